//! NVMe command and data-structure layouts (NVMe Base 2.0, NVM Command Set 1.0,
//! Key Value Command Set 1.0, NVMe over Fabrics). Offsets follow the specification tables; the Linux host's
//! `include/linux/nvme.h` and SPDK's `nvme_spec.h` static-assert the same ones.

mod auth;
mod command;
mod fabrics;
mod identify;
mod kv;
mod log;
mod registers;
mod status;

// Flat re-exports: every item stays reachable as `wire::nvme::X`, as before the split.
pub use self::auth::*;
pub use self::command::*;
pub use self::fabrics::*;
pub use self::identify::*;
pub use self::kv::*;
pub use self::log::*;
pub use self::registers::*;
pub use self::status::*;

/// Size of a submission queue entry.
pub const SQE_LEN: usize = 64;
/// Size of a completion queue entry.
pub const CQE_LEN: usize = 16;
/// Identify data structures are always 4 KiB.
pub const IDENTIFY_LEN: usize = 4096;
/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// NQN fields in Connect data and the discovery log are 256 bytes.
pub const NQN_FIELD_LEN: usize = 256;
/// The longest NQN the specification allows (excluding the NUL).
pub const NQN_MAX_LEN: usize = 223;
