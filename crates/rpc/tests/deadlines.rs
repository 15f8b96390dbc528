//! Deadlines: the client gives up on time, the server skips work whose caller has already
//! given up, and a late reply does not disturb later calls.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use stria_rpc::{Client, RpcError, ServerConfig, status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_times_out_and_the_connection_keeps_working() {
    let server = start().await;
    let client = Client::connect(server.addr).await.unwrap();
    let started = Instant::now();
    let err = client
        .call(DELAY, delay_msg(800, 1), Bytes::new(), Duration::from_millis(100))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, RpcError::Timeout { method: DELAY, .. }), "{err}");
    assert!(err.is_retryable());
    assert!(
        waited >= Duration::from_millis(100) && waited < Duration::from_millis(700),
        "{waited:?}"
    );
    // Same connection; the late reply of the first call arrives meanwhile and is dropped.
    let reply =
        client.call(DELAY, delay_msg(900, 2), Bytes::new(), Duration::from_secs(10)).await.unwrap();
    let tag: u64 = stria_rpc::decode_message(&reply.message).unwrap();
    assert_eq!(tag, 2);
    assert!(client.is_connected());
    assert_eq!(server.stats.peers.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_skips_requests_whose_deadline_passed_while_queued() {
    // One request at a time per connection: the second waits behind a 300 ms one.
    let config = ServerConfig { in_flight_per_connection_max: 1, ..Default::default() };
    let server = start_with(config).await;
    let mut stream = raw_connect(server.addr).await;
    let mut bytes = request_bytes(COUNTED, 1, 5_000, b"", b"");
    bytes.extend(request_bytes(COUNTED, 2, 50, b"", b""));
    send_raw(&mut stream, &bytes).await;
    // Half-close: the server answers both, then closes.
    let (_, mut write) = stream.split();
    tokio::io::AsyncWriteExt::shutdown(&mut write).await.unwrap();
    let frames = read_until_closed(&mut stream, Duration::from_secs(10)).await;
    let statuses: Vec<(u64, u16)> =
        frames.iter().map(|f| (f.header.request_id, f.header.status)).collect();
    assert_eq!(statuses, vec![(1, status::OK), (2, status::DEADLINE_EXCEEDED)]);
    assert_eq!(server.stats.counted_runs.load(Ordering::SeqCst), 1, "expired request ran");
}
