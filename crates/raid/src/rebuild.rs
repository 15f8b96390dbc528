//! Rebuild onto a replacement or spare, bitmap resync of a returning drive, and recovery after
//! an unclean stop (journal replay, then resync of the regions the write-intent bitmap marks).
//!
//! A rebuild walks the stripes in order under each stripe's exclusive lock, so foreground I/O
//! goes on between stripes; the rebuilt member becomes readable below its cursor as it goes.
//! The rate limit is per rebuilding drive and can change while the rebuild runs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use stria_io::{AlignedBuf, IO_BYTES_MAX};
use stria_proto::BLOCK_BYTES;

use crate::RaidError;
use crate::array::{Array, random_u64};
use crate::geometry::Level;
use crate::journal;
use crate::superblock::SlotState;

/// How often a running rebuild records its cursor in the superblocks, so a restart resumes
/// instead of starting over.
const CURSOR_PERSIST_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes of each drive one rebuild step covers: the stripes of one step are read and written
/// together and locked for the step only, which keeps foreground waits short.
const REBUILD_BATCH_BYTES: u64 = 1024 * 1024;
/// While foreground I/O is running, a rebuild takes this share of its rate limit, as md drops
/// from `speed_limit_max` towards `speed_limit_min`: the applications keep most of the drives,
/// and the rebuild goes back to the full rate as soon as they are idle.
const REBUILD_BUSY_SHARE_DIVISOR: u64 = 4;

#[derive(Debug)]
pub(crate) struct RebuildControl {
    rate_limit_bytes_s: AtomicU64,
    measured_bytes_s: AtomicU64,
    jobs: Mutex<Vec<Job>>,
}

#[derive(Debug)]
struct Job {
    slot: usize,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    progress: Arc<Progress>,
}

/// Progress of one rebuild, readable while it runs.
#[derive(Debug, Default)]
pub struct Progress {
    pub stripes_total: AtomicU64,
    pub stripes_done: AtomicU64,
    pub bytes_written: AtomicU64,
    pub finished: AtomicBool,
    pub error: Mutex<Option<String>>,
    started: Mutex<Option<Instant>>,
}

impl Progress {
    /// The average rate since the start; 0 once the walk has ended, so a rebuild that stopped
    /// never looks as if it were still moving.
    pub fn rate_bytes_s(&self) -> u64 {
        if self.finished.load(Relaxed) {
            return 0;
        }
        let started = *self.started.lock().unwrap_or_else(|e| e.into_inner());
        let secs = started.map(|s| s.elapsed().as_secs_f64()).unwrap_or(0.0);
        if secs < 0.01 { 0 } else { (self.bytes_written.load(Relaxed) as f64 / secs) as u64 }
    }
}

impl RebuildControl {
    pub fn new(rate: u64) -> RebuildControl {
        RebuildControl {
            rate_limit_bytes_s: AtomicU64::new(rate),
            measured_bytes_s: AtomicU64::new(0),
            jobs: Mutex::new(Vec::new()),
        }
    }

    pub fn set_rate(&self, bytes_s: u64) {
        self.rate_limit_bytes_s.store(bytes_s.max(1), Relaxed);
    }

    pub fn rate_limit(&self) -> u64 {
        self.rate_limit_bytes_s.load(Relaxed)
    }

    pub fn rate_measured(&self) -> u64 {
        self.measured_bytes_s.load(Relaxed)
    }

    pub fn stop_slot(&self, slot: usize) {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        for job in jobs.iter().filter(|j| j.slot == slot) {
            job.stop.store(true, Relaxed);
        }
    }

    /// The progress of the running (or last) rebuild of `slot`.
    pub fn progress(&self, slot: usize) -> Option<Arc<Progress>> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter().rev().find(|j| j.slot == slot).map(|j| j.progress.clone())
    }
}

/// Paces a background walk to a byte rate without letting idle time turn into a burst.
pub(crate) struct Pacer {
    next: Instant,
}

impl Pacer {
    pub fn new() -> Pacer {
        Pacer { next: Instant::now() }
    }

    pub fn pace(&mut self, bytes: u64, rate_bytes_s: u64) {
        let now = Instant::now();
        if self.next + Duration::from_millis(100) < now {
            self.next = now;
        }
        self.next += Duration::from_secs_f64(bytes as f64 / rate_bytes_s.max(1) as f64);
        if self.next > now {
            std::thread::sleep(self.next - now);
        }
    }
}

/// Starts rebuilding `slot` in the background. With `regions`, only stripes inside those
/// write-intent regions are rewritten (a returning drive); otherwise every stripe.
pub(crate) fn start(array: &Array, slot: usize, regions: Option<Vec<u64>>) {
    let worker = Array { inner: array.inner.clone(), owner: false };
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Progress::default());
    let thread_stop = stop.clone();
    let thread_progress = progress.clone();
    let handle = std::thread::Builder::new()
        .name(format!("rebuild-{slot}"))
        .spawn(move || {
            let outcome = run(&worker, slot, regions, &thread_stop, &thread_progress);
            if let Err(e) = &outcome {
                tracing::error!(slot, "rebuild stopped: {e}");
                worker.inner.rebuild.measured_bytes_s.store(0, Relaxed);
                *thread_progress.error.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(e.to_string());
            }
            thread_progress.finished.store(true, Relaxed);
        })
        .expect("spawning a rebuild thread");
    let mut jobs = array.inner.rebuild.jobs.lock().unwrap_or_else(|e| e.into_inner());
    jobs.retain(|j| !j.progress.finished.load(Relaxed) || j.slot != slot);
    jobs.push(Job { slot, stop, handle: Some(handle), progress });
}

/// Stops every rebuild and waits for the workers; their cursors are persisted so a later
/// assembly resumes where they stopped.
pub(crate) fn stop_all(array: &Array) {
    let handles: Vec<JoinHandle<()>> = {
        let mut jobs = array.inner.rebuild.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter_mut()
            .filter_map(|j| {
                j.stop.store(true, Relaxed);
                j.handle.take()
            })
            .collect()
    };
    for handle in handles {
        let _ = handle.join();
    }
}

/// Waits until no rebuild is running; returns the first error a rebuild reported.
pub(crate) fn wait_idle(array: &Array) -> Result<(), RaidError> {
    loop {
        let handle = {
            let mut jobs = array.inner.rebuild.jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.iter_mut().find_map(|j| j.handle.take())
        };
        match handle {
            Some(h) => {
                let _ = h.join();
            }
            None => break,
        }
    }
    let jobs = array.inner.rebuild.jobs.lock().unwrap_or_else(|e| e.into_inner());
    for job in jobs.iter() {
        if let Some(e) = job.progress.error.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(RaidError::Refused(format!("rebuild of slot {} failed: {e}", job.slot)));
        }
    }
    Ok(())
}

fn run(
    array: &Array,
    slot: usize,
    regions: Option<Vec<u64>>,
    stop: &AtomicBool,
    progress: &Progress,
) -> Result<(), RaidError> {
    let g = array.geometry();
    let stripes = g.stripes();
    let rows = array.rows_per_chunk();
    let bitmap = &array.inner.bitmap;
    let region_of = |stripe: u64| bitmap.region_of(g.drive_offset(stripe));
    let wanted =
        |stripe: u64| regions.as_ref().is_none_or(|r| r.binary_search(&region_of(stripe)).is_ok());
    let (cursor, dev) = {
        let members = array.members();
        let m = &members[slot];
        (
            m.cursor.clone(),
            m.dev
                .clone()
                .ok_or_else(|| RaidError::Refused("rebuild target has no device".into()))?,
        )
    };
    let total = (cursor.load(Relaxed)..stripes).filter(|&s| wanted(s)).count() as u64;
    progress.stripes_total.store(total, Relaxed);
    *progress.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    tracing::info!(slot, drive = dev.name(), stripes = total, "rebuild started");
    let mut pacer = Pacer::new();
    let mut last_persist = Instant::now();
    let batch_stripes = (REBUILD_BATCH_BYTES / g.unit()).max(1);
    let mut foreground_seen = array.inner.foreground_ops.load(Relaxed);
    let mut stripe = cursor.load(Relaxed);
    while stripe < stripes {
        if stop.load(Relaxed) {
            persist_cursor(array, slot, &dev)?;
            return Ok(());
        }
        let end = (stripe + batch_stripes).min(stripes);
        let batch: Vec<u64> = (stripe..end).filter(|&s| wanted(s)).collect();
        if batch.is_empty() {
            stripe = end;
            cursor.store(stripe, Relaxed);
            continue;
        }
        // One bounded batch under the barrier (shared) and the batch's stripe locks: the reads of
        // every stripe go to all surviving drives at once, then the writes to the new drive.
        // Foreground I/O to other stripes is never held up, and to these only for one batch.
        {
            let _barrier = array.inner.barrier.read().unwrap_or_else(|e| e.into_inner());
            let _locks = array.lock_stripes(batch.iter().copied());
            let members = array.members();
            let m = &members[slot];
            if !m.rebuilding(&dev) {
                return Err(RaidError::Refused(format!(
                    "slot {slot} left the rebuild (it failed or was replaced)"
                )));
            }
            let chunks = rebuilt_chunks(array, &members, slot, &batch, rows)?;
            // The new drive is not readable above the cursor and these stripes are locked, so
            // nobody can see the checksums before the data; a failed write fails the drive.
            if let Some(crc) = m.crc.as_ref() {
                for (&s, chunk) in batch.iter().zip(&chunks) {
                    crc.set_from_data(array.table_block(s, 0), chunk);
                }
            }
            let tickets: Vec<(usize, stria_io::IoTicket)> = batch
                .iter()
                .zip(chunks)
                .map(|(&s, data)| {
                    let op = stria_io::IoOp::Write {
                        offset: array.device_offset(s, 0),
                        data,
                        fua: false,
                    };
                    (slot, dev.submit(op))
                })
                .collect();
            if let Some((_, e)) = crate::array::wait_all(tickets).into_iter().next() {
                drop(_locks);
                drop(_barrier);
                array.fail_member(slot, &dev, &format!("write failed during rebuild: {e}"))?;
                return Err(e.into());
            }
            stripe = end;
            cursor.store(stripe, Relaxed);
        }
        if g.level.is_parity() {
            repair_dirty_parity(array, slot, &dev, &batch)?;
        }
        let bytes = batch.len() as u64 * g.unit();
        progress.stripes_done.fetch_add(batch.len() as u64, Relaxed);
        progress.bytes_written.fetch_add(bytes, Relaxed);
        array.inner.rebuild.measured_bytes_s.store(progress.rate_bytes_s(), Relaxed);
        let ops = array.inner.foreground_ops.load(Relaxed);
        let busy = ops != foreground_seen;
        foreground_seen = ops;
        let rate = array.inner.rebuild.rate_limit();
        pacer.pace(bytes, if busy { (rate / REBUILD_BUSY_SHARE_DIVISOR).max(1) } else { rate });
        if last_persist.elapsed() >= CURSOR_PERSIST_INTERVAL {
            persist_cursor(array, slot, &dev)?;
            last_persist = Instant::now();
        }
    }
    // Everything below the cursor is durable before the member is declared in sync.
    array.flush()?;
    {
        // The flush may have failed this drive and put a spare in its place: only the drive
        // rebuilt here is declared in sync.
        let mut members = array.members_mut();
        let m = &mut members[slot];
        if !m.rebuilding(&dev) {
            return Err(RaidError::Refused(format!(
                "slot {slot} left the rebuild as it finished (it failed or was replaced)"
            )));
        }
        m.state = SlotState::Active;
        array.inner.events.fetch_add(1, Relaxed);
    }
    array.write_superblocks(false)?;
    array.flush()?;
    tracing::info!(slot, "rebuild finished");
    Ok(())
}

/// Makes the parity of the batch's stripes that the write-intent bitmap marks agree with their
/// data, now that the slot's chunks are back. A full-stripe write torn by a crash, recovered
/// while a drive was missing, leaves parity that matches no data (§9: resync needs every
/// chunk); rebuilding the missing chunk from one parity leaves the other one wrong. The data's
/// blocks are checked against their checksums, so nothing bad is made to look good.
fn repair_dirty_parity(
    array: &Array,
    slot: usize,
    dev: &Arc<dyn stria_io::BlockDevice>,
    batch: &[u64],
) -> Result<(), RaidError> {
    let bitmap = &array.inner.bitmap;
    let g = array.geometry();
    let dirty: Vec<u64> = batch
        .iter()
        .copied()
        .filter(|&s| bitmap.is_set(bitmap.region_of(g.drive_offset(s))))
        .collect();
    if dirty.is_empty() {
        return Ok(());
    }
    let _barrier = array.inner.barrier.read().unwrap_or_else(|e| e.into_inner());
    let _locks = array.lock_stripes(dirty.iter().copied());
    let members = array.members();
    let m = &members[slot];
    if !m.rebuilding(dev) {
        return Err(RaidError::Refused(format!(
            "slot {slot} left the rebuild (it failed or was replaced)"
        )));
    }
    for stripe in dirty {
        if array.check_parity_stripe(&members, stripe, true)? == Some(true) {
            tracing::info!(stripe, "parity rewritten after a rebuild: it disagreed with the data");
        }
    }
    Ok(())
}

/// Records the rebuild cursor in the labels, only after what it vouches for is durable: the
/// rebuilt chunks below it and their checksums are flushed to the new drive first, so a crash
/// never leaves a label that calls unwritten stripes rebuilt.
fn persist_cursor(
    array: &Array,
    slot: usize,
    dev: &Arc<dyn stria_io::BlockDevice>,
) -> Result<(), RaidError> {
    {
        // Shared barrier: no flush (the other writer of checksum pages) runs meanwhile.
        let _barrier = array.inner.barrier.read().unwrap_or_else(|e| e.into_inner());
        let members = array.members();
        let m = &members[slot];
        if !m.rebuilding(dev) {
            return Ok(());
        }
        let durable = m
            .crc
            .as_ref()
            .map_or(Ok(()), |crc| crc.persist(dev.as_ref(), &array.layout()))
            .and_then(|()| dev.flush());
        if let Err(e) = durable {
            drop(_barrier);
            array.fail_member(slot, dev, &format!("flush failed during rebuild: {e}"))?;
            return Err(e.into());
        }
    }
    array.write_superblocks(false)
}

/// The full chunks `slot` must hold in each of `stripes`, rebuilt from the other members: the
/// reads of all the stripes are in flight together.
fn rebuilt_chunks(
    array: &Array,
    members: &[crate::array::Member],
    slot: usize,
    stripes: &[u64],
    rows: u64,
) -> Result<Vec<AlignedBuf>, RaidError> {
    let g = array.geometry();
    match g.level {
        Level::Raid5 | Level::Raid6 => {
            let reads: Vec<_> = stripes
                .iter()
                .map(|&s| array.submit_stripe_read(members, s, 0, rows, Some(slot), true))
                .collect();
            let mut out = Vec::with_capacity(stripes.len());
            for read in reads {
                let index = g
                    .members(read.stripe)
                    .iter()
                    .position(|&d| d == slot)
                    .expect("every drive is a member of every stripe");
                let mut all = array.finish_stripe_read(members, read, true)?;
                out.push(all.swap_remove(index));
            }
            Ok(out)
        }
        Level::Raid1 | Level::Raid10 => {
            let index = if g.level == Level::Raid1 { 0 } else { slot / 2 };
            // One verified copy per stripe, all read at once; a copy that fails its checksum
            // sends that stripe through the block-by-block path over every copy.
            let reads: Vec<_> = stripes
                .iter()
                .map(|&s| {
                    let source = g
                        .data_drives(s, index)
                        .iter()
                        .find(|&d| d != slot && members[d].readable(s));
                    source.and_then(|d| {
                        let dev = members[d].dev.as_ref()?;
                        let op = stria_io::IoOp::Read {
                            offset: array.device_offset(s, 0),
                            len: (rows * BLOCK_BYTES as u64) as usize,
                        };
                        Some((d, dev.submit(op)))
                    })
                })
                .collect();
            let mut out = Vec::with_capacity(stripes.len());
            for (&s, read) in stripes.iter().zip(reads) {
                let verified = match read.map(|(d, t)| (d, t.wait())) {
                    Some((d, Ok(stria_io::IoDone::Read(data)))) => {
                        let crc = members[d].crc.as_ref();
                        let first = array.table_block(s, 0);
                        crc.is_some_and(|crc| {
                            data.chunks_exact(BLOCK_BYTES).enumerate().all(|(j, b)| {
                                crate::checksum::crc_block(b) == crc.get(first + j as u64)
                            })
                        })
                        .then_some(data)
                    }
                    Some((d, Err(e))) => {
                        array.read_failed(&members[d], d, &e);
                        None
                    }
                    _ => None,
                };
                match verified {
                    Some(data) => out.push(data),
                    None => out.push(AlignedBuf::from_slice(
                        &array.read_chunk_verified(members, s, index, 0, rows)?,
                    )),
                }
            }
            Ok(out)
        }
        Level::Raid0 => Err(RaidError::Refused("raid0 cannot rebuild".into())),
    }
}

/// After an unclean stop: replay the journal, then resync checksums and parity of every region
/// the write-intent bitmap marks, then flush.
pub(crate) fn recover_unclean(array: &Array) -> Result<(), RaidError> {
    let layout = array.layout();
    let g = array.geometry();
    let members = array.members();
    let uuid = array.uuid();
    let epoch = array.inner.journal_epoch.load(Relaxed);
    if g.level.is_parity() && layout.journal_bytes > 0 {
        let mut records: BTreeMap<u64, journal::Record> = BTreeMap::new();
        for m in members.iter().filter(|m| m.state == SlotState::Active) {
            let Some(dev) = m.dev.as_ref() else { continue };
            let mut ring = Vec::with_capacity(layout.journal_bytes as usize);
            let mut at = 0;
            while at < layout.journal_bytes {
                let len = (layout.journal_bytes - at).min(IO_BYTES_MAX as u64) as usize;
                ring.extend_from_slice(&dev.read_at(layout.journal_offset + at, len)?);
                at += len as u64;
            }
            for record in journal::scan(&ring, uuid, epoch) {
                records.entry(record.seq).or_insert(record);
            }
        }
        // A void record (no entries) says a full-stripe write replaced the stripe after the
        // records before it: those must not be replayed over the newer data.
        let mut voided_below: BTreeMap<u64, u64> = BTreeMap::new();
        for record in records.values().filter(|r| r.entries.is_empty()) {
            let seq = voided_below.entry(record.stripe).or_insert(0);
            *seq = (*seq).max(record.seq);
        }
        let mut replayed = 0u64;
        for record in records.values() {
            if record.entries.is_empty()
                || voided_below.get(&record.stripe).is_some_and(|&v| record.seq < v)
            {
                continue;
            }
            replayed += 1;
            let mut at = 0;
            for entry in &record.entries {
                let bytes = entry.rows as usize * BLOCK_BYTES;
                let part = &record.payload[at..at + bytes];
                at += bytes;
                let d = entry.drive as usize;
                if d >= members.len() || !members[d].writable() {
                    continue;
                }
                let (Some(dev), Some(crc)) = (members[d].dev.as_ref(), members[d].crc.as_ref())
                else {
                    continue;
                };
                if record.stripe >= g.stripes()
                    || entry.row as u64 + entry.rows as u64 > array.rows_per_chunk()
                {
                    tracing::warn!(seq = record.seq, "journal record outside the array; ignored");
                    continue;
                }
                dev.write_at(
                    array.device_offset(record.stripe, entry.row as u64),
                    AlignedBuf::from_slice(part),
                )?;
                crc.set_from_data(array.table_block(record.stripe, entry.row as u64), part);
            }
        }
        array.inner.counters.journal_replayed.fetch_add(replayed, Relaxed);
        if replayed > 0 {
            tracing::info!(records = replayed, "journal replayed after an unclean stop");
        }
        // The replayed rows and their checksums must be durable before the labels name a new
        // epoch: once they do, the records that could redo these writes are void. (Not a full
        // flush: that would clear the write-intent bits the resync below still needs.)
        array.persist_tables_and_flush()?;
        array.inner.journal_epoch.store(random_u64(), Relaxed);
        array.write_superblocks(false)?;
    }
    let regions = array.inner.bitmap.dirty_regions();
    let region_stripes = array.inner.bitmap.region_bytes() / g.unit();
    let rows = array.rows_per_chunk();
    for region in &regions {
        let first = region * region_stripes;
        for stripe in first..(first + region_stripes).min(g.stripes()) {
            resync_stripe(array, &members, stripe, rows)?;
        }
        array.inner.counters.resynced_regions.fetch_add(1, Relaxed);
    }
    if !regions.is_empty() {
        tracing::info!(regions = regions.len(), "resynced regions written before an unclean stop");
    }
    array.write_superblocks(false)?;
    array.flush()
}

/// Recomputes checksums from data for every readable member of `stripe`, then makes parity (or
/// the mirror copies) agree with the data.
fn resync_stripe(
    array: &Array,
    members: &[crate::array::Member],
    stripe: u64,
    rows: u64,
) -> Result<(), RaidError> {
    let g = array.geometry();
    let len = (rows as usize) * BLOCK_BYTES;
    let mut chunks: Vec<Option<AlignedBuf>> = Vec::with_capacity(g.drives);
    for m in members {
        let data = match (m.readable(stripe), m.dev.as_ref()) {
            (true, Some(dev)) => Some(dev.read_at(array.device_offset(stripe, 0), len)?),
            _ => None,
        };
        if let (Some(data), Some(crc)) = (&data, m.crc.as_ref()) {
            crc.set_from_data(array.table_block(stripe, 0), data);
        }
        chunks.push(data);
    }
    if g.level.is_parity() && chunks.iter().any(|c| c.is_none()) {
        return Ok(()); // degraded: parity cannot be recomputed without every data chunk
    }
    let write = |d: usize, data: &[u8]| -> Result<(), RaidError> {
        let m = &members[d];
        let (Some(dev), Some(crc)) = (m.dev.as_ref(), m.crc.as_ref()) else { return Ok(()) };
        dev.write_at(array.device_offset(stripe, 0), AlignedBuf::from_slice(data))?;
        crc.set_from_data(array.table_block(stripe, 0), data);
        Ok(())
    };
    match g.level {
        Level::Raid5 | Level::Raid6 => {
            let order = g.members(stripe);
            let k = g.data_chunks();
            let data: Vec<&[u8]> =
                order[..k].iter().map(|&d| &chunks[d].as_ref().expect("checked")[..]).collect();
            let mut p = vec![0u8; len];
            let mut q = vec![0u8; len];
            if g.level == Level::Raid6 {
                array.kernel().pq_gen(&data, &mut p, &mut q);
            } else {
                array.kernel().xor_gen(&data, &mut p);
            }
            if chunks[order[k]].as_deref() != Some(&p[..]) {
                write(order[k], &p)?;
            }
            if g.level == Level::Raid6 && chunks[order[k + 1]].as_deref() != Some(&q[..]) {
                write(order[k + 1], &q)?;
            }
        }
        Level::Raid1 | Level::Raid10 => {
            // The copies still here are made equal even while degraded: left apart, each with
            // a valid checksum, a read would change value when the drive it came from fails.
            for index in 0..g.data_chunks() {
                let copies: Vec<usize> =
                    g.data_drives(stripe, index).iter().filter(|&d| chunks[d].is_some()).collect();
                let Some((&source, others)) = copies.split_first() else { continue };
                let first = chunks[source].clone().expect("present");
                for &d in others {
                    if chunks[d].as_deref() != Some(&first[..]) {
                        write(d, &first)?;
                    }
                }
            }
        }
        Level::Raid0 => {}
    }
    Ok(())
}
