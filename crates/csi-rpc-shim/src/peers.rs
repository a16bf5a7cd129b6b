//! [`Routes`]: how this agent reaches other agents, and the pool of connections to them.
//!
//! Each node is reached directly (it has an address this agent can dial) or through one relay
//! (a directly reachable agent that can dial it). There is no third option: a call takes at
//! most one hop between agents beyond the first link.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use csi_structs::NodeId;
use tonic::transport::{Channel, Endpoint};

#[cfg(feature = "tls")]
use crate::tls::TlsConfig;

/// The address book of one agent.
///
/// ```
/// use csi_rpc_shim::Routes;
/// use csi_structs::NodeId;
///
/// let b = NodeId::new("b")?;
/// let c = NodeId::new("c")?;
/// let routes = Routes::new()
///     .with_direct(b.clone(), "10.0.0.2:7400".parse().unwrap())
///     .with_relay(c, b); // reach c through b
/// # Ok::<(), csi_structs::ValidationErrors>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Routes {
    direct: HashMap<NodeId, SocketAddr>,
    relays: HashMap<NodeId, NodeId>,
}

/// How one call reaches its target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// The target is this agent.
    Local,
    /// Dial the target.
    Direct(SocketAddr),
    /// Dial the relay, which dials the target.
    Via {
        /// The relay's node.
        relay: NodeId,
        /// The relay's address.
        addr: SocketAddr,
    },
    /// No way.
    None,
}

impl Routes {
    /// No routes: only local calls work.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reach `node` at `addr`. Replaces an earlier route to it.
    pub fn set_direct(&mut self, node: NodeId, addr: SocketAddr) {
        self.relays.remove(&node);
        self.direct.insert(node, addr);
    }

    /// Reach `target` through `relay` (which must itself be reachable directly).
    pub fn set_relay(&mut self, target: NodeId, relay: NodeId) {
        self.direct.remove(&target);
        self.relays.insert(target, relay);
    }

    /// Forgets every route to `node`.
    pub fn remove(&mut self, node: &NodeId) {
        self.direct.remove(node);
        self.relays.remove(node);
    }

    /// [`set_direct`](Self::set_direct), by value.
    #[must_use]
    pub fn with_direct(mut self, node: NodeId, addr: SocketAddr) -> Self {
        self.set_direct(node, addr);
        self
    }

    /// [`set_relay`](Self::set_relay), by value.
    #[must_use]
    pub fn with_relay(mut self, target: NodeId, relay: NodeId) -> Self {
        self.set_relay(target, relay);
        self
    }

    /// The address of `node` if it is reachable directly.
    pub fn direct(&self, node: &NodeId) -> Option<SocketAddr> {
        self.direct.get(node).copied()
    }

    pub(crate) fn resolve(&self, me: &NodeId, target: &NodeId) -> Route {
        if target == me {
            return Route::Local;
        }
        if let Some(addr) = self.direct.get(target) {
            return Route::Direct(*addr);
        }
        match self.relays.get(target) {
            Some(relay) if relay != me && relay != target => match self.direct.get(relay) {
                Some(addr) => Route::Via {
                    relay: relay.clone(),
                    addr: *addr,
                },
                None => Route::None,
            },
            _ => Route::None,
        }
    }
}

/// One lazily connected channel per peer address.
#[derive(Debug)]
pub(crate) struct PeerPool {
    channels: Mutex<HashMap<SocketAddr, Channel>>,
    connect_timeout: Duration,
    #[cfg(feature = "tls")]
    tls: Option<TlsConfig>,
}

impl PeerPool {
    pub(crate) fn new(
        connect_timeout: Duration,
        #[cfg(feature = "tls")] tls: Option<TlsConfig>,
    ) -> Self {
        Self {
            channels: Mutex::new(HashMap::new()),
            connect_timeout,
            #[cfg(feature = "tls")]
            tls,
        }
    }

    /// The channel to `addr`, created on first use. `None` when no endpoint can be built for it
    /// (a TLS configuration the transport refuses).
    pub(crate) fn channel(&self, addr: SocketAddr) -> Option<Channel> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ch) = channels.get(&addr) {
            return Some(ch.clone());
        }
        let channel = self.endpoint(addr)?.connect_lazy();
        channels.insert(addr, channel.clone());
        Some(channel)
    }

    #[cfg(not(feature = "tls"))]
    fn endpoint(&self, addr: SocketAddr) -> Option<Endpoint> {
        Endpoint::from_shared(format!("http://{addr}"))
            .ok()
            .map(|e| e.connect_timeout(self.connect_timeout).tcp_nodelay(true))
    }

    #[cfg(feature = "tls")]
    fn endpoint(&self, addr: SocketAddr) -> Option<Endpoint> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .ok()?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        match &self.tls {
            Some(tls) => endpoint.tls_config(tls.client.clone()).ok(),
            None => Some(endpoint),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    #[test]
    fn resolution() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let r = Routes::new()
            .with_direct(n("b"), addr)
            .with_relay(n("c"), n("b"))
            .with_relay(n("d"), n("x"))
            .with_relay(n("e"), n("a"));
        assert_eq!(r.resolve(&n("a"), &n("a")), Route::Local);
        assert_eq!(r.resolve(&n("a"), &n("b")), Route::Direct(addr));
        assert_eq!(
            r.resolve(&n("a"), &n("c")),
            Route::Via {
                relay: n("b"),
                addr
            }
        );
        // A relay that is not directly reachable, or is this agent, is no route.
        assert_eq!(r.resolve(&n("a"), &n("d")), Route::None);
        assert_eq!(r.resolve(&n("a"), &n("e")), Route::None);
        assert_eq!(r.resolve(&n("a"), &n("z")), Route::None);
    }
}
