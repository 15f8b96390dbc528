//! Scrub and check: walk every stripe, verify every block's checksum and that parity (or the
//! mirror copies) agree with the data. Scrub repairs what it finds; check only reports and
//! writes nothing on any level.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use stria_io::AlignedBuf;
use stria_proto::BLOCK_BYTES;

use crate::RaidError;
use crate::array::Array;
use crate::geometry::Level;
use crate::rebuild::Pacer;

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScrubReport {
    pub stripes_checked: u64,
    pub bytes_checked: u64,
    /// Blocks whose contents did not match their CRC32C.
    pub checksum_errors: u64,
    /// Blocks rewritten from redundancy.
    pub repaired_blocks: u64,
    /// Stripes whose parity or mirror copies disagreed with the data.
    pub parity_mismatches: u64,
    pub unrecoverable_blocks: u64,
    pub stopped_early: bool,
}

impl ScrubReport {
    pub fn clean(&self) -> bool {
        self.checksum_errors == 0 && self.parity_mismatches == 0 && self.unrecoverable_blocks == 0
    }
}

impl Array {
    /// Walks the whole array. With `repair`, bad blocks are rewritten from redundancy and stale
    /// parity is recomputed from the data; without it nothing is written. `rate_bytes_s` limits
    /// the bytes read per second (None: as fast as the drives go). `progress(done, total)` is
    /// called after each stripe; setting `stop` ends the walk early with a partial report.
    pub fn scrub(
        &self,
        repair: bool,
        rate_bytes_s: Option<u64>,
        stop: &AtomicBool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ScrubReport, RaidError> {
        self.check_alive()?;
        let g = self.geometry();
        let rows = self.rows_per_chunk();
        let counters = &self.inner.counters;
        let before = (
            counters.checksum_errors.load(Relaxed),
            counters.repaired_blocks.load(Relaxed),
            counters.unrecoverable_blocks.load(Relaxed),
        );
        let mut report = ScrubReport::default();
        let mut pacer = Pacer::new();
        for stripe in 0..g.stripes() {
            if stop.load(Relaxed) {
                report.stopped_early = true;
                break;
            }
            {
                let _barrier = self.inner.barrier.read().unwrap_or_else(|e| e.into_inner());
                let _lock = self.lock_stripes(std::iter::once(stripe));
                let members = self.members();
                let mismatch = match g.level {
                    Level::Raid5 | Level::Raid6 => {
                        match self.check_parity_stripe(&members, stripe, repair)? {
                            Some(mismatch) => mismatch,
                            None => continue,
                        }
                    }
                    Level::Raid1 | Level::Raid10 => {
                        let mut mismatch = false;
                        for index in 0..g.data_chunks() {
                            mismatch |= self.scrub_mirror_chunk(&members, stripe, index, repair);
                        }
                        mismatch
                    }
                    Level::Raid0 => {
                        for d in 0..g.drives {
                            if let Some((bad, _)) =
                                self.read_rows_checked(&members, d, stripe, 0, rows)
                            {
                                counters
                                    .unrecoverable_blocks
                                    .fetch_add(bad.iter().filter(|b| **b).count() as u64, Relaxed);
                            }
                        }
                        false
                    }
                };
                report.parity_mismatches += mismatch as u64;
            }
            report.stripes_checked += 1;
            report.bytes_checked += g.unit() * g.drives as u64;
            progress(stripe + 1, g.stripes());
            if let Some(rate) = rate_bytes_s {
                pacer.pace(g.unit() * g.drives as u64, rate);
            }
        }
        report.checksum_errors = counters.checksum_errors.load(Relaxed) - before.0;
        report.repaired_blocks = counters.repaired_blocks.load(Relaxed) - before.1;
        report.unrecoverable_blocks = counters.unrecoverable_blocks.load(Relaxed) - before.2;
        if repair {
            self.flush()?;
        }
        Ok(report)
    }

    /// Whether the parity of `stripe` (RAID 5/6) disagrees with its data, reading every block
    /// checked against its checksum; with `repair`, bad blocks are rebuilt and parity that
    /// disagrees is rewritten from the data. None when the stripe cannot be read (counted as
    /// unrecoverable). The caller holds the barrier (shared) and the stripe's lock.
    pub(crate) fn check_parity_stripe(
        &self,
        members: &[crate::array::Member],
        stripe: u64,
        repair: bool,
    ) -> Result<Option<bool>, RaidError> {
        let g = self.geometry();
        let rows = self.rows_per_chunk();
        let all = match self.stripe_rows(members, stripe, 0, rows, None, repair) {
            Ok(all) => all,
            Err(RaidError::Unrecoverable { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let k = g.data_chunks();
        let mut fresh: Vec<AlignedBuf> = all[..k].to_vec();
        let len = rows as usize * BLOCK_BYTES;
        let sources: Vec<&[u8]> = fresh.iter().map(|c| &c[..]).collect();
        let mut p = AlignedBuf::zeroed(len);
        let mut q = AlignedBuf::zeroed(len);
        if g.level == Level::Raid6 {
            self.kernel().pq_gen(&sources, &mut p, &mut q);
        } else {
            self.kernel().xor_gen(&sources, &mut p);
        }
        fresh.push(p);
        if g.level == Level::Raid6 {
            fresh.push(q);
        }
        let order = g.members(stripe);
        let mut mismatch = false;
        for i in k..order.len() {
            if fresh[i] != all[i] {
                mismatch = true;
                if repair {
                    self.rewrite_chunk(&members[order[i]], stripe, &fresh[i]);
                }
            }
        }
        Ok(Some(mismatch))
    }

    /// Reads every copy of one data chunk once, counts the blocks that fail their checksums and
    /// the copies that disagree with the verified data; with `repair` it rewrites both, without
    /// it nothing is written. Returns whether verified copies disagreed.
    fn scrub_mirror_chunk(
        &self,
        members: &[crate::array::Member],
        stripe: u64,
        index: usize,
        repair: bool,
    ) -> bool {
        let g = self.geometry();
        let rows = self.rows_per_chunk() as usize;
        let copies: Vec<usize> = g.data_drives(stripe, index).iter().collect();
        let reads: Vec<_> = copies
            .iter()
            .map(|&d| self.read_rows_checked(members, d, stripe, 0, rows as u64))
            .collect();
        let mut good = vec![0u8; rows * BLOCK_BYTES];
        let mut known = vec![false; rows];
        for r in 0..rows {
            let range = r * BLOCK_BYTES..(r + 1) * BLOCK_BYTES;
            if let Some((_, data)) = reads.iter().flatten().find(|(bad, _)| !bad[r]) {
                good[range.clone()].copy_from_slice(&data[range]);
                known[r] = true;
            } else {
                self.inner.counters.unrecoverable_blocks.fetch_add(1, Relaxed);
            }
        }
        let mut mismatch = false;
        for (&d, read) in copies.iter().zip(&reads) {
            let Some((bad, data)) = read else { continue };
            let mut differs = false;
            for r in (0..rows).filter(|&r| known[r]) {
                let range = r * BLOCK_BYTES..(r + 1) * BLOCK_BYTES;
                if bad[r] {
                    if repair {
                        self.repair_block(&members[d], stripe, r as u64, &good[range]);
                    }
                } else if data[range.clone()] != good[range] {
                    differs = true;
                }
            }
            if differs {
                mismatch = true;
                if repair && known.iter().all(|&k| k) {
                    self.rewrite_chunk(&members[d], stripe, &good);
                }
            }
        }
        mismatch
    }

    fn rewrite_chunk(&self, m: &crate::array::Member, stripe: u64, data: &[u8]) {
        if let (Some(dev), Some(crc), true) = (m.dev.as_ref(), m.crc.as_ref(), m.writable()) {
            match dev.write_at(self.device_offset(stripe, 0), AlignedBuf::from_slice(data)) {
                Ok(()) => crc.set_from_data(self.table_block(stripe, 0), data),
                Err(e) => tracing::warn!("scrub repair write failed: {e}"),
            }
        }
    }
}
