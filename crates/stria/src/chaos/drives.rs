//! `stria chaos drives`: drive faults under load, on every RAID level, in this process.
//!
//! Each level gets an array of fault-injecting memory drives and a flat in-memory copy of what
//! was written (the model). A cycle runs a seeded load of writes, reads, trims and flushes in
//! one thread while the campaign breaks a drive from another at a chosen op, then repairs
//! (replace, resync, reassembly) under more load, and ends with a full read compared with the
//! model and a read-only RAID check. Within the level's tolerance no read or write may fail;
//! past it (one drive too many) I/O must be refused, and no read may ever return bytes the
//! model does not hold.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use stria_io::BlockDevice;
use stria_io::fault::FaultDevice;
use stria_io::mem::MemDevice;
use stria_raid::{Array, ArrayConfig, ArrayState, CreateOptions, Level};

use super::{CampaignArgs, Tally};
use crate::rng::SplitMix64;
use crate::usage;

const BLOCK: u64 = 4096;
/// Memory drives small enough to read in full every cycle, large enough for every layout.
const DRIVE_BYTES: u64 = 24 << 20;
/// Write-intent regions of 1 MiB (not the default 64 MiB), so a drive that returns is
/// resynced only in part and rot outside the resynced regions is left to the scrub.
const BITMAP_REGION_BYTES: u64 = 1 << 20;
/// Slow enough that loads overlap rebuilds and resyncs, fast enough for short cycles.
const REBUILD_RATE_BYTES_S: u64 = 48 << 20;
/// Longest run of blocks one load op touches.
const OP_BLOCKS_MAX: u64 = 32;
/// Ops of one load phase: the base plus up to as many again.
const LOAD_OPS: u64 = 120;
/// Extra latency a slow drive adds to every request, at most.
const SLOW_US_MAX: u64 = 3000;
/// Most bits flipped on a drive in one bit-rot cycle.
const ROT_BITS_MAX: u64 = 4;
/// Where the load tag separates the load streams from the campaign's own choices.
const LOAD_STREAM_TAG: u64 = 0x4c4f_4144; // "LOAD"

#[derive(Args, Debug)]
pub struct DrivesArgs {
    /// RAID level: 0, 1, 10, 5, 6, or all (each level runs --cycles cycles).
    #[arg(long, default_value = "all")]
    level: String,
    #[command(flatten)]
    campaign: CampaignArgs,
}

/// The array each level runs on: drives and stripe unit.
fn shape(level: Level) -> (usize, u32) {
    match level {
        Level::Raid0 => (3, 16 << 10),
        Level::Raid1 => (3, 16 << 10),
        Level::Raid10 => (4, 16 << 10),
        Level::Raid5 => (4, 16 << 10),
        Level::Raid6 => (6, 8 << 10),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// A drive dies under load and a new one is rebuilt in its place.
    Fail,
    /// A drive drops out under load, comes back a little later and is resynced.
    Return,
    /// The operator takes a working drive out and puts a new one in.
    Replace,
    /// A drive misses writes (absent across a restart, or failed and returning at a restart)
    /// and comes back with its old contents: it must not be trusted until resynced.
    Stale,
    /// Bits flip on one drive's medium; checksums must find them and redundancy repair them.
    BitRot,
    /// A drive returns after an absence with flipped bits outside what the resync rewrites.
    ReturnRotten,
    /// One drive answers every request late.
    Slow,
    /// Two drives die under load (RAID 6).
    TwoFail,
    /// One drive more dies than the level tolerates: I/O must be refused.
    TooMany,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Fail => "fail",
            Fault::Return => "return",
            Fault::Replace => "replace",
            Fault::Stale => "stale",
            Fault::BitRot => "bit-rot",
            Fault::ReturnRotten => "return-rotten",
            Fault::Slow => "slow",
            Fault::TwoFail => "two-fail",
            Fault::TooMany => "too-many",
        }
    }

    /// The faults a level is exposed to, each with a weight. One too many drives ends the array
    /// (a new one is made), so it comes up less often than the rest.
    fn for_level(level: Level) -> Vec<(Fault, u64)> {
        if level == Level::Raid0 {
            return vec![(Fault::BitRot, 3), (Fault::Slow, 3), (Fault::TooMany, 2)];
        }
        let mut faults = vec![
            (Fault::Fail, 3),
            (Fault::Return, 3),
            (Fault::Replace, 2),
            (Fault::Stale, 3),
            (Fault::BitRot, 3),
            (Fault::ReturnRotten, 2),
            (Fault::Slow, 2),
            (Fault::TooMany, 1),
        ];
        if level == Level::Raid6 {
            faults.push((Fault::TwoFail, 3));
        }
        faults
    }

    fn pick(level: Level, rng: &mut SplitMix64) -> Fault {
        let faults = Fault::for_level(level);
        let mut at = rng.below(faults.iter().map(|(_, w)| w).sum());
        for (fault, weight) in faults {
            if at < weight {
                return fault;
            }
            at -= weight;
        }
        unreachable!("the draw is below the total weight")
    }
}

/// Something the campaign does to the drives or the array while the load runs.
type Strike = Box<dyn FnOnce(&Array, &[Arc<FaultDevice>])>;

fn fail_at(slot: usize) -> Strike {
    Box::new(move |_, drives| drives[slot].fail())
}

/// What one load phase saw.
#[derive(Debug, Default)]
struct LoadReport {
    ops: u64,
    /// Reads and writes that failed, with why (first few only).
    errors: u64,
    error_lines: Vec<String>,
    /// Blocks a successful read returned with bytes the model does not allow.
    wrong_blocks: u64,
    wrong_lines: Vec<String>,
}

const LINES_KEPT_MAX: usize = 3;

impl LoadReport {
    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.error_lines.len() < LINES_KEPT_MAX {
            self.error_lines.push(what);
        }
    }

    /// Records the error of a campaign step, if it failed.
    fn check(&mut self, step: Result<(), String>) {
        if let Err(e) = step {
            self.error(e);
        }
    }

    fn absorb(&mut self, other: LoadReport) {
        self.ops += other.ops;
        self.errors += other.errors;
        self.wrong_blocks += other.wrong_blocks;
        let keep = |mine: &mut Vec<String>, theirs: Vec<String>| {
            for line in theirs {
                if mine.len() < LINES_KEPT_MAX {
                    mine.push(line);
                }
            }
        };
        keep(&mut self.error_lines, other.error_lines);
        keep(&mut self.wrong_lines, other.wrong_lines);
    }

    fn wrong(&mut self, blocks: u64, what: String) {
        self.wrong_blocks += blocks;
        if self.wrong_lines.len() < LINES_KEPT_MAX {
            self.wrong_lines.push(what);
        }
    }
}

/// The expected contents: the model, plus for blocks a failed write or trim may or may not
/// have changed, the contents that write would have left.
#[derive(Debug)]
struct Expected {
    model: Vec<u8>,
    unsure: HashMap<u64, Vec<Vec<u8>>>,
}

impl Expected {
    fn new(bytes: u64) -> Expected {
        Expected { model: vec![0; bytes as usize], unsure: HashMap::new() }
    }

    /// How many blocks of `data`, read at `offset`, hold what no write could have left there;
    /// the first one's index comes along.
    fn wrong_blocks(&self, offset: u64, data: &[u8]) -> (u64, Option<u64>) {
        let mut wrong = 0;
        let mut first = None;
        for (i, got) in data.chunks(BLOCK as usize).enumerate() {
            let block = offset / BLOCK + i as u64;
            let at = (block * BLOCK) as usize;
            let want = &self.model[at..at + got.len()];
            let allowed = got == want
                || self.unsure.get(&block).is_some_and(|alts| alts.iter().any(|a| a == got));
            if !allowed {
                wrong += 1;
                first.get_or_insert(block);
            }
        }
        (wrong, first)
    }

    fn maybe_written(&mut self, offset: u64, data: &[u8]) {
        for (i, block) in data.chunks(BLOCK as usize).enumerate() {
            self.unsure.entry(offset / BLOCK + i as u64).or_default().push(block.to_vec());
        }
    }
}

/// One level's array, drives and model.
struct Rig {
    level: Level,
    unit: u32,
    drives: Vec<Arc<FaultDevice>>,
    array: Option<Array>,
    expected: Expected,
    /// Drives made so far, for unique names.
    made: u64,
}

impl Rig {
    fn new(level: Level) -> Result<Rig, String> {
        let (_, unit) = shape(level);
        let mut rig = Rig {
            level,
            unit,
            drives: Vec::new(),
            array: None,
            expected: Expected::new(0),
            made: 0,
        };
        rig.recreate()?;
        Ok(rig)
    }

    /// A new array on new drives, all zeros, as after one drive too many.
    fn recreate(&mut self) -> Result<(), String> {
        let (count, _) = shape(self.level);
        self.array = None;
        self.drives = (0..count).map(|_| self.new_drive()).collect();
        let config = ArrayConfig {
            level: self.level,
            stripe_unit_bytes: self.unit,
            rated_tbw: 0,
            journal_bytes: None,
        };
        let array = Array::create(
            self.devices(None),
            &config,
            &CreateOptions { skip_discard: true, bitmap_region_bytes: Some(BITMAP_REGION_BYTES) },
        )
        .map_err(|e| format!("creating the array: {e}"))?;
        array.set_rebuild_rate(REBUILD_RATE_BYTES_S);
        self.expected = Expected::new(array.capacity_bytes());
        self.array = Some(array);
        Ok(())
    }

    fn new_drive(&mut self) -> Arc<FaultDevice> {
        self.made += 1;
        let name = format!("{}-d{}", self.level, self.made);
        Arc::new(FaultDevice::new(Arc::new(MemDevice::new(name, DRIVE_BYTES))))
    }

    fn devices(&self, without: Option<usize>) -> Vec<Arc<dyn BlockDevice>> {
        self.drives
            .iter()
            .enumerate()
            .filter(|(slot, _)| Some(*slot) != without)
            .map(|(_, d)| d.clone() as Arc<dyn BlockDevice>)
            .collect()
    }

    fn array(&self) -> &Array {
        self.array.as_ref().expect("the rig always holds an array between steps")
    }

    fn state_of(&self, slot: usize) -> &'static str {
        self.array().status().members[slot].state
    }

    /// Runs `ops` load ops; each strike is made from this thread once the load has started
    /// its op. `tolerant` loads expect errors (one drive too many) and record what a failed
    /// write may have left.
    fn under_load(
        &mut self,
        rng: &mut SplitMix64,
        ops: u64,
        strikes: Vec<(u64, Strike)>,
        tolerant: bool,
    ) -> LoadReport {
        let seed = SplitMix64::from_parts(&[rng.next_u64(), LOAD_STREAM_TAG]).next_u64();
        let started = AtomicU64::new(0);
        let finished = AtomicBool::new(false);
        let array = self.array.as_ref().expect("an array");
        let drives = &self.drives;
        let expected = &mut self.expected;
        std::thread::scope(|scope| {
            let loader = scope.spawn(|| {
                let report = load(array, expected, seed, ops, &started, tolerant);
                finished.store(true, SeqCst);
                report
            });
            for (at, strike) in strikes {
                while started.load(SeqCst) < at && !finished.load(SeqCst) {
                    std::thread::sleep(Duration::from_micros(200));
                }
                strike(array, drives);
            }
            loader.join().unwrap_or_else(|_| {
                let mut report = LoadReport::default();
                report.error("the load thread panicked".into());
                report
            })
        })
    }

    /// Makes the array notice failed drives: a write of what stripe 0 already holds touches
    /// every drive.
    fn probe(&self) -> Result<(), String> {
        let len = self.array().geometry().stripe_data_bytes() as usize;
        self.array().write(0, &self.expected.model[..len]).map_err(|e| format!("probe write: {e}"))
    }

    fn replace_with_new(&mut self, slot: usize) -> Result<(), String> {
        let drive = self.new_drive();
        self.drives[slot] = drive.clone();
        self.array().replace(slot, drive).map_err(|e| format!("replace slot {slot}: {e}"))
    }

    fn resync(&self, slot: usize) -> Result<(), String> {
        self.drives[slot].heal();
        self.array()
            .replace(slot, self.drives[slot].clone())
            .map_err(|e| format!("re-adding slot {slot}: {e}"))
    }

    /// Closes the array and assembles it again from its drives, leaving `without` out.
    fn reassemble(&mut self, without: Option<usize>) -> Result<(), String> {
        let array = self.array.take().expect("an array");
        array.close().map_err(|e| format!("close: {e}"))?;
        let array = Array::assemble(self.devices(without)).map_err(|e| format!("assemble: {e}"))?;
        array.set_rebuild_rate(REBUILD_RATE_BYTES_S);
        self.array = Some(array);
        Ok(())
    }

    /// Flips `bits` random bits in the data area of `slot`'s medium, between I/Os.
    fn rot(&self, rng: &mut SplitMix64, slot: usize, bits: u64) -> Result<(), String> {
        let layout = self.array().layout();
        for _ in 0..bits {
            let byte = layout.data_offset + rng.below(layout.data_bytes);
            self.drives[slot]
                .flip_bit(byte * 8 + rng.below(8))
                .map_err(|e| format!("flipping a bit on slot {slot}: {e}"))?;
        }
        Ok(())
    }

    /// Reads everything back. Without redundancy (RAID 0), a block whose rot the array detects
    /// may be refused with an error: it is then written again from the model.
    fn verify_all(&mut self, report: &mut LoadReport, refusal_allowed: bool) {
        let piece = (64 * BLOCK) as usize;
        let capacity = self.array().capacity_bytes();
        let mut buf = vec![0u8; piece];
        let mut offset = 0;
        while offset < capacity {
            let len = piece.min((capacity - offset) as usize);
            match self.array().read(offset, &mut buf[..len]) {
                Ok(()) => {
                    let (wrong, first) = self.expected.wrong_blocks(offset, &buf[..len]);
                    if wrong > 0 {
                        report.wrong(wrong, format!("full read: block {first:?} differs"));
                    }
                }
                Err(e) if refusal_allowed => {
                    let data = &self.expected.model[offset as usize..offset as usize + len];
                    if let Err(e2) = self.array().write(offset, data) {
                        report.error(format!("rewriting a refused range at {offset}: {e} / {e2}"));
                    }
                }
                Err(e) => report.error(format!("full read at {offset}: {e}")),
            }
            offset += len as u64;
        }
    }

    /// The end of every cycle: rebuilds done, the array optimal, every byte as the model says,
    /// and a read-only check clean.
    fn settle(&mut self, report: &mut LoadReport) {
        if let Err(e) = self.array().wait_rebuild() {
            report.error(format!("rebuild: {e}"));
        }
        self.verify_all(report, false);
        let stop = AtomicBool::new(false);
        match self.array().scrub(false, None, &stop, &mut |_, _| {}) {
            Ok(check) if check.clean() => {}
            Ok(check) => report.error(format!("RAID check not clean: {check:?}")),
            Err(e) => report.error(format!("RAID check: {e}")),
        }
        let state = self.array().status().state;
        if state != ArrayState::Optimal {
            report.error(format!("array {state:?} at the end of the cycle, not optimal"));
        }
    }

    /// One cycle: a fault of `fault`'s kind at a seeded op, the repair, and the checks.
    fn cycle(&mut self, rng: &mut SplitMix64, fault: Fault) -> (String, LoadReport) {
        let drives = self.drives.len();
        let slot = rng.below(drives as u64) as usize;
        let ops = LOAD_OPS + rng.below(LOAD_OPS);
        let at = rng.below(ops);
        let mut note = format!("slot {slot} at op {at}/{ops}");
        let mut report = LoadReport::default();
        match fault {
            Fault::Fail | Fault::Return | Fault::ReturnRotten => {
                let load = self.under_load(rng, ops, vec![(at, fail_at(slot))], false);
                report.absorb(load);
                report.check(self.probe());
                if self.state_of(slot) != "failed" {
                    report.error(format!("slot {slot} died but is {}", self.state_of(slot)));
                    return (note, report);
                }
                if fault == Fault::Fail {
                    report.check(self.replace_with_new(slot));
                } else {
                    // Writes land while it is away, then it comes back.
                    let load = self.under_load(rng, ops / 2, Vec::new(), false);
                    report.absorb(load);
                    if fault == Fault::ReturnRotten {
                        let bits = 1 + rng.below(ROT_BITS_MAX);
                        let _ = write!(note, ", {bits} bits flipped");
                        report.check(self.rot(rng, slot, bits));
                    }
                    report.check(self.resync(slot));
                }
                let load = self.under_load(rng, ops, Vec::new(), false);
                report.absorb(load);
                if fault == Fault::ReturnRotten {
                    // Rot outside what was resynced and read meanwhile is the scrub's to find.
                    report.check(self.scrub_repair());
                }
            }
            Fault::Replace => {
                let strike: Strike = Box::new(move |array, _| {
                    if let Err(e) = array.fail_drive(slot) {
                        eprintln!("  (operator fail of slot {slot} refused: {e})");
                    }
                });
                let load = self.under_load(rng, ops, vec![(at, strike)], false);
                report.absorb(load);
                report.check(self.replace_with_new(slot));
                let load = self.under_load(rng, ops, Vec::new(), false);
                report.absorb(load);
            }
            Fault::Stale => {
                if rng.below(2) == 0 {
                    note.push_str(", absent across a restart");
                    report.check(self.reassemble(Some(slot)));
                    if self.array.is_none() {
                        return (note, report);
                    }
                    let load = self.under_load(rng, ops, Vec::new(), false);
                    report.absorb(load);
                    report.check(self.reassemble(None));
                    if self.array.is_none() {
                        return (note, report);
                    }
                    if !matches!(self.state_of(slot), "rebuilding" | "active") {
                        report.check(self.resync(slot));
                    }
                } else {
                    note.push_str(", failed and back at a restart");
                    let load = self.under_load(rng, ops, vec![(at, fail_at(slot))], false);
                    report.absorb(load);
                    report.check(self.probe());
                    self.drives[slot].heal();
                    report.check(self.reassemble(None));
                    if self.array.is_none() {
                        return (note, report);
                    }
                    if self.state_of(slot) != "failed" {
                        report.error(format!(
                            "a failed drive came back at assembly as {}",
                            self.state_of(slot)
                        ));
                    }
                    // Read everything while the stale drive is attached but out.
                    self.verify_all(&mut report, false);
                    report.check(self.resync(slot));
                }
                let load = self.under_load(rng, ops, Vec::new(), false);
                report.absorb(load);
            }
            Fault::BitRot => {
                let load = self.under_load(rng, ops, Vec::new(), false);
                report.absorb(load);
                let bits = 1 + rng.below(ROT_BITS_MAX);
                let _ = write!(note, ", {bits} bits flipped");
                report.check(self.rot(rng, slot, bits));
                let raid0 = self.level == Level::Raid0;
                // Reads must repair what they meet (or, on RAID 0, refuse it).
                self.verify_all(&mut report, raid0);
                if !raid0 {
                    report.check(self.scrub_repair());
                }
                let load = self.under_load(rng, ops, Vec::new(), false);
                report.absorb(load);
            }
            Fault::Slow => {
                let latency = Duration::from_micros(500 + rng.below(SLOW_US_MAX));
                let _ = write!(note, ", +{} us per request", latency.as_micros());
                let slow: Strike = Box::new(move |_, d| d[slot].set_latency(latency));
                let load = self.under_load(rng, ops / 2, vec![(at / 2, slow)], false);
                report.absorb(load);
                self.drives[slot].set_latency(Duration::ZERO);
            }
            Fault::TwoFail => {
                let other = (slot + 1 + rng.below(drives as u64 - 1) as usize) % drives;
                let later = at + rng.below(ops - at);
                let _ = write!(note, " and slot {other} at op {later}");
                let strikes = vec![(at, fail_at(slot)), (later, fail_at(other))];
                let load = self.under_load(rng, ops, strikes, false);
                report.absorb(load);
                report.check(self.probe());
                for s in [slot, other] {
                    if self.state_of(s) != "failed" {
                        report.error(format!("slot {s} died but is {}", self.state_of(s)));
                    }
                    report.check(self.replace_with_new(s));
                }
                let load = self.under_load(rng, ops, Vec::new(), false);
                report.absorb(load);
            }
            Fault::TooMany => {
                let victims = self.too_many(slot);
                let _ = write!(note, ", slots {victims:?} die");
                let strikes =
                    victims.iter().enumerate().map(|(i, &v)| (at + i as u64, fail_at(v))).collect();
                let load = self.under_load(rng, ops, strikes, true);
                report.absorb(load);
                let _ = self.probe();
                self.check_refused(&mut report);
                // Nothing can bring this array back: start over on new drives.
                report.check(self.recreate());
                return (note, report);
            }
        }
        self.settle(&mut report);
        (note, report)
    }

    /// Scrub with repair: afterwards the check in `settle` must be clean.
    fn scrub_repair(&self) -> Result<(), String> {
        let stop = AtomicBool::new(false);
        self.array()
            .scrub(true, None, &stop, &mut |_, _| {})
            .map(|_| ())
            .map_err(|e| format!("scrub: {e}"))
    }

    /// Drives whose loss is one more than the level survives, starting at `slot`.
    fn too_many(&self, slot: usize) -> Vec<usize> {
        let drives = self.drives.len();
        let count = match self.level {
            Level::Raid10 => return vec![slot & !1, slot | 1],
            level => {
                let (_, unit) = shape(level);
                let g = stria_raid::Geometry::new(level, drives, unit, DRIVE_BYTES)
                    .map(|g| g.tolerated_failures())
                    .unwrap_or(0);
                g + 1
            }
        };
        (0..count).map(|i| (slot + i) % drives).collect()
    }

    /// After one drive too many: the array reports failed and a full read is refused.
    fn check_refused(&mut self, report: &mut LoadReport) {
        let state = self.array().status().state;
        if state != ArrayState::Failed {
            report.error(format!("one drive too many, but the array is {state:?}"));
        }
        let capacity = self.array().capacity_bytes() as usize;
        let mut buf = vec![0u8; capacity];
        if self.array().read(0, &mut buf).is_ok() {
            report.error("one drive too many, but a full read succeeded".into());
            let (wrong, first) = self.expected.wrong_blocks(0, &buf);
            if wrong > 0 {
                report.wrong(wrong, format!("full read past tolerance: block {first:?} differs"));
            }
        }
    }
}

/// The load: seeded writes, reads, trims and flushes. Every successful read is compared with
/// the model; the model follows every successful write and trim.
fn load(
    array: &Array,
    expected: &mut Expected,
    seed: u64,
    ops: u64,
    started: &AtomicU64,
    tolerant: bool,
) -> LoadReport {
    let mut rng = SplitMix64::new(seed);
    let mut report = LoadReport::default();
    let blocks = expected.model.len() as u64 / BLOCK;
    let mut buf = vec![0u8; (OP_BLOCKS_MAX * BLOCK) as usize];
    for op in 0..ops {
        started.store(op + 1, SeqCst);
        let kind = rng.below(100);
        let start = rng.below(blocks);
        let len = (1 + rng.below(OP_BLOCKS_MAX)).min(blocks - start);
        let (offset, bytes) = (start * BLOCK, (len * BLOCK) as usize);
        let range = offset as usize..offset as usize + bytes;
        report.ops += 1;
        match kind {
            0..=49 => {
                rng.fill(&mut buf[..bytes]);
                match array.write(offset, &buf[..bytes]) {
                    Ok(()) => expected.model[range].copy_from_slice(&buf[..bytes]),
                    Err(e) => {
                        expected.maybe_written(offset, &buf[..bytes]);
                        if !tolerant {
                            report.error(format!("write at {offset}+{bytes}: {e}"));
                        }
                    }
                }
            }
            50..=89 => match array.read(offset, &mut buf[..bytes]) {
                Ok(()) => {
                    let (wrong, first) = expected.wrong_blocks(offset, &buf[..bytes]);
                    if wrong > 0 {
                        report.wrong(wrong, format!("read at {offset}: block {first:?} differs"));
                    }
                }
                Err(e) if !tolerant => report.error(format!("read at {offset}+{bytes}: {e}")),
                Err(_) => {}
            },
            90..=94 => match array.trim(offset, bytes as u64) {
                Ok(()) => expected.model[range].fill(0),
                Err(e) => {
                    expected.maybe_written(offset, &vec![0u8; bytes]);
                    if !tolerant {
                        report.error(format!("trim at {offset}+{bytes}: {e}"));
                    }
                }
            },
            _ => {
                if let Err(e) = array.flush()
                    && !tolerant
                {
                    report.error(format!("flush: {e}"));
                }
            }
        }
    }
    report
}

fn parse_levels(text: &str) -> Result<Vec<Level>> {
    if text == "all" {
        return Ok(vec![Level::Raid0, Level::Raid1, Level::Raid10, Level::Raid5, Level::Raid6]);
    }
    let level: Level =
        text.parse().map_err(|e| usage(format!("--level {text}: {e} (0, 1, 10, 5, 6 or all)")))?;
    Ok(vec![level])
}

pub fn run(args: DrivesArgs) -> Result<()> {
    let seed = args.campaign.start()?;
    let levels = parse_levels(&args.level)?;
    println!(
        "campaign drives: seed {seed:#x}, {} cycles on each of {}",
        args.campaign.cycles,
        levels.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(", ")
    );
    let mut tally = Tally::default();
    let started = Instant::now();
    for level in levels {
        let mut rng = SplitMix64::from_parts(&[seed, level.code() as u64]);
        let mut rig = match Rig::new(level) {
            Ok(rig) => rig,
            Err(e) => {
                tally.fail(0, format_args!("{level}: {e}"));
                continue;
            }
        };
        let (lost_before, failures_before) = (tally.data_lost, tally.failures.len());
        for _ in 0..args.campaign.cycles {
            tally.cycles += 1;
            let cycle = tally.cycles;
            let fault = Fault::pick(level, &mut rng);
            let (note, report) = rig.cycle(&mut rng, fault);
            let verdict =
                if report.errors == 0 && report.wrong_blocks == 0 { "ok" } else { "FAILED" };
            println!(
                "cycle {cycle} {level} {}: {note}: {} ops, {verdict}",
                fault.name(),
                report.ops
            );
            for line in &report.error_lines {
                tally.fail(cycle, format_args!("{level} {}: {line}", fault.name()));
            }
            if report.errors > report.error_lines.len() as u64 {
                tally.fail(
                    cycle,
                    format_args!("{} more errors", report.errors - report.error_lines.len() as u64),
                );
            }
            if report.wrong_blocks > 0 {
                tally.lost(
                    cycle,
                    report.wrong_blocks * BLOCK,
                    format_args!(
                        "{level} {}: {} blocks read back wrong; {}",
                        fault.name(),
                        report.wrong_blocks,
                        report.wrong_lines.join("; ")
                    ),
                );
            }
            if rig.array.is_none() && rig.recreate().is_err() {
                tally.fail(cycle, format_args!("{level}: the array could not be made again"));
                break;
            }
        }
        println!(
            "level {level}: {} cycles, data lost: {}, failures: {}",
            args.campaign.cycles,
            tally.data_lost - lost_before,
            tally.failures.len() - failures_before
        );
    }
    println!("({:.1} s)", started.elapsed().as_secs_f64());
    tally.finish(
        "drives",
        seed,
        &format!("drives --level {} --cycles {}", args.level, args.campaign.cycles),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_has_faults_and_raid6_loses_two() {
        for level in parse_levels("all").expect("all") {
            assert!(!Fault::for_level(level).is_empty());
        }
        assert!(Fault::for_level(Level::Raid6).iter().any(|(f, _)| *f == Fault::TwoFail));
        assert!(Fault::for_level(Level::Raid0).iter().all(|(f, _)| *f != Fault::Fail));
    }

    #[test]
    fn an_unsure_block_accepts_either_content() {
        let mut expected = Expected::new(2 * BLOCK);
        let new = vec![7u8; BLOCK as usize];
        assert_eq!(expected.wrong_blocks(0, &new), (1, Some(0)));
        expected.maybe_written(0, &new);
        assert_eq!(expected.wrong_blocks(0, &new), (0, None));
        assert_eq!(expected.wrong_blocks(0, &[0u8; 4096]), (0, None));
        assert_eq!(expected.wrong_blocks(BLOCK, &new), (1, Some(1)));
    }
}
