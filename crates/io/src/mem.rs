//! A drive held in memory, for tests and property runs. Requests complete inside `submit`.

use std::sync::RwLock;
use std::time::Instant;

use crate::{AlignedBuf, BlockDevice, DriveStats, IoDone, IoOp, IoTicket, check_request};

#[derive(Debug)]
pub struct MemDevice {
    name: String,
    data: RwLock<Vec<u8>>,
    stats: DriveStats,
}

impl MemDevice {
    pub fn new(name: impl Into<String>, capacity_bytes: u64) -> MemDevice {
        MemDevice {
            name: name.into(),
            data: RwLock::new(vec![0; capacity_bytes as usize]),
            stats: DriveStats::default(),
        }
    }

    /// A copy of the whole medium, for tests that inspect what reached the "disk".
    pub fn contents(&self) -> Vec<u8> {
        self.data.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl BlockDevice for MemDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.data.read().unwrap_or_else(|e| e.into_inner()).len() as u64
    }

    fn submit(&self, op: IoOp) -> IoTicket {
        let started = Instant::now();
        let kind = op.kind();
        if let Err(e) = check_request(&self.name, self.capacity_bytes(), &op) {
            self.stats.record(kind, 0, started.elapsed(), false);
            return IoTicket::ready(Err(e));
        }
        let (outcome, bytes) = match op {
            IoOp::Read { offset, len } => {
                let data = self.data.read().unwrap_or_else(|e| e.into_inner());
                let start = offset as usize;
                (Ok(IoDone::Read(AlignedBuf::from_slice(&data[start..start + len]))), len)
            }
            IoOp::Write { offset, data: buf, .. } => {
                let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
                let start = offset as usize;
                data[start..start + buf.len()].copy_from_slice(&buf);
                (Ok(IoDone::Done), buf.len())
            }
            IoOp::Discard { offset, len } => {
                let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
                let start = offset as usize;
                data[start..start + len].fill(0);
                (Ok(IoDone::Done), 0)
            }
            IoOp::Flush => (Ok(IoDone::Done), 0),
        };
        self.stats.record(kind, bytes, started.elapsed(), true);
        IoTicket::ready(outcome)
    }

    fn stats(&self) -> &DriveStats {
        &self.stats
    }
}
