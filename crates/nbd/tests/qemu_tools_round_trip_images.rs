//! qemu-img and qemu-io, the clients virtual machines use, read and write exports correctly:
//! a sparse image copied in and back out is byte-identical, patterns verify, discards
//! become holes.

mod common;

use common::*;
use stria_nbd::{Backend, Exports, ServerConfig};

/// A 32 MiB image: random data in five 1 MiB runs and one 12 KiB run, zeroes elsewhere.
fn sparse_image(dir: &TempDir) -> (std::path::PathBuf, Vec<u8>) {
    let mut image = vec![0u8; 32 * MIB as usize];
    for (i, mib) in [0usize, 5, 9, 20, 31].into_iter().enumerate() {
        let at = mib * MIB as usize;
        image[at..at + MIB as usize].copy_from_slice(&pseudo_random(MIB as usize, i as u64 + 10));
    }
    image[12_288_000..12_288_000 + 12_288].copy_from_slice(&pseudo_random(12_288, 99));
    let path = dir.join("source.img");
    std::fs::write(&path, &image).expect("write image");
    (path, image)
}

#[test]
fn qemu_img_info_reports_the_virtual_size() {
    let (server, _) = serve_one("vm", 48 * MIB);
    let info = json(&tool_ok("qemu-img", &["info", "--output=json", &server.uri("vm")]));
    assert_eq!(info["virtual-size"], 48 * MIB);
    assert_eq!(info["format"], "raw");
}

#[test]
fn qemu_img_convert_in_and_back_out_is_byte_identical() {
    let dir = TempDir::new("qemu-img");
    let (source, image) = sparse_image(&dir);
    let (server, backend) = serve_one("vm", 32 * MIB);
    let uri = server.uri("vm");
    tool_ok(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", source.to_str().expect("path"), &uri],
    );
    assert_eq!(read_backend(&backend, 0, image.len()), image, "export differs from the source");
    // Zero runs were not stored as data.
    let allocated = backend.allocated_bytes();
    assert!(allocated < 8 * MIB, "{allocated} bytes allocated for ~5 MiB of data");

    let back = dir.join("back.img");
    tool_ok("qemu-img", &["convert", "-f", "raw", "-O", "raw", &uri, back.to_str().expect("path")]);
    let copied = std::fs::read(&back).expect("read copy");
    assert!(copied == image, "image read back through NBD differs from the source");
    assert!(server.stats.snapshot().bytes_written >= 5 * MIB);
}

#[test]
fn qemu_io_patterns_verify_and_discard_makes_holes() {
    let (server, backend) = serve_one("vm", 16 * MIB);
    let uri = server.uri("vm");
    let out = tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0xab 0 64k",
            "-c",
            "read -P 0xab 0 64k",
            "-c",
            "write -P 0x5c 1M 128k",
            "-c",
            "read -P 0x5c 1M 128k",
            "-c",
            "discard 1M 64k",
            "-c",
            "flush",
        ],
    );
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert_eq!(read_backend(&backend, 0, 65536), vec![0xab; 65536]);
    assert_eq!(read_backend(&backend, MIB + 65536, 65536), vec![0x5c; 65536]);
    assert!(backend.flush_count() >= 1, "FLUSH reached the backend");
    let map = backend.block_status(MIB, 131072).expect("status");
    assert!(map[0].hole && map[0].length == 65536, "discarded range is a hole: {map:?}");

    // A wrong pattern must be caught, or the checks above prove nothing.
    let out = tool("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0xcd 0 64k"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Pattern verification failed"), "mismatch not detected: {text}");
}

#[test]
fn qemu_io_unaligned_io_is_read_modify_written_by_the_client() {
    // qemu honours the 512-byte minimum block size: an unaligned write becomes an aligned
    // read-modify-write, so neighbouring bytes survive.
    let exports = Exports::new();
    let (backend, export) = mem_export(MIB);
    exports.insert("vm", export).expect("insert");
    let server = TestServer::start(exports, ServerConfig::default());
    backend.write(0, &[0x11; 1024], false).expect("seed");
    tool_ok("qemu-io", &["-f", "raw", &server.uri("vm"), "-c", "write -P 0x22 100 10"]);
    let bytes = read_backend(&backend, 0, 1024);
    assert!(bytes[..100].iter().all(|&b| b == 0x11));
    assert!(bytes[100..110].iter().all(|&b| b == 0x22));
    assert!(bytes[110..].iter().all(|&b| b == 0x11));
}
