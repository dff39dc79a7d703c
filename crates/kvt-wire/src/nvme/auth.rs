//! NVMe in-band authentication messages (NVMe Base 2.0 section 5.3 and 8.13): the
//! Authentication Send / Receive command fields and the DH-HMAC-CHAP messages they
//! carry. Layouts follow the specification's figures; SPDK's `nvmf_spec.h` and the
//! Linux host's `nvme.h` static-assert the same offsets. Hand-written: the messages
//! are a handful of fixed little-endian headers with length-checked tails.

use super::{admin_opc, Sqe};
use crate::le::*;

/// SECP: the NVMe security protocol.
pub const SECP_NVME: u8 = 0xE9;
/// SPSP0/SPSP1 of DH-HMAC-CHAP.
pub const SPSP_DHCHAP: u8 = 0x01;

/// Authentication Send (TL) / Receive (AL) command fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthCommand {
    pub secp: u8,
    pub spsp0: u8,
    pub spsp1: u8,
    /// Transfer length (Send) or allocation length (Receive).
    pub len: u32,
}

impl AuthCommand {
    pub fn parse(sqe: &Sqe) -> AuthCommand {
        AuthCommand {
            spsp0: sqe.0[41],
            spsp1: sqe.0[42],
            secp: sqe.0[43],
            len: u32_at(&sqe.0, 44),
        }
    }
    pub fn dhchap(len: u32) -> AuthCommand {
        AuthCommand {
            secp: SECP_NVME,
            spsp0: SPSP_DHCHAP,
            spsp1: SPSP_DHCHAP,
            len,
        }
    }
    pub fn encode(&self, fctype: u8, cid: u16) -> Sqe {
        let mut s = Sqe::new(admin_opc::FABRICS, cid, 0);
        s.0[4] = fctype;
        s.0[41] = self.spsp0;
        s.0[42] = self.spsp1;
        s.0[43] = self.secp;
        put_u32(&mut s.0, 44, self.len);
        s
    }
    /// The fields name DH-HMAC-CHAP.
    pub fn is_dhchap(&self) -> bool {
        self.secp == SECP_NVME && self.spsp0 == SPSP_DHCHAP && self.spsp1 == SPSP_DHCHAP
    }
}

/// AUTH_TYPE values.
pub mod auth_type {
    pub const COMMON: u8 = 0x00;
    pub const DHCHAP: u8 = 0x01;
}

/// AUTH_ID values.
pub mod auth_id {
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xF0;
    pub const FAILURE1: u8 = 0xF1;
}

/// The protocol identifier of DH-HMAC-CHAP in a Negotiate descriptor.
pub const AUTHID_DHCHAP: u8 = 0x01;

/// Reason code explanations of AUTH_Failure1/2 (the reason code itself is always
/// 01h, "authentication failure").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FailureReason {
    Failed = 0x01,
    ProtocolUnusable = 0x02,
    ScMismatch = 0x03,
    HashUnusable = 0x04,
    DhGroupUnusable = 0x05,
    IncorrectPayload = 0x06,
    IncorrectProtocolMessage = 0x07,
}

impl FailureReason {
    pub fn from_code(c: u8) -> Option<FailureReason> {
        use FailureReason::*;
        [
            Failed,
            ProtocolUnusable,
            ScMismatch,
            HashUnusable,
            DhGroupUnusable,
            IncorrectPayload,
            IncorrectProtocolMessage,
        ]
        .into_iter()
        .find(|r| *r as u8 == c)
    }
    pub fn describe(self) -> &'static str {
        match self {
            FailureReason::Failed => "authentication failed",
            FailureReason::ProtocolUnusable => "no usable authentication protocol",
            FailureReason::ScMismatch => "secure channel concatenation mismatch",
            FailureReason::HashUnusable => "no usable hash function",
            FailureReason::DhGroupUnusable => "no usable DH group",
            FailureReason::IncorrectPayload => "incorrect payload",
            FailureReason::IncorrectProtocolMessage => "unexpected protocol message",
        }
    }
}

const REASON_CODE_FAILURE: u8 = 0x01;
const HEADER_LEN: usize = 16;
/// A Negotiate descriptor: AUTHID, reserved, HALEN, DHLEN, 30 hash IDs, 30 DH IDs.
const DESCRIPTOR_LEN: usize = 64;
const ID_LIST_LEN: usize = 30;

/// The protocols a host offers (AUTH_Negotiate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    pub t_id: u16,
    pub sc_c: u8,
    pub protocols: Vec<Protocol>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    pub auth_id: u8,
    pub hashes: Vec<u8>,
    pub dhgroups: Vec<u8>,
}

/// The host's answer to a challenge (DH-HMAC-CHAP_Reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply<'a> {
    pub t_id: u16,
    pub hl: u8,
    /// The host asks the controller to authenticate too (bidirectional).
    pub cvalid: u8,
    /// S2, the host's sequence number for the controller's response.
    pub seqnum: u32,
    /// R1, HL bytes.
    pub response: &'a [u8],
    /// C2, HL bytes (meaningful when `cvalid` is 1).
    pub challenge: &'a [u8],
    /// The host's DH public value (DHVLEN bytes, empty for the null group).
    pub dh_value: &'a [u8],
}

/// A message a host sends with Authentication Send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMessage<'a> {
    Negotiate(Negotiate),
    Reply(Reply<'a>),
    Success2 { t_id: u16 },
    Failure2 { t_id: u16, reason: u8 },
}

/// Why a message could not be read: the explanation a Failure1 carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("message of {0} bytes is shorter or longer than its fields say")]
    Length(usize),
    #[error("unexpected message type {auth_type:#x}/{auth_id:#x}")]
    Unexpected { auth_type: u8, auth_id: u8 },
}

impl MessageError {
    pub fn reason(self) -> FailureReason {
        match self {
            MessageError::Length(_) => FailureReason::IncorrectPayload,
            MessageError::Unexpected { .. } => FailureReason::IncorrectProtocolMessage,
        }
    }
}

impl<'a> HostMessage<'a> {
    /// Reads a host message; every length must be exactly what its fields say.
    pub fn parse(b: &'a [u8]) -> Result<HostMessage<'a>, MessageError> {
        if b.len() < 8 {
            return Err(MessageError::Length(b.len()));
        }
        let (auth_type, auth_id, t_id) = (b[0], b[1], u16_at(b, 4));
        match (auth_type, auth_id) {
            (auth_type::COMMON, auth_id::NEGOTIATE) => {
                let napd = b[7] as usize;
                if b.len() != 8 + napd * DESCRIPTOR_LEN {
                    return Err(MessageError::Length(b.len()));
                }
                let mut protocols = Vec::with_capacity(napd);
                for d in b[8..].chunks_exact(DESCRIPTOR_LEN) {
                    let (halen, dhlen) = (d[2] as usize, d[3] as usize);
                    if halen > ID_LIST_LEN || dhlen > ID_LIST_LEN {
                        return Err(MessageError::Length(b.len()));
                    }
                    protocols.push(Protocol {
                        auth_id: d[0],
                        hashes: d[4..4 + halen].to_vec(),
                        dhgroups: d[4 + ID_LIST_LEN..4 + ID_LIST_LEN + dhlen].to_vec(),
                    });
                }
                Ok(HostMessage::Negotiate(Negotiate {
                    t_id,
                    sc_c: b[6],
                    protocols,
                }))
            }
            (auth_type::DHCHAP, auth_id::REPLY) => {
                if b.len() < HEADER_LEN {
                    return Err(MessageError::Length(b.len()));
                }
                let hl = b[6] as usize;
                let dhvlen = u16_at(b, 10) as usize;
                if b.len() != HEADER_LEN + 2 * hl + dhvlen {
                    return Err(MessageError::Length(b.len()));
                }
                let rest = &b[HEADER_LEN..];
                Ok(HostMessage::Reply(Reply {
                    t_id,
                    hl: b[6],
                    cvalid: b[8],
                    seqnum: u32_at(b, 12),
                    response: &rest[..hl],
                    challenge: &rest[hl..2 * hl],
                    dh_value: &rest[2 * hl..],
                }))
            }
            (auth_type::DHCHAP, auth_id::SUCCESS2) => {
                if b.len() != HEADER_LEN {
                    return Err(MessageError::Length(b.len()));
                }
                Ok(HostMessage::Success2 { t_id })
            }
            (auth_type::COMMON, auth_id::FAILURE2) => {
                // Header, reason code, explanation (SPDK and Linux pad to 16 bytes).
                if b.len() < 8 || b.len() > HEADER_LEN {
                    return Err(MessageError::Length(b.len()));
                }
                Ok(HostMessage::Failure2 { t_id, reason: b[7] })
            }
            _ => Err(MessageError::Unexpected { auth_type, auth_id }),
        }
    }

    /// The host's side: the message as it goes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            HostMessage::Negotiate(n) => {
                let mut b = vec![0u8; 8 + n.protocols.len() * DESCRIPTOR_LEN];
                b[0] = auth_type::COMMON;
                b[1] = auth_id::NEGOTIATE;
                put_u16(&mut b, 4, n.t_id);
                b[6] = n.sc_c;
                b[7] = n.protocols.len() as u8;
                for (p, d) in n
                    .protocols
                    .iter()
                    .zip(b[8..].chunks_exact_mut(DESCRIPTOR_LEN))
                {
                    let hashes = &p.hashes[..p.hashes.len().min(ID_LIST_LEN)];
                    let groups = &p.dhgroups[..p.dhgroups.len().min(ID_LIST_LEN)];
                    d[0] = p.auth_id;
                    d[2] = hashes.len() as u8;
                    d[3] = groups.len() as u8;
                    d[4..4 + hashes.len()].copy_from_slice(hashes);
                    d[4 + ID_LIST_LEN..4 + ID_LIST_LEN + groups.len()].copy_from_slice(groups);
                }
                b
            }
            HostMessage::Reply(r) => {
                let mut b = header(auth_type::DHCHAP, auth_id::REPLY, r.t_id);
                b[6] = r.hl;
                b[8] = r.cvalid;
                put_u16(&mut b, 10, r.dh_value.len() as u16);
                put_u32(&mut b, 12, r.seqnum);
                b.extend_from_slice(r.response);
                b.extend_from_slice(r.challenge);
                b.extend_from_slice(r.dh_value);
                b
            }
            HostMessage::Success2 { t_id } => header(auth_type::DHCHAP, auth_id::SUCCESS2, *t_id),
            HostMessage::Failure2 { t_id, reason } => {
                let mut b = header(auth_type::COMMON, auth_id::FAILURE2, *t_id);
                b[6] = REASON_CODE_FAILURE;
                b[7] = *reason;
                b
            }
        }
    }
}

fn header(auth_type: u8, auth_id: u8, t_id: u16) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN];
    b[0] = auth_type;
    b[1] = auth_id;
    put_u16(&mut b, 4, t_id);
    b
}

/// A message a controller returns with Authentication Receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControllerMessage {
    Challenge {
        t_id: u16,
        hash_id: u8,
        dhgroup_id: u8,
        /// S1.
        seqnum: u32,
        /// C1, HL bytes.
        challenge: Vec<u8>,
        /// The controller's DH public value.
        dh_value: Vec<u8>,
    },
    Success1 {
        t_id: u16,
        hl: u8,
        /// R2, the controller's response, when the host asked for it.
        response: Option<Vec<u8>>,
    },
    Failure1 {
        t_id: u16,
        reason: u8,
    },
}

impl ControllerMessage {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ControllerMessage::Challenge {
                t_id,
                hash_id,
                dhgroup_id,
                seqnum,
                challenge,
                dh_value,
            } => {
                let mut b = header(auth_type::DHCHAP, auth_id::CHALLENGE, *t_id);
                b[6] = challenge.len() as u8;
                b[8] = *hash_id;
                b[9] = *dhgroup_id;
                put_u16(&mut b, 10, dh_value.len() as u16);
                put_u32(&mut b, 12, *seqnum);
                b.extend_from_slice(challenge);
                b.extend_from_slice(dh_value);
                b
            }
            ControllerMessage::Success1 { t_id, hl, response } => {
                let mut b = header(auth_type::DHCHAP, auth_id::SUCCESS1, *t_id);
                // HL is set even without a response: the Linux host expects it.
                b[6] = *hl;
                if let Some(r) = response {
                    b[8] = 1;
                    b.extend_from_slice(r);
                }
                b
            }
            ControllerMessage::Failure1 { t_id, reason } => {
                let mut b = header(auth_type::COMMON, auth_id::FAILURE1, *t_id);
                b[6] = REASON_CODE_FAILURE;
                b[7] = *reason;
                b
            }
        }
    }

    /// The host's side: reads what a controller returned.
    pub fn parse(b: &[u8]) -> Result<ControllerMessage, MessageError> {
        if b.len() < 8 {
            return Err(MessageError::Length(b.len()));
        }
        let (ty, id, t_id) = (b[0], b[1], u16_at(b, 4));
        match (ty, id) {
            (auth_type::DHCHAP, auth_id::CHALLENGE) => {
                if b.len() < HEADER_LEN {
                    return Err(MessageError::Length(b.len()));
                }
                let hl = b[6] as usize;
                let dhvlen = u16_at(b, 10) as usize;
                if b.len() < HEADER_LEN + hl + dhvlen {
                    return Err(MessageError::Length(b.len()));
                }
                Ok(ControllerMessage::Challenge {
                    t_id,
                    hash_id: b[8],
                    dhgroup_id: b[9],
                    seqnum: u32_at(b, 12),
                    challenge: b[HEADER_LEN..HEADER_LEN + hl].to_vec(),
                    dh_value: b[HEADER_LEN + hl..HEADER_LEN + hl + dhvlen].to_vec(),
                })
            }
            (auth_type::DHCHAP, auth_id::SUCCESS1) => {
                if b.len() < HEADER_LEN {
                    return Err(MessageError::Length(b.len()));
                }
                let hl = b[6] as usize;
                let response = if b[8] != 0 {
                    if b.len() < HEADER_LEN + hl {
                        return Err(MessageError::Length(b.len()));
                    }
                    Some(b[HEADER_LEN..HEADER_LEN + hl].to_vec())
                } else {
                    None
                };
                Ok(ControllerMessage::Success1 {
                    t_id,
                    hl: b[6],
                    response,
                })
            }
            (auth_type::COMMON, auth_id::FAILURE1) => {
                Ok(ControllerMessage::Failure1 { t_id, reason: b[7] })
            }
            (auth_type, auth_id) => Err(MessageError::Unexpected { auth_type, auth_id }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvme::fctype;
    use proptest::prelude::*;

    #[test]
    fn command_fields_sit_where_spdk_puts_them() {
        let s = AuthCommand::dhchap(72).encode(fctype::AUTH_SEND, 9);
        assert_eq!(
            (s.0[0], s.0[4], s.0[41], s.0[42], s.0[43]),
            (0x7F, 5, 1, 1, 0xE9)
        );
        assert_eq!(u32_at(&s.0, 44), 72);
        let c = AuthCommand::parse(&s);
        assert!(c.is_dhchap());
        assert_eq!(c.len, 72);
    }

    #[test]
    fn negotiate_layout() {
        let n = HostMessage::Negotiate(Negotiate {
            t_id: 0x1234,
            sc_c: 0,
            protocols: vec![Protocol {
                auth_id: AUTHID_DHCHAP,
                hashes: vec![1, 2, 3],
                dhgroups: vec![0, 1, 2, 3, 4, 5],
            }],
        });
        let b = n.encode();
        assert_eq!(b.len(), 72);
        assert_eq!(
            (b[4], b[5], b[7], b[8], b[10], b[11]),
            (0x34, 0x12, 1, 1, 3, 6)
        );
        assert_eq!(&b[12..15], &[1, 2, 3]);
        assert_eq!(&b[42..48], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(HostMessage::parse(&b), Ok(n));
        // One byte short or long is an incorrect payload.
        assert_eq!(
            HostMessage::parse(&b[..71]).map_err(|e| e.reason()),
            Err(FailureReason::IncorrectPayload)
        );
    }

    #[test]
    fn reply_lengths_must_add_up() {
        let r = HostMessage::Reply(Reply {
            t_id: 1,
            hl: 32,
            cvalid: 1,
            seqnum: 7,
            response: &[1; 32],
            challenge: &[2; 32],
            dh_value: &[3; 256],
        });
        let b = r.encode();
        assert_eq!(b.len(), 16 + 64 + 256);
        assert_eq!(HostMessage::parse(&b), Ok(r));
        let mut short = b.clone();
        short.pop();
        assert_eq!(
            HostMessage::parse(&short),
            Err(MessageError::Length(short.len()))
        );
        let mut other = b.clone();
        other[1] = 0x09;
        assert_eq!(
            HostMessage::parse(&other).map_err(|e| e.reason()),
            Err(FailureReason::IncorrectProtocolMessage)
        );
    }

    #[test]
    fn controller_messages_round_trip() {
        for m in [
            ControllerMessage::Challenge {
                t_id: 3,
                hash_id: 3,
                dhgroup_id: 1,
                seqnum: 99,
                challenge: vec![4; 64],
                dh_value: vec![5; 256],
            },
            ControllerMessage::Success1 {
                t_id: 3,
                hl: 48,
                response: Some(vec![6; 48]),
            },
            ControllerMessage::Success1 {
                t_id: 3,
                hl: 48,
                response: None,
            },
            ControllerMessage::Failure1 {
                t_id: 3,
                reason: FailureReason::Failed as u8,
            },
        ] {
            assert_eq!(ControllerMessage::parse(&m.encode()), Ok(m));
        }
    }

    proptest! {
        #[test]
        fn parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..1500)) {
            let _ = HostMessage::parse(&b);
            let _ = ControllerMessage::parse(&b);
        }

        #[test]
        fn headers_with_any_lengths_never_panic(ty in 0u8..2, id in prop::sample::select(vec![0u8, 1, 2, 3, 4, 0xF0, 0xF1]),
                                               hl in any::<u8>(), dhvlen in any::<u16>(), napd in any::<u8>(),
                                               tail in 0usize..600) {
            let mut b = vec![0u8; 16 + tail];
            b[0] = ty; b[1] = id; b[6] = hl; b[7] = napd;
            b[10..12].copy_from_slice(&dhvlen.to_le_bytes());
            let _ = HostMessage::parse(&b);
            let _ = ControllerMessage::parse(&b);
        }

        #[test]
        fn replies_round_trip(hl in 0usize..65, dh in 0usize..300, cvalid in 0u8..2, seq in any::<u32>(), t_id in any::<u16>()) {
            let resp = vec![1u8; hl];
            let chal = vec![2u8; hl];
            let dhv = vec![3u8; dh];
            let r = HostMessage::Reply(Reply { t_id, hl: hl as u8, cvalid, seqnum: seq,
                                               response: &resp, challenge: &chal, dh_value: &dhv });
            let b = r.encode();
            prop_assert_eq!(HostMessage::parse(&b), Ok(r));
        }
    }
}
