//! Stria's NBD gateway: serves block exports to standard NBD clients (qemu, libnbd's
//! nbdinfo/nbdcopy, fio's `nbd` engine, the Linux kernel client).
//!
//! It owns the protocol, connections, TLS and access control. It never owns data: every export
//! is a [`Backend`] (a blocking trait, called from tokio's blocking pool), and it must never
//! pass the backend a request that failed validation, nor a write whose payload did not
//! arrive in full.
//!
//! # Protocol subset
//! - Fixed-newstyle handshake only (oldstyle and plain newstyle clients are disconnected);
//!   `NBD_FLAG_C_NO_ZEROES` honoured.
//! - Options: `EXPORT_NAME`, `ABORT`, `LIST`, `STARTTLS`, `INFO`, `GO` (with `NBD_INFO_EXPORT`,
//!   `NAME`, `DESCRIPTION`, `BLOCK_SIZE`), `STRUCTURED_REPLY`, `LIST_META_CONTEXT` and
//!   `SET_META_CONTEXT` for `base:allocation`. Anything else gets `NBD_REP_ERR_UNSUP`.
//! - Commands: READ, WRITE, DISC, FLUSH, TRIM, WRITE_ZEROES (`NO_HOLE` means the backend may
//!   not trim), BLOCK_STATUS (`base:allocation`, `REQ_ONE`), with FUA; READ accepts DF (every
//!   read is one chunk). Transmission flags: `HAS_FLAGS`, `READ_ONLY` (per export),
//!   `SEND_FLUSH`, `SEND_FUA`, `SEND_TRIM`, `SEND_WRITE_ZEROES`, `SEND_DF` (with structured
//!   replies), `CAN_MULTI_CONN` (when [`Backend::flush_is_global`]).
//! - Not offered: CACHE, FAST_ZERO, RESIZE, extended headers, TLS-PSK (rustls has no PSK
//!   cipher suites; use certificates).
//!
//! # Access control
//! Each [`Export`] carries an access list of [`AclRule`]s. A connection may see and use an
//! export only if some rule matches: its peer address lies in the rule's network and, when the
//! rule names a TLS identity, the connection ran `NBD_OPT_STARTTLS` with a client certificate
//! verified against [`TlsConfig::client_ca`] whose subject CN or a DNS SAN equals it. An empty
//! list refuses everyone. `NBD_OPT_LIST` shows only usable exports. A refused `INFO`/`GO`
//! gets `NBD_REP_ERR_UNKNOWN`, exactly as for a name that does not exist, so refusals do not
//! reveal which exports exist; the one exception is a peer whose address a rule lists with an
//! identity, which gets `NBD_REP_ERR_TLS_REQD` so its client knows to retry with TLS. Each
//! refusal is counted ([`ExportStats::refusals`], [`ServerStatsSnapshot::refusals`]) and
//! logged at warn level with peer and export.
//!
//! # Limits
//! Requests must be 512-byte aligned (advertised as the minimum block size; preferred 4 KiB)
//! and READ/WRITE at most 32 MiB (EINVAL otherwise; an oversized WRITE is answered and then
//! disconnected, as its payload cannot be skipped safely). TRIM and WRITE_ZEROES carry no
//! payload and may cover up to 4 GiB - 1 (nbdcopy zeroes whole holes in one request). Option payloads
//! over 64 KiB are skipped and refused, over 1 MiB disconnected. Per connection at most
//! `in_flight_requests_per_connection_max` requests and `in_flight_bytes_per_connection_max`
//! bytes are in flight; replies the client does not read time out after
//! `reply_write_timeout`; handshakes must finish within `handshake_timeout`; the server holds
//! at most `connections_max` connections. See [`ServerConfig`].
//!
//! The design notes are in `docs/internals/nbd.md`.

mod acl;
mod backend;
pub mod client;
mod export;
mod handshake;
mod mem_backend;
mod server;
mod tls;
mod transmission;
mod transport;
pub mod wire;

pub use acl::{AclRule, IpNet, IpNetError, Peer};
pub use backend::{Backend, BackendError, BackendErrorKind, BackendFuture, Extent, PartsFuture};
pub use export::{Export, ExportError, ExportStats, Exports};
pub use mem_backend::{MEM_BLOCK_BYTES, MemBackend};
pub use server::{
    ClientInfo, Clients, Server, ServerConfig, ServerError, ServerStats, ServerStatsSnapshot,
    ShutdownHandle,
};
pub use tls::{TlsConfig, TlsSetupError, certificate_identities};
