//! The file system end to end: `stria up` as a child process, a real FUSE mount, real system
//! calls. Persistence across a clean restart, crash (kill -9) with fsynced data intact and a
//! clean `stria fsck`, concurrent writers, and a drive lost under a running mount.

mod support;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use support::node::{Node, STRIA, pattern, require_fuse, scratch};

fn ok(what: &str, out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write_file(path: &Path, seed: u64, len: usize) {
    let mut file = File::create(path).expect("create");
    file.write_all(&pattern(seed, 0, len)).expect("write");
    file.sync_all().expect("fsync");
}

fn check_file(path: &Path, seed: u64, len: usize) {
    let got = fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert_eq!(got.len(), len, "{} has the wrong size", path.display());
    let want = pattern(seed, 0, len);
    if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
        panic!("{} differs at byte {at}", path.display());
    }
}

/// Files of every size class, a tree, a symlink, a hard link and xattrs; survives a clean
/// restart byte for byte.
#[test]
fn everything_survives_a_clean_restart() {
    require_fuse();
    let dir = scratch("restart");
    let mut node = Node::start(&dir, &["--drives", "4", "--raid", "5", "--drive-size", "256M"]);
    let m = node.mount.clone();
    let sizes = [0usize, 1, 3072, 3073, 4096, 65_537, 1 << 20, (3 << 20) + 12_345];
    fs::create_dir_all(m.join("a/b/c")).expect("mkdir");
    for (i, size) in sizes.iter().enumerate() {
        write_file(&m.join(format!("a/b/f{i}")), i as u64, *size);
    }
    std::os::unix::fs::symlink("b/f3", m.join("a/link")).expect("symlink");
    fs::hard_link(m.join("a/b/f4"), m.join("a/c-hard")).expect("link");
    fs::set_permissions(m.join("a/b/f2"), fs::Permissions::from_mode(0o640)).expect("chmod");
    let set = Command::new("setfattr")
        .args(["-n", "user.color", "-v", "blue"])
        .arg(m.join("a/b/f1"))
        .status();
    let xattr_tool = set.map(|s| s.success()).unwrap_or(false);
    node.stop();
    node.restart();
    for (i, size) in sizes.iter().enumerate() {
        check_file(&m.join(format!("a/b/f{i}")), i as u64, *size);
    }
    assert_eq!(fs::read_link(m.join("a/link")).expect("readlink"), Path::new("b/f3"));
    check_file(&m.join("a/link"), 3, sizes[3]);
    assert_eq!(fs::metadata(m.join("a/c-hard")).expect("stat").nlink(), 2);
    assert_eq!(fs::metadata(m.join("a/b/f2")).expect("stat").mode() & 0o7777, 0o640);
    assert!(m.join("a/b/c").is_dir());
    if xattr_tool {
        let out = Command::new("getfattr")
            .args(["--only-values", "-n", "user.color"])
            .arg(m.join("a/b/f1"))
            .output()
            .expect("getfattr");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "blue");
    }
    node.stop();
    let _ = fs::remove_dir_all(&dir);
}

/// N processes each write their own file, N processes write disjoint regions of one shared
/// file (dd with conv=notrunc); verified byte by byte after a remount.
#[test]
fn concurrent_writers_own_files_and_one_shared_file() {
    require_fuse();
    let dir = scratch("concurrent");
    let mut node = Node::start(
        &dir,
        &["--drives", "4", "--raid", "6", "--drive-size", "256M", "--targets", "2"],
    );
    let m = node.mount.clone();
    const WRITERS: usize = 4;
    const REGION: usize = 3 << 20;
    let sources: Vec<_> = (0..WRITERS)
        .map(|i| {
            let src = dir.join(format!("src{i}"));
            fs::write(&src, pattern(100 + i as u64, 0, REGION)).expect("source");
            src
        })
        .collect();
    File::create(m.join("shared")).expect("shared");
    let mut children = Vec::new();
    for (i, src) in sources.iter().enumerate() {
        let own = m.join(format!("own{i}"));
        children.push(
            Command::new("dd")
                .arg(format!("if={}", src.display()))
                .arg(format!("of={}", own.display()))
                .args(["bs=256K", "conv=fsync", "status=none"])
                .spawn()
                .expect("dd"),
        );
        children.push(
            Command::new("dd")
                .arg(format!("if={}", src.display()))
                .arg(format!("of={}", m.join("shared").display()))
                .arg(format!("seek={}", i * REGION))
                .args(["bs=64K", "oflag=seek_bytes", "conv=notrunc,fsync", "status=none"])
                .stdout(Stdio::null())
                .spawn()
                .expect("dd"),
        );
    }
    for mut child in children {
        assert!(child.wait().expect("wait dd").success(), "a writer failed");
    }
    node.stop();
    node.restart();
    let shared = fs::read(m.join("shared")).expect("read shared");
    assert_eq!(shared.len(), WRITERS * REGION);
    for i in 0..WRITERS {
        check_file(&m.join(format!("own{i}")), 100 + i as u64, REGION);
        let want = pattern(100 + i as u64, 0, REGION);
        assert!(shared[i * REGION..(i + 1) * REGION] == want[..], "shared region {i} differs");
    }
    node.stop();
    let _ = fs::remove_dir_all(&dir);
}

/// kill -9 of the node while a writer fsyncs files: after a restart every file the writer
/// reported as fsynced is intact, and `stria fsck` finds nothing wrong.
#[test]
fn fsynced_files_survive_kill_9() {
    require_fuse();
    let dir = scratch("kill9");
    let mut node = Node::start(&dir, &["--drives", "4", "--raid", "5", "--drive-size", "256M"]);
    let m = node.mount.clone();
    let mut synced: Vec<(usize, usize)> = Vec::new();
    for round in 0..3u64 {
        fs::create_dir_all(m.join(format!("r{round}"))).expect("mkdir");
        // A writer thread fsyncs files one after another; the node dies under it.
        let mount = m.clone();
        let writer = std::thread::spawn(move || {
            let mut done = Vec::new();
            for i in 0..10_000usize {
                let size = [100, 5000, 300_000, 1_200_000][i % 4];
                let path = mount.join(format!("r{round}/f{i}"));
                let seed = round * 100_000 + i as u64;
                let result = (|| -> std::io::Result<()> {
                    let mut file = File::create(&path)?;
                    file.write_all(&pattern(seed, 0, size))?;
                    file.sync_all()?;
                    // The directory entry must be durable too.
                    File::open(path.parent().expect("parent"))?.sync_all()
                })();
                if result.is_err() {
                    break;
                }
                done.push((i, size));
            }
            done
        });
        std::thread::sleep(std::time::Duration::from_millis(1500 + round * 700));
        node.kill();
        let done = writer.join().expect("writer thread");
        assert!(!done.is_empty(), "the writer fsynced nothing before the kill");
        node.restart();
        for (i, size) in &done {
            check_file(&m.join(format!("r{round}/f{i}")), round * 100_000 + *i as u64, *size);
        }
        synced.extend(done);
    }
    node.stop();
    let out = ok(
        "stria fsck",
        Command::new(STRIA).args(["fsck", "--data"]).arg(&dir).output().expect("fsck"),
    );
    assert!(out.contains("clean"), "fsck output: {out}");
    let _ = fs::remove_dir_all(&dir);
}

/// A drive of a RAID 6 target fails while files are written and read through the mount: no
/// application sees an error and all data verifies, also after a restart.
#[test]
fn a_failed_drive_under_the_mount_is_invisible_to_applications() {
    require_fuse();
    let dir = scratch("driveloss");
    let mut node = Node::start(&dir, &["--drives", "6", "--raid", "6", "--drive-size", "128M"]);
    let m = node.mount.clone();
    let mount = m.clone();
    let worker = std::thread::spawn(move || {
        for i in 0..60u64 {
            let size = 256 * 1024 + (i as usize) * 4099;
            let path = mount.join(format!("f{i}"));
            let mut file =
                OpenOptions::new().create(true).write(true).truncate(true).open(&path)?;
            file.write_all(&pattern(i, 0, size))?;
            file.sync_all()?;
            drop(file);
            let mut back = Vec::new();
            File::open(&path)?.read_to_end(&mut back)?;
            if back != pattern(i, 0, size) {
                return Err(std::io::Error::other(format!("f{i} read back wrong")));
            }
            let mut buf = vec![0u8; 4096];
            File::open(&path)?.read_exact_at(&mut buf, 4096)?;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok::<(), std::io::Error>(())
    });
    std::thread::sleep(std::time::Duration::from_millis(400));
    let out = ok(
        "stria target fail-drive",
        node.cli(&["target", "fail-drive", "--target", "1", "--slot", "2"]),
    );
    assert!(out.contains("failed"), "fail-drive output: {out}");
    worker.join().expect("worker").expect("an application saw an error");
    let status = ok("stria df", node.cli(&["df"]));
    assert!(status.contains("degraded"), "df does not show the degraded target: {status}");
    node.stop();
    node.restart();
    for i in 0..60u64 {
        check_file(&m.join(format!("f{i}")), i, 256 * 1024 + (i as usize) * 4099);
    }
    node.stop();
    let _ = fs::remove_dir_all(&dir);
}

/// `setstripe` on a directory sets the layout new files inherit; `getstripe` shows it; the
/// data lands on that many targets, which `df` shows.
#[test]
fn setstripe_getstripe_and_df() {
    require_fuse();
    let dir = scratch("stripe");
    let mut node = Node::start(
        &dir,
        &["--drives", "3", "--raid", "5", "--drive-size", "128M", "--targets", "3"],
    );
    let m = node.mount.clone();
    fs::create_dir(m.join("wide")).expect("mkdir");
    let wide = m.join("wide").display().to_string();
    ok("setstripe", node.cli(&["setstripe", "-c", "2", "-S", "256K", &wide]));
    let shown = ok("getstripe dir", node.cli(&["getstripe", &wide]));
    assert!(shown.contains("stripe_count: 2") && shown.contains("stripe_size: 262144"), "{shown}");
    write_file(&m.join("wide/f"), 7, 4 << 20);
    let file = m.join("wide/f").display().to_string();
    let shown = ok("getstripe file", node.cli(&["getstripe", &file]));
    assert!(shown.contains("stripe_count: 2") && shown.contains("stripe_size: 262144"), "{shown}");
    let targets_line = shown.lines().find(|l| l.contains("targets:")).expect("targets line");
    assert_eq!(targets_line.split_whitespace().count(), 3, "{targets_line}");
    // A small file stays inside its inode.
    write_file(&m.join("wide/small"), 8, 100);
    let small = ok(
        "getstripe small",
        node.cli(&["getstripe", &m.join("wide/small").display().to_string()]),
    );
    assert!(small.contains("inline"), "{small}");
    // A file given its own layout before it has data.
    let own = m.join("own").display().to_string();
    ok("setstripe file", node.cli(&["setstripe", "-c", "1", "-S", "1M", &own]));
    assert!(ok("getstripe own", node.cli(&["getstripe", &own])).contains("stripe_count: 1"));
    // A file with data keeps its layout.
    let refused = node.cli(&["setstripe", "-c", "3", &file]);
    assert!(!refused.status.success(), "setstripe on a file with data must be refused");
    let df = ok("df", node.cli(&["df"]));
    let rows: Vec<&str> = df
        .lines()
        .filter(|l| l.starts_with('t') && l.chars().nth(1).is_some_and(|c| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 3, "{df}");
    // 4 MiB striped over two targets: two rows show use, one shows none.
    let empty = rows.iter().filter(|r| r.contains(" 0 B ")).count();
    assert_eq!(empty, 1, "{df}");
    assert!(df.contains("optimal"), "{df}");
    check_file(&m.join("wide/f"), 7, 4 << 20);
    node.stop();
    let _ = fs::remove_dir_all(&dir);
}

/// Without the right to mount (an unprivileged user cannot open /dev/fuse here), `stria up`
/// says why and keeps serving the native API, which `stria df` uses.
#[test]
fn without_fuse_rights_the_node_says_so_and_keeps_serving() {
    require_fuse();
    let dir = scratch("nofuse");
    let status =
        Command::new("chown").args(["-R", "65534:65534"]).arg(&dir).status().expect("chown");
    assert!(status.success());
    let mut child = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", STRIA, "up", "--data"])
        .arg(&dir)
        .args(["--drives", "3", "--raid", "5", "--drive-size", "64M"])
        .args(["--meta-listen", "127.0.0.1:0", "--storage-listen", "127.0.0.1:0"])
        // Free ports for every listener: the defaults may belong to a node of the machine.
        .args(["--mgmt-listen", "127.0.0.1:0", "--nbd-listen", "127.0.0.1:0"])
        .args(["--api-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux)");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !dir.join("run.json").exists() {
        assert!(std::time::Instant::now() < deadline, "the node did not start");
        assert!(child.try_wait().expect("wait").is_none(), "the node exited");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let df = Command::new(STRIA).args(["df", "--data"]).arg(&dir).output().expect("df");
    // SAFETY: kill with a valid pid and signal.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stderr.contains("not mounted") && stderr.contains("native API"), "{stderr}");
    assert!(stdout.contains("mount    (none)"), "{stdout}");
    let df = ok("df without a mount", df);
    assert!(df.contains("t1") && df.contains("raid5"), "{df}");
    assert!(out.status.success(), "the node did not stop cleanly: {stderr}");
    let _ = fs::remove_dir_all(&dir);
}

/// Writers racing on one new file: small writes that fit inside the inode and large ones that
/// move it to chunks, at once, through O_DIRECT (no page cache to serialize them). Every byte
/// lands.
#[test]
fn racing_writes_across_the_inline_limit() {
    use std::os::unix::fs::OpenOptionsExt;
    require_fuse();
    let dir = scratch("race");
    let mut node = Node::start(&dir, &["--drives", "3", "--raid", "5", "--drive-size", "128M"]);
    let m = node.mount.clone();
    for round in 0..20u64 {
        let path = m.join(format!("race{round}"));
        File::create(&path).expect("create");
        let writers: Vec<_> = (0..6u64)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let file = OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_DIRECT)
                        .open(&path)
                        .expect("open O_DIRECT");
                    // Writers 0..3 stay under 3 KiB, the others reach past it.
                    let (offset, len) = if i < 3 { (i * 1000, 1000) } else { (i * 4096, 4096) };
                    file.write_all_at(&pattern(round * 10 + i, offset, len), offset)
                        .expect("pwrite");
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        let got = fs::read(&path).expect("read back");
        assert_eq!(got.len(), 6 * 4096, "round {round}");
        for i in 0..6u64 {
            let (offset, len) = if i < 3 { (i * 1000, 1000) } else { (i * 4096, 4096) };
            let want = pattern(round * 10 + i, offset, len);
            let region = &got[offset as usize..offset as usize + len];
            if region != &want[..] {
                let zeros = region.iter().filter(|b| **b == 0).count();
                let first = region.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                panic!(
                    "round {round} writer {i}: differs from byte {first}, {zeros} zero bytes of {len}"
                );
            }
        }
    }
    node.stop();
    let _ = fs::remove_dir_all(&dir);
}
