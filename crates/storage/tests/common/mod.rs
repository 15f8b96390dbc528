//! Shared rig for storage-service tests: one RAID 1 target over memory drives, a runtime, and
//! a call helper that encodes a message and runs the service's handler directly.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use stria_engine::Engine;
use stria_io::BlockDevice;
use stria_io::mem::MemDevice;
use stria_proto::fs::TargetId;
use stria_raid::{Array, ArrayConfig, CreateOptions, Level};
use stria_storage::{StorageService, Target};

/// A storage service with one RAID 1 target `id` (two 16 MiB memory drives), its chunk map in
/// `dir`.
pub fn service(dir: &Path, id: TargetId) -> StorageService {
    let drives: Vec<Arc<dyn BlockDevice>> = (0..2)
        .map(|i| Arc::new(MemDevice::new(format!("d{i}"), 16 << 20)) as Arc<dyn BlockDevice>)
        .collect();
    let config = ArrayConfig {
        level: Level::Raid1,
        stripe_unit_bytes: 64 * 1024,
        rated_tbw: 0,
        journal_bytes: None,
    };
    let array = Arc::new(
        Array::create(
            drives,
            &config,
            &CreateOptions { skip_discard: true, ..CreateOptions::default() },
        )
        .expect("array"),
    );
    let engine = Engine::create(array.clone(), dir, id).expect("engine");
    StorageService::new(vec![Target { id, pool: "default".into(), array, engine }])
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Sends one request to the service's handler; the encoded reply or the RPC status.
pub fn call<T: Serialize>(
    runtime: &tokio::runtime::Runtime,
    service: &StorageService,
    method: u16,
    message: &T,
    data: &[u8],
) -> Result<Vec<u8>, u16> {
    let message = Bytes::from(postcard::to_stdvec(message).expect("encode"));
    let work = service.handle(method, message, Bytes::copy_from_slice(data));
    runtime.block_on(work).map(|(reply, _)| reply).map_err(|refusal| refusal.status)
}
