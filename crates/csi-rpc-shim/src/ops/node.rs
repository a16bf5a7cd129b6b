//! The node calls: served only on the node named in the request.

use csi_structs::NodeId;

use super::{Acting, Op, PluginFuture, Routing};
use crate::backend::{LocalPlugins, ShimContext};
use crate::request::{NodeDetach, NodeExpand, NodeExpanded};
use crate::rpc::AgentRpc;
use crate::wire::{Decoder, InvalidMessage, WireId, WireMap, capability_to_wire, pb};

impl Op for NodeDetach {
    type Output = ();
    type Wire = pb::NodeDetachRequest;
    type WireOut = pb::NodeDetachResponse;
    const RPC: AgentRpc = AgentRpc::NodeDetach;
    const RELEASE_STEP: bool = true;

    fn volume(&self) -> Option<&csi_structs::VolumeId> {
        Some(&self.volume)
    }

    fn routing(&self) -> Routing<'_> {
        Routing::Node {
            plugin: &self.plugin,
            node: &self.node,
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ForNode {
            node: &self.node,
            plugin: &self.plugin,
            plugin_node: None,
        }
    }

    fn to_wire(&self, _target: &NodeId) -> Self::Wire {
        pb::NodeDetachRequest {
            plugin_id: self.plugin.to_wire(),
            volume_id: self.volume.to_wire(),
            external_volume_id: self.external_volume.to_wire(),
            node_id: self.node.to_wire(),
            workload_id: self.workload.to_wire(),
            capability: Some(capability_to_wire(&self.capability)),
            read_only: self.read_only,
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let plugin = d.id("plugin_id", w.plugin_id);
        let volume = d.id("volume_id", w.volume_id);
        let external_volume = d.id("external_volume_id", w.external_volume_id);
        let node: Option<NodeId> = d.id("node_id", w.node_id);
        let workload = d.id("workload_id", w.workload_id);
        let capability = d.capability("capability", w.capability);
        d.finish(|| {
            let node = node?;
            Some((
                NodeDetach {
                    plugin: plugin?,
                    volume: volume?,
                    external_volume: external_volume?,
                    node: node.clone(),
                    workload: workload?,
                    capability: capability?,
                    read_only: w.read_only,
                },
                node,
            ))
        })
    }

    fn output_to_wire((): ()) -> Self::WireOut {
        pb::NodeDetachResponse {}
    }

    fn output_from_wire(_: Self::WireOut) -> Result<(), InvalidMessage> {
        Ok(())
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, ()> {
        plugins.node_detach(ctx, self)
    }
}

impl Op for NodeExpand {
    type Output = NodeExpanded;
    type Wire = pb::NodeExpandRequest;
    type WireOut = pb::NodeExpandResponse;
    const RPC: AgentRpc = AgentRpc::NodeExpand;

    fn volume(&self) -> Option<&csi_structs::VolumeId> {
        Some(&self.volume)
    }

    fn routing(&self) -> Routing<'_> {
        Routing::Node {
            plugin: &self.plugin,
            node: &self.node,
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ForNode {
            node: &self.node,
            plugin: &self.plugin,
            plugin_node: None,
        }
    }

    fn to_wire(&self, _target: &NodeId) -> Self::Wire {
        pb::NodeExpandRequest {
            plugin_id: self.plugin.to_wire(),
            volume_id: self.volume.to_wire(),
            external_volume_id: self.external_volume.to_wire(),
            node_id: self.node.to_wire(),
            workload_id: self.workload.to_wire(),
            required_bytes: self.required_bytes,
            limit_bytes: self.limit_bytes,
            capability: Some(capability_to_wire(&self.capability)),
            secrets: self.secrets.to_wire_map(),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let plugin = d.id("plugin_id", w.plugin_id);
        let volume = d.id("volume_id", w.volume_id);
        let external_volume = d.id("external_volume_id", w.external_volume_id);
        let node: Option<NodeId> = d.id("node_id", w.node_id);
        let workload = d.id("workload_id", w.workload_id);
        let (required_bytes, limit_bytes) = d.capacity(w.required_bytes, w.limit_bytes);
        let capability = d.capability("capability", w.capability);
        let secrets = d.map("secrets", w.secrets);
        d.finish(|| {
            let node = node?;
            Some((
                NodeExpand {
                    plugin: plugin?,
                    volume: volume?,
                    external_volume: external_volume?,
                    node: node.clone(),
                    workload: workload?,
                    required_bytes,
                    limit_bytes,
                    capability: capability?,
                    secrets: secrets?,
                },
                node,
            ))
        })
    }

    fn output_to_wire(out: NodeExpanded) -> Self::WireOut {
        pb::NodeExpandResponse {
            capacity_bytes: out.capacity_bytes,
        }
    }

    fn output_from_wire(w: Self::WireOut) -> Result<NodeExpanded, InvalidMessage> {
        let mut d = Decoder::new();
        let capacity_bytes = d.non_negative("capacity_bytes", w.capacity_bytes);
        d.finish(|| Some(NodeExpanded { capacity_bytes }))
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, NodeExpanded> {
        plugins.node_expand(ctx, self)
    }
}
