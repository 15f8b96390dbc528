//! One conformance suite for every `BlockDevice`: whatever backs a drive, the array above must
//! see the same behaviour — data round-trips, many requests in flight, bad requests rejected
//! without side effects, FUA/flush/discard, and counters that match what was done.

// Tests unwrap freely: a panic is the failure report.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{ScratchDir, pattern};
use stria_io::fault::FaultDevice;
use stria_io::file::{Backend, DriveOptions, create_drive_file, open_drive};
use stria_io::mem::MemDevice;
use stria_io::{AlignedBuf, BlockDevice, DriveStatsSnapshot, IO_BYTES_MAX, IoDone, IoError, IoOp};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
const CAPACITY_BYTES: u64 = 64 * MIB as u64;

/// A device under test, the backend it must report, and whatever keeps its files alive.
struct Subject {
    dev: Arc<dyn BlockDevice>,
    backend: &'static str,
    _scratch: Option<ScratchDir>,
}

/// What the device should hold: every successful write is applied here too.
struct Model {
    bytes: Vec<u8>,
}

impl Model {
    fn write(&mut self, offset: u64, data: &[u8]) {
        let start = offset as usize;
        self.bytes[start..start + data.len()].copy_from_slice(data);
    }

    fn zero(&mut self, offset: u64, len: usize) {
        let start = offset as usize;
        self.bytes[start..start + len].fill(0);
    }

    fn slice(&self, offset: u64, len: usize) -> &[u8] {
        &self.bytes[offset as usize..offset as usize + len]
    }
}

/// Runs the whole suite against the device `make` builds with the given capacity.
fn conformance(make: impl FnOnce(u64) -> Subject) {
    let subject = make(CAPACITY_BYTES);
    let dev = subject.dev.as_ref();
    let mut model = Model { bytes: vec![0; CAPACITY_BYTES as usize] };

    reports_capacity_backend_and_starts_zeroed(dev, subject.backend);
    round_trips_at_many_offsets_and_sizes(dev, &mut model);
    keeps_256_requests_in_flight_from_one_thread(dev, &mut model);
    serves_8_threads_at_once(dev, &mut model);
    rejects_bad_requests_without_side_effects(dev, &model);
    fua_writes_and_flushes_succeed(dev, &mut model);
    discarded_ranges_read_back_as_zeros(dev, &mut model);
    counts_exactly_what_was_done(dev, &mut model);
    matches_model(dev, &model);
}

fn matches_model(dev: &dyn BlockDevice, model: &Model) {
    let chunk = 4 * MIB;
    for offset in (0..CAPACITY_BYTES).step_by(chunk) {
        let got = dev.read_at(offset, chunk).unwrap();
        if got[..] != *model.slice(offset, chunk) {
            let first = got.iter().zip(model.slice(offset, chunk)).position(|(a, b)| a != b);
            panic!(
                "{}: contents differ from the model near byte {:?}",
                dev.name(),
                first.map(|i| offset + i as u64)
            );
        }
    }
}

fn write(dev: &dyn BlockDevice, model: &mut Model, offset: u64, data: AlignedBuf) {
    model.write(offset, &data);
    dev.write_at(offset, data).unwrap();
}

fn reports_capacity_backend_and_starts_zeroed(dev: &dyn BlockDevice, backend: &str) {
    assert_eq!(dev.capacity_bytes(), CAPACITY_BYTES);
    assert_eq!(dev.backend(), backend);
    let head = dev.read_at(0, 64 * KIB).unwrap();
    let tail = dev.read_at(CAPACITY_BYTES - 64 * KIB as u64, 64 * KIB).unwrap();
    assert!(head.iter().chain(tail.iter()).all(|&b| b == 0), "a new device reads as zeros");
}

fn round_trips_at_many_offsets_and_sizes(dev: &dyn BlockDevice, model: &mut Model) {
    let sizes = [4 * KIB, 8 * KIB, 12 * KIB, 64 * KIB, MIB, 4 * MIB];
    let mut seed = 1;
    for size in sizes {
        for offset in [0, 7 * 4096, (MIB + 3 * 4096) as u64, CAPACITY_BYTES - size as u64] {
            seed += 1;
            let data = pattern(seed, size);
            write(dev, model, offset, data.clone());
            let back = dev.read_at(offset, size).unwrap();
            assert!(back == data, "{}: {size} bytes at {offset} did not round-trip", dev.name());
        }
    }
    // Later writes overlapped earlier ones; the model says what must have survived.
    matches_model(dev, model);
}

fn keeps_256_requests_in_flight_from_one_thread(dev: &dyn BlockDevice, model: &mut Model) {
    let base = 16 * MIB as u64;
    let offsets: Vec<u64> = (0..256).map(|i| base + i * 8192).collect();
    let tickets: Vec<_> = offsets
        .iter()
        .map(|&offset| {
            let data = pattern(offset, 4096);
            model.write(offset, &data);
            dev.submit(IoOp::Write { offset, data, fua: false })
        })
        .collect();
    for ticket in tickets {
        assert!(matches!(ticket.wait(), Ok(IoDone::Done)));
    }
    let tickets: Vec<_> =
        offsets.iter().map(|&offset| dev.submit(IoOp::Read { offset, len: 8192 })).collect();
    for (ticket, &offset) in tickets.into_iter().zip(&offsets) {
        match ticket.wait() {
            Ok(IoDone::Read(buf)) => assert_eq!(&buf[..], model.slice(offset, 8192)),
            other => panic!("read at {offset}: {other:?}"),
        }
    }
}

fn serves_8_threads_at_once(dev: &dyn BlockDevice, model: &mut Model) {
    let base = 24 * MIB as u64;
    let region = 2 * MIB as u64;
    let written: Vec<Vec<(u64, AlignedBuf)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8u64)
            .map(|thread| {
                scope.spawn(move || {
                    let start = base + thread * region;
                    let writes: Vec<(u64, AlignedBuf)> = (0..64u64)
                        .map(|i| (start + i * 16384, pattern(thread * 1000 + i, 16384)))
                        .collect();
                    // Batches of 16 in flight per thread, 128 across the device.
                    for batch in writes.chunks(16) {
                        let tickets: Vec<_> = batch
                            .iter()
                            .map(|(offset, data)| {
                                dev.submit(IoOp::Write {
                                    offset: *offset,
                                    data: data.clone(),
                                    fua: false,
                                })
                            })
                            .collect();
                        for ticket in tickets {
                            ticket.wait().unwrap();
                        }
                    }
                    for batch in writes.chunks(16) {
                        let tickets: Vec<_> = batch
                            .iter()
                            .map(|(offset, _)| {
                                dev.submit(IoOp::Read { offset: *offset, len: 16384 })
                            })
                            .collect();
                        for (ticket, (offset, data)) in tickets.into_iter().zip(batch) {
                            match ticket.wait() {
                                Ok(IoDone::Read(buf)) => {
                                    assert!(buf == *data, "thread {thread} at {offset}")
                                }
                                other => panic!("thread {thread} read at {offset}: {other:?}"),
                            }
                        }
                    }
                    writes
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for (offset, data) in written.iter().flatten() {
        model.write(*offset, data);
    }
}

fn rejects_bad_requests_without_side_effects(dev: &dyn BlockDevice, model: &Model) {
    let cap = CAPACITY_BYTES;
    let errors_before = dev.stats().snapshot().errors;
    type ExpectedError = fn(&IoError) -> bool;
    let cases: Vec<(IoOp, ExpectedError)> = vec![
        (IoOp::Read { offset: 512, len: 4096 }, |e| matches!(e, IoError::Misaligned { .. })),
        (IoOp::Read { offset: 0, len: 100 }, |e| matches!(e, IoError::Misaligned { .. })),
        (IoOp::Write { offset: 4097, data: pattern(9, 4096), fua: false }, |e| {
            matches!(e, IoError::Misaligned { .. })
        }),
        (IoOp::Write { offset: 0, data: pattern(9, 4097), fua: false }, |e| {
            matches!(e, IoError::Misaligned { .. })
        }),
        (IoOp::Discard { offset: 4096, len: 10 }, |e| matches!(e, IoError::Misaligned { .. })),
        (IoOp::Read { offset: cap, len: 4096 }, |e| matches!(e, IoError::OutOfRange { .. })),
        (IoOp::Write { offset: cap - 4096, data: pattern(9, 8192), fua: true }, |e| {
            matches!(e, IoError::OutOfRange { .. })
        }),
        // offset + len overflows u64; must not wrap around to a valid range.
        (IoOp::Read { offset: u64::MAX - 4095, len: 8192 }, |e| {
            matches!(e, IoError::OutOfRange { .. })
        }),
        (IoOp::Discard { offset: cap, len: 4096 }, |e| matches!(e, IoError::OutOfRange { .. })),
        (IoOp::Read { offset: 0, len: IO_BYTES_MAX + 4096 }, |e| {
            matches!(e, IoError::TooLarge { .. })
        }),
        (IoOp::Write { offset: 0, data: pattern(9, IO_BYTES_MAX + 4096), fua: false }, |e| {
            matches!(e, IoError::TooLarge { .. })
        }),
    ];
    let count = cases.len() as u64;
    for (op, expected) in cases {
        let description = format!("{op:?}");
        match dev.submit(op).wait() {
            Err(e) => assert!(expected(&e), "{description}: wrong error {e}"),
            Ok(_) => panic!("{description} was accepted"),
        }
    }
    assert_eq!(dev.stats().snapshot().errors - errors_before, count);
    matches_model(dev, model);
}

fn fua_writes_and_flushes_succeed(dev: &dyn BlockDevice, model: &mut Model) {
    let offset = 44 * MIB as u64;
    let data = pattern(4242, 128 * KIB);
    model.write(offset, &data);
    dev.submit(IoOp::Write { offset, data: data.clone(), fua: true }).wait().unwrap();
    dev.flush().unwrap();
    assert!(dev.read_at(offset, data.len()).unwrap() == data);
    // A flush with nothing written since is still a valid request.
    dev.flush().unwrap();
}

fn discarded_ranges_read_back_as_zeros(dev: &dyn BlockDevice, model: &mut Model) {
    let offset = 48 * MIB as u64;
    write(dev, model, offset, pattern(77, 3 * MIB));
    // One block in the middle, and a large aligned range at the end.
    let discards = [(offset + 4096, 4096), (offset + MIB as u64, 2 * MIB)];
    for (at, len) in discards {
        dev.submit(IoOp::Discard { offset: at, len }).wait().unwrap();
        model.zero(at, len);
    }
    let back = dev.read_at(offset, 3 * MIB).unwrap();
    assert_eq!(&back[..], model.slice(offset, 3 * MIB));
    assert!(back[4096..8192].iter().all(|&b| b == 0));
    assert!(back[..4096].iter().any(|&b| b != 0), "neighbours of a discard keep their data");
}

fn counts_exactly_what_was_done(dev: &dyn BlockDevice, model: &mut Model) {
    let before = dev.stats().snapshot();
    let base = 56 * MIB as u64;
    write(dev, model, base, pattern(1, 4 * KIB));
    write(dev, model, base + MIB as u64, pattern(2, MIB));
    let fua = pattern(3, 8 * KIB);
    model.write(base + 2 * MIB as u64, &fua);
    dev.submit(IoOp::Write { offset: base + 2 * MIB as u64, data: fua, fua: true }).wait().unwrap();
    dev.read_at(base, 4 * KIB).unwrap();
    dev.read_at(base, 64 * KIB).unwrap();
    assert_eq!(dev.read_at(base, 0).unwrap().len(), 0, "a zero-length read is valid and empty");
    dev.flush().unwrap();
    dev.flush().unwrap();
    dev.submit(IoOp::Discard { offset: base + 3 * MIB as u64, len: 4096 }).wait().unwrap();
    model.zero(base + 3 * MIB as u64, 4096);
    assert!(dev.read_at(1, 4096).is_err());
    assert!(dev.write_at(CAPACITY_BYTES, pattern(4, 4096)).is_err());

    let after = dev.stats().snapshot();
    let delta = |f: fn(&DriveStatsSnapshot) -> u64| f(&after) - f(&before);
    assert_eq!(delta(|s| s.write_ops), 3);
    assert_eq!(delta(|s| s.write_bytes), (4 * KIB + MIB + 8 * KIB) as u64);
    assert_eq!(delta(|s| s.read_ops), 3);
    assert_eq!(delta(|s| s.read_bytes), (4 * KIB + 64 * KIB) as u64);
    assert_eq!(delta(|s| s.flush_ops), 2);
    assert_eq!(delta(|s| s.discard_ops), 1);
    assert_eq!(delta(|s| s.errors), 2);
    let histogram_delta = |a: &[u64], b: &[u64]| a.iter().sum::<u64>() - b.iter().sum::<u64>();
    assert_eq!(histogram_delta(&after.read_latency, &before.read_latency), 3);
    assert_eq!(histogram_delta(&after.write_latency, &before.write_latency), 3);
}

fn file_subject(
    label: &str,
    backend: Backend,
    direct_io: bool,
    queue_depth: u32,
) -> impl FnOnce(u64) -> Subject {
    let label = label.to_string();
    move |capacity| {
        let scratch = ScratchDir::new(&label);
        let path = scratch.path().join("drive0");
        create_drive_file(&path, capacity).unwrap();
        let opts = DriveOptions { backend, direct_io, queue_depth, ..DriveOptions::default() };
        let dev = open_drive(&path, &opts).unwrap();
        let expected = match (backend, direct_io) {
            (Backend::Uring, true) => "io_uring+O_DIRECT",
            (Backend::Uring, false) => "io_uring (buffered)",
            (Backend::ThreadPool, true) => "threadpool+O_DIRECT",
            (Backend::ThreadPool, false) => "threadpool (buffered)",
            (Backend::Auto, _) => unreachable!("conformance names the backend it tests"),
        };
        Subject { dev, backend: expected, _scratch: Some(scratch) }
    }
}

#[test]
fn memory_device_conforms() {
    conformance(|capacity| Subject {
        dev: Arc::new(MemDevice::new("mem0", capacity)),
        backend: "memory",
        _scratch: None,
    });
}

#[test]
fn io_uring_direct_file_conforms() {
    conformance(file_subject("uring-direct", Backend::Uring, true, 128));
}

#[test]
fn io_uring_with_a_shallow_queue_conforms() {
    // Depth 2 keeps most of the 256 concurrent requests queued outside the ring.
    conformance(file_subject("uring-shallow", Backend::Uring, true, 2));
}

#[test]
fn io_uring_buffered_file_conforms() {
    conformance(file_subject("uring-buffered", Backend::Uring, false, 128));
}

#[test]
fn threadpool_direct_file_conforms() {
    conformance(file_subject("pool-direct", Backend::ThreadPool, true, 128));
}

#[test]
fn threadpool_buffered_file_conforms() {
    conformance(file_subject("pool-buffered", Backend::ThreadPool, false, 128));
}

#[test]
fn fault_device_without_faults_conforms() {
    conformance(|capacity| Subject {
        dev: Arc::new(FaultDevice::new(Arc::new(MemDevice::new("mem0", capacity)))),
        backend: "fault(memory)",
        _scratch: None,
    });
}

#[test]
fn fault_device_over_io_uring_without_faults_conforms() {
    let make_file = file_subject("fault-uring", Backend::Uring, true, 128);
    conformance(|capacity| {
        let inner = make_file(capacity);
        Subject {
            dev: Arc::new(FaultDevice::new(inner.dev)),
            backend: "fault(io_uring+O_DIRECT)",
            _scratch: inner._scratch,
        }
    });
}
