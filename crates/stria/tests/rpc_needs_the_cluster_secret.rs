//! The services of `stria up` (metadata, storage, management) serve only RPC peers that prove
//! they hold the node's cluster secret, made at the first start in `DATA/cluster-secret`. The
//! CLI reads it from there; a wrong secret gets a clear error, never service.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use bytes::Bytes;
use stria_rpc::{Client, ClientConfig, ClusterSecret, RpcError, status};
use support::node::{Node, require_fuse, scratch};

const T: Duration = Duration::from_secs(10);

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn only_peers_with_the_secret_reach_the_services() {
    require_fuse();
    let dir = scratch("cluster-secret");
    let node = Node::start(&dir, &["--drives", "3", "--drive-size", "128M", "--raid", "5"]);

    let secret_file = node.data.join("cluster-secret");
    let mode = std::fs::metadata(&secret_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "only the node's owner may read the secret");
    let hex = std::fs::read_to_string(&secret_file).unwrap();
    assert_eq!(hex.trim().len(), 64, "{hex}");
    let secret = ClusterSecret::load(&secret_file).unwrap();

    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(node.data.join("run.json")).unwrap())
            .unwrap();
    let addr = |key: &str| -> SocketAddr { run[key].as_str().unwrap().parse().unwrap() };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // A method number no service has: an authenticated peer gets "unknown method" back.
    const NO_SUCH_METHOD: u16 = 65_000;
    for role in ["meta", "storage", "mgmt"] {
        runtime.block_on(async {
            let anonymous = Client::new(addr(role), ClientConfig::default());
            let refused = anonymous.call(NO_SUCH_METHOD, Bytes::new(), Bytes::new(), T).await;
            let refused = refused.unwrap_err().to_string();
            assert!(
                refused.contains("unauthenticated") && refused.contains("cluster secret"),
                "{role} without a secret: {refused}"
            );

            let stranger = ClientConfig {
                secret: Some(ClusterSecret::from_bytes(&[0x5a; 32])),
                ..ClientConfig::default()
            };
            let error = Client::connect_with(addr(role), stranger).await.unwrap_err();
            assert!(matches!(error, RpcError::Unauthenticated { .. }), "{role}: {error:?}");

            let member = ClientConfig { secret: Some(secret.clone()), ..ClientConfig::default() };
            let client = Client::connect_with(addr(role), member).await.unwrap();
            let reply = client.call(NO_SUCH_METHOD, Bytes::new(), Bytes::new(), T).await.unwrap();
            assert_eq!(reply.status, status::UNKNOWN_METHOD, "{role} serves a member");
        });
    }

    // The CLI proves the secret it finds in the data directory.
    let out = node.cli(&["df"]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(&secret_file, format!("{}\n", "ab".repeat(32))).unwrap();
    let out = node.cli(&["df"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("refused this command's cluster secret"), "{}", text(&out));
    let out = node.cli(&["volume", "list"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("refused this command"), "{}", text(&out));
    let log = std::fs::read_to_string(node.data.join("logs/stria.log")).unwrap();
    assert!(log.contains("not authenticated"), "the node logs refused peers");
    std::fs::remove_file(&secret_file).unwrap();
    let out = node.cli(&["df"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("cannot read the cluster secret"), "{}", text(&out));
    std::fs::write(&secret_file, hex).unwrap();
    let out = node.cli(&["df"]);
    assert!(out.status.success(), "{}", text(&out));
}
