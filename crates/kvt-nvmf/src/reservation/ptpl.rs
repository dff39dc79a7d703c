//! Persist Through Power Loss for a namespace: its registrants and
//! reservation in one of two sinks (`PtplSink`), each written off the
//! reactor, each reporting through the namespace's `Durability` so a
//! command waits on a `PtplWait` the same way whichever it is:
//!
//! - a JSON file (SPDK's `ptpl_file`, SPDK's format: `ptpl`, `rtype`,
//!   `crkey`, `bdev_uuid`, `holder_uuid`, `registrants` of `rkey` and
//!   `host_uuid`), written whole and atomically (temporary file, fsync,
//!   rename, fsync of the directory) by one writer thread;
//! - a pool volume's record in the pool's metadata (`Record::VolumeResv`),
//!   journaled by the pool's metadata thread and carried in checkpoints.
//!
//! Either is read once when the namespace is created.

use super::{Held, HostId, Registrant, ResvState, ResvType};
use kvt_pool::format::VolumeResv;
use kvt_pool::Pool;
use kvt_wire::ident::uuid_text;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

/// Why a PTPL file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PtplError {
    #[error("PTPL file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("PTPL file {path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("PTPL file {path}: {field} is not valid: {value}")]
    Field {
        path: PathBuf,
        field: &'static str,
        value: String,
    },
}

/// One registrant as SPDK writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtplRegistrant {
    pub rkey: u64,
    pub host_uuid: String,
}

/// The file's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtplFile {
    pub ptpl: bool,
    #[serde(default)]
    pub rtype: u8,
    #[serde(default)]
    pub crkey: u64,
    #[serde(default)]
    pub bdev_uuid: String,
    #[serde(default)]
    pub holder_uuid: String,
    #[serde(default)]
    pub registrants: Vec<PtplRegistrant>,
}

fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, x) in b.iter_mut().enumerate() {
        *x = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(b)
}

impl PtplFile {
    /// The file for `state` of the namespace with UUID `ns_uuid`.
    pub fn of(state: &ResvState, ns_uuid: &[u8; 16]) -> PtplFile {
        let holder = state.held.map(|h| h.holder);
        PtplFile {
            ptpl: state.ptpl,
            rtype: state.held.map_or(0, |h| h.rtype.raw()),
            crkey: holder
                .and_then(|h| state.registrants.iter().find(|r| r.host == h))
                .map_or(0, |r| r.key),
            bdev_uuid: uuid_text(ns_uuid),
            holder_uuid: holder.map_or_else(String::new, |h| uuid_text(&h.bytes)),
            registrants: state
                .registrants
                .iter()
                .map(|r| PtplRegistrant {
                    rkey: r.key,
                    host_uuid: uuid_text(&r.host.bytes),
                })
                .collect(),
        }
    }

    /// The state it holds (controller IDs are not kept: FFFFh, "none").
    pub fn state(&self, path: &Path) -> Result<ResvState, PtplError> {
        let bad = |field, value: &str| PtplError::Field {
            path: path.into(),
            field,
            value: value.into(),
        };
        let mut s = ResvState {
            ptpl: self.ptpl,
            ..ResvState::default()
        };
        if !self.ptpl {
            return Ok(s);
        }
        for r in &self.registrants {
            let id = parse_uuid(&r.host_uuid).ok_or_else(|| bad("host_uuid", &r.host_uuid))?;
            let host = HostId::extended(id);
            if !s.is_registered(&host) {
                s.registrants.push(Registrant {
                    host,
                    key: r.rkey,
                    cntlid: 0xFFFF,
                });
            }
        }
        if self.rtype != 0 {
            let rtype = ResvType::from_raw(self.rtype)
                .map_err(|_| bad("rtype", &self.rtype.to_string()))?;
            let id = parse_uuid(&self.holder_uuid)
                .ok_or_else(|| bad("holder_uuid", &self.holder_uuid))?;
            let holder = HostId::extended(id);
            if !s.is_registered(&holder) {
                return Err(bad("holder_uuid", &self.holder_uuid));
            }
            s.held = Some(Held { rtype, holder });
        }
        s.generation = s.registrants.len() as u32;
        Ok(s)
    }
}

/// Reads `path`: `None` when there is no such file yet.
pub fn load(path: &Path) -> Result<Option<ResvState>, PtplError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(PtplError::Io {
                path: path.into(),
                source,
            })
        }
    };
    let f: PtplFile = serde_json::from_slice(&text).map_err(|source| PtplError::Json {
        path: path.into(),
        source,
    })?;
    f.state(path).map(Some)
}

/// Writes `f` to `path` atomically: a reader (or a restart after a crash)
/// sees the old file or the new one, never a part.
pub fn save(path: &Path, f: &PtplFile) -> Result<(), PtplError> {
    let io = |source| PtplError::Io {
        path: path.into(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let text = serde_json::to_vec_pretty(f).map_err(|source| PtplError::Json {
        path: path.into(),
        source,
    })?;
    let mut file = std::fs::File::create(&tmp).map_err(io)?;
    file.write_all(&text).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

/// How far the writer got with one namespace's file. Each change handed to
/// the writer gets the next sequence number (under the state's lock, so in
/// the order of the changes); the writer may skip to the newest.
#[derive(Debug, Default)]
pub struct Durability {
    pub queued: AtomicU64,
    /// The newest change the writer finished with (durable or failed).
    done: AtomicU64,
    /// The newest change whose write failed.
    failed: AtomicU64,
}

impl Durability {
    /// `None` while change `seq` is not written yet; then whether it is
    /// durable (a later change written durably covers it).
    pub fn outcome(&self, seq: u64) -> Option<bool> {
        if self.done.load(Ordering::Acquire) < seq {
            return None;
        }
        Some(self.failed.load(Ordering::Acquire) < seq)
    }

    fn finished(&self, seq: u64, ok: bool) {
        if !ok {
            self.failed.fetch_max(seq, Ordering::AcqRel);
        }
        self.done.fetch_max(seq, Ordering::AcqRel);
    }
}

/// A command waiting for its change to be durable before it is answered.
#[derive(Debug, Clone)]
pub struct PtplWait {
    pub durability: Arc<Durability>,
    pub seq: u64,
}

/// Where a namespace's reservation persists through power loss.
#[derive(Clone)]
pub enum PtplSink {
    /// SPDK's `ptpl_file`.
    File(PathBuf),
    /// The pool volume the namespace serves: a record in its pool's
    /// metadata.
    PoolVolume { pool: Arc<Pool>, vol: u32 },
}

impl std::fmt::Debug for PtplSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PtplSink::File(p) => write!(f, "File({})", p.display()),
            PtplSink::PoolVolume { pool, vol } => write!(f, "PoolVolume({}/{vol})", pool.name),
        }
    }
}

impl PtplSink {
    /// The PTPL file, when that is the sink.
    pub fn file(&self) -> Option<&Path> {
        match self {
            PtplSink::File(p) => Some(p),
            PtplSink::PoolVolume { .. } => None,
        }
    }

    /// Hands `s` (PTPL on, or just turned off) to the sink as the next
    /// change of `d`: what a command waits on before it is answered.
    pub fn persist(&self, s: &ResvState, ns_uuid: &[u8; 16], d: &Arc<Durability>) -> PtplWait {
        let seq = match self {
            PtplSink::File(path) => persist(path, PtplFile::of(s, ns_uuid), d),
            PtplSink::PoolVolume { pool, vol } => {
                let seq = d.queued.fetch_add(1, Ordering::AcqRel) + 1;
                let to = d.clone();
                pool.persist_reservation(
                    *vol,
                    volume_resv_of(s),
                    Box::new(move |ok| to.finished(seq, ok)),
                );
                seq
            }
        };
        PtplWait {
            durability: d.clone(),
            seq,
        }
    }
}

/// The pool record of `s`: nothing when PTPL is off (the spec keeps
/// nothing then). Controller IDs are not kept.
pub fn volume_resv_of(s: &ResvState) -> Option<VolumeResv> {
    if !s.ptpl {
        return None;
    }
    Some(VolumeResv {
        generation: s.generation,
        registrants: s
            .registrants
            .iter()
            .map(|r| (r.host.bytes, r.key))
            .collect(),
        held: s.held.map(|h| (h.rtype.raw(), h.holder.bytes)),
    })
}

/// The state a pool record holds (PTPL on; controller IDs FFFFh, "none").
/// The record was checked when the pool read it: RTYPE, a holder that is
/// a registrant.
pub fn state_of_volume_resv(r: &VolumeResv) -> ResvState {
    let held = r.held.and_then(|(t, holder)| {
        Some(Held {
            rtype: ResvType::from_raw(t).ok()?,
            holder: HostId::extended(holder),
        })
    });
    ResvState {
        registrants: r
            .registrants
            .iter()
            .map(|(host, key)| Registrant {
                host: HostId::extended(*host),
                key: *key,
                cntlid: 0xFFFF,
            })
            .collect(),
        held,
        generation: r.generation,
        ptpl: true,
    }
}

/// A file to write, what to write in it, and whom to tell.
type Job = (PathBuf, PtplFile, u64, Arc<Durability>);

/// The writer thread's inbox: files to write, in order.
fn writer() -> Option<&'static Mutex<mpsc::Sender<Job>>> {
    static WRITER: OnceLock<Option<Mutex<mpsc::Sender<Job>>>> = OnceLock::new();
    WRITER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("ptpl-writer".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        // Only the newest state of each file matters.
                        let mut latest = vec![job];
                        while let Ok(j) = rx.try_recv() {
                            latest.retain(|q| q.0 != j.0);
                            latest.push(j);
                        }
                        for (p, f, seq, d) in latest {
                            let r = save(&p, &f);
                            if let Err(e) = &r {
                                tracing::error!(error = %e, "reservation state not persisted");
                            }
                            d.finished(seq, r.is_ok());
                        }
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Hands `f` to the writer thread for `path`: the next change of `d`,
/// whose number comes back.
pub fn persist(path: &Path, f: PtplFile, d: &Arc<Durability>) -> u64 {
    let seq = d.queued.fetch_add(1, Ordering::AcqRel) + 1;
    let sent = writer()
        .and_then(|w| w.lock().ok())
        .is_some_and(|tx| tx.send((path.to_path_buf(), f, seq, d.clone())).is_ok());
    if !sent {
        tracing::error!(path = %path.display(), "PTPL writer thread unavailable; reservation state not persisted");
        d.finished(seq, false);
    }
    seq
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ResvState {
        let a = HostId::extended([0xA5; 16]);
        let b = HostId::extended([0xB6; 16]);
        ResvState {
            registrants: vec![
                Registrant {
                    host: a,
                    key: 0xA,
                    cntlid: 0xFFFF,
                },
                Registrant {
                    host: b,
                    key: 0xB,
                    cntlid: 0xFFFF,
                },
            ],
            held: Some(Held {
                rtype: ResvType::WriteExclusive,
                holder: b,
            }),
            generation: 2,
            ptpl: true,
        }
    }

    #[test]
    fn saved_state_loads_back_in_spdk_format() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ns1.json");
        assert!(load(&p).unwrap().is_none(), "no file yet");
        let f = PtplFile::of(&state(), &[7; 16]);
        assert_eq!(f.crkey, 0xB);
        assert_eq!(f.holder_uuid, "b6b6b6b6-b6b6-b6b6-b6b6-b6b6b6b6b6b6");
        save(&p, &f).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(v["rtype"], 1);
        assert_eq!(v["registrants"][0]["rkey"], 10);
        assert_eq!(load(&p).unwrap(), Some(state()));
        assert!(!dir.path().join("ns1.json.tmp").exists());
    }

    #[test]
    fn ptpl_off_keeps_nothing_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        let mut s = state();
        s.ptpl = false;
        save(&p, &PtplFile::of(&s, &[0; 16])).unwrap();
        assert_eq!(
            load(&p).unwrap(),
            Some(ResvState {
                ptpl: false,
                ..ResvState::default()
            })
        );
        std::fs::write(&p, br#"{"ptpl":true,"rtype":9,"holder_uuid":"x"}"#).unwrap();
        assert!(matches!(
            load(&p),
            Err(PtplError::Field { field: "rtype", .. })
        ));
        std::fs::write(&p, b"{").unwrap();
        assert!(matches!(load(&p), Err(PtplError::Json { .. })));
    }

    #[test]
    fn pool_records_translate_both_ways() {
        let s = state();
        let r = volume_resv_of(&s).unwrap();
        assert_eq!(r.held, Some((1, [0xB6; 16])));
        assert_eq!(state_of_volume_resv(&r), s);
        let off = ResvState {
            ptpl: false,
            ..state()
        };
        assert_eq!(volume_resv_of(&off), None, "PTPL off keeps nothing");
    }

    /// A pool volume's namespace persists in the pool: the change waits for
    /// the metadata thread's commit, and a reopened pool (no close: what a
    /// SIGKILL leaves) gives a new namespace the same state.
    #[test]
    fn a_pool_volume_persists_in_the_pool() {
        use kvt_pool::{FormatOptions, Pool, PoolOptions};
        let dev: kvt_bdev::SharedDevice = kvt_bdev::ram::RamDevice::new("ptpl", 64 << 20).unwrap();
        kvt_pool::format(&dev, &FormatOptions::default()).unwrap();
        let opts = PoolOptions::stepped;
        let pool = Pool::open("p", dev.clone(), opts()).unwrap();
        let vol = pool.create_volume("v", 8 << 20, 4096, 0).unwrap();
        let ns = super::super::NsReservation::for_pool_volume(pool.clone(), &vol, [3; 16]);
        assert!(ns.ptpl_capable() && ns.ptpl_file().is_none());
        let (_, wait) = ns.with_persisted(|s| *s = state()).unwrap();
        let wait = wait.expect("PTPL on: a change waits");
        assert_eq!(wait.durability.outcome(wait.seq), None, "not committed yet");
        pool.md_step(std::time::Instant::now());
        assert_eq!(wait.durability.outcome(wait.seq), Some(true));
        drop((ns, vol, pool));
        let pool = Pool::open("p", dev.clone(), opts()).unwrap();
        let vol = pool.volume("v").unwrap();
        let ns = super::super::NsReservation::for_pool_volume(pool.clone(), &vol, [3; 16]);
        assert_eq!(*ns.state.lock().unwrap(), state());
        // PTPL off: the record goes; a restart finds nothing.
        let (_, wait) = ns.with_persisted(|s| s.ptpl = false).unwrap();
        let wait = wait.expect("turning PTPL off is persisted");
        pool.md_step(std::time::Instant::now());
        assert_eq!(wait.durability.outcome(wait.seq), Some(true));
        drop((ns, vol, pool));
        let pool = Pool::open("p", dev, opts()).unwrap();
        assert_eq!(pool.volume("v").unwrap().reservation(), None);
    }

    #[test]
    fn the_writer_thread_writes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.json");
        let d = Arc::new(Durability::default());
        let seq = persist(&p, PtplFile::of(&state(), &[1; 16]), &d);
        assert_eq!(seq, 1);
        for _ in 0..500 {
            if let Some(ok) = d.outcome(seq) {
                assert!(ok);
                assert_eq!(load(&p).unwrap(), Some(state()));
                // A write that fails (no such directory) says so.
                let bad = dir.path().join("none/w.json");
                let seq = persist(&bad, PtplFile::of(&state(), &[1; 16]), &d);
                for _ in 0..500 {
                    if let Some(ok) = d.outcome(seq) {
                        assert!(!ok);
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                panic!("the failed write never finished");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("not written");
    }
}
