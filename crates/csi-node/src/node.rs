//! A whole node from one state directory: [`Node::open`] and [`Node::close`].
//!
//! The pieces of this crate and csi-claims fit together one way for most embedders: the
//! plugin manager, the volume manager on the node's database, the claims and their release
//! pipeline (node steps through the volume manager, controller steps through the plugins'
//! controllers), and the attach path. [`Node`] wires them from one directory:
//!
//! | in the directory | what it holds |
//! |---|---|
//! | `node.redb` | the claims and the usage records, group-committed together ([`RedbStore`]) |
//! | `plugins.json` | the plugins registered with [`Node::register_plugin`], restored at the next open |
//! | `staging/`, `per-workload/`, … | the stagings and publications ([`Layout`]) |
//!
//! A `usage.json` of an older version in the directory is moved into `node.redb` once.
//! Opening reads files; it runs them on Tokio's blocking pool, so it never holds up the
//! runtime's workers. [`Node::close`] returns once every file is closed.
//!
//! What stays the embedder's: the volume catalog (which volumes exist, their specs and
//! secrets), which workload claims what, and confirming the usage records restored from an
//! earlier run ([`VolumeManager::reconcile`], with what only the embedder knows).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_claims::driver::{
    ClaimsDriver, ClaimsHandle, ControllerDetacher, DriverConfig, NodeDetacher,
};
use csi_claims::store::{ClaimStore, Forgetting, RedbStore, StoreError};
use csi_client::Endpoint;
use csi_structs::{NodeId, PluginId};

use crate::attach::Attacher;
use crate::detach::{ClientControllerDetacher, NoSecrets, SecretsLookup, VolumeNodeDetacher};
use crate::layout::Layout;
use crate::plugins::{
    ClientCustomizer, PluginManager, PluginManagerConfig, PluginObserver, ReadyPlugin,
    RegistrationId, WaitError,
};
use crate::state::StateFileError;
use crate::volumes::{UsageDb, VolumeManager};

/// The node's database in its directory: claims and usage records.
pub const DATABASE_FILE: &str = "node.redb";
/// The plugin registrations in its directory.
pub const PLUGINS_FILE: &str = "plugins.json";
/// A usage file of an older version, moved into the database on open.
pub const LEGACY_USAGE_FILE: &str = "usage.json";

/// How long [`Node::close`] waits for the database's last handle by default: a commit under
/// way may take up to csi-claims' stall limit before it is given up.
pub const CLOSE_WAIT: Duration = Duration::from_secs(15);

/// Why a node could not be opened or closed. Each names the file or directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The state directory could not be created or made owner-only.
    #[error("node state directory {path}: {source}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The node's database could not be opened, read or closed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A state file (the plugins' registrations, the usage records) could not be read or
    /// written.
    #[error(transparent)]
    State(#[from] StateFileError),
    /// A task on Tokio's blocking pool did not finish (the runtime is shutting down).
    #[error("opening the node did not finish: {0}")]
    Interrupted(String),
    /// [`Node::close`] found the node's volume manager still held outside the node (by a
    /// csi-control `VolumeService` built over it, or a clone the embedder kept), so its
    /// database cannot close. The release pipeline and the plugins' tasks are stopped; the
    /// database closes when the last holder is dropped.
    #[error(
        "node {node} cannot close: its volume manager is still held by {holders} handle(s) \
         outside the node (a VolumeService over it, or a clone); drop them first, or close \
         through csi-control's ControlPlane, which closes the service and the node together"
    )]
    Held {
        /// The node.
        node: NodeId,
        /// How many handles outside the node hold its volume manager.
        holders: usize,
    },
}

/// What a [`Node`] is opened with. Every field has a default; see [`Node::builder`].
pub struct NodeBuilder {
    dir: PathBuf,
    node: NodeId,
    plugins: PluginManagerConfig,
    driver: DriverConfig,
    claims: Option<Arc<dyn ClaimStore>>,
    secrets: Arc<dyn SecretsLookup>,
    controller: Option<Arc<dyn ControllerDetacher>>,
    observers: Vec<Arc<dyn PluginObserver>>,
    customize: Option<ClientCustomizer>,
}

impl std::fmt::Debug for NodeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBuilder")
            .field("dir", &self.dir)
            .field("node", &self.node)
            .field(
                "claims",
                &self.claims.as_ref().map(|_| "a store of the embedder's"),
            )
            .finish_non_exhaustive()
    }
}

impl NodeBuilder {
    /// The plugin manager's settings (default: [`PluginManagerConfig::default`]).
    pub fn plugins(mut self, config: PluginManagerConfig) -> Self {
        self.plugins = config;
        self
    }

    /// The release pipeline's settings (default: [`DriverConfig::default`]).
    pub fn driver(mut self, config: DriverConfig) -> Self {
        self.driver = config;
        self
    }

    /// Keeps the claims in `store` (etcd, for agents sharing claims) instead of the node's
    /// database; the usage records stay in the database.
    pub fn claim_store(mut self, store: Arc<dyn ClaimStore>) -> Self {
        self.claims = Some(store);
        self
    }

    /// Where the controller release step finds a volume's secrets (default: none). A
    /// [`controller_detacher`](Self::controller_detacher) of the embedder's brings its own
    /// and this is not used.
    pub fn secrets(mut self, secrets: Arc<dyn SecretsLookup>) -> Self {
        self.secrets = secrets;
        self
    }

    /// Tells `observer` of every plugin event ([`PluginObserver`]), from the first; with the
    /// `shim` feature, csi-node's `RegistryFeed` is one, which keeps csi-rpc-shim's registry
    /// in step with the plugins.
    pub fn observer(mut self, observer: Arc<dyn PluginObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Sends the controller release steps through `detacher` (another node's controller,
    /// through csi-rpc-shim, say) instead of this node's plugins.
    pub fn controller_detacher(mut self, detacher: Arc<dyn ControllerDetacher>) -> Self {
        self.controller = Some(detacher);
        self
    }

    /// Adjusts every client the plugin manager builds for a registration, the node detach
    /// client included ([`PluginManagerBuilder::client_builder`](
    /// crate::plugins::PluginManagerBuilder::client_builder)): a call observer, one
    /// [`CallsInFlight`](csi_client::CallsInFlight) list for every plugin's calls, a metrics
    /// layer, policies. So every call the node makes, from the volume manager, the release
    /// pipeline or the fingerprints, goes through what `customize` set.
    pub fn client_builder(mut self, customize: ClientCustomizer) -> Self {
        self.customize = Some(customize);
        self
    }

    /// Opens the node: creates the directory (owner-only) if needed, opens the database,
    /// restores the plugin registrations and the usage records, and starts the release
    /// pipeline, which resumes the releases the claims say are unfinished.
    ///
    /// # Errors
    ///
    /// A [`NodeError`] naming the directory or the file that could not be opened or read.
    /// Nothing keeps running then.
    pub async fn open(self) -> Result<Node, NodeError> {
        let NodeBuilder {
            dir,
            node,
            plugins,
            driver,
            claims,
            secrets,
            controller,
            observers,
            customize,
        } = self;
        let opened = {
            let dir = dir.clone();
            blocking(move || open_files(&dir, plugins, observers, customize)).await??
        };
        let Opened {
            db,
            plugins,
            volumes,
        } = opened;
        // The node's own database is the claims' store of one writer, so claims can be
        // forgotten through it; an embedder's store forgets (or not) its own way.
        let (claims, forgetting) = match claims {
            Some(store) => (store, None),
            None => {
                let own: Arc<dyn ClaimStore> = Arc::new(db.clone());
                let forgetting = Arc::new(Forgetting::new(own));
                (
                    Arc::clone(&forgetting) as Arc<dyn ClaimStore>,
                    Some(forgetting),
                )
            }
        };
        let node_detacher: Arc<dyn NodeDetacher> =
            Arc::new(VolumeNodeDetacher::new(volumes.clone()));
        let controller = controller.unwrap_or_else(|| {
            Arc::new(ClientControllerDetacher::over(
                Arc::new(plugins.clone()),
                secrets,
            ))
        });
        let (handle, driver) =
            match ClaimsDriver::start(claims, node_detacher, controller, driver).await {
                Ok(started) => started,
                Err(e) => {
                    plugins.shutdown();
                    return Err(e.into());
                }
            };
        let attacher = Attacher::new(node.clone(), plugins.clone(), volumes.clone());
        Ok(Node {
            dir,
            node,
            plugins,
            volumes,
            claims: handle,
            attacher,
            driver,
            forgetting,
            db,
        })
    }
}

/// What opening reads from disk.
struct Opened {
    db: RedbStore,
    plugins: PluginManager,
    volumes: VolumeManager,
}

fn open_files(
    dir: &Path,
    plugins: PluginManagerConfig,
    observers: Vec<Arc<dyn PluginObserver>>,
    customize: Option<ClientCustomizer>,
) -> Result<Opened, NodeError> {
    create_state_dir(dir)?;
    let db_file = dir.join(DATABASE_FILE);
    let db = RedbStore::open(&db_file)?;
    let usage = UsageDb::open(&db, &db_file, Some(&dir.join(LEGACY_USAGE_FILE)))?;
    let mut builder = observers
        .into_iter()
        .fold(PluginManager::builder(plugins), |b, o| b.observer(o));
    if let Some(customize) = customize {
        builder = builder.client_builder(move |plugin, b| customize(plugin, b));
    }
    let plugins = builder.state_file(dir.join(PLUGINS_FILE)).start()?;
    match VolumeManager::open_with(Layout::new(dir), Arc::new(usage), Arc::new(plugins.clone())) {
        Ok(volumes) => Ok(Opened {
            db,
            plugins,
            volumes,
        }),
        Err(e) => {
            plugins.shutdown();
            Err(e.into())
        }
    }
}

/// Creates `dir` (and its parents) when missing and makes it owner-only, as a node's state
/// directory is kept.
///
/// # Errors
///
/// [`NodeError::Directory`] naming the directory.
pub fn create_state_dir(dir: &Path) -> Result<(), NodeError> {
    use std::os::unix::fs::PermissionsExt;
    let failed = |source| NodeError::Directory {
        path: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(failed)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)
}

/// Runs `f` on Tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NodeError::Interrupted(e.to_string()))
}

/// A node opened from one state directory: its plugins, volumes, claims and attach path.
///
/// ```no_run
/// use csi_client::Endpoint;
/// use csi_node::Node;
/// use csi_structs::{NodeId, PluginId};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let node = Node::open("/var/lib/my-orchestrator/csi", NodeId::new("node-1")?).await?;
/// let plugin = PluginId::new("ebs")?;
/// node.register_plugin(plugin.clone(), Endpoint::unix("/run/csi/ebs.sock")?).await?;
/// // Claim with node.claims(), attach with node.attacher(), release with node.claims().
/// node.close().await?;
/// # Ok(()) }
/// ```
pub struct Node {
    dir: PathBuf,
    node: NodeId,
    plugins: PluginManager,
    volumes: VolumeManager,
    claims: ClaimsHandle,
    attacher: Attacher,
    driver: ClaimsDriver,
    forgetting: Option<Arc<Forgetting<dyn ClaimStore>>>,
    db: RedbStore,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("dir", &self.dir)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Settings for a node whose state lives in `dir`, known to the orchestrator as `node`.
    pub fn builder(dir: impl Into<PathBuf>, node: NodeId) -> NodeBuilder {
        NodeBuilder {
            dir: dir.into(),
            node,
            plugins: PluginManagerConfig::default(),
            driver: DriverConfig::default(),
            claims: None,
            secrets: Arc::new(NoSecrets),
            controller: None,
            observers: Vec::new(),
            customize: None,
        }
    }

    /// Opens the node in `dir` with every default; see [`NodeBuilder::open`].
    ///
    /// # Errors
    ///
    /// As [`NodeBuilder::open`].
    pub async fn open(dir: impl Into<PathBuf>, node: NodeId) -> Result<Node, NodeError> {
        Self::builder(dir, node).open().await
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The orchestrator's id of this node.
    pub fn id(&self) -> &NodeId {
        &self.node
    }

    /// The plugin manager.
    pub fn plugins(&self) -> &PluginManager {
        &self.plugins
    }

    /// The volume manager.
    pub fn volumes(&self) -> &VolumeManager {
        &self.volumes
    }

    /// The claims: claim, release, and their events.
    pub fn claims(&self) -> &ClaimsHandle {
        &self.claims
    }

    /// The attach path for claims taken on this node.
    pub fn attacher(&self) -> &Attacher {
        &self.attacher
    }

    /// The claim store through which a volume's claims are forgotten without being released
    /// ([`Forgetting`]): the node's own database; `None` with a claim store of the
    /// embedder's ([`NodeBuilder::claim_store`]).
    pub fn forgetting(&self) -> Option<&Arc<Forgetting<dyn ClaimStore>>> {
        self.forgetting.as_ref()
    }

    /// Registers a plugin instance at `endpoint` ([`PluginManager::register`]), writing the
    /// registrations' file on Tokio's blocking pool.
    ///
    /// # Errors
    ///
    /// [`NodeError::State`] when the registrations' file cannot be written; nothing changed
    /// then.
    pub async fn register_plugin(
        &self,
        plugin: PluginId,
        endpoint: Endpoint,
    ) -> Result<RegistrationId, NodeError> {
        let plugins = self.plugins.clone();
        // The blocking pool's threads are inside the runtime: the instance's task is spawned
        // on it from there.
        blocking(move || plugins.register(plugin, endpoint))
            .await?
            .map_err(NodeError::from)
    }

    /// Waits until `plugin` is usable ([`PluginManager::wait_for`]), at most `within`.
    ///
    /// # Errors
    ///
    /// As [`PluginManager::wait_for`]: naming the plugin, the wait and what was missing.
    pub async fn wait_for(
        &self,
        plugin: &PluginId,
        within: Duration,
    ) -> Result<ReadyPlugin, WaitError> {
        let deadline = tokio::time::Instant::now() + within;
        self.plugins.wait_for(plugin, deadline).await
    }

    /// Deregisters `plugin`'s current registration, whichever it is (one restored at
    /// [`open`](Self::open) included); `false` when the plugin is not registered.
    ///
    /// # Errors
    ///
    /// [`NodeError::State`] when the registrations' file cannot be written.
    pub async fn deregister_plugin(&self, plugin: &PluginId) -> Result<bool, NodeError> {
        match self.plugins.status(plugin) {
            Some(status) => self.deregister_registration(status.registration).await,
            None => Ok(false),
        }
    }

    /// Deregisters a registration ([`PluginManager::deregister`]) on Tokio's blocking pool.
    /// `false`: it was not (or no longer) the plugin's current registration.
    ///
    /// # Errors
    ///
    /// [`NodeError::State`] when the registrations' file cannot be written.
    pub async fn deregister_registration(
        &self,
        registration: RegistrationId,
    ) -> Result<bool, NodeError> {
        let plugins = self.plugins.clone();
        blocking(move || plugins.deregister(registration))
            .await?
            .map_err(NodeError::from)
    }

    /// Closes the node within [`CLOSE_WAIT`]; see [`close_within`](Self::close_within).
    ///
    /// # Errors
    ///
    /// As [`close_within`](Self::close_within).
    pub async fn close(self) -> Result<(), NodeError> {
        self.close_within(CLOSE_WAIT).await
    }

    /// Stops the release pipeline (a release under way is checkpointed and resumed at the
    /// next open), the plugins' tasks, and returns once the database file is closed. The
    /// registrations' file is written by each registration before it returns, so nothing of
    /// it is left open.
    ///
    /// # Errors
    ///
    /// [`NodeError::Held`], at once, when a clone of the volume manager is still held outside
    /// the node (a `VolumeService` over it, say); [`NodeError::Store`] when another handle of
    /// the database (one the embedder took from the node's parts) still holds it after
    /// `within`.
    pub async fn close_within(self, within: Duration) -> Result<(), NodeError> {
        let Node {
            node,
            plugins,
            volumes,
            claims,
            attacher,
            driver,
            forgetting,
            db,
            ..
        } = self;
        driver.shutdown().await;
        plugins.shutdown();
        let manager = volumes.downgrade();
        drop((attacher, volumes, claims, plugins, forgetting));
        let holders = manager.strong_count();
        if holders > 0 {
            return Err(NodeError::Held { node, holders });
        }
        db.close(within).await?;
        Ok(())
    }
}
