//! [`CountingPlugins`]: the plugins behind a campaign agent's shim. They answer at once with
//! a fixed success, count every call that reaches them, and hang on request (an id starting
//! with [`HANG`]) until the shim drops the call, which they count too.

use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use csi_rpc_shim::{
    AgentRpc, ControllerAttach, ControllerAttached, ControllerDetach, ControllerExpand,
    ControllerExpanded, ControllerValidate, CreateSnapshot, CreateVolume, CreatedVolume,
    DeleteSnapshot, DeleteVolume, ListSnapshots, ListVolumes, LocalPlugins, LocalStatus,
    NodeDetach, NodeExpand, NodeExpanded, PluginError, ServiceKind, ShimContext, SnapshotInfo,
    SnapshotPage, Validated, VolumePage,
};
use csi_structs::{ExternalVolumeId, NodeId, PluginId, SnapshotId};

/// The plugin every campaign agent runs, healthy.
pub(crate) const PLUGIN: &str = "ebs";
/// A plugin that runs but fails its health checks.
pub(crate) const SICK_PLUGIN: &str = "sick";
/// A call whose key field (volume id, snapshot id or listing token) starts with this never
/// gets an answer from the plugin.
pub(crate) const HANG: &str = "hang-";

/// One call that reached the plugins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reached {
    pub(crate) rpc: AgentRpc,
    /// The authenticated node the call was made for.
    pub(crate) origin: NodeId,
}

#[derive(Debug, Default)]
struct Seen {
    reached: Vec<Reached>,
    dropped: u64,
}

/// Counting fake plugins of one node.
#[derive(Debug, Default)]
pub(crate) struct CountingPlugins {
    seen: Mutex<Seen>,
}

/// Counts a hung call as dropped when its future is dropped.
struct DropCount<'a>(&'a CountingPlugins);

impl Drop for DropCount<'_> {
    fn drop(&mut self) {
        self.0.lock().dropped += 1;
    }
}

impl CountingPlugins {
    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The calls that reached these plugins so far.
    pub(crate) fn reached(&self) -> Vec<Reached> {
        self.lock().reached.clone()
    }

    /// How many calls reached them so far.
    pub(crate) fn reached_count(&self) -> usize {
        self.lock().reached.len()
    }

    /// How many hung calls the shim dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    async fn answer<T>(
        &self,
        rpc: AgentRpc,
        ctx: &ShimContext,
        key: &str,
        ok: T,
    ) -> Result<T, PluginError> {
        self.lock().reached.push(Reached {
            rpc,
            origin: ctx.origin.clone(),
        });
        if key.starts_with(HANG) {
            let _count = DropCount(self);
            std::future::pending::<()>().await;
        }
        Ok(ok)
    }
}

fn snapshot(name: &str, source: &ExternalVolumeId) -> SnapshotInfo {
    SnapshotInfo {
        // A name is at most 128 bytes, so the id may be too long: fall back to a fixed one.
        snapshot: SnapshotId::new(format!("snap-{name}"))
            .or_else(|_| SnapshotId::new("snap"))
            .unwrap_or_else(|_| unreachable!("a constant id is valid")),
        source: source.clone(),
        size_bytes: 0,
        ready_to_use: true,
    }
}

#[async_trait]
impl LocalPlugins for CountingPlugins {
    fn status(&self, plugin: &PluginId, _service: ServiceKind) -> LocalStatus {
        match plugin.as_str() {
            PLUGIN => LocalStatus::Healthy,
            SICK_PLUGIN => LocalStatus::Unhealthy {
                reason: "probe failed".to_owned(),
            },
            _ => LocalStatus::Missing,
        }
    }

    async fn controller_attach(
        &self,
        ctx: &ShimContext,
        req: ControllerAttach,
    ) -> Result<ControllerAttached, PluginError> {
        let key = req.volume.as_str();
        self.answer(
            AgentRpc::ControllerAttach,
            ctx,
            key,
            ControllerAttached::default(),
        )
        .await
    }

    async fn controller_detach(
        &self,
        ctx: &ShimContext,
        req: ControllerDetach,
    ) -> Result<(), PluginError> {
        let key = req.volume.as_str();
        self.answer(AgentRpc::ControllerDetach, ctx, key, ()).await
    }

    async fn controller_validate(
        &self,
        ctx: &ShimContext,
        req: ControllerValidate,
    ) -> Result<Validated, PluginError> {
        let key = req.volume.as_str();
        let out = Validated::Confirmed;
        self.answer(AgentRpc::ControllerValidate, ctx, key, out)
            .await
    }

    async fn create_volume(
        &self,
        ctx: &ShimContext,
        req: CreateVolume,
    ) -> Result<CreatedVolume, PluginError> {
        let out = CreatedVolume {
            external_volume: ExternalVolumeId::new(req.volume.as_str())
                .unwrap_or_else(|_| unreachable!("a volume id is a valid external id")),
            capacity_bytes: req.required_bytes,
            volume_context: Default::default(),
            accessible_topology: Vec::new(),
        };
        let key = req.volume.as_str();
        self.answer(AgentRpc::ControllerCreateVolume, ctx, key, out)
            .await
    }

    async fn delete_volume(&self, ctx: &ShimContext, req: DeleteVolume) -> Result<(), PluginError> {
        let key = req.volume.as_str();
        self.answer(AgentRpc::ControllerDeleteVolume, ctx, key, ())
            .await
    }

    async fn controller_expand(
        &self,
        ctx: &ShimContext,
        req: ControllerExpand,
    ) -> Result<ControllerExpanded, PluginError> {
        let out = ControllerExpanded {
            capacity_bytes: req.required_bytes,
            node_expansion_required: false,
        };
        let key = req.volume.as_str();
        self.answer(AgentRpc::ControllerExpandVolume, ctx, key, out)
            .await
    }

    async fn list_volumes(
        &self,
        ctx: &ShimContext,
        req: ListVolumes,
    ) -> Result<VolumePage, PluginError> {
        let key = req.starting_token.as_str();
        let out = VolumePage::default();
        self.answer(AgentRpc::ControllerListVolumes, ctx, key, out)
            .await
    }

    async fn create_snapshot(
        &self,
        ctx: &ShimContext,
        req: CreateSnapshot,
    ) -> Result<SnapshotInfo, PluginError> {
        let out = snapshot(&req.name, &req.source);
        let key = req.volume.as_str();
        self.answer(AgentRpc::ControllerCreateSnapshot, ctx, key, out)
            .await
    }

    async fn delete_snapshot(
        &self,
        ctx: &ShimContext,
        req: DeleteSnapshot,
    ) -> Result<(), PluginError> {
        let key = req.snapshot.as_str();
        self.answer(AgentRpc::ControllerDeleteSnapshot, ctx, key, ())
            .await
    }

    async fn list_snapshots(
        &self,
        ctx: &ShimContext,
        req: ListSnapshots,
    ) -> Result<SnapshotPage, PluginError> {
        let key = req.starting_token.as_str();
        let out = SnapshotPage::default();
        self.answer(AgentRpc::ControllerListSnapshots, ctx, key, out)
            .await
    }

    async fn node_detach(&self, ctx: &ShimContext, req: NodeDetach) -> Result<(), PluginError> {
        let key = req.volume.as_str();
        self.answer(AgentRpc::NodeDetach, ctx, key, ()).await
    }

    async fn node_expand(
        &self,
        ctx: &ShimContext,
        req: NodeExpand,
    ) -> Result<NodeExpanded, PluginError> {
        let out = NodeExpanded {
            capacity_bytes: req.required_bytes,
        };
        let key = req.volume.as_str();
        self.answer(AgentRpc::NodeExpand, ctx, key, out).await
    }
}
