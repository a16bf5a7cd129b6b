//! Reads and growth of staged or published volumes: stats, expansion, health; capabilities
//! and node info.

use csi_proto::v1::node_service_capability::{self, Rpc as CapRpc};
use csi_proto::v1::*;
use tonic::Status;

use crate::capabilities::PluginService;
use crate::plugin::MockPlugin;
use crate::state::{State, at};
use crate::validate;

impl MockPlugin {
    /// The volume's size, after checking it is staged or published at `path`.
    pub(super) fn size_at(
        &self,
        state: &State,
        volume_id: &str,
        path: &str,
    ) -> Result<i64, Status> {
        let volume = self.node_volume(state, volume_id)?;
        let key = at(self.node_id(), path);
        let here = state
            .staged
            .get(&key)
            .is_some_and(|s| s.volume_id == volume_id)
            || state
                .published
                .get(&key)
                .is_some_and(|p| p.volume_id == volume_id);
        if !here {
            return Err(Status::not_found(format!(
                "volume {volume_id} is not staged or published at {path}"
            )));
        }
        Ok(volume.map_or(self.config().default_volume_bytes, |v| v.capacity))
    }

    /// The checks of `volume_path` before the volume is looked up: present. A relative path
    /// cannot be where a volume is staged or published, so it is answered NOT_FOUND by the
    /// lookup, as real plugins and csi-sanity expect (with
    /// [`Quirk::ArgumentChecksFirst`](crate::Quirk::ArgumentChecksFirst), INVALID_ARGUMENT
    /// first, as this mock once did).
    fn check_volume_path(&self, req_path: &str, staging_target_path: &str) -> Result<(), Status> {
        if self.shared.lock().quirks.argument_checks_first {
            validate::path("volume_path", req_path)?;
        } else {
            validate::required_within("volume_path", req_path, usize::MAX)?;
        }
        if !staging_target_path.is_empty() {
            validate::path("staging_target_path", staging_target_path)?;
        }
        Ok(())
    }

    pub(super) fn node_stats(
        &self,
        req: NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        self.check_volume_path(&req.volume_path, &req.staging_target_path)?;
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
            volume_condition: inner.volume_condition(
                self.has_node_cap(crate::capabilities::NodeCapability::VolumeCondition),
                &req.volume_id,
            ),
        })
    }

    pub(super) fn node_expand(
        &self,
        req: NodeExpandVolumeRequest,
    ) -> Result<NodeExpandVolumeResponse, Status> {
        validate::required("volume_id", &req.volume_id)?;
        self.check_volume_path(&req.volume_path, &req.staging_target_path)?;
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

    pub(super) fn node_capabilities(&self) -> NodeGetCapabilitiesResponse {
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

    pub(super) fn node_info(&self) -> NodeGetInfoResponse {
        let config = self.config();
        let topology = config
            .plugin_caps
            .services
            .contains(&PluginService::VolumeAccessibilityConstraints)
            && !config.topology.is_empty();
        NodeGetInfoResponse {
            node_id: self.node_id().to_owned(),
            max_volumes_per_node: config.max_volumes_per_node.unwrap_or(0),
            accessible_topology: topology.then(|| Topology {
                segments: config.topology.clone().into_iter().collect(),
            }),
        }
    }

    pub(super) fn node_volume_health(
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
