//! Export access lists: which initiators (by address, and optionally by TLS client-certificate
//! identity) may see and use an export.

use std::net::IpAddr;

pub use stria_proto::net::{IpNet, IpNetError};

/// One access-list entry. A connection matches when its peer address lies in `net` and, if
/// `tls_identity` is set, the connection runs TLS with a verified client certificate whose
/// subject common name or one of whose DNS subject-alternative names equals it exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclRule {
    pub net: IpNet,
    pub tls_identity: Option<String>,
}

impl AclRule {
    /// Parses `net` as an address or CIDR network.
    pub fn new(net: &str, tls_identity: Option<&str>) -> Result<AclRule, IpNetError> {
        Ok(AclRule { net: net.parse()?, tls_identity: tls_identity.map(str::to_string) })
    }

    /// Every IPv4 and IPv6 address, no identity: two rules.
    pub fn anyone() -> Vec<AclRule> {
        vec![
            AclRule { net: IpNet::everything(false), tls_identity: None },
            AclRule { net: IpNet::everything(true), tls_identity: None },
        ]
    }

    pub fn matches(&self, peer: &Peer) -> bool {
        if !self.net.contains(peer.addr) {
            return false;
        }
        match &self.tls_identity {
            None => true,
            Some(wanted) => peer.tls && peer.identities.iter().any(|have| have == wanted),
        }
    }

    /// Would match if the connection were TLS with this identity: the peer's address is
    /// listed, only the certificate is missing.
    pub(crate) fn matches_address_needs_tls(&self, peer: &Peer) -> bool {
        self.tls_identity.is_some() && !peer.tls && self.net.contains(peer.addr)
    }
}

/// What an access list is checked against: one connection's view of its initiator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub addr: IpAddr,
    /// The connection has completed `NBD_OPT_STARTTLS`.
    pub tls: bool,
    /// Names from the verified client certificate (subject CN, DNS SANs); empty without one.
    pub identities: Vec<String>,
}

/// The outcome of checking a peer against an export's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Allowed,
    /// Not allowed now, but a rule lists this address with an identity: TLS might help.
    NeedsTls,
    Denied,
}

pub(crate) fn check(acl: &[AclRule], peer: &Peer) -> Access {
    if acl.iter().any(|rule| rule.matches(peer)) {
        Access::Allowed
    } else if acl.iter().any(|rule| rule.matches_address_needs_tls(peer)) {
        Access::NeedsTls
    } else {
        Access::Denied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(addr: &str, tls: bool, ids: &[&str]) -> Peer {
        Peer {
            addr: addr.parse().expect("addr"),
            tls,
            identities: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn identity_rules_need_tls_and_an_exact_name() {
        let rule = AclRule::new("127.0.0.0/8", Some("client1")).expect("rule");
        assert!(rule.matches(&peer("127.0.0.1", true, &["client1"])));
        assert!(!rule.matches(&peer("127.0.0.1", true, &["client2"])));
        assert!(!rule.matches(&peer("127.0.0.1", true, &["client10"])));
        assert!(!rule.matches(&peer("127.0.0.1", false, &["client1"])));
        assert!(!rule.matches(&peer("10.0.0.1", true, &["client1"])));
        assert_eq!(
            check(std::slice::from_ref(&rule), &peer("127.0.0.1", false, &[])),
            Access::NeedsTls
        );
        assert_eq!(check(&[rule], &peer("10.0.0.1", false, &[])), Access::Denied);
    }

    #[test]
    fn an_empty_list_refuses_everyone() {
        assert_eq!(check(&[], &peer("127.0.0.1", true, &["client1"])), Access::Denied);
        assert_eq!(check(&AclRule::anyone(), &peer("::1", false, &[])), Access::Allowed);
    }
}
