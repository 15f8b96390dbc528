//! The device seam: everything that touches a drive goes through [`BlockDevice`].
//!
//! Implementations: [`file::open_drive`] (io_uring + O_DIRECT on block devices and preallocated
//! files, with a pread/pwrite thread pool where io_uring is refused), [`mem::MemDevice`] for tests,
//! and [`fault::FaultDevice`], a wrapper that fails, corrupts or slows another device on command.
//! This crate knows nothing about RAID, chunks or networks; it must never interpret the bytes it
//! moves.

pub mod buf;
pub mod fault;
pub mod file;
pub mod mem;
mod request_queue;
pub mod stats;
mod threadpool;
mod ticket;
mod uring;

use std::fmt::Debug;

pub use buf::AlignedBuf;
pub use stats::{DriveStats, DriveStatsSnapshot, LatencyHistogram};
pub use ticket::{Completer, IoTicket};

/// Every offset and length handed to a device is a multiple of this (O_DIRECT's rule on 4Kn
/// drives, and the unit our checksums cover).
pub const IO_ALIGN_BYTES: usize = stria_proto::BLOCK_BYTES;
/// The largest single request a device accepts; bigger transfers are split by the caller.
pub const IO_BYTES_MAX: usize = 32 * 1024 * 1024;

/// One request to a device. Buffers are owned so a request can sit in a kernel queue while the
/// submitter goes on to other drives.
#[derive(Debug)]
pub enum IoOp {
    Read {
        offset: u64,
        len: usize,
    },
    /// `fua`: the data is on stable media when the request completes (RWF_DSYNC / NVMe FUA).
    Write {
        offset: u64,
        data: AlignedBuf,
        fua: bool,
    },
    /// Everything completed before the flush was submitted is on stable media when it completes.
    Flush,
    /// The range's contents become undefined and its space may be given back.
    Discard {
        offset: u64,
        len: usize,
    },
}

impl IoOp {
    pub fn kind(&self) -> OpKind {
        match self {
            IoOp::Read { .. } => OpKind::Read,
            IoOp::Write { .. } => OpKind::Write,
            IoOp::Flush => OpKind::Flush,
            IoOp::Discard { .. } => OpKind::Discard,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Discard,
}

/// What a completed request gives back.
#[derive(Debug)]
pub enum IoDone {
    Read(AlignedBuf),
    Done,
}

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{device}: {op:?} at offset {offset} failed: {source}")]
    Os { device: String, op: OpKind, offset: u64, source: std::io::Error },
    #[error(
        "{device}: request at offset {offset} length {len} is not {IO_ALIGN_BYTES}-byte aligned"
    )]
    Misaligned { device: String, offset: u64, len: usize },
    #[error(
        "{device}: request at offset {offset} length {len} ends past the device end {capacity}"
    )]
    OutOfRange { device: String, offset: u64, len: usize, capacity: u64 },
    #[error("{device}: request of {len} bytes exceeds the {IO_BYTES_MAX}-byte limit")]
    TooLarge { device: String, len: usize },
    #[error("{device}: device has failed (injected)")]
    DeviceFailed { device: String },
    #[error("{device}: injected error at offset {offset}")]
    Injected { device: String, offset: u64 },
    #[error("{device}: the device stopped before completing the request")]
    Abandoned { device: String },
    #[error("{path}: {message}")]
    Open { path: String, message: String },
}

/// A drive: a fixed-size array of bytes addressed in [`IO_ALIGN_BYTES`] units.
///
/// `submit` never blocks on the request itself; the returned ticket is waited on. Several tickets
/// on several devices can be outstanding at once, which is how an array reaches all its drives in
/// parallel from one thread.
pub trait BlockDevice: Send + Sync + Debug {
    /// A human name for messages: the path, or `mem0`.
    fn name(&self) -> &str;
    fn capacity_bytes(&self) -> u64;
    fn submit(&self, op: IoOp) -> IoTicket;
    fn stats(&self) -> &DriveStats;

    /// How requests reach the medium, for `status` and logs: `"memory"`, `"io_uring+O_DIRECT"`,
    /// `"threadpool (buffered)"`, `"fault(io_uring+O_DIRECT)"`, ...
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn read_at(&self, offset: u64, len: usize) -> Result<AlignedBuf, IoError> {
        match self.submit(IoOp::Read { offset, len }).wait()? {
            IoDone::Read(buf) => Ok(buf),
            IoDone::Done => unreachable!("a read completes with its buffer"),
        }
    }

    fn write_at(&self, offset: u64, data: AlignedBuf) -> Result<(), IoError> {
        self.submit(IoOp::Write { offset, data, fua: false }).wait().map(|_| ())
    }

    fn flush(&self) -> Result<(), IoError> {
        self.submit(IoOp::Flush).wait().map(|_| ())
    }
}

/// Checks a request against the device's alignment, size and range limits. Every implementation
/// calls this before touching the medium, so a bad request never reaches the kernel.
pub fn check_request(device: &str, capacity: u64, op: &IoOp) -> Result<(), IoError> {
    let (offset, len) = match op {
        IoOp::Read { offset, len } | IoOp::Discard { offset, len } => (*offset, *len),
        IoOp::Write { offset, data, .. } => (*offset, data.len()),
        IoOp::Flush => return Ok(()),
    };
    if len > IO_BYTES_MAX && !matches!(op, IoOp::Discard { .. }) {
        return Err(IoError::TooLarge { device: device.to_string(), len });
    }
    if offset % IO_ALIGN_BYTES as u64 != 0 || len % IO_ALIGN_BYTES != 0 {
        return Err(IoError::Misaligned { device: device.to_string(), offset, len });
    }
    if offset.checked_add(len as u64).is_none_or(|end| end > capacity) {
        return Err(IoError::OutOfRange { device: device.to_string(), offset, len, capacity });
    }
    Ok(())
}
