//! The node's side of csi-rpc-shim (cargo feature `shim`): [`NodeBackend`], csi-rpc-shim's
//! [`LocalPlugins`] over this node's [`PluginManager`] and [`VolumeManager`]. Controller calls
//! go to the local plugin's controller service with csi-client; node detach goes through the
//! volume manager, so its usage records decide about unstaging; node expansion likewise.
//! [`RegistryFeed`] keeps the shim's registry in step with the plugin manager.

use async_trait::async_trait;
use csi_client::{CallOptions, ErrorClass, Failure, Rpc, SnapshotFilter};
use csi_rpc_shim::{
    ControllerAttach, ControllerAttached, ControllerDetach, ControllerExpand, ControllerExpanded,
    ControllerValidate, CreateSnapshot, CreateVolume, CreatedVolume, DeleteSnapshot, DeleteVolume,
    GrpcCode, ListSnapshots, ListVolumes, ListedVolume, LocalPlugins, LocalStatus, NodeDetach,
    NodeExpand, NodeExpanded, PluginError, PluginFailure, ServiceKind, ShimContext, SnapshotInfo,
    SnapshotPage, Validated, VolumePage,
};
use csi_structs::wire::size_to_wire;
use csi_structs::{CapacityRange, ConfirmPolicy, Confirmation, ControllerCapabilities, PluginId};

mod registry;

pub use registry::RegistryFeed;

use crate::layout::PublishUsage;
use crate::plugins::{Health, PluginManager};
use crate::volumes::{ExpandRequest, UnmountRequest, VolumeError, VolumeManager};

/// The reason [`NodeBackend`] gives for a plugin whose health is not known yet.
pub const NOT_PROBED: &str = "health unknown: not probed since its fingerprint";

/// csi-rpc-shim's [`LocalPlugins`] over this node's plugin manager and volume manager: the
/// node's side of the shim, what serves the calls other agents (and this one) route here.
#[derive(Clone, Debug)]
pub struct NodeBackend {
    plugins: PluginManager,
    volumes: VolumeManager,
}

/// What a failed plugin call came to: the plugin's status when it answered one, otherwise
/// what the client saw (an unusable answer, its own deadline, a lost socket).
pub fn plugin_failure(e: &csi_client::Error) -> PluginFailure {
    match e.kind().failure() {
        Failure::Status(code) => PluginFailure::Status(GrpcCode::from(code)),
        Failure::InvalidResponse => PluginFailure::UnusableAnswer,
        Failure::AttemptDeadline | Failure::CallDeadline | Failure::VolumeBusy => {
            PluginFailure::Deadline
        }
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
        VolumeError::NotConfirmed { source, .. } => node_failure(source),
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

impl NodeBackend {
    /// The backend over `plugins` and `volumes` (the volume manager's plugins should be the
    /// same manager's).
    pub fn new(plugins: PluginManager, volumes: VolumeManager) -> Self {
        Self { plugins, volumes }
    }

    /// Whether `plugin`'s `service` is here and healthy, for the shim: a plugin not yet
    /// fingerprinted or probed, or whose last probe failed, is `Unhealthy` (the shim still
    /// sends it release steps, never anything else).
    pub fn status(&self, plugin: &PluginId, service: ServiceKind) -> LocalStatus {
        let Some(status) = self.plugins.status(plugin) else {
            return LocalStatus::Missing;
        };
        let Some(fp) = &status.fingerprint else {
            // A node detach needs no fingerprint: "here, not healthy" lets the shim send
            // release steps and nothing else.
            return LocalStatus::Unhealthy {
                reason: "not fingerprinted yet".into(),
            };
        };
        let offered = match service {
            ServiceKind::Controller => fp.capabilities.plugin.has_controller_service(),
            ServiceKind::Node => fp.serves_node(),
        };
        if !offered {
            return LocalStatus::Missing;
        }
        match &status.health {
            Health::Healthy => LocalStatus::Healthy,
            Health::Unknown => LocalStatus::Unhealthy {
                reason: NOT_PROBED.into(),
            },
            Health::Unhealthy(why) => LocalStatus::Unhealthy {
                reason: why.to_string(),
            },
        }
    }

    fn controller(
        &self,
        plugin: &PluginId,
        rpc: Rpc,
        ctx: &ShimContext,
    ) -> Result<csi_client::ControllerClient, PluginError> {
        self.controller_and_caps(plugin, rpc, ctx).map(|(c, _)| c)
    }

    /// The controller client for `rpc` served under `ctx`, and the plugin's controller
    /// capabilities as fingerprinted.
    ///
    /// The client's whole-call budget is cut to the time left until the caller's deadline
    /// (never lengthened past its policy's), so that csi-client plans its retries against the
    /// deadline that counts: it does not pause for a retry the caller will not wait for, and it
    /// clips each attempt (and the `grpc-timeout` the plugin sees) to what is left. Without
    /// it, a retryable failure (UNAVAILABLE) under a short caller deadline (a duty holder's,
    /// say) became an uncertain "deadline passed" at that deadline instead of the plugin's
    /// answer at once.
    fn controller_and_caps(
        &self,
        plugin: &PluginId,
        rpc: Rpc,
        ctx: &ShimContext,
    ) -> Result<(csi_client::ControllerClient, ControllerCapabilities), PluginError> {
        match self.plugins.get(plugin) {
            Some(ready)
                if ready
                    .fingerprint
                    .capabilities
                    .plugin
                    .has_controller_service() =>
            {
                let left = ctx
                    .deadline
                    .saturating_duration_since(tokio::time::Instant::now());
                let budget = ready.client.policies().get(rpc).total_budget.min(left);
                let options = CallOptions::new().total_budget(budget);
                Ok((
                    ready.client.controller().with_options(options),
                    ready.fingerprint.capabilities.controller.clone(),
                ))
            }
            _ => Err(PluginError::failed(
                ErrorClass::RetryElsewhere,
                PluginFailure::Unreachable,
                format!("plugin {plugin} has no controller service here"),
            )),
        }
    }
}

/// The capacity range of an expansion (0: unset), refused before any call when it breaks the
/// spec's rules.
fn capacity_range(required_bytes: i64, limit_bytes: i64) -> Result<CapacityRange, PluginError> {
    CapacityRange::new(
        u64::try_from(required_bytes).ok(),
        u64::try_from(limit_bytes).ok(),
    )
    .map_err(|e| {
        PluginError::failed(
            ErrorClass::Fatal,
            PluginFailure::NotSent,
            format!("capacity range: {e}"),
        )
    })
}

/// Whether a list request asks for everything (no page size, no token).
fn whole(max_entries: i32, starting_token: &str) -> bool {
    max_entries == 0 && starting_token.is_empty()
}

/// A plugin answer that breaks the spec: the call's outcome is known (a read), so retry.
fn unusable(detail: String) -> PluginError {
    PluginError::failed(ErrorClass::Retry, PluginFailure::UnusableAnswer, detail)
}

/// One `ListVolumes` entry, checked by csi-structs' rules.
fn listed_volume(
    index: usize,
    entry: csi_client::proto::list_volumes_response::Entry,
) -> Result<ListedVolume, PluginError> {
    let volume = entry
        .volume
        .as_ref()
        .ok_or_else(|| unusable(format!("ListVolumes entry {index} has no volume")))
        .and_then(|v| {
            csi_structs::Volume::try_from(v)
                .map_err(|e| unusable(format!("ListVolumes entry {index}: {e}")))
        })?;
    let published_nodes = entry
        .status
        .map(|s| s.published_node_ids)
        .unwrap_or_default()
        .into_iter()
        .map(|n| {
            csi_structs::PluginNodeId::new(n)
                .map_err(|e| unusable(format!("ListVolumes entry {index}: published node: {e}")))
        })
        .collect::<Result<_, _>>()?;
    Ok(ListedVolume {
        external_volume: volume.volume_id,
        capacity_bytes: size_to_wire(volume.capacity_bytes),
        published_nodes,
    })
}

fn snapshot_info(s: csi_structs::Snapshot) -> SnapshotInfo {
    SnapshotInfo {
        snapshot: s.snapshot_id,
        source: s.source_volume_id,
        size_bytes: size_to_wire(s.size_bytes),
        ready_to_use: s.ready_to_use,
    }
}

async fn within<T>(
    ctx: &ShimContext,
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
impl LocalPlugins for NodeBackend {
    fn status(&self, plugin: &PluginId, service: ServiceKind) -> LocalStatus {
        NodeBackend::status(self, plugin, service)
    }

    async fn controller_attach(
        &self,
        ctx: &ShimContext,
        req: ControllerAttach,
    ) -> Result<ControllerAttached, PluginError> {
        let (c, caps) =
            self.controller_and_caps(&req.query.plugin, Rpc::ControllerPublishVolume, ctx)?;
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
            Ok(ControllerAttached { publish_context })
        })
        .await
    }

    async fn controller_detach(
        &self,
        ctx: &ShimContext,
        req: ControllerDetach,
    ) -> Result<(), PluginError> {
        let c = self.controller(&req.query.plugin, Rpc::ControllerUnpublishVolume, ctx)?;
        within(ctx, async move {
            c.unpublish(&req.external_volume, Some(&req.plugin_node), &req.secrets)
                .await
                .map_err(client_error)
        })
        .await
    }

    async fn controller_validate(
        &self,
        ctx: &ShimContext,
        req: ControllerValidate,
    ) -> Result<Validated, PluginError> {
        let c = self.controller(&req.query.plugin, Rpc::ValidateVolumeCapabilities, ctx)?;
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
        ctx: &ShimContext,
        req: CreateVolume,
    ) -> Result<CreatedVolume, PluginError> {
        let c = self.controller(&req.query.plugin, Rpc::CreateVolume, ctx)?;
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
                accessibility_requirements: req.accessibility_requirements.as_ref().map(Into::into),
                volume_content_source: req.content_source.as_ref().map(Into::into),
                ..Default::default()
            };
            let volume = c.create_volume(wire).await.map_err(client_error)?;
            Ok(CreatedVolume {
                external_volume: volume.volume_id,
                capacity_bytes: size_to_wire(volume.capacity_bytes),
                volume_context: volume.volume_context,
                accessible_topology: volume.accessible_topology,
            })
        })
        .await
    }

    async fn delete_volume(&self, ctx: &ShimContext, req: DeleteVolume) -> Result<(), PluginError> {
        let c = self.controller(&req.query.plugin, Rpc::DeleteVolume, ctx)?;
        within(ctx, async move {
            c.delete(&req.external_volume, &req.secrets)
                .await
                .map_err(client_error)
        })
        .await
    }

    async fn controller_expand(
        &self,
        ctx: &ShimContext,
        req: ControllerExpand,
    ) -> Result<ControllerExpanded, PluginError> {
        let c = self.controller(&req.query.plugin, Rpc::ControllerExpandVolume, ctx)?;
        let range = capacity_range(req.required_bytes, req.limit_bytes)?;
        within(ctx, async move {
            let answer = c
                .expand(
                    &req.external_volume,
                    &range,
                    req.capability.as_ref(),
                    &req.secrets,
                )
                .await
                .map_err(client_error)?;
            Ok(ControllerExpanded {
                capacity_bytes: i64::try_from(answer.capacity_bytes).unwrap_or(i64::MAX),
                node_expansion_required: answer.node_expansion_required,
            })
        })
        .await
    }

    /// One page as asked, or, with no token and no page size, the plugin's whole listing
    /// (every page followed by csi-client, which refuses a listing that never ends) in one
    /// answer.
    async fn list_volumes(
        &self,
        ctx: &ShimContext,
        req: ListVolumes,
    ) -> Result<VolumePage, PluginError> {
        let c = self.controller(&req.query.plugin, Rpc::ListVolumes, ctx)?;
        within(ctx, async move {
            let request = csi_client::proto::ListVolumesRequest {
                max_entries: req.max_entries,
                starting_token: req.starting_token.clone(),
            };
            let (entries, next_token) = if whole(req.max_entries, &req.starting_token) {
                let all = c.list_all_volumes(request).await.map_err(client_error)?;
                (all, String::new())
            } else {
                let page = c.list_volumes(request).await.map_err(client_error)?;
                (page.entries, page.next_token)
            };
            let entries = entries
                .into_iter()
                .enumerate()
                .map(|(i, e)| listed_volume(i, e))
                .collect::<Result<_, _>>()?;
            Ok(VolumePage {
                entries,
                next_token,
            })
        })
        .await
    }

    async fn create_snapshot(
        &self,
        ctx: &ShimContext,
        req: CreateSnapshot,
    ) -> Result<SnapshotInfo, PluginError> {
        let c = self.controller(&req.query.plugin, Rpc::CreateSnapshot, ctx)?;
        within(ctx, async move {
            let snapshot = c
                .create_snapshot(&req.source, &req.name, &req.parameters, &req.secrets)
                .await
                .map_err(client_error)?;
            Ok(snapshot_info(snapshot))
        })
        .await
    }

    async fn delete_snapshot(
        &self,
        ctx: &ShimContext,
        req: DeleteSnapshot,
    ) -> Result<(), PluginError> {
        let c = self.controller(&req.query.plugin, Rpc::DeleteSnapshot, ctx)?;
        within(ctx, async move {
            c.delete_snapshot(&req.snapshot, &req.secrets)
                .await
                .map_err(client_error)
        })
        .await
    }

    /// As [`list_volumes`](Self::list_volumes): one page, or the whole listing.
    async fn list_snapshots(
        &self,
        ctx: &ShimContext,
        req: ListSnapshots,
    ) -> Result<SnapshotPage, PluginError> {
        let c = self.controller(&req.query.plugin, Rpc::ListSnapshots, ctx)?;
        within(ctx, async move {
            let filter = SnapshotFilter {
                source_volume: req.source.clone(),
                snapshot: req.snapshot.clone(),
            };
            let (snapshots, next_token) = if whole(req.max_entries, &req.starting_token) {
                let all = c
                    .list_all_snapshots_matching(&filter, &req.secrets)
                    .await
                    .map_err(client_error)?;
                (all, String::new())
            } else {
                let max_entries = u32::try_from(req.max_entries).map_err(|_| {
                    PluginError::failed(
                        ErrorClass::Fatal,
                        PluginFailure::NotSent,
                        format!("max_entries {} is negative", req.max_entries),
                    )
                })?;
                let starting_token = Some(req.starting_token.as_str()).filter(|t| !t.is_empty());
                let page = c
                    .list_snapshots_page(&filter, &req.secrets, max_entries, starting_token)
                    .await
                    .map_err(client_error)?;
                (page.snapshots, page.next_token.unwrap_or_default())
            };
            let entries = snapshots.into_iter().map(snapshot_info).collect();
            Ok(SnapshotPage {
                entries,
                next_token,
            })
        })
        .await
    }

    async fn node_detach(&self, ctx: &ShimContext, req: NodeDetach) -> Result<(), PluginError> {
        let request = UnmountRequest {
            plugin: req.plugin,
            volume: req.volume,
            external_id: req.external_volume,
            workload: req.workload,
            usage: PublishUsage::of(&req.capability, req.read_only),
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
        ctx: &ShimContext,
        req: NodeExpand,
    ) -> Result<NodeExpanded, PluginError> {
        let request = ExpandRequest {
            plugin: req.plugin,
            volume: req.volume,
            external_id: req.external_volume,
            capacity: capacity_range(req.required_bytes, req.limit_bytes)?,
            capability: Some(req.capability),
            secrets: req.secrets,
        };
        within(ctx, async move {
            let grown = self.volumes.expand(&request).await.map_err(node_error)?;
            Ok(NodeExpanded {
                capacity_bytes: size_to_wire(grown),
            })
        })
        .await
    }
}
