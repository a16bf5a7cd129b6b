//! Publishing: NodePublishVolume creates the target (a directory for mount access, a file
//! for block access) under the parent the CO created; NodeUnpublishVolume removes it.

use std::fs;
use std::io;
use std::path::Path;

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use tonic::Status;

use crate::capabilities::NodeCapability;
use crate::plugin::MockPlugin;
use crate::services::controller::check_context;
use crate::state::{PublishedRec, at};
use crate::validate;

impl MockPlugin {
    pub(super) fn node_publish(
        &self,
        req: NodePublishVolumeRequest,
    ) -> Result<NodePublishVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::path("target_path", &req.target_path)?;
        if !req.staging_target_path.is_empty() {
            validate::path("staging_target_path", &req.staging_target_path)?;
        }
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
        let node = self.node_id();
        if let Some(volume) = self.node_volume(state, &req.volume_id)? {
            check_context(volume, &req.volume_context)?;
            if !validate::supports(&volume.capabilities, &capability) {
                return Err(Status::failed_precondition(format!(
                    "volume_capability is not supported by volume {}",
                    req.volume_id
                )));
            }
        }
        if self.has_node_cap(NodeCapability::StageUnstageVolume) {
            if req.staging_target_path.is_empty() {
                return Err(Status::failed_precondition(
                    "staging_target_path is required: this plugin has STAGE_UNSTAGE_VOLUME, so \
                     NodeStageVolume must succeed first",
                ));
            }
            match state.staged.get(&at(node, &req.staging_target_path)) {
                Some(s) if s.volume_id == req.volume_id => {}
                _ => {
                    return Err(Status::failed_precondition(format!(
                        "volume {} is not staged at {}; NodeStageVolume must succeed first",
                        req.volume_id, req.staging_target_path
                    )));
                }
            }
        }
        self.check_controller_published(state, &req.volume_id, &req.publish_context)?;
        let key = at(node, &req.target_path);
        if let Some(existing) = state.published.get(&key) {
            return if existing.volume_id != req.volume_id {
                Err(Status::failed_precondition(format!(
                    "target_path {} already holds volume {}",
                    req.target_path, existing.volume_id
                )))
            } else if existing.capability == capability
                && existing.readonly == req.readonly
                && existing.staging_path == req.staging_target_path
            {
                Ok(NodePublishVolumeResponse {})
            } else {
                Err(Status::already_exists(format!(
                    "volume {} is already published at {} with a different volume_capability, \
                     readonly or staging_target_path",
                    req.volume_id, req.target_path
                )))
            };
        }
        // Several target paths on one node only with MULTI_NODE_* and SINGLE_NODE_MULTI_WRITER
        // (csi-spec, NodePublishVolume: a second target path is FAILED_PRECONDITION otherwise).
        if let Some(other) = state.target_paths_on(node, &req.volume_id).first() {
            let mode = validate::mode_of(&capability);
            if !(validate::is_multi_node(mode) || mode == Mode::SingleNodeMultiWriter) {
                return Err(Status::failed_precondition(format!(
                    "volume {} is already published on node {node} at {other} and access mode \
                     {} allows one target path per node",
                    req.volume_id,
                    mode.as_str_name()
                )));
            }
        }
        self.check_node_limit(state, &req.volume_id)?;
        let block = validate::is_block(&capability);
        create_target(&req.target_path, block)?;
        state.published.insert(
            key,
            PublishedRec {
                volume_id: req.volume_id,
                capability,
                readonly: req.readonly,
                staging_path: req.staging_target_path,
                block,
            },
        );
        Ok(NodePublishVolumeResponse {})
    }

    pub(super) fn node_unpublish(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::path("target_path", &req.target_path)?;
        let mut inner = self.shared.lock();
        let strict = inner.quirks.not_found_on_repeated_unpublish;
        let state = &mut inner.state;
        self.node_volume(state, &req.volume_id)?;
        let key = at(self.node_id(), &req.target_path);
        match state.published.get(&key) {
            Some(p) if p.volume_id == req.volume_id => {
                remove_target(&req.target_path, p.block)?;
                state.published.remove(&key);
                Ok(NodeUnpublishVolumeResponse {})
            }
            Some(p) => Err(Status::failed_precondition(format!(
                "target_path {} holds volume {}, not {}",
                req.target_path, p.volume_id, req.volume_id
            ))),
            None if strict => Err(Status::not_found(format!(
                "volume {} is not published at {}",
                req.volume_id, req.target_path
            ))),
            None => Ok(NodeUnpublishVolumeResponse {}),
        }
    }
}

/// Creates the target: a directory for mount access, a file for block access. An existing
/// target of the right kind is reused.
pub(super) fn create_target(target: &str, block: bool) -> Result<(), Status> {
    let path = Path::new(target);
    let parent_ok = path.parent().is_some_and(|p| p.is_dir());
    if !parent_ok {
        return Err(Status::invalid_argument(format!(
            "target_path {target}: the parent directory does not exist; the CO must create it"
        )));
    }
    let result = if block {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map(drop)
    } else {
        match fs::create_dir(path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
            other => other,
        }
    };
    result.map_err(|e| {
        Status::internal(format!(
            "target_path {target}: cannot create the {} ({e})",
            if block { "device file" } else { "directory" }
        ))
    })
}

/// Removes what [`create_target`] made; a target already gone is fine.
pub(super) fn remove_target(target: &str, block: bool) -> Result<(), Status> {
    let result = if block {
        fs::remove_file(target)
    } else {
        fs::remove_dir(target)
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Status::internal(format!(
            "target_path {target}: cannot remove it ({e})"
        ))),
    }
}
