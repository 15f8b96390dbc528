//! Clients by server address, so a process keeps a few long-lived connections per storage
//! node instead of one per caller.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::client::{Client, ClientConfig};
use crate::transport::{TcpTransport, Transport};

/// Most connections one pool opens to one address.
pub const CONNECTIONS_PER_ADDRESS_MAX: usize = 64;

/// Lazily created clients keyed by address; `connections_per_address` of them per address,
/// handed out round robin so parallel streams spread over several TCP connections.
#[derive(Debug)]
pub struct Pool {
    transport: Arc<dyn Transport>,
    config: ClientConfig,
    connections_per_address: usize,
    /// Per address: its clients and the index of the next one to hand out.
    clients: Mutex<HashMap<SocketAddr, (Vec<Client>, usize)>>,
}

impl Pool {
    pub fn new(config: ClientConfig, connections_per_address: usize) -> Pool {
        Pool::with_transport(Arc::new(TcpTransport), config, connections_per_address)
    }

    pub fn with_transport(
        transport: Arc<dyn Transport>,
        config: ClientConfig,
        connections_per_address: usize,
    ) -> Pool {
        assert!(
            (1..=CONNECTIONS_PER_ADDRESS_MAX).contains(&connections_per_address),
            "connections per address must be 1..={CONNECTIONS_PER_ADDRESS_MAX}"
        );
        Pool { transport, config, connections_per_address, clients: Mutex::new(HashMap::new()) }
    }

    /// A client for `addr`. It connects on first use and reconnects after failures by
    /// itself, so callers never need to evict it for being broken.
    pub fn get(&self, addr: SocketAddr) -> Client {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let (list, next) = clients.entry(addr).or_insert_with(|| {
            let list = (0..self.connections_per_address)
                .map(|_| Client::with_transport(addr, self.transport.clone(), self.config.clone()))
                .collect();
            (list, 0)
        });
        let client = list[*next % list.len()].clone();
        *next = next.wrapping_add(1);
        client
    }

    /// Forgets `addr` (a node that left the cluster); its connections close once the last
    /// clone of its clients is dropped.
    pub fn remove(&self, addr: SocketAddr) {
        self.clients.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr);
    }

    /// Addresses the pool holds clients for.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner()).keys().copied().collect()
    }
}
