//! fio's `nbd` engine (libnbd underneath) runs a queue-depth-16 random read/write job and
//! verifies every block it wrote with CRC32C.

mod common;

use common::*;

#[test]
fn fio_randrw_with_crc32c_verify_passes() {
    let (server, backend) = serve_one("fio", 64 * MIB);
    let uri = format!("--uri={}", server.uri("fio"));
    let out = tool_ok(
        "fio",
        &[
            "--name=nbd-randrw",
            "--ioengine=nbd",
            &uri,
            "--rw=randrw",
            "--bs=4k",
            "--size=16M",
            "--iodepth=16",
            "--verify=crc32c",
            "--verify_state_save=0",
            "--do_verify=1",
            "--verify_fatal=1",
            "--randseed=7",
            "--output-format=json",
        ],
    );
    let report = json(&out);
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "fio reported an error: {job}");
    let written = job["write"]["io_bytes"].as_u64().expect("write bytes");
    let read = job["read"]["io_bytes"].as_u64().expect("read bytes");
    assert!(written >= 4 * MIB, "fio wrote only {written} bytes");
    assert!(read >= written, "fio read {read} bytes, less than it wrote and verified");
    let stats = server.stats.snapshot();
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert!(stats.bytes_written >= written);
    assert!(backend.allocated_bytes() >= written.min(16 * MIB) / 2);
}
