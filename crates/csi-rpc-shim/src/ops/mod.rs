//! One [`Op`] per call of the agent protocol: how it is routed, whom it acts for, its wire
//! form both ways, and which [`LocalPlugins`] method serves it.
//!
//! The shim's routing, forwarding and serving code is generic over this trait, so every call
//! follows the same path and the per-call code is only the mapping of fields.

use std::future::Future;
use std::pin::Pin;

use csi_structs::{NodeId, PluginId, PluginNodeId, VolumeId};

use crate::backend::{LocalPlugins, PluginError, ShimContext};
use crate::request::ControllerQuery;
use crate::rpc::AgentRpc;
use crate::wire::{Decoder, InvalidMessage, WireId, pb};

mod controller;
mod node;

/// Where a call goes.
pub(crate) enum Routing<'a> {
    /// To a controller instance of the query's plugin, chosen by the shim; `key` keeps a
    /// volume's calls on one instance.
    Controller {
        query: &'a ControllerQuery,
        key: &'a str,
    },
    /// To the node that owns the volume, and nowhere else.
    Node {
        plugin: &'a PluginId,
        node: &'a NodeId,
    },
}

impl Routing<'_> {
    pub(crate) fn plugin(&self) -> &PluginId {
        match self {
            Routing::Controller { query, .. } => &query.plugin,
            Routing::Node { plugin, .. } => plugin,
        }
    }
}

/// On whose behalf a call acts, for authorization.
pub(crate) enum Acting<'a> {
    /// For one node (attach, detach, node expand): a node-scoped caller must be that node and,
    /// when a plugin node id is named, it must be that node's own.
    ForNode {
        node: &'a NodeId,
        plugin: &'a PluginId,
        plugin_node: Option<&'a PluginNodeId>,
    },
    /// Reads only: any authenticated caller.
    ReadOnly,
    /// Changes volumes or snapshots for the cluster: cluster-scoped callers only.
    ClusterWide,
}

/// The future a [`LocalPlugins`] method returns.
pub(crate) type PluginFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, PluginError>> + Send + 'a>>;

/// One call of the agent protocol.
pub(crate) trait Op: Clone + Send + Sync + 'static {
    /// The domain answer.
    type Output: Send + 'static;
    /// The wire request.
    type Wire: prost::Message + Default + Send + 'static;
    /// The wire answer.
    type WireOut: prost::Message + Default + Send + 'static;
    /// Which call this is.
    const RPC: AgentRpc;
    /// Whether the call is a release step (node detach, controller detach). For a release
    /// step health is advice, not a gate: an instance reported unhealthy is still tried
    /// (after the healthy ones), because a plugin whose `Probe` hangs may well unpublish.
    const RELEASE_STEP: bool = false;

    fn routing(&self) -> Routing<'_>;
    fn acting(&self) -> Acting<'_>;
    /// The orchestrator volume the call is about, when it names one (for logs).
    fn volume(&self) -> Option<&VolumeId> {
        None
    }
    /// The wire form, addressed to `target`.
    fn to_wire(&self, target: &NodeId) -> Self::Wire;
    /// The call and its target node, with every field checked.
    fn from_wire(wire: Self::Wire) -> Result<(Self, NodeId), InvalidMessage>;
    fn output_to_wire(out: Self::Output) -> Self::WireOut;
    fn output_from_wire(wire: Self::WireOut) -> Result<Self::Output, InvalidMessage>;
    /// Runs the call against this node's plugins.
    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, Self::Output>;

    /// Applies the receiving side's rules before sending, so a call that a peer would reject
    /// fails here, without a network hop: the same checks, by construction.
    fn check(&self, any_node: &NodeId) -> Result<(), InvalidMessage> {
        Self::from_wire(self.to_wire(any_node)).map(|_| ())
    }
}

/// Decodes a controller query; the target is required, the preferred node optional.
pub(crate) fn query_from_wire(
    d: &mut Decoder,
    query: Option<pb::ControllerQuery>,
) -> (Option<ControllerQuery>, Option<NodeId>) {
    let q = query.unwrap_or_default();
    let plugin = d.id("query.plugin_id", q.plugin_id);
    let preferred = d.opt_id("query.preferred_node", q.preferred_node);
    let target = d.id("query.target_node", q.target_node);
    let query = plugin
        .zip(preferred)
        .map(|(plugin, preferred_node)| ControllerQuery {
            plugin,
            preferred_node,
        });
    (query, target)
}

/// The wire form of a controller query addressed to `target`.
pub(crate) fn query_to_wire(query: &ControllerQuery, target: &NodeId) -> pb::ControllerQuery {
    pb::ControllerQuery {
        plugin_id: query.plugin.to_wire(),
        preferred_node: query
            .preferred_node
            .as_ref()
            .map(WireId::to_wire)
            .unwrap_or_default(),
        target_node: target.to_wire(),
    }
}
