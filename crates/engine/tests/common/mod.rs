//! Shared test rig: a real RAID array over memory drives, a seeded generator, a chunk model.
#![allow(dead_code)]

use std::sync::Arc;

#[allow(unused_imports)]
pub use stria_engine::testing::Rng;
use stria_io::BlockDevice;
use stria_io::mem::MemDevice;
use stria_proto::fs::{ChunkId, ObjectId};
use stria_raid::{Array, ArrayConfig, CreateOptions, Level};

/// Seeds to run: `STRIA_ENGINE_SEED` picks one, `STRIA_ENGINE_SEEDS` sets how many fixed ones
/// (for long soak runs), else `count` fixed ones.
pub fn seeds(count: u64) -> Vec<u64> {
    let env = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    match env("STRIA_ENGINE_SEED") {
        Some(seed) => vec![seed],
        None => (1..=env("STRIA_ENGINE_SEEDS").unwrap_or(count)).map(|i| i * 7919).collect(),
    }
}

/// The memory drives stay reachable so a test can reassemble the same array.
pub struct Drives(pub Vec<Arc<MemDevice>>);

impl Drives {
    pub fn new(count: usize, bytes: u64) -> Drives {
        Drives((0..count).map(|i| Arc::new(MemDevice::new(format!("d{i}"), bytes))).collect())
    }
    pub fn devs(&self) -> Vec<Arc<dyn BlockDevice>> {
        self.0.iter().map(|d| d.clone() as Arc<dyn BlockDevice>).collect()
    }
    pub fn create(&self, level: Level, unit: u32) -> Arc<Array> {
        let config =
            ArrayConfig { level, stripe_unit_bytes: unit, rated_tbw: 0, journal_bytes: None };
        Arc::new(
            Array::create(
                self.devs(),
                &config,
                &CreateOptions { skip_discard: true, ..CreateOptions::default() },
            )
            .expect("create array"),
        )
    }
}

/// A RAID 5 array of 4 memory drives of `drive_mib` MiB each, 16 KiB stripe unit.
pub fn raid5(drive_mib: u64) -> (Drives, Arc<Array>) {
    let drives = Drives::new(4, drive_mib << 20);
    let array = drives.create(Level::Raid5, 16 * 1024);
    (drives, array)
}

pub fn chunk(object: u64, index: u64) -> ChunkId {
    ChunkId { object: ObjectId(object), index }
}

/// A fresh directory for a chunk map, removed when the test drops it (also when it panics).
pub struct TempDir(std::path::PathBuf);

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for TempDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!(
        "stria-engine-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    TempDir(dir)
}

/// The reference: a chunk is its bytes.
pub fn model_write(model: &mut Vec<u8>, offset: usize, data: &[u8]) {
    if data.is_empty() {
        return; // an empty write does not extend the chunk
    }
    if model.len() < offset + data.len() {
        model.resize(offset + data.len(), 0);
    }
    model[offset..offset + data.len()].copy_from_slice(data);
}

pub fn model_punch(model: &mut [u8], offset: usize, len: usize) {
    let end = (offset + len).min(model.len());
    if offset < end {
        model[offset..end].fill(0);
    }
}

pub fn model_read(model: &[u8], offset: usize, len: usize) -> Vec<u8> {
    let end = (offset + len).min(model.len());
    if offset >= end { Vec::new() } else { model[offset..end].to_vec() }
}
