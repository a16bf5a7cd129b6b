//! The shim's backend: this node's plugins, reached with csi-client. Controller calls go to
//! the local plugin's controller service; node detach goes through csi-node's
//! [`VolumeManager`] so its usage records decide about unstaging.

use async_trait::async_trait;
use csi_client::{ErrorClass, Failure};
use csi_rpc_shim::{
    Attached, CallContext, ControllerAttach, ControllerDetach, ControllerExpand,
    ControllerExpanded, ControllerValidate, CreateSnapshot, CreateVolume, CreatedVolume,
    DeleteSnapshot, DeleteVolume, GrpcCode, ListSnapshots, ListVolumes, LocalPlugins, LocalStatus,
    NodeDetach, NodeExpand, NodeExpanded, PluginError, PluginFailure, ServiceKind, SnapshotInfo,
    SnapshotPage, Validated, VolumePage,
};
use csi_structs::{CapacityRange, ConfirmPolicy, Confirmation, ControllerCapabilities, PluginId};

use super::plugins::Plugins;
use csi_node::layout::Usage;
use csi_node::volumes::{UnmountRequest, VolumeError, VolumeManager};

/// [`LocalPlugins`] over csi-client.
#[derive(Debug)]
pub struct LocalBackend {
    /// The local plugins.
    pub plugins: Plugins,
    /// The node volume manager.
    pub volumes: VolumeManager,
}

/// What a failed plugin call came to: the plugin's status when it answered one, otherwise
/// what the client saw (an unusable answer, its own deadline, a lost socket).
pub fn plugin_failure(e: &csi_client::Error) -> PluginFailure {
    match e.kind().failure() {
        Failure::Status(code) => PluginFailure::Status(GrpcCode::from(code)),
        Failure::InvalidResponse => PluginFailure::UnusableAnswer,
        Failure::AttemptDeadline | Failure::CallDeadline => PluginFailure::Deadline,
        Failure::ConnectionLost | Failure::NotConnected | Failure::BadEndpoint => {
            PluginFailure::Unreachable
        }
        Failure::InvalidRequest => PluginFailure::NotSent,
    }
}

fn client_error(e: csi_client::Error) -> PluginError {
    PluginError::failed(e.class(), plugin_failure(&e), e.to_string())
}

fn node_error(e: VolumeError) -> PluginError {
    PluginError::failed(e.class(), node_failure(&e), e.to_string())
}

fn node_failure(e: &VolumeError) -> PluginFailure {
    match e {
        VolumeError::NotUndone { failed, .. } => node_failure(failed),
        VolumeError::Call { source, .. } => plugin_failure(source),
        VolumeError::PluginMissing { .. } | VolumeError::NotHealthy { .. } => {
            PluginFailure::Unreachable
        }
        VolumeError::Unsupported { .. }
        | VolumeError::NotHere { .. }
        | VolumeError::Path(_)
        | VolumeError::Dir { .. }
        | VolumeError::Usage { .. } => PluginFailure::Agent,
    }
}

fn unsupported(what: &str) -> PluginError {
    PluginError::failed(
        ErrorClass::Fatal,
        PluginFailure::Agent,
        format!("csi-agent does not serve {what} for other agents"),
    )
}

impl LocalBackend {
    fn controller(&self, plugin: &PluginId) -> Result<csi_client::ControllerClient, PluginError> {
        self.controller_and_caps(plugin).map(|(c, _)| c)
    }

    /// The controller client, and the plugin's controller capabilities as fingerprinted.
    fn controller_and_caps(
        &self,
        plugin: &PluginId,
    ) -> Result<(csi_client::ControllerClient, ControllerCapabilities), PluginError> {
        match self.plugins.client(plugin) {
            Some((client, fp)) if fp.capabilities.plugin.has_controller_service() => {
                Ok((client.controller(), fp.capabilities.controller.clone()))
            }
            _ => Err(PluginError::failed(
                ErrorClass::RetryElsewhere,
                PluginFailure::Unreachable,
                format!("plugin {plugin} has no controller service here"),
            )),
        }
    }
}

async fn within<T>(
    ctx: &CallContext,
    call: impl Future<Output = Result<T, PluginError>>,
) -> Result<T, PluginError> {
    let deadline = ctx.deadline;
    tokio::time::timeout_at(deadline, call)
        .await
        .unwrap_or_else(|_| {
            Err(PluginError::failed(
                ErrorClass::Uncertain,
                PluginFailure::Deadline,
                "the caller's deadline passed before the plugin answered",
            ))
        })
}

#[async_trait]
impl LocalPlugins for LocalBackend {
    fn status(&self, plugin: &PluginId, service: ServiceKind) -> LocalStatus {
        self.plugins.status(plugin, service)
    }

    async fn controller_attach(
        &self,
        ctx: &CallContext,
        req: ControllerAttach,
    ) -> Result<Attached, PluginError> {
        let (c, caps) = self.controller_and_caps(&req.query.plugin)?;
        // The spec: the CO must send `readonly = false` unless the plugin has
        // PUBLISH_READONLY. Without it, read-only is left to NodePublishVolume.
        let read_only = req.read_only && caps.allows_readonly_publish();
        within(ctx, async move {
            let publish_context = c
                .publish(
                    &req.external_volume,
                    &req.plugin_node,
                    &req.capability,
                    read_only,
                    &req.volume_context,
                    &req.secrets,
                )
                .await
                .map_err(client_error)?;
            Ok(Attached { publish_context })
        })
        .await
    }

    async fn controller_detach(
        &self,
        ctx: &CallContext,
        req: ControllerDetach,
    ) -> Result<(), PluginError> {
        let c = self.controller(&req.query.plugin)?;
        within(ctx, async move {
            c.unpublish(&req.external_volume, Some(&req.plugin_node), &req.secrets)
                .await
                .map_err(client_error)
        })
        .await
    }

    async fn controller_validate(
        &self,
        ctx: &CallContext,
        req: ControllerValidate,
    ) -> Result<Validated, PluginError> {
        let c = self.controller(&req.query.plugin)?;
        within(ctx, async move {
            let asked = csi_structs::confirm::AskedCapabilities {
                volume_capabilities: req.capabilities.clone(),
                volume_context: req.volume_context.clone(),
                parameters: req.parameters.clone(),
                mutable_parameters: Default::default(),
            };
            match c
                .validate_volume_capabilities(
                    &req.external_volume,
                    &asked,
                    &req.secrets,
                    ConfirmPolicy::Lenient,
                )
                .await
                .map_err(client_error)?
            {
                not @ Confirmation::NotConfirmed { .. } => Ok(Validated::NotConfirmed {
                    message: not.to_string(),
                }),
                _ => Ok(Validated::Confirmed),
            }
        })
        .await
    }

    async fn create_volume(
        &self,
        ctx: &CallContext,
        req: CreateVolume,
    ) -> Result<CreatedVolume, PluginError> {
        let c = self.controller(&req.query.plugin)?;
        within(ctx, async move {
            let range = CapacityRange::new(
                u64::try_from(req.required_bytes).ok(),
                u64::try_from(req.limit_bytes).ok(),
            )
            .ok();
            let wire = csi_client::proto::CreateVolumeRequest {
                name: req.volume.as_str().to_owned(),
                capacity_range: range.as_ref().map(Into::into),
                volume_capabilities: req.capabilities.iter().map(Into::into).collect(),
                parameters: req.parameters.to_wire(),
                secrets: req.secrets.to_wire(),
                ..Default::default()
            };
            let volume = c.create_volume(wire).await.map_err(client_error)?;
            Ok(CreatedVolume {
                external_volume: volume.volume_id,
                capacity_bytes: volume
                    .capacity_bytes
                    .map(|b| i64::try_from(b).unwrap_or(i64::MAX))
                    .unwrap_or(0),
                volume_context: volume.volume_context,
            })
        })
        .await
    }

    async fn delete_volume(&self, ctx: &CallContext, req: DeleteVolume) -> Result<(), PluginError> {
        let c = self.controller(&req.query.plugin)?;
        within(ctx, async move {
            c.delete(&req.external_volume, &req.secrets)
                .await
                .map_err(client_error)
        })
        .await
    }

    async fn controller_expand(
        &self,
        _ctx: &CallContext,
        _req: ControllerExpand,
    ) -> Result<ControllerExpanded, PluginError> {
        Err(unsupported("ControllerExpandVolume"))
    }

    async fn list_volumes(
        &self,
        _ctx: &CallContext,
        _req: ListVolumes,
    ) -> Result<VolumePage, PluginError> {
        Err(unsupported("ListVolumes"))
    }

    async fn create_snapshot(
        &self,
        _ctx: &CallContext,
        _req: CreateSnapshot,
    ) -> Result<SnapshotInfo, PluginError> {
        Err(unsupported("CreateSnapshot"))
    }

    async fn delete_snapshot(
        &self,
        _ctx: &CallContext,
        _req: DeleteSnapshot,
    ) -> Result<(), PluginError> {
        Err(unsupported("DeleteSnapshot"))
    }

    async fn list_snapshots(
        &self,
        _ctx: &CallContext,
        _req: ListSnapshots,
    ) -> Result<SnapshotPage, PluginError> {
        Err(unsupported("ListSnapshots"))
    }

    async fn node_detach(&self, ctx: &CallContext, req: NodeDetach) -> Result<(), PluginError> {
        let request = UnmountRequest {
            plugin: req.plugin,
            volume: req.volume,
            external_id: req.external_volume,
            workload: req.workload,
            usage: Usage::of(&req.capability, req.read_only),
        };
        within(ctx, async move {
            self.volumes
                .unmount(&request)
                .await
                .map(drop)
                .map_err(node_error)
        })
        .await
    }

    async fn node_expand(
        &self,
        _ctx: &CallContext,
        _req: NodeExpand,
    ) -> Result<NodeExpanded, PluginError> {
        Err(unsupported("NodeExpandVolume"))
    }
}
