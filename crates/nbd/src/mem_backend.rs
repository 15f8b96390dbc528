//! An in-memory, sparse [`Backend`] for tests and examples: 4 KiB blocks allocated on first
//! write, with an exact allocation map. Not for production: nothing survives the process.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{Backend, BackendError, Extent};

/// Allocation granularity of [`MemBackend`].
pub const MEM_BLOCK_BYTES: u64 = 4096;
const _: () = assert!(MEM_BLOCK_BYTES.is_power_of_two());
const _: () = assert!(MEM_BLOCK_BYTES.is_multiple_of(crate::wire::BLOCK_SIZE_MIN_BYTES as u64));

/// A sparse in-memory disk. Unwritten blocks are holes that read as zeroes; TRIM and
/// WRITE_ZEROES (when allowed to trim) give whole blocks back, and zero the covered part of
/// partial ones so the range always reads back as zeroes afterwards. WRITE_ZEROES with
/// `NO_HOLE` provisions (allocates) every block of its range, so mind the memory in tests.
#[derive(Debug)]
pub struct MemBackend {
    size: u64,
    blocks: Mutex<BTreeMap<u64, Box<[u8]>>>,
    writes: AtomicU64,
    flushes: AtomicU64,
    flush_is_global: bool,
}

impl MemBackend {
    /// A backend of `size` bytes (a multiple of 512), all holes.
    pub fn new(size: u64) -> MemBackend {
        assert!(
            size.is_multiple_of(crate::wire::BLOCK_SIZE_MIN_BYTES as u64),
            "size must be 512-aligned"
        );
        MemBackend {
            size,
            blocks: Mutex::new(BTreeMap::new()),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            flush_is_global: true,
        }
    }

    /// Makes [`Backend::flush_is_global`] answer `false` (no `NBD_FLAG_CAN_MULTI_CONN`).
    pub fn with_local_flush(mut self) -> MemBackend {
        self.flush_is_global = false;
        self
    }

    /// Bytes of backing memory in use (whole blocks).
    pub fn allocated_bytes(&self) -> u64 {
        self.lock().len() as u64 * MEM_BLOCK_BYTES
    }

    /// Calls to [`Backend::write`], [`Backend::trim`] and [`Backend::write_zeroes`] that
    /// changed state, for tests that prove a request never reached the backend.
    pub fn mutation_count(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Box<[u8]>>> {
        // A panic while holding the lock cannot leave a block half-replaced (blocks are
        // inserted whole), so the map is still consistent.
        self.blocks.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(BackendError::invalid(format!(
                "range {offset}+{len} outside the {}-byte device",
                self.size
            ))),
        }
    }

    /// Zeroes `[offset, offset+len)`, dropping whole blocks when `may_deallocate` and
    /// allocating every block otherwise.
    fn zero_range(&self, offset: u64, len: u64, may_deallocate: bool) {
        let mut blocks = self.lock();
        for_each_block(offset, len, |index, within, count| {
            let whole = within == 0 && count as u64 == MEM_BLOCK_BYTES;
            if whole && may_deallocate {
                blocks.remove(&index);
            } else if let Some(block) = blocks.get_mut(&index) {
                block[within..within + count].fill(0);
            } else if !may_deallocate {
                blocks.insert(index, new_block());
            }
        });
    }
}

fn new_block() -> Box<[u8]> {
    vec![0u8; MEM_BLOCK_BYTES as usize].into_boxed_slice()
}

/// Calls `f(block_index, offset_within_block, byte_count)` for each block piece of the range.
fn for_each_block(offset: u64, len: u64, mut f: impl FnMut(u64, usize, usize)) {
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let index = at / MEM_BLOCK_BYTES;
        let within = (at % MEM_BLOCK_BYTES) as usize;
        let count = (MEM_BLOCK_BYTES - within as u64).min(end - at) as usize;
        f(index, within, count);
        at += count as u64;
    }
}

impl Backend for MemBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError> {
        self.check_range(offset, buf.len() as u64)?;
        let blocks = self.lock();
        let mut done = 0usize;
        for_each_block(offset, buf.len() as u64, |index, within, count| {
            let out = &mut buf[done..done + count];
            match blocks.get(&index) {
                Some(block) => out.copy_from_slice(&block[within..within + count]),
                None => out.fill(0),
            }
            done += count;
        });
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), BackendError> {
        self.check_range(offset, data.len() as u64)?;
        let mut blocks = self.lock();
        let mut done = 0usize;
        for_each_block(offset, data.len() as u64, |index, within, count| {
            let block = blocks.entry(index).or_insert_with(new_block);
            block[within..within + count].copy_from_slice(&data[done..done + count]);
            done += count;
        });
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check_range(offset, len)?;
        self.zero_range(offset, len, true);
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        _fua: bool,
    ) -> Result<(), BackendError> {
        self.check_range(offset, len)?;
        self.zero_range(offset, len, may_trim);
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BackendError> {
        self.check_range(offset, len)?;
        let end = offset + len;
        let blocks = self.lock();
        let mut extents: Vec<Extent> = Vec::new();
        let mut push = |length: u64, hole: bool, zero: bool| {
            if length == 0 {
                return;
            }
            match extents.last_mut() {
                Some(last) if last.hole == hole && last.zero == zero => last.length += length,
                _ => extents.push(Extent { length, hole, zero }),
            }
        };
        let mut at = offset;
        let first_index = offset / MEM_BLOCK_BYTES;
        let last_index = (end - 1) / MEM_BLOCK_BYTES;
        if len > 0 {
            for (&index, block) in blocks.range(first_index..=last_index) {
                let block_start = (index * MEM_BLOCK_BYTES).max(offset);
                let block_end = ((index + 1) * MEM_BLOCK_BYTES).min(end);
                push(block_start - at, true, true);
                let within = (block_start - index * MEM_BLOCK_BYTES) as usize;
                let piece = &block[within..within + (block_end - block_start) as usize];
                push(block_end - block_start, false, piece.iter().all(|&b| b == 0));
                at = block_end;
            }
        }
        push(end - at, true, true);
        Ok(extents)
    }

    fn flush_is_global(&self) -> bool {
        self.flush_is_global
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritten_space_reads_zero_and_is_a_hole() {
        let m = MemBackend::new(1 << 20);
        let mut buf = vec![1u8; 8192];
        m.read(4096, &mut buf).expect("read");
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(
            m.block_status(0, 1 << 20).expect("status"),
            vec![Extent { length: 1 << 20, hole: true, zero: true }]
        );
        assert_eq!(m.allocated_bytes(), 0);
    }

    #[test]
    fn writes_read_back_across_block_boundaries() {
        let m = MemBackend::new(1 << 20);
        let data: Vec<u8> = (0..10_240u32).map(|i| (i % 251) as u8 + 1).collect();
        m.write(3584, &data, false).expect("write");
        let mut back = vec![0u8; data.len()];
        m.read(3584, &mut back).expect("read");
        assert_eq!(back, data);
        // 3584..13824 touches blocks 0..=3.
        assert_eq!(m.allocated_bytes(), 4 * MEM_BLOCK_BYTES);
        assert_eq!(
            m.block_status(0, 32768).expect("status"),
            vec![
                Extent { length: 16384, hole: false, zero: false },
                Extent { length: 16384, hole: true, zero: true },
            ]
        );
    }

    #[test]
    fn block_status_of_a_sub_range_is_exact() {
        let m = MemBackend::new(1 << 20);
        m.write(8192, &[7u8; 4096], false).expect("write");
        assert_eq!(
            m.block_status(4608, 8192).expect("status"),
            vec![
                Extent { length: 3584, hole: true, zero: true },
                Extent { length: 4096, hole: false, zero: false },
                Extent { length: 512, hole: true, zero: true },
            ]
        );
    }

    #[test]
    fn write_zeroes_trims_or_provisions_as_asked() {
        let m = MemBackend::new(1 << 20);
        m.write(0, &[9u8; 16384], false).expect("write");
        m.write_zeroes(0, 8192, true, false).expect("zero");
        assert_eq!(m.allocated_bytes(), 8192);
        m.write_zeroes(65536, 8192, false, false).expect("zero");
        assert_eq!(m.allocated_bytes(), 16384);
        let status = m.block_status(65536, 8192).expect("status");
        assert_eq!(status, vec![Extent { length: 8192, hole: false, zero: true }]);
        // A partial-block trim zeroes the covered part and keeps the block.
        m.trim(8192 + 512, 1024).expect("trim");
        let mut buf = vec![0u8; 4096];
        m.read(8192, &mut buf).expect("read");
        assert!(buf[..512].iter().all(|&b| b == 9));
        assert!(buf[512..1536].iter().all(|&b| b == 0));
        assert!(buf[1536..].iter().all(|&b| b == 9));
    }

    #[test]
    fn out_of_range_requests_are_refused_without_change() {
        let m = MemBackend::new(8192);
        assert!(m.write(8192, &[1u8; 512], false).is_err());
        assert!(m.read(u64::MAX - 10, &mut [0u8; 512]).is_err());
        assert_eq!(m.mutation_count(), 0);
        assert_eq!(m.allocated_bytes(), 0);
    }
}
