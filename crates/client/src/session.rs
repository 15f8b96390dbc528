//! This client's session with the metadata service: who it is (`Hello`, repeated every
//! `LOCK_RENEW` while it runs, so the management API can list it) and its goodbye. Its id is
//! the one its byte-range locks and its opens carry. A node's own client also ends, every
//! `LOCK_RENEW`, the sessions of clients gone silent, and removes the chunks of the unlinked
//! files only they still had open (`ExpireClients`).

use std::sync::{Arc, Weak};

use stria_proto::wire::{ClientInfo, ClientSession, LOCK_RENEW, MetaReply, MetaRequest, Released};

use crate::purge::Purger;
use crate::transport::MetaConn;
use crate::{Client, FsResult, unexpected};

/// One `ExpireClients`: the purged files' chunks go to the purge queue. How many files it
/// purged.
async fn expire_once(meta: &MetaConn, purger: &Purger) -> FsResult<usize> {
    let (epoch, reply) = meta.call_at(MetaRequest::ExpireClients).await?;
    let MetaReply::Expired(purged) = reply else { return Err(unexpected(&reply)) };
    let count = purged.len();
    for Released { ino, layout } in purged {
        if let Some(layout) = layout {
            purger.push(ino, layout, epoch);
        }
    }
    Ok(count)
}

async fn keep_expiring(meta: Weak<MetaConn>, purger: Weak<Purger>) {
    loop {
        tokio::time::sleep(LOCK_RENEW).await;
        let (Some(meta), Some(purger)) = (meta.upgrade(), purger.upgrade()) else { return };
        match expire_once(&meta, &purger).await {
            Ok(0) => {}
            Ok(files) => {
                tracing::info!(files, "purged unlinked files that only ended clients had open")
            }
            Err(e) => tracing::warn!(%e, "ending the sessions of silent clients"),
        }
    }
}

async fn keep_saying_hello(meta: Weak<MetaConn>, client: u64, info: ClientInfo) {
    loop {
        tokio::time::sleep(LOCK_RENEW).await;
        let Some(meta) = meta.upgrade() else { return };
        let hello = MetaRequest::Hello { client, info: info.clone() };
        if let Err(e) = meta.call(hello).await {
            tracing::warn!(%e, "telling the metadata service this client is alive");
        }
    }
}

impl Client {
    /// Tells the metadata service who this client is, now and every `LOCK_RENEW` until the
    /// client is dropped; it lists the client meanwhile (`Client::sessions`).
    /// A first hello that fails is reported, and the later ones are still made.
    pub fn announce(&self, info: ClientInfo) -> FsResult<()> {
        let client = self.inner.locks.id();
        let meta = Arc::downgrade(&self.inner.meta);
        let task = self.inner.runtime.spawn(keep_saying_hello(meta, client, info.clone()));
        let previous = self.hello_task().replace(task.abort_handle());
        if let Some(previous) = previous {
            previous.abort();
        }
        self.meta(MetaRequest::Hello { client, info }).map(|_| ())
    }

    /// Tells the metadata service this client stops (and says hello no more).
    pub fn goodbye(&self) -> FsResult<()> {
        if let Some(task) = self.hello_task().take() {
            task.abort();
        }
        self.meta(MetaRequest::Goodbye { client: self.inner.locks.id() }).map(|_| ())
    }

    fn hello_task(&self) -> std::sync::MutexGuard<'_, Option<tokio::task::AbortHandle>> {
        self.inner.locks.hello.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the sessions of clients gone silent for a lease, now and every `LOCK_RENEW` until
    /// this client is dropped: the files they still had open count as closed, and the
    /// unlinked ones among them lose their chunks. For a node's own client (one per node).
    pub fn start_expiring_clients(&self) {
        let meta = Arc::downgrade(&self.inner.meta);
        let purger = Arc::downgrade(&self.inner.purger);
        self.inner.runtime.spawn(keep_expiring(meta, purger));
    }

    /// One round of [`Client::start_expiring_clients`]: how many files it purged.
    pub fn expire_clients(&self) -> FsResult<usize> {
        self.block(expire_once(&self.inner.meta, &self.inner.purger))
    }

    /// The clients the metadata service heard from lately.
    pub fn sessions(&self) -> FsResult<Vec<ClientSession>> {
        match self.meta(MetaRequest::ListClients)? {
            MetaReply::Clients(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }
}
