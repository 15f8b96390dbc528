//! The `stria raid` command line end to end, on sparse drive files in a fresh temp directory:
//! what a user types and what they get back (bytes, states, exit codes, one-line errors).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const STRIA: &str = env!("CARGO_BIN_EXE_stria");

/// A temp directory removed when the test ends, pass or fail.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("stria-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the scratch directory");
        Scratch { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn drives(&self, prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| self.path(&format!("{prefix}{i}"))).collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stria(args: &[&str], drives: &[String]) -> Output {
    Command::new(STRIA).args(args).args(drives).output().expect("running stria")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[track_caller]
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "stria failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The command failed with exactly one `error:` line; returns it.
#[track_caller]
fn one_error(out: Output) -> String {
    assert!(!out.status.success(), "expected a failure, got success: {}", text(&out.stdout));
    let stderr = text(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "expected one error line, got:\n{stderr}");
    errors[0].to_string()
}

fn json_state(drives: &[String]) -> String {
    let out = ok(stria(&["raid", "status", "--json"], drives));
    let status: serde_json::Value = serde_json::from_str(&out).expect("status --json is JSON");
    status["state"].as_str().expect("state is a string").to_string()
}

fn read_back(drives: &[String], offset: u64, length: usize) -> Vec<u8> {
    let out = stria(
        &["raid", "read", "--offset", &offset.to_string(), "--length", &length.to_string()],
        drives,
    );
    assert!(out.status.success(), "read failed: {}", text(&out.stderr));
    out.stdout
}

#[test]
fn raid6_keeps_unaligned_bytes_through_fail_and_replace() {
    let scratch = Scratch::new("raid6");
    let mut drives = scratch.drives("d", 6);
    let created = ok(stria(&["raid", "create", "--level", "6", "--size", "64M"], &drives));
    assert!(created.contains("raid6"), "{created}");

    // 300 KiB of non-repeating bytes at an offset that is aligned to nothing.
    let payload: Vec<u8> =
        (0..300 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let input = scratch.path("payload.bin");
    std::fs::write(&input, &payload).expect("writing the payload file");
    let offset = 1_000_003u64;
    let wrote =
        ok(stria(&["raid", "write", "--offset", &offset.to_string(), "--in", &input], &drives));
    assert!(wrote.contains(&format!("wrote {} bytes", payload.len())), "{wrote}");
    assert!(
        read_back(&drives, offset, payload.len()) == payload,
        "read differs from what was written"
    );
    // The bytes around the write are untouched (the edges were read-modify-written).
    assert!(read_back(&drives, offset - 3, 3).iter().all(|&b| b == 0));
    assert!(read_back(&drives, offset + payload.len() as u64, 5).iter().all(|&b| b == 0));
    assert_eq!(json_state(&drives), "optimal");

    ok(stria(&["raid", "fail", "--slot", "2"], &drives));
    assert_eq!(json_state(&drives), "degraded");
    // Still listed (a glob would list it), the failed drive stays out; data comes from parity.
    assert!(read_back(&drives, offset, payload.len()) == payload, "degraded read differs");

    let fresh = scratch.path("new2");
    ok(stria(&["raid", "replace", "--slot", "2", "--with", &fresh, "--size", "64M"], &drives));
    drives[2] = fresh;
    assert_eq!(json_state(&drives), "optimal");
    let check = ok(stria(&["raid", "check"], &drives));
    assert!(check.contains("clean"), "{check}");
    assert!(read_back(&drives, offset, payload.len()) == payload, "read after rebuild differs");
}

#[test]
fn bad_arguments_get_one_line_errors() {
    let scratch = Scratch::new("args");
    let drives = scratch.drives("d", 4);

    let e = one_error(stria(&["raid", "create", "--level", "7", "--size", "32M"], &drives));
    assert!(e.contains("unknown RAID level '7'"), "{e}");
    assert!(!Path::new(&drives[0]).exists(), "a refused create leaves no files behind");

    ok(stria(&["raid", "create", "--level", "5", "--size", "32M"], &drives));

    let out = stria(&["raid", "fail", "--slot", "9"], &drives);
    assert_eq!(out.status.code(), Some(2), "a bad slot is a usage error");
    let e = one_error(out);
    assert!(e.contains("--slot 9 does not exist") && e.contains("0..3"), "{e}");

    let mut missing = drives.clone();
    missing[1] = scratch.path("no-such-drive");
    let e = one_error(stria(&["raid", "check"], &missing));
    assert!(e.contains("no-such-drive") && e.contains("does not exist"), "{e}");

    let other = scratch.drives("other", 3);
    ok(stria(&["raid", "create", "--level", "5", "--size", "32M"], &other));
    let mut mixed = drives.clone();
    mixed[3] = other[0].clone();
    let e = one_error(stria(&["raid", "check"], &mixed));
    assert!(e.contains("other0") && e.contains("another array"), "{e}");

    // None of the refusals damaged the array.
    assert_eq!(json_state(&drives), "optimal");
}

#[test]
fn torture_acknowledged_writes_survive_a_kill() {
    let scratch = Scratch::new("torture");
    let drives = scratch.drives("d", 4);
    ok(stria(
        &["raid", "create", "--level", "5", "--stripe-unit", "16K", "--size", "64M"],
        &drives,
    ));
    let mut child = Command::new(STRIA)
        .args(["raid", "torture", "--seed", "42", "--blocks", "2048"])
        .args(&drives)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the writer");
    let stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut acked = 0u64;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("ack ").and_then(|n| n.parse().ok()) {
                acked = n;
            }
        }
        acked
    });
    std::thread::sleep(Duration::from_secs(1));
    child.kill().expect("killing the writer");
    let _ = child.wait();
    let acked = reader.join().expect("reader thread");
    assert!(acked > 0, "the writer acknowledged nothing in a second");

    // The killed writer's drive locks are released when the kernel tears down its I/O; retry
    // briefly while they are still held.
    let args = [
        "raid",
        "torture",
        "--verify",
        "--seed",
        "42",
        "--blocks",
        "2048",
        "--acked",
        &acked.to_string(),
    ];
    let mut out = stria(&args, &drives);
    for _ in 0..100 {
        if out.status.success() || !text(&out.stderr).contains("in use by another") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        out = stria(&args, &drives);
    }
    let summary = ok(out);
    assert!(summary.starts_with("verified 2048 blocks:"), "{summary}");

    // The verifier catches a wrong claim: a different seed's content was never written.
    let wrong = [
        "raid",
        "torture",
        "--verify",
        "--seed",
        "43",
        "--blocks",
        "2048",
        "--acked",
        &acked.to_string(),
    ];
    let e = one_error(stria(&wrong, &drives));
    assert!(e.contains("blocks are wrong"), "{e}");
}

#[test]
fn bench_reports_every_cell_and_removes_its_files() {
    let scratch = Scratch::new("bench");
    let dir = scratch.path("work");
    let json = scratch.path("bench.json");
    let out = ok(stria(
        &[
            "raid",
            "bench",
            "--dir",
            &dir,
            "--drives",
            "4",
            "--drive-size",
            "32M",
            "--working-set",
            "8M",
            "--levels",
            "0,5",
            "--states",
            "optimal,degraded,rebuilding",
            "--seconds",
            "0.1",
            "--queue-depths",
            "1,2",
            "--random-depth",
            "2",
            "--json",
            &json,
        ],
        &[],
    ));
    assert!(out.contains("seqW qd2") && out.contains("raid5") && out.contains("ratios"), "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("bench JSON written"))
            .expect("valid JSON");
    let cells = report["cells"].as_array().expect("cells");
    // raid0 has only the optimal state; raid5 has all three.
    assert_eq!(cells.len(), 4, "{report}");
    for cell in cells {
        assert_eq!(cell["random"].as_array().map(Vec::len), Some(5));
        assert!(cell["seq_read"][1]["mb_per_s"].as_f64().is_some_and(|v| v > 0.0), "{cell}");
    }
    assert!(
        report["ratios"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x["what"] == "seq_write_vs_raid0"))
    );
    assert!(!Path::new(&dir).exists(), "the scratch drive directory is removed afterwards");
}
