//! Replacing a failed drive and adding hot spares on a running `stria up`, through the REST API
//! and the CLI: the target rebuilds to optimal while it keeps serving, the data written before
//! reads back intact (through the mount, and from the drives alone after a restart), a spare
//! takes the place of the next drive that fails, `DATA/node.json` follows every change so a
//! restart assembles the same array, and bad requests are refused naming the field at fault.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::http::{Api, request};
use support::node::{Node, pattern, require_fuse, scratch};

const MIB: u64 = 1 << 20;
const DRIVE_BYTES: u64 = 128 * MIB;
const FILE_BYTES: usize = 24 << 20;

/// Waits until `check` holds on a fresh GET of `path`.
fn eventually(api: &Api, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    api.eventually(path, what, Duration::from_secs(120), check)
}

fn optimal(api: &Api) -> Value {
    eventually(api, "/api/v1/targets/1", "the target optimal", |t| {
        t["state"] == "optimal" && t["rebuild"].is_null()
    })
}

/// `(slot or "spare", device, state)` of every drive of target 1.
fn drives(target: &Value) -> Vec<(String, String, String)> {
    target["drives"]
        .as_array()
        .expect("drives")
        .iter()
        .map(|d| {
            let slot = d["slot"].as_u64().map_or("spare".to_string(), |s| s.to_string());
            let device = d["device"].as_str().expect("device").to_string();
            (slot, device, d["state"].as_str().expect("state").to_string())
        })
        .collect()
}

fn drive_id(target: &Value, slot: u64) -> String {
    target["drives"]
        .as_array()
        .expect("drives")
        .iter()
        .find(|d| d["slot"] == slot)
        .and_then(|d| d["id"].as_str())
        .expect("the slot's drive")
        .to_string()
}

/// The drives and spares `DATA/node.json` records for target 1.
fn recorded(data: &Path) -> (Vec<String>, Vec<String>) {
    let node: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("node.json")).expect("node.json"))
            .expect("JSON");
    let list = |key: &str| -> Vec<String> {
        node["targets"][0][key]
            .as_array()
            .map(|a| a.iter().map(|p| p.as_str().expect("path").to_string()).collect())
            .unwrap_or_default()
    };
    (list("drives"), list("spares"))
}

fn kinds(events: &Value) -> Vec<String> {
    events["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["kind"].as_str().expect("kind").to_string())
        .collect()
}

#[track_caller]
fn refused(api: &Api, path: &str, body: &str, status: u16, field: Option<&str>) -> String {
    let reply = api.call("POST", path, Some(body));
    assert_eq!(reply.status, status, "POST {path} {body}: {}", reply.body);
    let error = &reply.json()["error"];
    if let Some(field) = field {
        assert_eq!(error["field"], field, "POST {path} {body}: {}", reply.body);
    }
    error["message"].as_str().expect("message").to_string()
}

fn read_back(node: &Node, name: &str) -> Vec<u8> {
    std::fs::read(node.mount.join(name)).expect("read the file back")
}

#[test]
fn rest_replaces_a_failed_drive_and_a_spare_takes_over_the_next() {
    require_fuse();
    let dir = scratch("rest-replace");
    let size = format!("{}M", DRIVE_BYTES / MIB);
    let mut node = Node::start(&dir, &["--drives", "4", "--raid", "5", "--drive-size", &size]);
    let api = Api::of(&node);
    let data = pattern(11, 0, FILE_BYTES);
    std::fs::write(node.mount.join("before.bin"), &data).expect("write through the mount");
    let replace = "/api/v1/targets/1/drives/1/replace";
    let new_drive = format!(r#"{{"path":"new1.img","create_bytes":{DRIVE_BYTES}}}"#);

    // Both routes need the token.
    for path in [replace, "/api/v1/targets/1/spares"] {
        let reply = request(api.addr, "POST", path, None, Some(&new_drive));
        assert_eq!(reply.status, 401, "{path}: {}", reply.body);
    }
    // A slot in service is not replaced.
    let message = refused(&api, replace, &new_drive, 409, None);
    assert!(message.contains("fail it first"), "{message}");
    assert!(!dir.join("drives/new1.img").exists(), "a refused change creates nothing");

    let t = api.get("/api/v1/targets/1");
    let slot0 = t["drives"][0]["device"].as_str().expect("device").to_string();
    api.ok("POST", &format!("/api/v1/drives/{}/fail", drive_id(&t, 1)), None, 200);
    assert_eq!(api.get("/api/v1/targets/1")["state"], "degraded");

    // Bad bodies: 400 naming the field; a missing target 404.
    for (body, field) in [
        (r#"{"create_bytes":134217728}"#.to_string(), "path"),
        (r#"{"path":"../x.img","create_bytes":134217728}"#.to_string(), "path"),
        (r#"{"path":"drives/x.img","create_bytes":134217728}"#.to_string(), "path"),
        (r#"{"path":"/var/tmp/a/../x.img"}"#.to_string(), "path"),
        (format!(r#"{{"path":"{slot0}"}}"#), "path"),
        (r#"{"path":"x.img","create_bytes":1048576}"#.to_string(), "create_bytes"),
        (r#"{"path":"x.img","create_bytes":"big"}"#.to_string(), "create_bytes"),
        (r#"{"path":"x.img","colour":"red"}"#.to_string(), "colour"),
        (r#"{"path":"absent.img"}"#.to_string(), "path"),
        (format!(r#"{{"path":"{}"}}"#, dir.join("node.json").display()), "path"),
    ] {
        refused(&api, replace, &body, 400, Some(field));
    }
    let message = refused(&api, replace, &format!(r#"{{"path":"{slot0}"}}"#), 400, Some("path"));
    assert!(message.contains("already a drive of target 1 slot 0"), "{message}");
    refused(&api, "/api/v1/targets/1/drives/x/replace", &new_drive, 400, Some("slot"));
    refused(&api, "/api/v1/targets/1/drives/9/replace", &new_drive, 400, Some("slot"));
    refused(&api, "/api/v1/targets/7/drives/1/replace", &new_drive, 404, None);
    assert!(!dir.join("drives/x.img").exists());

    // The replacement: created sparse under DATA/drives, in at once, rebuilt in the background.
    let since = api.get("/api/v1/events")["last_seq"].as_u64().expect("seq");
    let t = api.ok("POST", replace, Some(&new_drive), 202);
    let device = t["drives"][1]["device"].as_str().expect("device");
    assert_eq!(device, dir.join("drives/new1.img").display().to_string());
    assert!(
        ["rebuilding", "active"].contains(&t["drives"][1]["state"].as_str().expect("state")),
        "{t}"
    );
    assert_eq!(
        std::fs::metadata(dir.join("drives/new1.img")).expect("the drive file").len(),
        DRIVE_BYTES
    );
    let (members, spares) = recorded(&dir);
    assert_eq!(
        members,
        ["drives/t1-d0.img", "drives/new1.img", "drives/t1-d2.img", "drives/t1-d3.img"]
    );
    assert!(spares.is_empty(), "{spares:?}");
    // Foreground I/O goes on while it rebuilds.
    std::fs::write(node.mount.join("during.bin"), pattern(12, 0, 4 << 20)).expect("write");
    optimal(&api);
    // The monitor samples once a second: the rebuild's end is in the events soon after.
    let path = format!("/api/v1/events?since={since}");
    let events = kinds(&eventually(&api, &path, "the rebuild's end", |e| {
        kinds(e).contains(&"rebuild_finished".to_string())
    }));
    for kind in ["drive_replaced", "drive_state_changed", "rebuild_started"] {
        assert!(events.contains(&kind.to_string()), "{kind} in {events:?}");
    }
    assert!(read_back(&node, "before.bin") == data, "the data survives the replacement");

    // A spare; the next failure goes to it.
    let spare = format!(r#"{{"path":"spare1.img","create_bytes":{DRIVE_BYTES}}}"#);
    let t = api.ok("POST", "/api/v1/targets/1/spares", Some(&spare), 201);
    let spare_path = dir.join("drives/spare1.img").display().to_string();
    assert!(drives(&t).contains(&("spare".into(), spare_path.clone(), "spare".into())), "{t}");
    assert_eq!(recorded(&dir).1, ["drives/spare1.img"]);
    let again = refused(&api, "/api/v1/targets/1/spares", &spare, 400, Some("path"));
    assert!(again.contains("already a hot spare of target 1"), "{again}");
    let exists = format!(r#"{{"path":"t1-d1.img","create_bytes":{DRIVE_BYTES}}}"#);
    let message = refused(&api, "/api/v1/targets/1/spares", &exists, 409, None);
    assert!(
        message.contains("exists already"),
        "the failed drive's file is not overwritten: {message}"
    );
    let message = refused(
        &api,
        "/api/v1/targets/1/spares",
        &format!(r#"{{"path":"{spare_path}"}}"#),
        400,
        Some("path"),
    );
    assert!(message.contains("already a hot spare of target 1"), "{message}");
    let since = api.get("/api/v1/events")["last_seq"].as_u64().expect("seq");
    assert!(kinds(&api.get("/api/v1/events?since=0")).contains(&"spare_added".to_string()));
    let t = api.get("/api/v1/targets/1");
    api.ok("POST", &format!("/api/v1/drives/{}/fail", drive_id(&t, 2)), None, 200);
    let t = api.get("/api/v1/targets/1");
    assert_eq!(t["drives"][2]["device"], json!(spare_path), "the spare took slot 2: {t}");
    assert!(drives(&t).iter().all(|(slot, _, _)| slot != "spare"), "no spare left: {t}");
    let (members, spares) = recorded(&dir);
    assert_eq!(
        members,
        ["drives/t1-d0.img", "drives/new1.img", "drives/spare1.img", "drives/t1-d3.img"]
    );
    assert!(spares.is_empty(), "{spares:?}");
    optimal(&api);
    let events = kinds(&api.get(&format!("/api/v1/events?since={since}")));
    assert!(events.contains(&"drive_failed".to_string()), "{events:?}");
    assert!(events.contains(&"rebuild_started".to_string()), "{events:?}");

    // A restart assembles the new members from node.json, and they hold the data: with the
    // page cache of the old mount gone, reads come from the drives.
    node.stop();
    node.restart();
    let api = Api::of(&node);
    let t = api.get("/api/v1/targets/1");
    assert_eq!(t["state"], "optimal", "{t}");
    let devices: Vec<String> = drives(&t).into_iter().map(|(_, d, _)| d).collect();
    let under = |name: &str| dir.join("drives").join(name).display().to_string();
    assert_eq!(
        devices,
        [under("t1-d0.img"), under("new1.img"), under("spare1.img"), under("t1-d3.img")]
    );
    assert!(read_back(&node, "before.bin") == data, "the data reads back after a restart");
    assert!(read_back(&node, "during.bin") == pattern(12, 0, 4 << 20));
    node.stop();

    // And a full check of the stopped node: namespace, chunks and RAID redundancy.
    let fsck = std::process::Command::new(support::node::STRIA)
        .args(["fsck", "--data"])
        .arg(&*dir)
        .output()
        .expect("run fsck");
    assert!(
        fsck.status.success(),
        "fsck: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
}

#[test]
fn cli_replaces_a_drive_and_adds_a_spare_on_a_running_node() {
    require_fuse();
    let dir = scratch("cli-replace");
    let elsewhere = scratch("cli-replace-ext");
    let size = format!("{}M", DRIVE_BYTES / MIB);
    let mut node = Node::start(&dir, &["--drives", "3", "--raid", "5", "--drive-size", &size]);
    let data = pattern(21, 0, FILE_BYTES);
    std::fs::write(node.mount.join("before.bin"), &data).expect("write through the mount");

    let help = node.cli(&["target", "replace-drive", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    for words in ["--with <PATH>", "--size <SIZE>", "DATA/drives/NAME", "--slot"] {
        assert!(help.contains(words), "replace-drive --help lacks {words}: {help}");
    }
    let help = node.cli(&["target", "add-spare", "--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("hot spare"));

    let outside = elsewhere.join("replacement.img");
    let outside_text = outside.display().to_string();
    let in_service = node.cli(&[
        "target",
        "replace-drive",
        "--target",
        "1",
        "--slot",
        "0",
        "--with",
        &outside_text,
        "--size",
        &size,
    ]);
    assert_eq!(
        in_service.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&in_service.stderr)
    );
    assert!(String::from_utf8_lossy(&in_service.stderr).contains("fail it first"));
    let failed = node.cli(&["target", "fail-drive", "--target", "1", "--slot", "0"]);
    assert!(failed.status.success(), "{}", String::from_utf8_lossy(&failed.stderr));

    // Refusals are one-line usage errors (exit 2) saying what is wrong.
    for (args, words) in [
        (vec!["--with", "absent.img"], "does not exist"),
        (vec!["--with", "small.img", "--size", "1M"], "at least"),
        (vec!["--with", "/var/tmp/a/../b.img", "--size", &size], ".."),
    ] {
        let mut all = vec!["target", "replace-drive", "--target", "1", "--slot", "0"];
        all.extend(args);
        let out = node.cli(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {stderr}");
        assert!(stderr.contains(words), "{all:?}: {stderr}");
    }

    // A drive file outside the data directory, given by absolute path.
    let out = node.cli(&[
        "target",
        "replace-drive",
        "--target",
        "1",
        "--slot",
        "0",
        "--with",
        &outside_text,
        "--size",
        &size,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("rebuilds in the background"), "{stdout}");
    // A spare by bare file name: DATA/drives/NAME.
    let out = node.cli(&["target", "add-spare", "--target", "1", "hot.img", "--size", &size]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("hot.img is a hot spare of target 1"), "{stdout}");
    assert!(dir.join("drives/hot.img").exists());
    let again = node.cli(&["target", "add-spare", "--target", "1", &outside_text]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already a drive of target 1 slot 0"));

    let api = Api::of(&node);
    optimal(&api);
    let (members, spares) = recorded(&dir);
    assert_eq!(members, [outside_text.as_str(), "drives/t1-d1.img", "drives/t1-d2.img"]);
    assert_eq!(spares, ["drives/hot.img"]);
    assert!(read_back(&node, "before.bin") == data);

    node.stop();
    node.restart();
    let api = Api::of(&node);
    let t = api.get("/api/v1/targets/1");
    assert_eq!(t["state"], "optimal", "{t}");
    let hot = dir.join("drives/hot.img").display().to_string();
    assert_eq!(
        drives(&t),
        [
            ("0".to_string(), outside_text.clone(), "active".to_string()),
            ("1".into(), dir.join("drives/t1-d1.img").display().to_string(), "active".into()),
            ("2".into(), dir.join("drives/t1-d2.img").display().to_string(), "active".into()),
            ("spare".into(), hot, "spare".into()),
        ]
    );
    assert!(read_back(&node, "before.bin") == data, "the data reads back after a restart");
    node.stop();
}
