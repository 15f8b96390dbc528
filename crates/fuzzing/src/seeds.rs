//! Seed inputs for every target, built with the project's own encoders so they are valid by
//! construction: a fuzzer starts from the real formats instead of guessing magic numbers and
//! checksums. `fuzz/corpus/<target>/seed-*` holds these bytes (the replay test writes them
//! there when `STRIA_FUZZ_WRITE_SEEDS=1`).

use bytes::Bytes;
use stria_engine::record::{BlockRef, ChunkRecord};
use stria_engine::superblock::Superblock as EngineSuperblock;
use stria_meta::record::{Body, DirBody, FileData, Inode};
use stria_nbd::wire::*;
use stria_proto::fs::{ChunkId, FileLayout, LayoutPolicy, ObjectId, TargetId};
use stria_proto::mgmt::{MgmtReply, MgmtRequest, MgmtResult};
use stria_proto::wire::{ChunkRead, ChunkWrite, FileKind, MetaReply, MetaRequest, Timestamp};
use stria_proto::{Slot, Uuid};
use stria_raid::geometry::Level;
use stria_raid::journal::{self, Entry};
use stria_raid::superblock::{BITMAP_REGION_MIN_BYTES, Layout, SlotEntry, SlotState, Superblock};
use stria_rpc::frame::Frame;

use crate::disk::{JOURNAL_ARRAY, JOURNAL_EPOCH};
use crate::nbd::{client_handshake, option, string_u32};

/// `(target, seed name, bytes)` for every seed.
pub fn all() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut add = |target: &'static str, seeds: Vec<(String, Vec<u8>)>| {
        out.extend(seeds.into_iter().map(|(name, bytes)| (target, name, bytes)));
    };
    add("rpc_frame", rpc_frame());
    add("postcard_messages", postcard_messages());
    add("nbd_handshake", nbd_handshake());
    add("nbd_transmission", nbd_transmission());
    add("rest_body", rest_body());
    add("drive_superblock", drive_superblock());
    add("raid_journal", raid_journal());
    add("engine_records", engine_records());
    add("meta_records", meta_records());
    out
}

fn with_mode(mode: u8, bytes: &[u8]) -> Vec<u8> {
    let mut v = vec![mode];
    v.extend_from_slice(bytes);
    v
}

fn rpc_frame() -> Vec<(String, Vec<u8>)> {
    let read = ChunkRead {
        target: TargetId(1),
        chunk: ChunkId { object: ObjectId(42), index: 3 },
        offset: 0,
        len: 4096,
    };
    let message = stria_rpc::encode_message(&read).expect("encodes");
    let request = Frame::request(2000, 1, 1500, message.clone(), Bytes::new(), true).to_vec();
    let write = Frame::request(2001, 2, 0, message, Bytes::from(vec![0xab; 4096]), false).to_vec();
    let response =
        Frame::response(2000, 0, 1, Bytes::new(), Bytes::from(vec![7u8; 4096]), true).to_vec();
    let mut pipeline = request.clone();
    pipeline.extend_from_slice(&write);
    pipeline.extend_from_slice(&response);
    vec![
        ("seed-request".into(), with_mode(0x02, &request)),
        ("seed-pipeline".into(), with_mode(0x42, &pipeline)),
        ("seed-pipeline-fixup".into(), with_mode(0x03, &pipeline)),
        ("seed-one-byte-reads".into(), with_mode(0x00, &response)),
    ]
}

fn attr() -> stria_proto::wire::Attr {
    stria_proto::wire::Attr {
        ino: 12,
        kind: FileKind::File,
        perm: 0o644,
        nlink: 1,
        uid: 1000,
        gid: 1000,
        size: 5 << 20,
        rdev: 0,
        atime: Timestamp::new(1_700_000_000, 1),
        mtime: Timestamp::new(1_700_000_000, 2),
        ctime: Timestamp::new(1_700_000_000, 3),
        crtime: Timestamp::new(1_700_000_000, 4),
        layout: Some(layout()),
    }
}

fn layout() -> FileLayout {
    FileLayout {
        pool: "default".into(),
        chunk_bytes: 1 << 20,
        targets: vec![TargetId(1), TargetId(2)],
    }
}

fn postcard_messages() -> Vec<(String, Vec<u8>)> {
    let index = |name: &str| {
        crate::messages::MESSAGES.iter().position(|(n, _)| *n == name).expect("listed") as u8
    };
    let encode = |value: &dyn erased::Encode| value.encode();
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        ("MetaRequest", encode(&MetaRequest::GetAttr { ino: 1 })),
        (
            "MetaRequest",
            encode(&MetaRequest::Lookup {
                caller: stria_proto::wire::Caller::new(1000, 1000).with_groups(&[10, 20]),
                parent: 1,
                name: b"hello.txt".to_vec(),
            }),
        ),
        ("MetaReply", encode(&MetaReply::Attr(attr()))),
        ("MetaReply", encode(&MetaReply::Entries(Vec::new()))),
        (
            "ChunkRead",
            encode(&ChunkRead {
                target: TargetId(3),
                chunk: ChunkId { object: ObjectId(ObjectId::VOLUME_BIT | 9), index: 1 },
                offset: 8192,
                len: 4096,
            }),
        ),
        (
            "ChunkWrite",
            encode(&ChunkWrite {
                target: TargetId(3),
                chunk: ChunkId { object: ObjectId(5), index: 0 },
                offset: 0,
                crc: 0xdead_beef,
                sync: true,
            }),
        ),
        (
            "MgmtRequest",
            encode(&MgmtRequest::VolumeCreate {
                name: "vol1".into(),
                size_bytes: 1 << 30,
                pool: "default".into(),
                stripe_count: 0,
                stripe_bytes: 0,
            }),
        ),
        ("MgmtResult", encode(&MgmtResult::Ok(MgmtReply::Volumes(Vec::new())))),
        (
            "ObjectsRemove",
            encode(&stria_proto::wire::ObjectsRemove {
                target: TargetId(2),
                objects: vec![ObjectId(7), ObjectId(8), ObjectId(1 << 40)],
            }),
        ),
    ];
    seeds
        .into_iter()
        .enumerate()
        .map(|(i, (name, bytes))| (format!("seed-{i}-{name}"), with_mode(index(name), &bytes)))
        .collect()
}

/// Object-safe postcard encoding, so the seed table above can mix message types.
mod erased {
    pub trait Encode {
        fn encode(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            postcard::to_allocvec(self).expect("seed encodes")
        }
    }
}

fn request(kind: u16, flags: u16, handle: u64, offset: u64, length: u32) -> Vec<u8> {
    RequestHeader { flags, kind, handle, offset, length }.encode().to_vec()
}

/// A little of everything the transmission phase serves, ending with a disconnect.
fn requests() -> Vec<u8> {
    let mut r = request(CMD_WRITE, CMD_FLAG_FUA, 1, 4096, 1024);
    r.extend(vec![0x5a; 1024]);
    r.extend(request(CMD_READ, 0, 2, 0, 8192));
    r.extend(request(CMD_FLUSH, 0, 3, 0, 0));
    r.extend(request(CMD_TRIM, 0, 4, 4096, 512));
    r.extend(request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 5, 65536, 4096));
    r.extend(request(CMD_BLOCK_STATUS, 0, 6, 0, 1 << 20));
    r.extend(request(CMD_DISC, 0, 7, 0, 0));
    r
}

fn nbd_handshake() -> Vec<(String, Vec<u8>)> {
    let flags = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    let mut list = flags.clone();
    list.extend(option(OPT_LIST, &[]));
    let mut info = string_u32("rw");
    info.extend_from_slice(&2u16.to_be_bytes());
    info.extend_from_slice(&INFO_NAME.to_be_bytes());
    info.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
    list.extend(option(OPT_INFO, &info));
    let mut meta = string_u32("rw");
    meta.extend_from_slice(&0u32.to_be_bytes());
    list.extend(option(OPT_STRUCTURED_REPLY, &[]));
    list.extend(option(OPT_LIST_META_CONTEXT, &meta));
    list.extend(option(OPT_STARTTLS, &[]));
    list.extend(option(99, b"unknown"));
    list.extend(option(OPT_ABORT, &[]));
    let mut export_name = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    export_name.extend(option(OPT_EXPORT_NAME, b"ro"));
    export_name.extend(request(CMD_READ, 0, 1, 0, 4096));
    let mut out = vec![("seed-options".into(), list), ("seed-export-name".into(), export_name)];
    for mode in 0..8u8 {
        let mut c = client_handshake(mode);
        c.extend(requests());
        out.push((format!("seed-go-{mode}"), c));
    }
    out
}

fn nbd_transmission() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> =
        (0..8u8).map(|mode| (format!("seed-mixed-{mode}"), with_mode(mode, &requests()))).collect();
    // Pipelined overlapping writes, then reads of what they wrote.
    let mut overlap = Vec::new();
    for (handle, offset) in [(1u64, 0u64), (2, 512), (3, 1024)] {
        overlap.extend(request(CMD_WRITE, 0, handle, offset, 2048));
        overlap.extend(vec![handle as u8; 2048]);
    }
    overlap.extend(request(CMD_READ, CMD_FLAG_DF, 9, 0, 4096));
    out.push(("seed-overlap".into(), with_mode(6, &overlap)));
    out
}

fn rest_body() -> Vec<(String, Vec<u8>)> {
    let bodies = [
        (
            "CreateVolume",
            r#"{"name":"vol-1","size_bytes":1073741824,"pool":"default","stripe_count":2,"stripe_bytes":1048576}"#,
        ),
        ("ResizeVolume", r#"{"size_bytes":2147483648,"force":true}"#),
        (
            "CreateExport",
            r#"{"volume":"vol-1","name":"exp","read_only":true,"description":"a \u00e9 test"}"#,
        ),
        ("InitiatorRule", r#"{"net":"10.0.0.0/24","tls_identity":"client-1"}"#),
        ("RebuildRate", r#"{"rate_bytes_per_s":104857600}"#),
        ("NewDrive", r#"{"path":"/dev/nvme1n1","create_bytes":null}"#),
        ("StartScrub", r#"{"repair":false,"rate_bytes_per_s":1048576}"#),
    ];
    bodies
        .iter()
        .map(|(name, body)| {
            let index = crate::rest::BODIES.iter().position(|(n, _)| n == name).expect("listed");
            (format!("seed-{name}"), with_mode(index as u8, body.as_bytes()))
        })
        .collect()
}

fn raid_superblock() -> Superblock {
    let layout = Layout::compute(1 << 30, 65536, 8 << 20, BITMAP_REGION_MIN_BYTES).expect("layout");
    let slot = |i: u8, state| SlotEntry {
        drive_uuid: Uuid([i; 16]),
        state,
        events_left: i as u64,
        rebuild_cursor: 77,
    };
    Superblock {
        array_uuid: Uuid([0xa1; 16]),
        drive_uuid: Uuid([1; 16]),
        slot: Slot(1).0,
        level: Level::Raid6,
        drives: 4,
        stripe_unit_bytes: 65536,
        clean: false,
        events: 9,
        created_unix_s: 1_790_000_000,
        layout,
        rated_endurance_bytes: 600_000_000_000_000,
        lifetime_bytes_written: 1 << 40,
        lifetime_bytes_read: 1 << 41,
        journal_epoch: 3,
        lifetime_errors: 1,
        rebuild_rate_bytes_s: 1 << 28,
        slots: vec![
            slot(0, SlotState::Active),
            slot(1, SlotState::Active),
            slot(2, SlotState::Rebuilding),
            slot(3, SlotState::Failed),
            slot(4, SlotState::Spare),
        ],
    }
}

fn drive_superblock() -> Vec<(String, Vec<u8>)> {
    let label = raid_superblock().encode();
    vec![
        ("seed-label".into(), with_mode(0, &label)),
        ("seed-label-fixup".into(), with_mode(1, &label)),
    ]
}

fn raid_journal() -> Vec<(String, Vec<u8>)> {
    let entries = [Entry { drive: 0, row: 2, rows: 1 }, Entry { drive: 3, row: 2, rows: 1 }];
    let (a, b) = (vec![0x11u8; 4096], vec![0x22u8; 4096]);
    let record = journal::encode(JOURNAL_ARRAY, JOURNAL_EPOCH, 5, 40, &entries, &[&a, &b]);
    let stale = journal::encode(JOURNAL_ARRAY, JOURNAL_EPOCH + 1, 6, 41, &entries[..1], &[&a]);
    let mut ring = vec![0u8; 4096];
    ring.extend_from_slice(&record);
    ring.extend_from_slice(&stale);
    vec![("seed-ring".into(), with_mode(0, &ring)), ("seed-ring-fixup".into(), with_mode(1, &ring))]
}

fn engine_records() -> Vec<(String, Vec<u8>)> {
    let mut record = ChunkRecord { len_bytes: 10 * 4096 - 100, blocks: vec![None; 10] };
    for i in 1..6 {
        record.blocks[i] = Some(BlockRef { physical: 1000 + i as u64, crc: i as u32 });
    }
    record.blocks[8] = Some(BlockRef { physical: 7, crc: 8 });
    let sb = EngineSuperblock {
        target: TargetId(4),
        engine_uuid: Uuid([4; 16]),
        array_uuid: Uuid([5; 16]),
        data_start_block: 256,
        block_count: 1 << 20,
    };
    vec![
        ("seed-chunk-record".into(), with_mode(0, &record.encode())),
        ("seed-empty-record".into(), with_mode(0, &ChunkRecord::default().encode())),
        ("seed-superblock".into(), with_mode(1, &sb.encode())),
        ("seed-superblock-fixup".into(), with_mode(3, &sb.encode())),
    ]
}

fn inode(kind: FileKind, body: Body) -> Inode {
    let t = stria_meta::Timestamp::new(1_700_000_000, 5);
    Inode {
        kind,
        mode: 0o755,
        uid: 1000,
        gid: 100,
        nlink: 1,
        size: 4,
        atime: t,
        mtime: t,
        ctime: t,
        rdev: 0,
        parent: 1,
        fileset: 12,
        version: 3,
        ext: "txt".into(),
        body,
    }
}

fn meta_records() -> Vec<(String, Vec<u8>)> {
    let inodes = [
        ("inline", inode(FileKind::File, Body::File(FileData::Inline(b"data".to_vec())))),
        ("chunked", inode(FileKind::File, Body::File(FileData::Chunked(layout())))),
        (
            "dir",
            inode(
                FileKind::Dir,
                Body::Dir(DirBody { next_seq: 3, policy: LayoutPolicy::default() }),
            ),
        ),
        ("symlink", inode(FileKind::Symlink, Body::Symlink(b"../target".to_vec()))),
        ("fifo", inode(FileKind::Fifo, Body::Special)),
    ];
    inodes
        .into_iter()
        .enumerate()
        .map(|(i, (name, inode))| {
            (format!("seed-{name}"), with_mode(i as u8, &inode.encode().expect("encodes")))
        })
        .collect()
}
