//! Property tests: random reads, writes and trims on every level, compared with a flat in-memory
//! model, with drive failures, returns, replacements, bit rot and reassembly injected at random
//! points. Each run is a seed; a seed that ever fails becomes a named regression test below.

use std::sync::Arc;

use stria_io::BlockDevice;
use stria_io::fault::FaultDevice;
use stria_io::mem::MemDevice;
use stria_raid::{Array, ArrayConfig, ArrayState, CreateOptions, Level};

const BLOCK: u64 = 4096;

/// A small deterministic generator (xorshift64*), so every failure is reproducible by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Rig {
    level: Level,
    faults: Vec<Arc<FaultDevice>>,
    array: Option<Array>,
    model: Vec<u8>,
    spare_count: usize,
}

fn drive(name: String, bytes: u64) -> Arc<FaultDevice> {
    Arc::new(FaultDevice::new(Arc::new(MemDevice::new(name, bytes))))
}

fn as_devs(faults: &[Arc<FaultDevice>]) -> Vec<Arc<dyn BlockDevice>> {
    faults.iter().map(|f| f.clone() as Arc<dyn BlockDevice>).collect()
}

impl Rig {
    fn new(level: Level, drives: usize, unit: u32, drive_bytes: u64) -> Rig {
        let faults: Vec<_> = (0..drives).map(|i| drive(format!("d{i}"), drive_bytes)).collect();
        let config =
            ArrayConfig { level, stripe_unit_bytes: unit, rated_tbw: 1, journal_bytes: None };
        // 1 MiB write-intent regions (not 64 MiB), so a returning drive's resync is partial.
        let options = CreateOptions { bitmap_region_bytes: Some(1 << 20), ..Default::default() };
        let array = Array::create(as_devs(&faults), &config, &options).expect("create");
        let model = vec![0u8; array.capacity_bytes() as usize];
        Rig { level, faults, array: Some(array), model, spare_count: 0 }
    }

    fn array(&self) -> &Array {
        self.array.as_ref().expect("assembled")
    }

    fn out_of_service(&self) -> Vec<usize> {
        self.slots_where(|state| state != "active")
    }

    fn replaceable(&self) -> Vec<usize> {
        self.slots_where(|state| state == "failed" || state == "missing")
    }

    fn slots_where(&self, wanted: impl Fn(&str) -> bool) -> Vec<usize> {
        self.array()
            .status()
            .members
            .iter()
            .filter(|m| wanted(m.state))
            .filter_map(|m| m.slot)
            .collect()
    }

    fn tolerated(&self) -> usize {
        match self.level {
            Level::Raid0 => 0,
            Level::Raid6 => 2,
            _ => 1,
        }
    }

    fn verify_all(&self, seed: u64, step: usize) {
        let mut buf = vec![0u8; self.model.len()];
        self.array()
            .read(0, &mut buf)
            .unwrap_or_else(|e| panic!("seed {seed} step {step}: full read failed: {e}"));
        if let Some(at) = buf.iter().zip(&self.model).position(|(a, b)| a != b) {
            panic!("seed {seed} step {step}: array differs from the model at byte {at}");
        }
    }

    fn run(&mut self, seed: u64, steps: usize) {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let blocks = self.model.len() as u64 / BLOCK;
        for step in 0..steps {
            let op = rng.below(100);
            let start = rng.below(blocks);
            let len = (1 + rng.below(48)).min(blocks - start);
            let (off, bytes) = (start * BLOCK, (len * BLOCK) as usize);
            if std::env::var_os("STRIA_MODEL_DEBUG").is_some() {
                eprintln!(
                    "step {step}: op {op} off {off} len {bytes} status {:?}",
                    self.slots_where(|s| s != "active")
                );
                let stop = std::sync::atomic::AtomicBool::new(false);
                let report = self.array().scrub(false, None, &stop, &mut |_, _| {}).expect("check");
                assert!(report.clean(), "seed {seed} before step {step}: {report:?}");
            }
            match op {
                0..=39 => {
                    let fill = rng.next();
                    let data: Vec<u8> = (0..bytes)
                        .map(|i| (fill >> (i % 8 * 8)) as u8 ^ (i / 4096) as u8)
                        .collect();
                    self.array()
                        .write(off, &data)
                        .unwrap_or_else(|e| panic!("seed {seed} step {step}: write: {e}"));
                    self.model[off as usize..off as usize + bytes].copy_from_slice(&data);
                }
                40..=69 => {
                    let mut buf = vec![0u8; bytes];
                    self.array()
                        .read(off, &mut buf)
                        .unwrap_or_else(|e| panic!("seed {seed} step {step}: read: {e}"));
                    assert!(
                        buf == self.model[off as usize..off as usize + bytes],
                        "seed {seed} step {step}: read at {off} differs"
                    );
                }
                70..=74 => {
                    self.array()
                        .trim(off, bytes as u64)
                        .unwrap_or_else(|e| panic!("seed {seed} step {step}: trim: {e}"));
                    self.model[off as usize..off as usize + bytes].fill(0);
                }
                75..=79 if self.tolerated() > 0 => {
                    // Fail a drive if the level still tolerates one more loss.
                    let out = self.out_of_service();
                    if out.len() < self.tolerated()
                        && (self.level != Level::Raid10 || out.is_empty())
                    {
                        let slot = rng.below(self.faults.len() as u64) as usize;
                        if !out.contains(&slot) {
                            self.array()
                                .fail_drive(slot)
                                .unwrap_or_else(|e| panic!("seed {seed} step {step}: fail: {e}"));
                        }
                    }
                }
                80..=84 => {
                    // Replace an out-of-service drive: sometimes the same drive coming back
                    // (bitmap resync), sometimes a fresh one (full rebuild).
                    if let Some(&slot) = self.replaceable().first() {
                        let returning = rng.below(2) == 0;
                        if std::env::var_os("STRIA_MODEL_DEBUG").is_some() {
                            eprintln!(
                                "replace slot {slot} returning={returning} states={:?}",
                                self.array()
                                    .status()
                                    .members
                                    .iter()
                                    .map(|m| m.state)
                                    .collect::<Vec<_>>()
                            );
                        }
                        let dev = if returning {
                            self.faults[slot].clone()
                        } else {
                            self.spare_count += 1;
                            let fresh = drive(
                                format!("r{}", self.spare_count),
                                self.faults[slot].capacity_bytes(),
                            );
                            self.faults[slot] = fresh.clone();
                            fresh
                        };
                        self.array()
                            .replace(slot, dev)
                            .unwrap_or_else(|e| panic!("seed {seed} step {step}: replace: {e}"));
                        if rng.below(2) == 0 {
                            self.array().wait_rebuild().unwrap_or_else(|e| {
                                panic!("seed {seed} step {step}: rebuild: {e}")
                            });
                        }
                    }
                }
                85..=89 if self.tolerated() > 0 => {
                    // Bit rot on one drive's data area, then a full read that must repair it.
                    // Only when optimal, so one flip never meets another loss in the same row.
                    self.array()
                        .wait_rebuild()
                        .unwrap_or_else(|e| panic!("seed {seed} step {step}: rebuild: {e}"));
                    if self.out_of_service().is_empty() {
                        let layout = self.array().layout();
                        let d = rng.below(self.faults.len() as u64) as usize;
                        let bit =
                            (layout.data_offset + rng.below(layout.data_bytes)) * 8 + rng.below(8);
                        self.faults[d].flip_bit(bit).expect("flip");
                        // A normal read touches one copy and no parity, so rot elsewhere is
                        // the scrub's to find: it must find and repair exactly this one block.
                        let stop = std::sync::atomic::AtomicBool::new(false);
                        let report =
                            self.array().scrub(true, None, &stop, &mut |_, _| {}).expect("scrub");
                        assert_eq!(
                            (
                                report.checksum_errors,
                                report.repaired_blocks,
                                report.parity_mismatches
                            ),
                            (1, 1, 0),
                            "seed {seed} step {step}: scrub after one flipped bit: {report:?}"
                        );
                        self.verify_all(seed, step);
                    }
                }
                90..=94 => {
                    self.array()
                        .flush()
                        .unwrap_or_else(|e| panic!("seed {seed} step {step}: flush: {e}"));
                }
                _ => {
                    // Close and reassemble from the drives alone.
                    let array = self.array.take().expect("assembled");
                    array.close().unwrap_or_else(|e| panic!("seed {seed} step {step}: close: {e}"));
                    let array = Array::assemble(as_devs(&self.faults))
                        .unwrap_or_else(|e| panic!("seed {seed} step {step}: assemble: {e}"));
                    self.array = Some(array);
                }
            }
        }
        self.array().wait_rebuild().expect("final rebuild");
        for slot in self.replaceable() {
            let fresh = drive(format!("final{slot}"), self.faults[slot].capacity_bytes());
            self.faults[slot] = fresh.clone();
            self.array().replace(slot, fresh).expect("final replace");
        }
        self.array().wait_rebuild().expect("final rebuild");
        self.verify_all(seed, steps);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let report = self.array().scrub(false, None, &stop, &mut |_, _| {}).expect("check");
        assert!(report.clean(), "seed {seed}: final check not clean: {report:?}");
        if self.tolerated() > 0 {
            assert_eq!(
                self.array().status().state,
                ArrayState::Optimal,
                "seed {seed}: not optimal after rebuilds"
            );
        }
    }
}

fn run_seeds(level: Level, drives: usize, unit: u32, seeds: std::ops::Range<u64>, steps: usize) {
    for seed in seeds {
        let mut rig = Rig::new(level, drives, unit, 24 << 20);
        rig.run(seed, steps);
    }
}

#[test]
fn raid0_matches_the_model() {
    run_seeds(Level::Raid0, 3, 16 * 1024, 0..6, 150);
}

#[test]
fn raid1_matches_the_model_through_failures() {
    run_seeds(Level::Raid1, 3, 8 * 1024, 100..106, 150);
}

#[test]
fn raid10_matches_the_model_through_failures() {
    run_seeds(Level::Raid10, 4, 16 * 1024, 200..206, 150);
}

#[test]
fn raid5_matches_the_model_through_failures() {
    run_seeds(Level::Raid5, 4, 16 * 1024, 300..308, 150);
}

#[test]
fn raid6_matches_the_model_through_failures() {
    run_seeds(Level::Raid6, 6, 4 * 1024, 400..408, 150);
}

#[test]
fn regression_seed_401_raid6() {
    run_seeds(Level::Raid6, 6, 4 * 1024, 401..402, 150);
}

#[test]
fn raid6_wide_with_large_units() {
    run_seeds(Level::Raid6, 9, 64 * 1024, 500..503, 120);
}

#[test]
fn losing_more_drives_than_tolerated_refuses_io() {
    let rig = Rig::new(Level::Raid5, 4, 16 * 1024, 24 << 20);
    rig.array().write(0, &vec![7u8; 65536]).unwrap();
    rig.faults[1].fail();
    rig.faults[2].fail();
    // The first write notices both failures; after that every I/O is refused.
    let _ = rig.array().write(0, &vec![8u8; 65536]);
    let mut buf = vec![0u8; 65536];
    let err =
        rig.array().read(0, &mut buf).expect_err("two lost drives on raid5 must refuse reads");
    assert!(err.to_string().contains("array has failed"), "{err}");
    assert_eq!(rig.array().status().state, ArrayState::Failed);
}

#[test]
fn a_failed_write_fails_the_drive_and_data_survives() {
    let rig = Rig::new(Level::Raid6, 5, 16 * 1024, 24 << 20);
    rig.faults[3].fail_after_writes(0);
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    rig.array().write(0, &data).unwrap();
    let status = rig.array().status();
    assert_eq!(status.members[3].state, "failed");
    assert_eq!(status.state, ArrayState::Degraded);
    let mut back = vec![0u8; data.len()];
    rig.array().read(0, &mut back).unwrap();
    assert!(back == data);
}

#[test]
fn bit_rot_is_detected_counted_and_repaired() {
    let rig = Rig::new(Level::Raid5, 4, 16 * 1024, 24 << 20);
    let data: Vec<u8> = (0..256 * 1024).map(|i| (i % 253) as u8).collect();
    rig.array().write(0, &data).unwrap();
    let layout = rig.array().layout();
    for d in 0..4 {
        rig.faults[d].flip_bit((layout.data_offset + 5000 + d as u64 * 16384) * 8).unwrap();
    }
    let mut back = vec![0u8; data.len()];
    rig.array().read(0, &mut back).unwrap();
    assert!(back == data);
    let status = rig.array().status();
    assert!(status.checksum_errors >= 3, "{status:?}");
    assert!(status.repaired_blocks >= 3, "{status:?}");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let report = rig.array().scrub(false, None, &stop, &mut |_, _| {}).unwrap();
    assert!(report.clean(), "repaired blocks must verify afterwards: {report:?}");
}

#[test]
fn raid0_bit_rot_is_an_error_not_wrong_data() {
    let rig = Rig::new(Level::Raid0, 2, 16 * 1024, 24 << 20);
    rig.array().write(0, &vec![1u8; 65536]).unwrap();
    let layout = rig.array().layout();
    rig.faults[0].flip_bit(layout.data_offset * 8 + 3).unwrap();
    let mut back = vec![0u8; 65536];
    let err = rig.array().read(0, &mut back).expect_err("no redundancy to repair from");
    assert!(err.to_string().contains("cannot be recovered"), "{err}");
}

#[test]
fn foreign_and_duplicate_drives_are_refused() {
    let a = Rig::new(Level::Raid1, 2, 16 * 1024, 24 << 20);
    let b = Rig::new(Level::Raid1, 2, 16 * 1024, 24 << 20);
    let mut mixed = as_devs(&a.faults);
    mixed.push(b.faults[0].clone());
    let err = Array::assemble(mixed).expect_err("foreign drive");
    assert!(err.to_string().contains("belongs to another array"), "{err}");
    let dup =
        vec![a.faults[0].clone() as Arc<dyn BlockDevice>, a.faults[0].clone(), a.faults[1].clone()];
    let err = Array::assemble(dup).expect_err("duplicate drive");
    assert!(err.to_string().contains("same drive id"), "{err}");
}

/// The write-intent bit of region 0 as member `slot` holds it on disk.
fn region_0_marked_on_disk(rig: &Rig, slot: usize) -> bool {
    let bitmap = rig.faults[slot].read_at(rig.array().layout().bitmap_offset, 4096).unwrap();
    bitmap[0] & 1 != 0
}

#[test]
fn a_flush_keeps_the_bit_of_a_region_in_use_and_clears_it_once_idle() {
    let rig = Rig::new(Level::Raid1, 2, 16 * 1024, 64 << 20);
    assert!(!region_0_marked_on_disk(&rig, 0));
    let status = rig.array().status();
    assert_eq!((status.bitmap_region_bytes, status.bitmap_marked_regions), (1 << 20, Some(0)));
    let writes_before = status.bitmap_writes.expect("a live array counts its bitmap writes");
    rig.array().write(0, &vec![1u8; 65536]).unwrap();
    assert!(region_0_marked_on_disk(&rig, 0) && region_0_marked_on_disk(&rig, 1));
    let status = rig.array().status();
    assert_eq!(status.bitmap_marked_regions, Some(1));
    assert_eq!(status.bitmap_writes, Some(writes_before + 1));
    // Written since the flush before: the bit stays, so the next write needs no bitmap write.
    rig.array().flush().unwrap();
    assert!(region_0_marked_on_disk(&rig, 0));
    let bitmap_writes = rig.faults[0].stats().snapshot().write_ops;
    rig.array().write(65536, &vec![2u8; 16384]).unwrap();
    assert_eq!(rig.faults[0].stats().snapshot().write_ops, bitmap_writes + 1, "data only");
    rig.array().flush().unwrap();
    assert!(region_0_marked_on_disk(&rig, 1));
    assert_eq!(rig.array().status().bitmap_writes, Some(writes_before + 1), "none since");
    // Idle for a whole interval: cleared on every member.
    rig.array().flush().unwrap();
    assert!(!region_0_marked_on_disk(&rig, 0) && !region_0_marked_on_disk(&rig, 1));
    let status = rig.array().status();
    assert_eq!(status.bitmap_marked_regions, Some(0));
    assert_eq!(status.bitmap_writes, Some(writes_before + 2));
    // A clean stop clears a bit written since the last flush too.
    rig.array().write(0, &vec![3u8; 4096]).unwrap();
    assert!(region_0_marked_on_disk(&rig, 0));
    let bitmap_offset = rig.array().layout().bitmap_offset;
    let Rig { faults, array, .. } = rig;
    array.unwrap().close().unwrap();
    for f in &faults {
        assert!(f.read_at(bitmap_offset, 4096).unwrap().iter().all(|&b| b == 0));
    }
}

#[test]
fn hot_spare_takes_over_a_failed_drive() {
    let rig = Rig::new(Level::Raid5, 3, 16 * 1024, 24 << 20);
    let data: Vec<u8> = (0..512 * 1024).map(|i| (i % 241) as u8).collect();
    rig.array().write(0, &data).unwrap();
    let spare = drive("spare".into(), 24 << 20);
    rig.array().add_spare(spare.clone()).unwrap();
    rig.array().fail_drive(1).unwrap();
    rig.array().wait_rebuild().unwrap();
    let status = rig.array().status();
    assert_eq!(status.state, ArrayState::Optimal);
    assert_eq!(status.members[1].device, "spare");
    // The spare now holds real data: lose another drive and read everything back.
    rig.array().fail_drive(0).unwrap();
    let mut back = vec![0u8; data.len()];
    rig.array().read(0, &mut back).unwrap();
    assert!(back == data);
}

#[test]
fn returning_drive_resyncs_only_written_regions() {
    let rig = Rig::new(Level::Raid1, 2, 16 * 1024, 64 << 20);
    rig.array().write(0, &vec![1u8; 1 << 20]).unwrap();
    rig.array().flush().unwrap();
    rig.array().fail_drive(1).unwrap();
    rig.array().write(0, &vec![2u8; 65536]).unwrap();
    let before = rig.faults[1].stats().snapshot().write_bytes;
    rig.array().replace(1, rig.faults[1].clone()).unwrap();
    rig.array().wait_rebuild().unwrap();
    let written = rig.faults[1].stats().snapshot().write_bytes - before;
    let capacity = rig.array().capacity_bytes();
    assert!(written < capacity / 4, "resync wrote {written} bytes of a {capacity}-byte array");
    rig.array().fail_drive(0).unwrap();
    let mut back = vec![0u8; 65536];
    rig.array().read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 2));
}

#[test]
fn rebuild_interrupted_by_a_restart_resumes_and_ends_consistent() {
    let mut rig = Rig::new(Level::Raid6, 6, 4 * 1024, 24 << 20);
    let data: Vec<u8> = (0..4 << 20).map(|i| (i * 13 % 251) as u8).collect();
    rig.array().write(0, &data).unwrap();
    rig.array().fail_drive(3).unwrap();
    let fresh = drive("fresh".into(), 24 << 20);
    rig.faults[3] = fresh.clone();
    rig.array().set_rebuild_rate(8 << 20);
    rig.array().replace(3, fresh).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(150));
    rig.array.take().unwrap().close().unwrap();
    let array = Array::assemble(as_devs(&rig.faults)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let report = array.scrub(false, None, &stop, &mut |_, _| {}).unwrap();
    assert!(report.clean(), "after restart mid-rebuild: {report:?}");
    array.wait_rebuild().unwrap();
    let report = array.scrub(false, None, &stop, &mut |_, _| {}).unwrap();
    assert!(report.clean(), "after the resumed rebuild: {report:?}");
    let mut back = vec![0u8; data.len()];
    array.read(0, &mut back).unwrap();
    assert!(back == data);
}

#[test]
fn drive_returning_at_assembly_after_another_was_rebuilt() {
    let mut rig = Rig::new(Level::Raid6, 6, 4 * 1024, 24 << 20);
    let data: Vec<u8> = (0..4 << 20).map(|i| (i * 13 % 251) as u8).collect();
    rig.array().write(0, &data).unwrap();
    rig.array().flush().unwrap();
    rig.array().fail_drive(3).unwrap();
    rig.array().write(8192, &vec![9u8; 40960]).unwrap();
    rig.array().fail_drive(0).unwrap();
    rig.array().write(1 << 20, &vec![7u8; 12288]).unwrap();
    let fresh = drive("fresh".into(), 24 << 20);
    rig.faults[0] = fresh.clone();
    rig.array().replace(0, fresh).unwrap();
    rig.array().wait_rebuild().unwrap();
    rig.array.take().unwrap().close().unwrap();
    let array = Array::assemble(as_devs(&rig.faults)).unwrap();
    array.wait_rebuild().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let report = array.scrub(false, None, &stop, &mut |_, _| {}).unwrap();
    assert!(report.clean(), "{report:?} {:?}", array.warnings());
}

#[test]
fn drive_missing_at_one_assembly_is_resynced_when_it_returns() {
    let mut rig = Rig::new(Level::Raid5, 4, 16 * 1024, 24 << 20);
    rig.array().write(0, &vec![1u8; 1 << 20]).unwrap();
    rig.array.take().unwrap().close().unwrap();
    let without: Vec<Arc<dyn BlockDevice>> = as_devs(&rig.faults[..3]);
    let degraded = Array::assemble(without).unwrap();
    degraded.write(0, &vec![2u8; 1 << 20]).unwrap();
    degraded.close().unwrap();
    // The missing drive comes back listed last: its old label must not win.
    let array = Array::assemble(as_devs(&rig.faults)).unwrap();
    array.wait_rebuild().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    assert!(array.scrub(false, None, &stop, &mut |_, _| {}).unwrap().clean());
    array.fail_drive(0).unwrap();
    let mut back = vec![0u8; 1 << 20];
    array.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 2));
}

/// A drive that leaves while it is being rebuilt holds data only below its rebuild cursor: when
/// it comes back it is rebuilt whole, not resynced from the write-intent bitmap as if it had
/// been in sync when it left.
#[test]
fn a_drive_that_left_while_rebuilding_is_rebuilt_whole_when_it_returns() {
    let rig = Rig::new(Level::Raid1, 2, 16 * 1024, 64 << 20);
    let data: Vec<u8> = (0..16 << 20).map(|i| (i * 7 % 253) as u8).collect();
    rig.array().write(0, &data).unwrap();
    // Two flushes clear the bits: the bitmap marks nothing.
    rig.array().flush().unwrap();
    rig.array().flush().unwrap();
    rig.array().fail_drive(1).unwrap();
    let fresh = drive("fresh".into(), 64 << 20);
    rig.array().set_rebuild_rate(1 << 20);
    rig.array().replace(1, fresh.clone()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    rig.array().fail_drive(1).unwrap();
    rig.array().set_rebuild_rate(1 << 40);
    rig.array().replace(1, fresh).unwrap();
    rig.array().wait_rebuild().unwrap();
    rig.array().fail_drive(0).unwrap();
    let mut back = vec![0u8; data.len()];
    rig.array().read(0, &mut back).unwrap();
    assert!(back == data, "the returning drive was not rebuilt whole");
}

/// The flush that ends a rebuild fails the new drive and a hot spare takes its place: the
/// spare, which holds nothing yet, must not be declared in sync.
#[test]
fn a_rebuild_whose_drive_fails_as_it_ends_does_not_vouch_for_the_spare() {
    let rig = Rig::new(Level::Raid5, 3, 16 * 1024, 24 << 20);
    let data: Vec<u8> = (0..8 << 20).map(|i| (i * 11 % 251) as u8).collect();
    rig.array().write(0, &data).unwrap();
    rig.array().fail_drive(0).unwrap();
    let layout = rig.array().layout();
    let fresh = drive("fresh".into(), 24 << 20);
    // Its checksum table cannot be written: the flush at the end of its rebuild fails it.
    fresh.fail_range(layout.crc_offset, layout.crc_bytes, &[stria_io::OpKind::Write]);
    rig.array().replace(0, fresh).unwrap();
    rig.array().add_spare(drive("spare".into(), 24 << 20)).unwrap();
    // The first rebuild ends in an error (which stays reported); the spare's runs to its end.
    let ended = rig.array().wait_rebuild();
    assert!(ended.is_err_and(|e| e.to_string().contains("slot 0")), "the failed drive's rebuild");
    assert_eq!(rig.array().status().state, ArrayState::Optimal);
    rig.array().fail_drive(1).unwrap();
    let mut back = vec![0u8; data.len()];
    rig.array().read(0, &mut back).unwrap();
    assert!(back == data, "the spare was declared in sync before it was rebuilt");
}

/// A write while the slot's own drive is being put back (its checksum table is still being
/// read) reaches the drive or its resync: never neither.
#[test]
fn a_write_while_a_returning_drive_is_put_back_is_not_lost() {
    let rig = Rig::new(Level::Raid1, 2, 16 * 1024, 64 << 20);
    rig.array().write(0, &vec![1u8; 4 << 20]).unwrap();
    rig.array().flush().unwrap();
    rig.array().flush().unwrap();
    rig.array().fail_drive(1).unwrap();
    let returning = rig.faults[1].clone();
    returning.set_latency(std::time::Duration::from_millis(300));
    std::thread::scope(|s| {
        let putting_back = s.spawn(|| rig.array().replace(1, returning.clone()));
        // Past the label read (one 300 ms read), into the checksum table's.
        std::thread::sleep(std::time::Duration::from_millis(450));
        // A region no bit marks yet (the bitmap's regions are 1 MiB).
        rig.array().write(3 << 20, &vec![2u8; 65536]).unwrap();
        putting_back.join().unwrap().unwrap();
        returning.set_latency(std::time::Duration::ZERO);
    });
    rig.array().wait_rebuild().unwrap();
    rig.array().fail_drive(0).unwrap();
    let mut back = vec![0u8; 65536];
    rig.array().read(3 << 20, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 2), "the write made while the drive came back is lost");
}

/// A bitmap write that fails a drive brings in the hot spare from inside the write that holds
/// the bitmap's lock: the write must finish, not wait on itself.
#[test]
fn a_failed_bitmap_write_that_brings_in_a_spare_does_not_hang() {
    let mut rig = Rig::new(Level::Raid5, 3, 16 * 1024, 24 << 20);
    rig.array().write(0, &vec![1u8; 1 << 20]).unwrap();
    rig.array().add_spare(drive("spare".into(), 24 << 20)).unwrap();
    let layout = rig.array().layout();
    rig.faults[1].fail_range(layout.bitmap_offset, layout.bitmap_bytes, &[stria_io::OpKind::Write]);
    // Not a scoped thread: a hung write must fail the test, not hang it.
    let array = Arc::new(rig.array.take().unwrap());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let writer = array.clone();
    std::thread::spawn(move || {
        // A region no bit marks yet: its bit is persisted before the write.
        let _ = done_tx.send(writer.write(8 << 20, &vec![2u8; 65536]));
    });
    let written = done_rx.recv_timeout(std::time::Duration::from_secs(20));
    assert!(written.is_ok(), "the write hung");
    written.unwrap().unwrap();
    array.wait_rebuild().unwrap();
    assert_eq!(array.status().state, ArrayState::Optimal);
    let mut back = vec![0u8; 65536];
    array.read(8 << 20, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 2));
}

/// One read that fails on a drive in several places takes that drive out once: the failures it
/// reports after the hot spare took the slot must not fail the spare too.
#[test]
fn late_reports_of_a_failed_drive_do_not_fail_its_spare() {
    let rig = Rig::new(Level::Raid5, 3, 16 * 1024, 24 << 20);
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 3 % 241) as u8).collect();
    rig.array().write(0, &data).unwrap();
    rig.array().add_spare(drive("spare".into(), 24 << 20)).unwrap();
    rig.faults[1].fail();
    // 1 MiB over 16 KiB units: many of its pieces are on drive 1.
    let mut back = vec![0u8; data.len()];
    rig.array().read(0, &mut back).unwrap();
    assert!(back == data);
    let status = rig.array().status();
    assert_ne!(status.members[1].state, "failed", "the spare was failed: {status:?}");
    rig.array().wait_rebuild().unwrap();
    assert_eq!(rig.array().status().state, ArrayState::Optimal);
}

/// A write over two stripes whose second stripe cannot be written (it cannot be rebuilt while
/// degraded) fails, but what it already sent to the first stripe keeps its checksums: the
/// first stripe still reads back, the block written and the blocks never written alike.
#[test]
fn a_write_that_fails_part_way_keeps_the_checksums_of_what_it_wrote() {
    let rig = Rig::new(Level::Raid5, 3, 16 * 1024, 24 << 20);
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 5 % 239) as u8).collect();
    rig.array().write(0, &data).unwrap();
    rig.array().flush().unwrap();
    rig.array().fail_drive(0).unwrap();
    let layout = rig.array().layout();
    // Stripe 1's first row rots on both drives left: it cannot be rebuilt.
    for d in [1, 2] {
        rig.faults[d].flip_bit((layout.data_offset + 16 * 1024) * 8).unwrap();
    }
    // 4 KiB at the end of stripe 0 (32 KiB of data), then 4 KiB of stripe 1, which fails.
    assert!(rig.array().write(28 * 1024, &[9u8; 8192]).is_err());
    let mut back = vec![0u8; 32 * 1024];
    rig.array().read(0, &mut back).unwrap();
    assert!(back[..28 * 1024] == data[..28 * 1024], "blocks never written");
    assert!(back[28 * 1024..].iter().all(|&b| b == 9), "the block written");
}

/// After a crash, a mirror assembled without one of its drives still makes the copies it has
/// agree: copies left apart (a torn write), each with a valid checksum, would let a read
/// change value when the drive it came from fails.
#[test]
fn a_degraded_mirror_makes_its_copies_agree_after_a_crash() {
    let mut rig = Rig::new(Level::Raid1, 3, 16 * 1024, 24 << 20);
    let old = vec![1u8; 65536];
    rig.array().write(0, &old).unwrap();
    rig.array().flush().unwrap();
    rig.array().write(0, &vec![2u8; 65536]).unwrap();
    let layout = rig.array().layout();
    // A crash, with drive 2 still holding the old bytes (a torn write).
    std::mem::forget(rig.array.take().unwrap());
    rig.faults[2].write_at(layout.data_offset, stria_io::AlignedBuf::from_slice(&old)).unwrap();
    let array = Array::assemble(as_devs(&rig.faults[1..])).unwrap();
    assert_eq!(array.status().state, ArrayState::Degraded);
    let mut first = vec![0u8; old.len()];
    array.read(0, &mut first).unwrap();
    array.fail_drive(1).unwrap();
    let mut second = vec![0u8; old.len()];
    array.read(0, &mut second).unwrap();
    assert!(first == second, "the copies left apart: a read changed value when a drive failed");
}

/// A full-stripe write torn by a crash, recovered while a drive is missing, leaves parity that
/// matches no data (resync needs every chunk); once the drive is back and rebuilt, the stripe's
/// parity agrees with its data again and a check is clean.
#[test]
fn a_torn_full_stripe_recovered_degraded_has_consistent_parity_after_the_drive_returns() {
    let mut rig = Rig::new(Level::Raid6, 6, 16 * 1024, 24 << 20);
    let stripe_bytes = 4 * 16 * 1024;
    rig.array().write(0, &vec![1u8; stripe_bytes]).unwrap();
    rig.array().flush().unwrap();
    let layout = rig.array().layout();
    let old_chunk = rig.faults[4].read_at(layout.data_offset, 16 * 1024).unwrap();
    rig.array().write(0, &vec![2u8; stripe_bytes]).unwrap();
    // A crash in the middle of that full-stripe write: drive 4 never got its part.
    std::mem::forget(rig.array.take().unwrap());
    rig.faults[4].write_at(layout.data_offset, old_chunk).unwrap();
    let without_2: Vec<Arc<FaultDevice>> =
        rig.faults.iter().enumerate().filter(|(i, _)| *i != 2).map(|(_, f)| f.clone()).collect();
    let degraded = Array::assemble(as_devs(&without_2)).unwrap();
    assert_eq!(degraded.status().state, ArrayState::Degraded);
    degraded.close().unwrap();
    let array = Array::assemble(as_devs(&rig.faults)).unwrap();
    array.wait_rebuild().unwrap();
    assert_eq!(array.status().state, ArrayState::Optimal);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let report = array.scrub(false, None, &stop, &mut |_, _| {}).unwrap();
    assert!(report.clean(), "after the returning drive's resync: {report:?}");
}
