//! Controller publications: publish, unpublish, and ValidateVolumeCapabilities (with the
//! `confirmed` quirks).

use std::collections::HashMap;

use csi_proto::v1::volume_capability::AccessType;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use tonic::Status;

use crate::capabilities::ControllerCapability;
use crate::plugin::MockPlugin;
use crate::state::{PublicationRec, VolumeRec};
use crate::validate;

impl MockPlugin {
    pub(super) fn controller_publish(
        &self,
        req: ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, Status> {
        let config = self.config();
        validate::required("volume_id", &req.volume_id)?;
        validate::required_within("node_id", &req.node_id, validate::MAX_NODE_ID_BYTES)?;
        validate::capability("volume_capability", req.volume_capability.as_ref())?;
        validate::map("volume_context", &req.volume_context)?;
        validate::secrets(&req.secrets)?;
        let capability = req.volume_capability.unwrap_or_default();
        validate::single_node_modes(
            "volume_capability",
            &[&capability],
            self.has_controller_cap(ControllerCapability::SingleNodeMultiWriter),
            "controller",
        )?;
        let mut inner = self.shared.lock();
        let known_node = self.knows_node(&inner, &req.node_id);
        let state = &mut inner.state;
        let volume = state
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", req.volume_id)))?;
        if !known_node {
            return Err(Status::not_found(format!(
                "node {} does not exist",
                req.node_id
            )));
        }
        if req.readonly && !self.has_controller_cap(ControllerCapability::PublishReadonly) {
            return Err(Status::invalid_argument(
                "readonly may only be true for a plugin with controller capability \
                 PUBLISH_READONLY",
            ));
        }
        check_context(volume, &req.volume_context)?;
        if !validate::supports(&volume.capabilities, &capability) {
            return Err(Status::invalid_argument(format!(
                "volume_capability (access mode {}) is not supported by volume {}",
                validate::mode_of(&capability).as_str_name(),
                req.volume_id
            )));
        }
        let key = (req.volume_id.clone(), req.node_id.clone());
        if let Some(existing) = state.publications.get(&key) {
            return if existing.capability == capability && existing.readonly == req.readonly {
                Ok(ControllerPublishVolumeResponse {
                    publish_context: existing.publish_context.clone(),
                })
            } else {
                Err(Status::already_exists(format!(
                    "volume {} is already published to node {} with a different \
                     volume_capability or readonly",
                    req.volume_id, req.node_id
                )))
            };
        }
        let elsewhere: Vec<(String, Mode)> = state
            .publications
            .iter()
            .filter(|((v, _), _)| *v == req.volume_id)
            .map(|((_, n), p)| (n.clone(), validate::mode_of(&p.capability)))
            .collect();
        let all_multi = validate::is_multi_node(validate::mode_of(&capability))
            && elsewhere.iter().all(|(_, m)| validate::is_multi_node(*m));
        if let Some((other, _)) = elsewhere.first().filter(|_| !all_multi) {
            return Err(Status::failed_precondition(format!(
                "volume {} is published to node {other} and its access mode is not MULTI_NODE",
                req.volume_id
            )));
        }
        if let Some(max) = config.max_volumes_per_node.filter(|m| *m > 0) {
            let attached = state.volumes_on_node(&req.node_id);
            if i64::try_from(attached).unwrap_or(i64::MAX) >= max {
                return Err(Status::resource_exhausted(format!(
                    "node {} already has {attached} volumes attached, the maximum is {max}",
                    req.node_id
                )));
            }
        }
        let publish_context = HashMap::from([(
            "devicePath".to_string(),
            format!("/dev/mock/{}", req.volume_id),
        )]);
        state.publications.insert(
            key,
            PublicationRec {
                capability,
                readonly: req.readonly,
                publish_context: publish_context.clone(),
            },
        );
        Ok(ControllerPublishVolumeResponse { publish_context })
    }

    pub(super) fn controller_unpublish(
        &self,
        req: ControllerUnpublishVolumeRequest,
    ) -> Result<ControllerUnpublishVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        if !req.node_id.is_empty() {
            validate::required_within("node_id", &req.node_id, validate::MAX_NODE_ID_BYTES)?;
        }
        validate::secrets(&req.secrets)?;
        let mut inner = self.shared.lock();
        let strict = inner.quirks.not_found_on_repeated_unpublish;
        let state = &mut inner.state;
        let nodes = if req.node_id.is_empty() {
            state.published_nodes(&req.volume_id)
        } else {
            vec![req.node_id.clone()]
        };
        // Only nodes this storage is served as have node state: the others never do.
        for node in &nodes {
            let still: Vec<String> = state
                .staged_paths_on(node, &req.volume_id)
                .into_iter()
                .chain(state.target_paths_on(node, &req.volume_id))
                .collect();
            if !still.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "volume {} is still staged or published on node {node} at {}; \
                     NodeUnpublishVolume and NodeUnstageVolume must succeed first",
                    req.volume_id,
                    still.join(", ")
                )));
            }
        }
        let mut removed = 0;
        for node in nodes {
            if state
                .publications
                .remove(&(req.volume_id.clone(), node))
                .is_some()
            {
                removed += 1;
            }
        }
        if removed == 0 && strict {
            return Err(Status::not_found(format!(
                "volume {} is not published to {}",
                req.volume_id,
                if req.node_id.is_empty() {
                    "any node"
                } else {
                    &req.node_id
                }
            )));
        }
        Ok(ControllerUnpublishVolumeResponse {})
    }

    pub(super) fn validate_capabilities(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::capabilities("volume_capabilities", &req.volume_capabilities)?;
        validate::map("volume_context", &req.volume_context)?;
        validate::map("parameters", &req.parameters)?;
        validate::map("mutable_parameters", &req.mutable_parameters)?;
        validate::secrets(&req.secrets)?;
        let inner = self.shared.lock();
        let quirks = inner.quirks.clone();
        let volume =
            inner.state.volumes.get(&req.volume_id).ok_or_else(|| {
                Status::not_found(format!("volume {} does not exist", req.volume_id))
            })?;
        let unsupported = req
            .volume_capabilities
            .iter()
            .find(|c| !validate::supports(&volume.capabilities, c));
        let refusal = if let Some(cap) = unsupported {
            Some(format!(
                "volume {} does not support access mode {} with {} access",
                req.volume_id,
                validate::mode_of(cap).as_str_name(),
                if validate::is_block(cap) {
                    "block"
                } else {
                    "mount"
                }
            ))
        } else if !req.volume_context.is_empty() && req.volume_context != volume.context {
            Some("volume_context differs from the volume's context".to_string())
        } else if !req.parameters.is_empty() && req.parameters != volume.parameters {
            Some("parameters differ from the volume's parameters".to_string())
        } else {
            None
        };
        drop(inner);
        if let Some(message) = refusal {
            return Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            });
        }
        if quirks.never_confirm {
            return Ok(ValidateVolumeCapabilitiesResponse::default());
        }
        let mut caps = req.volume_capabilities;
        for cap in &mut caps {
            if quirks.confirm_different_capability {
                let other = match validate::mode_of(cap) {
                    Mode::SingleNodeWriter => Mode::MultiNodeMultiWriter,
                    _ => Mode::SingleNodeWriter,
                };
                cap.access_mode = Some(volume_capability::AccessMode { mode: other as i32 });
            }
            if quirks.confirm_unknown_access_mode {
                cap.access_mode = Some(volume_capability::AccessMode {
                    mode: Mode::Unknown as i32,
                });
            }
            if quirks.echo_different_fs_type
                && let Some(AccessType::Mount(mount)) = cap.access_type.as_mut()
            {
                mount.fs_type = if mount.fs_type == "xfs" {
                    "ext4"
                } else {
                    "xfs"
                }
                .into();
            }
        }
        Ok(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: caps,
                parameters: req.parameters,
                mutable_parameters: req.mutable_parameters,
            }),
            message: String::new(),
        })
    }
}

/// A non-empty `volume_context` must be the volume's own (csi-spec §3.11).
pub(crate) fn check_context(
    volume: &VolumeRec,
    context: &HashMap<String, String>,
) -> Result<(), Status> {
    if !context.is_empty() && *context != volume.context {
        return Err(Status::invalid_argument(format!(
            "volume_context differs from the context CreateVolume returned for volume {}",
            volume.id
        )));
    }
    Ok(())
}
