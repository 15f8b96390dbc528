//! Serves one in-memory export to loopback clients until Ctrl-C.
//!
//! ```text
//! cargo run -p stria-nbd --example serve_mem -- 127.0.0.1:10809 64
//! nbdinfo nbd://127.0.0.1:10809/mem
//! ```

use std::sync::Arc;

use stria_nbd::{AclRule, Export, Exports, MemBackend, Server, ServerConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:10809".to_string());
    let size_mib: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(64);

    let exports = Exports::new();
    exports.insert(
        "mem",
        Export {
            backend: Arc::new(MemBackend::new(size_mib << 20)),
            description: format!("{size_mib} MiB in memory"),
            read_only: false,
            acl: vec![AclRule::new("127.0.0.0/8", None)?, AclRule::new("::1", None)?],
        },
    )?;
    let server = Server::new(exports, ServerConfig::default())?;
    let shutdown = server.shutdown_handle();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        shutdown.shutdown();
    });
    server.serve(tokio::net::TcpListener::bind(&addr).await?).await?;
    Ok(())
}
