//! Allocation queries: which blocks of a chunk hold data, and how much space an object holds.
//! Volumes answer NBD's block-status and a volume's allocated size from these; they read the
//! chunk map only, never the array.

use stria_proto::fs::{ChunkId, ObjectId};

use crate::{BLOCK, Engine, EngineError};

/// What one object holds on this target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectUsage {
    /// Chunks of the object stored here (holes-only chunks included).
    pub chunks: u64,
    /// Logical blocks that hold data, over all those chunks.
    pub mapped_blocks: u64,
}

impl ObjectUsage {
    /// The bytes the object's data blocks take (4 KiB per mapped block).
    pub fn allocated_bytes(&self) -> u64 {
        self.mapped_blocks * BLOCK as u64
    }
}

impl Engine {
    /// The mapped logical blocks of `chunk` as runs `(first block, blocks)`, in order; blocks
    /// between and after the runs are holes and read as zeros. A missing chunk has no runs.
    pub fn mapped_runs(&self, chunk: ChunkId) -> Result<Vec<(u32, u32)>, EngineError> {
        let _shared = self.lock_of(chunk).read().unwrap_or_else(|e| e.into_inner());
        Ok(self.load_record(chunk)?.map(|rec| rec.mapped_runs()).unwrap_or_default())
    }

    /// How many chunks of `object` this target stores and how many blocks they map. Reads
    /// every record of the object in one transaction, so it costs one record decode per chunk.
    pub fn object_usage(&self, object: ObjectId) -> Result<ObjectUsage, EngineError> {
        let mut usage = ObjectUsage::default();
        self.scan_records((object.0, 0)..=(object.0, u64::MAX), |_, rec| {
            usage.chunks += 1;
            usage.mapped_blocks += rec.mapped_blocks();
        })?;
        Ok(usage)
    }
}
