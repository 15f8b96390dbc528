//! A client that sends requests but never reads replies stalls only its own connection, and
//! is cut off once it has accepted nothing for the write-stall timeout.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use stria_rpc::{Client, ServerConfig};
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_does_not_block_others() {
    let config = ServerConfig {
        write_stall_timeout: Duration::from_millis(1500),
        in_flight_per_connection_max: 16,
        ..Default::default()
    };
    let server = start_with(config).await;
    let addr = server.addr;

    // The slow reader asks for 64 x 4 MiB of replies and reads none of them.
    let mut slow = raw_connect(addr).await;
    let ask = stria_rpc::encode_message(&(4u32 * 1024 * 1024)).unwrap();
    let writer = tokio::spawn(async move {
        for id in 1..=64u64 {
            if slow.write_all(&request_bytes(BIG_REPLY, id, 0, &ask, b"")).await.is_err() {
                break;
            }
        }
        slow
    });

    // Meanwhile another client's calls keep completing quickly.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let other = Client::connect(addr).await.unwrap();
    let started = Instant::now();
    for i in 0..50u64 {
        let reply = other
            .call(
                ECHO,
                Bytes::from(i.to_le_bytes().to_vec()),
                Bytes::from(vec![1u8; 65536]),
                Duration::from_secs(2),
            )
            .await
            .unwrap();
        assert_eq!(reply.message.as_ref(), &i.to_le_bytes());
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "others were slowed: {:?}",
        started.elapsed()
    );

    // The server gives up on the stalled connection: its socket reaches end of stream.
    let mut slow = writer.await.unwrap();
    let mut sink = vec![0u8; 1 << 20];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        // Only start reading once the stall timeout had time to fire.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        loop {
            match tokio::io::AsyncReadExt::read(&mut slow, &mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "stalled connection was never closed");
    let reply = other
        .call(ECHO, Bytes::from_static(b"after"), Bytes::new(), Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(reply.message, Bytes::from_static(b"after"));
}
