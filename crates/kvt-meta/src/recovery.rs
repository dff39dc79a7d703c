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
    pub journal_end: JournalEnd,
    pub end_seq: u64,
    pub end_pos: u64,
    pub replayed_bytes: u64,
}

/// Where journal replay stopped. Every replay stops at a slot that holds no
/// entry of the next sequence; only some of those reasons say anything went
/// wrong, and the log level follows (`is_clean`), so a healthy start reads as
/// one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum JournalEnd {
    /// Nothing replayed yet (a report not filled in).
    #[default]
    NotReplayed,
    /// Every byte of the ring was replayed.
    Full,
    /// The next slot holds no journal entry: never written since format (a
    /// fresh pool) or past the last entry written. The usual end.
    NoEntry { seq: u64 },
    /// The next slot holds an older entry (an earlier lap of the ring, or an
    /// earlier formatting's). The usual end once the ring has wrapped.
    OlderEntry { seq: u64 },
    /// The next slot holds an entry of this pool that fails verification: a
    /// write cut short by a crash or power loss (never acknowledged, so
    /// nothing acknowledged is lost), or damage.
    Torn { seq: u64, detail: String },
    /// The next slot could not be read.
    Unreadable { seq: u64, detail: String },
}

impl JournalEnd {
    /// Why replay stopped before sequence `seq`, from the error reading it.
    fn at(seq: u64, e: &PoolError) -> JournalEnd {
        use super::block::FormatError;
        match e {
            PoolError::Format(FormatError::BadMagic { .. }) | PoolError::EndOfRing => {
                JournalEnd::NoEntry { seq }
            }
            PoolError::JournalSequence { .. } => JournalEnd::OlderEntry { seq },
            PoolError::Io(_) => JournalEnd::Unreadable {
                seq,
                detail: e.to_string(),
            },
            _ => JournalEnd::Torn {
                seq,
                detail: e.to_string(),
            },
        }
    }

    /// True for the ends a healthy pool has (nothing to look into).
    pub fn is_clean(&self) -> bool {
        matches!(
            self,
            JournalEnd::Full | JournalEnd::NoEntry { .. } | JournalEnd::OlderEntry { .. }
        )
    }
}

impl std::fmt::Display for JournalEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JournalEnd::NotReplayed => write!(f, "journal not replayed"),
            JournalEnd::Full => write!(f, "journal fully replayed"),
            JournalEnd::NoEntry { seq } => {
                write!(
                    f,
                    "journal ends before sequence {seq} (no entry written there yet)"
                )
            }
            JournalEnd::OlderEntry { seq } => write!(
                f,
                "journal ends before sequence {seq} (the ring's next slot holds an older entry)"
            ),
            JournalEnd::Torn { seq, detail } => write!(
                f,
                "journal ends before sequence {seq}: that entry fails verification ({detail}); \
                 a write cut short by a crash or power loss, never acknowledged, or damage"
            ),
            JournalEnd::Unreadable { seq, detail } => {
                write!(
                    f,
                    "journal ends before sequence {seq}: that slot could not be read ({detail})"
                )
            }
        }
    }
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
    // Position, byte count and error before trying the ring's start, to undo
    // the try; the end is then told by the first slot's error, not the start's.
    let mut before_wrap: Option<(u64, u64, PoolError)> = None;
    rep.journal_end = loop {
        if rep.replayed_bytes >= sb.journal_len {
            // Jumping to the ring's start came back to where replay began
            // (position and count stay as they were, as ever): the end is
            // told by the slot before the jump.
            break match before_wrap.take() {
                Some((_, _, first)) => JournalEnd::at(seq, &first),
                None => JournalEnd::Full,
            };
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
                    before_wrap = Some((pos, rep.replayed_bytes, e));
                    rep.replayed_bytes += sb.journal_len - pos;
                    pos = 0;
                    continue;
                }
                let e = match before_wrap.take() {
                    Some((p, b, first)) => {
                        pos = p;
                        rep.replayed_bytes = b;
                        first
                    }
                    None => e,
                };
                break JournalEnd::at(seq, &e);
            }
        }
    };
    rep.end_seq = seq;
    rep.end_pos = pos;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_bdev::ram::RamDevice;
    use kvt_bdev::SharedDevice;

    /// Words that read as damage to an operator; a clean end says none of
    /// them (kvt-pool's recovery tests check the same on ends it writes).
    const ALARMING: [&str; 7] = [
        "bad", "magic", "error", "fail", "damage", "corrupt", "mismatch",
    ];

    /// A fresh pool's first recovery ends where nothing was written yet, and
    /// says so without a word that reads as damage.
    #[test]
    fn a_fresh_pools_journal_end_is_clean() {
        let dev: SharedDevice = RamDevice::new("fresh", 64 << 20).unwrap();
        crate::format(&dev, &crate::FormatOptions::default()).unwrap();
        let mut io = SyncIo::new(&dev).unwrap();
        let (_, _, rep) = load_image(&mut io, dev.size_bytes()).unwrap();
        assert_eq!(rep.journal_end, JournalEnd::NoEntry { seq: 1 });
        assert!(rep.journal_end.is_clean());
    }

    /// Every end a healthy pool can have reads as healthy; the others say
    /// what to look into.
    #[test]
    fn clean_ends_say_nothing_alarming() {
        let clean = [
            JournalEnd::Full,
            JournalEnd::NoEntry { seq: 1 },
            JournalEnd::OlderEntry { seq: 9 },
        ];
        for end in &clean {
            assert!(end.is_clean(), "{end}");
            let text = end.to_string().to_lowercase();
            for word in ALARMING {
                assert!(!text.contains(word), "`{text}` reads as damage");
            }
        }
        let detail = "journal entry: checksum mismatch".to_string();
        for end in [
            JournalEnd::Torn {
                seq: 3,
                detail: detail.clone(),
            },
            JournalEnd::Unreadable { seq: 3, detail },
        ] {
            assert!(!end.is_clean(), "{end}");
        }
    }
}
