//! Mounts hear of each other's namespace changes (the metadata service's change log) and drop
//! what their kernels cached of them, so a name removed or renamed, or a mode changed, through
//! one mount shows at once through another that had it cached, although every mount here may
//! keep names and attributes for an hour: only the notice can make the change show. A mount
//! that does not listen (`--no-watch`) keeps the stale name for its whole timeout, which shows
//! that the notices, not a timeout, are what the listening mount follows.
//!
//! A name one mount found absent, and another then created, shows too: a listening mount lets
//! its kernel keep absent names, and drops them when another client creates them.
//!
//! A mount that hears every change keeps names and attributes for `--attr-ttl-watched` (30 s
//! by default) instead of `--attr-ttl` (1 s): a stat of a name looked up 1.5 s before costs
//! the node's mount no request, nor does a second look for a name that is not there.

#![allow(clippy::unwrap_used)]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use support::http::Api;
use support::node::{Node, SecondMount, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];
/// An hour: no cached name or attribute runs out while the test runs.
const HOUR: [&str; 4] = ["--attr-ttl", "3600", "--attr-ttl-watched", "3600"];
/// An hour once the mount hears every change (one second after it starts to), and a second
/// before: absent names are kept only for the long timeout.
const WATCHED_HOUR: [&str; 4] = ["--attr-ttl", "1", "--attr-ttl-watched", "3600"];
const NOTICE_WAIT: Duration = Duration::from_secs(10);

/// Waits up to [`NOTICE_WAIT`] for `holds` to become true; whether it did.
fn eventually(mut holds: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + NOTICE_WAIT;
    loop {
        if holds() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Waits until `listener` hears changes made through `writer`: a name it cached and
/// `writer` removed goes (changes made before its first watch request was answered are not
/// told to it, so each try takes a new name).
fn wait_until_listening(writer: &Path, listener: &Path) {
    let deadline = Instant::now() + NOTICE_WAIT;
    for round in 0.. {
        let name = format!("probe-{round}");
        std::fs::write(writer.join(&name), b"p").unwrap();
        assert!(listener.join(&name).exists());
        std::fs::remove_file(writer.join(&name)).unwrap();
        let heard = Instant::now() + Duration::from_secs(1);
        while Instant::now() < heard {
            if !listener.join(&name).exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(Instant::now() < deadline, "{} never heard a change", listener.display());
    }
}

/// Looks up every name of the test through `mount`, so its kernel caches them.
fn cache_names(mount: &Path) {
    // (A stat, not a read: a read makes the kernel ask for the attributes again, for atime.)
    assert_eq!(std::fs::metadata(mount.join("gone")).unwrap().len(), 12);
    assert!(mount.join("dir/inner").exists());
    assert_eq!(mode(&mount.join("chmodded")), 0o644);
    assert!(!mount.join("born").exists());
    assert!(!mount.join("dir/born").exists());
}

#[test]
fn a_change_through_one_mount_shows_at_once_in_the_others() {
    require_fuse();
    let dir = scratch("hear-changes");
    let node = Node::start(&dir, &[&ARGS[..], &HOUR[..]].concat());
    let m1 = node.mount.clone();
    let listening = SecondMount::start_with(&node, &dir.join("listening"), &WATCHED_HOUR);
    let mut deaf_args = HOUR.to_vec();
    deaf_args.push("--no-watch");
    let deaf = SecondMount::start_with(&node, &dir.join("deaf"), &deaf_args);
    wait_until_listening(&m1, &listening.path);
    wait_until_listening(&listening.path, &m1);
    // The listening mount's long timeout starts one short timeout after it first heard.
    std::thread::sleep(Duration::from_millis(1100));

    std::fs::write(m1.join("gone"), b"soon removed").unwrap();
    std::fs::create_dir(m1.join("dir")).unwrap();
    std::fs::write(m1.join("dir/inner"), b"x").unwrap();
    std::fs::write(m1.join("chmodded"), b"y").unwrap();
    std::fs::set_permissions(m1.join("chmodded"), std::fs::Permissions::from_mode(0o644)).unwrap();
    cache_names(&listening.path);
    cache_names(&deaf.path);

    std::fs::remove_file(m1.join("gone")).unwrap();
    std::fs::write(m1.join("dir/born"), b"new").unwrap();
    std::fs::rename(m1.join("dir"), m1.join("moved")).unwrap();
    std::fs::set_permissions(m1.join("chmodded"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(m1.join("born")).unwrap();

    let l = &listening.path;
    assert!(eventually(|| !l.join("gone").exists()), "the listening mount still has `gone`");
    assert!(eventually(|| !l.join("dir").exists()), "the listening mount still has `dir`");
    assert_eq!(std::fs::read(l.join("moved/inner")).unwrap(), b"x");
    // Names it had found absent: created meanwhile, they show.
    assert!(eventually(|| l.join("born").is_dir()), "the listening mount still lacks `born`");
    assert_eq!(std::fs::read(l.join("moved/born")).unwrap(), b"new");
    assert!(
        eventually(|| mode(&l.join("chmodded")) == 0o600),
        "the listening mount still shows mode {:o}",
        mode(&l.join("chmodded"))
    );

    // The other way round: made and removed through a second mount, heard by the node's.
    std::fs::write(l.join("from-listening"), b"z").unwrap();
    assert_eq!(std::fs::read(m1.join("from-listening")).unwrap(), b"z");
    std::fs::remove_file(l.join("from-listening")).unwrap();
    assert!(
        eventually(|| !m1.join("from-listening").exists()),
        "the node's mount still has a name the second mount removed"
    );

    // The deaf mount still serves its hour-long cache: the stale name, the old mode.
    let d = &deaf.path;
    assert!(d.join("gone").exists(), "the deaf mount dropped `gone` without a notice");
    assert_eq!(mode(&d.join("chmodded")), 0o644, "the deaf mount saw the chmod");
    assert!(d.join("moved/inner").exists(), "a name it never had cached is looked up");
    // It never keeps a name as absent (it would not hear it created).
    assert!(d.join("born").is_dir(), "the deaf mount kept an absent name");
}

#[test]
fn a_listening_mount_keeps_names_past_the_short_timeout() {
    require_fuse();
    let dir = scratch("watched-ttl");
    let node = Node::start(&dir, &ARGS);
    let api = Api::of(&node);
    let requests = |op: &str| api.counter("stria_mount_requests_total", "op", op);
    let path = node.mount.join("kept");

    // The mount listens once its first watch request is answered (at mount time; the second
    // follows at once), and hands out the long timeout one short timeout (1 s) later: a name
    // looked up after that is kept by the kernel for 30 s.
    assert!(
        eventually(|| api.counter("stria_metadata_ops_total", "op", "watch_changes") >= 2),
        "the mount never asked for changes"
    );
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(&path, b"kept").unwrap();
    std::fs::metadata(&path).unwrap();
    std::fs::metadata(&path).unwrap();
    let asked = requests("lookup") + requests("getattr");
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..10 {
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4);
    }
    let more = requests("lookup") + requests("getattr") - asked;
    assert_eq!(more, 0, "stats 1.5 s after a lookup asked the mount {more} times");

    // A name that is not there is kept as absent: one lookup for many stats...
    let missing = node.mount.join("not-yet");
    let lookups = requests("lookup");
    for _ in 0..10 {
        assert!(!missing.exists());
    }
    let asked = requests("lookup") - lookups;
    assert_eq!(asked, 1, "10 stats of a missing name asked the mount {asked} times");
    // ...until another client creates it: the node's mount hears of it, and shows it.
    let other = SecondMount::start(&node, &dir.join("other"));
    std::fs::write(other.path.join("not-yet"), b"here").unwrap();
    assert!(
        eventually(|| missing.exists()),
        "the node's mount still hides a name another mount created"
    );
    assert_eq!(std::fs::read(&missing).unwrap(), b"here");
}
