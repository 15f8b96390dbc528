//! Access lists: an initiator not on an export's list cannot open it (and the refusal is
//! counted), `NBD_OPT_LIST` does not reveal it, an empty list refuses everyone, and a
//! read-only export rejects writes with EPERM while its data stays as it was.

mod common;

use common::*;
use stria_nbd::wire::*;
use stria_nbd::{AclRule, Backend, Exports, ServerConfig};

fn exports_with_acls() -> (Exports, std::sync::Arc<stria_nbd::MemBackend>) {
    let exports = Exports::new();
    let (_, public) = mem_export(MIB);
    exports.insert("public", public).expect("insert");
    let (secret_backend, mut secret) = mem_export(MIB);
    // Only a network this test's loopback peer is not in.
    secret.acl = vec![
        AclRule::new("10.0.0.0/8", None).expect("rule"),
        AclRule::new("fd00::/8", None).expect("rule"),
    ];
    exports.insert("secret", secret).expect("insert");
    let (_, mut nobody) = mem_export(MIB);
    nobody.acl = vec![];
    exports.insert("nobody", nobody).expect("insert");
    (exports, secret_backend)
}

#[test]
fn a_peer_not_on_the_list_is_refused_and_counted() {
    let (exports, secret_backend) = exports_with_acls();
    let server = TestServer::start(exports, ServerConfig::default());
    let refusals_before = server.exports.stats("secret").expect("stats").refusals();

    let out = tool("nbdinfo", &[&server.uri("secret")]);
    assert!(!out.status.success(), "nbdinfo opened a refused export");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // libnbd reports NBD_REP_ERR_UNKNOWN as ENOENT, the same as for a missing export.
    assert!(
        stderr.contains("No such file") && stderr.contains("secret"),
        "unexpected error: {stderr}"
    );
    let refusals = server.exports.stats("secret").expect("stats").refusals();
    assert!(refusals > refusals_before, "refusal not counted");
    assert!(server.stats.snapshot().refusals >= 1);

    // qemu fails too, and nothing was written.
    let out = tool("qemu-io", &["-f", "raw", &server.uri("secret"), "-c", "write -P 0x77 0 4k"]);
    assert!(
        !out.status.success() || String::from_utf8_lossy(&out.stderr).contains("not available")
    );
    assert_eq!(secret_backend.mutation_count(), 0);
    assert!(server.exports.stats("secret").expect("stats").refusals() > refusals);

    // The public export still opens.
    tool_ok("nbdinfo", &[&server.uri("public")]);
    assert_eq!(server.exports.stats("public").expect("stats").refusals(), 0);
}

#[test]
fn an_empty_list_refuses_everyone() {
    let (exports, _) = exports_with_acls();
    let server = TestServer::start(exports, ServerConfig::default());
    let out = tool("nbdinfo", &[&server.uri("nobody")]);
    assert!(!out.status.success());
    // Every refused attempt counts (nbdinfo tries NBD_OPT_INFO and NBD_OPT_GO).
    assert!(server.exports.stats("nobody").expect("stats").refusals() >= 1);
}

#[test]
fn refused_and_missing_exports_look_the_same() {
    let (exports, _) = exports_with_acls();
    let server = TestServer::start(exports, ServerConfig::default());
    let mut client = RawClient::connect(server.addr);
    let refused = client.option(OPT_INFO, &go_payload("secret", &[]));
    let missing = client.option(OPT_INFO, &go_payload("ghost", &[]));
    assert_eq!(refused.reply_type, REP_ERR_UNKNOWN);
    assert_eq!(missing.reply_type, REP_ERR_UNKNOWN);
    assert_eq!(
        String::from_utf8_lossy(&refused.payload),
        "export 'secret' is not available to this client"
    );
    // NBD_OPT_EXPORT_NAME cannot carry an error: the server hangs up.
    client.send_option(OPT_EXPORT_NAME, b"secret");
    assert!(client.closed_by_server());
}

#[test]
fn list_hides_exports_the_peer_may_not_use() {
    let (exports, _) = exports_with_acls();
    let server = TestServer::start(exports, ServerConfig::default());
    let list = json(&tool_ok("nbdinfo", &["--list", "--json", &format!("nbd://{}", server.addr)]));
    let names: Vec<&str> = list["exports"]
        .as_array()
        .expect("exports")
        .iter()
        .map(|e| e["export-name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, vec!["public"]);

    // Allowing the loopback network at run time makes "secret" visible to new connections.
    let mut secret = server.exports.get("secret").expect("secret");
    secret.acl.push(AclRule::new("127.0.0.1", None).expect("rule"));
    server.exports.insert("secret", secret).expect("replace");
    let list = json(&tool_ok("nbdinfo", &["--list", "--json", &format!("nbd://{}", server.addr)]));
    let mut names: Vec<&str> = list["exports"]
        .as_array()
        .expect("exports")
        .iter()
        .map(|e| e["export-name"].as_str().expect("name"))
        .collect();
    names.sort();
    assert_eq!(names, vec!["public", "secret"]);
}

#[test]
fn a_read_only_export_rejects_writes_with_eperm_and_keeps_its_data() {
    let exports = Exports::new();
    let (backend, mut export) = mem_export(MIB);
    export.read_only = true;
    backend.write(0, &[0x42; 8192], false).expect("seed");
    exports.insert("ro", export).expect("insert");
    let server = TestServer::start(exports, ServerConfig::default());
    let mutations = backend.mutation_count();

    // Straight to the server, bypassing any client-side read-only check.
    for structured in [false, true] {
        let mut client = RawClient::open(server.addr, "ro", structured);
        assert_eq!(client.write(1, 0, &[0x99; 4096]), NbdErrno::Perm.code());
        client.request(CMD_WRITE_ZEROES, 0, 2, 0, 4096, &[]);
        assert_eq!(client.reply_error(2), NbdErrno::Perm.code());
        client.request(CMD_TRIM, 0, 3, 0, 4096, &[]);
        assert_eq!(client.reply_error(3), NbdErrno::Perm.code());
        // Reads still work on the same connection.
        assert_eq!(client.read(4, 0, 4096).expect("read"), vec![0x42; 4096]);
        client.disconnect();
    }

    // A real client's write fails too.
    let out = tool("qemu-io", &["-f", "raw", &server.uri("ro"), "-c", "write -P 0x99 0 4k"]);
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("wrote 4096/4096"), "qemu-io reports a successful write: {text}");

    assert_eq!(backend.mutation_count(), mutations, "a refused write reached the backend");
    assert_eq!(read_backend(&backend, 0, 8192), vec![0x42; 8192]);
}
