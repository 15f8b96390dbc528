//! Clients that break the protocol get an error or a closed connection, never a changed
//! backend, and the server keeps serving well-behaved clients afterwards.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use stria_nbd::wire::*;
use stria_nbd::{Backend, Exports, ServerConfig};

const SIZE: u64 = 4 * MIB;

fn seeded() -> (TestServer, std::sync::Arc<stria_nbd::MemBackend>) {
    let (server, backend) = serve_one("disk", SIZE);
    backend.write(0, &[0x5a; 65536], false).expect("seed");
    (server, backend)
}

/// The export still serves a well-behaved client: a write and a read back.
fn still_serves(server: &TestServer) {
    let mut client = RawClient::open(server.addr, "disk", true);
    assert_eq!(client.write(1000, SIZE - 4096, &[0xc3; 4096]), 0);
    assert_eq!(client.read(1001, SIZE - 4096, 4096).expect("read"), vec![0xc3; 4096]);
    client.disconnect();
    tool_ok("nbdinfo", &[&server.uri("disk")]);
}

#[test]
fn bad_handshake_magic_and_flags_close_the_connection() {
    let (server, _) = seeded();
    // Unknown client flag bits.
    let mut client = RawClient::greet(server.addr);
    client.send(&(FLAG_C_FIXED_NEWSTYLE | 1 << 7).to_be_bytes());
    assert!(client.closed_by_server());
    // A non-fixed-newstyle client (as old clients or oldstyle expectations would send).
    let mut client = RawClient::greet(server.addr);
    client.send(&0u32.to_be_bytes());
    assert!(client.closed_by_server());
    // A bad option magic.
    let mut client = RawClient::connect(server.addr);
    client.send(&[0xde; 16]);
    assert!(client.closed_by_server());
    server.wait_for("three failed handshakes", |s| s.handshakes_failed >= 3);
    still_serves(&server);
}

#[test]
fn unknown_options_get_unsup_and_the_connection_stays_usable() {
    let (server, _) = seeded();
    let mut client = RawClient::connect(server.addr);
    let reply = client.option(4242, b"whatever");
    assert_eq!(reply.reply_type, REP_ERR_UNSUP);
    assert!(String::from_utf8_lossy(&reply.payload).contains("not supported"));
    // Extended headers (11) are not offered either.
    assert_eq!(client.option(11, &[]).reply_type, REP_ERR_UNSUP);
    assert_eq!(client.option(OPT_STARTTLS, &[]).reply_type, REP_ERR_POLICY, "no TLS configured");
    assert_eq!(client.option(OPT_LIST, b"x").reply_type, REP_ERR_INVALID);
    assert_eq!(client.option(OPT_INFO, &[0, 0, 0, 9, b'd']).reply_type, REP_ERR_INVALID);
    assert_eq!(
        client.option(OPT_SET_META_CONTEXT, &[]).reply_type,
        REP_ERR_INVALID,
        "needs structured replies"
    );
    let listed: Vec<u32> = client.option_all(OPT_LIST, &[]).iter().map(|r| r.reply_type).collect();
    assert_eq!(listed, vec![REP_SERVER, REP_ACK]);
    let go = client
        .option_all(OPT_GO, &go_payload("disk", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]));
    assert_eq!(go.last().map(|r| r.reply_type), Some(REP_ACK));
    let infos: Vec<u16> = go
        .iter()
        .filter(|r| r.reply_type == REP_INFO)
        .map(|r| u16::from_be_bytes([r.payload[0], r.payload[1]]))
        .collect();
    assert!(
        infos.contains(&INFO_EXPORT)
            && infos.contains(&INFO_NAME)
            && infos.contains(&INFO_BLOCK_SIZE)
    );
    assert_eq!(client.read(1, 0, 512).expect("read"), vec![0x5a; 512]);
}

#[test]
fn oversized_options_are_refused_or_disconnected() {
    let (server, _) = seeded();
    let mut client = RawClient::connect(server.addr);
    // Over the soft limit: skipped, refused, and the connection goes on.
    let reply = client.option(OPT_LIST, &vec![0u8; 100 * 1024]);
    assert_eq!(reply.reply_type, REP_ERR_TOO_BIG);
    assert_eq!(client.option_all(OPT_LIST, &[]).last().map(|r| r.reply_type), Some(REP_ACK));
    // Over the hard limit: one error, then the server hangs up without reading the payload.
    let mut header = IHAVEOPT.to_be_bytes().to_vec();
    header.extend_from_slice(&OPT_GO.to_be_bytes());
    header.extend_from_slice(&(64u32 << 20).to_be_bytes());
    client.send(&header);
    assert_eq!(client.read_option_reply().reply_type, REP_ERR_TOO_BIG);
    assert!(client.closed_by_server());
    still_serves(&server);
}

#[test]
fn bad_requests_get_errors_and_change_nothing() {
    let (server, backend) = seeded();
    let mutations = backend.mutation_count();
    for structured in [false, true] {
        let mut client = RawClient::open(server.addr, "disk", structured);
        // Longer than the 32 MiB maximum block size.
        assert_eq!(client.read(1, 0, 33 * MIB as u32), Err(NbdErrno::Invalid.code()));
        // Misaligned writes, with their payloads skipped correctly (the next request parses).
        assert_eq!(client.write(2, 100, &[0xee; 512]), NbdErrno::Invalid.code());
        assert_eq!(client.write(3, 0, &[0xee; 1000]), NbdErrno::Invalid.code());
        // Past the end: EINVAL for reads and trims, ENOSPC for writes.
        assert_eq!(client.read(4, SIZE - 512, 1024), Err(NbdErrno::Invalid.code()));
        assert_eq!(client.read(5, u64::MAX - 511, 512), Err(NbdErrno::Invalid.code()));
        assert_eq!(client.write(6, SIZE, &[0xee; 512]), NbdErrno::NoSpace.code());
        client.request(CMD_TRIM, 0, 7, SIZE - 512, 4096, &[]);
        assert_eq!(client.reply_error(7), NbdErrno::Invalid.code());
        client.request(CMD_WRITE_ZEROES, 0, 8, SIZE, 512, &[]);
        assert_eq!(client.reply_error(8), NbdErrno::NoSpace.code());
        // Unknown command, unknown flag, and CACHE (not offered).
        client.request(77, 0, 9, 0, 512, &[]);
        assert_eq!(client.reply_error(9), NbdErrno::Invalid.code());
        client.request(CMD_READ, 1 << 12, 10, 0, 512, &[]);
        match client.reply() {
            ServerReply::Simple { error, .. } => assert_eq!(error, NbdErrno::Invalid.code()),
            ServerReply::Chunk { kind, .. } => assert_eq!(kind, REPLY_TYPE_ERROR),
        }
        client.request(5, 0, 11, 0, 512, &[]);
        assert_eq!(client.reply_error(11), NbdErrno::Invalid.code());
        if !structured {
            // BLOCK_STATUS without a negotiated context.
            client.request(CMD_BLOCK_STATUS, 0, 12, 0, 512, &[]);
            assert_eq!(client.reply_error(12), NbdErrno::Invalid.code());
        }
        // Still in sync: a good read returns the seeded bytes.
        assert_eq!(client.read(13, 0, 4096).expect("read"), vec![0x5a; 4096]);
        client.disconnect();
    }
    assert_eq!(backend.mutation_count(), mutations, "a refused request reached the backend");
    assert_eq!(read_backend(&backend, 0, 65536), vec![0x5a; 65536]);
    assert!(read_backend(&backend, 65536, 65536).iter().all(|&b| b == 0));
    assert!(server.stats.snapshot().errors >= 20);
    still_serves(&server);
}

#[test]
fn structured_errors_carry_a_message() {
    let (server, _) = seeded();
    let mut client = RawClient::open(server.addr, "disk", true);
    client.request(CMD_READ, 0, 1, SIZE, 512, &[]);
    let ServerReply::Chunk { flags, kind, handle, payload } = client.reply() else {
        panic!("structured replies were negotiated");
    };
    assert_eq!((flags, kind, handle), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 1));
    assert_eq!(u32::from_be_bytes(payload[0..4].try_into().expect("4")), NbdErrno::Invalid.code());
    let len = u16::from_be_bytes([payload[4], payload[5]]) as usize;
    let message = String::from_utf8_lossy(&payload[6..6 + len]);
    assert!(message.contains("past the end"), "{message}");
}

#[test]
fn block_status_reports_holes_and_data() {
    let (server, _) = seeded();
    let mut client = RawClient::open(server.addr, "disk", true);
    client.request(CMD_BLOCK_STATUS, 0, 1, 0, 1 << 20, &[]);
    let ServerReply::Chunk { kind, payload, .. } = client.reply() else { panic!("structured") };
    assert_eq!(kind, REPLY_TYPE_BLOCK_STATUS);
    assert_eq!(u32::from_be_bytes(payload[0..4].try_into().expect("4")), META_BASE_ALLOCATION_ID);
    let descriptors: Vec<(u32, u32)> = payload[4..]
        .chunks(8)
        .map(|d| {
            (
                u32::from_be_bytes(d[0..4].try_into().expect("4")),
                u32::from_be_bytes(d[4..8].try_into().expect("4")),
            )
        })
        .collect();
    assert_eq!(descriptors, vec![(65536, 0), ((1 << 20) - 65536, STATE_HOLE | STATE_ZERO)]);
    // REQ_ONE: exactly one descriptor.
    client.request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 2, 0, 1 << 20, &[]);
    let ServerReply::Chunk { payload, .. } = client.reply() else { panic!("structured") };
    assert_eq!(payload.len(), 4 + 8);
}

#[test]
fn an_oversized_write_is_answered_then_disconnected() {
    let (server, backend) = seeded();
    let mutations = backend.mutation_count();
    let mut client = RawClient::open(server.addr, "disk", false);
    client.request(CMD_WRITE, 0, 1, 0, 64 << 20, &[0xee; 4096]);
    assert_eq!(client.reply_error(1), NbdErrno::Invalid.code());
    assert!(client.closed_by_server());
    server.wait_for("the protocol violation", |s| s.protocol_violations >= 1);
    assert_eq!(backend.mutation_count(), mutations);
    still_serves(&server);
}

#[test]
fn a_bad_request_magic_closes_the_connection() {
    let (server, _) = seeded();
    let mut client = RawClient::open(server.addr, "disk", false);
    client.send(&[0x11; REQUEST_HEADER_BYTES]);
    assert!(client.closed_by_server());
    still_serves(&server);
}

#[test]
fn a_client_vanishing_mid_payload_writes_nothing() {
    let (server, backend) = seeded();
    let mutations = backend.mutation_count();
    let mut client = RawClient::open(server.addr, "disk", false);
    // Header for 64 KiB, only 10 KiB of payload, then gone.
    client.request(CMD_WRITE, 0, 1, 65536, 65536, &[0xee; 10 * 1024]);
    drop(client);
    server.wait_for("the connection to end", |s| s.connections_active == 0);
    assert_eq!(backend.mutation_count(), mutations, "a partial write reached the backend");
    assert!(read_backend(&backend, 65536, 65536).iter().all(|&b| b == 0));
    still_serves(&server);
}

#[test]
fn replies_may_arrive_out_of_order_but_all_arrive() {
    let (server, backend) = seeded();
    let mut client = RawClient::open(server.addr, "disk", true);
    // A burst of mixed requests without waiting for replies.
    for i in 0..64u64 {
        client.request(
            CMD_WRITE,
            CMD_FLAG_FUA,
            100 + i,
            MIB + i * 4096,
            4096,
            &vec![i as u8 + 1; 4096],
        );
    }
    client.request(CMD_FLUSH, 0, 999, 0, 0, &[]);
    let mut handles: Vec<u64> = (0..65)
        .map(|_| match client.reply() {
            ServerReply::Simple { error: 0, handle } => handle,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    handles.sort();
    let mut expected: Vec<u64> = (100..164).collect();
    expected.push(999);
    assert_eq!(handles, expected);
    for i in 0..64u64 {
        assert_eq!(read_backend(&backend, MIB + i * 4096, 4096), vec![i as u8 + 1; 4096]);
    }
}

#[test]
fn idle_handshakes_are_dropped_after_the_deadline() {
    let exports = Exports::new();
    let (_, export) = mem_export(MIB);
    exports.insert("disk", export).expect("insert");
    let config =
        ServerConfig { handshake_timeout: Duration::from_millis(300), ..ServerConfig::default() };
    let server = TestServer::start(exports, config);
    let started = Instant::now();
    let mut client = RawClient::greet(server.addr);
    // Never answer the greeting.
    assert!(client.closed_by_server());
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    server.wait_for("the timed-out handshake", |s| s.handshakes_failed == 1);
}

#[test]
fn connections_beyond_the_limit_are_closed_at_once() {
    let exports = Exports::new();
    let (_, export) = mem_export(MIB);
    exports.insert("disk", export).expect("insert");
    let server =
        TestServer::start(exports, ServerConfig { connections_max: 2, ..ServerConfig::default() });
    let first = RawClient::open(server.addr, "disk", false);
    let _second = RawClient::greet(server.addr);
    let mut third = TcpStream::connect(server.addr).expect("connect");
    third.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut buf = [0u8; 18];
    assert_eq!(third.read(&mut buf).expect("read"), 0, "the third connection got a greeting");
    assert_eq!(server.stats.snapshot().connections_over_limit, 1);
    first.disconnect();
    server.wait_for("a free slot", |s| s.connections_active == 1);
    RawClient::open(server.addr, "disk", false).disconnect();
}

#[test]
fn a_client_that_never_reads_replies_is_cut_off_without_stalling_others() {
    let exports = Exports::new();
    let (_, export) = mem_export(64 * MIB);
    exports.insert("disk", export).expect("insert");
    let config = ServerConfig {
        reply_write_timeout: Duration::from_millis(500),
        in_flight_bytes_per_connection_max: 64 * MIB as usize,
        ..ServerConfig::default()
    };
    let server = TestServer::start(exports, config);

    // Ask for 32 x 32 MiB and read none of it.
    let mut slow = RawClient::open(server.addr, "disk", false);
    slow.stream.set_write_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut requests = Vec::new();
    for handle in 0..32u64 {
        requests.extend_from_slice(
            &RequestHeader { flags: 0, kind: CMD_READ, handle, offset: 0, length: 32 << 20 }
                .encode(),
        );
    }
    slow.stream.write_all(&requests).expect("send reads");

    // Meanwhile another client is served promptly.
    let started = Instant::now();
    let mut other = RawClient::open(server.addr, "disk", true);
    for handle in 0..50 {
        assert!(other.read(handle, 0, 4096).is_ok());
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "other client stalled: {:?}",
        started.elapsed()
    );
    other.disconnect();

    // The stalled connection is closed by the server; its peer sees the end of the stream
    // once it drains what the kernel buffered.
    server.wait_for("the stalled connection to be dropped", |s| s.connections_active == 0);
    let mut sink = vec![0u8; 1 << 20];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match slow.stream.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => assert!(Instant::now() < deadline, "server kept sending"),
            Err(e) => {
                assert!(matches!(e.kind(), std::io::ErrorKind::ConnectionReset), "{e}");
                break;
            }
        }
    }
}

#[test]
fn shutdown_finishes_in_flight_work_and_stops_serving() {
    let (server, backend) = seeded();
    let addr = server.addr;
    let mut client = RawClient::open(addr, "disk", false);
    assert_eq!(client.write(1, 8192, &[0x33; 8192]), 0);
    server.stop();
    assert!(client.closed_by_server());
    assert_eq!(read_backend(&backend, 8192, 8192), vec![0x33; 8192]);
    assert!(TcpStream::connect(addr).is_err(), "still accepting after shutdown");
}
