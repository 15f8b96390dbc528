//! Stria's internal RPC: length-prefixed binary frames over a byte-stream transport (TCP
//! today), many requests in flight per connection, bulk data carried raw after the header,
//! deadlines, and retries for idempotent calls.
//!
//! This crate owns framing, connections, pipelining and timeouts. It never interprets a
//! message: services decode their own (postcard) messages, and their method numbers and
//! service status codes live in `stria-proto`. The wire format is in `docs/internals/rpc.md`.
//!
//! Rules it keeps: every size is bounded before anything is allocated for it; a malformed
//! frame closes only the connection it came on; a handler that panics fails only its request;
//! with a cluster secret configured, nothing but the authentication handshake is read from a
//! peer that has not proven it holds the secret ([`auth`]).

pub mod auth;
pub mod client;
mod data;
pub mod frame;
// Public only so the fuzz targets (crates/fuzzing) can drive the socket reader; not an API.
#[doc(hidden)]
pub mod io;
pub mod pool;
pub mod server;
pub mod status;
pub mod transport;

pub use auth::{ClusterSecret, SecretError};
pub use client::{
    Client, ClientConfig, Reply, RetryPolicy, RpcError, decode_message, encode_message, retry,
};
pub use data::Data;
pub use frame::{DATA_BYTES_MAX, FrameError, Limits, MESSAGE_BYTES_MAX};
pub use pool::Pool;
pub use server::{Request, Response, Router, Server, ServerConfig, Service, ShutdownHandle};
pub use transport::{BoxFuture, Duplex, Listener, TcpAcceptor, TcpTransport, Transport};
