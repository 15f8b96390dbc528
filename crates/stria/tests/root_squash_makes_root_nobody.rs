//! `stria up --root-squash`: root on the mount has the rights of nobody (65534), as with NFS's
//! root_squash, and what it creates belongs to nobody; without the option root keeps its rights.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use support::node::{Node, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "128M", "--raid", "5"];

#[test]
fn root_squash_takes_roots_rights_on_the_mount() {
    require_fuse();
    let dir = scratch("root-squash");
    let mut node = Node::start(&dir, &ARGS);
    let mnt = node.mount.clone();
    std::fs::create_dir(mnt.join("root-only")).unwrap();
    std::fs::set_permissions(mnt.join("root-only"), std::fs::Permissions::from_mode(0o755))
        .unwrap();
    std::fs::create_dir(mnt.join("pub")).unwrap();
    std::fs::set_permissions(mnt.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(mnt.join("private"), b"root only").unwrap();
    std::fs::set_permissions(mnt.join("private"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(mnt.join("shared"), b"for everyone").unwrap();
    std::fs::set_permissions(mnt.join("shared"), std::fs::Permissions::from_mode(0o644)).unwrap();
    node.stop();

    let mut squashed_args = ARGS.to_vec();
    squashed_args.push("--root-squash");
    let mut node = Node::start(&dir, &squashed_args);
    let error = std::fs::read(mnt.join("private")).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::PermissionDenied, "{error}");
    assert_eq!(std::fs::read(mnt.join("shared")).unwrap(), b"for everyone");
    let error = std::fs::write(mnt.join("shared"), b"x").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::PermissionDenied, "{error}");
    let error = std::fs::write(mnt.join("root-only/new"), b"x").unwrap_err();
    assert_eq!(
        error.kind(),
        ErrorKind::PermissionDenied,
        "a directory only root may write: {error}"
    );

    std::fs::write(mnt.join("pub/made-by-root"), b"squashed").unwrap();
    let made = std::fs::metadata(mnt.join("pub/made-by-root")).unwrap();
    assert_eq!((made.uid(), made.gid()), (65534, 65534), "root's new file belongs to nobody");
    let error = std::os::unix::fs::chown(mnt.join("pub/made-by-root"), Some(0), None).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::EPERM), "{error}");
    // Nor may squashed root give a file capabilities (the mount is suid: anyone running it
    // would get them).
    let path =
        std::ffi::CString::new(mnt.join("pub/made-by-root").into_os_string().into_encoded_bytes())
            .unwrap();
    let (name, value) =
        (c"security.capability", [1u8, 0, 0, 2, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    // SAFETY: both strings are NUL-terminated and the value outlives the call.
    let rc = unsafe {
        libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0)
    };
    let error = std::io::Error::last_os_error();
    assert_eq!(
        (rc, error.raw_os_error()),
        (-1, Some(libc::EPERM)),
        "setcap as squashed root: {error}"
    );
    // A write by squashed root drops setuid, as a write by anyone without CAP_FSETID does.
    let suid = mnt.join("pub/suid");
    std::fs::write(&suid, b"a").unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4777)).unwrap();
    assert_eq!(std::fs::metadata(&suid).unwrap().mode() & 0o4000, 0o4000);
    let mut file = std::fs::OpenOptions::new().append(true).open(&suid).unwrap();
    std::io::Write::write_all(&mut file, b"b").unwrap();
    drop(file);
    assert_eq!(std::fs::metadata(&suid).unwrap().mode() & 0o4000, 0, "setuid kept");
    node.stop();

    // Without the option root has its rights again.
    let mut node = Node::start(&dir, &ARGS);
    assert_eq!(std::fs::read(mnt.join("private")).unwrap(), b"root only");
    std::os::unix::fs::chown(mnt.join("pub/made-by-root"), Some(0), Some(0)).unwrap();
    node.stop();
}
