//! Who is asking: FUSE requests carry uid, gid and pid but not the supplementary groups, which
//! the metadata service's permission checks need; they are read from `/proc/PID/status`.
//! With root squash, uid 0 becomes [`SQUASHED_ID`] and group 0 is replaced or dropped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fuser::Request;
use stria_proto::wire::Caller;

/// How long a process's group list is reused before it is read again.
const GROUPS_TTL: Duration = Duration::from_secs(2);
const CACHE_ENTRIES_MAX: usize = 4096;

/// The user and group root is mapped to under root squash: `nobody` and `nogroup`.
pub const SQUASHED_ID: u32 = 65534;

pub struct Callers {
    groups: Mutex<HashMap<(u32, u32), (Instant, Vec<u32>)>>,
    root_squash: bool,
}

impl Callers {
    pub fn new(root_squash: bool) -> Callers {
        Callers { groups: Mutex::new(HashMap::new()), root_squash }
    }

    /// Whether root is squashed: then no caller has root's privileges here.
    pub fn squash_root(&self) -> bool {
        self.root_squash
    }

    pub fn of(&self, req: &Request) -> Caller {
        let caller = self.unsquashed(req.uid(), req.gid(), req.pid());
        if self.root_squash { squash(caller) } else { caller }
    }

    fn unsquashed(&self, uid: u32, gid: u32, pid: u32) -> Caller {
        if uid == 0 {
            return Caller { uid, gid, groups: Vec::new() };
        }
        let now = Instant::now();
        let mut cache = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, groups)) = cache.get(&(pid, uid))
            && now.duration_since(*at) < GROUPS_TTL
        {
            return Caller { uid, gid, groups: groups.clone() };
        }
        let groups = read_groups(pid).unwrap_or_default();
        if cache.len() >= CACHE_ENTRIES_MAX {
            cache.retain(|_, (at, _)| now.duration_since(*at) < GROUPS_TTL);
        }
        cache.insert((pid, uid), (now, groups.clone()));
        Caller { uid, gid, groups }
    }
}

fn squash(mut caller: Caller) -> Caller {
    if caller.uid == 0 {
        caller.uid = SQUASHED_ID;
    }
    if caller.gid == 0 {
        caller.gid = SQUASHED_ID;
    }
    caller.groups.retain(|&g| g != 0);
    caller
}

fn read_groups(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Groups:"))?;
    Some(line["Groups:".len()..].split_whitespace().filter_map(|g| g.parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squash_maps_root_and_group_zero_only() {
        let root = squash(Caller { uid: 0, gid: 0, groups: vec![0, 4] });
        assert_eq!((root.uid, root.gid, root.groups), (SQUASHED_ID, SQUASHED_ID, vec![4]));
        let user = squash(Caller { uid: 1000, gid: 100, groups: vec![0, 27] });
        assert_eq!((user.uid, user.gid, user.groups), (1000, 100, vec![27]));
    }

    #[test]
    fn reads_this_process_groups() {
        let groups = read_groups(std::process::id());
        assert!(groups.is_some(), "our own /proc status has a Groups line");
    }
}
