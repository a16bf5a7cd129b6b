//! Expand: the controller, then the nodes where the volume is published.

use std::collections::{BTreeMap, BTreeSet};

use csi_rpc_shim::{ControllerExpand, ControllerQuery, NodeExpand};
use csi_structs::{NodeId, SecretsUse, VolumeExpansion, VolumeId, WorkloadId};

use super::error::{CallFailure, deleting, invalid, wire_size};
use super::{ServiceError, ServiceEvent, VolumeService};

/// What an expansion did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expanded {
    /// The volume's capacity now, as the plugin said (or as asked, when it did not).
    pub capacity_bytes: u64,
    /// Whether `ControllerExpandVolume` ran.
    pub controller_expanded: bool,
    /// The nodes where `NodeExpandVolume` ran.
    pub nodes_expanded: Vec<NodeId>,
    /// Whether a `NodeExpandVolume` waits for the volume's next claim (it is published
    /// nowhere now).
    pub node_expansion_pending: bool,
}

impl VolumeService {
    /// Grows a volume to `capacity_bytes`: `ControllerExpandVolume` when the plugin has
    /// controller `EXPAND_VOLUME` (a published volume only with `VolumeExpansion` `ONLINE`),
    /// then `NodeExpandVolume` on every node where it is published when the controller says
    /// so, or when the plugin expands on the node only; the new capacity is recorded. A node
    /// expansion with no node to run on waits for the volume's next claim.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Unsupported`] when the plugin cannot expand it (no `EXPAND_VOLUME`; an
    /// offline-only plugin and a published volume; node-only expansion of a volume published
    /// nowhere), [`ServiceError::Invalid`] for a capacity of 0 or below the current one, and
    /// the calls' errors (a node's saying what the controller step already did).
    pub async fn expand(
        &self,
        volume: &VolumeId,
        capacity_bytes: u64,
    ) -> Result<Expanded, ServiceError> {
        self.to_the_end("expand", Some(volume), |s| {
            let volume = volume.clone();
            async move { s.run_expand(&volume, capacity_bytes).await }
        })
        .await
    }

    /// [`expand`](Self::expand), in its task.
    async fn run_expand(
        &self,
        volume: &VolumeId,
        capacity_bytes: u64,
    ) -> Result<Expanded, ServiceError> {
        let entry = self.entry(volume)?;
        if entry.deleting {
            return Err(deleting(&entry.id));
        }
        let wanted = capacity_bytes;
        if wanted == 0 {
            return Err(invalid("capacity_bytes", "must be more than 0"));
        }
        let wire_wanted = wire_size("capacity_bytes", wanted)?;
        if let Some(current) = entry.capacity_bytes.filter(|c| wanted < *c) {
            return Err(invalid(
                "capacity_bytes",
                format!("{wanted} is below the volume's {current} bytes; volumes only grow"),
            ));
        }
        let plugin = &entry.plugin;
        let controller = self.controller_capabilities(plugin);
        let controller_can = controller
            .as_ref()
            .is_some_and(|c| c.controller.can_expand());
        let node_can = self.node_can_expand(plugin);
        if !controller_can && !node_can {
            return Err(ServiceError::Unsupported(format!(
                "plugin {plugin} cannot expand volumes: it advertises neither controller \
                 EXPAND_VOLUME nor node EXPAND_VOLUME"
            )));
        }
        let claims = self.claims_of(&entry.id);
        // One workload per node where the volume is mounted now.
        let mounted: BTreeMap<NodeId, WorkloadId> = claims
            .iter()
            .filter(|c| !c.state().is_releasing())
            .map(|c| (c.node().clone(), c.workload().clone()))
            .collect();
        let mut capacity = wanted;
        let node_step = if controller_can {
            let online = controller
                .as_ref()
                .is_some_and(|c| c.plugin.has_expansion(VolumeExpansion::Online));
            if !online && !claims.is_empty() {
                let nodes: BTreeSet<String> = claims.iter().map(|c| c.node().to_string()).collect();
                return Err(ServiceError::Unsupported(format!(
                    "plugin {plugin} expands volumes offline only (it does not advertise \
                     VolumeExpansion {}) and volume {} is published ({} claim(s), on {}): \
                     release them, then expand",
                    VolumeExpansion::Online,
                    entry.id,
                    claims.len(),
                    nodes.into_iter().collect::<Vec<_>>().join(", ")
                )));
            }
            let expanded = self
                .inner
                .shim
                .controller_expand(
                    ControllerExpand {
                        query: ControllerQuery::new(plugin.clone()),
                        volume: entry.id.clone(),
                        external_volume: entry.external_id.clone(),
                        required_bytes: wire_wanted,
                        limit_bytes: 0,
                        capability: Some(entry.capability()),
                        secrets: entry.secrets.for_use(SecretsUse::ControllerExpand),
                    },
                    self.inner.call_timeout,
                )
                .await
                .map_err(|e| ServiceError::shim("ControllerExpandVolume", &e))?;
            if let Ok(grown @ 1..) = u64::try_from(expanded.capacity_bytes) {
                capacity = grown;
            }
            tracing::info!(volume = %entry.id, capacity_bytes = capacity, node_expansion_required = expanded.node_expansion_required, "volume expanded by the controller");
            expanded.node_expansion_required
        } else if mounted.is_empty() {
            return Err(ServiceError::Unsupported(format!(
                "plugin {plugin} expands volumes on the node only (no controller EXPAND_VOLUME) \
                 and volume {} is published nowhere: claim it, then expand",
                entry.id
            )));
        } else {
            true
        };
        self.inner
            .catalog
            .update(&entry.id, &|e| {
                e.capacity_bytes = Some(capacity);
                e.node_expansion = node_step.then_some(wanted);
            })
            .await?;
        let mut nodes_expanded = Vec::new();
        if node_step {
            for (node, workload) in &mounted {
                let grown = self
                    .inner
                    .shim
                    .node_expand(
                        NodeExpand {
                            plugin: plugin.clone(),
                            volume: entry.id.clone(),
                            external_volume: entry.external_id.clone(),
                            node: node.clone(),
                            workload: workload.clone(),
                            required_bytes: wire_wanted,
                            limit_bytes: 0,
                            capability: entry.capability(),
                            secrets: entry.secrets.for_use(SecretsUse::NodeExpand),
                        },
                        self.inner.call_timeout,
                    )
                    .await
                    .map_err(|e| ServiceError::Call {
                        step: "NodeExpandVolume",
                        class: e.class(),
                        failure: CallFailure::of_shim(&e),
                        detail: format!(
                            "on node {node}: {e}; {}run `volume expand` again to finish",
                            if controller_can {
                                format!(
                                    "ControllerExpandVolume already grew it to {capacity} bytes; "
                                )
                            } else {
                                String::new()
                            }
                        ),
                    })?;
                match u64::try_from(grown.capacity_bytes) {
                    Ok(grown) if !controller_can && grown > capacity => capacity = grown,
                    _ => {}
                }
                nodes_expanded.push(node.clone());
            }
            if !mounted.is_empty() {
                self.inner
                    .catalog
                    .update(&entry.id, &|e| {
                        e.capacity_bytes = Some(capacity);
                        e.node_expansion = None;
                    })
                    .await?;
            }
        }
        let node_expansion_pending = node_step && mounted.is_empty();
        self.emit(ServiceEvent::Expanded {
            volume: entry.id.clone(),
            capacity_bytes: capacity,
            controller_expanded: controller_can,
            nodes_expanded: nodes_expanded.clone(),
            node_expansion_pending,
        });
        Ok(Expanded {
            capacity_bytes: capacity,
            controller_expanded: controller_can,
            nodes_expanded,
            node_expansion_pending,
        })
    }
}
