//! Request and reply messages of the management service (volumes, exports, initiator access
//! lists), postcard-encoded in the message part of an RPC frame. The CLI sends them; the REST API
//! will call the same service code.
//!
//! Every request gets an RPC-level success carrying a [`MgmtResult`]: failures are [`MgmtError`]s
//! with a status and a sentence meant for the operator, not bare codes.
//!
//! Compatibility rule: variants and fields are only ever appended.

use serde::{Deserialize, Serialize};

use crate::fs::TargetId;

/// Method numbers of the management service (block 4000..4999).
pub mod mgmt_method {
    pub const CALL: u16 = 4000;
}

/// Longest volume or export name.
pub const NAME_BYTES_MAX: usize = 64;
/// Volume sizes are multiples of this (the NBD minimum block size).
pub const VOLUME_ALIGN_BYTES: u64 = 512;
/// Largest volume: 1 PiB.
pub const VOLUME_BYTES_MAX: u64 = 1 << 50;
/// Most rules on one export's access list.
pub const ACL_RULES_MAX: usize = 256;

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum MgmtRequest {
    /// `stripe_count` 0: every target of the pool; `stripe_bytes` 0: the default chunk size.
    VolumeCreate {
        name: String,
        size_bytes: u64,
        pool: String,
        stripe_count: u32,
        stripe_bytes: u32,
    },
    VolumeList,
    VolumeShow {
        name: String,
    },
    /// Shrinking needs `force` and drops the data past the new end.
    VolumeResize {
        name: String,
        size_bytes: u64,
        force: bool,
    },
    /// Refused while the volume is exported.
    VolumeDelete {
        name: String,
    },
    /// `name` None: the export takes the volume's name.
    ExportAdd {
        volume: String,
        name: Option<String>,
        read_only: bool,
        description: String,
    },
    ExportList,
    ExportRemove {
        name: String,
    },
    /// `net`: an address or CIDR block; `tls_identity`: the client certificate's name, if any.
    InitiatorAllow {
        export: String,
        net: String,
        tls_identity: Option<String>,
    },
    InitiatorDeny {
        export: String,
        net: String,
        tls_identity: Option<String>,
    },
    /// A new volume `name` holding `source`'s data as it is now, copy-on-write (no data is
    /// copied). `snapshot`: the copy is read-only (exported read-only, never resized);
    /// otherwise it is an ordinary volume (a clone).
    VolumeCopy {
        source: String,
        name: String,
        snapshot: bool,
    },
    /// Gives volume `name` the data and size of `snapshot`, one of its own snapshots; what was
    /// written since is dropped. Refused while an NBD client is connected to the volume.
    VolumeRollback {
        name: String,
        snapshot: String,
    },
}

impl MgmtRequest {
    /// A short name for logs.
    pub fn op_name(&self) -> &'static str {
        match self {
            MgmtRequest::VolumeCreate { .. } => "volume-create",
            MgmtRequest::VolumeList => "volume-list",
            MgmtRequest::VolumeShow { .. } => "volume-show",
            MgmtRequest::VolumeResize { .. } => "volume-resize",
            MgmtRequest::VolumeDelete { .. } => "volume-delete",
            MgmtRequest::ExportAdd { .. } => "export-add",
            MgmtRequest::ExportList => "export-list",
            MgmtRequest::ExportRemove { .. } => "export-remove",
            MgmtRequest::InitiatorAllow { .. } => "initiator-allow",
            MgmtRequest::InitiatorDeny { .. } => "initiator-deny",
            MgmtRequest::VolumeCopy { snapshot: true, .. } => "volume-snapshot",
            MgmtRequest::VolumeCopy { snapshot: false, .. } => "volume-clone",
            MgmtRequest::VolumeRollback { .. } => "volume-rollback",
        }
    }
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum MgmtReply {
    Volume(VolumeInfo),
    Volumes(Vec<VolumeInfo>),
    Export(ExportInfo),
    Exports(Vec<ExportInfo>),
}

pub type MgmtResult = Result<MgmtReply, MgmtError>;

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct VolumeInfo {
    pub name: String,
    /// The volume's object id (`ObjectId::VOLUME_BIT` set).
    pub object: u64,
    pub size_bytes: u64,
    pub pool: String,
    /// Stripe size: bytes per chunk.
    pub chunk_bytes: u32,
    pub targets: Vec<TargetId>,
    /// Bytes written and not trimmed (thin provisioning); None if the targets did not answer.
    pub allocated_bytes: Option<u64>,
    pub state: String,
    /// Names of the exports that serve it.
    pub exports: Vec<String>,
    pub created_unix_s: u64,
    /// I/O served through the NBD gateway since the node started.
    pub io: VolumeIoCounts,
    /// The volume this one was copied from (a snapshot or clone), as named then.
    pub origin: Option<String>,
    /// A read-only copy: exported only read-only, never resized.
    pub snapshot: bool,
}

/// Requests a volume served through the NBD gateway, counted since the node started.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct VolumeIoCounts {
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    /// Microseconds spent serving the reads (writes), summed: over `read_ops`, the mean.
    pub read_latency_us_total: u64,
    pub write_latency_us_total: u64,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct AclRuleInfo {
    /// Normalised CIDR block, e.g. `10.0.0.0/24` or `127.0.0.1/32`.
    pub net: String,
    pub tls_identity: Option<String>,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ExportInfo {
    pub name: String,
    pub volume: String,
    pub read_only: bool,
    pub description: String,
    pub acl: Vec<AclRuleInfo>,
    /// Live figures from the NBD gateway (0 when it is not running).
    pub connections: u64,
    pub refused: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum MgmtStatus {
    /// A malformed or out-of-bounds argument.
    Invalid,
    NotFound,
    Exists,
    /// The request conflicts with the current state (delete an exported volume, shrink
    /// without force).
    Conflict,
    NoSpace,
    /// The registry or the targets failed.
    Internal,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct MgmtError {
    pub status: MgmtStatus,
    pub message: String,
}

impl MgmtError {
    pub fn new(status: MgmtStatus, message: impl Into<String>) -> MgmtError {
        MgmtError { status, message: message.into() }
    }
}

impl std::fmt::Display for MgmtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for MgmtError {}

/// Checks a volume or export name: 1 to 64 of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`.
pub fn check_name(what: &str, name: &str) -> Result<(), MgmtError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !name.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(MgmtError::new(
            MgmtStatus::Invalid,
            format!(
                "{what} name '{name}' is not valid: use 1 to {NAME_BYTES_MAX} letters, digits, \
                 '.', '_' or '-', not starting with '.' or '-'"
            ),
        ))
    }
}
