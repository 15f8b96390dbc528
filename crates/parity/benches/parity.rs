//! Single-thread, cache-hot throughput of every parity kernel this CPU can run, next to ISA-L
//! (Debian's libisal) on the same buffers in the same process.
//!
//! Each stripe holds 1 MiB of data (4 x 256 KiB or 8 x 128 KiB chunks); with parity it stays
//! under 1.5 MiB, which fits in L2 plus L3 (1 MiB and 32 MiB on the development machine), and
//! every operation runs back to back on the same buffers, so nothing comes from DRAM; at that
//! size the fastest kernels are bound by cache bandwidth. One extra 8+2 row uses a 32 KiB stripe that fits in L1, to show arithmetic speed.
//! GB/s counts data bytes only (10^9 bytes per GB), and each figure is the best of several runs.
//!
//! Run with `cargo bench -p stria-parity`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use isal_ref::{AlignedBuf, EcTables};
use stria_parity::{Kernel, gf};

const STRIPE_DATA_BYTES: usize = 1 << 20;
/// An extra, smaller stripe whose data and parity (40 KiB) fit in a 48 KiB L1: it shows the
/// kernels' arithmetic rate where the 1 MiB figures are bound by cache bandwidth.
const L1_STRIPE_DATA_BYTES: usize = 32 << 10;
const RUNS: usize = 9;
/// Each run repeats the operation for at least this long, so timer resolution is irrelevant.
const RUN_DURATION_MIN: Duration = Duration::from_millis(25);

/// Seconds per operation, the best over `RUNS` runs.
fn seconds_per_op(mut op: impl FnMut()) -> f64 {
    // Warm the caches and pick an iteration count from one timed call.
    op();
    let start = Instant::now();
    op();
    let single = start.elapsed().max(Duration::from_nanos(100));
    let iterations = (RUN_DURATION_MIN.as_secs_f64() / single.as_secs_f64()).ceil() as usize;
    (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations.max(1) {
                op();
            }
            start.elapsed().as_secs_f64() / iterations.max(1) as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn gb_per_s(seconds: f64) -> f64 {
    gb_per_s_for(STRIPE_DATA_BYTES, seconds)
}

fn gb_per_s_for(stripe_data_bytes: usize, seconds: f64) -> f64 {
    stripe_data_bytes as f64 / seconds / 1e9
}

/// `count` chunks of `len` pseudo-random bytes, 64-byte aligned (ISA-L's rules and ours alike).
fn random_chunks(count: usize, len: usize, seed: u64) -> Vec<AlignedBuf> {
    let mut state = seed | 1;
    (0..count)
        .map(|_| {
            let mut chunk = AlignedBuf::zeroed(len);
            for byte in chunk.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *byte = state as u8;
            }
            chunk
        })
        .collect()
}

fn refs(chunks: &[AlignedBuf]) -> Vec<&[u8]> {
    chunks.iter().map(|c| &c[..]).collect()
}

struct Row {
    operation: String,
    implementation: String,
    gb_s: f64,
    reference_gb_s: Option<f64>,
}

fn print_table(rows: &[Row]) {
    println!("{:<38} {:<44} {:>8} {:>11}", "operation", "implementation", "GB/s", "ours/ISA-L");
    println!("{}", "-".repeat(38 + 1 + 44 + 1 + 8 + 1 + 11));
    let mut previous = "";
    for row in rows {
        let operation = if row.operation == previous { "" } else { &row.operation };
        previous = &row.operation;
        let ratio = row.reference_gb_s.map_or(String::new(), |r| format!("{:.2}x", row.gb_s / r));
        println!("{:<38} {:<44} {:>8.2} {:>11}", operation, row.implementation, row.gb_s, ratio);
    }
}

fn bench_pq_encode(rows: &mut Vec<Row>, data_count: usize, stripe_data_bytes: usize) {
    let len = stripe_data_bytes / data_count;
    let operation = if stripe_data_bytes == STRIPE_DATA_BYTES {
        format!("P/Q encode {data_count}+2 ({} KiB chunks)", len / 1024)
    } else {
        format!("P/Q encode {data_count}+2, {} KiB stripe (L1)", stripe_data_bytes / 1024)
    };
    let gb_per_s = |seconds| gb_per_s_for(stripe_data_bytes, seconds);
    let data = random_chunks(data_count, len, data_count as u64);
    let data = refs(&data);
    let mut p = AlignedBuf::zeroed(len);
    let mut q = AlignedBuf::zeroed(len);

    // ISA-L first, both as the reference figure and to check our bytes against.
    let isal = gb_per_s(seconds_per_op(|| {
        isal_ref::pq_gen_aligned(black_box(&data), &mut p, &mut q);
        black_box((&p, &q));
    }));
    let (p_isal, q_isal) = (p.to_vec(), q.to_vec());

    for kernel in Kernel::available() {
        p.fill(0);
        q.fill(0);
        kernel.pq_gen(&data, &mut p, &mut q);
        assert!(p[..] == p_isal[..] && q[..] == q_isal[..], "{kernel} disagrees with ISA-L");
        let ours = gb_per_s(seconds_per_op(|| {
            kernel.pq_gen(black_box(&data), &mut p, &mut q);
            black_box((&p, &q));
        }));
        rows.push(Row {
            operation: operation.clone(),
            implementation: format!("stria {}", kernel.name()),
            gb_s: ours,
            reference_gb_s: Some(isal),
        });
    }
    rows.push(Row {
        operation: operation.clone(),
        implementation: "ISA-L pq_gen (reference)".into(),
        gb_s: isal,
        reference_gb_s: None,
    });

    let tables = EcTables::cauchy(data_count, 2);
    let rs = gb_per_s(seconds_per_op(|| {
        tables.encode(black_box(&data), &mut [&mut p, &mut q]);
        black_box((&p, &q));
    }));
    rows.push(Row {
        operation,
        implementation: format!("ISA-L ec_encode_data (Cauchy RS {data_count}+2)"),
        gb_s: rs,
        reference_gb_s: None,
    });
}

fn bench_xor(rows: &mut Vec<Row>, data_count: usize) {
    let len = STRIPE_DATA_BYTES / data_count;
    let operation = format!("XOR {data_count}+1 ({} KiB chunks)", len / 1024);
    let data = random_chunks(data_count, len, 99);
    let data = refs(&data);
    let mut p = AlignedBuf::zeroed(len);

    let isal = gb_per_s(seconds_per_op(|| {
        isal_ref::xor_gen_aligned(black_box(&data), &mut p);
        black_box(&p);
    }));
    let p_isal = p.to_vec();

    for kernel in Kernel::available() {
        p.fill(0);
        kernel.xor_gen(&data, &mut p);
        assert!(p[..] == p_isal[..], "{kernel} disagrees with ISA-L");
        let ours = gb_per_s(seconds_per_op(|| {
            kernel.xor_gen(black_box(&data), &mut p);
            black_box(&p);
        }));
        rows.push(Row {
            operation: operation.clone(),
            implementation: format!("stria {}", kernel.name()),
            gb_s: ours,
            reference_gb_s: Some(isal),
        });
    }
    rows.push(Row {
        operation,
        implementation: "ISA-L xor_gen (reference)".into(),
        gb_s: isal,
        reference_gb_s: None,
    });
}

/// Rebuilding two lost data chunks of an 8+2 stripe. ISA-L has no RAID 6 recovery routine, so
/// its figure is `ec_encode_data` run as a decoder: the same two rows of coefficients over the
/// same eight survivors, which is how an ISA-L user would recover.
fn bench_two_data_reconstruct(rows: &mut Vec<Row>) {
    const DATA_COUNT: usize = 8;
    const LOST: [usize; 2] = [2, 5];
    let len = STRIPE_DATA_BYTES / DATA_COUNT;
    let operation = format!("reconstruct 2 data of 8+2 ({} KiB)", len / 1024);
    let mut chunks = random_chunks(DATA_COUNT + 2, len, 7);
    {
        let (data, parity) = chunks.split_at_mut(DATA_COUNT);
        let [p, q] = parity else { unreachable!("two parity chunks") };
        Kernel::Scalar.pq_gen(&refs(data), p, q);
    }
    let original: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();

    // Survivors in stripe order, and md's recovery coefficients (see reconstruct.rs).
    let survivors: Vec<usize> = (0..DATA_COUNT + 2).filter(|i| !LOST.contains(i)).collect();
    let [x, y] = LOST;
    let c2 = gf::inv(gf::exp(x) ^ gf::exp(y));
    let c1 = gf::mul(gf::exp(y), c2);
    let row_x: Vec<u8> = survivors
        .iter()
        .map(|&i| match i {
            DATA_COUNT => c1,
            _ if i == DATA_COUNT + 1 => c2,
            _ => c1 ^ gf::mul(c2, gf::exp(i)),
        })
        .collect();
    let row_y: Vec<u8> = row_x
        .iter()
        .zip(&survivors)
        .map(|(&c, &i)| if i == DATA_COUNT + 1 { c } else { c ^ 1 })
        .collect();
    let tables = isal_ref::ec_init_tables(survivors.len(), 2, &[row_x, row_y].concat());

    let isal = {
        let mut lost_x = AlignedBuf::zeroed(len);
        let mut lost_y = AlignedBuf::zeroed(len);
        let sources: Vec<&[u8]> = survivors.iter().map(|&i| &chunks[i][..]).collect();
        tables.encode(&sources, &mut [&mut lost_x, &mut lost_y]);
        assert!(lost_x[..] == original[x][..] && lost_y[..] == original[y][..], "ISA-L decode");
        gb_per_s(seconds_per_op(|| {
            tables.encode(black_box(&sources), &mut [&mut lost_x, &mut lost_y]);
            black_box((&lost_x, &lost_y));
        }))
    };

    for kernel in Kernel::available() {
        let mut stripe: Vec<&mut [u8]> = chunks.iter_mut().map(|c| &mut c[..]).collect();
        stripe[x].fill(0xa5);
        stripe[y].fill(0x5a);
        kernel.reconstruct(&mut stripe, DATA_COUNT, &LOST).expect("two of 8+2 are recoverable");
        assert!(stripe[x][..] == original[x][..] && stripe[y][..] == original[y][..], "{kernel}");
        let ours = gb_per_s(seconds_per_op(|| {
            kernel
                .reconstruct(black_box(&mut stripe), DATA_COUNT, &LOST)
                .expect("two of 8+2 are recoverable");
            black_box(&stripe);
        }));
        rows.push(Row {
            operation: operation.clone(),
            implementation: format!("stria {}", kernel.name()),
            gb_s: ours,
            reference_gb_s: Some(isal),
        });
    }
    rows.push(Row {
        operation,
        implementation: "ISA-L ec_encode_data as decoder (reference)".into(),
        gb_s: isal,
        reference_gb_s: None,
    });
}

fn main() {
    println!(
        "stria-parity: 1 thread, cache-hot, 1 MiB of data per stripe, GB/s of data \
         (1e9 B/s), best of {RUNS} runs of >= {} ms; kernels available: {}",
        RUN_DURATION_MIN.as_millis(),
        Kernel::available().iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
    );
    let mut rows = Vec::new();
    bench_pq_encode(&mut rows, 4, STRIPE_DATA_BYTES);
    bench_pq_encode(&mut rows, 8, STRIPE_DATA_BYTES);
    bench_xor(&mut rows, 8);
    bench_two_data_reconstruct(&mut rows);
    bench_pq_encode(&mut rows, 8, L1_STRIPE_DATA_BYTES);
    print_table(&rows);
}
