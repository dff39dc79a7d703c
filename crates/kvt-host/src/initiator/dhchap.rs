//! The host's side of DH-HMAC-CHAP (NVMe Base 2.1, 8.3.4.5): Negotiate,
//! Challenge, Reply, Success1 and, when the controller authenticates too,
//! Success2 or Failure2.

use super::{Completion, Error, QueueConn, Result};
use kvt_auth::{self as a, DhGroup, Digest, ResponseInput, Role};
use kvt_wire::nvme::{self, ControllerMessage, HostMessage};

/// A host's DH-HMAC-CHAP keys and what it offers.
#[derive(Debug, Clone)]
pub struct HostDhchap {
    pub key: kvt_auth::DhchapSecret,
    /// Set: ask the controller to authenticate too.
    pub ctrlr_key: Option<kvt_auth::DhchapSecret>,
    pub digests: Vec<kvt_auth::Digest>,
    pub dhgroups: Vec<kvt_auth::DhGroup>,
}

impl HostDhchap {
    /// Offers every hash and group, as SPDK's and Linux's hosts do.
    pub fn new(
        key: kvt_auth::DhchapSecret,
        ctrlr_key: Option<kvt_auth::DhchapSecret>,
    ) -> HostDhchap {
        HostDhchap {
            key,
            ctrlr_key,
            digests: kvt_auth::Digest::ALL.to_vec(),
            dhgroups: kvt_auth::DhGroup::ALL.to_vec(),
        }
    }

    /// The host's side of one transaction on `q`.
    pub fn authenticate(
        &self,
        q: &mut QueueConn,
        hostnqn: &str,
        subnqn: &str,
        qid: u16,
    ) -> Result<()> {
        let t_id = 0x4B56 ^ qid;
        self.negotiate(q, t_id)?;
        let ch = parse(q.auth_recv(4096)?.ok()?)?;
        let ControllerMessage::Challenge {
            hash_id,
            dhgroup_id,
            seqnum,
            challenge,
            dh_value,
            ..
        } = &ch
        else {
            return Err(failure(&ch));
        };
        let d = Digest::from_id(*hash_id).ok_or_else(|| Error::Auth(format!("hash {hash_id}")))?;
        let g = DhGroup::from_id(*dhgroup_id)
            .ok_or_else(|| Error::Auth(format!("group {dhgroup_id}")))?;
        let (public, shared) = dh_exchange(g, dh_value)?;
        let respond = |role: Role, key: &[u8], challenge: &[u8], seqnum: u32| {
            a::response(
                role,
                &ResponseInput {
                    digest: d,
                    key,
                    challenge,
                    dh_secret: shared.as_deref().map(|v| v.as_slice()),
                    seqnum,
                    tid: t_id,
                    scc: 0,
                    hostnqn,
                    subnqn,
                },
            )
        };
        let r1 = respond(
            Role::Host,
            &self.key.transformed(hostnqn),
            challenge,
            *seqnum,
        );
        let (c2, s2) = self.host_challenge(d)?;
        self.reply(q, t_id, d, (&r1, &c2, s2), &public)?;
        let verdict = parse(q.auth_recv(4096)?.ok()?)?;
        let ControllerMessage::Success1 { response, .. } = &verdict else {
            return Err(failure(&verdict));
        };
        let Some(ck) = &self.ctrlr_key else {
            return Ok(());
        };
        let want = respond(Role::Controller, &ck.transformed(subnqn), &c2, s2);
        check_controller(q, t_id, response.as_deref(), &want)
    }

    /// Sends the Reply message: the host's response `r1` and, for the
    /// controller to answer, its challenge `c2` with sequence number `s2`.
    fn reply(
        &self,
        q: &mut QueueConn,
        t_id: u16,
        d: Digest,
        (r1, c2, s2): (&[u8], &[u8], u32),
        public: &[u8],
    ) -> Result<()> {
        q.auth_send(
            HostMessage::Reply(nvme::Reply {
                t_id,
                hl: d.hash_len() as u8,
                cvalid: self.ctrlr_key.is_some() as u8,
                seqnum: s2,
                response: r1,
                challenge: c2,
                dh_value: public,
            })
            .encode(),
        )?
        .ok()?;
        Ok(())
    }

    /// Sends the Negotiate message: every hash and group the host offers.
    fn negotiate(&self, q: &mut QueueConn, t_id: u16) -> Result<()> {
        q.auth_send(
            HostMessage::Negotiate(nvme::Negotiate {
                t_id,
                sc_c: 0,
                protocols: vec![nvme::Protocol {
                    auth_id: nvme::AUTHID_DHCHAP,
                    hashes: self.digests.iter().map(|d| d.id()).collect(),
                    dhgroups: self.dhgroups.iter().map(|g| g.id()).collect(),
                }],
            })
            .encode(),
        )?
        .ok()?;
        Ok(())
    }

    /// The host's challenge to the controller and its sequence number: random
    /// when the controller is to authenticate too, empty (zeroes, 0) if not.
    fn host_challenge(&self, d: Digest) -> Result<(Vec<u8>, u32)> {
        let mut c2 = vec![0u8; d.hash_len()];
        if self.ctrlr_key.is_none() {
            return Ok((c2, 0));
        }
        kvt_auth::random_bytes(&mut c2).map_err(|e| Error::Auth(e.to_string()))?;
        Ok((c2, 0x5EED))
    }
}

/// Bidirectional authentication's last step: the controller's response must
/// be `want`; sends Success2, or Failure2 and fails.
fn check_controller(
    q: &mut QueueConn,
    t_id: u16,
    response: Option<&[u8]>,
    want: &[u8],
) -> Result<()> {
    if response != Some(want) {
        q.auth_send(
            HostMessage::Failure2 {
                t_id,
                reason: nvme::FailureReason::Failed as u8,
            }
            .encode(),
        )?;
        return Err(Error::Auth(
            "the controller's response does not match dhchap_ctrlr_key".into(),
        ));
    }
    q.auth_send(HostMessage::Success2 { t_id }.encode())?.ok()?;
    Ok(())
}

/// The host's DH public value and the shared secret with the controller's
/// `peer` value (none for the NULL group).
fn dh_exchange(
    g: DhGroup,
    peer: &[u8],
) -> Result<(Vec<u8>, Option<impl std::ops::Deref<Target = Vec<u8>>>)> {
    if g == DhGroup::Null {
        return Ok((Vec::new(), None));
    }
    let k = a::DhKeyPair::generate(g).map_err(|e| Error::Auth(e.to_string()))?;
    let s = k
        .shared_secret(peer)
        .map_err(|e| Error::Auth(e.to_string()))?;
    Ok((k.public().to_vec(), Some(s)))
}

/// The error for a message that is not the one expected next.
fn failure(m: &ControllerMessage) -> Error {
    match m {
        ControllerMessage::Failure1 { reason, .. } => Error::Auth(format!(
            "the controller refused: {}",
            nvme::FailureReason::from_code(*reason).map_or("unknown reason", |r| r.describe())
        )),
        m => Error::Auth(format!("unexpected message {m:?}")),
    }
}

/// The controller's message an Authentication Receive returned.
fn parse(c: Completion) -> Result<ControllerMessage> {
    ControllerMessage::parse(&c.data).map_err(|e| Error::Auth(e.to_string()))
}
