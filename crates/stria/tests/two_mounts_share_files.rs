//! `stria mount`: a second client of a running node, mounted beside the node's own mount.
//! What one mount writes and closes, the other reads at its next open (close-to-open), even
//! when it had the old bytes in its page cache a moment before and its attribute cache has
//! not expired; names made or removed through one show in the other, and a name cached for
//! a file removed elsewhere does not fail a create; two mounts writing interleaved records of
//! one file leave every byte where its writer put it. A wrong cluster secret
//! is refused with a clear error, the node lists the mount among its clients (`GET
//! /api/v1/clients`) until it stops, and the command stops cleanly on SIGTERM and on `umount`.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::http::Api;
use support::node::{Node, STRIA, SecondMount, is_mounted, pattern, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];
const FILE_BYTES: usize = 1 << 20;
const REWRITE_BYTES: usize = 200_000;

/// Overwrites `bytes` at `offset` of `path` in place (no truncate) and closes it.
fn overwrite(path: &Path, offset: u64, bytes: &[u8]) {
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(bytes).unwrap();
}

fn append(path: &Path, bytes: &[u8]) {
    std::fs::OpenOptions::new().append(true).open(path).unwrap().write_all(bytes).unwrap();
}

#[test]
fn two_mounts_see_each_others_closed_files() {
    require_fuse();
    let dir = scratch("two-mounts");
    let node = Node::start(&dir, &ARGS);
    let m1 = node.mount.clone();
    let mut second = SecondMount::start(&node, &dir.join("m2"));
    let m2 = second.path.clone();

    // The node lists the second mount among its clients, beside its own.
    let api = Api::of(&node);
    let m2_text = m2.display().to_string();
    let listed =
        move |clients: &serde_json::Value| {
            clients.as_array().expect("a list").iter().any(|c| {
                c["kind"] == "fuse" && c["mount"] == m2_text.as_str() && c["host"].is_string()
            })
        };
    // (It says hello just after mounting.)
    let clients =
        api.eventually("/api/v1/clients", "the second mount", Duration::from_secs(10), &listed);
    let own = clients.as_array().unwrap().iter().filter(|c| c["kind"] == "fuse").count();
    assert_eq!(own, 2, "the node's own mount and the second one: {clients}");

    // A file written through the node's mount reads back whole through the second one.
    let mut expected = pattern(1, 0, FILE_BYTES);
    std::fs::write(m1.join("shared"), &expected).unwrap();
    assert!(std::fs::read(m2.join("shared")).unwrap() == expected, "m2 reads m1's file");

    // Rewritten in place through m2 while m1 holds the old pages in its page cache, with
    // m1's attributes (same size) still within their timeout: m1's next open reads the new
    // bytes.
    for round in 0..5u64 {
        assert!(std::fs::read(m1.join("shared")).unwrap() == expected, "round {round}: m1");
        let rewrite = pattern(100 + round, 0, REWRITE_BYTES);
        overwrite(&m2.join("shared"), 0, &rewrite);
        expected[..REWRITE_BYTES].copy_from_slice(&rewrite);
        let seen = std::fs::read(m1.join("shared")).unwrap();
        assert_eq!(seen.len(), expected.len(), "round {round}: size seen by m1");
        assert!(seen == expected, "round {round}: m1 read stale bytes after m2's close");
    }

    // Grown through m2 while m1's cached size is the old one: m1's next open reads it all.
    for round in 0..3u64 {
        assert!(std::fs::read(m1.join("shared")).unwrap() == expected, "append {round}: m1");
        let tail = pattern(200 + round, expected.len() as u64, 5000);
        append(&m2.join("shared"), &tail);
        expected.extend_from_slice(&tail);
        let seen = std::fs::read(m1.join("shared")).unwrap();
        assert_eq!(seen.len(), expected.len(), "append {round}: m1 missed the new end");
        assert!(seen == expected, "append {round}: m1 read stale bytes");
    }

    // And the other way round: m1 rewrites what m2 has cached.
    assert!(std::fs::read(m2.join("shared")).unwrap() == expected);
    let rewrite = pattern(300, 0, REWRITE_BYTES);
    overwrite(&m1.join("shared"), 4096, &rewrite);
    expected[4096..4096 + REWRITE_BYTES].copy_from_slice(&rewrite);
    assert!(std::fs::read(m2.join("shared")).unwrap() == expected, "m2 read stale bytes");

    // Names: made through m2, found through m1; removed through m1, gone from m2 once its
    // entry cache (1 s) expires.
    std::fs::create_dir(m2.join("made-on-m2")).unwrap();
    std::fs::write(m2.join("made-on-m2/small"), b"inline bytes").unwrap();
    assert_eq!(std::fs::read(m1.join("made-on-m2/small")).unwrap(), b"inline bytes");
    std::fs::remove_file(m1.join("made-on-m2/small")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while m2.join("made-on-m2/small").exists() {
        assert!(Instant::now() < deadline, "m2 still sees a file m1 removed 10 s ago");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::remove_dir(m2.join("made-on-m2")).unwrap();

    // A name m2 still has cached (for 1 s) for a file m1 removed: an O_CREAT open through
    // it makes a new file instead of failing with ENOENT on the dead inode (ESTALE makes the
    // kernel look the name up again); a plain open then finds the new file, not the old.
    // (m2 caches each name with a stat, and every round has a name of its own: a handle of
    // m2's own, released only after its close returned, would keep the old file open here for
    // a moment, and a name m2 still had cached from a round before would show that round's
    // file to the stat.)
    for round in 0..3 {
        let name = format!("victim-{round}");
        std::fs::write(m1.join(&name), b"old").unwrap();
        assert_eq!(std::fs::metadata(m2.join(&name)).unwrap().len(), 3);
        std::fs::remove_file(m1.join(&name)).unwrap();
        std::fs::write(m1.join(&name), format!("renewed {round}")).unwrap();
        let read = std::fs::read(m2.join(&name)).expect("read through a name renewed elsewhere");
        assert_eq!(read, format!("renewed {round}").as_bytes());
    }
    std::fs::write(m1.join("victim"), b"old").unwrap();
    assert_eq!(std::fs::metadata(m2.join("victim")).unwrap().len(), 3);
    std::fs::remove_file(m1.join("victim")).unwrap();
    let mut fresh = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(m2.join("victim"))
        .expect("O_CREAT through a name whose file another mount removed");
    fresh.write_all(b"new").unwrap();
    drop(fresh);
    assert_eq!(std::fs::read(m1.join("victim")).unwrap(), b"new");

    // Two mounts write interleaved, unaligned records of one file at once: every byte is
    // the one its writer put there, seen through both mounts.
    const RECORD: usize = 5000;
    const RECORDS: usize = 200;
    let record = |i: usize| vec![(i % 251) as u8 + 1; RECORD];
    std::fs::File::create(m1.join("interleaved")).unwrap();
    std::thread::scope(|scope| {
        for (first, mount) in [(0, &m1), (1, &m2)] {
            scope.spawn(move || {
                use std::os::unix::fs::FileExt;
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(mount.join("interleaved"))
                    .unwrap();
                for i in (first..RECORDS).step_by(2) {
                    file.write_all_at(&record(i), (i * RECORD) as u64).unwrap();
                }
                file.sync_all().unwrap();
            });
        }
    });
    let want: Vec<u8> = (0..RECORDS).flat_map(record).collect();
    for mount in [&m1, &m2] {
        let got = std::fs::read(mount.join("interleaved")).unwrap();
        assert_eq!(got.len(), want.len(), "{}: size of the shared file", mount.display());
        let bad = (0..RECORDS)
            .find(|&i| got[i * RECORD..(i + 1) * RECORD] != want[i * RECORD..(i + 1) * RECORD]);
        assert_eq!(bad, None, "{}: first wrong record", mount.display());
    }

    // SIGTERM unmounts and exits cleanly.
    let status = second.terminate();
    assert!(status.success(), "stria mount exited with {status}: {}", second.stderr());
    assert!(!is_mounted(&m2), "m2 still mounted after SIGTERM");
    assert!(second.stderr().contains("unmounted"), "{}", second.stderr());
    let clients = api.get("/api/v1/clients");
    assert!(!listed(&clients), "a mount that said goodbye is still listed: {clients}");
    // What m2 wrote is the node's: m1 still reads it after m2 is gone.
    assert!(std::fs::read(m1.join("shared")).unwrap() == expected);

    // `umount` from outside ends the command.
    let mut third = SecondMount::start(&node, &dir.join("m3"));
    let umount = Command::new("umount").arg(&third.path).status().unwrap();
    assert!(umount.success());
    let status = third.wait_exit();
    assert!(status.success(), "stria mount exited with {status}: {}", third.stderr());
    assert!(third.stderr().contains("was unmounted"), "{}", third.stderr());
}

#[test]
fn a_wrong_secret_or_a_partial_address_is_refused_clearly() {
    require_fuse();
    let dir = scratch("two-mounts-refused");
    let node = Node::start(&dir, &ARGS);
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let (meta, storage) = (run["meta"].as_str().unwrap(), run["storage"].as_str().unwrap());
    let wrong = dir.join("wrong-secret");
    std::fs::write(&wrong, "ab".repeat(32)).unwrap();
    let target = dir.join("m-refused");
    let out = Command::new(STRIA)
        .arg("mount")
        .arg(&target)
        .args(["--meta", meta, "--storage", storage, "--secret-file"])
        .arg(&wrong)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("refused the cluster secret"), "{stderr}");
    assert!(!is_mounted(&target));

    // The right secret through the same flags mounts.
    let right = dir.join("cluster-secret");
    let mut child = Command::new(STRIA)
        .arg("mount")
        .arg(&target)
        .args(["--meta", meta, "--storage", storage, "--secret-file"])
        .arg(&right)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !is_mounted(&target) {
        assert!(child.try_wait().unwrap().is_none(), "stria mount with the right secret exited");
        assert!(Instant::now() < deadline, "not mounted with the right secret after 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(node.mount.join("seen"), b"x").unwrap();
    assert_eq!(std::fs::read(target.join("seen")).unwrap(), b"x");
    // SAFETY: kill with a valid pid and signal.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());

    // --meta without the rest is a usage error (exit 2) naming what is missing.
    let out = Command::new(STRIA).arg("mount").arg(&target).args(["--meta", meta]).output();
    let out = out.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--storage") && stderr.contains("--secret-file"), "{stderr}");
}
