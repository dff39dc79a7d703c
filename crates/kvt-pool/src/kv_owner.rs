//! The reactor that owns a KV index's state. The first reactor to run a KV
//! command of a namespace takes the index's state out of its home mutex
//! (`KvIndex::home`) into its own `Locals` and keeps it: its queues' asks run
//! in place, and the other reactors post theirs (`KvPost`) and get the answer
//! back as an event for the asking queue pair, like a device completion. No
//! lock on the way; the posts are fixed-size queues, and what a full one
//! refuses waits in order on the sender's side for its next pass.
//!
//! The metadata thread's calls (drain, commit, trim, checkpoint) run on the
//! owner as a `Message::Call` while that thread waits. When the owner ends
//! (its `Locals` drop) the states go back home, so the last checkpoint still
//! finds them.

use super::kv::{KvIndex, State, StateHolder, StateJob};
use crate::kv_index::KeyIndex;
use crate::kv_index::{KvAnswer, KvAnswered, KvAsk};
use crossbeam_queue::ArrayQueue;
use kvt_reactor::{IoCtx, Locals, Message, ReactorShared, SharedPoller};
use kvt_wire::nvme::Status;
use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The key of a reactor's `KvOwned` among its `Locals`.
pub const KV_LOCAL: u64 = 0x4b56_4f57_4e45_4400;
/// The id of the KV post's poller on every reactor.
const KV_POLLER: u64 = 0x4b56_504f_5354_0000;
/// Asks, and answers, a post holds before senders keep theirs for later.
const POST_DEPTH: usize = 4096;
/// How often an owner looks for indexes nobody else holds.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// An ask from another reactor's queue pair.
struct PostedAsk {
    index: u64,
    ask: KvAsk,
    now: Instant,
    /// Where the answer goes: the asker's post, queue pair and command slot.
    /// `None` for a release, which has no answer.
    reply: Option<(Arc<KvPost>, u32, u16)>,
}

/// An answer for one of this reactor's queue pairs.
struct PostedAnswer {
    conn: u32,
    slot: u16,
    answer: KvAnswer,
}

enum Mail {
    Ask(PostedAsk),
    Answer(PostedAnswer),
}

/// A reactor's mailbox for the KV indexes: asks for the states it owns,
/// answers for its queue pairs.
pub struct KvPost {
    reactor: Arc<ReactorShared>,
    asks: ArrayQueue<PostedAsk>,
    answers: ArrayQueue<PostedAnswer>,
    /// Mail this reactor holds back because a post was full (its `KvOwned`).
    unsent: AtomicUsize,
}

impl KvPost {
    /// Puts `mail` down; the sender wakes the reactor (`KvOwned::wake_all`).
    fn put(&self, mail: Mail) -> Result<(), Mail> {
        match mail {
            Mail::Ask(a) => self.asks.push(a).map_err(Mail::Ask)?,
            Mail::Answer(a) => self.answers.push(a).map_err(Mail::Answer)?,
        }
        Ok(())
    }
}

/// What a reactor owns of the KV indexes (kept in its `Locals`).
pub struct KvOwned {
    post: Arc<KvPost>,
    states: Vec<(Arc<KvIndex>, Box<State>)>,
    /// Mail a full post refused, in the order it was sent.
    unsent: VecDeque<(Arc<KvPost>, Mail)>,
    /// Posts that got mail since they were last woken: woken once for all
    /// of it (a sleeping reactor's wake-up is a system call on the sender).
    to_wake: Vec<Arc<KvPost>>,
}

impl KvOwned {
    /// The state of index `id`, if this reactor owns it.
    fn state_of(&mut self, id: u64) -> Option<(&KvIndex, &mut State)> {
        self.states
            .iter_mut()
            .find(|(ix, _)| ix.id == id)
            .map(|(ix, st)| (&**ix, &mut **st))
    }

    /// Takes `ix`'s state from its home. False if another reactor has it,
    /// or it cannot be kept (an index not made by `into_shared`).
    fn adopt(&mut self, ix: &KvIndex) -> bool {
        let Some(me) = ix.me.upgrade() else {
            return false;
        };
        let mut home = ix.home();
        if ix.owner.get().is_some() {
            return false;
        }
        let Some(st) = home.take() else {
            return false;
        };
        self.states.push((me, st));
        self.count_owned();
        // Set under the home lock: whoever finds home empty finds an owner.
        let set = ix.owner.set(self.post.clone() as Arc<dyn StateHolder>);
        assert!(set.is_ok(), "two owners of one KV index");
        tracing::debug!(index = ix.id, "reactor took a KV index");
        true
    }

    /// Lets go of the states of indexes only this reactor still holds (their
    /// volume was deleted and no command or namespace holds them): nothing
    /// can reach them again.
    fn sweep(&mut self) {
        let before = self.states.len();
        self.states.retain(|(ix, _)| Arc::strong_count(ix) > 1);
        self.count_owned();
        if self.states.len() < before {
            tracing::debug!(
                released = before - self.states.len(),
                "KV index states of deleted volumes released"
            );
        }
    }

    fn count_owned(&self) {
        let n = self.states.len() as u64;
        self.post
            .reactor
            .kv_indexes_owned
            .store(n, Ordering::Relaxed);
    }

    /// Sends `mail`, or keeps it (behind earlier kept mail: order holds).
    fn send(&mut self, to: &Arc<KvPost>, mail: Mail) {
        if !self.unsent.is_empty() {
            self.keep(to, mail);
            return;
        }
        match to.put(mail) {
            Ok(()) => self.will_wake(to),
            Err(mail) => self.keep(to, mail),
        }
    }

    fn will_wake(&mut self, to: &Arc<KvPost>) {
        if !self.to_wake.iter().any(|p| Arc::ptr_eq(p, to)) {
            self.to_wake.push(to.clone());
        }
    }

    /// Wakes the reactors mail went to (those that sleep).
    fn wake_all(&mut self) {
        for p in self.to_wake.drain(..) {
            p.reactor.notify();
        }
    }

    fn keep(&mut self, to: &Arc<KvPost>, mail: Mail) {
        self.unsent.push_back((to.clone(), mail));
        self.post.unsent.store(self.unsent.len(), Ordering::Relaxed);
    }

    /// Sends what full posts refused earlier, in order, until one refuses.
    fn resend(&mut self) {
        while let Some((to, mail)) = self.unsent.pop_front() {
            if let Err(mail) = to.put(mail) {
                self.unsent.push_front((to, mail));
                break;
            }
            self.will_wake(&to);
        }
        self.post.unsent.store(self.unsent.len(), Ordering::Relaxed);
    }

    /// Carries out another reactor's ask on a state this one owns.
    fn serve(&mut self, a: PostedAsk) {
        let answer = match self.state_of(a.index) {
            Some((ix, st)) => ix.run(st, a.ask, a.now),
            None => {
                // Asks go only to the owner, which keeps its states until it
                // ends; an ask that finds none is answered, not dropped.
                tracing::error!(
                    index = a.index,
                    "KV ask for an index this reactor does not own"
                );
                refused(a.ask)
            }
        };
        if let Some((to, conn, slot)) = a.reply {
            let mail = Mail::Answer(PostedAnswer { conn, slot, answer });
            self.send(&to, mail);
        }
    }
}

impl Drop for KvOwned {
    fn drop(&mut self) {
        // The reactor ends: asks already posted are answered (their commands
        // wait for them), then the states go home for the metadata thread's
        // last commit and checkpoint. Gone first: later asks go home too.
        for (ix, _) in &self.states {
            ix.owner_gone.store(true, Ordering::Release);
        }
        while let Some(a) = self.post.asks.pop() {
            self.serve(a);
        }
        self.resend();
        self.wake_all();
        for (ix, st) in self.states.drain(..) {
            *ix.home() = Some(st);
        }
    }
}

/// The answer to an ask that could not be carried out.
fn refused(ask: KvAsk) -> KvAnswer {
    let e = Status::INTERNAL_ERROR;
    match ask {
        KvAsk::Reserve { .. } => KvAnswer::Reserve(Err(e)),
        KvAsk::CommitStore { .. } => KvAnswer::CommitStore(Err(e)),
        KvAsk::BeginRead { .. } => KvAnswer::BeginRead(Err(e)),
        KvAsk::Exists { .. } => KvAnswer::Exists(false),
        KvAsk::Delete { .. } => KvAnswer::Delete(Err(e)),
        KvAsk::List { .. } => KvAnswer::List(Vec::new()),
        KvAsk::AbortStore { .. } | KvAsk::AbortClaim { .. } | KvAsk::EndRead { .. } => {
            KvAnswer::Released
        }
    }
}

/// A reactor's side of the KV posts: serves the asks for the states it owns
/// and routes answers to its queue pairs.
struct KvPoller {
    post: Arc<KvPost>,
    /// When to look next (`KvOwned::sweep`).
    next_sweep: Option<Instant>,
}

impl SharedPoller for KvPoller {
    fn id(&self) -> u64 {
        KV_POLLER
    }
    fn fd(&self) -> Option<RawFd> {
        // Senders wake the reactor themselves (`ReactorShared::notify`).
        None
    }
    fn on_wake(&mut self) {}
    fn delivers_to_conns(&self) -> bool {
        true
    }
    fn serve(&mut self, locals: &mut Locals, now: Instant) -> usize {
        let Some(owned) = locals.get_mut::<KvOwned>(KV_LOCAL) else {
            return 0;
        };
        if !owned.unsent.is_empty() {
            owned.resend();
        }
        match self.next_sweep {
            Some(t) if now < t => {}
            _ => {
                self.next_sweep = Some(now + SWEEP_EVERY);
                owned.sweep();
            }
        }
        let mut n = 0;
        while let Some(a) = self.post.asks.pop() {
            owned.serve(a);
            n += 1;
        }
        // One wake-up per asking reactor for all the answers of this pass.
        owned.wake_all();
        if n > 0 {
            let served = &self.post.reactor.kv_asks_served;
            served.fetch_add(n as u64, Ordering::Relaxed);
        }
        n
    }
    fn poll(&mut self, _now: Instant, deliver: &mut dyn FnMut(u64, &dyn Any) -> bool) -> usize {
        let mut n = 0;
        while let Some(a) = self.post.answers.pop() {
            n += 1;
            let ev = KvAnswered {
                slot: a.slot,
                answer: std::cell::Cell::new(Some(a.answer)),
            };
            if !deliver(a.conn as u64, &ev) {
                // The queue pair waits for its answers before it goes.
                tracing::warn!(
                    conn = a.conn,
                    slot = a.slot,
                    "KV answer for a queue pair that is gone"
                );
            }
        }
        n
    }
    fn arm(&mut self) -> bool {
        !self.post.asks.is_empty()
            || !self.post.answers.is_empty()
            || self.post.unsent.load(Ordering::Relaxed) > 0
    }
}

/// Gives a reactor its KV post: call on the reactor, before it serves.
pub fn install(r: &mut kvt_reactor::Reactor) {
    let post = Arc::new(KvPost {
        reactor: r.shared.clone(),
        asks: ArrayQueue::new(POST_DEPTH),
        answers: ArrayQueue::new(POST_DEPTH),
        unsent: AtomicUsize::new(0),
    });
    let owned = KvOwned {
        post: post.clone(),
        states: Vec::new(),
        unsent: VecDeque::with_capacity(POST_DEPTH),
        to_wake: Vec::with_capacity(64),
    };
    r.insert_local(KV_LOCAL, Box::new(owned));
    r.add_poller(Box::new(KvPoller {
        post,
        next_sweep: None,
    }));
}

impl KeyIndex for KvIndex {
    fn block_size(&self) -> u32 {
        KvIndex::block_size(self)
    }
    fn max_keys(&self) -> u64 {
        KvIndex::max_keys(self)
    }
    fn used_blocks(&self) -> u64 {
        KvIndex::used_blocks(self)
    }
    fn ask(&self, a: KvAsk, slot: u16, ctx: &mut IoCtx) -> Option<KvAnswer> {
        ask(self, a, slot, ctx)
    }
    fn delete_all(&self, now: Instant) -> u64 {
        KvIndex::delete_all(self, now)
    }
}

/// `KeyIndex::ask` for a KV command on the reactor `ctx` runs: in place when
/// this reactor owns the state (taking it if nobody does), else posted to
/// the owner.
fn ask(ix: &KvIndex, ask: KvAsk, slot: u16, ctx: &mut IoCtx) -> Option<KvAnswer> {
    let now = ctx.now;
    let Some(owned) = ctx.locals.get_mut::<KvOwned>(KV_LOCAL) else {
        // A reactor without a post (tools, tests): wherever the state is.
        return Some(ix.with_state(move |ix, st| ix.run(st, ask, now)));
    };
    if ix.owner.get().is_none() && !owned.adopt(ix) && ix.owner.get().is_none() {
        // Not made to be owned (`into_shared`): it stays home.
        return Some(ix.with_state(move |ix, st| ix.run(st, ask, now)));
    }
    let gone = ix.owner_gone.load(Ordering::Acquire);
    let mine =
        |p: &Arc<dyn StateHolder>| std::ptr::addr_eq(Arc::as_ptr(p), Arc::as_ptr(&owned.post));
    match ix.owner.get() {
        Some(p) if mine(p) && !gone => match owned.state_of(ix.id) {
            Some((ix, st)) => Some(ix.run(st, ask, now)),
            None => {
                tracing::error!(
                    index = ix.id,
                    "this reactor owns a KV index it does not hold"
                );
                Some(refused(ask))
            }
        },
        Some(p) if !gone => {
            let Ok(to) = p.clone().into_any().downcast::<KvPost>() else {
                tracing::error!(index = ix.id, "a KV index owned by something not a reactor");
                return Some(refused(ask));
            };
            let reply = ask
                .wants_answer()
                .then(|| (owned.post.clone(), ctx.conn_id, slot));
            let mail = Mail::Ask(PostedAsk {
                index: ix.id,
                ask,
                now,
                reply,
            });
            owned.send(&to, mail);
            owned.wake_all();
            let posted = &owned.post.reactor.kv_asks_posted;
            posted.fetch_add(1, Ordering::Relaxed);
            None
        }
        _ => Some(ix.with_state(move |ix, st| ix.run(st, ask, now))),
    }
}

impl StateHolder for KvPost {
    fn post_job(&self, index: u64, job: StateJob) -> Result<(), StateJob> {
        // The job travels inside the message; a full inbox gives the message
        // back, and the job is taken out of it again.
        let job = Arc::new(Mutex::new(Some(job)));
        let on_owner = job.clone();
        let msg = Message::Call(Box::new(move |r| {
            let job = on_owner.lock().unwrap_or_else(|p| p.into_inner()).take();
            let Some(job) = job else { return };
            let owned = r.locals_mut().get_mut::<KvOwned>(KV_LOCAL);
            job(owned.and_then(|o| o.state_of(index)));
        }));
        match self.reactor.send(msg) {
            Ok(()) => Ok(()),
            Err(_) => {
                // Refused, so never run: the job is still in it.
                let back = job.lock().unwrap_or_else(|p| p.into_inner()).take();
                match back {
                    Some(job) => Err(job),
                    None => Ok(()),
                }
            }
        }
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}
