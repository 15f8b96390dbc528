//! Drives backed by a block device or a preallocated regular file.
//!
//! This module owns opening a drive: O_DIRECT (with a buffered fallback where the filesystem
//! refuses it), the exclusive `flock` that keeps two processes off one drive, sizing, and the
//! choice between the io_uring backend ([`crate::uring`]) and the pread/pwrite thread pool
//! ([`crate::threadpool`]). It must never open a drive for writing without holding the lock, and
//! never reports a capacity that is not a whole number of [`IO_ALIGN_BYTES`] blocks.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use crate::threadpool::PoolDevice;
use crate::uring::UringDevice;
use crate::{BlockDevice, IO_ALIGN_BYTES, IoError, OpKind};

/// The deepest io_uring queue we set up per drive; NVMe devices gain nothing past a few hundred.
pub const QUEUE_DEPTH_MAX: u32 = 4096;
/// The most pread/pwrite workers per drive in the thread-pool backend.
pub const THREADS_MAX: usize = 256;

/// How requests reach the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// io_uring where the kernel allows it, the thread pool where it does not.
    #[default]
    Auto,
    /// io_uring or nothing: opening fails if the ring cannot be set up.
    Uring,
    /// pread/pwrite on a pool of threads.
    ThreadPool,
}

#[derive(Debug, Clone)]
pub struct DriveOptions {
    pub backend: Backend,
    /// Bypass the page cache (O_DIRECT). Falls back to buffered I/O, with a warning, where the
    /// filesystem refuses O_DIRECT.
    pub direct_io: bool,
    /// io_uring requests in flight per drive, `1..=QUEUE_DEPTH_MAX`.
    pub queue_depth: u32,
    /// Worker threads per drive in the thread-pool backend, `1..=THREADS_MAX`.
    pub threads: usize,
}

impl Default for DriveOptions {
    fn default() -> DriveOptions {
        DriveOptions { backend: Backend::Auto, direct_io: true, queue_depth: 128, threads: 8 }
    }
}

/// What kind of object backs a drive; it decides how discard and sizing work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Medium {
    RegularFile,
    BlockDevice,
}

/// An open, locked drive and what was learned about it at open. Shared by a backend's threads;
/// closing the last reference releases the `flock`.
#[derive(Debug)]
pub(crate) struct DriveFile {
    pub(crate) file: File,
    pub(crate) name: String,
    pub(crate) medium: Medium,
    pub(crate) direct: bool,
    pub(crate) capacity_bytes: u64,
}

impl DriveFile {
    pub(crate) fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    pub(crate) fn os_error(&self, op: OpKind, offset: u64, source: io::Error) -> IoError {
        IoError::Os { device: self.name.clone(), op, offset, source }
    }

    /// Gives the range back to the medium. Regular files get a hole punched, so the range reads
    /// back as zeros and its blocks return to the filesystem; block devices get BLKDISCARD, after
    /// which the contents are whatever the device says (often zeros, not promised).
    pub(crate) fn discard(&self, offset: u64, len: usize) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        match self.medium {
            Medium::RegularFile => {
                let (offset, len) = (to_off_t(offset)?, to_off_t(len as u64)?);
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                retry_eintr(|| {
                    // SAFETY: fallocate only reads its integer arguments.
                    unsafe { libc::fallocate(self.fd(), mode, offset, len) }
                })
            }
            Medium::BlockDevice => {
                let range: [u64; 2] = [offset, len as u64];
                retry_eintr(|| {
                    // SAFETY: BLKDISCARD reads two u64s (start, length) from the pointer, which
                    // lives across the call.
                    unsafe { libc::ioctl(self.fd(), BLKDISCARD as _, range.as_ptr()) }
                })
            }
        }
    }
}

fn to_off_t(value: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(value)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset exceeds off_t"))
}

/// Runs a libc call that returns -1 and sets errno on failure, retrying when a signal
/// interrupted it.
fn retry_eintr(mut call: impl FnMut() -> libc::c_int) -> io::Result<()> {
    loop {
        if call() != -1 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

// Linux's _IOR(0x12, 114, size_t) and _IO(0x12, 119). The "read" direction bit sits one place
// lower on the architectures that use 3 direction bits.
const IOC_READ: libc::c_ulong = if cfg!(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)) {
    2 << 29
} else {
    2 << 30
};
const BLKGETSIZE64: libc::c_ulong =
    IOC_READ | ((size_of::<usize>() as libc::c_ulong) << 16) | (0x12 << 8) | 114;
const BLKDISCARD: libc::c_ulong = (0x12 << 8) | 119;

fn open_error(path: &Path, message: impl Into<String>) -> IoError {
    IoError::Open { path: path.display().to_string(), message: message.into() }
}

/// Creates a new drive file of `size_bytes` rounded down to a whole number of 4 KiB blocks.
///
/// The file is sparse (`set_len`): it takes no space until written, which is what `stria up`
/// wants for test arrays on a laptop. The flip side is that a full filesystem shows up later as
/// write errors (ENOSPC) rather than now; use `fallocate` on the file first where that matters.
/// Refuses to touch an existing file, so a typo cannot wipe a drive.
pub fn create_drive_file(path: &Path, size_bytes: u64) -> Result<(), IoError> {
    let rounded = size_bytes - size_bytes % IO_ALIGN_BYTES as u64;
    if rounded == 0 {
        return Err(open_error(
            path,
            format!(
                "drive size {size_bytes} bytes is smaller than one {IO_ALIGN_BYTES}-byte block"
            ),
        ));
    }
    let file = OpenOptions::new().write(true).create_new(true).open(path).map_err(|e| {
        if e.kind() == io::ErrorKind::AlreadyExists {
            open_error(path, "already exists; refusing to overwrite it as a new drive file")
        } else {
            open_error(path, format!("cannot create drive file: {e}"))
        }
    })?;
    if let Err(e) = file.set_len(rounded) {
        drop(file);
        // A zero-length leftover would make the retry fail with "already exists".
        let _ = std::fs::remove_file(path);
        return Err(open_error(path, format!("cannot size drive file to {rounded} bytes: {e}")));
    }
    Ok(())
}

/// Reads the first `len` bytes of a drive without locking it, through the page cache, so
/// `status` can look at superblocks while another process holds the drive. What it returns may
/// be torn by a concurrent write; callers verify checksums.
pub fn read_header(path: &Path, len: usize) -> Result<Vec<u8>, IoError> {
    let mut file =
        File::open(path).map_err(|e| open_error(path, format!("cannot open for reading: {e}")))?;
    let mut header = vec![0; len];
    file.read_exact(&mut header).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            open_error(path, format!("shorter than the {len}-byte header"))
        } else {
            open_error(path, format!("cannot read header: {e}"))
        }
    })?;
    Ok(header)
}

/// Opens a drive for exclusive use by this process and starts its backend.
pub fn open_drive(path: &Path, opts: &DriveOptions) -> Result<Arc<dyn BlockDevice>, IoError> {
    if opts.queue_depth == 0 || opts.queue_depth > QUEUE_DEPTH_MAX {
        return Err(open_error(
            path,
            format!("queue depth {} is outside 1..={QUEUE_DEPTH_MAX}", opts.queue_depth),
        ));
    }
    if opts.threads == 0 || opts.threads > THREADS_MAX {
        return Err(open_error(
            path,
            format!("thread count {} is outside 1..={THREADS_MAX}", opts.threads),
        ));
    }
    let drive = Arc::new(open_locked(path, opts.direct_io)?);
    let name = drive.name.clone();

    let device: Arc<dyn BlockDevice> = match opts.backend {
        Backend::Uring => Arc::new(
            UringDevice::start(drive, opts.queue_depth)
                .map_err(|e| open_error(path, format!("cannot set up io_uring: {e}")))?,
        ),
        Backend::ThreadPool => Arc::new(start_pool(path, drive, opts.threads)?),
        Backend::Auto => match UringDevice::start(drive.clone(), opts.queue_depth) {
            Ok(device) => Arc::new(device),
            Err(e) => {
                // Containers and hardened kernels refuse io_uring (EPERM, ENOSYS,
                // kernel.io_uring_disabled); the pool is slower but works everywhere.
                tracing::info!(drive = %name, error = %e, "io_uring unavailable, using thread pool");
                Arc::new(start_pool(path, drive, opts.threads)?)
            }
        },
    };
    tracing::info!(
        drive = %name,
        backend = device.backend(),
        capacity_bytes = device.capacity_bytes(),
        "opened drive"
    );
    Ok(device)
}

fn start_pool(path: &Path, drive: Arc<DriveFile>, threads: usize) -> Result<PoolDevice, IoError> {
    PoolDevice::start(drive, threads)
        .map_err(|e| open_error(path, format!("cannot start I/O threads: {e}")))
}

fn open_locked(path: &Path, direct: bool) -> Result<DriveFile, IoError> {
    let open = |flags: libc::c_int| {
        OpenOptions::new().read(true).write(true).custom_flags(flags).open(path)
    };
    let (file, direct) = if direct {
        match open(libc::O_DIRECT) {
            Ok(file) => (file, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(
                    drive = %path.display(),
                    "filesystem refuses O_DIRECT; using buffered I/O (data reaches the medium \
                     only on flush or FUA)"
                );
                let file = open(0).map_err(|e| open_error(path, format!("cannot open: {e}")))?;
                (file, false)
            }
            Err(e) => return Err(open_error(path, format!("cannot open: {e}"))),
        }
    } else {
        (open(0).map_err(|e| open_error(path, format!("cannot open: {e}")))?, false)
    };

    // The lock belongs to this open file description, so it lasts exactly as long as the
    // DriveFile and is released by the kernel if the process dies.
    // SAFETY: flock only reads its integer arguments.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == -1 {
        let err = io::Error::last_os_error();
        return Err(if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            open_error(path, "in use by another stria process")
        } else {
            open_error(path, format!("cannot lock: {err}"))
        });
    }

    let metadata = file.metadata().map_err(|e| open_error(path, format!("cannot stat: {e}")))?;
    let file_type = metadata.file_type();
    let (medium, capacity_bytes) = if file_type.is_block_device() {
        let mut bytes: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which outlives the call.
        if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut bytes as *mut u64) } == -1
        {
            let err = io::Error::last_os_error();
            return Err(open_error(path, format!("cannot read block device size: {err}")));
        }
        (Medium::BlockDevice, bytes)
    } else if file_type.is_file() {
        (Medium::RegularFile, metadata.len())
    } else {
        return Err(open_error(path, "is neither a regular file nor a block device"));
    };
    if capacity_bytes == 0 {
        return Err(open_error(path, "has zero size; create drive files with a size first"));
    }
    if capacity_bytes % IO_ALIGN_BYTES as u64 != 0 {
        return Err(open_error(
            path,
            format!("size {capacity_bytes} bytes is not a multiple of {IO_ALIGN_BYTES}"),
        ));
    }
    Ok(DriveFile { file, name: path.display().to_string(), medium, direct, capacity_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_ioctl_numbers_match_linux() {
        // From <linux/fs.h> on x86_64 and aarch64.
        if cfg!(target_pointer_width = "64") && IOC_READ == 2 << 30 {
            assert_eq!(BLKGETSIZE64, 0x8008_1272);
        }
        assert_eq!(BLKDISCARD, 0x1277);
    }
}
