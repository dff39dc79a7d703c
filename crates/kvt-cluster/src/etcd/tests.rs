//! The JSON shapes against literal JSON: the examples of etcd's gRPC gateway
//! docs and what etcd 3.4.23's gateway answered (captured by hand).

use super::*;

fn round_trip<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(
    json: &str,
) -> T {
    let v: T = serde_json::from_str(json).unwrap();
    let again: T = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
    assert_eq!(v, again, "{json}");
    v
}

#[test]
fn put_and_range_as_in_the_gateway_docs() {
    // docs: curl -L http://localhost:2379/v3/kv/put -X POST -d '{"key": "Zm9v", "value": "YmFy"}'
    let put: PutRequest = round_trip(r#"{"key": "Zm9v", "value": "YmFy"}"#);
    assert_eq!(
        (put.key.as_slice(), put.value.as_slice(), put.lease),
        (&b"foo"[..], &b"bar"[..], 0)
    );
    assert_eq!(
        serde_json::to_string(&put).unwrap(),
        r#"{"key":"Zm9v","value":"YmFy"}"#
    );
    let h: HeaderOnly = round_trip(
        r#"{"header":{"cluster_id":"12585971608760269493","member_id":"13847567121247652255","revision":"2","raft_term":"3"}}"#,
    );
    assert_eq!(h.header.cluster_id, 12585971608760269493);
    assert_eq!(h.header.revision, 2);
    let r: RangeResponse = round_trip(
        r#"{"header":{"cluster_id":"12585971608760269493","member_id":"13847567121247652255","revision":"2","raft_term":"3"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"}"#,
    );
    assert_eq!(r.count, 1);
    assert_eq!(r.kvs[0].value, b"bar");
    assert_eq!(r.kvs[0].create_revision, 2);
    let empty: RangeResponse = round_trip(r#"{"header":{"revision":"7"}}"#);
    assert!(empty.kvs.is_empty());
}

#[test]
fn leases_as_etcd_3_4_answers() {
    let g: LeaseGrantRequest = round_trip(r#"{"TTL":"5"}"#);
    assert_eq!(serde_json::to_string(&g).unwrap(), r#"{"TTL":"5"}"#);
    let g: LeaseGrantResponse = round_trip(
        r#"{"header":{"cluster_id":"324952591200643719","member_id":"3319814642761637952","revision":"1","raft_term":"2"},"ID":"2324035825750032901","TTL":"5"}"#,
    );
    assert_eq!((g.id, g.ttl), (2324035825750032901, 5));
    let k: StreamResult<LeaseKeepAliveResponse> = round_trip(
        r#"{"result":{"header":{"cluster_id":"324952591200643719","member_id":"3319814642761637952","revision":"1","raft_term":"2"},"ID":"2324035825750032903","TTL":"5"}}"#,
    );
    assert_eq!(k.result.ttl, 5);
    // An expired lease: no TTL.
    let k: StreamResult<LeaseKeepAliveResponse> =
        round_trip(r#"{"result":{"header":{"revision":"1"},"ID":"12345"}}"#);
    assert_eq!((k.result.id, k.result.ttl), (12345, 0));
    let e: GatewayError = round_trip(
        r#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#,
    );
    assert_eq!(e.code, GRPC_NOT_FOUND);
    assert_eq!(
        serde_json::to_string(&LeaseId { id: -1 }).unwrap(),
        r#"{"ID":"-1"}"#
    );
}

#[test]
fn put_if_absent_transaction() {
    let t = TxnRequest {
        compare: vec![Compare {
            result: "EQUAL".into(),
            target: "CREATE".into(),
            key: b"a".to_vec(),
            create_revision: 0,
        }],
        success: vec![RequestOp::RequestPut(PutRequest {
            key: b"a".to_vec(),
            value: b"b".to_vec(),
            lease: 7,
        })],
        failure: vec![RequestOp::RequestRange(RangeRequest {
            key: b"a".to_vec(),
            range_end: Vec::new(),
        })],
    };
    assert_eq!(
        serde_json::to_string(&t).unwrap(),
        r#"{"compare":[{"result":"EQUAL","target":"CREATE","key":"YQ==","create_revision":"0"}],"success":[{"request_put":{"key":"YQ==","value":"Yg==","lease":"7"}}],"failure":[{"request_range":{"key":"YQ=="}}]}"#
    );
    let ok: TxnResponse = round_trip(
        r#"{"header":{"cluster_id":"324952591200643719","member_id":"3319814642761637952","revision":"2","raft_term":"2"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"2"}}}]}"#,
    );
    assert!(ok.succeeded);
    let no: TxnResponse = round_trip(
        r#"{"header":{"revision":"2"},"responses":[{"response_range":{"header":{"revision":"2"},"kvs":[{"key":"YQ==","create_revision":"2","mod_revision":"2","version":"1","value":"Yg==","lease":"2324035825750032903"}],"count":"1"}}]}"#,
    );
    assert!(!no.succeeded);
    match &no.responses[0] {
        ResponseOp::ResponseRange(r) => assert_eq!(r.kvs[0].lease, 2324035825750032903),
        other => panic!("{other:?}"),
    }
}

#[test]
fn prefix_ends() {
    assert_eq!(prefix_end(b"/a/"), b"/a0");
    assert_eq!(prefix_end(&[b'a', 0xff]), b"b");
    assert_eq!(prefix_end(&[0xff]), vec![0]);
}

#[test]
fn a_resignation_deletes_the_owner_key_only_at_its_epoch() {
    let t = TxnRequest {
        compare: vec![Compare {
            result: "EQUAL".into(),
            target: "CREATE".into(),
            key: b"a".to_vec(),
            create_revision: 5,
        }],
        success: vec![RequestOp::RequestDeleteRange(DeleteRangeRequest {
            key: b"a".to_vec(),
            range_end: Vec::new(),
        })],
        failure: Vec::new(),
    };
    assert_eq!(
        serde_json::to_string(&t).unwrap(),
        r#"{"compare":[{"result":"EQUAL","target":"CREATE","key":"YQ==","create_revision":"5"}],"success":[{"request_delete_range":{"key":"YQ=="}}],"failure":[]}"#
    );
    // The gateway's answer carries `deleted`, which is not kept.
    let ok: TxnResponse = serde_json::from_str(
        r#"{"header":{"revision":"6"},"succeeded":true,"responses":[{"response_delete_range":{"header":{"revision":"6"},"deleted":"1"}}]}"#,
    )
    .unwrap();
    assert!(ok.succeeded);
    assert!(matches!(
        ok.responses[0],
        ResponseOp::ResponseDeleteRange(_)
    ));
}
