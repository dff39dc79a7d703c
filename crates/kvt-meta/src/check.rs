//! The offline check (`kvtarget check`): recovery's image of a pool, judged.
//! Superblock and checkpoint checksums, journal replay, no extent mapped twice,
//! none both clean and mapped, every KV key's blocks holding data, and the
//! extent accounting adding up. It reports; it never changes the device.

use super::image::VolumeImage;
use super::journal::VOL_KV;
use super::recovery::load_image;
use kvt_bdev::sync_io::SyncIo;
use kvt_bdev::SharedDevice;

/// What `kvtarget check` found.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub lines: Vec<String>,
    pub damage: Vec<String>,
}

/// Verifies a pool offline: superblock and checkpoint checksums, journal replay,
/// no extent mapped twice, none both free and mapped, everything in range.
pub fn check(dev: &SharedDevice) -> CheckReport {
    let mut rep = CheckReport::default();
    let mut io = match SyncIo::new(dev) {
        Ok(io) => io,
        Err(e) => {
            rep.damage.push(e.to_string());
            return rep;
        }
    };
    let (sb, img, rec) = match load_image(&mut io, dev.size_bytes()) {
        Ok(x) => x,
        Err(e) => {
            rep.damage.push(e.to_string());
            return rep;
        }
    };
    rep.lines.push(format!(
        "superblock: ok, {} extents of {} bytes, data at {}",
        sb.extent_count, sb.extent_size, sb.data_offset
    ));
    rep.lines.push(format!(
        "checkpoint: generation {} in slot {} ok{}",
        rec.checkpoint_gen,
        rec.checkpoint_slot,
        rec.other_slot
            .as_ref()
            .map(|s| format!(" (other {s})"))
            .unwrap_or_default()
    ));
    rep.lines.push(format!(
        "journal: {} entries, {} records replayed; {}",
        rec.journal_entries, rec.journal_records, rec.journal_end
    ));
    rep.damage.extend(img.problems.iter().cloned());
    let (owner, problems) = img.ownership();
    rep.damage.extend(problems);
    rep.damage.extend(img.kv_problems());
    rep.damage.extend(img.resv_problems());
    for (id, v) in &img.volumes {
        describe_volume(&mut rep, sb.extent_size, *id, v);
    }
    let dirty = (0..sb.extent_count)
        .filter(|p| !owner.contains_key(p) && !img.clean.contains(p))
        .count();
    rep.lines.push(format!(
        "extents: {} mapped, {} clean, {} dirty, {} total",
        owner.len(),
        img.clean.len(),
        dirty,
        sb.extent_count
    ));
    if owner.len() + img.clean.len() + dirty != sb.extent_count as usize {
        rep.damage.push("extent accounting does not add up".into());
    }
    rep
}

/// One volume's line (and its KV namespace's, whose keys must name blocks
/// that hold data).
fn describe_volume(rep: &mut CheckReport, extent_size: u64, id: u32, v: &VolumeImage) {
    let used: u64 = v
        .map
        .values()
        .map(|(_, bm)| bm.iter().map(|b| b.count_ones() as u64).sum::<u64>())
        .sum();
    rep.lines.push(format!(
        "volume {id} {:?}: {} bytes, block {}, {} extents mapped, {} blocks in use",
        v.desc.name,
        v.desc.size_bytes,
        v.desc.block_size,
        v.map.len(),
        used
    ));
    if v.desc.flags & VOL_KV != 0 {
        check_kv_volume(rep, extent_size, id, v);
    }
    if let Some(r) = &v.resv {
        // Decoding checked it: RTYPE, a holder that is a registrant, no host
        // twice, at most MAX_RESV_REGISTRANTS.
        rep.lines.push(format!(
            "volume {id} {:?}: reservation persists (PTPL), {} registrants, generation {}, {}",
            v.desc.name,
            r.registrants.len(),
            r.generation,
            r.held.map_or_else(
                || "not held".to_string(),
                |(t, _)| format!("held, type {t}")
            )
        ));
    }
}

fn check_kv_volume(rep: &mut CheckReport, extent_size: u64, id: u32, v: &VolumeImage) {
    let bytes: u64 = v.kv.values().map(|l| l.len as u64).sum();
    rep.lines.push(format!(
        "volume {id} {:?}: KV namespace, {} keys, {} value bytes",
        v.desc.name,
        v.kv.len(),
        bytes
    ));
    // A key's blocks must be valid in the volume (written before the
    // record that names them).
    for (k, l) in &v.kv {
        let bpe = extent_size / v.desc.block_size as u64;
        // A range past the volume's end is kv_problems' report already
        // (and walking it could take billions of steps).
        let end = l.block.saturating_add(l.nblocks as u64);
        if end > v.desc.size_bytes / v.desc.block_size.max(1) as u64 {
            continue;
        }
        let missing = (l.block..end).find(|&b| {
            let (lext, i) = ((b / bpe) as u32, (b % bpe) as usize);
            !v.map
                .get(&lext)
                .is_some_and(|(_, bm)| bm.get(i / 8).is_some_and(|x| x & (1 << (i % 8)) != 0))
        });
        if let Some(b) = missing {
            rep.damage.push(format!(
                "volume {id}: KV key {k:?} names block {b}, which holds no data"
            ));
        }
    }
}
