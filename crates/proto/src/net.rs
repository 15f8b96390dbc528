//! Network address ranges, as initiator access lists name them: one address (`192.0.2.7`,
//! `::1`) or a CIDR block (`10.0.0.0/24`, `fd00::/8`). IPv4 peers seen through a dual-stack
//! socket (`::ffff:a.b.c.d`) match IPv4 ranges.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IPv4 or IPv6 network in CIDR form (`10.0.0.0/8`, `fd00::/8`), or one address
/// (`192.0.2.7`, `::1`, taken as a /32 or /128). `0.0.0.0/0` and `::/0` match every address of
/// their family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix_len: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpNetError {
    BadAddress(String),
    BadPrefix(String),
    HostBitsSet(String),
}

impl fmt::Display for IpNetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpNetError::BadAddress(t) => write!(f, "'{t}' is not an IP address or CIDR block"),
            IpNetError::BadPrefix(t) => {
                write!(f, "'{t}' is not a prefix length for this address family")
            }
            IpNetError::HostBitsSet(t) => write!(
                f,
                "'{t}' has host bits set beyond its prefix length (did you mean the network \
                 address?)"
            ),
        }
    }
}

impl std::error::Error for IpNetError {}

impl IpNet {
    pub fn new(addr: IpAddr, prefix_len: u8) -> Result<IpNet, IpNetError> {
        let text = format!("{addr}/{prefix_len}");
        if prefix_len > max_prefix(addr) {
            return Err(IpNetError::BadPrefix(text));
        }
        let net = IpNet { addr, prefix_len };
        if mask(addr, prefix_len) != bits(addr) {
            return Err(IpNetError::HostBitsSet(text));
        }
        Ok(net)
    }

    /// Every address of one family: `0.0.0.0/0` or `::/0`.
    pub fn everything(v6: bool) -> IpNet {
        let addr = if v6 { IpAddr::from([0u16; 8]) } else { IpAddr::from([0u8; 4]) };
        IpNet { addr, prefix_len: 0 }
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// True when `ip` lies in this network. An IPv4 address seen through a dual-stack socket
    /// (`::ffff:a.b.c.d`) is compared as IPv4.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        if ip.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        mask(ip, self.prefix_len) == bits(self.addr)
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

/// The address as a 128-bit number, IPv4 in the low 32 bits.
fn bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn mask(addr: IpAddr, prefix_len: u8) -> u128 {
    let width = max_prefix(addr) as u32;
    let host_bits = width - prefix_len.min(max_prefix(addr)) as u32;
    let keep: u128 = if host_bits >= 128 { 0 } else { u128::MAX << host_bits };
    bits(addr) & keep
}

impl FromStr for IpNet {
    type Err = IpNetError;

    fn from_str(text: &str) -> Result<IpNet, IpNetError> {
        let text = text.trim();
        let (addr_text, prefix_text) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr =
            addr_text.parse().map_err(|_| IpNetError::BadAddress(text.to_string()))?;
        let prefix_len = match prefix_text {
            None => max_prefix(addr),
            Some(p) => {
                // Only plain decimal digits: "+8", " 8" and "08x" are typos, not prefixes.
                if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(IpNetError::BadPrefix(text.to_string()));
                }
                p.parse::<u8>().map_err(|_| IpNetError::BadPrefix(text.to_string()))?
            }
        };
        IpNet::new(addr, prefix_len)
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses_and_networks() {
        let net: IpNet = "10.0.0.0/8".parse().expect("net");
        assert!(net.contains("10.200.1.1".parse().expect("ip")));
        assert!(!net.contains("11.0.0.1".parse().expect("ip")));
        let one: IpNet = "192.0.2.7".parse().expect("one");
        assert_eq!(one.prefix_len(), 32);
        assert!(one.contains("192.0.2.7".parse().expect("ip")));
        assert!(!one.contains("192.0.2.8".parse().expect("ip")));
        let v6: IpNet = "fd00::/8".parse().expect("v6");
        assert!(v6.contains("fd12::1".parse().expect("ip")));
        assert!(!v6.contains("fe80::1".parse().expect("ip")));
        assert_eq!("::1".parse::<IpNet>().expect("::1").prefix_len(), 128);
    }

    #[test]
    fn everything_networks_match_their_family_only() {
        let all4: IpNet = "0.0.0.0/0".parse().expect("all4");
        let all6: IpNet = "::/0".parse().expect("all6");
        assert!(all4.contains("203.0.113.9".parse().expect("ip")));
        assert!(!all4.contains("2001:db8::1".parse().expect("ip")));
        assert!(all6.contains("2001:db8::1".parse().expect("ip")));
        // IPv4 through a dual-stack socket is IPv4.
        assert!(all4.contains("::ffff:127.0.0.1".parse().expect("ip")));
        let lo: IpNet = "127.0.0.0/8".parse().expect("lo");
        assert!(lo.contains("::ffff:127.0.0.1".parse().expect("ip")));
    }

    #[test]
    fn rejects_malformed_networks() {
        for bad in ["", "10.0.0.0/33", "::/129", "10.0.0.0/", "10.0.0.0/+8", "host", "10.1.0.0/8"] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad:?} should not parse");
        }
        assert!(matches!("10.1.0.0/8".parse::<IpNet>(), Err(IpNetError::HostBitsSet(_))));
    }
}
