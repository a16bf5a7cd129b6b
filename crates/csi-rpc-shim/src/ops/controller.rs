//! The controller calls.

use csi_structs::{NodeId, PluginNodeId};

use super::{Acting, Op, PluginFuture, Routing, query_from_wire, query_to_wire};
use crate::backend::{LocalPlugins, ShimContext};
use crate::request::{
    ControllerAttach, ControllerAttached, ControllerDetach, ControllerExpand, ControllerExpanded,
    ControllerValidate, CreateSnapshot, CreateVolume, CreatedVolume, DeleteSnapshot, DeleteVolume,
    ListSnapshots, ListVolumes, ListedVolume, SnapshotInfo, SnapshotPage, Validated, VolumePage,
};
use crate::rpc::AgentRpc;
use crate::wire::{
    Decoder, InvalidMessage, WireId, WireMap, capability_to_wire, content_source_to_wire, pb,
    requirement_to_wire, topology_to_wire,
};

impl Op for ControllerAttach {
    type Output = ControllerAttached;
    type Wire = pb::ControllerAttachRequest;
    type WireOut = pb::ControllerAttachResponse;
    const RPC: AgentRpc = AgentRpc::ControllerAttach;

    fn volume(&self) -> Option<&csi_structs::VolumeId> {
        Some(&self.volume)
    }

    fn routing(&self) -> Routing<'_> {
        Routing::Controller {
            query: &self.query,
            key: self.volume.as_str(),
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ForNode {
            node: &self.node,
            plugin: &self.query.plugin,
            plugin_node: Some(&self.plugin_node),
        }
    }

    fn to_wire(&self, target: &NodeId) -> Self::Wire {
        pb::ControllerAttachRequest {
            query: Some(query_to_wire(&self.query, target)),
            volume_id: self.volume.to_wire(),
            external_volume_id: self.external_volume.to_wire(),
            node_id: self.node.to_wire(),
            plugin_node_id: self.plugin_node.to_wire(),
            capability: Some(capability_to_wire(&self.capability)),
            read_only: self.read_only,
            secrets: self.secrets.to_wire_map(),
            volume_context: self.volume_context.to_wire_map(),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let (query, target) = query_from_wire(&mut d, w.query);
        let volume = d.id("volume_id", w.volume_id);
        let external_volume = d.id("external_volume_id", w.external_volume_id);
        let node = d.id("node_id", w.node_id);
        let plugin_node = d.id("plugin_node_id", w.plugin_node_id);
        let capability = d.capability("capability", w.capability);
        let secrets = d.map("secrets", w.secrets);
        let volume_context = d.map("volume_context", w.volume_context);
        d.finish(|| {
            Some((
                ControllerAttach {
                    query: query?,
                    volume: volume?,
                    external_volume: external_volume?,
                    node: node?,
                    plugin_node: plugin_node?,
                    capability: capability?,
                    read_only: w.read_only,
                    secrets: secrets?,
                    volume_context: volume_context?,
                },
                target?,
            ))
        })
    }

    fn output_to_wire(out: Self::Output) -> Self::WireOut {
        pb::ControllerAttachResponse {
            publish_context: out.publish_context.to_wire_map(),
        }
    }

    fn output_from_wire(w: Self::WireOut) -> Result<Self::Output, InvalidMessage> {
        let mut d = Decoder::new();
        let publish_context = d.map("publish_context", w.publish_context);
        d.finish(|| {
            Some(ControllerAttached {
                publish_context: publish_context?,
            })
        })
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, Self::Output> {
        plugins.controller_attach(ctx, self)
    }
}

impl Op for ControllerDetach {
    type Output = ();
    type Wire = pb::ControllerDetachRequest;
    type WireOut = pb::ControllerDetachResponse;
    const RPC: AgentRpc = AgentRpc::ControllerDetach;
    const RELEASE_STEP: bool = true;

    fn volume(&self) -> Option<&csi_structs::VolumeId> {
        Some(&self.volume)
    }

    fn routing(&self) -> Routing<'_> {
        Routing::Controller {
            query: &self.query,
            key: self.volume.as_str(),
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ForNode {
            node: &self.node,
            plugin: &self.query.plugin,
            plugin_node: Some(&self.plugin_node),
        }
    }

    fn to_wire(&self, target: &NodeId) -> Self::Wire {
        pb::ControllerDetachRequest {
            query: Some(query_to_wire(&self.query, target)),
            volume_id: self.volume.to_wire(),
            external_volume_id: self.external_volume.to_wire(),
            node_id: self.node.to_wire(),
            plugin_node_id: self.plugin_node.to_wire(),
            secrets: self.secrets.to_wire_map(),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let (query, target) = query_from_wire(&mut d, w.query);
        let volume = d.id("volume_id", w.volume_id);
        let external_volume = d.id("external_volume_id", w.external_volume_id);
        let node = d.id("node_id", w.node_id);
        let plugin_node = d.id("plugin_node_id", w.plugin_node_id);
        let secrets = d.map("secrets", w.secrets);
        d.finish(|| {
            Some((
                ControllerDetach {
                    query: query?,
                    volume: volume?,
                    external_volume: external_volume?,
                    node: node?,
                    plugin_node: plugin_node?,
                    secrets: secrets?,
                },
                target?,
            ))
        })
    }

    fn output_to_wire((): ()) -> Self::WireOut {
        pb::ControllerDetachResponse {}
    }

    fn output_from_wire(_: Self::WireOut) -> Result<(), InvalidMessage> {
        Ok(())
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, ()> {
        plugins.controller_detach(ctx, self)
    }
}

impl Op for ControllerValidate {
    type Output = Validated;
    type Wire = pb::ControllerValidateRequest;
    type WireOut = pb::ControllerValidateResponse;
    const RPC: AgentRpc = AgentRpc::ControllerValidate;

    fn volume(&self) -> Option<&csi_structs::VolumeId> {
        Some(&self.volume)
    }

    fn routing(&self) -> Routing<'_> {
        Routing::Controller {
            query: &self.query,
            key: self.volume.as_str(),
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ReadOnly
    }

    fn to_wire(&self, target: &NodeId) -> Self::Wire {
        pb::ControllerValidateRequest {
            query: Some(query_to_wire(&self.query, target)),
            volume_id: self.volume.to_wire(),
            external_volume_id: self.external_volume.to_wire(),
            capabilities: self.capabilities.iter().map(capability_to_wire).collect(),
            volume_context: self.volume_context.to_wire_map(),
            parameters: self.parameters.to_wire_map(),
            secrets: self.secrets.to_wire_map(),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let (query, target) = query_from_wire(&mut d, w.query);
        let volume = d.id("volume_id", w.volume_id);
        let external_volume = d.id("external_volume_id", w.external_volume_id);
        let capabilities = d.capabilities("capabilities", w.capabilities);
        let volume_context = d.map("volume_context", w.volume_context);
        let parameters = d.map("parameters", w.parameters);
        let secrets = d.map("secrets", w.secrets);
        d.finish(|| {
            Some((
                ControllerValidate {
                    query: query?,
                    volume: volume?,
                    external_volume: external_volume?,
                    capabilities: capabilities?,
                    volume_context: volume_context?,
                    parameters: parameters?,
                    secrets: secrets?,
                },
                target?,
            ))
        })
    }

    fn output_to_wire(out: Validated) -> Self::WireOut {
        match out {
            Validated::Confirmed => pb::ControllerValidateResponse {
                confirmed: true,
                message: String::new(),
            },
            Validated::NotConfirmed { message } => pb::ControllerValidateResponse {
                confirmed: false,
                message: crate::wire::cap_message(message),
            },
        }
    }

    fn output_from_wire(w: Self::WireOut) -> Result<Validated, InvalidMessage> {
        Ok(if w.confirmed {
            Validated::Confirmed
        } else {
            Validated::NotConfirmed {
                message: crate::wire::cap_message(w.message),
            }
        })
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, Validated> {
        plugins.controller_validate(ctx, self)
    }
}

impl Op for CreateVolume {
    type Output = CreatedVolume;
    type Wire = pb::ControllerCreateVolumeRequest;
    type WireOut = pb::ControllerCreateVolumeResponse;
    const RPC: AgentRpc = AgentRpc::ControllerCreateVolume;

    fn volume(&self) -> Option<&csi_structs::VolumeId> {
        Some(&self.volume)
    }

    fn routing(&self) -> Routing<'_> {
        Routing::Controller {
            query: &self.query,
            key: self.volume.as_str(),
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ClusterWide
    }

    fn to_wire(&self, target: &NodeId) -> Self::Wire {
        pb::ControllerCreateVolumeRequest {
            query: Some(query_to_wire(&self.query, target)),
            volume_id: self.volume.to_wire(),
            required_bytes: self.required_bytes,
            limit_bytes: self.limit_bytes,
            capabilities: self.capabilities.iter().map(capability_to_wire).collect(),
            parameters: self.parameters.to_wire_map(),
            secrets: self.secrets.to_wire_map(),
            accessibility_requirements: self
                .accessibility_requirements
                .as_ref()
                .map(requirement_to_wire),
            content_source: self.content_source.as_ref().map(content_source_to_wire),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let (query, target) = query_from_wire(&mut d, w.query);
        let volume = d.id("volume_id", w.volume_id);
        let (required_bytes, limit_bytes) = d.capacity(w.required_bytes, w.limit_bytes);
        let capabilities = d.capabilities("capabilities", w.capabilities);
        let parameters = d.map("parameters", w.parameters);
        let secrets = d.map("secrets", w.secrets);
        let requirements =
            d.requirement("accessibility_requirements", w.accessibility_requirements);
        let content_source = d.content_source("content_source", w.content_source);
        d.finish(|| {
            Some((
                CreateVolume {
                    query: query?,
                    volume: volume?,
                    required_bytes,
                    limit_bytes,
                    capabilities: capabilities?,
                    parameters: parameters?,
                    secrets: secrets?,
                    accessibility_requirements: requirements?,
                    content_source: content_source?,
                },
                target?,
            ))
        })
    }

    fn output_to_wire(out: CreatedVolume) -> Self::WireOut {
        pb::ControllerCreateVolumeResponse {
            external_volume_id: out.external_volume.to_wire(),
            capacity_bytes: out.capacity_bytes,
            volume_context: out.volume_context.to_wire_map(),
            accessible_topology: out
                .accessible_topology
                .iter()
                .map(topology_to_wire)
                .collect(),
        }
    }

    fn output_from_wire(w: Self::WireOut) -> Result<CreatedVolume, InvalidMessage> {
        let mut d = Decoder::new();
        let external_volume = d.id("external_volume_id", w.external_volume_id);
        let capacity_bytes = d.non_negative("capacity_bytes", w.capacity_bytes);
        let volume_context = d.map("volume_context", w.volume_context);
        let accessible_topology = d.topologies("accessible_topology", w.accessible_topology);
        d.finish(|| {
            Some(CreatedVolume {
                external_volume: external_volume?,
                capacity_bytes,
                volume_context: volume_context?,
                accessible_topology: accessible_topology?,
            })
        })
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, CreatedVolume> {
        plugins.create_volume(ctx, self)
    }
}

impl Op for DeleteVolume {
    type Output = ();
    type Wire = pb::ControllerDeleteVolumeRequest;
    type WireOut = pb::ControllerDeleteVolumeResponse;
    const RPC: AgentRpc = AgentRpc::ControllerDeleteVolume;

    fn volume(&self) -> Option<&csi_structs::VolumeId> {
        Some(&self.volume)
    }

    fn routing(&self) -> Routing<'_> {
        Routing::Controller {
            query: &self.query,
            key: self.volume.as_str(),
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ClusterWide
    }

    fn to_wire(&self, target: &NodeId) -> Self::Wire {
        pb::ControllerDeleteVolumeRequest {
            query: Some(query_to_wire(&self.query, target)),
            volume_id: self.volume.to_wire(),
            external_volume_id: self.external_volume.to_wire(),
            secrets: self.secrets.to_wire_map(),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let (query, target) = query_from_wire(&mut d, w.query);
        let volume = d.id("volume_id", w.volume_id);
        let external_volume = d.id("external_volume_id", w.external_volume_id);
        let secrets = d.map("secrets", w.secrets);
        d.finish(|| {
            Some((
                DeleteVolume {
                    query: query?,
                    volume: volume?,
                    external_volume: external_volume?,
                    secrets: secrets?,
                },
                target?,
            ))
        })
    }

    fn output_to_wire((): ()) -> Self::WireOut {
        pb::ControllerDeleteVolumeResponse {}
    }

    fn output_from_wire(_: Self::WireOut) -> Result<(), InvalidMessage> {
        Ok(())
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, ()> {
        plugins.delete_volume(ctx, self)
    }
}

impl Op for ControllerExpand {
    type Output = ControllerExpanded;
    type Wire = pb::ControllerExpandVolumeRequest;
    type WireOut = pb::ControllerExpandVolumeResponse;
    const RPC: AgentRpc = AgentRpc::ControllerExpandVolume;

    fn volume(&self) -> Option<&csi_structs::VolumeId> {
        Some(&self.volume)
    }

    fn routing(&self) -> Routing<'_> {
        Routing::Controller {
            query: &self.query,
            key: self.volume.as_str(),
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ClusterWide
    }

    fn to_wire(&self, target: &NodeId) -> Self::Wire {
        pb::ControllerExpandVolumeRequest {
            query: Some(query_to_wire(&self.query, target)),
            volume_id: self.volume.to_wire(),
            external_volume_id: self.external_volume.to_wire(),
            required_bytes: self.required_bytes,
            limit_bytes: self.limit_bytes,
            capability: self.capability.as_ref().map(capability_to_wire),
            secrets: self.secrets.to_wire_map(),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let (query, target) = query_from_wire(&mut d, w.query);
        let volume = d.id("volume_id", w.volume_id);
        let external_volume = d.id("external_volume_id", w.external_volume_id);
        let (required_bytes, limit_bytes) = d.capacity(w.required_bytes, w.limit_bytes);
        let capability = match w.capability {
            None => Some(None),
            Some(c) => d
                .capability_at(&csi_structs::FieldPath::named("capability"), c)
                .map(Some),
        };
        let secrets = d.map("secrets", w.secrets);
        d.finish(|| {
            Some((
                ControllerExpand {
                    query: query?,
                    volume: volume?,
                    external_volume: external_volume?,
                    required_bytes,
                    limit_bytes,
                    capability: capability?,
                    secrets: secrets?,
                },
                target?,
            ))
        })
    }

    fn output_to_wire(out: ControllerExpanded) -> Self::WireOut {
        pb::ControllerExpandVolumeResponse {
            capacity_bytes: out.capacity_bytes,
            node_expansion_required: out.node_expansion_required,
        }
    }

    fn output_from_wire(w: Self::WireOut) -> Result<ControllerExpanded, InvalidMessage> {
        let mut d = Decoder::new();
        let capacity_bytes = d.non_negative("capacity_bytes", w.capacity_bytes);
        d.finish(|| {
            Some(ControllerExpanded {
                capacity_bytes,
                node_expansion_required: w.node_expansion_required,
            })
        })
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, ControllerExpanded> {
        plugins.controller_expand(ctx, self)
    }
}

impl Op for ListVolumes {
    type Output = VolumePage;
    type Wire = pb::ControllerListVolumesRequest;
    type WireOut = pb::ControllerListVolumesResponse;
    const RPC: AgentRpc = AgentRpc::ControllerListVolumes;

    fn routing(&self) -> Routing<'_> {
        Routing::Controller {
            query: &self.query,
            key: self.query.plugin.as_str(),
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ReadOnly
    }

    fn to_wire(&self, target: &NodeId) -> Self::Wire {
        pb::ControllerListVolumesRequest {
            query: Some(query_to_wire(&self.query, target)),
            max_entries: self.max_entries,
            starting_token: self.starting_token.clone(),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let (query, target) = query_from_wire(&mut d, w.query);
        let max_entries = d.non_negative("max_entries", w.max_entries);
        let starting_token = d.string("starting_token", w.starting_token);
        d.finish(|| {
            Some((
                ListVolumes {
                    query: query?,
                    max_entries,
                    starting_token,
                },
                target?,
            ))
        })
    }

    fn output_to_wire(out: VolumePage) -> Self::WireOut {
        pb::ControllerListVolumesResponse {
            entries: out
                .entries
                .into_iter()
                .map(|v| pb::ListedVolume {
                    external_volume_id: v.external_volume.to_wire(),
                    capacity_bytes: v.capacity_bytes,
                    published_plugin_node_ids: v
                        .published_nodes
                        .iter()
                        .map(WireId::to_wire)
                        .collect(),
                })
                .collect(),
            next_token: out.next_token,
        }
    }

    fn output_from_wire(w: Self::WireOut) -> Result<VolumePage, InvalidMessage> {
        let mut d = Decoder::new();
        let mut entries = Vec::with_capacity(w.entries.len());
        let mut complete = true;
        for (i, v) in w.entries.into_iter().enumerate() {
            let at = csi_structs::FieldPath::named("entries").index(i);
            let external_volume = d.id_at(
                &at.clone().field("external_volume_id"),
                v.external_volume_id,
            );
            let published: Vec<Option<PluginNodeId>> = v
                .published_plugin_node_ids
                .into_iter()
                .enumerate()
                .map(|(j, id)| d.id_at(&at.clone().field("published_plugin_node_ids").index(j), id))
                .collect();
            let capacity_bytes =
                d.non_negative_at(&at.clone().field("capacity_bytes"), v.capacity_bytes);
            match (
                external_volume,
                published.into_iter().collect::<Option<Vec<_>>>(),
            ) {
                (Some(external_volume), Some(published_nodes)) => entries.push(ListedVolume {
                    external_volume,
                    capacity_bytes,
                    published_nodes,
                }),
                _ => complete = false,
            }
        }
        let next_token = d.string("next_token", w.next_token);
        d.finish(|| {
            complete.then_some(VolumePage {
                entries,
                next_token,
            })
        })
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, VolumePage> {
        plugins.list_volumes(ctx, self)
    }
}

fn snapshot_to_wire(s: SnapshotInfo) -> pb::Snapshot {
    pb::Snapshot {
        snapshot_id: s.snapshot.to_wire(),
        source_external_volume_id: s.source.to_wire(),
        size_bytes: s.size_bytes,
        ready_to_use: s.ready_to_use,
    }
}

fn snapshot_from_wire(
    d: &mut Decoder,
    at: &csi_structs::FieldPath,
    s: pb::Snapshot,
) -> Option<SnapshotInfo> {
    let snapshot = d.id_at(&at.clone().field("snapshot_id"), s.snapshot_id);
    let source = d.id_at(
        &at.clone().field("source_external_volume_id"),
        s.source_external_volume_id,
    );
    let size_bytes = d.non_negative_at(&at.clone().field("size_bytes"), s.size_bytes);
    Some(SnapshotInfo {
        snapshot: snapshot?,
        source: source?,
        size_bytes,
        ready_to_use: s.ready_to_use,
    })
}

impl Op for CreateSnapshot {
    type Output = SnapshotInfo;
    type Wire = pb::ControllerCreateSnapshotRequest;
    type WireOut = pb::ControllerCreateSnapshotResponse;
    const RPC: AgentRpc = AgentRpc::ControllerCreateSnapshot;

    fn volume(&self) -> Option<&csi_structs::VolumeId> {
        Some(&self.volume)
    }

    fn routing(&self) -> Routing<'_> {
        Routing::Controller {
            query: &self.query,
            key: self.volume.as_str(),
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ClusterWide
    }

    fn to_wire(&self, target: &NodeId) -> Self::Wire {
        pb::ControllerCreateSnapshotRequest {
            query: Some(query_to_wire(&self.query, target)),
            volume_id: self.volume.to_wire(),
            source_external_volume_id: self.source.to_wire(),
            name: self.name.clone(),
            parameters: self.parameters.to_wire_map(),
            secrets: self.secrets.to_wire_map(),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let (query, target) = query_from_wire(&mut d, w.query);
        let volume = d.id("volume_id", w.volume_id);
        let source = d.id("source_external_volume_id", w.source_external_volume_id);
        let name = d.request_name("name", w.name);
        let parameters = d.map("parameters", w.parameters);
        let secrets = d.map("secrets", w.secrets);
        d.finish(|| {
            Some((
                CreateSnapshot {
                    query: query?,
                    volume: volume?,
                    source: source?,
                    name,
                    parameters: parameters?,
                    secrets: secrets?,
                },
                target?,
            ))
        })
    }

    fn output_to_wire(out: SnapshotInfo) -> Self::WireOut {
        pb::ControllerCreateSnapshotResponse {
            snapshot: Some(snapshot_to_wire(out)),
        }
    }

    fn output_from_wire(w: Self::WireOut) -> Result<SnapshotInfo, InvalidMessage> {
        let mut d = Decoder::new();
        let at = csi_structs::FieldPath::named("snapshot");
        let snapshot = match w.snapshot {
            Some(s) => snapshot_from_wire(&mut d, &at, s),
            None => {
                let _ = d.id_at::<csi_structs::SnapshotId>(&at, String::new());
                None
            }
        };
        d.finish(|| snapshot)
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, SnapshotInfo> {
        plugins.create_snapshot(ctx, self)
    }
}

impl Op for DeleteSnapshot {
    type Output = ();
    type Wire = pb::ControllerDeleteSnapshotRequest;
    type WireOut = pb::ControllerDeleteSnapshotResponse;
    const RPC: AgentRpc = AgentRpc::ControllerDeleteSnapshot;

    fn routing(&self) -> Routing<'_> {
        Routing::Controller {
            query: &self.query,
            key: self.snapshot.as_str(),
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ClusterWide
    }

    fn to_wire(&self, target: &NodeId) -> Self::Wire {
        pb::ControllerDeleteSnapshotRequest {
            query: Some(query_to_wire(&self.query, target)),
            snapshot_id: self.snapshot.to_wire(),
            secrets: self.secrets.to_wire_map(),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let (query, target) = query_from_wire(&mut d, w.query);
        let snapshot = d.id("snapshot_id", w.snapshot_id);
        let secrets = d.map("secrets", w.secrets);
        d.finish(|| {
            Some((
                DeleteSnapshot {
                    query: query?,
                    snapshot: snapshot?,
                    secrets: secrets?,
                },
                target?,
            ))
        })
    }

    fn output_to_wire((): ()) -> Self::WireOut {
        pb::ControllerDeleteSnapshotResponse {}
    }

    fn output_from_wire(_: Self::WireOut) -> Result<(), InvalidMessage> {
        Ok(())
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, ()> {
        plugins.delete_snapshot(ctx, self)
    }
}

impl Op for ListSnapshots {
    type Output = SnapshotPage;
    type Wire = pb::ControllerListSnapshotsRequest;
    type WireOut = pb::ControllerListSnapshotsResponse;
    const RPC: AgentRpc = AgentRpc::ControllerListSnapshots;

    fn routing(&self) -> Routing<'_> {
        Routing::Controller {
            query: &self.query,
            key: self.query.plugin.as_str(),
        }
    }

    fn acting(&self) -> Acting<'_> {
        Acting::ReadOnly
    }

    fn to_wire(&self, target: &NodeId) -> Self::Wire {
        pb::ControllerListSnapshotsRequest {
            query: Some(query_to_wire(&self.query, target)),
            source_external_volume_id: self
                .source
                .as_ref()
                .map(WireId::to_wire)
                .unwrap_or_default(),
            snapshot_id: self
                .snapshot
                .as_ref()
                .map(WireId::to_wire)
                .unwrap_or_default(),
            max_entries: self.max_entries,
            starting_token: self.starting_token.clone(),
            secrets: self.secrets.to_wire_map(),
        }
    }

    fn from_wire(w: Self::Wire) -> Result<(Self, NodeId), InvalidMessage> {
        let mut d = Decoder::new();
        let (query, target) = query_from_wire(&mut d, w.query);
        let source = d.opt_id("source_external_volume_id", w.source_external_volume_id);
        let snapshot = d.opt_id("snapshot_id", w.snapshot_id);
        let max_entries = d.non_negative("max_entries", w.max_entries);
        let starting_token = d.string("starting_token", w.starting_token);
        let secrets = d.map("secrets", w.secrets);
        d.finish(|| {
            Some((
                ListSnapshots {
                    query: query?,
                    source: source?,
                    snapshot: snapshot?,
                    max_entries,
                    starting_token,
                    secrets: secrets?,
                },
                target?,
            ))
        })
    }

    fn output_to_wire(out: SnapshotPage) -> Self::WireOut {
        pb::ControllerListSnapshotsResponse {
            entries: out.entries.into_iter().map(snapshot_to_wire).collect(),
            next_token: out.next_token,
        }
    }

    fn output_from_wire(w: Self::WireOut) -> Result<SnapshotPage, InvalidMessage> {
        let mut d = Decoder::new();
        let n = w.entries.len();
        let entries: Vec<SnapshotInfo> = w
            .entries
            .into_iter()
            .enumerate()
            .filter_map(|(i, s)| {
                snapshot_from_wire(
                    &mut d,
                    &csi_structs::FieldPath::named("entries").index(i),
                    s,
                )
            })
            .collect();
        let next_token = d.string("next_token", w.next_token);
        d.finish(|| {
            (entries.len() == n).then_some(SnapshotPage {
                entries,
                next_token,
            })
        })
    }

    fn serve<'a>(
        self,
        plugins: &'a dyn LocalPlugins,
        ctx: &'a ShimContext,
    ) -> PluginFuture<'a, SnapshotPage> {
        plugins.list_snapshots(ctx, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_entry_errors_name_the_entry() {
        let listed = |id: &str, bytes: i64| pb::ListedVolume {
            external_volume_id: id.into(),
            capacity_bytes: bytes,
            published_plugin_node_ids: vec![],
        };
        let volumes = pb::ControllerListVolumesResponse {
            entries: vec![listed("v0", 1), listed("v1", -5), listed("v2", 1)],
            next_token: String::new(),
        };
        let err = ListVolumes::output_from_wire(volumes).unwrap_err();
        let lines = err.lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("entries[1].capacity_bytes"),
            "{lines:?}"
        );

        let snapshot = |bytes: i64| pb::Snapshot {
            snapshot_id: "s".into(),
            source_external_volume_id: "v".into(),
            size_bytes: bytes,
            ready_to_use: true,
        };
        let snapshots = pb::ControllerListSnapshotsResponse {
            entries: vec![snapshot(1), snapshot(1), snapshot(-1)],
            next_token: String::new(),
        };
        let err = ListSnapshots::output_from_wire(snapshots).unwrap_err();
        let lines = err.lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with("entries[2].size_bytes"), "{lines:?}");
    }
}
