//! A client and a server agree on every byte, match 1,000 pipelined replies to their calls
//! whatever order they complete in, and report remote statuses faithfully.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use stria_proto::fs::FsStatus;
use stria_rpc::{Client, ClientConfig, RpcError, status};

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_and_8_mib_of_data_round_trip() {
    let server = start().await;
    let client = Client::connect(server.addr).await.unwrap();
    let data: Vec<u8> =
        (0..8 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let data = Bytes::from(data);
    let message = Bytes::from_static(b"header-ish message");
    let reply = client.call(ECHO, message.clone(), data.clone(), T).await.unwrap();
    assert_eq!(reply.status, status::OK);
    assert_eq!(reply.message, message);
    assert_eq!(reply.data.len(), data.len());
    assert!(reply.data == data, "8 MiB payload changed on the way");

    // Empty parts are fine too, and without payload checksums.
    let plain = Client::new(server.addr, ClientConfig { payload_crc: false, ..Default::default() });
    let reply = plain.call(ECHO, Bytes::new(), Bytes::new(), T).await.unwrap();
    assert_eq!((reply.status, reply.message.len(), reply.data.len()), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_pipelined_calls_on_one_connection_complete_out_of_order() {
    let server = start().await;
    let client = Client::connect(server.addr).await.unwrap();
    let finished = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for i in 0..1000u64 {
        let client = client.clone();
        let finished = finished.clone();
        calls.push(tokio::spawn(async move {
            // Early calls sleep longest, so replies overtake each other.
            let ms = (1000 - i) % 40;
            let reply = client.call(DELAY, delay_msg(ms, i), Bytes::new(), T).await.unwrap();
            assert_eq!(reply.status, status::OK);
            let tag: u64 = stria_rpc::decode_message(&reply.message).unwrap();
            assert_eq!(tag, i, "reply matched to the wrong call");
            (i, finished.fetch_add(1, Ordering::SeqCst))
        }));
    }
    let mut order = Vec::new();
    for call in calls {
        order.push(call.await.unwrap());
    }
    assert_eq!(order.len(), 1000);
    let in_issue_order = order.iter().filter(|(i, rank)| *i as usize == *rank).count();
    assert!(in_issue_order < 900, "replies came back in issue order: not out of order");
    assert_eq!(server.stats.peers.lock().unwrap().len(), 1, "more than one connection was used");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_calls_and_statuses() {
    let server = start().await;
    let client = Client::connect(server.addr).await.unwrap();

    let (sum, data): (common::AddReply, stria_rpc::Data) = client
        .call_typed(ADD, &AddRequest { a: 40, b: 2 }, Bytes::from_static(b"xyz"), T)
        .await
        .unwrap();
    assert_eq!(sum, AddReply { sum: 42 });
    assert_eq!(data, Bytes::from_static(b"xyz"));

    // A message the handler cannot decode is a bad request, not a dead connection.
    let reply = client.call(ADD, Bytes::from_static(&[0xff]), Bytes::new(), T).await.unwrap();
    assert_eq!(reply.status, status::BAD_REQUEST);
    assert!(std::str::from_utf8(&reply.message).unwrap().contains("decode"));

    let reply = client.call(4242, Bytes::new(), Bytes::new(), T).await.unwrap();
    assert_eq!(reply.status, status::UNKNOWN_METHOD);
    let err = client.call_typed::<_, AddReply>(4242, &(), Bytes::new(), T).await.unwrap_err();
    assert_eq!(err.status(), Some(status::UNKNOWN_METHOD));
    assert!(err.to_string().contains("unknown method"), "{err}");

    let err = client.call_typed::<_, ()>(NOT_FOUND, &(), Bytes::new(), T).await.unwrap_err();
    assert_eq!(err.status(), Some(3001));
    assert_eq!(err.fs_status(), Some(FsStatus::NotFound));

    // A panicking handler fails its own request only.
    let reply = client.call(PANIC, Bytes::new(), Bytes::new(), T).await.unwrap();
    assert_eq!(reply.status, status::INTERNAL);
    let reply =
        client.call(ECHO, Bytes::from_static(b"still here"), Bytes::new(), T).await.unwrap();
    assert_eq!(reply.message, Bytes::from_static(b"still here"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_refused_before_sending() {
    let server = start().await;
    let client = Client::connect(server.addr).await.unwrap();
    let too_big = Bytes::from(vec![0u8; stria_rpc::DATA_BYTES_MAX as usize + 1]);
    let err = client.call(ECHO, Bytes::new(), too_big, T).await.unwrap_err();
    assert!(matches!(err, RpcError::TooLarge(_)), "{err}");
    let reply = client.call(ECHO, Bytes::from_static(b"ok"), Bytes::new(), T).await.unwrap();
    assert_eq!(reply.status, status::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_hands_out_clients_per_address() {
    let a = start().await;
    let b = start().await;
    let pool = stria_rpc::Pool::new(ClientConfig::default(), 2);
    for _ in 0..4 {
        for server in [&a, &b] {
            let client = pool.get(server.addr);
            assert_eq!(client.addr(), server.addr);
            let reply = client.call(ECHO, Bytes::from_static(b"p"), Bytes::new(), T).await.unwrap();
            assert_eq!(reply.status, status::OK);
        }
    }
    assert_eq!(a.stats.peers.lock().unwrap().len(), 2, "two connections per address");
    assert_eq!(b.stats.peers.lock().unwrap().len(), 2);
    let mut addrs = pool.addresses();
    addrs.sort();
    let mut want = vec![a.addr, b.addr];
    want.sort();
    assert_eq!(addrs, want);
}
