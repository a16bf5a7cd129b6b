//! What a node learns of the other nodes of its cluster: which plugins each hosts, and whether
//! it answers.
//!
//! Each node advertises its plugins as [`HostedPlugin`]s ([`HostedPlugin::of_node`]): in its
//! cluster member record (the front door does it in cluster mode, [`NodeAbout`]), or in an
//! answer of the orchestrator's own API to nodes that poll it. [`NodePeers`] keeps what each
//! peer reported last ([`NodePeers::report`]), feeds it to the routing's registry (csi-rpc-shim:
//! which node hosts which controller and node instance, and which nodes are down), and is the
//! volume service's [`Peers`]: the plugins fingerprinted anywhere, whether a node answers,
//! and, in a cluster, whether claims are shared and how a node is reported gone.
//!
//! ```
//! use std::sync::Arc;
//!
//! use csi_control::peers::{HostedPlugin, NodePeers};
//! use csi_control::Peers;
//! use csi_rpc_shim::Registry;
//! use csi_structs::NodeId;
//!
//! let peers = NodePeers::new(Arc::new(Registry::new()));
//! let other = NodeId::new("node-2").unwrap();
//! let ebs = HostedPlugin {
//!     id: "ebs".into(),
//!     controller: Some(true),
//!     node: Some(("i-0a".into(), true)),
//!     controller_publish: true,
//!     capabilities: None,
//! };
//! peers.report(&other, Ok(vec![ebs]));
//! assert_eq!(peers.reachable(&other), Some(true));
//! assert_eq!(peers.plugins()[0].plugin.as_str(), "ebs");
//! peers.report(&other, Err("connection refused".into()));
//! assert_eq!(peers.reachable(&other), Some(false));
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use csi_claims::StoreError;
use csi_client::Fingerprint;
use csi_node::plugins::PluginManager;
use csi_rpc_shim::{Health, Instance, NodeStatus, Registry, ServiceKind};
use csi_structs::{Capabilities, NodeId, PluginId, PluginNodeId};
use serde::{Deserialize, Serialize};

use crate::service::{PeerPlugin, Peers};

/// One plugin as the node that runs it advertises it to the others.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostedPlugin {
    /// The plugin id.
    pub id: String,
    /// Its controller service's health there (`None`: no controller there).
    pub controller: Option<bool>,
    /// Its node service there: the plugin's node id and whether it is healthy.
    pub node: Option<(String, bool)>,
    /// Whether its volumes need `ControllerPublishVolume`.
    pub controller_publish: bool,
    /// What the instance there advertises (absent from nodes that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
}

impl HostedPlugin {
    /// The fingerprinted plugins of `plugins`, as this node advertises them.
    pub fn of_node(plugins: &PluginManager) -> Vec<HostedPlugin> {
        plugins
            .list()
            .iter()
            .filter_map(|s| {
                let fp: &Fingerprint = s.fingerprint.as_ref()?;
                let healthy = s.health.is_healthy();
                Some(HostedPlugin {
                    id: s.plugin.to_string(),
                    controller: fp
                        .capabilities
                        .plugin
                        .has_controller_service()
                        .then_some(healthy),
                    node: fp.node.as_ref().map(|n| (n.node_id.to_string(), healthy)),
                    controller_publish: fp
                        .capabilities
                        .lifecycle_requires(csi_client::Rpc::ControllerPublishVolume),
                    capabilities: Some(fp.capabilities.clone()),
                })
            })
            .collect()
    }
}

/// What a cluster node says of itself in its member record (csi-control's
/// `cluster::MemberRecord`), beside its node id and instance: where peers reach its routing,
/// its plugins, and whatever the orchestrator adds (`extra`, written at the same level).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAbout {
    /// The address of its routing (csi-rpc-shim), `HOST:PORT`.
    pub shim: String,
    /// Its fingerprinted plugins.
    pub plugins: Vec<HostedPlugin>,
    /// The orchestrator's own fields (its API's address, say).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// What a node knows of one peer, from its last report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerReport {
    /// Whether the last report came (the peer answered, or is a live member).
    pub reachable: bool,
    /// Its plugins, from the last report that came.
    pub plugins: Vec<HostedPlugin>,
    /// Why the last report did not come.
    pub last_error: Option<String>,
}

/// A cluster's membership, as a node's peers need it.
#[async_trait::async_trait]
pub trait ClusterMembers: std::fmt::Debug + Send + Sync {
    /// Whether `node` is a live member now.
    fn is_member(&self, node: &NodeId) -> bool;

    /// Reports `node` gone for good to every member (their drivers skip its node steps).
    ///
    /// # Errors
    ///
    /// When the shared store cannot be written.
    async fn report_node_gone(&self, node: &NodeId) -> Result<(), StoreError>;
}

/// A node's peers as they reported last, fed to the routing's registry; the volume service's
/// [`Peers`]. See the [module docs](self).
#[derive(Debug)]
pub struct NodePeers {
    registry: Arc<Registry>,
    reports: Mutex<BTreeMap<NodeId, PeerReport>>,
    cluster: OnceLock<Arc<dyn ClusterMembers>>,
}

impl NodePeers {
    /// No peer reported yet; what they report goes to `registry` (the routing's).
    pub fn new(registry: Arc<Registry>) -> Self {
        Self {
            registry,
            reports: Mutex::default(),
            cluster: OnceLock::new(),
        }
    }

    /// The node is a member of `cluster`: claims are shared, a peer answers while it is a
    /// live member, and nodes are reported gone through it. A second call is ignored.
    pub fn set_cluster(&self, cluster: Arc<dyn ClusterMembers>) {
        let _ = self.cluster.set(cluster);
    }

    /// Every peer's last report, by node.
    pub fn reports(&self) -> BTreeMap<NodeId, PeerReport> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, PeerReport>> {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a report of `node`: its plugins (`Ok`: registered in the routing's registry,
    /// those it no longer lists removed, the node ready), or why it did not answer (`Err`:
    /// the node marked down; its instances stay known but are not chosen). A peer's first
    /// answer and each loss of it are logged once.
    pub fn report(&self, node: &NodeId, answer: Result<Vec<HostedPlugin>, String>) {
        let mut reports = self.lock();
        let state = reports.entry(node.clone()).or_default();
        match answer {
            Ok(plugins) => {
                if !state.reachable {
                    tracing::info!(peer = %node, plugins = plugins.len(), "peer reachable");
                }
                self.registry.set_node_status(node, NodeStatus::Ready);
                for old in &state.plugins {
                    if !plugins.iter().any(|p| p.id == old.id)
                        && let Ok(id) = PluginId::new(old.id.clone())
                    {
                        self.registry.remove(node, &id, ServiceKind::Controller);
                        self.registry.remove(node, &id, ServiceKind::Node);
                    }
                }
                for p in &plugins {
                    self.register(node, p);
                }
                state.reachable = true;
                state.plugins = plugins;
                state.last_error = None;
            }
            Err(e) => {
                if state.reachable || state.last_error.is_none() {
                    tracing::warn!(peer = %node, error = %e, "peer unreachable");
                }
                self.registry.set_node_status(node, NodeStatus::Down);
                state.reachable = false;
                state.last_error = Some(e);
            }
        }
    }

    /// Registers the instances of `p` on `node`; a plugin or plugin node id that is not
    /// valid is skipped (a peer's report is input).
    fn register(&self, node: &NodeId, p: &HostedPlugin) {
        let Ok(id) = PluginId::new(p.id.clone()) else {
            return;
        };
        let health = |ok: bool| {
            if ok {
                Health::Healthy
            } else {
                Health::unhealthy("peer reports it unhealthy")
            }
        };
        match p.controller {
            Some(ok) => self
                .registry
                .update(node, &id, Instance::Controller(health(ok))),
            None => self.registry.remove(node, &id, ServiceKind::Controller),
        }
        match &p.node {
            Some((plugin_node, ok)) => {
                if let Ok(plugin_node) = PluginNodeId::new(plugin_node.clone()) {
                    let instance = Instance::Node {
                        plugin_node,
                        health: health(*ok),
                    };
                    self.registry.update(node, &id, instance);
                }
            }
            None => self.registry.remove(node, &id, ServiceKind::Node),
        }
    }
}

#[async_trait::async_trait]
impl Peers for NodePeers {
    fn plugins(&self) -> Vec<PeerPlugin> {
        let mut out = Vec::new();
        for (node, peer) in self.lock().iter() {
            for p in &peer.plugins {
                let Ok(plugin) = PluginId::new(p.id.clone()) else {
                    continue;
                };
                out.push(PeerPlugin {
                    node: node.clone(),
                    plugin,
                    controller: p.controller.is_some(),
                    node_service: p.node.is_some(),
                    controller_publish: p.controller_publish,
                    capabilities: p.capabilities.clone(),
                });
            }
        }
        out
    }

    fn reachable(&self, node: &NodeId) -> Option<bool> {
        if let Some(cluster) = self.cluster.get() {
            return Some(cluster.is_member(node));
        }
        self.lock().get(node).map(|p| p.reachable)
    }

    fn shares_claims(&self) -> bool {
        self.cluster.get().is_some()
    }

    async fn report_node_gone(&self, node: &NodeId) -> Result<bool, StoreError> {
        match self.cluster.get() {
            Some(cluster) => cluster.report_node_gone(node).await.map(|()| true),
            None => Ok(false),
        }
    }
}
