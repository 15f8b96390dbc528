//! A chunk-map store in memory that can lose everything not yet synced, to test crash recovery
//! without killing a process. Each [`MemMapStore::backend`] is one "boot"; [`MemMapStore::crash`]
//! ends the boot: the old backend keeps answering its (doomed) database but its writes no longer
//! reach the medium, as if the machine had lost power.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use redb::StorageBackend;

#[derive(Default)]
struct Medium {
    /// What survives a power loss: the image as of the last `sync_data`.
    durable: Vec<u8>,
    /// The live boot's image, including writes not yet synced.
    live: Option<Arc<RwLock<Vec<u8>>>>,
    boot: u64,
}

/// The medium a test keeps across simulated crashes.
#[derive(Clone, Default)]
pub struct MemMapStore {
    medium: Arc<Mutex<Medium>>,
}

impl std::fmt::Debug for MemMapStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = lock(&self.medium);
        f.debug_struct("MemMapStore")
            .field("boot", &m.boot)
            .field("durable_len", &m.durable.len())
            .finish()
    }
}

/// One boot's view of a [`MemMapStore`]; give it to `Engine::create_with_backend` or
/// `Engine::open_with_backend`.
pub struct MemMapBackend {
    medium: Arc<Mutex<Medium>>,
    boot: u64,
    image: Arc<RwLock<Vec<u8>>>,
}

// By hand: the derived impl would print every byte of the image.
impl std::fmt::Debug for MemMapBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = self.image.read().unwrap_or_else(|e| e.into_inner()).len();
        f.debug_struct("MemMapBackend").field("boot", &self.boot).field("len", &len).finish()
    }
}

fn lock(m: &Mutex<Medium>) -> MutexGuard<'_, Medium> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemMapStore {
    pub fn new() -> MemMapStore {
        MemMapStore::default()
    }

    /// Starts a boot from what survived: the durable image.
    pub fn backend(&self) -> MemMapBackend {
        let mut m = lock(&self.medium);
        m.boot += 1;
        let image = Arc::new(RwLock::new(m.durable.clone()));
        m.live = Some(image.clone());
        MemMapBackend { medium: self.medium.clone(), boot: m.boot, image }
    }

    /// Power loss. With `keep_unsynced` the unsynced writes happen to have reached the medium
    /// (the process died, the kernel wrote its page cache); without, they are all lost.
    pub fn crash(&self, keep_unsynced: bool) {
        let mut m = lock(&self.medium);
        if keep_unsynced && let Some(live) = &m.live {
            let image = live.read().unwrap_or_else(|e| e.into_inner()).clone();
            m.durable = image;
        }
        m.live = None;
        m.boot += 1;
    }

    /// Bytes that would survive a crash now.
    pub fn durable_len(&self) -> usize {
        lock(&self.medium).durable.len()
    }
}

fn out_of_range() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "offset past the end of the store")
}

impl StorageBackend for MemMapBackend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.image.read().unwrap_or_else(|e| e.into_inner()).len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let image = self.image.read().unwrap_or_else(|e| e.into_inner());
        let start = offset as usize;
        let src = image.get(start..start + out.len()).ok_or_else(out_of_range)?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.image.write().unwrap_or_else(|e| e.into_inner()).resize(len as usize, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut m = lock(&self.medium);
        if m.boot == self.boot {
            m.durable = self.image.read().unwrap_or_else(|e| e.into_inner()).clone();
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        // A crashed boot's database may still write while it is dropped; its image is private
        // to it and only `sync_data` of the current boot publishes, so those writes are lost.
        let mut image = self.image.write().unwrap_or_else(|e| e.into_inner());
        let start = offset as usize;
        let dst = image.get_mut(start..start + data.len()).ok_or_else(out_of_range)?;
        dst.copy_from_slice(data);
        Ok(())
    }
}

/// A small deterministic generator (xorshift64*) for randomized tests, so every failure is
/// reproducible by its seed. Not for anything but tests.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}
