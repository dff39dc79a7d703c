//! A pool's metadata as plain values: what a checkpoint holds, with journal
//! records applied on top. Recovery builds the live state from it; `check` judges
//! it. Nothing here touches a device.

use super::checkpoint::{CheckpointData, ExtentMapping};
use super::journal::{KvLoc, Record, VolumeDesc, VolumeResv, RESV_CKPT_ROOM, VOL_KV};
use super::superblock::{bitmap_bytes_max, NO_EXTENT};
use kvt_wire::nvme::KvKey;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, Default)]
pub struct VolumeImage {
    pub desc: VolumeDesc,
    /// logical extent → (physical extent, valid-block bitmap)
    pub map: BTreeMap<u32, (u32, Vec<u8>)>,
    /// A KV volume's keys and where their values are.
    pub kv: BTreeMap<KvKey, KvLoc>,
    /// The reservation its namespace persists (Persist Through Power Loss).
    pub resv: Option<VolumeResv>,
}

impl Default for VolumeDesc {
    fn default() -> Self {
        VolumeDesc {
            id: 0,
            name: String::new(),
            uuid: [0; 16],
            size_bytes: 0,
            block_size: 4096,
            flags: 0,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Image {
    pub extent_size: u64,
    pub extent_count: u32,
    pub next_volume_id: u32,
    pub volumes: BTreeMap<u32, VolumeImage>,
    pub clean: BTreeSet<u32>,
    /// Inconsistencies met while building (damage for `check`).
    pub problems: Vec<String>,
}

/// Extents a volume of `size` bytes spans. A size from a damaged record can
/// claim more extents than an extent number holds: that saturates at
/// `u32::MAX` (no extent number is past it) instead of wrapping to a small
/// count, which made `n - 1` underflow in a resize (found by the pool_format
/// fuzz target).
fn extents_of(size: u64, extent_size: u64) -> u32 {
    u32::try_from(size.div_ceil(extent_size)).unwrap_or(u32::MAX)
}

/// Keeps only bits for blocks below `blocks` (the rest of the extent is past the
/// end of the volume).
fn truncate_bitmap(bm: &mut [u8], blocks: u64) {
    for (i, byte) in bm.iter_mut().enumerate() {
        let first = i as u64 * 8;
        if first >= blocks {
            *byte = 0;
        } else if blocks - first < 8 {
            *byte &= (1u8 << (blocks - first)) - 1;
        }
    }
}

impl Image {
    pub fn from_checkpoint(c: CheckpointData, extent_size: u64, extent_count: u32) -> Image {
        let mut img = Image {
            extent_size,
            extent_count,
            next_volume_id: c.next_volume_id,
            ..Default::default()
        };
        for d in c.volumes {
            if img.volumes.contains_key(&d.id) {
                img.problems
                    .push(format!("checkpoint lists volume {} twice", d.id));
            }
            img.volumes.insert(
                d.id,
                VolumeImage {
                    desc: d,
                    map: BTreeMap::new(),
                    kv: BTreeMap::new(),
                    resv: None,
                },
            );
        }
        for m in c.mappings {
            img.set_extent(m.vol, m.lext, m.phys, m.bitmap, "checkpoint");
        }
        img.load_checkpoint_kv(c.kv);
        for (vol, resv) in c.resv {
            match img.volumes.get_mut(&vol) {
                Some(v) => v.resv = Some(resv),
                None => img.problems.push(format!(
                    "checkpoint: reservation record for volume {vol}, which does not exist"
                )),
            }
        }
        for p in c.clean {
            if p >= extent_count {
                img.problems.push(format!(
                    "clean extent {p} is beyond the pool's {extent_count}"
                ));
            } else if !img.clean.insert(p) {
                img.problems
                    .push(format!("extent {p} is on the clean list twice"));
            }
        }
        img
    }

    fn set_extent(&mut self, vol: u32, lext: u32, phys: u32, bitmap: Vec<u8>, src: &str) {
        let (extent_size, extent_count) = (self.extent_size, self.extent_count);
        let Some(v) = self.volumes.get_mut(&vol) else {
            // A record for a volume deleted later in the same commit stream.
            return;
        };
        if lext >= extents_of(v.desc.size_bytes, extent_size) {
            self.problems.push(format!(
                "{src}: volume {vol} maps logical extent {lext} beyond its size"
            ));
            return;
        }
        if phys == NO_EXTENT {
            v.map.remove(&lext);
            return;
        }
        if phys >= extent_count {
            self.problems.push(format!(
                "{src}: volume {vol} extent {lext} maps to {phys}, beyond the pool's {extent_count}"
            ));
            return;
        }
        let want = (extent_size / v.desc.block_size as u64).div_ceil(8) as usize;
        if bitmap.len() != want || bitmap.len() > bitmap_bytes_max(extent_size) {
            self.problems.push(format!(
                "{src}: volume {vol} extent {lext} has a {}-byte bitmap, expected {want}",
                bitmap.len()
            ));
            return;
        }
        v.map.insert(lext, (phys, bitmap));
        self.clean.remove(&phys);
    }

    /// A checkpoint's keys, each volume's built in one pass from the keys in
    /// order: 10^6 keys inserted one by one in the order a checkpoint lists
    /// them (their slots', random for hashed keys) took about 0.5 s of a
    /// recovery. Stable: a key listed twice keeps its last location, as
    /// inserting in turn did.
    fn load_checkpoint_kv(&mut self, mut kv: Vec<(u32, KvKey, KvLoc)>) {
        kv.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        for same_vol in kv.chunk_by(|a, b| a.0 == b.0) {
            let (vol, first_key) = (same_vol[0].0, same_vol[0].1);
            // As `set_kv`: keys of a volume the checkpoint does not list go.
            let Some(v) = self.volumes.get_mut(&vol) else {
                continue;
            };
            if v.desc.flags & VOL_KV == 0 {
                self.problems.push(format!(
                    "checkpoint: KV key {first_key:?} for volume {vol}, which is not a KV volume"
                ));
                continue;
            }
            let keys = same_vol.iter().map(|&(_, k, l)| (k, l));
            if v.kv.is_empty() {
                v.kv = keys.collect();
            } else {
                v.kv.extend(keys);
            }
        }
    }

    fn set_kv(&mut self, vol: u32, key: KvKey, loc: Option<KvLoc>, src: &str) {
        let Some(v) = self.volumes.get_mut(&vol) else {
            return;
        };
        if v.desc.flags & VOL_KV == 0 {
            self.problems.push(format!(
                "{src}: KV key {key:?} for volume {vol}, which is not a KV volume"
            ));
            return;
        }
        match loc {
            Some(l) => {
                v.kv.insert(key, l);
            }
            None => {
                v.kv.remove(&key);
            }
        }
    }

    /// Keys of KV volumes whose values lie outside their volume or on
    /// another key's blocks.
    pub fn kv_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (id, v) in &self.volumes {
            let blocks = v.desc.size_bytes / v.desc.block_size.max(1) as u64;
            let mut by_block: Vec<(u64, u64, &KvKey)> = Vec::with_capacity(v.kv.len());
            for (k, l) in &v.kv {
                let end = l.block.saturating_add(l.nblocks as u64);
                if end > blocks || l.len as u64 > l.nblocks as u64 * v.desc.block_size as u64 {
                    problems.push(format!(
                        "volume {id}: KV key {k:?} at block {} ({} blocks, {} bytes) lies outside the volume",
                        l.block, l.nblocks, l.len
                    ));
                }
                if l.nblocks > 0 {
                    by_block.push((l.block, end, k));
                }
            }
            by_block.sort();
            for w in by_block.windows(2) {
                if w[1].0 < w[0].1 {
                    problems.push(format!(
                        "volume {id}: KV keys {:?} and {:?} share blocks from {}",
                        w[0].2, w[1].2, w[1].0
                    ));
                }
            }
        }
        problems
    }

    pub fn apply(&mut self, r: Record) {
        match r {
            Record::VolumeCreate(d) => {
                self.next_volume_id = self.next_volume_id.max(d.id.saturating_add(1));
                self.volumes.insert(
                    d.id,
                    VolumeImage {
                        desc: d,
                        map: BTreeMap::new(),
                        kv: BTreeMap::new(),
                        resv: None,
                    },
                );
            }
            Record::VolumeResize { id, size_bytes } => {
                let es = self.extent_size;
                if let Some(v) = self.volumes.get_mut(&id) {
                    v.desc.size_bytes = size_bytes;
                    let n = extents_of(size_bytes, es);
                    v.map.retain(|&l, _| l < n);
                    let tail = size_bytes % es;
                    if tail != 0 {
                        let blocks = tail / v.desc.block_size as u64;
                        if let Some((_, bm)) = v.map.get_mut(&(n - 1)) {
                            truncate_bitmap(bm, blocks);
                        }
                    }
                }
            }
            Record::VolumeDelete { id } => {
                self.volumes.remove(&id);
            }
            Record::Extent {
                vol,
                lext,
                phys,
                bitmap,
            } => self.set_extent(vol, lext, phys, bitmap, "journal"),
            Record::Reserve(list) => {
                for p in list {
                    self.clean.remove(&p);
                }
            }
            Record::Clean(list) => {
                for p in list {
                    if p < self.extent_count {
                        self.clean.insert(p);
                    }
                }
            }
            Record::KvPut { vol, key, loc } => self.set_kv(vol, key, Some(loc), "journal"),
            Record::KvDelete { vol, key } => self.set_kv(vol, key, None, "journal"),
            Record::VolumeResv { vol, resv } => {
                // A volume deleted later in the same commit stream has none.
                if let Some(v) = self.volumes.get_mut(&vol) {
                    v.resv = resv;
                }
            }
        }
    }

    /// The reservation records' bytes beyond the checkpoint room they share
    /// (`RESV_CKPT_ROOM`): a checkpoint could not hold them.
    pub fn resv_problems(&self) -> Vec<String> {
        let bytes: usize = self
            .volumes
            .values()
            .filter_map(|v| v.resv.as_ref())
            .map(|r| 4 + r.encoded_len())
            .sum();
        if bytes > RESV_CKPT_ROOM {
            return vec![format!(
                "reservation records take {bytes} bytes, more than their {RESV_CKPT_ROOM}-byte checkpoint room"
            )];
        }
        Vec::new()
    }

    /// Every physical extent and who maps it; reports extents mapped twice and
    /// extents both mapped and on the clean list.
    pub fn ownership(&self) -> (BTreeMap<u32, (u32, u32)>, Vec<String>) {
        let mut owner: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
        let mut problems = Vec::new();
        for (id, v) in &self.volumes {
            for (&lext, &(phys, _)) in &v.map {
                if let Some((ov, ol)) = owner.insert(phys, (*id, lext)) {
                    problems.push(format!(
                        "extent {phys} is mapped twice: volume {ov} extent {ol} and volume {id} extent {lext}"
                    ));
                }
                if self.clean.contains(&phys) {
                    problems.push(format!(
                        "extent {phys} is both free (clean) and mapped by volume {id} extent {lext}"
                    ));
                }
            }
        }
        (owner, problems)
    }

    /// Free extents that need scrubbing: neither mapped nor known clean.
    pub fn dirty(&self) -> Vec<u32> {
        let (owner, _) = self.ownership();
        (0..self.extent_count)
            .filter(|p| !owner.contains_key(p) && !self.clean.contains(p))
            .collect()
    }

    pub fn to_checkpoint(&self) -> CheckpointData {
        CheckpointData {
            next_volume_id: self.next_volume_id,
            volumes: self.volumes.values().map(|v| v.desc.clone()).collect(),
            mappings: self
                .volumes
                .iter()
                .flat_map(|(id, v)| {
                    v.map.iter().map(move |(&lext, (phys, bm))| ExtentMapping {
                        vol: *id,
                        lext,
                        phys: *phys,
                        bitmap: bm.clone(),
                    })
                })
                .collect(),
            clean: self.clean.iter().copied().collect(),
            kv: self
                .volumes
                .iter()
                .flat_map(|(id, v)| v.kv.iter().map(move |(k, l)| (*id, *k, *l)))
                .collect(),
            resv: self
                .volumes
                .iter()
                .filter_map(|(id, v)| Some((*id, v.resv.clone()?)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A damaged size saturates instead of wrapping to a small count.
    #[test]
    fn extent_counts_saturate() {
        assert_eq!(extents_of(0, 1 << 20), 0);
        assert_eq!(extents_of((1 << 20) + 1, 1 << 20), 2);
        assert_eq!(extents_of(u64::MAX, 1 << 20), u32::MAX);
        assert_eq!(extents_of(1 << 52, 1 << 20), u32::MAX);
    }

    fn desc(id: u32, size: u64) -> VolumeDesc {
        VolumeDesc {
            id,
            name: format!("v{id}"),
            uuid: [id as u8; 16],
            size_bytes: size,
            block_size: 4096,
            flags: 0,
        }
    }

    #[test]
    fn replay_and_ownership() {
        let mut img = Image::from_checkpoint(
            CheckpointData {
                next_volume_id: 1,
                volumes: vec![],
                mappings: vec![],
                clean: (0..8).collect(),
                kv: vec![],
                resv: vec![],
            },
            1 << 20,
            8,
        );
        img.apply(Record::VolumeCreate(desc(1, 3 << 20)));
        img.apply(Record::Reserve(vec![0, 1, 2]));
        img.apply(Record::Extent {
            vol: 1,
            lext: 2,
            phys: 1,
            bitmap: vec![0xff; 32],
        });
        assert_eq!(img.next_volume_id, 2);
        assert_eq!(img.dirty(), vec![0, 2]);
        img.apply(Record::VolumeResize {
            id: 1,
            size_bytes: (2 << 20) + 4096 * 3,
        });
        assert_eq!(img.volumes[&1].map[&2].1[0], 0b111);
        img.apply(Record::Clean(vec![1]));
        let (_, problems) = img.ownership();
        assert_eq!(problems.len(), 1, "{problems:?}");
        img.apply(Record::VolumeDelete { id: 1 });
        assert!(img.ownership().1.is_empty());
        img.apply(Record::Extent {
            vol: 9,
            lext: 0,
            phys: 3,
            bitmap: vec![],
        });
        assert!(img.problems.is_empty());
    }

    /// A checkpoint's keys land in their volumes whatever order it lists
    /// them in: a key listed twice keeps its last location (as one insert
    /// after another did), keys of a block volume are a problem, keys of a
    /// volume the checkpoint does not list are dropped.
    #[test]
    fn checkpoint_keys_land_in_their_volumes_in_any_order() {
        let kv_desc = |id| VolumeDesc {
            flags: VOL_KV,
            ..desc(id, 1 << 20)
        };
        let key = |n: u8| KvKey::new(&[n]).unwrap_or_default();
        let loc = |block| KvLoc {
            block,
            nblocks: 1,
            len: 1,
        };
        let img = Image::from_checkpoint(
            CheckpointData {
                next_volume_id: 4,
                volumes: vec![kv_desc(1), kv_desc(2)],
                mappings: vec![],
                clean: vec![],
                kv: vec![
                    (2, key(9), loc(0)),
                    (1, key(5), loc(1)),
                    (9, key(1), loc(2)),
                    (1, key(3), loc(3)),
                    (1, key(5), loc(4)),
                    (2, key(1), loc(5)),
                ],
                resv: vec![],
            },
            1 << 20,
            8,
        );
        let keys = |v: u32| -> Vec<(KvKey, u64)> {
            img.volumes[&v]
                .kv
                .iter()
                .map(|(k, l)| (*k, l.block))
                .collect()
        };
        assert_eq!(keys(1), vec![(key(3), 3), (key(5), 4)]);
        assert_eq!(keys(2), vec![(key(1), 5), (key(9), 0)]);
        assert!(img.problems.is_empty(), "{:?}", img.problems);
        let img = Image::from_checkpoint(
            CheckpointData {
                next_volume_id: 2,
                volumes: vec![desc(1, 1 << 20)],
                mappings: vec![],
                clean: vec![],
                kv: vec![(1, key(1), loc(0))],
                resv: vec![],
            },
            1 << 20,
            8,
        );
        assert_eq!(img.problems.len(), 1, "{:?}", img.problems);
    }
}
