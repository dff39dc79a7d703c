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

/// Controller Capabilities register fields.
pub mod cap {
    /// CAP.CSS (bits 44:37): which command sets CC.CSS may select.
    pub const CSS_SHIFT: u32 = 37;
    /// CSS bit 0: the NVM Command Set (CC.CSS = 000b).
    pub const CSS_NVM: u64 = 1 << CSS_SHIFT;
    /// CSS bit 6: one or more I/O Command Sets (CC.CSS = 110b). Linux
    /// (`nvme_enable_ctrl`) writes CC.CSS = 110b when it sees this bit.
    pub const CSS_IOCS: u64 = 1 << (CSS_SHIFT + 6);
}

/// Controller Configuration register fields.
pub mod cc {
    pub const EN: u32 = 1 << 0;
    /// CC.CSS (bits 6:4): I/O Command Set Selected.
    pub const CSS_SHIFT: u32 = 4;
    pub const CSS_MASK: u32 = 0x7 << CSS_SHIFT;
    /// CC.CSS = 000b: the NVM Command Set only.
    pub const CSS_NVM: u32 = 0b000;
    /// CC.CSS = 110b: all I/O Command Sets the controller supports, the
    /// combination chosen with the I/O Command Set Profile feature.
    pub const CSS_ALL_IOCS: u32 = 0b110;
    /// CC.CSS = 111b: Admin Command Set only (no I/O queues).
    pub const CSS_ADMIN_ONLY: u32 = 0b111;
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
