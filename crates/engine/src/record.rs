//! The chunk record: what the chunk map stores for one chunk.
//!
//! In memory a record is a vector with one slot per 4 KiB logical block (a hole or a physical
//! block and its CRC32C), which keeps every operation a simple slot edit. On disk it is
//! compacted to extents (logical block, physical block, run length) plus one CRC per mapped
//! block, encoded with postcard:
//!
//! ```text
//! RecordDisk { version: u8 = 1, len_bytes: u32, extents: [Extent], crcs: bytes }
//! Extent     { logical: u32, physical: u64, blocks: u32 }   (logical order, no overlap)
//! crcs       = 4 bytes LE per mapped block, in extent order
//! ```

use serde::{Deserialize, Serialize};
use stria_proto::fs::CHUNK_BYTES_MAX;

use crate::BLOCK;

const RECORD_VERSION: u8 = 1;
const _: () = assert!(CHUNK_BYTES_MAX.is_multiple_of(BLOCK as u32));

/// One mapped logical block: where its bytes live and their checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRef {
    pub physical: u64,
    pub crc: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkRecord {
    pub len_bytes: u32,
    /// Slot `i` describes logical block `i`; the vector never extends past the chunk length.
    pub blocks: Vec<Option<BlockRef>>,
}

#[derive(Serialize, Deserialize)]
struct Extent {
    logical: u32,
    physical: u64,
    blocks: u32,
}

#[derive(Serialize, Deserialize)]
struct RecordDisk {
    version: u8,
    len_bytes: u32,
    extents: Vec<Extent>,
    crcs: Vec<u8>,
}

/// Number of 4 KiB blocks that cover `len_bytes`.
pub fn blocks_for(len_bytes: u64) -> u32 {
    len_bytes.div_ceil(BLOCK as u64) as u32
}

impl ChunkRecord {
    /// The postcard encoding of [`RecordDisk`], written directly: every write of a chunk
    /// encodes its record, and a fragmented one has an extent per block. (postcard: `u8` as
    /// is, other integers and lengths as LEB128 varints, a byte vector as length and bytes.)
    pub fn encode(&self) -> Vec<u8> {
        let mut extents: Vec<(u32, u64, u32)> = Vec::new();
        let mut mapped = 0usize;
        for (i, slot) in self.blocks.iter().enumerate() {
            let Some(b) = slot else { continue };
            mapped += 1;
            if let Some((logical, physical, blocks)) = extents.last_mut()
                && *logical + *blocks == i as u32
                && *physical + *blocks as u64 == b.physical
            {
                *blocks += 1;
                continue;
            }
            extents.push((i as u32, b.physical, 1));
        }
        let mut out = Vec::with_capacity(16 + extents.len() * 16 + mapped * 4);
        out.push(RECORD_VERSION);
        put_varint(&mut out, self.len_bytes as u64);
        put_varint(&mut out, extents.len() as u64);
        for &(logical, physical, blocks) in &extents {
            put_varint(&mut out, logical as u64);
            put_varint(&mut out, physical);
            put_varint(&mut out, blocks as u64);
        }
        put_varint(&mut out, mapped as u64 * 4);
        for b in self.blocks.iter().flatten() {
            out.extend_from_slice(&b.crc.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ChunkRecord, String> {
        let disk: RecordDisk = postcard::from_bytes(bytes).map_err(|e| e.to_string())?;
        if disk.version != RECORD_VERSION {
            return Err(format!("record version {}, expected {RECORD_VERSION}", disk.version));
        }
        if disk.len_bytes > CHUNK_BYTES_MAX {
            return Err(format!("length {} past the chunk limit", disk.len_bytes));
        }
        let slots = blocks_for(disk.len_bytes as u64) as usize;
        let mapped: u64 = disk.extents.iter().map(|e| e.blocks as u64).sum();
        if disk.crcs.len() as u64 != mapped * 4 {
            return Err(format!("{} checksum bytes for {mapped} blocks", disk.crcs.len()));
        }
        let mut blocks = vec![None; slots];
        let mut crcs = disk.crcs.chunks_exact(4);
        for e in &disk.extents {
            let end = e.logical as u64 + e.blocks as u64;
            if e.blocks == 0 || end > slots as u64 {
                return Err(format!("extent at block {} runs past the chunk end", e.logical));
            }
            if e.physical.checked_add(e.blocks as u64).is_none() {
                return Err(format!(
                    "extent at block {} runs past the last block number",
                    e.logical
                ));
            }
            for k in 0..e.blocks {
                let slot = &mut blocks[(e.logical + k) as usize];
                if slot.is_some() {
                    return Err(format!("block {} mapped twice", e.logical + k));
                }
                let mut crc = [0u8; 4];
                crc.copy_from_slice(crcs.next().unwrap_or(&[0; 4]));
                *slot = Some(BlockRef {
                    physical: e.physical + k as u64,
                    crc: u32::from_le_bytes(crc),
                });
            }
        }
        Ok(ChunkRecord { len_bytes: disk.len_bytes, blocks })
    }

    /// The mapped logical blocks as runs `(first block, blocks)`, in logical order; the
    /// blocks between runs are holes.
    pub fn mapped_runs(&self) -> Vec<(u32, u32)> {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for (i, slot) in self.blocks.iter().enumerate() {
            if slot.is_none() {
                continue;
            }
            match runs.last_mut() {
                Some((first, n)) if *first + *n == i as u32 => *n += 1,
                _ => runs.push((i as u32, 1)),
            }
        }
        runs
    }

    /// How many logical blocks are mapped (hold data).
    pub fn mapped_blocks(&self) -> u64 {
        self.blocks.iter().flatten().count() as u64
    }

    /// The physical blocks this record holds, as sorted runs `(start, blocks)`.
    pub fn physical_runs(&self) -> Vec<(u64, u64)> {
        let mut physical: Vec<u64> = self.blocks.iter().flatten().map(|b| b.physical).collect();
        physical.sort_unstable();
        runs_of(&physical)
    }
}

/// Appends `v` as an unsigned LEB128 varint, as postcard encodes integers and lengths.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Coalesces sorted block numbers into runs `(start, blocks)`.
pub fn runs_of(sorted: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &p in sorted {
        match runs.last_mut() {
            Some((start, n)) if *start + *n == p => *n += 1,
            _ => runs.push((p, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_runs_compactly_and_round_trips() {
        let mut rec = ChunkRecord { len_bytes: 10 * BLOCK as u32 - 5, blocks: vec![None; 10] };
        for i in 2..8 {
            rec.blocks[i] = Some(BlockRef { physical: 100 + i as u64, crc: i as u32 * 7 });
        }
        rec.blocks[9] = Some(BlockRef { physical: 5, crc: 1 });
        let bytes = rec.encode();
        assert!(bytes.len() < 60, "record is {} bytes", bytes.len());
        assert_eq!(ChunkRecord::decode(&bytes), Ok(rec.clone()));
        assert_eq!(rec.physical_runs(), vec![(5, 1), (102, 6)]);
        assert_eq!(rec.mapped_runs(), vec![(2, 6), (9, 1)]);
        assert_eq!(rec.mapped_blocks(), 7);
    }

    /// The hand-written encoder writes exactly what postcard writes for the same record.
    #[test]
    fn encoding_is_postcards() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let slots = (next() % 300) as usize;
            let mut physical = next() >> (next() % 64);
            let blocks = (0..slots)
                .map(|_| {
                    if next() % 4 == 0 {
                        return None;
                    }
                    physical = if next() % 3 == 0 { next() >> (next() % 64) } else { physical + 1 };
                    Some(BlockRef { physical: physical.min(u64::MAX / 2), crc: next() as u32 })
                })
                .collect();
            let rec = ChunkRecord { len_bytes: (slots * BLOCK) as u32, blocks };
            let mut extents: Vec<Extent> = Vec::new();
            let mut crcs = Vec::new();
            for (i, b) in rec.blocks.iter().enumerate() {
                let Some(b) = b else { continue };
                crcs.extend_from_slice(&b.crc.to_le_bytes());
                match extents.last_mut() {
                    Some(e)
                        if e.logical + e.blocks == i as u32
                            && e.physical + e.blocks as u64 == b.physical =>
                    {
                        e.blocks += 1
                    }
                    _ => {
                        extents.push(Extent { logical: i as u32, physical: b.physical, blocks: 1 })
                    }
                }
            }
            let disk =
                RecordDisk { version: RECORD_VERSION, len_bytes: rec.len_bytes, extents, crcs };
            assert_eq!(rec.encode(), postcard::to_allocvec(&disk).expect("postcard"));
            assert_eq!(ChunkRecord::decode(&rec.encode()), Ok(rec));
        }
    }

    #[test]
    fn rejects_damaged_records() {
        let rec = ChunkRecord {
            len_bytes: BLOCK as u32,
            blocks: vec![Some(BlockRef { physical: 1, crc: 2 })],
        };
        let mut bytes = rec.encode();
        bytes[1] = 0; // length 0: the extent now runs past the end
        assert!(ChunkRecord::decode(&bytes).is_err());
        assert!(ChunkRecord::decode(&[9, 9, 9]).is_err());
    }

    /// An extent whose physical run would pass the end of the u64 block space is damage, not
    /// a record (block numbers are added up when the record is read and when space is freed).
    #[test]
    fn rejects_an_extent_past_the_last_block_number() {
        let disk = RecordDisk {
            version: RECORD_VERSION,
            len_bytes: 2 * BLOCK as u32,
            extents: vec![Extent { logical: 0, physical: u64::MAX, blocks: 2 }],
            crcs: vec![0; 8],
        };
        let bytes = postcard::to_allocvec(&disk).expect("encode");
        assert!(ChunkRecord::decode(&bytes).is_err());
    }
}
