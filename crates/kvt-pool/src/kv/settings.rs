//! A KV namespace's cache policy: what a full namespace does (`OnFull`), the
//! TTL keys expire after, whether free extents stay mapped. Set where the
//! namespace is served, not persisted; packed into one word so every
//! reactor reads it with one atomic load per command.

use super::KvIndex;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a full KV namespace does with a Store of a new value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFull {
    /// Evict the oldest keys not read since (second chance) to make room.
    #[default]
    Evict,
    /// Fail the Store with Capacity Exceeded.
    Fail,
}

impl OnFull {
    pub fn name(self) -> &'static str {
        match self {
            OnFull::Evict => "evict",
            OnFull::Fail => "fail",
        }
    }
}

/// A KV namespace's cache policy (set where it is served; not persisted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvSettings {
    pub on_full: OnFull,
    /// Keys older than this read as missing and are evicted when met.
    pub ttl: Option<Duration>,
    /// Free extents stay mapped (no trim): the namespace keeps its
    /// high-water footprint, and a cache that refills at once never pays for
    /// fresh mappings.
    pub keep_footprint: bool,
}

impl KvIndex {
    /// The cache policy, the TTL to the millisecond (what keys age by).
    pub fn settings(&self) -> KvSettings {
        PackedSettings::unpack(self.settings.load(Ordering::Acquire))
    }

    pub fn set_settings(&self, s: KvSettings) {
        self.settings
            .store(PackedSettings::pack(s), Ordering::Release);
        // Trimming may be on now: the next `trim_step` looks at the queue.
        self.trim_due_ms.store(0, Ordering::Release);
    }
}

/// `KvSettings` in one word, so every reactor reads the policy with one
/// atomic load: bit 0 `OnFull::Fail`, bit 1 `keep_footprint`, bits 2.. the
/// TTL in milliseconds plus one (0: no TTL), saturating at `TTL_MS_MAX`
/// (far beyond `MAX_TTL_SECS`, ten years).
pub(super) struct PackedSettings;

impl PackedSettings {
    const FAIL: u64 = 1;
    const KEEP_FOOTPRINT: u64 = 2;
    const TTL_SHIFT: u32 = 2;
    const TTL_MS_MAX: u64 = (u64::MAX >> PackedSettings::TTL_SHIFT) - 1;

    pub(super) fn pack(s: KvSettings) -> u64 {
        let ttl = s.ttl.map_or(0, |t| {
            let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
            ms.min(Self::TTL_MS_MAX) + 1
        });
        let fail = match s.on_full {
            OnFull::Evict => 0,
            OnFull::Fail => Self::FAIL,
        };
        let keep = if s.keep_footprint {
            Self::KEEP_FOOTPRINT
        } else {
            0
        };
        ttl << Self::TTL_SHIFT | keep | fail
    }

    fn unpack(w: u64) -> KvSettings {
        let ttl = w >> Self::TTL_SHIFT;
        KvSettings {
            on_full: if w & Self::FAIL != 0 {
                OnFull::Fail
            } else {
                OnFull::Evict
            },
            ttl: (ttl > 0).then(|| Duration::from_millis(ttl - 1)),
            keep_footprint: w & Self::KEEP_FOOTPRINT != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_ttl_beyond_the_packed_range_saturates() {
        let ix = KvIndex::new(4096 * 64, 4096);
        ix.set_settings(KvSettings {
            ttl: Some(Duration::MAX),
            ..KvSettings::default()
        });
        assert_eq!(
            ix.settings().ttl,
            Some(Duration::from_millis(PackedSettings::TTL_MS_MAX))
        );
        ix.set_settings(KvSettings {
            ttl: Some(Duration::from_micros(1500)),
            ..KvSettings::default()
        });
        assert_eq!(ix.settings().ttl, Some(Duration::from_millis(1)));
    }

    proptest! {
        /// Settings read back as set, the TTL to the millisecond (keys age
        /// by milliseconds, so nothing expires differently).
        #[test]
        fn settings_read_back_as_set(
            fail: bool,
            keep_footprint: bool,
            ttl_ms in proptest::option::of(prop_oneof![
                0u64..10_000,
                Just(10 * 365 * 24 * 3600 * 1000), // MAX_TTL_SECS,
                Just(PackedSettings::TTL_MS_MAX),
            ]),
        ) {
            let ix = KvIndex::new(4096 * 64, 4096);
            let s = KvSettings {
                on_full: if fail { OnFull::Fail } else { OnFull::Evict },
                ttl: ttl_ms.map(Duration::from_millis),
                keep_footprint,
            };
            ix.set_settings(s);
            prop_assert_eq!(ix.settings(), s);
        }
    }
}
