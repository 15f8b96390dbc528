//! The write path: mirror and stripe writes, full-stripe parity, reconstruct-write journaled
//! against the write hole, the write-intent bitmap.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;

use stria_io::{AlignedBuf, IoError, IoOp, IoTicket};
use stria_proto::BLOCK_BYTES;

use crate::RaidError;
use crate::array::{Array, BLOCK, Member, wait_all};
use crate::checksum::crc_block;
use crate::geometry::Piece;
use crate::journal::{self, Entry};

/// The bytes of a write's buffer (starting at array offset `offset`) that fall in `p`.
fn piece_bytes<'a>(data: &'a [u8], offset: u64, p: &Piece) -> &'a [u8] {
    let start = (p.array_offset - offset) as usize;
    &data[start..start + p.len as usize]
}

impl Array {
    // ----------------------------------------------------------------------------------------
    // Writes
    // ----------------------------------------------------------------------------------------

    /// Writes `data` at array offset `offset` (both multiples of 4096). Returns once every
    /// surviving copy is written (not yet flushed: call [`Array::flush`] for durability). A drive
    /// whose write fails is marked failed; the write still succeeds while redundancy remains.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), RaidError> {
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        self.check_alive()?;
        self.inner.foreground_ops.fetch_add(1, Relaxed);
        let g = self.inner.geometry;
        loop {
            let _barrier = self.inner.barrier.read().unwrap_or_else(|e| e.into_inner());
            let pieces: Vec<Piece> = g.split(offset, data.len() as u64).collect();
            let stripes: BTreeSet<u64> = pieces.iter().map(|p| p.stripe).collect();
            self.mark_intent(stripes.iter().copied())?;
            let _locks = self.lock_stripes(stripes.iter().copied());
            let members = self.members();
            let mut tickets = Vec::new();
            let mut crc_updates = Vec::new();
            let mut journal_full = false;
            for &stripe in &stripes {
                let in_stripe: Vec<&Piece> = pieces.iter().filter(|p| p.stripe == stripe).collect();
                let bytes_of = |p: &Piece| piece_bytes(data, offset, p);
                if g.level.is_parity() {
                    let planned = self.write_parity_stripe(
                        &members,
                        stripe,
                        &in_stripe,
                        data,
                        offset,
                        &mut tickets,
                        &mut crc_updates,
                    );
                    let planned = match planned {
                        Ok(planned) => planned,
                        Err(e) => {
                            // The stripes before this one are on their way to the drives: their
                            // checksums must follow them, or blocks nobody wrote would fail
                            // their checks. The write still fails.
                            let _ = self.finish_writes(&members, tickets, crc_updates);
                            return Err(e);
                        }
                    };
                    if !planned {
                        journal_full = true;
                        break;
                    }
                } else {
                    for p in in_stripe {
                        for d in g.data_drives(stripe, p.index).iter() {
                            if members[d].writable() {
                                // Each drive's write owns its buffer until it completes.
                                self.push_write(
                                    &members,
                                    d,
                                    stripe,
                                    p.offset_in_chunk / BLOCK,
                                    AlignedBuf::from_slice(bytes_of(p)),
                                    &mut tickets,
                                    &mut crc_updates,
                                );
                            }
                        }
                    }
                }
            }
            // Writes already submitted complete (and get their checksums) even when the
            // journal filled up part way: the retry after the checkpoint reads those stripes.
            self.finish_writes(&members, tickets, crc_updates)?;
            if journal_full {
                drop(_locks);
                drop(_barrier);
                self.flush()?;
                continue;
            }
            return Ok(());
        }
    }

    /// Writes blocks `[from, to)` of `stripe` (4 KiB blocks counted from the start of the
    /// stripe's data, in array order), where `image` (`stripe_data_bytes` long) is the stripe's
    /// whole data content after the write. Parity is computed from `image` over the rows the
    /// blocks touch, so nothing is read and no journal record is written.
    ///
    /// This is for one caller, the chunk engine's open stripe, which keeps two promises: the
    /// drives already hold `image` outside `[from, to)` (the stripe's first write was a
    /// full-stripe write of the image, and every later block came through here), and no other
    /// block of the stripe holds data that must survive a crash (the stripe is closed before
    /// any of its blocks is made durable). A crash during this write may tear the parity of the
    /// touched rows, which only blocks of the open stripe can suffer from. Levels without
    /// parity take a plain write.
    pub fn write_in_open_stripe(
        &self,
        stripe: u64,
        image: &[u8],
        from: u64,
        to: u64,
    ) -> Result<(), RaidError> {
        let g = self.inner.geometry;
        let stripe_bytes = g.stripe_data_bytes();
        let offset = stripe * stripe_bytes + from * BLOCK;
        let len = to.saturating_sub(from) * BLOCK;
        if image.len() as u64 != stripe_bytes || to * BLOCK > stripe_bytes {
            return Err(RaidError::Unrecoverable {
                offset,
                reason: format!(
                    "open-stripe write of blocks {from}..{to} with a {} byte image; the stripe \
                     holds {stripe_bytes} bytes",
                    image.len()
                ),
            });
        }
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if !g.level.is_parity() {
            return self.write(offset, &image[(from * BLOCK) as usize..(to * BLOCK) as usize]);
        }
        self.check_alive()?;
        self.inner.foreground_ops.fetch_add(1, Relaxed);
        loop {
            let _barrier = self.inner.barrier.read().unwrap_or_else(|e| e.into_inner());
            self.mark_intent(std::iter::once(stripe))?;
            let _locks = self.lock_stripes(std::iter::once(stripe));
            let members = self.members();
            // As for a full-stripe write: an older partial-stripe record of this stripe must not
            // be replayed over the new contents.
            if self.stripe_journaled(stripe) {
                if !self.journal(&members, stripe, &[])? {
                    drop(_locks);
                    drop(_barrier);
                    self.flush()?;
                    continue;
                }
                self.forget_journaled(stripe);
            }
            let unit = g.unit() as usize;
            let k = g.data_chunks();
            let drives = g.members(stripe);
            let pieces: Vec<Piece> = g.split(offset, len).collect();
            let a = pieces.iter().map(|p| p.offset_in_chunk / BLOCK).min().expect("non-empty");
            let b = pieces
                .iter()
                .map(|p| (p.offset_in_chunk + p.len) / BLOCK)
                .max()
                .expect("non-empty");
            let (lo, hi) = ((a * BLOCK) as usize, (b * BLOCK) as usize);
            let mut rows: Vec<AlignedBuf> = Vec::new();
            let sources: Vec<&[u8]> =
                (0..k).map(|i| &image[i * unit + lo..i * unit + hi]).collect();
            let mut p = AlignedBuf::zeroed(hi - lo);
            if g.level.parity_chunks() == 2 {
                let mut q = AlignedBuf::zeroed(hi - lo);
                self.inner.kernel.pq_gen(&sources, &mut p, &mut q);
                rows.push(p);
                rows.push(q);
            } else {
                self.inner.kernel.xor_gen(&sources, &mut p);
                rows.push(p);
            }
            let mut tickets = Vec::new();
            let mut crc_updates = Vec::new();
            for piece in &pieces {
                let d = drives[piece.index];
                if members[d].writable() {
                    let at = piece.index * unit + piece.offset_in_chunk as usize;
                    let buf = AlignedBuf::from_slice(&image[at..at + piece.len as usize]);
                    let row = piece.offset_in_chunk / BLOCK;
                    self.push_write(&members, d, stripe, row, buf, &mut tickets, &mut crc_updates);
                }
            }
            for (i, buf) in rows.into_iter().enumerate() {
                let d = drives[k + i];
                if members[d].writable() {
                    self.push_write(&members, d, stripe, a, buf, &mut tickets, &mut crc_updates);
                }
            }
            return self.finish_writes(&members, tickets, crc_updates);
        }
    }

    /// Waits for submitted drive writes, records the checksums of those that landed, and fails
    /// the drives whose writes did not.
    fn finish_writes(
        &self,
        members: &[Member],
        tickets: Vec<(usize, IoTicket)>,
        crc_updates: Vec<(usize, u64, u32)>,
    ) -> Result<(), RaidError> {
        let failures = wait_all(tickets);
        let failed_drives: BTreeSet<usize> = failures.iter().map(|(d, _)| *d).collect();
        for (d, table_block, crc) in crc_updates {
            if !failed_drives.contains(&d)
                && let Some(t) = members[d].crc.as_ref()
            {
                t.set(table_block, crc);
            }
        }
        self.handle_write_failures(members, failures)
    }

    /// Makes a range read as zeros. Redundancy and checksums are kept as for any write.
    pub fn trim(&self, offset: u64, len: u64) -> Result<(), RaidError> {
        self.check_range(offset, len)?;
        let step = self.inner.geometry.stripe_data_bytes().max(1 << 20);
        let zeros = vec![0u8; step.min(len.max(1)) as usize];
        let mut at = offset;
        while at < offset + len {
            let n = step.min(offset + len - at);
            self.write(at, &zeros[..n as usize])?;
            at += n;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_write(
        &self,
        members: &[Member],
        d: usize,
        stripe: u64,
        row: u64,
        buf: AlignedBuf,
        tickets: &mut Vec<(usize, IoTicket)>,
        crc_updates: &mut Vec<(usize, u64, u32)>,
    ) {
        let Some(dev) = members[d].dev.as_ref() else { return };
        let first = self.table_block(stripe, row);
        for (j, block) in buf.chunks_exact(BLOCK_BYTES).enumerate() {
            crc_updates.push((d, first + j as u64, crc_block(block)));
        }
        let offset = self.device_offset(stripe, row);
        tickets.push((d, dev.submit(IoOp::Write { offset, data: buf, fua: false })));
    }

    /// Submits every drive write for one stripe of a parity array, journaling partial-stripe
    /// writes first. Returns false when the journal is full (the caller checkpoints and retries).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_parity_stripe(
        &self,
        members: &[Member],
        stripe: u64,
        pieces: &[&Piece],
        data: &[u8],
        offset: u64,
        tickets: &mut Vec<(usize, IoTicket)>,
        crc_updates: &mut Vec<(usize, u64, u32)>,
    ) -> Result<bool, RaidError> {
        let bytes_of = |p: &Piece| piece_bytes(data, offset, p);
        let g = self.inner.geometry;
        let unit = g.unit();
        let k = g.data_chunks();
        let drives = g.members(stripe);
        let full = pieces.len() == k && pieces.iter().all(|p| p.len == unit);
        if full {
            // An older partial-stripe record of this stripe in the current epoch would, if
            // replayed after a crash, put its rows back over this newer data; a void record
            // (no entries, later sequence number) tells replay to skip it.
            if self.stripe_journaled(stripe) {
                if !self.journal(members, stripe, &[])? {
                    return Ok(false);
                }
                self.forget_journaled(stripe);
            }
            // Data first, straight from the caller's buffer, so the drives are busy while the
            // parity is computed (from the same buffer: no second copy).
            let sources: Vec<&[u8]> = pieces.iter().map(|p| bytes_of(p)).collect();
            for (i, src) in sources.iter().enumerate() {
                if members[drives[i]].writable() {
                    let buf = AlignedBuf::from_slice(src);
                    self.push_write(members, drives[i], stripe, 0, buf, tickets, crc_updates);
                }
            }
            let mut p = AlignedBuf::zeroed(unit as usize);
            if g.level.parity_chunks() == 2 {
                let mut q = AlignedBuf::zeroed(unit as usize);
                self.inner.kernel.pq_gen(&sources, &mut p, &mut q);
                if members[drives[k + 1]].writable() {
                    self.push_write(members, drives[k + 1], stripe, 0, q, tickets, crc_updates);
                }
            } else {
                self.inner.kernel.xor_gen(&sources, &mut p);
            }
            if members[drives[k]].writable() {
                self.push_write(members, drives[k], stripe, 0, p, tickets, crc_updates);
            }
            return Ok(true);
        }
        // Partial stripe: reconstruct-write over the touched rows. Reading through
        // `stripe_rows` verifies (and if needed rebuilds) every block the new parity depends on.
        let a = pieces.iter().map(|p| p.offset_in_chunk / BLOCK).min().expect("non-empty");
        let b =
            pieces.iter().map(|p| (p.offset_in_chunk + p.len) / BLOCK).max().expect("non-empty");
        let mut rows = self.stripe_rows(members, stripe, a, b, None, true)?;
        rows.truncate(k);
        for p in pieces {
            let at = (p.offset_in_chunk - a * BLOCK) as usize;
            rows[p.index][at..at + p.len as usize].copy_from_slice(bytes_of(p));
        }
        self.append_parity(&mut rows, 0, ((b - a) * BLOCK) as usize);
        let mut writes: Vec<(usize, u64, AlignedBuf)> = Vec::new();
        for p in pieces {
            if members[drives[p.index]].writable() {
                let at = (p.offset_in_chunk - a * BLOCK) as usize;
                writes.push((
                    drives[p.index],
                    p.offset_in_chunk / BLOCK,
                    AlignedBuf::from_slice(&rows[p.index][at..at + p.len as usize]),
                ));
            }
        }
        for (i, buf) in rows.into_iter().enumerate().skip(k) {
            if members[drives[i]].writable() {
                writes.push((drives[i], a, buf));
            }
        }
        if !self.journal(members, stripe, &writes)? {
            return Ok(false);
        }
        for (d, row, buf) in writes {
            self.push_write(members, d, stripe, row, buf, tickets, crc_updates);
        }
        Ok(true)
    }

    /// Appends P (and Q) computed over `chunks[..k]` bytes `[from, from + len)`.
    pub(crate) fn append_parity(&self, chunks: &mut Vec<AlignedBuf>, from: usize, len: usize) {
        let parity = self.inner.geometry.level.parity_chunks();
        let mut p = AlignedBuf::zeroed(len);
        let sources: Vec<&[u8]> = chunks.iter().map(|c| &c[from..from + len]).collect();
        if parity == 2 {
            let mut q = AlignedBuf::zeroed(len);
            self.inner.kernel.pq_gen(&sources, &mut p, &mut q);
            chunks.push(p);
            chunks.push(q);
        } else {
            self.inner.kernel.xor_gen(&sources, &mut p);
            chunks.push(p);
        }
    }

    /// Writes one journal record for a partial-stripe update to `parity + 1` members, with FUA.
    /// With no writes it is a void record: replay skips every earlier record of the stripe.
    /// Returns false if a ring is full.
    pub(crate) fn journal(
        &self,
        members: &[Member],
        stripe: u64,
        writes: &[(usize, u64, AlignedBuf)],
    ) -> Result<bool, RaidError> {
        let g = self.inner.geometry;
        let layout = &self.inner.layout;
        let entries: Vec<Entry> = writes
            .iter()
            .map(|(d, row, buf)| Entry {
                drive: *d as u16,
                row: *row as u32,
                rows: (buf.len() / BLOCK_BYTES) as u32,
            })
            .collect();
        let payload: Vec<&[u8]> = writes.iter().map(|(_, _, buf)| &buf[..]).collect();
        let seq = self.inner.journal_seq.fetch_add(1, Relaxed);
        let record = journal::encode(
            self.inner.uuid,
            self.inner.journal_epoch.load(Relaxed),
            seq,
            stripe,
            &entries,
            &payload,
        );
        let copies = g.level.parity_chunks() + 1;
        let targets: Vec<usize> = (0..g.drives)
            .map(|i| (stripe as usize + i) % g.drives)
            .filter(|&d| members[d].writable())
            .take(copies)
            .collect();
        // Reserve on every ring before writing to any, so a full ring never leaves a stray
        // record write behind that could land after the checkpoint.
        let mut positions = Vec::with_capacity(targets.len());
        for &d in &targets {
            match self.inner.rings[d].reserve(record.len() as u64, layout.journal_bytes) {
                Some(pos) => positions.push(pos),
                None => return Ok(false),
            }
        }
        let mut tickets = Vec::new();
        for (&d, pos) in targets.iter().zip(positions) {
            let dev = members[d].dev.as_ref().expect("writable members have devices");
            tickets.push((
                d,
                dev.submit(IoOp::Write {
                    offset: layout.journal_offset + pos,
                    data: record.clone(),
                    fua: true,
                }),
            ));
        }
        let failures = wait_all(tickets);
        let all_failed = failures.len() == targets.len();
        self.handle_write_failures(members, failures)?;
        if all_failed {
            return Err(RaidError::Unrecoverable {
                offset: stripe * g.stripe_data_bytes(),
                reason: "no journal copy could be written".into(),
            });
        }
        self.inner.counters.journal_records.fetch_add(1, Relaxed);
        if !writes.is_empty() {
            self.inner.journaled_stripes.lock().unwrap_or_else(|e| e.into_inner()).insert(stripe);
        }
        Ok(true)
    }

    fn stripe_journaled(&self, stripe: u64) -> bool {
        self.inner.journaled_stripes.lock().unwrap_or_else(|e| e.into_inner()).contains(&stripe)
    }

    fn forget_journaled(&self, stripe: u64) {
        self.inner.journaled_stripes.lock().unwrap_or_else(|e| e.into_inner()).remove(&stripe);
    }

    /// Sets the write-intent bits of the stripes' regions, persisting the bitmap first if any bit
    /// is new, so a crash mid-write is always followed by a resync of that region.
    pub(crate) fn mark_intent(&self, stripes: impl Iterator<Item = u64>) -> Result<(), RaidError> {
        let g = self.inner.geometry;
        let bitmap = &self.inner.bitmap;
        let regions: Vec<u64> = stripes.map(|s| bitmap.region_of(g.drive_offset(s))).collect();
        if bitmap.touch(&regions) {
            return Ok(());
        }
        let _guard = bitmap.persist_lock.lock().unwrap_or_else(|e| e.into_inner());
        // Bits another write set are on the drives by now: it persisted them before it let
        // go of the lock.
        if bitmap.set(regions.iter().copied()) {
            self.persist_bitmap()?;
        }
        bitmap.mark_persisted(&regions);
        Ok(())
    }

    pub(crate) fn persist_bitmap(&self) -> Result<(), RaidError> {
        self.write_bitmap(None)
    }

    /// Writes the bitmap to `slot`'s drive only (a newcomer).
    pub(crate) fn persist_bitmap_to(&self, slot: usize) -> Result<(), RaidError> {
        self.write_bitmap(Some(slot))
    }

    fn write_bitmap(&self, only: Option<usize>) -> Result<(), RaidError> {
        let layout = &self.inner.layout;
        let image = self.inner.bitmap.encode(layout.bitmap_bytes as usize);
        let members = self.members();
        let tickets = members
            .iter()
            .enumerate()
            .filter(|(d, m)| m.writable() && only.is_none_or(|slot| slot == *d))
            .filter_map(|(d, m)| {
                Some((
                    d,
                    m.dev.as_ref()?.submit(IoOp::Write {
                        offset: layout.bitmap_offset,
                        data: image.clone(),
                        fua: true,
                    }),
                ))
            })
            .collect();
        let failures = wait_all(tickets);
        self.inner.counters.bitmap_writes.fetch_add(1, Relaxed);
        self.handle_write_failures(&members, failures)
    }

    /// Marks every drive whose write failed as failed, then checks the array is still whole.
    pub(crate) fn handle_write_failures(
        &self,
        members: &[Member],
        failures: Vec<(usize, IoError)>,
    ) -> Result<(), RaidError> {
        if failures.is_empty() {
            return Ok(());
        }
        for (d, e) in failures {
            if let Some(dev) = members[d].dev.as_ref().filter(|_| members[d].writable()) {
                self.fail_member(d, dev, &format!("write failed: {e}"))?;
            }
        }
        self.check_alive()
    }
}
