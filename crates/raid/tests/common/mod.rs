//! Devices and helpers shared by the integration tests: a memory drive that logs every request
//! in order (to check what was made durable before what), and one whose discard leaves the old
//! bytes in place, as some block devices do.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use stria_io::mem::MemDevice;
use stria_io::{BlockDevice, DriveStats, IoDone, IoOp, IoTicket};
use stria_raid::superblock::Superblock;
use stria_raid::{Array, ArrayConfig, CreateOptions, Level};

pub const BLOCK: u64 = 4096;

/// One request as the logging device saw it.
#[derive(Clone, Debug)]
pub enum Logged {
    Write { offset: u64, data: Vec<u8> },
    Flush,
}

/// A memory drive that records its writes and flushes, and can ignore discards.
#[derive(Debug)]
pub struct LoggingDevice {
    inner: MemDevice,
    pub log: Mutex<Vec<Logged>>,
    discard_keeps_data: bool,
}

impl LoggingDevice {
    pub fn new(name: &str, bytes: u64) -> Arc<LoggingDevice> {
        Arc::new(LoggingDevice {
            inner: MemDevice::new(name, bytes),
            log: Mutex::new(Vec::new()),
            discard_keeps_data: false,
        })
    }

    /// A drive whose discard completes but changes nothing, filled with `fill` bytes.
    pub fn with_stale_discard(name: &str, bytes: u64, fill: u8) -> Arc<LoggingDevice> {
        let dev = MemDevice::new(name, bytes);
        let mut at = 0;
        while at < bytes {
            let len = (bytes - at).min(1 << 20);
            dev.write_at(at, stria_io::AlignedBuf::from_slice(&vec![fill; len as usize]))
                .expect("fill");
            at += len;
        }
        Arc::new(LoggingDevice {
            inner: dev,
            log: Mutex::new(Vec::new()),
            discard_keeps_data: true,
        })
    }

    pub fn take_log(&self) -> Vec<Logged> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    /// The label currently on the drive.
    pub fn label(&self) -> Superblock {
        Superblock::decode(&self.inner.read_at(0, 4096).expect("read label")).expect("label")
    }
}

impl BlockDevice for LoggingDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }
    fn stats(&self) -> &DriveStats {
        self.inner.stats()
    }
    fn submit(&self, op: IoOp) -> IoTicket {
        match &op {
            IoOp::Write { offset, data, .. } => self
                .log
                .lock()
                .unwrap()
                .push(Logged::Write { offset: *offset, data: data.to_vec() }),
            IoOp::Flush => self.log.lock().unwrap().push(Logged::Flush),
            IoOp::Discard { .. } if self.discard_keeps_data => {
                return IoTicket::ready(Ok(IoDone::Done));
            }
            _ => {}
        }
        self.inner.submit(op)
    }
}

pub fn devs<T: BlockDevice + 'static>(drives: &[Arc<T>]) -> Vec<Arc<dyn BlockDevice>> {
    drives.iter().map(|d| d.clone() as Arc<dyn BlockDevice>).collect()
}

pub fn config(level: Level, unit: u32) -> ArrayConfig {
    ArrayConfig { level, stripe_unit_bytes: unit, rated_tbw: 0, journal_bytes: None }
}

pub fn create<T: BlockDevice + 'static>(drives: &[Arc<T>], level: Level, unit: u32) -> Array {
    Array::create(devs(drives), &config(level, unit), &CreateOptions::default()).expect("create")
}

/// Bytes that differ per block, so a misplaced block is noticed.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i / 4096) as u8 ^ (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Stops the array as a crash would: nothing is closed, flushed or marked clean.
pub fn crash(array: Array) {
    std::mem::forget(array);
}

pub fn check(array: &Array) -> stria_raid::ScrubReport {
    let stop = std::sync::atomic::AtomicBool::new(false);
    array.scrub(false, None, &stop, &mut |_, _| {}).expect("check")
}
