//! The pool's on-disk format, re-exported from `crate::meta` where it lives
//! (superblock, sealed blocks, journal records, checkpoints), for the paths
//! the target, tools and fuzz targets name (`pool::format::VOL_KV`, ...).

pub use crate::meta::block::*;
pub use crate::meta::checkpoint::{CheckpointData, ExtentMapping};
pub use crate::meta::journal::*;
pub use crate::meta::superblock::*;
