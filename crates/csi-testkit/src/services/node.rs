//! Node: staging and publishing with real directories, stats, expansion, info, health.
//!
//! Who creates what (csi-spec §3.13): the CO creates the staging directory, so the mock only
//! checks it exists; the mock creates the target (a directory for mount access, a file standing
//! in for the device node for block access) under a parent the CO created, and removes it on
//! unpublish. Nothing is mounted, so tests run unprivileged.

use std::fs;
use std::io;
use std::path::Path;

use csi_proto::Rpc;
use csi_proto::v1::node_server::Node;
use csi_proto::v1::node_service_capability::{self, Rpc as CapRpc};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::capabilities::{ControllerCapability, NodeCapability, PluginService};
use crate::dispatch::Target;
use crate::plugin::MockPlugin;
use crate::services::Svc;
use crate::services::controller::check_context;
use crate::state::{PublishedRec, StagedRec, State, VolumeRec};
use crate::validate;

impl MockPlugin {
    fn has_node_cap(&self, cap: NodeCapability) -> bool {
        self.config().node_caps.contains(&cap)
    }

    /// Whether node calls must follow a controller publication to this node.
    fn needs_controller_publish(&self) -> bool {
        self.config().role.has_controller()
            && self
                .config()
                .controller_caps
                .contains(&ControllerCapability::PublishUnpublishVolume)
    }

    /// The volume a node call is about. With a controller role the mock knows every volume
    /// and answers NOT_FOUND for others; node-only, it accepts any id (as a node plugin that
    /// learns of volumes from the CO would).
    fn node_volume<'s>(
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
    fn check_controller_published(
        &self,
        state: &State,
        volume_id: &str,
        publish_context: &std::collections::HashMap<String, String>,
    ) -> Result<(), Status> {
        if !self.needs_controller_publish() {
            return Ok(());
        }
        let node = &self.config().node_id;
        let publication = state
            .publications
            .get(&(volume_id.to_string(), node.clone()))
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

    fn check_node_limit(&self, state: &State, volume_id: &str) -> Result<(), Status> {
        if self.needs_controller_publish() {
            return Ok(()); // enforced by ControllerPublishVolume
        }
        let Some(max) = self.config().max_volumes_per_node.filter(|m| *m > 0) else {
            return Ok(());
        };
        let mut volumes: Vec<&str> = state
            .staged
            .values()
            .map(|s| s.volume_id.as_str())
            .chain(state.published.values().map(|p| p.volume_id.as_str()))
            .collect();
        volumes.sort_unstable();
        volumes.dedup();
        if volumes.contains(&volume_id) {
            return Ok(());
        }
        if i64::try_from(volumes.len()).unwrap_or(i64::MAX) >= max {
            return Err(Status::resource_exhausted(format!(
                "node {} already uses {} volumes, the maximum is {max}",
                self.config().node_id,
                volumes.len()
            )));
        }
        Ok(())
    }

    fn node_stage(&self, req: NodeStageVolumeRequest) -> Result<NodeStageVolumeResponse, Status> {
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
        if let Some(existing) = state.staged.get(&req.staging_target_path) {
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
        if let Some(other) = state.staged_paths_of(&req.volume_id).first() {
            return Err(Status::failed_precondition(format!(
                "volume {} is already staged on node {} at {other}",
                req.volume_id,
                self.config().node_id
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
            req.staging_target_path,
            StagedRec {
                volume_id: req.volume_id,
                capability,
            },
        );
        Ok(NodeStageVolumeResponse {})
    }

    fn node_unstage(
        &self,
        req: NodeUnstageVolumeRequest,
    ) -> Result<NodeUnstageVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::path("staging_target_path", &req.staging_target_path)?;
        let mut inner = self.shared.lock();
        let strict = inner.quirks.not_found_on_repeated_unpublish;
        let state = &mut inner.state;
        self.node_volume(state, &req.volume_id)?;
        let published: Vec<&String> = state
            .published
            .iter()
            .filter(|(_, p)| {
                p.volume_id == req.volume_id && p.staging_path == req.staging_target_path
            })
            .map(|(path, _)| path)
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
        match state.staged.get(&req.staging_target_path) {
            Some(s) if s.volume_id == req.volume_id => {
                state.staged.remove(&req.staging_target_path);
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

    fn node_publish(
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
            match state.staged.get(&req.staging_target_path) {
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
        if let Some(existing) = state.published.get(&req.target_path) {
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
        if let Some(other) = state.target_paths_of(&req.volume_id).first() {
            let mode = validate::mode_of(&capability);
            if !(validate::is_multi_node(mode) || mode == Mode::SingleNodeMultiWriter) {
                return Err(Status::failed_precondition(format!(
                    "volume {} is already published at {other} and access mode {} allows one \
                     target path",
                    req.volume_id,
                    mode.as_str_name()
                )));
            }
        }
        self.check_node_limit(state, &req.volume_id)?;
        let block = validate::is_block(&capability);
        create_target(&req.target_path, block)?;
        state.published.insert(
            req.target_path,
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

    fn node_unpublish(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::path("target_path", &req.target_path)?;
        let mut inner = self.shared.lock();
        let strict = inner.quirks.not_found_on_repeated_unpublish;
        let state = &mut inner.state;
        self.node_volume(state, &req.volume_id)?;
        match state.published.get(&req.target_path) {
            Some(p) if p.volume_id == req.volume_id => {
                remove_target(&req.target_path, p.block)?;
                state.published.remove(&req.target_path);
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

    /// The volume's size, after checking it is staged or published at `path`.
    fn size_at(&self, state: &State, volume_id: &str, path: &str) -> Result<i64, Status> {
        let volume = self.node_volume(state, volume_id)?;
        let here = state
            .staged
            .get(path)
            .is_some_and(|s| s.volume_id == volume_id)
            || state
                .published
                .get(path)
                .is_some_and(|p| p.volume_id == volume_id);
        if !here {
            return Err(Status::not_found(format!(
                "volume {volume_id} is not staged or published at {path}"
            )));
        }
        Ok(volume.map_or(self.config().default_volume_bytes, |v| v.capacity))
    }

    fn node_stats(
        &self,
        req: NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::path("volume_path", &req.volume_path)?;
        if !req.staging_target_path.is_empty() {
            validate::path("staging_target_path", &req.staging_target_path)?;
        }
        let inner = self.shared.lock();
        let size = self.size_at(&inner.state, &req.volume_id, &req.volume_path)?;
        Ok(NodeGetVolumeStatsResponse {
            usage: vec![
                VolumeUsage {
                    available: size,
                    total: size,
                    used: 0,
                    unit: volume_usage::Unit::Bytes as i32,
                },
                VolumeUsage {
                    available: 1 << 20,
                    total: 1 << 20,
                    used: 0,
                    unit: volume_usage::Unit::Inodes as i32,
                },
            ],
            volume_condition: None,
        })
    }

    fn node_expand(
        &self,
        req: NodeExpandVolumeRequest,
    ) -> Result<NodeExpandVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        validate::path("volume_path", &req.volume_path)?;
        if !req.staging_target_path.is_empty() {
            validate::path("staging_target_path", &req.staging_target_path)?;
        }
        let range = req.capacity_range.unwrap_or_default();
        validate::capacity_range("capacity_range", &range)?;
        if let Some(cap) = &req.volume_capability {
            validate::capability("volume_capability", Some(cap))?;
        }
        validate::secrets(&req.secrets)?;
        let max = self.config().max_volume_bytes;
        if range.required_bytes > max {
            return Err(Status::out_of_range(format!(
                "capacity_range.required_bytes {} exceeds the largest volume ({max} bytes)",
                range.required_bytes
            )));
        }
        let inner = self.shared.lock();
        let size = self.size_at(&inner.state, &req.volume_id, &req.volume_path)?;
        if let (Some(cap), Some(volume)) = (
            &req.volume_capability,
            inner.state.volumes.get(&req.volume_id),
        ) && !validate::supports(&volume.capabilities, cap)
        {
            return Err(Status::invalid_argument(format!(
                "volume_capability is not supported by volume {}",
                req.volume_id
            )));
        }
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: size.max(range.required_bytes),
        })
    }

    fn node_capabilities(&self) -> NodeGetCapabilitiesResponse {
        NodeGetCapabilitiesResponse {
            capabilities: self
                .config()
                .node_caps
                .iter()
                .map(|cap| NodeServiceCapability {
                    r#type: Some(node_service_capability::Type::Rpc(CapRpc {
                        r#type: *cap as i32,
                    })),
                })
                .collect(),
        }
    }

    fn node_info(&self) -> NodeGetInfoResponse {
        let config = self.config();
        let topology = config
            .plugin_caps
            .services
            .contains(&PluginService::VolumeAccessibilityConstraints)
            && !config.topology.is_empty();
        NodeGetInfoResponse {
            node_id: config.node_id.clone(),
            max_volumes_per_node: config.max_volumes_per_node.unwrap_or(0),
            accessible_topology: topology.then(|| Topology {
                segments: config.topology.clone().into_iter().collect(),
            }),
        }
    }

    fn node_volume_health(
        &self,
        req: NodeGetVolumeHealthRequest,
    ) -> Result<NodeGetVolumeHealthResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        for (field, value) in [
            ("volume_publish_path", &req.volume_publish_path),
            ("staging_target_path", &req.staging_target_path),
        ] {
            if !value.is_empty() {
                validate::path(field, value)?;
            }
        }
        self.node_volume(&self.shared.lock().state, &req.volume_id)?;
        Ok(NodeGetVolumeHealthResponse {
            volume_health: Some(VolumeHealth {
                volume_id: req.volume_id,
                health_statuses: Vec::new(),
            }),
        })
    }
}

/// Creates the target: a directory for mount access, a file for block access. An existing
/// target of the right kind is reused.
fn create_target(target: &str, block: bool) -> Result<(), Status> {
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
fn remove_target(target: &str, block: bool) -> Result<(), Status> {
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

#[tonic::async_trait]
impl Node for Svc {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self.0.begin(Rpc::NodeStageVolume, &request, target).await?;
        scope.finish(self.0.node_stage(request.into_inner()))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodeUnstageVolume, &request, target)
            .await?;
        scope.finish(self.0.node_unstage(request.into_inner()))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodePublishVolume, &request, target)
            .await?;
        scope.finish(self.0.node_publish(request.into_inner()))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodeUnpublishVolume, &request, target)
            .await?;
        scope.finish(self.0.node_unpublish(request.into_inner()))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodeGetVolumeStats, &request, target)
            .await?;
        scope.finish(self.0.node_stats(request.into_inner()))
    }

    async fn node_get_volume_health(
        &self,
        request: Request<NodeGetVolumeHealthRequest>,
    ) -> Result<Response<NodeGetVolumeHealthResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodeGetVolumeHealth, &request, target)
            .await?;
        scope.finish(self.0.node_volume_health(request.into_inner()))
    }

    async fn node_get_storage_health(
        &self,
        request: Request<NodeGetStorageHealthRequest>,
    ) -> Result<Response<NodeGetStorageHealthResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::NodeGetStorageHealth, &request, Target::none())
            .await?;
        let result = validate::secrets(&request.get_ref().secrets)
            .map(|()| NodeGetStorageHealthResponse::default());
        scope.finish(result)
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodeExpandVolume, &request, target)
            .await?;
        scope.finish(self.0.node_expand(request.into_inner()))
    }

    async fn node_get_capabilities(
        &self,
        request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::NodeGetCapabilities, &request, Target::none())
            .await?;
        scope.finish(Ok(self.0.node_capabilities()))
    }

    async fn node_get_info(
        &self,
        request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::NodeGetInfo, &request, Target::none())
            .await?;
        scope.finish(Ok(self.0.node_info()))
    }
}
