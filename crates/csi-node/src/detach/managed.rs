//! The release pipeline's node step through the [`VolumeManager`].

use async_trait::async_trait;
use csi_claims::driver::NodeDetacher;
use csi_claims::{DetachError, DetachRpc, NodeDetachRequest};
use csi_structs::ErrorClass;

use crate::layout::PublishUsage;
use crate::volumes::{UnmountRequest, VolumeError, VolumeManager};

/// [`NodeDetacher`] over the node's [`VolumeManager`]: the node step of a release is the
/// workload's unmount, so the usage records decide about unstaging (the volume is unstaged
/// with its last publication on this node, whatever order the releases come in), the target
/// is the one the mount recorded, and every call is serialized with the volume's other
/// operations.
///
/// `node_unpublish` unpublishes and, when it was the last publication here, unstages;
/// `node_unstage` then confirms that the volume is no longer staged here (unstaging it if
/// no publication is left) rather than assuming it. A failure keeps the class of the call
/// that failed (`NodeUnpublishVolume` or `NodeUnstageVolume`).
#[derive(Clone, Debug)]
pub struct VolumeNodeDetacher {
    volumes: VolumeManager,
}

impl VolumeNodeDetacher {
    /// A node detacher over `volumes`.
    pub fn new(volumes: VolumeManager) -> Self {
        Self { volumes }
    }
}

fn detach_error(e: &VolumeError) -> DetachError {
    let rpc = match e {
        VolumeError::Call {
            step: "NodeUnstageVolume",
            ..
        } => DetachRpc::NodeUnstage,
        _ => DetachRpc::NodeUnpublish,
    };
    DetachError::new(rpc, e.class(), e.to_string())
}

fn unmount_request(request: &NodeDetachRequest) -> UnmountRequest {
    UnmountRequest {
        plugin: request.plugin.clone(),
        volume: request.volume.clone(),
        external_id: request.external_volume.clone(),
        workload: request.workload.clone(),
        usage: PublishUsage {
            read_only: request.read_only,
            attachment: request.attachment,
            access_mode: request.access_mode,
        },
    }
}

#[async_trait]
impl NodeDetacher for VolumeNodeDetacher {
    async fn node_unpublish(&self, request: &NodeDetachRequest) -> Result<(), DetachError> {
        self.volumes
            .unmount(&unmount_request(request))
            .await
            .map(drop)
            .map_err(|e| detach_error(&e))
    }

    /// Usually done already, by the last publication's unmount in `node_unpublish`; this
    /// confirms it instead of assuming it, so a freed claim never says "unstaged" of a volume
    /// still staged here. The unmount is repeated (idempotent: it unstages a volume with no
    /// publication left), then a volume still recorded here fails the step as
    /// [`Retry`](csi_structs::ErrorClass::Retry), naming who still has it published.
    async fn node_unstage(&self, request: &NodeDetachRequest) -> Result<(), DetachError> {
        self.volumes
            .unmount(&unmount_request(request))
            .await
            .map_err(|e| detach_error(&e))?;
        match self.volumes.record(&request.plugin, &request.volume) {
            None => Ok(()),
            Some(left) => Err(DetachError::new(
                DetachRpc::NodeUnstage,
                ErrorClass::Retry,
                format!(
                    "volume {} is not unstaged: still published here for workload(s) {}",
                    request.volume,
                    left.users
                        .keys()
                        .map(csi_structs::WorkloadId::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }
}
