//! Shared test harness: an in-process server on 127.0.0.1 (its own runtime on its own
//! thread, so tests can run real client processes and blocking sockets), helpers to run the
//! client tools, and a raw protocol client for hostile-input tests.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stria_nbd::wire::*;
use stria_nbd::{
    AclRule, Export, Exports, MemBackend, Server, ServerConfig, ServerStats, ShutdownHandle,
};

pub const MIB: u64 = 1024 * 1024;

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// A running server; stops (gracefully) when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub exports: Exports,
    pub stats: Arc<ServerStats>,
    pub clients: stria_nbd::Clients,
    shutdown: ShutdownHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start(exports: Exports, config: ServerConfig) -> TestServer {
        init_tracing();
        let server = Server::new(exports.clone(), config).expect("server config");
        let stats = server.stats();
        let clients = server.clients();
        let shutdown = server.shutdown_handle();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                tx.send(listener.local_addr().expect("local addr")).expect("report addr");
                server.serve(listener).await.expect("serve");
            });
        });
        let addr = rx.recv().expect("server started");
        TestServer { addr, exports, stats, clients, shutdown, thread: Some(thread) }
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.addr)
    }

    /// Shuts down and waits for `serve` to return.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.shutdown.shutdown();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("server thread");
        }
    }

    /// Waits (bounded) until `condition` holds on the server's counters.
    pub fn wait_for(
        &self,
        what: &str,
        condition: impl Fn(&stria_nbd::ServerStatsSnapshot) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let snapshot = self.stats.snapshot();
            if condition(&snapshot) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}: {snapshot:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.shutdown();
        // Do not join while panicking: a stuck server must not hide the original failure.
        if !std::thread::panicking() {
            self.stop_inner();
        }
    }
}

/// Loopback-only access, the default for tests.
pub fn loopback_acl() -> Vec<AclRule> {
    vec![AclRule::new("127.0.0.0/8", None).expect("rule")]
}

pub fn mem_export(size: u64) -> (Arc<MemBackend>, Export) {
    let backend = Arc::new(MemBackend::new(size));
    let export = Export {
        backend: backend.clone(),
        description: format!("{size} bytes in memory"),
        read_only: false,
        acl: loopback_acl(),
    };
    (backend, export)
}

/// One export named `name` served with the default configuration.
pub fn serve_one(name: &str, size: u64) -> (TestServer, Arc<MemBackend>) {
    let (backend, export) = mem_export(size);
    let exports = Exports::new();
    exports.insert(name, export).expect("insert");
    (TestServer::start(exports, ServerConfig::default()), backend)
}

/// Runs a client tool under a time limit. A missing tool fails the test with the package
/// to install (scripts/test installs them).
pub fn tool(program: &str, args: &[&str]) -> Output {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {program}")).output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "{program} is not installed (apt-get install qemu-utils libnbd-bin fio)"
    );
    Command::new("timeout").arg("120").arg(program).args(args).output().expect("run tool")
}

/// Like [`tool`], and the tool must succeed.
pub fn tool_ok(program: &str, args: &[&str]) -> String {
    let output = tool(program, args);
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn json(text: &str) -> serde_json::Value {
    // Some tools print a banner line before their JSON.
    let start = text.find(['{', '[']).unwrap_or(0);
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("bad JSON ({e}): {text}"))
}

/// Deterministic pseudo-random bytes (xorshift64*), so failures reproduce.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("stria-nbd-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn read_backend(backend: &MemBackend, offset: u64, len: usize) -> Vec<u8> {
    use stria_nbd::Backend;
    let mut buf = vec![0u8; len];
    backend.read(offset, &mut buf).expect("backend read");
    buf
}

// ---- Raw protocol client ---------------------------------------------------------------------

/// A hand-driven NBD client over a blocking socket, for sending what real clients never do.
pub struct RawClient {
    pub stream: TcpStream,
    pub structured: bool,
}

/// One option reply.
#[derive(Debug)]
pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub payload: Vec<u8>,
}

/// One transmission reply (simple, or one structured chunk).
#[derive(Debug, PartialEq, Eq)]
pub enum ServerReply {
    Simple { error: u32, handle: u64 },
    Chunk { flags: u16, kind: u16, handle: u64, payload: Vec<u8> },
}

impl RawClient {
    /// Connects and reads the greeting, checking the fixed-newstyle handshake flags.
    pub fn greet(addr: SocketAddr) -> RawClient {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
        let mut client = RawClient { stream, structured: false };
        let mut greeting = [0u8; 18];
        client.stream.read_exact(&mut greeting).expect("greeting");
        assert_eq!(&greeting[0..8], &NBD_MAGIC.to_be_bytes());
        assert_eq!(&greeting[8..16], &IHAVEOPT.to_be_bytes());
        assert_eq!(
            u16::from_be_bytes([greeting[16], greeting[17]]),
            FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
        );
        client
    }

    /// Greets and sends fixed-newstyle + no-zeroes client flags.
    pub fn connect(addr: SocketAddr) -> RawClient {
        let mut client = RawClient::greet(addr);
        client.send(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
        client
    }

    /// Connects and enters transmission on `export` with `NBD_OPT_GO`.
    pub fn open(addr: SocketAddr, export: &str, structured: bool) -> RawClient {
        let mut client = RawClient::connect(addr);
        if structured {
            let reply = client.option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(reply.reply_type, REP_ACK);
            client.structured = true;
            let mut data = (export.len() as u32).to_be_bytes().to_vec();
            data.extend_from_slice(export.as_bytes());
            data.extend_from_slice(&1u32.to_be_bytes());
            data.extend_from_slice(&(META_BASE_ALLOCATION.len() as u32).to_be_bytes());
            data.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
            let replies = client.option_all(OPT_SET_META_CONTEXT, &data);
            assert_eq!(replies.last().map(|r| r.reply_type), Some(REP_ACK));
        }
        let replies = client.option_all(OPT_GO, &go_payload(export, &[INFO_BLOCK_SIZE]));
        let last = replies.last().expect("a reply");
        assert_eq!(
            last.reply_type,
            REP_ACK,
            "GO failed: {:?}",
            String::from_utf8_lossy(&last.payload)
        );
        client
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut message = IHAVEOPT.to_be_bytes().to_vec();
        message.extend_from_slice(&option.to_be_bytes());
        message.extend_from_slice(&(data.len() as u32).to_be_bytes());
        message.extend_from_slice(data);
        self.send(&message);
    }

    pub fn read_option_reply(&mut self) -> OptionReply {
        let mut header = [0u8; OPTION_REPLY_HEADER_BYTES];
        self.stream.read_exact(&mut header).expect("option reply header");
        assert_eq!(&header[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        let option = u32::from_be_bytes(header[8..12].try_into().expect("4"));
        let reply_type = u32::from_be_bytes(header[12..16].try_into().expect("4"));
        let length = u32::from_be_bytes(header[16..20].try_into().expect("4"));
        let mut payload = vec![0u8; length as usize];
        self.stream.read_exact(&mut payload).expect("option reply payload");
        OptionReply { option, reply_type, payload }
    }

    /// Sends an option with a single reply.
    pub fn option(&mut self, option: u32, data: &[u8]) -> OptionReply {
        self.send_option(option, data);
        let reply = self.read_option_reply();
        assert_eq!(reply.option, option);
        reply
    }

    /// Sends an option and reads replies up to the final ACK or error.
    pub fn option_all(&mut self, option: u32, data: &[u8]) -> Vec<OptionReply> {
        self.send_option(option, data);
        let mut replies = Vec::new();
        loop {
            let reply = self.read_option_reply();
            assert_eq!(reply.option, option);
            let last = reply.reply_type == REP_ACK || reply.reply_type & (1 << 31) != 0;
            replies.push(reply);
            if last {
                return replies;
            }
        }
    }

    pub fn request(
        &mut self,
        kind: u16,
        flags: u16,
        handle: u64,
        offset: u64,
        length: u32,
        data: &[u8],
    ) {
        let mut message = RequestHeader { flags, kind, handle, offset, length }.encode().to_vec();
        message.extend_from_slice(data);
        self.send(&message);
    }

    /// Reads one reply; a simple READ reply's data must be read separately with `read_data`.
    pub fn reply(&mut self) -> ServerReply {
        let mut magic = [0u8; 4];
        self.stream.read_exact(&mut magic).expect("reply magic");
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => {
                let mut rest = [0u8; 12];
                self.stream.read_exact(&mut rest).expect("simple reply");
                ServerReply::Simple {
                    error: u32::from_be_bytes(rest[0..4].try_into().expect("4")),
                    handle: u64::from_be_bytes(rest[4..12].try_into().expect("8")),
                }
            }
            STRUCTURED_REPLY_MAGIC => {
                let mut rest = [0u8; 16];
                self.stream.read_exact(&mut rest).expect("chunk header");
                let length = u32::from_be_bytes(rest[12..16].try_into().expect("4"));
                let mut payload = vec![0u8; length as usize];
                self.stream.read_exact(&mut payload).expect("chunk payload");
                ServerReply::Chunk {
                    flags: u16::from_be_bytes(rest[0..2].try_into().expect("2")),
                    kind: u16::from_be_bytes(rest[2..4].try_into().expect("2")),
                    handle: u64::from_be_bytes(rest[4..12].try_into().expect("8")),
                    payload,
                }
            }
            other => panic!("unexpected reply magic {other:#x}"),
        }
    }

    pub fn read_data(&mut self, len: usize) -> Vec<u8> {
        let mut data = vec![0u8; len];
        self.stream.read_exact(&mut data).expect("reply data");
        data
    }

    /// The error value of the next reply (0 for success), for commands without data.
    pub fn reply_error(&mut self, handle: u64) -> u32 {
        match self.reply() {
            ServerReply::Simple { error, handle: h } => {
                assert_eq!(h, handle);
                error
            }
            ServerReply::Chunk { kind, handle: h, payload, flags } => {
                assert_eq!(h, handle);
                assert_eq!(flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE);
                if kind == REPLY_TYPE_ERROR {
                    u32::from_be_bytes(payload[0..4].try_into().expect("4"))
                } else {
                    0
                }
            }
        }
    }

    /// A 512-aligned read through the negotiated reply style; `Err(errno)` on failure.
    pub fn read(&mut self, handle: u64, offset: u64, length: u32) -> Result<Vec<u8>, u32> {
        self.request(CMD_READ, 0, handle, offset, length, &[]);
        match self.reply() {
            ServerReply::Simple { error: 0, handle: h } => {
                assert_eq!(h, handle);
                Ok(self.read_data(length as usize))
            }
            ServerReply::Simple { error, .. } => Err(error),
            ServerReply::Chunk { kind: REPLY_TYPE_OFFSET_DATA, payload, handle: h, .. } => {
                assert_eq!(h, handle);
                assert_eq!(&payload[0..8], &offset.to_be_bytes());
                Ok(payload[8..].to_vec())
            }
            ServerReply::Chunk { kind: REPLY_TYPE_ERROR, payload, .. } => {
                Err(u32::from_be_bytes(payload[0..4].try_into().expect("4")))
            }
            other => panic!("unexpected read reply {other:?}"),
        }
    }

    pub fn write(&mut self, handle: u64, offset: u64, data: &[u8]) -> u32 {
        self.request(CMD_WRITE, 0, handle, offset, data.len() as u32, data);
        self.reply_error(handle)
    }

    pub fn disconnect(mut self) {
        self.request(CMD_DISC, 0, 0, 0, 0, &[]);
        let mut rest = Vec::new();
        // The server closes after NBD_CMD_DISC; nothing more may arrive.
        let n = self.stream.read_to_end(&mut rest).expect("read to close");
        assert_eq!(n, 0, "server sent data after NBD_CMD_DISC");
    }

    /// True once the server has closed the connection (reads EOF or a reset).
    pub fn closed_by_server(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
        }
    }
}

pub fn go_payload(export: &str, infos: &[u16]) -> Vec<u8> {
    let mut data = (export.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for info in infos {
        data.extend_from_slice(&info.to_be_bytes());
    }
    data
}
