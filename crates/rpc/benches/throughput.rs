//! Loopback throughput of the RPC layer: small calls per second and 1 MiB calls per second,
//! with several calls in flight on one connection. A measurement, not a test: run with
//! `cargo bench -p stria-rpc --bench throughput` (optionally `-- SECONDS`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use stria_rpc::{Client, ClientConfig, Response, Router, Server, ServerConfig};

const SMALL: u16 = 1;
const PUT: u16 = 2;
const GET: u16 = 3;
const MIB: usize = 1024 * 1024;

async fn run(
    name: &str,
    client: &Client,
    concurrency: usize,
    seconds: f64,
    method: u16,
    data: Bytes,
    bytes_per_call: usize,
) {
    let calls = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let client = client.clone();
        let calls = calls.clone();
        let data = data.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let reply = client
                    .call(method, Bytes::from_static(b"m"), data.clone(), Duration::from_secs(30))
                    .await
                    .expect("call failed");
                assert_eq!(reply.status, 0);
                calls.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("bench task");
    }
    let secs = started.elapsed().as_secs_f64();
    let n = calls.load(Ordering::Relaxed) as f64;
    let mib_s = n * bytes_per_call as f64 / MIB as f64 / secs;
    println!(
        "{name:<34} in flight {concurrency:>3}: {:>10.0} calls/s {:>9.1} MiB/s  ({n} calls in {secs:.2} s)",
        n / secs,
        mib_s
    );
}

fn main() {
    let seconds: f64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2.0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let one_mib = Bytes::from(vec![0xa5u8; MIB]);
        let reply_mib = one_mib.clone();
        let router = Router::new()
            .route(SMALL, |req| async move { Response::ok(req.message, Bytes::new()) })
            .route(PUT, |_req| async move { Response::ok(Bytes::new(), Bytes::new()) })
            .route(GET, move |_req| {
                let data = reply_mib.clone();
                async move { Response::ok(Bytes::new(), data) }
            });
        let router = Arc::new(router);
        let server = Server::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let addr = server.local_addr();
        tokio::spawn(server.serve(router.clone()));
        let client = Client::connect(addr).await.expect("connect");
        let no_crc = Client::new(addr, ClientConfig { payload_crc: false, ..Default::default() });
        // The same service, called directly by clients of this process.
        let config = ServerConfig { in_process: true, ..ServerConfig::default() };
        let local =
            Server::bind_with("127.0.0.1:0".parse().expect("addr"), config).await.expect("bind");
        let local_addr = local.local_addr();
        tokio::spawn(local.serve(router));
        let in_memory = Client::connect(local_addr).await.expect("connect in process");

        println!("stria-rpc loopback throughput, {seconds} s per row, 2 runtime threads");
        run("small call (1-byte message)", &client, 1, seconds, SMALL, Bytes::new(), 0).await;
        run("small call (1-byte message)", &client, 64, seconds, SMALL, Bytes::new(), 0).await;
        run("1 MiB write (request data)", &client, 8, seconds, PUT, one_mib.clone(), MIB).await;
        run("1 MiB write, no payload crc", &no_crc, 8, seconds, PUT, one_mib.clone(), MIB).await;
        run("1 MiB read (reply data)", &client, 8, seconds, GET, Bytes::new(), MIB).await;
        println!(
            "the same server with ServerConfig::in_process: called directly from this process \
             (1 MiB rows hand over a shared buffer, no copy)"
        );
        run("small call, in process", &in_memory, 1, seconds, SMALL, Bytes::new(), 0).await;
        run("small call, in process", &in_memory, 64, seconds, SMALL, Bytes::new(), 0).await;
        run("1 MiB write, in process", &in_memory, 8, seconds, PUT, one_mib.clone(), MIB).await;
        run("1 MiB read, in process", &in_memory, 8, seconds, GET, Bytes::new(), MIB).await;
    });
}
