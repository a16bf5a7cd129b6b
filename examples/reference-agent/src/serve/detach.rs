//! The release pipeline's detachers for `serve`: both go through the shim, which serves a
//! call here when this node hosts the target (no network hop) and otherwise forwards it to
//! the agent that does, with failover across controllers.
//!
//! Node step: the shim's node detach runs `NodeUnpublishVolume` and, when the node's usage
//! tracker says the claim was the last user there, `NodeUnstageVolume`, on the claim's node.
//! The claim layer's separate unstage request is therefore already done when it comes.

use std::time::Duration;

use async_trait::async_trait;
use csi_claims::driver::{ControllerDetacher, NodeDetacher};
use csi_claims::{ControllerDetachRequest, DetachError, DetachRpc, NodeDetachRequest};
use csi_rpc_shim::{ControllerDetach, ControllerQuery, NodeDetach, Shim, ShimError};
use csi_structs::{AccessType, AccessTypeKind, MountOptions, Secrets, VolumeCapability};

/// Detaches through the shim.
#[derive(Clone, Debug)]
pub struct ShimDetacher {
    /// The shim.
    pub shim: Shim,
    /// The deadline of one call.
    pub timeout: Duration,
}

fn detach_error(rpc: DetachRpc, e: &ShimError) -> DetachError {
    DetachError::new(rpc, e.class(), e.to_string())
}

#[async_trait]
impl NodeDetacher for ShimDetacher {
    async fn node_unpublish(&self, r: &NodeDetachRequest) -> Result<(), DetachError> {
        let access_type = match r.attachment {
            AccessTypeKind::Block => AccessType::Block,
            AccessTypeKind::Mount => AccessType::Mount(MountOptions::new()),
        };
        let request = NodeDetach {
            plugin: r.plugin.clone(),
            volume: r.volume.clone(),
            external_volume: r.external_volume.clone(),
            node: r.node.clone(),
            workload: r.workload.clone(),
            capability: VolumeCapability::new(r.access_mode, access_type),
            read_only: r.read_only,
        };
        self.shim
            .node_detach(request, self.timeout)
            .await
            .map_err(|e| detach_error(DetachRpc::NodeUnpublish, &e))
    }

    async fn node_unstage(&self, _r: &NodeDetachRequest) -> Result<(), DetachError> {
        // Done by the node itself at the end of `node_unpublish` when it was the last user.
        Ok(())
    }
}

#[async_trait]
impl ControllerDetacher for ShimDetacher {
    async fn controller_unpublish(&self, r: &ControllerDetachRequest) -> Result<(), DetachError> {
        let request = ControllerDetach {
            query: ControllerQuery::new(r.plugin.clone()),
            volume: r.volume.clone(),
            external_volume: r.external_volume.clone(),
            node: r.node.clone(),
            plugin_node: r.plugin_node.clone(),
            secrets: Secrets::default(),
        };
        self.shim
            .controller_detach(request, self.timeout)
            .await
            .map_err(|e| detach_error(DetachRpc::ControllerUnpublish, &e))
    }
}
