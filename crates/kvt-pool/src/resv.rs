//! A volume's persisted namespace reservation (Persist Through Power Loss):
//! the target hands each change to `persist_reservation` (lock-free, from a
//! reactor); the metadata thread sets it on the volume, journals it as a
//! `Record::VolumeResv` with its next commit and then says whether it is
//! durable. Checkpoints carry every volume's record, recovery loads it, a
//! deleted volume takes it along.

use super::*;

/// Told whether a reservation record is durable (false: not journaled, or
/// the commit failed).
pub type ResvDone = Box<dyn FnOnce(bool) + Send>;

/// A reservation record waiting for the metadata thread.
pub(super) struct ResvReq {
    vol: u32,
    resv: Option<VolumeResv>,
    done: ResvDone,
}

impl ResvReq {
    /// Answers it "not durable" (the pool is read-only).
    pub(super) fn refuse(self) {
        (self.done)(false);
    }
}

impl Pool {
    /// Makes `resv` the persisted reservation of volume `vol` (`None`: PTPL
    /// is off, nothing kept); `done` hears once it is durable or refused.
    /// Changes of one volume are journaled in the order they are handed in.
    pub fn persist_reservation(&self, vol: u32, resv: Option<VolumeResv>, done: ResvDone) {
        self.resv_reqs.push(ResvReq { vol, resv, done });
        self.wake_md();
    }

    /// Metadata thread: takes the queued reservation records. Each one a
    /// volume can keep is set on it and queued for the next commit (its
    /// `done` comes back, answered after that commit); one for a volume that
    /// is gone, or that would overrun the checkpoint room the records share
    /// (`RESV_CKPT_ROOM`), is refused at once.
    pub(super) fn take_resv_reqs(&self, m: &mut Meta) -> Vec<ResvDone> {
        let mut waiting = Vec::new();
        while let Some(r) = self.resv_reqs.pop() {
            let Some(v) = self.volume_by_id(r.vol) else {
                (r.done)(false);
                continue;
            };
            if !self.resv_fits(r.vol, r.resv.as_ref()) {
                tracing::error!(pool = %self.name, volume = %v.desc.name, "reservation record refused: the pool's {RESV_CKPT_ROOM}-byte room for them is full");
                (r.done)(false);
                continue;
            }
            v.set_reservation(r.resv.clone());
            m.pending.push(Record::VolumeResv {
                vol: r.vol,
                resv: r.resv,
            });
            waiting.push(r.done);
        }
        waiting
    }

    /// Whether `resv` as volume `vol`'s record keeps every record within
    /// the registrant cap and the checkpoint room.
    fn resv_fits(&self, vol: u32, resv: Option<&VolumeResv>) -> bool {
        let Some(new) = resv else { return true };
        if new.registrants.len() > MAX_RESV_REGISTRANTS {
            return false;
        }
        let others: usize = self
            .volumes()
            .iter()
            .filter(|v| v.desc.id != vol)
            .filter_map(|v| v.reservation())
            .map(|r| 4 + r.encoded_len())
            .sum();
        others + 4 + new.encoded_len() <= RESV_CKPT_ROOM
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_bdev::ram::RamDevice;
    use std::sync::atomic::AtomicU8;

    fn resv(n: usize) -> VolumeResv {
        let registrants: Vec<([u8; 16], u64)> = (0..n)
            .map(|i| {
                let mut h = [0xC0; 16];
                h[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
                (h, 100 + i as u64)
            })
            .collect();
        VolumeResv {
            generation: n as u32,
            held: registrants.first().map(|(h, _)| (1, *h)),
            registrants,
        }
    }

    fn opts() -> PoolOptions {
        PoolOptions::stepped()
    }

    /// 0: not answered, 1: durable, 2: refused.
    fn answer() -> (Arc<AtomicU8>, ResvDone) {
        let a = Arc::new(AtomicU8::new(0));
        let b = a.clone();
        (
            a,
            Box::new(move |ok| b.store(if ok { 1 } else { 2 }, Ordering::Release)),
        )
    }

    fn persist(pool: &Pool, vol: u32, r: Option<VolumeResv>) -> u8 {
        let (a, done) = answer();
        pool.persist_reservation(vol, r, done);
        assert_eq!(a.load(Ordering::Acquire), 0, "answered before the commit");
        pool.md_step(Instant::now());
        a.load(Ordering::Acquire)
    }

    fn setup() -> (SharedDevice, Arc<Pool>, u32) {
        let dev: SharedDevice = RamDevice::new("resv", 64 << 20).unwrap();
        crate::format(&dev, &FormatOptions::default()).unwrap();
        let pool = Pool::open("resv", dev.clone(), opts()).unwrap();
        let id = pool.create_volume("v", 8 << 20, 4096, 0).unwrap().desc.id;
        (dev, pool, id)
    }

    /// Without a close: what a SIGKILL leaves is what recovery sees.
    fn reopen(dev: &SharedDevice) -> Arc<Pool> {
        Pool::open("resv", dev.clone(), opts()).unwrap()
    }

    #[test]
    fn a_record_is_journaled_replayed_and_cleared() {
        let (dev, pool, id) = setup();
        assert_eq!(persist(&pool, id, Some(resv(3))), 1);
        assert_eq!(pool.volume("v").unwrap().reservation(), Some(resv(3)));
        // Replayed from the journal (the open's checkpoint came before it).
        drop(pool);
        let pool = reopen(&dev);
        assert_eq!(pool.volume("v").unwrap().reservation(), Some(resv(3)));
        // PTPL off: nothing kept.
        assert_eq!(persist(&pool, id, None), 1);
        drop(pool);
        let pool = reopen(&dev);
        assert_eq!(pool.volume("v").unwrap().reservation(), None);
    }

    #[test]
    fn checkpoints_carry_records_and_deletes_drop_them() {
        let (dev, pool, id) = setup();
        let other = pool.create_volume("w", 4 << 20, 512, 0).unwrap().desc.id;
        assert_eq!(persist(&pool, id, Some(resv(2))), 1);
        assert_eq!(persist(&pool, other, Some(resv(1))), 1);
        pool.checkpoint_now().unwrap();
        // A later change in the journal on top of the checkpoint.
        assert_eq!(persist(&pool, other, Some(resv(4))), 1);
        drop(pool);
        let pool = reopen(&dev);
        assert_eq!(pool.volume("v").unwrap().reservation(), Some(resv(2)));
        assert_eq!(pool.volume("w").unwrap().reservation(), Some(resv(4)));
        pool.delete_volume("v").unwrap();
        // A record for the deleted volume is refused, not journaled.
        assert_eq!(persist(&pool, id, Some(resv(1))), 2);
        drop(pool);
        let pool = reopen(&dev);
        assert!(pool.volume("v").is_none());
        assert_eq!(pool.volume("w").unwrap().reservation(), Some(resv(4)));
        // The offline check reads and describes it.
        pool.close().unwrap();
        let rep = crate::check(&dev);
        assert!(rep.damage.is_empty(), "{:?}", rep.damage);
        assert!(
            rep.lines.iter().any(|l| l.contains("4 registrants")),
            "{:?}",
            rep.lines
        );
    }

    #[test]
    fn records_past_the_cap_or_the_room_are_refused() {
        let (_dev, pool, id) = setup();
        assert_eq!(persist(&pool, id, Some(resv(MAX_RESV_REGISTRANTS + 1))), 2);
        // The largest record fits; a second volume's as large does not.
        let big = |seed: u8| VolumeResv {
            registrants: (0..MAX_RESV_REGISTRANTS)
                .map(|i| {
                    let mut h = [seed; 16];
                    h[..8].copy_from_slice(&(i as u64).to_le_bytes());
                    (h, 1)
                })
                .collect(),
            ..VolumeResv::default()
        };
        assert_eq!(persist(&pool, id, Some(big(1))), 1);
        let other = pool.create_volume("w", 4 << 20, 512, 0).unwrap().desc.id;
        assert_eq!(persist(&pool, other, Some(big(2))), 2);
        assert_eq!(persist(&pool, other, Some(resv(2))), 1);
        assert!(pool.verify_live().0.is_empty());
        // The checkpoint that holds them fits its slot.
        pool.checkpoint_now().unwrap();
    }
}
