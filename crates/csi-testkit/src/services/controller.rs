//! Controller: volumes, controller publications, snapshots, capacity, expansion and health.

use std::collections::HashMap;

use csi_proto::Rpc;
use csi_proto::v1::controller_server::Controller;
use csi_proto::v1::controller_service_capability::{self, Rpc as CapRpc};
use csi_proto::v1::volume_capability::AccessType;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_content_source::Type as SourceType;
use csi_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::capabilities::{ControllerCapability, PluginService, VolumeExpansion};
use crate::dispatch::Target;
use crate::plugin::MockPlugin;
use crate::services::Svc;
use crate::state::pagination::page;
use crate::state::{PublicationRec, SnapshotRec, State, VolumeRec};
use crate::validate;

impl MockPlugin {
    fn has_controller_cap(&self, cap: ControllerCapability) -> bool {
        self.config().controller_caps.contains(&cap)
    }

    fn has_plugin_service(&self, service: PluginService) -> bool {
        self.config().plugin_caps.services.contains(&service)
    }

    fn create_volume(&self, req: CreateVolumeRequest) -> Result<CreateVolumeResponse, Status> {
        let config = self.config();
        validate::name("name", &req.name)?;
        validate::capabilities("volume_capabilities", &req.volume_capabilities)?;
        validate::single_node_modes(
            "volume_capabilities",
            &req.volume_capabilities.iter().collect::<Vec<_>>(),
            self.has_controller_cap(ControllerCapability::SingleNodeMultiWriter),
            "controller",
        )?;
        validate::map("parameters", &req.parameters)?;
        validate::map("mutable_parameters", &req.mutable_parameters)?;
        validate::secrets(&req.secrets)?;
        let range = req.capacity_range.unwrap_or_default();
        validate::capacity_range("capacity_range", &range)?;
        if !req.mutable_parameters.is_empty()
            && !self.has_controller_cap(ControllerCapability::ModifyVolume)
        {
            return Err(Status::invalid_argument(
                "mutable_parameters may only be sent to a plugin with controller capability \
                 MODIFY_VOLUME",
            ));
        }
        if req.accessibility_requirements.is_some()
            && !self.has_plugin_service(PluginService::VolumeAccessibilityConstraints)
        {
            return Err(Status::invalid_argument(
                "accessibility_requirements may only be sent to a plugin with plugin capability \
                 VOLUME_ACCESSIBILITY_CONSTRAINTS",
            ));
        }
        if range.required_bytes > config.max_volume_bytes {
            return Err(Status::out_of_range(format!(
                "capacity_range.required_bytes {} exceeds the largest volume this plugin \
                 provisions ({} bytes)",
                range.required_bytes, config.max_volume_bytes
            )));
        }
        let mut size = if range.required_bytes > 0 {
            range.required_bytes
        } else if range.limit_bytes > 0 {
            range.limit_bytes.min(config.default_volume_bytes)
        } else {
            config.default_volume_bytes
        };

        let mut inner = self.shared.lock();
        let state = &mut inner.state;
        if let Some(source_size) = self.source_size(state, req.volume_content_source.as_ref())? {
            if range.limit_bytes > 0 && range.limit_bytes < source_size {
                return Err(Status::out_of_range(format!(
                    "capacity_range.limit_bytes {} is smaller than the source ({source_size} \
                     bytes)",
                    range.limit_bytes
                )));
            }
            size = size.max(source_size);
        }
        if let Some(existing) = state
            .volume_names
            .get(&req.name)
            .and_then(|id| state.volumes.get(id))
        {
            return match incompatibility(existing, &req, &range) {
                None => Ok(CreateVolumeResponse {
                    volume: Some(existing.to_wire()),
                }),
                Some(field) => Err(Status::already_exists(format!(
                    "a volume named {:?} already exists ({}) with a different {field}",
                    req.name, existing.id
                ))),
            };
        }
        let available = config.capacity_bytes - state.used_bytes();
        if size > available {
            return Err(Status::resource_exhausted(format!(
                "{size} bytes requested, {available} bytes left in the pool"
            )));
        }
        let accessible_topology =
            if self.has_plugin_service(PluginService::VolumeAccessibilityConstraints) {
                match &req.accessibility_requirements {
                    Some(r) => r
                        .preferred
                        .first()
                        .or(r.requisite.first())
                        .cloned()
                        .into_iter()
                        .collect(),
                    None if !config.topology.is_empty() => vec![Topology {
                        segments: config.topology.clone().into_iter().collect(),
                    }],
                    None => Vec::new(),
                }
            } else {
                Vec::new()
            };
        let id = state.new_id("vol");
        let volume = VolumeRec {
            id: id.clone(),
            name: Some(req.name.clone()),
            capacity: size,
            capabilities: req.volume_capabilities,
            parameters: req.parameters,
            mutable_parameters: req.mutable_parameters,
            context: HashMap::from([("mock.csi.example/name".to_string(), req.name.clone())]),
            content_source: req.volume_content_source,
            requirements: req.accessibility_requirements,
            accessible_topology,
        };
        let wire = volume.to_wire();
        state.volumes.insert(id.clone(), volume);
        state.volume_names.insert(req.name, id);
        Ok(CreateVolumeResponse { volume: Some(wire) })
    }

    /// The size of a content source, after checking it may be used and exists.
    fn source_size(
        &self,
        state: &State,
        source: Option<&VolumeContentSource>,
    ) -> Result<Option<i64>, Status> {
        let Some(source) = source else {
            return Ok(None);
        };
        match &source.r#type {
            None => Err(Status::invalid_argument(
                "volume_content_source must be a snapshot or a volume",
            )),
            Some(SourceType::Snapshot(s)) => {
                validate::required("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?;
                if !self.has_controller_cap(ControllerCapability::CreateDeleteSnapshot) {
                    return Err(Status::invalid_argument(
                        "volume_content_source: restoring a snapshot needs controller capability \
                         CREATE_DELETE_SNAPSHOT",
                    ));
                }
                let snapshot = state.snapshots.get(&s.snapshot_id).ok_or_else(|| {
                    Status::not_found(format!("source snapshot {} does not exist", s.snapshot_id))
                })?;
                Ok(Some(snapshot.size))
            }
            Some(SourceType::Volume(v)) => {
                validate::required("volume_content_source.volume.volume_id", &v.volume_id)?;
                if !self.has_controller_cap(ControllerCapability::CloneVolume) {
                    return Err(Status::invalid_argument(
                        "volume_content_source: cloning a volume needs controller capability \
                         CLONE_VOLUME",
                    ));
                }
                let volume = state.volumes.get(&v.volume_id).ok_or_else(|| {
                    Status::not_found(format!("source volume {} does not exist", v.volume_id))
                })?;
                Ok(Some(volume.capacity))
            }
        }
    }

    fn delete_volume(&self, req: DeleteVolumeRequest) -> Result<DeleteVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::secrets(&req.secrets)?;
        let mut inner = self.shared.lock();
        let state = &mut inner.state;
        if !state.volumes.contains_key(&req.volume_id) {
            return Ok(DeleteVolumeResponse {});
        }
        let nodes = state.published_nodes(&req.volume_id);
        if !nodes.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {} is still controller-published to node(s) {}",
                req.volume_id,
                nodes.join(", ")
            )));
        }
        let on_node: Vec<String> = state
            .staged_paths_of(&req.volume_id)
            .into_iter()
            .chain(state.target_paths_of(&req.volume_id))
            .collect();
        if !on_node.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {} is still staged or published on node {} at {}",
                req.volume_id,
                self.config().node_id,
                on_node.join(", ")
            )));
        }
        if let Some(name) = state.volumes.remove(&req.volume_id).and_then(|v| v.name) {
            state.volume_names.remove(&name);
        }
        Ok(DeleteVolumeResponse {})
    }

    fn controller_publish(
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
        let state = &mut inner.state;
        let volume = state
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", req.volume_id)))?;
        if req.node_id != config.node_id && !config.other_nodes.contains(&req.node_id) {
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

    fn controller_unpublish(
        &self,
        req: ControllerUnpublishVolumeRequest,
    ) -> Result<ControllerUnpublishVolumeResponse, Status> {
        let config = self.config();
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
        if config.role.has_node() && nodes.contains(&config.node_id) {
            let still: Vec<String> = state
                .staged_paths_of(&req.volume_id)
                .into_iter()
                .chain(state.target_paths_of(&req.volume_id))
                .collect();
            if !still.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "volume {} is still staged or published on node {} at {}; \
                     NodeUnpublishVolume and NodeUnstageVolume must succeed first",
                    req.volume_id,
                    config.node_id,
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

    fn validate_capabilities(
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

    fn list_volumes(&self, req: ListVolumesRequest) -> Result<ListVolumesResponse, Status> {
        validate::optional("starting_token", &req.starting_token)?;
        let with_status = self.has_controller_cap(ControllerCapability::ListVolumesPublishedNodes);
        let inner = self.shared.lock();
        let state = &inner.state;
        let (volumes, next_token) = page(
            &state.volumes,
            |_| true,
            req.max_entries,
            &req.starting_token,
        )?;
        let entries = volumes
            .into_iter()
            .map(|v| list_volumes_response::Entry {
                volume: Some(v.to_wire()),
                status: with_status.then(|| list_volumes_response::VolumeStatus {
                    published_node_ids: state.published_nodes(&v.id),
                    volume_condition: None,
                }),
            })
            .collect();
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    fn get_volume(
        &self,
        req: ControllerGetVolumeRequest,
    ) -> Result<ControllerGetVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        let with_nodes = self.has_controller_cap(ControllerCapability::ListVolumesPublishedNodes);
        let inner = self.shared.lock();
        let volume =
            inner.state.volumes.get(&req.volume_id).ok_or_else(|| {
                Status::not_found(format!("volume {} does not exist", req.volume_id))
            })?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(volume.to_wire()),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: if with_nodes {
                    inner.state.published_nodes(&req.volume_id)
                } else {
                    Vec::new()
                },
                volume_condition: None,
            }),
        })
    }

    fn modify_volume(
        &self,
        req: ControllerModifyVolumeRequest,
    ) -> Result<ControllerModifyVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        if req.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument(
                "mutable_parameters is required (at least one key)",
            ));
        }
        validate::map("mutable_parameters", &req.mutable_parameters)?;
        validate::secrets(&req.secrets)?;
        let mut inner = self.shared.lock();
        let volume =
            inner.state.volumes.get_mut(&req.volume_id).ok_or_else(|| {
                Status::not_found(format!("volume {} does not exist", req.volume_id))
            })?;
        volume.mutable_parameters.extend(req.mutable_parameters);
        Ok(ControllerModifyVolumeResponse {})
    }

    fn get_capacity(&self, req: GetCapacityRequest) -> Result<GetCapacityResponse, Status> {
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            validate::capability(&format!("volume_capabilities[{i}]"), Some(cap))?;
        }
        validate::map("parameters", &req.parameters)?;
        if req.accessible_topology.is_some()
            && !self.has_plugin_service(PluginService::VolumeAccessibilityConstraints)
        {
            return Err(Status::invalid_argument(
                "accessible_topology may only be sent to a plugin with plugin capability \
                 VOLUME_ACCESSIBILITY_CONSTRAINTS",
            ));
        }
        let config = self.config();
        let used = self.shared.lock().state.used_bytes();
        let available = (config.capacity_bytes - used).max(0);
        Ok(GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(config.max_volume_bytes.min(available)),
            minimum_volume_size: None,
        })
    }

    fn controller_capabilities(&self) -> ControllerGetCapabilitiesResponse {
        ControllerGetCapabilitiesResponse {
            capabilities: self
                .config()
                .controller_caps
                .iter()
                .map(|cap| ControllerServiceCapability {
                    r#type: Some(controller_service_capability::Type::Rpc(CapRpc {
                        r#type: *cap as i32,
                    })),
                })
                .collect(),
        }
    }

    fn create_snapshot(
        &self,
        req: CreateSnapshotRequest,
    ) -> Result<CreateSnapshotResponse, Status> {
        validate::required("source_volume_id", &req.source_volume_id)?;
        validate::name("name", &req.name)?;
        validate::map("parameters", &req.parameters)?;
        validate::secrets(&req.secrets)?;
        if req.accessibility_requirements.is_some()
            && !self.has_plugin_service(PluginService::SnapshotAccessibilityConstraints)
        {
            return Err(Status::invalid_argument(
                "accessibility_requirements may only be sent to a plugin with plugin capability \
                 SNAPSHOT_ACCESSIBILITY_CONSTRAINTS",
            ));
        }
        let mut inner = self.shared.lock();
        let state = &mut inner.state;
        if let Some(existing) = state
            .snapshot_names
            .get(&req.name)
            .and_then(|id| state.snapshots.get(id))
        {
            return if existing.source_volume_id == req.source_volume_id {
                Ok(CreateSnapshotResponse {
                    snapshot: Some(existing.to_wire()),
                })
            } else {
                Err(Status::already_exists(format!(
                    "a snapshot named {:?} already exists ({}) of volume {}",
                    req.name, existing.id, existing.source_volume_id
                )))
            };
        }
        let size = state
            .volumes
            .get(&req.source_volume_id)
            .map(|v| v.capacity)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "source volume {} does not exist",
                    req.source_volume_id
                ))
            })?;
        let id = state.new_id("snap");
        let seq = state.next_snapshot_seq();
        let snapshot = SnapshotRec {
            id: id.clone(),
            name: Some(req.name.clone()),
            source_volume_id: req.source_volume_id,
            size,
            created: std::time::SystemTime::now(),
            seq,
            group_id: None,
        };
        let wire = snapshot.to_wire();
        state.snapshots.insert(id.clone(), snapshot);
        state.snapshot_names.insert(req.name, id);
        Ok(CreateSnapshotResponse {
            snapshot: Some(wire),
        })
    }

    fn delete_snapshot(
        &self,
        req: DeleteSnapshotRequest,
    ) -> Result<DeleteSnapshotResponse, Status> {
        validate::required("snapshot_id", &req.snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let mut inner = self.shared.lock();
        let state = &mut inner.state;
        let Some(snapshot) = state.snapshots.get(&req.snapshot_id) else {
            return Ok(DeleteSnapshotResponse {});
        };
        if let Some(group) = &snapshot.group_id {
            return Err(Status::invalid_argument(format!(
                "snapshot {} belongs to group snapshot {group}; delete it with \
                 DeleteVolumeGroupSnapshot",
                req.snapshot_id
            )));
        }
        if let Some(name) = state
            .snapshots
            .remove(&req.snapshot_id)
            .and_then(|s| s.name)
        {
            state.snapshot_names.remove(&name);
        }
        Ok(DeleteSnapshotResponse {})
    }

    fn list_snapshots(&self, req: ListSnapshotsRequest) -> Result<ListSnapshotsResponse, Status> {
        validate::optional("starting_token", &req.starting_token)?;
        validate::optional("source_volume_id", &req.source_volume_id)?;
        validate::optional("snapshot_id", &req.snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let inner = self.shared.lock();
        let (snapshots, next_token) = page(
            &inner.state.snapshots,
            |s| {
                (req.snapshot_id.is_empty() || s.id == req.snapshot_id)
                    && (req.source_volume_id.is_empty()
                        || s.source_volume_id == req.source_volume_id)
            },
            req.max_entries,
            &req.starting_token,
        )?;
        Ok(ListSnapshotsResponse {
            entries: snapshots
                .into_iter()
                .map(|s| list_snapshots_response::Entry {
                    snapshot: Some(s.to_wire()),
                })
                .collect(),
            next_token,
        })
    }

    fn get_snapshot(&self, req: GetSnapshotRequest) -> Result<GetSnapshotResponse, Status> {
        validate::required("snapshot_id", &req.snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let inner = self.shared.lock();
        let snapshot = inner.state.snapshots.get(&req.snapshot_id).ok_or_else(|| {
            Status::not_found(format!("snapshot {} does not exist", req.snapshot_id))
        })?;
        Ok(GetSnapshotResponse {
            snapshot: Some(snapshot.to_wire()),
        })
    }

    fn controller_expand(
        &self,
        req: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse, Status> {
        let config = self.config();
        validate::required("volume_id", &req.volume_id)?;
        let range = req
            .capacity_range
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        validate::capacity_range("capacity_range", &range)?;
        if let Some(cap) = &req.volume_capability {
            validate::capability("volume_capability", Some(cap))?;
        }
        validate::secrets(&req.secrets)?;
        let wanted = range.required_bytes.max(range.limit_bytes);
        if wanted == 0 {
            return Err(Status::invalid_argument(
                "capacity_range needs required_bytes or limit_bytes",
            ));
        }
        if wanted > config.max_volume_bytes {
            return Err(Status::out_of_range(format!(
                "capacity_range asks for {wanted} bytes; the largest volume is {} bytes",
                config.max_volume_bytes
            )));
        }
        let mut inner = self.shared.lock();
        let state = &mut inner.state;
        let used = state.used_bytes();
        let volume = state
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", req.volume_id)))?;
        if let Some(cap) = &req.volume_capability
            && !validate::supports(&volume.capabilities, cap)
        {
            return Err(Status::invalid_argument(format!(
                "volume_capability is not supported by volume {}",
                req.volume_id
            )));
        }
        let in_use = !state.published_nodes(&req.volume_id).is_empty()
            || !state.staged_paths_of(&req.volume_id).is_empty()
            || !state.target_paths_of(&req.volume_id).is_empty();
        if in_use && config.plugin_caps.expansion != Some(VolumeExpansion::Online) {
            return Err(Status::failed_precondition(format!(
                "volume {} is published and this plugin only expands offline",
                req.volume_id
            )));
        }
        let current = volume.capacity;
        let new_size = current.max(range.required_bytes);
        if new_size - current > config.capacity_bytes - used {
            return Err(Status::out_of_range(format!(
                "growing volume {} to {new_size} bytes needs more than the {} bytes left",
                req.volume_id,
                config.capacity_bytes - used
            )));
        }
        if let Some(volume) = state.volumes.get_mut(&req.volume_id) {
            volume.capacity = new_size;
        }
        let block = req
            .volume_capability
            .as_ref()
            .is_some_and(validate::is_block);
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: new_size,
            node_expansion_required: !block
                && config
                    .node_caps
                    .contains(&crate::capabilities::NodeCapability::ExpandVolume),
        })
    }

    fn controller_volume_health(
        &self,
        req: ControllerGetVolumeHealthRequest,
    ) -> Result<ControllerGetVolumeHealthResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::secrets(&req.secrets)?;
        if !self
            .shared
            .lock()
            .state
            .volumes
            .contains_key(&req.volume_id)
        {
            return Err(Status::not_found(format!(
                "volume {} does not exist",
                req.volume_id
            )));
        }
        Ok(ControllerGetVolumeHealthResponse {
            volume_health: Some(VolumeHealth {
                volume_id: req.volume_id,
                health_statuses: Vec::new(),
            }),
        })
    }

    fn controller_list_health(
        &self,
        req: ControllerListVolumeHealthRequest,
    ) -> Result<ControllerListVolumeHealthResponse, Status> {
        validate::optional("starting_token", &req.starting_token)?;
        validate::secrets(&req.secrets)?;
        // Every mock volume is healthy, and only abnormal volumes are listed.
        let inner = self.shared.lock();
        let (_, next_token) = page(
            &inner.state.volumes,
            |_| false,
            req.max_entries,
            &req.starting_token,
        )?;
        Ok(ControllerListVolumeHealthResponse {
            entries: Vec::new(),
            next_token,
        })
    }
}

/// Which requested property conflicts with an existing volume of the same name.
fn incompatibility(
    existing: &VolumeRec,
    req: &CreateVolumeRequest,
    range: &CapacityRange,
) -> Option<&'static str> {
    if existing.capacity < range.required_bytes
        || (range.limit_bytes > 0 && existing.capacity > range.limit_bytes)
    {
        return Some("capacity_range");
    }
    if !req
        .volume_capabilities
        .iter()
        .all(|c| validate::supports(&existing.capabilities, c))
    {
        return Some("volume_capabilities");
    }
    if existing.parameters != req.parameters {
        return Some("parameters");
    }
    if existing.mutable_parameters != req.mutable_parameters {
        return Some("mutable_parameters");
    }
    if existing.content_source != req.volume_content_source {
        return Some("volume_content_source");
    }
    if existing.requirements != req.accessibility_requirements {
        return Some("accessibility_requirements");
    }
    None
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

#[tonic::async_trait]
impl Controller for Svc {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let name = request.get_ref().name.clone();
        let target = Target::snapshot("volume-name", &name).with_volume(&name);
        let scope = self.0.begin(Rpc::CreateVolume, &request, target).await?;
        let result = self.0.create_volume(request.into_inner());
        if let Ok(CreateVolumeResponse { volume: Some(v) }) = &result {
            scope.set_volume(&v.volume_id);
        }
        scope.finish(result)
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self.0.begin(Rpc::DeleteVolume, &request, target).await?;
        scope.finish(self.0.delete_volume(request.into_inner()))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let r = request.get_ref();
        let target = Target::volume(&r.volume_id).with_node(&r.node_id);
        let scope = self
            .0
            .begin(Rpc::ControllerPublishVolume, &request, target)
            .await?;
        scope.finish(self.0.controller_publish(request.into_inner()))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let r = request.get_ref();
        let target = Target::volume(&r.volume_id).with_node(&r.node_id);
        let scope = self
            .0
            .begin(Rpc::ControllerUnpublishVolume, &request, target)
            .await?;
        scope.finish(self.0.controller_unpublish(request.into_inner()))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::ValidateVolumeCapabilities, &request, target)
            .await?;
        scope.finish(self.0.validate_capabilities(request.into_inner()))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::ListVolumes, &request, Target::none())
            .await?;
        scope.finish(self.0.list_volumes(request.into_inner()))
    }

    async fn controller_list_volume_health(
        &self,
        request: Request<ControllerListVolumeHealthRequest>,
    ) -> Result<Response<ControllerListVolumeHealthResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::ControllerListVolumeHealth, &request, Target::none())
            .await?;
        scope.finish(self.0.controller_list_health(request.into_inner()))
    }

    async fn controller_get_volume_health(
        &self,
        request: Request<ControllerGetVolumeHealthRequest>,
    ) -> Result<Response<ControllerGetVolumeHealthResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::ControllerGetVolumeHealth, &request, target)
            .await?;
        scope.finish(self.0.controller_volume_health(request.into_inner()))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::GetCapacity, &request, Target::none())
            .await?;
        scope.finish(self.0.get_capacity(request.into_inner()))
    }

    async fn controller_get_capabilities(
        &self,
        request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::ControllerGetCapabilities, &request, Target::none())
            .await?;
        scope.finish(Ok(self.0.controller_capabilities()))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let r = request.get_ref();
        let target = Target::snapshot("snapshot-name", &r.name).with_volume(&r.source_volume_id);
        let scope = self.0.begin(Rpc::CreateSnapshot, &request, target).await?;
        scope.finish(self.0.create_snapshot(request.into_inner()))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let target = Target::snapshot("snapshot", &request.get_ref().snapshot_id);
        let scope = self.0.begin(Rpc::DeleteSnapshot, &request, target).await?;
        scope.finish(self.0.delete_snapshot(request.into_inner()))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().source_volume_id);
        let scope = self.0.begin(Rpc::ListSnapshots, &request, target).await?;
        scope.finish(self.0.list_snapshots(request.into_inner()))
    }

    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::GetSnapshot, &request, Target::none())
            .await?;
        scope.finish(self.0.get_snapshot(request.into_inner()))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::ControllerExpandVolume, &request, target)
            .await?;
        scope.finish(self.0.controller_expand(request.into_inner()))
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::ControllerGetVolume, &request, target)
            .await?;
        scope.finish(self.0.get_volume(request.into_inner()))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::ControllerModifyVolume, &request, target)
            .await?;
        scope.finish(self.0.modify_volume(request.into_inner()))
    }
}
