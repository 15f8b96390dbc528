//! The postcard messages carried in RPC frames, decoded exactly as the services decode them:
//! an accepted message encodes to at most the bytes it came from and decodes back to itself,
//! and no decode allocates far beyond what its input could describe.

use serde::Serialize;
use serde::de::DeserializeOwned;
use stria_proto::mgmt::{MgmtRequest, MgmtResult};
use stria_proto::wire::{
    ChunkMap, ChunkMapReply, ChunkPunch, ChunkRead, ChunkTruncate, ChunkWrite, DriveChangeRefused,
    MetaReply, MetaRequest, ObjectRemove, ObjectSpace, ObjectSpaceReply, ObjectsRemove,
    TargetAddSpare, TargetFailDrive, TargetInfo, TargetReplaceDrive, TargetSync,
};

use crate::{largest_allocation_during, mode_and_rest};

/// Largest single allocation a decode may make beyond a small multiple of its input: serde
/// caps what it reserves ahead from a declared length (about 1 MiB), so a forged length alone
/// must not buy more.
const PREALLOCATION_BYTES_MAX: usize = 1024 * 1024;

/// Every message type a service or client decodes from a frame, as `(name, check)`.
pub const MESSAGES: &[(&str, crate::Target)] = &[
    ("MetaRequest", check::<MetaRequest>),
    ("MetaReply", check::<MetaReply>),
    ("ChunkRead", check::<ChunkRead>),
    ("ChunkWrite", check::<ChunkWrite>),
    ("ChunkTruncate", check::<ChunkTruncate>),
    ("ObjectRemove", check::<ObjectRemove>),
    ("ChunkPunch", check::<ChunkPunch>),
    ("ChunkMap", check::<ChunkMap>),
    ("ChunkMapReply", check::<ChunkMapReply>),
    ("ObjectSpace", check::<ObjectSpace>),
    ("ObjectSpaceReply", check::<ObjectSpaceReply>),
    ("TargetSync", check::<TargetSync>),
    ("TargetFailDrive", check::<TargetFailDrive>),
    ("TargetReplaceDrive", check::<TargetReplaceDrive>),
    ("TargetAddSpare", check::<TargetAddSpare>),
    ("DriveChangeRefused", check::<DriveChangeRefused>),
    ("TargetInfo", check::<TargetInfo>),
    ("Vec<TargetInfo>", check::<Vec<TargetInfo>>),
    ("MgmtRequest", check::<MgmtRequest>),
    ("MgmtResult", check::<MgmtResult>),
    ("ObjectsRemove", check::<ObjectsRemove>),
];

/// Input: one byte picking the message type (modulo the table), then the message part.
pub fn postcard_messages(data: &[u8]) {
    let (which, message) = mode_and_rest(data);
    let (_, check) = MESSAGES[which as usize % MESSAGES.len()];
    check(message);
}

fn check<T>(message: &[u8])
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let (decoded, largest) = largest_allocation_during(|| stria_rpc::decode_message::<T>(message));
    if let Some(largest) = largest {
        let bound = PREALLOCATION_BYTES_MAX + 64 * message.len();
        assert!(largest <= bound, "decoding {} bytes allocated {largest} at once", message.len());
    }
    let Ok(value) = decoded else { return };
    let again = postcard::to_allocvec(&value).expect("a decoded message encodes");
    assert!(
        again.len() <= message.len(),
        "{value:?} re-encodes to {} bytes, more than the {} it came from",
        again.len(),
        message.len()
    );
    let back: T = postcard::from_bytes(&again).expect("a re-encoded message decodes");
    assert_eq!(back, value, "message does not survive encode and decode");
}
