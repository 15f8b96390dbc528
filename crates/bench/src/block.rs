//! Block targets: a Stria volume through the client library, or any NBD export. A block
//! device has no names, so each file a workload creates is given its own region of the device
//! (in creation order, 1 MiB aligned); a workload that needs more than the device holds is
//! refused before it starts writing. Metadata workloads are refused.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use stria_client::VolumeIo;
use stria_nbd::client::{NbdClient, NbdUri};

use crate::target::{DataFile, Entry, OpenMode, Target, TargetKind};

const REGION_ALIGN_BYTES: u64 = 1 << 20;

/// A device that hands out connections (one per worker).
pub trait BlockDevice: Send + Sync {
    fn label(&self) -> String;
    fn size(&self) -> u64;
    fn connect(&self) -> io::Result<Box<dyn BlockConnection>>;
    /// How caches are kept out of the figures, in words.
    fn cache_policy(&self) -> String;
}

pub trait BlockConnection: Send {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
}

/// A Stria volume through the client library (no NBD, no kernel).
#[derive(Debug)]
pub struct VolumeDevice {
    name: String,
    io: Arc<VolumeIo>,
}

impl VolumeDevice {
    pub fn new(name: impl Into<String>, io: VolumeIo) -> VolumeDevice {
        VolumeDevice { name: name.into(), io: Arc::new(io) }
    }
}

fn volume_error(status: stria_proto::fs::FsStatus, what: &str, offset: u64) -> io::Error {
    let e = io::Error::from_raw_os_error(status.errno());
    io::Error::new(e.kind(), format!("volume {what} at {offset}: {status}"))
}

impl BlockDevice for VolumeDevice {
    fn label(&self) -> String {
        format!("volume:{}", self.name)
    }

    fn size(&self) -> u64 {
        self.io.size()
    }

    fn connect(&self) -> io::Result<Box<dyn BlockConnection>> {
        Ok(Box::new(VolumeConnection(self.io.clone())))
    }

    fn cache_policy(&self) -> String {
        "volume through the client library: write-through, no cache".into()
    }
}

struct VolumeConnection(Arc<VolumeIo>);

impl BlockConnection for VolumeConnection {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_into(offset, buf).map_err(|s| volume_error(s, "read", offset))
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write(offset, data, false).map_err(|s| volume_error(s, "write", offset))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().map_err(|s| volume_error(s, "flush", 0))
    }
}

/// Any NBD export (Stria's gateway, nbdkit, qemu-nbd…), one connection per worker.
#[derive(Debug)]
pub struct NbdDevice {
    uri: NbdUri,
    size: u64,
}

impl NbdDevice {
    /// Connects once to learn the size and check the export is writable.
    pub fn open(uri: NbdUri) -> io::Result<NbdDevice> {
        let probe = NbdClient::connect(&uri)?;
        let size = probe.size();
        if probe.read_only() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{uri} is read-only; the benchmark writes"),
            ));
        }
        probe.disconnect()?;
        Ok(NbdDevice { uri, size })
    }
}

impl BlockDevice for NbdDevice {
    fn label(&self) -> String {
        self.uri.to_string()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn connect(&self) -> io::Result<Box<dyn BlockConnection>> {
        Ok(Box::new(NbdConnection(NbdClient::connect(&self.uri)?)))
    }

    fn cache_policy(&self) -> String {
        "NBD: every request goes to the server".into()
    }
}

#[derive(Debug)]
struct NbdConnection(NbdClient);

impl BlockConnection for NbdConnection {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        // Requests over the protocol's 32 MiB limit are split.
        for (i, piece) in buf.chunks_mut(8 << 20).enumerate() {
            self.0.read_at(offset + (i as u64) * (8 << 20), piece)?;
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        for (i, piece) in data.chunks(8 << 20).enumerate() {
            self.0.write_at(offset + (i as u64) * (8 << 20), piece)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// A block device whose "files" are regions.
pub struct BlockTarget {
    device: Box<dyn BlockDevice>,
    regions: Mutex<Regions>,
}

impl std::fmt::Debug for BlockTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockTarget").field("device", &self.device.label()).finish()
    }
}

#[derive(Default)]
struct Regions {
    by_path: HashMap<String, (u64, u64)>,
    next: u64,
}

impl BlockTarget {
    pub fn new(device: Box<dyn BlockDevice>) -> BlockTarget {
        BlockTarget { device, regions: Mutex::new(Regions::default()) }
    }

    fn region(&self, path: &str) -> io::Result<(u64, u64)> {
        let regions = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        regions.by_path.get(path).copied().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{path}: no such region"))
        })
    }
}

fn no_namespace() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "a block device has no directories or names: metadata workloads need a file system",
    )
}

impl Target for BlockTarget {
    fn label(&self) -> String {
        self.device.label()
    }

    fn kind(&self) -> TargetKind {
        TargetKind::Block
    }

    fn has_namespace(&self) -> bool {
        false
    }

    fn mkdir(&self, _path: &str) -> io::Result<()> {
        Ok(())
    }

    fn rmdir(&self, _path: &str) -> io::Result<()> {
        Ok(())
    }

    fn open(&self, path: &str, mode: OpenMode) -> io::Result<Box<dyn DataFile>> {
        let (base, len) = if mode.create {
            let mut regions = self.regions.lock().unwrap_or_else(|p| p.into_inner());
            match regions.by_path.get(path) {
                Some(&region) => region,
                None => {
                    let base = regions.next;
                    let len = mode.size_hint;
                    let end = base + len.div_ceil(REGION_ALIGN_BYTES) * REGION_ALIGN_BYTES;
                    if end > self.device.size() {
                        return Err(io::Error::new(
                            io::ErrorKind::StorageFull,
                            format!(
                                "{}: the workload needs at least {end} bytes, the device has {}; \
                                 use smaller files or fewer threads",
                                self.device.label(),
                                self.device.size()
                            ),
                        ));
                    }
                    regions.next = end;
                    regions.by_path.insert(path.to_string(), (base, len));
                    (base, len)
                }
            }
        } else {
            self.region(path)?
        };
        Ok(Box::new(Region { conn: self.device.connect()?, base, len }))
    }

    fn stat(&self, path: &str) -> io::Result<u64> {
        Ok(self.region(path)?.1)
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let mut regions = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        if regions.by_path.remove(path).is_none() {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{path}: no such region")));
        }
        if regions.by_path.is_empty() {
            regions.next = 0;
        }
        Ok(())
    }

    fn list(&self, _path: &str) -> io::Result<Vec<Entry>> {
        Err(no_namespace())
    }

    fn drop_cache(&self, _path: &str) -> io::Result<()> {
        Ok(())
    }

    fn cache_policy(&self, _aligned: bool) -> String {
        self.device.cache_policy()
    }
}

struct Region {
    conn: Box<dyn BlockConnection>,
    base: u64,
    len: u64,
}

impl Region {
    fn check(&self, offset: u64, len: usize) -> io::Result<u64> {
        if offset + len as u64 > self.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes at {offset} run past the region's {} bytes", self.len),
            ));
        }
        Ok(self.base + offset)
    }
}

impl DataFile for Region {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let at = self.check(offset, data.len())?;
        self.conn.write_at(at, data)
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let at = self.check(offset, buf.len())?;
        self.conn.read_at(at, buf)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.conn.flush()
    }

    fn close(self: Box<Self>) -> io::Result<()> {
        Ok(())
    }
}
