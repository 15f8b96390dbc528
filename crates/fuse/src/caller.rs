//! Who is asking: FUSE requests carry uid, gid and pid but not the supplementary groups, which
//! the metadata service's permission checks need; they are read from `/proc/PID/status`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fuser::Request;
use stria_proto::wire::Caller;

/// How long a process's group list is reused before it is read again.
const GROUPS_TTL: Duration = Duration::from_secs(2);
const CACHE_ENTRIES_MAX: usize = 4096;

#[derive(Default)]
pub struct Callers {
    groups: Mutex<HashMap<(u32, u32), (Instant, Vec<u32>)>>,
}

impl Callers {
    pub fn of(&self, req: &Request) -> Caller {
        let (uid, gid, pid) = (req.uid(), req.gid(), req.pid());
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

fn read_groups(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Groups:"))?;
    Some(line["Groups:".len()..].split_whitespace().filter_map(|g| g.parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_groups() {
        let groups = read_groups(std::process::id());
        assert!(groups.is_some(), "our own /proc status has a Groups line");
    }
}
