//! Fixed-newstyle negotiation: greeting, option haggling, TLS upgrade, and the choice of an
//! export. Ends in transmission (`NBD_OPT_GO`, `NBD_OPT_EXPORT_NAME`) or a closed connection.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::acl::Peer;
use crate::export::{Export, ExportStats, Lookup};
use crate::server::{Shared, bump};
use crate::transport::Transport;
use crate::wire::*;

/// What a successful handshake hands to the transmission phase.
#[derive(Debug)]
pub(crate) struct Negotiated {
    pub transport: Transport,
    pub peer: SocketAddr,
    /// The initiator as the access list saw it, for checks after export changes.
    pub initiator: Peer,
    pub export_name: String,
    pub export: Arc<Export>,
    pub size: u64,
    pub structured: bool,
    /// `base:allocation` was selected for this export, so BLOCK_STATUS is allowed.
    pub block_status: bool,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("TLS handshake: {0}")]
    Tls(io::Error),
}

/// Negotiation state that `NBD_OPT_STARTTLS` resets.
#[derive(Debug, Default)]
struct State {
    structured: bool,
    /// The export named by the last `NBD_OPT_SET_META_CONTEXT`, and whether it selected
    /// `base:allocation`.
    meta: Option<(String, bool)>,
}

enum Next {
    Continue,
    Transmission(Box<Negotiated>),
    Close,
}

struct Conn<'a> {
    shared: &'a Shared,
    transport: Option<Transport>,
    peer_addr: SocketAddr,
    peer: Peer,
    no_zeroes: bool,
    state: State,
}

/// Runs the handshake; `Ok(None)` means the client (or shutdown) ended it cleanly.
pub(crate) async fn run(
    shared: &Shared,
    mut transport: Transport,
    peer_addr: SocketAddr,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Negotiated>, HandshakeError> {
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&NBD_MAGIC.to_be_bytes());
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    transport.write_all(&greeting).await?;
    transport.flush().await?;

    let client_flags = transport.read_u32().await?;
    if client_flags & !CLIENT_FLAGS_KNOWN != 0 {
        return Err(HandshakeError::Protocol(format!("unknown client flags {client_flags:#x}")));
    }
    // Non-fixed newstyle clients cannot receive option errors; refuse them outright.
    if client_flags & FLAG_C_FIXED_NEWSTYLE == 0 {
        return Err(HandshakeError::Protocol("client does not speak fixed newstyle".into()));
    }
    let mut conn = Conn {
        shared,
        transport: Some(transport),
        peer_addr,
        peer: Peer { addr: peer_addr.ip(), tls: false, identities: Vec::new() },
        no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
        state: State::default(),
    };
    for _ in 0..OPTIONS_PER_HANDSHAKE_MAX {
        let header = tokio::select! {
            header = conn.read_option_header() => header?,
            _ = shutdown.wait_for(|stop| *stop) => return Ok(None),
        };
        let stopping = *shutdown.borrow();
        match conn.option(header, stopping).await? {
            Next::Continue => {}
            Next::Transmission(negotiated) => return Ok(Some(*negotiated)),
            Next::Close => return Ok(None),
        }
    }
    Err(HandshakeError::Protocol(format!("more than {OPTIONS_PER_HANDSHAKE_MAX} options")))
}

impl Conn<'_> {
    fn io(&mut self) -> &mut Transport {
        self.transport.as_mut().expect("transport is only absent during the TLS upgrade")
    }

    async fn read_option_header(&mut self) -> Result<(u32, u32), HandshakeError> {
        let mut header = [0u8; OPTION_HEADER_BYTES];
        self.io().read_exact(&mut header).await?;
        let magic = u64::from_be_bytes(header[0..8].try_into().expect("8 bytes"));
        if magic != IHAVEOPT {
            return Err(HandshakeError::Protocol(format!("bad option magic {magic:#x}")));
        }
        let option = u32::from_be_bytes(header[8..12].try_into().expect("4 bytes"));
        let length = u32::from_be_bytes(header[12..16].try_into().expect("4 bytes"));
        Ok((option, length))
    }

    async fn reply(&mut self, option: u32, reply_type: u32, payload: &[u8]) -> io::Result<()> {
        let message = option_reply(option, reply_type, payload);
        self.io().write_all(&message).await?;
        self.io().flush().await
    }

    async fn reply_error(&mut self, option: u32, reply_type: u32, message: &str) -> io::Result<()> {
        self.reply(option, reply_type, truncate_utf8(message, STRING_BYTES_MAX).as_bytes()).await
    }

    async fn option(
        &mut self,
        (option, length): (u32, u32),
        stopping: bool,
    ) -> Result<Next, HandshakeError> {
        if length > OPTION_DATA_BYTES_HARD_MAX {
            // Reading or skipping this much would be the attack; say why and hang up.
            let message = format!("option data of {length} bytes is too large");
            self.reply_error(option, REP_ERR_TOO_BIG, &message).await?;
            return Err(HandshakeError::Protocol(message));
        }
        if length > OPTION_DATA_BYTES_MAX {
            let skipped =
                tokio::io::copy(&mut self.io().take(length as u64), &mut tokio::io::sink()).await?;
            if skipped != length as u64 {
                return Err(HandshakeError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            if option == OPT_EXPORT_NAME {
                return Err(HandshakeError::Protocol("oversized NBD_OPT_EXPORT_NAME".into()));
            }
            let message = format!("option data of {length} bytes exceeds {OPTION_DATA_BYTES_MAX}");
            self.reply_error(option, REP_ERR_TOO_BIG, &message).await?;
            return Ok(Next::Continue);
        }
        let mut data = vec![0u8; length as usize];
        self.io().read_exact(&mut data).await?;

        if option == OPT_ABORT {
            // The client may already have gone; a failed ACK changes nothing.
            let _ = self.reply(option, REP_ACK, &[]).await;
            let _ = self.io().shutdown().await;
            return Ok(Next::Close);
        }
        if stopping {
            if option == OPT_EXPORT_NAME {
                return Ok(Next::Close);
            }
            self.reply_error(option, REP_ERR_SHUTDOWN, "server is shutting down").await?;
            return Ok(Next::Continue);
        }
        if self.shared.tls_required && !self.peer.tls && option != OPT_STARTTLS {
            if option == OPT_EXPORT_NAME {
                // This option cannot carry an error; the protocol says to hang up.
                return Err(HandshakeError::Protocol(
                    "NBD_OPT_EXPORT_NAME before required TLS".into(),
                ));
            }
            self.reply_error(
                option,
                REP_ERR_TLS_REQD,
                "this server requires TLS (NBD_OPT_STARTTLS)",
            )
            .await?;
            return Ok(Next::Continue);
        }
        match option {
            OPT_EXPORT_NAME => self.export_name(&data).await,
            OPT_LIST => self.list(&data).await,
            OPT_STARTTLS => self.starttls(&data).await,
            OPT_INFO | OPT_GO => self.info_or_go(option, &data).await,
            OPT_STRUCTURED_REPLY => self.structured_reply(&data).await,
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta_context(option, &data).await,
            _ => {
                let message = format!("option {option} is not supported by this server");
                self.reply_error(option, REP_ERR_UNSUP, &message).await?;
                Ok(Next::Continue)
            }
        }
    }

    /// Looks an export up for this peer, counting and logging refusals.
    fn open(&self, name: &str) -> Result<(Arc<Export>, Arc<ExportStats>), Refusal> {
        match self.shared.exports.lookup(name, &self.peer) {
            Lookup::Allowed(export, stats) => Ok((export, stats)),
            Lookup::Missing => {
                debug!(peer = %self.peer_addr, export = name, "NBD client asked for an unknown export");
                Err(Refusal::Unknown)
            }
            Lookup::Refused { stats, needs_tls } => {
                stats.count_refusal();
                bump(&self.shared.stats.refusals, 1);
                warn!(
                    peer = %self.peer_addr,
                    export = name,
                    tls = self.peer.tls,
                    identities = ?self.peer.identities,
                    "NBD access refused by the export's access list"
                );
                if needs_tls && self.shared.tls.is_some() {
                    Err(Refusal::NeedsTls)
                } else {
                    Err(Refusal::Unknown)
                }
            }
        }
    }

    fn transmission_flags(&self, export: &Export) -> u16 {
        let mut flags = FLAG_HAS_FLAGS
            | FLAG_SEND_FLUSH
            | FLAG_SEND_FUA
            | FLAG_SEND_TRIM
            | FLAG_SEND_WRITE_ZEROES;
        if export.read_only {
            flags |= FLAG_READ_ONLY;
        }
        // DF is only meaningful (and only allowed) with structured replies; every read is
        // answered with one chunk anyway.
        if self.state.structured {
            flags |= FLAG_SEND_DF;
        }
        if export.backend.flush_is_global() {
            flags |= FLAG_CAN_MULTI_CONN;
        }
        flags
    }

    fn negotiated(
        &mut self,
        name: String,
        (export, stats): (Arc<Export>, Arc<ExportStats>),
    ) -> Next {
        stats.count_open();
        let size = export.backend.size();
        let block_status = self.state.structured
            && matches!(&self.state.meta, Some((meta_name, true)) if *meta_name == name);
        debug!(peer = %self.peer_addr, export = %name, tls = self.peer.tls, "NBD transmission starts");
        Next::Transmission(Box::new(Negotiated {
            transport: self.transport.take().expect("transport present"),
            peer: self.peer_addr,
            initiator: self.peer.clone(),
            export_name: name,
            export,
            size,
            structured: self.state.structured,
            block_status,
        }))
    }

    async fn export_name(&mut self, data: &[u8]) -> Result<Next, HandshakeError> {
        let name = parse_string(data)
            .map_err(|_| HandshakeError::Protocol("malformed NBD_OPT_EXPORT_NAME".into()))?;
        let opened = self
            .open(&name)
            .map_err(|_| HandshakeError::Protocol(format!("export '{name}' refused or unknown")))?;
        let export = &opened.0;
        let size = export.backend.size();
        let mut reply = Vec::with_capacity(8 + 2 + EXPORT_NAME_PADDING_BYTES);
        reply.extend_from_slice(&size.to_be_bytes());
        reply.extend_from_slice(&self.transmission_flags(export).to_be_bytes());
        if !self.no_zeroes {
            reply.extend_from_slice(&[0u8; EXPORT_NAME_PADDING_BYTES]);
        }
        self.io().write_all(&reply).await?;
        self.io().flush().await?;
        Ok(self.negotiated(name, opened))
    }

    async fn list(&mut self, data: &[u8]) -> Result<Next, HandshakeError> {
        if !data.is_empty() {
            self.reply_error(OPT_LIST, REP_ERR_INVALID, "NBD_OPT_LIST takes no data").await?;
            return Ok(Next::Continue);
        }
        for (name, description) in self.shared.exports.visible_to(&self.peer) {
            let mut payload = Vec::with_capacity(4 + name.len() + description.len());
            payload.extend_from_slice(&(name.len() as u32).to_be_bytes());
            payload.extend_from_slice(name.as_bytes());
            payload.extend_from_slice(description.as_bytes());
            self.reply(OPT_LIST, REP_SERVER, &payload).await?;
        }
        self.reply(OPT_LIST, REP_ACK, &[]).await?;
        Ok(Next::Continue)
    }

    async fn starttls(&mut self, data: &[u8]) -> Result<Next, HandshakeError> {
        let Some(acceptor) = self.shared.tls.clone() else {
            self.reply_error(OPT_STARTTLS, REP_ERR_POLICY, "TLS is not configured on this server")
                .await?;
            return Ok(Next::Continue);
        };
        if self.peer.tls {
            self.reply_error(OPT_STARTTLS, REP_ERR_INVALID, "TLS is already running").await?;
            return Ok(Next::Continue);
        }
        if !data.is_empty() {
            self.reply_error(OPT_STARTTLS, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data")
                .await?;
            return Ok(Next::Continue);
        }
        self.reply(OPT_STARTTLS, REP_ACK, &[]).await?;
        let Some(Transport::Plain(tcp)) = self.transport.take() else {
            return Err(HandshakeError::Protocol("TLS upgrade on a non-plain transport".into()));
        };
        let tls = acceptor.accept(tcp).await.map_err(HandshakeError::Tls)?;
        let identities = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| crate::tls::certificate_identities(leaf))
            .unwrap_or_default();
        debug!(peer = %self.peer_addr, ?identities, "NBD connection upgraded to TLS");
        self.transport = Some(Transport::Tls(Box::new(tls)));
        self.peer.tls = true;
        self.peer.identities = identities;
        // The protocol forbids carrying negotiation state across the upgrade.
        self.state = State::default();
        Ok(Next::Continue)
    }

    async fn info_or_go(&mut self, option: u32, data: &[u8]) -> Result<Next, HandshakeError> {
        let mut cursor = Cursor::new(data);
        let parsed = (|| {
            let name = cursor.string_u32()?;
            let count = cursor.u16()? as usize;
            let mut requests = Vec::with_capacity(count);
            for _ in 0..count {
                requests.push(cursor.u16()?);
            }
            if cursor.remaining() != 0 {
                return Err(Malformed);
            }
            Ok((name, requests))
        })();
        let Ok((name, requests)) = parsed else {
            self.reply_error(option, REP_ERR_INVALID, "malformed NBD_OPT_INFO/NBD_OPT_GO").await?;
            return Ok(Next::Continue);
        };
        let opened = match self.open(&name) {
            Ok(opened) => opened,
            Err(refusal) => {
                self.refuse(option, &name, refusal).await?;
                return Ok(Next::Continue);
            }
        };
        let export = &opened.0;
        let size = export.backend.size();
        let mut info = Vec::with_capacity(12);
        info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&size.to_be_bytes());
        info.extend_from_slice(&self.transmission_flags(export).to_be_bytes());
        self.reply(option, REP_INFO, &info).await?;
        if requests.contains(&INFO_NAME) {
            let mut info = INFO_NAME.to_be_bytes().to_vec();
            info.extend_from_slice(name.as_bytes());
            self.reply(option, REP_INFO, &info).await?;
        }
        if requests.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
            let mut info = INFO_DESCRIPTION.to_be_bytes().to_vec();
            info.extend_from_slice(export.description.as_bytes());
            self.reply(option, REP_INFO, &info).await?;
        }
        // Always sent: the server enforces non-default constraints (512-byte alignment), so a
        // client that understands the item should learn them even if it did not ask.
        let mut info = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        info.extend_from_slice(&BLOCK_SIZE_MIN_BYTES.to_be_bytes());
        info.extend_from_slice(&BLOCK_SIZE_PREFERRED_BYTES.to_be_bytes());
        info.extend_from_slice(&REQUEST_BYTES_MAX.to_be_bytes());
        self.reply(option, REP_INFO, &info).await?;
        self.reply(option, REP_ACK, &[]).await?;
        if option == OPT_GO {
            return Ok(self.negotiated(name, opened));
        }
        Ok(Next::Continue)
    }

    async fn refuse(&mut self, option: u32, name: &str, refusal: Refusal) -> io::Result<()> {
        match refusal {
            Refusal::NeedsTls => {
                let message = format!("export '{name}' requires TLS with a client certificate");
                self.reply_error(option, REP_ERR_TLS_REQD, &message).await
            }
            Refusal::Unknown => {
                let message = format!("export '{name}' is not available to this client");
                self.reply_error(option, REP_ERR_UNKNOWN, &message).await
            }
        }
    }

    async fn structured_reply(&mut self, data: &[u8]) -> Result<Next, HandshakeError> {
        if !data.is_empty() {
            self.reply_error(OPT_STRUCTURED_REPLY, REP_ERR_INVALID, "option takes no data").await?;
        } else if self.state.structured {
            self.reply_error(OPT_STRUCTURED_REPLY, REP_ERR_INVALID, "already negotiated").await?;
        } else {
            self.state.structured = true;
            self.reply(OPT_STRUCTURED_REPLY, REP_ACK, &[]).await?;
        }
        Ok(Next::Continue)
    }

    async fn meta_context(&mut self, option: u32, data: &[u8]) -> Result<Next, HandshakeError> {
        let setting = option == OPT_SET_META_CONTEXT;
        if setting {
            // A SET replaces the selection even when it fails.
            self.state.meta = None;
        }
        if !self.state.structured {
            let message = "metadata contexts need NBD_OPT_STRUCTURED_REPLY first";
            self.reply_error(option, REP_ERR_INVALID, message).await?;
            return Ok(Next::Continue);
        }
        let mut cursor = Cursor::new(data);
        let parsed = (|| {
            let name = cursor.string_u32()?;
            let count = cursor.u32()?;
            // Each query takes at least its 4-byte length, so the payload bounds the count.
            if count as usize > cursor.remaining() / 4 {
                return Err(Malformed);
            }
            let mut queries = Vec::with_capacity(count as usize);
            for _ in 0..count {
                queries.push(cursor.string_u32()?);
            }
            if cursor.remaining() != 0 {
                return Err(Malformed);
            }
            Ok((name, queries))
        })();
        let Ok((name, queries)) = parsed else {
            self.reply_error(option, REP_ERR_INVALID, "malformed metadata context request").await?;
            return Ok(Next::Continue);
        };
        // Only peers allowed to use the export learn anything about it; refusals are counted
        // where the export is actually opened (INFO/GO/EXPORT_NAME), not here.
        if !matches!(self.shared.exports.lookup(&name, &self.peer), Lookup::Allowed(..)) {
            let message = format!("export '{name}' is not available to this client");
            self.reply_error(option, REP_ERR_UNKNOWN, &message).await?;
            return Ok(Next::Continue);
        }
        let offered = if setting {
            // `base:` alone selects nothing during SET; unknown names are ignored.
            queries.iter().any(|q| q == META_BASE_ALLOCATION)
        } else {
            queries.is_empty() || queries.iter().any(|q| q == "base:" || q == META_BASE_ALLOCATION)
        };
        if offered {
            let id = if setting { META_BASE_ALLOCATION_ID } else { 0 };
            let mut payload = id.to_be_bytes().to_vec();
            payload.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
            self.reply(option, REP_META_CONTEXT, &payload).await?;
        }
        if setting {
            self.state.meta = Some((name, offered));
        }
        self.reply(option, REP_ACK, &[]).await?;
        Ok(Next::Continue)
    }
}

#[derive(Debug, Clone, Copy)]
enum Refusal {
    Unknown,
    NeedsTls,
}
