//! A backend with asynchronous reads and writes is awaited on the connection's task: real
//! clients (nbdcopy over several connections, qemu-io patterns) read back what they wrote,
//! every read and write went through the asynchronous path, and errors from it reach the
//! client as protocol errors. A backend whose calls complete at once (reads served from
//! memory) is answered by the connection's reader in batches; that holds up with far more
//! requests in flight than the connection's slots and byte budget allow. A backend that
//! reads into buffers of its own has them sent after the reply header as they are, in either
//! reply style; one that returns the wrong number of bytes fails that read with EIO. Trims and
//! write-zeroes take the asynchronous path too when the backend has one.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use stria_nbd::wire::{CMD_READ, REPLY_TYPE_OFFSET_DATA, RequestHeader};
use stria_nbd::{
    Backend, BackendError, BackendFuture, Export, Exports, Extent, MemBackend, PartsFuture,
};

/// MemBackend behind the asynchronous hooks, counting their use; writes at `poison` fail.
struct AsyncMem {
    inner: MemBackend,
    async_reads: AtomicU64,
    async_writes: AtomicU64,
    /// Trims and write-zeroes taken on the asynchronous path.
    async_zeroings: AtomicU64,
    poison: u64,
    /// Complete without yielding, as a read served from memory does.
    ready: bool,
    /// A read of 512 bytes or of 192 KiB here panics (a small read is polled by the
    /// connection's reader, a large one runs as a task of its own).
    read_panic: u64,
    /// Reads return the backend's own buffers (`read_parts_async`), split unevenly.
    parts: bool,
    /// A read in parts of 8 KiB here returns one byte too few.
    short_read: u64,
}

impl AsyncMem {
    fn new(size: u64) -> AsyncMem {
        AsyncMem {
            inner: MemBackend::new(size),
            async_reads: AtomicU64::new(0),
            async_writes: AtomicU64::new(0),
            async_zeroings: AtomicU64::new(0),
            poison: u64::MAX,
            ready: false,
            read_panic: u64::MAX,
            parts: false,
            short_read: u64::MAX,
        }
    }
}

impl Backend for AsyncMem {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&self, _offset: u64, _buf: &mut [u8]) -> Result<(), BackendError> {
        Err(BackendError::io("the blocking read path must not be used"))
    }
    fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> Result<(), BackendError> {
        Err(BackendError::io("the blocking write path must not be used"))
    }
    fn flush(&self) -> Result<(), BackendError> {
        self.inner.flush()
    }
    fn trim(&self, _offset: u64, _len: u64) -> Result<(), BackendError> {
        Err(BackendError::io("the blocking trim path must not be used"))
    }
    fn write_zeroes(&self, _o: u64, _l: u64, _t: bool, _f: bool) -> Result<(), BackendError> {
        Err(BackendError::io("the blocking write-zeroes path must not be used"))
    }
    fn trim_async(&self, offset: u64, len: u64) -> Option<BackendFuture<'_>> {
        self.async_zeroings.fetch_add(1, Ordering::Relaxed);
        Some(Box::pin(async move { self.inner.trim(offset, len) }))
    }
    fn write_zeroes_async(&self, o: u64, l: u64, t: bool, f: bool) -> Option<BackendFuture<'_>> {
        self.async_zeroings.fetch_add(1, Ordering::Relaxed);
        Some(Box::pin(async move {
            tokio::task::yield_now().await;
            self.inner.write_zeroes(o, l, t, f)
        }))
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BackendError> {
        self.inner.block_status(offset, len)
    }
    fn read_async<'a>(&'a self, offset: u64, buf: &'a mut [u8]) -> Option<BackendFuture<'a>> {
        self.async_reads.fetch_add(1, Ordering::Relaxed);
        Some(Box::pin(async move {
            if !self.ready {
                tokio::task::yield_now().await;
            }
            let poisoned = offset == self.read_panic && matches!(buf.len(), 512 | 196_608);
            assert!(!poisoned, "a read at the poisoned offset fails hard");
            self.inner.read(offset, buf)
        }))
    }
    fn read_parts_async(&self, offset: u64, len: usize) -> Option<PartsFuture<'_>> {
        if !self.parts {
            return None;
        }
        self.async_reads.fetch_add(1, Ordering::Relaxed);
        Some(Box::pin(async move {
            if !self.ready {
                tokio::task::yield_now().await;
            }
            let mut all = vec![0u8; len];
            self.inner.read(offset, &mut all)?;
            if offset == self.short_read && len == 8192 {
                all.pop();
            }
            // Uneven pieces, one of them empty: 1000 bytes, nothing, half the rest, the rest.
            let all = bytes::Bytes::from(all);
            let first = all.len().min(1000);
            let middle = first + (all.len() - first) / 2;
            Ok(vec![
                all.slice(..first),
                bytes::Bytes::new(),
                all.slice(first..middle),
                all.slice(middle..),
            ])
        }))
    }
    fn write_async<'a>(
        &'a self,
        offset: u64,
        data: &'a [u8],
        fua: bool,
    ) -> Option<BackendFuture<'a>> {
        self.async_writes.fetch_add(1, Ordering::Relaxed);
        Some(Box::pin(async move {
            if !self.ready {
                tokio::task::yield_now().await;
            }
            if offset == self.poison {
                return Err(BackendError::no_space("poisoned offset"));
            }
            self.inner.write(offset, data, fua)
        }))
    }
}

/// Serves `backend` as export "a" to loopback clients.
fn serve(backend: &Arc<AsyncMem>, config: stria_nbd::ServerConfig) -> TestServer {
    let exports = Exports::new();
    let export = Export {
        backend: backend.clone(),
        description: String::new(),
        read_only: false,
        acl: loopback_acl(),
    };
    exports.insert("a", export).expect("insert");
    TestServer::start(exports, config)
}

#[test]
fn reads_and_writes_take_the_async_path() {
    let size = 32 * 1024 * 1024;
    let backend = Arc::new(AsyncMem { poison: 16 * 1024 * 1024, ..AsyncMem::new(size) });
    let server = serve(&backend, Default::default());
    let dir = TempDir::new("async");
    let image = dir.join("in.img");
    std::fs::write(&image, pseudo_random(8 * 1024 * 1024, 3)).expect("image");
    let uri = server.uri("a");
    tool_ok("nbdcopy", &["--connections=4", &image.display().to_string(), &uri]);
    let back = dir.join("back.img");
    tool_ok("nbdcopy", &["--connections=4", &uri, &back.display().to_string()]);
    let (a, b) = (std::fs::read(&image).expect("a"), std::fs::read(&back).expect("b"));
    assert!(a == b[..a.len()], "data read back through the async path differs");
    assert!(backend.async_writes.load(Ordering::Relaxed) > 0);
    assert!(backend.async_reads.load(Ordering::Relaxed) > 0);
    // An error from the async path is the client's error, and the connection goes on.
    let out = tool(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x11 16M 4k",
            "-c",
            "write -P 0x22 0 4k",
            "-c",
            "read -P 0x22 0 4k",
            "-c",
            "discard 1M 64k",
            "-c",
            "write -z 2M 64k",
            "-c",
            "read -P 0 1M 64k",
            "-c",
            "read -P 0 2M 64k",
        ],
    );
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("No space left on device"), "{text}");
    assert!(text.contains("read 4096/4096"), "the connection kept serving: {text}");
    assert_eq!(text.matches("read 65536/65536").count(), 2, "trimmed and zeroed: {text}");
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert!(backend.async_zeroings.load(Ordering::Relaxed) >= 2, "trim and zeroes went async");
    server.stop();
}

#[test]
fn requests_completed_at_once_are_answered_in_batches_within_the_limits() {
    let size = 16 * 1024 * 1024;
    let backend =
        Arc::new(AsyncMem { ready: true, read_panic: 8 * 1024 * 1024, ..AsyncMem::new(size) });
    // nbdcopy keeps up to 64 requests in flight: far past two slots, so the reader must
    // hand its batch (which holds the slots of its replies) over whenever it runs out.
    let config =
        stria_nbd::ServerConfig { in_flight_requests_per_connection_max: 2, ..Default::default() };
    let server = serve(&backend, config);
    let dir = TempDir::new("batched");
    let image = dir.join("in.img");
    std::fs::write(&image, pseudo_random(size as usize, 11)).expect("image");
    let uri = server.uri("a");
    tool_ok("nbdcopy", &["--connections=2", &image.display().to_string(), &uri]);
    let back = dir.join("back.img");
    tool_ok("nbdcopy", &["--connections=2", &uri, &back.display().to_string()]);
    let (a, b) = (std::fs::read(&image).expect("a"), std::fs::read(&back).expect("b"));
    assert!(a == b, "data read back through batched replies differs");
    // Many small reads in one pipeline: every reply arrives, each with its own data.
    let out = tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "aio_write -P 0x31 0 4k",
            "-c",
            "aio_write -P 0x32 4k 4k",
            "-c",
            "aio_write -P 0x33 8k 4k",
            "-c",
            "aio_flush",
            "-c",
            "aio_read -P 0x31 0 4k",
            "-c",
            "aio_read -P 0x32 4k 4k",
            "-c",
            "aio_read -P 0x33 8k 4k",
            "-c",
            "aio_flush",
        ],
    );
    assert_eq!(out.matches("read 4096/4096").count(), 3, "{out}");
    assert!(!out.contains("Pattern verification failed"), "{out}");
    // 64 reads sent in one segment: the reader parses them from its buffer without waiting,
    // so it runs out of slots while its batch holds them.
    let mut client = RawClient::open(server.addr, "a", true);
    let mut pipeline = Vec::new();
    for handle in 0..64u64 {
        let header =
            RequestHeader { flags: 0, kind: CMD_READ, handle, offset: handle * 8192, length: 4096 };
        pipeline.extend_from_slice(&header.encode());
    }
    client.send(&pipeline);
    let mut answered = vec![false; 64];
    for _ in 0..64 {
        match client.reply() {
            ServerReply::Chunk { kind: REPLY_TYPE_OFFSET_DATA, handle, payload, .. } => {
                let offset = handle * 8192;
                assert_eq!(&payload[..8], &offset.to_be_bytes(), "reply {handle}'s offset");
                let stored = read_backend(&backend.inner, offset, 4096);
                assert!(payload[8..] == stored[..], "reply {handle}'s data");
                assert!(!std::mem::replace(&mut answered[handle as usize], true), "{handle} twice");
            }
            other => panic!("unexpected reply {other:?}"),
        }
    }
    // A backend that panics fails that request with EIO; the connection goes on.
    assert_eq!(client.read(100, 8 * 1024 * 1024, 512), Err(5), "EIO for the failed read");
    let stored = read_backend(&backend.inner, 4096, 4096);
    assert_eq!(client.read(101, 4096, 4096).as_deref(), Ok(&stored[..]));
    assert!(backend.async_reads.load(Ordering::Relaxed) > 0);
    server.stop();
}

#[test]
fn a_panic_in_a_read_of_any_size_fails_that_read_only() {
    for ready in [true, false] {
        let size = 16 * 1024 * 1024;
        let poison = 8 * 1024 * 1024;
        let backend = Arc::new(AsyncMem { ready, read_panic: poison, ..AsyncMem::new(size) });
        let server = serve(&backend, Default::default());
        let mut client = RawClient::open(server.addr, "a", true);
        // Small (the reader's own poll, or a task when not ready) and large (a task).
        for (handle, len) in [(1, 512u32), (2, 192 * 1024)] {
            assert_eq!(client.read(handle, poison, len), Err(5), "EIO for {len} bytes ({ready})");
        }
        let stored = read_backend(&backend.inner, 4096, 256 * 1024);
        assert_eq!(client.read(3, 4096, 256 * 1024).as_deref(), Ok(&stored[..]), "{ready}");
        server.stop();
    }
}

#[test]
fn reads_in_the_backends_own_buffers_are_sent_as_they_are() {
    let size = 16 * 1024 * 1024;
    for ready in [false, true] {
        let backend = Arc::new(AsyncMem {
            ready,
            parts: true,
            short_read: 4 * 1024 * 1024,
            ..AsyncMem::new(size)
        });
        let server = serve(&backend, Default::default());
        let dir = TempDir::new("parts");
        let image = dir.join("in.img");
        std::fs::write(&image, pseudo_random(size as usize, 17)).expect("image");
        let uri = server.uri("a");
        tool_ok("nbdcopy", &["--connections=2", &image.display().to_string(), &uri]);
        let back = dir.join("back.img");
        tool_ok("nbdcopy", &["--connections=2", &uri, &back.display().to_string()]);
        let (a, b) = (std::fs::read(&image).expect("a"), std::fs::read(&back).expect("b"));
        assert!(a == b, "data read back in the backend's buffers differs (ready: {ready})");
        for structured in [false, true] {
            let mut client = RawClient::open(server.addr, "a", structured);
            for (handle, (offset, len)) in
                [(0, 512), (4096, 4096), (1 << 20, 1 << 20)].into_iter().enumerate()
            {
                let stored = read_backend(&backend.inner, offset, len);
                let got = client.read(handle as u64, offset, len as u32);
                assert_eq!(got.as_deref(), Ok(&stored[..]), "{len} bytes at {offset}");
            }
            // The wrong number of bytes is the backend's failure: EIO, and the connection
            // goes on.
            assert_eq!(client.read(9, 4 * 1024 * 1024, 8192), Err(5), "EIO for a short read");
            let stored = read_backend(&backend.inner, 8192, 4096);
            assert_eq!(client.read(10, 8192, 4096).as_deref(), Ok(&stored[..]));
        }
        assert!(backend.async_reads.load(Ordering::Relaxed) > 0);
        server.stop();
    }
}
