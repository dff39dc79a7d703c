//! How a pool this crate wrote ends its journal when kvt-meta's recovery
//! reads it back: a clean reopen reads as healthy, a torn entry does not.
//! (A fresh pool's end and the words each end uses are kvt-meta's own tests.)

use super::*;
use kvt_bdev::ram::RamDevice;
use kvt_bdev::sync_io::SyncIo;
use kvt_meta::{BlockHeader, JournalEnd, Superblock, HEADER_LEN, JOURNAL_MAGIC, META_BLOCK};

fn recover(dev: &SharedDevice) -> (Superblock, RecoveryReport) {
    let mut io = SyncIo::new(dev).unwrap();
    let (sb, _, rep) = load_image(&mut io, dev.size_bytes()).unwrap();
    (sb, rep)
}

/// What an operator reads after a clean close must not read as damage.
#[test]
fn a_clean_reopen_ends_the_journal_cleanly() {
    let dev: SharedDevice = RamDevice::new("reopen", 64 << 20).unwrap();
    format(&dev, &FormatOptions::default()).unwrap();
    let pool = Pool::open("p", dev.clone(), PoolOptions::stepped()).unwrap();
    pool.create_volume("v", 1 << 20, 4096, 0).unwrap();
    pool.close().unwrap();
    let (_, reopened) = recover(&dev);
    let end = &reopened.journal_end;
    assert!(end.is_clean(), "{end}");
    let text = end.to_string().to_lowercase();
    for alarming in [
        "bad", "magic", "error", "fail", "damage", "corrupt", "mismatch",
    ] {
        assert!(!text.contains(alarming), "`{text}` reads as damage");
    }
}

/// A journal entry whose payload no longer matches its checksum (a torn
/// write) ends replay before it, and says so as something to look into.
#[test]
fn a_torn_entry_ends_the_journal_and_is_not_clean() {
    let dev: SharedDevice = RamDevice::new("torn", 64 << 20).unwrap();
    format(&dev, &FormatOptions::default()).unwrap();
    let pool = Pool::open("p", dev.clone(), PoolOptions::stepped()).unwrap();
    pool.create_volume("v", 1 << 20, 4096, 0).unwrap();
    let (sb, before) = recover(&dev);
    assert!(before.journal_entries >= 1, "{before:?}");
    // Find the first entry replayed in the ring; flip a byte of its payload.
    let first_seq = before.end_seq - before.journal_entries;
    let mut io = SyncIo::new(&dev).unwrap();
    let first_start = (0..sb.journal_len / META_BLOCK)
        .map(|i| i * META_BLOCK)
        .find(|&pos| {
            let head = io
                .read(sb.journal_offset + pos, META_BLOCK as usize)
                .unwrap();
            BlockHeader::decode(JOURNAL_MAGIC, &head, "journal entry")
                .is_ok_and(|h| h.seq == first_seq)
        })
        .unwrap();
    let at = sb.journal_offset + first_start + HEADER_LEN as u64;
    let mut b = io
        .read(at - at % META_BLOCK, META_BLOCK as usize)
        .unwrap()
        .to_vec();
    b[(at % META_BLOCK) as usize] ^= 0xff;
    io.write(at - at % META_BLOCK, &b).unwrap();
    drop(io);
    let (_, after) = recover(&dev);
    assert!(
        matches!(after.journal_end, JournalEnd::Torn { seq, .. } if seq == first_seq),
        "{:?}",
        after.journal_end
    );
    assert!(!after.journal_end.is_clean());
    drop(pool);
}
