//! TLS for `NBD_OPT_STARTTLS`: loading the server's certificate and key, optional client
//! certificate verification, and reading a verified client certificate's identities.
//!
//! rustls (with the ring provider) has no TLS-PSK support, so the pre-shared-key mode some NBD
//! servers offer is not available here; use certificates.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// TLS settings of a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM file with the server certificate chain (leaf first).
    pub cert: PathBuf,
    /// PEM file with the server's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM file of CA certificates that sign client certificates. When set, clients are asked
    /// for a certificate; one that does not verify fails the TLS handshake, while a client that
    /// sends none still gets TLS but no identity (so identity ACL rules will not match it).
    pub client_ca: Option<PathBuf>,
    /// Refuse every option except `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT` until TLS is up
    /// (the protocol's FORCEDTLS mode). Otherwise TLS is the client's choice (SELECTIVETLS)
    /// and exports whose rules all name an identity are in effect TLS-only.
    pub required: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("reading {path}: {source}")]
    Pem { path: PathBuf, source: rustls_pki_types::pem::Error },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("client CA file: {0}")]
    ClientCa(String),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

pub(crate) fn acceptor(config: &TlsConfig) -> Result<TlsAcceptor, TlsSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = load_certs(&config.cert)?;
    let key = PrivateKeyDer::from_pem_file(&config.key)
        .map_err(|source| TlsSetupError::Pem { path: config.key.clone(), source })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let server_config = match &config.client_ca {
        None => builder.with_no_client_auth().with_single_cert(certs, key)?,
        Some(ca_path) => {
            let mut roots = RootCertStore::empty();
            for cert in load_certs(ca_path)? {
                roots.add(cert)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsSetupError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier).with_single_cert(certs, key)?
        }
    };
    Ok(TlsAcceptor::from(Arc::new(server_config)))
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let pem_error = |source| TlsSetupError::Pem { path: path.to_path_buf(), source };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if certs.is_empty() {
        return Err(TlsSetupError::NoCertificate(path.to_path_buf()));
    }
    Ok(certs)
}

/// The names an ACL identity is compared with: every subject common name and every DNS
/// subject-alternative name of a (verified) certificate. A certificate that does not parse
/// yields no names, so it matches no identity rule.
pub fn certificate_identities(der: &[u8]) -> Vec<String> {
    der::identities(der).unwrap_or_default()
}

/// Just enough DER to find the subject CN and the DNS SANs of an X.509 certificate. The input
/// has already been verified by rustls; this parser still bounds every read.
mod der {
    const SEQUENCE: u8 = 0x30;
    const SET: u8 = 0x31;
    const OID: u8 = 0x06;
    const BOOLEAN: u8 = 0x01;
    const OCTET_STRING: u8 = 0x04;
    const CONTEXT_0_CONSTRUCTED: u8 = 0xa0;
    const CONTEXT_3_CONSTRUCTED: u8 = 0xa3;
    const SAN_DNS_NAME: u8 = 0x82;
    const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
    const OID_SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
    // DirectoryString choices that carry text we can compare.
    const UTF8_STRING: u8 = 0x0c;
    const PRINTABLE_STRING: u8 = 0x13;
    const IA5_STRING: u8 = 0x16;

    #[derive(Debug)]
    pub struct Bad;

    /// Splits one TLV off the front of `input`: (tag, value, rest).
    fn tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), Bad> {
        let (&tag, rest) = input.split_first().ok_or(Bad)?;
        if tag & 0x1f == 0x1f {
            return Err(Bad); // multi-byte tags never occur in the fields we read
        }
        let (&first, mut rest) = rest.split_first().ok_or(Bad)?;
        let len = if first < 0x80 {
            first as usize
        } else {
            let count = (first & 0x7f) as usize;
            if count == 0 || count > 4 || rest.len() < count {
                return Err(Bad);
            }
            let mut len = 0usize;
            for &b in &rest[..count] {
                len = (len << 8) | b as usize;
            }
            rest = &rest[count..];
            len
        };
        if rest.len() < len {
            return Err(Bad);
        }
        Ok((tag, &rest[..len], &rest[len..]))
    }

    fn expect(input: &[u8], tag: u8) -> Result<(&[u8], &[u8]), Bad> {
        let (t, value, rest) = tlv(input)?;
        if t != tag {
            return Err(Bad);
        }
        Ok((value, rest))
    }

    pub fn identities(cert: &[u8]) -> Result<Vec<String>, Bad> {
        let (certificate, _) = expect(cert, SEQUENCE)?;
        let (tbs, _) = expect(certificate, SEQUENCE)?;
        let mut rest = tbs;
        // version [0] EXPLICIT, optional
        if rest.first() == Some(&CONTEXT_0_CONSTRUCTED) {
            rest = tlv(rest)?.2;
        }
        rest = tlv(rest)?.2; // serialNumber
        rest = tlv(rest)?.2; // signature algorithm
        rest = tlv(rest)?.2; // issuer
        rest = tlv(rest)?.2; // validity
        let (subject, after_subject) = expect(rest, SEQUENCE)?;
        let mut names = common_names(subject)?;
        rest = tlv(after_subject)?.2; // subjectPublicKeyInfo
        // issuerUniqueID [1], subjectUniqueID [2], then extensions [3], all optional.
        while !rest.is_empty() {
            let (tag, value, next) = tlv(rest)?;
            if tag == CONTEXT_3_CONSTRUCTED {
                let (extensions, _) = expect(value, SEQUENCE)?;
                names.extend(dns_names(extensions)?);
            }
            rest = next;
        }
        Ok(names)
    }

    fn common_names(mut rdns: &[u8]) -> Result<Vec<String>, Bad> {
        let mut names = Vec::new();
        while !rdns.is_empty() {
            let (set, next) = expect(rdns, SET)?;
            rdns = next;
            let mut attributes = set;
            while !attributes.is_empty() {
                let (attribute, next) = expect(attributes, SEQUENCE)?;
                attributes = next;
                let (oid, value) = expect(attribute, OID)?;
                if oid != OID_COMMON_NAME {
                    continue;
                }
                let (tag, text, _) = tlv(value)?;
                if matches!(tag, UTF8_STRING | PRINTABLE_STRING | IA5_STRING)
                    && let Ok(text) = std::str::from_utf8(text)
                {
                    names.push(text.to_string());
                }
            }
        }
        Ok(names)
    }

    fn dns_names(mut extensions: &[u8]) -> Result<Vec<String>, Bad> {
        let mut names = Vec::new();
        while !extensions.is_empty() {
            let (extension, next) = expect(extensions, SEQUENCE)?;
            extensions = next;
            let (oid, mut rest) = expect(extension, OID)?;
            if rest.first() == Some(&BOOLEAN) {
                rest = tlv(rest)?.2; // critical
            }
            if oid != OID_SUBJECT_ALT_NAME {
                continue;
            }
            let (octets, _) = expect(rest, OCTET_STRING)?;
            let (mut general_names, _) = expect(octets, SEQUENCE)?;
            while !general_names.is_empty() {
                let (tag, value, next) = tlv(general_names)?;
                general_names = next;
                if tag == SAN_DNS_NAME
                    && let Ok(text) = std::str::from_utf8(value)
                {
                    names.push(text.to_string());
                }
            }
        }
        Ok(names)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn truncated_input_is_rejected_not_panicking() {
            let der = [0x30, 0x82, 0x01, 0x00, 0x30];
            assert!(identities(&der).is_err());
            for len in 0..8 {
                let junk: Vec<u8> = (0..len).map(|i| 0x30 + i as u8).collect();
                let _ = identities(&junk);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_the_common_name_and_dns_sans() {
        let mut params = rcgen::CertificateParams::new(vec![
            "node7.example".to_string(),
            "127.0.0.1".to_string(),
        ])
        .expect("params");
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "Stria");
        params.distinguished_name.push(rcgen::DnType::CommonName, "client1");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        let mut names = certificate_identities(cert.der());
        names.sort();
        // The IP SAN is not a DNS name and is not an identity.
        assert_eq!(names, vec!["client1".to_string(), "node7.example".to_string()]);
    }

    #[test]
    fn garbage_has_no_identity() {
        assert!(certificate_identities(b"not a certificate").is_empty());
    }
}
