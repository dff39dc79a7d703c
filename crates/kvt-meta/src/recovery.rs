//! Recovery: reads a pool's metadata without changing anything. The superblock
//! first (refused when it claims more than the device holds), then the newer
//! valid checkpoint slot, then the journal from the checkpoint's position to its
//! last valid entry, every record applied to an `Image`. `Pool::open` builds
//! the live state from the image; `check` judges it.

use super::block::{
    round_up, unseal, BlockHeader, CHECKPOINT_MAGIC, HEADER_LEN, JOURNAL_MAGIC, META_BLOCK,
};
use super::checkpoint::CheckpointData;
use super::error::PoolError;
use super::image::Image;
use super::journal::Record;
use super::superblock::Superblock;
use kvt_bdev::sync_io::SyncIo;

/// Ties checkpoint and journal blocks to one formatting of the pool: the
/// first eight bytes of its UUID.
pub fn pool_tag(uuid: &[u8; 16]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&uuid[..8]);
    u64::from_le_bytes(b)
}

/// What recovery found, for logs and `check`.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    pub checkpoint_gen: u64,
    pub checkpoint_slot: usize,
    pub other_slot: Option<String>,
    pub journal_entries: u64,
    pub journal_records: u64,
    pub journal_end: String,
    pub end_seq: u64,
    pub end_pos: u64,
    pub replayed_bytes: u64,
}

/// Reads a pool's metadata without changing anything: superblock, the newest
/// valid checkpoint, and the journal replayed to its last valid entry.
/// Runs a metadata read-and-verify once more when it fails: a device can
/// return one read corrupted or from the wrong place, and taking that for
/// the journal's end (or a bad checkpoint) would silently recover an older
/// state. A failure that repeats is the metadata's own (a torn tail).
fn verified<T>(what: &str, mut read: impl FnMut() -> Result<T, PoolError>) -> Result<T, PoolError> {
    match read() {
        Ok(v) => Ok(v),
        Err(first) => match read() {
            Ok(v) => {
                tracing::warn!(
                    "{what}: a read failed verification ({first}); read again, it is good"
                );
                Ok(v)
            }
            Err(e) => Err(e),
        },
    }
}

/// `device_size` is what the device really holds: a superblock claiming
/// more is refused before anything it describes is read.
pub fn load_image(
    io: &mut SyncIo,
    device_size: u64,
) -> Result<(Superblock, Image, RecoveryReport), PoolError> {
    let sb = verified("superblock", || {
        let sbb = io.read(0, META_BLOCK as usize)?;
        Ok(Superblock::decode(&sbb)?)
    })?;
    if sb.device_size > device_size {
        return Err(PoolError::DeviceTooSmall {
            claimed: sb.device_size,
            actual: device_size,
        });
    }
    let tag = pool_tag(&sb.uuid);
    let (ch, cdata, slot, other_slot) = newest_checkpoint(io, &sb, tag)?;
    let mut img = Image::from_checkpoint(cdata, sb.extent_size, sb.extent_count);
    let mut rep = RecoveryReport {
        checkpoint_gen: ch.seq,
        checkpoint_slot: slot,
        other_slot,
        ..Default::default()
    };
    replay_journal(io, &sb, tag, &ch, &mut img, &mut rep);
    Ok((sb, img, rep))
}

/// The newer valid checkpoint of the two slots: its header, payload, slot,
/// and what was wrong with (or older in) the other slot.
fn newest_checkpoint(
    io: &mut SyncIo,
    sb: &Superblock,
    tag: u64,
) -> Result<(BlockHeader, CheckpointData, usize, Option<String>), PoolError> {
    let mut best: Option<(BlockHeader, CheckpointData, usize)> = None;
    let mut errors = Vec::new();
    for slot in 0..2 {
        match verified("checkpoint", || read_checkpoint(io, sb, tag, slot)) {
            Ok((h, c)) => {
                if best.as_ref().map_or(true, |(bh, _, _)| h.seq > bh.seq) {
                    if let Some((bh, _, s)) = &best {
                        errors.push(format!("slot {s}: older checkpoint {}", bh.seq));
                    }
                    best = Some((h, c, slot));
                } else {
                    errors.push(format!("slot {slot}: older checkpoint {}", h.seq));
                }
            }
            Err(e) => errors.push(format!("slot {slot}: {e}")),
        }
    }
    let Some((ch, cdata, slot)) = best else {
        return Err(PoolError::NoCheckpoint {
            detail: errors.join("; "),
        });
    };
    Ok((ch, cdata, slot, errors.pop()))
}

/// Reads and verifies checkpoint slot `slot` once.
fn read_checkpoint(
    io: &mut SyncIo,
    sb: &Superblock,
    tag: u64,
    slot: usize,
) -> Result<(BlockHeader, CheckpointData), PoolError> {
    let off = sb.ckpt_offset + slot as u64 * sb.ckpt_slot_len;
    let head = io.read(off, META_BLOCK as usize)?;
    let h = BlockHeader::decode(CHECKPOINT_MAGIC, &head, "checkpoint header")?;
    if h.pool_tag != tag {
        return Err(PoolError::ForeignCheckpoint);
    }
    // Generation g lives in slot g % 2 (format's first one, 1, in
    // slot 0): another slot's valid checkpoint here is a misdirected
    // read, and taking it would recover an older state.
    if h.seq % 2 != slot as u64 && h.seq != 1 {
        return Err(PoolError::CheckpointMisplaced { gen: h.seq, slot });
    }
    // The head may sit exactly at the ring's end (the next entry wraps).
    if h.journal_pos > sb.journal_len || h.journal_pos % META_BLOCK != 0 {
        return Err(PoolError::CheckpointJournalPosition {
            pos: h.journal_pos,
            len: sb.journal_len,
        });
    }
    let total = round_up(HEADER_LEN as u64 + h.payload_len, META_BLOCK);
    if total > sb.ckpt_slot_len {
        return Err(PoolError::CheckpointOverflow { bytes: total });
    }
    let b = io.read(off, total as usize)?;
    let p = unseal(&h, &b, "checkpoint")?;
    Ok((h, CheckpointData::decode(p)?))
}

/// Reads and verifies the journal entry of sequence `seq` at ring offset
/// `pos` once: its records and its length in the ring.
fn read_entry(
    io: &mut SyncIo,
    sb: &Superblock,
    tag: u64,
    pos: u64,
    seq: u64,
) -> Result<(Vec<Record>, u64), PoolError> {
    if pos + META_BLOCK > sb.journal_len {
        return Err(PoolError::EndOfRing);
    }
    let head = io.read(sb.journal_offset + pos, META_BLOCK as usize)?;
    let h = BlockHeader::decode(JOURNAL_MAGIC, &head, "journal entry")?;
    if h.pool_tag != tag || h.seq != seq {
        return Err(PoolError::JournalSequence { pos, seq });
    }
    let total = round_up(HEADER_LEN as u64 + h.payload_len, META_BLOCK);
    if pos + total > sb.journal_len {
        return Err(PoolError::JournalEntryOverrun { pos });
    }
    let b = io.read(sb.journal_offset + pos, total as usize)?;
    let p = unseal(&h, &b, "journal entry")?;
    Ok((Record::decode_all(p, "journal entry")?, total))
}

/// Applies the journal from checkpoint `ch`'s position to its last valid
/// entry onto `img`; says where and why replay ended in `rep`.
fn replay_journal(
    io: &mut SyncIo,
    sb: &Superblock,
    tag: u64,
    ch: &BlockHeader,
    img: &mut Image,
    rep: &mut RecoveryReport,
) {
    let (mut seq, mut pos) = (ch.journal_seq, ch.journal_pos);
    // Position and byte count before trying the ring's start, to undo the try.
    let mut before_wrap: Option<(u64, u64)> = None;
    rep.journal_end = loop {
        if rep.replayed_bytes >= sb.journal_len {
            break "journal fully replayed".into();
        }
        match verified("journal entry", || read_entry(io, sb, tag, pos, seq)) {
            Ok((records, total)) => {
                rep.journal_entries += 1;
                rep.journal_records += records.len() as u64;
                for r in records {
                    img.apply(r);
                }
                rep.replayed_bytes += total;
                pos += total;
                seq += 1;
                before_wrap = None;
            }
            Err(e) => {
                // An entry that did not fit at the end of the ring was written at 0.
                if pos != 0 && before_wrap.is_none() {
                    before_wrap = Some((pos, rep.replayed_bytes));
                    rep.replayed_bytes += sb.journal_len - pos;
                    pos = 0;
                    continue;
                }
                if let Some((p, b)) = before_wrap.take() {
                    pos = p;
                    rep.replayed_bytes = b;
                }
                break format!("replayed up to sequence {seq} (next slot: {e})");
            }
        }
    };
    rep.end_seq = seq;
    rep.end_pos = pos;
}
