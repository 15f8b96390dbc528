//! Which version of each file a cache in front of this client holds (the kernel's page
//! cache, for the FUSE mount), so that `open` can tell whether another client changed the file
//! since: close-to-open consistency between clients.
//!
//! A version is the file's size and mtime as the metadata service has them. The client
//! notes the version each open finds and the one its own changes leave when it knows the
//! cache held the version before them (a published size, checked against the version the
//! service reports it replaced; a file it created); a change whose version before is unknown
//! (an inline write, a setattr) drops the record. An open that finds another version than the
//! one noted knows the cache is stale. mtime carries nanoseconds and is set by the writer, so two
//! different contents with one version would take two writers in the same nanosecond.

use std::collections::HashMap;
use std::sync::Mutex;

use stria_proto::fs::Ino;
use stria_proto::wire::{Attr, Timestamp};

/// Most files remembered. Past it the record starts over, which costs each file's cached
/// pages once (their next open drops them), nothing else.
const SEEN_MAX: usize = 1 << 16;

#[derive(Debug, Default)]
pub(crate) struct SeenVersions {
    versions: Mutex<HashMap<Ino, (u64, Timestamp)>>,
}

impl SeenVersions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Ino, (u64, Timestamp)>> {
        self.versions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cache now holds this version of `ino` (this client made it, or just fetched it).
    pub fn note(&self, ino: Ino, size: u64, mtime: Timestamp) {
        let mut versions = self.lock();
        if versions.len() >= SEEN_MAX && !versions.contains_key(&ino) {
            versions.clear();
        }
        versions.insert(ino, (size, mtime));
    }

    pub fn note_attr(&self, attr: &Attr) {
        self.note(attr.ino, attr.size, attr.mtime);
    }

    /// This client changed `ino` from version `before` (as the metadata service had it just
    /// before the change) to `after`. The cache holds `after` only if it held `before`: a
    /// change another client made in between stays unseen, so the record is dropped.
    pub fn advance(&self, ino: Ino, before: (u64, Timestamp), after: (u64, Timestamp)) {
        let mut versions = self.lock();
        if versions.get(&ino) == Some(&before) {
            versions.insert(ino, after);
        } else {
            versions.remove(&ino);
        }
    }

    /// Whether the version in `attr` (fresh from the metadata service) is the one noted for
    /// its file; notes it either way. A file with nothing noted is not current: nothing says
    /// what the cache holds.
    pub fn is_current(&self, attr: &Attr) -> bool {
        let mut versions = self.lock();
        let current = versions.get(&attr.ino) == Some(&(attr.size, attr.mtime));
        if !current {
            if versions.len() >= SEEN_MAX && !versions.contains_key(&attr.ino) {
                versions.clear();
            }
            versions.insert(attr.ino, (attr.size, attr.mtime));
        }
        current
    }

    /// The cache dropped `ino` (the kernel forgot the inode).
    pub fn forget(&self, ino: Ino) {
        self.lock().remove(&ino);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn attr(ino: Ino, size: u64, secs: i64, nanos: u32) -> Attr {
        let t = Timestamp::default();
        Attr {
            ino,
            kind: stria_proto::wire::FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size,
            rdev: 0,
            atime: t,
            mtime: Timestamp { secs, nanos },
            ctime: t,
            crtime: t,
            layout: None,
        }
    }

    #[test]
    fn an_open_is_current_only_for_the_version_noted_last() {
        let seen = SeenVersions::default();
        assert!(!seen.is_current(&attr(7, 10, 1, 5)), "nothing noted yet");
        assert!(seen.is_current(&attr(7, 10, 1, 5)), "the open noted what it found");
        assert!(!seen.is_current(&attr(7, 10, 1, 6)), "another client wrote: new mtime");
        assert!(!seen.is_current(&attr(7, 11, 1, 6)), "same mtime, other size");
        let (v1, v2) =
            ((11, Timestamp { secs: 1, nanos: 6 }), (20, Timestamp { secs: 2, nanos: 0 }));
        seen.advance(7, v1, v2);
        assert!(seen.is_current(&attr(7, 20, 2, 0)), "this client's own change");
        let v3 = (30, Timestamp { secs: 3, nanos: 0 });
        seen.advance(7, v1, v3);
        assert!(!seen.is_current(&attr(7, 30, 3, 0)), "another change came in between");
        seen.forget(7);
        assert!(!seen.is_current(&attr(7, 20, 2, 0)), "forgotten: nothing noted");
    }

    #[test]
    fn the_record_is_bounded() {
        let seen = SeenVersions::default();
        for ino in 0..SEEN_MAX as u64 + 10 {
            seen.note(ino, 1, Timestamp::default());
        }
        assert!(seen.lock().len() <= SEEN_MAX);
        assert!(seen.is_current(&attr(SEEN_MAX as u64 + 9, 1, 0, 0)), "the newest stays");
    }
}
