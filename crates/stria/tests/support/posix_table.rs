//! POSIX conformance table, run through a mounted file system (Stria's FUSE mount in the
//! integration tests; validated against ext4).
//!
//! Every case runs in its own fresh subdirectory and asserts exact results: return values,
//! errno numbers, contents byte for byte, sizes, link counts, modes and the timestamps POSIX
//! defines. Only `std` and `libc` are used. Linux only.
//!
//! * [`run_all`]: every case that runs as the calling user; expects root (chown cases).
//! * [`run_unprivileged`]: permission cases; fixtures are built as root, the checks run in a
//!   forked child that drops to `uid`/`gid` with `extra_gid` as its only supplementary group.
//! * [`readdir_large`]: `n` files, each listed exactly once (slow; kept separate).
//!
//! On a FUSE mount the unprivileged cases need the mount to admit other users (`allow_other`)
//! and permission checks (`default_permissions` or equivalent checks in the daemon). Timestamp
//! checks sleep 20 ms between operations, so the file system must keep sub-20 ms ctime/mtime
//! resolution (nanoseconds, like ext4).
#![allow(dead_code)]

use std::ffi::{CStr, CString};
use std::fs;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Outcome of a table run: one entry per case, in order.
#[derive(Debug, Default)]
pub struct Report {
    pub cases: Vec<(String, Result<(), String>)>,
}

impl Report {
    /// `"case: message"` for every failed case.
    pub fn failures(&self) -> Vec<String> {
        self.cases
            .iter()
            .filter_map(|(name, r)| r.as_ref().err().map(|e| format!("{name}: {e}")))
            .collect()
    }

    /// Number of cases that passed.
    pub fn passed(&self) -> usize {
        self.cases.iter().filter(|(_, r)| r.is_ok()).count()
    }
}

type CaseResult = Result<(), String>;
type Case = (&'static str, fn(&Path) -> CaseResult);

// ---------------------------------------------------------------------------------------------
// Assertions
// ---------------------------------------------------------------------------------------------

macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!("line {}: {}", line!(), format!($($arg)+)));
        }
    };
}

macro_rules! ensure_eq {
    ($got:expr, $want:expr, $($arg:tt)+) => {{
        let (got, want) = (&$got, &$want);
        if got != want {
            return Err(format!(
                "line {}: {}: got {:?}, expected {:?}",
                line!(),
                format!($($arg)+),
                got,
                want
            ));
        }
    }};
}

macro_rules! ensure_mode {
    ($got:expr, $want:expr, $($arg:tt)+) => {{
        let (got, want) = (($got) as u32, ($want) as u32);
        if got != want {
            return Err(format!(
                "line {}: {}: got mode {:o}, expected {:o}",
                line!(),
                format!($($arg)+),
                got,
                want
            ));
        }
    }};
}

fn ename(e: i32) -> String {
    let s = match e {
        libc::EEXIST => "EEXIST",
        libc::ENOENT => "ENOENT",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::EISDIR => "EISDIR",
        libc::ENOTDIR => "ENOTDIR",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EINVAL => "EINVAL",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ELOOP => "ELOOP",
        libc::EBADF => "EBADF",
        libc::ENODATA => "ENODATA",
        libc::ERANGE => "ERANGE",
        libc::EBUSY => "EBUSY",
        libc::EXDEV => "EXDEV",
        libc::EIO => "EIO",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EFBIG => "EFBIG",
        libc::E2BIG => "E2BIG",
        _ => return format!("errno {e}"),
    };
    s.to_string()
}

/// The call must succeed.
fn ok<T>(what: &str, r: Result<T, i32>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: failed with {}", ename(e)))
}

/// The call must fail with exactly `want`.
fn fails<T: std::fmt::Debug>(what: &str, r: Result<T, i32>, want: i32) -> CaseResult {
    fails_any(what, r, &[want])
}

/// The call must fail with one of `wants`.
fn fails_any<T: std::fmt::Debug>(what: &str, r: Result<T, i32>, wants: &[i32]) -> CaseResult {
    let names: Vec<String> = wants.iter().map(|&e| ename(e)).collect();
    match r {
        Ok(v) => Err(format!("{what}: succeeded ({v:?}), expected {}", names.join(" or "))),
        Err(e) if wants.contains(&e) => Ok(()),
        Err(e) => Err(format!("{what}: got {}, expected {}", ename(e), names.join(" or "))),
    }
}

fn io<T>(what: &str, r: std::io::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Byte-for-byte comparison that reports the first difference instead of dumping buffers.
fn same_bytes(what: &str, got: &[u8], want: &[u8]) -> CaseResult {
    if got == want {
        return Ok(());
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
    Err(format!(
        "{what}: content differs: got {} bytes, expected {}; first difference at offset {first} \
         (got {:?}, expected {:?})",
        got.len(),
        want.len(),
        got.get(first),
        want.get(first)
    ))
}

// ---------------------------------------------------------------------------------------------
// Thin libc wrappers: Ok(value) or Err(errno)
// ---------------------------------------------------------------------------------------------

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn cs(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path contains NUL")
}

fn cb(b: &[u8]) -> CString {
    CString::new(b).expect("string contains NUL")
}

fn rc(r: libc::c_int) -> Result<(), i32> {
    if r < 0 { Err(errno()) } else { Ok(()) }
}

/// An owned file descriptor, closed on drop.
#[derive(Debug)]
struct Fd(i32);

impl Drop for Fd {
    fn drop(&mut self) {
        if self.0 >= 0 {
            // SAFETY: we own this descriptor.
            unsafe { libc::close(self.0) };
        }
    }
}

impl Fd {
    fn raw(&self) -> i32 {
        self.0
    }
    fn close(mut self) -> Result<(), i32> {
        let fd = self.0;
        self.0 = -1;
        // SAFETY: we own this descriptor.
        rc(unsafe { libc::close(fd) })
    }
}

fn open_(p: &Path, flags: i32, mode: u32) -> Result<Fd, i32> {
    let c = cs(p);
    // SAFETY: valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 { Err(errno()) } else { Ok(Fd(fd)) }
}

fn stat_(p: &Path) -> Result<libc::stat, i32> {
    let c = cs(p);
    // SAFETY: zeroed stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    rc(unsafe { libc::stat(c.as_ptr(), &mut st) })?;
    Ok(st)
}

/// The mode as a `stat` that asks for nothing else sees it (`statx` with `STATX_MODE`, as
/// `stat -c %a` does): the kernel answers it from its cache unless told the mode changed.
fn mode_only_(p: &Path) -> Result<u32, i32> {
    let c = cs(p);
    // SAFETY: zeroed statx is a valid out buffer.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    rc(unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_MODE, &mut st) })?;
    Ok(u32::from(st.stx_mode))
}

fn lstat_(p: &Path) -> Result<libc::stat, i32> {
    let c = cs(p);
    // SAFETY: zeroed stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    rc(unsafe { libc::lstat(c.as_ptr(), &mut st) })?;
    Ok(st)
}

fn fstat_(fd: &Fd) -> Result<libc::stat, i32> {
    // SAFETY: zeroed stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    rc(unsafe { libc::fstat(fd.raw(), &mut st) })?;
    Ok(st)
}

fn read_(fd: &Fd, len: usize) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; len];
    // SAFETY: buffer of len bytes.
    let n = unsafe { libc::read(fd.raw(), buf.as_mut_ptr().cast(), len) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn write_(fd: &Fd, data: &[u8]) -> Result<usize, i32> {
    // SAFETY: buffer of data.len() bytes.
    let n = unsafe { libc::write(fd.raw(), data.as_ptr().cast(), data.len()) };
    if n < 0 { Err(errno()) } else { Ok(n as usize) }
}

/// One pread call (may be short).
fn pread_(fd: &Fd, len: usize, off: u64) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; len];
    // SAFETY: buffer of len bytes.
    let n = unsafe { libc::pread(fd.raw(), buf.as_mut_ptr().cast(), len, off as libc::off_t) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// pread until `len` bytes or EOF.
fn pread_all(fd: &Fd, len: usize, off: u64) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; len];
    let mut got = 0usize;
    while got < len {
        // SAFETY: buffer has len - got bytes left at got.
        let n = unsafe {
            libc::pread(
                fd.raw(),
                buf[got..].as_mut_ptr().cast(),
                len - got,
                (off + got as u64) as libc::off_t,
            )
        };
        if n < 0 {
            return Err(errno());
        }
        if n == 0 {
            break;
        }
        got += n as usize;
    }
    buf.truncate(got);
    Ok(buf)
}

fn pwrite_(fd: &Fd, data: &[u8], off: u64) -> Result<usize, i32> {
    // SAFETY: buffer of data.len() bytes.
    let n = unsafe { libc::pwrite(fd.raw(), data.as_ptr().cast(), data.len(), off as libc::off_t) };
    if n < 0 { Err(errno()) } else { Ok(n as usize) }
}

fn pwrite_all(fd: &Fd, data: &[u8], off: u64) -> Result<(), i32> {
    let mut done = 0usize;
    while done < data.len() {
        let n = pwrite_(fd, &data[done..], off + done as u64)?;
        if n == 0 {
            return Err(libc::EIO);
        }
        done += n;
    }
    Ok(())
}

fn write_all_(fd: &Fd, data: &[u8]) -> Result<(), i32> {
    let mut done = 0usize;
    while done < data.len() {
        let n = write_(fd, &data[done..])?;
        if n == 0 {
            return Err(libc::EIO);
        }
        done += n;
    }
    Ok(())
}

fn lseek_(fd: &Fd, off: i64, whence: i32) -> Result<i64, i32> {
    // SAFETY: plain syscall.
    let r = unsafe { libc::lseek(fd.raw(), off as libc::off_t, whence) };
    if r < 0 { Err(errno()) } else { Ok(r as i64) }
}

fn ftruncate_(fd: &Fd, len: i64) -> Result<(), i32> {
    // SAFETY: plain syscall.
    rc(unsafe { libc::ftruncate(fd.raw(), len as libc::off_t) })
}

fn truncate_(p: &Path, len: i64) -> Result<(), i32> {
    let c = cs(p);
    // SAFETY: valid C string.
    rc(unsafe { libc::truncate(c.as_ptr(), len as libc::off_t) })
}

fn fsync_(fd: &Fd) -> Result<(), i32> {
    // SAFETY: plain syscall.
    rc(unsafe { libc::fsync(fd.raw()) })
}

fn rename_(a: &Path, b: &Path) -> Result<(), i32> {
    let (a, b) = (cs(a), cs(b));
    // SAFETY: valid C strings.
    rc(unsafe { libc::rename(a.as_ptr(), b.as_ptr()) })
}

fn renameat2_(a: &Path, b: &Path, flags: u32) -> Result<(), i32> {
    let (a, b) = (cs(a), cs(b));
    // SAFETY: valid C strings; renameat2(olddirfd, oldpath, newdirfd, newpath, flags).
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD as libc::c_long,
            a.as_ptr(),
            libc::AT_FDCWD as libc::c_long,
            b.as_ptr(),
            flags as libc::c_long,
        )
    };
    if r < 0 { Err(errno()) } else { Ok(()) }
}

fn link_(a: &Path, b: &Path) -> Result<(), i32> {
    let (a, b) = (cs(a), cs(b));
    // SAFETY: valid C strings.
    rc(unsafe { libc::link(a.as_ptr(), b.as_ptr()) })
}

fn symlink_(target: &[u8], p: &Path) -> Result<(), i32> {
    let (t, c) = (cb(target), cs(p));
    // SAFETY: valid C strings.
    rc(unsafe { libc::symlink(t.as_ptr(), c.as_ptr()) })
}

fn readlink_(p: &Path, bufsize: usize) -> Result<Vec<u8>, i32> {
    let c = cs(p);
    let mut buf = vec![0u8; bufsize];
    // SAFETY: buffer of bufsize bytes.
    let n = unsafe { libc::readlink(c.as_ptr(), buf.as_mut_ptr().cast(), bufsize) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn unlink_(p: &Path) -> Result<(), i32> {
    let c = cs(p);
    // SAFETY: valid C string.
    rc(unsafe { libc::unlink(c.as_ptr()) })
}

fn mkdir_(p: &Path, mode: u32) -> Result<(), i32> {
    let c = cs(p);
    // SAFETY: valid C string.
    rc(unsafe { libc::mkdir(c.as_ptr(), mode as libc::mode_t) })
}

fn rmdir_(p: &Path) -> Result<(), i32> {
    let c = cs(p);
    // SAFETY: valid C string.
    rc(unsafe { libc::rmdir(c.as_ptr()) })
}

fn chmod_(p: &Path, mode: u32) -> Result<(), i32> {
    let c = cs(p);
    // SAFETY: valid C string.
    rc(unsafe { libc::chmod(c.as_ptr(), mode as libc::mode_t) })
}

fn fchmod_(fd: &Fd, mode: u32) -> Result<(), i32> {
    // SAFETY: plain syscall.
    rc(unsafe { libc::fchmod(fd.raw(), mode as libc::mode_t) })
}

fn chown_(p: &Path, uid: u32, gid: u32) -> Result<(), i32> {
    let c = cs(p);
    // SAFETY: valid C string.
    rc(unsafe { libc::chown(c.as_ptr(), uid, gid) })
}

fn lchown_(p: &Path, uid: u32, gid: u32) -> Result<(), i32> {
    let c = cs(p);
    // SAFETY: valid C string.
    rc(unsafe { libc::lchown(c.as_ptr(), uid, gid) })
}

const NOCHANGE: u32 = u32::MAX; // (uid_t)-1

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec { tv_sec: sec as libc::time_t, tv_nsec: nsec as _ }
}

fn utimens_(p: &Path, times: Option<[libc::timespec; 2]>, flags: i32) -> Result<(), i32> {
    let c = cs(p);
    let ptr = times.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: valid C string and null or two timespecs.
    rc(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ptr, flags) })
}

fn futimens_(fd: &Fd, times: [libc::timespec; 2]) -> Result<(), i32> {
    // SAFETY: two timespecs.
    rc(unsafe { libc::futimens(fd.raw(), times.as_ptr()) })
}

fn access_(p: &Path, mode: i32) -> Result<(), i32> {
    let c = cs(p);
    // SAFETY: valid C string.
    rc(unsafe { libc::access(c.as_ptr(), mode) })
}

fn setxattr_(p: &Path, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
    let (c, n) = (cs(p), cb(name.as_bytes()));
    // SAFETY: valid strings and buffer.
    rc(unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) })
}

/// getxattr with a buffer of `size` bytes (0 = size query). Returns (reported size, bytes).
fn getxattr_(p: &Path, name: &str, size: usize) -> Result<(usize, Vec<u8>), i32> {
    let (c, n) = (cs(p), cb(name.as_bytes()));
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 { std::ptr::null_mut() } else { buf.as_mut_ptr().cast() };
    // SAFETY: valid strings, buffer of size bytes or null with size 0.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), ptr, size) };
    if r < 0 {
        return Err(errno());
    }
    let r = r as usize;
    buf.truncate(r.min(size));
    Ok((r, buf))
}

fn listxattr_(p: &Path, size: usize) -> Result<(usize, Vec<u8>), i32> {
    let c = cs(p);
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 { std::ptr::null_mut() } else { buf.as_mut_ptr().cast() };
    // SAFETY: valid string, buffer of size bytes or null with size 0.
    let r = unsafe { libc::listxattr(c.as_ptr(), ptr, size) };
    if r < 0 {
        return Err(errno());
    }
    let r = r as usize;
    buf.truncate(r.min(size));
    Ok((r, buf))
}

fn removexattr_(p: &Path, name: &str) -> Result<(), i32> {
    let (c, n) = (cs(p), cb(name.as_bytes()));
    // SAFETY: valid strings.
    rc(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) })
}

fn xattr_names(p: &Path) -> Result<Vec<Vec<u8>>, i32> {
    let (size, _) = listxattr_(p, 0)?;
    let (n, buf) = listxattr_(p, size + 256)?;
    Ok(buf[..n].split(|&b| b == 0).filter(|s| !s.is_empty()).map(|s| s.to_vec()).collect())
}

fn statvfs_(p: &Path) -> Result<libc::statvfs, i32> {
    let c = cs(p);
    // SAFETY: zeroed statvfs is a valid out buffer.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    rc(unsafe { libc::statvfs(c.as_ptr(), &mut st) })?;
    Ok(st)
}

/// (name, d_type) of every entry, including "." and "..", via opendir/readdir.
fn list_dir(p: &Path) -> Result<Vec<(Vec<u8>, u8)>, i32> {
    let c = cs(p);
    // SAFETY: valid C string.
    let dirp = unsafe { libc::opendir(c.as_ptr()) };
    if dirp.is_null() {
        return Err(errno());
    }
    let mut out = Vec::new();
    loop {
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: dirp is an open DIR*.
        let ent = unsafe { libc::readdir(dirp) };
        if ent.is_null() {
            let e = errno();
            // SAFETY: dirp is an open DIR*.
            unsafe { libc::closedir(dirp) };
            if e != 0 {
                return Err(e);
            }
            break;
        }
        // SAFETY: readdir returned a valid dirent with a NUL-terminated name.
        let (name, ty) =
            unsafe { (CStr::from_ptr((*ent).d_name.as_ptr()).to_bytes().to_vec(), (*ent).d_type) };
        out.push((name, ty));
    }
    Ok(out)
}

fn names_of(p: &Path) -> Result<Vec<Vec<u8>>, i32> {
    let mut v: Vec<Vec<u8>> = list_dir(p)?.into_iter().map(|(n, _)| n).collect();
    v.sort();
    Ok(v)
}

fn euid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::geteuid() }
}

fn egid() -> u32 {
    // SAFETY: always succeeds.
    unsafe { libc::getegid() }
}

fn drop_cache(fd: &Fd) {
    // Best effort: push dirty data out and ask the kernel to drop cached pages so the next
    // read comes from the file system, not the page cache.
    // SAFETY: plain syscalls.
    unsafe {
        libc::fsync(fd.raw());
        libc::posix_fadvise(fd.raw(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

const S_IFMT: u32 = libc::S_IFMT;
const S_IFREG: u32 = libc::S_IFREG;
const S_IFDIR: u32 = libc::S_IFDIR;
const S_IFLNK: u32 = libc::S_IFLNK;
const S_ISGID: u32 = libc::S_ISGID;
const MIB: usize = 1 << 20;
const INLINE_MAX: usize = 3072;
const OLD_SEC: i64 = 1_000_000_000;

fn umask() -> u32 {
    if let Ok(s) = fs::read_to_string("/proc/self/status") {
        for line in s.lines() {
            if let Some(Ok(m)) =
                line.strip_prefix("Umask:").map(|v| u32::from_str_radix(v.trim(), 8))
            {
                return m;
            }
        }
    }
    0o022
}

/// Deterministic, offset-dependent content (period unrelated to any block size).
fn pat(seed: u64, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (off + i)
                .wrapping_add(seed.wrapping_mul(0x9E37_79B9))
                .wrapping_mul(0x2545_F491_4F6C_DD1D);
            (x >> 56) as u8 | 1 // never zero, so holes are distinguishable
        })
        .collect()
}

fn put(p: &Path, data: &[u8]) -> CaseResult {
    io(&format!("write {}", p.display()), fs::write(p, data))
}

fn get(p: &Path) -> Result<Vec<u8>, String> {
    io(&format!("read {}", p.display()), fs::read(p))
}

fn tick() {
    std::thread::sleep(Duration::from_millis(20));
}

fn mtime(st: &libc::stat) -> (i64, i64) {
    (st.st_mtime, st.st_mtime_nsec)
}
fn ctime(st: &libc::stat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}
fn atime(st: &libc::stat) -> (i64, i64) {
    (st.st_atime, st.st_atime_nsec)
}

fn now() -> (i64, i64) {
    let mut t = ts(0, 0);
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut t) };
    (t.tv_sec, t.tv_nsec)
}

/// Set atime and mtime to a fixed old value so a later update is unmistakable.
fn set_old(p: &Path) -> CaseResult {
    ok("utimensat(old)", utimens_(p, Some([ts(OLD_SEC, 0), ts(OLD_SEC, 0)]), 0))
}

/// mtime of `p` must have moved off the old value set by `set_old`.
fn mtime_updated(p: &Path, what: &str) -> CaseResult {
    let st = ok(&format!("stat after {what}"), stat_(p))?;
    ensure!(mtime(&st) > (OLD_SEC, 0), "{what}: mtime of {} not updated", p.display());
    Ok(())
}

fn mtime_kept(p: &Path, what: &str) -> CaseResult {
    let st = ok(&format!("stat after {what}"), stat_(p))?;
    ensure_eq!(mtime(&st), (OLD_SEC, 0), "{what}: mtime of {} must not change", p.display());
    Ok(())
}

fn ctime_of(p: &Path) -> Result<(i64, i64), String> {
    Ok(ctime(&ok("lstat for ctime", lstat_(p))?))
}

/// Run `op`, then require that ctime of `p` increased.
fn ctime_bumped(p: &Path, what: &str, op: impl FnOnce() -> CaseResult) -> CaseResult {
    let before = ctime_of(p)?;
    tick();
    op()?;
    let after = ctime_of(p)?;
    ensure!(
        after > before,
        "{what}: ctime of {} not updated ({before:?} -> {after:?})",
        p.display()
    );
    Ok(())
}

fn expected_gid(dir: &Path) -> Result<u32, String> {
    let st = ok("stat parent", stat_(dir))?;
    Ok(if st.st_mode & S_ISGID != 0 { st.st_gid } else { egid() })
}

/// Full-file check against a model through an existing fd and through a fresh open.
fn verify(fd: &Fd, path: &Path, model: &[u8], what: &str) -> CaseResult {
    let st = ok("fstat", fstat_(fd))?;
    ensure_eq!(st.st_size as usize, model.len(), "{what}: size");
    let got = ok("pread", pread_all(fd, model.len() + 4096, 0))?;
    same_bytes(&format!("{what} (same fd)"), &got, model)?;
    let fresh = ok("reopen", open_(path, libc::O_RDONLY, 0))?;
    drop_cache(&fresh);
    let got = ok("pread fresh", pread_all(&fresh, model.len() + 4096, 0))?;
    same_bytes(&format!("{what} (fresh fd)"), &got, model)
}

fn model_write(model: &mut Vec<u8>, data: &[u8], off: usize) {
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

fn rw(p: &Path) -> Result<Fd, String> {
    ok("open O_RDWR|O_CREAT", open_(p, libc::O_RDWR | libc::O_CREAT, 0o644))
}

// ---------------------------------------------------------------------------------------------
// Cases: create / open
// ---------------------------------------------------------------------------------------------

fn create_basic(d: &Path) -> CaseResult {
    let p = d.join("f");
    set_old(d)?;
    let fd =
        ok("open O_CREAT|O_EXCL", open_(&p, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o640))?;
    let st = ok("fstat", fstat_(&fd))?;
    ensure_mode!(st.st_mode & S_IFMT, S_IFREG, "file type");
    ensure_mode!(st.st_mode & 0o7777, 0o640 & !umask(), "mode of new file");
    ensure_eq!(st.st_size, 0, "size of new file");
    ensure_eq!(st.st_nlink, 1, "nlink of new file");
    ensure_eq!(st.st_uid, euid(), "owner of new file");
    ensure_eq!(st.st_gid, expected_gid(d)?, "group of new file");
    let st2 = ok("stat", stat_(&p))?;
    ensure_eq!(st2.st_ino, st.st_ino, "stat and fstat inode");
    mtime_updated(d, "create in dir")?;
    ok("write", write_all_(&fd, b"abc"))?;
    ok("close", fd.close())?;
    // O_CREAT without O_EXCL on an existing file opens it, no truncation, mode ignored.
    let fd = ok("open existing O_CREAT", open_(&p, libc::O_CREAT | libc::O_WRONLY, 0o600))?;
    let st = ok("fstat", fstat_(&fd))?;
    ensure_eq!(st.st_size, 3, "size after reopen with O_CREAT");
    ensure_mode!(st.st_mode & 0o7777, 0o640 & !umask(), "mode after reopen with O_CREAT");
    ensure_eq!(st.st_ino, st2.st_ino, "inode after reopen");
    same_bytes("content", &get(&p)?, b"abc")
}

fn open_excl(d: &Path) -> CaseResult {
    let p = d.join("f");
    put(&p, b"x")?;
    let fl = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;
    fails("O_CREAT|O_EXCL on existing file", open_(&p, fl, 0o644), libc::EEXIST)?;
    same_bytes("content after failed O_EXCL", &get(&p)?, b"x")?;
    let sub = d.join("sub");
    ok("mkdir", mkdir_(&sub, 0o755))?;
    fails("O_CREAT|O_EXCL on existing dir", open_(&sub, fl, 0o644), libc::EEXIST)?;
    let s = d.join("dangling");
    ok("symlink", symlink_(b"target", &s))?;
    fails("O_CREAT|O_EXCL on dangling symlink", open_(&s, fl, 0o644), libc::EEXIST)?;
    fails("dangling target must not be created", lstat_(&d.join("target")), libc::ENOENT)?;
    let n = d.join("new");
    let fd = ok("O_CREAT|O_EXCL on new name", open_(&n, fl, 0o644))?;
    ok("close", fd.close())?;
    ok("stat new", stat_(&n)).map(|_| ())
}

fn open_errors(d: &Path) -> CaseResult {
    let f = d.join("f");
    put(&f, b"data")?;
    let sub = d.join("sub");
    ok("mkdir", mkdir_(&sub, 0o755))?;
    fails("open missing", open_(&d.join("missing"), libc::O_RDONLY, 0), libc::ENOENT)?;
    fails(
        "O_CREAT in missing dir",
        open_(&d.join("missing/x"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::ENOENT,
    )?;
    fails("open file/x", open_(&d.join("f/x"), libc::O_RDONLY, 0), libc::ENOTDIR)?;
    fails(
        "O_CREAT file/x",
        open_(&d.join("f/x"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::ENOTDIR,
    )?;
    fails("stat file/x", stat_(&d.join("f/x")), libc::ENOTDIR)?;
    fails("open dir O_WRONLY", open_(&sub, libc::O_WRONLY, 0), libc::EISDIR)?;
    fails("open dir O_RDWR", open_(&sub, libc::O_RDWR, 0), libc::EISDIR)?;
    fails(
        "open dir O_CREAT|O_WRONLY",
        open_(&sub, libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::EISDIR,
    )?;
    fails(
        "O_DIRECTORY on a file",
        open_(&f, libc::O_RDONLY | libc::O_DIRECTORY, 0),
        libc::ENOTDIR,
    )?;
    let fd = ok("O_DIRECTORY on a dir", open_(&sub, libc::O_RDONLY | libc::O_DIRECTORY, 0))?;
    ok("close", fd.close())?;
    ok("open dir O_RDONLY", open_(&sub, libc::O_RDONLY, 0)).map(|_| ())
}

fn open_trunc(d: &Path) -> CaseResult {
    let p = d.join("f");
    put(&p, &pat(1, 0, 5000))?;
    set_old(&p)?;
    let c0 = ctime_of(&p)?;
    tick();
    let fd = ok("open O_TRUNC", open_(&p, libc::O_WRONLY | libc::O_TRUNC, 0))?;
    let st = ok("fstat", fstat_(&fd))?;
    ensure_eq!(st.st_size, 0, "size after O_TRUNC");
    ensure!(mtime(&st) > (OLD_SEC, 0), "O_TRUNC must update mtime");
    ensure!(ctime(&st) > c0, "O_TRUNC must update ctime");
    ok("write", write_all_(&fd, b"xy"))?;
    ok("close", fd.close())?;
    same_bytes("content after O_TRUNC + write", &get(&p)?, b"xy")?;
    // Extending after O_TRUNC must not resurrect the old 5000 bytes.
    ok("truncate up", truncate_(&p, 5000))?;
    let mut model = b"xy".to_vec();
    model.resize(5000, 0);
    same_bytes("O_TRUNC then extend reads zeros", &get(&p)?, &model)?;
    // O_TRUNC of a small (inline) file too.
    let fd = ok("open O_TRUNC again", open_(&p, libc::O_RDWR | libc::O_TRUNC, 0))?;
    ensure_eq!(ok("read", read_(&fd, 10))?.len(), 0, "read after O_TRUNC");
    Ok(())
}

fn open_append(d: &Path) -> CaseResult {
    let p = d.join("f");
    put(&p, b"")?;
    let a = ok("open A O_APPEND", open_(&p, libc::O_WRONLY | libc::O_APPEND, 0))?;
    let b = ok("open B O_APPEND", open_(&p, libc::O_WRONLY | libc::O_APPEND, 0))?;
    ok("A write", write_all_(&a, b"aaa"))?;
    ok("B write", write_all_(&b, b"bbbb"))?;
    ok("A write", write_all_(&a, b"cc"))?;
    same_bytes("two appenders", &get(&p)?, b"aaabbbbcc")?;
    ensure_eq!(ok("lseek", lseek_(&a, 0, libc::SEEK_CUR))?, 9, "A offset after append");
    ok("lseek A to 0", lseek_(&a, 0, libc::SEEK_SET))?;
    ok("A write after seek", write_all_(&a, b"d"))?;
    same_bytes("append ignores seek", &get(&p)?, b"aaabbbbccd")?;
    let c = ok("open C plain", open_(&p, libc::O_WRONLY, 0))?;
    ok("C write", write_all_(&c, b"ZZ"))?;
    ok("B write", write_all_(&b, b"e"))?;
    same_bytes("plain writer + appender", &get(&p)?, b"ZZabbbbccde")?;
    ensure_eq!(ok("lseek", lseek_(&b, 0, libc::SEEK_CUR))?, 11, "B offset after append");
    Ok(())
}

fn open_bad_fd_mode(d: &Path) -> CaseResult {
    let p = d.join("f");
    put(&p, b"hello")?;
    let r = ok("open O_RDONLY", open_(&p, libc::O_RDONLY, 0))?;
    fails("write on O_RDONLY fd", write_(&r, b"x"), libc::EBADF)?;
    fails("pwrite on O_RDONLY fd", pwrite_(&r, b"x", 0), libc::EBADF)?;
    fails("ftruncate on O_RDONLY fd", ftruncate_(&r, 0), libc::EINVAL)?;
    let w = ok("open O_WRONLY", open_(&p, libc::O_WRONLY, 0))?;
    fails("read on O_WRONLY fd", read_(&w, 4), libc::EBADF)?;
    fails("pread on O_WRONLY fd", pread_(&w, 4, 0), libc::EBADF)?;
    same_bytes("content unchanged", &get(&p)?, b"hello")?;
    let st = ok("stat", stat_(&p))?;
    ensure_eq!(st.st_size, 5, "size unchanged");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cases: I/O
// ---------------------------------------------------------------------------------------------

fn io_pread_pwrite(d: &Path) -> CaseResult {
    let p = d.join("f");
    let fd = rw(&p)?;
    ensure_eq!(ok("pwrite", pwrite_(&fd, b"hello", 0))?, 5, "pwrite count");
    ensure_eq!(ok("pwrite", pwrite_(&fd, b"world", 100))?, 5, "pwrite count");
    ensure_eq!(ok("fstat", fstat_(&fd))?.st_size, 105, "size");
    same_bytes("pread 0..5", &ok("pread", pread_(&fd, 5, 0))?, b"hello")?;
    same_bytes("pread gap", &ok("pread", pread_(&fd, 95, 5))?, &[0u8; 95])?;
    same_bytes("pread straddling EOF is short", &ok("pread", pread_(&fd, 50, 100))?, b"world")?;
    ensure_eq!(ok("pread at EOF", pread_(&fd, 10, 105))?.len(), 0, "pread at EOF");
    ensure_eq!(ok("pread past EOF", pread_(&fd, 10, 10_000))?.len(), 0, "pread past EOF");
    ensure_eq!(
        ok("lseek", lseek_(&fd, 0, libc::SEEK_CUR))?,
        0,
        "pread/pwrite must not move offset"
    );
    ok("write", write_all_(&fd, b"AB"))?;
    ensure_eq!(ok("lseek", lseek_(&fd, 0, libc::SEEK_CUR))?, 2, "offset after write");
    same_bytes("after write at 0", &ok("pread", pread_(&fd, 5, 0))?, b"ABllo")?;
    same_bytes("read continues at offset", &ok("read", read_(&fd, 3))?, b"llo")?;
    // Across a page boundary.
    let data = pat(2, 4090, 20);
    ok("pwrite across page", pwrite_all(&fd, &data, 4090))?;
    same_bytes("pread across page", &ok("pread", pread_(&fd, 20, 4090))?, &data)?;
    // A zero-length write does not extend the file.
    ensure_eq!(ok("pwrite 0 bytes", pwrite_(&fd, b"", MIB as u64))?, 0, "zero-length pwrite");
    ensure_eq!(ok("fstat", fstat_(&fd))?.st_size, 4110, "size after zero-length pwrite");
    let mut model = vec![0u8; 4110];
    model[..5].copy_from_slice(b"ABllo");
    model[100..105].copy_from_slice(b"world");
    model[4090..4110].copy_from_slice(&data);
    verify(&fd, &p, &model, "pread/pwrite")
}

fn io_seek_past_eof(d: &Path) -> CaseResult {
    let p = d.join("f");
    put(&p, b"0123456789")?;
    let fd = ok("open", open_(&p, libc::O_RDWR, 0))?;
    ensure_eq!(ok("lseek SET 20", lseek_(&fd, 20, libc::SEEK_SET))?, 20, "lseek");
    ensure_eq!(ok("read past EOF", read_(&fd, 10))?.len(), 0, "read past EOF");
    ensure_eq!(ok("lseek END", lseek_(&fd, 0, libc::SEEK_END))?, 10, "SEEK_END");
    ensure_eq!(ok("lseek END+5", lseek_(&fd, 5, libc::SEEK_END))?, 15, "SEEK_END+5");
    ensure_eq!(ok("fstat", fstat_(&fd))?.st_size, 10, "seek alone does not extend");
    ok("write", write_all_(&fd, b"x"))?;
    ensure_eq!(ok("fstat", fstat_(&fd))?.st_size, 16, "size after write past EOF");
    same_bytes("content", &get(&p)?, b"0123456789\0\0\0\0\0x")?;
    fails("lseek negative", lseek_(&fd, -1, libc::SEEK_SET), libc::EINVAL)
}

fn io_holes(d: &Path) -> CaseResult {
    // Hole then one byte beyond 1 MiB.
    let p = d.join("big");
    let fd = rw(&p)?;
    ok("pwrite", pwrite_all(&fd, b"Z", (MIB + 5) as u64))?;
    let mut model = vec![0u8; MIB + 6];
    model[MIB + 5] = b'Z';
    verify(&fd, &p, &model, "hole before 1 MiB + 5")?;
    // Data, hole, data.
    let p = d.join("mid");
    let fd = rw(&p)?;
    ok("pwrite A", pwrite_all(&fd, b"A", 0))?;
    ok("pwrite B", pwrite_all(&fd, b"B", 70_000))?;
    let mut model = vec![0u8; 70_001];
    model[0] = b'A';
    model[70_000] = b'B';
    verify(&fd, &p, &model, "hole in the middle")?;
    // A hole inside a small file.
    let p = d.join("small");
    let fd = rw(&p)?;
    ok("pwrite x", pwrite_all(&fd, b"x", 0))?;
    ok("pwrite y", pwrite_all(&fd, b"y", 2000))?;
    let mut model = vec![0u8; 2001];
    model[0] = b'x';
    model[2000] = b'y';
    verify(&fd, &p, &model, "hole in a small file")
}

fn io_truncate(d: &Path) -> CaseResult {
    let p = d.join("f");
    let data = pat(3, 0, 100);
    put(&p, &data)?;
    let fd = ok("open", open_(&p, libc::O_RDWR, 0))?;
    ok("lseek", lseek_(&fd, 80, libc::SEEK_SET))?;
    set_old(&p)?;
    ctime_bumped(&p, "ftruncate", || ok("ftruncate 50", ftruncate_(&fd, 50)))?;
    mtime_updated(&p, "ftruncate")?;
    verify(&fd, &p, &data[..50], "ftruncate down")?;
    ensure_eq!(ok("lseek", lseek_(&fd, 0, libc::SEEK_CUR))?, 80, "truncate must not move offset");
    ok("ftruncate 200", ftruncate_(&fd, 200))?;
    let mut model = data[..50].to_vec();
    model.resize(200, 0);
    verify(&fd, &p, &model, "ftruncate up")?;
    ok("truncate 10", truncate_(&p, 10))?;
    verify(&fd, &p, &data[..10], "truncate(path) down")?;
    ok("truncate 4097", truncate_(&p, 4097))?;
    let mut model = data[..10].to_vec();
    model.resize(4097, 0);
    verify(&fd, &p, &model, "truncate(path) up")?;
    ok("truncate 0", truncate_(&p, 0))?;
    verify(&fd, &p, b"", "truncate to 0")?;
    let sub = d.join("sub");
    ok("mkdir", mkdir_(&sub, 0o755))?;
    fails("truncate dir", truncate_(&sub, 0), libc::EISDIR)?;
    fails("truncate negative", truncate_(&p, -1), libc::EINVAL)?;
    fails("ftruncate negative", ftruncate_(&fd, -1), libc::EINVAL)?;
    fails("truncate missing", truncate_(&d.join("missing"), 0), libc::ENOENT)
}

fn io_truncate_down_up(d: &Path) -> CaseResult {
    for (name, size, down) in [
        ("small", 3000usize, 10usize),
        ("mid", 10_000, 5000),
        ("large", 2 * MIB + 123, 1000),
        ("pages", 3 * MIB, MIB + 4095),
    ] {
        let p = d.join(name);
        let data = pat(4, 0, size);
        let fd = rw(&p)?;
        ok("write", pwrite_all(&fd, &data, 0))?;
        drop_cache(&fd);
        ok("ftruncate down", ftruncate_(&fd, down as i64))?;
        ok("ftruncate up", ftruncate_(&fd, size as i64))?;
        let mut model = data[..down].to_vec();
        model.resize(size, 0);
        verify(&fd, &p, &model, &format!("{name}: truncate {size} -> {down} -> {size}"))?;
        // Same through truncate(2) by path with no fd-side state.
        ok("truncate down", truncate_(&p, (down / 2) as i64))?;
        ok("truncate up", truncate_(&p, size as i64))?;
        model[down / 2..].fill(0);
        verify(&fd, &p, &model, &format!("{name}: truncate(path) down/up"))?;
    }
    Ok(())
}

fn io_write_times(d: &Path) -> CaseResult {
    let p = d.join("f");
    put(&p, b"abc")?;
    set_old(&p)?;
    let fd = ok("open", open_(&p, libc::O_RDWR, 0))?;
    let _ = ok("read", read_(&fd, 3))?;
    mtime_kept(&p, "read")?;
    ctime_bumped(&p, "write", || ok("pwrite", pwrite_all(&fd, b"X", 1)))?;
    mtime_updated(&p, "write")?;
    // mtime also moves on a second write (no caching of the first update).
    let m1 = mtime(&ok("stat", stat_(&p))?);
    tick();
    ok("pwrite", pwrite_all(&fd, b"Y", 2))?;
    let m2 = mtime(&ok("stat", stat_(&p))?);
    ensure!(m2 > m1, "second write must update mtime again ({m1:?} -> {m2:?})");
    same_bytes("content", &get(&p)?, b"aXY")
}

fn io_fsync(d: &Path) -> CaseResult {
    let p = d.join("f");
    let fd = rw(&p)?;
    ok("write", pwrite_all(&fd, b"durable", 0))?;
    ok("fsync", fsync_(&fd))?;
    // SAFETY: plain syscall.
    ok("fdatasync", rc(unsafe { libc::fdatasync(fd.raw()) }))?;
    let dfd = ok("open dir", open_(d, libc::O_RDONLY | libc::O_DIRECTORY, 0))?;
    ok("fsync dir", fsync_(&dfd))?;
    let ro = ok("open O_RDONLY", open_(&p, libc::O_RDONLY, 0))?;
    ok("fsync on O_RDONLY fd", fsync_(&ro))?;
    verify(&fd, &p, b"durable", "after fsync")
}

fn io_large_single_write(d: &Path) -> CaseResult {
    let p = d.join("f");
    let fd = rw(&p)?;
    let data = pat(5, 0, 3 * MIB + 1);
    ensure_eq!(ok("one 3 MiB + 1 write", write_(&fd, &data))?, data.len(), "single write count");
    let got = ok("one pread", pread_(&fd, data.len() + 10, 0))?;
    ensure_eq!(got.len(), data.len(), "single pread count");
    same_bytes("single pread", &got, &data)?;
    let mut model = data;
    let mid = pat(6, 12_345, MIB);
    ensure_eq!(ok("unaligned 1 MiB pwrite", pwrite_(&fd, &mid, 12_345))?, MIB, "pwrite count");
    model_write(&mut model, &mid, 12_345);
    verify(&fd, &p, &model, "after unaligned 1 MiB pwrite")
}

// ---------------------------------------------------------------------------------------------
// Cases: small files growing past the 3 KiB inline limit and shrinking back
// ---------------------------------------------------------------------------------------------

fn inline_grow_odd(d: &Path) -> CaseResult {
    let p = d.join("f");
    let fd = rw(&p)?;
    let mut model = Vec::new();
    let steps: &[(usize, usize)] = &[
        (0, 3000),
        (3069, 7), // crosses 3072 from below, leaves a 69-byte hole
        (3071, 1),
        (3072, 3),
        (2999, 333), // overwrites across the boundary
        (1, 5000),
        (7777, 1),
        (4093, 9),
    ];
    for (i, &(off, len)) in steps.iter().enumerate() {
        let data = pat(10 + i as u64, off as u64, len);
        ok("pwrite", pwrite_all(&fd, &data, off as u64))?;
        model_write(&mut model, &data, off);
        verify(&fd, &p, &model, &format!("step {i}: pwrite {len} at {off}"))?;
    }
    // Boundary exactly: 3072 bytes (still inline), then one more byte.
    let p = d.join("exact");
    let fd = rw(&p)?;
    let data = pat(20, 0, INLINE_MAX);
    ok("write 3072", pwrite_all(&fd, &data, 0))?;
    let mut model = data.clone();
    verify(&fd, &p, &model, "exactly 3072")?;
    ok("write byte 3073", pwrite_all(&fd, b"!", INLINE_MAX as u64))?;
    model.push(b'!');
    verify(&fd, &p, &model, "3073 bytes")?;
    // A sparse small file whose last byte is at 3071, then 3072.
    let p = d.join("sparse");
    let fd = rw(&p)?;
    ok("pwrite at 3071", pwrite_all(&fd, b"a", 3071))?;
    let mut model = vec![0u8; 3072];
    model[3071] = b'a';
    verify(&fd, &p, &model, "sparse 3072")?;
    ok("pwrite at 3072", pwrite_all(&fd, b"b", 3072))?;
    model.push(b'b');
    verify(&fd, &p, &model, "sparse 3073")
}

fn inline_append(d: &Path) -> CaseResult {
    // One append of 100 bytes from 3000.
    let p = d.join("one");
    let base = pat(30, 0, 3000);
    put(&p, &base)?;
    let fd = ok("open O_APPEND", open_(&p, libc::O_RDWR | libc::O_APPEND, 0))?;
    let more = pat(31, 3000, 100);
    ok("append 100", write_all_(&fd, &more))?;
    let mut model = base.clone();
    model.extend_from_slice(&more);
    verify(&fd, &p, &model, "3000 + 100")?;
    // Byte-by-byte appends across the boundary.
    let p = d.join("bytes");
    put(&p, &base)?;
    let fd = ok("open O_APPEND", open_(&p, libc::O_RDWR | libc::O_APPEND, 0))?;
    let mut model = base.clone();
    for i in 0..100u64 {
        let b = [(i as u8).wrapping_mul(7) | 1];
        ok("append 1", write_all_(&fd, &b))?;
        model.push(b[0]);
    }
    verify(&fd, &p, &model, "3000 + 100 x 1 byte")?;
    // 17-byte appends through a fresh fd each time.
    let p = d.join("reopen");
    put(&p, &base)?;
    let mut model = base;
    for i in 0..8u64 {
        let fd = ok("open O_APPEND", open_(&p, libc::O_WRONLY | libc::O_APPEND, 0))?;
        let data = pat(40 + i, model.len() as u64, 17);
        ok("append 17", write_all_(&fd, &data))?;
        ok("close", fd.close())?;
        model.extend_from_slice(&data);
    }
    let fd = ok("open", open_(&p, libc::O_RDONLY, 0))?;
    verify(&fd, &p, &model, "3000 + 8 x 17 bytes")
}

fn inline_grow_large(d: &Path) -> CaseResult {
    let p = d.join("f");
    let fd = rw(&p)?;
    let mut model = pat(50, 0, 100);
    ok("write 100", pwrite_all(&fd, &model, 0))?;
    // Straddle the 1 MiB mark from a small file.
    let data = pat(51, (MIB - 3) as u64, 10);
    ok("pwrite at 1 MiB - 3", pwrite_all(&fd, &data, (MIB - 3) as u64))?;
    model_write(&mut model, &data, MIB - 3);
    verify(&fd, &p, &model, "small file + write at 1 MiB - 3")?;
    // Sequential odd-sized writes up to 5 MiB + 17.
    ok("lseek", lseek_(&fd, 100, libc::SEEK_SET))?;
    let target = 5 * MIB + 17;
    let mut off = 100usize;
    while off < target {
        let len = 65_537.min(target - off);
        let data = pat(52, off as u64, len);
        ok("write chunk", write_all_(&fd, &data))?;
        model_write(&mut model, &data, off);
        off += len;
    }
    verify(&fd, &p, &model, "grown to 5 MiB + 17")?;
    // Shrink below the inline limit, then regrow across it.
    ok("ftruncate 3000", ftruncate_(&fd, 3000))?;
    model.truncate(3000);
    verify(&fd, &p, &model, "shrunk to 3000")?;
    ok("ftruncate 3072", ftruncate_(&fd, 3072))?;
    model.resize(3072, 0);
    verify(&fd, &p, &model, "shrunk then up to 3072")?;
    let data = pat(53, 3050, 100);
    ok("pwrite 100 at 3050", pwrite_all(&fd, &data, 3050))?;
    model_write(&mut model, &data, 3050);
    verify(&fd, &p, &model, "regrown across 3072")?;
    ok("ftruncate 0", ftruncate_(&fd, 0))?;
    ok("pwrite 10", pwrite_all(&fd, b"0123456789", 0))?;
    verify(&fd, &p, b"0123456789", "truncated to 0 and rewritten")
}

fn inline_shrink_reopen(d: &Path) -> CaseResult {
    let p = d.join("f");
    let data = pat(60, 0, MIB + MIB / 2);
    put(&p, &data)?;
    ok("truncate 2500", truncate_(&p, 2500))?;
    let fd = ok("open", open_(&p, libc::O_RDWR, 0))?;
    verify(&fd, &p, &data[..2500], "1.5 MiB shrunk to 2500")?;
    ok("close", fd.close())?;
    same_bytes("read after reopen", &get(&p)?, &data[..2500])?;
    let fd = ok("open O_APPEND", open_(&p, libc::O_RDWR | libc::O_APPEND, 0))?;
    let more = pat(61, 2500, 1000);
    ok("append 1000", write_all_(&fd, &more))?;
    let mut model = data[..2500].to_vec();
    model.extend_from_slice(&more);
    verify(&fd, &p, &model, "2500 + 1000 (no stale data from the old chunks)")
}

// ---------------------------------------------------------------------------------------------
// Cases: rename
// ---------------------------------------------------------------------------------------------

fn rename_new_name(d: &Path) -> CaseResult {
    let (a, b) = (d.join("a"), d.join("b"));
    put(&a, b"alpha")?;
    let ino = ok("stat", stat_(&a))?.st_ino;
    set_old(d)?;
    ctime_bumped(d, "rename in dir (dir ctime)", || ok("rename", rename_(&a, &b)))?;
    mtime_updated(d, "rename in dir")?;
    fails("stat old name", stat_(&a), libc::ENOENT)?;
    let st = ok("stat new name", stat_(&b))?;
    ensure_eq!(st.st_ino, ino, "inode kept across rename");
    ensure_eq!(st.st_nlink, 1, "nlink");
    same_bytes("content", &get(&b)?, b"alpha")?;
    ensure_eq!(
        ok("readdir", names_of(d))?,
        vec![b".".to_vec(), b"..".to_vec(), b"b".to_vec()],
        "dir entries"
    );
    Ok(())
}

fn rename_file_ctime(d: &Path) -> CaseResult {
    // POSIX leaves this open; Linux local file systems update the renamed inode's ctime.
    let (a, b) = (d.join("a"), d.join("b"));
    put(&a, b"x")?;
    let before = ctime_of(&a)?;
    tick();
    ok("rename", rename_(&a, &b))?;
    let after = ctime_of(&b)?;
    ensure!(after > before, "ctime of renamed file not updated");
    Ok(())
}

fn rename_across_dirs(d: &Path) -> CaseResult {
    let (d1, d2) = (d.join("d1"), d.join("d2"));
    ok("mkdir d1", mkdir_(&d1, 0o755))?;
    ok("mkdir d2", mkdir_(&d2, 0o755))?;
    let (a, b) = (d1.join("a"), d2.join("b"));
    let data = pat(70, 0, 10_000);
    put(&a, &data)?;
    set_old(&d1)?;
    set_old(&d2)?;
    let c1 = ctime_of(&d1)?;
    let c2 = ctime_of(&d2)?;
    tick();
    ok("rename across dirs", rename_(&a, &b))?;
    mtime_updated(&d1, "rename out of dir")?;
    mtime_updated(&d2, "rename into dir")?;
    ensure!(ctime_of(&d1)? > c1, "source dir ctime not updated");
    ensure!(ctime_of(&d2)? > c2, "target dir ctime not updated");
    fails("stat old", stat_(&a), libc::ENOENT)?;
    same_bytes("content", &get(&b)?, &data)?;
    ensure_eq!(ok("stat d1", stat_(&d1))?.st_nlink, 2, "d1 nlink (file move)");
    ensure_eq!(ok("stat d2", stat_(&d2))?.st_nlink, 2, "d2 nlink (file move)");
    Ok(())
}

fn rename_replace_file(d: &Path) -> CaseResult {
    let (a, b) = (d.join("a"), d.join("b"));
    put(&a, b"new")?;
    put(&b, b"old content")?;
    let ino_a = ok("stat a", stat_(&a))?.st_ino;
    let held = ok("open b", open_(&b, libc::O_RDONLY, 0))?;
    ok("rename a over b", rename_(&a, &b))?;
    fails("stat a", stat_(&a), libc::ENOENT)?;
    ensure_eq!(ok("stat b", stat_(&b))?.st_ino, ino_a, "b is a's inode");
    same_bytes("b content", &get(&b)?, b"new")?;
    ensure_eq!(ok("fstat replaced", fstat_(&held))?.st_nlink, 0, "replaced inode nlink");
    same_bytes(
        "replaced inode still readable",
        &ok("pread", pread_all(&held, 100, 0))?,
        b"old content",
    )?;
    ensure_eq!(
        ok("readdir", names_of(d))?,
        vec![b".".to_vec(), b"..".to_vec(), b"b".to_vec()],
        "dir entries"
    );
    Ok(())
}

fn rename_replace_empty_dir(d: &Path) -> CaseResult {
    let (d1, d2) = (d.join("d1"), d.join("d2"));
    ok("mkdir d1", mkdir_(&d1, 0o755))?;
    ok("mkdir d2", mkdir_(&d2, 0o755))?;
    put(&d1.join("inside"), b"i")?;
    let ino = ok("stat d1", stat_(&d1))?.st_ino;
    ensure_eq!(ok("stat d", stat_(d))?.st_nlink, 4, "parent nlink before");
    ok("rename dir over empty dir", rename_(&d1, &d2))?;
    fails("stat d1", stat_(&d1), libc::ENOENT)?;
    ensure_eq!(ok("stat d2", stat_(&d2))?.st_ino, ino, "d2 is d1's inode");
    same_bytes("moved content", &get(&d2.join("inside"))?, b"i")?;
    ensure_eq!(ok("stat d", stat_(d))?.st_nlink, 3, "parent nlink after");
    ensure_eq!(ok("stat d2", stat_(&d2))?.st_nlink, 2, "moved dir nlink");
    Ok(())
}

fn rename_errors(d: &Path) -> CaseResult {
    let (d1, d2, f, g) = (d.join("d1"), d.join("d2"), d.join("f"), d.join("g"));
    ok("mkdir d1", mkdir_(&d1, 0o755))?;
    ok("mkdir d2", mkdir_(&d2, 0o755))?;
    put(&d2.join("x"), b"x")?;
    put(&f, b"f")?;
    fails_any("dir over non-empty dir", rename_(&d1, &d2), &[libc::ENOTEMPTY, libc::EEXIST])?;
    ok("d1 intact", stat_(&d1))?;
    ok("d2/x intact", stat_(&d2.join("x")))?;
    fails("file over dir", rename_(&f, &d1), libc::EISDIR)?;
    fails("dir over file", rename_(&d1, &f), libc::ENOTDIR)?;
    same_bytes("f intact", &get(&f)?, b"f")?;
    let sub = d1.join("sub");
    ok("mkdir d1/sub", mkdir_(&sub, 0o755))?;
    fails("dir into own subdir", rename_(&d1, &sub.join("x")), libc::EINVAL)?;
    fails("dir into itself", rename_(&d1, &d1.join("x")), libc::EINVAL)?;
    fails("rename missing", rename_(&g, &d.join("h")), libc::ENOENT)?;
    fails("rename into missing dir", rename_(&f, &d.join("missing/x")), libc::ENOENT)?;
    fails("rename through a file", rename_(&f, &f.join("x")), libc::ENOTDIR)?;
    ok("stat f", stat_(&f)).map(|_| ())
}

fn rename_noreplace(d: &Path) -> CaseResult {
    let (a, b, c) = (d.join("a"), d.join("b"), d.join("c"));
    put(&a, b"a")?;
    put(&b, b"b")?;
    fails(
        "RENAME_NOREPLACE onto existing",
        renameat2_(&a, &b, libc::RENAME_NOREPLACE),
        libc::EEXIST,
    )?;
    same_bytes("a intact", &get(&a)?, b"a")?;
    same_bytes("b intact", &get(&b)?, b"b")?;
    ok("RENAME_NOREPLACE to new name", renameat2_(&a, &c, libc::RENAME_NOREPLACE))?;
    fails("a gone", stat_(&a), libc::ENOENT)?;
    same_bytes("c content", &get(&c)?, b"a")
}

fn rename_exchange(d: &Path) -> CaseResult {
    let (f, dd) = (d.join("f"), d.join("d"));
    put(&f, b"data")?;
    ok("mkdir", mkdir_(&dd, 0o755))?;
    put(&dd.join("child"), b"c")?;
    let (fi, di) = (ok("stat f", stat_(&f))?.st_ino, ok("stat d", stat_(&dd))?.st_ino);
    ok("RENAME_EXCHANGE file <-> dir", renameat2_(&f, &dd, libc::RENAME_EXCHANGE))?;
    let sf = ok("stat f", stat_(&f))?;
    let sd = ok("stat d", stat_(&dd))?;
    ensure_mode!(sf.st_mode & S_IFMT, S_IFDIR, "f is now a dir");
    ensure_mode!(sd.st_mode & S_IFMT, S_IFREG, "d is now a file");
    ensure_eq!((sf.st_ino, sd.st_ino), (di, fi), "inodes swapped");
    same_bytes("d content", &get(&dd)?, b"data")?;
    same_bytes("f/child content", &get(&f.join("child"))?, b"c")?;
    fails(
        "exchange with missing",
        renameat2_(&f, &d.join("missing"), libc::RENAME_EXCHANGE),
        libc::ENOENT,
    )?;
    // Across directories: parents' link counts follow the directory; ".." is updated.
    let (p1, p2) = (d.join("p1"), d.join("p2"));
    ok("mkdir p1", mkdir_(&p1, 0o755))?;
    ok("mkdir p2", mkdir_(&p2, 0o755))?;
    put(&p1.join("x"), b"x")?;
    ok("mkdir p2/y", mkdir_(&p2.join("y"), 0o755))?;
    ok("exchange p1/x <-> p2/y", renameat2_(&p1.join("x"), &p2.join("y"), libc::RENAME_EXCHANGE))?;
    ensure_eq!(ok("stat p1", stat_(&p1))?.st_nlink, 3, "p1 nlink (gained dir)");
    ensure_eq!(ok("stat p2", stat_(&p2))?.st_nlink, 2, "p2 nlink (lost dir)");
    ensure_eq!(
        ok("stat p1/x/..", stat_(&p1.join("x/..")))?.st_ino,
        ok("stat p1", stat_(&p1))?.st_ino,
        "'..' of exchanged dir"
    );
    same_bytes("p2/y content", &get(&p2.join("y"))?, b"x")
}

fn rename_self(d: &Path) -> CaseResult {
    let (a, b, sub) = (d.join("a"), d.join("b"), d.join("sub"));
    put(&a, b"same")?;
    ok("rename a a", rename_(&a, &a))?;
    same_bytes("a intact", &get(&a)?, b"same")?;
    ok("mkdir", mkdir_(&sub, 0o755))?;
    ok("rename dir onto itself", rename_(&sub, &sub))?;
    // Two links to one inode: rename(a, b) does nothing and both names stay.
    ok("link", link_(&a, &b))?;
    ok("rename link onto link", rename_(&a, &b))?;
    ensure_eq!(ok("stat a", stat_(&a))?.st_nlink, 2, "a still there, nlink");
    ensure_eq!(ok("stat b", stat_(&b))?.st_nlink, 2, "b nlink");
    ensure_eq!(
        ok("readdir", names_of(d))?,
        vec![b".".to_vec(), b"..".to_vec(), b"a".to_vec(), b"b".to_vec(), b"sub".to_vec()],
        "entries"
    );
    Ok(())
}

fn rename_dir_nlink(d: &Path) -> CaseResult {
    let (p1, p2) = (d.join("p1"), d.join("p2"));
    ok("mkdir p1", mkdir_(&p1, 0o755))?;
    ok("mkdir p2", mkdir_(&p2, 0o755))?;
    ok("mkdir p1/sub", mkdir_(&p1.join("sub"), 0o755))?;
    put(&p1.join("sub/f"), b"f")?;
    ensure_eq!(ok("stat p1", stat_(&p1))?.st_nlink, 3, "p1 nlink before");
    ok("rename dir across", rename_(&p1.join("sub"), &p2.join("moved")))?;
    ensure_eq!(ok("stat p1", stat_(&p1))?.st_nlink, 2, "p1 nlink after");
    ensure_eq!(ok("stat p2", stat_(&p2))?.st_nlink, 3, "p2 nlink after");
    ensure_eq!(
        ok("stat moved/..", stat_(&p2.join("moved/..")))?.st_ino,
        ok("stat p2", stat_(&p2))?.st_ino,
        "'..' of moved dir"
    );
    same_bytes("moved content", &get(&p2.join("moved/f"))?, b"f")
}

// ---------------------------------------------------------------------------------------------
// Cases: links
// ---------------------------------------------------------------------------------------------

fn links_hard(d: &Path) -> CaseResult {
    let (a, b) = (d.join("a"), d.join("b"));
    put(&a, b"one")?;
    ctime_bumped(&a, "link", || ok("link", link_(&a, &b)))?;
    let (sa, sb) = (ok("stat a", stat_(&a))?, ok("stat b", stat_(&b))?);
    ensure_eq!(sa.st_ino, sb.st_ino, "same inode");
    ensure_eq!((sa.st_nlink, sb.st_nlink), (2, 2), "nlink after link");
    let fd = ok("open b", open_(&b, libc::O_WRONLY | libc::O_APPEND, 0))?;
    ok("write via b", write_all_(&fd, b"two"))?;
    same_bytes("seen via a", &get(&a)?, b"onetwo")?;
    fails("link onto existing", link_(&a, &b), libc::EEXIST)?;
    let sub = d.join("sub");
    ok("mkdir", mkdir_(&sub, 0o755))?;
    fails("link a directory", link_(&sub, &d.join("sub2")), libc::EPERM)?;
    fails("link missing", link_(&d.join("missing"), &d.join("c")), libc::ENOENT)?;
    ctime_bumped(&a, "unlink of other link", || ok("unlink b", unlink_(&b)))?;
    ensure_eq!(ok("stat a", stat_(&a))?.st_nlink, 1, "nlink after unlink");
    ensure_eq!(ok("fstat", fstat_(&fd))?.st_nlink, 1, "fstat nlink after unlink");
    ok("unlink a", unlink_(&a))?;
    fails("stat a", stat_(&a), libc::ENOENT)?;
    ensure_eq!(ok("fstat", fstat_(&fd))?.st_nlink, 0, "nlink after last unlink");
    Ok(())
}

fn links_dir_nlink(d: &Path) -> CaseResult {
    let p = d.join("p");
    ok("mkdir", mkdir_(&p, 0o755))?;
    ensure_eq!(ok("stat", stat_(&p))?.st_nlink, 2, "empty dir nlink");
    put(&p.join("f1"), b"")?;
    put(&p.join("f2"), b"")?;
    ensure_eq!(ok("stat", stat_(&p))?.st_nlink, 2, "files do not count");
    for s in ["s1", "s2", "s3"] {
        ok("mkdir sub", mkdir_(&p.join(s), 0o755))?;
    }
    ensure_eq!(ok("stat", stat_(&p))?.st_nlink, 5, "2 + 3 subdirs");
    ok("rmdir", rmdir_(&p.join("s1")))?;
    ensure_eq!(ok("stat", stat_(&p))?.st_nlink, 4, "after rmdir");
    ok("rename subdir out", rename_(&p.join("s2"), &d.join("s2")))?;
    ensure_eq!(ok("stat", stat_(&p))?.st_nlink, 3, "after moving a subdir out");
    ensure_eq!(ok("stat d", stat_(d))?.st_nlink, 4, "receiving parent");
    Ok(())
}

fn links_unlink_open(d: &Path) -> CaseResult {
    for (name, size) in [("small", 100usize), ("large", 2 * MIB + 7)] {
        let p = d.join(name);
        let data = pat(80, 0, size);
        put(&p, &data)?;
        let fd = ok("open", open_(&p, libc::O_RDWR, 0))?;
        set_old(d)?;
        ok("unlink open file", unlink_(&p))?;
        mtime_updated(d, "unlink")?;
        fails("stat after unlink", stat_(&p), libc::ENOENT)?;
        fails("open after unlink", open_(&p, libc::O_RDONLY, 0), libc::ENOENT)?;
        let st = ok("fstat", fstat_(&fd))?;
        ensure_eq!(st.st_nlink, 0, "{name}: nlink of unlinked open file");
        ensure_eq!(st.st_size as usize, size, "{name}: size of unlinked open file");
        same_bytes(
            &format!("{name}: read via fd"),
            &ok("pread", pread_all(&fd, size + 10, 0))?,
            &data,
        )?;
        ok("write via fd", pwrite_all(&fd, b"more", size as u64))?;
        let mut model = data.clone();
        model.extend_from_slice(b"more");
        same_bytes(
            &format!("{name}: read after write"),
            &ok("pread", pread_all(&fd, size + 10, 0))?,
            &model,
        )?;
        ok("close", fd.close())?;
        ensure_eq!(
            ok("readdir", names_of(d))?,
            vec![b".".to_vec(), b"..".to_vec()],
            "{name}: entries after close"
        );
    }
    fails("unlink missing", unlink_(&d.join("missing")), libc::ENOENT)
}

// ---------------------------------------------------------------------------------------------
// Cases: symlinks
// ---------------------------------------------------------------------------------------------

fn symlink_basic(d: &Path) -> CaseResult {
    let (t, s) = (d.join("t"), d.join("s"));
    put(&t, b"content")?;
    ok("symlink", symlink_(b"t", &s))?;
    same_bytes("readlink", &ok("readlink", readlink_(&s, 4096))?, b"t")?;
    let ls = ok("lstat", lstat_(&s))?;
    ensure_mode!(ls.st_mode & S_IFMT, S_IFLNK, "lstat type");
    ensure_eq!(ls.st_size, 1, "symlink size = target length");
    let st = ok("stat", stat_(&s))?;
    ensure_mode!(st.st_mode & S_IFMT, S_IFREG, "stat follows");
    ensure_eq!(st.st_ino, ok("stat t", stat_(&t))?.st_ino, "stat gives target inode");
    ensure!(ls.st_ino != st.st_ino, "symlink has its own inode");
    same_bytes("read through symlink", &get(&s)?, b"content")?;
    // Long target, exact bytes, truncating readlink.
    let long: Vec<u8> = (0..1000).map(|i| b"abc/../xyz"[i % 10]).collect();
    let l = d.join("long");
    ok("symlink long", symlink_(&long, &l))?;
    same_bytes("readlink long", &ok("readlink", readlink_(&l, 4096))?, &long)?;
    ensure_eq!(ok("lstat", lstat_(&l))?.st_size, 1000, "long symlink size");
    same_bytes("readlink small buffer truncates", &ok("readlink", readlink_(&l, 4))?, &long[..4])?;
    fails("readlink regular file", readlink_(&t, 100), libc::EINVAL)?;
    fails("readlink missing", readlink_(&d.join("missing"), 100), libc::ENOENT)?;
    fails("symlink onto existing", symlink_(b"x", &t), libc::EEXIST)?;
    // Through a symlink to a directory.
    let sub = d.join("sub");
    ok("mkdir", mkdir_(&sub, 0o755))?;
    ok("symlink to dir", symlink_(b"sub", &d.join("ds")))?;
    put(&d.join("ds/f"), b"via")?;
    same_bytes("file created through dir symlink", &get(&sub.join("f"))?, b"via")?;
    // unlink removes the link, not the target.
    ok("unlink symlink", unlink_(&s))?;
    same_bytes("target intact", &get(&t)?, b"content")
}

fn symlink_dangling(d: &Path) -> CaseResult {
    let s = d.join("s");
    ok("symlink", symlink_(b"nope", &s))?;
    ok("lstat dangling", lstat_(&s))?;
    fails("stat dangling", stat_(&s), libc::ENOENT)?;
    fails("open dangling", open_(&s, libc::O_RDONLY, 0), libc::ENOENT)?;
    fails(
        "O_CREAT|O_EXCL on dangling",
        open_(&s, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644),
        libc::EEXIST,
    )?;
    // O_CREAT without O_EXCL follows the link and creates the target.
    let fd = ok("O_CREAT through dangling", open_(&s, libc::O_CREAT | libc::O_WRONLY, 0o644))?;
    ok("write", write_all_(&fd, b"made"))?;
    ok("close", fd.close())?;
    same_bytes("target created", &get(&d.join("nope"))?, b"made")?;
    ensure_mode!(ok("lstat", lstat_(&s))?.st_mode & S_IFMT, S_IFLNK, "still a symlink");
    Ok(())
}

fn symlink_loop(d: &Path) -> CaseResult {
    let (a, b, s) = (d.join("a"), d.join("b"), d.join("self"));
    ok("symlink a->b", symlink_(b"b", &a))?;
    ok("symlink b->a", symlink_(b"a", &b))?;
    ok("symlink self", symlink_(b"self", &s))?;
    fails("stat loop", stat_(&a), libc::ELOOP)?;
    fails("open loop", open_(&a, libc::O_RDONLY, 0), libc::ELOOP)?;
    fails("stat self loop", stat_(&s), libc::ELOOP)?;
    fails("stat through loop", stat_(&a.join("x")), libc::ELOOP)?;
    ok("lstat loop", lstat_(&a))?;
    same_bytes("readlink loop", &ok("readlink", readlink_(&a, 100))?, b"b")
}

fn symlink_nofollow(d: &Path) -> CaseResult {
    let (t, s) = (d.join("t"), d.join("s"));
    put(&t, b"t")?;
    ok("symlink", symlink_(b"t", &s))?;
    fails("O_NOFOLLOW on symlink", open_(&s, libc::O_RDONLY | libc::O_NOFOLLOW, 0), libc::ELOOP)?;
    fails(
        "O_NOFOLLOW|O_CREAT on symlink",
        open_(&s, libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW, 0o644),
        libc::ELOOP,
    )?;
    ok("O_NOFOLLOW on file", open_(&t, libc::O_RDONLY | libc::O_NOFOLLOW, 0))?;
    ok("mkdir", mkdir_(&d.join("sub"), 0o755))?;
    put(&d.join("sub/f"), b"f")?;
    ok("symlink dir", symlink_(b"sub", &d.join("ds")))?;
    ok(
        "O_NOFOLLOW only applies to the last component",
        open_(&d.join("ds/f"), libc::O_RDONLY | libc::O_NOFOLLOW, 0),
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cases: xattrs (user. namespace)
// ---------------------------------------------------------------------------------------------

fn xattr_basic(d: &Path) -> CaseResult {
    let f = d.join("f");
    put(&f, b"")?;
    ok("setxattr", setxattr_(&f, "user.test", b"hello", 0))?;
    ensure_eq!(ok("size query", getxattr_(&f, "user.test", 0))?.0, 5, "size query");
    let (n, v) = ok("getxattr", getxattr_(&f, "user.test", 64))?;
    ensure_eq!(n, 5, "getxattr length");
    same_bytes("value", &v, b"hello")?;
    let names = ok("listxattr", xattr_names(&f))?;
    ensure!(names.contains(&b"user.test".to_vec()), "listxattr lacks user.test: {names:?}");
    let (sz, _) = ok("listxattr size", listxattr_(&f, 0))?;
    let (n, _) = ok("listxattr", listxattr_(&f, sz))?;
    ensure_eq!(n, sz, "listxattr size query matches");
    ok("overwrite shorter", setxattr_(&f, "user.test", b"hi", 0))?;
    let (n, v) = ok("getxattr", getxattr_(&f, "user.test", 64))?;
    ensure_eq!(n, 2, "length after overwrite");
    same_bytes("value after overwrite", &v, b"hi")?;
    ok("removexattr", removexattr_(&f, "user.test"))?;
    fails("getxattr removed", getxattr_(&f, "user.test", 64), libc::ENODATA)?;
    fails("removexattr missing", removexattr_(&f, "user.test"), libc::ENODATA)?;
    let names = ok("listxattr", xattr_names(&f))?;
    ensure!(!names.contains(&b"user.test".to_vec()), "removed name still listed: {names:?}");
    fails("getxattr on missing file", getxattr_(&d.join("missing"), "user.x", 10), libc::ENOENT)
}

fn xattr_flags(d: &Path) -> CaseResult {
    let f = d.join("f");
    put(&f, b"")?;
    ok("setxattr", setxattr_(&f, "user.a", b"1", 0))?;
    fails(
        "XATTR_CREATE on existing",
        setxattr_(&f, "user.a", b"2", libc::XATTR_CREATE),
        libc::EEXIST,
    )?;
    same_bytes("unchanged", &ok("get", getxattr_(&f, "user.a", 10))?.1, b"1")?;
    fails(
        "XATTR_REPLACE on missing",
        setxattr_(&f, "user.b", b"2", libc::XATTR_REPLACE),
        libc::ENODATA,
    )?;
    fails("missing not created", getxattr_(&f, "user.b", 10), libc::ENODATA)?;
    ok("XATTR_REPLACE on existing", setxattr_(&f, "user.a", b"3", libc::XATTR_REPLACE))?;
    same_bytes("replaced", &ok("get", getxattr_(&f, "user.a", 10))?.1, b"3")?;
    ok("XATTR_CREATE new", setxattr_(&f, "user.b", b"4", libc::XATTR_CREATE))?;
    same_bytes("created", &ok("get", getxattr_(&f, "user.b", 10))?.1, b"4")
}

fn xattr_erange(d: &Path) -> CaseResult {
    let f = d.join("f");
    put(&f, b"")?;
    ok("setxattr", setxattr_(&f, "user.ten", b"0123456789", 0))?;
    fails("getxattr buffer too small", getxattr_(&f, "user.ten", 5), libc::ERANGE)?;
    ensure_eq!(ok("exact buffer", getxattr_(&f, "user.ten", 10))?.0, 10, "exact-size buffer");
    fails("listxattr buffer too small", listxattr_(&f, 3), libc::ERANGE)?;
    let long = format!("user.{}", "n".repeat(251)); // 256 bytes
    fails("name longer than 255", setxattr_(&f, &long, b"v", 0), libc::ERANGE)?;
    let max = format!("user.{}", "n".repeat(250)); // 255 bytes
    ok("name of 255 bytes", setxattr_(&f, &max, b"v", 0))?;
    same_bytes("255-byte name value", &ok("get", getxattr_(&f, &max, 10))?.1, b"v")
}

fn xattr_values(d: &Path) -> CaseResult {
    let f = d.join("f");
    put(&f, &pat(90, 0, 5000))?; // a chunked file
    ok("empty value", setxattr_(&f, "user.empty", b"", 0))?;
    ensure_eq!(ok("get empty", getxattr_(&f, "user.empty", 10))?.0, 0, "empty value length");
    let bin = [0u8, 1, 0, 255, 0, 7];
    ok("binary value", setxattr_(&f, "user.bin", &bin, 0))?;
    same_bytes("binary value", &ok("get", getxattr_(&f, "user.bin", 10))?.1, &bin)?;
    let big = pat(91, 0, 2000);
    ok("2000-byte value", setxattr_(&f, "user.big", &big, 0))?;
    same_bytes("2000-byte value", &ok("get", getxattr_(&f, "user.big", 4000))?.1, &big)?;
    let mut names = ok("listxattr", xattr_names(&f))?;
    names.retain(|n| n.starts_with(b"user."));
    names.sort();
    ensure_eq!(
        names,
        vec![b"user.big".to_vec(), b"user.bin".to_vec(), b"user.empty".to_vec()],
        "each name listed exactly once"
    );
    // On a directory too.
    let sub = d.join("sub");
    ok("mkdir", mkdir_(&sub, 0o755))?;
    ok("setxattr dir", setxattr_(&sub, "user.d", b"dir", 0))?;
    same_bytes("dir xattr", &ok("get", getxattr_(&sub, "user.d", 10))?.1, b"dir")?;
    // File content unaffected.
    same_bytes("content", &get(&f)?, &pat(90, 0, 5000))
}

// ---------------------------------------------------------------------------------------------
// Cases: chmod / chown / utimens
// ---------------------------------------------------------------------------------------------

fn attr_chmod(d: &Path) -> CaseResult {
    let f = d.join("f");
    put(&f, b"x")?;
    set_old(&f)?;
    ctime_bumped(&f, "chmod", || ok("chmod", chmod_(&f, 0o751)))?;
    mtime_kept(&f, "chmod")?;
    ensure_mode!(ok("stat", stat_(&f))?.st_mode & 0o7777, 0o751, "mode after chmod");
    ok("chmod all bits", chmod_(&f, 0o7777))?;
    ensure_mode!(ok("stat", stat_(&f))?.st_mode & 0o7777, 0o7777, "mode with suid/sgid/sticky");
    let fd = ok("open", open_(&f, libc::O_RDONLY, 0))?;
    ok("fchmod", fchmod_(&fd, 0o600))?;
    let st = ok("stat", stat_(&f))?;
    ensure_mode!(st.st_mode & 0o7777, 0o600, "mode after fchmod");
    ensure_mode!(st.st_mode & S_IFMT, S_IFREG, "type kept");
    let sub = d.join("sub");
    ok("mkdir", mkdir_(&sub, 0o755))?;
    ok("chmod dir", chmod_(&sub, 0o1707))?;
    ensure_mode!(ok("stat", stat_(&sub))?.st_mode & 0o7777, 0o1707, "dir mode");
    fails("chmod missing", chmod_(&d.join("missing"), 0o644), libc::ENOENT)
}

fn attr_chown(d: &Path) -> CaseResult {
    let f = d.join("f");
    put(&f, b"x")?;
    ctime_bumped(&f, "chown", || ok("chown", chown_(&f, 1234, 5678)))?;
    let st = ok("stat", stat_(&f))?;
    ensure_eq!((st.st_uid, st.st_gid), (1234, 5678), "owner after chown");
    ok("chown -1 -1", chown_(&f, NOCHANGE, NOCHANGE))?;
    let st = ok("stat", stat_(&f))?;
    ensure_eq!((st.st_uid, st.st_gid), (1234, 5678), "owner after chown(-1, -1)");
    ok("chgrp only", chown_(&f, NOCHANGE, 42))?;
    let st = ok("stat", stat_(&f))?;
    ensure_eq!((st.st_uid, st.st_gid), (1234, 42), "owner after chgrp");
    // lchown changes the link, not the target.
    let s = d.join("s");
    ok("symlink", symlink_(b"f", &s))?;
    ok("lchown", lchown_(&s, 777, 888))?;
    let ls = ok("lstat", lstat_(&s))?;
    ensure_eq!((ls.st_uid, ls.st_gid), (777, 888), "symlink owner");
    let st = ok("stat", stat_(&f))?;
    ensure_eq!((st.st_uid, st.st_gid), (1234, 42), "target owner unchanged by lchown");
    ok("chown through symlink", chown_(&s, 99, 98))?;
    let st = ok("stat", stat_(&f))?;
    ensure_eq!((st.st_uid, st.st_gid), (99, 98), "chown follows symlink");
    Ok(())
}

fn attr_root_write_keeps_suid(d: &Path) -> CaseResult {
    // Root has CAP_FSETID: its writes and truncates leave set-ID bits alone.
    let f = d.join("f");
    put(&f, b"#!/bin/sh\n")?;
    ok("chmod", chmod_(&f, 0o6755))?;
    let fd = ok("open", open_(&f, libc::O_WRONLY, 0))?;
    ok("write", pwrite_all(&fd, b"#!/bin/bash\n", 0))?;
    ok("ftruncate", ftruncate_(&fd, 4))?;
    drop(fd);
    ensure_mode!(ok("stat", stat_(&f))?.st_mode & 0o7777, 0o6755, "mode after root's write");
    Ok(())
}

fn attr_chown_clears_suid(d: &Path) -> CaseResult {
    let cases: &[(u32, u32)] = &[
        (0o4755, 0o755),  // setuid cleared
        (0o6755, 0o755),  // setuid and group-executable setgid cleared
        (0o2745, 0o2745), // setgid without group exec (lock marker) kept
        (0o4644, 0o644),
    ];
    for (i, &(before, after)) in cases.iter().enumerate() {
        let f = d.join(format!("f{i}"));
        put(&f, b"#!/bin/sh\n")?;
        ok("chmod", chmod_(&f, before))?;
        ok("chown by root", chown_(&f, 1000, 1000))?;
        ensure_mode!(ok("stat", stat_(&f))?.st_mode & 0o7777, after, "mode {before:o} after chown");
    }
    // Directories keep their setgid bit.
    let sub = d.join("sub");
    ok("mkdir", mkdir_(&sub, 0o755))?;
    ok("chmod dir", chmod_(&sub, 0o2775))?;
    ok("chown dir", chown_(&sub, 1000, 1000))?;
    ensure_mode!(ok("stat", stat_(&sub))?.st_mode & 0o7777, 0o2775, "dir setgid after chown");
    Ok(())
}

fn attr_utimens_explicit(d: &Path) -> CaseResult {
    let f = d.join("f");
    put(&f, b"x")?;
    let c0 = ctime_of(&f)?;
    tick();
    let a = ts(1_000_000_000, 123_456_789);
    let m = ts(1_200_000_000, 987_654_321);
    ok("utimensat explicit", utimens_(&f, Some([a, m]), 0))?;
    let st = ok("stat", stat_(&f))?;
    ensure_eq!(atime(&st), (1_000_000_000, 123_456_789), "atime");
    ensure_eq!(mtime(&st), (1_200_000_000, 987_654_321), "mtime");
    ensure!(ctime(&st) > c0, "utimensat must update ctime");
    // Through an fd.
    let fd = ok("open", open_(&f, libc::O_RDONLY, 0))?;
    ok("futimens", futimens_(&fd, [ts(5, 6), ts(7, 8)]))?;
    let st = ok("stat", stat_(&f))?;
    ensure_eq!((atime(&st), mtime(&st)), ((5, 6), (7, 8)), "times after futimens");
    fails(
        "tv_nsec out of range",
        utimens_(&f, Some([ts(1, 1_000_000_000), ts(1, 0)]), 0),
        libc::EINVAL,
    )?;
    fails("utimensat missing", utimens_(&d.join("missing"), Some([a, m]), 0), libc::ENOENT)
}

fn attr_utimens_range(d: &Path) -> CaseResult {
    // Representable range is file-system dependent (POSIX only requires "supported" times);
    // Linux ext4 (256-byte inodes), xfs (bigtime), btrfs and tmpfs all take these.
    let f = d.join("f");
    put(&f, b"x")?;
    ok("utimensat pre-epoch/2040", utimens_(&f, Some([ts(-1, 0), ts(2_208_988_800, 5)]), 0))?;
    let st = ok("stat", stat_(&f))?;
    ensure_eq!(atime(&st), (-1, 0), "atime before the epoch");
    ensure_eq!(mtime(&st), (2_208_988_800, 5), "mtime after 2038");
    Ok(())
}

fn attr_utimens_now_omit(d: &Path) -> CaseResult {
    let f = d.join("f");
    put(&f, b"x")?;
    let a = ts(1_000_000_000, 111);
    let m = ts(1_100_000_000, 222);
    ok("utimensat explicit", utimens_(&f, Some([a, m]), 0))?;
    let within = |t: (i64, i64), lo: (i64, i64), hi: (i64, i64)| t.0 >= lo.0 - 1 && t.0 <= hi.0 + 1;
    // mtime = now, atime omitted.
    let c0 = ctime_of(&f)?;
    tick();
    let t0 = now();
    ok(
        "UTIME_OMIT/UTIME_NOW",
        utimens_(&f, Some([ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_NOW)]), 0),
    )?;
    let t1 = now();
    let st = ok("stat", stat_(&f))?;
    ensure_eq!(atime(&st), (1_000_000_000, 111), "atime with UTIME_OMIT");
    ensure!(
        within(mtime(&st), t0, t1),
        "mtime with UTIME_NOW: {:?} not within {t0:?}..{t1:?}",
        mtime(&st)
    );
    ensure!(ctime(&st) > c0, "ctime after UTIME_NOW");
    // atime = now, mtime omitted.
    let m_now = mtime(&st);
    ok(
        "UTIME_NOW/UTIME_OMIT",
        utimens_(&f, Some([ts(0, libc::UTIME_NOW), ts(0, libc::UTIME_OMIT)]), 0),
    )?;
    let t2 = now();
    let st = ok("stat", stat_(&f))?;
    ensure_eq!(mtime(&st), m_now, "mtime with UTIME_OMIT");
    ensure!(within(atime(&st), t1, t2), "atime with UTIME_NOW");
    // Both omitted: nothing changes, not even ctime.
    let c1 = ctime_of(&f)?;
    tick();
    ok(
        "UTIME_OMIT both",
        utimens_(&f, Some([ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_OMIT)]), 0),
    )?;
    let st = ok("stat", stat_(&f))?;
    ensure_eq!(ctime(&st), c1, "ctime with both UTIME_OMIT");
    ensure_eq!(mtime(&st), m_now, "mtime with both UTIME_OMIT");
    // NULL times: both now.
    ok("utimensat explicit", utimens_(&f, Some([a, m]), 0))?;
    let t3 = now();
    ok("utimensat NULL", utimens_(&f, None, 0))?;
    let t4 = now();
    let st = ok("stat", stat_(&f))?;
    ensure!(within(atime(&st), t3, t4) && within(mtime(&st), t3, t4), "NULL times set both to now");
    Ok(())
}

fn attr_utimens_symlink(d: &Path) -> CaseResult {
    let (f, s) = (d.join("f"), d.join("s"));
    put(&f, b"x")?;
    ok("symlink", symlink_(b"f", &s))?;
    ok("utimensat target", utimens_(&f, Some([ts(100, 0), ts(200, 0)]), 0))?;
    ok(
        "utimensat AT_SYMLINK_NOFOLLOW",
        utimens_(&s, Some([ts(300, 1), ts(400, 2)]), libc::AT_SYMLINK_NOFOLLOW),
    )?;
    let ls = ok("lstat", lstat_(&s))?;
    ensure_eq!(mtime(&ls), (400, 2), "symlink mtime");
    let st = ok("stat", stat_(&f))?;
    ensure_eq!(mtime(&st), (200, 0), "target mtime unchanged");
    ok("utimensat through symlink", utimens_(&s, Some([ts(500, 0), ts(600, 0)]), 0))?;
    ensure_eq!(mtime(&ok("stat", stat_(&f))?), (600, 0), "target mtime via symlink");
    Ok(())
}

/// `cp -p`: write, set the source's times through the fd, close. The times set stay (the close
/// must not put back the time of the writes), and a later write moves mtime on again.
fn attr_futimens_after_write(d: &Path) -> CaseResult {
    const SET_SEC: i64 = 1_230_768_000; // 2009-01-01
    let cases: [(&str, &[usize]); 3] =
        [("inline", &[100]), ("chunked", &[8192]), ("grown", &[8192, 8192])];
    for (name, writes) in cases {
        let p = d.join(name);
        let fd = ok("open O_CREAT|O_WRONLY", open_(&p, libc::O_CREAT | libc::O_WRONLY, 0o644))?;
        let mut model = Vec::new();
        for (seed, &len) in writes.iter().enumerate() {
            let data = pat(seed as u64, model.len() as u64, len);
            ok("write", write_all_(&fd, &data))?;
            model.extend_from_slice(&data);
        }
        ok("futimens", futimens_(&fd, [ts(SET_SEC, 5), ts(SET_SEC, 0)]))?;
        let st = ok("fstat", fstat_(&fd))?;
        ensure_eq!(mtime(&st), (SET_SEC, 0), "{name}: mtime after futimens (fstat)");
        ensure_eq!(st.st_size as usize, model.len(), "{name}: size after futimens");
        ok("close", fd.close())?;
        let st = ok("stat", stat_(&p))?;
        ensure_eq!(mtime(&st), (SET_SEC, 0), "{name}: mtime after close");
        ensure_eq!(atime(&st), (SET_SEC, 5), "{name}: atime after close");
        // A new open asks the file system again.
        let fd = ok("reopen", open_(&p, libc::O_RDONLY, 0))?;
        let st = ok("fstat after reopen", fstat_(&fd))?;
        ensure_eq!(mtime(&st), (SET_SEC, 0), "{name}: mtime after reopen");
        ensure_eq!(st.st_size as usize, model.len(), "{name}: size after reopen");
        drop(fd);
        same_bytes(name, &get(&p)?, &model)?;
        let t0 = now();
        let fd = ok("open O_WRONLY", open_(&p, libc::O_WRONLY, 0))?;
        ok("pwrite", pwrite_all(&fd, b"w", 0))?;
        ok("close", fd.close())?;
        let st = ok("stat after a later write", stat_(&p))?;
        ensure!(
            mtime(&st).0 >= t0.0 - 1,
            "{name}: a write after futimens must move mtime on: {:?}, written at {t0:?}",
            mtime(&st)
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cases: directories
// ---------------------------------------------------------------------------------------------

fn dir_mkdir(d: &Path) -> CaseResult {
    let sub = d.join("sub");
    set_old(d)?;
    let n0 = ok("stat", stat_(d))?.st_nlink;
    ctime_bumped(d, "mkdir (parent ctime)", || ok("mkdir", mkdir_(&sub, 0o750)))?;
    mtime_updated(d, "mkdir")?;
    ensure_eq!(ok("stat", stat_(d))?.st_nlink, n0 + 1, "parent nlink after mkdir");
    let st = ok("stat", stat_(&sub))?;
    ensure_mode!(st.st_mode & S_IFMT, S_IFDIR, "type");
    ensure_mode!(st.st_mode & 0o7777, 0o750 & !umask(), "mode");
    ensure_eq!(st.st_nlink, 2, "nlink");
    ensure_eq!(st.st_uid, euid(), "owner");
    ensure_eq!(st.st_gid, expected_gid(d)?, "group");
    ensure_eq!(
        ok("readdir", names_of(&sub))?,
        vec![b".".to_vec(), b"..".to_vec()],
        "new dir entries"
    );
    ensure_eq!(ok("stat ..", stat_(&sub.join("..")))?.st_ino, ok("stat", stat_(d))?.st_ino, "'..'");
    ensure_eq!(ok("stat .", stat_(&sub.join(".")))?.st_ino, st.st_ino, "'.'");
    fails("mkdir existing dir", mkdir_(&sub, 0o755), libc::EEXIST)?;
    put(&d.join("f"), b"")?;
    fails("mkdir over file", mkdir_(&d.join("f"), 0o755), libc::EEXIST)?;
    ok("symlink", symlink_(b"nowhere", &d.join("s")))?;
    fails("mkdir over dangling symlink", mkdir_(&d.join("s"), 0o755), libc::EEXIST)?;
    fails("mkdir in missing parent", mkdir_(&d.join("missing/x"), 0o755), libc::ENOENT)?;
    fails("mkdir under a file", mkdir_(&d.join("f/x"), 0o755), libc::ENOTDIR)
}

fn dir_rmdir(d: &Path) -> CaseResult {
    let sub = d.join("sub");
    ok("mkdir", mkdir_(&sub, 0o755))?;
    put(&sub.join("f"), b"")?;
    fails("rmdir non-empty (file)", rmdir_(&sub), libc::ENOTEMPTY)?;
    ok("unlink", unlink_(&sub.join("f")))?;
    ok("mkdir inner", mkdir_(&sub.join("inner"), 0o755))?;
    fails("rmdir non-empty (subdir)", rmdir_(&sub), libc::ENOTEMPTY)?;
    ok("rmdir inner", rmdir_(&sub.join("inner")))?;
    let f = d.join("f");
    put(&f, b"")?;
    fails("rmdir a file", rmdir_(&f), libc::ENOTDIR)?;
    fails("unlink a dir", unlink_(&sub), libc::EISDIR)?;
    fails("rmdir missing", rmdir_(&d.join("missing")), libc::ENOENT)?;
    fails("rmdir dir/.", rmdir_(&sub.join(".")), libc::EINVAL)?;
    ok("symlink to dir", symlink_(b"sub", &d.join("ls")))?;
    fails("rmdir symlink to dir", rmdir_(&d.join("ls")), libc::ENOTDIR)?;
    set_old(d)?;
    let n0 = ok("stat", stat_(d))?.st_nlink;
    ok("rmdir empty", rmdir_(&sub))?;
    mtime_updated(d, "rmdir")?;
    ensure_eq!(ok("stat", stat_(d))?.st_nlink, n0 - 1, "parent nlink after rmdir");
    fails("stat removed", stat_(&sub), libc::ENOENT)
}

fn dir_readdir_small(d: &Path) -> CaseResult {
    put(&d.join("f"), b"")?;
    ok("mkdir", mkdir_(&d.join("sub"), 0o755))?;
    ok("symlink", symlink_(b"f", &d.join("s")))?;
    let mut ents = ok("readdir", list_dir(d))?;
    ents.sort();
    let names: Vec<&[u8]> = ents.iter().map(|(n, _)| n.as_slice()).collect();
    ensure_eq!(names, vec![&b"."[..], b"..", b"f", b"s", b"sub"], "entries");
    for (name, ty) in &ents {
        let want = match name.as_slice() {
            b"f" => libc::DT_REG,
            b"s" => libc::DT_LNK,
            _ => libc::DT_DIR,
        };
        ensure!(
            *ty == want || *ty == libc::DT_UNKNOWN,
            "d_type of {:?}: {ty}, expected {want}",
            String::from_utf8_lossy(name)
        );
    }
    ok("unlink", unlink_(&d.join("f")))?;
    ensure_eq!(
        ok("readdir", names_of(d))?,
        vec![b".".to_vec(), b"..".to_vec(), b"s".to_vec(), b"sub".to_vec()],
        "entries after unlink"
    );
    fails("opendir on a dangling symlink", list_dir(&d.join("s")), libc::ENOENT)?;
    put(&d.join("g"), b"")?;
    fails("opendir on a file", list_dir(&d.join("g")), libc::ENOTDIR)
}

fn dir_readdir_mutating(d: &Path) -> CaseResult {
    let n = 1000usize;
    for i in 0..n {
        put(&d.join(format!("e{i:04}")), b"")?;
    }
    let c = cs(d);
    // SAFETY: valid C string.
    let dirp = unsafe { libc::opendir(c.as_ptr()) };
    ensure!(!dirp.is_null(), "opendir: {}", ename(errno()));
    // Unlink every entry right after readdir returns it (the `rm -rf` pattern): entries that
    // were never removed must still be returned, so one pass must empty the directory.
    let mut seen = std::collections::HashSet::new();
    let mut err = None;
    loop {
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: dirp is an open DIR*.
        let ent = unsafe { libc::readdir(dirp) };
        if ent.is_null() {
            if errno() != 0 {
                err = Some(format!("readdir: {}", ename(errno())));
            }
            break;
        }
        // SAFETY: valid dirent.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes().to_vec();
        if name == b"." || name == b".." {
            continue;
        }
        if !seen.insert(name.clone()) {
            err = Some(format!("{:?} returned twice", String::from_utf8_lossy(&name)));
            break;
        }
        if let Err(e) = unlink_(&d.join(std::ffi::OsStr::from_bytes(&name))) {
            err = Some(format!("unlink {:?}: {}", String::from_utf8_lossy(&name), ename(e)));
            break;
        }
    }
    if err.is_none() {
        // rewinddir sees entries created after opendir.
        put(&d.join("late"), b"")?;
        // SAFETY: dirp is an open DIR*.
        unsafe { libc::rewinddir(dirp) };
        let mut names = Vec::new();
        loop {
            // SAFETY: dirp is an open DIR*.
            let ent = unsafe { libc::readdir(dirp) };
            if ent.is_null() {
                break;
            }
            // SAFETY: valid dirent.
            names.push(unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes().to_vec());
        }
        names.sort();
        if names != vec![b".".to_vec(), b"..".to_vec(), b"late".to_vec()] {
            let shown: Vec<String> =
                names.iter().take(8).map(|n| String::from_utf8_lossy(n).into_owned()).collect();
            err = Some(format!(
                "after rewinddir: {} entries, first {shown:?}; expected ., .., late",
                names.len()
            ));
        }
    }
    // SAFETY: dirp is an open DIR*.
    unsafe { libc::closedir(dirp) };
    if let Some(e) = err {
        return Err(e);
    }
    ensure_eq!(seen.len(), n, "entries returned while unlinking");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cases: statfs, names
// ---------------------------------------------------------------------------------------------

fn statfs_sane(d: &Path) -> CaseResult {
    let st = ok("statvfs", statvfs_(d))?;
    ensure!(st.f_bsize > 0 && st.f_frsize > 0, "block sizes {} {}", st.f_bsize, st.f_frsize);
    ensure!(st.f_blocks > 0, "f_blocks is 0");
    ensure!(st.f_bfree <= st.f_blocks, "f_bfree {} > f_blocks {}", st.f_bfree, st.f_blocks);
    ensure!(st.f_bavail <= st.f_bfree, "f_bavail {} > f_bfree {}", st.f_bavail, st.f_bfree);
    ensure!(st.f_ffree <= st.f_files, "f_ffree {} > f_files {}", st.f_ffree, st.f_files);
    ensure_eq!(st.f_namemax, 255, "f_namemax");
    let f = d.join("f");
    put(&f, b"x")?;
    let sf = ok("statvfs file", statvfs_(&f))?;
    ensure_eq!(
        (sf.f_fsid, sf.f_blocks, sf.f_bsize),
        (st.f_fsid, st.f_blocks, st.f_bsize),
        "same fs via a file"
    );
    fails("statvfs missing", statvfs_(&d.join("missing")), libc::ENOENT)
}

fn names_max(d: &Path) -> CaseResult {
    let n255 = "a".repeat(255);
    let n256 = "a".repeat(256);
    let p = d.join(&n255);
    put(&p, b"max")?;
    same_bytes("255-byte name", &get(&p)?, b"max")?;
    ensure!(
        ok("readdir", names_of(d))?.contains(&n255.as_bytes().to_vec()),
        "255-byte name not listed"
    );
    let q = d.join("b".repeat(255));
    ok("rename to 255", rename_(&p, &q))?;
    ok("link 255", link_(&q, &d.join("c".repeat(255))))?;
    ok("mkdir 255", mkdir_(&d.join("d".repeat(255)), 0o755))?;
    ok("symlink 255", symlink_(b"x", &d.join("e".repeat(255))))?;
    // 255 bytes of multi-byte UTF-8 (85 x 3 bytes) is fine; 86 characters (258 bytes) is not.
    let u85 = "\u{20AC}".repeat(85);
    put(&d.join(&u85), b"utf8")?;
    same_bytes("85 x 3-byte chars", &get(&d.join(&u85))?, b"utf8")?;
    let long = d.join(&n256);
    let too_long = ENAMETOOLONG_;
    fails("open O_CREAT 256", open_(&long, libc::O_CREAT | libc::O_WRONLY, 0o644), too_long)?;
    fails("stat 256", stat_(&long), too_long)?;
    fails("mkdir 256", mkdir_(&long, 0o755), too_long)?;
    fails("symlink 256", symlink_(b"x", &long), too_long)?;
    fails("link 256", link_(&q, &long), too_long)?;
    fails("rename to 256", rename_(&q, &long), too_long)?;
    fails(
        "86 x 3-byte chars",
        open_(&d.join("\u{20AC}".repeat(86)), libc::O_CREAT | libc::O_WRONLY, 0o644),
        too_long,
    )?;
    ok("source survives", stat_(&q)).map(|_| ())
}

const ENAMETOOLONG_: i32 = libc::ENAMETOOLONG;

fn names_special(d: &Path) -> CaseResult {
    let names: &[&[u8]] = &[
        b"a b",
        b"-dash",
        b".hidden",
        b"tab\there",
        b"nl\nhere",
        "\u{00fc}\u{00df}\u{4e2d}".as_bytes(),
        b"x:y",
        b"...",
    ];
    for n in names {
        let p = d.join(std::ffi::OsStr::from_bytes(n));
        put(&p, n)?;
        same_bytes("content", &get(&p)?, n)?;
    }
    let listed = ok("readdir", names_of(d))?;
    for n in names {
        ensure!(listed.contains(&n.to_vec()), "{:?} not listed", String::from_utf8_lossy(n));
    }
    ensure_eq!(listed.len(), names.len() + 2, "entry count");
    Ok(())
}

fn names_non_utf8(d: &Path) -> CaseResult {
    let n: &[u8] = &[b'x', 0xff, 0xfe, b'y'];
    let p = d.join(std::ffi::OsStr::from_bytes(n));
    put(&p, b"raw")?;
    same_bytes("content", &get(&p)?, b"raw")?;
    ensure!(
        ok("readdir", names_of(d))?.contains(&n.to_vec()),
        "non-UTF-8 name not listed byte for byte"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

const CASES: &[Case] = &[
    ("create.basic", create_basic),
    ("open.excl", open_excl),
    ("open.errors", open_errors),
    ("open.trunc", open_trunc),
    ("open.append_two_fds", open_append),
    ("open.access_mode_ebadf", open_bad_fd_mode),
    ("io.pread_pwrite", io_pread_pwrite),
    ("io.seek_past_eof", io_seek_past_eof),
    ("io.holes", io_holes),
    ("io.truncate", io_truncate),
    ("io.truncate_down_up_zeros", io_truncate_down_up),
    ("io.write_updates_times", io_write_times),
    ("io.fsync", io_fsync),
    ("io.large_single_write", io_large_single_write),
    ("inline.grow_odd_offsets", inline_grow_odd),
    ("inline.append_3000_to_3100", inline_append),
    ("inline.grow_to_5mib_and_shrink", inline_grow_large),
    ("inline.shrink_reopen_append", inline_shrink_reopen),
    ("rename.new_name", rename_new_name),
    ("rename.file_ctime", rename_file_ctime),
    ("rename.across_dirs", rename_across_dirs),
    ("rename.replace_file", rename_replace_file),
    ("rename.replace_empty_dir", rename_replace_empty_dir),
    ("rename.errors", rename_errors),
    ("rename.noreplace", rename_noreplace),
    ("rename.exchange", rename_exchange),
    ("rename.onto_itself", rename_self),
    ("rename.dir_parent_nlink", rename_dir_nlink),
    ("links.hard", links_hard),
    ("links.dir_nlink", links_dir_nlink),
    ("links.unlink_open_file", links_unlink_open),
    ("symlink.basic", symlink_basic),
    ("symlink.dangling", symlink_dangling),
    ("symlink.loop", symlink_loop),
    ("symlink.nofollow", symlink_nofollow),
    ("xattr.basic", xattr_basic),
    ("xattr.flags", xattr_flags),
    ("xattr.erange", xattr_erange),
    ("xattr.values", xattr_values),
    ("attr.chmod", attr_chmod),
    ("attr.chown", attr_chown),
    ("attr.chown_clears_suid", attr_chown_clears_suid),
    ("attr.root_write_keeps_suid", attr_root_write_keeps_suid),
    ("attr.utimens_explicit", attr_utimens_explicit),
    ("attr.utimens_range", attr_utimens_range),
    ("attr.utimens_now_omit", attr_utimens_now_omit),
    ("attr.utimens_symlink", attr_utimens_symlink),
    ("attr.futimens_after_write_kept_at_close", attr_futimens_after_write),
    ("dir.mkdir", dir_mkdir),
    ("dir.rmdir", dir_rmdir),
    ("dir.readdir_small", dir_readdir_small),
    ("dir.readdir_while_unlinking", dir_readdir_mutating),
    ("statfs.sane", statfs_sane),
    ("names.max_length", names_max),
    ("names.special", names_special),
    ("names.non_utf8", names_non_utf8),
];

/// Names of the cases `run_all` runs, in order.
pub fn case_names() -> Vec<&'static str> {
    CASES.iter().map(|(n, _)| *n).collect()
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn fresh_root(dir: &Path, tag: &str) -> Result<PathBuf, String> {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    // SAFETY: always succeeds.
    let pid = unsafe { libc::getpid() };
    let root = dir.join(format!("posix-{tag}-{pid}-{n}"));
    ok(&format!("mkdir {}", root.display()), mkdir_(&root, 0o755))?;
    ok("chmod root", chmod_(&root, 0o755))?;
    Ok(root)
}

/// Remove a tree as root, first making every directory searchable and writable.
fn remove_tree(p: &Path) -> Result<(), String> {
    fn open_up(p: &Path) {
        let is_dir = lstat_(p).is_ok_and(|st| st.st_mode & S_IFMT == S_IFDIR);
        if is_dir {
            let _ = chmod_(p, 0o755);
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    open_up(&e.path());
                }
            }
        }
    }
    open_up(p);
    io(&format!("remove {}", p.display()), fs::remove_dir_all(p))
}

fn run_case(f: fn(&Path) -> CaseResult, d: &Path) -> CaseResult {
    match std::panic::catch_unwind(|| f(d)) {
        Ok(r) => r,
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("panicked: {msg}"))
        }
    }
}

/// Run every case as the calling user, each in its own fresh subdirectory of `dir`.
pub fn run_all(dir: &Path) -> Report {
    let mut report = Report::default();
    let root = match fresh_root(dir, "table") {
        Ok(r) => r,
        Err(e) => {
            report.cases.push(("setup".to_string(), Err(e)));
            return report;
        }
    };
    for (name, f) in CASES {
        let d = root.join(name);
        let r = ok(&format!("mkdir {}", d.display()), mkdir_(&d, 0o755))
            .and_then(|()| run_case(*f, &d));
        report.cases.push((name.to_string(), r));
    }
    if let Err(e) = remove_tree(&root) {
        report.cases.push(("cleanup".to_string(), Err(e)));
    }
    report
}

// ---------------------------------------------------------------------------------------------
// readdir with many entries
// ---------------------------------------------------------------------------------------------

/// Create `n` empty files, require readdir to return each exactly once plus "." and "..",
/// remove them, require the directory to be empty again.
pub fn readdir_large(dir: &Path, n: usize) -> Result<(), String> {
    let root = fresh_root(dir, "readdir")?;
    let result = readdir_large_in(&root, n);
    let cleanup = remove_tree(&root);
    result.and(cleanup)
}

fn readdir_large_in(d: &Path, n: usize) -> CaseResult {
    // Names of varying length so entries do not pack uniformly.
    let name = |i: usize| format!("{i:06}-{}", "x".repeat(i % 37));
    for i in 0..n {
        let fd = ok(
            &format!("create #{i}"),
            open_(&d.join(name(i)), libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644),
        )?;
        ok("close", fd.close())?;
    }
    let ents = ok("readdir", list_dir(d))?;
    let mut seen = std::collections::HashMap::<Vec<u8>, usize>::new();
    for (nm, _) in &ents {
        *seen.entry(nm.clone()).or_default() += 1;
    }
    let dups: Vec<String> = seen
        .iter()
        .filter(|(_, c)| **c > 1)
        .take(5)
        .map(|(k, c)| format!("{} x{c}", String::from_utf8_lossy(k)))
        .collect();
    ensure!(dups.is_empty(), "entries returned more than once: {dups:?}");
    ensure!(seen.contains_key(&b"."[..]) && seen.contains_key(&b".."[..]), "'.' or '..' missing");
    let missing: Vec<String> =
        (0..n).map(name).filter(|s| !seen.contains_key(s.as_bytes())).take(5).collect();
    ensure!(missing.is_empty(), "entries missing from readdir: {missing:?}");
    ensure_eq!(ents.len(), n + 2, "entry count");
    ensure_eq!(ok("stat", stat_(d))?.st_nlink, 2, "nlink of a dir with only files");
    for i in 0..n {
        ok(&format!("unlink #{i}"), unlink_(&d.join(name(i))))?;
    }
    ensure_eq!(
        ok("readdir after unlink", names_of(d))?,
        vec![b".".to_vec(), b"..".to_vec()],
        "entries after removal"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Unprivileged cases
// ---------------------------------------------------------------------------------------------

/// Identity the child runs as.
#[derive(Debug, Clone, Copy)]
struct Ids {
    uid: u32,
    gid: u32,
    extra: u32,
}

type Setup = fn(&Path, &Ids) -> CaseResult;
type Check = fn(&Path, &Ids) -> CaseResult;

/// Root-side fixture: a file with exact owner and mode (chmod after chown, which clears suid).
fn mk_file(p: &Path, data: &[u8], uid: u32, gid: u32, mode: u32) -> CaseResult {
    put(p, data)?;
    ok("chown fixture", chown_(p, uid, gid))?;
    ok("chmod fixture", chmod_(p, mode))
}

fn mk_dir(p: &Path, uid: u32, gid: u32, mode: u32) -> CaseResult {
    ok("mkdir fixture", mkdir_(p, 0o700))?;
    ok("chown fixture", chown_(p, uid, gid))?;
    ok("chmod fixture", chmod_(p, mode))
}

fn can_read(p: &Path) -> Result<Vec<u8>, i32> {
    let fd = open_(p, libc::O_RDONLY, 0)?;
    pread_all(&fd, 1 << 16, 0)
}

fn can_write(p: &Path) -> Result<(), i32> {
    let fd = open_(p, libc::O_WRONLY, 0)?;
    pwrite_all(&fd, b"w", 0)
}

fn no_setup(_: &Path, _: &Ids) -> CaseResult {
    Ok(())
}

fn preflight_check(d: &Path, ids: &Ids) -> CaseResult {
    ensure_eq!((euid(), egid()), (ids.uid, ids.gid), "effective ids in the child");
    let mut groups = [0 as libc::gid_t; 64];
    // SAFETY: buffer of 64 gids.
    let n = unsafe { libc::getgroups(64, groups.as_mut_ptr()) };
    ensure!(n >= 0, "getgroups failed");
    ensure_eq!(groups[..n as usize].to_vec(), vec![ids.extra], "supplementary groups");
    ok(
        "stat the case dir as the user (ancestors searchable? mount allows other users?)",
        stat_(d),
    )?;
    Ok(())
}

fn owner_class_setup(d: &Path, i: &Ids) -> CaseResult {
    mk_file(&d.join("r"), b"data", i.uid, 0, 0o400)?;
    mk_file(&d.join("none"), b"data", i.uid, i.gid, 0o077)
}
fn owner_class_check(d: &Path, _: &Ids) -> CaseResult {
    same_bytes("owner read 0400", &ok("owner read 0400", can_read(&d.join("r")))?, b"data")?;
    fails("owner write 0400", can_write(&d.join("r")), libc::EACCES)?;
    fails("owner read 0077 (owner class wins)", can_read(&d.join("none")), libc::EACCES)?;
    fails("access R_OK 0077", access_(&d.join("none"), libc::R_OK), libc::EACCES)
}

fn group_class_setup(d: &Path, i: &Ids) -> CaseResult {
    mk_file(&d.join("g"), b"data", 0, i.gid, 0o040)?;
    mk_file(&d.join("gx"), b"data", 0, i.gid, 0o704)
}
fn group_class_check(d: &Path, _: &Ids) -> CaseResult {
    same_bytes("group read 040", &ok("group read 040", can_read(&d.join("g")))?, b"data")?;
    fails("group write 040", can_write(&d.join("g")), libc::EACCES)?;
    fails("group read 0704 (group class wins over other)", can_read(&d.join("gx")), libc::EACCES)
}

fn other_class_setup(d: &Path, _: &Ids) -> CaseResult {
    mk_file(&d.join("o"), b"data", 0, 0, 0o004)?;
    mk_file(&d.join("zero"), b"data", 0, 0, 0o000)?;
    mk_file(&d.join("w"), b"data", 0, 0, 0o002)
}
fn other_class_check(d: &Path, _: &Ids) -> CaseResult {
    same_bytes("other read 004", &ok("other read 004", can_read(&d.join("o")))?, b"data")?;
    fails("other write 004", can_write(&d.join("o")), libc::EACCES)?;
    fails("read 000", can_read(&d.join("zero")), libc::EACCES)?;
    fails("write 000", can_write(&d.join("zero")), libc::EACCES)?;
    ok("other write 002", can_write(&d.join("w")))?;
    fails("other read 002", can_read(&d.join("w")), libc::EACCES)
}

fn suppl_setup(d: &Path, i: &Ids) -> CaseResult {
    mk_file(&d.join("s"), b"data", 0, i.extra, 0o060)?;
    mk_file(&d.join("s2"), b"data", 0, i.extra, 0o006)
}
fn suppl_check(d: &Path, _: &Ids) -> CaseResult {
    same_bytes(
        "supplementary group read",
        &ok("read via supplementary group", can_read(&d.join("s")))?,
        b"data",
    )?;
    ok("write via supplementary group", can_write(&d.join("s")))?;
    fails("supplementary group class wins over other", can_read(&d.join("s2")), libc::EACCES)
}

fn exec_setup(d: &Path, _: &Ids) -> CaseResult {
    mk_file(&d.join("x"), b"#!/bin/sh\n", 0, 0, 0o755)?;
    mk_file(&d.join("nx"), b"#!/bin/sh\n", 0, 0, 0o644)
}
fn exec_check(d: &Path, _: &Ids) -> CaseResult {
    ok("access X_OK 0755", access_(&d.join("x"), libc::X_OK))?;
    fails("access X_OK 0644", access_(&d.join("nx"), libc::X_OK), libc::EACCES)?;
    fails("access W_OK 0755 root file", access_(&d.join("x"), libc::W_OK), libc::EACCES)
}

fn dir_search_setup(d: &Path, _: &Ids) -> CaseResult {
    mk_dir(&d.join("nx"), 0, 0, 0o755)?;
    mk_file(&d.join("nx/f"), b"data", 0, 0, 0o644)?;
    ok("chmod", chmod_(&d.join("nx"), 0o776))?;
    mk_dir(&d.join("nr"), 0, 0, 0o755)?;
    mk_file(&d.join("nr/f"), b"data", 0, 0, 0o644)?;
    ok("chmod", chmod_(&d.join("nr"), 0o771))?;
    mk_dir(&d.join("a"), 0, 0, 0o755)?;
    mk_dir(&d.join("a/b"), 0, 0, 0o755)?;
    mk_file(&d.join("a/b/c"), b"data", 0, 0, 0o644)?;
    ok("chmod", chmod_(&d.join("a/b"), 0o700))
}
fn dir_search_check(d: &Path, _: &Ids) -> CaseResult {
    fails("stat through dir without x", stat_(&d.join("nx/f")), libc::EACCES)?;
    fails("open through dir without x", open_(&d.join("nx/f"), libc::O_RDONLY, 0), libc::EACCES)?;
    let names = ok("readdir dir with r but no x", names_of(&d.join("nx")))?;
    ensure!(names.contains(&b"f".to_vec()), "f not listed");
    fails("readdir dir without r", list_dir(&d.join("nr")), libc::EACCES)?;
    same_bytes(
        "open by name in dir with x only",
        &ok("read nr/f", can_read(&d.join("nr/f")))?,
        b"data",
    )?;
    fails("nested lookup through 0700 root dir", stat_(&d.join("a/b/c")), libc::EACCES)?;
    fails(
        "create through dir without x",
        open_(&d.join("nx/new"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::EACCES,
    )
}

fn dir_write_setup(d: &Path, _: &Ids) -> CaseResult {
    mk_dir(&d.join("ro"), 0, 0, 0o755)?;
    mk_file(&d.join("ro/f"), b"data", 0, 0, 0o666)?;
    mk_dir(&d.join("ro/e"), 0, 0, 0o755)?;
    mk_dir(&d.join("rw"), 0, 0, 0o777)?;
    mk_file(&d.join("rw/f"), b"data", 0, 0, 0o600)?;
    mk_file(&d.join("rw/g"), b"data", 0, 0, 0o600)?;
    mk_dir(&d.join("wnx"), 0, 0, 0o772)
}
fn dir_write_check(d: &Path, _: &Ids) -> CaseResult {
    let ro = d.join("ro");
    fails(
        "create in 0755 root dir",
        open_(&ro.join("new"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::EACCES,
    )?;
    fails("unlink in 0755 root dir", unlink_(&ro.join("f")), libc::EACCES)?;
    fails("mkdir in 0755 root dir", mkdir_(&ro.join("m"), 0o755), libc::EACCES)?;
    fails("rmdir in 0755 root dir", rmdir_(&ro.join("e")), libc::EACCES)?;
    fails("rename in 0755 root dir", rename_(&ro.join("f"), &ro.join("g")), libc::EACCES)?;
    fails("symlink in 0755 root dir", symlink_(b"x", &ro.join("s")), libc::EACCES)?;
    fails("link into 0755 root dir", link_(&ro.join("f"), &ro.join("l")), libc::EACCES)?;
    ok("write 0666 file in 0755 dir", can_write(&ro.join("f")))?;
    let rw = d.join("rw");
    ok("unlink root's file in 0777 dir (no sticky)", unlink_(&rw.join("f")))?;
    ok("rename root's file in 0777 dir (no sticky)", rename_(&rw.join("g"), &rw.join("h")))?;
    let fd =
        ok("create in 0777 dir", open_(&rw.join("mine"), libc::O_CREAT | libc::O_WRONLY, 0o644))?;
    ok("close", fd.close())?;
    fails(
        "create in dir with w but no x",
        open_(&d.join("wnx/n"), libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::EACCES,
    )
}

fn readonly_setup(d: &Path, i: &Ids) -> CaseResult {
    mk_file(&d.join("f"), b"keep", i.uid, i.gid, 0o444)
}
fn readonly_check(d: &Path, _: &Ids) -> CaseResult {
    let f = d.join("f");
    fails("O_WRONLY on 0444", open_(&f, libc::O_WRONLY, 0), libc::EACCES)?;
    fails("O_RDWR on 0444", open_(&f, libc::O_RDWR, 0), libc::EACCES)?;
    fails("O_WRONLY|O_TRUNC on 0444", open_(&f, libc::O_WRONLY | libc::O_TRUNC, 0), libc::EACCES)?;
    fails(
        "O_CREAT|O_WRONLY on existing 0444",
        open_(&f, libc::O_CREAT | libc::O_WRONLY, 0o644),
        libc::EACCES,
    )?;
    fails("truncate 0444", truncate_(&f, 0), libc::EACCES)?;
    same_bytes("content unchanged", &ok("read", can_read(&f))?, b"keep")?;
    ok("owner may chmod own file", chmod_(&f, 0o644))?;
    ok("write after chmod", can_write(&f))?;
    same_bytes("content after write", &ok("read", can_read(&f))?, b"weep")
}

fn chmod_other_setup(d: &Path, i: &Ids) -> CaseResult {
    mk_file(&d.join("root"), b"r", 0, 0, 0o666)?;
    mk_file(&d.join("root644"), b"r", 0, 0, 0o644)?;
    mk_file(&d.join("mine"), b"m", i.uid, i.gid, 0o644)
}
fn chmod_other_check(d: &Path, i: &Ids) -> CaseResult {
    let (root, mine) = (d.join("root"), d.join("mine"));
    fails("chmod someone else's file", chmod_(&root, 0o777), libc::EPERM)?;
    fails("chown someone else's file", chown_(&root, i.uid, NOCHANGE), libc::EPERM)?;
    fails("give own file away", chown_(&mine, 0, NOCHANGE), libc::EPERM)?;
    fails("chgrp own file to a non-member group", chown_(&mine, NOCHANGE, 0), libc::EPERM)?;
    ok("chgrp own file to supplementary group", chown_(&mine, NOCHANGE, i.extra))?;
    ensure_eq!(ok("stat", stat_(&mine))?.st_gid, i.extra, "group after chgrp");
    ok("chown own file to itself", chown_(&mine, i.uid, i.gid))?;
    fails(
        "explicit times on someone else's file",
        utimens_(&root, Some([ts(1, 0), ts(2, 0)]), 0),
        libc::EPERM,
    )?;
    ok("UTIME_NOW on someone else's writable file", utimens_(&root, None, 0))?;
    fails(
        "UTIME_NOW on someone else's read-only file",
        utimens_(&d.join("root644"), None, 0),
        libc::EACCES,
    )?;
    ok("explicit times on own file", utimens_(&mine, Some([ts(1, 0), ts(2, 0)]), 0))?;
    ensure_mode!(ok("stat", stat_(&root))?.st_mode & 0o7777, 0o666, "root's mode unchanged");
    Ok(())
}

fn sticky_setup(d: &Path, i: &Ids) -> CaseResult {
    let s = d.join("s");
    mk_dir(&s, 0, 0, 0o1777)?;
    mk_file(&s.join("root"), b"r", 0, 0, 0o666)?;
    mk_file(&s.join("root2"), b"r", 0, 0, 0o666)?;
    mk_file(&s.join("given"), b"g", i.uid, i.gid, 0o644)?;
    mk_dir(&s.join("rootdir"), 0, 0, 0o777)
}
fn sticky_check(d: &Path, _: &Ids) -> CaseResult {
    let s = d.join("s");
    fails("unlink other's file in sticky dir", unlink_(&s.join("root")), libc::EPERM)?;
    fails(
        "rename other's file in sticky dir",
        rename_(&s.join("root"), &s.join("x")),
        libc::EPERM,
    )?;
    fails("rmdir other's dir in sticky dir", rmdir_(&s.join("rootdir")), libc::EPERM)?;
    ok("write other's 0666 file in sticky dir", can_write(&s.join("root")))?;
    let fd = ok("create own file", open_(&s.join("mine"), libc::O_CREAT | libc::O_WRONLY, 0o644))?;
    ok("close", fd.close())?;
    fails(
        "rename own file over other's file",
        rename_(&s.join("mine"), &s.join("root2")),
        libc::EPERM,
    )?;
    ok("rename own file", rename_(&s.join("mine"), &s.join("mine2")))?;
    ok("unlink own file", unlink_(&s.join("mine2")))?;
    ok("unlink file owned by user (made by root)", unlink_(&s.join("given")))?;
    ok("other's files still there", stat_(&s.join("root")))?;
    ok("other's files still there", stat_(&s.join("root2"))).map(|_| ())
}

fn setgid_setup(d: &Path, i: &Ids) -> CaseResult {
    mk_dir(&d.join("sg"), 0, i.extra, 0o2777)?;
    mk_dir(&d.join("plain"), 0, i.extra, 0o777)
}
fn setgid_check(d: &Path, i: &Ids) -> CaseResult {
    let sg = d.join("sg");
    let fd =
        ok("create in setgid dir", open_(&sg.join("f"), libc::O_CREAT | libc::O_WRONLY, 0o644))?;
    let st = ok("fstat", fstat_(&fd))?;
    ensure_eq!(st.st_gid, i.extra, "new file inherits the dir's group");
    ensure_eq!(st.st_uid, i.uid, "new file owner");
    ok("mkdir in setgid dir", mkdir_(&sg.join("sub"), 0o755))?;
    let st = ok("stat", stat_(&sg.join("sub")))?;
    ensure_eq!(st.st_gid, i.extra, "new subdir inherits the dir's group");
    ensure!(
        st.st_mode & S_ISGID != 0,
        "new subdir inherits the setgid bit (mode {:o})",
        st.st_mode
    );
    let fd2 = ok(
        "create in inherited subdir",
        open_(&sg.join("sub/g"), libc::O_CREAT | libc::O_WRONLY, 0o644),
    )?;
    ensure_eq!(ok("fstat", fstat_(&fd2))?.st_gid, i.extra, "grandchild group");
    let fd3 = ok(
        "create in plain dir",
        open_(&d.join("plain/f"), libc::O_CREAT | libc::O_WRONLY, 0o644),
    )?;
    ensure_eq!(ok("fstat", fstat_(&fd3))?.st_gid, i.gid, "group in a dir without setgid");
    ok("mkdir in plain dir", mkdir_(&d.join("plain/sub"), 0o755))?;
    ensure!(
        ok("stat", stat_(&d.join("plain/sub")))?.st_mode & S_ISGID == 0,
        "no setgid bit without a setgid parent"
    );
    Ok(())
}

fn sgid_nonmember_setup(d: &Path, i: &Ids) -> CaseResult {
    mk_file(&d.join("rootgrp"), b"x", i.uid, 0, 0o644)?;
    mk_file(&d.join("member"), b"x", i.uid, i.extra, 0o644)
}
fn sgid_nonmember_check(d: &Path, _: &Ids) -> CaseResult {
    ok("chmod 02755 own file, group not a member", chmod_(&d.join("rootgrp"), 0o2755))?;
    ensure_mode!(
        ok("stat", stat_(&d.join("rootgrp")))?.st_mode & 0o7777,
        0o755,
        "setgid dropped silently"
    );
    ok("chmod 02755 own file, member group", chmod_(&d.join("member"), 0o2755))?;
    ensure_mode!(ok("stat", stat_(&d.join("member")))?.st_mode & 0o7777, 0o2755, "setgid kept");
    ok("chmod 04755 own file", chmod_(&d.join("member"), 0o4755))?;
    ensure_mode!(ok("stat", stat_(&d.join("member")))?.st_mode & 0o7777, 0o4755, "setuid kept");
    Ok(())
}

fn write_kills_suid_setup(d: &Path, _: &Ids) -> CaseResult {
    mk_file(&d.join("u"), b"data", 0, 0, 0o4777)?;
    mk_file(&d.join("g"), b"data", 0, 0, 0o2777)?;
    mk_file(&d.join("lock"), b"data", 0, 0, 0o2767)?;
    mk_file(&d.join("t"), b"data", 0, 0, 0o6777)?;
    mk_file(&d.join("same"), b"data", 0, 0, 0o4777)?;
    // Looked at before the writes, so that the kernel holds the old modes.
    for name in ["u", "g", "lock", "t", "same"] {
        ok("stat fixture", stat_(&d.join(name)))?;
    }
    Ok(())
}
fn write_kills_suid_check(d: &Path, _: &Ids) -> CaseResult {
    // Modes read both ways: a stat asking for the mode alone is answered from the kernel's
    // cache, which must have heard of the change.
    ok("write setuid file", can_write(&d.join("u")))?;
    ensure_mode!(ok("statx", mode_only_(&d.join("u")))? & 0o7777, 0o777, "setuid after write");
    ensure_mode!(
        ok("stat", stat_(&d.join("u")))?.st_mode & 0o7777,
        0o777,
        "setuid cleared by unprivileged write"
    );
    ok("write setgid file", can_write(&d.join("g")))?;
    ensure_mode!(ok("statx", mode_only_(&d.join("g")))? & 0o7777, 0o777, "setgid after write");
    ensure_mode!(
        ok("stat", stat_(&d.join("g")))?.st_mode & 0o7777,
        0o777,
        "setgid cleared by unprivileged write"
    );
    // Without group execute, set-group-ID marks mandatory locking and stays.
    ok("write setgid file without group execute", can_write(&d.join("lock")))?;
    ensure_mode!(
        ok("stat", stat_(&d.join("lock")))?.st_mode & 0o7777,
        0o2767,
        "setgid without group execute kept by unprivileged write"
    );
    let fd = ok("open for truncate", open_(&d.join("t"), libc::O_WRONLY, 0))?;
    ok("ftruncate", ftruncate_(&fd, 2))?;
    drop(fd);
    ensure_mode!(ok("statx", mode_only_(&d.join("t")))? & 0o7777, 0o777, "mode after truncate");
    // A truncate to the size the file has clears them too.
    let fd = ok("open for truncate", open_(&d.join("same"), libc::O_WRONLY, 0))?;
    ok("ftruncate to the same size", ftruncate_(&fd, 4))?;
    drop(fd);
    ensure_mode!(
        ok("stat", stat_(&d.join("same")))?.st_mode & 0o7777,
        0o777,
        "mode after a truncate to the same size"
    );
    Ok(())
}

fn ftruncate_fd_setup(d: &Path, i: &Ids) -> CaseResult {
    mk_dir(&d.join("mine"), i.uid, i.gid, 0o755)
}
/// Write permission is checked when a file is opened, not again by ftruncate(2): a file
/// created read-only (as `install -m 444`, tar and cp make them) is written and cut through
/// the fd that created it. truncate(2) by name still needs it.
fn ftruncate_fd_check(d: &Path, _: &Ids) -> CaseResult {
    for (name, len) in [("inline", 100usize), ("chunked", 2 * MIB)] {
        let p = d.join("mine").join(name);
        let fd = ok("open O_CREAT|O_RDWR 0444", open_(&p, libc::O_CREAT | libc::O_RDWR, 0o444))?;
        let half = len / 2;
        let mut model = pat(7, 0, half);
        ok("write", write_all_(&fd, &model))?;
        let rest = pat(7, half as u64, len - half);
        ok("pwrite", pwrite_all(&fd, &rest, half as u64))?;
        model.extend_from_slice(&rest);
        ok(&format!("{name}: ftruncate up"), ftruncate_(&fd, (len + 4096) as i64))?;
        model.resize(len + 4096, 0);
        ensure_eq!(ok("fstat", fstat_(&fd))?.st_size as usize, model.len(), "{name}: size up");
        ok(&format!("{name}: ftruncate down"), ftruncate_(&fd, (len - 10) as i64))?;
        model.truncate(len - 10);
        ensure_eq!(ok("fstat", fstat_(&fd))?.st_size as usize, model.len(), "{name}: size down");
        ok("close", fd.close())?;
        let st = ok("stat", stat_(&p))?;
        ensure_mode!(st.st_mode & 0o7777, 0o444, "{name}: mode");
        ensure_eq!(st.st_size as usize, model.len(), "{name}: size after close");
        same_bytes(name, &get(&p)?, &model)?;
        fails(&format!("{name}: truncate 0444 by name"), truncate_(&p, 0), libc::EACCES)?;
        fails(&format!("{name}: O_WRONLY on 0444"), open_(&p, libc::O_WRONLY, 0), libc::EACCES)?;
        ensure_eq!(ok("stat", stat_(&p))?.st_size as usize, model.len(), "{name}: size kept");
    }
    Ok(())
}

fn xattr_perm_setup(d: &Path, i: &Ids) -> CaseResult {
    mk_file(&d.join("r"), b"x", 0, 0, 0o644)?;
    ok("setxattr fixture", setxattr_(&d.join("r"), "user.a", b"v", 0))?;
    mk_file(&d.join("p"), b"x", 0, 0, 0o600)?;
    ok("setxattr fixture", setxattr_(&d.join("p"), "user.a", b"v", 0))?;
    mk_file(&d.join("mine"), b"x", i.uid, i.gid, 0o644)
}
fn xattr_perm_check(d: &Path, _: &Ids) -> CaseResult {
    same_bytes(
        "getxattr readable file",
        &ok("getxattr", getxattr_(&d.join("r"), "user.a", 10))?.1,
        b"v",
    )?;
    fails("setxattr read-only file", setxattr_(&d.join("r"), "user.b", b"v", 0), libc::EACCES)?;
    fails("removexattr read-only file", removexattr_(&d.join("r"), "user.a"), libc::EACCES)?;
    fails("getxattr unreadable file", getxattr_(&d.join("p"), "user.a", 10), libc::EACCES)?;
    ok("setxattr own file", setxattr_(&d.join("mine"), "user.m", b"1", 0))?;
    same_bytes("own xattr", &ok("getxattr", getxattr_(&d.join("mine"), "user.m", 10))?.1, b"1")
}

const UNPRIV: &[(&str, Setup, Check)] = &[
    ("perm.preflight", no_setup, preflight_check),
    ("perm.owner_class", owner_class_setup, owner_class_check),
    ("perm.group_class", group_class_setup, group_class_check),
    ("perm.other_class", other_class_setup, other_class_check),
    ("perm.supplementary_group", suppl_setup, suppl_check),
    ("perm.exec_access", exec_setup, exec_check),
    ("perm.dir_search", dir_search_setup, dir_search_check),
    ("perm.dir_write", dir_write_setup, dir_write_check),
    ("perm.readonly_file_write", readonly_setup, readonly_check),
    ("perm.chmod_chown_utimens_other", chmod_other_setup, chmod_other_check),
    ("perm.sticky_dir", sticky_setup, sticky_check),
    ("perm.setgid_dir", setgid_setup, setgid_check),
    ("perm.chmod_sgid_nonmember", sgid_nonmember_setup, sgid_nonmember_check),
    ("perm.write_clears_suid", write_kills_suid_setup, write_kills_suid_check),
    ("perm.xattr", xattr_perm_setup, xattr_perm_check),
    ("perm.ftruncate_through_writable_fd", ftruncate_fd_setup, ftruncate_fd_check),
];

/// Names of the cases `run_unprivileged` runs, in order.
pub fn unprivileged_case_names() -> Vec<&'static str> {
    UNPRIV.iter().map(|(n, _, _)| *n).collect()
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n").replace('\t', "\\t")
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(o) => out.push(o),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Permission cases as a non-root user. Must be called as root: fixtures are built by the
/// caller, the checks run in a forked child with `setgroups([extra_gid])`, `setresgid(gid)`,
/// `setresuid(uid)`, and results come back through a pipe. `dir` and its ancestors must be
/// searchable by `uid` (and a FUSE mount must allow other users).
pub fn run_unprivileged(dir: &Path, uid: u32, gid: u32, extra_gid: u32) -> Report {
    let ids = Ids { uid, gid, extra: extra_gid };
    let mut report = Report::default();
    if euid() != 0 {
        report.cases.push((
            "setup".to_string(),
            Err("run_unprivileged must be called as root".to_string()),
        ));
        return report;
    }
    let root = match fresh_root(dir, "unpriv") {
        Ok(r) => r,
        Err(e) => {
            report.cases.push(("setup".to_string(), Err(e)));
            return report;
        }
    };
    // Build every fixture as root.
    let mut setup: Vec<CaseResult> = Vec::new();
    for (name, s, _) in UNPRIV {
        let d = root.join(name);
        let r = ok("mkdir case dir", mkdir_(&d, 0o755))
            .and_then(|()| ok("chmod case dir", chmod_(&d, 0o755)))
            .and_then(|()| run_case_ids(*s, &d, &ids))
            .map_err(|e| format!("setup (as root): {e}"));
        setup.push(r);
    }
    let child = run_child(&root, &ids, &setup);
    for (i, (name, _, _)) in UNPRIV.iter().enumerate() {
        let r = match &setup[i] {
            Err(e) => Err(e.clone()),
            Ok(()) => match &child {
                Err(e) => Err(e.clone()),
                Ok(map) => map
                    .get(*name)
                    .cloned()
                    .unwrap_or_else(|| Err("no result from the unprivileged child".to_string())),
            },
        };
        report.cases.push((name.to_string(), r));
    }
    if let Err(e) = remove_tree(&root) {
        report.cases.push(("cleanup".to_string(), Err(e)));
    }
    report
}

fn run_case_ids(f: fn(&Path, &Ids) -> CaseResult, d: &Path, ids: &Ids) -> CaseResult {
    match std::panic::catch_unwind(|| f(d, ids)) {
        Ok(r) => r,
        Err(_) => Err("panicked".to_string()),
    }
}

type ChildResults = std::collections::HashMap<String, CaseResult>;

/// How long the unprivileged child may take in all before it is killed.
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);

fn parse_results(text: &str, map: &mut ChildResults) {
    for line in text.lines() {
        let mut parts = line.splitn(3, '\t');
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
        let r = if kind == "OK" { Ok(()) } else { Err(unescape(parts.next().unwrap_or(""))) };
        map.insert(name.to_string(), r);
    }
}

fn run_child(root: &Path, ids: &Ids, setup: &[CaseResult]) -> Result<ChildResults, String> {
    let mut fds = [0i32; 2];
    // SAFETY: array of two ints.
    rc(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })
        .map_err(|e| format!("pipe2: {}", ename(e)))?;
    let (rfd, wfd) = (fds[0], fds[1]);
    // SAFETY: the child only runs our checks and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = errno();
        // SAFETY: closing our own pipe ends.
        unsafe {
            libc::close(rfd);
            libc::close(wfd);
        }
        return Err(format!("fork: {}", ename(e)));
    }
    if pid == 0 {
        // Child: one line per case, written as soon as the case finishes.
        // SAFETY: closing the read end we do not use.
        unsafe { libc::close(rfd) };
        child_body(root, ids, setup, &mut |line: &str| {
            let bytes = line.as_bytes();
            let mut done = 0usize;
            while done < bytes.len() {
                // SAFETY: buffer slice is valid.
                let n =
                    unsafe { libc::write(wfd, bytes[done..].as_ptr().cast(), bytes.len() - done) };
                if n <= 0 {
                    break;
                }
                done += n as usize;
            }
        });
        // SAFETY: leave without running the parent's destructors or atexit handlers.
        unsafe { libc::_exit(0) };
    }
    // Parent.
    // SAFETY: closing the write end we do not use.
    unsafe { libc::close(wfd) };
    // SAFETY: rfd is ours; File takes ownership and closes it.
    let mut pipe = unsafe { fs::File::from_raw_fd(rfd) };
    let deadline = std::time::Instant::now() + CHILD_TIMEOUT;
    let mut raw = Vec::new();
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            timed_out = true;
            break;
        }
        let mut pfd = libc::pollfd { fd: rfd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(60_000) as i32) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            break;
        }
        if n == 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => raw.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if timed_out {
        // SAFETY: killing our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let mut map = ChildResults::new();
    parse_results(&String::from_utf8_lossy(&raw), &mut map);
    let expected = setup.iter().filter(|r| r.is_ok()).count();
    if map.len() < expected {
        let why = if timed_out {
            format!("unprivileged child killed after {CHILD_TIMEOUT:?}")
        } else {
            format!("unprivileged child died (wait status {status:#x})")
        };
        // Attribute the failure to the first case without a result (the one that hung/died).
        if let Some((name, _, _)) = UNPRIV
            .iter()
            .enumerate()
            .find(|(i, (n, _, _))| setup[*i].is_ok() && !map.contains_key(*n))
            .map(|(_, c)| c)
        {
            map.insert(name.to_string(), Err(format!("{why} while running this case")));
        }
    }
    Ok(map)
}

fn child_body(root: &Path, ids: &Ids, setup: &[CaseResult], emit: &mut dyn FnMut(&str)) {
    let groups = [ids.extra as libc::gid_t];
    // SAFETY: plain syscalls; order matters: groups and gid while still root, uid last.
    let dropped = unsafe {
        libc::setgroups(1, groups.as_ptr()) == 0
            && libc::setresgid(ids.gid, ids.gid, ids.gid) == 0
            && libc::setresuid(ids.uid, ids.uid, ids.uid) == 0
    };
    if !dropped {
        let e = ename(errno());
        for (name, _, _) in UNPRIV {
            emit(&format!("{name}\tERR\tdropping privileges failed: {e}\n"));
        }
        return;
    }
    for (i, (name, _, check)) in UNPRIV.iter().enumerate() {
        if setup[i].is_err() {
            continue;
        }
        match run_case_ids(*check, &root.join(name), ids) {
            Ok(()) => emit(&format!("{name}\tOK\n")),
            Err(e) => emit(&format!("{name}\tERR\t{}\n", escape(&e))),
        }
    }
}
