//! The transmission phase of one connection: a reader that parses and checks requests, runs
//! each on the backend, and a writer that sends replies in completion order.
//!
//! A request whose backend call completes at once (a read served from memory) is answered by
//! the reader itself: its reply joins a batch that goes to the writer, as one buffer, when the
//! reader has no more buffered requests to parse, so a client with many requests in flight
//! gets many replies per send. Every other request becomes a task of its own (the blocking
//! pool for commands without an asynchronous path) and sends its reply when done.
//!
//! Memory per connection is bounded by two semaphores: request slots (requests in progress)
//! and a byte budget (write payloads being held, read replies waiting to be sent). A permit is
//! taken before anything is allocated and released only after the reply has gone to the
//! socket, so a client that never drains replies stalls only its own connection, and the
//! writer's timeout then disconnects it.

use std::future::Future;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::backend::{Backend, BackendError, Extent};
use crate::export::Standing;
use crate::handshake::Negotiated;
use crate::server::{ServerStats, Shared, bump};
use crate::transport::WriteHalf;
use crate::wire::*;

/// Read-ahead buffer of the request reader; big payloads bypass it.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// How long closing the connection (TLS close_notify) may take once replies are done.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A request that passed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    Read { offset: u64, length: u32 },
    Write { offset: u64, length: u32, fua: bool },
    Flush,
    Trim { offset: u64, length: u32 },
    WriteZeroes { offset: u64, length: u32, may_trim: bool, fua: bool },
    BlockStatus { offset: u64, length: u32, req_one: bool },
    Disconnect,
}

/// What the connection negotiated that request validation depends on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub size: u64,
    pub read_only: bool,
    pub structured: bool,
    pub block_status: bool,
}

/// A request refused before it reached the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub errno: NbdErrno,
    pub message: String,
}

fn refused(errno: NbdErrno, message: impl Into<String>) -> Refused {
    Refused { errno, message: message.into() }
}

/// Checks one request header against the protocol and the export. Pure, so every rule is
/// unit-tested without a socket. (An oversized WRITE is caught by the reader before this,
/// because its payload cannot be skipped safely.)
pub(crate) fn validate(h: &RequestHeader, limits: &Limits) -> Result<Command, Refused> {
    let allowed_flags = match h.kind {
        CMD_READ if limits.structured => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        CMD_DISC => u16::MAX,
        other => return Err(refused(NbdErrno::Invalid, format!("unknown command {other}"))),
    };
    if h.flags & !allowed_flags != 0 {
        return Err(refused(
            NbdErrno::Invalid,
            format!("command flags {:#x} not valid for command {}", h.flags, h.kind),
        ));
    }
    let fua = h.flags & CMD_FLAG_FUA != 0;
    let (offset, length) = (h.offset, h.length);
    let writes = matches!(h.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && limits.read_only {
        return Err(refused(NbdErrno::Perm, "export is read-only"));
    }
    let aligned = |value: u64| value.is_multiple_of(BLOCK_SIZE_MIN_BYTES as u64);
    let in_bounds = offset.checked_add(length as u64).is_some_and(|end| end <= limits.size);
    let past_end = || {
        format!("range {offset}+{length} extends past the end of the {}-byte export", limits.size)
    };
    let misaligned = || {
        format!("offset {offset} and length {length} must be multiples of {BLOCK_SIZE_MIN_BYTES}")
    };
    match h.kind {
        CMD_DISC => Ok(Command::Disconnect),
        CMD_FLUSH => Ok(Command::Flush),
        CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES => {
            // Only requests whose data crosses the wire are capped. TRIM and WRITE_ZEROES may
            // cover up to 4 GiB - 1: the protocol asks clients to keep WRITE_ZEROES within the
            // maximum block size, but nbdcopy zeroes whole holes (tens of MiB) in one request,
            // and such a request costs no server memory.
            let data_carrying = matches!(h.kind, CMD_READ | CMD_WRITE);
            if data_carrying && length > REQUEST_BYTES_MAX {
                return Err(refused(
                    NbdErrno::Invalid,
                    format!("length {length} exceeds the maximum block size {REQUEST_BYTES_MAX}"),
                ));
            }
            if !aligned(offset) || !aligned(length as u64) {
                return Err(refused(NbdErrno::Invalid, misaligned()));
            }
            if !in_bounds {
                // The protocol asks for ENOSPC on writes past the end, EINVAL otherwise.
                let errno = if h.kind == CMD_READ || h.kind == CMD_TRIM {
                    NbdErrno::Invalid
                } else {
                    NbdErrno::NoSpace
                };
                return Err(refused(errno, past_end()));
            }
            Ok(match h.kind {
                CMD_READ => Command::Read { offset, length },
                CMD_WRITE => Command::Write { offset, length, fua },
                CMD_TRIM => Command::Trim { offset, length },
                _ => Command::WriteZeroes {
                    offset,
                    length,
                    may_trim: h.flags & CMD_FLAG_NO_HOLE == 0,
                    fua,
                },
            })
        }
        CMD_BLOCK_STATUS => {
            if !limits.block_status {
                return Err(refused(NbdErrno::Invalid, "no metadata context was negotiated"));
            }
            if length == 0 || !aligned(offset) {
                return Err(refused(NbdErrno::Invalid, misaligned()));
            }
            if !in_bounds {
                return Err(refused(NbdErrno::Invalid, past_end()));
            }
            // The length is only a hint (clients send e.g. 2^31 - 1); cover whole sectors
            // inside the export, which is itself a multiple of the sector size.
            let rounded =
                (length as u64).div_ceil(BLOCK_SIZE_MIN_BYTES as u64) * BLOCK_SIZE_MIN_BYTES as u64;
            let length = rounded.min(limits.size - offset) as u32;
            Ok(Command::BlockStatus { offset, length, req_one: h.flags & CMD_FLAG_REQ_ONE != 0 })
        }
        _ => unreachable!("command kinds were checked above"),
    }
}

/// Turns a backend allocation map into `base:allocation` descriptors: consecutive, nonzero,
/// 512-byte multiples, not past `requested`, at most [`BLOCK_STATUS_DESCRIPTORS_MAX`] (one with
/// `req_one`). A backend answer that is empty or unaligned degrades to status 0 ("allocated,
/// contents unknown"), which the protocol allows for any block.
pub(crate) fn descriptors(extents: &[Extent], requested: u32, req_one: bool) -> Vec<(u32, u32)> {
    let sector = BLOCK_SIZE_MIN_BYTES as u64;
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut covered = 0u64;
    for extent in extents {
        let left = requested as u64 - covered;
        let length = extent.length.min(left) / sector * sector;
        if length == 0 {
            break;
        }
        let flags =
            if extent.hole { STATE_HOLE } else { 0 } | if extent.zero { STATE_ZERO } else { 0 };
        match out.last_mut() {
            Some(last) if last.1 == flags => last.0 += length as u32,
            _ => {
                if out.len() == BLOCK_STATUS_DESCRIPTORS_MAX {
                    break;
                }
                out.push((length as u32, flags));
            }
        }
        covered += length;
        // A partial (unaligned) extent ends the reply; the client asks again from there.
        if length != extent.length.min(left) || covered == requested as u64 {
            break;
        }
    }
    if out.is_empty() {
        out.push((requested.max(BLOCK_SIZE_MIN_BYTES), 0));
    }
    if req_one {
        out.truncate(1);
    }
    out
}

/// Most replies (or batches of them) the writer gathers for one round of sends.
const REPLY_BATCH_MAX: usize = 64;
/// Buffers one vectored write takes at most (Linux refuses more than 1024).
const IO_SLICES_MAX: usize = 1024;

/// Replies the reader gathers (bytes) before it hands them to the writer without waiting
/// for its buffered requests to run out.
const REPLY_BATCH_BYTES: usize = 256 * 1024;

/// One reply's bytes: its head (the header, or the whole reply) and the data that follows,
/// in the backend's own buffers (see [`Backend::read_parts_async`]), sent without a copy.
#[derive(Debug)]
struct Message {
    head: Vec<u8>,
    data: Vec<Bytes>,
}

impl Message {
    fn len(&self) -> usize {
        self.head.len() + self.data.iter().map(Bytes::len).sum::<usize>()
    }

    /// The buffers to write, empty ones left out.
    fn slices(&self) -> impl Iterator<Item = IoSlice<'_>> {
        std::iter::once(&self.head[..])
            .chain(self.data.iter().map(|d| &d[..]))
            .filter(|b| !b.is_empty())
            .map(IoSlice::new)
    }
}

impl From<Vec<u8>> for Message {
    fn from(head: Vec<u8>) -> Message {
        Message { head, data: Vec::new() }
    }
}

/// One reply, or a batch of them, on its way to the socket, with the permits it keeps until
/// it is sent.
struct Reply {
    messages: Vec<Message>,
    _slot: OwnedSemaphorePermit,
    _budget: Option<OwnedSemaphorePermit>,
}

/// Replies of requests the reader completed itself, not yet handed to the writer.
#[derive(Default)]
struct Batch {
    messages: Vec<Message>,
    bytes: usize,
    slot: Option<OwnedSemaphorePermit>,
    budget: Option<OwnedSemaphorePermit>,
}

impl Batch {
    fn add(
        &mut self,
        message: Message,
        slot: OwnedSemaphorePermit,
        budget: Option<OwnedSemaphorePermit>,
    ) {
        self.bytes += message.len();
        self.messages.push(message);
        match &mut self.slot {
            Some(held) => held.merge(slot),
            None => self.slot = Some(slot),
        }
        match (&mut self.budget, budget) {
            (Some(held), Some(more)) => held.merge(more),
            (held @ None, more) => *held = more,
            (Some(_), None) => {}
        }
    }

    /// Hands the gathered replies to the writer as one.
    async fn send(&mut self, ctx: &Ctx) {
        let Some(slot) = self.slot.take() else { return };
        let messages = std::mem::take(&mut self.messages);
        self.bytes = 0;
        ctx.send_all(messages, slot, self.budget.take()).await;
    }
}

/// Shared by the request tasks of one connection.
struct Ctx {
    backend: Arc<dyn Backend>,
    stats: Arc<ServerStats>,
    structured: bool,
    peer: SocketAddr,
    export_name: String,
    replies: mpsc::Sender<Reply>,
}

impl Ctx {
    fn error_message(&self, handle: u64, errno: NbdErrno, message: &str) -> Vec<u8> {
        bump(&self.stats.errors, 1);
        if self.structured {
            structured_error_chunk(handle, errno, message)
        } else {
            simple_reply_header(errno.code(), handle).to_vec()
        }
    }

    async fn send(
        &self,
        message: Message,
        slot: OwnedSemaphorePermit,
        budget: Option<OwnedSemaphorePermit>,
    ) {
        self.send_all(vec![message], slot, budget).await;
    }

    async fn send_all(
        &self,
        messages: Vec<Message>,
        slot: OwnedSemaphorePermit,
        budget: Option<OwnedSemaphorePermit>,
    ) {
        // Fails only when the writer is gone (client disconnected); the reply has no reader.
        let _ = self.replies.send(Reply { messages, _slot: slot, _budget: budget }).await;
    }
}

enum Ending {
    Disconnect,
    /// The export changed under the connection (see [`Standing`]).
    Revoked(Standing),
    Eof,
    Shutdown,
    WriterGone,
    Violation(String),
    Io(std::io::Error),
}

pub(crate) async fn run(
    shared: &Shared,
    negotiated: Negotiated,
    mut shutdown: watch::Receiver<bool>,
) {
    let Negotiated {
        transport,
        peer,
        initiator,
        export_name,
        export,
        size,
        structured,
        block_status,
    } = negotiated;
    // The check runs here, before the first request, against a subscription taken first, so a
    // change since the handshake looked the export up is seen (the node's gateway, draining a
    // volume, relies on it: a connection listed after its last look serves nothing); then
    // after every later change, in a watcher task.
    let mut changes = shared.exports.watch();
    let first = shared.exports.standing(&export_name, &initiator, &export);
    let (revoked, mut revoked_rx) = watch::channel((first != Standing::Kept).then_some(first));
    let watcher = AbortOnDrop(tokio::spawn({
        let exports = shared.exports.clone();
        let (name, export) = (export_name.clone(), export.clone());
        async move {
            while changes.changed().await.is_ok() {
                let standing = exports.standing(&name, &initiator, &export);
                if standing != Standing::Kept {
                    let _ = revoked.send(Some(standing));
                    return;
                }
            }
        }
    }));
    let config = &shared.config;
    let limits = Limits { size, read_only: export.read_only, structured, block_status };
    let (read_half, write_half) = transport.split();
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, read_half);
    let requests_max = config.in_flight_requests_per_connection_max;
    let (reply_tx, reply_rx) = mpsc::channel::<Reply>(requests_max);
    let writer =
        tokio::spawn(write_replies(write_half, reply_rx, config.reply_write_timeout, peer));
    let slots = Arc::new(Semaphore::new(requests_max));
    let budget = Arc::new(Semaphore::new(config.in_flight_bytes_per_connection_max));
    let ctx = Arc::new(Ctx {
        backend: export.backend.clone(),
        stats: shared.stats.clone(),
        structured,
        peer,
        export_name,
        replies: reply_tx,
    });
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut batch = Batch::default();

    let ending = loop {
        while tasks.try_join_next().is_some() {}
        if reader.buffer().len() < REQUEST_HEADER_BYTES {
            // The next header has to come from the socket: send what is done first.
            batch.send(&ctx).await;
        }
        let mut header = [0u8; REQUEST_HEADER_BYTES];
        // Cancelling the read is fine on these paths: the connection closes either way.
        let read = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => break Ending::Shutdown,
            _ = ctx.replies.closed() => break Ending::WriterGone,
            standing = revoked_by(&mut revoked_rx) => break Ending::Revoked(standing),
            read = reader.read_exact(&mut header) => read,
        };
        if let Err(e) = read {
            break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Ending::Eof
            } else {
                Ending::Io(e)
            };
        }
        bump(&shared.stats.requests, 1);
        let h = match RequestHeader::parse(&header) {
            Ok(h) => h,
            Err(e) => break Ending::Violation(e.to_string()),
        };
        if h.kind == CMD_DISC {
            break Ending::Disconnect;
        }
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                // The batch holds slots of its own; waiting with them held could wait forever.
                batch.send(&ctx).await;
                match slots.clone().acquire_owned().await {
                    Ok(slot) => slot,
                    Err(_) => break Ending::WriterGone,
                }
            }
        };
        if h.kind == CMD_WRITE && h.length > REQUEST_BYTES_MAX {
            // Skipping up to 4 GiB of payload is the denial of service the protocol lets a
            // server refuse: answer, then hang up.
            let message = format!("write of {} bytes exceeds {REQUEST_BYTES_MAX}", h.length);
            let reply = ctx.error_message(h.handle, NbdErrno::Invalid, &message);
            ctx.send(reply.into(), slot, None).await;
            break Ending::Violation(message);
        }
        let command = match validate(&h, &limits) {
            Ok(command) => command,
            Err(refusal) => {
                if h.kind == CMD_WRITE {
                    if reader.buffer().len() < h.length as usize {
                        batch.send(&ctx).await;
                    }
                    let mut payload = (&mut reader).take(h.length as u64);
                    let skipped = tokio::time::timeout(
                        config.payload_read_timeout,
                        tokio::io::copy(&mut payload, &mut tokio::io::sink()),
                    )
                    .await;
                    match skipped {
                        Ok(Ok(n)) if n == h.length as u64 => {}
                        Ok(Ok(_)) => break Ending::Eof,
                        Ok(Err(e)) => break Ending::Io(e),
                        Err(_) => break Ending::Violation("write payload stalled".into()),
                    }
                }
                debug!(peer = %ctx.peer, export = %ctx.export_name, handle = h.handle,
                    error = %refusal.message, "NBD request refused");
                let reply = ctx.error_message(h.handle, refusal.errno, &refusal.message);
                ctx.send(reply.into(), slot, None).await;
                continue;
            }
        };
        let budget_bytes = match command {
            Command::Read { length, .. } | Command::Write { length, .. } => length,
            _ => 0,
        };
        let budget_permit = if budget_bytes > 0 {
            let permit = match budget.clone().try_acquire_many_owned(budget_bytes) {
                Ok(permit) => Ok(permit),
                Err(_) => {
                    batch.send(&ctx).await;
                    budget.clone().acquire_many_owned(budget_bytes).await
                }
            };
            match permit {
                Ok(permit) => Some(permit),
                Err(_) => break Ending::WriterGone,
            }
        } else {
            None
        };
        let payload = if let Command::Write { length, .. } = command {
            // The whole payload is in memory before the backend sees any of it, so a client
            // that vanishes mid-payload never causes a partial write.
            let mut data = Vec::with_capacity(length as usize);
            if reader.buffer().len() < length as usize {
                batch.send(&ctx).await;
            }
            let fill = read_payload(&mut reader, &mut data, length as usize);
            let read = tokio::time::timeout(config.payload_read_timeout, fill).await;
            match read {
                Ok(Ok(_)) => Some(data),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break Ending::Eof,
                Ok(Err(e)) => break Ending::Io(e),
                Err(_) => break Ending::Violation("write payload stalled".into()),
            }
        } else {
            None
        };
        let task_ctx = ctx.clone();
        let mut work =
            Box::pin(async move { execute(&task_ctx, h.handle, command, payload).await });
        // A panic in the backend fails its request (EIO), not the connection, in the reader's
        // poll and in a task alike.
        let panicked = {
            let ctx = ctx.clone();
            move || {
                warn!(peer = %ctx.peer, export = %ctx.export_name, ?command, "NBD backend panicked");
                Message::from(ctx.error_message(h.handle, NbdErrno::Io, "the backend failed"))
            }
        };
        // One poll here: a request served from memory completes in it and joins the batch. A
        // large read goes to a task at once, so another worker can copy and check it while this
        // one reads the next request.
        let polled = if matches!(command, Command::Read { length, .. } if length as usize > REPLY_BATCH_BYTES)
        {
            Poll::Pending
        } else {
            std::future::poll_fn(|cx| Poll::Ready(poll_caught(work.as_mut(), cx))).await
        };
        match polled {
            Poll::Ready(done) => {
                let message = done.unwrap_or_else(|()| panicked());
                if message.len() <= REPLY_BATCH_BYTES {
                    batch.add(message, slot, budget_permit);
                    if batch.bytes >= REPLY_BATCH_BYTES {
                        batch.send(&ctx).await;
                    }
                } else {
                    ctx.send(message, slot, budget_permit).await;
                }
            }
            Poll::Pending => {
                let ctx = ctx.clone();
                tasks.spawn(async move {
                    let message = std::future::poll_fn(|cx| poll_caught(work.as_mut(), cx))
                        .await
                        .unwrap_or_else(|()| panicked());
                    ctx.send(message, slot, budget_permit).await;
                });
            }
        }
    };
    batch.send(&ctx).await;

    match &ending {
        Ending::Disconnect => debug!(%peer, "NBD client disconnected"),
        Ending::Eof => debug!(%peer, "NBD client closed the connection"),
        Ending::Shutdown => debug!(%peer, "NBD connection closing for shutdown"),
        Ending::Revoked(standing) => {
            bump(&shared.stats.connections_revoked, 1);
            info!(%peer, export = %ctx.export_name, reason = standing.reason(),
                "NBD connection closing: its export changed")
        }
        Ending::WriterGone => debug!(%peer, "NBD reply writer stopped"),
        Ending::Io(e) => debug!(%peer, error = %e, "NBD connection read failed"),
        Ending::Violation(why) => {
            bump(&shared.stats.protocol_violations, 1);
            warn!(%peer, export = %ctx.export_name, reason = %why, "NBD client broke the protocol; disconnecting");
        }
    }
    // In-flight requests finish (their payloads are complete) and their replies are sent
    // before the connection closes, as the protocol asks for NBD_CMD_DISC and shutdown.
    while tasks.join_next().await.is_some() {}
    // Nothing of the connection holds the backend past this point: a volume being deleted or
    // rolled back waits only for the requests, not for the client to close.
    drop((ctx, watcher, export));
    if let Err(e) = writer.await {
        warn!(%peer, error = %e, "NBD reply writer panicked");
    }
    // The writer has sent every reply and shut its side. Closing with requests of a pipelining
    // client still unread would reset the connection, and the kernel would drop replies not yet
    // delivered: read until the client closes too (bounded).
    let linger = async {
        let mut sink = vec![0u8; 64 << 10];
        while matches!(reader.read(&mut sink).await, Ok(n) if n > 0) {}
    };
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, linger).await;
}

/// Waits until the connection's export watcher finds it may not go on.
async fn revoked_by(watcher: &mut watch::Receiver<Option<Standing>>) -> Standing {
    let verdict = watcher.wait_for(Option::is_some).await.map(|standing| *standing);
    match verdict {
        Ok(standing) => standing.unwrap_or(Standing::Removed),
        // The watcher stopped without a verdict (the exports are gone with the server).
        Err(_) => std::future::pending().await,
    }
}

/// Aborts the task when dropped: the export watcher lives as long as its connection.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Polls `work` once; a panic in it is `Ready(Err(()))`.
fn poll_caught<F: Future<Output = Message> + ?Sized>(
    work: Pin<&mut F>,
    cx: &mut Context<'_>,
) -> Poll<Result<Message, ()>> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| work.poll(cx))) {
        Ok(Poll::Ready(message)) => Poll::Ready(Ok(message)),
        Ok(Poll::Pending) => Poll::Pending,
        Err(_) => Poll::Ready(Err(())),
    }
}

/// Reads exactly `len` bytes into `data`'s spare room, with no zeroing of a buffer first; a
/// stream that ends before is `UnexpectedEof`.
async fn read_payload<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    data: &mut Vec<u8>,
    len: usize,
) -> std::io::Result<()> {
    while data.len() < len {
        let want = (len - data.len()) as u64;
        if (&mut *reader).take(want).read_buf(data).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

async fn execute(ctx: &Ctx, handle: u64, command: Command, payload: Option<Vec<u8>>) -> Message {
    let backend = ctx.backend.clone();
    let structured = ctx.structured;
    let result = match run_async(&*backend, handle, command, &payload, structured).await {
        Some(result) => result,
        None => tokio::task::spawn_blocking(move || {
            run_blocking(&*backend, handle, command, payload, structured)
        })
        .await
        .unwrap_or_else(|e| Err(BackendError::io(format!("backend task failed: {e}")))),
    };
    match result {
        Ok(Done { message, bytes_read, bytes_written }) => {
            bump(&ctx.stats.bytes_read, bytes_read);
            bump(&ctx.stats.bytes_written, bytes_written);
            message
        }
        Err(e) => {
            warn!(peer = %ctx.peer, export = %ctx.export_name, ?command, error = %e, "NBD backend request failed");
            ctx.error_message(handle, e.nbd_errno(), &e.message).into()
        }
    }
}

struct Done {
    message: Message,
    bytes_read: u64,
    bytes_written: u64,
}

fn ok(handle: u64) -> Done {
    Done {
        message: simple_reply_header(0, handle).to_vec().into(),
        bytes_read: 0,
        bytes_written: 0,
    }
}

/// Reads and writes through the backend's asynchronous path, when it has one; `None` sends
/// the request to the blocking pool instead.
async fn run_async(
    backend: &dyn Backend,
    handle: u64,
    command: Command,
    payload: &Option<Vec<u8>>,
    structured: bool,
) -> Option<Result<Done, BackendError>> {
    match command {
        Command::Read { offset, length } if length > 0 => {
            if let Some(parts) = backend.read_parts_async(offset, length as usize) {
                return Some(parts.await.and_then(|data| {
                    let got: usize = data.iter().map(Bytes::len).sum();
                    if got != length as usize {
                        let why =
                            format!("the backend returned {got} bytes for a read of {length}");
                        return Err(BackendError::io(why));
                    }
                    let head = read_reply_head(handle, offset, length as usize, structured);
                    let message = Message { head, data };
                    Ok(Done { message, bytes_read: length as u64, bytes_written: 0 })
                }));
            }
            let (mut message, prefix) = read_reply_buffer(length as usize, structured);
            if let Err(e) = backend.read_async(offset, &mut message[prefix..])?.await {
                return Some(Err(e));
            }
            Some(Ok(read_reply_done(message, handle, offset, structured)))
        }
        Command::Write { offset, length, fua } if length > 0 => {
            let data = payload.as_deref().unwrap_or_default();
            assert_eq!(data.len(), length as usize, "write payload was read in full");
            let result = backend.write_async(offset, data, fua)?.await;
            Some(result.map(|()| Done { bytes_written: length as u64, ..ok(handle) }))
        }
        Command::Trim { offset, length } if length > 0 => {
            Some(backend.trim_async(offset, length as u64)?.await.map(|()| ok(handle)))
        }
        Command::WriteZeroes { offset, length, may_trim, fua } if length > 0 => {
            let zeroed = backend.write_zeroes_async(offset, length as u64, may_trim, fua)?.await;
            Some(zeroed.map(|()| ok(handle)))
        }
        _ => None,
    }
}

/// A READ reply with room for `length` bytes of data after its header, and where they start.
/// A structured reply carries the data as one OFFSET_DATA chunk (at most 32 MiB), so DF holds.
fn read_reply_buffer(length: usize, structured: bool) -> (Vec<u8>, usize) {
    let prefix = read_reply_prefix(structured);
    (vec![0u8; prefix + length], prefix)
}

/// Bytes of a READ reply before its data.
fn read_reply_prefix(structured: bool) -> usize {
    if structured { OFFSET_DATA_PREFIX_BYTES } else { SIMPLE_REPLY_HEADER_BYTES }
}

/// The header of a READ reply carrying `length` bytes of data: as many bytes as
/// [`read_reply_buffer`] leaves before the data.
fn read_reply_head(handle: u64, offset: u64, length: usize, structured: bool) -> Vec<u8> {
    if structured {
        let mut head = Vec::with_capacity(OFFSET_DATA_PREFIX_BYTES);
        head.extend_from_slice(&structured_reply_header(
            REPLY_FLAG_DONE,
            REPLY_TYPE_OFFSET_DATA,
            handle,
            (8 + length) as u32,
        ));
        head.extend_from_slice(&offset.to_be_bytes());
        head
    } else {
        simple_reply_header(0, handle).to_vec()
    }
}

/// Fills in the header of a READ reply whose data the backend has written.
fn read_reply_done(mut message: Vec<u8>, handle: u64, offset: u64, structured: bool) -> Done {
    let prefix = read_reply_prefix(structured);
    let length = message.len() - prefix;
    message[..prefix].copy_from_slice(&read_reply_head(handle, offset, length, structured));
    Done { message: message.into(), bytes_read: length as u64, bytes_written: 0 }
}

/// Runs on the blocking pool: one backend call and the encoded success reply.
fn run_blocking(
    backend: &dyn Backend,
    handle: u64,
    command: Command,
    payload: Option<Vec<u8>>,
    structured: bool,
) -> Result<Done, BackendError> {
    match command {
        Command::Read { offset, length } => {
            let length = length as usize;
            if structured && length == 0 {
                let message =
                    structured_reply_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, handle, 0).to_vec();
                return Ok(Done { message: message.into(), bytes_read: 0, bytes_written: 0 });
            }
            let (mut message, prefix) = read_reply_buffer(length, structured);
            if length > 0 {
                backend.read(offset, &mut message[prefix..])?;
            }
            Ok(read_reply_done(message, handle, offset, structured))
        }
        Command::Write { offset, length, fua } => {
            let data = payload.unwrap_or_default();
            assert_eq!(data.len(), length as usize, "write payload was read in full");
            if length > 0 {
                backend.write(offset, &data, fua)?;
            }
            Ok(Done { bytes_written: length as u64, ..ok(handle) })
        }
        Command::Flush => {
            backend.flush()?;
            Ok(ok(handle))
        }
        Command::Trim { offset, length } => {
            if length > 0 {
                backend.trim(offset, length as u64)?;
            }
            Ok(ok(handle))
        }
        Command::WriteZeroes { offset, length, may_trim, fua } => {
            if length > 0 {
                backend.write_zeroes(offset, length as u64, may_trim, fua)?;
            }
            Ok(ok(handle))
        }
        Command::BlockStatus { offset, length, req_one } => {
            let extents = backend.block_status(offset, length as u64)?;
            let descriptors = descriptors(&extents, length, req_one);
            let message = block_status_chunk(handle, META_BASE_ALLOCATION_ID, &descriptors);
            Ok(Done { message: message.into(), bytes_read: 0, bytes_written: 0 })
        }
        Command::Disconnect => unreachable!("disconnect is handled by the reader"),
    }
}

async fn write_replies(
    mut writer: WriteHalf,
    mut replies: mpsc::Receiver<Reply>,
    timeout: Duration,
    peer: SocketAddr,
) {
    let mut batch: Vec<Reply> = Vec::new();
    while let Some(first) = replies.recv().await {
        // Every reply already queued goes out with this one, in vectored writes: a busy
        // connection pays one send for many replies and copies none of them.
        batch.push(first);
        while batch.len() < REPLY_BATCH_MAX {
            match replies.try_recv() {
                Ok(reply) => batch.push(reply),
                Err(_) => break,
            }
        }
        let messages = batch.iter().flat_map(|r| &r.messages);
        let mut slices: Vec<IoSlice<'_>> = messages.flat_map(Message::slices).collect();
        let mut sent = write_all_vectored(&mut writer, &mut slices, timeout).await;
        // Flush (TLS records) before going idle.
        if sent.is_ok() && replies.is_empty() {
            sent = match tokio::time::timeout(timeout, writer.flush()).await {
                Ok(flushed) => flushed,
                Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
            };
        }
        // The replies are out: their permits go back to the reader.
        batch.clear();
        match sent {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                warn!(%peer, timeout_s = timeout.as_secs_f64(),
                    "NBD client is not reading replies; disconnecting");
                break;
            }
            Err(e) => {
                debug!(%peer, error = %e, "NBD reply write failed");
                break;
            }
        }
    }
    // Dropping the receiver tells the reader (and every pending sender) to stop.
    drop(replies);
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.shutdown()).await;
}

/// Writes every byte of `slices`, in vectored writes of at most [`IO_SLICES_MAX`] buffers (a
/// transport without vectored writes gets them joined into one buffer). Each write must make
/// progress within `timeout`, else `TimedOut`: a slow reader is served, one that stopped is not.
async fn write_all_vectored(
    writer: &mut WriteHalf,
    slices: &mut [IoSlice<'_>],
    timeout: Duration,
) -> std::io::Result<()> {
    if !writer.is_write_vectored() && slices.len() > 1 {
        let joined: Vec<u8> = slices.iter().flat_map(|s| s.iter().copied()).collect();
        return write_slices(writer, &mut [IoSlice::new(&joined)], timeout).await;
    }
    write_slices(writer, slices, timeout).await
}

async fn write_slices(
    writer: &mut WriteHalf,
    mut slices: &mut [IoSlice<'_>],
    timeout: Duration,
) -> std::io::Result<()> {
    while !slices.is_empty() {
        let take = slices.len().min(IO_SLICES_MAX);
        let written =
            match tokio::time::timeout(timeout, writer.write_vectored(&slices[..take])).await {
                Ok(written) => written?,
                Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
            };
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, written);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: u64 = 1 << 20;

    fn limits() -> Limits {
        Limits { size: SIZE, read_only: false, structured: true, block_status: true }
    }

    fn req(kind: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader { flags, kind, handle: 1, offset, length }
    }

    fn errno(r: Result<Command, Refused>) -> NbdErrno {
        r.expect_err("should be refused").errno
    }

    #[test]
    fn good_requests_pass() {
        assert_eq!(
            validate(&req(CMD_READ, CMD_FLAG_DF, 4096, 4096), &limits()),
            Ok(Command::Read { offset: 4096, length: 4096 })
        );
        assert_eq!(
            validate(&req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE | CMD_FLAG_FUA, 0, 512), &limits()),
            Ok(Command::WriteZeroes { offset: 0, length: 512, may_trim: false, fua: true })
        );
        assert_eq!(
            validate(&req(CMD_WRITE, 0, SIZE - 512, 512), &limits()),
            Ok(Command::Write { offset: SIZE - 512, length: 512, fua: false })
        );
        // Zeroing more than the maximum block size is accepted (no payload, no memory).
        let big = Limits { size: 1 << 33, ..limits() };
        let zero_len = 4 * REQUEST_BYTES_MAX;
        assert_eq!(
            validate(&req(CMD_WRITE_ZEROES, 0, 0, zero_len), &big),
            Ok(Command::WriteZeroes { offset: 0, length: zero_len, may_trim: true, fua: false })
        );
    }

    #[test]
    fn size_alignment_and_range_errors_follow_the_protocol() {
        let l = limits();
        assert_eq!(
            errno(validate(&req(CMD_READ, 0, 0, REQUEST_BYTES_MAX + 512), &l)),
            NbdErrno::Invalid
        );
        assert_eq!(errno(validate(&req(CMD_READ, 0, 100, 512), &l)), NbdErrno::Invalid);
        assert_eq!(errno(validate(&req(CMD_WRITE, 0, 0, 100), &l)), NbdErrno::Invalid);
        assert_eq!(errno(validate(&req(CMD_READ, 0, SIZE, 512), &l)), NbdErrno::Invalid);
        assert_eq!(errno(validate(&req(CMD_TRIM, 0, SIZE, 512), &l)), NbdErrno::Invalid);
        assert_eq!(errno(validate(&req(CMD_WRITE, 0, SIZE, 512), &l)), NbdErrno::NoSpace);
        assert_eq!(
            errno(validate(&req(CMD_WRITE_ZEROES, 0, SIZE - 512, 1024), &l)),
            NbdErrno::NoSpace
        );
        // Offsets near u64::MAX must not wrap around into range.
        assert_eq!(errno(validate(&req(CMD_READ, 0, u64::MAX - 511, 512), &l)), NbdErrno::Invalid);
    }

    #[test]
    fn flags_and_commands_are_checked() {
        let l = limits();
        assert_eq!(errno(validate(&req(99, 0, 0, 0), &l)), NbdErrno::Invalid);
        assert_eq!(errno(validate(&req(5, 0, 0, 512), &l)), NbdErrno::Invalid); // CACHE: not offered
        assert_eq!(errno(validate(&req(CMD_WRITE, CMD_FLAG_DF, 0, 512), &l)), NbdErrno::Invalid);
        assert_eq!(errno(validate(&req(CMD_READ, 1 << 9, 0, 512), &l)), NbdErrno::Invalid);
        let simple = Limits { structured: false, ..l };
        assert_eq!(
            errno(validate(&req(CMD_READ, CMD_FLAG_DF, 0, 512), &simple)),
            NbdErrno::Invalid
        );
    }

    #[test]
    fn read_only_exports_refuse_every_kind_of_write() {
        let l = Limits { read_only: true, ..limits() };
        for kind in [CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES] {
            assert_eq!(errno(validate(&req(kind, 0, 0, 512), &l)), NbdErrno::Perm);
        }
        assert!(validate(&req(CMD_READ, 0, 0, 512), &l).is_ok());
        assert!(validate(&req(CMD_FLUSH, 0, 0, 0), &l).is_ok());
    }

    #[test]
    fn block_status_needs_a_context_and_rounds_its_hint() {
        let without = Limits { block_status: false, ..limits() };
        assert_eq!(errno(validate(&req(CMD_BLOCK_STATUS, 0, 0, 512), &without)), NbdErrno::Invalid);
        assert_eq!(
            validate(
                &req(CMD_BLOCK_STATUS, 0, 0, i32::MAX as u32),
                &Limits { size: 1 << 32, ..limits() }
            ),
            Ok(Command::BlockStatus { offset: 0, length: 1 << 31, req_one: false })
        );
        assert_eq!(
            validate(&req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, SIZE - 512, 100), &limits()),
            Ok(Command::BlockStatus { offset: SIZE - 512, length: 512, req_one: true })
        );
        assert_eq!(
            errno(validate(&req(CMD_BLOCK_STATUS, 0, SIZE, 512), &limits())),
            NbdErrno::Invalid
        );
    }

    fn ext(length: u64, hole: bool, zero: bool) -> Extent {
        Extent { length, hole, zero }
    }

    #[test]
    fn descriptors_are_clipped_merged_and_aligned() {
        let map = [ext(4096, false, false), ext(4096, false, false), ext(8192, true, true)];
        assert_eq!(
            descriptors(&map, 12288, false),
            vec![(8192, 0), (4096, STATE_HOLE | STATE_ZERO)]
        );
        assert_eq!(descriptors(&map, 12288, true), vec![(8192, 0)]);
        // An unaligned backend extent ends the reply at the last whole sector.
        let odd = [ext(1000, false, false), ext(4096, true, true)];
        assert_eq!(descriptors(&odd, 8192, false), vec![(512, 0)]);
        // Nothing usable: the whole range as "allocated, unknown".
        assert_eq!(descriptors(&[], 4096, false), vec![(4096, 0)]);
        assert_eq!(descriptors(&[ext(100, true, true)], 4096, false), vec![(4096, 0)]);
    }

    #[test]
    fn descriptors_are_capped() {
        let map: Vec<Extent> =
            (0..BLOCK_STATUS_DESCRIPTORS_MAX + 10).map(|i| ext(512, i % 2 == 0, false)).collect();
        let out = descriptors(&map, u32::MAX / 512 * 512, false);
        assert_eq!(out.len(), BLOCK_STATUS_DESCRIPTORS_MAX);
    }
}
