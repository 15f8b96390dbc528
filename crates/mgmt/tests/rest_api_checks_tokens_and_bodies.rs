//! The REST router on a real management service (registry in a scratch file) and a fake node:
//! the token is required where it must be, bad bodies get 400 naming the field, management
//! errors map to their HTTP statuses, and changes land in the event log.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};
use stria_mgmt::api::{ApiState, router};
use stria_mgmt::node_view::*;
use stria_mgmt::{ApiToken, Mgmt, Monitor, NodeView, PoolResolver, Registry};
use stria_proto::fs::TargetId;
use stria_proto::mgmt::{MgmtError, MgmtStatus};
use tower::ServiceExt;

const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// One RAID 5 target of three drives; records the actions it is asked for.
#[derive(Default)]
struct FakeNode {
    rebuild_rate: Mutex<Option<u64>>,
    scrubbing: Mutex<bool>,
}

impl NodeView for FakeNode {
    fn targets(&self) -> Vec<TargetStatus> {
        let drive = |slot: u32| DriveStatus {
            id: format!("drive-{slot}"),
            device: format!("/data/t1-d{slot}.img"),
            backend: "memory".into(),
            target: TargetId(1),
            slot: Some(slot),
            state: "active".into(),
            capacity_bytes: Some(1 << 30),
            read_bytes: 0,
            written_bytes: 0,
            read_ops: 0,
            write_ops: 0,
            errors: 0,
            lifetime_written_bytes: 0,
            rated_endurance_bytes: 0,
            wear_percent: None,
            remaining_life_days: None,
            read_latency_p99_us: 0,
            write_latency_p99_us: 0,
        };
        let scrubbing = *self.scrubbing.lock().expect("lock");
        vec![TargetStatus {
            id: TargetId(1),
            pool: "default".into(),
            state: TargetState::Optimal,
            geometry: Geometry {
                level: "raid5".into(),
                drives: 3,
                data_drives: 2,
                stripe_unit_bytes: 65536,
                tolerated_failures: 1,
                array_capacity_bytes: 2 << 30,
            },
            space: Space { total_bytes: 2 << 30, ..Space::default() },
            rebuild: None,
            rebuild_rate_limit_bytes_per_s: self.rebuild_rate.lock().expect("lock").unwrap_or(1),
            scrub: ScrubStatus {
                state: if scrubbing { ScrubState::Running } else { ScrubState::Idle },
                ..ScrubStatus::idle()
            },
            checksum_errors: 0,
            repaired_blocks: 0,
            unrecoverable_blocks: 0,
            io: TargetIo::default(),
            read_cache: ReadCache::default(),
            warnings: Vec::new(),
            drives: (0..3).map(drive).collect(),
        }]
    }

    fn set_rebuild_rate(&self, _target: TargetId, bytes_per_s: u64) -> Result<(), MgmtError> {
        *self.rebuild_rate.lock().expect("lock") = Some(bytes_per_s);
        Ok(())
    }

    fn start_scrub(&self, _: TargetId, _: bool, _: Option<u64>) -> Result<(), MgmtError> {
        let mut scrubbing = self.scrubbing.lock().expect("lock");
        if *scrubbing {
            return Err(MgmtError::new(MgmtStatus::Conflict, "a scrub runs already"));
        }
        *scrubbing = true;
        Ok(())
    }

    fn stop_scrub(&self, _: TargetId) -> Result<(), MgmtError> {
        *self.scrubbing.lock().expect("lock") = false;
        Ok(())
    }
}

struct Harness {
    app: axum::Router,
    node: Arc<FakeNode>,
    mgmt: Mgmt,
    _dir: PathGuard,
}

struct PathGuard(std::path::PathBuf);

impl Drop for PathGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn harness(name: &str) -> Harness {
    let dir = std::env::temp_dir().join(format!("stria-rest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let registry = Registry::open(&dir.join("registry.redb")).expect("registry");
    // Nothing listens there: volume data work fails fast, which these tests do not need.
    let nowhere: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    let client = stria_client::Client::new(
        tokio::runtime::Handle::current(),
        stria_client::ClientConfig::new(nowhere, vec![(TargetId(1), nowhere)]),
    );
    let pools: PoolResolver =
        Arc::new(|pool: &str| if pool == "default" { vec![TargetId(1)] } else { Vec::new() });
    let mgmt = Mgmt::new(registry, client, pools).expect("mgmt");
    let node = Arc::new(FakeNode::default());
    let monitor = Monitor::new(node.clone(), mgmt.clone());
    let identity = NodeIdentity {
        id: "node-1".into(),
        hostname: "test".into(),
        version: "0".into(),
        data_dir: dir.display().to_string(),
        started_unix_s: 0,
        addresses: NodeAddresses {
            api: None,
            mgmt: None,
            meta: nowhere,
            storage: nowhere,
            nbd: None,
            mount: None,
        },
    };
    let state = ApiState::new(mgmt.clone(), monitor, identity, ApiToken::from_string(TOKEN.into()));
    Harness { app: router(state), node, mgmt, _dir: PathGuard(dir) }
}

async fn call(
    h: &Harness,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let request =
        request.body(body.map_or_else(Body::empty, |b| Body::from(b.to_string()))).expect("req");
    let response = h.app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 24).await.expect("body");
    let value = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

async fn authed(h: &Harness, method: &str, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    call(h, method, uri, Some(TOKEN), body).await
}

fn field(v: &Value) -> Option<&str> {
    v["error"]["field"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_routes_need_the_token_and_health_does_not() {
    let h = harness("auth");
    let (status, body) = call(&h, "GET", "/api/v1/health", None, None).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("ok")));
    let (status, body) = call(&h, "GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["openapi"].as_str().expect("document").starts_with("3.1"));
    for route in ["/api/v1/cluster", "/api/v1/volumes", "/api/v1/drives", "/metrics"] {
        let (status, body) = call(&h, "GET", route, None, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{route} without a token");
        assert_eq!(body["error"]["code"], "unauthorized");
        let (status, _) = call(&h, "GET", route, Some("wrong"), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{route} with a wrong token");
        let (status, _) = authed(&h, "GET", route, None).await;
        assert_eq!(status, StatusCode::OK, "{route} with the token");
    }
    // A write without the token changes nothing.
    let (status, _) =
        call(&h, "POST", "/api/v1/volumes", None, Some(r#"{"name":"v","size_bytes":4096}"#)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(h.mgmt.registry().volumes().expect("list").is_empty());
    // Ten failures in a row from one address: the next wrong one gets 429.
    let mut last = StatusCode::OK;
    for _ in 0..4 {
        last = call(&h, "GET", "/api/v1/cluster", Some("wrong"), None).await.0;
    }
    assert_eq!(last, StatusCode::TOO_MANY_REQUESTS);
    let (status, _) = authed(&h, "GET", "/api/v1/cluster", None).await;
    assert_eq!(status, StatusCode::OK, "the right token still passes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_get_400_naming_the_field() {
    let h = harness("bodies");
    let cases: [(&str, &str, &str, &str); 12] = [
        ("POST", "/api/v1/volumes", r#"{"size_bytes":4096}"#, "name"),
        ("POST", "/api/v1/volumes", r#"{"name":"v","size_bytes":"4k"}"#, "size_bytes"),
        ("POST", "/api/v1/volumes", r#"{"name":"v","size_bytes":100}"#, "size_bytes"),
        ("POST", "/api/v1/volumes", r#"{"name":".v","size_bytes":4096}"#, "name"),
        ("POST", "/api/v1/volumes", r#"{"name":"v","size_bytes":4096,"sise":1}"#, "sise"),
        (
            "POST",
            "/api/v1/volumes",
            r#"{"name":"v","size_bytes":4096,"stripe_bytes":1000}"#,
            "stripe_bytes",
        ),
        (
            "POST",
            "/api/v1/volumes",
            r#"{"name":"v","size_bytes":4096,"stripe_count":9}"#,
            "stripe_count",
        ),
        ("POST", "/api/v1/exports", r#"{"volume":"v","read_only":"yes"}"#, "read_only"),
        ("POST", "/api/v1/exports/e/initiators", r#"{"net":"10.0.0.1/8"}"#, "net"),
        (
            "POST",
            "/api/v1/exports/e/initiators",
            r#"{"net":"10.0.0.1","tls_identity":""}"#,
            "tls_identity",
        ),
        (
            "POST",
            "/api/v1/targets/1/rebuild-rate",
            r#"{"rate_bytes_per_s":10}"#,
            "rate_bytes_per_s",
        ),
        ("POST", "/api/v1/targets/one/rebuild-rate", r#"{"rate_bytes_per_s":10485760}"#, "id"),
    ];
    for (method, uri, body, want) in cases {
        let (status, reply) = authed(&h, method, uri, Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri} {body}: {reply}");
        assert_eq!(field(&reply), Some(want), "{method} {uri} {body}: {reply}");
        assert!(!reply["error"]["message"].as_str().unwrap_or("").is_empty());
    }
    let (status, reply) = authed(&h, "POST", "/api/v1/volumes", Some("{not json")).await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_json"))
    );
    for query in [
        "/api/v1/performance?seconds=0",
        "/api/v1/performance?seconds=x",
        "/api/v1/events?limit=5000",
        "/api/v1/events?sinse=1",
    ] {
        let (status, reply) = authed(&h, "GET", query, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {reply}");
        assert!(field(&reply).is_some(), "{query} names the parameter: {reply}");
    }
    let big = format!(r#"{{"name":"v","size_bytes":4096,"pool":"{}"}}"#, "x".repeat(70_000));
    let (status, _) = authed(&h, "POST", "/api/v1/volumes", Some(&big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let request = Request::builder()
        .method("POST")
        .uri("/api/v1/volumes")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("name=v"))
        .expect("req");
    let response = h.app.clone().oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(h.mgmt.registry().volumes().expect("list").is_empty(), "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_errors_keep_their_meaning_and_changes_are_events() {
    let h = harness("errors");
    let (status, v) =
        authed(&h, "POST", "/api/v1/volumes", Some(r#"{"name":"v1","size_bytes":1048576}"#)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!((v["name"].as_str(), v["size_bytes"].as_u64()), (Some("v1"), Some(1 << 20)));
    let again = r#"{"name":"v1","size_bytes":1048576}"#;
    let (status, e) = authed(&h, "POST", "/api/v1/volumes", Some(again)).await;
    assert_eq!((status, e["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("exists")));
    let (status, e) = authed(
        &h,
        "POST",
        "/api/v1/volumes",
        Some(r#"{"name":"v2","size_bytes":4096,"pool":"ssd"}"#),
    )
    .await;
    assert_eq!((status, e["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    let (status, _) = authed(&h, "GET", "/api/v1/volumes/nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, e) =
        authed(&h, "POST", "/api/v1/volumes/v1/resize", Some(r#"{"size_bytes":4096}"#)).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("conflict")),
        "shrink needs force"
    );
    let (status, x) =
        authed(&h, "POST", "/api/v1/exports", Some(r#"{"volume":"v1","name":"e1"}"#)).await;
    assert_eq!(status, StatusCode::CREATED, "{x}");
    let (status, x) =
        authed(&h, "POST", "/api/v1/exports/e1/initiators", Some(r#"{"net":"10.1.0.0/16"}"#)).await;
    assert_eq!((status, x["acl"][0]["net"].as_str()), (StatusCode::OK, Some("10.1.0.0/16")));
    let (status, e) = authed(&h, "DELETE", "/api/v1/volumes/v1", None).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("conflict")),
        "exported"
    );
    let (status, _) =
        authed(&h, "DELETE", "/api/v1/exports/e1/initiators?net=10.9.0.0/16", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no such rule");
    let (status, x) =
        authed(&h, "DELETE", "/api/v1/exports/e1/initiators?net=10.1.0.0%2F16", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(x["acl"], json!([]));
    let (status, _) = authed(&h, "GET", "/api/v1/exports/e1", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = authed(&h, "DELETE", "/api/v1/exports/e1", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = authed(&h, "DELETE", "/api/v1/exports/e1", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = authed(&h, "PUT", "/api/v1/volumes/v1", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, _) = authed(&h, "GET", "/api/v1/nothing", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, t) = authed(
        &h,
        "POST",
        "/api/v1/targets/1/rebuild-rate",
        Some(r#"{"rate_bytes_per_s":52428800}"#),
    )
    .await;
    assert_eq!(
        (status, t["rebuild_rate_limit_bytes_per_s"].as_u64()),
        (StatusCode::OK, Some(52428800))
    );
    assert_eq!(*h.node.rebuild_rate.lock().expect("lock"), Some(52428800));
    let (status, _) = authed(
        &h,
        "POST",
        "/api/v1/targets/7/rebuild-rate",
        Some(r#"{"rate_bytes_per_s":52428800}"#),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, t) = authed(&h, "POST", "/api/v1/targets/1/scrub", None).await;
    assert_eq!((status, t["scrub"]["state"].as_str()), (StatusCode::ACCEPTED, Some("running")));
    let (status, _) =
        authed(&h, "POST", "/api/v1/targets/1/scrub", Some(r#"{"repair":false}"#)).await;
    assert_eq!(status, StatusCode::CONFLICT, "one scrub at a time");
    let (status, _) = authed(&h, "DELETE", "/api/v1/targets/1/scrub", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = authed(&h, "POST", "/api/v1/drives/drive-9/fail", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, page) = authed(&h, "GET", "/api/v1/events", None).await;
    assert_eq!(status, StatusCode::OK);
    let kinds: Vec<&str> = page["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    for kind in [
        "volume_created",
        "export_added",
        "initiator_allowed",
        "initiator_denied",
        "export_removed",
        "rebuild_rate_changed",
        "scrub_started",
    ] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    assert!(!kinds.contains(&"volume_deleted"), "refused changes are not events");
    let last = page["last_seq"].as_u64().expect("seq");
    let (_, newer) = authed(&h, "GET", &format!("/api/v1/events?since={last}"), None).await;
    assert_eq!(newer["events"], json!([]));
}
