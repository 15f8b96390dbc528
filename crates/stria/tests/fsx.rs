//! An fsx-style exerciser through the FUSE mount: a seeded random sequence of writes (small and
//! large, inside the inode and across chunks, past the end leaving holes), truncates (shrinking
//! and growing), reads, mmap reads, fsyncs and reopens on a few files, every result compared
//! with an in-memory model of each file. A second handle on the same file reads alongside.
//!
//! The CI run is short. For long runs (hours):
//!   STRIA_FSX_OPS=2000000 cargo test -p stria --test fsx -- --nocapture
//! and to replay a failure, STRIA_FSX_SEED=<the seed it printed>. STRIA_FSX_WRITEBACK=1 runs
//! it on a mount with the kernel's writeback cache (`stria up --writeback-cache`).
//!
//! `two_mounts_hand_files_over_with_close_to_open` runs a like sequence over two mounts of one
//! node (`stria up`'s and a `stria mount`): each file is open on one mount at a time and moves
//! to the other through a close and an open, which is what close-to-open consistency promises;
//! files are also replaced by a rename from the other mount while this one has the name cached.
//! STRIA_FSX_OPS and STRIA_FSX_SEED apply to it too.

mod support;

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use support::node::{Node, SecondMount, require_fuse, scratch};

/// Files are kept under this size so the model stays small; large enough to span chunks of
/// the default 1 MiB stripe.
const FILE_BYTES_MAX: u64 = 6 << 20;
const FILES: usize = 3;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// Sizes skewed small: most operations are a few KiB, some reach a MiB or more.
    fn len(&mut self) -> u64 {
        match self.below(10) {
            0..=4 => 1 + self.below(4096),
            5..=7 => 1 + self.below(64 << 10),
            _ => 1 + self.below(1536 << 10),
        }
    }
}

struct Subject {
    path: PathBuf,
    file: File,
    /// A second handle, opened read-only: it must see what the first one wrote.
    reader: File,
    model: Vec<u8>,
}

impl Subject {
    fn open(path: &Path, create: bool) -> (File, File) {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(create)
            .open(path)
            .expect("open");
        let reader = File::open(path).expect("open reader");
        (file, reader)
    }
}

/// What happened, for the failure message.
struct Log(Vec<String>);

impl Log {
    fn push(&mut self, entry: String) {
        if self.0.len() == 64 {
            self.0.remove(0);
        }
        self.0.push(entry);
    }
}

fn check(seed: u64, log: &Log, what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    panic!(
        "fsx seed {seed}: {what}: got {} bytes, expected {}; first difference at {first:?}\nlast operations:\n  {}",
        got.len(),
        want.len(),
        log.0.join("\n  ")
    );
}

fn read_exact_at(file: &File, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], offset + done as u64).expect("read") {
            0 => break,
            n => done += n,
        }
    }
    buf.truncate(done);
    buf
}

/// Reads through a shared read-only mapping of the whole file.
fn mmap_read(file: &File, offset: usize, len: usize, size: usize) -> Vec<u8> {
    if size == 0 || len == 0 {
        return Vec::new();
    }
    // SAFETY: a fresh read-only shared mapping of `size` bytes of an open file; it is read
    // within bounds and unmapped before returning.
    unsafe {
        let ptr = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let bytes = std::slice::from_raw_parts(ptr as *const u8, size);
        let out = bytes[offset..offset + len].to_vec();
        libc::munmap(ptr, size);
        out
    }
}

/// The seed (STRIA_FSX_SEED, else the clock) and the operation count (STRIA_FSX_OPS, else
/// `default_ops`), printed so a failure can be replayed.
fn seed_and_ops(default_ops: u64) -> (u64, u64) {
    let seed =
        std::env::var("STRIA_FSX_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let ops = std::env::var("STRIA_FSX_OPS").ok().and_then(|s| s.parse().ok());
    let ops = ops.unwrap_or(default_ops);
    println!("fsx: seed {seed}, {ops} operations (replay with STRIA_FSX_SEED={seed})");
    (seed, ops)
}

/// A write of up to [`Rng::len`] bytes anywhere up to a little past the end: its offset and
/// bytes, already applied to `model`.
fn random_write(rng: &mut Rng, model: &mut Vec<u8>) -> (u64, Vec<u8>) {
    let size = model.len() as u64;
    let offset = rng.below((size + (256 << 10)).min(FILE_BYTES_MAX));
    let len = rng.len().min(FILE_BYTES_MAX - offset).max(1);
    let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    let end = (offset + len) as usize;
    if model.len() < end {
        model.resize(end, 0);
    }
    model[offset as usize..end].copy_from_slice(&data);
    (offset, data)
}

#[test]
fn random_file_operations_match_a_model() {
    require_fuse();
    let (seed, ops) = seed_and_ops(1500);
    let dir = scratch("fsx");
    let mut args = vec!["--drives", "4", "--drive-size", "256M", "--raid", "5"];
    if std::env::var_os("STRIA_FSX_WRITEBACK").is_some() {
        args.push("--writeback-cache");
        println!("fsx: on a mount with the writeback cache");
    }
    let node = Node::start(&dir, &args);
    let mut rng = Rng(seed);
    let mut log = Log(Vec::new());
    let mut subjects: Vec<Subject> = (0..FILES)
        .map(|i| {
            let path = node.mount.join(format!("fsx{i}"));
            let (file, reader) = Subject::open(&path, true);
            Subject { path, file, reader, model: Vec::new() }
        })
        .collect();
    let mut counts = [0u64; 8];
    for n in 0..ops {
        let s = &mut subjects[rng.below(FILES as u64) as usize];
        let size = s.model.len() as u64;
        let op = rng.below(100);
        match op {
            // Write: anywhere up to a little past the end (leaving a hole).
            0..=39 => {
                let (offset, data) = random_write(&mut rng, &mut s.model);
                let len = data.len();
                log.push(format!("#{n} write {} at {offset} len {len}", s.path.display()));
                s.file.write_all_at(&data, offset).expect("write");
                counts[0] += 1;
            }
            // Read a range through either handle.
            40..=59 => {
                let offset = rng.below(size + 4096);
                let len = rng.len() as usize;
                let handle = if rng.below(2) == 0 { &s.file } else { &s.reader };
                log.push(format!("#{n} read {} at {offset} len {len}", s.path.display()));
                let got = read_exact_at(handle, offset, len);
                let start = (offset as usize).min(s.model.len());
                let end = (offset as usize + len).min(s.model.len());
                check(seed, &log, "read", &got, &s.model[start..end]);
                counts[1] += 1;
            }
            // Truncate: shrink, or grow (a hole at the end).
            60..=67 => {
                let to =
                    if rng.below(2) == 0 { rng.below(size + 1) } else { rng.below(FILE_BYTES_MAX) };
                log.push(format!("#{n} truncate {} to {to}", s.path.display()));
                s.file.set_len(to).expect("truncate");
                s.model.resize(to as usize, 0);
                counts[2] += 1;
            }
            // mmap read.
            68..=75 => {
                if size > 0 {
                    let offset = rng.below(size) as usize;
                    let len = (rng.len() as usize).min(size as usize - offset);
                    log.push(format!("#{n} mmap-read {} at {offset} len {len}", s.path.display()));
                    let got = mmap_read(&s.reader, offset, len, size as usize);
                    check(seed, &log, "mmap read", &got, &s.model[offset..offset + len]);
                }
                counts[3] += 1;
            }
            // The size both handles see.
            76..=83 => {
                log.push(format!("#{n} stat {}", s.path.display()));
                let a = s.file.metadata().expect("fstat").len();
                let b = std::fs::metadata(&s.path).expect("stat").len();
                if a != size || b != size {
                    panic!(
                        "fsx seed {seed}: size: fstat {a}, stat {b}, model {size}\n  {}",
                        log.0.join("\n  ")
                    );
                }
                counts[4] += 1;
            }
            // fsync.
            84..=89 => {
                log.push(format!("#{n} fsync {}", s.path.display()));
                s.file.sync_all().expect("fsync");
                counts[5] += 1;
            }
            // Close both handles and reopen; then read it all.
            90..=97 => {
                log.push(format!("#{n} reopen {}", s.path.display()));
                let (file, reader) = Subject::open(&s.path, false);
                s.file = file;
                s.reader = reader;
                let got = std::fs::read(&s.path).expect("read whole");
                check(seed, &log, "whole file after reopen", &got, &s.model);
                counts[6] += 1;
            }
            // Compare everything through a fresh open.
            _ => {
                log.push(format!("#{n} verify {}", s.path.display()));
                let got = std::fs::read(&s.path).expect("read whole");
                check(seed, &log, "whole file", &got, &s.model);
                counts[7] += 1;
            }
        }
    }
    // Finally every file, whole, after closing everything.
    for s in subjects.drain(..) {
        drop(s.file);
        drop(s.reader);
        let got = std::fs::read(&s.path).expect("read whole");
        check(seed, &log, "final whole file", &got, &s.model);
    }
    println!(
        "fsx: seed {seed}: writes {} reads {} truncates {} mmap-reads {} stats {} fsyncs {} reopens {} verifies {}",
        counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], counts[6], counts[7]
    );
    assert!(counts.iter().all(|c| *c > 0) || ops < 200, "every kind of operation ran: {counts:?}");
}

/// One file of the two-mount run: its name, the mount it is open on now, that mount's
/// handle, and the model.
struct Handed {
    name: String,
    on: usize,
    file: File,
    model: Vec<u8>,
}

/// Closes `file` (leaving /dev/null in its place) before anything else is opened.
fn close(file: &mut File) {
    drop(std::mem::replace(file, File::open("/dev/null").expect("open /dev/null")));
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).expect("open")
}

#[test]
fn two_mounts_hand_files_over_with_close_to_open() {
    require_fuse();
    let (seed, ops) = seed_and_ops(1200);
    let dir = scratch("fsx-two");
    let node = Node::start(&dir, &["--drives", "4", "--drive-size", "256M", "--raid", "5"]);
    let second = SecondMount::start(&node, &dir.join("m2"));
    let mounts = [node.mount.clone(), second.path.clone()];
    let mut rng = Rng(seed);
    let mut log = Log(Vec::new());
    let mut files: Vec<Handed> = (0..FILES)
        .map(|i| {
            let name = format!("two{i}");
            let on = i % 2;
            let file = open_rw(&mounts[on].join(&name));
            Handed { name, on, file, model: Vec::new() }
        })
        .collect();
    let mut counts = [0u64; 7];
    for n in 0..ops {
        let f = &mut files[rng.below(FILES as u64) as usize];
        let size = f.model.len() as u64;
        let here = mounts[f.on].join(&f.name);
        match rng.below(100) {
            0..=39 => {
                let (offset, data) = random_write(&mut rng, &mut f.model);
                log.push(format!(
                    "#{n} m{} write {} at {offset} len {}",
                    f.on + 1,
                    f.name,
                    data.len()
                ));
                f.file.write_all_at(&data, offset).expect("write");
                counts[0] += 1;
            }
            40..=54 => {
                let offset = rng.below(size + 4096);
                let len = rng.len() as usize;
                log.push(format!("#{n} m{} read {} at {offset} len {len}", f.on + 1, f.name));
                let got = read_exact_at(&f.file, offset, len);
                let start = (offset as usize).min(f.model.len());
                let end = (offset as usize + len).min(f.model.len());
                check(seed, &log, "read", &got, &f.model[start..end]);
                counts[1] += 1;
            }
            55..=62 => {
                let to =
                    if rng.below(2) == 0 { rng.below(size + 1) } else { rng.below(FILE_BYTES_MAX) };
                log.push(format!("#{n} m{} truncate {} to {to}", f.on + 1, f.name));
                f.file.set_len(to).expect("truncate");
                f.model.resize(to as usize, 0);
                counts[2] += 1;
            }
            63..=70 => {
                log.push(format!("#{n} m{} stat {}", f.on + 1, f.name));
                let a = f.file.metadata().expect("fstat").len();
                let b = std::fs::metadata(&here).expect("stat").len();
                if a != size || b != size {
                    panic!(
                        "fsx seed {seed}: size on m{}: fstat {a}, stat {b}, model {size}\n  {}",
                        f.on + 1,
                        log.0.join("\n  ")
                    );
                }
                counts[3] += 1;
            }
            // Hand the file over: close it here, open it on a mount picked at random (the
            // other one mostly), and read all of it there, through the page cache that mount
            // may still hold from an earlier turn, and through a mapping.
            71..=89 => {
                let to = if rng.below(4) == 0 { f.on } else { 1 - f.on };
                log.push(format!("#{n} hand {} from m{} to m{}", f.name, f.on + 1, to + 1));
                let there = mounts[to].join(&f.name);
                close(&mut f.file);
                f.file = open_rw(&there);
                f.on = to;
                let got = read_exact_at(&f.file, 0, f.model.len() + 4096);
                check(seed, &log, "whole file after the hand-over", &got, &f.model);
                if size > 0 && rng.below(2) == 0 {
                    let got = mmap_read(&f.file, 0, size as usize, size as usize);
                    check(seed, &log, "mmap read after the hand-over", &got, &f.model);
                }
                counts[4] += 1;
            }
            // Replace the file from the other mount, as editors and rsync do (new bytes under
            // a temporary name, renamed over it) or by removing it and creating it anew, while
            // this mount has the old name cached.
            90..=95 => {
                let other = 1 - f.on;
                log.push(format!("#{n} replace {} from m{}", f.name, other + 1));
                close(&mut f.file);
                let mut model = Vec::new();
                let (offset, data) = random_write(&mut rng, &mut model);
                let target = mounts[other].join(&f.name);
                if rng.below(2) == 0 {
                    let temp = mounts[other].join(format!("{}.new", f.name));
                    let replacement = open_rw(&temp);
                    replacement.write_all_at(&data, offset).expect("write replacement");
                    drop(replacement);
                    std::fs::rename(&temp, &target).expect("rename over");
                } else {
                    // Or removed and made anew under the same name.
                    std::fs::remove_file(&target).expect("unlink");
                    let new = OpenOptions::new().write(true).create_new(true).open(&target);
                    new.expect("create anew").write_all_at(&data, offset).expect("write anew");
                }
                f.model = model;
                f.file = open_rw(&here);
                let got = read_exact_at(&f.file, 0, f.model.len() + 4096);
                check(
                    seed,
                    &log,
                    "the replaced file through the mount that cached the old name",
                    &got,
                    &f.model,
                );
                counts[5] += 1;
            }
            _ => {
                log.push(format!("#{n} m{} fsync {}", f.on + 1, f.name));
                f.file.sync_all().expect("fsync");
                counts[6] += 1;
            }
        }
    }
    for f in files.drain(..) {
        drop(f.file);
        for (i, mount) in mounts.iter().enumerate() {
            let got = std::fs::read(mount.join(&f.name)).expect("read whole");
            check(seed, &log, &format!("final whole file on m{}", i + 1), &got, &f.model);
        }
    }
    println!(
        "fsx two mounts: seed {seed}: writes {} reads {} truncates {} stats {} hand-overs {} replaces {} fsyncs {}",
        counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], counts[6]
    );
    assert!(counts.iter().all(|c| *c > 0) || ops < 200, "every kind of operation ran: {counts:?}");
}

/// Found by the exerciser: a truncate right after writes that were not yet published (no
/// fsync or close between) left their tail in the chunk, and growing the file again showed it.
#[test]
fn a_truncate_drops_the_tail_of_writes_not_yet_published() {
    require_fuse();
    let dir = scratch("fsx-truncate");
    let node = Node::start(&dir, &["--drives", "3", "--drive-size", "128M", "--raid", "5"]);
    for (i, (written, cut, grown)) in [
        (600_000u64, 500_000u64, 1_000_000u64),
        (3_000_000, 1_500_000, 4_000_000),
        (5_000, 10, 8_000),
    ]
    .into_iter()
    .enumerate()
    {
        let path = node.mount.join(format!("t{i}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.write_all_at(&vec![0xab; written as usize], 0).unwrap();
        file.set_len(cut).unwrap();
        file.set_len(grown).unwrap();
        drop(file);
        let mut expected = vec![0xab; cut as usize];
        expected.resize(grown as usize, 0);
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), expected.len());
        let first = got.iter().zip(&expected).position(|(a, b)| a != b);
        assert_eq!(first, None, "case {i}: stale bytes after the cut");
        // And from the drives, not the page cache.
        let f = File::open(&path).unwrap();
        // SAFETY: a plain advisory system call on a descriptor we own.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(std::fs::read(&path).unwrap(), expected, "case {i} from the drives");
    }
}

/// Found by the exerciser: a write acknowledged while an overlapping earlier write was still
/// queued could reach the target first, and the older bytes won. Overlapping writes must land
/// in the order they were made.
#[test]
fn overlapping_writes_land_in_the_order_they_were_made() {
    require_fuse();
    let dir = scratch("fsx-order");
    let node = Node::start(&dir, &["--drives", "3", "--drive-size", "256M", "--raid", "5"]);
    let path = node.mount.join("order");
    let file =
        OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    let mut model = vec![0u8; 4 << 20];
    let mut rng = Rng(7);
    for round in 0..200u64 {
        // A large write, then smaller ones inside it and across its edges, back to back.
        let base = rng.below(2 << 20);
        for (k, (offset, len)) in
            [(base, 1_400_000), (base + 1000, 300_000), (base + 700_000, 900_000), (base + 5, 7)]
                .into_iter()
                .enumerate()
        {
            let data = vec![((round * 4 + k as u64) % 255 + 1) as u8; len as usize];
            file.write_all_at(&data, offset).unwrap();
            model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        }
    }
    drop(file);
    let end = model.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    model.truncate(end);
    let got = std::fs::read(&path).unwrap();
    let first = got.iter().zip(&model).position(|(a, b)| a != b);
    assert_eq!((got.len(), first), (model.len(), None), "an older write overtook a newer one");
}
