//! Where an index's state is, and how a call reaches it: at home under a
//! mutex (before a reactor takes it, in tools and tests, after the owner
//! ended), or on the reactor that owns it (`kv_owner`), which runs a job
//! for the caller while it waits. Only cold paths lock the home; the KV
//! command path asks the owner (`KeyIndex::ask`).

use super::{KvIndex, State};
use std::sync::atomic::Ordering;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A job on a KV index's state, run where the state is: with it, or with
/// `None` when its holder no longer has it.
pub(crate) type StateJob = Box<dyn FnOnce(Option<(&KvIndex, &mut State)>) + Send>;

/// What holds a KV index's state once it left home (a reactor:
/// `kv_owner::KvPost`): runs jobs on it for other threads.
pub(crate) trait StateHolder: Send + Sync {
    /// Runs `job` on the state of index `index` on the holder's thread,
    /// later; gives the job back if it cannot take it now.
    fn post_job(&self, index: u64, job: StateJob) -> Result<(), StateJob>;
    /// The holder as what it is (the command path reaches the reactor's post).
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// How long a caller waits for the state's holder before it looks whether
/// the holder has ended.
const HOLDER_PATIENCE: Duration = Duration::from_millis(50);

impl KvIndex {
    /// The home of the state (see `home`).
    pub(crate) fn home(&self) -> MutexGuard<'_, Option<Box<State>>> {
        self.home_locks.fetch_add(1, Ordering::Relaxed);
        // A panic while holding it cannot leave a half-made change worse than
        // refusing service: the state is plain values, each change one step.
        self.home.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the state where it is: here under the home lock, or on
    /// the owning reactor while the caller waits (so never call this from a
    /// reactor: the KV command path asks, `KeyIndex::ask`).
    pub(crate) fn with_state<R: Send + 'static>(
        &self,
        f: impl FnOnce(&KvIndex, &mut State) -> R + Send + 'static,
    ) -> R {
        let mut f = f;
        loop {
            // The owner first: while one serves, the home mutex is never taken.
            let holder = self
                .owner
                .get()
                .filter(|_| !self.owner_gone.load(Ordering::Acquire));
            if let Some(h) = holder {
                match self.call_holder(&**h, f) {
                    Ok(r) => return r,
                    Err(back) => f = back,
                }
                continue;
            }
            match self.at_home(f) {
                Ok(r) => return r,
                // An owner is taking the state, or one ended and is handing
                // it back: in one place or the other in a moment.
                Err(back) => f = back,
            }
            std::thread::yield_now();
        }
    }

    /// Runs `f` on the state on its holder's thread and waits; gives `f`
    /// back if the holder no longer has the state.
    fn call_holder<R, F>(&self, holder: &dyn StateHolder, f: F) -> Result<R, F>
    where
        R: Send + 'static,
        F: FnOnce(&KvIndex, &mut State) -> R + Send + 'static,
    {
        let cell = Arc::new(Mutex::new(Some(f)));
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let on_holder = cell.clone();
        let job: StateJob = Box::new(move |found| {
            let Some((ix, st)) = found else {
                return;
            };
            let f = on_holder.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(f) = f {
                let r = f(ix, st);
                ix.publish(st);
                let _ = tx.send(r);
            }
        });
        let mut job = Some(job);
        loop {
            if let Some(j) = job.take() {
                job = holder.post_job(self.id, j).err();
            }
            match rx.recv_timeout(HOLDER_PATIENCE) {
                Ok(r) => return Ok(r),
                // The holder ended with the job unread: the state is home.
                Err(RecvTimeoutError::Timeout) if self.owner_gone.load(Ordering::Acquire) => break,
                Err(RecvTimeoutError::Timeout) => {}
                // The job ran without the state (or was dropped): `f` is back.
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let f = cell.lock().unwrap_or_else(|p| p.into_inner()).take();
        match f {
            Some(f) => Err(f),
            // Taken at the last moment: its result is on the way (a job that
            // takes its closure sends what it returns).
            None => match rx.recv() {
                Ok(r) => Ok(r),
                Err(_) => panic!("a KV index call on its owner failed"),
            },
        }
    }

    /// Runs `f` on the state at home, where it is unless a reactor owns it.
    /// Returns `f` back if a reactor does.
    pub(crate) fn at_home<R, F: FnOnce(&KvIndex, &mut State) -> R>(&self, f: F) -> Result<R, F> {
        let mut home = self.home();
        match home.as_deref_mut() {
            Some(st) => {
                let r = f(self, st);
                self.publish(st);
                Ok(r)
            }
            None => Err(f),
        }
    }

    /// Keeps what others read without the state current: `used_blocks`
    /// (Identify) and `has_changes` (the metadata thread). Stored only when
    /// they move, so readers' copies of the line stay valid.
    pub(crate) fn publish(&self, st: &State) {
        let used = st.blocks.total - st.blocks.free;
        if self.used_blocks.load(Ordering::Relaxed) != used {
            self.used_blocks.store(used, Ordering::Relaxed);
        }
        let changes = !st.dirty.is_empty() || !st.pending_free.is_empty();
        if self.changes.load(Ordering::Relaxed) != changes {
            self.changes.store(changes, Ordering::Release);
        }
    }

    /// Times the home mutex was taken: it stays still while a reactor owns
    /// the index, whatever the commands and the metadata thread do.
    pub fn home_locks(&self) -> u64 {
        self.home_locks.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use std::collections::BTreeMap;
    use std::time::Instant;

    /// With no reactor owning the index every call runs at home, under the
    /// lock, and leaves what others read without the state current: the
    /// blocks the values take (Identify) and whether a commit has work.
    #[test]
    fn calls_at_home_publish_what_others_read() {
        let now = Instant::now();
        let ix = KvIndex::new(64 * 4096, 4096);
        let mut durable = BTreeMap::new();
        let locks = ix.home_locks();
        assert!(!ix.has_changes());
        assert!(store(&ix, &key(1), 3 * 4096, now).is_ok());
        assert!(ix.home_locks() > locks);
        assert_eq!(ix.used_blocks(), 3);
        assert!(ix.has_changes());
        commit(&ix, &mut durable);
        assert!(!ix.has_changes());
        assert_eq!(ix.delete(&key(1), now), Ok(()));
        assert!(ix.has_changes());
        // Given up, not durably yet: the blocks stay used until the commit.
        assert_eq!(ix.used_blocks(), 3);
        commit(&ix, &mut durable);
        assert_eq!((ix.used_blocks(), ix.has_changes()), (0, false));
    }
}
