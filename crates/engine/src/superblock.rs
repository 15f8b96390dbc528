//! The engine superblock: block 0 of the array, naming the target and the chunk map it belongs
//! to, so a chunk map is never opened against the wrong array.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "STRIAENG"
//!      8     4  format version (LE)
//!     12     4  target id (LE)
//!     16    16  engine uuid (also stored in the chunk map's identity record)
//!     32    16  array uuid (the RAID array's own id)
//!     48     8  first data block (LE; blocks below it are reserved)
//!     56     8  block count of the array (LE)
//!     64  4028  zero
//!   4092     4  CRC32C of bytes 0..4092 (LE)
//! ```

use stria_proto::Uuid;
use stria_proto::fs::TargetId;

use crate::BLOCK;

pub const MAGIC: [u8; 8] = *b"STRIAENG";
pub const FORMAT_VERSION: u32 = 1;
const CRC_AT: usize = BLOCK - 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub target: TargetId,
    pub engine_uuid: Uuid,
    pub array_uuid: Uuid,
    pub data_start_block: u64,
    pub block_count: u64,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.target.0.to_le_bytes());
        b[16..32].copy_from_slice(&self.engine_uuid.0);
        b[32..48].copy_from_slice(&self.array_uuid.0);
        b[48..56].copy_from_slice(&self.data_start_block.to_le_bytes());
        b[56..64].copy_from_slice(&self.block_count.to_le_bytes());
        let crc = stria_proto::crc32c(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, String> {
        if b.len() != BLOCK {
            return Err(format!("superblock is {} bytes, not {BLOCK}", b.len()));
        }
        if b[0..8] != MAGIC {
            return Err("no engine magic in block 0 (array not formatted by the engine)".into());
        }
        let stored = u32::from_le_bytes(le4(&b[CRC_AT..]));
        let actual = stria_proto::crc32c(&b[..CRC_AT]);
        if stored != actual {
            return Err(format!("checksum {actual:#010x} does not match stored {stored:#010x}"));
        }
        let version = u32::from_le_bytes(le4(&b[8..12]));
        if version != FORMAT_VERSION {
            return Err(format!("format version {version}, this build reads {FORMAT_VERSION}"));
        }
        Ok(Superblock {
            target: TargetId(u32::from_le_bytes(le4(&b[12..16]))),
            engine_uuid: Uuid(le16(&b[16..32])),
            array_uuid: Uuid(le16(&b[32..48])),
            data_start_block: u64::from_le_bytes(le8(&b[48..56])),
            block_count: u64::from_le_bytes(le8(&b[56..64])),
        })
    }
}

fn le4(b: &[u8]) -> [u8; 4] {
    let mut out = [0u8; 4];
    out.copy_from_slice(&b[..4]);
    out
}

fn le8(b: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&b[..8]);
    out
}

fn le16(b: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&b[..16]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let sb = Superblock {
            target: TargetId(7),
            engine_uuid: Uuid([3; 16]),
            array_uuid: Uuid([9; 16]),
            data_start_block: 48,
            block_count: 1 << 20,
        };
        let mut b = sb.encode();
        assert_eq!(Superblock::decode(&b), Ok(sb));
        b[13] ^= 1;
        assert!(Superblock::decode(&b).expect_err("damaged").contains("checksum"));
        assert!(Superblock::decode(&[0u8; BLOCK]).expect_err("blank").contains("magic"));
    }
}
