//! A server with a cluster secret serves only peers that prove they hold it: a client without
//! it, with another secret, or one that sends requests straight away is refused before any
//! request runs, with a goodbye that says why; a client with the secret is served as usual.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use stria_rpc::frame::Frame;
use stria_rpc::{Client, ClientConfig, ClusterSecret, RpcError, ServerConfig, status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(10);

fn secret(fill: u8) -> ClusterSecret {
    ClusterSecret::from_bytes(&[fill; 32])
}

async fn guarded() -> TestServer {
    start_with(ServerConfig { secret: Some(secret(1)), ..ServerConfig::default() }).await
}

fn client_config(secret: Option<ClusterSecret>) -> ClientConfig {
    ClientConfig { secret, ..ClientConfig::default() }
}

#[tokio::test]
async fn a_client_with_the_secret_is_served() {
    let server = guarded().await;
    let client = Client::connect_with(server.addr, client_config(Some(secret(1)))).await.unwrap();
    let reply = client.call(ECHO, Bytes::from_static(b"m"), Bytes::from_static(b"d"), T).await;
    let reply = reply.unwrap();
    assert_eq!(
        (reply.status, &reply.message[..], &reply.data.to_vec()[..]),
        (0, &b"m"[..], &b"d"[..])
    );
    // A second connection (a reconnect) authenticates again.
    let other = Client::connect_with(server.addr, client_config(Some(secret(1)))).await.unwrap();
    assert_eq!(other.call(ECHO, Bytes::new(), Bytes::new(), T).await.unwrap().status, 0);
}

#[tokio::test]
async fn a_client_with_another_secret_is_refused_and_says_why() {
    let server = guarded().await;
    let error =
        Client::connect_with(server.addr, client_config(Some(secret(2)))).await.unwrap_err();
    assert!(matches!(error, RpcError::Unauthenticated { .. }), "{error:?}");
    assert!(!error.is_retryable(), "a wrong secret does not get better by retrying");
    assert!(error.to_string().contains("does not hold this cluster's secret"), "{error}");
}

#[tokio::test]
async fn a_client_without_the_secret_learns_that_the_server_requires_one() {
    let server = guarded().await;
    let client = Client::new(server.addr, client_config(None));
    let error = client.call(COUNTED, Bytes::new(), Bytes::new(), T).await.unwrap_err();
    let text = error.to_string();
    assert!(text.contains("unauthenticated") && text.contains("cluster secret"), "{text}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(server.stats.counted_runs.load(Ordering::SeqCst), 0, "the request must not run");
}

#[tokio::test]
async fn a_client_with_a_secret_refuses_a_server_without_one() {
    let open = start().await;
    let error = Client::connect_with(open.addr, client_config(Some(secret(1)))).await.unwrap_err();
    assert!(matches!(error, RpcError::Unauthenticated { .. }), "{error:?}");
    assert!(error.to_string().contains("without a cluster secret"), "{error}");
}

/// A raw peer that answers the challenge with a made-up proof, then sends a request anyway.
#[tokio::test]
async fn a_forged_proof_gets_a_goodbye_and_nothing_runs() {
    let server = guarded().await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let mut hello = b"SAUH\x01\0\0\0".to_vec();
    hello.extend_from_slice(&[9u8; 32]);
    stream.write_all(&hello).await.unwrap();
    let mut challenge = [0u8; 4 + 1 + 32 + 32];
    stream.read_exact(&mut challenge).await.unwrap();
    assert_eq!(&challenge[..5], b"SAUC\x01");
    let mut proof = b"SAUP".to_vec();
    proof.extend_from_slice(&[0u8; 32]);
    stream.write_all(&proof).await.unwrap();
    let request = Frame::request(COUNTED, 1, 0, Bytes::new(), Bytes::new(), false);
    let _ = stream.write_all(&request.to_vec()).await;
    let frames = read_until_closed(&mut stream, T).await;
    assert_eq!(frames.len(), 1, "one goodbye: {frames:?}");
    assert_eq!(frames[0].header.status, status::UNAUTHENTICATED);
    let text = String::from_utf8_lossy(&frames[0].message).into_owned();
    assert!(text.contains("wrong cluster secret"), "{text}");
    assert_eq!(server.stats.counted_runs.load(Ordering::SeqCst), 0);
}

/// A peer that connects and says nothing is dropped once the handshake time is up, and the
/// server keeps serving others meanwhile.
#[tokio::test]
async fn a_silent_peer_is_dropped_after_the_handshake_timeout() {
    let server = start_with(ServerConfig {
        secret: Some(secret(1)),
        handshake_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    })
    .await;
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let client = Client::connect_with(server.addr, client_config(Some(secret(1)))).await.unwrap();
    assert_eq!(client.call(ECHO, Bytes::new(), Bytes::new(), T).await.unwrap().status, 0);
    let frames = read_until_closed(&mut silent, T).await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0].header.status, status::UNAUTHENTICATED);
    assert!(String::from_utf8_lossy(&frames[0].message).contains("no authentication handshake"));
}
