//! The front door: a node and its control plane, opened with one call.
//!
//! [`ControlPlane::open`] gives an orchestrator everything the crates below make it wire by
//! hand: csi-node's [`Node`] (plugins, volumes, claims and their release pipeline), the volume
//! [`catalog`](crate::catalog), the routing of every plugin call (csi-rpc-shim, kept inside)
//! and the [`VolumeService`] over them, with the safe defaults on:
//!
//! - **secrets**: every call that takes a volume's secrets gets them from the catalog,
//!   the release pipeline's `ControllerUnpublishVolume` included;
//! - **restart**: the node's usage records restored from disk are confirmed with their plugins
//!   before they are trusted ([`VolumeService::reconcile_node`], started by `open`; its report
//!   is [`ControlPlane::reconciled`]), and releases resumed from the claims wait for their
//!   plugin's first fingerprint;
//! - **closing**: [`ControlPlane::close`] closes the service and the node together.
//!
//! One node keeps everything in one directory:
//!
//! | in the directory | what it holds |
//! |---|---|
//! | `volumes.json` | the catalog (owner-only: it holds the volumes' secrets) |
//! | `node/` | the node's state ([`csi_node::node`]): `node.redb` (claims and usage records), `plugins.json`, the staging and publish directories |
//!
//! A directory laid out by [`Stores`](crate::stores::Stores) with the embedded store (the
//! claims and the node's usage records in `claims.redb` beside `volumes.json`, the paths under
//! `node/`; the reference agent's data directory) is taken over as it is: its `claims.redb`
//! moves to `node/node.redb` once, at the first open.
//!
//! ```no_run
//! use csi_client::Endpoint;
//! use csi_control::ControlPlane;
//! use csi_structs::{NodeId, PluginId};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let plane = ControlPlane::open("/var/lib/my-orchestrator", NodeId::new("node-1")?).await?;
//! let plugin = PluginId::new("ebs")?;
//! plane.register_plugin(plugin.clone(), Endpoint::unix("/run/csi/ebs.sock")?).await?;
//! plane.wait_for_plugin(&plugin, std::time::Duration::from_secs(30)).await?;
//! // Create, claim, release, expand, snapshot, delete: plane.service().
//! plane.close().await?;
//! # Ok(()) }
//! ```
//!
//! [`ControlPlane::builder`] changes the timings and the plugin manager's and release
//! pipeline's settings, and shows every CSI call the control plane makes, as it ends
//! ([`call_observer`](ControlPlaneBuilder::call_observer)) and while it runs
//! ([`calls_in_flight`](ControlPlaneBuilder::calls_in_flight)); the builders of the crates
//! below stay for setups this one does not cover.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_claims::driver::DriverConfig;
use csi_client::{CallObserver, CallsInFlight, CsiClientBuilder, Endpoint};
use csi_node::Node;
use csi_node::node::NodeError;
use csi_node::plugins::{
    PluginManagerConfig, PluginObserver, ReadyPlugin, RegistrationId, WaitError,
};
use csi_node::shim::{NodeBackend, RegistryFeed};
use csi_node::state::StateFileError;
use csi_rpc_shim::{
    Credentials, NodeStatus, Registry, Routes, Scope, Shim, ShimConfig, Token, TokenBook,
};
use csi_structs::{NodeId, PluginId};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::catalog::{CatalogSecrets, FileCatalog, VolumeCatalog};
use crate::service::{NodeReconciled, VolumeService};

/// The node's own state directory inside the control plane's.
pub const NODE_DIR: &str = "node";

/// How long, by default, a restart waits for a plugin of the restored records (or of a
/// release resumed from the claims) to be fingerprinted and healthy before going on without
/// it.
pub const RESTART_WAIT: Duration = Duration::from_secs(10);

/// Why a control plane could not be opened or closed; each names what failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlaneError {
    /// The node could not be opened or closed (its directory, database or state files).
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The catalog (`volumes.json`) could not be read.
    #[error(transparent)]
    Catalog(#[from] StateFileError),
    /// The system's random source, for the node's internal routing credentials, could not
    /// be read.
    #[error("reading /dev/urandom: {0}")]
    Random(#[source] std::io::Error),
    /// The directory holds both the embedded claim store of
    /// [`Stores`](crate::stores::Stores) (`claims.redb`) and the node's database
    /// (`node/node.redb`); the control plane takes neither for the other. Move away the one
    /// that is not current.
    #[error(
        "{old} and {new} both exist: the claims would be read from one and not the other; \
         move away the one that is not current"
    )]
    TwoDatabases {
        /// The embedded claim store's file.
        old: PathBuf,
        /// The node's database file.
        new: PathBuf,
    },
    /// [`ControlPlane::close`]: the volume service is still held elsewhere (a clone of the
    /// `Arc` from [`ControlPlane::service`]). The release pipeline and the plugins' tasks
    /// are stopped; the node's database closes when the last clone is dropped.
    #[error(
        "the control plane of node {node} cannot close: its volume service is still held by \
         {holders} other handle(s), which keep the node's database open until dropped"
    )]
    ServiceHeld {
        /// The node.
        node: NodeId,
        /// How many other handles hold the service.
        holders: usize,
    },
}

/// What a [`ControlPlane`] is opened with: [`ControlPlane::builder`]. Every setting has a
/// default.
#[derive(Debug)]
pub struct ControlPlaneBuilder {
    dir: PathBuf,
    node: NodeId,
    call_timeout: Duration,
    restart_wait: Duration,
    plugins: PluginManagerConfig,
    driver: DriverConfig,
    observer: Option<Arc<dyn CallObserver>>,
    calls: Option<Arc<CallsInFlight>>,
}

impl ControlPlaneBuilder {
    /// The deadline of each plugin call the service makes, and of the wait for a failed
    /// claim's release (default: 30 s; [`VolumeServiceBuilder::call_timeout`](
    /// crate::service::VolumeServiceBuilder::call_timeout)).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// How long a restart waits for the plugins of what was restored before going on
    /// without them (default: [`RESTART_WAIT`]).
    pub fn restart_wait(mut self, wait: Duration) -> Self {
        self.restart_wait = wait;
        self
    }

    /// The plugin manager's settings (default: [`PluginManagerConfig::default`]).
    pub fn plugins(mut self, config: PluginManagerConfig) -> Self {
        self.plugins = config;
        self
    }

    /// Tells `observer` of every CSI call the control plane makes, as it ends: its RPC, the
    /// volume it names, its duration and its outcome ([`CallEvent`](csi_client::CallEvent)).
    /// Every client of every plugin registered here is built with it, so the calls of the
    /// fingerprints and probes, of the volume service's operations and of the release
    /// pipeline are all seen, each once, as it ends (default: none).
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use csi_client::{CallEvent, CallObserver};
    /// use csi_control::ControlPlane;
    /// use csi_structs::NodeId;
    ///
    /// #[derive(Debug)]
    /// struct PrintCalls;
    ///
    /// impl CallObserver for PrintCalls {
    ///     fn on_call(&self, call: &CallEvent) {
    ///         let volume = call.volume.as_ref().map_or("-", |v| v.as_str());
    ///         println!("{} {volume} {:?}: {}", call.rpc.name(), call.duration, call.outcome.label());
    ///     }
    /// }
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let plane = ControlPlane::builder("/var/lib/my-orchestrator", NodeId::new("node-1")?)
    ///     .call_observer(Arc::new(PrintCalls))
    ///     .open()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn call_observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Lists every CSI call the control plane makes in `calls` while it runs (default: a
    /// list per plugin client), so one list shows what each long call waits on
    /// ([`CallsInFlight::list`], [`CallsInFlight::log_long_calls`]).
    pub fn calls_in_flight(mut self, calls: Arc<CallsInFlight>) -> Self {
        self.calls = Some(calls);
        self
    }

    /// The release pipeline's settings (default: [`DriverConfig::default`], with
    /// releases resumed at open waiting up to the [`restart_wait`](Self::restart_wait) for
    /// their plugins).
    pub fn driver(mut self, config: DriverConfig) -> Self {
        self.driver = config;
        self
    }

    /// Opens the control plane: the catalog (`volumes.json`), the node (`node/`, created
    /// owner-only when missing) with its plugins restored and its release pipeline resumed,
    /// and the volume service; then starts confirming the restored usage records
    /// ([`ControlPlane::reconciled`]).
    ///
    /// # Errors
    ///
    /// A [`PlaneError`] naming the file or directory that could not be opened; nothing keeps
    /// running then.
    pub async fn open(self) -> Result<ControlPlane, PlaneError> {
        let ControlPlaneBuilder {
            dir,
            node: me,
            call_timeout,
            restart_wait,
            plugins,
            mut driver,
            observer,
            calls,
        } = self;
        csi_node::node::create_state_dir(&dir)?;
        adopt_stores_layout(&dir)?;
        let catalog: Arc<dyn VolumeCatalog> = Arc::new(FileCatalog::open(&dir).await?);
        // The shim's registry learns this node's plugins from the plugin manager's events.
        let registry = Arc::new(Registry::new());
        registry.set_node_status(&me, NodeStatus::Ready);
        let feed = Arc::new(RegistryFeed::new(me.clone(), Arc::clone(&registry)));
        if driver.first_plugin_wait.is_zero() {
            driver.first_plugin_wait = restart_wait;
        }
        let mut node = Node::builder(dir.join(NODE_DIR), me.clone());
        if observer.is_some() || calls.is_some() {
            node = node.client_builder(Arc::new(move |_, mut client: CsiClientBuilder| {
                if let Some(observer) = &observer {
                    client = client.observer(Arc::clone(observer));
                }
                if let Some(calls) = &calls {
                    client = client.calls_in_flight(Arc::clone(calls));
                }
                client
            }));
        }
        let node = node
            .plugins(plugins)
            .driver(driver)
            .secrets(Arc::new(CatalogSecrets::new(Arc::clone(&catalog))))
            .observer(Arc::clone(&feed) as Arc<dyn PluginObserver>)
            .open()
            .await?;
        feed.wake(node.claims().clone());
        let shim = match local_shim(&node, registry) {
            Ok(shim) => shim,
            Err(e) => {
                // Nothing of the node is handed out yet: it closes at once.
                let _ = node.close().await;
                return Err(e);
            }
        };
        let service = Arc::new(
            VolumeService::for_node(&node, catalog, shim)
                .call_timeout(call_timeout)
                .build(),
        );
        let (report, reconciled) = watch::channel(None);
        let reconcile = {
            let service = Arc::clone(&service);
            tokio::spawn(async move {
                let done = service.reconcile_node(restart_wait).await;
                let _ = report.send(Some(Arc::new(done)));
            })
        };
        Ok(ControlPlane {
            dir,
            node,
            service,
            reconciled,
            reconcile,
        })
    }
}

/// The routing of this node's plugin calls: csi-rpc-shim over this node's plugins alone,
/// with credentials nobody outside the process sees (the shim is never served).
fn local_shim(node: &Node, registry: Arc<Registry>) -> Result<Shim, PlaneError> {
    let token = Token::new(random_hex(24)?).map_err(|e| {
        PlaneError::Random(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            e.to_string(),
        ))
    })?;
    let credentials = Credentials {
        node: node.id().clone(),
        token,
    };
    let backend = Arc::new(NodeBackend::new(
        node.plugins().clone(),
        node.volumes().clone(),
    ));
    Ok(Shim::new(
        ShimConfig::new(credentials, Scope::Cluster),
        registry,
        backend,
        TokenBook::new(),
        Routes::new(),
    ))
}

/// `bytes` random bytes from the system, as hex.
fn random_hex(bytes: usize) -> Result<String, PlaneError> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(PlaneError::Random)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Moves the embedded claim store of [`Stores`](crate::stores::Stores) (`<dir>/claims.redb`:
/// the claims and the node's usage records, in the tables `node.redb` has) to
/// `<dir>/node/node.redb`, where the node opens it. Nothing to do when there is none; refused,
/// changing nothing, when both files exist (which one holds the truth is the operator's call).
fn adopt_stores_layout(dir: &Path) -> Result<(), PlaneError> {
    let old = dir.join(crate::stores::CLAIMS_FILE);
    if !old.exists() {
        return Ok(());
    }
    let node_dir = dir.join(NODE_DIR);
    let new = node_dir.join(csi_node::node::DATABASE_FILE);
    if new.exists() {
        return Err(PlaneError::TwoDatabases { old, new });
    }
    csi_node::node::create_state_dir(&node_dir)?;
    std::fs::rename(&old, &new).map_err(|source| {
        PlaneError::Node(NodeError::Directory {
            path: old.clone(),
            source,
        })
    })?;
    tracing::info!(from = %old.display(), to = %new.display(), "claim store moved into the node's directory");
    Ok(())
}

/// A node and its control plane, open (module docs: [`self`]).
pub struct ControlPlane {
    dir: PathBuf,
    node: Node,
    service: Arc<VolumeService>,
    reconciled: watch::Receiver<Option<Arc<NodeReconciled>>>,
    reconcile: JoinHandle<()>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir)
            .field("node", self.node.id())
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Settings for the control plane of node `node`, whose state lives in `dir`.
    pub fn builder(dir: impl Into<PathBuf>, node: NodeId) -> ControlPlaneBuilder {
        ControlPlaneBuilder {
            dir: dir.into(),
            node,
            call_timeout: Duration::from_secs(30),
            restart_wait: RESTART_WAIT,
            plugins: PluginManagerConfig::default(),
            driver: DriverConfig::default(),
            observer: None,
            calls: None,
        }
    }

    /// Opens the control plane of node `node` in `dir` with every default; see
    /// [`ControlPlaneBuilder::open`].
    ///
    /// # Errors
    ///
    /// As [`ControlPlaneBuilder::open`].
    pub async fn open(dir: impl Into<PathBuf>, node: NodeId) -> Result<Self, PlaneError> {
        Self::builder(dir, node).open().await
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The orchestrator's id of this node.
    pub fn id(&self) -> &NodeId {
        self.node.id()
    }

    /// The volume operations: register, create, claim, release, expand, snapshots, detach,
    /// deregister, delete. Clone the `Arc` to share it between tasks, and drop the clones
    /// before [`close`](Self::close).
    pub fn service(&self) -> &Arc<VolumeService> {
        &self.service
    }

    /// The node: its plugin manager, volume manager and claims.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Registers the plugin instance at `endpoint` on this node ([`Node::register_plugin`]); it is
    /// fingerprinted and probed from then on, and registered again at the next open.
    ///
    /// # Errors
    ///
    /// As [`Node::register_plugin`]: the registrations' file could not be written.
    pub async fn register_plugin(
        &self,
        plugin: PluginId,
        endpoint: Endpoint,
    ) -> Result<RegistrationId, NodeError> {
        self.node.register_plugin(plugin, endpoint).await
    }

    /// Waits up to `within` until `plugin` is fingerprinted and healthy here
    /// ([`Node::wait_for`]).
    ///
    /// # Errors
    ///
    /// As [`Node::wait_for`]: naming the plugin, the wait and what was missing.
    pub async fn wait_for_plugin(
        &self,
        plugin: &PluginId,
        within: Duration,
    ) -> Result<ReadyPlugin, WaitError> {
        self.node.wait_for(plugin, within).await
    }

    /// What confirming the usage records restored at open found and did, once it is done
    /// (at most the restart wait for each plugin, plus the calls): which publications were
    /// published again, which released, which kept. A node opened on an empty directory
    /// has nothing to confirm and answers at once.
    pub async fn reconciled(&self) -> Arc<NodeReconciled> {
        let mut reconciled = self.reconciled.clone();
        match reconciled.wait_for(Option::is_some).await {
            Ok(done) => done.clone().unwrap_or_else(unfinished),
            // The task ended without a report: only when it panicked.
            Err(_) => unfinished(),
        }
    }

    /// Closes the volume service and the node together: stops the confirmation of restored
    /// records if it still runs, waits for the operations still running (those whose callers
    /// left run to their end: [`VolumeService::wait_idle`]), then closes the node ([`Node::close`]: the release pipeline
    /// checkpoints and stops, the plugins' tasks stop, the database closes).
    ///
    /// # Errors
    ///
    /// [`PlaneError::ServiceHeld`], at once, when a clone of [`service`](Self::service) is
    /// still held: the release pipeline and the plugins' tasks are stopped then, and the
    /// node's database closes when the last clone is dropped. Otherwise as [`Node::close`].
    pub async fn close(self) -> Result<(), PlaneError> {
        let ControlPlane {
            node,
            service,
            reconcile,
            ..
        } = self;
        reconcile.abort();
        let _ = reconcile.await;
        // An operation whose caller left runs to its end, holding the node's managers.
        service.wait_idle().await;
        let holders = Arc::strong_count(&service) - 1;
        let me = node.id().clone();
        // The last handle drops the service here; another still holding it keeps the
        // node's volume manager, which the node's close then reports at once.
        drop(service);
        match node.close().await {
            Ok(()) => Ok(()),
            Err(NodeError::Held { .. }) if holders > 0 => {
                Err(PlaneError::ServiceHeld { node: me, holders })
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The report of a confirmation that ended without one.
fn unfinished() -> Arc<NodeReconciled> {
    Arc::new(NodeReconciled {
        plugins_not_ready: Vec::new(),
        report: Default::default(),
    })
}
