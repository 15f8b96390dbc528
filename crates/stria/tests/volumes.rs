//! Block volumes end to end: `stria up` serves volumes over NBD to real clients nobody here
//! wrote (qemu-img and qemu-io, libnbd's nbdinfo and nbdcopy, fio's nbd engine), managed with
//! `stria volume / export / initiator`; access lists and read-only exports refuse what they
//! must; data survives a restart and a failed drive under load; snapshots and clones keep the
//! instant they were taken while their source changes and goes.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::node::{Node, pattern, require_fuse, scratch};

const MIB: u64 = 1 << 20;

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn ok(what: &str, out: Output) -> String {
    assert!(out.status.success(), "{what} failed ({}): {}", out.status, text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tool(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (the test command installs it): {e}"))
}

/// Parses JSON output; fio prints notes ("connected to NBD server") before its report.
fn json(s: &str) -> serde_json::Value {
    let start = s.find(['{', '[']).unwrap_or(0);
    serde_json::from_str(&s[start..]).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// `nbd://ADDR/EXPORT` of the node's gateway.
fn uri(node: &Node, export: &str) -> String {
    let run = json(&std::fs::read_to_string(node.data.join("run.json")).expect("run.json"));
    let addr = run["nbd"].as_str().expect("the node runs an NBD gateway");
    format!("nbd://{addr}/{export}")
}

fn create_exported(node: &Node, volume: &str, size: &str) {
    ok("volume create", node.cli(&["volume", "create", volume, "--size", size]));
    ok("export add", node.cli(&["export", "add", volume]));
    ok("initiator allow", node.cli(&["initiator", "allow", volume, "127.0.0.1"]));
}

fn volume_json(node: &Node, volume: &str) -> serde_json::Value {
    json(&ok("volume show", node.cli(&["volume", "show", volume, "--json"])))
}

/// A raw image with data, zero runs and holes in it.
fn make_image(path: &Path, len: u64) -> Vec<u8> {
    let mut image = pattern(11, 0, len as usize);
    for hole in [(0, MIB), (5 * MIB, 3 * MIB), (len - 2 * MIB, 2 * MIB)] {
        image[hole.0 as usize..(hole.0 + hole.1) as usize].fill(0);
    }
    std::fs::write(path, &image).expect("write image");
    image
}

/// Starts fio's `nbd` engine on `uri` with `verify` on: every block it writes is read back
/// and checked (crc32c), and the first mismatch fails it. Its JSON report is on stdout.
fn start_fio_verify(
    uri: &str,
    rw: &str,
    bs: &str,
    size: &str,
    iodepth: &str,
    loops: &str,
) -> std::process::Child {
    Command::new("fio")
        .args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            &format!("--size={size}"),
            &format!("--iodepth={iodepth}"),
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            &format!("--loops={loops}"),
            "--output-format=json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start fio")
}

fn same_file(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).expect("read a"), std::fs::read(b).expect("read b"));
    assert_eq!(x.len(), y.len(), "{} and {} differ in size", a.display(), b.display());
    if let Some(at) = x.iter().zip(&y).position(|(p, q)| p != q) {
        panic!("{} and {} differ at byte {at}", a.display(), b.display());
    }
}

#[test]
fn volumes_serve_real_nbd_clients_and_survive_a_restart() {
    require_fuse();
    let dir = scratch("volumes");
    let mut node = Node::start(&dir, &["--drives", "4", "--raid", "5", "--drive-size", "256M"]);
    create_exported(&node, "vol1", "64M");
    let v = volume_json(&node, "vol1");
    assert_eq!(v["size_bytes"], 64 * MIB);
    assert_eq!(v["allocated_bytes"], 0, "thin: nothing allocated before the first write");
    assert_eq!(v["exports"][0], "vol1");
    let vol = uri(&node, "vol1");

    // nbdinfo: size, block-size constraints, the export in the list.
    let info = json(&ok("nbdinfo", tool("nbdinfo", &["--json", &vol])));
    let export = &info["exports"][0];
    assert_eq!(export["export-size"], 64 * MIB, "{info}");
    assert_eq!(export["block_size_minimum"], 512, "{info}");
    assert_eq!(export["block_size_preferred"], 4096, "{info}");
    assert_eq!(export["block_size_maximum"], 32 * MIB, "{info}");
    assert_eq!(export["can_multi_conn"], true, "{info}");
    let list = ok("nbdinfo --list", tool("nbdinfo", &["--list", "--json", &vol]));
    assert!(list.contains("\"vol1\""), "{list}");

    // qemu-img: an image with holes in, and back out byte for byte.
    let image = dir.join("src.img");
    let want = make_image(&image, 64 * MIB);
    let qinfo = ok("qemu-img info", tool("qemu-img", &["info", "--output=json", &vol]));
    assert_eq!(json(&qinfo)["virtual-size"], 64 * MIB, "{qinfo}");
    ok(
        "qemu-img convert in",
        tool(
            "qemu-img",
            &["convert", "-n", "-f", "raw", "-O", "raw", &image.display().to_string(), &vol],
        ),
    );
    let back = dir.join("back.img");
    ok(
        "qemu-img convert out",
        tool("qemu-img", &["convert", "-f", "raw", "-O", "raw", &vol, &back.display().to_string()]),
    );
    same_file(&image, &back);

    // The allocation map shows the holes qemu-img skipped; thin volumes hold less than size.
    let map = ok("nbdinfo --map", tool("nbdinfo", &["--map", "--json", &vol]));
    let runs = json(&map);
    let runs = runs.as_array().expect("map is a list");
    let hole_bytes: u64 = runs
        .iter()
        .filter(|r| r["type"].as_u64().unwrap_or(0) & 1 == 1)
        .map(|r| r["length"].as_u64().expect("length"))
        .sum();
    assert!(hole_bytes >= 4 * MIB, "the zero runs of the image stay holes: {map}");
    let allocated = volume_json(&node, "vol1")["allocated_bytes"].as_u64().expect("allocated");
    assert!(allocated >= 50 * MIB && allocated <= 60 * MIB, "allocated {allocated}: {map}");
    let shown = volume_json(&node, "vol1");
    let (read, written) = (shown["nbd_read_bytes"].as_u64(), shown["nbd_written_bytes"].as_u64());
    assert!(written.expect("written") >= 50 * MIB, "the gateway counts writes: {shown}");
    assert!(
        read.expect("read") >= 50 * MIB,
        "the gateway counts reads (holes are skipped): {shown}"
    );
    assert_eq!(want.len() as u64, 64 * MIB);

    // nbdcopy over four connections, both directions.
    let copied = dir.join("copied.img");
    ok("nbdcopy out", tool("nbdcopy", &["--connections=4", &vol, &copied.display().to_string()]));
    same_file(&image, &copied);

    // qemu-io patterns: write, read back, discard reads zeros.
    let io = ok(
        "qemu-io",
        tool(
            "qemu-io",
            &[
                "-f",
                "raw",
                &vol,
                "-c",
                "write -P 0xab 1M 192k",
                "-c",
                "read -P 0xab 1M 192k",
                "-c",
                "discard 1M 64k",
                "-c",
                "read -P 0 1M 64k",
                "-c",
                "read -P 0xab 1088k 128k",
                "-c",
                "flush",
            ],
        ),
    );
    assert!(!io.contains("Pattern verification failed"), "{io}");

    // fio's nbd engine: random 4 KiB and sequential 1 MiB writes, verified.
    let fio_uri = format!("--uri={vol}");
    for (rw, bs) in [("randrw", "4k"), ("write", "1m")] {
        let out = ok(
            "fio nbd",
            tool(
                "fio",
                &[
                    "--name=vol",
                    "--ioengine=nbd",
                    &fio_uri,
                    &format!("--rw={rw}"),
                    &format!("--bs={bs}"),
                    "--offset=32M",
                    "--size=16M",
                    "--iodepth=16",
                    "--verify=crc32c",
                    "--verify_fatal=1",
                    "--verify_state_save=0",
                    "--output-format=json",
                ],
            ),
        );
        let report = json(&out);
        assert_eq!(report["jobs"][0]["error"], 0, "fio {rw}: {out}");
    }
    // Restore the image's contents over fio's range and check everything after a restart.
    ok("nbdcopy in", tool("nbdcopy", &["--connections=4", &image.display().to_string(), &vol]));
    node.stop();
    let fsck = ok("fsck", node.cli(&["fsck"]));
    assert!(fsck.contains("fsck: clean") && !fsck.contains("stray"), "{fsck}");
    node.restart();
    let vol = uri(&node, "vol1");
    let after = dir.join("after.img");
    ok("nbdcopy after restart", tool("nbdcopy", &[&vol, &after.display().to_string()]));
    same_file(&image, &after);
    node.stop();
}

/// The whole volume behind `uri`, through nbdcopy.
fn read_volume(dir: &Path, uri: &str, name: &str) -> Vec<u8> {
    let out = dir.join(format!("{name}.img"));
    let _ = std::fs::remove_file(&out);
    ok("nbdcopy out", tool("nbdcopy", &[uri, &out.display().to_string()]));
    std::fs::read(&out).expect("read copy")
}

/// An exported volume `name` of `len` bytes filled from a raw image ([`make_image`]) with
/// qemu-img; returns the image's bytes and the volume's NBD URI.
fn exported_with_image(node: &Node, dir: &Path, name: &str, len: u64) -> (Vec<u8>, String) {
    create_exported(node, name, &format!("{}M", len / MIB));
    let image = dir.join(format!("{name}.img"));
    let original = make_image(&image, len);
    let volume = uri(node, name);
    let image = image.display().to_string();
    let args = ["convert", "-n", "-f", "raw", "-O", "raw", &image, &volume];
    ok("qemu-img convert in", tool("qemu-img", &args));
    (original, volume)
}

fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: size");
    if let Some(at) = got.iter().zip(want).position(|(p, q)| p != q) {
        panic!("{what}: differs at byte {at}");
    }
}

fn qemu_io(uri: &str, commands: &[&str]) {
    let mut args = vec!["-f", "raw", uri];
    for c in commands {
        args.extend(["-c", c]);
    }
    let out = ok("qemu-io", tool("qemu-io", &args));
    assert!(!out.contains("Pattern verification failed") && !out.contains("failed"), "{out}");
}

#[test]
fn snapshots_and_clones_keep_their_instant() {
    require_fuse();
    let dir = scratch("volume-snapshots");
    let mut node = Node::start(&dir, &["--drives", "4", "--raid", "5", "--drive-size", "256M"]);
    let (original, base) = exported_with_image(&node, &dir, "base", 32 * MIB);

    // A snapshot: read-only, same size, no data copied.
    let snap = json(&ok("snapshot", node.cli(&["volume", "snapshot", "base", "snap", "--json"])));
    assert_eq!(snap["snapshot"], true, "{snap}");
    assert_eq!(snap["origin"], "base", "{snap}");
    assert_eq!(snap["state"], "online", "{snap}");
    assert_eq!(snap["size_bytes"], 32 * MIB, "{snap}");
    assert_eq!(snap["allocated_bytes"], volume_json(&node, "base")["allocated_bytes"]);
    let df_before = ok("df", node.cli(&["df"]));
    let refused = node.cli(&["export", "add", "snap"]);
    assert!(!refused.status.success(), "a snapshot is not exported writable");
    assert!(text(&refused).contains("snapshot"), "{}", text(&refused));
    let refused = node.cli(&["volume", "resize", "snap", "--size", "64M"]);
    assert!(!refused.status.success() && text(&refused).contains("snapshot"), "{}", text(&refused));
    ok("export snap", node.cli(&["export", "add", "snap", "--read-only"]));
    ok("allow snap", node.cli(&["initiator", "allow", "snap", "127.0.0.1"]));
    let snap_uri = uri(&node, "snap");

    // The source changes; the snapshot does not.
    let mut changed = original.clone();
    qemu_io(&base, &["write -P 0xcd 0 4M", "discard 8M 1M", "write -P 0x5a 31M 1M", "flush"]);
    changed[..4 * MIB as usize].fill(0xcd);
    changed[8 * MIB as usize..9 * MIB as usize].fill(0);
    changed[31 * MIB as usize..].fill(0x5a);
    same_bytes(&read_volume(&dir, &base, "base-now"), &changed, "base after its writes");
    same_bytes(&read_volume(&dir, &snap_uri, "snap-now"), &original, "the snapshot");
    let df_after = ok("df", node.cli(&["df"]));
    assert_ne!(df_before, df_after, "overwrites take new blocks: {df_before} {df_after}");

    // A writable clone of the snapshot.
    let clone = json(&ok("clone", node.cli(&["volume", "clone", "snap", "copy", "--json"])));
    assert_eq!(
        (clone["snapshot"].as_bool(), clone["origin"].as_str()),
        (Some(false), Some("snap"))
    );
    create_export_of(&node, "copy");
    let copy_uri = uri(&node, "copy");
    let mut copy = original.clone();
    qemu_io(&copy_uri, &["write -P 0xee 16M 1M", "flush"]);
    copy[16 * MIB as usize..17 * MIB as usize].fill(0xee);
    same_bytes(&read_volume(&dir, &copy_uri, "copy-now"), &copy, "the clone after its write");
    same_bytes(&read_volume(&dir, &snap_uri, "snap-again"), &original, "the snapshot again");

    // A snapshot taken while fio writes and verifies: writes pause for it, none fails.
    let fio = start_fio_verify(&base, "randwrite", "4k", "8M", "16", "20");
    std::thread::sleep(std::time::Duration::from_millis(700));
    ok("snapshot under writes", node.cli(&["volume", "snapshot", "base", "busy"]));
    let out = fio.wait_with_output().expect("fio");
    assert!(out.status.success(), "fio failed around the snapshot: {}", text(&out));
    assert_eq!(json(&String::from_utf8_lossy(&out.stdout))["jobs"][0]["error"], 0);
    let busy = volume_json(&node, "busy");
    assert_eq!(busy["state"], "online", "{busy}");

    // The source goes; its copies stay, also across a restart, and fsck finds them sound.
    ok("unexport base", node.cli(&["export", "remove", "base"]));
    ok("delete base", node.cli(&["volume", "delete", "base"]));
    node.stop();
    let fsck = ok("fsck", node.cli(&["fsck"]));
    assert!(fsck.contains("fsck: clean") && !fsck.contains("stray"), "{fsck}");
    assert!(fsck.contains("blocks are shared by volumes"), "{fsck}");
    node.restart();
    same_bytes(&read_volume(&dir, &uri(&node, "snap"), "snap-restart"), &original, "snapshot");
    same_bytes(&read_volume(&dir, &uri(&node, "copy"), "copy-restart"), &copy, "clone");
    ok("delete busy", node.cli(&["volume", "delete", "busy"]));
    node.stop();
}

/// `stria volume rollback`: the volume gets its snapshot's data and size back; it is refused
/// for what is not its own snapshot and while a client is connected; and a node stopped half
/// way (aborted at each step) comes back with the volume either as it was or rolled back, never
/// a mix, and nothing left behind for fsck to find.
#[test]
fn a_rollback_gives_the_snapshot_back_even_across_a_crash() {
    require_fuse();
    let dir = scratch("volume-rollback");
    let mut node = Node::start(&dir, &["--drives", "4", "--raid", "5", "--drive-size", "256M"]);
    let (original, vm) = exported_with_image(&node, &dir, "vm", 16 * MIB);
    ok("snapshot", node.cli(&["volume", "snapshot", "vm", "good"]));
    ok("clone", node.cli(&["volume", "clone", "vm", "other"]));

    // Writes after the snapshot, and a grow.
    qemu_io(&vm, &["write -P 0xcd 0 4M", "write -P 0x5a 15M 1M", "flush"]);
    ok("grow", node.cli(&["volume", "resize", "vm", "--size", "24M"]));

    // Refusals change nothing.
    let refused = node.cli(&["volume", "rollback", "vm", "--to", "other"]);
    assert!(!refused.status.success(), "a clone is not a snapshot to roll back to");
    assert!(text(&refused).contains("not a snapshot of 'vm'"), "{}", text(&refused));
    let refused = node.cli(&["volume", "rollback", "vm", "--to", "missing"]);
    assert!(text(&refused).contains("no volume named 'missing'"), "{}", text(&refused));
    let refused = node.cli(&["volume", "rollback", "good", "--to", "good"]);
    assert!(text(&refused).contains("is a snapshot and does not change"), "{}", text(&refused));
    let fio = start_fio_verify(&vm, "randwrite", "4k", "4M", "8", "40");
    std::thread::sleep(std::time::Duration::from_millis(700));
    let refused = node.cli(&["volume", "rollback", "vm", "--to", "good"]);
    let out = fio.wait_with_output().expect("fio");
    assert!(!refused.status.success(), "rolled back under a connected client");
    assert!(text(&refused).contains("NBD clients connected"), "{}", text(&refused));
    assert!(out.status.success(), "fio failed around the refused rollback: {}", text(&out));
    assert_eq!(json(&String::from_utf8_lossy(&out.stdout))["jobs"][0]["error"], 0);
    assert_eq!(volume_json(&node, "vm")["state"], "online");
    let mut changed = read_volume(&dir, &vm, "vm-changed");
    assert_eq!(changed.len() as u64, 24 * MIB);
    assert!(changed[15 * MIB as usize..16 * MIB as usize].iter().all(|&b| b == 0x5a));

    // The rollback: the snapshot's data and size, served again by the same export.
    let after =
        json(&ok("rollback", node.cli(&["volume", "rollback", "vm", "--to", "good", "--json"])));
    assert_eq!(
        (after["state"].as_str(), after["size_bytes"].as_u64()),
        (Some("online"), Some(16 * MIB))
    );
    assert_eq!(after["exports"][0], "vm", "{after}");
    same_bytes(&read_volume(&dir, &vm, "vm-rolled-back"), &original, "the rolled-back volume");
    same_bytes(&read_volume(&dir, &uri(&node, "vm"), "vm-again"), &original, "a new connection");

    // Aborted after the copy, before the switch: the volume stays as it was.
    qemu_io(&vm, &["write -P 0x77 0 1M", "flush"]);
    changed = original.clone();
    changed[..MIB as usize].fill(0x77);
    let fsck_clean = |node: &Node, when: &str| {
        let fsck = ok("fsck", node.cli(&["fsck"]));
        assert!(fsck.contains("fsck: clean") && !fsck.contains("stray"), "{when}: {fsck}");
    };
    for (point, want) in [("rollback-copied", &changed), ("rollback-switched", &original)] {
        node.stop();
        // The rollback before (or the recovery after the last crash) left nothing behind.
        fsck_clean(&node, point);
        node.env = vec![("STRIA_CRASH_POINT".into(), point.into())];
        node.restart();
        let crashed = node.cli(&["volume", "rollback", "vm", "--to", "good"]);
        assert!(!crashed.status.success(), "{point}: the node went on");
        // Refused instead would mean the last rollback's replaced data was never removed.
        assert!(!text(&crashed).contains("still being removed"), "{point}: {}", text(&crashed));
        assert!(!node.wait_exit(std::time::Duration::from_secs(30)).success(), "{point}");
        // The rollback's objects are owned while its record lasts: nothing is a stray, so
        // the recovery after a crash leaves them to the rollback's own recovery.
        fsck_clean(&node, &format!("after the abort at {point}"));
        node.env.clear();
        node.restart();
        let volume = volume_json(&node, "vm");
        assert_eq!(volume["state"], "online", "{point}: {volume}");
        same_bytes(&read_volume(&dir, &uri(&node, "vm"), point), want, point);
    }
    ok("delete clone", node.cli(&["volume", "delete", "other"]));

    // A snapshot outlives its volume, but a new volume of the same name does not own it.
    ok("create vm2", node.cli(&["volume", "create", "vm2", "--size", "16M"]));
    ok("snapshot vm2", node.cli(&["volume", "snapshot", "vm2", "vm2-snap"]));
    ok("delete vm2", node.cli(&["volume", "delete", "vm2"]));
    assert_eq!(volume_json(&node, "vm2-snap")["origin"], "vm2 (deleted)");
    ok("create vm2 again", node.cli(&["volume", "create", "vm2", "--size", "16M"]));
    let refused = node.cli(&["volume", "rollback", "vm2", "--to", "vm2-snap"]);
    assert!(text(&refused).contains("not a snapshot of 'vm2'"), "{}", text(&refused));
    node.stop();
    fsck_clean(&node, "at the end");
}

/// A snapshot of a volume striped over three targets, taken while one client writes 4 KiB
/// blocks all over it, one after the other (each acknowledged before the next), is a clean
/// cut: for some instant, every block holds the last write made to it before that instant.
#[test]
fn a_snapshot_across_targets_is_of_one_instant() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    require_fuse();
    let dir = scratch("volume-instant");
    let mut node = Node::start(
        &dir,
        &["--targets", "3", "--drives", "3", "--raid", "5", "--drive-size", "96M"],
    );
    ok(
        "volume create",
        node.cli(&["volume", "create", "v", "--size", "128M", "--stripe-size", "64K"]),
    );
    create_export_of(&node, "v");
    let shown = volume_json(&node, "v");
    assert_eq!(shown["targets"].as_array().map(Vec::len), Some(3), "{shown}");
    let blocks = 128 * MIB / 4096;
    // Every chunk exists (written with zeros), so copying them takes a while: a copy that did
    // not hold the writes back would be torn.
    qemu_io(&uri(&node, "v"), &["write -P 0 0 128M", "flush"]);
    // Write n (from 1) goes to block `place(n)`, all over the volume, and carries n.
    let place = move |n: u64| n.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29) % blocks;
    let target = stria_nbd::client::NbdUri::parse(&uri(&node, "v")).expect("uri");
    let (written, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let writer = {
        let (written, stop) = (written.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut client = stria_nbd::client::NbdClient::connect(&target).expect("connect");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let mut block = vec![0u8; 4096];
                block[..8].copy_from_slice(&n.to_le_bytes());
                client.write_at(place(n) * 4096, &block).expect("write");
                written.store(n, Ordering::Relaxed);
            }
            n
        })
    };
    while written.load(Ordering::Relaxed) < 2000 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let before = written.load(Ordering::Relaxed);
    ok("snapshot under writes", node.cli(&["volume", "snapshot", "v", "cut"]));
    let after = written.load(Ordering::Relaxed);
    std::thread::sleep(std::time::Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let last = writer.join().expect("writer");
    assert!(last > after, "writes went on after the snapshot");
    ok("export cut", node.cli(&["export", "add", "cut", "--read-only"]));
    ok("allow cut", node.cli(&["initiator", "allow", "cut", "127.0.0.1"]));
    let image = read_volume(&dir, &uri(&node, "cut"), "cut");
    let stamps: Vec<u64> = image
        .chunks_exact(4096)
        .map(|b| u64::from_le_bytes(b[..8].try_into().expect("8 bytes")))
        .collect();
    // The instant: just after the newest write the snapshot holds.
    let cut = stamps.iter().copied().max().unwrap_or(0);
    assert!(cut >= before && cut <= after + 1, "cut {cut} not in {before}..={after}");
    let mut want = vec![0u64; blocks as usize];
    for n in 1..=cut {
        want[place(n) as usize] = n;
    }
    let torn: Vec<(usize, u64, u64)> = (0..blocks as usize)
        .filter(|&i| stamps[i] != want[i])
        .map(|i| (i, stamps[i], want[i]))
        .take(5)
        .collect();
    assert!(torn.is_empty(), "torn at write {cut}: (block, holds, should hold) {torn:?}");
    node.stop();
}

fn create_export_of(node: &Node, volume: &str) {
    ok("export add", node.cli(&["export", "add", volume]));
    ok("initiator allow", node.cli(&["initiator", "allow", volume, "127.0.0.1"]));
}

#[test]
fn access_lists_read_only_exports_and_volume_rules() {
    require_fuse();
    let dir = scratch("volume-acl");
    let mut node = Node::start(&dir, &["--drives", "3", "--raid", "5", "--drive-size", "128M"]);
    create_exported(&node, "open", "16M");
    ok("volume create", node.cli(&["volume", "create", "locked", "--size", "16M"]));
    ok("export add", node.cli(&["export", "add", "locked"]));
    ok("allow elsewhere", node.cli(&["initiator", "allow", "locked", "10.9.9.0/24"]));

    // A peer not on the list is refused, counted, and does not see the export listed.
    let refused = tool("nbdinfo", &[&uri(&node, "locked")]);
    assert!(!refused.status.success(), "an initiator off the list got in: {}", text(&refused));
    let list = ok("nbdinfo --list", tool("nbdinfo", &["--list", "--json", &uri(&node, "open")]));
    assert!(list.contains("\"open\"") && !list.contains("\"locked\""), "{list}");
    let exports = json(&ok("export list", node.cli(&["export", "list", "--json"])));
    let locked = exports.as_array().expect("list").iter().find(|e| e["name"] == "locked").cloned();
    let locked = locked.expect("locked export listed");
    assert!(locked["refused"].as_u64().expect("refused") >= 1, "{locked}");
    assert_eq!(locked["acl"][0]["net"], "10.9.9.0/24");

    // Allowing the loopback address lets the client in; denying it shuts the door again.
    ok("allow", node.cli(&["initiator", "allow", "locked", "127.0.0.1"]));
    ok("nbdinfo allowed", tool("nbdinfo", &[&uri(&node, "locked")]));
    // A client connected when its address is denied is cut off, not left writing.
    let mut fio = start_fio_verify(&uri(&node, "locked"), "randwrite", "4k", "4M", "8", "100000");
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(fio.try_wait().expect("fio").is_none(), "fio ended before the deny");
    ok("deny", node.cli(&["initiator", "deny", "locked", "127.0.0.1"]));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = fio.try_wait().expect("fio") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = fio.kill();
            panic!("fio still writes 30 s after its initiator was denied");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(!status.success(), "fio finished its 100,000 loops instead of being cut off");
    assert!(!tool("nbdinfo", &[&uri(&node, "locked")]).status.success(), "deny had no effect");

    // A read-only export refuses writes and the data does not change.
    let rw = uri(&node, "open");
    ok("seed", tool("qemu-io", &["-f", "raw", &rw, "-c", "write -P 0x5a 0 64k"]));
    ok("export ro", node.cli(&["export", "add", "open", "--name", "open-ro", "--read-only"]));
    ok("allow ro", node.cli(&["initiator", "allow", "open-ro", "127.0.0.0/8"]));
    let ro = uri(&node, "open-ro");
    let write = tool("qemu-io", &["-f", "raw", &ro, "-c", "write -P 0x11 0 4k"]);
    assert!(
        !write.status.success() || text(&write).contains("failed"),
        "a write on a read-only export succeeded: {}",
        text(&write)
    );
    ok("read ro", tool("qemu-io", &["-f", "raw", "-r", &ro, "-c", "read -P 0x5a 0 64k"]));

    // Volume rules, with clear errors.
    let busy = node.cli(&["volume", "delete", "open"]);
    assert!(
        !busy.status.success() && text(&busy).contains("remove the export first"),
        "{}",
        text(&busy)
    );
    let shrink = node.cli(&["volume", "resize", "open", "--size", "8M"]);
    assert!(!shrink.status.success() && text(&shrink).contains("--force"), "{}", text(&shrink));
    let bad = node.cli(&["volume", "create", "odd", "--size", "1000"]);
    assert_eq!(bad.status.code(), Some(2), "an unaligned size is a usage error: {}", text(&bad));
    let bad = node.cli(&["initiator", "allow", "open", "10.0.0.0/40"]);
    assert_eq!(bad.status.code(), Some(2), "a bad CIDR is a usage error: {}", text(&bad));
    let missing = node.cli(&["volume", "show", "nope"]);
    assert!(!missing.status.success() && text(&missing).contains("no volume named 'nope'"));
    let dup = node.cli(&["volume", "create", "open", "--size", "16M"]);
    assert!(!dup.status.success() && text(&dup).contains("exists already"), "{}", text(&dup));

    // Grow is seen by new connections; shrink with --force drops the data past the end.
    ok("grow", node.cli(&["volume", "resize", "open", "--size", "32M"]));
    let info = json(&ok("nbdinfo", tool("nbdinfo", &["--json", &rw])));
    assert_eq!(info["exports"][0]["export-size"], 32 * MIB);
    ok("tail write", tool("qemu-io", &["-f", "raw", &rw, "-c", "write -P 0x77 20M 1M"]));
    ok("shrink", node.cli(&["volume", "resize", "open", "--size", "8M", "--force"]));
    ok("grow again", node.cli(&["volume", "resize", "open", "--size", "32M"]));
    ok("old tail reads zero", tool("qemu-io", &["-f", "raw", &rw, "-c", "read -P 0 20M 1M"]));
    ok("head kept", tool("qemu-io", &["-f", "raw", &rw, "-c", "read -P 0x5a 0 64k"]));

    // Removing the exports lets the volume go, with its data, also while a client writes: the
    // removal cuts it off, and the delete (which waits until no connection holds the volume)
    // leaves nothing behind for fsck below. (The wait itself is not forced here: the cut-off
    // connection's last writes are done long before the next command runs.)
    let mut fio = start_fio_verify(&rw, "randwrite", "4k", "8M", "16", "100000");
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(fio.try_wait().expect("fio").is_none(), "fio ended before the removal");
    ok("remove ro", node.cli(&["export", "remove", "open-ro"]));
    ok("remove", node.cli(&["export", "remove", "open"]));
    ok("delete", node.cli(&["volume", "delete", "open"]));
    let cut = fio.wait_with_output().expect("fio");
    assert!(!cut.status.success(), "fio went on after its export was removed");
    let volumes = ok("volume list", node.cli(&["volume", "list", "--json"]));
    assert!(!volumes.contains("\"open\""), "{volumes}");
    node.stop();
    let fsck = ok("fsck", node.cli(&["fsck"]));
    assert!(fsck.contains("fsck: clean") && !fsck.contains("stray"), "{fsck}");
}

#[test]
fn a_failed_drive_under_fio_verify_reaches_no_client() {
    require_fuse();
    let dir = scratch("volume-fault");
    let node = Node::start(&dir, &["--drives", "5", "--raid", "6", "--drive-size", "128M"]);
    create_exported(&node, "vol", "48M");
    let mut fio = start_fio_verify(&uri(&node, "vol"), "randrw", "16k", "32M", "8", "40");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(fio.try_wait().expect("fio status").is_none(), "fio ended before the drive failed");
    let failed =
        ok("fail-drive", node.cli(&["target", "fail-drive", "--target", "1", "--slot", "1"]));
    assert!(failed.contains("failed"), "{failed}");
    let still_running = fio.try_wait().expect("fio status").is_none();
    let out = fio.wait_with_output().expect("fio");
    assert!(still_running, "fio ended before it could see the failed drive: {}", text(&out));
    assert!(out.status.success(), "fio saw an error with a drive lost: {}", text(&out));
    let report = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(report["jobs"][0]["error"], 0, "{report}");
    let df = ok("df", node.cli(&["df"]));
    assert!(df.contains("degraded"), "the target is degraded: {df}");
}

/// A CA, the gateway's certificate, and libnbd-style client directories (`ca-cert.pem`,
/// `client-cert.pem`, `client-key.pem`) for each client name.
fn make_pki(
    dir: &Path,
    clients: &[&str],
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.distinguished_name.push(DnType::CommonName, "stria e2e CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("CA");
    let ca_path = dir.join("ca-cert.pem");
    std::fs::write(&ca_path, ca.pem()).expect("write ca");
    let mut server =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("p");
    server.distinguished_name.push(DnType::CommonName, "stria-gateway");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().expect("key");
    let cert = server.signed_by(&key, &ca).expect("server cert");
    let (cert_path, key_path) = (dir.join("server-cert.pem"), dir.join("server-key.pem"));
    std::fs::write(&cert_path, cert.pem()).expect("write");
    std::fs::write(&key_path, key.serialize_pem()).expect("write");
    for name in clients {
        let cdir = dir.join(name);
        std::fs::create_dir_all(&cdir).expect("client dir");
        std::fs::copy(&ca_path, cdir.join("ca-cert.pem")).expect("copy ca");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, *name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &ca).expect("client cert");
        std::fs::write(cdir.join("client-cert.pem"), cert.pem()).expect("write");
        std::fs::write(cdir.join("client-key.pem"), key.serialize_pem()).expect("write");
    }
    (cert_path, key_path, ca_path)
}

#[test]
fn tls_identities_gate_an_export() {
    require_fuse();
    let dir = scratch("volume-tls");
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki).expect("pki dir");
    let (cert, key, ca) = make_pki(&pki, &["client1", "client2"]);
    let (cert, key, ca) =
        (cert.display().to_string(), key.display().to_string(), ca.display().to_string());
    let node = Node::start(
        &dir.join("data"),
        &[
            "--drives",
            "3",
            "--raid",
            "5",
            "--drive-size",
            "128M",
            "--nbd-tls-cert",
            &cert,
            "--nbd-tls-key",
            &key,
            "--nbd-tls-ca",
            &ca,
        ],
    );
    ok("volume create", node.cli(&["volume", "create", "secure", "--size", "16M"]));
    ok("export add", node.cli(&["export", "add", "secure"]));
    let rule = ["initiator", "allow", "secure", "127.0.0.1", "--tls-identity", "client1"];
    ok("allow client1", node.cli(&rule));
    let plain = uri(&node, "secure");
    let tls_uri = |client: &str| {
        format!(
            "{}?tls-certificates={}",
            plain.replacen("nbd://", "nbds://", 1),
            pki.join(client).display()
        )
    };
    let info = json(&ok("nbdinfo as client1", tool("nbdinfo", &["--json", &tls_uri("client1")])));
    assert_eq!(info["exports"][0]["export-size"], 16 * MIB, "{info}");
    // Data through TLS: an image in and back out with nbdcopy.
    let image = dir.join("tls.img");
    std::fs::write(&image, pattern(5, 0, 16 * MIB as usize)).expect("image");
    let back = dir.join("tls-back.img");
    ok("nbdcopy in", tool("nbdcopy", &[&image.display().to_string(), &tls_uri("client1")]));
    ok("nbdcopy out", tool("nbdcopy", &[&tls_uri("client1"), &back.display().to_string()]));
    same_file(&image, &back);
    let other = tool("nbdinfo", &[&tls_uri("client2")]);
    assert!(!other.status.success(), "another identity got in: {}", text(&other));
    let no_tls = tool("nbdinfo", &[&plain]);
    assert!(!no_tls.status.success(), "a plain client got in: {}", text(&no_tls));
    let exports = json(&ok("export list", node.cli(&["export", "list", "--json"])));
    assert!(exports[0]["refused"].as_u64().expect("refused") >= 2, "{exports}");
    assert_eq!(exports[0]["acl"][0]["tls_identity"], "client1");
}
