//! A shared pool's owner epoch (issue 36): the node that wins the election of
//! a shared pool opens it with its epoch (`Pool::open_owned`), which writes
//! the epoch into the superblock's block before recovery and anything
//! else; every metadata commit and checkpoint re-reads it first
//! (`check_epoch`) and is refused when a newer owner has written a larger
//! one. The pool then fails like after a write error: read-only, allocations
//! fail, and `superseded` tells the cluster to fence the groups.
//!
//! What this does not close: the window between the re-read and the write
//! it guards (a new owner that takes over inside it is not seen by that one
//! commit), and data writes to blocks already mapped, which go in place
//! without a commit; the lease fence (half the TTL) and the I/O path's
//! deadline check guard those. A real dual-ported device would close the
//! window with an NVMe reservation (preempt and abort); not done.

use super::*;
use kvt_meta::epoch::{newest_epoch, put_epoch, EpochRecord};
use kvt_meta::SUPERBLOCK_VERSION_EPOCH;

impl Pool {
    /// Opens a shared pool as its owner with epoch `epoch` (the election's,
    /// never 0): writes the epoch into the superblock's block, then recovers
    /// the pool from its journal (the old owner's later commits are refused,
    /// so none is lost between the two) and writes `open`'s checkpoint.
    /// Refused when the pool shows a newer epoch, or has no epoch record
    /// (superblock format 1).
    pub fn open_owned(
        name: &str,
        dev: SharedDevice,
        opts: PoolOptions,
        epoch: u64,
        node: &str,
    ) -> Result<Arc<Pool>, PoolError> {
        assert!(epoch > 0, "epoch 0 means not owned");
        Pool::open_inner(name, dev, opts, Some((epoch, node)))
    }

    /// Writes `epoch` into the superblock's block (before recovery's
    /// checkpoint, with the metadata lock held by the caller).
    pub(super) fn write_epoch(
        name: &str,
        io: &mut SyncIo,
        sb: &Superblock,
        epoch: u64,
        node: &str,
    ) -> Result<(), PoolError> {
        if sb.version < SUPERBLOCK_VERSION_EPOCH {
            return Err(PoolError::NoEpochRecord {
                pool: name.into(),
                version: sb.version,
            });
        }
        let mut block = io.read(0, META_BLOCK as usize)?;
        let rec = EpochRecord {
            pool_uuid: sb.uuid,
            epoch,
            node: node.into(),
        };
        put_epoch(&mut block, &rec).map_err(|newer| PoolError::Superseded {
            pool: name.into(),
            epoch,
            newer: newer.epoch,
            node: newer.node,
        })?;
        io.write(0, &block)?;
        io.flush()?;
        tracing::info!(
            pool = name,
            epoch,
            node,
            "pool taken over: owner epoch written"
        );
        Ok(())
    }

    /// This owner's epoch (0: not a shared pool, nothing to check).
    pub fn owner_epoch(&self) -> u64 {
        self.owner_epoch
    }

    /// A newer owner's epoch refused a commit: this node writes no more.
    pub fn superseded(&self) -> bool {
        self.superseded.load(Ordering::Acquire)
    }

    /// Re-reads the owner epoch before a metadata write: refused when a newer
    /// owner took the pool over.
    pub(super) fn check_epoch(&self, m: &mut Meta) -> Result<(), PoolError> {
        if self.owner_epoch == 0 {
            return Ok(());
        }
        let block = m.io.read(0, META_BLOCK as usize)?;
        match newest_epoch(&block, &self.sb.uuid) {
            Some(n) if n.epoch > self.owner_epoch => {
                self.superseded.store(true, Ordering::Release);
                tracing::error!(pool = %self.name, epoch = self.owner_epoch, newer = n.epoch, node = %n.node, "superseded by a newer owner: no more metadata writes");
                Err(PoolError::Superseded {
                    pool: self.name.clone(),
                    epoch: self.owner_epoch,
                    newer: n.epoch,
                    node: n.node,
                })
            }
            _ => Ok(()),
        }
    }

    /// Lets go of a pool this node no longer owns (fenced or superseded):
    /// stops the metadata thread and writes nothing, neither a commit nor a
    /// checkpoint (the next owner recovers from the journal).
    pub fn release(&self) {
        {
            let mut m = lock(&self.meta);
            m.failed
                .get_or_insert_with(|| "released: no longer the owner".into());
            self.failed.store(true, Ordering::Release);
        }
        self.stop.store(true, Ordering::Release);
        self.wake_md();
        if let Some(h) = lock(&self.md_thread).take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_bdev::ram::RamDevice;

    fn opts() -> PoolOptions {
        PoolOptions::stepped()
    }

    fn volumes_recovered(dev: &SharedDevice) -> Vec<String> {
        let mut io = SyncIo::new(dev).unwrap();
        let (_, img, _) = load_image(&mut io, dev.size_bytes()).unwrap();
        img.volumes.values().map(|v| v.desc.name.clone()).collect()
    }

    /// Two openers, epochs 5 then 7: the epoch-5 writer's next commit is
    /// refused, and nothing it wrote after 7 took over is visible to a
    /// recovery; the epoch-7 owner writes on.
    #[test]
    fn the_older_owner_is_refused_after_a_takeover() {
        let dev: SharedDevice = RamDevice::new("shared", 64 << 20).unwrap();
        crate::format(&dev, &FormatOptions::default()).unwrap();
        let a = Pool::open_owned("p", dev.clone(), opts(), 5, "node-a").unwrap();
        a.create_volume("before", 1 << 20, 4096, 0).unwrap();
        let b = Pool::open_owned("p", dev.clone(), opts(), 7, "node-b").unwrap();
        assert_eq!(
            b.volume("before").map(|v| v.desc.name.clone()).as_deref(),
            Some("before")
        );
        let refused = a.create_volume("after", 1 << 20, 4096, 0);
        assert!(
            matches!(
                refused,
                Err(PoolError::Superseded {
                    epoch: 5,
                    newer: 7,
                    ..
                })
            ),
            "{:?}",
            refused.err()
        );
        assert!(a.superseded());
        assert!(a.sync().is_err(), "read-only from then on");
        assert!(a.checkpoint_now().is_err());
        b.create_volume("by-b", 1 << 20, 4096, 0).unwrap();
        let mut seen = volumes_recovered(&dev);
        seen.sort();
        assert_eq!(seen, ["before", "by-b"]);
        a.release();
        b.close().unwrap();
        assert_eq!(volumes_recovered(&dev).len(), 2);
        // The older epoch cannot take the pool back.
        let again = Pool::open_owned("p", dev.clone(), opts(), 6, "node-a");
        assert!(matches!(again, Err(PoolError::Superseded { newer: 7, .. })));
    }

    #[test]
    fn a_format_1_pool_cannot_be_owned_but_still_opens() {
        let dev: SharedDevice = RamDevice::new("old", 64 << 20).unwrap();
        let sb = crate::format(&dev, &FormatOptions::default()).unwrap();
        let old = Superblock {
            version: kvt_meta::FORMAT_VERSION,
            ..sb
        };
        SyncIo::new(&dev).unwrap().write(0, &old.encode()).unwrap();
        let owned = Pool::open_owned("p", dev.clone(), opts(), 3, "n");
        assert!(matches!(
            owned,
            Err(PoolError::NoEpochRecord { version: 1, .. })
        ));
        let p = Pool::open("p", dev, opts()).unwrap();
        assert_eq!(p.owner_epoch(), 0);
        p.close().unwrap();
    }

    #[test]
    fn a_released_pool_writes_nothing() {
        let dev: SharedDevice = RamDevice::new("rel", 64 << 20).unwrap();
        crate::format(&dev, &FormatOptions::default()).unwrap();
        let a = Pool::open_owned("p", dev.clone(), opts(), 4, "a").unwrap();
        let meta_len = a.sb.data_offset as usize;
        let before = SyncIo::new(&dev).unwrap().read(0, meta_len).unwrap();
        a.release();
        assert!(a.create_volume("x", 1 << 20, 4096, 0).is_err());
        assert!(a.close().is_err());
        let after = SyncIo::new(&dev).unwrap().read(0, meta_len).unwrap();
        assert!(
            before[..] == after[..],
            "a released pool wrote to its device"
        );
    }
}
