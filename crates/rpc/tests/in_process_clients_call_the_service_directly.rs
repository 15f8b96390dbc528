//! A server with `in_process` lets clients of its own process that hold its secret call the
//! service directly (no connection, no frames), with the same answers and the same panic and
//! size checks; any other client connects over TCP and meets the handshake, which refuses a
//! stranger. Once the server is gone, its address is no longer served in process.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use stria_rpc::server::served_in_process;
use stria_rpc::{Client, ClientConfig, ClusterSecret, RpcError, ServerConfig};
use tokio::io::AsyncWriteExt;

const T: Duration = Duration::from_secs(10);

fn secret(fill: u8) -> ClusterSecret {
    ClusterSecret::from_bytes(&[fill; 32])
}

#[tokio::test]
async fn in_process_clients_call_the_service_directly_with_the_same_checks() {
    let config =
        ServerConfig { secret: Some(secret(1)), in_process: true, ..ServerConfig::default() };
    let server = start_with(config).await;
    // The service is registered once the server task starts serving.
    for _ in 0..1000 {
        if served_in_process(server.addr) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(served_in_process(server.addr));

    // A member: served, with bulk data both ways, many calls in flight.
    let member = ClientConfig { secret: Some(secret(1)), ..ClientConfig::default() };
    let client = Client::connect_with(server.addr, member).await.unwrap();
    let data = Bytes::from(vec![0x5au8; 3 << 20]);
    let mut calls = Vec::new();
    for i in 0..32u8 {
        let (client, data) = (client.clone(), data.clone());
        calls.push(tokio::spawn(async move {
            client.call(ECHO, Bytes::from(vec![i]), data, T).await.unwrap()
        }));
    }
    for (i, call) in calls.into_iter().enumerate() {
        let reply = call.await.unwrap();
        assert_eq!((reply.status, &reply.message[..]), (0, &[i as u8][..]));
        assert_eq!(reply.data, data);
    }

    // Data answered in several buffers reaches the caller as those buffers, uncopied.
    let message = stria_rpc::encode_message(&4096u32).unwrap();
    let reply = client.call(SPLIT_ECHO, message, data.clone(), T).await.unwrap();
    assert_eq!(reply.data, data);
    assert_eq!(reply.data.parts().len(), data.len() / 4096);
    let second = reply.data.parts()[1].as_ptr();
    assert_eq!(second, data[4096..].as_ptr(), "a part was copied");

    // A handler that panics answers INTERNAL; the caller lives on.
    let reply = client.call(PANIC, Bytes::new(), Bytes::new(), T).await.unwrap();
    assert_eq!(reply.status, stria_rpc::status::INTERNAL);

    // A stranger is refused in memory as over TCP, whether it connects first or just calls.
    let stranger = ClientConfig { secret: Some(secret(2)), ..ClientConfig::default() };
    match Client::connect_with(server.addr, stranger.clone()).await {
        Err(RpcError::Unauthenticated { .. }) => {}
        other => panic!("a stranger was not refused: {other:?}"),
    }
    let lazy = Client::new(server.addr, stranger);
    match lazy.call(ECHO, Bytes::new(), Bytes::new(), T).await {
        Err(RpcError::Unauthenticated { .. }) => {}
        other => panic!("a stranger's call was served: {other:?}"),
    }
    let anonymous = Client::new(server.addr, ClientConfig::default());
    assert!(
        anonymous.call(ECHO, Bytes::new(), Bytes::new(), T).await.is_err(),
        "a client without the secret was served"
    );

    // Another process's view: plain TCP still works on the same address.
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(&[0u8; 8]).await.unwrap();

    server.shutdown.shutdown();
    server.task.await.unwrap().unwrap();
    assert!(!served_in_process(server.addr), "a stopped server still registered");
}

#[tokio::test]
async fn servers_without_the_option_are_reached_over_tcp_only() {
    let server = start().await;
    assert!(!served_in_process(server.addr));
    let client = Client::connect(server.addr).await.unwrap();
    let reply = client.call(ECHO, Bytes::from_static(b"m"), Bytes::new(), T).await.unwrap();
    assert_eq!(reply.status, 0);

    // Over a connection, data answered in several buffers arrives whole, as one.
    let data: Bytes = (0..100_000u32).map(|i| i as u8).collect::<Vec<u8>>().into();
    let message = stria_rpc::encode_message(&4096u32).unwrap();
    let reply = client.call(SPLIT_ECHO, message, data.clone(), T).await.unwrap();
    assert_eq!(reply.status, 0);
    assert_eq!(reply.data, data);
    assert_eq!(reply.data.parts().len(), 1);
}
