//! The release pipeline's detachers through csi-rpc-shim (cargo feature `shim`), for an
//! orchestrator whose agents forward calls to each other.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use csi_claims::driver::{ControllerDetacher, NodeDetacher};
use csi_claims::{ControllerDetachRequest, DetachError, DetachRpc, NodeDetachRequest};
use csi_rpc_shim::{ControllerDetach, ControllerQuery, NodeDetach, Shim, ShimError};
use csi_structs::{AccessType, AccessTypeKind, MountOptions, VolumeCapability};

use super::controller::SecretsLookup;

/// Both detacher traits through a [`Shim`]: it serves a call here when this node hosts the
/// target (no network hop) and otherwise forwards it to the agent that does, failing over
/// across controllers.
///
/// The node step goes to the claim's node, whose shim backend runs `NodeUnpublishVolume` and,
/// when its volume manager says the claim was the last user there, `NodeUnstageVolume` (see
/// [`VolumeManager::unmount`](crate::volumes::VolumeManager::unmount)). The release
/// pipeline's separate unstage request is therefore already done when it comes, and answers
/// `Ok` at once.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use csi_node::detach::{NoSecrets, ShimDetacher};
///
/// # fn wire(shim: csi_rpc_shim::Shim) {
/// let detacher = Arc::new(ShimDetacher::new(shim, Duration::from_secs(30), Arc::new(NoSecrets)));
/// // Pass `detacher` as both the node and the controller detacher of a ClaimsDriver.
/// # drop(detacher);
/// # }
/// ```
#[derive(Clone)]
pub struct ShimDetacher {
    shim: Shim,
    timeout: Duration,
    secrets: Arc<dyn SecretsLookup>,
}

impl ShimDetacher {
    /// Detaches through `shim`, each call under `timeout`, with the controller secrets
    /// `secrets` finds for the volume.
    pub fn new(shim: Shim, timeout: Duration, secrets: Arc<dyn SecretsLookup>) -> Self {
        Self {
            shim,
            timeout,
            secrets,
        }
    }
}

impl std::fmt::Debug for ShimDetacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShimDetacher")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn shim_error(rpc: DetachRpc, e: &ShimError) -> DetachError {
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
            .map_err(|e| shim_error(DetachRpc::NodeUnpublish, &e))
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
            secrets: self.secrets.controller_secrets(&r.volume),
        };
        // Under a fenced duty, the agent that serves the hop must stop retrying by the
        // holder's deadline: a holder paused meanwhile could not cancel it. The shim also
        // stamps that deadline in wall-clock time, so an agent that reads the request only
        // after it (paused with the request in its socket) refuses it without calling the
        // plugin, and this holder sees its own deadline passing (uncertain: taken again).
        let timeout = r.duty_deadline.map_or(self.timeout, |deadline| {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            self.timeout.min(left)
        });
        self.shim
            .controller_detach(request, timeout)
            .await
            .map_err(|e| shim_error(DetachRpc::ControllerUnpublish, &e))
    }
}
