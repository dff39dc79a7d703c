//! Consistency checks of a live pool, for tests and the simulation: no
//! physical extent mapped twice, none both mapped and free, the counters
//! adding up.

use super::*;

impl Pool {
    /// Checks the live pool's state: no physical extent mapped twice, none
    /// both mapped and on a free list, and the extent accounting. Holding the
    /// metadata lock keeps GC and reservations still, so mapped extents cannot
    /// reach a free list during the check (no false alarms under load).
    pub fn verify_live(&self) -> (Vec<String>, String) {
        let m = lock(&self.meta);
        let mut problems = Vec::new();
        let mut owner: std::collections::HashMap<u32, (u32, u32)> = Default::default();
        for v in self.volumes() {
            for (l, p) in v.mapped() {
                if p >= self.sb.extent_count {
                    problems.push(format!(
                        "volume {} extent {l} maps to {p}, beyond the pool",
                        v.desc.name
                    ));
                }
                if let Some((ov, ol)) = owner.insert(p, (v.desc.id, l)) {
                    problems.push(format!(
                        "extent {p} is mapped twice: volume {ov} extent {ol} and volume {} extent {l}",
                        v.desc.id
                    ));
                }
            }
        }
        let lists: [(&str, Vec<u32>); 3] = [
            ("clean", m.clean.iter().copied().collect()),
            ("dirty", m.dirty.clone()),
            ("scrubbing", m.scrubbed.clone()),
        ];
        let mut free = std::collections::HashSet::new();
        for (name, list) in &lists {
            for p in list {
                if let Some((v, l)) = owner.get(p) {
                    problems.push(format!(
                        "extent {p} is both {name} and mapped by volume {v} extent {l}"
                    ));
                }
                if !free.insert(*p) {
                    problems.push(format!("extent {p} is on a free list twice"));
                }
            }
        }
        let reserved = self.ready.len() + self.caches.iter().map(|c| c.len()).sum::<usize>();
        let summary = format!(
            "{} mapped, {} clean, {} dirty, {} scrubbing, {} reserved, {} freed in flight, {} total",
            owner.len(),
            m.clean.len(),
            m.dirty.len(),
            m.scrubbed.len(),
            reserved,
            self.freed.len(),
            self.sb.extent_count
        );
        (problems, summary)
    }

    /// Debug builds (the simulation's profile): extents about to become clean
    /// or reserved are mapped by no volume, or a first write would share them.
    pub(super) fn assert_unmapped(&self, extents: &[u32], what: &str) {
        let listed: std::collections::HashSet<u32> = extents.iter().copied().collect();
        for v in self.volumes() {
            for (l, p) in v.mapped() {
                assert!(
                    !listed.contains(&p),
                    "pool {}: {what} extent {p} is mapped by volume {} extent {l}",
                    self.name,
                    v.desc.name
                );
            }
        }
    }

    /// `verify_live` plus the allocator's accounting, for a pool with nothing
    /// in flight (the simulation between steps): every extent is in exactly
    /// one place, mapped, on a free list, reserved, or freed and not yet
    /// listed, so those counts add up to the pool's extents exactly. With
    /// `counters` (right after a metadata step) the published counters must
    /// match the lists too.
    pub fn verify_quiescent(&self, counters: bool) -> Vec<String> {
        let (mut problems, summary) = self.verify_live();
        let m = lock(&self.meta);
        let mapped: usize = self.volumes().iter().map(|v| v.mapped().len()).sum();
        let reserved = self.ready.len() + self.caches.iter().map(|c| c.len()).sum::<usize>();
        let listed =
            mapped + m.clean.len() + m.dirty.len() + m.scrubbed.len() + reserved + self.freed.len();
        if listed != self.sb.extent_count as usize {
            problems.push(format!(
                "extent accounting: {listed} accounted for, pool has {} ({summary})",
                self.sb.extent_count
            ));
        }
        // What the metrics report must be what the lists hold.
        let (clean, dirty) = (
            self.stats.clean.load(Ordering::Relaxed) as usize,
            self.stats.dirty.load(Ordering::Relaxed) as usize,
        );
        if counters && (clean != m.clean.len() || dirty != m.dirty.len() + m.scrubbed.len()) {
            problems.push(format!(
                "counters: clean {clean} dirty {dirty}, lists: clean {} dirty {} scrubbing {}",
                m.clean.len(),
                m.dirty.len(),
                m.scrubbed.len()
            ));
        }
        problems
    }
}
