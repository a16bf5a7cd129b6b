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
//! A directory laid out by [`Stores`] with the embedded store (the
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
//!
//! # A cluster node
//!
//! `ControlPlaneBuilder::cluster` (cargo feature `etcd`) opens a node of a cluster with the
//! same call: the catalog and the claims are in etcd, shared by every node; the node's usage
//! records, registrations and paths stay in `node/`. The node joins the cluster's
//! `cluster::Membership` (its record says where its routing is and which
//! plugins it hosts, kept current; `instance.id` in the directory tells its restart from
//! another process given the same node id), and follows the other members: their routes and
//! plugins go to its routing and to [`ControlPlane::peers`] as they come and go. Its release
//! pipeline performs its own node steps, and controller steps while it holds the controller
//! duty, fenced in etcd; they go through the routing, so the duty holder reaches a controller
//! on any node. What stays the embedder's: serving the routing on the address it advertises.
//!
//! ```no_run
//! # #[cfg(feature = "etcd")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use csi_control::stores::EtcdConfig;
//! use csi_control::{ClusterSettings, ControlPlane};
//! use csi_rpc_shim::Token;
//! use csi_structs::NodeId;
//!
//! let etcd = EtcdConfig {
//!     endpoints: vec!["http://10.0.0.1:2379".into()],
//!     prefix: "/my-orchestrator".into(),
//!     ca_file: None,
//!     identity: None,
//!     user: None,
//! };
//! let token = Token::new(std::fs::read_to_string("/etc/my-orchestrator/cluster.token")?.trim())?;
//! let listener = tokio::net::TcpListener::bind("10.0.0.5:7070").await?;
//! let plane = ControlPlane::builder("/var/lib/my-orchestrator", NodeId::new("node-5")?)
//!     .cluster(ClusterSettings::new(etcd, token, "10.0.0.5:7070"))
//!     .open()
//!     .await?;
//! let routing = plane.service().shim().clone();
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let served = tokio::spawn(async move {
//!     routing.serve(listener, async { let _ = stopped.await; }).await
//! });
//! // Create, claim, release: plane.service(), against every node's claims.
//! let _ = stop.send(());
//! served.await??;
//! plane.close().await?;
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_claims::detach::{ControllerDetachRequest, DetachError, DetachRpc};
use csi_claims::driver::{ControllerDetacher, DriverConfig};
use csi_client::{CallObserver, CallsInFlight, CsiClientBuilder, Endpoint};
use csi_node::Node;
use csi_node::detach::{SecretsLookup, ShimDetacher};
use csi_node::node::NodeError;
use csi_node::plugins::{
    ClientCustomizer, PluginManagerConfig, PluginObserver, ReadyPlugin, RegistrationId, WaitError,
};
use csi_node::shim::{NodeBackend, RegistryFeed};
use csi_node::state::StateFileError;
use csi_rpc_shim::{
    Credentials, NodeStatus, Registry, Routes, Scope, Shim, ShimConfig, Token, TokenBook,
};
use csi_structs::{ErrorClass, NodeId, PluginId};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::catalog::{CatalogSecrets, FileCatalog, VolumeCatalog};
use crate::peers::NodePeers;
use crate::service::{NodeReconciled, Peers, VolumeService};
use crate::stores::{StoreConfig, Stores, StoresError};

#[cfg(feature = "etcd")]
pub mod cluster;

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
    /// The shared stores ([`StoreConfig::Etcd`]) could not be opened: a file of the etcd
    /// settings, etcd itself, or a build without etcd.
    #[error(transparent)]
    Stores(#[from] StoresError),
    /// The catalog (`volumes.json`) could not be read.
    #[error(transparent)]
    Catalog(#[from] StateFileError),
    /// This node could not join the cluster (cargo feature `etcd`): etcd failed, or another
    /// live member has this node id.
    #[cfg(feature = "etcd")]
    #[error(transparent)]
    Join(Box<crate::cluster::JoinError<crate::peers::NodeAbout>>),
    /// A field of `ClusterSettings::extra` takes the name of one of the member record's own
    /// (cargo feature `etcd`); nothing was opened.
    #[cfg(feature = "etcd")]
    #[error(
        "cluster settings: extra field {field:?} is one of the member record's own fields \
         (format, node, instance, shim, plugins); name it otherwise"
    )]
    RecordField {
        /// The field.
        field: &'static str,
    },
    /// The controller duty's timing does not fit the member lease (cargo feature `etcd`).
    #[cfg(feature = "etcd")]
    #[error("cluster settings: {0}")]
    Duty(#[source] csi_claims::duty::DutyTimingError),
    /// The cluster's instance file (`instance.id` in the directory) could not be read or
    /// written.
    #[error("{path}: {source}")]
    Instance {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The system's random source, for the node's internal routing credentials, could not
    /// be read.
    #[error("reading /dev/urandom: {0}")]
    Random(#[source] std::io::Error),
    /// The directory holds both the embedded claim store of
    /// [`Stores`] (`claims.redb`) and the node's database
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
pub struct ControlPlaneBuilder {
    dir: PathBuf,
    node: NodeId,
    call_timeout: Duration,
    restart_wait: Duration,
    plugins: PluginManagerConfig,
    driver: DriverConfig,
    observer: Option<Arc<dyn CallObserver>>,
    calls: Option<Arc<CallsInFlight>>,
    store: StoreConfig,
    token: Option<Token>,
    customize: Option<ClientCustomizer>,
    plugin_observers: Vec<Arc<dyn PluginObserver>>,
    #[cfg(feature = "etcd")]
    cluster: Option<cluster::ClusterSettings>,
}

impl std::fmt::Debug for ControlPlaneBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlaneBuilder")
            .field("dir", &self.dir)
            .field("node", &self.node)
            .field("store", &self.store)
            .field("call_timeout", &self.call_timeout)
            .field("restart_wait", &self.restart_wait)
            .finish_non_exhaustive()
    }
}

impl ControlPlaneBuilder {
    /// The token this node presents to other nodes' routing (csi-rpc-shim) and accepts
    /// from them (default: a random one, for a node whose routing is never served). Give
    /// the cluster's token to serve [`VolumeService::shim`] to peers and route to theirs.
    pub fn shim_token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// Adjusts every plugin client the node builds, after the control plane's own settings
    /// ([`NodeBuilder::client_builder`](csi_node::node::NodeBuilder::client_builder)):
    /// policies, a metrics layer.
    pub fn client_builder(mut self, customize: ClientCustomizer) -> Self {
        self.customize = Some(customize);
        self
    }

    /// Tells `observer` of every plugin event, from the first (registered, fingerprinted,
    /// health changes, gone): a log, metrics. Call again for more than one.
    pub fn plugin_observer(mut self, observer: Arc<dyn PluginObserver>) -> Self {
        self.plugin_observers.push(observer);
        self
    }

    /// Opens a node of a cluster (cargo feature `etcd`): the catalog and the claims in the
    /// etcd of [`ClusterSettings::etcd`](cluster::ClusterSettings::etcd) (the node's usage
    /// records and paths still in `node/`), the node joined to the cluster's
    /// [`Membership`](crate::cluster::Membership) with a record saying where its routing is
    /// and which plugins it hosts (kept current), and the other members' routes and plugins
    /// fed to its routing as they come and go. Serve the routing
    /// ([`VolumeService::shim`]) on the advertised address.
    #[cfg(feature = "etcd")]
    pub fn cluster(mut self, settings: cluster::ClusterSettings) -> Self {
        self.store = StoreConfig::Etcd(Box::new(settings.etcd.clone()));
        self.token = Some(settings.token.clone());
        self.cluster = Some(settings);
        self
    }

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

    /// Opens the control plane: the catalog (`volumes.json`, or etcd for a cluster node), the
    /// node (`node/`, created owner-only when missing) with its plugins restored and its
    /// release pipeline resumed, the volume service, and for a cluster node its membership;
    /// then starts confirming the restored usage records ([`ControlPlane::reconciled`]).
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
            store,
            token,
            customize,
            plugin_observers,
            #[cfg(feature = "etcd")]
            cluster,
        } = self;
        #[cfg(feature = "etcd")]
        if let Some(settings) = &cluster {
            settings.check()?;
        }
        csi_node::node::create_state_dir(&dir)?;
        let (catalog, shared): (Arc<dyn VolumeCatalog>, _) = match &store {
            StoreConfig::Embedded => {
                adopt_stores_layout(&dir)?;
                (Arc::new(FileCatalog::open(&dir).await?), None)
            }
            StoreConfig::Etcd(_) => {
                let stores = Stores::open(&store, &dir, &me).await?;
                (Arc::clone(&stores.catalog), Some(stores))
            }
        };
        let description = match &shared {
            Some(stores) => stores.description.clone(),
            None => format!(
                "embedded {}",
                dir.join(NODE_DIR)
                    .join(csi_node::node::DATABASE_FILE)
                    .display()
            ),
        };
        // The shim's registry learns this node's plugins from the plugin manager's events.
        let registry = Arc::new(Registry::new());
        registry.set_node_status(&me, NodeStatus::Ready);
        let feed = Arc::new(RegistryFeed::new(me.clone(), Arc::clone(&registry)));
        if driver.first_plugin_wait.is_zero() {
            driver.first_plugin_wait = restart_wait;
        }
        let mut node = Node::builder(dir.join(NODE_DIR), me.clone());
        if let Some(stores) = &shared {
            node = node.claim_store(Arc::clone(&stores.claims));
            driver.machine.duties = stores.duties.clone();
            // A controller may be another member's, which this node never fingerprints.
            driver.first_plugin_wait_controllers = false;
        }
        if observer.is_some() || calls.is_some() || customize.is_some() {
            node = node.client_builder(Arc::new(move |plugin, mut client: CsiClientBuilder| {
                if let Some(observer) = &observer {
                    client = client.observer(Arc::clone(observer));
                }
                if let Some(calls) = &calls {
                    client = client.calls_in_flight(Arc::clone(calls));
                }
                match &customize {
                    Some(customize) => customize(plugin, client),
                    None => client,
                }
            }));
        }
        // Controller release steps go through the routing, which picks a controller on this
        // node or a peer's; the routing needs the node's managers, so it is handed over once
        // the node is open.
        let (routing_tx, routing) = watch::channel(None);
        node = plugin_observers
            .into_iter()
            .fold(node, |node, observer| node.observer(observer));
        let node = node
            .plugins(plugins)
            .driver(driver)
            .controller_detacher(Arc::new(LateRouting { routing }))
            .observer(Arc::clone(&feed) as Arc<dyn PluginObserver>)
            .open()
            .await?;
        feed.wake(node.claims().clone());
        let peers = Arc::new(NodePeers::new(Arc::clone(&registry)));
        let shim = match local_shim(&node, registry, token, call_timeout) {
            Ok(shim) => shim,
            Err(e) => {
                // Nothing of the node is handed out yet: it closes at once.
                let _ = node.close().await;
                return Err(e);
            }
        };
        let secrets: Arc<dyn SecretsLookup> = Arc::new(CatalogSecrets::new(Arc::clone(&catalog)));
        let _ = routing_tx.send(Some(Arc::new(ShimDetacher::new(
            shim.clone(),
            call_timeout,
            secrets,
        ))));
        let service = VolumeService::for_node(&node, catalog, shim)
            .call_timeout(call_timeout)
            .peers(Arc::clone(&peers) as Arc<dyn Peers>)
            .build();
        let service = Arc::new(service);
        #[cfg(feature = "etcd")]
        let joined = match (cluster, shared.as_ref().and_then(|s| s.etcd.as_ref())) {
            (Some(settings), Some(store)) => {
                match cluster::join(&dir, &node, service.shim(), &peers, store, settings).await {
                    Ok(joined) => Some(joined),
                    Err(e) => {
                        drop(service);
                        let _ = node.close().await;
                        return Err(e);
                    }
                }
            }
            _ => None,
        };
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
            description,
            peers,
            #[cfg(feature = "etcd")]
            etcd: shared.and_then(|s| s.etcd),
            #[cfg(feature = "etcd")]
            joined,
        })
    }
}

/// The controller release steps, through the routing once the control plane has built it
/// (a step that comes first waits for it; none can come before the node is open).
struct LateRouting {
    routing: watch::Receiver<Option<Arc<ShimDetacher>>>,
}

#[async_trait::async_trait]
impl ControllerDetacher for LateRouting {
    async fn controller_unpublish(&self, r: &ControllerDetachRequest) -> Result<(), DetachError> {
        let mut routing = self.routing.clone();
        let detacher = match routing.wait_for(Option::is_some).await {
            Ok(ready) => ready.clone(),
            Err(_) => None,
        };
        match detacher {
            Some(detacher) => detacher.controller_unpublish(r).await,
            None => Err(DetachError::new(
                DetachRpc::ControllerUnpublish,
                ErrorClass::Retry,
                "the control plane did not finish opening; the step is repeated at the next open",
            )),
        }
    }
}

/// The routing of this node's plugin calls: csi-rpc-shim over this node's plugins, with
/// `token` (the cluster's, to serve it and reach peers) or credentials nobody outside the
/// process sees; no route until the embedder adds its peers'.
fn local_shim(
    node: &Node,
    registry: Arc<Registry>,
    token: Option<Token>,
    call_timeout: Duration,
) -> Result<Shim, PlaneError> {
    let token = match token {
        Some(token) => token,
        None => Token::new(csi_node::state::random_hex(24).map_err(PlaneError::Random)?).map_err(
            |e| {
                PlaneError::Random(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    e.to_string(),
                ))
            },
        )?,
    };
    let credentials = Credentials {
        node: node.id().clone(),
        token,
    };
    let backend = Arc::new(NodeBackend::new(
        node.plugins().clone(),
        node.volumes().clone(),
    ));
    let mut config = ShimConfig::new(credentials, Scope::Cluster);
    config.connect_timeout = call_timeout.min(Duration::from_secs(10));
    Ok(Shim::new(
        config,
        registry,
        backend,
        TokenBook::new(),
        Routes::new(),
    ))
}

/// Moves the embedded claim store of [`Stores`] (`<dir>/claims.redb`:
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
    description: String,
    peers: Arc<NodePeers>,
    #[cfg(feature = "etcd")]
    etcd: Option<csi_claims::store::EtcdStore>,
    #[cfg(feature = "etcd")]
    joined: Option<cluster::Joined>,
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
            store: StoreConfig::Embedded,
            token: None,
            customize: None,
            plugin_observers: Vec::new(),
            #[cfg(feature = "etcd")]
            cluster: None,
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

    /// Where the catalog and the claims are, for a log line: `embedded <dir>/node/node.redb`
    /// or `etcd://HOST:PORT,... prefix /...`.
    pub fn store_description(&self) -> &str {
        &self.description
    }

    /// What this node knows of its peers (their plugins, whether they answer), fed to its
    /// routing; report what peers polled by the embedder say with [`NodePeers::report`]. In
    /// cluster mode the members' records feed it.
    pub fn peers(&self) -> &Arc<NodePeers> {
        &self.peers
    }

    /// The cluster's membership of a node opened with
    /// [`cluster`](ControlPlaneBuilder::cluster): the members, the controller duty's holder,
    /// the nodes reported gone.
    #[cfg(feature = "etcd")]
    pub fn membership(&self) -> Option<&Arc<crate::cluster::Membership<crate::peers::NodeAbout>>> {
        self.joined.as_ref().map(|j| &j.membership)
    }

    /// The etcd client of a cluster node ([`ControlPlaneBuilder::cluster`]), for keys of the
    /// embedder's own under the cluster's prefix; `None` with the embedded store.
    #[cfg(feature = "etcd")]
    pub fn etcd(&self) -> Option<&csi_claims::store::EtcdStore> {
        self.etcd.as_ref()
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
    /// The future holds no borrow of the control plane: a task can wait on it.
    pub fn reconciled(&self) -> impl Future<Output = Arc<NodeReconciled>> + Send + 'static {
        let mut reconciled = self.reconciled.clone();
        async move {
            match reconciled.wait_for(Option::is_some).await {
                Ok(done) => done.clone().unwrap_or_else(unfinished),
                // The task ended without a report: only when it panicked.
                Err(_) => unfinished(),
            }
        }
    }

    /// Closes the volume service and the node together: stops the confirmation of restored
    /// records if it still runs, waits up to the call timeout for the operations still
    /// running (those whose callers left run to their end: [`VolumeService::wait_idle`]),
    /// then closes the node ([`Node::close`]: the release pipeline checkpoints and stops, the
    /// plugins' tasks stop, the database closes).
    ///
    /// # Errors
    ///
    /// [`PlaneError::ServiceHeld`], at once, when a clone of [`service`](Self::service) is
    /// still held: the release pipeline and the plugins' tasks are stopped then, and the
    /// node's database closes when the last clone is dropped. Otherwise as [`Node::close`]
    /// (its [`NodeError::Held`] when an operation still runs after the wait: the database
    /// closes when it ends).
    pub async fn close(self) -> Result<(), PlaneError> {
        let ControlPlane {
            node,
            service,
            reconcile,
            #[cfg(feature = "etcd")]
            joined,
            ..
        } = self;
        reconcile.abort();
        let _ = reconcile.await;
        // An operation whose caller left runs to its end, holding the node's managers (and
        // calling through the routing): it ends before anything stops, if it does within a
        // call's time.
        let _ = tokio::time::timeout(service.call_timeout(), service.wait_idle()).await;
        // The members' follower holds the routing (and so the node's volume manager): it
        // stops first; the membership is left once the node's release pipeline stopped.
        #[cfg(feature = "etcd")]
        let membership = match joined {
            Some(joined) => Some(joined.stop().await),
            None => None,
        };
        let holders = Arc::strong_count(&service) - 1;
        let me = node.id().clone();
        // The last handle drops the service here; another still holding it keeps the
        // node's volume manager, which the node's close then reports at once.
        drop(service);
        let closed = node.close().await;
        #[cfg(feature = "etcd")]
        if let Some(membership) = membership {
            membership.leave().await;
        }
        match closed {
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
        released_while_gone: Vec::new(),
    })
}
