//! The management role: the registry of block volumes, their NBD exports and the initiators
//! allowed to use them, and the service that changes it.
//!
//! - [`Registry`] keeps the records in one redb file (`DATA/mgmt/registry.redb` under
//!   `stria up`), each change a durable transaction.
//! - [`Mgmt`] carries out requests ([`stria_proto::mgmt::MgmtRequest`]): it validates them,
//!   changes the registry, does the data work through the client library (a volume's chunks are
//!   removed on delete, trimmed past the end on shrink) and tells the NBD gateway
//!   ([`Gateway`]) what to serve.
//! - [`MgmtRpc`] serves it on the internal RPC (method `mgmt_method::CALL`); the CLI is its
//!   client. The REST API will call [`Mgmt::handle`] too, so there is one code path.
//!
//! Snapshots and clones are not built yet (the chunk engine has no shared blocks).

mod registry;
mod service;

pub use registry::{AclRule, ExportRecord, Registry, VolumeRecord, VolumeState};
pub use service::{ExportStats, Gateway, Mgmt, MgmtRpc, PoolResolver};
