//! A connection in transmission is checked again after every change of the exports: removing
//! its export, taking its initiator off the access list, or giving the name another backend or
//! mode closes it once its requests in flight are answered. Putting the same export back (as
//! the node's gateway does after every management change), widening its list, or changing
//! another export leaves it alone.

mod common;

use std::time::Duration;

use common::*;
use stria_nbd::{AclRule, Export};

const LEN: u64 = 1 << 20;

/// Opens `a` and writes one block through it, so the connection is known to work.
fn opened(server: &TestServer, byte: u8) -> RawClient {
    let mut client = RawClient::open(server.addr, "a", false);
    assert_eq!(client.write(1, 0, &[byte; 4096]), 0, "write before the change");
    client
}

/// The connection still serves after `change` (given time to be checked again) and is still
/// listed.
fn kept(server: &TestServer, client: &mut RawClient, byte: u8, what: &str) {
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(client.read(2, 0, 4096), Ok(vec![byte; 4096]), "{what}: the connection was cut");
    assert_eq!(server.clients.list().len(), 1, "{what}: the connection is not listed");
}

fn closed(client: &mut RawClient, what: &str) {
    assert!(client.closed_by_server(), "{what}: the connection stayed open");
}

#[test]
fn export_changes_close_only_the_connections_they_revoke() {
    let (backend, export) = mem_export(LEN);
    let exports = stria_nbd::Exports::new();
    exports.insert("a", export.clone()).expect("insert a");
    exports.insert("b", export.clone()).expect("insert b");
    let server = TestServer::start(exports.clone(), stria_nbd::ServerConfig::default());

    let mut client = opened(&server, 1);
    exports.insert("a", export.clone()).expect("same export again");
    kept(&server, &mut client, 1, "the same export put back");
    exports.remove("b");
    kept(&server, &mut client, 1, "another export removed");
    let wider = Export {
        acl: vec![
            AclRule::new("127.0.0.0/8", None).expect("rule"),
            AclRule::new("10.0.0.0/8", None).expect("rule"),
        ],
        ..export.clone()
    };
    exports.insert("a", wider).expect("wider list");
    kept(&server, &mut client, 1, "a wider access list");

    exports.remove("a");
    closed(&mut client, "export removed");

    exports.insert("a", export.clone()).expect("back");
    let mut client = opened(&server, 2);
    let elsewhere =
        Export { acl: vec![AclRule::new("10.0.0.0/8", None).expect("rule")], ..export.clone() };
    exports.insert("a", elsewhere).expect("narrower list");
    closed(&mut client, "initiator no longer on the list");

    exports.insert("a", export.clone()).expect("back");
    let mut client = opened(&server, 3);
    let (_other, other) = mem_export(LEN);
    exports.insert("a", other).expect("other backend");
    closed(&mut client, "another backend under the name");

    exports.insert("a", export.clone()).expect("back");
    let mut client = opened(&server, 4);
    exports.insert("a", Export { read_only: true, ..export.clone() }).expect("read-only");
    closed(&mut client, "the export made read-only");

    // Each close was the export change's doing, and only those four were.
    server.wait_for("four revoked connections", |s| s.connections_revoked == 4);
    // What was written before each change stayed; nobody is listed any more.
    assert_eq!(read_backend(&backend, 0, 4096), vec![4; 4096]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !server.clients.list().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "clients left listed: {:?}",
            server.clients.list()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server.stop();
}
