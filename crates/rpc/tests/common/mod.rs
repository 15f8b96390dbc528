//! A test service and raw-socket helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use stria_proto::fs::FsStatus;
use stria_rpc::frame::{Frame, Limits, decode_frame};
use stria_rpc::{Response, Router, Server, ServerConfig, ShutdownHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

pub const ECHO: u16 = 1000;
/// Message: postcard `Delay`; sleeps, then echoes `tag`.
pub const DELAY: u16 = 1001;
pub const PANIC: u16 = 1002;
pub const ADD: u16 = 1003;
pub const NOT_FOUND: u16 = 1004;
/// Counts how often it ran (deadline tests prove a skipped request never ran).
pub const COUNTED: u16 = 1005;
/// Answers with `len` bytes of data (message: postcard u32).
pub const BIG_REPLY: u16 = 1006;
/// Echoes the data as parts of the size given in the message (postcard u32).
pub const SPLIT_ECHO: u16 = 1007;

#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
pub struct Delay {
    pub ms: u64,
    pub tag: u64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub struct AddRequest {
    pub a: u64,
    pub b: u64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub struct AddReply {
    pub sum: u64,
}

#[derive(Default, Debug)]
pub struct Stats {
    pub peers: Mutex<HashSet<SocketAddr>>,
    pub counted_runs: AtomicUsize,
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    pub shutdown: ShutdownHandle,
    pub task: JoinHandle<std::io::Result<()>>,
}

pub fn router(stats: Arc<Stats>) -> Router {
    let s1 = stats.clone();
    let s2 = stats.clone();
    Router::new()
        .route(ECHO, move |req| {
            s1.peers.lock().unwrap().insert(req.peer);
            async move { Response::ok(req.message, req.data) }
        })
        .route(DELAY, move |req| {
            s2.peers.lock().unwrap().insert(req.peer);
            async move {
                let delay: Delay = match req.decode() {
                    Ok(d) => d,
                    Err(bad) => return bad,
                };
                tokio::time::sleep(Duration::from_millis(delay.ms)).await;
                Response::encode(&delay.tag, Bytes::new())
            }
        })
        .route(PANIC, |_req| async move { panic!("handler bug (expected by the test)") })
        .route(ADD, |req| async move {
            match req.decode::<AddRequest>() {
                Ok(add) => Response::encode(&AddReply { sum: add.a + add.b }, req.data),
                Err(bad) => bad,
            }
        })
        .route(NOT_FOUND, |_req| async move { Response::fs_error(FsStatus::NotFound) })
        .route(COUNTED, move |_req| {
            stats.counted_runs.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Response::ok(Bytes::new(), Bytes::new())
            }
        })
        .route(BIG_REPLY, |req| async move {
            let len: u32 = match req.decode() {
                Ok(len) => len,
                Err(bad) => return bad,
            };
            Response::ok(Bytes::new(), Bytes::from(vec![0x5a; len as usize]))
        })
        .route(SPLIT_ECHO, |req| async move {
            let part: u32 = match req.decode::<u32>() {
                Ok(part) => part.max(1),
                Err(bad) => return bad,
            };
            let data = req.data.clone();
            let parts = (0..data.len()).step_by(part as usize);
            let data: stria_rpc::Data =
                parts.map(|at| data.slice(at..(at + part as usize).min(data.len()))).collect();
            Response::ok(Bytes::new(), data)
        })
}

pub async fn start_with(config: ServerConfig) -> TestServer {
    start_on("127.0.0.1:0".parse().unwrap(), config).await
}

pub async fn start() -> TestServer {
    start_with(ServerConfig::default()).await
}

pub async fn start_on(addr: SocketAddr, config: ServerConfig) -> TestServer {
    let server = Server::bind_with(addr, config).await.expect("bind");
    let addr = server.local_addr();
    let shutdown = server.shutdown_handle();
    let stats = Arc::new(Stats::default());
    let task = tokio::spawn(server.serve(Arc::new(router(stats.clone()))));
    TestServer { addr, stats, shutdown, task }
}

pub fn delay_msg(ms: u64, tag: u64) -> Bytes {
    stria_rpc::encode_message(&Delay { ms, tag }).unwrap()
}

/// Reads until the server closes the socket (or `limit` passes: then panics) and returns
/// the frames it sent.
pub async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Vec<Frame> {
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "server did not close the connection within {limit:?}");
    let mut frames = Vec::new();
    let mut at = 0;
    while let Ok(Some((frame, used))) = decode_frame(&bytes[at..], &Limits::default()) {
        frames.push(frame);
        at += used;
    }
    frames
}

pub async fn raw_connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.expect("connect")
}

pub async fn send_raw(stream: &mut TcpStream, bytes: &[u8]) {
    stream.write_all(bytes).await.expect("write");
}

pub fn request_bytes(method: u16, id: u64, budget_ms: u32, message: &[u8], data: &[u8]) -> Vec<u8> {
    Frame::request(
        method,
        id,
        budget_ms,
        Bytes::copy_from_slice(message),
        Bytes::copy_from_slice(data),
        true,
    )
    .to_vec()
}
