//! nbdcopy spreads a copy over four connections (the server advertises multi-conn; nbdcopy
//! opens at most one per thread, hence `--threads=4`), in both
//! directions, and the bytes survive exactly.

mod common;

use common::*;

#[test]
fn nbdcopy_with_four_connections_round_trips_an_image() {
    let dir = TempDir::new("nbdcopy");
    let mut image = pseudo_random(24 * MIB as usize, 3);
    // Leave zero runs so the copy also exercises block status and zeroing.
    image[4 * MIB as usize..10 * MIB as usize].fill(0);
    image[20 * MIB as usize..22 * MIB as usize].fill(0);
    let source = dir.join("source.img");
    std::fs::write(&source, &image).expect("write image");
    let (server, backend) = serve_one("disk", 24 * MIB);
    let uri = server.uri("disk");

    let before = server.stats.snapshot().connections_accepted;
    tool_ok("nbdcopy", &["--connections=4", "--threads=4", source.to_str().expect("path"), &uri]);
    assert_eq!(read_backend(&backend, 0, image.len()), image, "export differs after nbdcopy in");
    let after_in = server.stats.snapshot().connections_accepted;
    assert!(after_in - before >= 4, "nbdcopy used {} connections", after_in - before);

    let back = dir.join("back.img");
    tool_ok("nbdcopy", &["--connections=4", "--threads=4", &uri, back.to_str().expect("path")]);
    let copied = std::fs::read(&back).expect("read copy");
    assert!(copied == image, "image copied out differs from the source");
    let after_out = server.stats.snapshot().connections_accepted;
    assert!(after_out - after_in >= 4, "nbdcopy used {} connections", after_out - after_in);
    let stats = server.stats.snapshot();
    assert_eq!(stats.errors, 0, "{stats:?}");
}

#[test]
fn nbdcopy_zeroes_holes_larger_than_the_maximum_block_size() {
    // nbdcopy zeroes a whole hole with one WRITE_ZEROES, here ~250 MiB: more than the 32 MiB
    // maximum block size, and accepted because zeroing carries no payload.
    let dir = TempDir::new("nbdcopy-holes");
    let source = dir.join("sparse.img");
    let file = std::fs::File::create(&source).expect("create");
    file.set_len(256 * MIB).expect("size");
    drop(file);
    let head = pseudo_random(MIB as usize, 5);
    let tail = pseudo_random(MIB as usize, 6);
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&source).expect("open");
        file.write_all_at(&head, 0).expect("head");
        file.write_all_at(&tail, 255 * MIB).expect("tail");
    }
    let (server, backend) = serve_one("disk", 256 * MIB);
    // Garbage in the middle that the copy has to zero.
    stria_nbd::Backend::write(&*backend, 100 * MIB, &[0xff; 65536], false).expect("garbage");
    tool_ok("nbdcopy", &[source.to_str().expect("path"), &server.uri("disk")]);
    assert_eq!(read_backend(&backend, 0, MIB as usize), head);
    assert_eq!(read_backend(&backend, 255 * MIB, MIB as usize), tail);
    assert!(read_backend(&backend, 100 * MIB, 65536).iter().all(|&b| b == 0), "hole not zeroed");
    assert_eq!(server.stats.snapshot().errors, 0);
}
