//! `NodeUnpublishVolume` and `NodeUnstageVolume` for the release pipeline.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use csi_claims::driver::NodeDetacher;
use csi_claims::{DetachError, DetachRpc, NodeDetachRequest};
use csi_client::CsiClient;
use csi_structs::ErrorClass;

use super::cleanup::remove_empty_dirs;
use super::error::detach_error;
use crate::layout::{Layout, PublishUsage};

/// [`NodeDetacher`] with a [`CsiClient`] talking to the node plugin on this node.
///
/// Paths come from the [`Layout`]: the target is
/// `<data-dir>/per-workload/<workload>/<volume>/<usage>`, the staging directory
/// `<data-dir>/staging/<volume>` (one per volume: csi-claims asks for the unstage only when the
/// claim was the last one of the volume on its node). The calls carry the paths as the plugin
/// sees them ([`Layout::for_plugin`]); after a successful (or already done) call the
/// directories the orchestrator created are removed, on the host, when empty.
///
/// When the plugin lacks `STAGE_UNSTAGE_VOLUME` (`staging == false`), an unstage request is
/// answered `Ok` without a call: nothing was staged.
///
/// Attempts, deadlines and the socket wait are all the client's: the adapter adds no per-call
/// overrides, so the client's rows for `NodeUnpublishVolume` and `NodeUnstageVolume` are the one
/// place the limits live. Build the client with
/// [`NodeDetachPolicy::client`](super::NodeDetachPolicy::client) (or
/// [`apply`](super::NodeDetachPolicy::apply) on a builder); with
/// [`NodeDetachPolicy::DEFAULT`](super::NodeDetachPolicy::DEFAULT) each call makes one attempt
/// (the release driver is the retry loop) and a missing plugin is reported after about a
/// second.
#[derive(Debug, Clone)]
pub struct ClientNodeDetacher {
    client: CsiClient,
    layout: Layout,
    staging: bool,
}

impl ClientNodeDetacher {
    /// An adapter calling the node plugin behind `client`; `staging` is whether the plugin
    /// advertises `STAGE_UNSTAGE_VOLUME`
    /// ([`NodeCapabilities::requires_staging`](csi_structs::NodeCapabilities::requires_staging)).
    ///
    /// The calls run under `client`'s policy rows: build it with
    /// [`NodeDetachPolicy::client`](super::NodeDetachPolicy::client).
    pub fn new(client: CsiClient, layout: Layout, staging: bool) -> Self {
        Self {
            client,
            layout,
            staging,
        }
    }

    /// The layout the paths come from.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
}

fn usage(request: &NodeDetachRequest) -> PublishUsage {
    PublishUsage {
        read_only: request.read_only,
        attachment: request.attachment,
        access_mode: request.access_mode,
    }
}

/// After the call: keep its outcome, then remove the directories; a failed removal is a
/// retry (the call is idempotent and will answer "already done").
fn finish(
    rpc: DetachRpc,
    outcome: Result<(), csi_client::Error>,
    dir: &Path,
    stop_at: &Path,
) -> Result<(), DetachError> {
    let outcome = outcome.map_err(|e| detach_error(rpc, &e));
    let done = match &outcome {
        Ok(()) => true,
        Err(e) => e.class == ErrorClass::AlreadyDone,
    };
    if done {
        remove_empty_dirs(dir, stop_at).map_err(|e| {
            DetachError::new(
                rpc,
                ErrorClass::Retry,
                format!("{rpc} done, but removing {} failed: {e}", dir.display()),
            )
        })?;
    }
    outcome
}

impl ClientNodeDetacher {
    fn target(&self, request: &NodeDetachRequest) -> Result<PathBuf, DetachError> {
        self.layout
            .target_path(&request.volume, &request.workload, &usage(request))
            .map_err(|e| {
                DetachError::new(DetachRpc::NodeUnpublish, ErrorClass::Fatal, e.to_string())
            })
    }

    /// The text the plugin is sent for a host path (see
    /// [`Layout::for_plugin`]), or a fatal error naming it.
    fn for_plugin(&self, rpc: DetachRpc, host: &Path) -> Result<String, DetachError> {
        self.layout
            .for_plugin(host)
            .map_err(|e| DetachError::new(rpc, ErrorClass::Fatal, e.to_string()))
    }

    fn staging(&self, request: &NodeDetachRequest) -> Result<PathBuf, DetachError> {
        self.layout
            .staging_path(&request.volume)
            .map_err(|e| DetachError::new(DetachRpc::NodeUnstage, ErrorClass::Fatal, e.to_string()))
    }
}

#[async_trait]
impl NodeDetacher for ClientNodeDetacher {
    async fn node_unpublish(&self, request: &NodeDetachRequest) -> Result<(), DetachError> {
        let rpc = DetachRpc::NodeUnpublish;
        let target = self.target(request)?;
        let outcome = self
            .client
            .node()
            .unpublish(
                &request.external_volume,
                Path::new(&self.for_plugin(rpc, &target)?),
            )
            .await;
        finish(rpc, outcome, &target, &self.layout.workload_root())
    }

    async fn node_unstage(&self, request: &NodeDetachRequest) -> Result<(), DetachError> {
        if !self.staging {
            return Ok(());
        }
        let rpc = DetachRpc::NodeUnstage;
        let staging = self.staging(request)?;
        let outcome = self
            .client
            .node()
            .unstage(
                &request.external_volume,
                Path::new(&self.for_plugin(rpc, &staging)?),
            )
            .await;
        finish(rpc, outcome, &staging, &self.layout.staging_root())
    }
}
