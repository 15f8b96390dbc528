//! The attributes of directories this client just changed, as the metadata service answered
//! them with the change (`MetaReply::WithParent`). The kernel drops a directory's cached
//! attributes after every create or unlink in it, and with `default_permissions` asks for them
//! again before the next one: the mount answers that from here, which saves a metadata round
//! trip per create and per remove.
//!
//! An entry is as fresh as a `GetAttr` sent just after the change, and the mount uses it only
//! within its attribute timeout, the staleness it allows the kernel's own cache; fresher
//! attributes (a `GetAttr` or `Lookup` answer) drop it. Only a
//! change that overlapped no other request of this client naming the directory leaves an
//! entry: with two in flight, the service may have run them in either order, and the later
//! reply could carry the older attributes. Any other change of the directory drops it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use stria_proto::fs::Ino;
use stria_proto::wire::Attr;

/// Most directories remembered; past it the entries older than [`KEPT_FOR`] go, then all.
const DIRS_MAX: usize = 4096;
/// Oldest an entry is kept at all (a mount's attribute timeout is usually 1 s).
const KEPT_FOR: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct Dir {
    /// Requests naming the directory that are on their way.
    in_flight: u32,
    /// Requests naming the directory sent so far.
    sent: u64,
    attr: Option<(Instant, Attr)>,
}

#[derive(Debug, Default)]
pub(crate) struct DirAttrs {
    dirs: Mutex<HashMap<Ino, Dir>>,
}

/// The directories a request in flight names: for each, whether no other request naming it
/// was in flight when it was sent, and the send count it was sent at. Dropped unanswered (a
/// failure, a cancelled call), it leaves no entry.
pub(crate) struct InFlight<'a> {
    attrs: &'a DirAttrs,
    dirs: Vec<(Ino, bool, u64)>,
}

impl DirAttrs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Ino, Dir>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request that changes `changed` is being sent.
    pub fn sending(&self, changed: &[Ino]) -> InFlight<'_> {
        if changed.is_empty() {
            return InFlight { attrs: self, dirs: Vec::new() };
        }
        let mut dirs = self.lock();
        let noted = changed
            .iter()
            .map(|&ino| {
                let dir = dirs.entry(ino).or_default();
                let alone = dir.in_flight == 0;
                dir.in_flight += 1;
                dir.sent += 1;
                dir.attr = None;
                (ino, alone, dir.sent)
            })
            .collect();
        InFlight { attrs: self, dirs: noted }
    }

    /// `ino`'s attributes as a change of this client left them, if that was within `max_age`.
    pub fn get(&self, ino: Ino, max_age: Duration) -> Option<Attr> {
        let dirs = self.lock();
        let (at, attr) = dirs.get(&ino)?.attr.as_ref()?;
        (at.elapsed() <= max_age).then(|| attr.clone())
    }

    /// Drops what is kept of `ino` (fresher attributes came, or another client changed it),
    /// and what a change of this client now in flight would bring: its answer may have been
    /// read before the fresher state.
    pub fn forget(&self, ino: Ino) {
        let mut dirs = self.lock();
        if let Some(dir) = dirs.get_mut(&ino) {
            dir.attr = None;
            dir.sent += 1;
            if dir.in_flight == 0 {
                dirs.remove(&ino);
            }
        }
    }

    fn settle(&self, noted: &[(Ino, bool, u64)], parent: Option<Attr>) {
        let mut dirs = self.lock();
        let now = Instant::now();
        for &(ino, alone, sent_at) in noted {
            let Some(dir) = dirs.get_mut(&ino) else { continue };
            dir.in_flight -= 1;
            match &parent {
                Some(attr) if attr.ino == ino && alone && dir.sent == sent_at => {
                    dir.attr = Some((now, attr.clone()));
                }
                _ => dir.attr = None,
            }
            if dir.in_flight == 0 && dir.attr.is_none() {
                dirs.remove(&ino);
            }
        }
        if dirs.len() > DIRS_MAX {
            dirs.retain(|_, d| {
                d.in_flight > 0 || d.attr.as_ref().is_some_and(|(at, _)| now - *at < KEPT_FOR)
            });
            if dirs.len() > DIRS_MAX {
                dirs.retain(|_, d| d.in_flight > 0);
                dirs.values_mut().for_each(|d| d.attr = None);
            }
        }
    }
}

impl InFlight<'_> {
    /// The request was answered; `parent` is the directory's attributes the reply carried.
    pub fn answered(mut self, parent: Option<Attr>) {
        let noted = std::mem::take(&mut self.dirs);
        self.attrs.settle(&noted, parent);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.dirs.is_empty() {
            let noted = std::mem::take(&mut self.dirs);
            self.attrs.settle(&noted, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stria_proto::wire::{FileKind, Timestamp};

    fn dir(ino: Ino, nlink: u32) -> Attr {
        let t = Timestamp::new(1, 0);
        Attr {
            ino,
            kind: FileKind::Dir,
            perm: 0o755,
            nlink,
            uid: 0,
            gid: 0,
            size: 0,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            layout: None,
        }
    }

    const AGE: Duration = Duration::from_secs(1);

    #[test]
    fn a_change_alone_leaves_the_directory_s_attributes() {
        let attrs = DirAttrs::default();
        attrs.sending(&[5]).answered(Some(dir(5, 3)));
        assert_eq!(attrs.get(5, AGE).map(|a| a.nlink), Some(3));
        assert_eq!(attrs.get(5, Duration::ZERO), None, "older than allowed");
        // Another change of it, answered without them: gone.
        attrs.sending(&[5]).answered(None);
        assert_eq!(attrs.get(5, AGE), None);
        assert!(attrs.lock().is_empty(), "nothing kept for it");
    }

    #[test]
    fn overlapping_changes_leave_nothing_and_a_failed_one_clears() {
        let attrs = DirAttrs::default();
        let first = attrs.sending(&[5]);
        let second = attrs.sending(&[5]);
        // Answered in any order, neither may be the last state the service left.
        second.answered(Some(dir(5, 4)));
        first.answered(Some(dir(5, 3)));
        assert_eq!(attrs.get(5, AGE), None);
        attrs.sending(&[5]).answered(Some(dir(5, 4)));
        let failed = attrs.sending(&[5]);
        assert_eq!(attrs.get(5, AGE), None, "a change on its way hides the entry");
        drop(failed);
        assert_eq!(attrs.get(5, AGE), None);
        // A rename names two: each is dropped.
        attrs.sending(&[6]).answered(Some(dir(6, 2)));
        attrs.sending(&[6, 7]).answered(None);
        assert_eq!(attrs.get(6, AGE), None);
    }
}
