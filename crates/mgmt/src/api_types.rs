//! Request and response bodies of the REST API that are not the node view's own types.
//!
//! Request bodies refuse unknown fields, so a misspelt field is a 400 naming it rather than a
//! silently ignored option.

use serde::{Deserialize, Serialize};
use stria_proto::fs::TargetId;
use stria_proto::mgmt::{AclRuleInfo, ExportInfo, VolumeInfo};
use utoipa::ToSchema;

use crate::events::Event;
use crate::node_view::{NodeIdentity, TargetState};

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the API answers.
    pub status: String,
    pub version: String,
}

/// One node of the cluster.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Node {
    #[serde(flatten)]
    pub identity: NodeIdentity,
    pub uptime_s: u64,
    /// The worst state of the node's targets.
    pub state: TargetState,
    pub targets: u32,
    pub drives: u32,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Cluster {
    pub version: String,
    /// The worst state of any target.
    pub state: TargetState,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub volumes: u32,
    pub exports: u32,
    /// Nodes (one per `stria up` today).
    pub nodes: Vec<Node>,
}

/// A pool: the targets files and volumes draw space from.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Pool {
    pub name: String,
    #[schema(value_type = Vec<u32>)]
    pub targets: Vec<TargetId>,
    /// The worst state of its targets.
    pub state: TargetState,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub volumes: u32,
    /// Bytes promised to its volumes (thin: more than the capacity is allowed).
    pub provisioned_bytes: u64,
}

/// The file system as `statfs` reports it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct FileSystem {
    pub name: String,
    pub pool: String,
    /// Where it is mounted on this node, if it is.
    pub mount: Option<String>,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub used_bytes: u64,
    pub inodes_total: u64,
    pub inodes_used: u64,
    pub inodes_free: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct Volume {
    pub name: String,
    /// The volume's object id.
    pub object: u64,
    pub size_bytes: u64,
    pub pool: String,
    /// Stripe size: bytes per chunk.
    pub chunk_bytes: u32,
    #[schema(value_type = Vec<u32>)]
    pub targets: Vec<TargetId>,
    /// Bytes written and not trimmed; absent if a target did not answer.
    pub allocated_bytes: Option<u64>,
    /// `online`, `copying` (a snapshot or clone being made), `rolling-back` (being given a
    /// snapshot's data; not exported meanwhile), `deleting`, or `deleted` in the reply to a
    /// delete.
    pub state: String,
    /// Exports that serve it.
    pub exports: Vec<String>,
    pub created_unix_s: u64,
    /// The volume this one was copied from (snapshot or clone), as named then.
    pub origin: Option<String>,
    /// A read-only copy: exported only read-only, never resized.
    pub snapshot: bool,
}

impl From<VolumeInfo> for Volume {
    fn from(v: VolumeInfo) -> Volume {
        Volume {
            name: v.name,
            object: v.object,
            size_bytes: v.size_bytes,
            pool: v.pool,
            chunk_bytes: v.chunk_bytes,
            targets: v.targets,
            allocated_bytes: v.allocated_bytes,
            state: v.state,
            exports: v.exports,
            created_unix_s: v.created_unix_s,
            origin: v.origin,
            snapshot: v.snapshot,
        }
    }
}

/// An access rule: who may connect to an export.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct AclRule {
    /// Normalised CIDR block, e.g. `10.0.0.0/24` or `127.0.0.1/32`.
    pub net: String,
    /// Required TLS client identity, if any.
    pub tls_identity: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct Export {
    pub name: String,
    pub volume: String,
    pub read_only: bool,
    pub description: String,
    /// Initiators allowed to connect; empty: nobody.
    pub acl: Vec<AclRule>,
    /// Connections that opened the export since the node started.
    pub connections: u64,
    /// Attempts the access list refused since the node started.
    pub refused: u64,
}

impl From<ExportInfo> for Export {
    fn from(e: ExportInfo) -> Export {
        Export {
            name: e.name,
            volume: e.volume,
            read_only: e.read_only,
            description: e.description,
            acl: e
                .acl
                .into_iter()
                .map(|AclRuleInfo { net, tls_identity }| AclRule { net, tls_identity })
                .collect(),
            connections: e.connections,
            refused: e.refused,
        }
    }
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct EventPage {
    /// Oldest first.
    pub events: Vec<Event>,
    /// The newest event's number: pass it as `since` to get only what comes after.
    pub last_seq: u64,
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// 1 to 64 of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`.
    pub name: String,
    /// A non-zero multiple of 512, at most 1 PiB.
    pub size_bytes: u64,
    /// Default `default`.
    #[serde(default)]
    pub pool: Option<String>,
    /// Targets to stripe over; default every target of the pool.
    #[serde(default)]
    pub stripe_count: Option<u32>,
    /// Bytes per chunk; default 1 MiB.
    #[serde(default)]
    pub stripe_bytes: Option<u32>,
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyVolume {
    /// The new volume's name.
    pub name: String,
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackVolume {
    /// One of the volume's own snapshots.
    pub snapshot: String,
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeVolume {
    pub size_bytes: u64,
    /// Needed to shrink: the data past the new end is lost.
    #[serde(default)]
    pub force: bool,
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateExport {
    /// The volume to serve.
    pub volume: String,
    /// Export name; default the volume's name.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub read_only: bool,
    /// At most 1024 bytes.
    #[serde(default)]
    pub description: String,
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InitiatorRule {
    /// An address (`10.0.0.7`) or CIDR block (`10.0.0.0/24`); host bits past the prefix are
    /// refused as a likely typo.
    pub net: String,
    /// Also require this TLS client identity.
    #[serde(default)]
    pub tls_identity: Option<String>,
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RebuildRate {
    /// Bytes per second a rebuild may move, 1 MiB/s to 100 GiB/s.
    pub rate_bytes_per_s: u64,
}

/// A drive for a target: to replace a failed slot's drive, or to be a hot spare.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewDrive {
    /// An absolute path (a drive file or a block device), or a bare file name, which means
    /// `DATA/drives/NAME` on the node. Refused: other relative paths, paths with `..`, files
    /// of the node's data directory outside `DATA/drives/`, drives of any target already.
    pub path: String,
    /// Create the drive file first, sparse, of this many bytes (it must not exist yet); at
    /// least what the target's drives hold. Absent: the path must exist.
    #[serde(default)]
    pub create_bytes: Option<u64>,
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartScrub {
    /// Rewrite bad blocks and stale parity from redundancy (default); false only reports.
    #[serde(default = "yes")]
    pub repair: bool,
    /// Bytes read per second, at least 1 MiB/s; default unlimited.
    #[serde(default)]
    pub rate_bytes_per_s: Option<u64>,
}

fn yes() -> bool {
    true
}

/// Regular files and their logical bytes (hard links counted once).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct UsageCount {
    pub files: u64,
    pub bytes: u64,
}

/// Usage of one owner (uid).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct UserUsage {
    pub uid: u32,
    /// The name in this node's `/etc/passwd`, if it has one.
    pub name: Option<String>,
    pub files: u64,
    pub bytes: u64,
}

/// Usage of one group (gid).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct GroupUsage {
    pub gid: u32,
    /// The name in this node's `/etc/group`, if it has one.
    pub name: Option<String>,
    pub files: u64,
    pub bytes: u64,
}

/// Usage of one fileset: a top-level directory, or (`name` "/") the files directly in the root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct FilesetUsage {
    pub name: String,
    /// Inode number of the top-level directory (1 for the root's own files).
    pub ino: u64,
    pub files: u64,
    pub bytes: u64,
}

/// Usage of one file-name extension: lower-cased, after the last dot, up to 16 letters or
/// digits; "" for names without one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct ExtensionUsage {
    pub extension: String,
    pub files: u64,
    pub bytes: u64,
}

/// One file-size class: files of at least `size_min_bytes` and under `size_max_bytes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct SizeClass {
    /// For people: "< 4 KiB", "4 KiB – 64 KiB", ..., ">= 64 MiB".
    pub label: String,
    pub size_min_bytes: u64,
    /// Exclusive; null for the last class.
    pub size_max_bytes: Option<u64>,
    pub files: u64,
    pub bytes: u64,
}

/// File-system analytics from the metadata service's usage counters (kept current by every
/// change; the tree is not walked). Rankings hold the `top` entries with the most bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct Analytics {
    pub top: u32,
    pub total: UsageCount,
    pub users: Vec<UserUsage>,
    pub groups: Vec<GroupUsage>,
    pub filesets: Vec<FilesetUsage>,
    pub extensions: Vec<ExtensionUsage>,
    /// Five classes, smallest first: < 4 KiB, < 64 KiB, < 1 MiB, < 64 MiB, >= 64 MiB.
    pub size_histogram: Vec<SizeClass>,
}
