//! [`Registry`]: which plugin instances run on which nodes, and how healthy they are.
//!
//! Fed by the agent's view of the cluster (fingerprints and health reports), it answers the two
//! routing questions: which nodes can serve controller calls for plugin P now
//! ([`Registry::controllers`]), and can node N serve node calls for P
//! ([`Registry::node_plugin`]).
//!
//! A node the registry has never heard of is *unknown*, not *gone*: only an explicit
//! [`NodeStatus::Gone`] says a node left. An agent that just started with an empty registry
//! must not tell the claim layer to skip a node detach.
//!
//! ```
//! use csi_rpc_shim::{Health, Instance, NodePlugin, Registry};
//! use csi_structs::{NodeId, PluginId, PluginNodeId};
//!
//! let reg = Registry::new();
//! let (a, b) = (NodeId::new("a")?, NodeId::new("b")?);
//! let ebs = PluginId::new("ebs")?;
//! reg.update(&a, &ebs, Instance::Controller(Health::Healthy));
//! reg.update(&b, &ebs, Instance::Controller(Health::unhealthy("probe failed")));
//! reg.update(&b, &ebs, Instance::Node { plugin_node: PluginNodeId::new("i-b")?, health: Health::Healthy });
//!
//! let view = reg.controllers(&ebs);
//! assert_eq!(view.ready, vec![a]);
//! assert_eq!(view.refused.len(), 1);
//! assert!(matches!(reg.node_plugin(&b, &ebs), NodePlugin::Ready { .. }));
//! # Ok::<(), csi_structs::ValidationErrors>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{PoisonError, RwLock};

use csi_structs::{NodeId, PluginId, PluginNodeId};

use crate::error::{Refusal, RefusalReason};
use crate::rpc::ServiceKind;

/// The health of one plugin service instance, from its last health report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Passing its health checks.
    Healthy,
    /// Failing them.
    Unhealthy {
        /// Why, for people.
        reason: String,
    },
}

impl Health {
    /// An unhealthy report with this reason.
    pub fn unhealthy(reason: impl Into<String>) -> Self {
        Health::Unhealthy {
            reason: reason.into(),
        }
    }
}

/// One plugin service instance on a node, as a fingerprint reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Instance {
    /// The plugin's controller service.
    Controller(Health),
    /// The plugin's node service, with the node id the plugin gave (`NodeGetInfo`).
    Node {
        /// The plugin's id for this node.
        plugin_node: PluginNodeId,
        /// Its health.
        health: Health,
    },
}

/// Whether a node is part of the cluster and serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeStatus {
    /// Up and serving.
    Ready,
    /// Known but not serving now (missed heartbeats, draining its agent…); may come back.
    Down,
    /// Left the cluster for good: its instances are forgotten.
    Gone,
}

/// The controllers of one plugin, as [`Registry::controllers`] sees them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControllerView {
    /// Nodes with a healthy controller instance on a ready node, sorted by node id.
    pub ready: Vec<NodeId>,
    /// The other instances and why they cannot serve now.
    pub refused: Vec<Refusal>,
}

/// What the registry knows about a plugin's node service on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodePlugin {
    /// Healthy on a ready node.
    Ready {
        /// The plugin's id for the node.
        plugin_node: PluginNodeId,
    },
    /// Present but unhealthy.
    Unhealthy {
        /// Why, for people.
        reason: String,
    },
    /// The node is known but the plugin's node service is not registered there.
    Missing,
    /// The node is known but not ready.
    NodeDown,
    /// The node left the cluster.
    NodeGone,
    /// The node was never reported.
    UnknownNode,
}

#[derive(Debug)]
struct NodeEntry {
    status: NodeStatus,
    controllers: BTreeMap<PluginId, Health>,
    node_plugins: BTreeMap<PluginId, (PluginNodeId, Health)>,
}

impl NodeEntry {
    fn new(status: NodeStatus) -> Self {
        Self {
            status,
            controllers: BTreeMap::new(),
            node_plugins: BTreeMap::new(),
        }
    }
}

/// Plugin instances per node. Cheap to query; share it behind an `Arc`.
///
/// One `RwLock` over the whole table, held only for the few map operations of each method and
/// never across an `.await`.
#[derive(Debug, Default)]
pub struct Registry {
    nodes: RwLock<HashMap<NodeId, NodeEntry>>,
}

impl Registry {
    /// An empty registry: every node is unknown.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an instance report. A node first heard of this way becomes
    /// [`NodeStatus::Ready`]; a node marked gone is not brought back (mark it ready first).
    pub fn update(&self, node: &NodeId, plugin: &PluginId, instance: Instance) {
        let mut nodes = self.nodes.write().unwrap_or_else(PoisonError::into_inner);
        let entry = nodes
            .entry(node.clone())
            .or_insert_with(|| NodeEntry::new(NodeStatus::Ready));
        if entry.status == NodeStatus::Gone {
            return;
        }
        match instance {
            Instance::Controller(health) => {
                entry.controllers.insert(plugin.clone(), health);
            }
            Instance::Node {
                plugin_node,
                health,
            } => {
                entry
                    .node_plugins
                    .insert(plugin.clone(), (plugin_node, health));
            }
        }
    }

    /// Forgets one instance (the plugin was stopped on that node).
    pub fn remove(&self, node: &NodeId, plugin: &PluginId, service: ServiceKind) {
        let mut nodes = self.nodes.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = nodes.get_mut(node) {
            match service {
                ServiceKind::Controller => entry.controllers.remove(plugin),
                ServiceKind::Node => entry.node_plugins.remove(plugin).map(|(_, h)| h),
            };
        }
    }

    /// Sets a node's status. [`NodeStatus::Gone`] forgets its instances.
    pub fn set_node_status(&self, node: &NodeId, status: NodeStatus) {
        let mut nodes = self.nodes.write().unwrap_or_else(PoisonError::into_inner);
        let entry = nodes
            .entry(node.clone())
            .or_insert_with(|| NodeEntry::new(status));
        entry.status = status;
        if status == NodeStatus::Gone {
            entry.controllers.clear();
            entry.node_plugins.clear();
        }
    }

    /// A node's status, `None` when it was never reported.
    pub fn node_status(&self, node: &NodeId) -> Option<NodeStatus> {
        let nodes = self.nodes.read().unwrap_or_else(PoisonError::into_inner);
        nodes.get(node).map(|e| e.status)
    }

    /// The nodes that can serve controller calls for `plugin` now, and why the others cannot.
    pub fn controllers(&self, plugin: &PluginId) -> ControllerView {
        let nodes = self.nodes.read().unwrap_or_else(PoisonError::into_inner);
        let mut view = ControllerView::default();
        for (node, entry) in nodes.iter() {
            let Some(health) = entry.controllers.get(plugin) else {
                continue;
            };
            let reason = match (entry.status, health) {
                (NodeStatus::Ready, Health::Healthy) => {
                    view.ready.push(node.clone());
                    continue;
                }
                (NodeStatus::Ready, Health::Unhealthy { reason }) => RefusalReason::Unhealthy {
                    reason: reason.clone(),
                },
                (NodeStatus::Down | NodeStatus::Gone, _) => RefusalReason::NodeDown,
            };
            view.refused.push(Refusal {
                node: node.clone(),
                reason,
            });
        }
        view.ready.sort();
        view.refused.sort_by(|a, b| a.node.cmp(&b.node));
        view
    }

    /// Whether `node` can serve node calls for `plugin` now.
    pub fn node_plugin(&self, node: &NodeId, plugin: &PluginId) -> NodePlugin {
        let nodes = self.nodes.read().unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = nodes.get(node) else {
            return NodePlugin::UnknownNode;
        };
        match entry.status {
            NodeStatus::Gone => return NodePlugin::NodeGone,
            NodeStatus::Down => return NodePlugin::NodeDown,
            NodeStatus::Ready => {}
        }
        match entry.node_plugins.get(plugin) {
            None => NodePlugin::Missing,
            Some((plugin_node, Health::Healthy)) => NodePlugin::Ready {
                plugin_node: plugin_node.clone(),
            },
            Some((_, Health::Unhealthy { reason })) => NodePlugin::Unhealthy {
                reason: reason.clone(),
            },
        }
    }

    /// The plugin's id for `node`, healthy or not, if its node service was ever reported.
    pub fn plugin_node_id(&self, node: &NodeId, plugin: &PluginId) -> Option<PluginNodeId> {
        let nodes = self.nodes.read().unwrap_or_else(PoisonError::into_inner);
        nodes
            .get(node)?
            .node_plugins
            .get(plugin)
            .map(|(id, _)| id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    #[test]
    fn controllers_are_sorted_and_refusals_explained() {
        let reg = Registry::new();
        let p = PluginId::new("p").unwrap();
        for name in ["c", "a", "b", "d"] {
            reg.update(&n(name), &p, Instance::Controller(Health::Healthy));
        }
        reg.update(
            &n("b"),
            &p,
            Instance::Controller(Health::unhealthy("probe")),
        );
        reg.set_node_status(&n("d"), NodeStatus::Down);
        let view = reg.controllers(&p);
        assert_eq!(view.ready, vec![n("a"), n("c")]);
        assert_eq!(
            view.refused,
            vec![
                Refusal {
                    node: n("b"),
                    reason: RefusalReason::Unhealthy {
                        reason: "probe".into()
                    }
                },
                Refusal {
                    node: n("d"),
                    reason: RefusalReason::NodeDown
                },
            ]
        );
        assert_eq!(
            reg.controllers(&PluginId::new("other").unwrap()),
            ControllerView::default()
        );
    }

    #[test]
    fn node_plugin_answers() {
        let reg = Registry::new();
        let p = PluginId::new("p").unwrap();
        let id = PluginNodeId::new("i-1").unwrap();
        assert_eq!(reg.node_plugin(&n("a"), &p), NodePlugin::UnknownNode);
        reg.set_node_status(&n("a"), NodeStatus::Ready);
        assert_eq!(reg.node_plugin(&n("a"), &p), NodePlugin::Missing);
        reg.update(
            &n("a"),
            &p,
            Instance::Node {
                plugin_node: id.clone(),
                health: Health::Healthy,
            },
        );
        assert_eq!(
            reg.node_plugin(&n("a"), &p),
            NodePlugin::Ready {
                plugin_node: id.clone()
            }
        );
        reg.set_node_status(&n("a"), NodeStatus::Down);
        assert_eq!(reg.node_plugin(&n("a"), &p), NodePlugin::NodeDown);
        assert_eq!(reg.plugin_node_id(&n("a"), &p), Some(id));
        reg.set_node_status(&n("a"), NodeStatus::Gone);
        assert_eq!(reg.node_plugin(&n("a"), &p), NodePlugin::NodeGone);
        // A late report does not resurrect a gone node.
        reg.update(&n("a"), &p, Instance::Controller(Health::Healthy));
        assert!(reg.controllers(&p).ready.is_empty());
        reg.remove(&n("zz"), &p, ServiceKind::Node);
    }
}
