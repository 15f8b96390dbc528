//! The read path: the fast path, batched reconstruction of stripes with a missing or bad
//! member, and the verified reads that every repair, rebuild and scrub goes through.
//!
//! A stripe that needs reconstruction is read as one unit: rows `[a, b)` of every member it
//! needs, submitted to all drives at once (and, in a degraded read, for all its stripes at once),
//! then checked against the checksum table and rebuilt with one parity kernel call per run of
//! rows that share the same set of missing members.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use stria_io::{AlignedBuf, IoDone, IoError, IoOp, IoTicket};
use stria_proto::BLOCK_BYTES;

use crate::RaidError;
use crate::array::{Array, BLOCK, Member};
use crate::checksum::crc_block;
use crate::geometry::{Level, Piece};

/// Most bytes of member reads a degraded read keeps in flight before it reconstructs them, so a
/// huge read of a degraded array does not hold its whole stripe set in memory at once.
const RECONSTRUCT_BATCH_BYTES: u64 = 64 * 1024 * 1024;

/// Rows `[a, b)` of the members of one parity stripe, read or being read.
pub(crate) struct StripeRead {
    pub stripe: u64,
    pub a: u64,
    pub b: u64,
    /// One per stripe position (data, P, Q): the read in flight, or None when the member is not
    /// read (unreadable, excluded, or skipped).
    tickets: Vec<Option<IoTicket>>,
    /// Positions that are readable but were not read because P alone suffices: Q on RAID 6 when
    /// at most one data member is missing. Read on demand if more turns out to be bad.
    skipped: Vec<bool>,
    /// Positions whose member cannot serve this stripe at all (or is the one being rebuilt).
    unavailable: Vec<bool>,
}

impl Array {
    /// Reads `buf.len()` bytes at array offset `offset` (both multiples of 4096). Every block is
    /// checked against its CRC32C; a bad or unreadable block is rebuilt from redundancy and
    /// rewritten in place, or the read fails. Wrong data is never returned.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RaidError> {
        self.read_into(offset, buf, None)
    }

    /// As [`Array::read`], and sets `crcs[k]` to the CRC32C of block `k` of `buf` (`crcs` holds
    /// one entry per 4 KiB block). The array checks every block it returns against its
    /// checksum table, so a caller that keeps its own checksums of these blocks can compare
    /// them with these instead of checksumming the bytes again.
    pub fn read_with_crcs(
        &self,
        offset: u64,
        buf: &mut [u8],
        crcs: &mut [u32],
    ) -> Result<(), RaidError> {
        assert_eq!(crcs.len(), buf.len() / BLOCK_BYTES, "one CRC per block of the buffer");
        self.read_into(offset, buf, Some(crcs))
    }

    fn read_into(
        &self,
        offset: u64,
        buf: &mut [u8],
        mut crcs: Option<&mut [u32]>,
    ) -> Result<(), RaidError> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.check_alive()?;
        self.inner.foreground_ops.fetch_add(1, Relaxed);
        let g = self.inner.geometry;
        let _barrier = self.inner.barrier.read().unwrap_or_else(|e| e.into_inner());
        let pieces: Vec<Piece> = g.split(offset, buf.len() as u64).collect();
        let _locks = self.lock_stripes_shared(pieces.iter().map(|p| p.stripe));
        let members = self.members();
        let out_range = |p: &Piece| {
            (p.array_offset - offset) as usize..(p.array_offset - offset + p.len) as usize
        };
        // Parity stripes with a piece no member can serve are reconstructed whole: each
        // surviving member's rows are read once for all the pieces of the stripe.
        let mut degraded: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        if g.level.is_parity() {
            for p in &pieces {
                if !g.data_drives(p.stripe, p.index).iter().any(|d| members[d].readable(p.stripe)) {
                    degraded.insert(p.stripe, (u64::MAX, 0));
                }
            }
            for p in &pieces {
                if let Some((a, b)) = degraded.get_mut(&p.stripe) {
                    *a = (*a).min(p.offset_in_chunk / BLOCK);
                    *b = (*b).max((p.offset_in_chunk + p.len) / BLOCK);
                }
            }
        }
        // Fast path: read each other piece from one good copy, all drives at once.
        let mut tickets = Vec::with_capacity(pieces.len());
        for (i, p) in pieces.iter().enumerate() {
            if degraded.contains_key(&p.stripe) {
                continue;
            }
            let drive =
                g.data_drives(p.stripe, p.index).iter().find(|&d| members[d].readable(p.stripe));
            let ticket = drive.and_then(|d| {
                let dev = members[d].dev.as_ref()?;
                let dev_offset = self.device_offset(p.stripe, p.offset_in_chunk / BLOCK);
                Some((d, dev.submit(IoOp::Read { offset: dev_offset, len: p.len as usize })))
            });
            tickets.push((i, ticket));
        }
        let degraded: Vec<(u64, u64, u64)> =
            degraded.into_iter().map(|(s, (a, b))| (s, a, b)).collect();
        let mut rebuilt = self.reconstruct_stripes(&members, &degraded)?;
        let mut slow = Vec::new();
        for (i, ticket) in tickets {
            let p = &pieces[i];
            let good = match ticket.map(|(d, t)| (d, t.wait())) {
                Some((d, Ok(IoDone::Read(data)))) => {
                    let first = self.table_block(p.stripe, p.offset_in_chunk / BLOCK);
                    let crc = members[d].crc.as_ref().expect("readable members have tables");
                    let range = out_range(p);
                    let mut piece_crcs =
                        crcs.as_deref_mut().map(|c| &mut c[range.start / BLOCK_BYTES..]);
                    let ok = data.chunks_exact(BLOCK_BYTES).enumerate().all(|(j, b)| {
                        let actual = crc_block(b);
                        if let Some(out) = piece_crcs.as_deref_mut() {
                            out[j] = actual;
                        }
                        actual == crc.get(first + j as u64)
                    });
                    if ok {
                        buf[range].copy_from_slice(&data);
                    }
                    ok
                }
                Some((d, Err(e))) => {
                    self.read_failed(&members[d], d, &e);
                    false
                }
                _ => false,
            };
            if !good {
                slow.push(i);
            }
        }
        // Pieces that failed their checksum or their read: whole stripes through the parity
        // math (batched like the degraded stripes), or every mirror copy.
        if g.level.is_parity() && !slow.is_empty() {
            let mut again: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            for &i in &slow {
                let p = &pieces[i];
                let (a, b) = (p.offset_in_chunk / BLOCK, (p.offset_in_chunk + p.len) / BLOCK);
                let e = again.entry(p.stripe).or_insert((a, b));
                *e = (e.0.min(a), e.1.max(b));
            }
            let again: Vec<(u64, u64, u64)> =
                again.into_iter().map(|(s, (a, b))| (s, a, b)).collect();
            rebuilt.extend(self.reconstruct_stripes(&members, &again)?);
            for &i in &slow {
                let p = &pieces[i];
                let read = rebuilt.get(&p.stripe).expect("every slow stripe was reconstructed");
                copy_piece(p, read, &mut buf[out_range(p)]);
            }
        } else {
            for &i in &slow {
                let p = pieces[i];
                let row = p.offset_in_chunk / BLOCK;
                let data =
                    self.read_chunk_verified(&members, p.stripe, p.index, row, p.len / BLOCK)?;
                buf[out_range(&p)].copy_from_slice(&data);
            }
        }
        for p in pieces.iter().filter(|p| degraded_contains(&degraded, p.stripe)) {
            let read = rebuilt.get(&p.stripe).expect("every degraded stripe was reconstructed");
            copy_piece(p, read, &mut buf[out_range(p)]);
        }
        // What was reconstructed or read again was checked member by member; its own CRCs are
        // computed here (rare: degraded stripes and repairs).
        if let Some(crcs) = crcs {
            let again = pieces
                .iter()
                .enumerate()
                .filter(|(i, p)| slow.contains(i) || degraded_contains(&degraded, p.stripe));
            for (_, p) in again {
                let range = out_range(p);
                let at = range.start / BLOCK_BYTES;
                for (j, b) in buf[range].chunks_exact(BLOCK_BYTES).enumerate() {
                    crcs[at + j] = crc_block(b);
                }
            }
        }
        Ok(())
    }

    /// Reads and reconstructs rows `[a, b)` of each `(stripe, a, b)`: the member reads of many
    /// stripes are in flight together, in batches of at most [`RECONSTRUCT_BATCH_BYTES`]. Returns
    /// each stripe's first row and its members' rows (data first).
    fn reconstruct_stripes(
        &self,
        members: &[Member],
        stripes: &[(u64, u64, u64)],
    ) -> Result<BTreeMap<u64, (u64, Vec<AlignedBuf>)>, RaidError> {
        let drives = self.inner.geometry.drives as u64;
        let mut out = BTreeMap::new();
        let mut at = 0;
        while at < stripes.len() {
            let mut batch = Vec::new();
            let mut bytes = 0;
            while at < stripes.len() && (batch.is_empty() || bytes < RECONSTRUCT_BATCH_BYTES) {
                let (stripe, a, b) = stripes[at];
                bytes += (b - a) * BLOCK * drives;
                batch.push(self.submit_stripe_read(members, stripe, a, b, None, true));
                at += 1;
            }
            for read in batch {
                let (stripe, a) = (read.stripe, read.a);
                self.inner.counters.degraded_reads.fetch_add(1, Relaxed);
                out.insert(stripe, (a, self.finish_stripe_read(members, read, true)?));
            }
        }
        Ok(out)
    }

    /// Submits the reads of rows `[a, b)` of `stripe`'s members, except `exclude` and those that
    /// cannot serve the stripe. With `lean` (the caller needs only data rows), RAID 6 leaves Q
    /// unread while P and all but one data member can be read.
    pub(crate) fn submit_stripe_read(
        &self,
        members: &[Member],
        stripe: u64,
        a: u64,
        b: u64,
        exclude: Option<usize>,
        lean: bool,
    ) -> StripeRead {
        let g = self.inner.geometry;
        let order = g.members(stripe);
        let k = g.data_chunks();
        let unavailable: Vec<bool> =
            order.iter().map(|&d| Some(d) == exclude || !members[d].readable(stripe)).collect();
        let mut skipped = vec![false; order.len()];
        if lean
            && g.level == Level::Raid6
            && !unavailable[k]
            && !unavailable[k + 1]
            && unavailable[..k].iter().filter(|&&u| u).count() <= 1
        {
            skipped[k + 1] = true;
        }
        let tickets = order
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if unavailable[i] || skipped[i] {
                    return None;
                }
                let dev = members[d].dev.as_ref()?;
                Some(dev.submit(IoOp::Read {
                    offset: self.device_offset(stripe, a),
                    len: ((b - a) * BLOCK) as usize,
                }))
            })
            .collect();
        StripeRead { stripe, a, b, tickets, skipped, unavailable }
    }

    /// Waits for a stripe read, checks every block read against its checksum and rebuilds the
    /// missing and bad rows from the others. With `repair`, rebuilt blocks of readable members
    /// are rewritten. Skipped positions come back zeroed unless they had to be read.
    pub(crate) fn finish_stripe_read(
        &self,
        members: &[Member],
        read: StripeRead,
        repair: bool,
    ) -> Result<Vec<AlignedBuf>, RaidError> {
        let g = self.inner.geometry;
        let StripeRead { stripe, a, b, tickets, mut skipped, mut unavailable } = read;
        let order = g.members(stripe);
        let rows = (b - a) as usize;
        let mut bufs = Vec::with_capacity(order.len());
        let mut bad: Vec<Vec<bool>> = Vec::with_capacity(order.len());
        for (i, ticket) in tickets.into_iter().enumerate() {
            let d = order[i];
            let data = match ticket.map(|t| t.wait()) {
                Some(Ok(IoDone::Read(data))) => Some(data),
                Some(Err(e)) => {
                    // A drive that cannot read is taken out of service rather than retried on
                    // every request; the data comes from redundancy.
                    self.read_failed(&members[d], d, &e);
                    unavailable[i] = true;
                    None
                }
                _ => None,
            };
            match data {
                Some(data) => {
                    bad.push(self.check_rows(&members[d], stripe, a, &data));
                    bufs.push(data);
                }
                None => {
                    bad.push(vec![true; rows]);
                    bufs.push(AlignedBuf::zeroed(rows * BLOCK_BYTES));
                }
            }
        }
        let parity = g.level.parity_chunks();
        let k = g.data_chunks();
        // A skipped member is needed as soon as P alone cannot rebuild some row.
        let needs_skipped = (0..rows).any(|r| {
            let missing: Vec<usize> =
                (0..order.len()).filter(|&i| bad[i][r] && !skipped[i]).collect();
            missing.len() > 1 || missing.contains(&k)
        });
        if needs_skipped {
            for i in 0..order.len() {
                if !skipped[i] {
                    continue;
                }
                skipped[i] = false;
                match self.read_rows_checked(members, order[i], stripe, a, b - a) {
                    Some((flags, data)) => {
                        bad[i] = flags;
                        bufs[i] = data;
                    }
                    None => unavailable[i] = true,
                }
            }
        }
        let mut r = 0;
        while r < rows {
            let (bad_ref, skipped_ref) = (&bad, &skipped);
            let missing_at =
                |row: usize| (0..order.len()).filter(move |&i| bad_ref[i][row] && !skipped_ref[i]);
            let missing: Vec<usize> = missing_at(r).collect();
            let mut end = r + 1;
            while end < rows && missing_at(end).eq(missing.iter().copied()) {
                end += 1;
            }
            if !missing.is_empty() {
                if missing.len() > parity {
                    self.inner.counters.unrecoverable_blocks.fetch_add(1, Relaxed);
                    return Err(RaidError::Unrecoverable {
                        offset: stripe * g.stripe_data_bytes(),
                        reason: format!(
                            "{} members of stripe {stripe} are unreadable or fail their checksums at row {}, {} tolerates {parity}",
                            missing.len(),
                            a + r as u64,
                            g.level
                        ),
                    });
                }
                let range = r * BLOCK_BYTES..end * BLOCK_BYTES;
                let mut slices: Vec<&mut [u8]> =
                    bufs.iter_mut().map(|b| &mut b[range.clone()]).collect();
                if skipped.iter().any(|&s| s) {
                    // One data member missing and Q unread: it is the XOR of P and the others.
                    let target = missing[0];
                    let mut dest = None;
                    let mut sources: Vec<&[u8]> = Vec::with_capacity(k);
                    for (i, slice) in slices.into_iter().enumerate().take(k + 1) {
                        if i == target {
                            dest = Some(slice);
                        } else {
                            let slice: &[u8] = slice;
                            sources.push(slice);
                        }
                    }
                    let dest = dest.expect("the target is a data position");
                    self.inner.kernel.xor_gen(&sources, dest);
                } else {
                    self.inner.kernel.reconstruct(&mut slices, k, &missing).map_err(|e| {
                        RaidError::Unrecoverable {
                            offset: stripe * g.stripe_data_bytes(),
                            reason: e.to_string(),
                        }
                    })?;
                }
                if repair {
                    for &i in missing.iter().filter(|&&i| !unavailable[i]) {
                        for row in r..end {
                            let block = &bufs[i][row * BLOCK_BYTES..(row + 1) * BLOCK_BYTES];
                            self.repair_block(&members[order[i]], stripe, a + row as u64, block);
                        }
                    }
                }
            }
            r = end;
        }
        Ok(bufs)
    }

    /// Per-row "fails its checksum" flags for rows read from `m` starting at `row`.
    fn check_rows(&self, m: &Member, stripe: u64, row: u64, data: &[u8]) -> Vec<bool> {
        let Some(crc) = m.crc.as_ref() else { return vec![true; data.len() / BLOCK_BYTES] };
        let first = self.table_block(stripe, row);
        let bad: Vec<bool> = data
            .chunks_exact(BLOCK_BYTES)
            .enumerate()
            .map(|(j, b)| crc_block(b) != crc.get(first + j as u64))
            .collect();
        let errors = bad.iter().filter(|&&b| b).count() as u64;
        if errors > 0 {
            self.inner.counters.checksum_errors.fetch_add(errors, Relaxed);
            tracing::warn!(
                drive = m.dev.as_ref().map(|d| d.name()).unwrap_or("?"),
                stripe,
                row,
                errors,
                "checksum mismatch; repairing from redundancy"
            );
        }
        bad
    }

    /// For parity levels: rows `[a, b)` of every member of `stripe` (data first, then P, Q),
    /// correct: blocks that are unreadable, fail their checksum, or belong to `exclude` are
    /// rebuilt from the others. With `repair`, rebuilt blocks of readable members are rewritten.
    pub(crate) fn stripe_rows(
        &self,
        members: &[Member],
        stripe: u64,
        a: u64,
        b: u64,
        exclude: Option<usize>,
        repair: bool,
    ) -> Result<Vec<AlignedBuf>, RaidError> {
        let read = self.submit_stripe_read(members, stripe, a, b, exclude, false);
        self.finish_stripe_read(members, read, repair)
    }

    /// Reads rows of one data chunk through redundancy: every copy or the parity math, repairing
    /// bad blocks it finds. The caller holds the stripe lock.
    pub(crate) fn read_chunk_verified(
        &self,
        members: &[Member],
        stripe: u64,
        index: usize,
        row: u64,
        rows: u64,
    ) -> Result<Vec<u8>, RaidError> {
        let g = self.inner.geometry;
        self.inner.counters.degraded_reads.fetch_add(1, Relaxed);
        if g.level.is_parity() {
            let all = self.stripe_rows(members, stripe, row, row + rows, None, true)?;
            return Ok(all[index].to_vec());
        }
        // Mirrors (and RAID 0, which has a single copy): assemble block by block from whichever
        // copy verifies, then repair the copies that did not.
        let copies: Vec<usize> = g.data_drives(stripe, index).iter().collect();
        let mut reads: Vec<Option<(Vec<bool>, AlignedBuf)>> = Vec::new();
        for &d in &copies {
            reads.push(self.read_rows_checked(members, d, stripe, row, rows));
        }
        let mut out = vec![0u8; (rows * BLOCK) as usize];
        for r in 0..rows as usize {
            let range = r * BLOCK_BYTES..(r + 1) * BLOCK_BYTES;
            let good = reads.iter().flatten().find(|(bad, _)| !bad[r]);
            let Some((_, data)) = good else {
                self.inner.counters.unrecoverable_blocks.fetch_add(1, Relaxed);
                return Err(RaidError::Unrecoverable {
                    offset: stripe * g.stripe_data_bytes()
                        + index as u64 * g.unit()
                        + (row + r as u64) * BLOCK,
                    reason: format!(
                        "no copy of this block passes its checksum ({} copies)",
                        copies.len()
                    ),
                });
            };
            out[range.clone()].copy_from_slice(&data[range.clone()]);
            for (c, read) in copies.iter().zip(&reads) {
                if let Some((bad, _)) = read
                    && bad[r]
                {
                    self.repair_block(&members[*c], stripe, row + r as u64, &out[range.clone()]);
                }
            }
        }
        Ok(out)
    }

    /// Reads rows of one member's chunk and checks each block: returns per-row "bad" flags and
    /// the data, or None if the member cannot be read at this stripe at all.
    pub(crate) fn read_rows_checked(
        &self,
        members: &[Member],
        slot: usize,
        stripe: u64,
        row: u64,
        rows: u64,
    ) -> Option<(Vec<bool>, AlignedBuf)> {
        let m = &members[slot];
        if !m.readable(stripe) {
            return None;
        }
        let dev = m.dev.as_ref()?;
        m.crc.as_ref()?;
        match dev.read_at(self.device_offset(stripe, row), (rows * BLOCK) as usize) {
            Ok(data) => Some((self.check_rows(m, stripe, row, &data), data)),
            Err(e) => {
                // A drive that cannot read is taken out of service (the array goes degraded)
                // rather than retried on every request; the data comes from redundancy.
                self.read_failed(m, slot, &e);
                Some((vec![true; rows as usize], AlignedBuf::zeroed((rows * BLOCK) as usize)))
            }
        }
    }

    /// A read of member `m` (in `slot`) failed: the drive is taken out, unless it already was.
    pub(crate) fn read_failed(&self, m: &Member, slot: usize, e: &IoError) {
        if self.inner.geometry.level == Level::Raid0 {
            tracing::error!("{e}");
            return;
        }
        let Some(dev) = m.dev.as_ref() else { return };
        if let Err(fail) = self.fail_member(slot, dev, &format!("read failed: {e}")) {
            tracing::error!("{fail}");
        }
    }

    /// Rewrites one block that failed its checksum with the value rebuilt from redundancy.
    pub(crate) fn repair_block(&self, m: &Member, stripe: u64, row: u64, data: &[u8]) {
        let (Some(dev), Some(crc)) = (m.dev.as_ref(), m.crc.as_ref()) else { return };
        if !m.writable() {
            return;
        }
        match dev.write_at(self.device_offset(stripe, row), AlignedBuf::from_slice(data)) {
            Ok(()) => {
                crc.set(self.table_block(stripe, row), crc_block(data));
                self.inner.counters.repaired_blocks.fetch_add(1, Relaxed);
            }
            Err(e) => tracing::warn!("repair write failed: {e}"),
        }
    }
}

fn degraded_contains(degraded: &[(u64, u64, u64)], stripe: u64) -> bool {
    degraded.binary_search_by_key(&stripe, |&(s, _, _)| s).is_ok()
}

/// Copies piece `p` out of a reconstructed stripe (`first` row, members' rows).
fn copy_piece(p: &Piece, (first, rows): &(u64, Vec<AlignedBuf>), out: &mut [u8]) {
    let at = (p.offset_in_chunk - first * BLOCK) as usize;
    out.copy_from_slice(&rows[p.index][at..at + p.len as usize]);
}
