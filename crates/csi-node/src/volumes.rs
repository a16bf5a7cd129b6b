//! The volume manager: staging and publishing volumes on this node for workloads, with the
//! usage records that say who still uses what.
//!
//! - **Mount** ([`VolumeManager::mount`]): `NodeStageVolume` once per volume on this node
//!   (when the plugin has `STAGE_UNSTAGE_VOLUME`), at the volume's one staging path, then
//!   `NodePublishVolume` per workload at the workload's target. The workload is recorded as
//!   a user of the volume *before* anything is staged, so an unmount of another workload
//!   never unstages the volume under a publish. Only through a plugin whose last probe
//!   answered ready: while its health is unknown or bad the mount is refused
//!   ([`VolumeError::NotHealthy`], retryable) before anything is recorded or sent.
//! - **Unmount** ([`VolumeManager::unmount`]): `NodeUnpublishVolume` of the workload's
//!   target (the one recorded at mount, so mount and unmount always agree on the path), then
//!   `NodeUnstageVolume` when it was the volume's last user here. `NOT_FOUND` counts as
//!   done, and a publication already cleaned up (no record, no target directory) needs no
//!   call: retrying after a lost answer is safe. A recorded publication (a restored one
//!   too) always gets its calls, whether or not its target directory is still there.
//!   Whatever the plugin's health: a plugin whose `Probe` hangs still gets
//!   `NodeUnpublishVolume` ([`NodePlugins::detach_client`]).
//! - **Expand** ([`VolumeManager::expand`]): `NodeExpandVolume` at a path where the volume is
//!   published (and its staging path), when the plugin has `EXPAND_VOLUME`.
//! - **One operation per volume.** Operations on one volume wait for each other, in order;
//!   different volumes go at once.
//! - **Usage persisted.** Every change of a volume's record is durable before the call it
//!   leads to, so a restarted manager knows which volumes were staged, who had them
//!   published, and which outcomes are uncertain (a deadline, a lost connection, an answer
//!   that could not be used: the mount may exist). A mount writes twice on its way (the user
//!   and the stage it is about to make, then the outcome), an unmount once or twice. The
//!   records live in a [`UsageStore`]: [`UsageDb`] (one record per volume in a redb table,
//!   the writes of concurrent operations committed together) or [`UsageJson`] (one JSON
//!   file rewritten whole; its formats and the migration of the older one are in [`usage`]).
//! - **A restored record is confirmed before it is trusted.** A record read from the file
//!   says what was done before the restart, not what holds now: after a host reboot the
//!   plugin has nothing staged or published, whatever the file says. The manager keeps, in
//!   memory only (never in the file), which stages and publishes it saw succeed since it
//!   opened the records, and **never skips a stage or publish on the strength of a record it
//!   did not itself see succeed since it started**: the first mount of a restored volume
//!   stages it again before it publishes (a publish is always sent). Release steps of a
//!   restored record always call the plugin (`NOT_FOUND` is done), so its record does not
//!   stay behind. [`VolumeManager::reconcile`] confirms every record at once (stage and
//!   publish again, or release, as the embedder's [`RestoreLookup`] says); a record whose
//!   plugin is not here is reported and kept. The host's mount table is read for the report
//!   only, never to decide a call (see [`reconcile`](VolumeManager::reconcile)).
//! - **A failed mount undoes itself.** A stage or publish that failed (uncertain or not) of a
//!   workload not published before is undone before the mount returns: `NodeUnpublishVolume`
//!   of its target, then `NodeUnstageVolume` when no other publication of the volume is left
//!   here. What the undo could not do stays recorded ([`VolumeManager::uncertain`]) and the
//!   error says so ([`VolumeError::NotUndone`]) until an unmount cleans it up.
//! - **Events.** Each operation ends with a [`VolumeEvent`] carrying its outcome
//!   ([`VolumeManager::subscribe`]).
//!
//! The manager reaches plugins through [`NodePlugins`], which the
//! [`PluginManager`] implements; node detach calls use the
//! plugin's detach client (a short socket wait and one attempt, see
//! [`NodeDetachPolicy`](crate::detach::NodeDetachPolicy)).
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use csi_node::layout::Layout;
//! use csi_node::plugins::{PluginManager, PluginManagerConfig};
//! use csi_node::volumes::{MountRequest, VolumeManager};
//! use csi_structs::*;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let plugins = PluginManager::builder(PluginManagerConfig::default()).start()?;
//! let volumes = VolumeManager::open(
//!     Layout::new("/var/lib/my-orchestrator/csi"),
//!     "/var/lib/my-orchestrator/csi/usage.json",
//!     Arc::new(plugins),
//! )?;
//! let target = volumes
//!     .mount(&MountRequest {
//!         plugin: PluginId::new("ebs")?,
//!         volume: VolumeId::new("db")?,
//!         external_id: ExternalVolumeId::new("vol-0a")?,
//!         capability: VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new()),
//!         read_only: false,
//!         workload: WorkloadId::new("web-1")?,
//!         publish_context: PublishContext::default(),
//!         volume_context: VolumeContext::new(),
//!         secrets: VolumeSecrets::default(),
//!     })
//!     .await?;
//! println!("published at {}", target.display());
//! # Ok(()) }
//! ```

mod error;
pub(crate) mod ops;
mod reconcile;
pub mod store;
pub mod usage;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use csi_client::{CsiClient, ErrorClass, NodePublish, NodeStage, proto};
use csi_structs::{
    CapacityRange, ExternalVolumeId, PluginId, PublishContext, Secrets, SecretsUse,
    VolumeCapability, VolumeContext, VolumeId, VolumeSecrets, WorkloadId,
};
use tokio::sync::broadcast;

pub use error::VolumeError;
use ops::Ops;
pub use reconcile::{
    Found, ReconcileAction, ReconcileOutcome, Reconciled, Reconciliation, Republish, Restore,
    RestoreLookup, Restored,
};
pub use store::{USAGE_TABLE, UsageDb, UsageJson, UsageStore};
use usage::key as usage_key;
pub use usage::{LegacyStaging, StepState, UserEntry, VolumeEntry};

use crate::layout::{Layout, PublishUsage};
use crate::plugins::{PluginManager, ReadyPlugin};
use crate::state::StateFileError;

/// How the volume manager reaches a plugin's node service.
pub trait NodePlugins: Send + Sync + 'static {
    /// The fingerprinted plugin's clients and health, or `None` when it is not here (yet).
    fn node_plugin(&self, plugin: &PluginId) -> Option<ReadyPlugin>;

    /// The client for node detach calls (`NodeUnpublishVolume`, `NodeUnstageVolume`) of a
    /// plugin that is here, whatever its health (and, where the implementation knows the
    /// registration, before its fingerprint): release steps are never gated on health. By
    /// default the detach client of [`node_plugin`](Self::node_plugin).
    fn detach_client(&self, plugin: &PluginId) -> Option<CsiClient> {
        self.node_plugin(plugin).map(|ready| ready.detach)
    }
}

impl NodePlugins for PluginManager {
    fn node_plugin(&self, plugin: &PluginId) -> Option<ReadyPlugin> {
        self.get(plugin)
    }

    fn detach_client(&self, plugin: &PluginId) -> Option<CsiClient> {
        PluginManager::detach_client(self, plugin)
    }
}

/// A volume's turn on the attach path, held until dropped: [`VolumeManager::attach_turn`].
#[derive(Debug)]
#[must_use = "the turn ends when it is dropped"]
pub struct AttachTurn {
    _turn: ops::Turn,
}

/// What a mount needs.
#[derive(Clone, Debug)]
pub struct MountRequest {
    /// The plugin.
    pub plugin: PluginId,
    /// The orchestrator's volume id.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_id: ExternalVolumeId,
    /// How the volume is used.
    pub capability: VolumeCapability,
    /// Publish read-only.
    pub read_only: bool,
    /// The workload.
    pub workload: WorkloadId,
    /// What `ControllerPublishVolume` returned for this node (empty without it).
    pub publish_context: PublishContext,
    /// The volume's context, from its creation or registration.
    pub volume_context: VolumeContext,
    /// The volume's secrets: `NodeStageVolume` sends their
    /// [`NodeStage`](SecretsUse::NodeStage) set, `NodePublishVolume` their
    /// [`NodePublish`](SecretsUse::NodePublish) set.
    pub secrets: VolumeSecrets,
}

/// What an unmount needs.
#[derive(Clone, Debug)]
pub struct UnmountRequest {
    /// The plugin.
    pub plugin: PluginId,
    /// The orchestrator's volume id.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_id: ExternalVolumeId,
    /// The workload.
    pub workload: WorkloadId,
    /// How it was published: names the target when the workload has no usage record.
    pub usage: PublishUsage,
}

/// What a node expansion needs.
#[derive(Clone, Debug)]
pub struct ExpandRequest {
    /// The plugin.
    pub plugin: PluginId,
    /// The orchestrator's volume id.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_id: ExternalVolumeId,
    /// The size asked for.
    pub capacity: CapacityRange,
    /// How the volume is used (lets the plugin tell a block volume from a filesystem).
    pub capability: Option<VolumeCapability>,
    /// Secrets of the call.
    pub secrets: Secrets,
}

/// How an unmount ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unmounted {
    /// Whether `NodeUnpublishVolume` was called (not when the publication was already gone).
    pub unpublished: bool,
    /// Whether the volume was unstaged (it was the volume's last publication here).
    pub unstaged: bool,
}

/// The end of one volume manager operation.
#[derive(Clone, Debug)]
pub enum VolumeEvent {
    /// A mount ended: the host path of the target, or why not.
    Mount {
        /// The plugin.
        plugin: PluginId,
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// How it ended.
        outcome: Result<PathBuf, VolumeError>,
    },
    /// An unmount ended.
    Unmount {
        /// The plugin.
        plugin: PluginId,
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// How it ended.
        outcome: Result<Unmounted, VolumeError>,
    },
    /// [`reconcile`](VolumeManager::reconcile) came to a restored record: what it found and
    /// what it did.
    Reconcile(Reconciliation),
    /// A node expansion ended: the capacity the plugin reported (`None`: unknown), or why not.
    Expand {
        /// The plugin.
        plugin: PluginId,
        /// The volume.
        volume: VolumeId,
        /// How it ended.
        outcome: Result<Option<u64>, VolumeError>,
    },
}

impl fmt::Display for VolumeEvent {
    /// One line for people: `volume v1 (plugin ebs) for workload w1: mounted at <target>`,
    /// `…: unmount failed (retry): <error>`, a [`Reconciliation`]'s line, `volume v1 (plugin
    /// ebs): expanded on this node to 2147483648 bytes`; plugin text escaped by the errors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn failed(f: &mut fmt::Formatter<'_>, what: &str, e: &VolumeError) -> fmt::Result {
            write!(f, "{what} failed ({}): {e}", e.class().as_str())
        }
        match self {
            VolumeEvent::Mount {
                plugin,
                volume,
                workload,
                outcome,
            } => {
                write!(
                    f,
                    "volume {volume} (plugin {plugin}) for workload {workload}: "
                )?;
                match outcome {
                    Ok(target) => write!(f, "mounted at {}", target.display()),
                    Err(e) => failed(f, "mount", e),
                }
            }
            VolumeEvent::Unmount {
                plugin,
                volume,
                workload,
                outcome,
            } => {
                write!(
                    f,
                    "volume {volume} (plugin {plugin}) for workload {workload}: "
                )?;
                match outcome {
                    Ok(u) => write!(
                        f,
                        "unmounted (unpublished: {}, unstaged: {})",
                        u.unpublished, u.unstaged
                    ),
                    Err(e) => failed(f, "unmount", e),
                }
            }
            VolumeEvent::Reconcile(r) => r.fmt(f),
            VolumeEvent::Expand {
                plugin,
                volume,
                outcome,
            } => {
                write!(f, "volume {volume} (plugin {plugin}): ")?;
                match outcome {
                    Ok(Some(bytes)) => write!(f, "expanded on this node to {bytes} bytes"),
                    Ok(None) => f.write_str("expanded on this node"),
                    Err(e) => failed(f, "node expansion", e),
                }
            }
        }
    }
}

/// Which step of a publication an [`UncertainMount`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountStep {
    /// `NodeStageVolume` of the volume.
    Stage,
    /// `NodePublishVolume` for a workload.
    Publish,
}

impl MountStep {
    /// `stage` or `publish`.
    pub const fn as_str(self) -> &'static str {
        match self {
            MountStep::Stage => "stage",
            MountStep::Publish => "publish",
        }
    }
}

impl fmt::Display for MountStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stage or publish whose outcome is not known to be done: started (a crash or an error
/// came before the answer) or uncertain (a deadline or lost connection). An unmount of the
/// volume undoes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UncertainMount {
    /// The plugin.
    pub plugin: PluginId,
    /// The volume.
    pub volume: VolumeId,
    /// The workload, for a publish.
    pub workload: Option<WorkloadId>,
    /// Which step.
    pub step: MountStep,
    /// The staging path or target (host side).
    pub path: PathBuf,
    /// Where it stands.
    pub state: StepState,
}

impl fmt::Display for UncertainMount {
    /// `volume v1 (plugin ebs) for workload w1: publish uncertain at /data/…/target`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "volume {} (plugin {})", self.volume, self.plugin)?;
        if let Some(w) = &self.workload {
            write!(f, " for workload {w}")?;
        }
        write!(
            f,
            ": {} {} at {}",
            self.step,
            self.state,
            self.path.display()
        )
    }
}

/// Which volume (and workload) a release step is about.
#[derive(Clone, Copy, Debug)]
struct Ids<'a> {
    plugin: &'a PluginId,
    volume: &'a VolumeId,
    external_id: &'a ExternalVolumeId,
    /// The workload whose unmount it is (`None`: a clean-up of the volume's staging alone).
    workload: Option<&'a WorkloadId>,
}

/// What a mount did: its target, and whether it called `NodeStageVolume`.
#[derive(Debug)]
struct Mounted {
    target: PathBuf,
    restaged: bool,
}

/// The node volume manager. Cheap to clone; every clone is the same manager.
#[derive(Clone)]
pub struct VolumeManager {
    inner: Arc<Inner>,
}

struct Inner {
    layout: Layout,
    /// Where the usage records are kept.
    store: Arc<dyn UsageStore>,
    plugins: Arc<dyn NodePlugins>,
    /// The usage records as last written, by key.
    usage: Mutex<BTreeMap<String, VolumeEntry>>,
    ops: Ops,
    /// The attach path's turns ([`VolumeManager::attach_turn`]), apart from `ops` so that a
    /// mount can run while its volume's attach turn is held.
    attaches: Ops,
    events: broadcast::Sender<VolumeEvent>,
    /// The stages and publishes this process saw succeed since it opened the records (in
    /// memory only, never written): a record says `done` for a step; only this says the
    /// step is done *now*.
    confirmed: Mutex<Confirmed>,
}

/// Which steps of the records this process saw succeed (see [`Inner::confirmed`]).
#[derive(Debug, Default)]
struct Confirmed {
    /// Keys of volumes staged by this process.
    staged: BTreeSet<String>,
    /// `(key, workload)` published by this process.
    published: BTreeSet<(String, WorkloadId)>,
}

impl std::fmt::Debug for VolumeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeManager")
            .field("layout", &self.inner.layout)
            .field("store", &self.inner.store)
            .finish_non_exhaustive()
    }
}

/// A stage or publish call's outcome as a record.
fn step_state<T>(result: &Result<T, csi_client::Error>) -> StepState {
    match result {
        Ok(_) => StepState::Done,
        Err(e) if e.class() == ErrorClass::Uncertain => StepState::Uncertain,
        Err(_) => StepState::Started,
    }
}

impl VolumeManager {
    /// A weak reference to this manager's shared state: it upgrades while any clone of the
    /// manager is alive, so [`Node::close`](crate::Node::close) can tell at once whether
    /// someone outside the node still holds one.
    pub(crate) fn downgrade(&self) -> std::sync::Weak<impl Sized + Send + Sync + use<>> {
        Arc::downgrade(&self.inner)
    }

    /// Opens the manager with its paths under `layout` and its usage records in the JSON
    /// file `usage_file` ([`UsageJson`]), loading them (a file in the older format is
    /// migrated and written back). A node with a redb database should prefer
    /// [`open_with`](Self::open_with) and a [`UsageDb`]: its writes are group-committed.
    ///
    /// # Errors
    ///
    /// A [`StateFileError`] when the usage file exists but cannot be read or parsed, holds a
    /// record that cannot be used (naming its key), or was migrated and cannot be written.
    pub fn open(
        layout: Layout,
        usage_file: impl Into<PathBuf>,
        plugins: Arc<dyn NodePlugins>,
    ) -> Result<Self, StateFileError> {
        Self::open_with(layout, Arc::new(UsageJson::new(usage_file)), plugins)
    }

    /// Opens the manager with its paths under `layout` and its usage records in `store`,
    /// loading them.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use csi_claims::store::RedbStore;
    /// use csi_node::layout::Layout;
    /// use csi_node::plugins::{PluginManager, PluginManagerConfig};
    /// use csi_node::volumes::{UsageDb, VolumeManager};
    ///
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let root = std::path::Path::new("/var/lib/my-orchestrator/csi");
    /// let db = RedbStore::open(root.join("node.redb"))?;
    /// // Usage records of an older version's JSON file move into the database once.
    /// let usage = UsageDb::open(&db, root.join("node.redb"), Some(&root.join("usage.json")))?;
    /// let plugins = PluginManager::builder(PluginManagerConfig::default()).start()?;
    /// let volumes = VolumeManager::open_with(Layout::new(root), Arc::new(usage), Arc::new(plugins))?;
    /// # let _ = volumes;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`StateFileError`] when the records cannot be loaded (see [`UsageStore::load`]).
    pub fn open_with(
        layout: Layout,
        store: Arc<dyn UsageStore>,
        plugins: Arc<dyn NodePlugins>,
    ) -> Result<Self, StateFileError> {
        let usage = store.load()?;
        let (events, _) = broadcast::channel(256);
        Ok(Self {
            inner: Arc::new(Inner {
                layout,
                store,
                plugins,
                usage: Mutex::new(usage),
                ops: Ops::default(),
                attaches: Ops::default(),
                events,
                confirmed: Mutex::new(Confirmed::default()),
            }),
        })
    }

    /// The layout the paths come from.
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// Every operation's end from now on (a receiver more than 256 events behind misses the
    /// oldest).
    pub fn subscribe(&self) -> broadcast::Receiver<VolumeEvent> {
        self.inner.events.subscribe()
    }

    /// Changes the record of `key` and writes it before returning; when the write fails
    /// nothing changed, and a change that leaves the record as it was writes nothing. The
    /// caller holds the volume's turn, so two changes of one record never race; changes of
    /// different volumes go to the store at once (a [`UsageDb`] commits them together). The
    /// records' lock is held only to copy or replace one record, so a reader never waits on
    /// the disk.
    async fn change<T>(
        &self,
        volume: &VolumeId,
        key: &str,
        f: impl FnOnce(&mut Option<VolumeEntry>) -> T,
    ) -> Result<T, VolumeError> {
        let before = self.entry(key);
        let mut next = before.clone();
        let out = f(&mut next);
        if next != before {
            self.inner
                .store
                .write(key, next.as_ref())
                .await
                .map_err(|source| VolumeError::Usage {
                    volume: volume.clone(),
                    source: Arc::new(source),
                })?;
            let mut usage = self.usage();
            match next {
                Some(entry) => usage.insert(key.to_owned(), entry),
                None => usage.remove(key),
            };
        }
        Ok(out)
    }

    /// The records as last written (locked briefly: never across a write).
    fn usage(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, VolumeEntry>> {
        self.inner
            .usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The steps seen to succeed since open (locked briefly).
    fn confirmed(&self) -> std::sync::MutexGuard<'_, Confirmed> {
        self.inner
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this process saw the volume's stage succeed (and not undone since).
    fn stage_confirmed(&self, key: &str) -> bool {
        self.confirmed().staged.contains(key)
    }

    /// Whether this process saw the workload's publish succeed (and not undone since).
    fn publish_confirmed(&self, key: &str, workload: &WorkloadId) -> bool {
        self.confirmed()
            .published
            .contains(&(key.to_owned(), workload.clone()))
    }

    /// Records what this process just saw: `Some(true)` a step succeeded, `Some(false)` it
    /// failed or was undone (so it is not trusted any more); `workload` names a publish,
    /// `None` the volume's stage.
    fn confirm(&self, key: &str, workload: Option<&WorkloadId>, succeeded: bool) {
        let mut confirmed = self.confirmed();
        match (workload, succeeded) {
            (None, true) => {
                confirmed.staged.insert(key.to_owned());
            }
            (None, false) => {
                confirmed.staged.remove(key);
            }
            (Some(w), true) => {
                confirmed.published.insert((key.to_owned(), w.clone()));
            }
            (Some(w), false) => {
                confirmed.published.remove(&(key.to_owned(), w.clone()));
            }
        }
    }

    fn entry(&self, key: &str) -> Option<VolumeEntry> {
        self.usage().get(key).cloned()
    }

    fn emit(&self, event: VolumeEvent) {
        // No subscriber is fine.
        let _ = self.inner.events.send(event);
    }

    /// Stages (when the plugin stages and the volume is not staged here yet) and publishes a
    /// volume for a workload; returns the target (host path). Mounting again what is mounted
    /// is safe (the calls are idempotent).
    ///
    /// # Errors
    ///
    /// A [`VolumeError`]. What the failed mount may have done is undone first (see the
    /// [module docs](self)); when that undo fails too, the error is
    /// [`VolumeError::NotUndone`] and the stage or publish stays recorded
    /// ([`uncertain`](Self::uncertain)) until an unmount cleans it up.
    pub async fn mount(&self, req: &MountRequest) -> Result<PathBuf, VolumeError> {
        let outcome = self.mount_inner(req).await;
        self.emit(VolumeEvent::Mount {
            plugin: req.plugin.clone(),
            volume: req.volume.clone(),
            workload: req.workload.clone(),
            outcome: outcome.clone(),
        });
        outcome
    }

    async fn mount_inner(&self, req: &MountRequest) -> Result<PathBuf, VolumeError> {
        let key = usage_key(&req.plugin, &req.volume);
        let _turn = self.inner.ops.turn(&key).await;
        self.mount_in_turn(req).await.map(|m| m.target)
    }

    /// The mount, with the volume's turn held by the caller.
    async fn mount_in_turn(&self, req: &MountRequest) -> Result<Mounted, VolumeError> {
        let usage = PublishUsage::of(&req.capability, req.read_only);
        let key = usage_key(&req.plugin, &req.volume);
        let layout = &self.inner.layout;
        let target = layout.target_path(&req.volume, &req.workload, &usage)?;
        let staging_path = layout.staging_path(&req.volume)?;
        let plugin = self.publishable(&req.plugin)?;
        let stages = plugin.fingerprint.capabilities.node.requires_staging();
        let call = |step, source| VolumeError::Call {
            step,
            volume: req.volume.clone(),
            workload: Some(req.workload.clone()),
            source: Arc::new(source),
        };
        // A stage is skipped only when this process saw it succeed: a record restored from
        // the file says what was done before a restart, not what holds now (a rebooted host
        // has nothing staged).
        let stage_confirmed = self.stage_confirmed(&key);
        // One record per volume: the first publication creates it with the volume's staging
        // path; later ones (another workload, read or write) join it and use the path recorded
        // there, which is where the volume is staged. The user, and the stage about to be
        // made, are recorded in one write before anything is staged or published.
        let (staging, staged, target, was_published) = self
            .change(&req.volume, &key, |slot| {
                let entry = slot.get_or_insert_with(|| VolumeEntry {
                    plugin: req.plugin.clone(),
                    volume: req.volume.clone(),
                    external_id: req.external_id.clone(),
                    staging: None,
                    stage: None,
                    users: BTreeMap::new(),
                    legacy_stagings: Vec::new(),
                    publish_context: None,
                });
                if entry.publish_context.is_none() {
                    entry.publish_context = Some(req.publish_context.clone());
                }
                if stages && entry.staging.is_none() {
                    entry.staging = Some(staging_path.clone());
                }
                let staged = entry.stage == Some(StepState::Done) && stage_confirmed;
                if stages && !staged {
                    entry.stage = Some(StepState::Started);
                }
                let was_published = entry
                    .users
                    .get(&req.workload)
                    .is_some_and(|u| u.publish == StepState::Done);
                let user = entry
                    .users
                    .entry(req.workload.clone())
                    .or_insert_with(|| UserEntry {
                        target: target.clone(),
                        publish: StepState::Started,
                    });
                (
                    entry.staging.clone().filter(|_| stages),
                    staged,
                    user.target.clone(),
                    was_published,
                )
            })
            .await?;
        let mut restaged = false;
        let mounted = async {
            if let Some(staging) = &staging
                && !staged
            {
                let staging_text = layout.for_plugin(staging)?;
                self.create_dir(staging, &req.volume)?;
                let secrets = req.secrets.for_use(SecretsUse::NodeStage);
                let result = plugin
                    .client
                    .node()
                    .stage(&NodeStage {
                        volume: &req.external_id,
                        staging_target_path: Path::new(&staging_text),
                        capability: &req.capability,
                        publish_context: &req.publish_context,
                        volume_context: &req.volume_context,
                        secrets: &secrets,
                    })
                    .await;
                self.confirm(&key, None, result.is_ok());
                if result.is_err() {
                    self.set_stage(&req.volume, &key, step_state(&result))
                        .await?;
                }
                // A stage that succeeded is recorded with the publish's outcome, below: until
                // then the record says `started`, which a restart undoes all the same.
                result.map_err(|e| call("NodeStageVolume", e))?;
                restaged = true;
            }
            if let Some(parent) = target.parent() {
                self.create_dir(parent, &req.volume)?;
            }
            let staging_text = staging
                .as_deref()
                .map(|s| layout.for_plugin(s))
                .transpose()?;
            let target_text = layout.for_plugin(&target)?;
            let secrets = req.secrets.for_use(SecretsUse::NodePublish);
            let result = plugin
                .client
                .node()
                .publish(&NodePublish {
                    volume: &req.external_id,
                    staging_target_path: staging_text.as_deref().map(Path::new),
                    target_path: Path::new(&target_text),
                    capability: &req.capability,
                    readonly: req.read_only,
                    publish_context: &req.publish_context,
                    volume_context: &req.volume_context,
                    secrets: &secrets,
                })
                .await;
            let state = step_state(&result);
            self.confirm(&key, Some(&req.workload), result.is_ok());
            self.change(&req.volume, &key, |slot| {
                if let Some(e) = slot {
                    if restaged {
                        e.stage = Some(StepState::Done);
                    }
                    if let Some(u) = e.users.get_mut(&req.workload) {
                        u.publish = state;
                    }
                }
            })
            .await?;
            result.map_err(|e| call("NodePublishVolume", e))?;
            Ok(target)
        }
        .await;
        match mounted {
            Ok(target) => Ok(Mounted { target, restaged }),
            // A workload published before keeps its publication: a repeated mount that fails
            // does not tear down what was done before it.
            Err(failed) if was_published => Err(failed),
            Err(failed) => Err(self.undo_mount(req, failed).await),
        }
    }

    /// Undoes what a failed mount may have done for a workload not published before (the
    /// turn of the volume is held): `NodeUnpublishVolume` of its target, then `NodeUnstageVolume` when no other
    /// publication of the volume is left here, as an unmount does. Returns the mount's error,
    /// or [`VolumeError::NotUndone`] when the undo failed too (the usage record then keeps
    /// what is left, for an unmount to clean up).
    async fn undo_mount(&self, req: &MountRequest, failed: VolumeError) -> VolumeError {
        let unmount = UnmountRequest {
            plugin: req.plugin.clone(),
            volume: req.volume.clone(),
            external_id: req.external_id.clone(),
            workload: req.workload.clone(),
            usage: PublishUsage::of(&req.capability, req.read_only),
        };
        match self.unmount_in_turn(&unmount).await {
            Ok(undone) => {
                tracing::info!(
                    volume = %req.volume,
                    workload = %req.workload,
                    unpublished = undone.unpublished,
                    unstaged = undone.unstaged,
                    error = %failed,
                    "failed mount undone"
                );
                failed
            }
            Err(undo) => {
                tracing::warn!(volume = %req.volume, workload = %req.workload, error = %failed, undo = %undo, "failed mount not undone; the usage record keeps it");
                VolumeError::NotUndone {
                    failed: Box::new(failed),
                    undo: Box::new(undo),
                }
            }
        }
    }

    async fn set_stage(
        &self,
        volume: &VolumeId,
        key: &str,
        state: StepState,
    ) -> Result<(), VolumeError> {
        self.change(volume, key, |slot| {
            if let Some(e) = slot {
                e.stage = Some(state);
            }
        })
        .await
    }

    fn create_dir(&self, path: &Path, volume: &VolumeId) -> Result<(), VolumeError> {
        std::fs::create_dir_all(path).map_err(|source| VolumeError::Dir {
            volume: volume.clone(),
            action: "create",
            path: path.to_owned(),
            source: Arc::new(source),
        })
    }

    /// Unpublishes a workload's publication, then unstages the volume when it was its last
    /// publication here. Idempotent: a publication already cleaned up (no record and no
    /// target directory) is not unpublished again, and `NOT_FOUND` counts as done.
    ///
    /// # Errors
    ///
    /// A [`VolumeError`]; the usage record keeps whatever is still to do.
    pub async fn unmount(&self, req: &UnmountRequest) -> Result<Unmounted, VolumeError> {
        let outcome = self.unmount_inner(req).await;
        self.emit(VolumeEvent::Unmount {
            plugin: req.plugin.clone(),
            volume: req.volume.clone(),
            workload: req.workload.clone(),
            outcome: outcome.clone(),
        });
        outcome
    }

    async fn unmount_inner(&self, req: &UnmountRequest) -> Result<Unmounted, VolumeError> {
        let key = usage_key(&req.plugin, &req.volume);
        let _turn = self.inner.ops.turn(&key).await;
        self.unmount_in_turn(req).await
    }

    /// The unmount, with the volume's turn held by the caller.
    async fn unmount_in_turn(&self, req: &UnmountRequest) -> Result<Unmounted, VolumeError> {
        let key = usage_key(&req.plugin, &req.volume);
        let computed = self
            .inner
            .layout
            .target_path(&req.volume, &req.workload, &req.usage)?;
        let recorded = self
            .entry(&key)
            .and_then(|e| e.users.get(&req.workload).map(|u| u.target.clone()));
        // The target the mount recorded, whatever the request says about the usage: mount
        // and unmount must agree on the path.
        let target = recorded.clone().unwrap_or(computed);
        let mut unpublished = false;
        if recorded.is_some() || target.exists() {
            let target_text = self.inner.layout.for_plugin(&target)?;
            let client = self.detach_client(&req.plugin)?;
            match client
                .node()
                .unpublish(&req.external_id, Path::new(&target_text))
                .await
            {
                Ok(()) => {}
                Err(e) if e.class() == ErrorClass::AlreadyDone => {
                    tracing::debug!(volume = %req.volume, workload = %req.workload, "already unpublished");
                }
                Err(source) => {
                    // The publication is not known to be whole any more.
                    self.confirm(&key, Some(&req.workload), false);
                    return Err(VolumeError::Call {
                        step: "NodeUnpublishVolume",
                        volume: req.volume.clone(),
                        workload: Some(req.workload.clone()),
                        source: Arc::new(source),
                    });
                }
            }
            unpublished = true;
            self.confirm(&key, Some(&req.workload), false);
            // The plugin removes the target; the empty directories made above it go too. A
            // removal that fails (a target still mounted, say) keeps the record, so the
            // unmount is retried rather than forgetting a publication.
            self.remove_dirs(&target, &self.inner.layout.workload_root(), &req.volume)?;
            self.change(&req.volume, &key, |slot| {
                if let Some(e) = slot {
                    e.users.remove(&req.workload);
                }
            })
            .await?;
        }
        let unstaged = self
            .unstage_if_unused(
                &key,
                &Ids {
                    plugin: &req.plugin,
                    volume: &req.volume,
                    external_id: &req.external_id,
                    workload: Some(&req.workload),
                },
            )
            .await?;
        Ok(Unmounted {
            unpublished,
            unstaged,
        })
    }

    /// When no publication of the volume is left here: unstages it (and any staging an older
    /// version made at a per-usage path), then drops its record. Each staging is removed from
    /// the record once unstaged, so a retry after a failure repeats only what is left.
    async fn unstage_if_unused(&self, key: &str, req: &Ids<'_>) -> Result<bool, VolumeError> {
        let Some(entry) = self.entry(key) else {
            return Ok(false);
        };
        if !entry.users.is_empty() {
            return Ok(false);
        }
        let mut unstaged = false;
        for legacy in &entry.legacy_stagings {
            self.unstage(req, &legacy.path).await?;
            unstaged = true;
            self.change(req.volume, key, |slot| {
                if let Some(e) = slot {
                    e.legacy_stagings.retain(|l| l.path != legacy.path);
                }
            })
            .await?;
        }
        if let (Some(staging), Some(_)) = (&entry.staging, entry.stage) {
            self.unstage(req, staging).await?;
            self.confirm(key, None, false);
            unstaged = true;
        }
        self.change(req.volume, key, |slot| {
            if slot.as_ref().is_some_and(|e| e.users.is_empty()) {
                *slot = None;
            }
        })
        .await?;
        Ok(unstaged)
    }

    /// `NodeUnstageVolume` at `staging` (`NOT_FOUND` counts as done), then its directory goes.
    async fn unstage(&self, req: &Ids<'_>, staging: &Path) -> Result<(), VolumeError> {
        let staging_text = self.inner.layout.for_plugin(staging)?;
        let client = self.detach_client(req.plugin)?;
        match client
            .node()
            .unstage(req.external_id, Path::new(&staging_text))
            .await
        {
            Ok(()) => {}
            Err(e) if e.class() == ErrorClass::AlreadyDone => {}
            Err(source) => {
                // The staging is not known to be whole any more.
                self.confirm(&usage_key(req.plugin, req.volume), None, false);
                return Err(VolumeError::Call {
                    step: "NodeUnstageVolume",
                    volume: req.volume.clone(),
                    workload: req.workload.cloned(),
                    source: Arc::new(source),
                });
            }
        }
        self.remove_dirs(staging, &self.inner.layout.staging_root(), req.volume)
    }

    /// `NodeExpandVolume` of a volume published (or staged) here, at one of its targets.
    /// Returns the capacity the plugin reported (`None`: unknown).
    ///
    /// # Errors
    ///
    /// [`VolumeError::Unsupported`] without the plugin's `EXPAND_VOLUME`,
    /// [`VolumeError::NotHere`] when the volume has no publication or staging here, and the
    /// call's error.
    pub async fn expand(&self, req: &ExpandRequest) -> Result<Option<u64>, VolumeError> {
        let outcome = self.expand_inner(req).await;
        self.emit(VolumeEvent::Expand {
            plugin: req.plugin.clone(),
            volume: req.volume.clone(),
            outcome: outcome.clone(),
        });
        outcome
    }

    async fn expand_inner(&self, req: &ExpandRequest) -> Result<Option<u64>, VolumeError> {
        let key = usage_key(&req.plugin, &req.volume);
        let _turn = self.inner.ops.turn(&key).await;
        let plugin = self.node_plugin(&req.plugin)?;
        if !plugin.fingerprint.capabilities.node.can_expand() {
            return Err(VolumeError::Unsupported {
                plugin: req.plugin.clone(),
                what: "expand volumes on the node",
                capability: "EXPAND_VOLUME",
            });
        }
        let entry = self.entry(&key);
        let staging = entry.as_ref().and_then(|e| {
            e.staging
                .clone()
                .filter(|_| e.stage == Some(StepState::Done))
        });
        let published = entry.as_ref().and_then(|e| {
            e.users
                .values()
                .find(|u| u.publish == StepState::Done)
                .map(|u| u.target.clone())
        });
        let Some(volume_path) = published.or_else(|| staging.clone()) else {
            return Err(VolumeError::NotHere {
                volume: req.volume.clone(),
            });
        };
        let layout = &self.inner.layout;
        let staging_text = staging
            .as_deref()
            .map(|s| layout.for_plugin(s))
            .transpose()?;
        let answer = plugin
            .client
            .node()
            .node_expand_volume(proto::NodeExpandVolumeRequest {
                volume_id: req.external_id.as_str().to_owned(),
                volume_path: layout.for_plugin(&volume_path)?,
                capacity_range: Some((&req.capacity).into()),
                staging_target_path: staging_text.unwrap_or_default(),
                volume_capability: req.capability.as_ref().map(Into::into),
                secrets: req.secrets.to_wire(),
            })
            .await
            .map_err(|source| VolumeError::Call {
                step: "NodeExpandVolume",
                volume: req.volume.clone(),
                workload: None,
                source: Arc::new(source),
            })?;
        Ok(u64::try_from(answer.capacity_bytes).ok().filter(|b| *b > 0))
    }

    /// The plugin a mount would publish through, checked the way [`mount`](Self::mount)
    /// checks it: fingerprinted, with a Node service, and healthy (its last probe answered
    /// ready). A caller that does something before the mount (a controller publish, a claim)
    /// asks first, so it does nothing through a plugin the mount would refuse.
    ///
    /// # Errors
    ///
    /// [`VolumeError::PluginMissing`] when the plugin's node service is not here (yet), and
    /// [`VolumeError::NotHealthy`] (retryable, naming the plugin and its health) while its
    /// health is unknown or bad.
    pub fn publishable(&self, plugin: &PluginId) -> Result<ReadyPlugin, VolumeError> {
        let ready = self.node_plugin(plugin)?;
        if !ready.health.is_healthy() {
            return Err(VolumeError::NotHealthy {
                plugin: plugin.clone(),
                health: ready.health,
            });
        }
        Ok(ready)
    }

    /// The fingerprinted plugin with a Node service, or `PluginMissing`.
    fn node_plugin(&self, plugin: &PluginId) -> Result<ReadyPlugin, VolumeError> {
        self.inner
            .plugins
            .node_plugin(plugin)
            .filter(|p| p.fingerprint.serves_node())
            .ok_or_else(|| VolumeError::PluginMissing {
                plugin: plugin.clone(),
            })
    }

    /// The plugin's client for node detach calls, whatever its health, or `PluginMissing`.
    fn detach_client(&self, plugin: &PluginId) -> Result<CsiClient, VolumeError> {
        self.inner
            .plugins
            .detach_client(plugin)
            .ok_or_else(|| VolumeError::PluginMissing {
                plugin: plugin.clone(),
            })
    }

    /// Removes `path` and its empty parents below `root` (see
    /// [`remove_empty_dirs`](crate::detach::remove_empty_dirs)).
    fn remove_dirs(&self, path: &Path, root: &Path, volume: &VolumeId) -> Result<(), VolumeError> {
        crate::detach::remove_empty_dirs(path, root).map_err(|source| VolumeError::Dir {
            volume: volume.clone(),
            action: "remove",
            path: path.to_owned(),
            source: Arc::new(source),
        })
    }

    /// Waits for the volume's turn on the attach path and holds it until the returned
    /// [`AttachTurn`] is dropped. Whoever attaches a volume here (a controller publish when
    /// the volume has none recorded on this node, then the [`mount`](Self::mount) that
    /// records it) holds the turn throughout, so that two claims of one volume on this node
    /// send one `ControllerPublishVolume` between them: the second finds the
    /// [`publish_context`](Self::publish_context) the first recorded. Turns of different
    /// volumes do not wait for each other, and they are apart from the turns the manager's
    /// own operations take, so a mount (or an unmount of the release pipeline) runs while the
    /// attach turn of its volume is held. csi-node's [`Attacher`](crate::attach::Attacher)
    /// takes it, and so does an orchestrator's own attach path over the same manager.
    pub async fn attach_turn(&self, plugin: &PluginId, volume: &VolumeId) -> AttachTurn {
        AttachTurn {
            _turn: self.inner.attaches.turn(&usage_key(plugin, volume)).await,
        }
    }

    /// The `publish_context` recorded for a volume on this node (by the first mount of it
    /// here), if any: what a later mount of the volume passes on. While the volume has a
    /// record with a context, its `ControllerPublishVolume` to this node is done: the record
    /// is written after it, and goes with the volume's last unstage here, before the release
    /// pipeline's `ControllerUnpublishVolume` (when its node steps go through this manager, as
    /// csi-node's [`VolumeNodeDetacher`](crate::detach::VolumeNodeDetacher) and shim backend
    /// make them). A claim that finds one reuses it instead of publishing again, after a
    /// restart too (the context is kept with the record, unless it was empty).
    pub fn publish_context(&self, plugin: &PluginId, volume: &VolumeId) -> Option<PublishContext> {
        self.entry(&usage_key(plugin, volume))?.publish_context
    }

    /// The usage record of a volume here, if it has one: staged, published, or with a step
    /// whose outcome is not known to be undone.
    pub fn record(&self, plugin: &PluginId, volume: &VolumeId) -> Option<VolumeEntry> {
        self.entry(&usage_key(plugin, volume))
    }

    /// Where `workload` has `volume` published here (host path), if it does.
    pub fn published(&self, volume: &VolumeId, workload: &WorkloadId) -> Option<PathBuf> {
        let usage = self.usage();
        usage
            .values()
            .filter(|e| &e.volume == volume)
            .find_map(|e| e.users.get(workload).map(|u| u.target.clone()))
    }

    /// Every usage record: one per volume (and plugin) staged or published here.
    pub fn records(&self) -> Vec<VolumeEntry> {
        let usage = self.usage();
        usage.values().cloned().collect()
    }

    /// Publications per plugin on this node.
    pub fn in_use(&self) -> BTreeMap<PluginId, u64> {
        let mut out = BTreeMap::new();
        for e in self.records() {
            *out.entry(e.plugin.clone()).or_default() += e.users.len() as u64;
        }
        out
    }

    /// Stages and publications whose outcome is not known to be done.
    pub fn uncertain(&self) -> Vec<UncertainMount> {
        let mut out = Vec::new();
        for e in self.records() {
            let stagings = e
                .stage
                .zip(e.staging.as_ref())
                .into_iter()
                .chain(e.legacy_stagings.iter().map(|l| (l.stage, &l.path)));
            for (state, path) in stagings {
                if state != StepState::Done {
                    out.push(UncertainMount {
                        plugin: e.plugin.clone(),
                        volume: e.volume.clone(),
                        workload: None,
                        step: MountStep::Stage,
                        path: path.clone(),
                        state,
                    });
                }
            }
            for (w, u) in &e.users {
                if u.publish != StepState::Done {
                    out.push(UncertainMount {
                        plugin: e.plugin.clone(),
                        volume: e.volume.clone(),
                        workload: Some(w.clone()),
                        step: MountStep::Publish,
                        path: u.target.clone(),
                        state: u.publish,
                    });
                }
            }
        }
        out
    }
}
