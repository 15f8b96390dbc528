//! The metadata service on the wire: decodes [`MetaRequest`]s, runs them on the blocking pool
//! and encodes [`MetaReply`]s; errors travel as `FsStatus` RPC codes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stria_proto::fs::{FsStatus, Ino};
use stria_proto::wire::{self, MetaReply, MetaRequest, meta_method};
use stria_rpc::{BoxFuture, Request, Response, Service};

use crate::changes::ChangeLog;
use crate::{Attr, InlineWrite, Meta, MetaError, NodeKind, Purge, RenameFlags, XattrFlags};

/// Where the byte capacity `statfs` reports comes from (the storage targets).
pub type CapacitySource = Arc<dyn Fn() -> (u64, u64) + Send + Sync>;

const _: () = assert!(wire::ANALYTICS_TOP_MAX as usize <= crate::ANALYTICS_TOP_MAX);

fn wire_usage(usage: crate::Usage) -> wire::UsageCount {
    wire::UsageCount { files: usage.files, bytes: usage.bytes }
}

fn wire_analytics(a: crate::Analytics) -> wire::Analytics {
    let ids = |list: Vec<(u32, crate::Usage)>| {
        list.into_iter().map(|(id, u)| wire::IdUsage { id, usage: wire_usage(u) }).collect()
    };
    wire::Analytics {
        total: wire_usage(a.total),
        users: ids(a.users),
        groups: ids(a.groups),
        filesets: a
            .filesets
            .into_iter()
            .map(|f| wire::FilesetUsage { ino: f.ino, name: f.name, usage: wire_usage(f.usage) })
            .collect(),
        extensions: a
            .extensions
            .into_iter()
            .map(|(extension, u)| wire::ExtensionUsage { extension, usage: wire_usage(u) })
            .collect(),
        size_histogram: a.size_histogram.into_iter().map(wire_usage).collect(),
        size_class_bounds_bytes: crate::SIZE_CLASS_BOUNDS.to_vec(),
    }
}

/// Requests served, by operation (`MetaRequest::op_name`), since the service started.
#[derive(Debug, Default)]
pub struct OpCounts(std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>);

impl OpCounts {
    fn count(&self, op: &'static str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()).entry(op).or_default() += 1;
    }

    /// Every operation seen so far with its count, by name.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (*k, *v)).collect()
    }
}

fn lock_error(status: FsStatus) -> MetaError {
    MetaError::Fs { status, context: "byte-range lock or client session" }
}

/// The metadata service: a [`Meta`] behind the RPC [`Service`] interface.
#[derive(Clone)]
pub struct MetaService {
    meta: Arc<Meta>,
    capacity: CapacitySource,
    ops: Arc<OpCounts>,
    /// The incarnation of the namespace's durable state (see [`wire::Epoch`]).
    epoch: wire::Epoch,
    /// This run of the service (see [`wire::Instance`]).
    instance: wire::Instance,
    /// What the namespace's recent changes were, for mounts to drop what they cached.
    changes: Arc<ChangeLog>,
}

impl std::fmt::Debug for MetaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaService").field("meta", &self.meta).finish_non_exhaustive()
    }
}

impl MetaService {
    /// The per-operation request counters (shared by every clone of the service).
    pub fn op_counts(&self) -> Arc<OpCounts> {
        self.ops.clone()
    }

    pub fn new(meta: Arc<Meta>, capacity: CapacitySource) -> MetaService {
        let (epoch, instance) = (wire::new_epoch(), wire::new_epoch());
        MetaService {
            meta,
            capacity,
            ops: Arc::default(),
            epoch,
            instance,
            changes: Arc::default(),
        }
    }

    /// Serves under `epoch` instead of a fresh one: the one a clean stop handed over.
    pub fn with_epoch(mut self, epoch: wire::Epoch) -> MetaService {
        self.epoch = epoch;
        self
    }

    /// The log of changes mounts watch; closing it ends their waiting requests (a stop).
    pub fn change_log(&self) -> Arc<ChangeLog> {
        self.changes.clone()
    }

    /// The epoch every reply carries.
    pub fn epoch(&self) -> wire::Epoch {
        self.epoch
    }

    /// Runs one request to completion (synchronously).
    pub fn handle(&self, request: MetaRequest) -> Result<MetaReply, FsStatus> {
        self.handle_noting(request, &mut Vec::new())
    }

    /// [`MetaService::handle`], adding to `changes` what the request changed beyond what it
    /// names (the inode an unlink or a replacing rename took a link from).
    fn handle_noting(
        &self,
        request: MetaRequest,
        changes: &mut Vec<wire::Change>,
    ) -> Result<MetaReply, FsStatus> {
        let op = request.op_name();
        tracing::trace!(op, "metadata request");
        self.ops.count(op);
        let parent = request.parent_changed();
        let reply = self.dispatch(request, changes).map(|reply| self.with_parent(reply, parent));
        reply.map_err(|error| {
            let status = error.status();
            if status == FsStatus::Io {
                tracing::error!(op, %error, "metadata request failed");
            }
            status
        })
    }

    fn dispatch(
        &self,
        request: MetaRequest,
        changes: &mut Vec<wire::Change>,
    ) -> Result<MetaReply, MetaError> {
        let meta = &self.meta;
        Ok(match request {
            MetaRequest::Lookup { caller, parent, name } => {
                self.attr(meta.lookup(parent, &name, &caller)?)?
            }
            MetaRequest::GetAttr { ino } => self.attr(meta.getattr(ino)?)?,
            MetaRequest::SetAttr { caller, ino, set } => {
                let outcome = meta.setattr(ino, &caller, &set)?;
                MetaReply::SetAttr {
                    attr: self.wire_attr(outcome.attr),
                    old_size: outcome.old_size,
                }
            }
            MetaRequest::Create {
                caller,
                parent,
                name,
                kind,
                mode,
                rdev,
                exclusive,
                open,
                client,
            } => {
                let node = match kind {
                    wire::FileKind::File => NodeKind::File,
                    wire::FileKind::Fifo => NodeKind::Fifo,
                    wire::FileKind::Socket => NodeKind::Socket,
                    wire::FileKind::CharDevice => NodeKind::CharDevice { rdev },
                    wire::FileKind::BlockDevice => NodeKind::BlockDevice { rdev },
                    wire::FileKind::Dir | wire::FileKind::Symlink => {
                        return Err(MetaError::Fs {
                            status: FsStatus::Invalid,
                            context: "create of a directory or symlink",
                        });
                    }
                };
                if let Some(mask) = open {
                    let (attr, created) = meta
                        .create_open(parent, &name, node, mode, &caller, exclusive, mask, client)?;
                    MetaReply::Open { attr: self.wire_attr(attr), inline: None, created }
                } else {
                    let attr = match meta.mknod(parent, &name, node, mode, &caller) {
                        Ok(attr) => attr,
                        // O_CREAT without O_EXCL takes what is there.
                        Err(MetaError::Fs { status: FsStatus::Exists, .. }) if !exclusive => {
                            meta.lookup(parent, &name, &caller)?
                        }
                        Err(error) => return Err(error),
                    };
                    self.attr(attr)?
                }
            }
            MetaRequest::Mkdir { caller, parent, name, mode } => {
                self.attr(meta.mkdir(parent, &name, mode, &caller)?)?
            }
            MetaRequest::Symlink { caller, parent, name, target } => {
                self.attr(meta.symlink(parent, &name, &target, &caller)?)?
            }
            MetaRequest::Link { caller, ino, new_parent, new_name } => {
                self.attr(meta.link(ino, new_parent, &new_name, &caller)?)?
            }
            MetaRequest::Unlink { caller, parent, name } => {
                let unlinked = meta.unlink(parent, &name, &caller)?;
                changes.push(wire::Change::Attr { ino: unlinked.ino });
                MetaReply::Released(unlinked.purge.map(released))
            }
            MetaRequest::Rmdir { caller, parent, name } => {
                meta.rmdir(parent, &name, &caller)?;
                MetaReply::Released(None)
            }
            MetaRequest::Rename { caller, parent, name, new_parent, new_name, flags } => {
                let flags = RenameFlags { noreplace: flags.no_replace, exchange: flags.exchange };
                let replaced = meta.rename(parent, &name, new_parent, &new_name, flags, &caller)?;
                if let Some(replaced) = &replaced {
                    changes.push(wire::Change::Attr { ino: replaced.ino });
                }
                MetaReply::Released(replaced.and_then(|u| u.purge).map(released))
            }
            MetaRequest::Readlink { ino } => MetaReply::Bytes(meta.readlink(ino)?),
            // Run in process (no connection to leave out, no waiting): every change so far.
            MetaRequest::WatchChanges { after, .. } => {
                let nobody = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
                MetaReply::Changes(self.changes.since(after, nobody))
            }
            MetaRequest::Readdir { caller, ino, cookie, max_entries } => {
                let entries = meta.readdir(ino, cookie, max_entries as usize, &caller)?;
                MetaReply::Entries(entries)
            }
            MetaRequest::Access { caller, ino, mask } => {
                meta.access(ino, &caller, mask)?;
                MetaReply::Done
            }
            MetaRequest::Open { caller, ino, mask, client } => {
                if mask != 0 {
                    meta.access(ino, &caller, mask)?;
                }
                meta.open_file(ino, client)?;
                let attr = match meta.getattr(ino) {
                    Ok(attr) => self.wire_attr(attr),
                    Err(error) => {
                        let _ = meta.release(ino, client);
                        return Err(error);
                    }
                };
                // A small file's bytes come with the open, so reading it costs no request.
                let inline = if attr.kind == wire::FileKind::File && attr.layout.is_none() {
                    meta.read_inline(ino, 0, attr.size as usize).ok().flatten()
                } else {
                    None
                };
                MetaReply::Open { attr, inline, created: false }
            }
            MetaRequest::Release { ino, client } => {
                MetaReply::Released(meta.release(ino, client)?.map(released))
            }
            MetaRequest::ReadInline { ino } => {
                let attr = meta.getattr(ino)?;
                let bytes = meta.read_inline(ino, 0, attr.size as usize)?;
                MetaReply::Bytes(bytes.unwrap_or_default())
            }
            MetaRequest::WriteInline { ino, offset, data } => {
                match meta.write_inline(ino, offset, &data)? {
                    InlineWrite::Written { .. } => self.attr(meta.getattr(ino)?)?,
                    InlineWrite::MustSpill | InlineWrite::Chunked => {
                        return Err(MetaError::Fs {
                            status: FsStatus::TooBig,
                            context: "inline write beyond the inline limit",
                        });
                    }
                }
            }
            MetaRequest::Spill { ino } => self.spill(ino, None)?,
            MetaRequest::SpillSized { ino, size, mtime } => self.spill(ino, Some((size, mtime)))?,
            MetaRequest::SpillCommit { ino, layout, version } => {
                let plan = crate::SpillPlan { ino, bytes: Vec::new(), layout, version };
                meta.spill_commit(&plan)?;
                self.attr(meta.getattr(ino)?)?
            }
            MetaRequest::GetLock { ino, owner, range, kind } => {
                meta.getattr(ino)?;
                let holder = meta.locks().test(ino, owner, range, kind);
                MetaReply::Lock(holder.map_err(lock_error)?)
            }
            MetaRequest::SetLock { ino, owner, pid, range, kind, wait } => {
                if kind != wire::LockKind::Unlock {
                    meta.getattr(ino)?;
                    if meta.in_grace() {
                        // A lock yet to be reclaimed may cover the range.
                        return Err(lock_error(FsStatus::Grace));
                    }
                }
                meta.locks().set_or_wait(ino, owner, pid, range, kind, wait).map_err(lock_error)?;
                MetaReply::Done
            }
            MetaRequest::ReleaseLocks { ino, owner } => {
                meta.locks().release_owner(ino, owner);
                MetaReply::Done
            }
            MetaRequest::RenewLocks { client } => {
                // During the grace period a client without a lease is one that has yet to
                // reclaim, not one whose locks were dropped.
                if !meta.locks().renew(client) && !meta.in_grace() {
                    // The client's locks were dropped: it is told so (`Stale`).
                    return Err(lock_error(FsStatus::Stale));
                }
                MetaReply::Done
            }
            MetaRequest::Hello { client, info } => {
                meta.sessions().hello(client, info).map_err(lock_error)?;
                MetaReply::Done
            }
            MetaRequest::Goodbye { client } => {
                // Its handles are closed by now; any left count as closed.
                meta.sessions().goodbye(client);
                meta.drop_client(client);
                MetaReply::Done
            }
            MetaRequest::Reclaim { client, first, opens, locks } => {
                if opens.len() > wire::RECLAIM_PIECE_MAX || locks.len() > wire::RECLAIM_PIECE_MAX {
                    return Err(lock_error(FsStatus::Invalid));
                }
                let loss = meta.reclaim(client, first, &opens, &locks)?;
                MetaReply::Reclaimed { opens_lost: loss.opens, locks_lost: loss.locks }
            }
            MetaRequest::ListClients => MetaReply::Clients(meta.sessions().list()),
            MetaRequest::ExpireClients => {
                MetaReply::Expired(meta.expire_clients()?.into_iter().map(released).collect())
            }
            MetaRequest::ExtendSize { ino, size, mtime } => {
                let (_, (size_before, mtime_before)) = meta.extend_size_from(ino, size, mtime)?;
                MetaReply::Extended { size_before, mtime_before }
            }
            MetaRequest::GetXattr { caller, ino, name } => {
                MetaReply::Bytes(meta.getxattr(ino, &name, &caller)?)
            }
            MetaRequest::SetXattr { caller, ino, name, value, mode } => {
                let flags = match mode {
                    wire::XattrSetMode::Any => XattrFlags::Any,
                    wire::XattrSetMode::Create => XattrFlags::Create,
                    wire::XattrSetMode::Replace => XattrFlags::Replace,
                };
                meta.setxattr(ino, &name, &value, flags, &caller)?;
                MetaReply::Done
            }
            MetaRequest::ListXattr { caller, ino } => {
                MetaReply::Names(meta.listxattr(ino, &caller)?)
            }
            MetaRequest::RemoveXattr { caller, ino, name } => {
                meta.removexattr(ino, &name, &caller)?;
                MetaReply::Done
            }
            MetaRequest::DropPrivileges { ino, suidgid } => {
                let (attr, dropped) = meta.drop_privileges(ino, suidgid)?;
                if dropped {
                    changes.push(wire::Change::Attr { ino });
                }
                MetaReply::Dropped { attr: self.wire_attr(attr), dropped }
            }
            MetaRequest::StatFs => {
                let (total, free) = (self.capacity)();
                let s = meta.statfs(total, free)?;
                MetaReply::StatFs(wire::StatFs {
                    bytes_total: s.bytes_total,
                    bytes_free: s.bytes_free,
                    files_total: s.inodes_total,
                    files_used: s.inodes_used,
                })
            }
            MetaRequest::SetFileLayout { caller, ino, policy } => {
                let layout = meta.choose_layout(&policy)?;
                meta.set_file_layout(ino, &layout, &caller)?;
                MetaReply::Done
            }
            MetaRequest::GetLayoutPolicy { ino } => MetaReply::Policy(meta.layout_policy(ino)?),
            MetaRequest::SetLayoutPolicy { caller, ino, policy } => {
                meta.set_layout_policy(ino, &policy, &caller)?;
                MetaReply::Done
            }
            MetaRequest::Sync => {
                meta.sync()?;
                MetaReply::Done
            }
            MetaRequest::Analytics { top } => {
                if top > wire::ANALYTICS_TOP_MAX {
                    return Err(crate::error::fs(FsStatus::Invalid, "analytics top over 100"));
                }
                MetaReply::Analytics(wire_analytics(meta.analytics(top as usize)?))
            }
        })
    }

    /// `Spill` and `SpillSized` ([`Meta::spill`]): a chunked file answers its attributes; an
    /// inline file with bytes gets the plan (the client writes them, then `SpillCommit`); an
    /// empty one has nothing to carry over, so it switches at once (taking `sized`'s size and
    /// mtime too), which saves the client a round trip. If a concurrent spill won the race,
    /// the file is chunked all the same.
    fn spill(
        &self,
        ino: Ino,
        sized: Option<(u64, wire::Timestamp)>,
    ) -> Result<MetaReply, MetaError> {
        match self.meta.spill(ino, sized)? {
            crate::Spilled::Chunked(attr) => self.attr(attr),
            crate::Spilled::Plan(plan) => Ok(MetaReply::Spilled {
                layout: plan.layout,
                data: plan.bytes,
                version: plan.version,
            }),
        }
    }

    /// A change of a directory's entries answers with the directory's attributes too (read
    /// just after the change): the kernel asks for them before the next change in it, and the
    /// client answers that from what came here.
    fn with_parent(&self, reply: MetaReply, parent: Option<Ino>) -> MetaReply {
        match parent.map(|dir| self.meta.getattr(dir)) {
            Some(Ok(dir)) => {
                MetaReply::WithParent { reply: Box::new(reply), parent: self.wire_attr(dir) }
            }
            _ => reply,
        }
    }

    fn attr(&self, attr: Attr) -> Result<MetaReply, MetaError> {
        Ok(MetaReply::Attr(self.wire_attr(attr)))
    }

    /// The wire form of an inode's attributes.
    fn wire_attr(&self, attr: Attr) -> wire::Attr {
        wire::Attr {
            ino: attr.ino,
            kind: attr.kind,
            perm: attr.mode as u16,
            nlink: attr.nlink,
            uid: attr.uid,
            gid: attr.gid,
            size: attr.size,
            rdev: attr.rdev,
            atime: attr.atime,
            mtime: attr.mtime,
            ctime: attr.ctime,
            crtime: attr.ctime,
            layout: attr.layout,
        }
    }
}

impl Service for MetaService {
    fn call(&self, request: Request) -> BoxFuture<'static, Response> {
        let service = self.clone();
        Box::pin(async move {
            if request.method != meta_method::CALL {
                return Response::error(stria_rpc::status::UNKNOWN_METHOD, "not a meta method");
            }
            let decoded: MetaRequest = match request.decode() {
                Ok(decoded) => decoded,
                Err(response) => return response,
            };
            let (epoch, instance) = (service.epoch, service.instance);
            if let MetaRequest::WatchChanges { after, wait_ms } = decoded {
                service.ops.count(decoded.op_name());
                // Answered a little before the caller's deadline, so an idle wait ends with
                // an empty batch rather than a timeout.
                let until_deadline =
                    request.deadline.saturating_duration_since(tokio::time::Instant::now());
                let wait = Duration::from_millis(wait_ms.min(wire::CHANGES_WAIT_MAX_MS).into())
                    .min(until_deadline.mul_f64(0.8));
                let batch = service.changes.wait(after, request.peer, wait).await;
                let reply = MetaReply::Changes(batch);
                return Response::encode(&(epoch, reply, instance), Bytes::new());
            }
            let mut changes = decoded.namespace_changes();
            let origin = request.peer;
            // Reads are short snapshot lookups, and with lazy commits a mutation is a short
            // transaction that rarely touches the disk (one commit in LAZY_COMMITS_PER_SYNC is
            // durable): run them here rather than pay two thread hand-offs to the blocking
            // pool (1.4x creates and removes, measured side by side). A sync, and any
            // mutation under durable commits, waits on the disk: blocking pool.
            let inline = decoded.is_read_only()
                || (service.meta.commit_mode() == crate::Commit::Lazy
                    && !matches!(decoded, MetaRequest::Sync));
            if inline {
                return match service.handle_noting(decoded, &mut changes) {
                    Ok(reply) => {
                        service.changes.record(origin, changes);
                        Response::encode(&(epoch, reply, instance), Bytes::new())
                    }
                    Err(status) => Response::fs_error(status),
                };
            }
            // Recorded on the blocking thread: a caller that stops waiting does not stop the
            // change, and must not stop its notice either.
            let work = move || {
                let reply = service.handle_noting(decoded, &mut changes);
                if reply.is_ok() {
                    service.changes.record(origin, changes);
                }
                reply
            };
            match tokio::task::spawn_blocking(work).await {
                Ok(Ok(reply)) => Response::encode(&(epoch, reply, instance), Bytes::new()),
                Ok(Err(status)) => Response::fs_error(status),
                Err(_) => Response::error(stria_rpc::status::INTERNAL, "metadata handler panicked"),
            }
        })
    }
}

fn released(purge: Purge) -> wire::Released {
    wire::Released { ino: purge.ino, layout: purge.layout }
}
