//! Pool images for the `pool_check` target, in a sparse form small enough to fuzz.
//!
//! A real pool is mostly zeros (the smallest `kvtarget pool create` makes is a
//! few MiB), too big for AFL's inputs, so an input describes one:
//!
//! ```text
//! byte 0     flags: bit 0 = recompute checksums after placing the segments
//! bytes 1-2  device size in 4 KiB blocks (u16 LE, 1 to MAX_DEVICE_BLOCKS)
//! then       segments: offset u32 LE, length u16 LE, that many bytes
//! ```
//!
//! With bit 0 set, the superblock CRC and the CRCs of every checkpoint and
//! journal block header (and payload) the superblock points at are made right,
//! so mutations reach the checks behind the checksums (geometry, records,
//! replay) instead of stopping at "checksum mismatch".

use kvt_bdev::ram::RamDevice;
use kvt_bdev::SharedDevice;
use kvt_pool::format::{
    CheckpointData, Superblock, CHECKPOINT_MAGIC, HEADER_LEN, JOURNAL_MAGIC, META_BLOCK,
};
use kvt_pool::image::Image;
use kvt_pool::{self as pool, SyncIo};

/// Largest device an input may describe (64 MiB): RAM pages are only touched
/// where segments land, but `check` walks every extent.
pub const MAX_DEVICE_BLOCKS: u64 = 16 << 10;
/// Journal blocks the checksum fix-up looks at (the ring may be larger).
const FIXUP_JOURNAL_BLOCKS: u64 = 512;
pub const FLAG_FIX_CHECKSUMS: u8 = 1;
const BLOCK: usize = META_BLOCK as usize;

/// Offsets inside a 64-byte block header (pool::format::BlockHeader).
const HDR_PAYLOAD_LEN: usize = 32;
const HDR_PAYLOAD_CRC: usize = 40;
const HDR_CRC: usize = 60;

/// The device an input describes, or `None` for an input too short to say.
pub fn build(data: &[u8]) -> Option<SharedDevice> {
    let (&flags, rest) = data.split_first()?;
    let blocks =
        u64::from(u16::from_le_bytes([*rest.first()?, *rest.get(1)?])).clamp(1, MAX_DEVICE_BLOCKS);
    let size = blocks * META_BLOCK;
    let dev: SharedDevice = RamDevice::new("fuzz", size).ok()?;
    let mut io = SyncIo::new(&dev).ok()?;
    let mut seg = &rest[2..];
    while seg.len() >= 6 {
        let off = u64::from(u32::from_le_bytes([seg[0], seg[1], seg[2], seg[3]]));
        let len = usize::from(u16::from_le_bytes([seg[4], seg[5]])).min(seg.len() - 6);
        let bytes = &seg[6..6 + len];
        seg = &seg[6 + len..];
        if off >= size {
            continue;
        }
        let n = len.min((size - off) as usize);
        io.write(off, &bytes[..n]).ok()?;
    }
    if flags & FLAG_FIX_CHECKSUMS != 0 {
        fix_checksums(&mut io, size);
    }
    Some(dev)
}

fn crc(b: &[u8]) -> u32 {
    kvt_wire::tcp::crc32c(b)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn fix_checksums(io: &mut SyncIo, size: u64) {
    let Ok(mut sb) = io.read(0, BLOCK) else {
        return;
    };
    let c = crc(&sb[..BLOCK - 4]);
    sb[BLOCK - 4..].copy_from_slice(&c.to_le_bytes());
    if io.write(0, &sb).is_err() {
        return;
    }
    let Ok(sb) = Superblock::decode(&sb) else {
        return;
    };
    for slot in 0..2 {
        let off = sb.ckpt_offset.saturating_add(slot * sb.ckpt_slot_len);
        fix_block(io, size, off, sb.ckpt_slot_len, CHECKPOINT_MAGIC);
    }
    for i in 0..FIXUP_JOURNAL_BLOCKS.min(sb.journal_len / META_BLOCK) {
        let pos = i * META_BLOCK;
        fix_block(
            io,
            size,
            sb.journal_offset.saturating_add(pos),
            sb.journal_len - pos,
            JOURNAL_MAGIC,
        );
    }
}

/// Makes the header at `off` (and its payload, when it fits in `room` and on
/// the device) carry correct checksums, if it has the right magic.
fn fix_block(io: &mut SyncIo, size: u64, off: u64, room: u64, magic: &[u8; 8]) {
    if off.saturating_add(META_BLOCK) > size {
        return;
    }
    let Ok(head) = io.read(off, BLOCK) else {
        return;
    };
    if &head[..8] != magic {
        return;
    }
    let plen = u64_at(&head, HDR_PAYLOAD_LEN);
    let total = (HEADER_LEN as u64).saturating_add(plen);
    let mut b = head.to_vec();
    if total <= room.min(size - off) {
        if let Ok(whole) = io.read(off, total as usize) {
            // Reads come back in whole aligned buffers: keep only `total`.
            b = whole[..total as usize].to_vec();
            let c = crc(&b[HEADER_LEN..]);
            b[HDR_PAYLOAD_CRC..HDR_PAYLOAD_CRC + 4].copy_from_slice(&c.to_le_bytes());
        }
    }
    let c = crc(&b[..HDR_CRC]);
    b[HDR_CRC..HEADER_LEN].copy_from_slice(&c.to_le_bytes());
    let _ = io.write(off, &b[..HEADER_LEN]);
}

/// The `pool_check` harness: `pool::check` as `kvtarget check` runs it, then
/// recovery's own view (`load_image`) checked against it.
pub fn check(data: &[u8]) {
    let Some(dev) = build(data) else {
        return;
    };
    let rep = pool::check(&dev);
    // `check` either says why the pool is unusable, or describes it.
    assert!(
        !rep.damage.is_empty() || !rep.lines.is_empty(),
        "check reported nothing"
    );
    let Ok(mut io) = SyncIo::new(&dev) else {
        return;
    };
    match pool::load_image(&mut io, dev.size_bytes()) {
        Ok((sb, img, _)) => {
            assert!(
                !rep.lines.is_empty(),
                "check found no pool where recovery did"
            );
            // The state recovery would write as its next checkpoint must decode
            // to itself and rebuild the same image.
            let c = img.to_checkpoint();
            let enc = c.encode();
            assert_eq!(CheckpointData::decode(&enc).as_ref(), Ok(&c));
            let img2 = Image::from_checkpoint(c.clone(), sb.extent_size, sb.extent_count);
            assert_eq!(
                img2.to_checkpoint(),
                c,
                "checkpoint of the image rebuilds differently"
            );
        }
        Err(e) => assert!(
            rep.damage.contains(&e.to_string()),
            "load_image failed ({e}) but check did not say so: {:?}",
            rep.damage
        ),
    }
}
