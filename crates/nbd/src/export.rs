//! The export registry: named backends with their access lists, shared with running servers
//! and changeable while they run.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::acl::{self, Access, AclRule, Peer};
use crate::backend::Backend;
use crate::wire::{BLOCK_SIZE_MIN_BYTES, STRING_BYTES_MAX};

/// One export: a backend plus how it is offered.
#[derive(Clone)]
pub struct Export {
    pub backend: Arc<dyn Backend>,
    /// Shown by `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION`; at most 4096 bytes.
    pub description: String,
    /// Advertise `NBD_FLAG_READ_ONLY` and fail every write, trim and write-zeroes with EPERM.
    pub read_only: bool,
    /// Who may see and use the export. Empty: nobody.
    pub acl: Vec<AclRule>,
}

impl fmt::Debug for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Export")
            .field("size", &self.backend.size())
            .field("description", &self.description)
            .field("read_only", &self.read_only)
            .field("acl", &self.acl)
            .finish()
    }
}

/// Counters per export name. They survive replacing the export under the same name, so a
/// metrics scraper sees monotonic values.
#[derive(Debug, Default)]
pub struct ExportStats {
    refusals: AtomicU64,
    opens: AtomicU64,
}

impl ExportStats {
    /// Attempts to inspect or open the export (`NBD_OPT_INFO`, `NBD_OPT_GO`,
    /// `NBD_OPT_EXPORT_NAME`) that the access list refused.
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Connections that entered transmission on this export.
    pub fn opens(&self) -> u64 {
        self.opens.load(Ordering::Relaxed)
    }

    pub(crate) fn count_refusal(&self) {
        self.refusals.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_open(&self) {
        self.opens.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    #[error("export name must be at most {STRING_BYTES_MAX} bytes of UTF-8 without NUL")]
    BadName,
    #[error("export description must be at most {STRING_BYTES_MAX} bytes without NUL")]
    BadDescription,
    #[error("export size {0} is not a multiple of {BLOCK_SIZE_MIN_BYTES} bytes")]
    SizeNotAligned(u64),
}

#[derive(Debug)]
struct Entry {
    export: Arc<Export>,
    stats: Arc<ExportStats>,
}

/// The set of exports, cheap to clone (all clones share one registry). Changes take effect
/// for options negotiated after them, and connections in transmission check theirs again
/// after every change: one whose export is gone, whose access list no longer lets it in, or
/// whose export now serves another backend or another mode is closed once the requests it
/// has in flight are answered (see `transmission::run`).
#[derive(Debug, Clone)]
pub struct Exports {
    inner: Arc<RwLock<Registry>>,
    /// Counts changes; connections in transmission wait on it.
    changes: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for Exports {
    fn default() -> Exports {
        Exports { inner: Arc::default(), changes: Arc::new(tokio::sync::watch::Sender::new(0)) }
    }
}

/// Whether two exports serve one backend: its address, without the vtable (which may differ
/// between codegen units).
fn same_backend(a: &Export, b: &Export) -> bool {
    Arc::as_ptr(&a.backend).cast::<()>() == Arc::as_ptr(&b.backend).cast::<()>()
}

/// Whether a connection in transmission may go on, after a change of the exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    Kept,
    Removed,
    Refused,
    /// The name now serves another backend, or the same one in another mode.
    Replaced,
}

impl Standing {
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Standing::Kept => "still allowed",
            Standing::Removed => "the export was removed",
            Standing::Refused => "the access list no longer allows this client",
            Standing::Replaced => "the export now serves other data or another mode",
        }
    }
}

#[derive(Debug, Default)]
struct Registry {
    entries: BTreeMap<String, Entry>,
    /// Stats of names that were removed, kept so counters stay monotonic if they return.
    retired_stats: BTreeMap<String, Arc<ExportStats>>,
}

/// What the registry says about one name for one peer.
pub(crate) enum Lookup {
    Allowed(Arc<Export>, Arc<ExportStats>),
    /// Exists, refused for this peer; `needs_tls` when a TLS identity could change that.
    Refused {
        stats: Arc<ExportStats>,
        needs_tls: bool,
    },
    Missing,
}

impl Exports {
    pub fn new() -> Exports {
        Exports::default()
    }

    /// Adds or replaces the export `name`; returns the one it replaced.
    pub fn insert(&self, name: &str, export: Export) -> Result<Option<Export>, ExportError> {
        if crate::wire::parse_string(name.as_bytes()).is_err() {
            return Err(ExportError::BadName);
        }
        if crate::wire::parse_string(export.description.as_bytes()).is_err() {
            return Err(ExportError::BadDescription);
        }
        let size = export.backend.size();
        if !size.is_multiple_of(BLOCK_SIZE_MIN_BYTES as u64) {
            return Err(ExportError::SizeNotAligned(size));
        }
        let mut registry = self.write();
        let stats = match registry.entries.get(name) {
            Some(old) => old.stats.clone(),
            None => registry.retired_stats.remove(name).unwrap_or_default(),
        };
        let same = registry.entries.get(name).is_some_and(|old| {
            same_backend(&old.export, &export)
                && old.export.read_only == export.read_only
                && old.export.acl == export.acl
        });
        let old =
            registry.entries.insert(name.to_string(), Entry { export: Arc::new(export), stats });
        drop(registry);
        // An export put back unchanged (the node's gateway re-applies every export after each
        // management change) concerns no connection.
        if !same {
            self.changes.send_modify(|n| *n += 1);
        }
        Ok(old.map(|entry| (*entry.export).clone()))
    }

    /// Removes the export `name`; connections using it close once their requests in flight
    /// are answered.
    pub fn remove(&self, name: &str) -> Option<Export> {
        let mut registry = self.write();
        let entry = registry.entries.remove(name)?;
        registry.retired_stats.insert(name.to_string(), entry.stats);
        drop(registry);
        self.changes.send_modify(|n| *n += 1);
        Some((*entry.export).clone())
    }

    /// Wakes on every later change of the exports.
    pub(crate) fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether a connection of `peer` that opened `opened` under `name` may go on.
    pub(crate) fn standing(&self, name: &str, peer: &Peer, opened: &Export) -> Standing {
        let registry = self.read();
        let Some(entry) = registry.entries.get(name) else { return Standing::Removed };
        if acl::check(&entry.export.acl, peer) != Access::Allowed {
            return Standing::Refused;
        }
        if same_backend(&entry.export, opened) && entry.export.read_only == opened.read_only {
            Standing::Kept
        } else {
            Standing::Replaced
        }
    }

    pub fn get(&self, name: &str) -> Option<Export> {
        self.read().entries.get(name).map(|entry| (*entry.export).clone())
    }

    pub fn names(&self) -> Vec<String> {
        self.read().entries.keys().cloned().collect()
    }

    /// Counters of the export `name` (also after it was removed).
    pub fn stats(&self, name: &str) -> Option<Arc<ExportStats>> {
        let registry = self.read();
        registry
            .entries
            .get(name)
            .map(|entry| entry.stats.clone())
            .or_else(|| registry.retired_stats.get(name).cloned())
    }

    pub(crate) fn lookup(&self, name: &str, peer: &Peer) -> Lookup {
        let registry = self.read();
        let Some(entry) = registry.entries.get(name) else {
            return Lookup::Missing;
        };
        match acl::check(&entry.export.acl, peer) {
            Access::Allowed => Lookup::Allowed(entry.export.clone(), entry.stats.clone()),
            Access::NeedsTls => Lookup::Refused { stats: entry.stats.clone(), needs_tls: true },
            Access::Denied => Lookup::Refused { stats: entry.stats.clone(), needs_tls: false },
        }
    }

    /// Names and descriptions of the exports this peer may use, for `NBD_OPT_LIST`.
    pub(crate) fn visible_to(&self, peer: &Peer) -> Vec<(String, String)> {
        self.read()
            .entries
            .iter()
            .filter(|(_, entry)| acl::check(&entry.export.acl, peer) == Access::Allowed)
            .map(|(name, entry)| (name.clone(), entry.export.description.clone()))
            .collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        // Writers replace whole entries, so a panic elsewhere cannot leave one half-written.
        self.inner.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.inner.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemBackend;

    fn export(acl: Vec<AclRule>) -> Export {
        Export {
            backend: Arc::new(MemBackend::new(1 << 20)),
            description: "test".into(),
            read_only: false,
            acl,
        }
    }

    fn peer(addr: &str) -> Peer {
        Peer { addr: addr.parse().expect("addr"), tls: false, identities: vec![] }
    }

    #[test]
    fn list_shows_only_what_the_peer_may_use() {
        let exports = Exports::new();
        exports.insert("open", export(AclRule::anyone())).expect("insert");
        exports
            .insert("lan", export(vec![AclRule::new("10.0.0.0/8", None).expect("rule")]))
            .expect("insert");
        exports.insert("nobody", export(vec![])).expect("insert");
        let names: Vec<String> =
            exports.visible_to(&peer("127.0.0.1")).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["open".to_string()]);
        assert!(matches!(exports.lookup("nobody", &peer("10.0.0.1")), Lookup::Refused { .. }));
        assert!(matches!(exports.lookup("lan", &peer("10.0.0.1")), Lookup::Allowed(..)));
        assert!(matches!(exports.lookup("ghost", &peer("10.0.0.1")), Lookup::Missing));
    }

    #[test]
    fn counters_survive_replacement_and_removal() {
        let exports = Exports::new();
        exports.insert("a", export(vec![])).expect("insert");
        exports.stats("a").expect("stats").count_refusal();
        exports.insert("a", export(vec![])).expect("replace");
        assert_eq!(exports.stats("a").expect("stats").refusals(), 1);
        exports.remove("a").expect("remove");
        assert_eq!(exports.stats("a").expect("stats").refusals(), 1);
        exports.insert("a", export(vec![])).expect("again");
        assert_eq!(exports.stats("a").expect("stats").refusals(), 1);
    }

    #[test]
    fn rejects_bad_names_and_unaligned_sizes() {
        let exports = Exports::new();
        assert_eq!(exports.insert("a\0b", export(vec![])).err(), Some(ExportError::BadName));
        let odd = Export {
            backend: Arc::new(OddSize),
            description: String::new(),
            read_only: false,
            acl: vec![],
        };
        assert_eq!(exports.insert("odd", odd).err(), Some(ExportError::SizeNotAligned(1000)));
    }

    struct OddSize;
    impl Backend for OddSize {
        fn size(&self) -> u64 {
            1000
        }
        fn read(&self, _: u64, _: &mut [u8]) -> Result<(), crate::BackendError> {
            Ok(())
        }
        fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), crate::BackendError> {
            Ok(())
        }
        fn flush(&self) -> Result<(), crate::BackendError> {
            Ok(())
        }
        fn trim(&self, _: u64, _: u64) -> Result<(), crate::BackendError> {
            Ok(())
        }
        fn write_zeroes(
            &self,
            _: u64,
            _: u64,
            _: bool,
            _: bool,
        ) -> Result<(), crate::BackendError> {
            Ok(())
        }
        fn block_status(&self, _: u64, _: u64) -> Result<Vec<crate::Extent>, crate::BackendError> {
            Ok(vec![])
        }
    }
}
