//! The node side: a volume manager with one staging path per volume and per-workload publish
//! paths under `<data_dir>/node`, usage records persisted to `<data_dir>/node/usage.json`
//! ([`super::usage`], so a restart knows who still uses what), idempotent unpublish when the
//! mount was already cleaned up, and uncertain outcomes recorded until a release cleans them up.
//!
//! Paths follow [`csi_node::layout`] rooted at `<data_dir>/node` (volume ids are unique per
//! agent; ids that would escape their directory are refused):
//!
//! ```text
//! <data_dir>/node/staging/<volume>
//! <data_dir>/node/per-workload/<workload>/<volume>/<usage>
//! ```
//!
//! A volume is staged once on this node (`NodeStageVolume` with its first publication) and
//! every publication of it, read or write, uses that staging path; it is unstaged when its
//! last publication here is gone. All calls for one volume are serialized; different volumes
//! run concurrently.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use csi_client::{ErrorClass, NodePublish, NodeStage};
use csi_structs::{
    ExternalVolumeId, PluginId, PublishContext, Secrets, VolumeCapability, VolumeContext, VolumeId,
    WorkloadId,
};

use super::plugins::Plugins;
pub use super::usage::{LegacyStaging, StepState, UserEntry, VolumeEntry};
use super::usage::{UsageFile, key as usage_key};
use crate::ops::api::UncertainView;
use csi_node::layout::{Layout, LayoutError, Usage};
use csi_node::state::{StateFileError, save_json};

/// What a mount needs.
#[derive(Clone, Debug)]
pub struct MountRequest {
    /// The plugin.
    pub plugin: PluginId,
    /// The orchestrator's id.
    pub volume: VolumeId,
    /// The plugin's id.
    pub external_id: ExternalVolumeId,
    /// How it is used.
    pub capability: VolumeCapability,
    /// Read-only publication.
    pub read_only: bool,
    /// The workload.
    pub workload: WorkloadId,
    /// From `ControllerPublishVolume`.
    pub publish_context: PublishContext,
    /// From creation or registration.
    pub volume_context: VolumeContext,
}

/// What an unmount needs.
#[derive(Clone, Debug)]
pub struct UnmountRequest {
    /// The plugin.
    pub plugin: PluginId,
    /// The orchestrator's id.
    pub volume: VolumeId,
    /// The plugin's id.
    pub external_id: ExternalVolumeId,
    /// How it was used.
    pub capability: VolumeCapability,
    /// Whether it was published read-only.
    pub read_only: bool,
    /// The workload.
    pub workload: WorkloadId,
}

/// A failed node operation.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The plugin's node service is not here (or not fingerprinted yet).
    #[error("plugin {plugin} has no node service on this node (yet)")]
    PluginMissing {
        /// The plugin.
        plugin: PluginId,
    },
    /// A CSI call failed.
    #[error("{step} of volume {volume} for workload {workload}: {source}")]
    Call {
        /// `NodeStageVolume`, `NodePublishVolume`, …
        step: &'static str,
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// The client's error.
        #[source]
        source: csi_client::Error,
    },
    /// An id cannot be used as a path segment.
    #[error(transparent)]
    Path(#[from] LayoutError),
    /// A directory could not be created or the usage file not written.
    #[error("volume {volume}: {detail}")]
    Local {
        /// The volume.
        volume: VolumeId,
        /// What failed.
        detail: String,
    },
}

impl NodeError {
    /// The error class.
    pub fn class(&self) -> ErrorClass {
        match self {
            NodeError::PluginMissing { .. } => ErrorClass::RetryElsewhere,
            NodeError::Call { source, .. } => source.class(),
            NodeError::Local { .. } => ErrorClass::Retry,
            NodeError::Path(_) => ErrorClass::Fatal,
        }
    }

    /// The gRPC code, when a plugin answered one.
    pub fn code(&self) -> Option<csi_client::Code> {
        match self {
            NodeError::Call { source, .. } => source.code(),
            _ => None,
        }
    }
}

/// The usage of a publication, for its paths.
pub fn usage_of(capability: &VolumeCapability, read_only: bool) -> Usage {
    Usage {
        read_only,
        attachment: capability.access_type.kind(),
        access_mode: capability.access_mode,
    }
}

/// The node volume manager. Cheap to clone.
#[derive(Clone, Debug)]
pub struct VolumeManager {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    layout: Layout,
    file: PathBuf,
    plugins: Plugins,
    usage: Mutex<UsageFile>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl VolumeManager {
    /// Opens the manager under `<data_dir>/node`, loading the usage file.
    ///
    /// # Errors
    ///
    /// When the usage file exists but cannot be read or parsed, holds a record that cannot
    /// be used, or was migrated from the previous format and cannot be written back.
    pub fn open(data_dir: &Path, plugins: Plugins) -> Result<Self, StateFileError> {
        let root = data_dir.join("node");
        let file = root.join("usage.json");
        let (usage, migrated) = UsageFile::load(&file)?;
        if migrated {
            save_json(&file, &usage)?;
            tracing::info!(file = %file.display(), volumes = usage.volumes.len(), "usage records migrated to one record per volume");
        }
        Ok(Self {
            inner: Arc::new(Inner {
                layout: Layout::new(root),
                file,
                plugins,
                usage: Mutex::new(usage),
                locks: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Checks that a volume id can name its staging directory.
    ///
    /// # Errors
    ///
    /// [`LayoutError`] naming `volume_id`.
    pub fn check_volume(&self, volume: &VolumeId) -> Result<(), LayoutError> {
        self.inner.layout.staging_path(volume).map(drop)
    }

    /// The publish target of `workload` for a volume.
    ///
    /// # Errors
    ///
    /// [`LayoutError`] when an id cannot be a path segment.
    pub fn target_path(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
        capability: &VolumeCapability,
        read_only: bool,
    ) -> Result<PathBuf, LayoutError> {
        self.inner
            .layout
            .target_path(volume, workload, &usage_of(capability, read_only))
    }

    async fn lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let m = {
            let mut locks = self
                .inner
                .locks
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            Arc::clone(locks.entry(key.to_owned()).or_default())
        };
        m.lock_owned().await
    }

    /// Changes the usage table and writes it before returning.
    fn change<T>(
        &self,
        volume: &VolumeId,
        f: impl FnOnce(&mut BTreeMap<String, VolumeEntry>) -> T,
    ) -> Result<T, NodeError> {
        let mut usage = self
            .inner
            .usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let out = f(&mut usage.volumes);
        save_json(&self.inner.file, &*usage).map_err(|e| NodeError::Local {
            volume: volume.clone(),
            detail: e.to_string(),
        })?;
        Ok(out)
    }

    fn entry(&self, key: &str) -> Option<VolumeEntry> {
        self.inner
            .usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .volumes
            .get(key)
            .cloned()
    }

    /// Stages (when the plugin stages and the volume is not staged yet) and publishes a volume
    /// for a workload; returns the target path. The workload is recorded as a user first, so a
    /// concurrent unmount of another workload cannot unstage in between.
    ///
    /// # Errors
    ///
    /// A [`NodeError`]; an uncertain stage or publish stays recorded as such until a release
    /// cleans it up.
    pub async fn mount(&self, req: &MountRequest) -> Result<PathBuf, NodeError> {
        let usage = usage_of(&req.capability, req.read_only);
        let key = usage_key(&req.plugin, &req.volume);
        let target = self
            .inner
            .layout
            .target_path(&req.volume, &req.workload, &usage)?;
        let staging_path = self.inner.layout.staging_path(&req.volume)?;
        let _guard = self.lock(&key).await;
        let (client, fp) =
            self.inner
                .plugins
                .client(&req.plugin)
                .ok_or_else(|| NodeError::PluginMissing {
                    plugin: req.plugin.clone(),
                })?;
        if !fp.serves_node() {
            return Err(NodeError::PluginMissing {
                plugin: req.plugin.clone(),
            });
        }
        let stages = fp.capabilities.node.requires_staging();
        let local = |detail: String| NodeError::Local {
            volume: req.volume.clone(),
            detail,
        };
        let call = |step, source| NodeError::Call {
            step,
            volume: req.volume.clone(),
            workload: req.workload.clone(),
            source,
        };
        // One record per volume: the first publication creates it with the volume's staging
        // path; later ones (another workload, read or write) join it and use the path recorded
        // there, which is where the volume is staged.
        let (staging, stage_state) = self.change(&req.volume, |vols| {
            let entry = vols.entry(key.clone()).or_insert_with(|| VolumeEntry {
                plugin: req.plugin.to_string(),
                volume: req.volume.to_string(),
                external_id: req.external_id.to_string(),
                staging: None,
                stage: None,
                users: BTreeMap::new(),
                legacy_stagings: Vec::new(),
            });
            if stages && entry.staging.is_none() {
                entry.staging = Some(staging_path.clone());
            }
            entry
                .users
                .entry(req.workload.to_string())
                .or_insert_with(|| UserEntry {
                    target: target.clone(),
                    publish: StepState::Started,
                });
            (entry.staging.clone().filter(|_| stages), entry.stage)
        })?;
        let secrets = Secrets::default();
        if let Some(staging) = &staging
            && stage_state != Some(StepState::Done)
        {
            std::fs::create_dir_all(staging)
                .map_err(|e| local(format!("cannot create {}: {e}", staging.display())))?;
            self.change(&req.volume, |v| {
                if let Some(e) = v.get_mut(&key) {
                    e.stage = Some(StepState::Started);
                }
            })?;
            let staging_text = staging.display().to_string();
            let result = client
                .node()
                .stage(&NodeStage {
                    volume: &req.external_id,
                    staging_target_path: &staging_text,
                    capability: &req.capability,
                    publish_context: &req.publish_context,
                    volume_context: &req.volume_context,
                    secrets: &secrets,
                })
                .await;
            let state = match &result {
                Ok(()) => StepState::Done,
                Err(e) if e.class() == ErrorClass::Uncertain => StepState::Uncertain,
                Err(_) => StepState::Started,
            };
            self.change(&req.volume, |v| {
                if let Some(e) = v.get_mut(&key) {
                    e.stage = Some(state);
                }
            })?;
            result.map_err(|e| call("NodeStageVolume", e))?;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| local(format!("cannot create {}: {e}", parent.display())))?;
        }
        let target_text = target.display().to_string();
        let staging_text = staging.as_ref().map(|s| s.display().to_string());
        let result = client
            .node()
            .publish(&NodePublish {
                volume: &req.external_id,
                staging_target_path: staging_text.as_deref(),
                target_path: &target_text,
                capability: &req.capability,
                readonly: req.read_only,
                publish_context: &req.publish_context,
                volume_context: &req.volume_context,
                secrets: &secrets,
            })
            .await;
        let state = match &result {
            Ok(()) => StepState::Done,
            Err(e) if e.class() == ErrorClass::Uncertain => StepState::Uncertain,
            Err(_) => StepState::Started,
        };
        self.change(&req.volume, |v| {
            if let Some(e) = v.get_mut(&key)
                && let Some(u) = e.users.get_mut(req.workload.as_str())
            {
                u.publish = state;
            }
        })?;
        result.map_err(|e| call("NodePublishVolume", e))?;
        Ok(target)
    }

    /// Unpublishes a workload's publication, then unstages when it was the last user here.
    /// Idempotent: a publication already cleaned up (no record and no target directory) is
    /// not unpublished again, and NOT_FOUND counts as done.
    ///
    /// # Errors
    ///
    /// A [`NodeError`]; the usage record keeps whatever is still to do.
    pub async fn unmount(&self, req: &UnmountRequest) -> Result<(), NodeError> {
        let usage = usage_of(&req.capability, req.read_only);
        let key = usage_key(&req.plugin, &req.volume);
        let target = self
            .inner
            .layout
            .target_path(&req.volume, &req.workload, &usage)?;
        let _guard = self.lock(&key).await;
        let recorded = self.entry(&key);
        let user_recorded = recorded
            .as_ref()
            .is_some_and(|e| e.users.contains_key(req.workload.as_str()));
        let call = |step, source| NodeError::Call {
            step,
            volume: req.volume.clone(),
            workload: req.workload.clone(),
            source,
        };
        if user_recorded || target.exists() {
            let client = self.detach_client(&req.plugin)?;
            let target_text = target.display().to_string();
            match client
                .node()
                .unpublish(&req.external_id, &target_text)
                .await
            {
                Ok(()) => {}
                Err(e) if e.class() == ErrorClass::AlreadyDone => {
                    tracing::debug!(volume = %req.volume, workload = %req.workload, "already unpublished");
                }
                Err(e) => return Err(call("NodeUnpublishVolume", e)),
            }
            // The plugin removes the target; the empty directories we made above it go too.
            // A removal that fails (a target still mounted, say) keeps the record, so the
            // release is retried rather than forgetting a publication.
            self.remove_dirs(&target, &self.inner.layout.workload_root(), &req.volume)?;
            self.change(&req.volume, |v| {
                if let Some(e) = v.get_mut(&key) {
                    e.users.remove(req.workload.as_str());
                }
            })?;
        }
        self.unstage_if_unused(&key, req).await
    }

    /// When no publication of the volume is left here: unstages it (and any staging an older
    /// agent made at a per-usage path), then drops its record. Each staging is removed from
    /// the record once unstaged, so a retry after a failure repeats only what is left.
    async fn unstage_if_unused(&self, key: &str, req: &UnmountRequest) -> Result<(), NodeError> {
        let Some(entry) = self.entry(key) else {
            return Ok(());
        };
        if !entry.users.is_empty() {
            return Ok(());
        }
        for legacy in &entry.legacy_stagings {
            self.unstage(req, &legacy.path).await?;
            self.change(&req.volume, |v| {
                if let Some(e) = v.get_mut(key) {
                    e.legacy_stagings.retain(|l| l.path != legacy.path);
                }
            })?;
        }
        if let (Some(staging), Some(_)) = (&entry.staging, entry.stage) {
            self.unstage(req, staging).await?;
        }
        self.change(&req.volume, |v| {
            if v.get(key).is_some_and(|e| e.users.is_empty()) {
                v.remove(key);
            }
        })?;
        Ok(())
    }

    /// `NodeUnstageVolume` at `staging` (NOT_FOUND counts as done), then its directory goes.
    async fn unstage(&self, req: &UnmountRequest, staging: &Path) -> Result<(), NodeError> {
        let client = self.detach_client(&req.plugin)?;
        let staging_text = staging.display().to_string();
        match client.node().unstage(&req.external_id, &staging_text).await {
            Ok(()) => {}
            Err(e) if e.class() == ErrorClass::AlreadyDone => {}
            Err(e) => {
                return Err(NodeError::Call {
                    step: "NodeUnstageVolume",
                    volume: req.volume.clone(),
                    workload: req.workload.clone(),
                    source: e,
                });
            }
        }
        self.remove_dirs(staging, &self.inner.layout.staging_root(), &req.volume)
    }

    /// The plugin's client for node detach calls (see
    /// [`NodeDetachPolicy`](csi_node::detach::NodeDetachPolicy)), or `PluginMissing`.
    fn detach_client(&self, plugin: &PluginId) -> Result<csi_client::CsiClient, NodeError> {
        self.inner
            .plugins
            .detach_client(plugin)
            .ok_or_else(|| NodeError::PluginMissing {
                plugin: plugin.clone(),
            })
    }

    /// Removes `path` and its empty parents below `root` (the shared cleanup of
    /// [`csi_node::detach::remove_empty_dirs`]); a failure is a retryable local error.
    fn remove_dirs(&self, path: &Path, root: &Path, volume: &VolumeId) -> Result<(), NodeError> {
        csi_node::detach::remove_empty_dirs(path, root).map_err(|e| NodeError::Local {
            volume: volume.clone(),
            detail: format!("cannot remove {}: {e}", path.display()),
        })
    }

    /// Where `workload` has `volume` published here, if it does.
    pub fn published(&self, volume: &str, workload: &str) -> Option<PathBuf> {
        let usage = self
            .inner
            .usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        usage
            .volumes
            .values()
            .filter(|e| e.volume == volume)
            .find_map(|e| e.users.get(workload).map(|u| u.target.clone()))
    }

    /// Publications per plugin id on this node.
    pub fn in_use(&self) -> BTreeMap<String, u64> {
        let usage = self
            .inner
            .usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut out = BTreeMap::new();
        for e in usage.volumes.values() {
            *out.entry(e.plugin.clone()).or_default() += e.users.len() as u64;
        }
        out
    }

    /// Stages and publications whose outcome is not known to be done.
    pub fn uncertain(&self) -> Vec<UncertainView> {
        let usage = self
            .inner
            .usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        for e in usage.volumes.values() {
            let stagings = e
                .stage
                .zip(e.staging.as_ref())
                .into_iter()
                .chain(e.legacy_stagings.iter().map(|l| (l.stage, &l.path)));
            for (s, path) in stagings {
                if s != StepState::Done {
                    out.push(UncertainView {
                        volume: e.volume.clone(),
                        workload: "-".into(),
                        step: "stage".into(),
                        path: path.display().to_string(),
                    });
                }
            }
            for (w, u) in &e.users {
                if u.publish != StepState::Done {
                    out.push(UncertainView {
                        volume: e.volume.clone(),
                        workload: w.clone(),
                        step: "publish".into(),
                        path: u.target.display().to_string(),
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use csi_structs::{AccessMode, MountOptions};

    use super::*;
    use crate::metrics::Metrics;

    /// A mock plugin serving at `<dir>/plugins/mock.sock`, with volume `db` created with `cap`
    /// and attached to the mock's node, made through `client`.
    struct Attached {
        mock: csi_testkit::MockPlugin,
        server: csi_testkit::MockServer,
        client: csi_client::CsiClient,
        ext: csi_structs::ExternalVolumeId,
        context: csi_structs::PublishContext,
    }

    async fn attached_volume(dir: &std::path::Path, cap: &VolumeCapability) -> Attached {
        use csi_client::{CsiClient, Endpoint, proto};

        let socket = dir.join("plugins").join("mock.sock");
        std::fs::create_dir_all(socket.parent().expect("parent")).expect("plugin dir");
        let mock = csi_testkit::MockPlugin::builder().build().expect("mock");
        let server = mock.serve_unix(&socket).await.expect("serves");
        let client = CsiClient::new(Endpoint::unix(&socket).expect("endpoint"));
        let ext = client
            .controller()
            .create_volume(proto::CreateVolumeRequest {
                name: "db".into(),
                volume_capabilities: vec![cap.into()],
                ..Default::default()
            })
            .await
            .expect("created")
            .volume_id;
        let plugin_node = client
            .fingerprint()
            .await
            .expect("fingerprint")
            .node
            .expect("node service")
            .node_id;
        let context = client
            .controller()
            .publish(
                &ext,
                &plugin_node,
                cap,
                false,
                &csi_structs::VolumeContext::new(),
                &Secrets::default(),
            )
            .await
            .expect("attached");
        Attached {
            mock,
            server,
            client,
            ext,
            context,
        }
    }

    #[test]
    fn usage_segments_keep_modes_apart() {
        let rw = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
        let ro = VolumeCapability::block(AccessMode::MultiNodeReaderOnly);
        assert_eq!(
            usage_of(&rw, false).segment(),
            "rw-mount-single-node-writer"
        );
        assert_eq!(
            usage_of(&ro, true).segment(),
            "ro-block-multi-node-reader-only"
        );
    }

    /// A plugin registry over `<dir>/plugins`.
    fn plugins_in(dir: &Path) -> Plugins {
        Plugins::new(
            csi_structs::NodeId::new("n1").expect("id"),
            dir.join("plugins"),
            Arc::new(csi_rpc_shim::Registry::new()),
            Metrics::new(),
            super::super::plugins::Timings {
                health_interval: Duration::from_secs(1),
                retry_interval: Duration::from_millis(50),
                // `serve`'s default, so the old two minutes would show as retried attempts.
                call_timeout: Duration::from_secs(60),
                fingerprint_interval: Duration::from_secs(30),
                node_detach: csi_node::detach::NodeDetachPolicy::DEFAULT,
            },
        )
    }

    #[tokio::test]
    async fn unmounting_what_is_already_cleaned_up_needs_no_plugin() {
        let dir = tempfile::tempdir().expect("temp dir");
        let plugins = plugins_in(dir.path());
        let manager = VolumeManager::open(dir.path(), plugins).expect("opens");
        let request = UnmountRequest {
            plugin: PluginId::new("gone").expect("id"),
            volume: VolumeId::new("v1").expect("id"),
            external_id: ExternalVolumeId::new("vol-1").expect("id"),
            capability: VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new()),
            read_only: false,
            workload: WorkloadId::new("w1").expect("id"),
        };
        // No record and no target directory: done, without calling the (missing) plugin.
        manager.unmount(&request).await.expect("already done");
        // A target directory left behind means it may still be mounted: the plugin is needed.
        let target = manager
            .target_path(
                &request.volume,
                &request.workload,
                &request.capability,
                false,
            )
            .expect("valid ids");
        std::fs::create_dir_all(&target).expect("dir");
        let err = manager
            .unmount(&request)
            .await
            .expect_err("needs the plugin");
        assert_eq!(err.class(), ErrorClass::RetryElsewhere);
        // An id that would escape the data directory is refused before anything happens.
        let escape = UnmountRequest {
            workload: WorkloadId::new("..").expect("the id type allows it"),
            ..request
        };
        let err = manager.unmount(&escape).await.expect_err("refused");
        assert!(
            matches!(err, NodeError::Path(ref e) if e.field == "workload_id"),
            "{err}"
        );
    }

    #[test]
    fn a_usage_record_that_cannot_be_used_stops_the_open_with_its_key() {
        let dir = tempfile::tempdir().expect("temp dir");
        let node = dir.path().join("node");
        std::fs::create_dir_all(&node).expect("dir");
        std::fs::write(
            node.join("usage.json"),
            r#"{"version": 2, "volumes": {"mock/x": {"plugin": "mock", "volume": "db",
                "external_id": "e", "staging": null, "stage": null, "users": {}}}}"#,
        )
        .expect("write");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let plugins = runtime.block_on(async { plugins_in(dir.path()) });
        match VolumeManager::open(dir.path(), plugins) {
            Err(StateFileError::Record { key, .. }) => assert_eq!(key, "mock/x"),
            other => panic!("expected a record error, got {other:?}"),
        }
    }

    /// A format 1 usage file from the previous agent: volume `db` staged and published
    /// read-only for `reader`; the writer's mount tried a second staging at its own per-usage
    /// path, which the plugin refused (one staging per volume on a node), so that record says
    /// `started` for both steps. Opened, it becomes one record; releasing the reader keeps the
    /// staging, releasing the writer unstages both paths (the refused one answers NOT_FOUND,
    /// which is done).
    #[tokio::test]
    async fn format_1_stagings_are_unstaged_with_the_last_publication() {
        use csi_client::{NodePublish, NodeStage, Rpc};
        use csi_structs::VolumeContext;

        let dir = tempfile::tempdir().expect("temp dir");
        // The state the previous agent left behind, made through a client.
        let cap = VolumeCapability::mount(AccessMode::MultiNodeSingleWriter, MountOptions::new());
        let Attached {
            mock,
            server: _server,
            client,
            ext,
            context,
            ..
        } = attached_volume(dir.path(), &cap).await;
        let layout = Layout::new(dir.path().join("node"));
        let volume = VolumeId::new("db").expect("id");
        let mut records = serde_json::Map::new();
        for (workload, read_only) in [("reader", true), ("writer", false)] {
            let usage = usage_of(&cap, read_only);
            let staging = layout.staging_root().join("db").join(usage.segment());
            let target = layout
                .target_path(&volume, &WorkloadId::new(workload).expect("id"), &usage)
                .expect("path");
            std::fs::create_dir_all(&staging).expect("staging dir");
            std::fs::create_dir_all(target.parent().expect("parent")).expect("target parent");
            let step = if read_only { "done" } else { "started" };
            records.insert(
                format!("mock/db/{}", usage.segment()),
                serde_json::json!({
                    "plugin": "mock", "volume": "db", "external_id": ext.as_str(),
                    "staging": staging, "stage": step,
                    "users": {workload: {"target": target, "publish": step}},
                }),
            );
            if !read_only {
                continue;
            }
            client
                .node()
                .stage(&NodeStage {
                    volume: &ext,
                    staging_target_path: staging.to_str().expect("utf-8"),
                    capability: &cap,
                    publish_context: &context,
                    volume_context: &VolumeContext::new(),
                    secrets: &Secrets::default(),
                })
                .await
                .expect("staged");
            client
                .node()
                .publish(&NodePublish {
                    volume: &ext,
                    staging_target_path: Some(staging.to_str().expect("utf-8")),
                    target_path: target.to_str().expect("utf-8"),
                    capability: &cap,
                    readonly: read_only,
                    publish_context: &context,
                    volume_context: &VolumeContext::new(),
                    secrets: &Secrets::default(),
                })
                .await
                .expect("published");
        }
        let file = dir.path().join("node").join("usage.json");
        std::fs::write(
            &file,
            serde_json::to_vec(&serde_json::json!({"volumes": records})).expect("json"),
        )
        .expect("write v1");
        assert_eq!(mock.staged().len(), 1);
        mock.calls().clear();

        let plugins = plugins_in(dir.path());
        let manager = VolumeManager::open(dir.path(), plugins.clone()).expect("migrates");
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
        assert_eq!(written["version"], 2, "written back as format 2: {written}");
        assert_eq!(
            written["volumes"]
                .as_object()
                .map(|v| v.keys().cloned().collect::<Vec<_>>()),
            Some(vec!["mock/db".to_owned()])
        );
        plugins.scan();
        let plugin = PluginId::new("mock").expect("id");
        tokio::time::timeout(Duration::from_secs(30), async {
            while plugins.detach_client(&plugin).is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the plugin is fingerprinted (hang guard)");

        let unmount = |workload: &str, read_only| UnmountRequest {
            plugin: plugin.clone(),
            volume: volume.clone(),
            external_id: ext.clone(),
            capability: cap.clone(),
            read_only,
            workload: WorkloadId::new(workload).expect("id"),
        };
        manager
            .unmount(&unmount("reader", true))
            .await
            .expect("reader released");
        assert_eq!(mock.calls().count(Rpc::NodeUnpublishVolume), 1);
        assert_eq!(
            mock.calls().count(Rpc::NodeUnstageVolume),
            0,
            "the writer still uses it"
        );
        assert_eq!(mock.staged().len(), 1);

        manager
            .unmount(&unmount("writer", false))
            .await
            .expect("writer released");
        assert_eq!(mock.calls().count(Rpc::NodeUnpublishVolume), 2);
        assert_eq!(
            mock.calls().count(Rpc::NodeUnstageVolume),
            2,
            "both stagings"
        );
        assert!(mock.staged().is_empty() && mock.published().is_empty());
        assert!(manager.in_use().is_empty(), "{:?}", manager.in_use());
        assert!(!layout.staging_root().join("db").exists());
        // The plugin's watch task goes with the runtime.
        drop(plugins);
    }

    /// `serve`'s node detach goes through the plugin's detach client: when the node plugin's
    /// socket is gone, one unpublish attempt with a short socket wait fails the step as
    /// `RetryElsewhere`, instead of csi-client's four attempts of up to 30 s of dialling.
    #[tokio::test]
    async fn a_vanished_node_plugin_fails_the_unmount_after_one_short_attempt() {
        use csi_structs::VolumeContext;

        let dir = tempfile::tempdir().expect("temp dir");
        let cap = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
        let Attached {
            server,
            ext,
            context: publish_context,
            ..
        } = attached_volume(dir.path(), &cap).await;

        let plugins = plugins_in(dir.path());
        let manager = VolumeManager::open(dir.path(), plugins.clone()).expect("opens");
        plugins.scan();
        let plugin = PluginId::new("mock").expect("id");
        tokio::time::timeout(Duration::from_secs(30), async {
            while plugins.detach_client(&plugin).is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the plugin is fingerprinted (hang guard)");
        let volume = VolumeId::new("db").expect("id");
        let workload = WorkloadId::new("w1").expect("id");
        manager
            .mount(&MountRequest {
                plugin: plugin.clone(),
                volume: volume.clone(),
                external_id: ext.clone(),
                capability: cap.clone(),
                read_only: false,
                workload: workload.clone(),
                publish_context,
                volume_context: VolumeContext::new(),
            })
            .await
            .expect("mounted");

        // The plugin goes away; the registry has not rescanned, so it still lists it.
        server.shutdown().await.expect("stops");
        let detach = plugins.detach_client(&plugin).expect("still listed");
        let dials_before = detach.connection().dial_attempts();
        let err = manager
            .unmount(&UnmountRequest {
                plugin,
                volume,
                external_id: ext,
                capability: cap,
                read_only: false,
                workload,
            })
            .await
            .expect_err("the plugin is gone");
        assert_eq!(err.class(), ErrorClass::RetryElsewhere, "{err}");
        match &err {
            NodeError::Call { step, source, .. } => {
                assert_eq!(*step, "NodeUnpublishVolume");
                assert_eq!(source.attempts(), 1, "one attempt: {source}");
                // The dial gave up by itself (socket missing after the short wait); no
                // deadline had to cut a 30 s wait short.
                match source.kind() {
                    csi_client::ErrorKind::NotConnected(connect) => assert_eq!(
                        connect.io_error().kind(),
                        std::io::ErrorKind::NotFound,
                        "{source}"
                    ),
                    other => panic!("expected not connected, got {other}"),
                }
            }
            other => panic!("expected the unpublish call's error, got {other}"),
        }
        // One socket wait of 1 s, dials 10 ms, 20 ms, ... apart: a handful, not ~36 per attempt.
        let dials = detach.connection().dial_attempts() - dials_before;
        assert!((1..=10).contains(&dials), "{dials} dials");
        assert_eq!(manager.uncertain().len(), 0, "{:?}", manager.uncertain());
        assert!(
            manager.published("db", "w1").is_some(),
            "the record is kept for the retry"
        );
    }
}
