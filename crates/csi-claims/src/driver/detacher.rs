//! The two traits through which the driver reaches plugins.

use async_trait::async_trait;

use crate::detach::{ControllerDetachRequest, DetachError, NodeDetachRequest};

/// Performs the node step of a release on the claim's node: `NodeUnpublishVolume` and
/// `NodeUnstageVolume`.
///
/// Implemented by the layer that composes the crates, in `csi-client` terms (on the node
/// itself, or forwarded to it). Each call must be bounded by a deadline (csi-client's are);
/// the driver also applies [`DriverConfig::call_timeout`](super::DriverConfig::call_timeout)
/// as a backstop.
///
/// # Errors
///
/// Classify every failure with its [`ErrorClass`](csi_structs::ErrorClass):
/// `NOT_FOUND` is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone) (counted as
/// success); a node plugin that is missing or unhealthy on the node is
/// [`RetryElsewhere`](csi_structs::ErrorClass::RetryElsewhere) — the step then fails and the
/// volume is requeued, never skipped.
#[async_trait]
pub trait NodeDetacher: Send + Sync + 'static {
    /// `NodeUnpublishVolume` for the claim's publication on its node.
    async fn node_unpublish(&self, request: &NodeDetachRequest) -> Result<(), DetachError>;

    /// `NodeUnstageVolume` on the claim's node (only asked when it was the last user there).
    /// For a plugin without the `STAGE_UNSTAGE_VOLUME` node capability there is nothing to
    /// unstage: answer `Ok(())` without a call.
    async fn node_unstage(&self, request: &NodeDetachRequest) -> Result<(), DetachError>;
}

/// Performs the controller step of a release: `ControllerUnpublishVolume` with the plugin's
/// volume id and the plugin's node id.
///
/// Implemented by the layer that composes the crates; choosing which controller instance
/// serves the call (and failing over on
/// [`RetryElsewhere`](csi_structs::ErrorClass::RetryElsewhere)) is that layer's job. The
/// driver never runs more than
/// [`MachineConfig::controller_limit`](crate::MachineConfig::controller_limit) of these at
/// once per plugin.
///
/// # Errors
///
/// As for [`NodeDetacher`]: a classified [`DetachError`].
#[async_trait]
pub trait ControllerDetacher: Send + Sync + 'static {
    /// `ControllerUnpublishVolume`.
    async fn controller_unpublish(
        &self,
        request: &ControllerDetachRequest,
    ) -> Result<(), DetachError>;
}
