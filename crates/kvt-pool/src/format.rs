//! The pool's on-disk format, re-exported from `kvt_meta` where it lives
//! (superblock, sealed blocks, journal records, checkpoints), for the paths
//! the target, tools and fuzz targets name (`pool::format::VOL_KV`, ...).

pub use kvt_meta::block::*;
pub use kvt_meta::checkpoint::{CheckpointData, ExtentMapping};
pub use kvt_meta::journal::*;
pub use kvt_meta::superblock::*;
