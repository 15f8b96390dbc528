//! Any mounted file system, through plain POSIX calls (`open`, `pread`, `pwrite`, `fsync`,
//! `stat`, `unlink`, `readdir`), so every file system is measured the same way.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::target::{DataFile, Entry, OpenMode, Target, TargetKind, short_read};

/// How page-cache effects are kept out of the figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// O_DIRECT where transfers are aligned; otherwise buffered, and each file's cached pages
    /// are dropped (fsync + POSIX_FADV_DONTNEED) between writing and reading it.
    Direct,
    /// Buffered I/O; cached pages dropped between writing and reading.
    Drop,
    /// Buffered I/O, caches left alone (measures the cache, not the storage).
    Keep,
}

impl CacheMode {
    pub fn parse(text: &str) -> Result<CacheMode, String> {
        match text {
            "direct" => Ok(CacheMode::Direct),
            "drop" => Ok(CacheMode::Drop),
            "keep" => Ok(CacheMode::Keep),
            other => Err(format!("unknown cache mode {other:?}: use direct, drop or keep")),
        }
    }
}

#[derive(Debug)]
pub struct PosixTarget {
    root: PathBuf,
    cache: CacheMode,
    /// Set once the file system refused O_DIRECT, at open (old tmpfs) or at the first
    /// transfer (a FUSE file system whose daemon cannot pass O_DIRECT on); buffered from then on.
    direct_refused: Arc<AtomicBool>,
}

impl PosixTarget {
    /// `root` must be an existing directory.
    pub fn new(root: PathBuf, cache: CacheMode) -> io::Result<PosixTarget> {
        let meta = std::fs::metadata(&root)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", root.display())))?;
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", root.display()),
            ));
        }
        Ok(PosixTarget { root, cache, direct_refused: Arc::new(AtomicBool::new(false)) })
    }

    fn path(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }

    fn with_path<T>(&self, path: &str, result: io::Result<T>) -> io::Result<T> {
        result.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.path(path).display())))
    }

    fn direct(&self, aligned: bool) -> bool {
        self.cache == CacheMode::Direct && aligned && !self.direct_refused.load(Relaxed)
    }
}

impl Target for PosixTarget {
    fn label(&self) -> String {
        self.root.display().to_string()
    }

    fn kind(&self) -> TargetKind {
        TargetKind::Posix
    }

    fn mkdir(&self, path: &str) -> io::Result<()> {
        self.with_path(path, std::fs::create_dir(self.path(path)))
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        self.with_path(path, std::fs::remove_dir(self.path(path)))
    }

    fn open(&self, path: &str, mode: OpenMode) -> io::Result<Box<dyn DataFile>> {
        let full = self.path(path);
        let direct = self.direct(mode.aligned);
        let file = match open_file(&full, mode, direct) {
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                self.direct_refused.store(true, Relaxed);
                open_file(&full, mode, false)
            }
            other => other,
        };
        let file = self.with_path(path, file)?;
        // Reopening after a refused transfer must not truncate what was written.
        let reopen = OpenMode { create: false, ..mode };
        Ok(Box::new(PosixFile {
            file,
            direct,
            path: full,
            mode: reopen,
            refused: self.direct_refused.clone(),
        }))
    }

    fn stat(&self, path: &str) -> io::Result<u64> {
        Ok(self.with_path(path, std::fs::metadata(self.path(path)))?.len())
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        self.with_path(path, std::fs::remove_file(self.path(path)))
    }

    fn list(&self, path: &str) -> io::Result<Vec<Entry>> {
        let mut entries = Vec::new();
        for entry in self.with_path(path, std::fs::read_dir(self.path(path)))? {
            let entry = entry?;
            entries.push(Entry {
                name: entry.file_name().to_string_lossy().into_owned(),
                is_dir: entry.file_type()?.is_dir(),
            });
        }
        Ok(entries)
    }

    fn drop_cache(&self, path: &str) -> io::Result<()> {
        if self.cache == CacheMode::Keep {
            return Ok(());
        }
        let file = self.with_path(path, File::open(self.path(path)))?;
        file.sync_data()?;
        // SAFETY: a plain system call on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    fn cache_policy(&self, aligned: bool) -> String {
        match self.cache {
            CacheMode::Keep => "buffered, page cache kept (figures include cache hits)".into(),
            _ if self.direct(aligned) => "O_DIRECT".into(),
            CacheMode::Direct if aligned => {
                "buffered (the file system refused O_DIRECT); fsync + POSIX_FADV_DONTNEED \
                 before reading"
                    .into()
            }
            _ => "buffered; fsync + POSIX_FADV_DONTNEED before reading".into(),
        }
    }
}

fn open_file(path: &Path, mode: OpenMode, direct: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(mode.write).create(mode.create).truncate(mode.create);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path)
}

#[derive(Debug)]
struct PosixFile {
    file: File,
    /// Opened with O_DIRECT.
    direct: bool,
    path: PathBuf,
    mode: OpenMode,
    refused: Arc<AtomicBool>,
}

impl PosixFile {
    /// After EINVAL on an O_DIRECT transfer: reopen buffered, and tell the target, so this
    /// and later files go buffered. Returns whether the transfer should be retried.
    fn fall_back(&mut self, e: &io::Error) -> io::Result<bool> {
        if !self.direct || e.raw_os_error() != Some(libc::EINVAL) {
            return Ok(false);
        }
        self.refused.store(true, Relaxed);
        self.file = open_file(&self.path, self.mode, false)?;
        self.direct = false;
        Ok(true)
    }

    fn read_fully(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => return Err(short_read(offset, buf.len(), done)),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl DataFile for PosixFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        match self.file.write_all_at(data, offset) {
            Err(e) if self.fall_back(&e)? => self.file.write_all_at(data, offset),
            other => other,
        }
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self.read_fully(offset, buf) {
            Err(e) if self.fall_back(&e)? => self.read_fully(offset, buf),
            other => other,
        }
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_all()
    }

    fn close(self: Box<Self>) -> io::Result<()> {
        // close(2) reports deferred write errors on NFS and FUSE; std's drop ignores them.
        let fd = std::os::fd::IntoRawFd::into_raw_fd(self.file);
        // SAFETY: we own `fd` (taken out of the File) and close it exactly once.
        if unsafe { libc::close(fd) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
