//! `stria bench` against a running `stria up`: every workload at a tiny scale through the FUSE
//! mount and through the client library side by side, block workloads on a volume (client
//! library) and its NBD export, a sweep with charts, and the refusals. Each run's report is
//! checked for consistency: bytes written = bytes read, operations counted = operations asked
//! for, files created = files removed, none left behind.

mod support;

use std::process::Output;

use support::node::{Node, require_fuse, scratch};

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn ok(what: &str, out: Output) -> String {
    assert!(out.status.success(), "{what} failed ({}): {}", out.status, text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `stria bench ARGS --json - --data DIR` and returns the report.
fn bench(node: &Node, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", "-"]);
    let out = ok(&format!("stria {}", all.join(" ")), node.cli(&all));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn phase<'a>(record: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    record["result"]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == name)
        .unwrap_or_else(|| panic!("no phase {name} in {record}"))
}

/// The checks every run must pass; returns the records.
fn records(report: &serde_json::Value, expected: usize) -> Vec<serde_json::Value> {
    let records = report["records"].as_array().unwrap().clone();
    assert_eq!(records.len(), expected, "{report}");
    assert_eq!(report["interrupted"], false);
    for r in &records {
        let c = &r["result"]["checks"];
        assert_eq!(c["files_left"], 0, "{r}");
        assert_eq!(c["files_created"], c["files_removed"], "{r}");
        assert_eq!(c["verified"], true, "{r}");
        for p in r["result"]["phases"].as_array().unwrap() {
            assert!(p["rate"].as_f64().unwrap() > 0.0, "{p}");
        }
    }
    records
}

fn mount_is_empty(node: &Node) {
    let left: Vec<_> =
        std::fs::read_dir(&node.mount).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind on the mount: {left:?}");
}

#[test]
fn every_workload_runs_through_the_mount_and_the_client_library() {
    require_fuse();
    let dir = scratch("bench-workloads");
    let node = Node::start(&dir, &["--drives", "4", "--drive-size", "256M", "--raid", "5"]);
    let mount = node.mount.display().to_string();
    let m = mount.as_str();

    // seq: FUSE and native side by side; every byte verified on both.
    let report = bench(
        &node,
        &[
            "seq",
            "--path",
            m,
            "--native",
            "-t",
            "2",
            "--file-size",
            "4M",
            "--transfer",
            "1M",
            "--fsync",
            "--verify",
            "--runs",
            "2",
        ],
    );
    let rs = records(&report, 4);
    let kinds: Vec<&str> =
        report["targets"].as_array().unwrap().iter().map(|t| t["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["posix", "native"]);
    for r in &rs {
        assert_eq!(phase(r, "write")["write"]["bytes"], 8 << 20);
        assert_eq!(phase(r, "read")["read"]["bytes"], 8 << 20);
        assert_eq!(phase(r, "write")["write"]["ops"], 8);
    }
    // Interleaved run by run: mount, native, mount, native.
    let order: Vec<u64> = rs.iter().map(|r| r["target"].as_u64().unwrap()).collect();
    assert_eq!(order, [0, 1, 0, 1]);
    assert_eq!(report["ratios"].as_array().unwrap().len(), 2, "write and read ratios");
    mount_is_empty(&node);

    // shared (N-1, strided) on the mount.
    let report = bench(
        &node,
        &[
            "shared",
            "--path",
            m,
            "-t",
            "3",
            "--block-size",
            "1M",
            "--transfer",
            "64K",
            "--strided",
            "--verify",
        ],
    );
    let r = &records(&report, 1)[0];
    assert_eq!(phase(r, "write")["write"]["bytes"], 3 << 20);
    assert_eq!(phase(r, "read")["read"]["bytes"], 3 << 20);

    // random with a queue depth, counted exactly.
    let report = bench(
        &node,
        &[
            "random",
            "--path",
            m,
            "--native",
            "-t",
            "2",
            "--iodepth",
            "2",
            "--file-size",
            "2M",
            "--ops",
            "50",
            "--verify",
        ],
    );
    for r in records(&report, 2) {
        assert_eq!(phase(&r, "randwrite")["write"]["ops"], 200);
        assert_eq!(phase(&r, "randread")["read"]["ops"], 200);
    }

    // meta with 3 KiB files (kept inside the inode), in both modes.
    for shared in [false, true] {
        let mut args = vec![
            "meta",
            "--path",
            m,
            "--native",
            "-t",
            "2",
            "--files",
            "200",
            "--files-per-dir",
            "50",
            "--file-size",
            "3K",
            "--verify",
        ];
        if shared {
            args.push("--shared-dirs");
        }
        for r in records(&bench(&node, &args), 2) {
            for p in ["create", "stat", "read", "remove"] {
                assert_eq!(phase(&r, p)["ops"], 200, "{p}: {r}");
            }
            assert_eq!(r["result"]["checks"]["bytes_read"], 200 * 3072);
        }
    }

    // mix, corners, frames and io500 on the mount.
    let r = &records(
        &bench(
            &node,
            &[
                "mix",
                "--path",
                m,
                "-t",
                "2",
                "--file-size",
                "1M",
                "--ops",
                "20",
                "--read-percents",
                "100,50,0",
                "--verify",
            ],
        ),
        1,
    )[0];
    assert_eq!(phase(r, "read100")["read"]["ops"], 40);
    assert_eq!(phase(r, "read0")["write"]["ops"], 40);
    let r = &records(
        &bench(
            &node,
            &["corners", "--path", m, "-t", "1", "--file-size", "1M", "--ops", "20", "--verify"],
        ),
        1,
    )[0];
    assert_eq!(phase(r, "seqread-64k")["read"]["bytes"], 1 << 20);
    assert_eq!(phase(r, "randwrite-4k")["write"]["ops"], 20);
    let r = &records(
        &bench(
            &node,
            &["frames", "--path", m, "-t", "2", "--frame-size", "1M", "--frames", "4", "--verify"],
        ),
        1,
    )[0];
    assert_eq!(r["result"]["checks"]["files_created"], 8);
    assert_eq!(r["result"]["checks"]["bytes_read"], 8 << 20);
    let report = bench(
        &node,
        &[
            "io500",
            "--path",
            m,
            "-t",
            "2",
            "--easy-size",
            "2M",
            "--hard-transfers",
            "10",
            "--easy-files",
            "20",
            "--hard-files",
            "10",
            "--verify",
        ],
    );
    let r = &records(&report, 1)[0];
    assert_eq!(r["result"]["phases"].as_array().unwrap().len(), 12);
    assert!(r["result"]["extra"]["score"].as_f64().unwrap() > 0.0);
    assert!(report["notes"][0].as_str().unwrap().contains("NOT an official"));
    mount_is_empty(&node);
}

#[test]
fn block_workloads_run_on_a_volume_and_its_nbd_export() {
    require_fuse();
    let dir = scratch("bench-block");
    let node = Node::start(&dir, &["--drives", "4", "--drive-size", "256M", "--raid", "5"]);
    ok("volume create", node.cli(&["volume", "create", "bv", "--size", "64M"]));
    ok("export add", node.cli(&["export", "add", "bv"]));
    ok("initiator allow", node.cli(&["initiator", "allow", "bv", "127.0.0.1"]));
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(node.data.join("run.json")).unwrap())
            .unwrap();
    let uri = format!("nbd://{}/bv", run["nbd"].as_str().unwrap());

    // Without --overwrite a block target is refused (exit 2, nothing written).
    let out = node.cli(&["bench", "seq", "--volume", "bv", "--file-size", "1M"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--overwrite"), "{}", text(&out));

    let report = bench(
        &node,
        &[
            "random",
            "--volume",
            "bv",
            "--nbd",
            &uri,
            "--overwrite",
            "-t",
            "2",
            "--iodepth",
            "2",
            "--file-size",
            "4M",
            "--ops",
            "50",
            "--verify",
        ],
    );
    let rs = records(&report, 2);
    assert_eq!(report["targets"][0]["kind"], "block");
    assert_eq!(report["targets"][1]["label"], uri.as_str());
    for r in &rs {
        assert_eq!(phase(r, "prepare")["write"]["bytes"], 8 << 20);
        assert_eq!(phase(r, "randread")["read"]["ops"], 200);
    }
    let report = bench(
        &node,
        &[
            "seq",
            "--nbd",
            &uri,
            "--overwrite",
            "-t",
            "2",
            "--file-size",
            "8M",
            "--transfer",
            "1M",
            "--verify",
        ],
    );
    let r = &records(&report, 1)[0];
    assert_eq!(phase(r, "read")["read"]["bytes"], 16 << 20);

    // A workload that does not fit the device is refused before it writes.
    let out =
        node.cli(&["bench", "seq", "--nbd", &uri, "--overwrite", "-t", "2", "--file-size", "64M"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("the device has"), "{}", text(&out));
    // Metadata workloads need a file system.
    let out = node.cli(&["bench", "meta", "--volume", "bv", "--overwrite"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("needs a file system"), "{}", text(&out));
    // An NBD export this client may not use.
    let out = node.cli(&[
        "bench",
        "seq",
        "--nbd",
        &format!("nbd://{}/nope", run["nbd"].as_str().unwrap()),
        "--overwrite",
    ]);
    assert!(!out.status.success());
    assert!(text(&out).contains("no such export"), "{}", text(&out));
}

#[test]
fn a_sweep_writes_a_table_json_and_charts() {
    require_fuse();
    let dir = scratch("bench-sweep");
    let node = Node::start(&dir, &["--drives", "3", "--drive-size", "256M", "--raid", "5"]);
    let ext = dir.join("plain");
    std::fs::create_dir_all(&ext).unwrap();
    let charts = dir.join("charts");
    let json = dir.join("report.json");
    let out = ok(
        "sweep",
        node.cli(&[
            "bench",
            "sweep",
            "seq",
            "--path",
            &node.mount.display().to_string(),
            "--compare",
            &ext.display().to_string(),
            "-t",
            "4",
            "--file-size",
            "2M",
            "--transfer",
            "512K",
            "--verify",
            "--no-progress",
            "--charts",
            &charts.display().to_string(),
            "--json",
            &json.display().to_string(),
        ]),
    );
    assert!(out.contains("SUSTAINED") && out.contains("PEAK"), "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["sweep"], true);
    records(&report, 6);
    let threads: Vec<u64> = report["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["threads"].as_u64().unwrap())
        .collect();
    assert_eq!(
        threads,
        [1, 2, 4, 1, 2, 4, 1, 2, 4, 1, 2, 4],
        "2 targets x (write, read) x 3 counts"
    );
    let mut files: Vec<String> = std::fs::read_dir(&charts)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["seq-read.png", "seq-read.svg", "seq-write.png", "seq-write.svg"]);
    let png = std::fs::read(charts.join("seq-write.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
    // Bad arguments are usage errors.
    let out = node.cli(&["bench", "seq", "--path", "/nonexistent-dir"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("/nonexistent-dir"), "{}", text(&out));
    let out = node.cli(&["bench", "seq"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("nothing to measure"), "{}", text(&out));
}

#[test]
fn ctrl_c_stops_a_run_with_partial_results_and_nothing_left_behind() {
    require_fuse();
    let dir = scratch("bench-interrupt");
    let node = Node::start(&dir, &["--drives", "3", "--drive-size", "256M", "--raid", "5"]);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_stria"))
        .args(["bench", "meta", "--path", &node.mount.display().to_string(), "-t", "2"])
        .args(["--files", "1000000", "--files-per-dir", "1000", "--no-progress", "--data"])
        .arg(&node.data)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Let it create some files, then interrupt it as Ctrl-C does.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    fn walk(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| {
                        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                            walk(&e.path())
                        } else {
                            1
                        }
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    while walk(&node.mount) < 50 {
        assert!(std::time::Instant::now() < deadline, "the benchmark created no files");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: kill with a valid pid and signal.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("INTERRUPTED"), "{stdout}");
    assert!(stdout.contains("create"), "the partial create phase is reported: {stdout}");
    assert!(text(&out).contains("interrupted"), "{}", text(&out));
    mount_is_empty(&node);
}
