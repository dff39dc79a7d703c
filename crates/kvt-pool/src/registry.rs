//! The volume registry: volumes by name and ID, and the control-path calls
//! that create, delete and resize them (each journaled before it returns).

use super::*;

impl Pool {
    pub fn volume(&self, name: &str) -> Option<Arc<Volume>> {
        self.volumes
            .read()
            .ok()?
            .values()
            .find(|v| v.desc.name == name)
            .cloned()
    }

    pub fn volume_by_id(&self, id: u32) -> Option<Arc<Volume>> {
        self.volumes.read().ok()?.get(&id).cloned()
    }

    /// `f` on every volume, under the table's read lock: no copy of the
    /// table (the metadata thread walks it every step; 4,000 volumes made
    /// that walk 6 % of a core on an idle target). `f` must not create,
    /// delete or resize a volume.
    pub(super) fn for_each_volume(&self, mut f: impl FnMut(&Arc<Volume>)) {
        let table = match self.volumes.read() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        table.values().for_each(&mut f);
    }

    pub fn volumes(&self) -> Vec<Arc<Volume>> {
        self.volumes
            .read()
            .map(|v| v.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Creates a volume; durable when this returns.
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_size: u32,
        flags: u32,
    ) -> Result<Arc<Volume>, PoolError> {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(PoolError::VolumeName);
        }
        if !matches!(block_size, 512 | 4096) {
            return Err(PoolError::VolumeBlockSize { name: name.into() });
        }
        if size_bytes == 0 || size_bytes % block_size as u64 != 0 {
            return Err(PoolError::VolumeSize {
                name: name.into(),
                size: size_bytes,
                block_size: block_size as u64,
            });
        }
        if size_bytes.div_ceil(self.sb.extent_size) > u32::MAX as u64 / 2 {
            return Err(PoolError::VolumeTooLarge {
                name: name.into(),
                size: size_bytes,
            });
        }
        let mut m = lock(&self.meta);
        if self.volume(name).is_some() {
            return Err(PoolError::VolumeExists { name: name.into() });
        }
        let max = self.sb.max_volumes as usize;
        if self.volumes.read().map(|v| v.len()).unwrap_or(0) >= max {
            return Err(PoolError::TooManyVolumes {
                pool: self.name.clone(),
                max,
            });
        }
        if flags & VOL_KV != 0 {
            let taken: u64 = self
                .volumes()
                .iter()
                .filter(|v| v.kv.is_some())
                .map(|v| kv::max_keys_of(v.desc.size_bytes))
                .sum();
            // Saturating: the volume table comes from the device, whose KV
            // volumes may claim more than its room (`check` reports it).
            let room = kv_key_room(self.sb.device_size).saturating_sub(taken);
            let keys = kv::max_keys_of(size_bytes);
            if keys > room {
                return Err(PoolError::KvKeyRoom {
                    name: name.into(),
                    keys,
                    room,
                });
            }
        }
        let id = m.next_volume_id;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let desc = VolumeDesc {
            id,
            name: name.to_string(),
            uuid: stable_uuid(&format!("{:?}/{id}/{name}/{nanos}", self.sb.uuid)),
            size_bytes,
            block_size,
            flags,
        };
        let vol = Arc::new(Volume::new(desc.clone(), self.sb.extent_size));
        m.next_volume_id += 1;
        m.pending.push(Record::VolumeCreate(desc));
        if let Ok(mut v) = self.volumes.write() {
            v.insert(id, vol.clone());
        }
        self.commit(&mut m, Vec::new())?;
        Ok(vol)
    }

    pub(super) fn exclusive(&self, name: &str) -> Result<Arc<Volume>, PoolError> {
        let v = self
            .volume(name)
            .ok_or_else(|| PoolError::NoVolume { name: name.into() })?;
        // The pool's table and `v` are the only holders when nothing serves it.
        if Arc::strong_count(&v) > 2 {
            return Err(PoolError::VolumeInUse { name: name.into() });
        }
        Ok(v)
    }

    /// Deletes a volume: its extents are freed at once (metadata only) and
    /// scrubbed by GC before any other volume sees them.
    pub fn delete_volume(&self, name: &str) -> Result<(), PoolError> {
        let mut m = lock(&self.meta);
        let v = self.exclusive(name)?;
        // Pending extent changes go first so replay never sees them after the delete.
        self.commit(&mut m, Vec::new())?;
        v.deleted.store(true, Ordering::Release);
        let freed = v.unmap_from(0);
        v.clear_dirty();
        if let Ok(mut t) = self.volumes.write() {
            t.remove(&v.desc.id);
        }
        m.pending.push(Record::VolumeDelete { id: v.desc.id });
        m.dirty.extend(freed);
        self.commit(&mut m, Vec::new())?;
        self.wake_md();
        Ok(())
    }

    /// Resizes a volume that is not being served. Shrinking frees the extents
    /// past the new end at once.
    pub fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<(), PoolError> {
        let mut m = lock(&self.meta);
        let v = self.exclusive(name)?;
        if v.kv.is_some() {
            return Err(PoolError::KvResize { name: name.into() });
        }
        let bs = v.desc.block_size as u64;
        if size_bytes == 0 || size_bytes % bs != 0 {
            return Err(PoolError::VolumeSize {
                name: name.into(),
                size: size_bytes,
                block_size: bs,
            });
        }
        self.commit(&mut m, Vec::new())?;
        // Blocks past the new end inside the last kept extent lose their valid
        // bits (in memory here, on replay from the record); reads follow the
        // bitmap, so growing again shows zeros there without touching the device.
        let new = v.resized(size_bytes);
        let keep = new.extent_count();
        let freed: Vec<u32> = v
            .mapped()
            .into_iter()
            .filter(|&(l, _)| l >= keep)
            .map(|(_, p)| p)
            .collect();
        new.clear_dirty();
        if let Ok(mut t) = self.volumes.write() {
            t.insert(v.desc.id, Arc::new(new));
        }
        m.pending.push(Record::VolumeResize {
            id: v.desc.id,
            size_bytes,
        });
        m.dirty.extend(freed);
        self.commit(&mut m, Vec::new())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_bdev::ram::RamDevice;
    use kvt_meta::{SUPERBLOCK_VERSION_EPOCH, SUPERBLOCK_VERSION_VOLUMES};

    fn opts() -> PoolOptions {
        PoolOptions::stepped()
    }

    /// A pool takes as many volumes as its superblock says its checkpoint
    /// slots hold (4,096 from format 3; 1,024 for a format 2 pool, whose
    /// slots were sized for that many), names the limit past them, and keeps
    /// them all through a checkpoint and a restart.
    #[test]
    fn a_pool_holds_the_volumes_its_superblock_has_room_for() {
        for (version, max) in [
            (SUPERBLOCK_VERSION_EPOCH, 1024),
            (SUPERBLOCK_VERSION_VOLUMES, 4096),
        ] {
            let dev: SharedDevice = RamDevice::new("vols", 256 << 20).unwrap();
            let sb = crate::format(&dev, &FormatOptions::default()).unwrap();
            assert_eq!(sb.max_volumes, 4096);
            let sb = Superblock { version, ..sb };
            SyncIo::new(&dev).unwrap().write(0, &sb.encode()).unwrap();
            let pool = Pool::open("p", dev.clone(), opts()).unwrap();
            assert_eq!(pool.sb.max_volumes as usize, max);
            for i in 0..max {
                pool.create_volume(&format!("v{i}"), 64 << 10, 4096, 0)
                    .unwrap();
            }
            let past = pool.create_volume("one-more", 64 << 10, 4096, 0);
            assert!(
                matches!(past, Err(PoolError::TooManyVolumes { max: m, .. }) if m == max),
                "format {version}: {:?}",
                past.map(|v| v.desc.id)
            );
            pool.checkpoint_now().unwrap();
            drop(pool);
            let again = Pool::open("p", dev, opts()).unwrap();
            assert_eq!(again.volumes().len(), max, "format {version}");
            assert!(again.volume(&format!("v{}", max - 1)).is_some());
        }
    }
}
