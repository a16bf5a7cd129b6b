//! Staging: NodeStageVolume checks the staging directory the CO created; NodeUnstageVolume
//! leaves it in place.

use std::fs;

use csi_proto::v1::*;
use tonic::Status;

use crate::capabilities::NodeCapability;
use crate::plugin::MockPlugin;
use crate::services::controller::check_context;
use crate::state::{StagedRec, at};
use crate::validate;

impl MockPlugin {
    pub(super) fn node_stage(
        &self,
        req: NodeStageVolumeRequest,
    ) -> Result<NodeStageVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::path("staging_target_path", &req.staging_target_path)?;
        validate::capability("volume_capability", req.volume_capability.as_ref())?;
        validate::map("publish_context", &req.publish_context)?;
        validate::map("volume_context", &req.volume_context)?;
        validate::secrets(&req.secrets)?;
        let capability = req.volume_capability.unwrap_or_default();
        validate::single_node_modes(
            "volume_capability",
            &[&capability],
            self.has_node_cap(NodeCapability::SingleNodeMultiWriter),
            "node",
        )?;
        let mut inner = self.shared.lock();
        let state = &mut inner.state;
        if let Some(volume) = self.node_volume(state, &req.volume_id)? {
            check_context(volume, &req.volume_context)?;
            if !validate::supports(&volume.capabilities, &capability) {
                return Err(Status::failed_precondition(format!(
                    "volume_capability is not supported by volume {}",
                    req.volume_id
                )));
            }
        }
        self.check_controller_published(state, &req.volume_id, &req.publish_context)?;
        let node = self.node_id();
        let key = at(node, &req.staging_target_path);
        if let Some(existing) = state.staged.get(&key) {
            return if existing.volume_id != req.volume_id {
                Err(Status::failed_precondition(format!(
                    "staging_target_path {} already holds volume {}",
                    req.staging_target_path, existing.volume_id
                )))
            } else if existing.capability == capability {
                Ok(NodeStageVolumeResponse {})
            } else {
                Err(Status::already_exists(format!(
                    "volume {} is already staged at {} with a different volume_capability",
                    req.volume_id, req.staging_target_path
                )))
            };
        }
        if let Some(other) = state.staged_paths_on(node, &req.volume_id).first() {
            return Err(Status::failed_precondition(format!(
                "volume {} is already staged on node {node} at {other}",
                req.volume_id
            )));
        }
        self.check_node_limit(state, &req.volume_id)?;
        match fs::metadata(&req.staging_target_path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(Status::invalid_argument(format!(
                    "staging_target_path {} is not a directory",
                    req.staging_target_path
                )));
            }
            Err(e) => {
                return Err(Status::invalid_argument(format!(
                    "staging_target_path {} cannot be used ({e}); the CO must create the \
                     directory before NodeStageVolume",
                    req.staging_target_path
                )));
            }
        }
        state.staged.insert(
            key,
            StagedRec {
                volume_id: req.volume_id,
                capability,
            },
        );
        Ok(NodeStageVolumeResponse {})
    }

    pub(super) fn node_unstage(
        &self,
        req: NodeUnstageVolumeRequest,
    ) -> Result<NodeUnstageVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::path("staging_target_path", &req.staging_target_path)?;
        let mut inner = self.shared.lock();
        let strict = inner.quirks.not_found_on_repeated_unpublish;
        let state = &mut inner.state;
        self.node_volume(state, &req.volume_id)?;
        let node = self.node_id();
        let published: Vec<&String> = state
            .published
            .iter()
            .filter(|((n, _), p)| {
                n == node
                    && p.volume_id == req.volume_id
                    && p.staging_path == req.staging_target_path
            })
            .map(|((_, path), _)| path)
            .collect();
        if !published.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {} is still published at {}; NodeUnpublishVolume must succeed first",
                req.volume_id,
                published
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let key = at(node, &req.staging_target_path);
        match state.staged.get(&key) {
            Some(s) if s.volume_id == req.volume_id => {
                state.staged.remove(&key);
                Ok(NodeUnstageVolumeResponse {})
            }
            Some(s) => Err(Status::failed_precondition(format!(
                "staging_target_path {} holds volume {}, not {}",
                req.staging_target_path, s.volume_id, req.volume_id
            ))),
            None if strict => Err(Status::not_found(format!(
                "volume {} is not staged at {}",
                req.volume_id, req.staging_target_path
            ))),
            None => Ok(NodeUnstageVolumeResponse {}),
        }
    }
}
