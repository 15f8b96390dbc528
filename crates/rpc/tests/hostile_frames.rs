//! Hostile or broken frames close only the connection they came on, get a goodbye frame
//! saying why where the framing allows, and never make the server allocate what a header
//! merely claims.

#![allow(clippy::unwrap_used)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use stria_rpc::frame::{FLAG_PAYLOAD_CRC, Frame, HEADER_BYTES, Header, Kind};
use stria_rpc::{Client, ServerConfig, status};

/// Records the largest single allocation this test binary makes.
struct Tracking;

static LARGEST_ALLOCATION: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

const T: Duration = Duration::from_secs(10);

fn header(message_len: u32, data_len: u32) -> Header {
    Header {
        kind: Kind::Request,
        flags: 0,
        method: ECHO,
        status: 0,
        request_id: 1,
        budget_ms: 0,
        message_len,
        data_len,
        payload_crc: 0,
    }
}

/// Sends `bytes` on a fresh connection (then optionally closes the write side) and checks the
/// server closes it, with a BAD_FRAME goodbye when `expect_goodbye`.
async fn assert_closes(
    addr: std::net::SocketAddr,
    what: &str,
    bytes: &[u8],
    half_close: bool,
    expect_goodbye: bool,
) {
    let mut stream = raw_connect(addr).await;
    send_raw(&mut stream, bytes).await;
    if half_close {
        let (_, mut write) = stream.split();
        tokio::io::AsyncWriteExt::shutdown(&mut write).await.unwrap();
    }
    let frames = read_until_closed(&mut stream, T).await;
    if expect_goodbye {
        assert_eq!(frames.len(), 1, "{what}: expected one goodbye frame, got {frames:?}");
        assert_eq!(frames[0].header.request_id, 0, "{what}");
        assert_eq!(frames[0].header.status, status::BAD_FRAME, "{what}");
        let reason = String::from_utf8_lossy(&frames[0].message).to_string();
        eprintln!("{what}: closed with {reason:?}");
    } else {
        assert!(frames.is_empty(), "{what}: unexpected frames {frames:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hostile_frame_closes_only_its_connection() {
    let config =
        ServerConfig { frame_read_timeout: Duration::from_millis(300), ..Default::default() };
    let server = start_with(config).await;
    let good = Client::connect(server.addr).await.unwrap();
    // Keep a bystander busy the whole time: its calls must all succeed.
    let bystander = {
        let good = good.clone();
        tokio::spawn(async move {
            let mut done = 0;
            for i in 0..200u64 {
                let reply = good.call(DELAY, delay_msg(2, i), Bytes::new(), T).await.unwrap();
                assert_eq!(stria_rpc::decode_message::<u64>(&reply.message).unwrap(), i);
                done += 1;
            }
            done
        })
    };

    let garbage: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2246822519) >> 13) as u8).collect();
    assert_closes(server.addr, "garbage bytes", &garbage, false, true).await;

    let mut bad_magic = request_bytes(ECHO, 1, 0, b"m", b"d");
    bad_magic[0..4].copy_from_slice(b"HTTP");
    assert_closes(server.addr, "bad magic", &bad_magic, false, true).await;

    let huge_data = header(0, u32::MAX).encode();
    assert_closes(server.addr, "huge data length", &huge_data, false, true).await;
    let huge_message = header(u32::MAX - 1, 0).encode();
    assert_closes(server.addr, "huge message length", &huge_message, false, true).await;
    let just_over = header(0, stria_rpc::DATA_BYTES_MAX + 1).encode();
    assert_closes(server.addr, "data one byte over", &just_over, false, true).await;

    let mut bad_header_crc = request_bytes(ECHO, 1, 0, b"m", b"d");
    bad_header_crc[14] ^= 0x10;
    assert_closes(server.addr, "bad header crc", &bad_header_crc, false, true).await;

    let mut bad_payload_crc = request_bytes(ECHO, 1, 0, b"message", b"data");
    let last = bad_payload_crc.len() - 1;
    bad_payload_crc[last] ^= 1;
    assert_closes(server.addr, "bad payload crc", &bad_payload_crc, false, true).await;

    // A frame that promises 1000 bytes and delivers 10, then the client hangs up.
    let mut truncated = header(0, 1000).encode().to_vec();
    truncated.extend_from_slice(&[1u8; 10]);
    assert_closes(server.addr, "truncated then close", &truncated, true, true).await;

    // The same, but the client stays silent: the frame read timeout closes it.
    assert_closes(server.addr, "truncated then silence", &truncated, false, true).await;

    // Half a header, then close.
    assert_closes(server.addr, "half a header", &truncated[..HEADER_BYTES / 2], true, true).await;

    // Well-formed frames the server must still refuse.
    let response = Frame::response(ECHO, 0, 5, Bytes::new(), Bytes::new(), true).to_vec();
    assert_closes(server.addr, "response sent to a server", &response, false, true).await;
    let id_zero = request_bytes(ECHO, 0, 0, b"", b"");
    assert_closes(server.addr, "request id 0", &id_zero, false, true).await;
    let mut unknown_flag = header(0, 0);
    unknown_flag.flags = 0x0100;
    assert_closes(server.addr, "unknown flag", &unknown_flag.encode(), false, true).await;
    let mut stray = header(0, 0);
    stray.payload_crc = 1;
    assert_closes(server.addr, "crc without its flag", &stray.encode(), false, true).await;
    let mut with_flag = header(0, 0);
    with_flag.flags = FLAG_PAYLOAD_CRC;
    with_flag.payload_crc = 0xdead_beef;
    assert_closes(server.addr, "wrong crc of empty payload", &with_flag.encode(), false, true)
        .await;

    // A good request after a good one on a raw connection still works (sanity of the helper).
    let mut ok = raw_connect(server.addr).await;
    send_raw(&mut ok, &request_bytes(ECHO, 7, 0, b"hi", b"")).await;
    let (_, mut write) = ok.split();
    tokio::io::AsyncWriteExt::shutdown(&mut write).await.unwrap();
    let frames = read_until_closed(&mut ok, T).await;
    assert_eq!(frames.len(), 1);
    assert_eq!((frames[0].header.request_id, frames[0].header.status), (7, status::OK));
    assert_eq!(frames[0].message, Bytes::from_static(b"hi"));

    assert_eq!(bystander.await.unwrap(), 200);
    assert_eq!(server.stats.peers.lock().unwrap().len(), 2, "bystander + sanity connection");
    assert!(good.is_connected(), "the bystander's connection was disturbed");

    let largest = LARGEST_ALLOCATION.load(Ordering::Relaxed);
    assert!(
        largest < 4 * 1024 * 1024,
        "server allocated {largest} bytes at once: it trusted a declared length"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_rejects_a_hostile_server_reply() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        // Wait for the request so the call is in flight when the bad reply comes.
        let mut got = [0u8; HEADER_BYTES];
        tokio::io::AsyncReadExt::read_exact(&mut s, &mut got).await.unwrap();
        let mut h = header(0, u32::MAX);
        h.kind = Kind::Response;
        tokio::io::AsyncWriteExt::write_all(&mut s, &h.encode()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let client = Client::connect(addr).await.unwrap();
    let err = client.call(ECHO, Bytes::new(), Bytes::new(), T).await.unwrap_err();
    assert!(err.to_string().contains("exceeds the limit"), "{err}");
}
