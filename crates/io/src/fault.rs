//! A device wrapper that fails, corrupts or slows another device on command, so tests can break
//! drives at exact moments while the array above keeps running.
//!
//! Faults are set and cleared at runtime from any thread. Failures are decided at submit time;
//! read corruption is applied to the completed buffer on its way back. It must never change the
//! inner device's medium except through [`FaultDevice::flip_bit`], which exists to do exactly
//! that.
//!
//! Counters: [`FaultDevice::stats`] is what users of this device saw — every request submitted
//! here is counted exactly once, injected failures as errors, corrupted reads as successful
//! reads (the corruption is silent, as on a real drive). The inner device's own counters
//! ([`FaultDevice::inner`]) see only requests that reached it, plus `flip_bit`'s read and write.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::{
    BlockDevice, DriveStats, IO_ALIGN_BYTES, IoDone, IoError, IoOp, IoTicket, OpKind, check_request,
};

/// Fault ranges a device holds at once; tests needing more are probably leaking ranges.
pub const FAULT_RANGES_MAX: usize = 1024;

const NO_WRITE_LIMIT: u64 = u64::MAX;

#[derive(Debug, Clone, Copy)]
struct FailRange {
    offset: u64,
    len: u64,
    /// Bit `1 << kind_bit(kind)` set for each kind that fails.
    kinds: u8,
}

#[derive(Debug, Clone, Copy)]
struct CorruptRange {
    offset: u64,
    len: u64,
}

#[derive(Debug, Default)]
struct Ranges {
    failing: Vec<FailRange>,
    corrupting: Vec<CorruptRange>,
}

#[derive(Debug)]
pub struct FaultDevice {
    inner: Arc<dyn BlockDevice>,
    stats: Arc<DriveStats>,
    backend: &'static str,
    failed: AtomicBool,
    latency_us: AtomicU64,
    /// Writes still allowed before the device dies; NO_WRITE_LIMIT when no limit is set.
    writes_left: AtomicU64,
    ranges: RwLock<Ranges>,
}

fn kind_bit(kind: OpKind) -> u8 {
    match kind {
        OpKind::Read => 1,
        OpKind::Write => 2,
        OpKind::Flush => 4,
        OpKind::Discard => 8,
    }
}

/// Where `[offset, offset + len)` first meets `[start, start + range_len)`, if it does.
fn overlap_start(offset: u64, len: u64, start: u64, range_len: u64) -> Option<u64> {
    let end = offset.saturating_add(len);
    let range_end = start.saturating_add(range_len);
    (len > 0 && range_len > 0 && offset < range_end && start < end).then(|| offset.max(start))
}

/// `"fault(<inner backend>)"`, made once per distinct inner backend so `backend()` can return a
/// `&'static str` without leaking a string per device.
fn fault_backend_name(inner: &'static str) -> &'static str {
    static NAMES: OnceLock<Mutex<Vec<(&'static str, &'static str)>>> = OnceLock::new();
    let mut names = NAMES.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, name)) = names.iter().find(|(key, _)| *key == inner) {
        return name;
    }
    let name: &'static str = Box::leak(format!("fault({inner})").into_boxed_str());
    names.push((inner, name));
    name
}

impl FaultDevice {
    /// Wraps `inner` with no faults set: every request passes through unchanged.
    pub fn new(inner: Arc<dyn BlockDevice>) -> FaultDevice {
        FaultDevice {
            backend: fault_backend_name(inner.backend()),
            inner,
            stats: Arc::new(DriveStats::default()),
            failed: AtomicBool::new(false),
            latency_us: AtomicU64::new(0),
            writes_left: AtomicU64::new(NO_WRITE_LIMIT),
            ranges: RwLock::default(),
        }
    }

    /// The wrapped device, for reading its contents or counters behind the faults.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// Every request fails with [`IoError::DeviceFailed`] until [`FaultDevice::heal`].
    pub fn fail(&self) {
        self.failed.store(true, SeqCst);
    }

    /// Undoes [`FaultDevice::fail`] and any [`FaultDevice::fail_after_writes`] limit. Range
    /// faults and latency stay.
    pub fn heal(&self) {
        self.writes_left.store(NO_WRITE_LIMIT, SeqCst);
        self.failed.store(false, SeqCst);
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(SeqCst)
    }

    /// Requests of the given kinds that overlap `[offset, offset + len)` fail with
    /// [`IoError::Injected`] naming the first failing byte. Flushes cover no range, so they
    /// never match.
    pub fn fail_range(&self, offset: u64, len: u64, ops: &[OpKind]) {
        let kinds = ops.iter().fold(0, |bits, &kind| bits | kind_bit(kind));
        let mut ranges = self.ranges.write().unwrap_or_else(|e| e.into_inner());
        assert!(
            ranges.failing.len() < FAULT_RANGES_MAX,
            "more than {FAULT_RANGES_MAX} fault ranges"
        );
        ranges.failing.push(FailRange { offset, len, kinds });
    }

    /// Reads overlapping `[offset, offset + len)` succeed but come back with one bit flipped in
    /// each affected 4 KiB block (the lowest bit of the block's first byte inside the range), as
    /// from a flaky transfer. The medium
    /// is unchanged, so a re-read through the inner device sees the true data.
    pub fn corrupt_reads(&self, offset: u64, len: u64) {
        let mut ranges = self.ranges.write().unwrap_or_else(|e| e.into_inner());
        assert!(
            ranges.corrupting.len() < FAULT_RANGES_MAX,
            "more than {FAULT_RANGES_MAX} fault ranges"
        );
        ranges.corrupting.push(CorruptRange { offset, len });
    }

    /// Removes every range set by [`FaultDevice::fail_range`] and [`FaultDevice::corrupt_reads`].
    pub fn clear_ranges(&self) {
        *self.ranges.write().unwrap_or_else(|e| e.into_inner()) = Ranges::default();
    }

    /// Each request waits this long in the submitting thread before anything else happens,
    /// modelling a slow drive. Zero turns it off.
    pub fn set_latency(&self, latency: Duration) {
        self.latency_us.store(latency.as_micros().min(u64::MAX as u128) as u64, SeqCst);
    }

    /// The next `writes` writes succeed; the one after fails and the device is failed from then
    /// on (every request gets [`IoError::DeviceFailed`]), as when a drive dies mid-run.
    pub fn fail_after_writes(&self, writes: u64) {
        self.writes_left.store(writes.min(NO_WRITE_LIMIT - 1), SeqCst);
    }

    /// Flips bit `offset_bit` of the inner device's medium now (bit 0 is the lowest bit of byte
    /// 0), by reading its 4 KiB block, flipping, and writing it back — bit rot, not a transfer
    /// error. Bypasses every fault set here. Not atomic against a concurrent write to the same
    /// block, so call it between I/Os.
    pub fn flip_bit(&self, offset_bit: u64) -> Result<(), IoError> {
        let byte = offset_bit / 8;
        let block = byte - byte % IO_ALIGN_BYTES as u64;
        let mut data = self.inner.read_at(block, IO_ALIGN_BYTES)?;
        data[(byte - block) as usize] ^= 1 << (offset_bit % 8);
        self.inner.write_at(block, data)
    }

    fn injected_failure(&self, op: &IoOp) -> Option<IoError> {
        let device = || self.inner.name().to_string();
        if self.failed.load(SeqCst) {
            return Some(IoError::DeviceFailed { device: device() });
        }
        if matches!(op, IoOp::Write { .. }) {
            let allowed = self.writes_left.fetch_update(SeqCst, SeqCst, |left| match left {
                NO_WRITE_LIMIT => Some(left),
                0 => None,
                _ => Some(left - 1),
            });
            if allowed.is_err() {
                self.failed.store(true, SeqCst);
                return Some(IoError::DeviceFailed { device: device() });
            }
        }
        let (offset, len) = match op {
            IoOp::Read { offset, len } | IoOp::Discard { offset, len } => (*offset, *len as u64),
            IoOp::Write { offset, data, .. } => (*offset, data.len() as u64),
            IoOp::Flush => return None,
        };
        let ranges = self.ranges.read().unwrap_or_else(|e| e.into_inner());
        ranges
            .failing
            .iter()
            .filter(|range| range.kinds & kind_bit(op.kind()) != 0)
            .find_map(|range| overlap_start(offset, len, range.offset, range.len))
            .map(|at| IoError::Injected { device: device(), offset: at })
    }

    /// Byte positions, relative to a read at `offset` of `len` bytes, to corrupt.
    fn corruption_points(&self, offset: u64, len: usize) -> Vec<usize> {
        let ranges = self.ranges.read().unwrap_or_else(|e| e.into_inner());
        let mut points = Vec::new();
        for range in &ranges.corrupting {
            let mut block = offset;
            while block < offset + len as u64 {
                let block_end = block + IO_ALIGN_BYTES as u64;
                if let Some(at) =
                    overlap_start(block, IO_ALIGN_BYTES as u64, range.offset, range.len)
                {
                    points.push((at - offset) as usize);
                }
                block = block_end;
            }
        }
        points.sort_unstable();
        points.dedup();
        points
    }
}

impl BlockDevice for FaultDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }

    fn submit(&self, op: IoOp) -> IoTicket {
        let started = Instant::now();
        let kind = op.kind();
        let latency_us = self.latency_us.load(SeqCst);
        if latency_us > 0 {
            std::thread::sleep(Duration::from_micros(latency_us));
        }
        // Misuse is reported as misuse even on a failed device, so tests of callers see their
        // own bugs rather than the injected fault.
        let checked = check_request(self.inner.name(), self.inner.capacity_bytes(), &op);
        if let Some(error) = checked.err().or_else(|| self.injected_failure(&op)) {
            self.stats.record(kind, 0, started.elapsed(), false);
            return IoTicket::ready(Err(error));
        }

        let write_bytes = match &op {
            IoOp::Write { data, .. } => data.len(),
            _ => 0,
        };
        let corrupt = match op {
            IoOp::Read { offset, len } => self.corruption_points(offset, len),
            _ => Vec::new(),
        };
        let stats = self.stats.clone();
        self.inner.submit(op).on_complete(move |outcome| {
            let bytes = match outcome {
                Ok(IoDone::Read(buf)) => {
                    for &at in &corrupt {
                        buf[at] ^= 1;
                    }
                    buf.len()
                }
                Ok(IoDone::Done) => write_bytes,
                Err(_) => 0,
            };
            stats.record(kind, bytes, started.elapsed(), outcome.is_ok());
        })
    }

    fn stats(&self) -> &DriveStats {
        &self.stats
    }

    fn backend(&self) -> &'static str {
        self.backend
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_is_half_open() {
        assert_eq!(overlap_start(0, 4096, 4096, 4096), None);
        assert_eq!(overlap_start(4096, 4096, 0, 4097), Some(4096));
        assert_eq!(overlap_start(0, 8192, 4100, 1), Some(4100));
        assert_eq!(overlap_start(0, 0, 0, 4096), None);
    }

    #[test]
    fn backend_names_are_shared_per_inner_backend() {
        let a = fault_backend_name("memory");
        let b = fault_backend_name("memory");
        assert_eq!(a, "fault(memory)");
        assert!(std::ptr::eq(a, b));
    }
}
