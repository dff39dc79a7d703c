//! etcd v3 through its JSON gRPC gateway (etcd's "gRPC gateway" docs): each
//! RPC is `POST /v3/<service>/<method>` with the protobuf message as JSON in
//! protobuf's JSON mapping as etcd 3.4 emits it: field names as in the .proto
//! (`create_revision`, `ID`, `TTL`), bytes as base64, 64-bit integers as
//! strings, zero values left out. Streaming RPCs (`lease/keepalive`) take one
//! request and answer `{"result": ...}`.

use super::http::{self, HttpError};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// 64-bit integers as JSON strings (protobuf's mapping); a bare number is
/// accepted too.
mod num_str {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, T: FromStr, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            S(String),
            N(serde_json::Number),
        }
        let text = match Either::deserialize(d)? {
            Either::S(s) => s,
            Either::N(n) => n.to_string(),
        };
        text.parse()
            .map_err(|_| serde::de::Error::custom(format!("`{text}` is not an integer")))
    }
}

/// Bytes as base64 (protobuf's mapping of `bytes`).
mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// `etcdserverpb.ResponseHeader`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseHeader {
    #[serde(default, with = "num_str")]
    pub cluster_id: u64,
    #[serde(default, with = "num_str")]
    pub member_id: u64,
    #[serde(default, with = "num_str")]
    pub revision: i64,
    #[serde(default, with = "num_str")]
    pub raft_term: u64,
}

/// `LeaseGrantRequest` (`POST /v3/lease/grant`); `ID` 0: etcd picks one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseGrantRequest {
    #[serde(rename = "TTL", with = "num_str")]
    pub ttl: i64,
    #[serde(
        rename = "ID",
        default,
        with = "num_str",
        skip_serializing_if = "is_zero"
    )]
    pub id: i64,
}

/// `LeaseGrantResponse`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseGrantResponse {
    #[serde(default)]
    pub header: ResponseHeader,
    #[serde(rename = "ID", with = "num_str")]
    pub id: i64,
    #[serde(rename = "TTL", with = "num_str")]
    pub ttl: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// `LeaseKeepAliveRequest` and `LeaseRevokeRequest`: a lease by its ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseId {
    #[serde(rename = "ID", with = "num_str")]
    pub id: i64,
}

/// `LeaseKeepAliveResponse`; `TTL` absent (0): the lease is gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseKeepAliveResponse {
    #[serde(default)]
    pub header: ResponseHeader,
    #[serde(rename = "ID", with = "num_str")]
    pub id: i64,
    #[serde(
        rename = "TTL",
        default,
        with = "num_str",
        skip_serializing_if = "is_zero"
    )]
    pub ttl: i64,
}

/// A streaming RPC's message as the gateway sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamResult<T> {
    pub result: T,
}

/// `PutRequest` (`POST /v3/kv/put`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PutRequest {
    #[serde(with = "b64")]
    pub key: Vec<u8>,
    #[serde(with = "b64")]
    pub value: Vec<u8>,
    #[serde(default, with = "num_str", skip_serializing_if = "is_zero")]
    pub lease: i64,
}

/// `RangeRequest` (`POST /v3/kv/range`); `range_end` empty: the one key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RangeRequest {
    #[serde(with = "b64")]
    pub key: Vec<u8>,
    #[serde(default, with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub range_end: Vec<u8>,
}

/// `DeleteRangeRequest` (`POST /v3/kv/deleterange`).
pub type DeleteRangeRequest = RangeRequest;

/// `mvccpb.KeyValue`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyValue {
    #[serde(with = "b64")]
    pub key: Vec<u8>,
    #[serde(default, with = "num_str")]
    pub create_revision: i64,
    #[serde(default, with = "num_str")]
    pub mod_revision: i64,
    #[serde(default, with = "num_str")]
    pub version: i64,
    #[serde(default, with = "b64")]
    pub value: Vec<u8>,
    #[serde(default, with = "num_str", skip_serializing_if = "is_zero")]
    pub lease: i64,
}

/// `RangeResponse`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RangeResponse {
    #[serde(default)]
    pub header: ResponseHeader,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kvs: Vec<KeyValue>,
    #[serde(default, with = "num_str", skip_serializing_if = "is_zero")]
    pub count: i64,
}

/// A response with only a header (`PutResponse`, `LeaseRevokeResponse`, ...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeaderOnly {
    #[serde(default)]
    pub header: ResponseHeader,
}

/// `Compare` of a key's create revision (the one compare kvtarget makes:
/// `create_revision == 0` is "the key does not exist").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compare {
    /// `CompareResult` by name; "EQUAL" is 0 and may be absent.
    #[serde(default = "equal")]
    pub result: String,
    /// `CompareTarget` by name: "CREATE".
    pub target: String,
    #[serde(with = "b64")]
    pub key: Vec<u8>,
    #[serde(with = "num_str")]
    pub create_revision: i64,
}

fn equal() -> String {
    "EQUAL".into()
}

/// `RequestOp`: one operation of a transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestOp {
    RequestPut(PutRequest),
    RequestRange(RangeRequest),
    RequestDeleteRange(DeleteRangeRequest),
}

/// `ResponseOp`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseOp {
    ResponsePut(HeaderOnly),
    ResponseRange(RangeResponse),
    /// `DeleteRangeResponse` (its `deleted` count is not read).
    ResponseDeleteRange(HeaderOnly),
}

/// `TxnRequest` (`POST /v3/kv/txn`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

/// `TxnResponse`; `succeeded` absent: false.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TxnResponse {
    #[serde(default)]
    pub header: ResponseHeader,
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default)]
    pub responses: Vec<ResponseOp>,
}

/// The gateway's error body (a gRPC status).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GatewayError {
    #[serde(default)]
    pub error: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub code: i32,
}

/// gRPC's NOT_FOUND (a lease that expired or was revoked).
pub const GRPC_NOT_FOUND: i32 = 5;

/// Why an etcd call failed; one line naming the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No answer: connection refused, timed out, name unknown.
    #[error("etcd at {endpoint} unreachable: {source}")]
    Unreachable { endpoint: String, source: HttpError },
    /// etcd answered with an error status.
    #[error("etcd at {endpoint}: {path}: {message} (HTTP {status}, gRPC code {code})")]
    Status {
        endpoint: String,
        path: &'static str,
        status: u16,
        code: i32,
        message: String,
    },
    /// etcd answered with JSON of another shape.
    #[error("etcd at {endpoint}: {path}: unexpected answer: {source}")]
    Json {
        endpoint: String,
        path: &'static str,
        source: serde_json::Error,
    },
}

impl EtcdError {
    pub fn is_unreachable(&self) -> bool {
        matches!(self, EtcdError::Unreachable { .. })
    }
}

/// A client of one cluster's endpoints; a call goes to the endpoint that last
/// answered and, when it does not, to each of the others once.
#[derive(Debug)]
pub struct Client {
    endpoints: Vec<String>,
    current: usize,
    timeout: Duration,
}

impl Client {
    /// `endpoints` are `host:port`; each socket operation waits `timeout`.
    pub fn new(endpoints: Vec<String>, timeout: Duration) -> Client {
        assert!(!endpoints.is_empty(), "an etcd client needs an endpoint");
        Client {
            endpoints,
            current: 0,
            timeout,
        }
    }

    /// The endpoint calls go to first.
    pub fn endpoint(&self) -> &str {
        &self.endpoints[self.current]
    }

    fn call<Q: Serialize, A: serde::de::DeserializeOwned>(
        &mut self,
        path: &'static str,
        req: &Q,
    ) -> Result<A, EtcdError> {
        let body = serde_json::to_vec(req).map_err(|source| EtcdError::Json {
            endpoint: self.endpoint().into(),
            path,
            source,
        })?;
        let mut last = None;
        for i in 0..self.endpoints.len() {
            let at = (self.current + i) % self.endpoints.len();
            let endpoint = &self.endpoints[at];
            match http::post(endpoint, path, &body, self.timeout) {
                Ok(a) => {
                    self.current = at;
                    return decode(endpoint, path, a);
                }
                Err(source) => {
                    last = Some(EtcdError::Unreachable {
                        endpoint: endpoint.clone(),
                        source,
                    })
                }
            }
        }
        Err(last.expect("at least one endpoint was tried"))
    }

    pub fn lease_grant(&mut self, ttl_secs: i64) -> Result<LeaseGrantResponse, EtcdError> {
        self.call(
            "/v3/lease/grant",
            &LeaseGrantRequest {
                ttl: ttl_secs,
                id: 0,
            },
        )
    }

    /// One keep-alive; `ttl` 0 in the answer: the lease is gone.
    pub fn lease_keepalive(&mut self, id: i64) -> Result<LeaseKeepAliveResponse, EtcdError> {
        let r: StreamResult<LeaseKeepAliveResponse> =
            self.call("/v3/lease/keepalive", &LeaseId { id })?;
        Ok(r.result)
    }

    pub fn lease_revoke(&mut self, id: i64) -> Result<HeaderOnly, EtcdError> {
        self.call("/v3/lease/revoke", &LeaseId { id })
    }

    pub fn put(&mut self, req: &PutRequest) -> Result<HeaderOnly, EtcdError> {
        self.call("/v3/kv/put", req)
    }

    pub fn range(&mut self, req: &RangeRequest) -> Result<RangeResponse, EtcdError> {
        self.call("/v3/kv/range", req)
    }

    pub fn delete_range(&mut self, req: &DeleteRangeRequest) -> Result<HeaderOnly, EtcdError> {
        self.call("/v3/kv/deleterange", req)
    }

    pub fn txn(&mut self, req: &TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.call("/v3/kv/txn", req)
    }
}

/// Decodes a gateway answer as `A` (an error status as `EtcdError::Status`).
pub fn decode<A: serde::de::DeserializeOwned>(
    endpoint: &str,
    path: &'static str,
    a: http::Answer,
) -> Result<A, EtcdError> {
    let json_error = |source| EtcdError::Json {
        endpoint: endpoint.into(),
        path,
        source,
    };
    if !(200..300).contains(&a.status) {
        let e: GatewayError = serde_json::from_slice(&a.body).unwrap_or(GatewayError {
            error: String::new(),
            message: String::from_utf8_lossy(&a.body).trim().to_string(),
            code: 0,
        });
        return Err(EtcdError::Status {
            endpoint: endpoint.into(),
            path,
            status: a.status,
            code: e.code,
            message: e.message,
        });
    }
    // A stream's answer may hold several messages, one per line: the first.
    let first = a
        .body
        .split(|&b| b == b'\n')
        .find(|l| !l.iter().all(u8::is_ascii_whitespace));
    serde_json::from_slice(first.unwrap_or(&[])).map_err(json_error)
}

/// The smallest key after every key with `prefix` (etcd's `range_end` for a
/// prefix): the prefix with its last byte below 0xff incremented.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Base64 as etcd's JSON carries bytes (for messages and tests).
pub fn base64(v: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(v)
}

#[cfg(test)]
mod tests;
