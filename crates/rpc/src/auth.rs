//! Mutual authentication of a connection with the cluster secret, before any frame.
//!
//! Every process of a cluster holds the same 32-byte secret (`stria up` makes it at its first
//! start, in `DATA/cluster-secret`). A server configured with it reads nothing but the four
//! handshake messages below from a new connection until the peer has proven it holds the
//! secret too; a client configured with it does not send a request before the server has
//! proven the same. Neither side ever sends the secret: each answers a fresh challenge of the
//! other with an HMAC-SHA256 keyed by it.
//!
//! ```text
//! client                                              server
//!   hello:     "SAUH" | version u8 | 3 zero bytes | client nonce [32]   ->
//!           <-   challenge: "SAUC" | version u8 | server nonce [32] | server proof [32]
//!   proof:     "SAUP" | client proof [32]               ->
//!           <-   verdict: "SAOK", or a goodbye frame (status UNAUTHENTICATED, reason)
//!
//! server proof = HMAC(secret, "stria-rpc server" | client nonce | server nonce)
//! client proof = HMAC(secret, "stria-rpc client" | client nonce | server nonce)
//! ```
//!
//! The hello is exactly one frame header long, so a server that runs without a secret reads
//! it as a frame with a bad magic and answers with its goodbye at once: the client then says
//! that the server runs without a secret instead of waiting for a challenge.
//!
//! A server refuses with an ordinary goodbye frame (status [`status::UNAUTHENTICATED`]), so a
//! client that speaks no handshake at all still learns why it was dropped. This authenticates
//! the peers; it does not encrypt or sign the frames that follow.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::frame::{HEADER_BYTES, Header, Limits, MAGIC};
use crate::status;

/// Bytes of the secret.
pub const SECRET_BYTES: usize = 32;
/// The handshake's own version, independent of the frame version.
pub const AUTH_VERSION: u8 = 1;

const NONCE_BYTES: usize = 32;
const PROOF_BYTES: usize = 32;
const HELLO: [u8; 4] = *b"SAUH";
const HELLO_BYTES: usize = 8 + NONCE_BYTES;
const _: () = assert!(HELLO_BYTES == HEADER_BYTES);
const CHALLENGE: [u8; 4] = *b"SAUC";
const PROOF: [u8; 4] = *b"SAUP";
const ACCEPTED: [u8; 4] = *b"SAOK";
/// The longest refusal text a client reads from a goodbye frame during the handshake.
const REFUSAL_TEXT_MAX: u32 = 4096;

/// The shared secret of a cluster. Its bytes never leave this type; `Debug` hides them.
#[derive(Clone)]
pub struct ClusterSecret {
    key: Arc<hmac::Key>,
    /// The key's HMAC of a fixed label, computed once: what [`ClusterSecret::same_as`]
    /// compares, on every call between peers of one process.
    fingerprint: [u8; 32],
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

/// Why a secret file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read the cluster secret {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error("cannot write the cluster secret {path}: {source}")]
    Write { path: String, source: io::Error },
    #[error(
        "the cluster secret {path} is damaged: it must hold {} hex digits",
        SECRET_BYTES * 2
    )]
    Malformed { path: String },
    #[error("cannot draw random bytes for a secret")]
    Random,
}

impl ClusterSecret {
    /// Whether `other` is the same secret, without revealing either: their HMACs of a fixed
    /// label are compared. For peers in one process, which need no handshake.
    pub fn same_as(&self, other: &ClusterSecret) -> bool {
        // Constant time: fold every byte's difference before looking at the result.
        self.fingerprint.iter().zip(&other.fingerprint).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
    }

    pub fn from_bytes(bytes: &[u8; SECRET_BYTES]) -> ClusterSecret {
        let key = hmac::Key::new(hmac::HMAC_SHA256, bytes);
        let mut fingerprint = [0u8; 32];
        fingerprint.copy_from_slice(hmac::sign(&key, b"stria-rpc same process").as_ref());
        ClusterSecret { key: Arc::new(key), fingerprint }
    }

    /// Reads a secret file: 64 hex digits, surrounding white space ignored.
    pub fn load(path: &Path) -> Result<ClusterSecret, SecretError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| SecretError::Read { path: shown.clone(), source })?;
        let bytes = parse_hex(text.trim()).ok_or(SecretError::Malformed { path: shown })?;
        Ok(ClusterSecret::from_bytes(&bytes))
    }

    /// Reads the secret file at `path`, or makes a new random one there (mode 0600, never
    /// replacing a file that appeared meanwhile).
    pub fn load_or_create(path: &Path) -> Result<ClusterSecret, SecretError> {
        if path.exists() {
            return ClusterSecret::load(path);
        }
        let mut bytes = [0u8; SECRET_BYTES];
        SystemRandom::new().fill(&mut bytes).map_err(|_| SecretError::Random)?;
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let shown = path.display().to_string();
        let written = {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .and_then(|mut file| {
                    file.write_all(format!("{text}\n").as_bytes())?;
                    file.sync_all()
                })
        };
        match written {
            Ok(()) => Ok(ClusterSecret::from_bytes(&bytes)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => ClusterSecret::load(path),
            Err(source) => Err(SecretError::Write { path: shown, source }),
        }
    }

    fn proof(&self, label: &[u8], client_nonce: &[u8], server_nonce: &[u8]) -> hmac::Tag {
        let mut context = hmac::Context::with_key(&self.key);
        context.update(label);
        context.update(client_nonce);
        context.update(server_nonce);
        context.sign()
    }

    fn check(&self, label: &[u8], client_nonce: &[u8], server_nonce: &[u8], proof: &[u8]) -> bool {
        let mut signed = Vec::with_capacity(label.len() + 2 * NONCE_BYTES);
        signed.extend_from_slice(label);
        signed.extend_from_slice(client_nonce);
        signed.extend_from_slice(server_nonce);
        hmac::verify(&self.key, &signed, proof).is_ok()
    }
}

const SERVER_LABEL: &[u8] = b"stria-rpc server";
const CLIENT_LABEL: &[u8] = b"stria-rpc client";

fn parse_hex(text: &str) -> Option<[u8; SECRET_BYTES]> {
    if text.len() != SECRET_BYTES * 2 || !text.is_ascii() {
        return None;
    }
    let mut bytes = [0u8; SECRET_BYTES];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(bytes)
}

fn nonce() -> io::Result<[u8; NONCE_BYTES]> {
    let mut nonce = [0u8; NONCE_BYTES];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| io::Error::other("cannot draw random bytes for a nonce"))?;
    Ok(nonce)
}

/// How a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer does not hold the secret, or speaks no handshake.
    #[error("{0}")]
    Refused(String),
}

/// The server's half: returns once the client has proven it holds `secret`. On `Refused`
/// the caller sends the reason in a goodbye frame and closes.
pub async fn accept<R, W>(
    reader: &mut R,
    writer: &mut W,
    secret: &ClusterSecret,
) -> Result<(), AuthError>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut hello = [0u8; HELLO_BYTES];
    reader.read_exact(&mut hello[..4]).await?;
    if hello[..4] != HELLO {
        return Err(AuthError::Refused(
            "this server requires the cluster secret: the client sent no authentication hello \
             (give it the node's DATA/cluster-secret)"
                .into(),
        ));
    }
    reader.read_exact(&mut hello[4..]).await?;
    if hello[4] != AUTH_VERSION {
        return Err(AuthError::Refused(format!(
            "authentication version {} is not spoken here (this server speaks {AUTH_VERSION})",
            hello[4]
        )));
    }
    let client_nonce = &hello[8..];
    let server_nonce = nonce()?;
    let mut challenge = Vec::with_capacity(4 + 1 + NONCE_BYTES + PROOF_BYTES);
    challenge.extend_from_slice(&CHALLENGE);
    challenge.push(AUTH_VERSION);
    challenge.extend_from_slice(&server_nonce);
    challenge.extend_from_slice(secret.proof(SERVER_LABEL, client_nonce, &server_nonce).as_ref());
    writer.write_all(&challenge).await?;
    writer.flush().await?;

    let mut proof = [0u8; 4 + PROOF_BYTES];
    match reader.read_exact(&mut proof).await {
        Ok(_) => {}
        // A client that found the server's proof wrong leaves here: it holds another secret.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(AuthError::Refused(
                "the client left after the challenge: it holds another cluster secret".into(),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    if proof[..4] != PROOF || !secret.check(CLIENT_LABEL, client_nonce, &server_nonce, &proof[4..])
    {
        return Err(AuthError::Refused(
            "wrong cluster secret: this client's secret differs from the server's".into(),
        ));
    }
    writer.write_all(&ACCEPTED).await?;
    writer.flush().await?;
    Ok(())
}

/// The client's half: returns once the server has proven it holds `secret` and accepted
/// this client's proof.
pub async fn connect<R, W>(
    reader: &mut R,
    writer: &mut W,
    secret: &ClusterSecret,
) -> Result<(), AuthError>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let client_nonce = nonce()?;
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(&HELLO);
    hello.extend_from_slice(&[AUTH_VERSION, 0, 0, 0]);
    hello.extend_from_slice(&client_nonce);
    writer.write_all(&hello).await?;
    writer.flush().await?;

    let mut challenge = [0u8; 4 + 1 + NONCE_BYTES + PROOF_BYTES];
    reader.read_exact(&mut challenge[..4]).await?;
    if challenge[..4] != CHALLENGE {
        return Err(refusal_or_garbage(reader, &challenge[..4], "its challenge").await);
    }
    reader.read_exact(&mut challenge[4..]).await?;
    if challenge[4] != AUTH_VERSION {
        return Err(AuthError::Refused(format!(
            "the server speaks authentication version {}, this client {AUTH_VERSION}",
            challenge[4]
        )));
    }
    let server_nonce = &challenge[5..5 + NONCE_BYTES];
    let server_proof = &challenge[5 + NONCE_BYTES..];
    if !secret.check(SERVER_LABEL, &client_nonce, server_nonce, server_proof) {
        return Err(AuthError::Refused(
            "the server does not hold this cluster's secret (is it another cluster's node?)".into(),
        ));
    }
    let mut proof = Vec::with_capacity(4 + PROOF_BYTES);
    proof.extend_from_slice(&PROOF);
    proof.extend_from_slice(secret.proof(CLIENT_LABEL, &client_nonce, server_nonce).as_ref());
    writer.write_all(&proof).await?;
    writer.flush().await?;

    let mut verdict = [0u8; 4];
    reader.read_exact(&mut verdict).await?;
    if verdict != ACCEPTED {
        return Err(refusal_or_garbage(reader, &verdict, "its verdict").await);
    }
    Ok(())
}

/// After four unexpected bytes: the server's goodbye frame (its reason), or garbage.
async fn refusal_or_garbage<R>(reader: &mut R, first: &[u8], expected: &str) -> AuthError
where
    R: AsyncRead + Unpin + ?Sized,
{
    if first != MAGIC.to_le_bytes() {
        return AuthError::Refused(format!(
            "the server sent no authentication {expected}: is it a Stria RPC service?"
        ));
    }
    let mut header = [0u8; HEADER_BYTES];
    header[..4].copy_from_slice(first);
    if let Err(e) = reader.read_exact(&mut header[4..]).await {
        return AuthError::Io(e);
    }
    let limits = Limits { message_bytes_max: REFUSAL_TEXT_MAX, data_bytes_max: 0 };
    let Ok(header) = Header::decode(&header, &limits) else {
        return AuthError::Refused("the server answered with a malformed frame".into());
    };
    let mut text = vec![0u8; header.message_len as usize];
    if let Err(e) = reader.read_exact(&mut text).await {
        return AuthError::Io(e);
    }
    let reason = String::from_utf8_lossy(&text);
    if header.status == status::UNAUTHENTICATED {
        AuthError::Refused(format!("refused by the server: {reason}"))
    } else {
        AuthError::Refused(format!(
            "the server closed the connection ({}: {reason}); does it run without a cluster secret?",
            status::name(header.status)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(fill: u8) -> ClusterSecret {
        ClusterSecret::from_bytes(&[fill; SECRET_BYTES])
    }

    async fn handshake(
        server: ClusterSecret,
        client: ClusterSecret,
    ) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let (client_end, server_end) = tokio::io::duplex(1024);
        let (mut cr, mut cw) = tokio::io::split(client_end);
        let (mut sr, mut sw) = tokio::io::split(server_end);
        let server_side = tokio::spawn(async move {
            let result = accept(&mut sr, &mut sw, &server).await;
            if let Err(AuthError::Refused(reason)) = &result {
                let frame = crate::frame::Frame::response(
                    0,
                    status::UNAUTHENTICATED,
                    crate::frame::REQUEST_ID_CONNECTION,
                    bytes::Bytes::from(reason.clone()),
                    bytes::Bytes::new(),
                    false,
                );
                let _ = sw.write_all(&frame.to_vec()).await;
            }
            result
        });
        let client_result = connect(&mut cr, &mut cw, &client).await;
        drop((cr, cw));
        (server_side.await.unwrap(), client_result)
    }

    #[tokio::test]
    async fn the_same_secret_passes_both_ways() {
        let (server, client) = handshake(secret(7), secret(7)).await;
        assert!(server.is_ok(), "{server:?}");
        assert!(client.is_ok(), "{client:?}");
    }

    #[tokio::test]
    async fn another_secret_is_refused_by_the_client_first() {
        // The server proves itself first, so the client notices the mismatch and stops: the
        // server sees the connection end instead of a proof, and counts that as a refusal.
        let (server, client) = handshake(secret(7), secret(8)).await;
        let client = client.unwrap_err().to_string();
        assert!(client.contains("does not hold this cluster's secret"), "{client}");
        let server = server.unwrap_err().to_string();
        assert!(server.contains("another cluster secret"), "{server}");
    }

    #[test]
    fn secret_files_are_made_once_and_read_back() {
        let dir = std::env::temp_dir().join(format!("stria-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster-secret");
        let _ = std::fs::remove_file(&path);
        let made = ClusterSecret::load_or_create(&path).unwrap();
        let again = ClusterSecret::load_or_create(&path).unwrap();
        let n = [1u8; NONCE_BYTES];
        assert_eq!(
            made.proof(CLIENT_LABEL, &n, &n).as_ref(),
            again.proof(CLIENT_LABEL, &n, &n).as_ref()
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&path, "not hex\n").unwrap();
        let damaged = ClusterSecret::load(&path).unwrap_err().to_string();
        assert!(damaged.contains("damaged"), "{damaged}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
