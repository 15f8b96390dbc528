//! Broken connections fail the calls on them with a clear error and the next call connects
//! again; a graceful shutdown lets running requests finish; the connection limit holds.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use stria_rpc::frame::{Frame, Limits};
use stria_rpc::{Client, ClientConfig, RetryPolicy, RpcError, ServerConfig, status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const T: Duration = Duration::from_secs(10);

/// Reads one request frame from a raw socket (test fake server side).
async fn read_request(stream: &mut tokio::net::TcpStream) -> Frame {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Ok(Some((frame, _))) = stria_rpc::frame::decode_frame(&bytes, &Limits::default()) {
            return frame;
        }
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "client closed before sending a whole request");
        bytes.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_dropping_the_connection_fails_in_flight_calls_then_reconnect_works() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = tokio::spawn(async move {
        // First connection: take a request and hang up without answering.
        let (mut first, _) = listener.accept().await.unwrap();
        let _ = read_request(&mut first).await;
        drop(first);
        // Second connection: answer properly.
        let (mut second, _) = listener.accept().await.unwrap();
        let request = read_request(&mut second).await;
        let reply = Frame::response(
            request.header.method,
            status::OK,
            request.header.request_id,
            Bytes::from_static(b"second"),
            request.data,
            true,
        );
        second.write_all(&reply.to_vec()).await.unwrap();
        let mut rest = Vec::new();
        let _ = second.read_to_end(&mut rest).await;
    });

    let client = Client::new(addr, ClientConfig::default());
    let err = client.call(ECHO, Bytes::new(), Bytes::new(), T).await.unwrap_err();
    assert!(matches!(err, RpcError::ConnectionLost { .. }), "{err}");
    assert!(err.to_string().contains("closed"), "{err}");
    assert!(!client.is_connected());

    let reply = client.call(ECHO, Bytes::new(), Bytes::from_static(b"d"), T).await.unwrap();
    assert_eq!(reply.message, Bytes::from_static(b"second"));
    assert_eq!(reply.data, Bytes::from_static(b"d"));
    drop(client);
    tokio::time::timeout(T, fake).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_running_requests_and_restart_reconnects() {
    let server = start().await;
    let addr = server.addr;
    let client = Client::connect(addr).await.unwrap();
    let slow = {
        let client = client.clone();
        tokio::spawn(async move { client.call(DELAY, delay_msg(400, 9), Bytes::new(), T).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.shutdown.shutdown();
    // The running request still gets its reply.
    let reply = slow.await.unwrap().unwrap();
    assert_eq!(stria_rpc::decode_message::<u64>(&reply.message).unwrap(), 9);
    tokio::time::timeout(T, server.task).await.unwrap().unwrap().unwrap();

    // Server gone: a clear connect error (after the goodbye closed the old connection).
    let err = client.call(ECHO, Bytes::new(), Bytes::new(), T).await.unwrap_err();
    assert!(matches!(err, RpcError::Connect { .. } | RpcError::ConnectionLost { .. }), "{err}");
    let err = client.call(ECHO, Bytes::new(), Bytes::new(), T).await.unwrap_err();
    assert!(matches!(err, RpcError::Connect { .. }), "{err}");
    assert!(err.is_retryable());

    // Same address again: the same client reconnects by itself, and retries bridge the gap.
    let restarted = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        start_on(addr, ServerConfig::default()).await
    });
    let policy = RetryPolicy {
        attempts_max: 20,
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
    };
    let reply = client
        .call_idempotent(ECHO, Bytes::from_static(b"again"), Bytes::new(), T, &policy)
        .await
        .unwrap();
    assert_eq!(reply.message, Bytes::from_static(b"again"));
    let restarted = restarted.await.unwrap();
    assert_eq!(restarted.stats.peers.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_refused_as_overloaded() {
    let config = ServerConfig { connections_max: 2, ..Default::default() };
    let server = start_with(config).await;
    let a = Client::connect(server.addr).await.unwrap();
    let b = Client::connect(server.addr).await.unwrap();
    for c in [&a, &b] {
        assert_eq!(c.call(ECHO, Bytes::new(), Bytes::new(), T).await.unwrap().status, 0);
    }
    let mut third = raw_connect(server.addr).await;
    let frames = read_until_closed(&mut third, T).await;
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].header.request_id, 0);
    assert_eq!(frames[0].header.status, status::OVERLOADED);

    // A client over the limit sees a retryable error naming the cause.
    let c = Client::new(server.addr, ClientConfig::default());
    let err = c.call(ECHO, Bytes::new(), Bytes::new(), T).await.unwrap_err();
    assert!(err.to_string().contains("overloaded"), "{err}");
    assert!(err.is_retryable());

    // Freeing a slot lets a new connection in.
    drop(a);
    let reply = stria_rpc::retry(&RetryPolicy::default(), || {
        c.call(ECHO, Bytes::from_static(b"in"), Bytes::new(), T)
    })
    .await
    .unwrap();
    assert_eq!(reply.message, Bytes::from_static(b"in"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_nothing_is_a_connect_error() {
    let addr: SocketAddr = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let err = Client::connect(addr).await.unwrap_err();
    assert!(matches!(err, RpcError::Connect { .. }), "{err}");
}
