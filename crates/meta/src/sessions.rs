//! The clients of the namespace heard from lately: each says who it is (`Hello`) when it
//! starts and again every `LOCK_RENEW`, and goodbye when it stops; one not heard from for a
//! `LOCK_LEASE` is gone from the list. The management API lists them (`GET /clients`), so a
//! mount on another machine shows there. A session that ends that way is kept aside until
//! [`Sessions::expire`] takes it: the files its client still had open are then released
//! (`Meta::expire_clients`). Memory only, like the locks.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use stria_proto::fs::FsStatus;
use stria_proto::wire::{
    CLIENT_INFO_TEXT_MAX, CLIENT_SESSIONS_MAX, ClientInfo, ClientSession, LOCK_LEASE,
};

#[derive(Debug)]
struct Session {
    info: ClientInfo,
    since_unix_s: u64,
    last: Instant,
}

/// Most ended sessions kept for [`Sessions::expire`]; past it the oldest are forgotten, and
/// their clients' opens stay counted until the service restarts (as before sessions ended).
const ENDED_MAX: usize = 4 * CLIENT_SESSIONS_MAX;

#[derive(Debug, Default)]
struct State {
    live: HashMap<u64, Session>,
    /// Sessions that ran out, oldest first, not yet taken by `expire`.
    ended: Vec<u64>,
}

impl State {
    /// Moves the sessions not heard from within a lease to `ended`.
    fn end_silent(&mut self, now: Instant) {
        let ended = &mut self.ended;
        self.live.retain(|&client, s| {
            let alive = now.duration_since(s.last) <= LOCK_LEASE;
            if !alive {
                ended.push(client);
            }
            alive
        });
        if ended.len() > ENDED_MAX {
            ended.drain(..ended.len() - ENDED_MAX);
        }
    }
}

#[derive(Debug, Default)]
pub struct Sessions {
    state: Mutex<State>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `client` is alive and is `info`.
    pub fn hello(&self, client: u64, info: ClientInfo) -> Result<(), FsStatus> {
        if [&info.kind, &info.mount, &info.host].iter().any(|t| t.len() > CLIENT_INFO_TEXT_MAX) {
            return Err(FsStatus::Invalid);
        }
        let now = Instant::now();
        let mut state = self.lock();
        state.end_silent(now);
        let sessions = &mut state.live;
        if let Some(session) = sessions.get_mut(&client) {
            session.info = info;
            session.last = now;
            return Ok(());
        }
        if sessions.len() >= CLIENT_SESSIONS_MAX {
            return Err(FsStatus::NoSpace);
        }
        let since_unix_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        sessions.insert(client, Session { info, since_unix_s, last: now });
        Ok(())
    }

    pub fn goodbye(&self, client: u64) {
        self.lock().live.remove(&client);
    }

    /// Ends the sessions not heard from within a lease and takes every ended session not
    /// taken yet.
    pub fn expire(&self) -> Vec<u64> {
        let mut state = self.lock();
        state.end_silent(Instant::now());
        std::mem::take(&mut state.ended)
    }

    /// Every client heard from within the last lease, oldest first.
    pub fn list(&self) -> Vec<ClientSession> {
        let mut state = self.lock();
        state.end_silent(Instant::now());
        let mut out: Vec<ClientSession> = state
            .live
            .iter()
            .map(|(&client, s)| ClientSession {
                client,
                info: s.info.clone(),
                since_unix_s: s.since_unix_s,
            })
            .collect();
        out.sort_by_key(|s| (s.since_unix_s, s.client));
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn info(mount: &str) -> ClientInfo {
        ClientInfo { kind: "fuse".into(), mount: mount.into(), host: "h".into(), pid: 7 }
    }

    #[test]
    fn clients_come_and_go() {
        let s = Sessions::default();
        s.hello(1, info("/a")).unwrap();
        s.hello(2, info("/b")).unwrap();
        s.hello(1, info("/a2")).unwrap();
        let list = s.list();
        assert_eq!(list.len(), 2);
        assert_eq!(list.iter().find(|c| c.client == 1).unwrap().info.mount, "/a2");
        s.goodbye(2);
        assert_eq!(s.list().len(), 1);
        assert!(s.expire().is_empty(), "a goodbye is not an expiry (the caller drops its opens)");
        // Silent for longer than a lease: gone, and ended once.
        s.lock().live.get_mut(&1).unwrap().last =
            Instant::now().checked_sub(LOCK_LEASE + Duration::from_secs(1)).unwrap();
        assert!(s.list().is_empty());
        assert_eq!(s.expire(), vec![1]);
        assert!(s.expire().is_empty());
    }

    #[test]
    fn oversized_info_is_refused() {
        let s = Sessions::default();
        let long = "x".repeat(CLIENT_INFO_TEXT_MAX + 1);
        assert_eq!(s.hello(1, info(&long)), Err(FsStatus::Invalid));
        assert!(s.list().is_empty());
    }
}
