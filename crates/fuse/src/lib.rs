//! The FUSE mount: translates kernel requests into client-library calls.
//!
//! Permission checks: the mount uses the kernel's `default_permissions` (the kernel checks
//! mode bits with the caller's full group list before it asks us), and the metadata service
//! checks again with the same identity, so the native API and the mount agree.
//!
//! Caching: attributes and entries are cached by the kernel for
//! [`MountOptions::watched_attr_ttl`] while the mount hears every change other clients make
//! (the `watch` module drops what they changed from the kernel's caches), for
//! [`MountOptions::attr_ttl`] otherwise; the page cache is kept across opens of a file no
//! other client changed meanwhile (close-to-open: an open that finds the file changed drops
//! the kernel's pages and cached attributes), and the kernel's writeback cache gathers small
//! writes into large ones.

mod caller;
mod convert;
mod locks;
mod watch;

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, Config, Errno, FileHandle, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};
use stria_client::Client;
use stria_proto::fs::FsStatus;
use stria_proto::wire::{FileKind, LockKind, LockRange, SetAttr, TimeSet, XattrSetMode};

use caller::Callers;
pub use caller::SQUASHED_ID;
use convert::{absent_attr, errno, file_attr, file_type, timestamp};

/// How the file system is mounted.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Threads reading the kernel's requests from `/dev/fuse` (see [`default_threads`]).
    pub threads: usize,
    /// How long the kernel may trust attributes and names without asking, while changes of
    /// other clients are not heard of (`watch_changes` off, or the metadata service away).
    pub attr_ttl: Duration,
    /// Hear of other clients' changes (the metadata service's change log) and drop them from
    /// the kernel's caches, within milliseconds.
    pub watch_changes: bool,
    /// How long the kernel may trust attributes and names while the mount hears every change
    /// of other clients: a bound on staleness should a change not be heard of (the metadata
    /// service restarted, say), as NFS's attribute cache timeouts (up to 60 s) are without
    /// any notice.
    pub watched_attr_ttl: Duration,
    /// Let users other than the mounting one use the mount (needs root or `user_allow_other`).
    pub allow_other: bool,
    /// Largest read and write request, at most 1 MiB on Linux.
    pub max_io_bytes: u32,
    /// The kernel's writeback cache: small buffered writes are gathered in the page cache.
    /// With it the kernel trusts its own size and mtime of a cached file, so what another
    /// client writes to a file this mount has cached stays invisible (wrong size, stale
    /// pages) until the kernel drops the inode: only for a mount that is its files' sole
    /// writer. Without it the mount follows other clients' changes once its attribute cache
    /// (`attr_ttl`) expires, and drops cached pages whose file changed size or mtime.
    pub writeback_cache: bool,
    /// Requests from uid 0 act as [`SQUASHED_ID`], and group 0 is dropped from every request
    /// (NFS's root_squash). The kernel's own checks (`default_permissions`) still let root
    /// through, so the metadata service's checks, which see the squashed caller, decide.
    pub root_squash: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            threads: default_threads(),
            attr_ttl: Duration::from_secs(1),
            watch_changes: true,
            watched_attr_ttl: Duration::from_secs(30),
            allow_other: true,
            max_io_bytes: 1 << 20,
            writeback_cache: false,
            root_squash: false,
        }
    }
}

/// One thread per CPU reads the kernel's requests, at least 2 and at most 16.
///
/// More threads than CPUs cost small requests time: the kernel hands each request to the
/// thread that has waited longest, so the work goes round every thread and none stays warm on
/// its CPU. On 2 CPUs, 4 threads against 2 (`mdbench.py`, 2 processes × 20,000 files, twice
/// each): creates 6,900 and 6,964 → 8,005 and 8,107/s, small-file reads 22,581 and 22,530 →
/// 36,289 and 36,599/s, removes 13,472 and 13,565 → 15,727 and 15,813/s; the large-I/O rows
/// of fsbench did not move beyond their noise. Calls that can wait long (fsync, and a flush
/// or close that waits for queued writes) run on a blocking thread of the client's runtime
/// instead, so they hold none of these few threads.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 16)
}

/// A mounted Stria file system; dropping it unmounts.
#[derive(Debug)]
pub struct Mount {
    session: Option<fuser::BackgroundSession>,
    requests: Arc<RequestCounts>,
    offloaded: Arc<Offloaded>,
    lock_waiters: Arc<locks::LockWaiters>,
    /// Hears of other clients' changes (when `MountOptions::watch_changes`).
    watcher: Option<watch::Watcher>,
}

/// Most calls answered from blocking threads at once ([`StriaFs::reply_empty_after`]); past
/// it a slow call is answered on its request thread, as every call used to be. The client's
/// runtime has 64 blocking threads, which the services of an all-in-one node use too: slow
/// calls filling them would leave the service work they wait for queued behind them.
const OFFLOADED_MAX: usize = 16;

/// How long unmounting waits for slow calls still running (each ends within the client's
/// request timeout).
const OFFLOADED_DRAIN_WAIT: Duration = Duration::from_secs(60);

/// The calls running on blocking threads: at most [`OFFLOADED_MAX`], and unmounting waits for
/// them, so a close still on its way is done before the node goes on to stop.
#[derive(Debug, Default)]
struct Offloaded {
    running: std::sync::Mutex<usize>,
    idle: std::sync::Condvar,
}

/// One running offloaded call; its drop (also in a panic) counts it out.
struct OffloadedCall(Arc<Offloaded>);

impl Offloaded {
    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A slot for one more call, if fewer than [`OFFLOADED_MAX`] run.
    fn start(self: &Arc<Self>) -> Option<OffloadedCall> {
        let mut running = self.lock();
        if *running >= OFFLOADED_MAX {
            return None;
        }
        *running += 1;
        Some(OffloadedCall(self.clone()))
    }

    /// Waits until none runs, at most `limit`; whether none does.
    fn wait_idle(&self, limit: Duration) -> bool {
        let running = self.lock();
        let (running, _) = self
            .idle
            .wait_timeout_while(running, limit, |running| *running > 0)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *running == 0
    }
}

impl Drop for OffloadedCall {
    fn drop(&mut self) {
        let mut running = self.0.lock();
        *running -= 1;
        if *running == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// Declares [`Op`] with its names, listed once.
macro_rules! ops {
    ($($op:ident => $name:literal,)*) => {
        /// The kernel requests a mount answers, named as in the FUSE protocol (lowercase).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op {
            $($op,)*
        }

        impl Op {
            pub const ALL: [Op; [$(Op::$op),*].len()] = [$(Op::$op),*];

            pub fn name(self) -> &'static str {
                match self {
                    $(Op::$op => $name,)*
                }
            }
        }
    };
}

ops! {
    Lookup => "lookup",
    Getattr => "getattr",
    Setattr => "setattr",
    Readlink => "readlink",
    Mknod => "mknod",
    Mkdir => "mkdir",
    Unlink => "unlink",
    Rmdir => "rmdir",
    Symlink => "symlink",
    Rename => "rename",
    Link => "link",
    Open => "open",
    Read => "read",
    Write => "write",
    Flush => "flush",
    Release => "release",
    Fsync => "fsync",
    Opendir => "opendir",
    Readdir => "readdir",
    Fsyncdir => "fsyncdir",
    Statfs => "statfs",
    Setxattr => "setxattr",
    Getxattr => "getxattr",
    Listxattr => "listxattr",
    Removexattr => "removexattr",
    Access => "access",
    Create => "create",
    Getlk => "getlk",
    Setlk => "setlk",
}

/// How many of each [`Op`] a mount has answered since it was mounted.
#[derive(Debug, Default)]
pub struct RequestCounts {
    counts: [AtomicU64; Op::ALL.len()],
}

impl RequestCounts {
    fn count(&self, op: Op) {
        self.counts[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Every request answered at least once, with its count.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        Op::ALL
            .iter()
            .map(|&r| (r.name(), self.counts[r as usize].load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect()
    }
}

impl Mount {
    /// The mount's request counters (they outlive it).
    pub fn requests(&self) -> Arc<RequestCounts> {
        self.requests.clone()
    }

    /// False once the kernel ended the session: someone ran `umount` or `fusermount -u` on
    /// the mount point.
    pub fn is_mounted(&self) -> bool {
        self.session.as_ref().is_some_and(|session| !session.guard.is_finished())
    }

    /// Unmounts and waits for the request threads to finish, and for the slow calls they
    /// left running on blocking threads (at most a minute).
    pub fn unmount(mut self) -> io::Result<()> {
        self.lock_waiters.stop();
        if let Some(watcher) = self.watcher.take() {
            watcher.stop();
        }
        if let Some(session) = self.session.take() {
            if session.guard.is_finished() {
                // Unmounted from outside (umount): nothing left to unmount.
                session.join()?;
            } else {
                session.umount_and_join()?;
            }
        }
        if !self.offloaded.wait_idle(OFFLOADED_DRAIN_WAIT) {
            tracing::warn!("unmounted with fsync or close calls still running");
        }
        Ok(())
    }
}

/// Mounts `client`'s file system at `mountpoint`, served by background threads.
pub fn mount(client: Client, mountpoint: &Path, options: &MountOptions) -> io::Result<Mount> {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("stria".into()),
        MountOption::Subtype("stria".into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
        MountOption::Suid,
        MountOption::Dev,
    ];
    if options.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    let requests = Arc::new(RequestCounts::default());
    let offloaded = Arc::new(Offloaded::default());
    let notifier = Arc::new(std::sync::OnceLock::new());
    let ttl = Arc::new(watch::CacheTtl::new(options.attr_ttl, options.watched_attr_ttl));
    let watched = options.watch_changes.then(|| client.clone());
    let known = Arc::new(watch::KnownInodes::default());
    let absent = Arc::new(watch::AbsentNames::default());
    let lock_waiters = Arc::new(locks::LockWaiters::default());
    let fs = StriaFs {
        requests: requests.clone(),
        offloaded: offloaded.clone(),
        client,
        ttl: ttl.clone(),
        known: known.clone(),
        absent: absent.clone(),
        max_io_bytes: options.max_io_bytes,
        writeback_cache: options.writeback_cache,
        drops_privileges: false,
        callers: Callers::new(options.root_squash),
        notifier: notifier.clone(),
        lock_holders: Arc::default(),
        lock_waiters: lock_waiters.clone(),
    };
    let session = fuser::spawn_mount(fs, mountpoint, &config)?;
    let _ = notifier.set(session.notifier());
    let watcher = match watched {
        Some(client) => {
            Some(watch::Watcher::start(client, session.notifier(), ttl, known, absent)?)
        }
        None => None,
    };
    Ok(Mount { session: Some(session), requests, offloaded, lock_waiters, watcher })
}

struct StriaFs {
    requests: Arc<RequestCounts>,
    offloaded: Arc<Offloaded>,
    client: Client,
    /// How long the kernel may keep what it is handed (see `watch::CacheTtl`).
    ttl: Arc<watch::CacheTtl>,
    /// The inodes the kernel holds (see `watch::KnownInodes`).
    known: Arc<watch::KnownInodes>,
    /// The names the kernel holds as absent (see `watch::AbsentNames`).
    absent: Arc<watch::AbsentNames>,
    max_io_bytes: u32,
    writeback_cache: bool,
    /// The kernel leaves dropping a file's capabilities and set-ID bits on write to us
    /// (FUSE_HANDLE_KILLPRIV_V2), and so sends no capability lookup before each write.
    drops_privileges: bool,
    callers: Callers,
    /// Tells the kernel to drop what it cached; set once the session runs.
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// Who holds byte-range locks through which handles.
    lock_holders: Arc<locks::LockHolders>,
    lock_waiters: Arc<locks::LockWaiters>,
}

const GENERATION: Generation = Generation(0);

/// `readdir` offsets: 0 starts, 1 follows `.`, 2 follows `..`; larger offsets are the
/// metadata service's own cookies, whose real entries start above 2.
const DIR_OFFSET_DOTDOT: u64 = 2;

/// Makes the kernel drop its cached attributes of `ino` (not its pages: that waits for no
/// page and no request, so a request thread may do it). Its next read asks for them, and a
/// changed size or mtime then drops the pages (AUTO_INVAL_DATA).
fn drop_cached_attrs(notifier: Option<&fuser::Notifier>, ino: u64) {
    if let Some(notifier) = notifier
        && let Err(e) = notifier.inval_inode(INodeNo(ino), -1, 0)
    {
        tracing::debug!(ino, error = %e, "invalidating cached attributes");
    }
}

/// A lock type of fcntl (F_RDLCK, F_WRLCK, F_UNLCK).
fn lock_kind(typ: i32) -> Option<LockKind> {
    match typ {
        libc::F_RDLCK => Some(LockKind::Read),
        libc::F_WRLCK => Some(LockKind::Write),
        libc::F_UNLCK => Some(LockKind::Unlock),
        _ => None,
    }
}

/// The result of a call on an inode the kernel named by number (not by a name in a
/// directory): NotFound then means the inode is gone, removed through another client while
/// this kernel still had a name cached for it. ESTALE makes the kernel look the path up
/// again and retry (open, stat, chmod, access, xattrs and readlink do), so the caller sees
/// the name as it is now (a new file, or ENOENT) rather than the dead inode.
fn stale_if_gone<T>(result: Result<T, FsStatus>) -> Result<T, FsStatus> {
    result.map_err(|e| if e == FsStatus::NotFound { FsStatus::Stale } else { e })
}

fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

fn time_set(time: TimeOrNow) -> TimeSet {
    match time {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(at) => TimeSet::At(timestamp(at)),
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<(), FsStatus>) {
    match result {
        Ok(()) => reply.ok(),
        Err(error) => reply.error(errno(error)),
    }
}

impl StriaFs {
    /// Replies with the outcome of `call`: made here, or on a blocking thread of the client's
    /// runtime when it may wait long (`slow`) and fewer than [`OFFLOADED_MAX`] such calls run,
    /// so this request thread goes back to the kernel's queue at once. (The kernel matches
    /// replies to requests by id, in any order.)
    fn reply_empty_after(
        &self,
        slow: bool,
        reply: ReplyEmpty,
        call: impl FnOnce(&Client) -> Result<(), FsStatus> + Send + 'static,
    ) {
        let Some(running) = slow.then(|| self.offloaded.start()).flatten() else {
            return reply_empty(reply, call(&self.client));
        };
        let client = self.client.clone();
        self.client.runtime().spawn_blocking(move || {
            reply_empty(reply, call(&client));
            drop(running);
        });
    }

    fn reply_entry(&self, reply: ReplyEntry, result: Result<stria_proto::wire::Attr, FsStatus>) {
        match result {
            Ok(attr) => {
                self.known.looked_up(attr.ino);
                reply.entry(&self.ttl.get(), &file_attr(&attr), GENERATION)
            }
            Err(error) => reply.error(errno(error)),
        }
    }

    /// A lookup found no such name. While the watcher hears every change, the kernel may
    /// keep that for the long timeout (an entry with node id 0), so that a search path or a
    /// stat before a create asks once: another client's create of the name is heard and
    /// drops it (`watch::AbsentNames`). Otherwise ENOENT, which the kernel does not keep.
    /// `heard`: where the watcher was before the lookup was sent.
    fn reply_absent(&self, reply: ReplyEntry, parent: u64, name: &[u8], heard: u64) {
        match self.ttl.watched() {
            Some(ttl) if self.absent.record(parent, name, ttl, heard) => {
                reply.entry(&ttl, &absent_attr(), GENERATION)
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn reply_attr(&self, reply: ReplyAttr, result: Result<stria_proto::wire::Attr, FsStatus>) {
        match result {
            Ok(attr) => reply.attr(&self.ttl.get(), &file_attr(&attr)),
            Err(error) => reply.error(errno(error)),
        }
    }

    fn kind_of_mode(mode: u32) -> Result<FileKind, FsStatus> {
        Ok(match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => FileKind::File,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            libc::S_IFDIR => FileKind::Dir,
            _ => return Err(FsStatus::Invalid),
        })
    }

    /// How the kernel is to treat a handle opened with `flags`. A handle that cannot write
    /// has nothing of its own to flush, so its `close` sends no FLUSH request (as NFS skips
    /// the flush of a file not open for writing); writes through other handles are flushed
    /// at their own close, and the handle's RELEASE still follows its last close.
    ///
    /// Cached pages are kept when `cache_current` (the file is as this mount last saw it);
    /// otherwise the kernel drops them at this open.
    fn open_flags(flags: i32, cache_current: bool) -> FopenFlags {
        let mut open = FopenFlags::empty();
        if cache_current {
            open |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        if flags & libc::O_ACCMODE == libc::O_RDONLY {
            open |= FopenFlags::FOPEN_NOFLUSH;
        }
        open
    }

    /// Close-to-open between clients: whether the kernel's pages of the file `attr` (fresh
    /// from the open) describes are still current. When another client changed the file
    /// since this mount last saw it, the kernel's cached attributes are dropped too (its
    /// size may be stale for up to the attribute timeout): its next read asks for them, and
    /// a changed size or mtime then also drops the pages (AUTO_INVAL_DATA). Only the
    /// attributes are invalidated here, which waits for no page and no request: dropping
    /// pages from a request thread could wait on a page whose read needs that thread.
    fn revalidate(&self, attr: &stria_proto::wire::Attr) -> bool {
        if self.client.cache_is_current(attr) {
            return true;
        }
        drop_cached_attrs(self.notifier.get(), attr.ino);
        false
    }

    fn open_mask(flags: i32) -> u32 {
        let mut mask = match flags & libc::O_ACCMODE {
            libc::O_WRONLY => libc::W_OK,
            libc::O_RDWR => libc::R_OK | libc::W_OK,
            _ => libc::R_OK,
        } as u32;
        if flags & libc::O_TRUNC != 0 {
            mask |= libc::W_OK as u32;
        }
        mask
    }
}

impl Filesystem for StriaFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Best effort: the kernel keeps its own lower limits when ours are refused.
        let _ = config.set_max_write(self.max_io_bytes);
        let _ = config.set_max_readahead(self.max_io_bytes);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        // ASYNC_DIO lets the kernel keep many O_DIRECT requests of one file in flight (without
        // it, libaio against the mount runs one request at a time per file).
        // AUTO_INVAL_DATA: cached pages go when a refreshed mtime differs (another client
        // wrote); the writeback cache, when asked for, makes the kernel ignore that.
        // POSIX_LOCKS and FLOCK_LOCKS hand fcntl and flock locks to us (`locks`).
        let cache = if self.writeback_cache {
            InitFlags::FUSE_WRITEBACK_CACHE
        } else {
            InitFlags::FUSE_AUTO_INVAL_DATA
        };
        let wanted = cache
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_POSIX_LOCKS
            | InitFlags::FUSE_FLOCK_LOCKS;
        if let Err(refused) = config.add_capabilities(wanted) {
            tracing::info!(?refused, "the kernel does not offer every FUSE capability we use");
        }
        // Apart, so that a kernel without it (before 5.11) keeps the rest. With it, a write
        // costs one request instead of two: the kernel no longer asks for the file's
        // capability before each one, and the write drops privileges (`write`); chown and
        // truncate drop them in the metadata service. Only with a service that knows how.
        self.drops_privileges = self.client.knows_drop_privileges()
            && config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok();
        if !self.drops_privileges {
            tracing::info!("the kernel checks for privileges to drop before each write");
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.requests.count(Op::Lookup);
        let caller = self.callers.of(req);
        let heard = self.absent.heard();
        match self.client.lookup(&caller, parent.0, name_bytes(name)) {
            Err(FsStatus::NotFound) => self.reply_absent(reply, parent.0, name_bytes(name), heard),
            found => self.reply_entry(reply, found),
        }
    }

    /// The kernel evicted the inode, and its pages with it.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.known.forgotten(ino.0, nlookup);
        self.client.forget_cached(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.requests.count(Op::Getattr);
        // The kernel asks for a directory's attributes after each change in it; a change of
        // this mount's within the attribute timeout brought them (as fresh as the kernel's
        // own cache would keep them).
        let attr = self.client.getattr_within(ino.0, self.ttl.short());
        self.reply_attr(reply, stale_if_gone(attr));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.requests.count(Op::Setattr);
        let caller = self.callers.of(req);
        let mut set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            writable_handle: false,
        };
        // With default_permissions the kernel refuses explicit times from anyone but the owner
        // before asking us; with the writeback cache it sends "now" as an explicit time. So an
        // explicit time from a non-owner is the kernel's stand-in for UTIME_NOW.
        let explicit =
            matches!(set.atime, Some(TimeSet::At(_))) || matches!(set.mtime, Some(TimeSet::At(_)));
        if explicit && caller.uid != 0 {
            if let Ok(attr) = self.client.getattr(ino.0)
                && attr.uid != caller.uid
            {
                set.atime = set.atime.map(|_| TimeSet::Now);
                set.mtime = set.mtime.map(|_| TimeSet::Now);
            }
        }
        // The kernel names the handle for a truncate through an open file (ftruncate, and an
        // open with O_TRUNC); write permission was checked at its open.
        let result = match fh {
            Some(fh) => self.client.setattr_handle(&caller, ino.0, fh.0, set),
            None => self.client.setattr(&caller, ino.0, set),
        };
        self.reply_attr(reply, stale_if_gone(result));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.requests.count(Op::Readlink);
        match stale_if_gone(self.client.readlink(ino.0)) {
            Ok(target) => reply.data(&target),
            Err(error) => reply.error(errno(error)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.requests.count(Op::Mknod);
        let caller = self.callers.of(req);
        let result = Self::kind_of_mode(mode).and_then(|kind| {
            self.client.create(&caller, parent.0, name_bytes(name), kind, mode & !umask, rdev, true)
        });
        self.reply_entry(reply, result);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.requests.count(Op::Mkdir);
        let caller = self.callers.of(req);
        self.reply_entry(
            reply,
            self.client.mkdir(&caller, parent.0, name_bytes(name), mode & !umask),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.requests.count(Op::Unlink);
        let caller = self.callers.of(req);
        reply_empty(reply, self.client.unlink(&caller, parent.0, name_bytes(name)));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.requests.count(Op::Rmdir);
        let caller = self.callers.of(req);
        reply_empty(reply, self.client.rmdir(&caller, parent.0, name_bytes(name)));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.requests.count(Op::Symlink);
        let caller = self.callers.of(req);
        let target = target.as_os_str().as_bytes();
        self.reply_entry(
            reply,
            self.client.symlink(&caller, parent.0, name_bytes(link_name), target),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Op::Rename);
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            reply.error(Errno::EINVAL);
            return;
        }
        let caller = self.callers.of(req);
        let flags = stria_proto::wire::RenameFlags {
            no_replace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        let result = self.client.rename(
            &caller,
            parent.0,
            name_bytes(name),
            newparent.0,
            name_bytes(newname),
            flags,
        );
        reply_empty(reply, result);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.requests.count(Op::Link);
        let caller = self.callers.of(req);
        self.reply_entry(reply, self.client.link(&caller, ino.0, newparent.0, name_bytes(newname)));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.requests.count(Op::Open);
        let caller = self.callers.of(req);
        match stale_if_gone(self.client.open(&caller, ino.0, Self::open_mask(flags.0))) {
            // A file with no name left that this mount had no handle of was reached through
            // a name cached here after another client removed it (or replaced it, as editors
            // and rsync do), and its last handle elsewhere keeps it alive for now: the name
            // is stale. (A file unlinked here loses its cached name at once; /proc/PID/fd
            // reopens of it go through a handle that is still open.)
            Ok((fh, attr))
                if attr.nlink == 0
                    && attr.kind == FileKind::File
                    && self.client.handles_open(ino.0) == 1 =>
            {
                let _ = self.client.release(fh);
                reply.error(errno(FsStatus::Stale));
            }
            // Cached pages are kept unless another client changed the file (`revalidate`).
            Ok((fh, attr)) => {
                let current = self.revalidate(&attr);
                reply.opened(FileHandle(fh), Self::open_flags(flags.0, current))
            }
            Err(error) => reply.error(errno(error)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.requests.count(Op::Read);
        match self.client.read(fh.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(error) => reply.error(errno(error)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.requests.count(Op::Write);
        if self.drops_privileges {
            // The kernel sets the flag when the writer lacks CAP_FSETID. It keeps the mode it
            // has (and a stat that asks for the mode alone would show it for the attribute
            // timeout), so a drop makes it ask again.
            // Root keeps them (it has CAP_FSETID), but not a root squashed to nobody.
            let suidgid = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
                || self.callers.squash_root();
            match self.client.drop_privileges_for_write(fh.0, suidgid) {
                Ok(true) => drop_cached_attrs(self.notifier.get(), ino.0),
                Ok(false) => {}
                Err(error) => return reply.error(errno(error)),
            }
        }
        match self.client.write(fh.0, offset, data) {
            Ok(written) => reply.written(written),
            Err(error) => reply.error(errno(error)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Op::Flush);
        // A process closing a file drops its byte-range locks on it (POSIX), once its writes
        // are published: whoever takes the lock next reads them.
        let unlock = self.lock_holders.owner_closed(ino.0, lock_owner.0);
        let slow = self.client.has_queued_writes(fh.0);
        self.reply_empty_after(slow, reply, move |client| {
            let flushed = client.flush(fh.0);
            if unlock {
                locks::release_locks(client, ino.0, lock_owner.0);
            }
            flushed
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Op::Release);
        let unlock = self.lock_holders.handle_released(ino.0, fh.0);
        let slow = self.client.has_queued_writes(fh.0);
        self.reply_empty_after(slow, reply, move |client| {
            let released = client.release(fh.0);
            for owner in unlock {
                locks::release_locks(client, ino.0, owner);
            }
            released
        });
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        self.requests.count(Op::Getlk);
        let Some(kind) = lock_kind(typ) else { return reply.error(Errno::EINVAL) };
        let range = LockRange { start, end };
        match self.client.getlk(ino.0, lock_owner.0, range, kind) {
            Ok(Some(holder)) => {
                let typ =
                    if holder.kind == LockKind::Write { libc::F_WRLCK } else { libc::F_RDLCK };
                // The kernel refuses (EIO) offsets past i64::MAX, its own "to the end of the
                // file": a lock the client library took to u64::MAX is reported as that.
                let end = holder.range.end.min(i64::MAX as u64);
                reply.locked(holder.range.start.min(end), end, typ, holder.pid)
            }
            // Nothing in the way: the request comes back as F_UNLCK.
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, pid),
            Err(error) => reply.error(errno(error)),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Op::Setlk);
        let Some(kind) = lock_kind(typ) else { return reply.error(Errno::EINVAL) };
        let range = LockRange { start, end };
        let (ino, owner, fh) = (ino.0, lock_owner.0, fh.0);
        if kind == LockKind::Unlock {
            // What this handle wrote under the lock is published before another client can
            // take it (as NFS flushes at unlock).
            let slow = self.client.has_queued_writes(fh);
            return self.reply_empty_after(slow, reply, move |client| {
                let flushed = client.flush(fh);
                let unlocked = client.setlk(ino, owner, pid, range, kind, None);
                flushed.and(unlocked)
            });
        }
        self.lock_holders.asking(ino, owner, fh);
        if !sleep {
            let result = self.client.setlk(ino, owner, pid, range, kind, None);
            let (holders, notifier) = (&self.lock_holders, self.notifier.get());
            return reply_empty(
                reply,
                locks::taken(&self.client, holders, notifier, ino, owner, result),
            );
        }
        // F_SETLKW waits on a thread of its own until the lock is free, the waiting process
        // has a signal to take, or the mount goes away.
        let Some(slot) = self.lock_waiters.start() else {
            let _ = self.lock_holders.answered(ino, owner);
            return reply.error(Errno::ENOLCK);
        };
        let waiter = req.pid();
        let (client, waiters) = (self.client.clone(), self.lock_waiters.clone());
        let (holders, notifier) = (self.lock_holders.clone(), self.notifier.clone());
        let spawned = std::thread::Builder::new().name("stria-lockwait".into()).spawn(move || {
            let gave_up = || waiters.stopping() || locks::waiter_gave_up(waiter);
            let result = client.setlk(ino, owner, pid, range, kind, Some(&gave_up));
            let result = locks::taken(&client, &holders, notifier.get(), ino, owner, result);
            reply_empty(reply, result);
            drop(slot);
        });
        if let Err(e) = spawned {
            // The reply went with the closure: fuser answers a dropped reply with EIO.
            tracing::error!(%e, "no thread for a byte-range lock wait");
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Op::Fsync);
        self.reply_empty_after(true, reply, move |client| client.fsync(fh.0));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.requests.count(Op::Opendir);
        let caller = self.callers.of(req);
        match stale_if_gone(self.client.access(&caller, ino.0, libc::R_OK as u32)) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(error) => reply.error(errno(error)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.requests.count(Op::Readdir);
        if offset == 0 && reply.add(ino, 1, fuser::FileType::Directory, ".") {
            return reply.ok();
        }
        // The kernel answers `..` lookups itself; the entry only needs a non-zero inode number
        // (readdir callers skip entries numbered 0).
        let parent = INodeNo(stria_proto::fs::ROOT_INO);
        if offset <= 1 && reply.add(parent, DIR_OFFSET_DOTDOT, fuser::FileType::Directory, "..") {
            return reply.ok();
        }
        let caller = self.callers.of(req);
        let mut cookie = if offset <= DIR_OFFSET_DOTDOT { 0 } else { offset };
        loop {
            let entries = match self.client.readdir(&caller, ino.0, cookie, 512) {
                Ok(entries) => entries,
                Err(error) => return reply.error(errno(error)),
            };
            if entries.is_empty() {
                return reply.ok();
            }
            for entry in entries {
                let next = entry.next_cookie;
                let name = OsStr::from_bytes(&entry.name);
                if reply.add(INodeNo(entry.ino), next, file_type(entry.kind), name) {
                    return reply.ok();
                }
                cookie = entry.next_cookie;
            }
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Op::Fsyncdir);
        self.reply_empty_after(true, reply, move |client| client.fsyncdir(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.requests.count(Op::Statfs);
        const BLOCK: u64 = 4096;
        match self.client.statfs() {
            Ok(s) => reply.statfs(
                s.bytes_total / BLOCK,
                s.bytes_free / BLOCK,
                s.bytes_free / BLOCK,
                s.files_total,
                s.files_total.saturating_sub(s.files_used),
                BLOCK as u32,
                stria_proto::fs::NAME_BYTES_MAX as u32,
                BLOCK as u32,
            ),
            Err(error) => reply.error(errno(error)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.requests.count(Op::Setxattr);
        let mode = if flags & libc::XATTR_CREATE != 0 {
            XattrSetMode::Create
        } else if flags & libc::XATTR_REPLACE != 0 {
            XattrSetMode::Replace
        } else {
            XattrSetMode::Any
        };
        let caller = self.callers.of(req);
        let result = self.client.setxattr(&caller, ino.0, name_bytes(name), value, mode);
        reply_empty(reply, stale_if_gone(result));
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.requests.count(Op::Getxattr);
        let caller = self.callers.of(req);
        match stale_if_gone(self.client.getxattr(&caller, ino.0, name_bytes(name))) {
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) if value.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(value) => reply.data(&value),
            Err(error) => reply.error(errno(error)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.requests.count(Op::Listxattr);
        let caller = self.callers.of(req);
        match stale_if_gone(self.client.listxattr(&caller, ino.0)) {
            Ok(names) => {
                let mut list = Vec::new();
                for name in names {
                    list.extend_from_slice(&name);
                    list.push(0);
                }
                if size == 0 {
                    reply.size(list.len() as u32)
                } else if list.len() > size as usize {
                    reply.error(Errno::ERANGE)
                } else {
                    reply.data(&list)
                }
            }
            Err(error) => reply.error(errno(error)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.requests.count(Op::Removexattr);
        let caller = self.callers.of(req);
        reply_empty(
            reply,
            stale_if_gone(self.client.removexattr(&caller, ino.0, name_bytes(name))),
        );
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.requests.count(Op::Access);
        let caller = self.callers.of(req);
        reply_empty(reply, stale_if_gone(self.client.access(&caller, ino.0, mask.bits() as u32)));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.requests.count(Op::Create);
        let caller = self.callers.of(req);
        let exclusive = flags & libc::O_EXCL != 0;
        if let Err(error) = Self::kind_of_mode(mode) {
            return reply.error(errno(error));
        }
        let (name, mode, mask) = (name_bytes(name), mode & !umask, Self::open_mask(flags));
        let created = self.client.create_open(&caller, parent.0, name, mode, exclusive, mask);
        // The kernel takes every file create opens for a new one and truncates none, so a
        // file another client made first (it has bytes) is truncated here for O_TRUNC.
        let created = created.and_then(|(fh, attr)| {
            if flags & libc::O_TRUNC == 0 || attr.size == 0 {
                return Ok((fh, attr));
            }
            let set = SetAttr { size: Some(0), ..SetAttr::default() };
            match self.client.setattr(&caller, attr.ino, set) {
                Ok(attr) => Ok((fh, attr)),
                Err(error) => {
                    let _ = self.client.release(fh);
                    Err(error)
                }
            }
        });
        match created {
            // A file another client made first may have pages cached here (`revalidate`).
            Ok((fh, attr)) => {
                self.known.looked_up(attr.ino);
                reply.created(
                    &self.ttl.get(),
                    &file_attr(&attr),
                    GENERATION,
                    FileHandle(fh),
                    Self::open_flags(flags, self.revalidate(&attr)),
                )
            }
            Err(error) => reply.error(errno(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offloaded_calls_are_capped_and_unmount_waits_for_the_last() {
        let offloaded = Arc::new(Offloaded::default());
        let mut running: Vec<_> = (0..OFFLOADED_MAX).map(|_| offloaded.start()).collect();
        assert!(running.iter().all(Option::is_some));
        assert!(offloaded.start().is_none(), "one past the cap is answered inline");
        assert!(!offloaded.wait_idle(Duration::from_millis(10)));
        let last = running.pop().flatten();
        running.clear();
        assert!(offloaded.start().is_some_and(|call| {
            drop(call);
            true
        }));
        let waiter = {
            let offloaded = offloaded.clone();
            std::thread::spawn(move || offloaded.wait_idle(Duration::from_secs(60)))
        };
        drop(last);
        assert!(waiter.join().expect("waiter"), "idle once the last call ended");
    }

    #[test]
    fn each_op_counts_in_its_own_slot_under_its_own_name() {
        let counts = RequestCounts::default();
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i, "Op::ALL lists the ops in declaration order");
            for _ in 0..=i {
                counts.count(*op);
            }
        }
        let snapshot = counts.snapshot();
        assert_eq!(snapshot.len(), Op::ALL.len());
        for (i, (name, n)) in snapshot.iter().enumerate() {
            assert_eq!(*name, Op::ALL[i].name());
            assert_eq!(*n, i as u64 + 1);
        }
        let names: std::collections::BTreeSet<_> = snapshot.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), Op::ALL.len(), "names are distinct");
        assert!(RequestCounts::default().snapshot().is_empty(), "unseen ops are left out");
    }
}
