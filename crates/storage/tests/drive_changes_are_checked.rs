//! Drive changes on a running target (TargetReplaceDrive, TargetAddSpare): bad paths, sizes
//! and slots are refused with the field at fault and nothing is left behind; a good change
//! puts the drive in, rebuilds it in the background and is recorded before and after; a spare
//! that takes a failed slot is recorded too.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{call, runtime, service};
use stria_proto::fs::{ChunkId, FsStatus, ObjectId, TargetId};
use stria_proto::wire::{
    ChunkRead, ChunkWrite, DriveChangeRefused, DriveField, TargetAddSpare, TargetFailDrive,
    TargetInfo, TargetReplaceDrive, storage_method,
};
use stria_storage::{DriveAdmin, Membership, MembershipRecorder, StorageService};

const MIB: u64 = 1 << 20;

/// Keeps every membership the service records.
#[derive(Default)]
struct Recorded(Mutex<Vec<(TargetId, Membership)>>);

impl MembershipRecorder for Recorded {
    fn record(&self, target: TargetId, membership: &Membership) -> Result<(), String> {
        self.0.lock().expect("lock").push((target, membership.clone()));
        Ok(())
    }
}

impl Recorded {
    fn last(&self) -> Membership {
        self.0.lock().expect("lock").last().expect("something was recorded").1.clone()
    }

    fn count(&self) -> usize {
        self.0.lock().expect("lock").len()
    }
}

/// Sends a drive change; its reply, or its status and explanation.
fn change<T: serde::Serialize>(
    runtime: &tokio::runtime::Runtime,
    service: &StorageService,
    method: u16,
    request: &T,
) -> Result<TargetInfo, (FsStatus, DriveChangeRefused)> {
    let message = Bytes::from(postcard::to_stdvec(request).expect("encode"));
    match runtime.block_on(service.handle(method, message, Bytes::new())) {
        Ok((reply, _)) => Ok(postcard::from_bytes(&reply).expect("a TargetInfo")),
        Err(refusal) => {
            let status = FsStatus::from_rpc_code(refusal.status).expect("a file-system status");
            let why = postcard::from_bytes(&refusal.message).expect("refusals explain themselves");
            Err((status, why))
        }
    }
}

fn replace(slot: u32, path: &Path, create_bytes: Option<u64>) -> TargetReplaceDrive {
    TargetReplaceDrive { target: TargetId(1), slot, path: path.display().to_string(), create_bytes }
}

fn refused(
    result: Result<TargetInfo, (FsStatus, DriveChangeRefused)>,
) -> (FsStatus, Option<DriveField>, String) {
    let (status, why) = result.expect_err("refused");
    (status, why.field, why.message)
}

#[test]
fn drive_changes_are_checked_recorded_and_rebuilt() {
    let dir = std::env::temp_dir().join(format!("stria-storage-drives-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let dir = dir.canonicalize().expect("canonical");
    let drives = dir.join("drives");
    let runtime = runtime();
    let target = TargetId(1);

    // Without a record to keep changes in, the service refuses them.
    let bare = service(&dir.join("bare"), target);
    let (status, _, message) = refused(change(
        &runtime,
        &bare,
        storage_method::TARGET_ADD_SPARE,
        &TargetAddSpare { target, path: "x.img".into(), create_bytes: Some(16 * MIB) },
    ));
    assert_eq!(status, FsStatus::NotSupported, "{message}");

    let recorded = Arc::new(Recorded::default());
    let service = service(&dir.join("map"), target).with_drive_admin(DriveAdmin {
        drive_dir: drives.clone(),
        reserved_dirs: vec![dir.clone()],
        recorder: recorded.clone(),
    });
    let chunk = ChunkId { object: ObjectId(3), index: 0 };
    let data: Vec<u8> = (0..256 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let write = ChunkWrite { target, chunk, offset: 0, crc: crc32c::crc32c(&data), sync: true };
    call(&runtime, &service, storage_method::CHUNK_WRITE, &write, &data).expect("write");

    // A slot in service cannot be replaced; nor can one that does not exist.
    let in_service = change(
        &runtime,
        &service,
        storage_method::TARGET_REPLACE_DRIVE,
        &replace(1, &drives.join("n.img"), Some(16 * MIB)),
    );
    let (status, field, message) = refused(in_service);
    assert_eq!((status, field), (FsStatus::Busy, Some(DriveField::Slot)), "{message}");
    assert!(message.contains("fail it first"), "{message}");
    let (status, field, _) = refused(change(
        &runtime,
        &service,
        storage_method::TARGET_REPLACE_DRIVE,
        &replace(7, &drives.join("n.img"), Some(16 * MIB)),
    ));
    assert_eq!((status, field), (FsStatus::Invalid, Some(DriveField::Slot)));

    let fail = TargetFailDrive { target, slot: 1 };
    call(&runtime, &service, storage_method::TARGET_FAIL_DRIVE, &fail, &[]).expect("fail slot 1");

    // Bad paths and sizes name their field; nothing is created or recorded for them.
    let cases: Vec<(TargetReplaceDrive, FsStatus, DriveField, &str)> = vec![
        (
            TargetReplaceDrive { path: "sub/x.img".into(), ..replace(1, &dir, None) },
            FsStatus::Invalid,
            DriveField::Path,
            "relative",
        ),
        (
            TargetReplaceDrive { path: "/a/../x.img".into(), ..replace(1, &dir, None) },
            FsStatus::Invalid,
            DriveField::Path,
            "..",
        ),
        (
            replace(1, &drives.join("small.img"), Some(MIB)),
            FsStatus::Invalid,
            DriveField::CreateBytes,
            "at least",
        ),
        (
            replace(1, &drives.join("absent.img"), None),
            FsStatus::NotFound,
            DriveField::Path,
            "does not exist",
        ),
        (
            replace(1, &dir.join("own.img"), Some(16 * MIB)),
            FsStatus::Invalid,
            DriveField::Path,
            "data directory",
        ),
    ];
    let records = recorded.count();
    for (request, status, field, words) in cases {
        let (s, f, message) =
            refused(change(&runtime, &service, storage_method::TARGET_REPLACE_DRIVE, &request));
        assert_eq!((s, f), (status, Some(field)), "{request:?}: {message}");
        assert!(message.contains(words), "{request:?}: {message}");
    }
    assert!(!drives.join("small.img").exists() && !dir.join("own.img").exists());
    assert_eq!(recorded.count(), records, "refused changes are not recorded");

    // A file too small for the array, existing already.
    std::fs::create_dir_all(&drives).expect("drives dir");
    let small = drives.join("tiny.img");
    std::fs::File::create(&small).and_then(|f| f.set_len(4 * MIB)).expect("tiny file");
    let (status, field, message) = refused(change(
        &runtime,
        &service,
        storage_method::TARGET_REPLACE_DRIVE,
        &replace(1, &small, None),
    ));
    assert_eq!((status, field), (FsStatus::Invalid, Some(DriveField::Path)), "{message}");
    assert!(message.contains("needs at least"), "{message}");
    let (status, _, message) = refused(change(
        &runtime,
        &service,
        storage_method::TARGET_REPLACE_DRIVE,
        &replace(1, &small, Some(16 * MIB)),
    ));
    assert_eq!(status, FsStatus::Exists, "create_bytes needs a new file: {message}");

    // A bare name means the drive directory: created sparse, in, recorded, rebuilt.
    let request = TargetReplaceDrive { path: "new.img".into(), ..replace(1, &dir, Some(16 * MIB)) };
    let info = change(&runtime, &service, storage_method::TARGET_REPLACE_DRIVE, &request)
        .expect("replace slot 1");
    assert_eq!(info.target, target);
    let new = drives.join("new.img");
    assert_eq!(std::fs::metadata(&new).expect("created").len(), 16 * MIB);
    let all = recorded.0.lock().expect("lock").clone();
    let (pending, done) = (&all[all.len() - 2].1, &all[all.len() - 1].1);
    assert!(pending.spares.contains(&new), "the new drive is recorded before it joins");
    assert_eq!(done.members[1].as_ref(), Some(&new), "and then as slot 1: {done:?}");
    assert!(!done.spares.contains(&new));
    let array = service.targets().next().expect("target").array.clone();
    array.wait_rebuild().expect("the rebuild finishes");
    assert_eq!(format!("{:?}", array.status().state), "Optimal");

    // The new drive holds the data: with slot 0 failed, reads come from it alone.
    let (status, field, message) = refused(change(
        &runtime,
        &service,
        storage_method::TARGET_ADD_SPARE,
        &TargetAddSpare { target, path: "new.img".into(), create_bytes: None },
    ));
    assert_eq!((status, field), (FsStatus::Invalid, Some(DriveField::Path)), "{message}");
    assert!(message.contains("already a drive of target 1 slot 1"), "{message}");
    let spare = TargetAddSpare { target, path: "spare.img".into(), create_bytes: Some(16 * MIB) };
    change(&runtime, &service, storage_method::TARGET_ADD_SPARE, &spare).expect("add a spare");
    assert_eq!(recorded.last().spares, vec![drives.join("spare.img")]);
    let fail = TargetFailDrive { target, slot: 0 };
    call(&runtime, &service, storage_method::TARGET_FAIL_DRIVE, &fail, &[]).expect("fail slot 0");
    let after: Membership = recorded.last();
    assert_eq!(after.members[0].as_ref(), Some(&drives.join("spare.img")), "{after:?}");
    assert!(after.spares.is_empty(), "the spare took the failed slot: {after:?}");
    array.wait_rebuild().expect("the spare's rebuild finishes");
    let read = ChunkRead { target, chunk, offset: 0, len: data.len() as u32 };
    let message = Bytes::from(postcard::to_stdvec(&read).expect("encode"));
    let (_, bytes) = runtime
        .block_on(service.handle(storage_method::CHUNK_READ, message, Bytes::new()))
        .expect("read back");
    assert!(bytes == data[..], "the data survived two drive changes");
    drop(service);
    let _ = std::fs::remove_dir_all(&dir);
}
