//! The node side: a volume manager with per-volume staging paths and per-workload publish
//! paths under `<data_dir>/node`, a usage tracker persisted to `<data_dir>/node/usage.json`
//! (so a restart knows who still uses what), idempotent unpublish when the mount was already
//! cleaned up, and uncertain outcomes recorded until a release cleans them up.
//!
//! Paths follow [`crate::layout`] rooted at `<data_dir>/node` (volume ids are unique per
//! agent; ids that would escape their directory are refused):
//!
//! ```text
//! <data_dir>/node/staging/<volume>/<usage>
//! <data_dir>/node/per-workload/<workload>/<volume>/<usage>
//! ```
//!
//! All calls for one volume are serialized; different volumes run concurrently.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use csi_client::{ErrorClass, NodePublish, NodeStage};
use csi_structs::{
    ExternalVolumeId, PluginId, PublishContext, Secrets, VolumeCapability, VolumeContext, VolumeId,
    WorkloadId,
};
use serde::{Deserialize, Serialize};

use super::plugins::Plugins;
use super::store::{StateFileError, load_json, save_json};
use crate::layout::{Layout, LayoutError, Usage};
use crate::ops::api::UncertainView;

/// Where a step stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// The call succeeded.
    Done,
    /// The call's outcome is unknown (deadline, lost connection): it may have happened.
    Uncertain,
    /// The call is about to be made (recorded first, so a crash leaves a trace).
    Started,
}

/// One workload's publication.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserEntry {
    /// The target path.
    pub target: PathBuf,
    /// How the publish call ended.
    pub publish: StepState,
}

/// One volume (per plugin and usage) on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeEntry {
    /// The plugin.
    pub plugin: String,
    /// The orchestrator's volume id.
    pub volume: String,
    /// The plugin's volume id.
    pub external_id: String,
    /// The staging path, when the plugin stages.
    pub staging: Option<PathBuf>,
    /// How the stage call ended (`None`: no staging, or not staged).
    pub stage: Option<StepState>,
    /// Workloads using the volume here.
    pub users: BTreeMap<String, UserEntry>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct UsageFile {
    volumes: BTreeMap<String, VolumeEntry>,
}

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
    /// When the usage file exists but cannot be read or parsed.
    pub fn open(data_dir: &Path, plugins: Plugins) -> Result<Self, StateFileError> {
        let root = data_dir.join("node");
        let file = root.join("usage.json");
        let usage: UsageFile = load_json(&file)?.unwrap_or_default();
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

    fn key(plugin: &PluginId, volume: &VolumeId, usage: &Usage) -> String {
        format!("{plugin}/{volume}/{}", usage.segment())
    }

    /// Checks that a volume id can name its staging directory.
    ///
    /// # Errors
    ///
    /// [`LayoutError`] naming `volume_id`.
    pub fn check_volume(
        &self,
        volume: &VolumeId,
        capability: &VolumeCapability,
    ) -> Result<(), LayoutError> {
        self.inner
            .layout
            .staging_path(volume, &usage_of(capability, false))
            .map(drop)
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
        let key = Self::key(&req.plugin, &req.volume, &usage);
        let target = self
            .inner
            .layout
            .target_path(&req.volume, &req.workload, &usage)?;
        let staging_path = self.inner.layout.staging_path(&req.volume, &usage)?;
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
        let staging = fp
            .capabilities
            .node
            .requires_staging()
            .then_some(staging_path);
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
        let stage_state = self.change(&req.volume, |vols| {
            let entry = vols.entry(key.clone()).or_insert_with(|| VolumeEntry {
                plugin: req.plugin.to_string(),
                volume: req.volume.to_string(),
                external_id: req.external_id.to_string(),
                staging: staging.clone(),
                stage: None,
                users: BTreeMap::new(),
            });
            entry
                .users
                .entry(req.workload.to_string())
                .or_insert_with(|| UserEntry {
                    target: target.clone(),
                    publish: StepState::Started,
                });
            entry.stage
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
        let key = Self::key(&req.plugin, &req.volume, &usage);
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

    async fn unstage_if_unused(&self, key: &str, req: &UnmountRequest) -> Result<(), NodeError> {
        let Some(entry) = self.entry(key) else {
            return Ok(());
        };
        if !entry.users.is_empty() {
            return Ok(());
        }
        if let (Some(staging), Some(_)) = (&entry.staging, entry.stage) {
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
            self.remove_dirs(staging, &self.inner.layout.staging_root(), &req.volume)?;
        }
        self.change(&req.volume, |v| {
            if v.get(key).is_some_and(|e| e.users.is_empty()) {
                v.remove(key);
            }
        })?;
        Ok(())
    }

    /// The plugin's client for node detach calls (see
    /// [`NodeDetachPolicy`](crate::adapters::NodeDetachPolicy)), or `PluginMissing`.
    fn detach_client(&self, plugin: &PluginId) -> Result<csi_client::CsiClient, NodeError> {
        self.inner
            .plugins
            .detach_client(plugin)
            .ok_or_else(|| NodeError::PluginMissing {
                plugin: plugin.clone(),
            })
    }

    /// Removes `path` and its empty parents below `root` (the shared cleanup of
    /// [`crate::adapters::remove_empty_dirs`]); a failure is a retryable local error.
    fn remove_dirs(&self, path: &Path, root: &Path, volume: &VolumeId) -> Result<(), NodeError> {
        crate::adapters::remove_empty_dirs(path, root).map_err(|e| NodeError::Local {
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
            if let (Some(s), Some(path)) = (e.stage, &e.staging)
                && s != StepState::Done
            {
                out.push(UncertainView {
                    volume: e.volume.clone(),
                    workload: "-".into(),
                    step: "stage".into(),
                    path: path.display().to_string(),
                });
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

    #[tokio::test]
    async fn unmounting_what_is_already_cleaned_up_needs_no_plugin() {
        let dir = tempfile::tempdir().expect("temp dir");
        let me = csi_structs::NodeId::new("n1").expect("id");
        let plugins = Plugins::new(
            me,
            dir.path().join("plugins"),
            Arc::new(csi_rpc_shim::Registry::new()),
            Metrics::new(),
            super::super::plugins::Timings {
                health_interval: Duration::from_secs(1),
                retry_interval: Duration::from_secs(1),
                call_timeout: Duration::from_secs(1),
                fingerprint_interval: Duration::from_secs(30),
                node_detach: crate::adapters::NodeDetachPolicy::DEFAULT,
            },
        );
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
}
