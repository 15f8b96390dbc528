//! The REST API and metrics of a real `stria up`: the token is made once with mode 0600 and
//! required; every resource shows the live node (drives, targets, pools, file system,
//! volumes, exports, events, performance); every action works and is seen by the CLI too; a
//! failed drive turns the target degraded in the API, the events and the metrics; the served
//! OpenAPI document is the checked-in one.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::{Value, json};
use support::http::{Api, request};
use support::node::{Node, pattern, require_fuse, scratch};

const MIB: u64 = 1 << 20;

/// Waits until `check` holds on a fresh GET of `path`.
fn eventually(api: &Api, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    api.eventually(path, what, Duration::from_secs(30), check)
}

fn kinds(events: &Value) -> Vec<String> {
    events["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["kind"].as_str().expect("kind").to_string())
        .collect()
}

#[test]
fn rest_api_serves_the_live_node_and_its_actions() {
    require_fuse();
    let dir = scratch("rest-api");
    let mut node = Node::start(
        &dir,
        &["--drives", "4", "--raid", "5", "--drive-size", "256M", "--rated-tbw", "1"],
    );
    let api = Api::of(&node);

    // The token: made at the first start, 64 hex digits, mode 0600, shown once in the banner.
    let token_file = node.data.join("mgmt/api-token");
    let mode = std::fs::metadata(&token_file).expect("token").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is private");
    assert_eq!(api.token.len(), 64);
    assert!(node.stdout().contains(&api.token), "the first banner shows the token");
    assert!(node.stdout().contains(&format!("http://{}/api/v1", api.addr)), "{}", node.stdout());

    // Auth: health and the document are open; everything else needs the token.
    let health = request(api.addr, "GET", "/api/v1/health", None, None);
    assert_eq!((health.status, health.json()["status"].clone()), (200, json!("ok")));
    for path in ["/api/v1/cluster", "/api/v1/volumes", "/metrics"] {
        let none = request(api.addr, "GET", path, None, None);
        assert_eq!(none.status, 401, "{path} without a token: {}", none.body);
        assert_eq!(none.json()["error"]["code"], "unauthorized");
        assert!(none.header("www-authenticate").is_some_and(|h| h.starts_with("Bearer")));
        let wrong = request(api.addr, "GET", path, Some(&"0".repeat(64)), None);
        assert_eq!(wrong.status, 401, "{path} with a wrong token: {}", wrong.body);
    }
    let create = r#"{"name":"sneaky","size_bytes":1048576}"#;
    let refused = request(api.addr, "POST", "/api/v1/volumes", None, Some(create));
    assert_eq!(refused.status, 401);

    // The OpenAPI document served is the one checked in.
    let served = request(api.addr, "GET", "/api/v1/openapi.json", None, None);
    assert_eq!(served.status, 200);
    let checked_in: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/api/openapi.json"
        ))
        .expect("docs/api/openapi.json"),
    )
    .expect("JSON");
    assert!(served.json() == checked_in, "the served document differs from docs/api/openapi.json");

    // Resources show the live node.
    let cluster = api.get("/api/v1/cluster");
    assert_eq!(cluster["state"], "optimal");
    assert_eq!(cluster["nodes"][0]["addresses"]["api"], json!(api.addr.to_string()));
    assert_eq!(cluster["nodes"][0]["drives"], 4);
    assert!(cluster["capacity_bytes"].as_u64().expect("capacity") > 500 * MIB);
    assert_eq!(api.get("/api/v1/nodes")[0]["id"], cluster["nodes"][0]["id"]);
    let drives = api.get("/api/v1/drives");
    let drives = drives.as_array().expect("drives");
    assert_eq!(drives.len(), 4, "one entry per --drives");
    for (slot, d) in drives.iter().enumerate() {
        assert_eq!(d["state"], "active");
        assert_eq!(d["slot"], slot);
        assert_eq!(d["target"], 1);
        assert_eq!(d["capacity_bytes"], 256 * MIB);
        assert!(d["device"].as_str().expect("device").ends_with(&format!("drives/t1-d{slot}.img")));
        let wear = d["wear_percent"].as_f64().expect("rated drives report wear");
        assert!((0.0..1.0).contains(&wear), "a new 1 TBW drive is barely worn: {d}");
    }
    let drive_id = drives[2]["id"].as_str().expect("id").to_string();
    assert_eq!(api.get(&format!("/api/v1/drives/{drive_id}"))["slot"], 2);
    assert_eq!(api.call("GET", "/api/v1/drives/no-such-drive", None).status, 404);
    let targets = api.get("/api/v1/targets");
    assert_eq!(targets.as_array().expect("targets").len(), 1);
    let t = api.get("/api/v1/targets/1");
    assert_eq!(t["state"], "optimal");
    assert_eq!(t["geometry"]["level"], "raid5");
    assert_eq!(t["geometry"]["drives"], 4);
    assert_eq!(t["geometry"]["data_drives"], 3);
    assert_eq!(t["rebuild"], Value::Null);
    assert_eq!(t["scrub"]["state"], "idle");
    assert_eq!(api.call("GET", "/api/v1/targets/9", None).status, 404);
    let pools = api.get("/api/v1/pools");
    assert_eq!(
        (pools[0]["name"].clone(), pools[0]["targets"].clone()),
        (json!("default"), json!([1]))
    );
    let fs = api.get("/api/v1/filesystems");
    assert_eq!(fs[0]["mount"], json!(node.mount.display().to_string()));
    assert!(fs[0]["inodes_used"].as_u64().expect("inodes") >= 1);
    assert!(fs[0]["capacity_bytes"].as_u64().expect("capacity") > 0);
    assert_eq!(api.get("/api/v1/volumes"), json!([]));
    assert_eq!(api.get("/api/v1/exports"), json!([]));
    assert!(kinds(&api.get("/api/v1/events")).contains(&"node_started".to_string()));

    // Writes through the mount show up in the performance series within a few samples.
    std::fs::write(node.mount.join("load.bin"), pattern(3, 0, 8 * MIB as usize)).expect("write");
    let perf = eventually(&api, "/api/v1/performance?seconds=30", "write throughput", |p| {
        p["total"]["write_bytes_per_s"]
            .as_array()
            .is_some_and(|s| s.iter().any(|v| v.as_f64().is_some_and(|v| v > 0.0)))
    });
    let points = perf["timestamps_unix_s"].as_array().expect("timestamps").len();
    assert!(points <= 30);
    assert_eq!(
        perf["targets"][0]["rates"]["write_ops_per_s"].as_array().expect("series").len(),
        points
    );
    assert_eq!(perf["drives"].as_array().expect("drives").len(), 4);
    assert!(
        perf["total"]["write_latency_us_mean"]
            .as_array()
            .expect("latency")
            .iter()
            .any(|v| v.as_f64().is_some_and(|v| v > 0.0)),
        "a latency is measured: {perf}"
    );
    assert_eq!(api.call("GET", "/api/v1/performance?seconds=0", None).status, 400);

    // Volumes: create, see it from the CLI too, resize, refuse bad bodies naming the field.
    let v = api.ok("POST", "/api/v1/volumes", Some(r#"{"name":"vm1","size_bytes":33554432}"#), 201);
    assert_eq!(
        (v["size_bytes"].as_u64(), v["allocated_bytes"].as_u64()),
        (Some(32 * MIB), Some(0))
    );
    let cli = node.cli(&["volume", "list", "--json"]);
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    assert!(
        String::from_utf8_lossy(&cli.stdout).contains("\"vm1\""),
        "the CLI sees the API's volume"
    );
    for (body, field) in [
        (r#"{"name":"vm2","size_bytes":"big"}"#, "size_bytes"),
        (r#"{"size_bytes":4096}"#, "name"),
        (r#"{"name":"vm2","size_bytes":1000}"#, "size_bytes"),
        (r#"{"name":"vm2","size_bytes":4096,"colour":"red"}"#, "colour"),
    ] {
        let reply = api.call("POST", "/api/v1/volumes", Some(body));
        assert_eq!(reply.status, 400, "{body}: {}", reply.body);
        assert_eq!(reply.json()["error"]["field"], field, "{body}: {}", reply.body);
    }
    assert_eq!(
        api.call("POST", "/api/v1/volumes", Some(r#"{"name":"vm1","size_bytes":4096}"#)).status,
        409
    );
    let v = api.ok("POST", "/api/v1/volumes/vm1/resize", Some(r#"{"size_bytes":67108864}"#), 200);
    assert_eq!(v["size_bytes"].as_u64(), Some(64 * MIB));
    assert_eq!(api.get("/api/v1/volumes/vm1")["size_bytes"].as_u64(), Some(64 * MIB));

    // Exports and their access lists.
    let x = api.ok("POST", "/api/v1/exports", Some(r#"{"volume":"vm1","read_only":true}"#), 201);
    assert_eq!(
        (x["name"].clone(), x["read_only"].clone(), x["acl"].clone()),
        (json!("vm1"), json!(true), json!([]))
    );
    // Nobody is allowed yet: a real NBD client is refused, and the API counts and reports it.
    let run: Value = serde_json::from_str(
        &std::fs::read_to_string(node.data.join("run.json")).expect("run.json"),
    )
    .expect("JSON");
    let uri = format!("nbd://{}/vm1", run["nbd"].as_str().expect("the node serves NBD"));
    let refused = std::process::Command::new("nbdinfo")
        .arg(&uri)
        .output()
        .expect("run nbdinfo (the test command installs libnbd-bin)");
    assert!(!refused.status.success(), "an export with an empty access list refuses everyone");
    assert!(api.get("/api/v1/exports/vm1")["refused"].as_u64().expect("refused") >= 1);
    eventually(&api, "/api/v1/events", "the refusal event", |e| {
        kinds(e).contains(&"initiator_refused".to_string())
    });
    let text = api.call("GET", "/metrics", None).body;
    for line in [
        "stria_volume_provisioned_bytes{volume=\"vm1\",pool=\"default\"} 67108864",
        "stria_volume_allocated_bytes{volume=\"vm1\",pool=\"default\"} 0",
        "stria_export_acl_rules{export=\"vm1\",volume=\"vm1\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "metrics lack {line}:\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("stria_export_refusals_total{export=\"vm1\"")
                && !l.ends_with(" 0")),
        "the refusal is counted in the metrics"
    );
    // load.bin was created through the mount: the metadata service counted the create.
    let creates = text
        .lines()
        .find_map(|l| l.strip_prefix("stria_metadata_ops_total{op=\"create\"} "))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(creates.is_some_and(|n| n >= 1.0), "metadata ops by type in the metrics:\n{text}");
    let x = api.ok("POST", "/api/v1/exports/vm1/initiators", Some(r#"{"net":"127.0.0.1"}"#), 200);
    assert_eq!(x["acl"], json!([{"net": "127.0.0.1/32", "tls_identity": null}]));
    let bad = api.call("POST", "/api/v1/exports/vm1/initiators", Some(r#"{"net":"10.0.0.1/8"}"#));
    assert_eq!((bad.status, bad.json()["error"]["field"].clone()), (400, json!("net")));
    // A connected initiator is a client of the node, next to the FUSE mount, until it leaves.
    let mut holder = std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-r", &uri, "-c", "read 0 4M", "-c", "sleep 4000"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run qemu-io (the test command installs qemu-utils)");
    let clients = eventually(&api, "/api/v1/clients", "the NBD client", |c| {
        c.as_array().is_some_and(|all| all.iter().any(|x| x["kind"] == "nbd"))
    });
    let all = clients.as_array().expect("list");
    let fuse = all.iter().find(|x| x["kind"] == "fuse").expect("the FUSE mount is a client");
    assert_eq!(fuse["mount"], json!(node.mount.display().to_string()));
    let nbd = all.iter().find(|x| x["kind"] == "nbd").expect("nbd client");
    assert_eq!((nbd["export"].clone(), nbd["tls"].clone()), (json!("vm1"), json!(false)));
    assert!(nbd["peer"].as_str().expect("peer").starts_with("127.0.0.1:"), "{nbd}");
    holder.wait().expect("qemu-io ends");
    // Its reads are in the volume's own performance series; the pool has one too.
    let perf = eventually(&api, "/api/v1/performance?seconds=60", "the volume's reads", |p| {
        p["volumes"].as_array().is_some_and(|all| {
            all.iter().any(|v| {
                v["volume"] == "vm1"
                    && v["rates"]["read_bytes_per_s"]
                        .as_array()
                        .is_some_and(|s| s.iter().any(|x| x.as_f64().is_some_and(|x| x > 0.0)))
            })
        })
    });
    let vm1 = perf["volumes"].as_array().and_then(|v| v.iter().find(|v| v["volume"] == "vm1"));
    let latencies = vm1.expect("vm1")["rates"]["read_latency_us_mean"].clone();
    assert!(
        latencies.as_array().is_some_and(|s| s.iter().any(|x| x.as_f64().is_some_and(|x| x > 0.0))),
        "the gateway measures the volume's latency: {latencies}"
    );
    assert_eq!(perf["pools"][0]["pool"], "default", "{perf}");
    assert!(
        perf["pools"][0]["rates"]["write_bytes_per_s"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x.as_f64().is_some_and(|x| x > 0.0))),
        "the pool's series carries the writes of its targets: {perf}"
    );
    eventually(&api, "/api/v1/clients", "the NBD client gone", |c| {
        c.as_array().is_some_and(|all| all.iter().all(|x| x["kind"] != "nbd"))
    });
    let x = api.ok("DELETE", "/api/v1/exports/vm1/initiators", Some(r#"{"net":"127.0.0.1"}"#), 200);
    assert_eq!(x["acl"], json!([]));
    api.ok("POST", "/api/v1/exports/vm1/initiators", Some(r#"{"net":"10.2.0.0/16"}"#), 200);
    let x = api.ok("DELETE", "/api/v1/exports/vm1/initiators?net=10.2.0.0/16", None, 200);
    assert_eq!(x["acl"], json!([]));
    assert_eq!(api.get("/api/v1/exports/vm1")["volume"], "vm1");
    assert_eq!(api.call("DELETE", "/api/v1/volumes/vm1", None).status, 409, "exported");
    api.ok("DELETE", "/api/v1/exports/vm1", None, 200);
    assert_eq!(api.get("/api/v1/exports"), json!([]));
    assert_eq!(api.ok("DELETE", "/api/v1/volumes/vm1", None, 200)["state"], "deleted");
    assert_eq!(api.get("/api/v1/volumes"), json!([]));
    let events = kinds(&api.get("/api/v1/events"));
    for kind in [
        "volume_created",
        "volume_resized",
        "export_added",
        "initiator_allowed",
        "initiator_denied",
        "export_removed",
        "volume_deleted",
    ] {
        assert!(events.contains(&kind.to_string()), "{kind} in {events:?}");
    }

    // Rebuild rate and scrub on the running target.
    let t = api.ok(
        "POST",
        "/api/v1/targets/1/rebuild-rate",
        Some(r#"{"rate_bytes_per_s":104857600}"#),
        200,
    );
    assert_eq!(t["rebuild_rate_limit_bytes_per_s"].as_u64(), Some(100 * MIB));
    assert_eq!(
        api.call("POST", "/api/v1/targets/1/rebuild-rate", Some(r#"{"rate":1}"#)).status,
        400
    );
    api.ok("POST", "/api/v1/targets/1/scrub", Some(r#"{"repair":true}"#), 202);
    let t = eventually(&api, "/api/v1/targets/1", "scrub to finish", |t| {
        t["scrub"]["state"] == "finished"
    });
    assert_eq!(t["scrub"]["runs"], 1);
    assert!(t["scrub"]["findings"]["bytes_checked"].as_u64().expect("bytes") > 0);
    assert_eq!(t["scrub"]["findings"]["checksum_errors"], 0);

    // Fail a drive: the target turns degraded everywhere, and the events say so.
    let since = api.get("/api/v1/events")["last_seq"].as_u64().expect("seq");
    let d = api.ok("POST", &format!("/api/v1/drives/{drive_id}/fail"), None, 200);
    assert_eq!(d["state"], "failed");
    assert_eq!(api.get("/api/v1/targets/1")["state"], "degraded");
    assert_eq!(api.get("/api/v1/cluster")["state"], "degraded");
    let again = api.call("POST", &format!("/api/v1/drives/{drive_id}/fail"), None);
    assert_eq!(again.status, 409, "a second failure would lose data: {}", again.body);
    let newer = api.get(&format!("/api/v1/events?since={since}"));
    let newer_kinds = kinds(&newer);
    assert!(newer_kinds.contains(&"drive_failed".to_string()), "{newer}");
    assert!(newer_kinds.contains(&"target_state_changed".to_string()), "{newer}");
    assert!(
        newer["events"]
            .as_array()
            .expect("events")
            .iter()
            .all(|e| e["time_unix_ms"].as_u64().is_some_and(|t| t > 0))
    );

    // Metrics: names with units and labels, the degraded state among them.
    let metrics = api.call("GET", "/metrics", None);
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .header("content-type")
            .is_some_and(|c| c.starts_with("application/openmetrics-text"))
    );
    let text = metrics.body;
    let failed_drive = format!("drive=\"{drive_id}\"");
    for needle in [
        "stria_drive_read_bytes_total{drive=\"",
        "stria_drive_written_bytes_total{",
        "stria_drive_read_ops_total{",
        "stria_drive_write_ops_total{",
        "stria_drive_errors_total{",
        "stria_drive_capacity_bytes{",
        "stria_target_capacity_bytes{target=\"1\",pool=\"default\",level=\"raid5\"}",
        "stria_target_used_bytes{target=\"1\"",
        "stria_target_state{target=\"1\",pool=\"default\",level=\"raid5\",state=\"degraded\"} 1",
        "stria_target_state{target=\"1\",pool=\"default\",level=\"raid5\",state=\"optimal\"} 0",
        "stria_target_written_bytes_total{target=\"1\"",
        "stria_target_write_latency_seconds_bucket{",
        "stria_target_rebuild_rate_limit_bytes_per_second{target=\"1\"",
        "stria_pool_capacity_bytes{pool=\"default\"}",
        "stria_fs_inodes_used ",
        "stria_api_auth_failures_total ",
        "# EOF",
    ] {
        assert!(text.contains(needle), "metrics lack {needle}:\n{text}");
    }
    assert!(
        text.lines().any(|l| l.starts_with("stria_drive_state{")
            && l.contains(&failed_drive)
            && l.ends_with("state=\"failed\"} 1")),
        "the failed drive's state is in the metrics"
    );

    // A restart keeps the token and does not show it again.
    node.stop();
    node.restart();
    let again = Api::of(&node);
    assert_eq!(again.token, api.token, "the token survives a restart");
    assert!(!node.stdout().contains(&api.token), "the token is shown only once");
    assert!(node.stdout().contains("mgmt/api-token"), "the banner says where the token is");
    assert_eq!(again.get("/api/v1/targets/1")["state"], "degraded", "the failed drive stays out");
    node.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `(files, bytes)` of the ranking entry whose `key` is `value`.
fn usage_of(list: &Value, key: &str, value: Value) -> Option<(u64, u64)> {
    list.as_array()?
        .iter()
        .find(|e| e[key] == value)
        .map(|e| (e["files"].as_u64().expect("files"), e["bytes"].as_u64().expect("bytes")))
}

#[test]
fn rest_api_reports_file_system_analytics_from_the_mount() {
    require_fuse();
    let dir = scratch("rest-analytics");
    let mut node = Node::start(&dir, &["--drives", "4", "--raid", "5", "--drive-size", "256M"]);
    let api = Api::of(&node);
    assert_eq!(api.get("/api/v1/analytics")["total"], json!({"files": 0, "bytes": 0}));
    assert_eq!(request(api.addr, "GET", "/api/v1/analytics", None, None).status, 401);
    for bad in ["top=0", "top=101", "top=x", "depth=1"] {
        let reply = api.call("GET", &format!("/api/v1/analytics?{bad}"), None);
        assert_eq!(reply.status, 400, "{bad}: {}", reply.body);
    }

    // Files written as root through the mount; some given to uid 4242 (gid 4343).
    let m = &node.mount;
    std::fs::create_dir_all(m.join("proj/sub")).expect("mkdir proj");
    std::fs::create_dir(m.join("home")).expect("mkdir home");
    std::fs::write(m.join("proj/a.dat"), pattern(1, 0, 2 * MIB as usize)).expect("a.dat");
    std::fs::write(m.join("proj/sub/b.DAT"), pattern(2, 0, 100 << 10)).expect("b.DAT");
    std::fs::write(m.join("home/notes.txt"), vec![b'n'; 100]).expect("notes.txt");
    std::fs::write(m.join("home/c.log"), pattern(3, 0, 10 << 10)).expect("c.log");
    std::fs::write(m.join("top.txt"), b"seven!\n").expect("top.txt");
    // Sparse: 64 MiB of size, nothing stored; counted by size like any file.
    std::fs::File::create(m.join("home/disk.img"))
        .and_then(|f| f.set_len(64 * MIB))
        .expect("disk.img");
    for name in ["proj/sub/b.DAT", "home/notes.txt", "home/disk.img"] {
        std::os::unix::fs::chown(m.join(name), Some(4242), Some(4343)).expect("chown");
    }

    let total_bytes = 2 * MIB + (100 << 10) + 100 + (10 << 10) + 7 + 64 * MIB;
    let a = eventually(&api, "/api/v1/analytics?top=10", "six files", |a| {
        a["total"] == json!({"files": 6, "bytes": total_bytes})
    });
    assert_eq!(a["top"], 10);
    assert_eq!(
        a["users"],
        json!([
            {"uid": 4242, "name": null, "files": 3, "bytes": 64 * MIB + (100 << 10) + 100},
            {"uid": 0, "name": "root", "files": 3, "bytes": 2 * MIB + (10 << 10) + 7},
        ])
    );
    assert_eq!(a["groups"][0]["gid"], 4343);
    assert_eq!(a["groups"][1]["gid"], 0);
    let filesets: Vec<(String, u64, u64)> = a["filesets"]
        .as_array()
        .expect("filesets")
        .iter()
        .map(|f| {
            let n = |k: &str| f[k].as_u64().expect("number");
            (f["name"].as_str().expect("name").to_string(), n("files"), n("bytes"))
        })
        .collect();
    assert_eq!(
        filesets,
        [
            ("home".to_string(), 3, 64 * MIB + (10 << 10) + 100),
            ("proj".to_string(), 2, 2 * MIB + (100 << 10)),
            ("/".to_string(), 1, 7),
        ]
    );
    assert_eq!(
        a["extensions"],
        json!([
            {"extension": "img", "files": 1, "bytes": 64 * MIB},
            {"extension": "dat", "files": 2, "bytes": 2 * MIB + (100 << 10)},
            {"extension": "log", "files": 1, "bytes": 10 << 10},
            {"extension": "txt", "files": 2, "bytes": 107},
        ])
    );
    let classes: Vec<(String, u64, u64)> = a["size_histogram"]
        .as_array()
        .expect("histogram")
        .iter()
        .map(|c| {
            let n = |k: &str| c[k].as_u64().expect("number");
            (c["label"].as_str().expect("label").to_string(), n("files"), n("bytes"))
        })
        .collect();
    let class = |label: &str, files, bytes| (label.to_string(), files, bytes);
    assert_eq!(
        classes,
        [
            class("< 4 KiB", 2, 107),
            class("4 KiB – 64 KiB", 1, 10 << 10),
            class("64 KiB – 1 MiB", 1, 100 << 10),
            class("1 MiB – 64 MiB", 1, 2 * MIB),
            class(">= 64 MiB", 1, 64 * MIB),
        ]
    );
    assert_eq!(a["size_histogram"][4]["size_max_bytes"], Value::Null);
    assert_eq!(a["size_histogram"][4]["size_min_bytes"], 64 * MIB);
    let one = api.get("/api/v1/analytics?top=1");
    assert_eq!(one["users"].as_array().map(Vec::len), Some(1));
    assert_eq!(one["extensions"][0]["extension"], "img");
    assert_eq!(one["size_histogram"], a["size_histogram"], "top cuts rankings only");

    // Truncate and unlink through the mount move the numbers at once.
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.join("home/disk.img"))
        .and_then(|f| f.set_len(1000))
        .expect("truncate");
    std::fs::remove_file(m.join("home/notes.txt")).expect("unlink");
    let total_bytes = 2 * MIB + (100 << 10) + (10 << 10) + 7 + 1000;
    let a = eventually(&api, "/api/v1/analytics", "the truncate and the unlink", |a| {
        a["total"] == json!({"files": 5, "bytes": total_bytes})
    });
    assert_eq!(usage_of(&a["users"], "uid", json!(4242)), Some((2, (100 << 10) + 1000)));
    assert_eq!(a["users"][0]["uid"], 0, "root holds the most bytes now");
    assert_eq!(usage_of(&a["filesets"], "name", json!("home")), Some((2, (10 << 10) + 1000)));
    assert_eq!(usage_of(&a["extensions"], "extension", json!("txt")), Some((1, 7)));
    assert_eq!(usage_of(&a["extensions"], "extension", json!("img")), Some((1, 1000)));
    assert_eq!(a["size_histogram"][0]["files"], 2, "the truncated file is small now");
    assert_eq!(a["size_histogram"][4]["files"], 0);
    node.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
