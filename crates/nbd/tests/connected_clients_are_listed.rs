//! The server lists the clients in transmission (peer, export, TLS, since when) and drops
//! each from the list when its connection ends.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn clients_in_transmission_are_listed_until_they_leave() {
    let (server, _backend) = serve_one("disk", 1 << 20);
    assert!(server.clients.list().is_empty());
    let first = RawClient::open(server.addr, "disk", true);
    let second = RawClient::open(server.addr, "disk", false);
    wait_until("two clients listed", || server.clients.list().len() == 2);
    let listed = server.clients.list();
    assert!(listed.iter().all(|c| c.export == "disk" && !c.tls && c.peer.ip().is_loopback()));
    assert!(listed.iter().all(|c| c.since_unix_s > 1_600_000_000), "{listed:?}");
    drop(first);
    wait_until("one client left", || server.clients.list().len() == 1);
    drop(second);
    wait_until("no client left", || server.clients.list().is_empty());
    // A client that only negotiates (nbdinfo) is never in transmission for long, and a
    // refused one never is.
    tool_ok("nbdinfo", &[&server.uri("disk")]);
    wait_until("nbdinfo gone", || server.clients.list().is_empty());
    server.stop();
}
