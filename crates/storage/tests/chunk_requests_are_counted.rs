//! Each target counts the chunk reads and writes it serves, with their latency, for the
//! management role's metrics and charts; refused requests are not counted as served.

mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::{call, runtime, service};
use stria_proto::fs::{ChunkId, ObjectId, TargetId};
use stria_proto::wire::{ChunkRead, ChunkWrite, storage_method};

#[test]
fn served_chunk_requests_are_counted_per_target() {
    let dir = std::env::temp_dir().join(format!("stria-storage-counted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let runtime = runtime();
    let target = TargetId(2);
    let service = service(&dir, target);

    let chunk = ChunkId { object: ObjectId(7), index: 0 };
    let data = vec![9u8; 40_000];
    let write = ChunkWrite { target, chunk, offset: 0, crc: crc32c::crc32c(&data), sync: true };
    call(&runtime, &service, storage_method::CHUNK_WRITE, &write, &data).expect("write");
    let read = ChunkRead { target, chunk, offset: 0, len: 4096 };
    call(&runtime, &service, storage_method::CHUNK_READ, &read, &[]).expect("read");
    let elsewhere = ChunkRead { target: TargetId(99), ..read };
    assert!(call(&runtime, &service, storage_method::CHUNK_READ, &elsewhere, &[]).is_err());

    let io = service.io_stats(target).expect("the target has counters");
    assert_eq!((io.write_ops.load(Relaxed), io.write_bytes.load(Relaxed)), (1, 40_000));
    assert_eq!((io.read_ops.load(Relaxed), io.read_bytes.load(Relaxed)), (1, 4096));
    assert_eq!(io.write_latency.counts().iter().sum::<u64>(), 1);
    assert_eq!(io.read_latency.counts().iter().sum::<u64>(), 1);
    assert!(io.write_latency_us_total.load(Relaxed) > 0, "a synced write takes some time");
    assert!(service.io_stats(TargetId(99)).is_none());
    let _ = std::fs::remove_dir_all(&dir);
}
