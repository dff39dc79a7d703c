//! NVMe over Fabrics commands: Connect (command and data) and Property Get/Set.

use super::{admin_opc, fctype, Sqe, NQN_FIELD_LEN};
use crate::le::*;

/// Fabrics Connect command fields (SQE) and data (1024 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectCommand {
    pub recfmt: u16,
    pub qid: u16,
    /// 0-based submission queue size.
    pub sqsize: u16,
    pub cattr: u8,
    /// Keep-alive timeout in milliseconds (admin queue only; 0 disables).
    pub kato: u32,
}

/// Connect command attribute: the host disables SQ flow control.
pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;

impl ConnectCommand {
    pub fn parse(sqe: &Sqe) -> ConnectCommand {
        ConnectCommand {
            recfmt: u16_at(&sqe.0, 40),
            qid: u16_at(&sqe.0, 42),
            sqsize: u16_at(&sqe.0, 44),
            cattr: sqe.0[46],
            kato: u32_at(&sqe.0, 48),
        }
    }
    pub fn encode(&self, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin_opc::FABRICS, cid, 0);
        s.0[4] = fctype::CONNECT;
        put_u16(&mut s.0, 40, self.recfmt);
        put_u16(&mut s.0, 42, self.qid);
        put_u16(&mut s.0, 44, self.sqsize);
        s.0[46] = self.cattr;
        put_u32(&mut s.0, 48, self.kato);
        s
    }
}

pub const CONNECT_DATA_LEN: usize = 1024;
/// Byte offsets inside the Connect data, used to point the host at a bad field.
pub const CONNECT_DATA_CNTLID_OFF: u16 = 16;
pub const CONNECT_DATA_SUBNQN_OFF: u16 = 256;
pub const CONNECT_DATA_HOSTNQN_OFF: u16 = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

impl ConnectData {
    pub fn parse(b: &[u8]) -> Option<ConnectData> {
        if b.len() < CONNECT_DATA_LEN {
            return None;
        }
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&b[0..16]);
        Some(ConnectData {
            hostid,
            cntlid: u16_at(b, 16),
            subnqn: str_at(b, 256, NQN_FIELD_LEN),
            hostnqn: str_at(b, 512, NQN_FIELD_LEN),
        })
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONNECT_DATA_LEN];
        b[0..16].copy_from_slice(&self.hostid);
        put_u16(&mut b, 16, self.cntlid);
        put_str_nul(&mut b, 256, NQN_FIELD_LEN, &self.subnqn);
        put_str_nul(&mut b, 512, NQN_FIELD_LEN, &self.hostnqn);
        b
    }
}

/// Property Get/Set fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyCommand {
    /// Size attribute: false = 4 bytes, true = 8 bytes.
    pub eight_bytes: bool,
    pub offset: u32,
    pub value: u64,
}

impl PropertyCommand {
    pub fn parse(sqe: &Sqe) -> PropertyCommand {
        PropertyCommand {
            eight_bytes: sqe.0[40] & 0x7 == 1,
            offset: u32_at(&sqe.0, 44),
            value: u64_at(&sqe.0, 48),
        }
    }
    pub fn encode(&self, fctype: u8, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin_opc::FABRICS, cid, 0);
        s.0[4] = fctype;
        s.0[40] = self.eight_bytes as u8;
        put_u32(&mut s.0, 44, self.offset);
        put_u64(&mut s.0, 48, self.value);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = ConnectData::parse(&bytes);
        }

        #[test]
        fn connect_data_round_trips(cntlid in any::<u16>(), sub in "[a-z0-9.:-]{1,223}", host in "[a-z0-9.:-]{1,223}") {
            let d = ConnectData { hostid: [7; 16], cntlid, subnqn: sub, hostnqn: host };
            prop_assert_eq!(ConnectData::parse(&d.encode()), Some(d));
        }
    }
}
