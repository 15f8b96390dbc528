//! The array: assembly from superblocks, the read and write paths, flush and membership changes.
//!
//! Locking, outermost first: `barrier` (shared by every data-path operation, exclusive for a
//! flush/checkpoint), then the stripe locks of the stripes an operation touches (taken in
//! ascending index order; shared for reads, exclusive for writes, rebuild and scrub), then
//! `membership` for short snapshots only. No lock is held while waiting for another lock
//! of an earlier rank, so there is no deadlock.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use stria_io::{AlignedBuf, BlockDevice, IoError, IoOp, IoTicket};
use stria_parity::Kernel;
use stria_proto::{BLOCK_BYTES, Uuid};

use crate::RaidError;
use crate::bitmap::WriteIntent;
use crate::checksum::CrcTable;
use crate::geometry::{Geometry, Level};
use crate::journal::Ring;
use crate::rebuild::RebuildControl;
use crate::superblock::{BITMAP_REGION_MIN_BYTES, Layout, SlotState, Superblock};

pub(crate) const BLOCK: u64 = BLOCK_BYTES as u64;
/// Hashed stripe locks; a power of two well above any useful queue depth.
pub(crate) const STRIPE_LOCKS: usize = 4096;
/// Journal ring per drive for parity levels, unless the drive is small.
const JOURNAL_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default rebuild and resync rate limit, per rebuilding drive.
pub const REBUILD_RATE_BYTES_S_DEFAULT: u64 = 200 * 1024 * 1024;

/// The shape of a new array.
#[derive(Clone, Debug)]
pub struct ArrayConfig {
    pub level: Level,
    pub stripe_unit_bytes: u32,
    /// Rated endurance per drive, in terabytes written (the vendor's TBW figure); 0 = unknown.
    pub rated_tbw: u64,
    /// Journal ring size per drive (parity levels); None picks a default from the drive size.
    pub journal_bytes: Option<u64>,
}

/// Options for [`Array::create`].
#[derive(Clone, Debug, Default)]
pub struct CreateOptions {
    /// Do not discard (nor check) the data area at creation: for devices known to read as
    /// zeros already (memory devices in tests, drive files created sparse just before).
    pub skip_discard: bool,
    /// Least data-area bytes one write-intent bit covers; None: `BITMAP_REGION_MIN_BYTES`
    /// (64 MiB). Smaller regions resync less after a crash or a drive's short absence, at the
    /// cost of more bitmap writes; tests on small drives use them to exercise partial resync.
    pub bitmap_region_bytes: Option<u64>,
}

/// Bytes of each drive read (and, where not zero, rewritten with zeros) per step when a new
/// array's data area is checked after the discard.
const ZERO_CHECK_BYTES: usize = 8 * 1024 * 1024;
const _: () = assert!(ZERO_CHECK_BYTES <= stria_io::IO_BYTES_MAX);

#[derive(Clone, Debug)]
pub(crate) struct Member {
    pub dev: Option<Arc<dyn BlockDevice>>,
    pub drive_uuid: Uuid,
    pub state: SlotState,
    pub events_left: u64,
    pub crc: Option<Arc<CrcTable>>,
    /// Rebuilding members are valid for stripes below this.
    pub cursor: Arc<AtomicU64>,
    pub lifetime_written_base: u64,
    pub lifetime_read_base: u64,
    pub lifetime_errors_base: u64,
}

impl Member {
    /// Whether this member's drive is `dev` (not a spare or replacement that took the slot).
    pub(crate) fn holds(&self, dev: &Arc<dyn BlockDevice>) -> bool {
        self.dev.as_ref().is_some_and(|d| Arc::ptr_eq(d, dev))
    }

    /// Whether `dev` is this member's drive and is still being rebuilt.
    pub(crate) fn rebuilding(&self, dev: &Arc<dyn BlockDevice>) -> bool {
        self.state == SlotState::Rebuilding && self.holds(dev)
    }

    pub(crate) fn empty(state: SlotState) -> Member {
        Member {
            dev: None,
            drive_uuid: Uuid::NIL,
            state,
            events_left: 0,
            crc: None,
            cursor: Arc::new(AtomicU64::new(0)),
            lifetime_written_base: 0,
            lifetime_read_base: 0,
            lifetime_errors_base: 0,
        }
    }

    pub(crate) fn with_device(
        dev: Arc<dyn BlockDevice>,
        sb: &Superblock,
        state: SlotState,
        crc: CrcTable,
    ) -> Member {
        Member {
            dev: Some(dev),
            drive_uuid: sb.drive_uuid,
            state,
            events_left: 0,
            crc: Some(Arc::new(crc)),
            cursor: Arc::new(AtomicU64::new(0)),
            lifetime_written_base: sb.lifetime_bytes_written,
            lifetime_read_base: sb.lifetime_bytes_read,
            lifetime_errors_base: sb.lifetime_errors,
        }
    }

    pub fn readable(&self, stripe: u64) -> bool {
        match self.state {
            SlotState::Active => self.dev.is_some(),
            SlotState::Rebuilding => self.dev.is_some() && stripe < self.cursor.load(Relaxed),
            _ => false,
        }
    }

    pub fn writable(&self) -> bool {
        matches!(self.state, SlotState::Active | SlotState::Rebuilding) && self.dev.is_some()
    }
}

#[derive(Debug)]
pub(crate) struct Spare {
    pub dev: Arc<dyn BlockDevice>,
    pub drive_uuid: Uuid,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub checksum_errors: AtomicU64,
    pub repaired_blocks: AtomicU64,
    pub unrecoverable_blocks: AtomicU64,
    pub degraded_reads: AtomicU64,
    pub journal_records: AtomicU64,
    pub journal_replayed: AtomicU64,
    pub resynced_regions: AtomicU64,
    pub bitmap_writes: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub uuid: Uuid,
    pub geometry: Geometry,
    pub layout: Layout,
    pub created_unix_s: u64,
    pub rated_endurance_bytes: u64,
    pub kernel: Kernel,
    pub membership: RwLock<Vec<Member>>,
    pub spares: Mutex<Vec<Spare>>,
    pub events: AtomicU64,
    pub journal_epoch: AtomicU64,
    pub journal_seq: AtomicU64,
    /// Stripes with a partial-stripe record in the current journal epoch (cleared at each
    /// checkpoint): a full-stripe write to one of them must void that record first.
    pub journaled_stripes: Mutex<BTreeSet<u64>>,
    pub rings: Vec<Ring>,
    pub stripe_locks: Vec<RwLock<()>>,
    pub barrier: RwLock<()>,
    pub bitmap: WriteIntent,
    pub counters: Counters,
    pub superblock_lock: Mutex<()>,
    pub rebuild: RebuildControl,
    pub warnings: Mutex<Vec<String>>,
    pub closed: AtomicBool,
    /// Foreground reads and writes started so far; background walks watch it to step aside
    /// while the array is busy.
    pub foreground_ops: AtomicU64,
}

/// An assembled, running array. Dropping it stops background work and closes it cleanly.
#[derive(Debug)]
pub struct Array {
    pub(crate) inner: Arc<Inner>,
    /// Only the handle returned to the user closes the array on drop; background workers hold
    /// non-owning handles.
    pub(crate) owner: bool,
}

fn now_unix_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn random_u64() -> u64 {
    let id = Uuid::random();
    u64::from_le_bytes(id.0[..8].try_into().unwrap_or([1; 8])) | 1
}

/// Makes sure every member's data area reads back as zeros, which the new checksum table and
/// parity describe. A discard guarantees that only on files (a punched hole); on a block device
/// it may leave the old contents. So the area is read back, all drives at once, and any step
/// that is not all zeros is written with zeros. (On files the read costs little: holes read as
/// zeros without touching the medium.)
fn zero_data_areas(members: &[Member], layout: &Layout) -> Result<(), RaidError> {
    let mut at = 0u64;
    while at < layout.data_bytes {
        let len = (layout.data_bytes - at).min(ZERO_CHECK_BYTES as u64) as usize;
        let offset = layout.data_offset + at;
        let reads: Vec<(usize, IoTicket)> = members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| Some((i, m.dev.as_ref()?.submit(IoOp::Read { offset, len }))))
            .collect();
        let mut writes = Vec::new();
        for (i, ticket) in reads {
            let data = match ticket.wait()? {
                stria_io::IoDone::Read(data) => data,
                stria_io::IoDone::Done => continue,
            };
            let zero = data.chunks_exact(8).all(|w| w.iter().fold(0, |acc, b| acc | b) == 0);
            if !zero && let Some(dev) = members[i].dev.as_ref() {
                let zeros = AlignedBuf::zeroed(len);
                writes.push((i, dev.submit(IoOp::Write { offset, data: zeros, fua: false })));
            }
        }
        if let Some((_, e)) = wait_all(writes).into_iter().next() {
            return Err(e.into());
        }
        at += len as u64;
    }
    Ok(())
}

/// Waits for every ticket, returning the index and error of each one that failed.
pub(crate) fn wait_all(tickets: Vec<(usize, IoTicket)>) -> Vec<(usize, IoError)> {
    tickets.into_iter().filter_map(|(who, t)| t.wait().err().map(|e| (who, e))).collect()
}

impl Array {
    /// Writes fresh superblocks, checksum tables and bitmaps on `devs` and returns the array.
    pub fn create(
        devs: Vec<Arc<dyn BlockDevice>>,
        config: &ArrayConfig,
        options: &CreateOptions,
    ) -> Result<Array, RaidError> {
        let unit = config.stripe_unit_bytes as u64;
        let capacity = devs.iter().map(|d| d.capacity_bytes()).min().unwrap_or(0);
        // Validate the shape before sizing the journal from it.
        Geometry::new(config.level, devs.len(), config.stripe_unit_bytes, capacity)?;
        let data_chunks =
            Geometry::new(config.level, devs.len(), config.stripe_unit_bytes, capacity)?
                .data_chunks() as u64;
        let journal_bytes = if config.level.is_parity() {
            let largest_record = BLOCK + (data_chunks + 2) * unit;
            let wanted = config.journal_bytes.unwrap_or(JOURNAL_BYTES_DEFAULT.min(capacity / 32));
            wanted.max(2 * largest_record).div_ceil(BLOCK) * BLOCK
        } else {
            0
        };
        let region_min = options.bitmap_region_bytes.unwrap_or(BITMAP_REGION_MIN_BYTES);
        let layout = Layout::compute(capacity, unit, journal_bytes, region_min).ok_or_else(|| {
            RaidError::InvalidConfig(format!(
                "drives of {capacity} bytes are too small for this array; use drives of at least {} MiB",
                (journal_bytes + (2 << 20) + 8 * unit) >> 20
            ))
        })?;
        let geometry =
            Geometry::new(config.level, devs.len(), config.stripe_unit_bytes, layout.data_bytes)?;
        let mut seen = BTreeSet::new();
        for dev in &devs {
            if !seen.insert(dev.name().to_string()) {
                return Err(RaidError::InvalidConfig(format!(
                    "{} is listed twice; give each drive once",
                    dev.name()
                )));
            }
        }
        let uuid = Uuid::random();
        let blocks = layout.data_bytes / BLOCK;
        let members: Vec<Member> = devs
            .into_iter()
            .map(|dev| Member {
                dev: Some(dev),
                drive_uuid: Uuid::random(),
                state: SlotState::Active,
                events_left: 0,
                crc: Some(Arc::new(CrcTable::zeroed(blocks))),
                cursor: Arc::new(AtomicU64::new(0)),
                lifetime_written_base: 0,
                lifetime_read_base: 0,
                lifetime_errors_base: 0,
            })
            .collect();
        if !options.skip_discard {
            let tickets = members
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let dev = m.dev.as_ref()?;
                    Some((
                        i,
                        dev.submit(IoOp::Discard {
                            offset: layout.data_offset,
                            len: layout.data_bytes as usize,
                        }),
                    ))
                })
                .collect();
            if let Some((_, e)) = wait_all(tickets).into_iter().next() {
                return Err(e.into());
            }
        }
        if !options.skip_discard {
            zero_data_areas(&members, &layout)?;
        }
        let array = Array::from_parts(
            uuid,
            geometry,
            layout,
            now_unix_s(),
            config.rated_tbw.saturating_mul(1_000_000_000_000),
            members,
            Vec::new(),
            1,
            random_u64(),
        );
        // The zeroed journal region must not hold records of a previous array on these drives;
        // the random epoch makes any leftover bytes invalid, and the bitmap starts clear.
        for (slot, m) in array.members().iter().enumerate() {
            let dev = m.dev.as_ref().expect("new members have devices");
            let crc = m.crc.as_ref().expect("new members have tables");
            crc.persist(dev.as_ref(), &layout)?;
            dev.write_at(
                layout.bitmap_offset,
                array.inner.bitmap.encode(layout.bitmap_bytes as usize),
            )?;
            let _ = slot;
        }
        array.write_superblocks(false)?;
        array.flush_devices()?;
        Ok(array)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        uuid: Uuid,
        geometry: Geometry,
        layout: Layout,
        created_unix_s: u64,
        rated_endurance_bytes: u64,
        members: Vec<Member>,
        spares: Vec<Spare>,
        events: u64,
        journal_epoch: u64,
    ) -> Array {
        let rings = (0..geometry.drives).map(|_| Ring::default()).collect();
        Array {
            owner: true,
            inner: Arc::new(Inner {
                uuid,
                geometry,
                layout,
                created_unix_s,
                rated_endurance_bytes,
                kernel: Kernel::best(),
                membership: RwLock::new(members),
                spares: Mutex::new(spares),
                events: AtomicU64::new(events),
                journal_epoch: AtomicU64::new(journal_epoch),
                journal_seq: AtomicU64::new(1),
                journaled_stripes: Mutex::new(BTreeSet::new()),
                rings,
                stripe_locks: (0..STRIPE_LOCKS).map(|_| RwLock::new(())).collect(),
                barrier: RwLock::new(()),
                bitmap: WriteIntent::new(
                    layout.bitmap_region_bytes,
                    layout.data_bytes,
                    layout.bitmap_bytes,
                ),
                counters: Counters::default(),
                superblock_lock: Mutex::new(()),
                rebuild: RebuildControl::new(REBUILD_RATE_BYTES_S_DEFAULT),
                warnings: Mutex::new(Vec::new()),
                closed: AtomicBool::new(false),
                foreground_ops: AtomicU64::new(0),
            }),
        }
    }

    pub fn uuid(&self) -> Uuid {
        self.inner.uuid
    }

    pub fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    pub fn layout(&self) -> Layout {
        self.inner.layout
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.inner.geometry.capacity_bytes()
    }

    pub fn warnings(&self) -> Vec<String> {
        self.inner.warnings.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn members(&self) -> Vec<Member> {
        self.inner.membership.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn members_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Member>> {
        self.inner.membership.write().unwrap_or_else(|e| e.into_inner())
    }

    /// How many members are out of service (failed, missing, or not yet rebuilt).
    pub(crate) fn failed_count(members: &[Member]) -> usize {
        members.iter().filter(|m| m.state != SlotState::Active).count()
    }

    /// Whether the data is still complete given which members can serve reads.
    pub(crate) fn redundancy_ok(geometry: &Geometry, members: &[Member]) -> bool {
        let out = |d: usize| {
            !matches!(members[d].state, SlotState::Active | SlotState::Rebuilding)
                || members[d].dev.is_none()
        };
        match geometry.level {
            Level::Raid0 => (0..geometry.drives).all(|d| !out(d)),
            Level::Raid1 => (0..geometry.drives).any(|d| !out(d)),
            Level::Raid10 => (0..geometry.drives / 2).all(|p| !out(2 * p) || !out(2 * p + 1)),
            Level::Raid5 | Level::Raid6 => {
                (0..geometry.drives).filter(|&d| out(d)).count() <= geometry.level.parity_chunks()
            }
        }
    }

    /// Errors with [`RaidError::ArrayFailed`] once more drives are out than the level tolerates.
    pub(crate) fn check_alive(&self) -> Result<(), RaidError> {
        let members = self.members();
        let g = &self.inner.geometry;
        if self.can_serve(&members) {
            Ok(())
        } else {
            Err(RaidError::ArrayFailed {
                level: g.level,
                drives: g.drives,
                failed: Self::failed_count(&members),
                tolerated: g.tolerated_failures(),
            })
        }
    }

    /// Whether `members` can still provide every byte. A rebuilding member is not yet a full
    /// source, so it counts as out for this check, although it still receives writes.
    pub(crate) fn can_serve(&self, members: &[Member]) -> bool {
        let g = &self.inner.geometry;
        let sources: Vec<Member> = members
            .iter()
            .map(|m| {
                let mut m = m.clone();
                if m.state == SlotState::Rebuilding {
                    m.state = SlotState::Failed;
                }
                m
            })
            .collect();
        Self::redundancy_ok(g, &sources)
            || Self::redundancy_ok(g, members) && self.rebuilding_is_partial()
    }

    fn rebuilding_is_partial(&self) -> bool {
        // A member re-added for a bitmap resync holds valid data outside the marked regions, but
        // we cannot serve reads from it per region yet, so treat it as out: conservative.
        false
    }

    fn stripe_lock_indices(&self, stripes: impl Iterator<Item = u64>) -> Vec<usize> {
        let set: BTreeSet<usize> = stripes.map(|s| (s as usize) & (STRIPE_LOCKS - 1)).collect();
        set.into_iter().collect()
    }

    pub(crate) fn lock_stripes_shared(
        &self,
        stripes: impl Iterator<Item = u64>,
    ) -> Vec<RwLockReadGuard<'_, ()>> {
        self.stripe_lock_indices(stripes)
            .into_iter()
            .map(|i| self.inner.stripe_locks[i].read().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    pub(crate) fn lock_stripes(
        &self,
        stripes: impl Iterator<Item = u64>,
    ) -> Vec<RwLockWriteGuard<'_, ()>> {
        self.stripe_lock_indices(stripes)
            .into_iter()
            .map(|i| self.inner.stripe_locks[i].write().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<(), RaidError> {
        if offset % BLOCK != 0 || len % BLOCK != 0 {
            return Err(RaidError::Misaligned { offset, len });
        }
        let capacity = self.capacity_bytes();
        if offset.checked_add(len).is_none_or(|end| end > capacity) {
            return Err(RaidError::OutOfRange { offset, len, capacity });
        }
        Ok(())
    }

    /// The device byte offset of `row` (a 4 KiB block index) in `stripe`'s chunk.
    pub(crate) fn device_offset(&self, stripe: u64, row: u64) -> u64 {
        self.inner.layout.data_offset + self.inner.geometry.drive_offset(stripe) + row * BLOCK
    }

    /// The checksum-table block number of `row` in `stripe`'s chunk on any drive.
    pub(crate) fn table_block(&self, stripe: u64, row: u64) -> u64 {
        self.inner.geometry.drive_offset(stripe) / BLOCK + row
    }

    pub(crate) fn rows_per_chunk(&self) -> u64 {
        self.inner.geometry.unit() / BLOCK
    }

    /// Stops background work, flushes and marks the array clean.
    pub fn close(self) -> Result<(), RaidError> {
        self.shutdown()
    }

    fn shutdown(&self) -> Result<(), RaidError> {
        if self.inner.closed.swap(true, Relaxed) {
            return Ok(());
        }
        crate::rebuild::stop_all(self);
        if self.check_alive().is_err() {
            return Ok(());
        }
        self.flush_clearing_bitmap()?;
        self.write_superblocks(true)?;
        self.flush_devices()
    }

    pub fn set_rebuild_rate(&self, bytes_per_s: u64) {
        self.inner.rebuild.set_rate(bytes_per_s);
    }

    pub fn kernel(&self) -> Kernel {
        self.inner.kernel
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        if let Err(e) = self.shutdown() {
            tracing::error!("closing array {}: {e}", self.inner.uuid);
        }
    }
}
