//! Opening drives safely: one process per drive, no nonsense sizes, no accidental overwrites,
//! and a way to peek at a drive someone else holds.

// Tests unwrap freely: a panic is the failure report.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{ScratchDir, pattern};
use stria_io::file::{Backend, DriveOptions, create_drive_file, open_drive, read_header};
use stria_io::{BlockDevice, IoError};

const MIB: u64 = 1 << 20;

fn open_error_message(result: Result<std::sync::Arc<dyn BlockDevice>, IoError>) -> String {
    match result {
        Err(e @ IoError::Open { .. }) => e.to_string(),
        Err(e) => panic!("expected an open error, got {e}"),
        Ok(dev) => panic!("opened {} unexpectedly", dev.name()),
    }
}

#[test]
fn a_drive_open_in_one_place_cannot_be_opened_again_until_closed() {
    let scratch = ScratchDir::new("in-use");
    let path = scratch.path().join("drive0");
    create_drive_file(&path, 8 * MIB).unwrap();
    for backend in [Backend::Uring, Backend::ThreadPool] {
        let opts = DriveOptions { backend, ..DriveOptions::default() };
        let first = open_drive(&path, &opts).unwrap();
        let message = open_error_message(open_drive(&path, &opts));
        assert!(message.contains("in use by another stria process"), "{message}");
        assert!(message.contains(&path.display().to_string()), "{message}");
        drop(first);
        // Dropping the device joins its threads and closes the file, releasing the lock.
        open_drive(&path, &opts).unwrap();
    }
}

#[test]
fn empty_and_ragged_files_are_refused() {
    let scratch = ScratchDir::new("sizes");
    let empty = scratch.path().join("empty");
    std::fs::File::create(&empty).unwrap();
    let message = open_error_message(open_drive(&empty, &DriveOptions::default()));
    assert!(message.contains("zero size"), "{message}");

    let ragged = scratch.path().join("ragged");
    std::fs::File::create(&ragged).unwrap().set_len(MIB + 512).unwrap();
    let message = open_error_message(open_drive(&ragged, &DriveOptions::default()));
    assert!(message.contains("not a multiple of 4096"), "{message}");

    let message = open_error_message(open_drive(scratch.path(), &DriveOptions::default()));
    assert!(
        message.contains("neither a regular file nor a block device")
            || message.contains("cannot open"),
        "{message}"
    );
}

#[test]
fn create_drive_file_rounds_down_stays_sparse_and_never_overwrites() {
    let scratch = ScratchDir::new("create");
    let path = scratch.path().join("drive0");
    create_drive_file(&path, 16 * MIB + 1000).unwrap();
    let metadata = std::fs::metadata(&path).unwrap();
    assert_eq!(metadata.len(), 16 * MIB);
    assert!(metadata.blocks() * 512 < MIB, "a new drive file takes no space until written");

    let dev = open_drive(&path, &DriveOptions::default()).unwrap();
    dev.write_at(0, pattern(1, 4096)).unwrap();
    drop(dev);
    match create_drive_file(&path, 4 * MIB) {
        Err(IoError::Open { message, .. }) => {
            assert!(message.contains("refusing to overwrite"), "{message}")
        }
        other => panic!("overwrite was not refused: {other:?}"),
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16 * MIB);
    assert_eq!(read_header(&path, 4096).unwrap(), pattern(1, 4096)[..]);

    assert!(create_drive_file(&scratch.path().join("tiny"), 4095).is_err());
    assert!(!scratch.path().join("tiny").exists());
}

#[test]
fn headers_can_be_read_while_another_process_holds_the_drive() {
    let scratch = ScratchDir::new("header");
    let path = scratch.path().join("drive0");
    create_drive_file(&path, 4 * MIB).unwrap();
    let dev = open_drive(&path, &DriveOptions::default()).unwrap();
    dev.submit(stria_io::IoOp::Write { offset: 0, data: pattern(9, 8192), fua: true })
        .wait()
        .unwrap();
    assert_eq!(read_header(&path, 8192).unwrap(), pattern(9, 8192)[..]);
    assert_eq!(read_header(&path, 100).unwrap(), pattern(9, 8192)[..100]);
    assert!(matches!(read_header(&path, 8 * MIB as usize), Err(IoError::Open { .. })));
    assert!(matches!(read_header(Path::new("/nonexistent/stria"), 10), Err(IoError::Open { .. })));
}

#[test]
fn auto_picks_io_uring_with_o_direct_where_the_kernel_allows_it() {
    let scratch = ScratchDir::new("auto");
    let path = scratch.path().join("drive0");
    create_drive_file(&path, 4 * MIB).unwrap();
    let uring_works =
        open_drive(&path, &DriveOptions { backend: Backend::Uring, ..DriveOptions::default() })
            .map(drop)
            .is_ok();
    let dev = open_drive(&path, &DriveOptions::default()).unwrap();
    let expected = if uring_works { "io_uring+O_DIRECT" } else { "threadpool+O_DIRECT" };
    assert_eq!(dev.backend(), expected);
    if std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").is_ok_and(|v| v.trim() == "0")
    {
        assert!(uring_works, "io_uring is enabled on this kernel but could not be set up");
    }
}

#[test]
fn tmpfs_drives_work_with_or_without_o_direct() {
    // Older kernels refuse O_DIRECT on tmpfs with EINVAL; open_drive must fall back to buffered
    // I/O there rather than fail. Newer kernels accept it. Either way the drive must work.
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm; skipping");
        return;
    }
    let scratch = ScratchDir::under(shm, "tmpfs");
    let path = scratch.path().join("drive0");
    create_drive_file(&path, 4 * MIB).unwrap();
    let dev = open_drive(&path, &DriveOptions::default()).unwrap();
    assert!(dev.backend().contains("O_DIRECT") || dev.backend().contains("buffered"));
    dev.write_at(MIB, pattern(2, 65536)).unwrap();
    dev.flush().unwrap();
    assert!(dev.read_at(MIB, 65536).unwrap() == pattern(2, 65536));
}

#[test]
fn options_outside_their_limits_are_refused() {
    let scratch = ScratchDir::new("limits");
    let path = scratch.path().join("drive0");
    create_drive_file(&path, 4 * MIB).unwrap();
    for opts in [
        DriveOptions { queue_depth: 0, ..DriveOptions::default() },
        DriveOptions {
            queue_depth: stria_io::file::QUEUE_DEPTH_MAX + 1,
            ..DriveOptions::default()
        },
        DriveOptions { threads: 0, backend: Backend::ThreadPool, ..DriveOptions::default() },
    ] {
        assert!(matches!(open_drive(&path, &opts), Err(IoError::Open { .. })), "{opts:?}");
    }
}

#[test]
fn dropping_a_device_never_leaves_a_ticket_hanging() {
    // Requests in flight when the last handle goes away complete (Drop drains them); requests
    // still queued fail as abandoned. Either way every waiter gets an answer.
    let scratch = ScratchDir::new("drop");
    let path = scratch.path().join("drive0");
    create_drive_file(&path, 8 * MIB).unwrap();
    for backend in [Backend::Uring, Backend::ThreadPool] {
        let dev = open_drive(&path, &DriveOptions { backend, ..DriveOptions::default() }).unwrap();
        let tickets: Vec<_> = (0..64u64)
            .map(|i| {
                dev.submit(stria_io::IoOp::Write {
                    offset: i * 4096,
                    data: pattern(i, 4096),
                    fua: false,
                })
            })
            .collect();
        drop(dev);
        // Each ticket either completed or was abandoned; none hangs, none reports a bogus error.
        for ticket in tickets {
            match ticket.wait() {
                Ok(_) | Err(IoError::Abandoned { .. }) => {}
                Err(e) => panic!("{backend:?}: {e}"),
            }
        }
    }
}

#[test]
fn a_read_the_medium_cannot_fill_fails_instead_of_returning_a_short_buffer() {
    // Someone truncates the drive file behind our back: the last block no longer exists, so a
    // read covering it gets a short transfer from the kernel, which must surface as an error.
    let scratch = ScratchDir::new("short");
    let path = scratch.path().join("drive0");
    create_drive_file(&path, 8 * MIB).unwrap();
    for backend in [Backend::Uring, Backend::ThreadPool] {
        let dev = open_drive(&path, &DriveOptions { backend, ..DriveOptions::default() }).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(8 * MIB - 4096)
            .unwrap();
        match dev.read_at(8 * MIB - 8192, 8192) {
            Err(IoError::Os { source, .. }) => {
                assert_eq!(
                    source.kind(),
                    std::io::ErrorKind::UnexpectedEof,
                    "{backend:?}: {source}"
                )
            }
            other => panic!("{backend:?}: short read returned {other:?}"),
        }
        assert_eq!(dev.stats().snapshot().errors, 1);
        assert_eq!(dev.stats().snapshot().read_ops, 0);
        drop(dev);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(8 * MIB).unwrap();
    }
}
