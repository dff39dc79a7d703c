//! Controller properties (registers) reachable through Property Get/Set and
//! their fields.

/// Controller property (register) offsets reachable through Property Get/Set.
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1C;
    pub const NSSR: u32 = 0x20;
}

/// Controller Configuration register fields.
pub mod cc {
    pub const EN: u32 = 1 << 0;
    pub const SHN_SHIFT: u32 = 14;
    pub const SHN_MASK: u32 = 0x3 << SHN_SHIFT;
    pub const IOSQES_SHIFT: u32 = 16;
    pub const IOCQES_SHIFT: u32 = 20;
}

/// Controller Status register fields.
pub mod csts {
    pub const RDY: u32 = 1 << 0;
    pub const CFS: u32 = 1 << 1;
    pub const SHST_COMPLETE: u32 = 0x2 << 2;
    pub const SHST_MASK: u32 = 0x3 << 2;
}
