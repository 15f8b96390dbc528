//! A small file's bytes (kept inside its inode) come with the open, so the client reads them
//! without another request. They must never be stale where POSIX and close-to-open promise
//! fresh data: a new open sees what another client wrote and closed (also while an older
//! handle of the file is still open here), and this client's own writes and truncates show at
//! once.

#![allow(clippy::unwrap_used)]

mod support;

use stria_proto::fs::{FsStatus, ROOT_INO};
use stria_proto::wire::{Caller, SetAttr, XattrSetMode};
use support::node::{Node, native_client, pattern, require_fuse, scratch};

#[test]
fn small_files_read_from_the_open_stay_fresh() {
    require_fuse();
    let dir = scratch("small-files-open");
    let node = Node::start(&dir, &["--drives", "3", "--drive-size", "128M", "--raid", "5"]);
    let (client, _runtime) = native_client(&node);
    let root = Caller::root();
    let a = pattern(1, 0, 3000);
    let b = pattern(2, 0, 3000);
    std::fs::write(node.mount.join("small"), &a).unwrap();

    let ino = client.lookup(&root, ROOT_INO, b"small").unwrap().ino;
    let mask = (libc::R_OK | libc::W_OK) as u32;
    let (fh, attr) = client.open(&root, ino, mask).unwrap();
    assert_eq!(attr.size, 3000);
    assert!(attr.layout.is_none(), "3000 bytes live inside the inode");
    assert_eq!(client.read(fh, 0, 4096).unwrap(), a);
    assert_eq!(client.read(fh, 100, 50).unwrap(), a[100..150]);
    client.release(fh).unwrap();

    // Another client (the mount) writes and closes: the next open here sees it.
    std::fs::write(node.mount.join("small"), &b).unwrap();
    let (fh, _) = client.open(&root, ino, mask).unwrap();
    assert_eq!(client.read(fh, 0, 4096).unwrap(), b, "a new open fetches fresh bytes");

    // Our own write shows at once through the same handle.
    client.write(fh, 10, b"XYZ").unwrap();
    let mut expected = b.clone();
    expected[10..13].copy_from_slice(b"XYZ");
    assert_eq!(client.read(fh, 0, 4096).unwrap(), expected);
    // And so does a truncate.
    client.setattr(&root, ino, SetAttr { size: Some(20), ..Default::default() }).unwrap();
    assert_eq!(client.read(fh, 0, 4096).unwrap(), expected[..20]);
    client.release(fh).unwrap();

    // Growing past the inline limit moves the file to chunks; reads follow.
    let (fh, _) = client.open(&root, ino, mask).unwrap();
    assert_eq!(client.read(fh, 0, 4096).unwrap(), expected[..20]);
    let big = pattern(3, 0, 10_000);
    client.write(fh, 0, &big).unwrap();
    let got = client.read(fh, 0, 20_000).unwrap();
    if got != big {
        let first = got.iter().zip(&big).position(|(a, b)| a != b);
        let p1 = pattern(1, 0, 10_000);
        let p2 = pattern(2, 0, 10_000);
        panic!(
            "read {} bytes, first difference at {first:?}; got[0..8]={:?} big={:?} p1={:?} p2={:?} expected20={:?}",
            got.len(),
            &got[..8],
            &big[..8],
            &p1[..8],
            &p2[..8],
            &expected[..8]
        );
    }
    client.release(fh).unwrap();
    // The mount caches attributes for 1 s; past that it sees the other client's close.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(std::fs::read(node.mount.join("small")).unwrap().len(), big.len());
    assert_eq!(std::fs::read(node.mount.join("small")).unwrap(), big);
}

/// A new open here reads what another client wrote and closed even while an older handle of
/// the file stays open here: the inline copy the older open fetched is this client's cache and
/// must not outlive the new open.
#[test]
fn a_new_open_beside_an_open_handle_reads_fresh_inline_bytes() {
    require_fuse();
    let dir = scratch("open-beside-open-inline");
    let node = Node::start(&dir, &["--drives", "3", "--drive-size", "128M", "--raid", "5"]);
    let (client, _runtime) = native_client(&node);
    let root = Caller::root();
    let read = libc::R_OK as u32;
    let a = pattern(11, 0, 3000);
    let b = pattern(12, 0, 3000);
    std::fs::write(node.mount.join("small"), &a).unwrap();
    let ino = client.lookup(&root, ROOT_INO, b"small").unwrap().ino;
    let (held, attr) = client.open(&root, ino, read).unwrap();
    assert!(attr.layout.is_none(), "3000 bytes live inside the inode");
    assert!(client.read(held, 0, 4096).unwrap() == a, "the first open reads the bytes");
    // Another client (the mount) rewrites the file and closes it.
    std::fs::write(node.mount.join("small"), &b).unwrap();
    let (fresh, _) = client.open(&root, ino, read).unwrap();
    let got = client.read(fresh, 0, 4096).unwrap();
    assert!(got != a, "a new open read the inline copy of the open before");
    assert!(got == b, "a new open reads the new bytes");
    client.release(fresh).unwrap();
    client.release(held).unwrap();
}

/// The same for a file of several chunks read sequentially here, so that chunks were read
/// ahead for the older handle: the new open must not be served from them.
#[test]
fn a_new_open_beside_an_open_handle_reads_past_the_old_read_ahead() {
    require_fuse();
    let dir = scratch("open-beside-open-chunks");
    let node = Node::start(&dir, &["--drives", "3", "--drive-size", "128M", "--raid", "5"]);
    let (client, _runtime) = native_client(&node);
    let root = Caller::root();
    let read = libc::R_OK as u32;
    let len = (4 << 20) + 1234;
    let old = pattern(13, 0, len);
    let new = pattern(14, 0, len);
    std::fs::write(node.mount.join("large"), &old).unwrap();
    let ino = client.lookup(&root, ROOT_INO, b"large").unwrap().ino;
    let read_all = |fh| {
        let mut got = Vec::with_capacity(len);
        while got.len() < len {
            let part = client.read(fh, got.len() as u64, 128 << 10).unwrap();
            assert!(!part.is_empty(), "short file: {} bytes", got.len());
            got.extend_from_slice(&part);
        }
        got
    };
    let (held, attr) = client.open(&root, ino, read).unwrap();
    assert!(attr.layout.is_some(), "the file is in chunks");
    assert!(read_all(held) == old, "the first open reads the bytes");
    // Rewritten in place through the mount, and closed.
    {
        use std::io::Write;
        let mut file =
            std::fs::OpenOptions::new().write(true).open(node.mount.join("large")).unwrap();
        file.write_all(&new).unwrap();
    }
    let (fresh, _) = client.open(&root, ino, read).unwrap();
    let got = read_all(fresh);
    let stale = got.iter().zip(&new).position(|(g, n)| g != n);
    assert_eq!(stale, None, "first byte a new open read stale (of {len})");
    client.release(fresh).unwrap();
    client.release(held).unwrap();
}

/// FUSE's create of a name another client made first opens that file: only if the caller may
/// open it for what it asked, and with its bytes, not as a new empty file.
#[test]
fn create_of_a_file_another_client_made_first_checks_and_keeps_it() {
    require_fuse();
    let dir = scratch("create-existing");
    let node = Node::start(&dir, &["--drives", "3", "--drive-size", "128M", "--raid", "5"]);
    let (client, _runtime) = native_client(&node);
    let content = pattern(5, 0, 2000);
    let path = node.mount.join("theirs");
    std::fs::write(&path, &content).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();

    let user = Caller { uid: 1000, gid: 1000, groups: Vec::new() };
    let write = libc::W_OK as u32;
    let refused = client.create_open(&user, ROOT_INO, b"theirs", 0o666, false, write);
    assert_eq!(refused.unwrap_err(), FsStatus::Access, "a user may not write root's 0644 file");

    let read = libc::R_OK as u32;
    let (fh, attr) = client.create_open(&user, ROOT_INO, b"theirs", 0o666, false, read).unwrap();
    assert_eq!(attr.size, 2000);
    assert_eq!(client.read(fh, 0, 4096).unwrap(), content, "the file keeps its bytes");
    client.release(fh).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), content);
}

/// A file this client created is known to have no extended attributes while it is open here
/// (the kernel asks for security.capability before every write, and that is answered without
/// a request); the client's own setxattr and removexattr are seen at once.
#[test]
fn xattrs_of_a_file_created_here_follow_its_own_changes() {
    require_fuse();
    let dir = scratch("created-xattrs");
    let node = Node::start(&dir, &["--drives", "3", "--drive-size", "128M", "--raid", "5"]);
    let (client, _runtime) = native_client(&node);
    let root = Caller::root();
    let write = libc::W_OK as u32;
    let (fh, attr) = client.create_open(&root, ROOT_INO, b"fresh", 0o644, false, write).unwrap();
    let ino = attr.ino;
    assert_eq!(client.getxattr(&root, ino, b"user.k").unwrap_err(), FsStatus::NoData);
    client.setxattr(&root, ino, b"user.k", b"v1", XattrSetMode::Any).unwrap();
    assert_eq!(client.getxattr(&root, ino, b"user.k").unwrap(), b"v1");
    client.removexattr(&root, ino, b"user.k").unwrap();
    assert_eq!(client.getxattr(&root, ino, b"user.k").unwrap_err(), FsStatus::NoData);
    client.release(fh).unwrap();

    // Set through the mount while this client has the file open: seen at its next open.
    let (fh, _) = client.open(&root, ino, write).unwrap();
    std::fs::File::open(node.mount.join("fresh")).unwrap();
    xattr_set(&node.mount.join("fresh"), "user.m", b"from the mount");
    client.release(fh).unwrap();
    let (fh, _) = client.open(&root, ino, write).unwrap();
    assert_eq!(client.getxattr(&root, ino, b"user.m").unwrap(), b"from the mount");
    client.release(fh).unwrap();
}

fn xattr_set(path: &std::path::Path, name: &str, value: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: both strings are NUL-terminated and live across the call; value is a valid slice.
    let rc = unsafe {
        libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0)
    };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
}
