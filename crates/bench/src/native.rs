//! Stria's client library called directly, bypassing FUSE and the kernel (as 3FS's USRBIO is
//! measured), to show what the mount costs.
//!
//! Names are resolved with one lookup per component from the root, as a path walk in the kernel
//! would do without its dentry cache. The client keeps no page cache, so nothing needs dropping.

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

use stria_client::{Client, FileHandleId, FsResult};
use stria_proto::fs::{FsStatus, Ino, ROOT_INO};
use stria_proto::wire::{Caller, FileKind};

use crate::target::{DataFile, Entry, OpenMode, Target, TargetKind, short_read};

/// Most bytes one client read or write carries; larger transfers are split.
const REQUEST_BYTES_MAX: usize = 8 << 20;

#[derive(Debug)]
pub struct NativeTarget {
    client: Client,
    label: String,
    caller: Caller,
    /// Directories this target made or walked, by path: a client holds on to the directories
    /// it works in as the kernel's dentry cache does, so a file operation costs one lookup of
    /// its own name, not one per path component. Only the benchmark changes its directories.
    dirs: Mutex<HashMap<String, Ino>>,
}

fn io_error(status: FsStatus, what: &str, path: &str) -> io::Error {
    let e = io::Error::from_raw_os_error(status.errno());
    io::Error::new(e.kind(), format!("{what} {path}: {status}"))
}

impl NativeTarget {
    /// Runs as root (uid 0), as the benchmark's other targets usually do.
    pub fn new(client: Client, label: impl Into<String>) -> NativeTarget {
        NativeTarget {
            client,
            label: label.into(),
            caller: Caller::root(),
            dirs: Mutex::new(HashMap::new()),
        }
    }

    fn split(path: &str) -> (&str, &str) {
        match path.rsplit_once('/') {
            Some((dir, name)) => (dir, name),
            None => ("", path),
        }
    }

    fn dirs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Ino>> {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn resolve(&self, path: &str) -> FsResult<Ino> {
        if path.is_empty() {
            return Ok(ROOT_INO);
        }
        if let Some(&ino) = self.dirs().get(path) {
            return Ok(ino);
        }
        let mut ino = ROOT_INO;
        for name in path.split('/').filter(|c| !c.is_empty()) {
            ino = self.client.lookup(&self.caller, ino, name.as_bytes())?.ino;
        }
        Ok(ino)
    }

    /// Resolves a directory and remembers it.
    fn resolve_dir(&self, path: &str) -> FsResult<Ino> {
        let ino = self.resolve(path)?;
        if !path.is_empty() {
            self.dirs().insert(path.to_string(), ino);
        }
        Ok(ino)
    }

    fn in_dir<T>(
        &self,
        path: &str,
        what: &str,
        f: impl FnOnce(Ino, &[u8]) -> FsResult<T>,
    ) -> io::Result<T> {
        let (dir, name) = Self::split(path);
        self.resolve(dir)
            .and_then(|parent| f(parent, name.as_bytes()))
            .map_err(|s| io_error(s, what, path))
    }
}

impl Target for NativeTarget {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn kind(&self) -> TargetKind {
        TargetKind::Native
    }

    fn mkdir(&self, path: &str) -> io::Result<()> {
        let attr =
            self.in_dir(path, "mkdir", |p, n| self.client.mkdir(&self.caller, p, n, 0o755))?;
        self.dirs().insert(path.to_string(), attr.ino);
        Ok(())
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        self.in_dir(path, "rmdir", |p, n| self.client.rmdir(&self.caller, p, n))?;
        self.dirs().remove(path);
        Ok(())
    }

    fn open(&self, path: &str, mode: OpenMode) -> io::Result<Box<dyn DataFile>> {
        let (fh, size) = if mode.create {
            self.in_dir(path, "create", |p, n| {
                // The benchmark's files are new; an existing one is truncated as O_TRUNC does.
                match self.client.create_open(&self.caller, p, n, 0o644, false, libc::W_OK as u32) {
                    Ok((fh, attr)) if attr.size > 0 => {
                        let set =
                            stria_proto::wire::SetAttr { size: Some(0), ..Default::default() };
                        self.client.setattr(&self.caller, attr.ino, set)?;
                        Ok((fh, 0))
                    }
                    Ok((fh, attr)) => Ok((fh, attr.size)),
                    Err(e) => Err(e),
                }
            })?
        } else {
            let mask =
                if mode.write { libc::R_OK as u32 | libc::W_OK as u32 } else { libc::R_OK as u32 };
            let ino = self.in_dir(path, "open", |p, n| self.client.lookup(&self.caller, p, n))?.ino;
            let (fh, attr) =
                self.client.open(&self.caller, ino, mask).map_err(|s| io_error(s, "open", path))?;
            (fh, attr.size)
        };
        Ok(Box::new(NativeFile { client: self.client.clone(), fh, size }))
    }

    fn stat(&self, path: &str) -> io::Result<u64> {
        self.in_dir(path, "stat", |p, n| self.client.lookup(&self.caller, p, n).map(|a| a.size))
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        self.in_dir(path, "unlink", |p, n| self.client.unlink(&self.caller, p, n))
    }

    fn list(&self, path: &str) -> io::Result<Vec<Entry>> {
        let ino = self.resolve_dir(path).map_err(|s| io_error(s, "readdir", path))?;
        let mut entries = Vec::new();
        let mut cookie = 0;
        loop {
            let batch = self
                .client
                .readdir(&self.caller, ino, cookie, 1024)
                .map_err(|s| io_error(s, "readdir", path))?;
            let Some(last) = batch.last() else { break };
            cookie = last.next_cookie;
            entries.extend(batch.into_iter().map(|e| Entry {
                name: String::from_utf8_lossy(&e.name).into_owned(),
                is_dir: e.kind == FileKind::Dir,
            }));
        }
        Ok(entries)
    }

    fn drop_cache(&self, _path: &str) -> io::Result<()> {
        Ok(())
    }

    fn cache_policy(&self, _aligned: bool) -> String {
        "client library: no page cache to bypass".into()
    }
}

#[derive(Debug)]
struct NativeFile {
    client: Client,
    fh: FileHandleId,
    size: u64,
}

fn data_error(status: FsStatus, what: &str, offset: u64) -> io::Error {
    let e = io::Error::from_raw_os_error(status.errno());
    io::Error::new(e.kind(), format!("{what} at offset {offset}: {status}"))
}

impl DataFile for NativeFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        for (i, piece) in data.chunks(REQUEST_BYTES_MAX).enumerate() {
            let at = offset + (i * REQUEST_BYTES_MAX) as u64;
            self.client.write(self.fh, at, piece).map_err(|s| data_error(s, "write", at))?;
        }
        self.size = self.size.max(offset + data.len() as u64);
        Ok(())
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let wanted = buf.len();
        for (i, piece) in buf.chunks_mut(REQUEST_BYTES_MAX).enumerate() {
            let at = offset + (i * REQUEST_BYTES_MAX) as u64;
            let got = self
                .client
                .read(self.fh, at, piece.len() as u32)
                .map_err(|s| data_error(s, "read", at))?;
            if got.len() < piece.len() {
                return Err(short_read(offset, wanted, i * REQUEST_BYTES_MAX + got.len()));
            }
            piece.copy_from_slice(&got);
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.client.fsync(self.fh).map_err(|s| data_error(s, "fsync", 0))
    }

    fn close(self: Box<Self>) -> io::Result<()> {
        self.client.release(self.fh).map_err(|s| data_error(s, "close", self.size))
    }
}
