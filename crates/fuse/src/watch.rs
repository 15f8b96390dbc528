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

use std::collections::HashMap;
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
        let now = self.base.elapsed().as_nanos() as u64;
        if now >= self.long_from.load(Ordering::Relaxed) { self.long } else { self.short }
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
    ) -> std::io::Result<Watcher> {
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("stria-watch".into())
            .spawn(move || run(&client, &notifier, &ttl, &known, stopped))?;
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
                    if !batch.complete && cursor.is_some() {
                        ttl.deaf();
                        // Whatever was missed, every inode's attributes are asked for again:
                        // a name whose inode is gone then fails with ESTALE, and the kernel
                        // looks it up afresh. A name rebound to another live inode stays
                        // until its timeout.
                        let inodes = known.all();
                        tracing::warn!(
                            inodes = inodes.len(),
                            "missed changes of other clients (the metadata service restarted, \
                             or this mount fell behind): dropping every cached attribute"
                        );
                        for ino in inodes {
                            drop_cached_attrs(Some(notifier), ino);
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

/// Makes the kernel drop what it cached of one change. A name it did not cache is no error.
fn apply(notifier: &Notifier, change: &Change) {
    match change {
        Change::Entry { parent, name } => {
            if let Err(e) = notifier.inval_entry(INodeNo(*parent), OsStr::from_bytes(name))
                && e.raw_os_error() != Some(libc::ENOENT)
            {
                tracing::debug!(parent, error = %e, "invalidating a cached name");
            }
        }
        Change::Attr { ino } => drop_cached_attrs(Some(notifier), *ino),
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
    fn the_long_timeout_holds_only_while_hearing() {
        let ttl = CacheTtl::new(Duration::from_millis(50), Duration::from_secs(30));
        assert_eq!(ttl.get(), Duration::from_millis(50));
        ttl.hearing();
        assert_eq!(ttl.get(), Duration::from_millis(50), "not before one short timeout passed");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(ttl.get(), Duration::from_secs(30));
        ttl.deaf();
        assert_eq!(ttl.get(), Duration::from_millis(50));
        assert_eq!(ttl.short(), Duration::from_millis(50));
        // A long timeout shorter than the short one is raised to it.
        assert_eq!(
            CacheTtl::new(Duration::from_secs(5), Duration::ZERO).long,
            Duration::from_secs(5)
        );
    }
}
