//! Formatting a device: scrubs the data region, invalidates any earlier
//! pool's checkpoints and journal, writes the first checkpoint (every extent
//! clean) and, last, the superblock: a pool exists only once its metadata does.

use super::block::{seal, BlockHeader, CHECKPOINT_MAGIC, META_BLOCK, SUPERBLOCK_MAGIC};
use super::checkpoint::CheckpointData;
use super::error::PoolError;
use super::recovery::pool_tag;
use super::superblock::{Superblock, MAX_VOLUMES};
use kvt_bdev::sync_io::SyncIo;
use kvt_bdev::{IoOp, SharedDevice};
use kvt_wire::ident::stable_uuid;

/// Options for formatting a pool.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    pub extent_size: u64,
    /// Overwrite a device that already holds a pool.
    pub force: bool,
    /// Journal size override (tests use small journals to exercise wrapping).
    pub journal_len: Option<u64>,
    /// Volumes the checkpoint slots have room for (default `MAX_VOLUMES`,
    /// 4,096; each takes 640 bytes of metadata, both slots).
    pub max_volumes: Option<u32>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            extent_size: 1 << 20,
            force: false,
            journal_len: None,
            max_volumes: None,
        }
    }
}

/// Formats a pool on a device.
pub fn format(dev: &SharedDevice, opts: &FormatOptions) -> Result<Superblock, PoolError> {
    let mut io = SyncIo::new(dev)?;
    let size = dev.size_bytes();
    if size >= META_BLOCK {
        let b = io.read(0, META_BLOCK as usize)?;
        if &b[..8] == SUPERBLOCK_MAGIC && !opts.force {
            return Err(PoolError::Occupied {
                dev: dev.describe(),
                detail: match Superblock::decode(&b) {
                    Ok(sb) => format!(" ({} extents of {} bytes)", sb.extent_count, sb.extent_size),
                    Err(e) => format!(" (damaged: {e})"),
                },
            });
        }
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let uuid = stable_uuid(&format!("pool/{}/{nanos}", dev.describe()));
    let max_volumes = opts.max_volumes.unwrap_or(MAX_VOLUMES as u32);
    let sb = Superblock::layout_with(size, opts.extent_size, uuid, opts.journal_len, max_volumes)
        .map_err(|e| PoolError::from(e).on(dev.describe()))?;
    // Whatever the device held before must not leak into volumes: start with
    // every extent scrubbed (one deallocate over the data region).
    let data_len = sb.extent_count as u64 * sb.extent_size;
    io.run_all(vec![IoOp::Deallocate {
        offset: sb.data_offset,
        len: data_len,
    }])
    .map_err(|errno| PoolError::Scrub { errno })?;
    // Invalidate both checkpoint slots and the journal's first block of any
    // earlier pool, then write the first checkpoint.
    let zero = vec![0u8; META_BLOCK as usize];
    io.write(sb.ckpt_offset + sb.ckpt_slot_len, &zero)?;
    io.write(sb.journal_offset, &zero)?;
    let ckpt = CheckpointData {
        next_volume_id: 1,
        volumes: vec![],
        mappings: vec![],
        clean: (0..sb.extent_count).collect(),
        kv: vec![],
        resv: vec![],
    };
    let block = seal(
        CHECKPOINT_MAGIC,
        BlockHeader {
            seq: 1,
            journal_seq: 1,
            journal_pos: 0,
            payload_len: 0,
            payload_crc: 0,
            pool_tag: pool_tag(&sb.uuid),
        },
        &ckpt.encode(),
    );
    io.write(sb.ckpt_offset, &block)?;
    io.flush()?;
    // The superblock goes last: a pool exists only once its metadata does.
    io.write(0, &sb.encode())?;
    io.flush()?;
    Ok(sb)
}
