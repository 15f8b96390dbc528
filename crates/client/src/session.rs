//! This client's session with the metadata service: who it is (`Hello`, repeated every
//! `LOCK_RENEW` while it runs, so the management API can list it) and its goodbye. Its id is
//! the one its byte-range locks carry.

use std::sync::{Arc, Weak};

use stria_proto::wire::{ClientInfo, ClientSession, LOCK_RENEW, MetaReply, MetaRequest};

use crate::transport::MetaConn;
use crate::{Client, FsResult, unexpected};

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

    /// The clients the metadata service heard from lately.
    pub fn sessions(&self) -> FsResult<Vec<ClientSession>> {
        match self.meta(MetaRequest::ListClients)? {
            MetaReply::Clients(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }
}
