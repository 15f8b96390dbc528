//! The per-drive checksum table: one CRC32C per 4 KiB block of the drive's data area.
//!
//! The table lives in memory (4 bytes per 4 KiB, i.e. 1 MiB per GiB of drive) and on the drive in
//! its own region. Pages changed since the last flush are written at flush time, before the
//! drive's own flush, so a flushed block always has its flushed checksum. After an unclean stop
//! the checksums of regions marked in the write-intent bitmap are recomputed from the data.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use stria_io::{AlignedBuf, BlockDevice, IoError};
use stria_proto::BLOCK_BYTES;

use crate::superblock::Layout;

const CRCS_PER_PAGE: usize = BLOCK_BYTES / 4;
/// The largest run of table pages written in one request.
const PERSIST_PAGES_MAX: usize = 256;

pub fn crc_block(block: &[u8]) -> u32 {
    debug_assert_eq!(block.len(), BLOCK_BYTES);
    stria_proto::crc32c(block)
}

/// CRC32C of a block of zeros: what a freshly created, discarded data area holds.
pub fn crc_zero_block() -> u32 {
    static ZERO: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ZERO.get_or_init(|| stria_proto::crc32c(&[0u8; BLOCK_BYTES]))
}

#[derive(Debug)]
pub struct CrcTable {
    crcs: Vec<AtomicU32>,
    dirty_pages: Vec<AtomicU64>,
}

impl CrcTable {
    /// A table for a freshly zeroed data area.
    pub fn zeroed(blocks: u64) -> CrcTable {
        let zero = crc_zero_block();
        let pages = (blocks as usize).div_ceil(CRCS_PER_PAGE);
        let table = CrcTable {
            crcs: (0..blocks).map(|_| AtomicU32::new(zero)).collect(),
            dirty_pages: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        };
        for page in 0..pages {
            table.mark_page(page);
        }
        table
    }

    pub fn load(dev: &dyn BlockDevice, layout: &Layout) -> Result<CrcTable, IoError> {
        let blocks = layout.data_bytes / BLOCK_BYTES as u64;
        let mut crcs = Vec::with_capacity(blocks as usize);
        let chunk = (PERSIST_PAGES_MAX * BLOCK_BYTES) as u64;
        let mut offset = 0;
        while offset < layout.crc_bytes {
            let len = chunk.min(layout.crc_bytes - offset) as usize;
            let buf = dev.read_at(layout.crc_offset + offset, len)?;
            for word in buf.chunks_exact(4) {
                if crcs.len() as u64 == blocks {
                    break;
                }
                crcs.push(AtomicU32::new(u32::from_le_bytes([word[0], word[1], word[2], word[3]])));
            }
            offset += len as u64;
        }
        let pages = (blocks as usize).div_ceil(CRCS_PER_PAGE);
        Ok(CrcTable {
            crcs,
            dirty_pages: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    pub fn blocks(&self) -> u64 {
        self.crcs.len() as u64
    }

    pub fn get(&self, block: u64) -> u32 {
        self.crcs[block as usize].load(Relaxed)
    }

    pub fn set(&self, block: u64, crc: u32) {
        self.crcs[block as usize].store(crc, Relaxed);
        self.mark_page(block as usize / CRCS_PER_PAGE);
    }

    /// Sets the checksums of consecutive blocks from their contents.
    pub fn set_from_data(&self, first_block: u64, data: &[u8]) {
        for (i, block) in data.chunks_exact(BLOCK_BYTES).enumerate() {
            self.set(first_block + i as u64, crc_block(block));
        }
    }

    fn mark_page(&self, page: usize) {
        self.dirty_pages[page / 64].fetch_or(1 << (page % 64), Relaxed);
    }

    /// Writes every page changed since the last call. The caller flushes the drive afterwards.
    pub fn persist(&self, dev: &dyn BlockDevice, layout: &Layout) -> Result<(), IoError> {
        let pages = self.crcs.len().div_ceil(CRCS_PER_PAGE);
        let mut dirty = Vec::new();
        for (word_index, word) in self.dirty_pages.iter().enumerate() {
            let mut bits = word.swap(0, Relaxed);
            while bits != 0 {
                let bit = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                dirty.push(word_index * 64 + bit);
            }
        }
        let mut tickets = Vec::new();
        let mut i = 0;
        while i < dirty.len() {
            let first = dirty[i];
            let mut count = 1;
            while i + count < dirty.len()
                && dirty[i + count] == first + count
                && count < PERSIST_PAGES_MAX
            {
                count += 1;
            }
            let mut buf = AlignedBuf::zeroed(count * BLOCK_BYTES);
            for page in first..(first + count).min(pages) {
                let base = page * CRCS_PER_PAGE;
                let out = &mut buf[(page - first) * BLOCK_BYTES..(page - first + 1) * BLOCK_BYTES];
                for (j, slot) in out.chunks_exact_mut(4).enumerate() {
                    if let Some(crc) = self.crcs.get(base + j) {
                        slot.copy_from_slice(&crc.load(Relaxed).to_le_bytes());
                    }
                }
            }
            let offset = layout.crc_offset + (first * BLOCK_BYTES) as u64;
            tickets.push(dev.submit(stria_io::IoOp::Write { offset, data: buf, fua: false }));
            i += count;
        }
        let mut result = Ok(());
        for ticket in tickets {
            if let Err(e) = ticket.wait() {
                result = Err(e);
            }
        }
        if result.is_err() {
            // Nothing was lost: mark everything dirty again so a later flush retries after the
            // drive has been dealt with.
            for page in dirty {
                self.mark_page(page);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stria_io::mem::MemDevice;

    #[test]
    fn persisted_table_loads_back() {
        let layout =
            Layout::compute(64 << 20, 65536, 0, crate::superblock::BITMAP_REGION_MIN_BYTES)
                .unwrap();
        let dev = MemDevice::new("m", 64 << 20);
        let blocks = layout.data_bytes / 4096;
        let table = CrcTable::zeroed(blocks);
        table.set(0, 7);
        table.set(blocks - 1, 9);
        table.set(2000, 11);
        table.persist(&dev, &layout).unwrap();
        let loaded = CrcTable::load(&dev, &layout).unwrap();
        assert_eq!(loaded.blocks(), blocks);
        assert_eq!((loaded.get(0), loaded.get(2000), loaded.get(blocks - 1)), (7, 11, 9));
        assert_eq!(loaded.get(1), crc_zero_block());
    }
}
