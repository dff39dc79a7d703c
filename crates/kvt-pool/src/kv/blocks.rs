//! The allocator of a KV namespace's blocks: a used-block bitmap of fixed
//! size (allocating never allocates memory) searched for contiguous runs,
//! next fit from the last allocation, preferring the shortest run a value
//! fits among the next few. Values take whole blocks of the volume; which
//! blocks wait for a commit before reuse is `changes`' business.

/// Runs long enough for a value that `Blocks::find_run` compares.
const FIT_CANDIDATES: u32 = 16;
/// Blocks past the first fitting run that `Blocks::find_run` looks at for a
/// better one (1,024 words of the bitmap).
const FIT_LOOK_BLOCKS: u64 = 65536;

/// Used-block bitmap with next-fit search for contiguous runs: fixed size, so
/// allocation never allocates memory.
pub(super) struct Blocks {
    /// One bit a block, set while used; bits past `total` are set.
    pub(super) words: Vec<u64>,
    pub(super) total: u64,
    /// Blocks whose bit is clear.
    pub(super) free: u64,
    /// Where the next search starts: just past the last run allocated.
    pub(super) hint: u64,
}

impl Blocks {
    pub(super) fn new(total: u64) -> Blocks {
        let n = total.div_ceil(64) as usize;
        let mut words = vec![0u64; n];
        // Bits past the end count as used, so a search never returns them.
        if total % 64 != 0 {
            if let Some(w) = words.last_mut() {
                *w = !0u64 << (total % 64);
            }
        }
        Blocks {
            words,
            total,
            free: total,
            hint: 0,
        }
    }
    pub(super) fn all_free(&self, first: u64, n: u64) -> bool {
        self.next_free(first) == Some(first) && self.next_used(first) >= first + n
    }
    pub(super) fn is_used(&self, b: u64) -> bool {
        self.words
            .get((b / 64) as usize)
            .is_some_and(|w| w & (1 << (b % 64)) != 0)
    }
    pub(super) fn set(&mut self, block: u64, n: u32, used: bool) {
        for b in block..block + n as u64 {
            if b >= self.total {
                break;
            }
            let (i, bit) = ((b / 64) as usize, 1u64 << (b % 64));
            let w = &mut self.words[i];
            if (*w & bit != 0) != used {
                *w ^= bit;
                if used {
                    self.free -= 1;
                } else {
                    self.free += 1;
                }
            }
        }
    }
    /// The first free block at or after `from`, if any.
    fn next_free(&self, from: u64) -> Option<u64> {
        self.next_free_below(from, self.total)
    }
    /// The first free block in `from..end`, if any; looks at no word past `end`.
    fn next_free_below(&self, from: u64, end: u64) -> Option<u64> {
        let end = end.min(self.total);
        if from >= end {
            return None;
        }
        let last = ((end - 1) / 64) as usize;
        let mut i = (from / 64) as usize;
        let mut w = self.words.get(i)? | ((1u64 << (from % 64)) - 1);
        loop {
            if w != !0 {
                let b = i as u64 * 64 + w.trailing_ones() as u64;
                return (b < end).then_some(b);
            }
            if i >= last {
                return None;
            }
            i += 1;
            w = *self.words.get(i)?;
        }
    }
    /// The first used block at or after `from` (or `total`).
    fn next_used(&self, from: u64) -> u64 {
        self.next_used_below(from, self.total)
    }
    /// The first used block in `from..end`, or `end`; looks at no word past `end`.
    fn next_used_below(&self, from: u64, end: u64) -> u64 {
        let end = end.min(self.total);
        if from >= end {
            return end;
        }
        let last = ((end - 1) / 64) as usize;
        let mut i = (from / 64) as usize;
        let Some(&first) = self.words.get(i) else {
            return end;
        };
        let mut w = first & !((1u64 << (from % 64)) - 1);
        loop {
            if w != 0 {
                return (i as u64 * 64 + w.trailing_zeros() as u64).min(end);
            }
            if i >= last {
                return end;
            }
            i += 1;
            match self.words.get(i) {
                Some(&x) => w = x,
                None => return end,
            }
        }
    }
    /// Takes `n` contiguous free blocks (next fit from the last allocation).
    pub(super) fn alloc(&mut self, n: u32) -> Option<u64> {
        let b = self.find_run(n, self.hint)?;
        self.set(b, n, true);
        self.hint = b + n as u64;
        Some(b)
    }
    /// A run of `n` free blocks from `hint` on, wrapping to 0: of the runs
    /// long enough within `FIT_LOOK_BLOCKS` of the first (at most
    /// `FIT_CANDIDATES` of them), the shortest (an exact fit at once), so a
    /// value takes a hole its size rather than cutting into a long run a
    /// larger value will need. Every scan is bounded: past the first fit, a
    /// Store looks at no more than `FIT_LOOK_BLOCKS` of the bitmap.
    pub(super) fn find_run(&self, n: u32, hint: u64) -> Option<u64> {
        if n == 0 || (n as u64) > self.free {
            return None;
        }
        let n = n as u64;
        // Runs are measured up to this length: longer ones are all "long".
        let cap = n.max(FIT_LOOK_BLOCKS);
        let mut best: Option<(u64, u64)> = None;
        let mut seen = 0;
        // Blocks left to look at: unbounded until a run fits.
        let mut left = u64::MAX;
        for (start, end) in [(hint, self.total), (0, hint)] {
            let mut at = start;
            while at < end && left > 0 {
                let stop = end.min(at.saturating_add(left));
                // None: nothing free before `stop`; the wrapped range may have some.
                let Some(b) = self.next_free_below(at, stop) else {
                    left -= stop - at;
                    break;
                };
                let run_end = self.next_used_below(b, stop.min(b + cap));
                let len = run_end - b;
                left -= run_end - at;
                at = run_end;
                if len < n {
                    continue;
                }
                if best.is_none() {
                    left = FIT_LOOK_BLOCKS;
                }
                if best.map_or(true, |(_, l)| len < l) {
                    best = Some((b, len));
                }
                seen += 1;
                if len == n || seen == FIT_CANDIDATES {
                    return best.map(|(b, _)| b);
                }
            }
        }
        best.map(|(b, _)| b)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::KvIndex;
    use super::*;
    use std::collections::BTreeMap;
    use std::time::Instant;

    #[test]
    fn blocks_find_runs_and_free_them() {
        let mut b = Blocks::new(130);
        assert_eq!(b.alloc(64), Some(0));
        assert_eq!(b.alloc(64), Some(64));
        assert_eq!(b.alloc(3), None);
        assert_eq!(b.alloc(2), Some(128));
        assert_eq!(b.free, 0);
        b.set(10, 20, false);
        assert_eq!(b.alloc(21), None);
        assert_eq!(b.alloc(20), Some(10));
        b.set(60, 10, false);
        assert_eq!(b.alloc(10), Some(60));
        assert_eq!(b.free, 0);
    }

    #[test]
    fn next_fit_wraps_to_free_runs_before_the_hint() {
        // The hint past every free block: the search must wrap, not give up.
        let mut b = Blocks::new(128);
        assert_eq!(b.alloc(128), Some(0));
        b.set(32, 32, false);
        assert_eq!(b.hint, 128);
        assert_eq!(b.alloc(32), Some(32));
        b.set(0, 32, false);
        b.set(96, 16, false);
        b.hint = 100;
        assert_eq!(b.alloc(32), Some(0));
    }

    /// A value goes into the shortest free run it fits among the next few,
    /// not the first: an exact hole is used and the long run stays whole for
    /// a large value (first fit cut long runs into pieces no large value fit,
    /// and Stores of 0.5-1 MiB evicted with 20 % of the namespace free).
    #[test]
    fn a_value_takes_the_hole_it_fits_best() {
        let now = Instant::now();
        let ix = KvIndex::new(64 * 4096, 4096);
        let mut durable = BTreeMap::new();
        // Blocks 0-7 key 0, 8-9 key 1, 10-13 key 2, 14-63 free.
        for (i, n) in [(0, 8), (1, 2), (2, 4)] {
            assert!(store_with(&ix, &key(i), n * 4096, now, &mut durable).is_ok());
        }
        assert!(ix.delete(&key(1), now).is_ok());
        commit(&ix, &mut durable);
        // Next fit from block 14 would cut the long run; the 2-block hole fits.
        let loc = store_with(&ix, &key(3), 2 * 4096, now, &mut durable);
        assert_eq!(loc.map(|l| l.block), Ok(8));
        // And the long run is still whole for a value of all of it.
        let loc = store_with(&ix, &key(4), 50 * 4096, now, &mut durable);
        assert_eq!(loc.map(|l| l.block), Ok(14));
        assert_eq!(ix.snapshot().evictions, 0);
        assert!(ix.verify().is_empty());
    }
}
