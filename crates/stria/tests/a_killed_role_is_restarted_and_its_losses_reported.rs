//! `stria up --separate-roles`: the storage and metadata roles run as processes of their own.
//! A role killed with -9 is recovered from and restarted while the mount stays up; what it had
//! acknowledged but not yet made durable is lost, and the mount says so: the next fsync of a
//! file (or fsyncdir of a directory) with such a change fails with EIO, once. Durable data
//! reads back, and the stopped node is clean.

#![allow(clippy::unwrap_used)]

mod support;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use support::node::{Node, pattern, require_fuse, scratch};

const ARGS: [&str; 7] =
    ["--drives", "4", "--drive-size", "256M", "--raid", "5", "--separate-roles"];

fn role_pid(data: &Path, role: &str) -> Option<u32> {
    let text = std::fs::read_to_string(data.join("roles").join(format!("{role}.json"))).ok()?;
    let record: serde_json::Value = serde_json::from_str(&text).ok()?;
    record["pid"].as_u64().map(|pid| pid as u32)
}

/// kill -9 of one role; returns its pid.
fn kill_role(node: &Node, role: &str) -> u32 {
    let pid = role_pid(&node.data, role).unwrap_or_else(|| panic!("no {role} role record"));
    // SAFETY: kill with a pid from the role's record and a valid signal.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0, "kill the {role} role");
    pid
}

/// Returns once the supervisor has both roles serving again after `pid` died.
fn wait_roles_back(node: &Node, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let back = ["storage", "meta"].iter().all(|r| {
            role_pid(&node.data, r)
                .is_some_and(|p| p != pid && Path::new(&format!("/proc/{p}")).exists())
        });
        if back && node.cli(&["df"]).status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "roles not back: {}", node.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Past the kernel's cached entries and attributes (1 s on the mount).
    std::thread::sleep(Duration::from_millis(1200));
}

#[test]
fn killed_roles_come_back_and_a_lost_change_fails_its_sync_once() {
    require_fuse();
    let dir = scratch("separate-roles");
    let mut node = Node::start(&dir, &ARGS);
    let mnt = node.mount.clone();
    for role in ["storage", "meta"] {
        assert!(role_pid(&node.data, role).is_some(), "no {role} role process");
    }
    assert_ne!(role_pid(&node.data, "storage"), role_pid(&node.data, "meta"));

    // Durable before any kill.
    let durable = pattern(1, 0, 3 << 20);
    let mut a = File::create(mnt.join("a")).unwrap();
    a.write_all(&durable).unwrap();
    a.sync_all().unwrap();
    File::open(&mnt).unwrap().sync_all().unwrap();

    // Written, acknowledged, not synced: the storage role dies with it.
    let mut b = File::create(mnt.join("b")).unwrap();
    File::open(&mnt).unwrap().sync_all().unwrap();
    b.write_all(&pattern(2, 0, 1 << 20)).unwrap();
    b.flush().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let killed = kill_role(&node, "storage");
    // A read made while the role is down (O_DIRECT: past the page cache) waits for it and
    // succeeds.
    let direct =
        OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(mnt.join("a")).unwrap();
    let mut again = vec![0u8; durable.len()];
    direct.read_exact_at(&mut again, 0).expect("a read during the restart waits for the role");
    assert_eq!(again, durable);
    let log = std::fs::read_to_string(node.data.join("logs/stria.log")).unwrap();
    assert!(log.contains("cannot connect"), "the read never met the dead role:\n{log}");
    wait_roles_back(&node, killed);
    let lost = b.sync_all().expect_err("the restarted storage role lost b's data");
    assert_eq!(lost.raw_os_error(), Some(libc::EIO), "{lost}");
    b.sync_all().expect("the loss is reported once");
    assert!(node.stderr().contains("the storage role died"), "{}", node.stderr());

    // The mount kept working: durable data is there, new data becomes durable.
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), durable);
    let mut c = File::create(mnt.join("c")).unwrap();
    c.write_all(&pattern(3, 0, 1 << 20)).unwrap();
    c.sync_all().unwrap();
    File::open(&mnt).unwrap().sync_all().unwrap();

    // Data whose size the metadata role will die without: the recovery must not take it for
    // bytes past the file's end (it is the mount's, unpublished), so its fsync afterwards works.
    let mut g = File::create(mnt.join("g")).unwrap();
    g.write_all(&pattern(4, 0, 1 << 20)).unwrap();
    g.sync_all().unwrap();
    std::fs::create_dir(mnt.join("d")).unwrap();
    File::open(&mnt).unwrap().sync_all().unwrap();
    g.write_all(&pattern(5, 0, 2 << 20)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // And a namespace change not yet synced when the metadata role dies.
    OpenOptions::new().create(true).write(true).open(mnt.join("d/e")).unwrap();
    let killed = kill_role(&node, "meta");
    // A lookup of a name never looked up before (nothing cached) waits for the role.
    let missing = std::fs::metadata(mnt.join("d/never")).expect_err("no such name");
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound, "{missing}");
    wait_roles_back(&node, killed);
    let d = File::open(mnt.join("d")).unwrap();
    let lost = d.sync_all().expect_err("the restarted metadata role may have lost d/e");
    assert_eq!(lost.raw_os_error(), Some(libc::EIO), "{lost}");
    d.sync_all().expect("the loss is reported once");
    g.sync_all().expect("g's unpublished data survived the recovery");
    let mut want = pattern(4, 0, 1 << 20);
    want.extend(pattern(5, 0, 2 << 20));
    assert_eq!(std::fs::read(mnt.join("g")).unwrap(), want);
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), durable);
    assert_eq!(std::fs::read(mnt.join("c")).unwrap(), pattern(3, 0, 1 << 20));
    drop((a, b, c, d, g, direct));

    node.stop();
    let fsck = node.cli(&["fsck"]);
    let out = String::from_utf8_lossy(&fsck.stdout);
    assert!(fsck.status.success() && out.contains("fsck: clean"), "{out}");
    assert!(!node.data.join("roles/storage.json").exists(), "a stopped role keeps its record");

    // All roles in one process again, on the same data.
    node.args.retain(|a| a != "--separate-roles");
    node.restart();
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), durable);
    assert_eq!(std::fs::read(mnt.join("c")).unwrap(), pattern(3, 0, 1 << 20));
    node.stop();
}
