//! Journal commits and checkpoints: what the metadata thread writes through
//! `kvt_meta`, and the orderings that make it crash-safe (data before the
//! records that name it, a checkpoint before journal space is reused).

use super::*;
use kvt_meta::checkpoint::ExtentMapping;

#[cfg(test)]
thread_local! {
    /// Runs once between a commit's drain of KV keys and its drain of
    /// extents (tests: a Store that completes right there).
    pub(super) static BETWEEN_DRAINS: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Largest journal entry.
const MAX_ENTRY: usize = 256 << 10;

impl Pool {
    /// Writes the journal entries for `extra` plus every change made so far,
    /// then flushes the device.
    pub(super) fn commit(&self, m: &mut Meta, extra: Vec<Record>) -> Result<(), PoolError> {
        if let Some(f) = &m.failed {
            return Err(PoolError::ReadOnly {
                pool: self.name.clone(),
                cause: f.clone(),
            });
        }
        let t0 = std::time::Instant::now();
        let r = self.commit_inner(m, extra);
        self.stats
            .last_commit_ns
            .store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Err(e) = &r {
            m.failed = Some(e.to_string());
        }
        self.kv_committed(r.is_ok());
        // The next step restarts the periodic commit's interval from its now.
        m.last_commit = None;
        r
    }

    fn commit_inner(&self, m: &mut Meta, extra: Vec<Record>) -> Result<(), PoolError> {
        self.check_epoch(m)?;
        // Checkpoint before draining changes, never in the middle: a record
        // drained before a checkpoint and written after it would replay an
        // older state over the checkpoint's.
        if m.used > self.sb.journal_len / 4 {
            self.checkpoint(m)?;
        }
        let mut records = std::mem::take(&mut m.pending);
        self.drain_changes(&mut records);
        records.extend(extra);
        if records.is_empty() {
            // Nothing to journal: a Flush only needs the device flushed.
            m.io.flush()?;
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // Data before metadata: an entry that marks blocks valid must not
        // reach the device before their data does, or a crash could keep the
        // entry and lose the data (the blocks would read their old contents).
        // The same for a key's record and its value.
        if records
            .iter()
            .any(|r| matches!(r, Record::Extent { .. } | Record::KvPut { .. }))
        {
            m.io.flush()?;
        }
        let entries = pack_entries(&records, MAX_ENTRY.min(self.sb.journal_len as usize / 8));
        let total: u64 = entries
            .iter()
            .map(|e| round_up((HEADER_LEN + e.len()) as u64, META_BLOCK) * 2)
            .sum();
        if m.used + total > self.sb.journal_len / 2 {
            // Too much for the journal: a checkpoint captures all of it (the
            // drained extents at their current state; a Clean list left out
            // only means those extents are scrubbed again after a crash).
            return self.checkpoint(m);
        }
        for payload in entries {
            self.append_entry(m, &payload)?;
        }
        m.io.flush()?;
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Appends every volume's changed extents and KV keys since the last
    /// commit to `records`.
    ///
    /// A volume's KV keys are drained before its extents and journaled after
    /// them. A key reaches the index only after its value's write set the
    /// blocks' valid bits, so extents drained after the keys carry every bit
    /// those keys need; drained the other way round, a Store completing
    /// between the two drains put its key in this commit and its bits in the
    /// next, and a SIGKILL between them left a key naming a block that holds
    /// no data (`kvtarget check`, tests/kv.rs, 3 runs in 21 under load). In
    /// the journal the extents come first: replay stops at the first entry a
    /// crash left unwritten, so a key is never replayed without its bits.
    fn drain_changes(&self, records: &mut Vec<Record>) {
        let mut changed = Vec::new();
        let mut kv_changed = Vec::new();
        for v in self.volumes() {
            kv_changed.clear();
            if let Some(kv) = &v.kv {
                kv.drain_changes(&mut kv_changed);
            }
            #[cfg(test)]
            if let Some(f) = BETWEEN_DRAINS.with(|h| h.borrow_mut().take()) {
                f();
            }
            v.drain_dirty(&mut changed);
            records.extend(changed.drain(..).map(|m| Record::Extent {
                vol: m.vol,
                lext: m.lext,
                phys: m.phys,
                bitmap: m.bitmap,
            }));
            records.extend(kv_changed.drain(..).map(|(key, loc)| match loc {
                Some(loc) => Record::KvPut {
                    vol: v.desc.id,
                    key,
                    loc,
                },
                None => Record::KvDelete {
                    vol: v.desc.id,
                    key,
                },
            }));
        }
    }

    /// Seals one entry's payload and writes it at the journal head (at the
    /// ring's start when it does not fit before the end), without a flush.
    fn append_entry(&self, m: &mut Meta, payload: &[u8]) -> Result<(), PoolError> {
        let block = seal(
            JOURNAL_MAGIC,
            BlockHeader {
                seq: m.seq,
                journal_seq: 0,
                journal_pos: 0,
                payload_len: 0,
                payload_crc: 0,
                pool_tag: self.pool_tag,
            },
            payload,
        );
        let len = block.len() as u64;
        // An entry that does not fit before the end of the ring (even
        // when the head sits exactly at the end) starts at 0.
        let wrap = m.head + len > self.sb.journal_len;
        assert!(m.head <= self.sb.journal_len, "journal head past the ring");
        let gap = if wrap {
            self.sb.journal_len - m.head
        } else {
            0
        };
        if m.used + gap + len > self.sb.journal_len {
            return Err(PoolError::JournalOverflow);
        }
        if wrap {
            m.head = 0;
        }
        m.io.write(self.sb.journal_offset + m.head, &block)?;
        m.head += len;
        m.used += gap + len;
        debug_assert!(
            m.head <= self.sb.journal_len && m.used <= self.sb.journal_len,
            "journal head {} / used {} past the {}-byte ring",
            m.head,
            m.used,
            self.sb.journal_len
        );
        m.seq += 1;
        Ok(())
    }

    /// Writes the whole metadata state to the older checkpoint slot; the journal
    /// restarts after it.
    pub(super) fn checkpoint(&self, m: &mut Meta) -> Result<(), PoolError> {
        self.check_epoch(m)?;
        let t0 = std::time::Instant::now();
        // Data before metadata, as in a commit: the values and blocks the
        // checkpoint names reach the device before it does.
        m.io.flush()?;
        // Changes queued so far are captured by the snapshot below. If this
        // write tears, the older checkpoint and its journal are still intact.
        for v in self.volumes() {
            v.clear_dirty();
        }
        let data = self.checkpoint_data(m);
        if cfg!(debug_assertions) {
            self.assert_unmapped(&data.clean, "clean");
        }
        let gen = m.ckpt_gen + 1;
        let block = seal(
            CHECKPOINT_MAGIC,
            BlockHeader {
                seq: gen,
                journal_seq: m.seq,
                journal_pos: m.head,
                payload_len: 0,
                payload_crc: 0,
                pool_tag: self.pool_tag,
            },
            &data.encode(),
        );
        if block.len() as u64 > self.sb.ckpt_slot_len {
            return Err(PoolError::CheckpointTooLarge {
                bytes: block.len() as u64,
                slot: self.sb.ckpt_slot_len,
            });
        }
        let slot = gen % 2;
        m.io.write(self.sb.ckpt_offset + slot * self.sb.ckpt_slot_len, &block)?;
        m.io.flush()?;
        m.ckpt_gen = gen;
        m.used = 0;
        // Pending control records are captured by the volume table above.
        m.pending.clear();
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        let s = &self.stats;
        s.last_checkpoint_bytes
            .store(block.len() as u64, Ordering::Relaxed);
        s.last_checkpoint_ns
            .store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.kv_committed(true);
        Ok(())
    }

    /// Writes a checkpoint now (control path: `kvtarget_pool_checkpoint`,
    /// bench/run-scale.sh), after flushing the data it will name, with the
    /// error handling of a commit: a failure leaves the pool read-only.
    pub fn checkpoint_now(&self) -> Result<(), PoolError> {
        let mut m = lock(&self.meta);
        if let Some(f) = &m.failed {
            return Err(PoolError::ReadOnly {
                pool: self.name.clone(),
                cause: f.clone(),
            });
        }
        let r =
            m.io.flush()
                .map_err(PoolError::from)
                .and_then(|()| self.checkpoint(&mut m));
        if let Err(e) = &r {
            m.failed = Some(e.to_string());
            self.kv_committed(false);
        }
        m.last_commit = None;
        r
    }

    /// Tells KV indexes whether the commit that took their changes is
    /// durable: blocks their keys gave up before it are free for reuse.
    pub(super) fn kv_committed(&self, ok: bool) {
        for v in self.volumes() {
            if let Some(kv) = &v.kv {
                kv.committed(ok);
            }
        }
    }

    /// The whole metadata state as a checkpoint holds it. Drains each KV
    /// index's change list: the checkpoint captures those changes. The keys
    /// are taken before the extents' valid bits, as a commit drains them
    /// (`drain_changes`): every key's value bits are set before the key is,
    /// so the bitmaps read after hold them.
    fn checkpoint_data(&self, m: &Meta) -> CheckpointData {
        let vols = self.volumes();
        let kv = vols
            .iter()
            .flat_map(|v| {
                let id = v.desc.id;
                v.kv.iter().flat_map(move |kv| {
                    kv.drain_snapshot()
                        .into_iter()
                        .map(move |(k, l)| (id, k, l))
                })
            })
            .collect();
        CheckpointData {
            next_volume_id: m.next_volume_id,
            volumes: vols.iter().map(|v| v.desc.clone()).collect(),
            mappings: vols
                .iter()
                .flat_map(|v| {
                    v.mapped()
                        .into_iter()
                        .map(|(lext, phys)| ExtentMapping {
                            vol: v.desc.id,
                            lext,
                            phys,
                            bitmap: v.bitmap(lext),
                        })
                        .collect::<Vec<_>>()
                })
                .collect(),
            clean: m.clean.iter().copied().collect(),
            kv,
            resv: vols
                .iter()
                .filter_map(|v| Some((v.desc.id, v.reservation()?)))
                .collect(),
        }
    }
}
