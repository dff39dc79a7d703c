//! The target simulation: the whole front door under crashes.
//!
//! One simulated reactor runs two controllers' admin and I/O queues (`Queue`s on
//! the fake link) over one pool on the fault device (volatile cache, torn and
//! lost writes at a crash, fuses, in-flight completions reordered). A seeded
//! generator puts batches of commands in flight across the I/O queues: Write,
//! Write with FUA, Read, Flush (one namespace or all), Deallocate and Write
//! Zeroes on two block namespaces, and Store, Retrieve, Delete, Exist and
//! Flush on a KV namespace (set to evict on odd seeds, to fail when full on
//! even ones). In half the process lives the KV index is another reactor's
//! (`RemoteIndex`): each step's answer comes back later, between device
//! completions, in any order. Time is simulated (`now` moves only when the run says so); the
//! pool's metadata steps run between polls. At random points the target
//! crashes: every queue, the channels, the target and the pool are dropped,
//! the device loses its cache, the pool is reopened by recovery and the hosts
//! connect again.
//!
//! The oracle is the pool simulation's (`pool::sim`): each block and key has
//! the values it may hold now and the values it may hold after a crash (the
//! one at its last durable point, by Flush or FUA, and every one written
//! since). Every read and Retrieve is checked against the first (and a value
//! carries its namespace, block or key, so another's bytes fail); after every
//! recovery every block and key is read back through the queues and checked
//! against the second. Every command must complete within bounded simulated
//! time.
//!
//! `KVT_TARGET_SIM_SEEDS=N` sets how many seeds run (default 50),
//! `KVT_TARGET_SIM_SEED=S` runs one. A failure prints its replay command.

use super::*;
use kvt_bdev::fault::{FaultDevice, FaultHandle, SimRng};
use kvt_pool::channel::VolumeDevice;
use kvt_pool::gc::GcSettings;
use kvt_pool::kv::{KvIndex, KvSettings, OnFull};
use kvt_pool::kv_index::{KeyIndex, KvAnswer, KvAsk};
use kvt_pool::{format as format_pool, FormatOptions, Pool, PoolOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const EXTENT: u64 = 64 << 10;
/// Block namespaces 1 and 2 (512-byte blocks), KV namespace 3.
const BLOCK_NS: [u32; 2] = [1, 2];
const KV_NSID: u32 = 3;
const VOL_BLOCKS: u64 = 512;
const KV_BS: u32 = 4096;
const KV_KEYS: u32 = 24;
/// Values of up to 5 blocks: more than the KV volume holds, so Stores evict
/// (or fail, on a namespace set to fail when full).
const KV_MAX_VALUE: u32 = 5 * KV_BS;
/// A batch must complete within this many polls of 200 us.
const MAX_POLLS: usize = 20_000;

/// Simulated time: one real instant at the start, then only what the run adds.
struct Clock {
    start: Instant,
    now: Instant,
}

/// The KV index as queues on a reactor that does not own it see it: a step
/// is carried out when asked (in the order asked, as the owner serves its
/// post) and its answer is held, to come back to its queue later
/// (`Sim::poll`), like the answers the owning reactor posts back.
struct RemoteIndex {
    ix: Arc<KvIndex>,
    /// (connection, command slot, answer) not yet delivered.
    answers: std::sync::Mutex<Vec<(u32, u16, KvAnswer)>>,
}

impl RemoteIndex {
    fn take_answers(&self) -> Vec<(u32, u16, KvAnswer)> {
        std::mem::take(&mut *self.answers.lock().unwrap_or_else(|p| p.into_inner()))
    }
    fn put_back(&self, mut a: Vec<(u32, u16, KvAnswer)>) {
        let mut held = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        a.append(&mut held);
        *held = a;
    }
}

impl KeyIndex for RemoteIndex {
    fn block_size(&self) -> u32 {
        self.ix.block_size()
    }
    fn max_keys(&self) -> u64 {
        self.ix.max_keys()
    }
    fn used_blocks(&self) -> u64 {
        self.ix.used_blocks()
    }
    fn ask(&self, ask: KvAsk, slot: u16, ctx: &mut IoCtx) -> Option<KvAnswer> {
        let a = KeyIndex::ask(&*self.ix, ask, slot, ctx)?;
        if !ask.wants_answer() {
            return Some(a);
        }
        let mut held = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        held.push((ctx.conn_id, slot, a));
        None
    }
    fn delete_all(&self, now: Instant) -> u64 {
        self.ix.delete_all(now)
    }
}

/// What a queue's reactor owns (one reactor serves every queue here).
struct Reactor {
    channels: ChannelCache,
    bufs: BufPool,
    locals: Locals,
}

struct SimQueue {
    q: Queue<FakeReq>,
    link: FakeLink,
    conn_id: u32,
    next_cid: u16,
}

/// The target as one process life sees it.
struct World {
    pool: Arc<Pool>,
    _target: Arc<Target>,
    nss: Vec<Arc<Namespace>>,
    /// The KV namespace's index when it is another reactor's.
    remote: Option<Arc<RemoteIndex>>,
    reactor: Reactor,
    /// Admin queues first (kept connected), then I/O queues.
    admins: Vec<SimQueue>,
    ios: Vec<SimQueue>,
}

/// A block's values: what a read may see now, and what may survive a crash.
#[derive(Clone, Debug)]
struct Slot<V: Ord + Clone> {
    cur: BTreeSet<V>,
    allowed: BTreeSet<V>,
}

impl<V: Ord + Clone> Slot<V> {
    fn new(v: V) -> Slot<V> {
        Slot {
            cur: BTreeSet::from([v.clone()]),
            allowed: BTreeSet::from([v]),
        }
    }
    fn settle(&mut self, v: V) {
        *self = Slot::new(v);
    }
}

/// One command in flight and what the model needs of it.
#[derive(Debug, Clone)]
enum Cmd {
    Write {
        nsid: u32,
        slba: u64,
        values: Vec<u64>,
        fua: bool,
    },
    Zero {
        nsid: u32,
        slba: u64,
        nlb: u32,
        dsm: bool,
    },
    Read {
        nsid: u32,
        slba: u64,
        nlb: u32,
    },
    Flush {
        nsid: u32,
    },
    Store {
        key: u32,
        version: u64,
        len: u32,
    },
    Retrieve {
        key: u32,
    },
    Delete {
        key: u32,
    },
    Exist {
        key: u32,
    },
}

/// A value a block took in a batch: by a Write (FUA or not), Write Zeroes or
/// Deallocate (0), acknowledged or failed.
#[derive(Debug, Clone, Copy)]
struct Written {
    value: u64,
    acked: bool,
    fua: bool,
}

type Taken = BTreeMap<(u32, u64), Vec<Written>>;

/// Flush with this NSID flushes every namespace.
const NSID_ALL: u32 = 0xFFFF_FFFF;

/// A block after a batch wrote `vals` to it (in flight together, so in any
/// order): any of them may be there now and after a crash; an acknowledged
/// FUA write is a durable point, so the older values are gone; a failed
/// write may or may not have landed.
fn take_values(s: &mut Slot<u64>, vals: &[Written]) {
    let all: BTreeSet<u64> = vals.iter().map(|w| w.value).collect();
    if vals.iter().any(|w| w.acked && w.fua) {
        s.allowed = all.clone();
    } else {
        s.allowed.extend(all.iter().copied());
    }
    if vals.iter().any(|w| w.acked) {
        s.cur = all;
    } else {
        s.cur.extend(all);
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Cover {
    crashes: u64,
    /// Controllers connected over NVMe/RDMA (the others over NVMe/TCP).
    rdma_controllers: u64,
    fuses: u64,
    commands: u64,
    errors: u64,
    writes: u64,
    fua_writes: u64,
    flushes: u64,
    reads_checked: u64,
    zeroes: u64,
    kv_stores: u64,
    kv_hits: u64,
    kv_evictions: u64,
    kv_claims: u64,
    kv_full: u64,
    batches: u64,
    reordered: u64,
    /// KV index answers that came back after a later device completion or
    /// another command's answer (`RemoteIndex`).
    kv_answers_late: u64,
    blocks_settled: u64,
    keys_settled: u64,
}

impl Cover {
    fn add(&mut self, o: &Cover) {
        self.crashes += o.crashes;
        self.rdma_controllers += o.rdma_controllers;
        self.fuses += o.fuses;
        self.commands += o.commands;
        self.errors += o.errors;
        self.writes += o.writes;
        self.fua_writes += o.fua_writes;
        self.flushes += o.flushes;
        self.reads_checked += o.reads_checked;
        self.zeroes += o.zeroes;
        self.kv_stores += o.kv_stores;
        self.kv_hits += o.kv_hits;
        self.kv_evictions += o.kv_evictions;
        self.kv_claims += o.kv_claims;
        self.kv_full += o.kv_full;
        self.batches += o.batches;
        self.reordered += o.reordered;
        self.kv_answers_late += o.kv_answers_late;
        self.blocks_settled += o.blocks_settled;
        self.keys_settled += o.keys_settled;
    }
}

struct Sim {
    seed: u64,
    rng: SimRng,
    fault: Arc<FaultDevice>,
    dev: kvt_bdev::SharedDevice,
    clock: Clock,
    world: Option<World>,
    evict: bool,
    blocks: BTreeMap<(u32, u64), Slot<u64>>,
    keys: Vec<Slot<Option<u64>>>,
    kv_lens: BTreeMap<u64, u32>,
    next_value: u64,
    next_conn: u32,
    cover: Cover,
    log: Vec<String>,
}

fn pool_opts() -> PoolOptions {
    PoolOptions {
        md_thread: false,
        reactors: 1,
        gc: GcSettings {
            fixed_batch: Some(3),
            ..GcSettings::default()
        },
        commit_interval: None,
        ..PoolOptions::default()
    }
}

/// A block's bytes: its value, namespace and LBA, so a stale, torn or
/// misplaced block fails to decode. Value 0 is zeros.
fn block_bytes(v: u64, nsid: u32, lba: u64, out: &mut [u8]) {
    if v == 0 {
        out.fill(0);
        return;
    }
    let idx = (nsid as u64) << 40 | lba;
    out.fill((v as u8) ^ (idx as u8) ^ (nsid as u8) ^ 0x5A);
    out[..8].copy_from_slice(&v.to_le_bytes());
    out[8..16].copy_from_slice(&idx.to_le_bytes());
}

fn block_value(b: &[u8], nsid: u32, lba: u64) -> Option<u64> {
    if b.iter().all(|&x| x == 0) {
        return Some(0);
    }
    let v = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    let mut want = vec![0u8; b.len()];
    block_bytes(v, nsid, lba, &mut want);
    (want == b).then_some(v)
}

fn kv_key(k: u32) -> nvme::KvKey {
    let mut b = *b"tsim-key\0\0\0\0";
    b[8..].copy_from_slice(&k.to_be_bytes());
    nvme::KvKey::new(&b).unwrap_or_default()
}

fn kv_byte(k: u32, version: u64, i: usize) -> u8 {
    let x = version.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((k as u64) << 40) ^ i as u64;
    (x ^ (x >> 29)) as u8
}

/// A value of at least 16 bytes: key, version and length, then bytes that
/// depend on all three.
fn kv_value(k: u32, version: u64, len: u32) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len as usize).map(|i| kv_byte(k, version, i)).collect();
    v[..4].copy_from_slice(&k.to_le_bytes());
    v[4..12].copy_from_slice(&version.to_le_bytes());
    v[12..16].copy_from_slice(&len.to_le_bytes());
    v
}

/// The version a value read back holds, if it is whole and key `k`'s.
fn kv_version(k: u32, data: &[u8]) -> Option<u64> {
    let version = u64::from_le_bytes(data.get(4..12)?.try_into().ok()?);
    let len = u32::from_le_bytes(data.get(12..16)?.try_into().ok()?);
    (data.len() == len as usize && kv_value(k, version, len) == data).then_some(version)
}

fn sim_ctx<'a>(r: &'a mut Reactor, conn_id: u32, clock: &Clock) -> IoCtx<'a> {
    IoCtx {
        channels: &mut r.channels,
        bufs: &mut r.bufs,
        locals: &mut r.locals,
        conn_id,
        now: clock.now,
        now_ns: clock.now.saturating_duration_since(clock.start).as_nanos() as u64,
    }
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let fault = FaultDevice::new(1_200_000 + 32 * EXTENT);
        let dev: kvt_bdev::SharedDevice = Arc::new(FaultHandle(fault.clone()));
        let fo = FormatOptions {
            extent_size: EXTENT,
            force: false,
            journal_len: Some(96 << 10),
            // The 1,024 of format 2: this small device's room.
            max_volumes: Some(1024),
        };
        if let Err(e) = format_pool(&dev, &fo) {
            panic!("seed {seed}: format: {e}");
        }
        let pool = match Pool::open("tsim", dev.clone(), pool_opts()) {
            Ok(p) => p,
            Err(e) => panic!("seed {seed}: open: {e}"),
        };
        for (i, nsid) in BLOCK_NS.iter().enumerate() {
            let r = pool.create_volume(&format!("b{nsid}"), VOL_BLOCKS * 512, 512, 0);
            if let Err(e) = r {
                panic!("seed {seed}: create volume {i}: {e}");
            }
        }
        // 4 extents of 4 KiB blocks: 64 blocks for 24 keys of up to 5 blocks.
        let r = pool.create_volume("kv", 4 * EXTENT, KV_BS, kvt_pool::format::VOL_KV);
        if let Err(e) = r {
            panic!("seed {seed}: create the KV volume: {e}");
        }
        fault.set_reorder(Some(seed ^ 0x7a67));
        let now = Instant::now();
        let mut blocks = BTreeMap::new();
        for nsid in BLOCK_NS {
            for lba in 0..VOL_BLOCKS {
                blocks.insert((nsid, lba), Slot::new(0));
            }
        }
        let mut sim = Sim {
            seed,
            rng: SimRng(seed),
            fault,
            dev,
            clock: Clock { start: now, now },
            world: None,
            evict: seed % 2 == 1,
            blocks,
            keys: vec![Slot::new(None); KV_KEYS as usize],
            kv_lens: BTreeMap::new(),
            next_value: 1,
            next_conn: 1,
            cover: Cover::default(),
            log: Vec::new(),
        };
        sim.start(pool);
        sim
    }

    fn fail(&self, msg: String) -> ! {
        let tail: Vec<_> = self.log.iter().rev().take(300).rev().cloned().collect();
        panic!(
            "seed {}: {msg}\nlast operations:\n  {}\nreproduce: KVT_TARGET_SIM_SEED={} cargo test --profile sim -p kvt-nvmf --lib tests::target_sim -- --nocapture",
            self.seed,
            tail.join("\n  "),
            self.seed
        );
    }

    fn world(&mut self) -> &mut World {
        match self.world.as_mut() {
            Some(w) => w,
            None => panic!("no target running"),
        }
    }

    fn kv_index(&self) -> Arc<KvIndex> {
        let w = self.world.as_ref();
        match w
            .and_then(|w| w.pool.volume("kv"))
            .and_then(|v| v.kv.clone())
        {
            Some(ix) => ix,
            None => self.fail("the KV volume or its index is missing".into()),
        }
    }

    /// The target starts over `pool`: a subsystem with the three namespaces,
    /// two controllers (admin queue, then one or two I/O queues each), each
    /// over NVMe/TCP or NVMe/RDMA.
    fn start(&mut self, pool: Arc<Pool>) {
        let target = Arc::new(Target::new(TransportLimits::default()));
        let subsys = Arc::new(Subsystem::new(
            SUBNQN,
            SubsystemKind::Nvm,
            "SERIAL1",
            "MODEL1",
            false,
            vec![HOSTNQN.into()],
        ));
        target.add_subsystem(subsys.clone());
        let mut nss = Vec::new();
        for nsid in BLOCK_NS {
            let Some(vol) = pool.volume(&format!("b{nsid}")) else {
                self.fail(format!("volume b{nsid} missing"))
            };
            let dev = VolumeDevice::new(pool.clone(), vol);
            nss.push(Arc::new(Namespace::new(SUBNQN, nsid, dev, 512)));
        }
        let Some(vol) = pool.volume("kv") else {
            self.fail("the KV volume is missing".into())
        };
        let Some(ix) = vol.kv.clone() else {
            self.fail("the KV volume has no index".into())
        };
        ix.set_settings(KvSettings {
            on_full: if self.evict {
                OnFull::Evict
            } else {
                OnFull::Fail
            },
            ..KvSettings::default()
        });
        let dev = VolumeDevice::new(pool.clone(), vol);
        let remote = self.rng.chance(50).then(|| {
            Arc::new(RemoteIndex {
                ix: ix.clone(),
                answers: std::sync::Mutex::new(Vec::new()),
            })
        });
        let kv: Arc<dyn KeyIndex> = match &remote {
            Some(r) => r.clone(),
            None => ix,
        };
        nss.push(Arc::new(
            Namespace::new(SUBNQN, KV_NSID, dev, KV_BS).with_kv(kv),
        ));
        for ns in &nss {
            if let Err(e) = subsys.add_namespace(ns.clone()) {
                self.fail(format!("add namespace: {e}"));
            }
        }
        self.world = Some(World {
            pool,
            _target: target,
            nss,
            remote,
            reactor: Reactor {
                channels: ChannelCache::default(),
                bufs: BufPool::new(8),
                locals: Locals::default(),
            },
            admins: Vec::new(),
            ios: Vec::new(),
        });
        for _ in 0..2 {
            let (sqe, data) = connect_cmd(0, 0, 31, 0, 0xFFFF, SUBNQN, HOSTNQN);
            // NVMe/TCP, or NVMe/RDMA (which places read buffers first).
            let rdma = self.rng.chance(50);
            self.cover.rdma_controllers += rdma as u64;
            let cfg = |qid| if rdma { rdma_cfg(qid) } else { tcp_cfg() };
            let mut a = self.new_queue(cfg(0));
            let r = self.exec_now(&mut a, sqe, &data);
            let cntlid = r.cqe.result as u16;
            let r2 = self.exec_now(&mut a, prop_set(1, prop::CC, CC_ENABLE_ALL_IOCS), &[]);
            if r.status() != Status::SUCCESS || r2.status() != Status::SUCCESS {
                self.fail(format!("admin connect or enable: {r:?} {r2:?}"));
            }
            for qid in 1..=1 + self.rng.below(2) as u16 {
                let (sqe, data) = connect_cmd(0, qid, 31, 0, cntlid, SUBNQN, HOSTNQN);
                let mut io = self.new_queue(cfg(qid));
                let r = self.exec_now(&mut io, sqe, &data);
                if r.status() != Status::SUCCESS {
                    self.fail(format!("I/O queue {qid} connect: {r:?}"));
                }
                self.world().ios.push(io);
            }
            self.world().admins.push(a);
        }
    }

    fn new_queue(&mut self, cfg: QueueConfig) -> SimQueue {
        let conn_id = self.next_conn;
        self.next_conn += 1;
        let target = self.world()._target.clone();
        SimQueue {
            q: Queue::new(target, cfg),
            link: FakeLink::default(),
            conn_id,
            next_cid: 1,
        }
    }

    /// Runs a command answered without device I/O (Connect, Property Set).
    fn exec_now(&mut self, sq: &mut SimQueue, sqe: Sqe, icd: &[u8]) -> Sent {
        let clock = Clock {
            start: self.clock.start,
            now: self.clock.now,
        };
        let w = self.world();
        let mut ctx = sim_ctx(&mut w.reactor, sq.conn_id, &clock);
        let cap = Capsule {
            sqe: &sqe,
            desc: tcp_desc(&sqe),
            icd,
            icd_corrupt: false,
            x: Some(sqe.cid()),
        };
        let got = sq.q.receive(cap, &mut sq.link, &mut ctx);
        let mut sent = std::mem::take(&mut sq.link.sent);
        if got != Received::Done || sent.len() != 1 {
            self.fail(format!("{sqe:?}: {got:?}, {sent:?}"));
        }
        sent.remove(0)
    }

    // -----------------------------------------------------------------------
    // Commands.

    fn sqe_of(&mut self, cmd: &Cmd, cid: u16) -> (Sqe, Vec<u8>) {
        match *cmd {
            Cmd::Write {
                nsid,
                slba,
                ref values,
                fua,
            } => {
                let nlb = values.len() as u32;
                let mut s = rw(io_opc::WRITE, cid, nsid, slba, nlb);
                if fua {
                    s.set_cdw(12, s.cdw(12) | 1 << 30);
                }
                let mut data = vec![0u8; nlb as usize * 512];
                for (i, (v, b)) in values.iter().zip(data.chunks_mut(512)).enumerate() {
                    block_bytes(*v, nsid, slba + i as u64, b);
                }
                (s, data)
            }
            Cmd::Zero {
                nsid,
                slba,
                nlb,
                dsm: true,
            } => {
                let mut list = vec![0u8; 16];
                DsmRange {
                    attributes: 0,
                    nlb,
                    slba,
                }
                .encode(&mut list);
                let mut s = Sqe::new(io_opc::DATASET_MANAGEMENT, cid, nsid);
                s.set_cdw(11, DSM_ATTR_DEALLOCATE);
                s.set_sgl(host_sgl(16));
                (s, list)
            }
            Cmd::Zero {
                nsid, slba, nlb, ..
            } => {
                let mut s = Sqe::new(io_opc::WRITE_ZEROES, cid, nsid);
                s.set_cdw(10, slba as u32);
                s.set_cdw(11, (slba >> 32) as u32);
                s.set_cdw(12, nlb - 1);
                (s, Vec::new())
            }
            Cmd::Read { nsid, slba, nlb } => (rw(io_opc::READ, cid, nsid, slba, nlb), Vec::new()),
            Cmd::Flush { nsid } => (Sqe::new(io_opc::FLUSH, cid, nsid), Vec::new()),
            Cmd::Store { key, version, len } => {
                let c = nvme::KvCommand::Store {
                    key: kv_key(key),
                    value_size: len,
                    options: Default::default(),
                };
                let mut s = c.encode(cid, KV_NSID);
                s.set_sgl(host_sgl(len));
                (s, kv_value(key, version, len))
            }
            Cmd::Retrieve { key } => {
                let c = nvme::KvCommand::Retrieve {
                    key: kv_key(key),
                    host_buffer_size: KV_MAX_VALUE,
                    raw: false,
                };
                let mut s = c.encode(cid, KV_NSID);
                s.set_sgl(host_sgl(KV_MAX_VALUE));
                (s, Vec::new())
            }
            Cmd::Delete { key } => (
                nvme::KvCommand::Delete { key: kv_key(key) }.encode(cid, KV_NSID),
                Vec::new(),
            ),
            Cmd::Exist { key } => (
                nvme::KvCommand::Exist { key: kv_key(key) }.encode(cid, KV_NSID),
                Vec::new(),
            ),
        }
    }

    /// A random command; `busy` keys are not picked (one command per key in a batch).
    fn pick(&mut self, busy: &mut BTreeSet<u32>) -> Cmd {
        let roll = self.rng.below(100);
        if roll < 55 {
            let nsid = BLOCK_NS[self.rng.below(2) as usize];
            let nlb = 1 + self.rng.below(16) as u32;
            let slba = self.rng.below(VOL_BLOCKS - nlb as u64 + 1);
            return match roll {
                0..=19 => {
                    let values = (0..nlb).map(|_| self.value()).collect();
                    Cmd::Write {
                        nsid,
                        slba,
                        values,
                        fua: false,
                    }
                }
                20..=27 => {
                    let values = (0..nlb).map(|_| self.value()).collect();
                    Cmd::Write {
                        nsid,
                        slba,
                        values,
                        fua: true,
                    }
                }
                28..=40 => Cmd::Read { nsid, slba, nlb },
                41..=46 => Cmd::Flush {
                    nsid: if self.rng.chance(20) { NSID_ALL } else { nsid },
                },
                _ => Cmd::Zero {
                    nsid,
                    slba,
                    nlb,
                    dsm: self.rng.chance(50),
                },
            };
        }
        if roll >= 95 {
            return Cmd::Flush { nsid: KV_NSID };
        }
        let mut key = self.rng.below(KV_KEYS as u64) as u32;
        while busy.contains(&key) {
            key = (key + 1) % KV_KEYS;
        }
        busy.insert(key);
        match roll {
            55..=74 => {
                let version = self.value();
                let len = 16 + self.rng.below((KV_MAX_VALUE - 15) as u64) as u32;
                self.kv_lens.insert(version, len);
                Cmd::Store { key, version, len }
            }
            75..=84 => Cmd::Retrieve { key },
            85..=89 => Cmd::Delete { key },
            _ => Cmd::Exist { key },
        }
    }

    fn value(&mut self) -> u64 {
        self.next_value += 1;
        self.next_value
    }

    /// Puts `cmds` in flight (each on a random I/O queue), moves their data,
    /// then polls with simulated time and metadata steps between until every
    /// one has answered. The answers come back in the order of `cmds`.
    fn run_batch(&mut self, cmds: &[Cmd]) -> Vec<Sent> {
        let nq = self.world().ios.len() as u64;
        let mut at: Vec<(usize, u16)> = Vec::new();
        for cmd in cmds {
            let qi = self.rng.below(nq) as usize;
            let cid = {
                let sq = &mut self.world().ios[qi];
                let c = sq.next_cid;
                sq.next_cid = sq.next_cid.wrapping_add(1).max(1);
                c
            };
            self.log.push(format!("q{qi} cid {cid}: {cmd:?}"));
            let (sqe, data) = self.sqe_of(cmd, cid);
            self.submit(qi, sqe, &data);
            at.push((qi, cid));
        }
        let mut got: Vec<Option<Sent>> = vec![None; cmds.len()];
        let mut order = Vec::new();
        for _ in 0..MAX_POLLS {
            self.collect(&at, &mut got, &mut order);
            if got.iter().all(Option::is_some) {
                break;
            }
            self.clock.now += Duration::from_micros(self.rng.below(201));
            self.poll();
            if self.rng.chance(30) {
                let now = self.clock.now;
                self.world().pool.md_step(now);
            }
        }
        if got.iter().any(Option::is_none) {
            let left: Vec<_> = (0..cmds.len()).filter(|&i| got[i].is_none()).collect();
            self.fail(format!("commands {left:?} of this batch never completed"));
        }
        self.cover.batches += 1;
        if order.windows(2).any(|w| w[0] > w[1]) {
            self.cover.reordered += 1;
        }
        got.into_iter().flatten().collect()
    }

    fn submit(&mut self, qi: usize, sqe: Sqe, data: &[u8]) {
        let clock = Clock {
            start: self.clock.start,
            now: self.clock.now,
        };
        let w = self.world();
        let sq = &mut w.ios[qi];
        let mut ctx = sim_ctx(&mut w.reactor, sq.conn_id, &clock);
        let cap = Capsule {
            sqe: &sqe,
            desc: tcp_desc(&sqe),
            icd: &[],
            icd_corrupt: false,
            x: Some(sqe.cid()),
        };
        match sq.q.receive(cap, &mut sq.link, &mut ctx) {
            Received::Done => {}
            Received::NeedData { slot, len, dir } => {
                let mut b = ctx.bufs.get(len);
                if dir == DataDirection::HostToController {
                    if data.len() != len {
                        panic!("the command asked for {len} bytes, not {}", data.len());
                    }
                    b.copy_from_slice(data);
                }
                if let Some(r) = sq.q.request_mut(slot) {
                    r.buf = Some(b);
                }
                sq.q.data_ready(slot, false, &mut sq.link, &mut ctx);
            }
            Received::Overrun => panic!("queue overrun"),
        }
    }

    /// Polls the reactor's device channels once and routes every completion
    /// to its queue by the tag's connection.
    fn poll(&mut self) {
        let clock = Clock {
            start: self.clock.start,
            now: self.clock.now,
        };
        let w = self.world();
        let mut done = Vec::new();
        for ns in &w.nss {
            if let Ok(ch) = w.reactor.channels.get(ns) {
                ch.poll(&mut done, clock.now);
            }
        }
        for c in done {
            let conn = (c.tag >> 32) as u32;
            let Some(sq) = w.ios.iter_mut().find(|q| q.conn_id == conn) else {
                panic!("a completion for connection {conn}, which has no queue");
            };
            let mut ctx = sim_ctx(&mut w.reactor, conn, &clock);
            sq.q.io_complete(c.tag as u16, c.result, c.buf, &mut sq.link, &mut ctx);
        }
        self.kv_answers(&clock);
    }

    /// Delivers some of the KV index answers held (`RemoteIndex`), in a
    /// random order; the rest wait for a later poll.
    fn kv_answers(&mut self, clock: &Clock) {
        let Some(remote) = self.world().remote.clone() else {
            return;
        };
        let mut held = remote.take_answers();
        let mut now = Vec::new();
        let mut i = 0;
        while i < held.len() {
            if self.rng.chance(60) {
                let j = self.rng.below(held.len() as u64) as usize;
                now.push(held.swap_remove(j));
            } else {
                i += 1;
            }
        }
        self.cover.kv_answers_late += (now.len() > 1 || !held.is_empty()) as u64;
        remote.put_back(held);
        let w = self.world();
        for (conn, slot, answer) in now {
            let Some(sq) = w.ios.iter_mut().find(|q| q.conn_id == conn) else {
                panic!("a KV answer for connection {conn}, which has no queue");
            };
            let mut ctx = sim_ctx(&mut w.reactor, conn, clock);
            sq.q.kv_answer(slot, Some(answer), &mut sq.link, &mut ctx);
        }
    }

    fn collect(&mut self, at: &[(usize, u16)], got: &mut [Option<Sent>], order: &mut Vec<usize>) {
        let w = self.world();
        for (qi, sq) in w.ios.iter_mut().enumerate() {
            for s in std::mem::take(&mut sq.link.sent) {
                let i = at
                    .iter()
                    .position(|&(q, cid)| q == qi && cid == s.cqe.cid)
                    .unwrap_or_else(|| panic!("a response nobody waits for: {s:?}"));
                assert!(got[i].is_none(), "two responses for one command: {s:?}");
                got[i] = Some(s);
                order.push(i);
            }
        }
    }

    // -----------------------------------------------------------------------
    // The model.

    fn step(&mut self) {
        let roll = self.rng.below(100);
        if roll < 4 {
            self.crash();
            return;
        }
        if roll < 7 {
            self.cover.fuses += 1;
            let n = self.rng.below(12);
            self.log
                .push(format!("fuse: the device fails after {n} writes"));
            self.fault.arm_fuse(n);
        }
        let n = 1 + self.rng.below(6) as usize;
        let mut busy = BTreeSet::new();
        let cmds: Vec<Cmd> = (0..n).map(|_| self.pick(&mut busy)).collect();
        let answers = self.run_batch(&cmds);
        self.apply(&cmds, &answers);
        if self.fault.tripped() {
            self.crash();
        }
    }

    /// Checks the batch's answers and moves the model on.
    fn apply(&mut self, cmds: &[Cmd], answers: &[Sent]) {
        let (taken, flushed) = self.note_batch(cmds, answers);
        self.check_reads(cmds, answers, &taken);
        // A Flush makes what was there before the batch durable.
        for nsid in BLOCK_NS {
            if flushed.contains(&nsid) || flushed.contains(&NSID_ALL) {
                for lba in 0..VOL_BLOCKS {
                    if let Some(s) = self.blocks.get_mut(&(nsid, lba)) {
                        s.allowed = s.cur.clone();
                    }
                }
            }
        }
        for (k, vals) in taken {
            if let Some(s) = self.blocks.get_mut(&k) {
                take_values(s, &vals);
            }
        }
        self.apply_kv(cmds, answers, &flushed);
    }

    /// The values each block may have taken in the batch, and the namespaces
    /// an acknowledged Flush named.
    fn note_batch(&mut self, cmds: &[Cmd], answers: &[Sent]) -> (Taken, BTreeSet<u32>) {
        let mut taken = Taken::new();
        let mut flushed = BTreeSet::new();
        for (cmd, s) in cmds.iter().zip(answers) {
            self.cover.commands += 1;
            let acked = s.status() == Status::SUCCESS;
            if !acked {
                self.cover.errors += 1;
                self.log.push(format!("  {cmd:?}: {}", s.status()));
            }
            match *cmd {
                Cmd::Write {
                    nsid,
                    slba,
                    ref values,
                    fua,
                } => {
                    self.cover.writes += acked as u64;
                    self.cover.fua_writes += (acked && fua) as u64;
                    for (i, &value) in values.iter().enumerate() {
                        let e = taken.entry((nsid, slba + i as u64)).or_default();
                        e.push(Written { value, acked, fua });
                    }
                }
                Cmd::Zero {
                    nsid, slba, nlb, ..
                } => {
                    self.cover.zeroes += acked as u64;
                    for lba in slba..slba + nlb as u64 {
                        let e = taken.entry((nsid, lba)).or_default();
                        e.push(Written {
                            value: 0,
                            acked,
                            fua: false,
                        });
                    }
                }
                Cmd::Flush { nsid } if acked => {
                    self.cover.flushes += 1;
                    flushed.insert(nsid);
                }
                _ => {}
            }
        }
        (taken, flushed)
    }

    /// Every block a Read returned holds a value it had before the batch or
    /// one written in it, of its own namespace and LBA.
    fn check_reads(&mut self, cmds: &[Cmd], answers: &[Sent], taken: &Taken) {
        for (cmd, s) in cmds.iter().zip(answers) {
            let Cmd::Read { nsid, slba, nlb } = *cmd else {
                continue;
            };
            if s.status() != Status::SUCCESS {
                continue;
            }
            if s.data.len() != nlb as usize * 512 {
                self.fail(format!("{cmd:?} returned {} bytes", s.data.len()));
            }
            for (i, b) in s.data.chunks(512).enumerate() {
                let lba = slba + i as u64;
                let Some(slot) = self.blocks.get(&(nsid, lba)) else {
                    self.fail(format!("no model for block {nsid}/{lba}"))
                };
                let v = block_value(b, nsid, lba);
                let racing = taken.get(&(nsid, lba));
                let fine = v.is_some_and(|v| {
                    slot.cur.contains(&v) || racing.is_some_and(|r| r.iter().any(|w| w.value == v))
                });
                if !fine {
                    self.fail(format!(
                        "read of {nsid}/{lba} returned {v:?} (bytes {:02x?}...), the model allows {:?} or {racing:?}",
                        &b[..16],
                        slot.cur
                    ));
                }
                self.cover.reads_checked += 1;
            }
        }
    }

    fn apply_kv(&mut self, cmds: &[Cmd], answers: &[Sent], flushed: &BTreeSet<u32>) {
        if flushed.contains(&KV_NSID) || flushed.contains(&NSID_ALL) {
            for s in &mut self.keys {
                s.allowed = s.cur.clone();
            }
        }
        let evict = self.evict;
        for (cmd, s) in cmds.iter().zip(answers) {
            let st = s.status();
            let ok = st == Status::SUCCESS;
            let missing = st == Status::KV_KEY_DOES_NOT_EXIST;
            let key = match *cmd {
                Cmd::Store { key, .. }
                | Cmd::Retrieve { key }
                | Cmd::Delete { key }
                | Cmd::Exist { key } => key,
                _ => continue,
            };
            let slot = self.keys[key as usize].clone();
            let absent_ok = evict || slot.cur.contains(&None);
            let mut next = slot.clone();
            match *cmd {
                Cmd::Store { .. } if st == Status::CAPACITY_EXCEEDED => {
                    // Refused for space: nothing changed.
                    self.cover.kv_full += 1;
                }
                Cmd::Store { version, .. } => {
                    next.allowed.insert(Some(version));
                    if ok {
                        self.cover.kv_stores += 1;
                        next.cur = BTreeSet::from([Some(version)]);
                    } else {
                        // A device error: the value may or may not be there.
                        next.cur.insert(Some(version));
                    }
                }
                Cmd::Retrieve { .. } if ok => {
                    let v = kv_version(key, &s.data);
                    let len_ok =
                        v.and_then(|v| self.kv_lens.get(&v)) == Some(&(s.cqe.result as u32));
                    if !len_ok || !v.is_some_and(|v| slot.cur.contains(&Some(v))) {
                        self.fail(format!(
                            "Retrieve of key {key} returned {v:?} ({} bytes, DW0 {}), the model allows {:?}",
                            s.data.len(),
                            s.cqe.result,
                            slot.cur
                        ));
                    }
                    self.cover.kv_hits += 1;
                }
                Cmd::Retrieve { .. } | Cmd::Exist { .. } if missing => {
                    if !absent_ok {
                        self.fail(format!("key {key} missing, the model has {:?}", slot.cur));
                    }
                    next.cur = BTreeSet::from([None]);
                }
                Cmd::Exist { .. } if ok && !slot.cur.iter().any(Option::is_some) => {
                    self.fail(format!("key {key} exists, the model has {:?}", slot.cur));
                }
                Cmd::Delete { .. } if ok || missing => {
                    if missing && !absent_ok {
                        self.fail(format!(
                            "Delete: key {key} missing, the model has {:?}",
                            slot.cur
                        ));
                    }
                    next.allowed.insert(None);
                    next.cur = BTreeSet::from([None]);
                }
                Cmd::Delete { .. } => {
                    next.allowed.insert(None);
                    next.cur.insert(None);
                }
                _ => {}
            }
            self.keys[key as usize] = next;
        }
    }

    // -----------------------------------------------------------------------
    // Crash and recovery.

    fn crash(&mut self) {
        self.cover.crashes += 1;
        self.log.push("crash".into());
        let ix = self.kv_index().snapshot();
        self.cover.kv_evictions += ix.evictions;
        self.cover.kv_claims += ix.commit_waits;
        // The process dies: queues, channels, target and pool, then the
        // device loses what its cache held.
        self.world = None;
        self.fault.crash(&mut self.rng);
        let pool = match Pool::open("tsim", self.dev.clone(), pool_opts()) {
            Ok(p) => p,
            Err(e) => self.fail(format!("recovery: {e}")),
        };
        self.start(pool);
        self.settle();
    }

    /// Reads every block and key back through the queues: each must hold a
    /// value the model allows after a crash, which becomes its only value.
    fn settle(&mut self) {
        for nsid in BLOCK_NS {
            for slba in (0..VOL_BLOCKS).step_by(64) {
                let cmd = Cmd::Read {
                    nsid,
                    slba,
                    nlb: 64,
                };
                let s = self.run_batch(std::slice::from_ref(&cmd)).remove(0);
                if s.status() != Status::SUCCESS || s.data.len() != 64 * 512 {
                    self.fail(format!("{cmd:?} after recovery: {s:?}"));
                }
                for (i, b) in s.data.chunks(512).enumerate() {
                    let lba = slba + i as u64;
                    let v = block_value(b, nsid, lba);
                    let Some(slot) = self.blocks.get_mut(&(nsid, lba)) else {
                        continue;
                    };
                    match v {
                        Some(v) if slot.allowed.contains(&v) => slot.settle(v),
                        _ => {
                            let allowed = slot.allowed.clone();
                            self.fail(format!(
                                "after recovery block {nsid}/{lba} holds {v:?} (bytes {:02x?}...), the model allows {allowed:?}",
                                &b[..16]
                            ))
                        }
                    }
                    self.cover.blocks_settled += 1;
                }
            }
        }
        for key in 0..KV_KEYS {
            let cmd = Cmd::Retrieve { key };
            let s = self.run_batch(std::slice::from_ref(&cmd)).remove(0);
            let got = match s.status() {
                Status::SUCCESS => match kv_version(key, &s.data) {
                    Some(v) => Some(v),
                    None => self.fail(format!(
                        "after recovery key {key} holds {} bytes of no value of its own",
                        s.data.len()
                    )),
                },
                Status::KV_KEY_DOES_NOT_EXIST => None,
                other => self.fail(format!("Retrieve of key {key} after recovery: {other}")),
            };
            let slot = &self.keys[key as usize];
            let fine = slot.allowed.contains(&got) || (got.is_none() && self.evict);
            if !fine {
                self.fail(format!(
                    "after recovery key {key} holds {got:?}, the model allows {:?}",
                    slot.allowed
                ));
            }
            self.keys[key as usize].settle(got);
            self.cover.keys_settled += 1;
        }
    }
}

fn run_seed(seed: u64, steps: usize) -> Cover {
    let mut sim = Sim::new(seed);
    for _ in 0..steps {
        sim.step();
    }
    // A last crash without a flush.
    sim.crash();
    sim.cover
}

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(d)
}

#[test]
fn target_simulation_over_many_seeds() {
    let steps = env_u64("KVT_TARGET_SIM_STEPS", 120) as usize;
    if let Ok(s) = std::env::var("KVT_TARGET_SIM_SEED") {
        let seed: u64 = s
            .parse()
            .unwrap_or_else(|_| panic!("KVT_TARGET_SIM_SEED={s} is not a number"));
        eprintln!("seed {seed}: {:?}", run_seed(seed, steps));
        return;
    }
    let seeds = env_u64("KVT_TARGET_SIM_SEEDS", 50);
    let first = env_u64("KVT_TARGET_SIM_FIRST_SEED", 0);
    let mut total = Cover::default();
    for c in kvt_seeds::run_seeds(first, seeds, |seed| run_seed(seed, steps)) {
        total.add(&c);
    }
    eprintln!(
        "target simulation: seeds {first}..{}: {total:?}",
        first + seeds
    );
    // The run must exercise what it is for.
    assert!(total.crashes >= seeds, "{total:?}");
    if seeds >= 20 {
        assert!(
            total.fua_writes > 0
                && total.flushes > 0
                && total.reads_checked > 0
                && total.kv_stores > 0
                && total.kv_hits > 0
                && total.kv_evictions > 0
                && total.kv_claims > 0
                && total.reordered > 0
                && total.kv_answers_late > 0
                && total.fuses > 0
                && total.rdma_controllers > 0,
            "not exercised: {total:?}"
        );
    }
}
