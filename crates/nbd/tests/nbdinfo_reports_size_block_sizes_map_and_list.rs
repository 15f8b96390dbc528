//! libnbd's nbdinfo sees the export's size, block-size constraints and flags, an exact
//! allocation map after writes, and the export list.

mod common;

use std::sync::Arc;

use common::*;
use stria_nbd::{Backend, Export, Exports, MemBackend, ServerConfig};

#[test]
fn nbdinfo_json_reports_size_block_sizes_and_flags() {
    let (server, _backend) = serve_one("disk", 64 * MIB);
    let info = json(&tool_ok("nbdinfo", &["--json", &server.uri("disk")]));
    assert_eq!(info["protocol"], "newstyle-fixed");
    assert_eq!(info["TLS"], false);
    assert_eq!(info["structured"], true);
    let export = &info["exports"][0];
    assert_eq!(export["export-name"], "disk");
    assert_eq!(export["export-size"], 64 * MIB);
    assert_eq!(export["description"], format!("{} bytes in memory", 64 * MIB));
    assert_eq!(export["block_size_minimum"], 512);
    assert_eq!(export["block_size_preferred"], 4096);
    assert_eq!(export["block_size_maximum"], 32 * MIB);
    assert_eq!(export["is_read_only"], false);
    assert_eq!(export["can_flush"], true);
    assert_eq!(export["can_fua"], true);
    assert_eq!(export["can_trim"], true);
    assert_eq!(export["can_zero"], true);
    assert_eq!(export["can_df"], true);
    assert_eq!(export["can_multi_conn"], true);
    assert_eq!(export["contexts"][0], "base:allocation");
    let opens = server.exports.stats("disk").expect("stats").opens();
    assert!(opens >= 1, "the export was opened {opens} times");
}

#[test]
fn multi_conn_follows_the_backend_and_read_only_the_export() {
    let exports = Exports::new();
    let local = Arc::new(MemBackend::new(MIB).with_local_flush());
    exports
        .insert(
            "local",
            Export {
                backend: local,
                description: String::new(),
                read_only: true,
                acl: loopback_acl(),
            },
        )
        .expect("insert");
    let server = TestServer::start(exports, ServerConfig::default());
    let info = json(&tool_ok("nbdinfo", &["--json", &server.uri("local")]));
    let export = &info["exports"][0];
    assert_eq!(export["can_multi_conn"], false);
    assert_eq!(export["is_read_only"], true);
}

#[test]
fn nbdinfo_map_shows_written_data_and_holes() {
    let (server, backend) = serve_one("disk", 16 * MIB);
    backend.write(MIB, &pseudo_random(64 * 1024, 1), false).expect("write");
    backend.write(8 * MIB, &pseudo_random(4096, 2), false).expect("write");
    backend.write_zeroes(12 * MIB, 8192, false, false).expect("provision zeroes");
    let map = json(&tool_ok("nbdinfo", &["--map", "--json", &server.uri("disk")]));
    let runs: Vec<(u64, u64, String)> = map
        .as_array()
        .expect("array")
        .iter()
        .map(|e| {
            (
                e["offset"].as_u64().expect("offset"),
                e["length"].as_u64().expect("length"),
                e["description"].as_str().expect("description").to_string(),
            )
        })
        .collect();
    let hole = "hole,zero".to_string();
    assert_eq!(
        runs,
        vec![
            (0, MIB, hole.clone()),
            (MIB, 65536, "data".into()),
            (MIB + 65536, 7 * MIB - 65536, hole.clone()),
            (8 * MIB, 4096, "data".into()),
            (8 * MIB + 4096, 4 * MIB - 4096, hole.clone()),
            (12 * MIB, 8192, "zero".into()),
            (12 * MIB + 8192, 4 * MIB - 8192, hole),
        ]
    );
}

#[test]
fn nbdinfo_list_shows_every_usable_export_with_its_description() {
    let exports = Exports::new();
    for name in ["alpha", "beta"] {
        let (_, mut export) = mem_export(MIB);
        export.description = format!("the {name} disk");
        exports.insert(name, export).expect("insert");
    }
    let server = TestServer::start(exports, ServerConfig::default());
    let list = json(&tool_ok("nbdinfo", &["--list", "--json", &format!("nbd://{}", server.addr)]));
    let mut seen: Vec<(String, String)> = list["exports"]
        .as_array()
        .expect("exports")
        .iter()
        .map(|e| {
            (
                e["export-name"].as_str().expect("name").into(),
                e["description"].as_str().expect("desc").into(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![("alpha".into(), "the alpha disk".into()), ("beta".into(), "the beta disk".into())]
    );
}
