//! The io_uring backend: one thread per drive owns a ring and everything in flight on it.
//!
//! Submitters validate a request and push it onto the drive's [`RequestQueue`]; the thread moves
//! queued requests into the ring (up to the queue depth), submits them together, and completes
//! tickets as completions arrive. An eventfd polled through the ring itself wakes the thread
//! when a request arrives while it waits for completions, so it has one place to sleep.
//!
//! It owns the buffers of in-flight requests and must never free one while the kernel may still
//! use it: if the thread ever exits with requests in flight (a bug or a dead ring) their buffers
//! are leaked, not freed. It never completes a read or write with fewer bytes than asked.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::{IoUring, opcode, types};

use crate::file::DriveFile;
use crate::request_queue::{Request, RequestQueue, Taken};
use crate::{
    AlignedBuf, BlockDevice, Completer, DriveStats, IoDone, IoError, IoOp, IoTicket, OpKind,
    check_request,
};

/// user_data of the eventfd poll; slab keys are small, so it cannot collide with one.
const WAKE_TOKEN: u64 = u64::MAX;
/// Times one request is resubmitted after a short transfer or EAGAIN/EINTR before it fails.
/// A healthy device needs at most one or two; more means something is wrong underneath.
const RESUBMITS_MAX: u32 = 16;
/// Consecutive failed `io_uring_enter` calls tolerated (with a pause between) before the ring
/// is declared dead.
const ENTER_FAILURES_MAX: u32 = 1000;
const ENTER_RETRY_PAUSE: Duration = Duration::from_millis(1);

#[derive(Debug)]
pub(crate) struct UringDevice {
    drive: Arc<DriveFile>,
    queue: Arc<RequestQueue>,
    wake: Arc<OwnedFd>,
    stats: Arc<DriveStats>,
    thread: Option<JoinHandle<()>>,
}

impl UringDevice {
    /// Sets up the ring and starts the drive's thread. Fails if the kernel refuses io_uring or
    /// lacks an operation we use, so the caller can fall back to the thread pool.
    pub(crate) fn start(drive: Arc<DriveFile>, queue_depth: u32) -> io::Result<UringDevice> {
        // One extra entry for the wake-up poll, which is always armed while the thread sleeps.
        let ring: IoUring = IoUring::builder().build(queue_depth + 1)?;
        check_opcodes(&ring)?;

        // SAFETY: eventfd takes only integer flags and returns a new descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw == -1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh descriptor nobody else owns.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });

        let queue = Arc::new(RequestQueue::default());
        let stats = Arc::new(DriveStats::default());
        let depth = queue_depth as usize;
        let reaper = Reaper {
            ring,
            drive: drive.clone(),
            queue: queue.clone(),
            wake: wake.clone(),
            stats: stats.clone(),
            slab: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            in_flight: 0,
            resubmit: Vec::with_capacity(depth),
            poll_armed: false,
            completions: Vec::with_capacity(depth + 1),
            intake: Vec::with_capacity(depth),
        };
        let thread =
            std::thread::Builder::new().name("stria-uring".into()).spawn(move || reaper.run())?;
        Ok(UringDevice { drive, queue, wake, stats, thread: Some(thread) })
    }
}

/// Old kernels (before 5.6) set up rings but lack plain read/write; finding out here lets the
/// caller fall back instead of failing every request later.
fn check_opcodes(ring: &IoUring) -> io::Result<()> {
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    let needed =
        [opcode::Read::CODE, opcode::Write::CODE, opcode::Fsync::CODE, opcode::PollAdd::CODE];
    if needed.iter().all(|&code| probe.is_supported(code)) {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::Unsupported, "kernel io_uring lacks read/write/fsync"))
    }
}

fn wake(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64. The only failure is EAGAIN when the counter is
    // saturated, and then the thread is certainly going to wake anyway.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), size_of::<u64>()) };
}

impl BlockDevice for UringDevice {
    fn name(&self) -> &str {
        &self.drive.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.drive.capacity_bytes
    }

    fn submit(&self, op: IoOp) -> IoTicket {
        let started = std::time::Instant::now();
        if let Err(e) = check_request(&self.drive.name, self.drive.capacity_bytes, &op) {
            self.stats.record(op.kind(), 0, started.elapsed(), false);
            return IoTicket::ready(Err(e));
        }
        let (ticket, completer) = IoTicket::pending(&self.drive.name);
        // Only the push that finds the queue empty must wake the thread: it takes everything
        // queued each time it looks, and leaves requests behind only when its ring is full, in
        // which case a completion is coming and it will look again.
        if self.queue.push(Request { op, completer, started }) {
            wake(&self.wake);
        }
        ticket
    }

    fn stats(&self) -> &DriveStats {
        &self.stats
    }

    fn backend(&self) -> &'static str {
        if self.drive.direct { "io_uring+O_DIRECT" } else { "io_uring (buffered)" }
    }
}

impl Drop for UringDevice {
    fn drop(&mut self) {
        self.queue.stop();
        wake(&self.wake);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!(drive = %self.drive.name, "io_uring thread panicked");
        }
    }
}

/// A request the kernel is working on.
#[derive(Debug)]
struct InFlight {
    kind: OpKind,
    offset: u64,
    /// The read destination or write source; empty for a flush. Its heap memory never moves,
    /// so SQEs may point into it while the InFlight itself moves around.
    buf: AlignedBuf,
    /// Bytes transferred so far; short transfers resubmit from here.
    done: usize,
    fua: bool,
    resubmits: u32,
    completer: Completer,
    started: std::time::Instant,
}

/// The state owned by a drive's io_uring thread.
struct Reaper {
    ring: IoUring,
    drive: Arc<DriveFile>,
    queue: Arc<RequestQueue>,
    wake: Arc<OwnedFd>,
    stats: Arc<DriveStats>,
    /// In-flight requests by slab key (the SQE's user_data).
    slab: Vec<Option<InFlight>>,
    free: Vec<usize>,
    in_flight: usize,
    /// Keys whose remainder (or retry) must be pushed again.
    resubmit: Vec<usize>,
    poll_armed: bool,
    completions: Vec<(u64, i32)>,
    intake: Vec<Request>,
}

impl Reaper {
    fn run(mut self) {
        let mut stopping = false;
        let mut enter_failures = 0;
        loop {
            if !stopping {
                stopping = self.take_requests();
            }
            self.push_resubmits();
            if stopping && self.in_flight == 0 {
                return;
            }
            if !stopping && !self.poll_armed {
                self.arm_wake_poll();
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => enter_failures = 0,
                // EINTR: a signal; EBUSY: completions must be reaped before more can be
                // submitted, which the reap below does.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => {
                    enter_failures += 1;
                    if enter_failures >= ENTER_FAILURES_MAX {
                        tracing::error!(
                            drive = %self.drive.name,
                            error = %e,
                            in_flight = self.in_flight,
                            "io_uring submission keeps failing; stopping the drive"
                        );
                        // Later submits are refused as abandoned; Drop leaks what is in flight.
                        self.queue.stop();
                        return;
                    }
                    std::thread::sleep(ENTER_RETRY_PAUSE);
                }
            }
            self.reap();
        }
    }

    /// Moves queued requests into the ring until the queue is empty or the ring is full.
    /// Returns true once the device is stopping.
    fn take_requests(&mut self) -> bool {
        loop {
            let room = self.free.len();
            if room == 0 {
                return false;
            }
            let mut intake = std::mem::take(&mut self.intake);
            let taken = self.queue.take(room, &mut intake);
            for request in intake.drain(..) {
                self.start(request);
            }
            self.intake = intake;
            match taken {
                Taken::Stopping => return true,
                Taken::Drained => return false,
                // Requests completed on the spot (discards, empty transfers) used no slot, so
                // there may be room for the rest.
                Taken::More => {}
            }
        }
    }

    fn start(&mut self, request: Request) {
        let Request { op, completer, started } = request;
        let kind = op.kind();
        let (offset, buf, fua) = match op {
            // Handed on only when the kernel has filled all of it (`completed`).
            IoOp::Read { offset, len } => (offset, AlignedBuf::for_read(len), false),
            IoOp::Write { offset, data, fua } => (offset, data, fua),
            IoOp::Flush => (0, AlignedBuf::zeroed(0), false),
            IoOp::Discard { offset, len } => {
                // Hole punching and BLKDISCARD are quick metadata operations; doing them here
                // keeps the ring code to reads, writes and fsync.
                let outcome = self
                    .drive
                    .discard(offset, len)
                    .map(|()| IoDone::Done)
                    .map_err(|e| self.drive.os_error(OpKind::Discard, offset, e));
                self.stats.record(kind, 0, started.elapsed(), outcome.is_ok());
                completer.complete(outcome);
                return;
            }
        };
        if kind != OpKind::Flush && buf.is_empty() {
            // A zero-length read would look like end-of-file to the completion code.
            self.stats.record(kind, 0, started.elapsed(), true);
            let done = if kind == OpKind::Read { IoDone::Read(buf) } else { IoDone::Done };
            completer.complete(Ok(done));
            return;
        }
        let Some(key) = self.free.pop() else {
            unreachable!("take_requests takes no more requests than there are free slots");
        };
        self.slab[key] =
            Some(InFlight { kind, offset, buf, done: 0, fua, resubmits: 0, completer, started });
        self.in_flight += 1;
        self.resubmit.push(key);
    }

    /// Pushes an SQE for every key waiting to go (new requests and remainders). There is always
    /// room: the SQ has depth + 1 entries and each slot has at most one SQE outstanding.
    fn push_resubmits(&mut self) {
        let fd = types::Fd(self.drive.fd());
        while let Some(key) = self.resubmit.pop() {
            let Some(op) = self.slab[key].as_mut() else { continue };
            let remaining = (op.buf.len() - op.done) as u32;
            let entry = match op.kind {
                OpKind::Read => {
                    // SAFETY: done < len, so the pointer stays inside the buffer.
                    let ptr = unsafe { op.buf.as_mut_ptr().add(op.done) };
                    opcode::Read::new(fd, ptr, remaining).offset(op.offset + op.done as u64).build()
                }
                OpKind::Write => {
                    // SAFETY: as above.
                    let ptr = unsafe { op.buf.as_ptr().add(op.done) };
                    let flags = if op.fua { libc::RWF_DSYNC } else { 0 };
                    opcode::Write::new(fd, ptr, remaining)
                        .offset(op.offset + op.done as u64)
                        .rw_flags(flags)
                        .build()
                }
                OpKind::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
                OpKind::Discard => unreachable!("discards complete in start"),
            };
            // SAFETY: the buffer lives in the slab until this key's completion is reaped, and
            // is leaked rather than freed if the thread exits before that.
            if unsafe { self.ring.submission().push(&entry.user_data(key as u64)) }.is_err() {
                // Cannot happen given the sizing above; if it does, try again after the next
                // submit has emptied the queue rather than lose the request.
                tracing::error!(drive = %self.drive.name, "io_uring submission queue full");
                self.resubmit.push(key);
                return;
            }
        }
    }

    fn arm_wake_poll(&mut self) {
        let entry = opcode::PollAdd::new(types::Fd(self.wake.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(WAKE_TOKEN);
        // SAFETY: the poll references only the eventfd, which this thread keeps open.
        if unsafe { self.ring.submission().push(&entry) }.is_ok() {
            self.poll_armed = true;
        }
    }

    fn reap(&mut self) {
        let mut completions = std::mem::take(&mut self.completions);
        completions.extend(self.ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
        for &(user_data, result) in &completions {
            if user_data == WAKE_TOKEN {
                self.poll_armed = false;
                let mut count: u64 = 0;
                // SAFETY: reads 8 bytes into a live u64. EAGAIN (already reset) is fine: we only
                // read to clear the counter so the next poll waits for a new request.
                unsafe { libc::read(self.wake.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
            } else {
                self.completed(user_data as usize, result);
            }
        }
        completions.clear();
        self.completions = completions;
    }

    fn completed(&mut self, key: usize, result: i32) {
        let Some(op) = self.slab.get_mut(key).and_then(Option::as_mut) else {
            tracing::error!(drive = %self.drive.name, key, "completion for unknown request");
            return;
        };
        let position = op.offset + op.done as u64;
        if result < 0 {
            let errno = -result;
            if matches!(errno, libc::EAGAIN | libc::EINTR) && op.resubmits < RESUBMITS_MAX {
                op.resubmits += 1;
                self.resubmit.push(key);
                return;
            }
            let error = self.drive.os_error(op.kind, position, io::Error::from_raw_os_error(errno));
            self.finish(key, Err(error));
            return;
        }
        if op.kind == OpKind::Flush {
            self.finish(key, Ok(IoDone::Done));
            return;
        }
        let moved = result as usize;
        op.done += moved;
        if op.done >= op.buf.len() {
            self.finish(key, Ok(IoDone::Done));
            return;
        }
        // A short transfer: the device ended early, or the kernel split the request.
        if moved == 0 || op.resubmits >= RESUBMITS_MAX {
            let (kind, message) = match op.kind {
                OpKind::Read => (io::ErrorKind::UnexpectedEof, "read ended early"),
                _ => (io::ErrorKind::WriteZero, "write ended early"),
            };
            let source = io::Error::new(
                kind,
                format!("{message}: {} of {} bytes transferred", op.done, op.buf.len()),
            );
            let error = self.drive.os_error(op.kind, position, source);
            self.finish(key, Err(error));
            return;
        }
        op.resubmits += 1;
        self.resubmit.push(key);
    }

    fn finish(&mut self, key: usize, outcome: Result<IoDone, IoError>) {
        let Some(op) = self.slab[key].take() else { return };
        self.free.push(key);
        self.in_flight -= 1;
        let ok = outcome.is_ok();
        // A flush carries an empty buffer, so it moves 0 bytes here as everywhere else.
        let bytes = if ok { op.buf.len() } else { 0 };
        self.stats.record(op.kind, bytes, op.started.elapsed(), ok);
        let outcome = match outcome {
            Ok(_) if op.kind == OpKind::Read => Ok(IoDone::Read(op.buf)),
            other => other,
        };
        op.completer.complete(outcome);
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // Only reached with requests in flight if the thread is giving up on a broken ring. The
        // kernel may still write into their buffers, so leak those instead of freeing them; the
        // completers still fail their tickets.
        for op in self.slab.iter_mut().filter_map(Option::take) {
            std::mem::forget(op.buf);
            drop(op.completer);
        }
    }
}
