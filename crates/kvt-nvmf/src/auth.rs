//! DH-HMAC-CHAP on one queue, the controller's side (NVMe Base 2.0 section 8.13.5):
//! the host negotiates a hash and a DH group (AUTH_Negotiate, Authentication Send),
//! reads the challenge (Authentication Receive), answers it (DH-HMAC-CHAP_Reply,
//! optionally asking the controller to prove itself too), and reads the verdict
//! (Success1, or Failure1 after which the queue closes); a bidirectional exchange
//! ends with the host's Success2 or Failure2. Until it ends in success the queue
//! carries nothing but these two commands (`Queue::admit`).
//!
//! Each queue of a controller authenticates on its own, as in SPDK's nvmf_tgt and
//! Linux nvmet. A message the state does not expect, or one whose lengths do not add
//! up, ends the transaction with Failure1 and the reason the specification names; the
//! Send that carried it completes successfully (the failure is reported in band).

use kvt_auth::{self as auth, AuthPolicy, DhGroup, DhKeyPair, Digest, Key, ResponseInput, Role};
use kvt_wire::nvme::{
    AuthCommand, ControllerMessage, FailureReason, HostMessage, Reply, Status, AUTHID_DHCHAP,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// A host entry's keys (SPDK's `dhchap_key` / `dhchap_ctrlr_key`): the host proves
/// itself with the first; with the second the controller can prove itself to a host
/// that asks.
#[derive(Debug, Clone)]
pub struct HostKeys {
    pub dhchap_key: Arc<Key>,
    pub dhchap_ctrlr_key: Option<Arc<Key>>,
}

/// Why a host entry's key names do not resolve; `field` is the entry's key
/// (`dhchap_key` or `dhchap_ctrlr_key`).
#[derive(Debug, thiserror::Error)]
pub enum HostKeyError {
    #[error("{field}: {source}")]
    Missing {
        field: &'static str,
        #[source]
        source: kvt_auth::KeyError,
    },
    #[error("psk: key `{key}` is not an NVMe/TCP TLS PSK: {source}")]
    NotPsk {
        key: String,
        #[source]
        source: kvt_auth::PskError,
    },
    #[error("{field}: key `{key}` is not a DH-HMAC-CHAP secret: {source}")]
    NotDhchap {
        field: &'static str,
        key: String,
        #[source]
        source: kvt_auth::SecretError,
    },
}

impl HostKeys {
    /// A host entry's keys by name from `ring`, each checked to hold a
    /// DH-HMAC-CHAP secret now rather than at the host's first Connect (the
    /// configuration and `nvmf_subsystem_add_host` / `set_keys` share this).
    pub fn resolve(
        ring: &kvt_auth::Keyring,
        key: &str,
        ctrlr_key: Option<&str>,
    ) -> Result<HostKeys, HostKeyError> {
        let get = |field: &'static str, name: &str| {
            let k = ring
                .get(name)
                .map_err(|source| HostKeyError::Missing { field, source })?;
            k.dhchap().map_err(|source| HostKeyError::NotDhchap {
                field,
                key: name.to_string(),
                source,
            })?;
            Ok(k)
        };
        Ok(HostKeys {
            dhchap_key: get("dhchap_key", key)?,
            dhchap_ctrlr_key: ctrlr_key.map(|c| get("dhchap_ctrlr_key", c)).transpose()?,
        })
    }
}

/// A host entry's TLS PSK (SPDK's `psk`) by name from `ring`, checked to hold
/// one in the interchange format now rather than at the host's first handshake.
pub fn resolve_psk(ring: &kvt_auth::Keyring, name: &str) -> Result<Arc<Key>, HostKeyError> {
    let k = ring.get(name).map_err(|source| HostKeyError::Missing {
        field: "psk",
        source,
    })?;
    k.tls_psk().map_err(|source| HostKeyError::NotPsk {
        key: name.to_string(),
        source,
    })?;
    Ok(k)
}

/// An authentication transaction with no step for this long fails (SPDK's
/// default; a controller with a keep-alive timeout uses that instead).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Negotiate,
    /// Negotiated: the next Receive returns the challenge.
    Challenge,
    /// Challenged: the next Send must be the host's Reply.
    Reply,
    /// Reply checked: the next Receive returns Success1.
    Success1,
    /// Success1 carried the controller's response: the host's Success2 or
    /// Failure2 comes next.
    Success2,
    /// Failed: the next Receive returns Failure1 with this reason.
    Failure1(FailureReason),
    Done,
    /// Failure1 returned, or the host sent Failure2: the queue closes.
    Failed,
}

/// What a step asks of the queue besides its completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub status: Status,
    /// Controller-to-host data (Authentication Receive).
    pub data: Option<Vec<u8>>,
    /// Close the queue once the completion is out.
    pub close_after: bool,
}

impl Step {
    fn status(status: Status) -> Step {
        Step {
            status,
            data: None,
            close_after: false,
        }
    }
}

/// A transaction's state for listings: SPDK's state names, and what was
/// negotiated once it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthStatus {
    pub state: &'static str,
    pub digest: Option<&'static str>,
    pub dhgroup: Option<&'static str>,
}

pub struct QueueAuth {
    state: State,
    keys: Option<HostKeys>,
    hostnqn: String,
    subnqn: String,
    qid: u16,
    policy: AuthPolicy,
    tid: u16,
    digest: Digest,
    dhgroup: DhGroup,
    /// A hash and group were agreed.
    negotiated: bool,
    dh: Option<DhKeyPair>,
    /// C1, the controller's challenge.
    challenge: Zeroizing<Vec<u8>>,
    seqnum: u32,
    /// R2, when the host asked the controller to authenticate.
    ctrl_response: Option<Zeroizing<Vec<u8>>>,
    timeout: Duration,
    deadline: Instant,
}

impl QueueAuth {
    /// A transaction for `hostnqn` on queue `qid`; `keys` None: the host has none
    /// on this subsystem, so any exchange it starts fails.
    pub fn new(
        keys: Option<HostKeys>,
        hostnqn: &str,
        subnqn: &str,
        qid: u16,
        policy: AuthPolicy,
        timeout: Duration,
        now: Instant,
    ) -> QueueAuth {
        QueueAuth {
            state: State::Negotiate,
            keys,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            qid,
            policy,
            tid: 0,
            digest: Digest::Sha256,
            dhgroup: DhGroup::Null,
            negotiated: false,
            dh: None,
            challenge: Zeroizing::new(Vec::new()),
            seqnum: 0,
            ctrl_response: None,
            timeout,
            deadline: now + timeout,
        }
    }

    /// The transaction ended in success.
    pub fn succeeded(&self) -> bool {
        self.state == State::Done
    }

    /// Still running (neither succeeded nor failed).
    pub fn in_progress(&self) -> bool {
        !matches!(self.state, State::Done | State::Failed)
    }

    /// The transaction failed: the queue is closing, and nothing more happens
    /// on it.
    pub fn failed(&self) -> bool {
        self.state == State::Failed
    }

    /// A step after the failure (commands the host had already sent).
    fn after_failure() -> Step {
        Step {
            status: Status::COMMAND_SEQUENCE_ERROR,
            data: None,
            close_after: true,
        }
    }

    /// No step came within the timeout.
    pub fn expired(&self, now: Instant) -> bool {
        self.in_progress() && now >= self.deadline
    }

    /// The state as `nvmf_subsystem_get_qpairs` lists it.
    pub fn status(&self) -> AuthStatus {
        let state = match self.state {
            State::Negotiate => "negotiate",
            State::Challenge => "challenge",
            State::Reply => "reply",
            State::Success1 => "success1",
            State::Success2 => "success2",
            State::Failure1(_) => "failure1",
            State::Done => "completed",
            State::Failed => "error",
        };
        AuthStatus {
            state,
            digest: self.negotiated.then(|| self.digest.name()),
            dhgroup: self.negotiated.then(|| self.dhgroup.name()),
        }
    }

    fn fail(&mut self, reason: FailureReason, why: String) -> Step {
        tracing::warn!(
            host = %self.hostnqn,
            subnqn = %self.subnqn,
            qid = self.qid,
            reason = reason.describe(),
            "DH-HMAC-CHAP: {why}"
        );
        self.state = State::Failure1(reason);
        Step::status(Status::SUCCESS)
    }

    fn checked(cmd: &AuthCommand, len: usize) -> Result<(), Status> {
        if !cmd.is_dhchap() || cmd.len as usize != len {
            return Err(Status::INVALID_FIELD);
        }
        Ok(())
    }

    /// Authentication Send with `data`, the transferred message.
    pub fn send(&mut self, cmd: &AuthCommand, data: &[u8], now: Instant) -> Step {
        if self.failed() {
            return Self::after_failure();
        }
        if let Err(s) = Self::checked(cmd, data.len()) {
            tracing::warn!(host = %self.hostnqn, qid = self.qid, secp = cmd.secp, spsp0 = cmd.spsp0, spsp1 = cmd.spsp1, tl = cmd.len, data = data.len(), "Authentication Send: not a DH-HMAC-CHAP transfer");
            return Step::status(s);
        }
        let msg = match HostMessage::parse(data) {
            Ok(m) => m,
            Err(e) => {
                // A Negotiate names the transaction even when the rest is bad:
                // the Failure1 answers it.
                if self.state == State::Negotiate && data.len() >= 6 {
                    self.tid = u16::from_le_bytes([data[4], data[5]]);
                }
                return self.fail(e.reason(), format!("{e}"));
            }
        };
        self.deadline = now + self.timeout;
        match msg {
            HostMessage::Negotiate(n) => self.on_negotiate(&n),
            HostMessage::Reply(r) => {
                if self.state != State::Reply {
                    return self.fail(
                        FailureReason::IncorrectProtocolMessage,
                        format!("Reply in state {:?}", self.state),
                    );
                }
                match self.check_reply(&r) {
                    Ok(()) => {
                        self.state = State::Success1;
                        Step::status(Status::SUCCESS)
                    }
                    Err((reason, why)) => self.fail(reason, why),
                }
            }
            HostMessage::Success2 { t_id } => self.on_success2(t_id),
            HostMessage::Failure2 { t_id, reason } => self.on_failure2(t_id, reason),
        }
    }

    /// Negotiate: picks the hash and DH group, first of each both allow.
    fn on_negotiate(&mut self, n: &kvt_wire::nvme::Negotiate) -> Step {
        if self.state != State::Negotiate {
            return self.fail(
                FailureReason::IncorrectProtocolMessage,
                format!("Negotiate in state {:?}", self.state),
            );
        }
        self.tid = n.t_id;
        if n.sc_c != 0 {
            return self.fail(
                FailureReason::ScMismatch,
                format!(
                    "secure channel concatenation {} asked, none offered",
                    n.sc_c
                ),
            );
        }
        let Some(p) = n.protocols.iter().find(|p| p.auth_id == AUTHID_DHCHAP) else {
            return self.fail(
                FailureReason::ProtocolUnusable,
                "the host offers no DH-HMAC-CHAP".to_string(),
            );
        };
        let Some(d) = Digest::ALL
            .into_iter()
            .find(|d| self.policy.allows_digest(*d) && p.hashes.contains(&d.id()))
        else {
            return self.fail(
                FailureReason::HashUnusable,
                format!("no hash both allow (host offers {:?})", p.hashes),
            );
        };
        let Some(g) = DhGroup::ALL
            .into_iter()
            .find(|g| self.policy.allows_dhgroup(*g) && p.dhgroups.contains(&g.id()))
        else {
            return self.fail(
                FailureReason::DhGroupUnusable,
                format!("no DH group both allow (host offers {:?})", p.dhgroups),
            );
        };
        self.digest = d;
        self.dhgroup = g;
        self.negotiated = true;
        self.state = State::Challenge;
        Step::status(Status::SUCCESS)
    }

    /// Success2: the host accepted the controller's response.
    fn on_success2(&mut self, t_id: u16) -> Step {
        if self.state != State::Success2 {
            return self.fail(
                FailureReason::IncorrectProtocolMessage,
                format!("Success2 in state {:?}", self.state),
            );
        }
        if t_id != self.tid {
            return self.fail(
                FailureReason::IncorrectPayload,
                format!("Success2 for transaction {t_id}, not {}", self.tid),
            );
        }
        self.finish("host and controller");
        Step::status(Status::SUCCESS)
    }

    /// Failure2: the host refused the controller's response.
    fn on_failure2(&mut self, t_id: u16, reason: u8) -> Step {
        if self.state != State::Success2 || t_id != self.tid {
            return self.fail(
                FailureReason::IncorrectProtocolMessage,
                format!("Failure2 in state {:?}", self.state),
            );
        }
        tracing::warn!(host = %self.hostnqn, subnqn = %self.subnqn, qid = self.qid,
            reason = FailureReason::from_code(reason).map_or("unknown", |r| r.describe()),
            "DH-HMAC-CHAP: the host refused the controller's response (a wrong dhchap_ctrlr_key?)");
        self.state = State::Failed;
        Step {
            status: Status::SUCCESS,
            data: None,
            close_after: true,
        }
    }

    fn finish(&mut self, who: &str) {
        self.state = State::Done;
        self.dh = None;
        tracing::info!(
            host = %self.hostnqn,
            subnqn = %self.subnqn,
            qid = self.qid,
            digest = self.digest.name(),
            dhgroup = self.dhgroup.name(),
            "DH-HMAC-CHAP: {who} authenticated"
        );
    }

    /// The Reply's fields against the transaction, hash and DH group.
    fn check_reply_fields(&self, r: &Reply<'_>) -> Result<(), (FailureReason, String)> {
        let payload = |why: String| (FailureReason::IncorrectPayload, why);
        if r.t_id != self.tid {
            return Err(payload(format!(
                "Reply for transaction {}, not {}",
                r.t_id, self.tid
            )));
        }
        if r.hl as usize != self.digest.hash_len() {
            return Err(payload(format!(
                "Reply hash length {} with {}",
                r.hl,
                self.digest.name()
            )));
        }
        if r.cvalid > 1 || (r.cvalid == 1 && r.seqnum == 0) {
            return Err(payload(format!(
                "Reply CVALID {} with sequence number {}",
                r.cvalid, r.seqnum
            )));
        }
        if r.dh_value.len() != self.dhgroup.value_len() {
            return Err(payload(format!(
                "Reply DH value of {} bytes with {}",
                r.dh_value.len(),
                self.dhgroup.name()
            )));
        }
        Ok(())
    }

    /// Checks the host's Reply: its fields, then its response against the
    /// host's key; computes the controller's response if the host asks for one.
    fn check_reply(&mut self, r: &Reply<'_>) -> Result<(), (FailureReason, String)> {
        self.check_reply_fields(r)?;
        let failed = |why: String| (FailureReason::Failed, why);
        let keys = self
            .keys
            .clone()
            .ok_or_else(|| failed("the host has no dhchap_key on this subsystem".into()))?;
        let dh_secret = match &self.dh {
            Some(k) => Some(
                k.shared_secret(r.dh_value)
                    .map_err(|e| failed(format!("host DH value: {e}")))?,
            ),
            None => None,
        };
        let secret = keys
            .dhchap_key
            .dhchap()
            .map_err(|e| failed(format!("key `{}`: {e}", keys.dhchap_key.name)))?;
        let expected = auth::response(
            Role::Host,
            &ResponseInput {
                digest: self.digest,
                key: &secret.transformed(&self.hostnqn),
                challenge: &self.challenge,
                dh_secret: dh_secret.as_deref().map(|v| v.as_slice()),
                seqnum: self.seqnum,
                tid: self.tid,
                scc: 0,
                hostnqn: &self.hostnqn,
                subnqn: &self.subnqn,
            },
        );
        if !bool::from(expected.as_slice().ct_eq(r.response)) {
            return Err(failed(format!(
                "the host's response does not match key `{}` (a wrong dhchap_key?)",
                keys.dhchap_key.name
            )));
        }
        if r.cvalid == 1 {
            let ckey = keys.dhchap_ctrlr_key.as_ref().ok_or_else(|| {
                failed(
                    "the host asks the controller to authenticate, but it has no dhchap_ctrlr_key"
                        .into(),
                )
            })?;
            let csecret = ckey
                .dhchap()
                .map_err(|e| failed(format!("key `{}`: {e}", ckey.name)))?;
            self.ctrl_response = Some(auth::response(
                Role::Controller,
                &ResponseInput {
                    digest: self.digest,
                    key: &csecret.transformed(&self.subnqn),
                    challenge: r.challenge,
                    dh_secret: dh_secret.as_deref().map(|v| v.as_slice()),
                    seqnum: r.seqnum,
                    tid: self.tid,
                    scc: 0,
                    hostnqn: &self.hostnqn,
                    subnqn: &self.subnqn,
                },
            ));
        }
        Ok(())
    }

    /// Authentication Receive with allocation length `cmd.len`.
    pub fn receive(&mut self, cmd: &AuthCommand, now: Instant) -> Step {
        if self.failed() {
            return Self::after_failure();
        }
        if !cmd.is_dhchap() {
            tracing::warn!(host = %self.hostnqn, qid = self.qid, secp = cmd.secp, "Authentication Receive: not DH-HMAC-CHAP");
            return Step::status(Status::INVALID_FIELD);
        }
        self.deadline = now + self.timeout;
        let msg = match self.state {
            State::Challenge => match self.challenge_message() {
                Ok(m) => {
                    self.state = State::Reply;
                    m
                }
                Err((reason, why)) => {
                    self.fail(reason, why);
                    self.failure1(reason)
                }
            },
            State::Success1 => {
                let m = ControllerMessage::Success1 {
                    t_id: self.tid,
                    hl: self.digest.hash_len() as u8,
                    response: self.ctrl_response.as_ref().map(|r| r.to_vec()),
                };
                if self.ctrl_response.is_some() {
                    self.state = State::Success2;
                } else {
                    self.finish("host");
                }
                m
            }
            State::Failure1(reason) => self.failure1(reason),
            s => {
                self.fail(
                    FailureReason::IncorrectProtocolMessage,
                    format!("Authentication Receive in state {s:?}"),
                );
                self.failure1(FailureReason::IncorrectProtocolMessage)
            }
        };
        let data = msg.encode();
        if data.len() > cmd.len as usize {
            // Too small a buffer even for the verdict: nothing to say in band.
            tracing::warn!(host = %self.hostnqn, qid = self.qid, al = cmd.len, need = data.len(), "Authentication Receive: allocation length too small");
            self.state = State::Failed;
            return Step {
                status: Status::INVALID_FIELD,
                data: None,
                close_after: true,
            };
        }
        let close_after = self.state == State::Failed;
        Step {
            status: Status::SUCCESS,
            data: Some(data),
            close_after,
        }
    }

    fn failure1(&mut self, reason: FailureReason) -> ControllerMessage {
        self.state = State::Failed;
        ControllerMessage::Failure1 {
            t_id: self.tid,
            reason: reason as u8,
        }
    }

    fn challenge_message(&mut self) -> Result<ControllerMessage, (FailureReason, String)> {
        let failed = |e: auth::DhError| (FailureReason::Failed, e.to_string());
        let mut c = Zeroizing::new(vec![0u8; self.digest.hash_len()]);
        auth::random_bytes(&mut c).map_err(failed)?;
        let mut seq = [0u8; 4];
        auth::random_bytes(&mut seq).map_err(failed)?;
        // Zero means "no sequence number" in a Reply; never send it.
        self.seqnum = u32::from_le_bytes(seq).max(1);
        self.challenge = c;
        self.dh = match self.dhgroup {
            DhGroup::Null => None,
            g => Some(DhKeyPair::generate(g).map_err(failed)?),
        };
        Ok(ControllerMessage::Challenge {
            t_id: self.tid,
            hash_id: self.digest.id(),
            dhgroup_id: self.dhgroup.id(),
            seqnum: self.seqnum,
            challenge: self.challenge.to_vec(),
            dh_value: self
                .dh
                .as_ref()
                .map(|k| k.public().to_vec())
                .unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvt_auth::DhchapSecret;
    use kvt_wire::nvme::{auth_id, Negotiate, Protocol};

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host";
    const SUB: &str = "nqn.2026-12.io.kvtarget:auth";

    fn secret(b: u8, t: Option<Digest>) -> DhchapSecret {
        DhchapSecret::new(&[b; 32], t).unwrap()
    }
    fn key(name: &str, s: &DhchapSecret) -> Arc<Key> {
        Arc::new(Key::from_text(name, &s.encode()))
    }
    fn keys(bidi: bool) -> HostKeys {
        HostKeys {
            dhchap_key: key("k", &secret(1, Some(Digest::Sha256))),
            dhchap_ctrlr_key: bidi.then(|| key("c", &secret(2, Some(Digest::Sha512)))),
        }
    }
    fn auth(k: Option<HostKeys>, policy: AuthPolicy) -> QueueAuth {
        QueueAuth::new(k, HOST, SUB, 0, policy, DEFAULT_TIMEOUT, Instant::now())
    }
    fn send(a: &mut QueueAuth, m: &[u8]) -> Step {
        a.send(&AuthCommand::dhchap(m.len() as u32), m, Instant::now())
    }
    fn recv(a: &mut QueueAuth) -> (Step, ControllerMessage) {
        let s = a.receive(&AuthCommand::dhchap(4096), Instant::now());
        let m = ControllerMessage::parse(s.data.as_deref().unwrap_or(&[])).unwrap();
        (s, m)
    }
    fn negotiate(hashes: &[u8], groups: &[u8]) -> Vec<u8> {
        HostMessage::Negotiate(Negotiate {
            t_id: 7,
            sc_c: 0,
            protocols: vec![Protocol {
                auth_id: AUTHID_DHCHAP,
                hashes: hashes.to_vec(),
                dhgroups: groups.to_vec(),
            }],
        })
        .encode()
    }

    /// The host's side, computed as a host does (with the host's secrets).
    fn reply(
        challenge: &ControllerMessage,
        host_secret: &DhchapSecret,
        bidi: Option<&[u8]>,
    ) -> (Vec<u8>, Option<Zeroizing<Vec<u8>>>) {
        let ControllerMessage::Challenge {
            t_id,
            hash_id,
            dhgroup_id,
            seqnum,
            challenge,
            dh_value,
        } = challenge
        else {
            panic!("not a challenge: {challenge:?}")
        };
        let d = Digest::from_id(*hash_id).unwrap();
        let g = DhGroup::from_id(*dhgroup_id).unwrap();
        let (mine, shared) = match g {
            DhGroup::Null => (Vec::new(), None),
            g => {
                let k = DhKeyPair::generate(g).unwrap();
                let s = k.shared_secret(dh_value).unwrap();
                (k.public().to_vec(), Some(s))
            }
        };
        let input = |key: &[u8], ch: &[u8], seq: u32| {
            auth::response(
                Role::Host,
                &ResponseInput {
                    digest: d,
                    key,
                    challenge: ch,
                    dh_secret: shared.as_deref().map(|v| v.as_slice()),
                    seqnum: seq,
                    tid: *t_id,
                    scc: 0,
                    hostnqn: HOST,
                    subnqn: SUB,
                },
            )
        };
        let r1 = input(&host_secret.transformed(HOST), challenge, *seqnum);
        let c2 = vec![0x5A; d.hash_len()];
        let expect_r2 = bidi.map(|ckey| {
            auth::response(
                Role::Controller,
                &ResponseInput {
                    digest: d,
                    key: ckey,
                    challenge: &c2,
                    dh_secret: shared.as_deref().map(|v| v.as_slice()),
                    seqnum: 42,
                    tid: *t_id,
                    scc: 0,
                    hostnqn: HOST,
                    subnqn: SUB,
                },
            )
        });
        let zero = vec![0; d.hash_len()];
        let msg = HostMessage::Reply(Reply {
            t_id: *t_id,
            hl: d.hash_len() as u8,
            cvalid: bidi.is_some() as u8,
            seqnum: if bidi.is_some() { 42 } else { 0 },
            response: &r1,
            challenge: if bidi.is_some() { &c2 } else { &zero },
            dh_value: &mine,
        })
        .encode();
        (msg, expect_r2)
    }

    #[test]
    fn unidirectional_with_every_group() {
        for g in DhGroup::ALL {
            let policy = AuthPolicy {
                dhgroups: 1 << g.id(),
                ..AuthPolicy::default()
            };
            let mut a = auth(Some(keys(false)), policy);
            assert_eq!(
                send(&mut a, &negotiate(&[1, 2, 3], &[0, 1, 2, 3, 4, 5])).status,
                Status::SUCCESS
            );
            let (_, ch) = recv(&mut a);
            assert!(
                matches!(ch, ControllerMessage::Challenge { hash_id: 3, dhgroup_id, .. } if dhgroup_id == g.id())
            );
            let (r, _) = reply(&ch, &secret(1, Some(Digest::Sha256)), None);
            assert_eq!(send(&mut a, &r).status, Status::SUCCESS);
            let (s, m) = recv(&mut a);
            assert!(!s.close_after);
            assert!(
                matches!(
                    m,
                    ControllerMessage::Success1 {
                        response: None,
                        hl: 64,
                        ..
                    }
                ),
                "{m:?}"
            );
            assert!(a.succeeded(), "{}", g.name());
        }
    }

    #[test]
    fn bidirectional_proves_the_controller() {
        let mut a = auth(Some(keys(true)), AuthPolicy::default());
        send(&mut a, &negotiate(&[1], &[1]));
        let (_, ch) = recv(&mut a);
        let ckey = secret(2, Some(Digest::Sha512)).transformed(SUB);
        let (r, expect) = reply(&ch, &secret(1, Some(Digest::Sha256)), Some(&ckey));
        send(&mut a, &r);
        let (_, m) = recv(&mut a);
        let ControllerMessage::Success1 {
            response: Some(r2), ..
        } = m
        else {
            panic!("{m:?}")
        };
        assert_eq!(r2, expect.unwrap().to_vec());
        assert!(!a.succeeded());
        assert_eq!(a.status().state, "success2");
        assert_eq!(
            send(&mut a, &HostMessage::Success2 { t_id: 7 }.encode()).status,
            Status::SUCCESS
        );
        assert!(a.succeeded());
        assert_eq!(
            a.status(),
            AuthStatus {
                state: "completed",
                digest: Some("sha256"),
                dhgroup: Some("ffdhe2048")
            }
        );
        let fresh = auth(None, AuthPolicy::default()).status();
        assert_eq!((fresh.state, fresh.digest), ("negotiate", None));
    }

    fn failure_of(a: &mut QueueAuth) -> u8 {
        let (s, m) = recv(a);
        assert!(s.close_after);
        assert!(!a.in_progress());
        match m {
            ControllerMessage::Failure1 { reason, .. } => reason,
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn a_wrong_key_fails_with_failure1_and_closes() {
        let mut a = auth(Some(keys(false)), AuthPolicy::default());
        send(&mut a, &negotiate(&[1], &[0]));
        let (_, ch) = recv(&mut a);
        let (r, _) = reply(&ch, &secret(9, Some(Digest::Sha256)), None);
        assert_eq!(send(&mut a, &r).status, Status::SUCCESS);
        assert_eq!(failure_of(&mut a), FailureReason::Failed as u8);
        // Failed is final: the right Reply afterwards changes nothing.
        let (r, _) = reply(&ch, &secret(1, Some(Digest::Sha256)), None);
        let s = send(&mut a, &r);
        assert_eq!(
            (s.status, s.close_after),
            (Status::COMMAND_SEQUENCE_ERROR, true)
        );
        assert!(a.failed() && !a.succeeded());
    }

    #[test]
    fn no_key_and_missing_controller_key_fail() {
        let mut a = auth(None, AuthPolicy::default());
        send(&mut a, &negotiate(&[1], &[0]));
        let (_, ch) = recv(&mut a);
        let (r, _) = reply(&ch, &secret(1, Some(Digest::Sha256)), None);
        send(&mut a, &r);
        assert_eq!(failure_of(&mut a), FailureReason::Failed as u8);
        let mut a = auth(Some(keys(false)), AuthPolicy::default());
        send(&mut a, &negotiate(&[1], &[0]));
        let (_, ch) = recv(&mut a);
        let (r, _) = reply(&ch, &secret(1, Some(Digest::Sha256)), Some(&[3; 64]));
        send(&mut a, &r);
        assert_eq!(failure_of(&mut a), FailureReason::Failed as u8);
    }

    #[test]
    fn replayed_and_truncated_messages_are_refused() {
        // A truncated Reply: incorrect payload.
        let mut a = auth(Some(keys(false)), AuthPolicy::default());
        send(&mut a, &negotiate(&[1], &[1]));
        let (_, ch) = recv(&mut a);
        let (r, _) = reply(&ch, &secret(1, Some(Digest::Sha256)), None);
        // A transfer length that is not the data's is a bad command, not a message.
        let tl_off = AuthCommand::dhchap(r.len() as u32 + 1);
        assert_eq!(
            a.send(&tl_off, &r, Instant::now()).status,
            Status::INVALID_FIELD
        );
        assert_eq!(send(&mut a, &r[..r.len() - 1]).status, Status::SUCCESS);
        assert_eq!(failure_of(&mut a), FailureReason::IncorrectPayload as u8);

        // A Reply replayed after success: unexpected message.
        let mut a = auth(Some(keys(false)), AuthPolicy::default());
        send(&mut a, &negotiate(&[1], &[0]));
        let (_, ch) = recv(&mut a);
        let (r, _) = reply(&ch, &secret(1, Some(Digest::Sha256)), None);
        send(&mut a, &r);
        recv(&mut a);
        assert!(a.succeeded());
        send(&mut a, &r);
        assert_eq!(
            failure_of(&mut a),
            FailureReason::IncorrectProtocolMessage as u8
        );

        // A Reply from an earlier transaction (its challenge): the response fails.
        let mut b = auth(Some(keys(false)), AuthPolicy::default());
        send(&mut b, &negotiate(&[1], &[0]));
        recv(&mut b);
        send(&mut b, &r);
        assert_eq!(failure_of(&mut b), FailureReason::Failed as u8);
    }

    #[test]
    fn negotiation_failures_name_the_reason() {
        let policy = AuthPolicy {
            digests: 1 << Digest::Sha512.id(),
            dhgroups: 1 << DhGroup::Ffdhe2048.id(),
        };
        for (m, reason) in [
            (negotiate(&[1], &[1]), FailureReason::HashUnusable),
            (negotiate(&[3], &[0]), FailureReason::DhGroupUnusable),
            (
                HostMessage::Negotiate(Negotiate {
                    t_id: 1,
                    sc_c: 0,
                    protocols: vec![Protocol {
                        auth_id: 9,
                        hashes: vec![3],
                        dhgroups: vec![1],
                    }],
                })
                .encode(),
                FailureReason::ProtocolUnusable,
            ),
            (
                HostMessage::Negotiate(Negotiate {
                    t_id: 1,
                    sc_c: 1,
                    protocols: vec![],
                })
                .encode(),
                FailureReason::ScMismatch,
            ),
            (
                HostMessage::Success2 { t_id: 0 }.encode(),
                FailureReason::IncorrectProtocolMessage,
            ),
            (
                vec![0x01, auth_id::CHALLENGE, 0, 0, 0, 0, 0, 0],
                FailureReason::IncorrectProtocolMessage,
            ),
        ] {
            let mut a = auth(Some(keys(false)), policy);
            assert_eq!(send(&mut a, &m).status, Status::SUCCESS);
            assert_eq!(failure_of(&mut a), reason as u8, "{reason:?}");
        }
        // Receive before Negotiate.
        let mut a = auth(Some(keys(false)), policy);
        assert_eq!(
            failure_of(&mut a),
            FailureReason::IncorrectProtocolMessage as u8
        );
    }

    #[test]
    fn wrong_security_protocol_and_timeouts() {
        let mut a = auth(Some(keys(false)), AuthPolicy::default());
        let m = negotiate(&[1], &[0]);
        let mut cmd = AuthCommand::dhchap(m.len() as u32);
        cmd.secp = 0xEA;
        assert_eq!(
            a.send(&cmd, &m, Instant::now()).status,
            Status::INVALID_FIELD
        );
        assert_eq!(
            a.receive(&cmd, Instant::now()).status,
            Status::INVALID_FIELD
        );
        let t0 = Instant::now();
        let a = QueueAuth::new(
            None,
            HOST,
            SUB,
            1,
            AuthPolicy::default(),
            Duration::from_secs(1),
            t0,
        );
        assert!(!a.expired(t0));
        assert!(a.expired(t0 + Duration::from_secs(1)));
        // A small allocation length cannot hold the challenge.
        let mut a = auth(Some(keys(false)), AuthPolicy::default());
        send(&mut a, &negotiate(&[1], &[5]));
        let s = a.receive(&AuthCommand::dhchap(64), Instant::now());
        assert_eq!(s.status, Status::INVALID_FIELD);
        assert!(s.close_after);
    }
}
