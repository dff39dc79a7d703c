//! A queue's own Error Information log entries: a small ring written only by
//! the reactor that owns the queue and read, without a lock, by whoever
//! answers Get Log Page (the admin queue's reactor). Each slot is a sequence
//! lock over atomics: the writer makes the sequence odd while it writes, the
//! reader retries a slot it saw change.

use kvt_wire::nvme::ErrorLogEntry;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Entries one queue keeps (the controller reports the newest 64 over all of
/// its queues).
pub const QUEUE_ERROR_ENTRIES: usize = 16;

#[derive(Default)]
struct Slot {
    /// Even: stable; odd: being written. 0: never written.
    seq: AtomicU64,
    /// error_count; sqid | cid << 16 | status << 32 | param_location << 48;
    /// lba; nsid | trtype << 32.
    words: [AtomicU64; 4],
}

#[derive(Default)]
pub struct ErrorRing {
    slots: [Slot; QUEUE_ERROR_ENTRIES],
    /// Entries written so far (the writer's cursor).
    written: AtomicU64,
}

impl std::fmt::Debug for ErrorRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorRing")
            .field("written", &self.written.load(Ordering::Relaxed))
            .finish()
    }
}

fn pack(e: &ErrorLogEntry) -> [u64; 4] {
    [
        e.error_count,
        e.sqid as u64
            | (e.cid as u64) << 16
            | (e.status as u64) << 32
            | (e.param_location as u64) << 48,
        e.lba,
        e.nsid as u64 | (e.trtype as u64) << 32,
    ]
}

fn unpack(w: [u64; 4]) -> ErrorLogEntry {
    ErrorLogEntry {
        error_count: w[0],
        sqid: w[1] as u16,
        cid: (w[1] >> 16) as u16,
        status: (w[1] >> 32) as u16,
        param_location: (w[1] >> 48) as u16,
        lba: w[2],
        nsid: w[3] as u32,
        trtype: (w[3] >> 32) as u8,
    }
}

impl ErrorRing {
    /// Adds an entry, replacing the oldest. Only the owning reactor calls it.
    pub fn push(&self, e: &ErrorLogEntry) {
        let n = self.written.load(Ordering::Relaxed);
        let slot = &self.slots[(n % QUEUE_ERROR_ENTRIES as u64) as usize];
        let s = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(s | 1, Ordering::Relaxed);
        // The odd sequence is visible before any word changes.
        fence(Ordering::Release);
        for (w, v) in slot.words.iter().zip(pack(e)) {
            w.store(v, Ordering::Relaxed);
        }
        slot.seq.store((s | 1) + 1, Ordering::Release);
        self.written.store(n + 1, Ordering::Release);
    }

    /// Appends this ring's entries (any order) to `out`.
    pub fn read_into(&self, out: &mut Vec<ErrorLogEntry>) {
        for slot in &self.slots {
            // A slot the writer keeps rewriting is skipped after a few tries:
            // the entry there is being replaced by a newer one anyway.
            for _ in 0..64 {
                let s1 = slot.seq.load(Ordering::Acquire);
                if s1 == 0 {
                    break;
                }
                if s1 & 1 == 1 {
                    std::hint::spin_loop();
                    continue;
                }
                let w = [
                    slot.words[0].load(Ordering::Relaxed),
                    slot.words[1].load(Ordering::Relaxed),
                    slot.words[2].load(Ordering::Relaxed),
                    slot.words[3].load(Ordering::Relaxed),
                ];
                fence(Ordering::Acquire);
                if slot.seq.load(Ordering::Relaxed) == s1 {
                    out.push(unpack(w));
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn entry(n: u64) -> ErrorLogEntry {
        ErrorLogEntry {
            error_count: n,
            sqid: (n % 7) as u16,
            cid: n as u16,
            status: 0x4004,
            param_location: 0xFFFF,
            lba: n * 8,
            nsid: 1,
            trtype: 3,
        }
    }

    proptest! {
        #[test]
        fn entries_survive_packing(e in (any::<u64>(), any::<u16>(), any::<u16>(), any::<u16>(), any::<u16>(), any::<u64>(), any::<u32>(), any::<u8>())) {
            let e = ErrorLogEntry { error_count: e.0, sqid: e.1, cid: e.2, status: e.3, param_location: e.4, lba: e.5, nsid: e.6, trtype: e.7 };
            prop_assert_eq!(unpack(pack(&e)), e);
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_entries() {
        let r = ErrorRing::default();
        let mut out = Vec::new();
        r.read_into(&mut out);
        assert!(out.is_empty(), "an unused ring reports nothing");
        for n in 1..=40 {
            r.push(&entry(n));
        }
        r.read_into(&mut out);
        let mut counts: Vec<u64> = out.iter().map(|e| e.error_count).collect();
        counts.sort_unstable();
        assert_eq!(counts, (25..=40).collect::<Vec<_>>());
        assert!(out.iter().all(|e| *e == entry(e.error_count)));
    }

    #[test]
    fn a_reader_never_sees_a_torn_entry() {
        let r = Arc::new(ErrorRing::default());
        let w = r.clone();
        let writer = std::thread::spawn(move || {
            for n in 1..200_000 {
                w.push(&entry(n));
            }
        });
        let mut out = Vec::new();
        while !writer.is_finished() {
            out.clear();
            r.read_into(&mut out);
            for e in &out {
                assert_eq!(*e, entry(e.error_count), "torn entry");
            }
        }
        assert!(writer.join().is_ok());
    }
}
