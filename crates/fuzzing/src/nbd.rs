//! The NBD server, driven over an in-memory pipe with the real handshake and transmission code
//! and two small in-memory exports: `rw` (writable) and `ro` (read-only, holding a pattern).
//! The fuzzed bytes are what a client sends; the client then closes its side. Every session
//! must end (answered or hung up on) within a bound, never panic, leave the read-only export
//! untouched, and leave the writable one unchanged outside the ranges the requests named.
//! The server's replies must be well-formed and answer only handles that were sent.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use stria_nbd::wire::*;
use stria_nbd::{AclRule, Backend, Export, Exports, MemBackend, Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::mode_and_rest;

/// Size of each export: small, so that whole-export checks stay cheap.
pub const EXPORT_BYTES: u64 = 1024 * 1024;
/// Longest one session may take before it counts as a hang.
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Server output kept for checking; the rest is read and dropped.
const OUTPUT_KEPT_BYTES: usize = 8 * 1024 * 1024;

struct World {
    server: Server,
    rw: Arc<MemBackend>,
    ro: Arc<MemBackend>,
    /// The read-only export's mutation count once filled.
    ro_mutations: u64,
}

/// What the read-only export holds: a recognisable pattern in a few blocks, holes elsewhere.
fn ro_image() -> Vec<u8> {
    let mut image = vec![0u8; EXPORT_BYTES as usize];
    for (i, b) in image[..64 * 1024].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    image
}

fn world() -> World {
    let rw = Arc::new(MemBackend::new(EXPORT_BYTES));
    let ro = Arc::new(MemBackend::new(EXPORT_BYTES));
    ro.write(0, &ro_image()[..64 * 1024], false).expect("fill the read-only export");
    let exports = Exports::new();
    for (name, backend, read_only) in [("rw", rw.clone(), false), ("ro", ro.clone(), true)] {
        let export = Export {
            backend,
            description: format!("fuzz export {name}"),
            read_only,
            acl: AclRule::anyone(),
        };
        exports.insert(name, export).expect("valid export");
    }
    let config = ServerConfig {
        handshake_timeout: Duration::from_secs(3),
        reply_write_timeout: Duration::from_secs(3),
        payload_read_timeout: Duration::from_secs(3),
        ..ServerConfig::default()
    };
    let server = Server::new(exports, config).expect("valid server config");
    let ro_mutations = ro.mutation_count();
    World { server, rw, ro, ro_mutations }
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
}

/// Sends `client` to a fresh server, closes the client's side, and returns what the server
/// sent back, with the world to inspect.
fn session(client: &[u8]) -> (World, Vec<u8>) {
    let world = world();
    let output = RUNTIME.with(|rt| {
        rt.block_on(async {
            let (ours, theirs) = tokio::io::duplex(256 * 1024);
            let (mut from_server, mut to_server) = tokio::io::split(ours);
            let peer: SocketAddr = "127.0.0.1:40000".parse().expect("address");
            let serve = world.server.serve_in_memory(theirs, peer);
            let send = async {
                // The server may hang up before taking everything; that is its right.
                let _ = to_server.write_all(client).await;
                let _ = to_server.shutdown().await;
            };
            let receive = async {
                let mut kept = Vec::new();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match from_server.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let room = OUTPUT_KEPT_BYTES.saturating_sub(kept.len());
                            kept.extend_from_slice(&buf[..n.min(room)]);
                        }
                    }
                }
                kept
            };
            let all = async { tokio::join!(serve, send, receive).2 };
            match tokio::time::timeout(SESSION_TIMEOUT, all).await {
                Ok(output) => output,
                Err(_) => panic!("the NBD session did not end within {SESSION_TIMEOUT:?}"),
            }
        })
    });
    (world, output)
}

fn read_all(backend: &MemBackend) -> Vec<u8> {
    let mut image = vec![0u8; EXPORT_BYTES as usize];
    backend.read(0, &mut image).expect("read the export back");
    image
}

fn check_read_only_untouched(world: &World) {
    let mutations = world.ro.mutation_count() - world.ro_mutations;
    assert_eq!(mutations, 0, "a request changed the read-only export");
    assert!(read_all(&world.ro) == ro_image(), "the read-only export's bytes changed");
}

/// Input: the raw byte stream of a client from its first byte (client flags, options, and
/// whatever follows if it reaches transmission).
pub fn nbd_handshake(data: &[u8]) {
    let (world, output) = session(data);
    check_read_only_untouched(&world);
    let greeting = greeting();
    assert!(output.starts_with(&greeting), "the server did not greet first");
    let mut at = greeting.len();
    // Option replies follow until transmission (or a hang-up); each must be well-formed.
    while output.len() >= at + OPTION_REPLY_HEADER_BYTES {
        let h = &output[at..at + OPTION_REPLY_HEADER_BYTES];
        if be64(&h[0..8]) != OPTION_REPLY_MAGIC {
            break; // NBD_OPT_EXPORT_NAME's reply or transmission: not an option reply.
        }
        let reply_type = be32(&h[12..16]);
        let len = be32(&h[16..20]) as usize;
        let known = matches!(reply_type, REP_ACK | REP_SERVER | REP_INFO | REP_META_CONTEXT);
        assert!(known || reply_type & REP_ERR != 0, "unknown option reply type {reply_type:#x}");
        assert!(len <= 2 * STRING_BYTES_MAX + 64, "option reply of {len} bytes");
        at += OPTION_REPLY_HEADER_BYTES + len;
    }
}

fn greeting() -> Vec<u8> {
    let mut g = NBD_MAGIC.to_be_bytes().to_vec();
    g.extend_from_slice(&IHAVEOPT.to_be_bytes());
    g.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    g
}

/// A whole option request.
pub fn option(option: u32, payload: &[u8]) -> Vec<u8> {
    let mut o = IHAVEOPT.to_be_bytes().to_vec();
    o.extend_from_slice(&option.to_be_bytes());
    o.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    o.extend_from_slice(payload);
    o
}

/// The string-with-length encoding of option payloads.
pub fn string_u32(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

/// A valid client handshake ending in `NBD_OPT_GO`, picked by the mode byte: bit 0 the
/// read-only export, bit 1 structured replies, bit 2 `base:allocation` too.
pub fn client_handshake(mode: u8) -> Vec<u8> {
    let export = if mode & 1 == 1 { "ro" } else { "rw" };
    let mut c = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    if mode & 2 != 0 {
        c.extend(option(OPT_STRUCTURED_REPLY, &[]));
        if mode & 4 != 0 {
            let mut p = string_u32(export);
            p.extend_from_slice(&1u32.to_be_bytes());
            p.extend(string_u32(META_BASE_ALLOCATION));
            c.extend(option(OPT_SET_META_CONTEXT, &p));
        }
    }
    let mut go = string_u32(export);
    go.extend_from_slice(&0u16.to_be_bytes());
    c.extend(option(OPT_GO, &go));
    c
}

/// One request as the model reads it from the client's stream.
#[derive(Clone, Copy, Debug)]
struct Sent {
    kind: u16,
    length: u32,
}

/// Input: one mode byte choosing the handshake (see [`client_handshake`]), then the client's
/// transmission stream: request headers and write payloads.
pub fn nbd_transmission(data: &[u8]) {
    let (mode, requests) = mode_and_rest(data);
    let mut client = client_handshake(mode);
    client.extend_from_slice(requests);
    let (world, output) = session(&client);
    check_read_only_untouched(&world);

    // Model: walk the requests as the server must, noting handles and the sectors any write,
    // trim or write-zeroes names (whether or not it was valid: an over-approximation).
    let mut touched = vec![false; (EXPORT_BYTES / BLOCK_SIZE_MIN_BYTES as u64) as usize];
    let mut sent: HashMap<u64, Vec<Sent>> = HashMap::new();
    let mut requests_sent = 0usize;
    let mut at = 0usize;
    while let Some(header) = requests.get(at..at + REQUEST_HEADER_BYTES) {
        let Ok(h) = RequestHeader::parse(header.try_into().expect("header size")) else { break };
        at += REQUEST_HEADER_BYTES;
        if h.kind == CMD_DISC {
            break;
        }
        requests_sent += 1;
        sent.entry(h.handle).or_default().push(Sent { kind: h.kind, length: h.length });
        if matches!(h.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES) {
            let sector = BLOCK_SIZE_MIN_BYTES as u64;
            let first = h.offset / sector;
            let end = h.offset.saturating_add(h.length as u64).div_ceil(sector);
            for s in first..end.min(touched.len() as u64) {
                touched[s as usize] = true;
            }
        }
        if h.kind == CMD_WRITE {
            if h.length > REQUEST_BYTES_MAX {
                break; // Answered, then the server hangs up.
            }
            at = at.saturating_add(h.length as usize);
        }
    }
    let rw = read_all(&world.rw);
    for (s, &was_touched) in touched.iter().enumerate() {
        let sector =
            &rw[s * BLOCK_SIZE_MIN_BYTES as usize..(s + 1) * BLOCK_SIZE_MIN_BYTES as usize];
        assert!(was_touched || sector.iter().all(|&b| b == 0), "sector {s} changed untouched");
    }

    check_replies(&output, mode & 2 != 0, &sent, requests_sent);
}

/// Skips the handshake replies, then checks every transmission reply the server sent.
fn check_replies(output: &[u8], structured: bool, sent: &HashMap<u64, Vec<Sent>>, count: usize) {
    if output.len() >= OUTPUT_KEPT_BYTES {
        return; // Cut short by the harness: replies may be torn at the cut.
    }
    let mut at = greeting().len();
    // Option replies, up to the ACK of NBD_OPT_GO.
    loop {
        let Some(h) = output.get(at..at + OPTION_REPLY_HEADER_BYTES) else { return };
        assert_eq!(be64(&h[0..8]), OPTION_REPLY_MAGIC, "bad option reply during the handshake");
        let (option, reply_type) = (be32(&h[8..12]), be32(&h[12..16]));
        assert!(reply_type & REP_ERR == 0, "the fuzz handshake was refused ({reply_type:#x})");
        at += OPTION_REPLY_HEADER_BYTES + be32(&h[16..20]) as usize;
        if option == OPT_GO && reply_type == REP_ACK {
            break;
        }
    }
    let mut finished = 0usize;
    while at < output.len() {
        let Some(magic) = output.get(at..at + 4) else { panic!("torn reply at {at}") };
        if be32(magic) == SIMPLE_REPLY_MAGIC {
            let h = output.get(at..at + SIMPLE_REPLY_HEADER_BYTES).expect("whole simple reply");
            let (error, handle) = (be32(&h[4..8]), be64(&h[8..16]));
            let requests = sent.get(&handle).unwrap_or_else(|| panic!("reply to unsent {handle}"));
            at += SIMPLE_REPLY_HEADER_BYTES;
            finished += 1;
            if !structured && error == 0 && requests.iter().any(|r| r.kind == CMD_READ) {
                let reads: Vec<u32> =
                    requests.iter().filter(|r| r.kind == CMD_READ).map(|r| r.length).collect();
                if reads.iter().any(|&l| l != reads[0]) || requests.len() != reads.len() {
                    return; // Handle reused for different requests: lengths are ambiguous.
                }
                at += reads[0] as usize;
            }
        } else {
            assert!(structured, "structured reply without negotiation, or garbage, at {at}");
            assert_eq!(be32(magic), STRUCTURED_REPLY_MAGIC, "garbage instead of a reply at {at}");
            let h = output.get(at..at + STRUCTURED_REPLY_HEADER_BYTES).expect("whole header");
            let flags = u16::from_be_bytes([h[4], h[5]]);
            let handle = be64(&h[8..16]);
            let len = be32(&h[16..20]) as usize;
            assert!(sent.contains_key(&handle), "structured reply to unsent handle {handle}");
            at += STRUCTURED_REPLY_HEADER_BYTES + len;
            if flags & REPLY_FLAG_DONE != 0 {
                finished += 1;
            }
        }
    }
    assert_eq!(at, output.len(), "the last reply is torn");
    assert!(finished <= count, "{finished} replies to {count} requests");
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The harness must really reach transmission: a seed's write lands and its read is
    /// answered, or every property above would hold vacuously.
    #[test]
    fn a_seed_session_reaches_transmission() {
        let mut client = client_handshake(0);
        let mut write =
            RequestHeader { flags: 0, kind: CMD_WRITE, handle: 1, offset: 4096, length: 512 };
        client.extend(write.encode());
        client.extend([0x5a; 512]);
        write.kind = CMD_READ;
        write.handle = 2;
        client.extend(write.encode());
        let (world, output) = session(&client);
        let mut back = vec![0u8; 512];
        world.rw.read(4096, &mut back).expect("read back");
        assert!(back.iter().all(|&b| b == 0x5a), "the write did not reach the export");
        // Both requests are answered, without error. Replies go out in completion order and
        // the read was sent without waiting for the write's reply, so it may come first and
        // see the block before the write (the protocol allows both).
        let reply = |handle: u64| {
            let mut header = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
            header.extend(0u32.to_be_bytes());
            header.extend(handle.to_be_bytes());
            output.windows(header.len()).position(|w| w == header.as_slice())
        };
        assert!(reply(1).is_some(), "the write was not answered");
        let read = reply(2).expect("the read was not answered") + SIMPLE_REPLY_HEADER_BYTES;
        let data = &output[read..read + 512];
        assert!(
            data.iter().all(|&b| b == 0x5a) || data.iter().all(|&b| b == 0),
            "the read returned neither the old nor the new block"
        );
    }
}
