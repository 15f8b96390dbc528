//! The fallback backend for kernels or containers that refuse io_uring: a few worker threads per
//! drive doing blocking pread/pwrite, fdatasync and discard.
//!
//! It owns its workers and nothing else; the queue and locking are shared with the io_uring
//! backend. Like it, it never completes a read or write with fewer bytes than asked, and a
//! request still queued when the device is dropped fails as abandoned rather than running.

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::file::DriveFile;
use crate::request_queue::{Request, RequestQueue};
use crate::{AlignedBuf, BlockDevice, DriveStats, IoDone, IoOp, IoTicket, check_request};

#[derive(Debug)]
pub(crate) struct PoolDevice {
    drive: Arc<DriveFile>,
    queue: Arc<RequestQueue>,
    stats: Arc<DriveStats>,
    workers: Vec<JoinHandle<()>>,
}

impl PoolDevice {
    pub(crate) fn start(drive: Arc<DriveFile>, threads: usize) -> io::Result<PoolDevice> {
        let queue = Arc::new(RequestQueue::default());
        let stats = Arc::new(DriveStats::default());
        let mut device = PoolDevice { drive, queue, stats, workers: Vec::with_capacity(threads) };
        for _ in 0..threads {
            let (drive, queue, stats) =
                (device.drive.clone(), device.queue.clone(), device.stats.clone());
            // On failure `device` drops here, which stops and joins the workers already started.
            let worker =
                std::thread::Builder::new().name("stria-io-pool".into()).spawn(move || {
                    while let Some(request) = queue.take_one_waiting() {
                        execute(&drive, &stats, request);
                    }
                })?;
            device.workers.push(worker);
        }
        Ok(device)
    }
}

fn execute(drive: &DriveFile, stats: &DriveStats, request: Request) {
    let Request { op, completer, started } = request;
    let kind = op.kind();
    let (outcome, bytes) = match op {
        IoOp::Read { offset, len } => {
            let mut buf = AlignedBuf::zeroed(len);
            // read_exact_at retries short reads and EINTR and fails on end-of-file, so a
            // partial buffer is never returned as success.
            match drive.file.read_exact_at(&mut buf, offset) {
                Ok(()) => (Ok(IoDone::Read(buf)), len),
                Err(e) => (Err(drive.os_error(kind, offset, e)), 0),
            }
        }
        IoOp::Write { offset, data, fua } => match write_all_at(drive, &data, offset, fua) {
            Ok(()) => (Ok(IoDone::Done), data.len()),
            Err(e) => (Err(drive.os_error(kind, offset, e)), 0),
        },
        IoOp::Flush => match drive.file.sync_data() {
            Ok(()) => (Ok(IoDone::Done), 0),
            Err(e) => (Err(drive.os_error(kind, 0, e)), 0),
        },
        IoOp::Discard { offset, len } => match drive.discard(offset, len) {
            Ok(()) => (Ok(IoDone::Done), 0),
            Err(e) => (Err(drive.os_error(kind, offset, e)), 0),
        },
    };
    stats.record(kind, bytes, started.elapsed(), outcome.is_ok());
    completer.complete(outcome);
}

/// Writes all of `data`; with `fua`, each pwritev2 carries RWF_DSYNC so the data is stable when
/// it returns. Kernels without pwritev2 flags get a plain write followed by fdatasync, which
/// gives the same promise for this range (and more).
fn write_all_at(drive: &DriveFile, data: &[u8], offset: u64, fua: bool) -> io::Result<()> {
    if !fua {
        return drive.file.write_all_at(data, offset);
    }
    let mut done = 0;
    while done < data.len() {
        let iov = libc::iovec {
            iov_base: data[done..].as_ptr() as *mut libc::c_void,
            iov_len: data.len() - done,
        };
        let position = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset exceeds off_t"))?;
        // SAFETY: one iovec pointing into `data`, which outlives the call; pwritev2 only reads it.
        let written = unsafe { libc::pwritev2(drive.fd(), &iov, 1, position, libc::RWF_DSYNC) };
        if written < 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOSYS | libc::EOPNOTSUPP) => {
                    drive.file.write_all_at(&data[done..], offset + done as u64)?;
                    return drive.file.sync_data();
                }
                _ => return Err(err),
            }
        }
        if written == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "write ended early"));
        }
        done += written as usize;
    }
    Ok(())
}

impl BlockDevice for PoolDevice {
    fn name(&self) -> &str {
        &self.drive.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.drive.capacity_bytes
    }

    fn submit(&self, op: IoOp) -> IoTicket {
        let started = Instant::now();
        if let Err(e) = check_request(&self.drive.name, self.drive.capacity_bytes, &op) {
            self.stats.record(op.kind(), 0, started.elapsed(), false);
            return IoTicket::ready(Err(e));
        }
        let (ticket, completer) = IoTicket::pending(&self.drive.name);
        self.queue.push(Request { op, completer, started });
        ticket
    }

    fn stats(&self) -> &DriveStats {
        &self.stats
    }

    fn backend(&self) -> &'static str {
        if self.drive.direct { "threadpool+O_DIRECT" } else { "threadpool (buffered)" }
    }
}

impl Drop for PoolDevice {
    fn drop(&mut self) {
        self.queue.stop();
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                tracing::error!(drive = %self.drive.name, "I/O worker thread panicked");
            }
        }
    }
}
