//! The storage methods volumes use, called on the service directly: punch, chunk map and
//! object space answer from the engine, and malformed or out-of-bounds requests are refused
//! with a status while the service keeps serving.

mod common;

use common::{call, runtime};
use stria_proto::fs::{CHUNK_BYTES_MAX, ChunkId, FsStatus, ObjectId, TargetId};
use stria_proto::wire::{
    BlockRun, ChunkMap, ChunkMapReply, ChunkPunch, ChunkWrite, ObjectSpace, ObjectSpaceReply,
    storage_method,
};
use stria_storage::StorageService;

fn service(dir: &std::path::Path) -> StorageService {
    common::service(dir, TargetId(5))
}

#[test]
fn punch_map_and_space_round_trip_and_bad_requests_are_refused() {
    let dir = std::env::temp_dir().join(format!("stria-storage-volume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let runtime = runtime();
    let service = service(&dir);
    let target = TargetId(5);
    let object = ObjectId(ObjectId::VOLUME_BIT | 9);
    let chunk = ChunkId { object, index: 3 };
    let data = vec![4u8; 40_000];
    let write = ChunkWrite { target, chunk, offset: 0, crc: crc32c::crc32c(&data), sync: false };
    call(&runtime, &service, storage_method::CHUNK_WRITE, &write, &data).expect("write");

    let map = |service: &StorageService| -> ChunkMapReply {
        let reply =
            call(&runtime, service, storage_method::CHUNK_MAP, &ChunkMap { target, chunk }, &[])
                .expect("map");
        postcard::from_bytes(&reply).expect("decode map")
    };
    let space = |service: &StorageService| -> ObjectSpaceReply {
        let request = ObjectSpace { target, object };
        let reply =
            call(&runtime, service, storage_method::OBJECT_SPACE, &request, &[]).expect("space");
        postcard::from_bytes(&reply).expect("decode space")
    };
    assert_eq!(map(&service).runs, vec![BlockRun { first_block: 0, blocks: 10 }]);
    assert_eq!(space(&service), ObjectSpaceReply { allocated_bytes: 40_960, chunks: 1 });

    let punch = ChunkPunch { target, chunk, offset: 4096, len: 8192 };
    call(&runtime, &service, storage_method::CHUNK_PUNCH, &punch, &[]).expect("punch");
    assert_eq!(
        map(&service).runs,
        vec![BlockRun { first_block: 0, blocks: 1 }, BlockRun { first_block: 3, blocks: 7 }]
    );
    assert_eq!(space(&service), ObjectSpaceReply { allocated_bytes: 8 * 4096, chunks: 1 });

    // Refused: a range past the largest chunk, a target this node does not serve, garbage.
    let past = ChunkPunch { target, chunk, offset: CHUNK_BYTES_MAX - 10, len: 20 };
    let refused = call(&runtime, &service, storage_method::CHUNK_PUNCH, &past, &[]);
    assert_eq!(refused, Err(FsStatus::Invalid.rpc_code()));
    let huge = ChunkPunch { target, chunk, offset: u32::MAX, len: u32::MAX };
    let refused = call(&runtime, &service, storage_method::CHUNK_PUNCH, &huge, &[]);
    assert_eq!(refused, Err(FsStatus::Invalid.rpc_code()));
    let elsewhere = ChunkMap { target: TargetId(6), chunk };
    let refused = call(&runtime, &service, storage_method::CHUNK_MAP, &elsewhere, &[]);
    assert_eq!(refused, Err(FsStatus::Stale.rpc_code()));
    let refused = call(&runtime, &service, storage_method::OBJECT_SPACE, &[0xffu8; 3], &[]);
    assert_eq!(refused, Err(stria_rpc::status::BAD_REQUEST));
    // Nothing changed, and punching the rest removes the chunk.
    assert_eq!(space(&service).allocated_bytes, 8 * 4096);
    let rest = ChunkPunch { target, chunk, offset: 0, len: CHUNK_BYTES_MAX };
    call(&runtime, &service, storage_method::CHUNK_PUNCH, &rest, &[]).expect("punch all");
    assert_eq!(map(&service).runs, vec![]);
    assert_eq!(space(&service), ObjectSpaceReply { allocated_bytes: 0, chunks: 0 });
    drop(service);
    let _ = std::fs::remove_dir_all(&dir);
}
