//! Rules every node rpc shares: which volumes the node knows, the controller publication a
//! node call needs, the per-node volume limit.

use tonic::Status;

use crate::capabilities::{ControllerCapability, NodeCapability};
use crate::plugin::MockPlugin;
use crate::state::{State, VolumeRec};

impl MockPlugin {
    pub(super) fn has_node_cap(&self, cap: NodeCapability) -> bool {
        self.config().node_caps.contains(&cap)
    }

    /// Whether node calls must follow a controller publication to this node.
    pub(super) fn needs_controller_publish(&self) -> bool {
        self.config().role.has_controller()
            && self
                .config()
                .controller_caps
                .contains(&ControllerCapability::PublishUnpublishVolume)
    }

    /// The volume a node call is about. With a controller role the mock knows every volume
    /// and answers NOT_FOUND for others; node-only, it accepts any id (as a node plugin that
    /// learns of volumes from the CO would).
    pub(super) fn node_volume<'s>(
        &self,
        state: &'s State,
        volume_id: &str,
    ) -> Result<Option<&'s VolumeRec>, Status> {
        match state.volumes.get(volume_id) {
            Some(v) => Ok(Some(v)),
            None if self.config().role.has_controller() => Err(Status::not_found(format!(
                "volume {volume_id} does not exist"
            ))),
            None => Ok(None),
        }
    }

    /// With controller publishing, a node call needs a publication to this node and the
    /// `publish_context` it returned.
    pub(super) fn check_controller_published(
        &self,
        state: &State,
        volume_id: &str,
        publish_context: &std::collections::HashMap<String, String>,
    ) -> Result<(), Status> {
        if !self.needs_controller_publish() {
            return Ok(());
        }
        let node = self.node_id();
        let publication = state
            .publications
            .get(&(volume_id.to_string(), node.to_owned()))
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "volume {volume_id} is not controller-published to node {node}; \
                     ControllerPublishVolume must succeed first"
                ))
            })?;
        if *publish_context != publication.publish_context {
            return Err(Status::invalid_argument(format!(
                "publish_context differs from what ControllerPublishVolume returned for volume \
                 {volume_id} on node {node}"
            )));
        }
        Ok(())
    }

    pub(super) fn check_node_limit(&self, state: &State, volume_id: &str) -> Result<(), Status> {
        if self.needs_controller_publish() {
            return Ok(()); // enforced by ControllerPublishVolume
        }
        let Some(max) = self.config().max_volumes_per_node.filter(|m| *m > 0) else {
            return Ok(());
        };
        let node = self.node_id();
        let staged = state
            .staged
            .iter()
            .filter(|((n, _), _)| n == node)
            .map(|(_, s)| s.volume_id.as_str());
        let published = state
            .published
            .iter()
            .filter(|((n, _), _)| n == node)
            .map(|(_, p)| p.volume_id.as_str());
        let mut volumes: Vec<&str> = staged.chain(published).collect();
        volumes.sort_unstable();
        volumes.dedup();
        if volumes.contains(&volume_id) {
            return Ok(());
        }
        if i64::try_from(volumes.len()).unwrap_or(i64::MAX) >= max {
            return Err(Status::resource_exhausted(format!(
                "node {node} already uses {} volumes, the maximum is {max}",
                volumes.len()
            )));
        }
        Ok(())
    }
}
