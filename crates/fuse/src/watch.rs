//! Cache coherence with other clients: a thread that hears of their namespace changes and
//! makes the kernel drop what it cached of them.
//!
//! The metadata service keeps a log of recent changes, each with the connection it came
//! through (`stria_meta::changes`). The watcher long-polls it (`Client::watch_changes`): for
//! a name another client removed or rebound it drops the kernel's entry, for attributes
//! another client changed (a directory's, when its entries changed) it drops the kernel's
//! cached attributes. While it hears every change, the mount lets the kernel keep names and
//! attributes for [`MountOptions::watched_attr_ttl`] instead of [`MountOptions::attr_ttl`]:
//! a stat or a path walk of a name seen recently costs no request.
//!
//! [`MountOptions::watched_attr_ttl`]: crate::MountOptions::watched_attr_ttl
//! [`MountOptions::attr_ttl`]: crate::MountOptions::attr_ttl

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuser::{INodeNo, Notifier};
use stria_client::Client;
use stria_proto::wire::Change;
use tokio::sync::watch;

use crate::drop_cached_attrs;

/// How long one watch request waits for a change before it asks again.
const WATCH_WAIT: Duration = Duration::from_secs(5);
/// Pause after a failed watch request (the metadata service is away), doubled after each
/// further failure up to [`RETRY_PAUSE_MAX`] (a service too old to know the request answers
/// every one with an error).
const RETRY_PAUSE: Duration = Duration::from_secs(1);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(60);
/// The root directory's inode (FUSE_ROOT_ID): the kernel holds it without a lookup.
const ROOT_INO: u64 = 1;

/// How long the kernel may keep the names and attributes the mount hands it.
#[derive(Debug)]
pub(crate) struct CacheTtl {
    short: Duration,
    long: Duration,
    base: Instant,
    /// From when (nanoseconds after `base`) the long timeout holds; `u64::MAX`: not now.
    long_from: AtomicU64,
}

impl CacheTtl {
    pub(crate) fn new(short: Duration, long: Duration) -> CacheTtl {
        CacheTtl {
            short,
            long: long.max(short),
            base: Instant::now(),
            long_from: AtomicU64::new(u64::MAX),
        }
    }

    /// The timeout of an entry or attributes handed to the kernel now.
    pub(crate) fn get(&self) -> Duration {
        self.watched().unwrap_or(self.short)
    }

    /// The long timeout, while the watcher hears every change; None otherwise.
    pub(crate) fn watched(&self) -> Option<Duration> {
        let now = self.base.elapsed().as_nanos() as u64;
        (now >= self.long_from.load(Ordering::Relaxed)).then_some(self.long)
    }

    /// The watcher is current from now on. An answer the metadata service read before the
    /// watcher's cursor may still be on its way: the long timeout starts once one short
    /// timeout has passed, so such an answer goes out with the short one.
    fn hearing(&self) {
        if self.long_from.load(Ordering::Relaxed) == u64::MAX {
            let from = (self.base.elapsed() + self.short).as_nanos() as u64;
            self.long_from.store(from, Ordering::Relaxed);
        }
    }

    /// The watcher is not current (its request failed, or it missed changes).
    fn deaf(&self) {
        self.long_from.store(u64::MAX, Ordering::Relaxed);
    }

    /// The timeout that holds whether or not the watcher hears changes.
    pub(crate) fn short(&self) -> Duration {
        self.short
    }
}

/// The inodes the kernel holds: lookup counts of the entries handed to it, less its forgets.
/// A mount that missed changes drops the cached attributes of every one of them. A count
/// that runs ahead of the kernel's (a reply counted after the forget that followed it) only
/// costs an invalidation the kernel ignores.
#[derive(Debug)]
pub(crate) struct KnownInodes {
    shards: Vec<Mutex<HashMap<u64, u64>>>,
}

const KNOWN_SHARDS: usize = 16;

impl Default for KnownInodes {
    fn default() -> KnownInodes {
        KnownInodes { shards: (0..KNOWN_SHARDS).map(|_| Mutex::default()).collect() }
    }
}

impl KnownInodes {
    fn shard(&self, ino: u64) -> MutexGuard<'_, HashMap<u64, u64>> {
        let shard = &self.shards[(ino % KNOWN_SHARDS as u64) as usize];
        shard.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An entry naming `ino` went to the kernel.
    pub(crate) fn looked_up(&self, ino: u64) {
        *self.shard(ino).entry(ino).or_default() += 1;
    }

    /// The kernel forgot `count` lookups of `ino`.
    pub(crate) fn forgotten(&self, ino: u64, count: u64) {
        let mut shard = self.shard(ino);
        if let Some(held) = shard.get_mut(&ino) {
            *held = held.saturating_sub(count);
            if *held == 0 {
                shard.remove(&ino);
            }
        }
    }

    /// Every inode the kernel may hold: the counted ones and the root (never looked up).
    fn all(&self) -> Vec<u64> {
        let mut all = vec![ROOT_INO];
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            all.extend(shard.keys().filter(|&&ino| ino != ROOT_INO));
        }
        all
    }
}

/// The names the mount told the kernel are absent, with the long timeout: the kernel then
/// answers lookups of them itself (a search path, a `stat` before a create). Another client
/// that creates one is heard (a [`Change::Entry`]). A mount that missed changes forgets every
/// one of them, since one created meanwhile must not stay hidden for the timeout.
///
/// Bounded: past [`ABSENT_NAMES_MAX`] names still within their timeout, an absent name goes to
/// the kernel uncached, as a plain ENOENT. The timeout is always the same long one, so names
/// run out in the order they came: a queue.
#[derive(Debug, Default)]
pub(crate) struct AbsentNames {
    names: Mutex<VecDeque<AbsentName>>,
    /// Bumped by the watcher before it applies changes to names: an answer read before them
    /// must not be cached (it may be the name the change created).
    heard: AtomicU64,
}

/// Until when (the kernel's timeout and a margin), the directory, the name.
type AbsentName = (Instant, u64, Box<[u8]>);

/// Most names [`AbsentNames`] holds (names are at most 255 bytes: at most about 20 MiB).
const ABSENT_NAMES_MAX: usize = 65_536;
/// Kept past their timeout for this long, as the kernel's own clock may run out later.
const ABSENT_MARGIN: Duration = Duration::from_secs(1);

impl AbsentNames {
    /// Where the watcher is: pass it to [`AbsentNames::record`] after the lookup.
    pub(crate) fn heard(&self) -> u64 {
        self.heard.load(Ordering::Acquire)
    }

    /// `name` in `parent` is about to go to the kernel as absent for `ttl`, looked up when the
    /// watcher was at `heard`. False when it must not be cached: the watcher heard of changes
    /// to names meanwhile, or the record is full.
    pub(crate) fn record(&self, parent: u64, name: &[u8], ttl: Duration, heard: u64) -> bool {
        let now = Instant::now();
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if self.heard() != heard {
            return false;
        }
        while names.front().is_some_and(|&(until, ..)| until <= now) {
            names.pop_front();
        }
        if names.len() >= ABSENT_NAMES_MAX {
            return false;
        }
        names.push_back((now + ttl + ABSENT_MARGIN, parent, name.into()));
        true
    }

    /// The watcher is about to apply changes to names.
    fn hearing_names(&self) {
        self.heard.fetch_add(1, Ordering::AcqRel);
    }

    /// Every name still within its timeout; the record is emptied.
    fn take(&self) -> Vec<(u64, Box<[u8]>)> {
        let now = Instant::now();
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        names
            .drain(..)
            .filter(|&(until, ..)| until > now)
            .map(|(_, parent, name)| (parent, name))
            .collect()
    }
}

/// The running watcher thread; [`Watcher::stop`] ends it.
#[derive(Debug)]
pub(crate) struct Watcher {
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    pub(crate) fn start(
        client: Client,
        notifier: Notifier,
        ttl: Arc<CacheTtl>,
        known: Arc<KnownInodes>,
        absent: Arc<AbsentNames>,
    ) -> std::io::Result<Watcher> {
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("stria-watch".into())
            .spawn(move || run(&client, &notifier, &ttl, &known, &absent, stopped))?;
        Ok(Watcher { stop, thread: Some(thread) })
    }

    /// Ends the thread (its request in flight is dropped) and waits for it.
    pub(crate) fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(
    client: &Client,
    notifier: &Notifier,
    ttl: &CacheTtl,
    known: &KnownInodes,
    absent: &AbsentNames,
    mut stopped: watch::Receiver<bool>,
) {
    let runtime = client.runtime().clone();
    runtime.block_on(async {
        let mut cursor = None;
        let mut pause = RETRY_PAUSE;
        loop {
            let batch = tokio::select! {
                _ = stopped.wait_for(|stop| *stop) => break,
                batch = client.watch_changes(cursor, WATCH_WAIT) => batch,
            };
            match batch {
                Ok(batch) => {
                    pause = RETRY_PAUSE;
                    let names_changed =
                        batch.changes.iter().any(|change| matches!(change, Change::Entry { .. }));
                    if names_changed || !batch.complete {
                        absent.hearing_names();
                    }
                    if !batch.complete && cursor.is_some() {
                        ttl.deaf();
                        // Whatever was missed, every inode's attributes are asked for again:
                        // a name whose inode is gone then fails with ESTALE, and the kernel
                        // looks it up afresh. A name rebound to another live inode stays
                        // until its timeout. Names cached as absent are all dropped.
                        let inodes = known.all();
                        let names = absent.take();
                        tracing::warn!(
                            inodes = inodes.len(),
                            absent_names = names.len(),
                            "missed changes of other clients (the metadata service restarted, \
                             or this mount fell behind): dropping every cached attribute and \
                             every name cached as absent"
                        );
                        for ino in inodes {
                            drop_cached_attrs(Some(notifier), ino);
                        }
                        for (parent, name) in names {
                            drop_cached_name(notifier, parent, &name);
                        }
                    }
                    for change in &batch.changes {
                        apply(notifier, change);
                    }
                    cursor = Some(batch.cursor);
                    ttl.hearing();
                }
                Err(error) => {
                    ttl.deaf();
                    tracing::debug!(%error, "watching for changes of other clients");
                    tokio::select! {
                        _ = stopped.wait_for(|stop| *stop) => break,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(RETRY_PAUSE_MAX);
                }
            }
        }
    });
}

/// Makes the kernel drop what it cached of one change.
fn apply(notifier: &Notifier, change: &Change) {
    match change {
        Change::Entry { parent, name } => drop_cached_name(notifier, *parent, name),
        Change::Attr { ino } => drop_cached_attrs(Some(notifier), *ino),
    }
}

/// Makes the kernel drop `name` in `parent`, present or absent. A name it did not cache is no
/// error.
fn drop_cached_name(notifier: &Notifier, parent: u64, name: &[u8]) {
    if let Err(e) = notifier.inval_entry(INodeNo(parent), OsStr::from_bytes(name))
        && e.raw_os_error() != Some(libc::ENOENT)
    {
        tracing::debug!(parent, error = %e, "invalidating a cached name");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_inodes_follow_lookups_and_forgets() {
        let known = KnownInodes::default();
        for ino in [1, 2, 2, 17, 33] {
            known.looked_up(ino);
        }
        known.forgotten(2, 1);
        known.forgotten(17, 1);
        // A forget of more than was counted (the kernel's count ran ahead) and of an inode
        // never counted drop nothing else.
        known.forgotten(33, 5);
        known.forgotten(99, 1);
        let mut all = known.all();
        all.sort_unstable();
        assert_eq!(all, vec![1, 2], "the root, and inode 2 with one lookup left");
        known.forgotten(2, 1);
        known.forgotten(1, 1);
        assert_eq!(known.all(), vec![ROOT_INO], "the root is always there");
    }

    #[test]
    fn absent_names_are_kept_until_a_gap_and_not_across_changes() {
        let absent = AbsentNames::default();
        let long = Duration::from_secs(30);
        let heard = absent.heard();
        assert!(absent.record(1, b"a", long, heard));
        // A lookup that crossed a change to names is not cached.
        absent.hearing_names();
        assert!(!absent.record(1, b"b", long, heard));
        assert!(absent.record(1, b"b", long, absent.heard()));
        let mut names = absent.take();
        names.sort();
        assert_eq!(names, vec![(1, b"a"[..].into()), (1, b"b"[..].into())]);
        assert!(absent.take().is_empty(), "taken once");
    }

    #[test]
    fn absent_names_run_out_in_order_and_a_full_record_refuses_more() {
        let absent = AbsentNames::default();
        let heard = absent.heard();
        // The margin keeps a name a second past its timeout.
        assert!(absent.record(2, b"soon", Duration::ZERO, heard));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(absent.take().len(), 1, "still within the margin");
        for i in 0..ABSENT_NAMES_MAX {
            assert!(absent.record(2, &i.to_le_bytes(), Duration::from_secs(30), heard));
        }
        assert!(!absent.record(2, b"one more", Duration::from_secs(30), heard), "full");
        assert_eq!(absent.take().len(), ABSENT_NAMES_MAX);
        assert!(absent.record(2, b"one more", Duration::from_secs(30), heard), "emptied");
    }

    #[test]
    fn the_long_timeout_holds_only_while_hearing() {
        let ttl = CacheTtl::new(Duration::from_millis(50), Duration::from_secs(30));
        assert_eq!(ttl.get(), Duration::from_millis(50));
        ttl.hearing();
        assert_eq!(ttl.get(), Duration::from_millis(50), "not before one short timeout passed");
        assert_eq!(ttl.watched(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(ttl.get(), Duration::from_secs(30));
        assert_eq!(ttl.watched(), Some(Duration::from_secs(30)));
        ttl.deaf();
        assert_eq!(ttl.get(), Duration::from_millis(50));
        assert_eq!(ttl.watched(), None);
        assert_eq!(ttl.short(), Duration::from_millis(50));
        // A long timeout shorter than the short one is raised to it.
        assert_eq!(
            CacheTtl::new(Duration::from_secs(5), Duration::ZERO).long,
            Duration::from_secs(5)
        );
    }
}
