//! Volumes: create (empty, restored, cloned), delete, list, get, modify, capacity, expansion,
//! health.

use std::collections::HashMap;

use csi_proto::v1::volume_content_source::Type as SourceType;
use csi_proto::v1::*;
use tonic::Status;

use crate::capabilities::{ControllerCapability, PluginService, VolumeExpansion};
use crate::plugin::MockPlugin;
use crate::state::pagination::page;
use crate::state::{State, VolumeRec};
use crate::validate;

impl MockPlugin {
    pub(super) fn create_volume(
        &self,
        req: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, Status> {
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
        if !self.shared.lock().quirks.any_mutable_parameter_key {
            self.check_mutable_keys(&req.mutable_parameters)?;
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
        let elsewhere = inner.quirks.volumes_elsewhere;
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
                    None if !config.topology.is_empty() && elsewhere => {
                        vec![Topology {
                            segments: config
                                .topology
                                .keys()
                                .map(|k| (k.clone(), "elsewhere".to_owned()))
                                .collect(),
                        }]
                    }
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
    pub(super) fn source_size(
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

    pub(super) fn delete_volume(
        &self,
        req: DeleteVolumeRequest,
    ) -> Result<DeleteVolumeResponse, Status> {
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
        let on_nodes = state.node_uses(&req.volume_id);
        if !on_nodes.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {} is still staged or published at (node:path) {}",
                req.volume_id,
                on_nodes.join(", ")
            )));
        }
        if let Some(name) = state.volumes.remove(&req.volume_id).and_then(|v| v.name) {
            state.volume_names.remove(&name);
        }
        Ok(DeleteVolumeResponse {})
    }

    pub(super) fn list_volumes(
        &self,
        req: ListVolumesRequest,
    ) -> Result<ListVolumesResponse, Status> {
        validate::optional("starting_token", &req.starting_token)?;
        let with_nodes = self.has_controller_cap(ControllerCapability::ListVolumesPublishedNodes);
        let with_condition = self.has_controller_cap(ControllerCapability::VolumeCondition);
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
                status: (with_nodes || with_condition).then(|| {
                    list_volumes_response::VolumeStatus {
                        published_node_ids: if with_nodes {
                            state.published_nodes(&v.id)
                        } else {
                            Vec::new()
                        },
                        volume_condition: inner.volume_condition(with_condition, &v.id),
                    }
                }),
            })
            .collect();
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    pub(super) fn get_volume(
        &self,
        req: ControllerGetVolumeRequest,
    ) -> Result<ControllerGetVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        let with_nodes = self.has_controller_cap(ControllerCapability::ListVolumesPublishedNodes);
        let with_condition = self.has_controller_cap(ControllerCapability::VolumeCondition);
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
                volume_condition: inner.volume_condition(with_condition, &req.volume_id),
            }),
        })
    }

    /// Checks in the order real plugins and csi-sanity expect: the volume id, then that the
    /// volume exists (NOT_FOUND), then the keys. An empty `mutable_parameters` changes nothing
    /// and answers OK (csi-sanity's "modify a volume created without a volume attribute class"
    /// sends exactly that).
    pub(super) fn modify_volume(
        &self,
        req: ControllerModifyVolumeRequest,
    ) -> Result<ControllerModifyVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::map("mutable_parameters", &req.mutable_parameters)?;
        validate::secrets(&req.secrets)?;
        let mut inner = self.shared.lock();
        if inner.quirks.argument_checks_first && req.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument(
                "mutable_parameters is required (at least one key)",
            ));
        }
        let any_key = inner.quirks.any_mutable_parameter_key;
        let volume =
            inner.state.volumes.get_mut(&req.volume_id).ok_or_else(|| {
                Status::not_found(format!("volume {} does not exist", req.volume_id))
            })?;
        if !any_key {
            self.check_mutable_keys(&req.mutable_parameters)?;
        }
        volume.mutable_parameters.extend(req.mutable_parameters);
        Ok(ControllerModifyVolumeResponse {})
    }

    /// Refuses every `mutable_parameters` key the configuration does not list, naming them.
    pub(super) fn check_mutable_keys(
        &self,
        mutable_parameters: &HashMap<String, String>,
    ) -> Result<(), Status> {
        let supported = &self.config().mutable_parameter_keys;
        let mut unsupported: Vec<&str> = mutable_parameters
            .keys()
            .map(String::as_str)
            .filter(|key| !supported.contains(*key))
            .collect();
        if unsupported.is_empty() {
            return Ok(());
        }
        unsupported.sort_unstable();
        let accepted = if supported.is_empty() {
            "this plugin supports no mutable parameter".to_string()
        } else {
            format!(
                "supported keys: {}",
                supported
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        Err(Status::invalid_argument(format!(
            "mutable_parameters key {} is not supported ({accepted})",
            unsupported
                .iter()
                .map(|key| format!("{key:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    pub(super) fn get_capacity(
        &self,
        req: GetCapacityRequest,
    ) -> Result<GetCapacityResponse, Status> {
        for (i, cap) in req.volume_capabilities.iter().enumerate() {
            validate::capability_at(
                &csi_structs::FieldPath::named("volume_capabilities").index(i),
                Some(cap),
            )?;
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

    pub(super) fn controller_expand(
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
            || !state.node_uses(&req.volume_id).is_empty();
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

    pub(super) fn controller_volume_health(
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

    pub(super) fn controller_list_health(
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
pub(super) fn incompatibility(
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
