//! The management role: the registry of block volumes, their NBD exports and the initiators
//! allowed to use them, the service that changes it, and the node's REST API, metrics, event
//! log and performance series.
//!
//! - [`Registry`] keeps the records in one redb file (`DATA/mgmt/registry.redb` under
//!   `stria up`), each change a durable transaction.
//! - [`Mgmt`] carries out requests ([`stria_proto::mgmt::MgmtRequest`]): it validates them,
//!   changes the registry, does the data work through the client library (a volume's chunks are
//!   removed on delete, trimmed past the end on shrink), tells the NBD gateway ([`Gateway`])
//!   what to serve and records each change in its [`EventLog`].
//! - [`MgmtRpc`] serves it on the internal RPC (method `mgmt_method::CALL`); the CLI is its
//!   client. The REST API ([`api`]) calls [`Mgmt::handle`] too, so there is one code path.
//! - The node's hardware (drives, targets) reaches mgmt through the [`NodeView`] trait, which
//!   the node implements; mgmt never depends on the RAID or storage crates.
//! - [`Monitor`] samples the node every second: an hour of series for charts, and events for
//!   the state changes it sees. [`metrics`] renders the Prometheus exposition.
//! - [`dashboard`] serves the web dashboard (`web/` at the repository root, compiled in): a page
//!   that reads and changes everything through the REST API.
//!
//! It must never serve data without the API token (`api_auth`) except the health check and
//! the OpenAPI document (the dashboard's static files hold no data). Snapshots and clones are not built yet (the chunk engine has no shared
//! blocks). The REST API is described in `docs/internals/mgmt.md`.

pub mod api;
mod api_analytics;
pub mod api_auth;
mod api_drives;
pub mod api_error;
pub mod api_types;
mod api_volumes;
pub mod dashboard;
pub mod events;
pub mod metrics;
pub mod monitor;
pub mod node_view;
mod registry;
mod service;

pub use api::ApiServer;
pub use api_auth::ApiToken;
pub use events::{Event, EventKind, EventLog, Severity};
pub use monitor::Monitor;
pub use node_view::NodeView;
pub use registry::{AclRule, ExportRecord, Registry, VolumeOrigin, VolumeRecord, VolumeState};
pub use service::{
    DriveChangeRefusal, ExportStats, Gateway, GatewayClient, Mgmt, MgmtRpc, PoolResolver, WriteHold,
};
