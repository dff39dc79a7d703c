//! Key ages and the TTL: ages count in milliseconds from the first `now` a
//! caller passes (no clock is read here), and a key older than the TTL
//! reads as missing and leaves the index when a command meets it.

use super::{Entry, KvIndex, State};
use kvt_wire::nvme::KvKey;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl KvIndex {
    /// Milliseconds from the index's base (`KvIndex::base`) to `now`.
    pub(super) fn ms(&self, now: Instant) -> u64 {
        let base = *self.base.get_or_init(|| now);
        now.saturating_duration_since(base).as_millis() as u64
    }

    /// Gives `key` up if it is older than `ttl`, counted as an expiration:
    /// the command that meets it finds no key.
    pub(super) fn expire_if_old(
        &self,
        st: &mut State,
        key: &KvKey,
        now_ms: u64,
        ttl: Option<Duration>,
    ) {
        let Some(slot) = st.slot_of(key) else {
            return;
        };
        let old = st
            .entries
            .get(slot as usize)
            .and_then(|e| e.as_ref())
            .is_some_and(|e| expired(e, now_ms, ttl));
        if old {
            self.counters.expirations.fetch_add(1, Ordering::Relaxed);
            self.give_up(st, slot);
        }
    }
}

pub(super) fn expired(e: &Entry, now_ms: u64, ttl: Option<Duration>) -> bool {
    // Saturating: reactors pass their own clocks (see `count_gone`).
    ttl.is_some_and(|t| now_ms.saturating_sub(e.stored_ms) >= t.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn ttl_expires_keys() {
        let now = Instant::now();
        let ix = KvIndex::new(1 << 20, 4096);
        ix.set_settings(KvSettings {
            on_full: OnFull::Evict,
            ttl: Some(Duration::from_secs(10)),
            keep_footprint: false,
        });
        assert!(store(&ix, &key(1), 100, now).is_ok());
        assert!(ix.exists(&key(1), now + Duration::from_secs(9)));
        assert!(!ix.exists(&key(1), now + Duration::from_secs(11)));
        assert_eq!(ix.snapshot().expirations, 1);
    }

    /// Ages count from the first `now` the index is given, not from a clock
    /// read when it was made: the simulation's clock started before the
    /// index and runs slower than the wall clock on a loaded machine, and
    /// every age then stayed zero (a KV volume never trimmed, seed 27).
    #[test]
    fn ages_count_from_the_callers_clock_not_the_wall_clock() {
        // A caller clock an hour behind the wall clock when the index is made.
        let now = Instant::now();
        let Some(behind) = now.checked_sub(Duration::from_secs(3600)) else {
            return; // booted less than an hour ago: no such clock to stand in
        };
        let ix = KvIndex::new(1 << 20, 4096);
        ix.set_settings(KvSettings {
            on_full: OnFull::Evict,
            ttl: Some(Duration::from_secs(10)),
            keep_footprint: false,
        });
        assert!(store(&ix, &key(1), 100, behind).is_ok());
        assert!(ix.exists(&key(1), behind + Duration::from_secs(9)));
        assert!(!ix.exists(&key(1), behind + Duration::from_secs(11)));
        // A recovered index: restored keys age from the first `now` after
        // the restart, not from a clock read during recovery.
        let ix = KvIndex::new(1 << 20, 4096);
        ix.set_settings(KvSettings {
            on_full: OnFull::Evict,
            ttl: Some(Duration::from_secs(10)),
            keep_footprint: false,
        });
        let loc = KvLoc {
            block: 0,
            nblocks: 1,
            len: 100,
        };
        assert_eq!(ix.restore(key(2), loc), Ok(()));
        assert!(ix.exists(&key(2), behind));
        assert!(ix.exists(&key(2), behind + Duration::from_secs(9)));
        assert!(!ix.exists(&key(2), behind + Duration::from_secs(11)));
    }
}
