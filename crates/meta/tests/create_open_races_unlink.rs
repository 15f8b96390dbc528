//! open(O_CREAT) racing an unlink of the same name by another client: the inode the create made
//! (or found) may go before the open is counted; the create then starts over, and never fails
//! with ENOENT, which POSIX does not allow open(O_CREAT) to return.

mod common;

use std::sync::Arc;

use common::*;
use stria_meta::service::MetaService;
use stria_proto::fs::{FsStatus, ROOT_INO};
use stria_proto::wire::{FileKind, MetaReply, MetaRequest};

#[test]
fn create_with_open_never_fails_with_enoent_under_unlinks() {
    let service = MetaService::new(Arc::new(meta()), Arc::new(|| (1 << 40, 1 << 40)));
    let name = b"contended".to_vec();
    let create = MetaRequest::Create {
        caller: alice(),
        parent: ROOT_INO,
        name: name.clone(),
        kind: FileKind::File,
        mode: 0o644,
        rdev: 0,
        exclusive: false,
        open: Some(2),
        client: 7,
    };
    let unlink = MetaRequest::Unlink { caller: alice(), parent: ROOT_INO, name };
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = service.handle(unlink.clone());
            }
        });
        // Stops the unlinker however this thread leaves the loop, a panic included: the scope
        // waits for it, so a failed round that left it running hung the test instead of
        // failing it.
        let _stop = StopOnDrop(&stop);
        for round in 0..20_000 {
            // A change to a directory's entries answers with the directory's attributes too.
            let reply = service.handle(create.clone()).map(|reply| match reply {
                MetaReply::WithParent { reply, .. } => *reply,
                other => other,
            });
            match reply {
                Ok(MetaReply::Open { attr, .. }) => {
                    service
                        .handle(MetaRequest::Release { ino: attr.ino, client: 7 })
                        .expect("release");
                }
                Ok(other) => panic!("round {round}: {other:?}"),
                Err(status) => {
                    assert_ne!(
                        status,
                        FsStatus::NotFound,
                        "round {round}: open(O_CREAT) said ENOENT"
                    );
                    panic!("round {round}: {status:?}");
                }
            }
        }
    });
}

struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
