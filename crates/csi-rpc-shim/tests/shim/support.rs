//! Three (or more) agents in one process over loopback TCP, each with scripted fake plugins.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use csi_rpc_shim::{
    AgentRpc, ControllerAttach, ControllerAttached, ControllerDetach, ControllerExpand,
    ControllerExpanded, ControllerQuery, ControllerValidate, CreateSnapshot, CreateVolume,
    CreatedVolume, Credentials, DeleteSnapshot, DeleteVolume, GrpcCode, Health, Instance,
    ListSnapshots, ListVolumes, LocalPlugins, LocalStatus, NodeDetach, NodeExpand, NodeExpanded,
    PluginError, Registry, Routes, Scope, ServiceKind, Shim, ShimConfig, ShimContext, SnapshotInfo,
    SnapshotPage, Strategy, Token, TokenBook, Validated, VolumePage, WallClock,
};
use csi_structs::{
    AccessMode, ContentSource, ErrorClass, ExternalVolumeId, NodeId, PluginId, PluginNodeId,
    PublishContext, Secrets, VolumeCapability, VolumeContext, VolumeId, WorkloadId,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Generous bound on anything that should finish promptly: only catches hangs.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(20);
/// The timeout for calls expected to succeed or fail on their own.
pub(crate) const CALL: Duration = Duration::from_secs(10);

pub(crate) fn n(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

pub(crate) fn plugin() -> PluginId {
    PluginId::new("ebs").unwrap()
}

pub(crate) fn plugin_node(node: &str) -> PluginNodeId {
    PluginNodeId::new(format!("i-{node}")).unwrap()
}

pub(crate) fn token_of(node: &str) -> String {
    format!("token-of-{node}-0123456789")
}

/// How a fake plugin answers one call.
#[derive(Clone, Debug)]
pub(crate) enum Behaviour {
    Succeed,
    Fail(PluginError),
    /// Never answers; counts the call as cancelled when its future is dropped.
    Hang,
}

pub(crate) fn unavailable() -> Behaviour {
    Behaviour::Fail(PluginError::new(
        ErrorClass::Retry,
        GrpcCode::Unavailable,
        "controller restarting",
    ))
}

/// One call as the fake saw it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) rpc: AgentRpc,
    pub(crate) ctx: ShimContext,
    /// Time left until the deadline when the call arrived.
    pub(crate) budget: Duration,
    /// The secrets the call carried, as the plugin would get them.
    pub(crate) secrets: Option<Secrets>,
}

#[derive(Default)]
struct FakeState {
    status: HashMap<ServiceKind, LocalStatus>,
    script: HashMap<AgentRpc, Behaviour>,
    seen: Vec<Seen>,
    /// What `list_volumes` answers (an empty page by default).
    volume_page: VolumePage,
}

/// Scripted plugins of one node (one plugin, `ebs`).
pub(crate) struct FakePlugins {
    node: NodeId,
    state: Mutex<FakeState>,
    cancelled: Arc<AtomicUsize>,
}

struct CancelOnDrop(Arc<AtomicUsize>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl FakePlugins {
    pub(crate) fn new(node: &NodeId) -> Self {
        let mut state = FakeState::default();
        state
            .status
            .insert(ServiceKind::Controller, LocalStatus::Healthy);
        state.status.insert(ServiceKind::Node, LocalStatus::Healthy);
        Self {
            node: node.clone(),
            state: Mutex::new(state),
            cancelled: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub(crate) fn set_status(&self, service: ServiceKind, status: LocalStatus) {
        self.state.lock().unwrap().status.insert(service, status);
    }

    pub(crate) fn script(&self, rpc: AgentRpc, behaviour: Behaviour) {
        self.state.lock().unwrap().script.insert(rpc, behaviour);
    }

    pub(crate) fn set_volume_page(&self, page: VolumePage) {
        self.state.lock().unwrap().volume_page = page;
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    pub(crate) fn calls(&self, rpc: AgentRpc) -> usize {
        self.seen().iter().filter(|s| s.rpc == rpc).count()
    }

    pub(crate) fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }

    async fn answer<T>(
        &self,
        rpc: AgentRpc,
        ctx: &ShimContext,
        secrets: Option<&Secrets>,
        ok: T,
    ) -> Result<T, PluginError> {
        let behaviour = {
            let mut state = self.state.lock().unwrap();
            state.seen.push(Seen {
                rpc,
                ctx: ctx.clone(),
                budget: ctx.deadline.saturating_duration_since(Instant::now()),
                secrets: secrets.cloned(),
            });
            state
                .script
                .get(&rpc)
                .cloned()
                .unwrap_or(Behaviour::Succeed)
        };
        match behaviour {
            Behaviour::Succeed => Ok(ok),
            Behaviour::Fail(e) => Err(e),
            Behaviour::Hang => {
                let _guard = CancelOnDrop(self.cancelled.clone());
                std::future::pending::<()>().await;
                unreachable!("pending never completes")
            }
        }
    }
}

#[async_trait]
impl LocalPlugins for FakePlugins {
    fn status(&self, plugin: &PluginId, service: ServiceKind) -> LocalStatus {
        if plugin.as_str() != "ebs" {
            return LocalStatus::Missing;
        }
        self.state.lock().unwrap().status[&service].clone()
    }

    async fn controller_attach(
        &self,
        ctx: &ShimContext,
        req: ControllerAttach,
    ) -> Result<ControllerAttached, PluginError> {
        let publish_context =
            PublishContext::try_from_iter([("served_by", self.node.as_str())]).unwrap();
        self.answer(
            AgentRpc::ControllerAttach,
            ctx,
            Some(&req.secrets),
            ControllerAttached { publish_context },
        )
        .await
    }

    async fn controller_detach(
        &self,
        ctx: &ShimContext,
        req: ControllerDetach,
    ) -> Result<(), PluginError> {
        self.answer(AgentRpc::ControllerDetach, ctx, Some(&req.secrets), ())
            .await
    }

    async fn controller_validate(
        &self,
        ctx: &ShimContext,
        req: ControllerValidate,
    ) -> Result<Validated, PluginError> {
        self.answer(
            AgentRpc::ControllerValidate,
            ctx,
            Some(&req.secrets),
            Validated::Confirmed,
        )
        .await
    }

    async fn create_volume(
        &self,
        ctx: &ShimContext,
        req: CreateVolume,
    ) -> Result<CreatedVolume, PluginError> {
        let out = CreatedVolume {
            external_volume: ExternalVolumeId::new(format!("ext-{}", req.volume)).unwrap(),
            capacity_bytes: req.required_bytes,
            // Says what it was made from, so a test sees the content source arrive.
            volume_context: match &req.content_source {
                Some(ContentSource::Snapshot(id)) => {
                    VolumeContext::try_from_iter([("from-snapshot", id.as_str())]).unwrap()
                }
                Some(ContentSource::Volume(id)) => {
                    VolumeContext::try_from_iter([("cloned-from", id.as_str())]).unwrap()
                }
                None => VolumeContext::default(),
            },
            // Reachable where it was asked to be, first choice first.
            accessible_topology: req
                .accessibility_requirements
                .iter()
                .flat_map(|r| r.preferred().iter().chain(r.requisite()).take(1))
                .cloned()
                .collect(),
        };
        self.answer(
            AgentRpc::ControllerCreateVolume,
            ctx,
            Some(&req.secrets),
            out,
        )
        .await
    }

    async fn delete_volume(&self, ctx: &ShimContext, req: DeleteVolume) -> Result<(), PluginError> {
        self.answer(
            AgentRpc::ControllerDeleteVolume,
            ctx,
            Some(&req.secrets),
            (),
        )
        .await
    }

    async fn controller_expand(
        &self,
        ctx: &ShimContext,
        req: ControllerExpand,
    ) -> Result<ControllerExpanded, PluginError> {
        let out = ControllerExpanded {
            capacity_bytes: req.required_bytes,
            node_expansion_required: true,
        };
        self.answer(
            AgentRpc::ControllerExpandVolume,
            ctx,
            Some(&req.secrets),
            out,
        )
        .await
    }

    async fn list_volumes(
        &self,
        ctx: &ShimContext,
        _req: ListVolumes,
    ) -> Result<VolumePage, PluginError> {
        let page = self.state.lock().unwrap().volume_page.clone();
        self.answer(AgentRpc::ControllerListVolumes, ctx, None, page)
            .await
    }

    async fn create_snapshot(
        &self,
        ctx: &ShimContext,
        req: CreateSnapshot,
    ) -> Result<SnapshotInfo, PluginError> {
        let out = SnapshotInfo {
            snapshot: csi_structs::SnapshotId::new(format!("snap-{}", req.name)).unwrap(),
            source: req.source.clone(),
            size_bytes: 0,
            ready_to_use: true,
        };
        self.answer(
            AgentRpc::ControllerCreateSnapshot,
            ctx,
            Some(&req.secrets),
            out,
        )
        .await
    }

    async fn delete_snapshot(
        &self,
        ctx: &ShimContext,
        req: DeleteSnapshot,
    ) -> Result<(), PluginError> {
        self.answer(
            AgentRpc::ControllerDeleteSnapshot,
            ctx,
            Some(&req.secrets),
            (),
        )
        .await
    }

    async fn list_snapshots(
        &self,
        ctx: &ShimContext,
        req: ListSnapshots,
    ) -> Result<SnapshotPage, PluginError> {
        self.answer(
            AgentRpc::ControllerListSnapshots,
            ctx,
            Some(&req.secrets),
            SnapshotPage::default(),
        )
        .await
    }

    async fn node_detach(&self, ctx: &ShimContext, _req: NodeDetach) -> Result<(), PluginError> {
        self.answer(AgentRpc::NodeDetach, ctx, None, ()).await
    }

    async fn node_expand(
        &self,
        ctx: &ShimContext,
        req: NodeExpand,
    ) -> Result<NodeExpanded, PluginError> {
        let out = NodeExpanded {
            capacity_bytes: req.required_bytes,
        };
        self.answer(AgentRpc::NodeExpand, ctx, Some(&req.secrets), out)
            .await
    }
}

/// How to build one agent.
#[derive(Clone, Debug)]
pub(crate) struct AgentSpec {
    pub(crate) name: &'static str,
    pub(crate) scope: Scope,
    /// Whether its server runs (a stopped agent has an address nobody listens on).
    pub(crate) running: bool,
    /// The token it presents (defaults to its own).
    pub(crate) presents: Option<String>,
    /// Nodes it has no direct link to, with the relay to use instead.
    pub(crate) via: Vec<(&'static str, &'static str)>,
    /// Nodes it has no route to at all.
    pub(crate) unreachable: Vec<&'static str>,
    pub(crate) strategy: Strategy,
    /// Its cap on a received call (the default when `None`).
    pub(crate) max_remote_timeout: Option<Duration>,
    /// How far its wall clock runs ahead of the system clock (none: the system clock).
    pub(crate) clock_ahead: Option<Duration>,
    /// TLS for its links (dialling and serving).
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<csi_rpc_shim::TlsConfig>,
}

impl AgentSpec {
    pub(crate) fn node(name: &'static str) -> Self {
        Self {
            name,
            scope: Scope::Node,
            running: true,
            presents: None,
            via: Vec::new(),
            unreachable: Vec::new(),
            strategy: Strategy::Sticky,
            max_remote_timeout: None,
            clock_ahead: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    pub(crate) fn cluster(name: &'static str) -> Self {
        Self {
            scope: Scope::Cluster,
            ..Self::node(name)
        }
    }

    pub(crate) fn stopped(mut self) -> Self {
        self.running = false;
        self
    }

    pub(crate) fn presenting(mut self, token: &str) -> Self {
        self.presents = Some(token.to_owned());
        self
    }

    pub(crate) fn via(mut self, target: &'static str, relay: &'static str) -> Self {
        self.via.push((target, relay));
        self
    }

    pub(crate) fn no_route_to(mut self, target: &'static str) -> Self {
        self.unreachable.push(target);
        self
    }

    pub(crate) fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    pub(crate) fn max_remote_timeout(mut self, cap: Duration) -> Self {
        self.max_remote_timeout = Some(cap);
        self
    }

    /// Its wall clock runs `ahead` of the others': to it, every call arrives as if it had
    /// waited that long in its socket (a paused agent reading a buffered request).
    pub(crate) fn clock_ahead(mut self, ahead: Duration) -> Self {
        self.clock_ahead = Some(ahead);
        self
    }

    #[cfg(feature = "tls")]
    pub(crate) fn tls(mut self, tls: csi_rpc_shim::TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }
}

pub(crate) struct Agent {
    pub(crate) id: NodeId,
    pub(crate) shim: Shim,
    pub(crate) plugins: Arc<FakePlugins>,
    pub(crate) addr: SocketAddr,
    _stop: Option<oneshot::Sender<()>>,
}

pub(crate) struct Cluster {
    pub(crate) registry: Arc<Registry>,
    agents: Vec<Agent>,
    /// The stopped agents' ports, held for the cluster's life.
    _reserved: Vec<tokio::net::TcpSocket>,
}

impl Cluster {
    /// Starts the agents. Every agent knows every other's token (with its scope), and by
    /// default reaches every other directly. The registry (shared, like a replicated cluster
    /// view) lists every node as ready with a healthy node plugin `i-<name>`, and no
    /// controllers: tests add those.
    pub(crate) async fn start(specs: Vec<AgentSpec>) -> Cluster {
        let registry = Arc::new(Registry::new());
        let mut addrs = Vec::new();
        let mut listeners = Vec::new();
        let mut reserved = Vec::new();
        for spec in &specs {
            if spec.running {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                addrs.push(listener.local_addr().unwrap());
                listeners.push(Some(listener));
            } else {
                // A stopped agent's port is bound and never listened on, so dialling it is
                // refused. It stays bound (without SO_REUSEADDR), so no other test running
                // alongside can take the port and answer in the stopped agent's place.
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
                addrs.push(socket.local_addr().unwrap());
                reserved.push(socket);
                listeners.push(None);
            }
            registry.update(
                &n(spec.name),
                &plugin(),
                Instance::Node {
                    plugin_node: plugin_node(spec.name),
                    health: Health::Healthy,
                },
            );
        }
        let mut book = TokenBook::new();
        for spec in &specs {
            book.insert(
                n(spec.name),
                Token::new(token_of(spec.name)).unwrap(),
                spec.scope,
            );
        }
        let mut agents = Vec::new();
        for (spec, listener) in specs.iter().zip(listeners) {
            let id = n(spec.name);
            let mut routes = Routes::new();
            for (other, addr) in specs.iter().zip(&addrs) {
                if other.name != spec.name {
                    routes.set_direct(n(other.name), *addr);
                }
            }
            for (target, relay) in &spec.via {
                routes.set_relay(n(target), n(relay));
            }
            for target in &spec.unreachable {
                routes.remove(&n(target));
            }
            let presents = spec.presents.clone().unwrap_or_else(|| token_of(spec.name));
            let mut config = ShimConfig::new(
                Credentials {
                    node: id.clone(),
                    token: Token::new(presents).unwrap(),
                },
                spec.scope,
            );
            config.strategy = spec.strategy;
            if let Some(cap) = spec.max_remote_timeout {
                config.max_remote_timeout = cap;
            }
            if let Some(ahead) = spec.clock_ahead {
                config.wall_clock = WallClock::following_tokio(SystemTime::now() + ahead);
            }
            #[cfg(feature = "tls")]
            {
                config.tls = spec.tls.clone();
            }
            let plugins = Arc::new(FakePlugins::new(&id));
            let shim = Shim::new(
                config,
                registry.clone(),
                plugins.clone(),
                book.clone(),
                routes,
            );
            let addr = addrs[agents.len()];
            let stop = match listener {
                Some(listener) => {
                    let (tx, rx) = oneshot::channel::<()>();
                    let server = shim.clone();
                    tokio::spawn(async move {
                        server
                            .serve(listener, async {
                                let _ = rx.await;
                            })
                            .await
                    });
                    Some(tx)
                }
                None => None,
            };
            agents.push(Agent {
                id,
                shim,
                plugins,
                addr,
                _stop: stop,
            });
        }
        Cluster {
            registry,
            agents,
            _reserved: reserved,
        }
    }

    pub(crate) fn agent(&self, name: &str) -> &Agent {
        self.agents
            .iter()
            .find(|a| a.id.as_str() == name)
            .unwrap_or_else(|| panic!("no agent {name}"))
    }

    /// Registers a healthy controller instance of `ebs` on each of `nodes`.
    pub(crate) fn controllers_on(&self, nodes: &[&str]) {
        for node in nodes {
            self.registry
                .update(&n(node), &plugin(), Instance::Controller(Health::Healthy));
        }
    }

    /// Which agents' plugins saw `rpc`, by name.
    pub(crate) fn served(&self, rpc: AgentRpc) -> Vec<String> {
        self.agents
            .iter()
            .filter(|a| a.plugins.calls(rpc) > 0)
            .map(|a| a.id.to_string())
            .collect()
    }
}

pub(crate) fn capability() -> VolumeCapability {
    VolumeCapability::block(AccessMode::SingleNodeWriter)
}

pub(crate) fn secrets() -> Secrets {
    Secrets::try_from_iter([("password", "hunter2-very-secret")]).unwrap()
}

/// An attach of volume `vol` to `node`, which acts for itself.
pub(crate) fn attach(vol: &str, node: &str) -> ControllerAttach {
    ControllerAttach {
        query: ControllerQuery::new(plugin()),
        volume: VolumeId::new(vol).unwrap(),
        external_volume: ExternalVolumeId::new(format!("ext-{vol}")).unwrap(),
        node: n(node),
        plugin_node: plugin_node(node),
        capability: capability(),
        read_only: false,
        secrets: secrets(),
        volume_context: Default::default(),
    }
}

pub(crate) fn detach(vol: &str, node: &str) -> ControllerDetach {
    ControllerDetach {
        query: ControllerQuery::new(plugin()),
        volume: VolumeId::new(vol).unwrap(),
        external_volume: ExternalVolumeId::new(format!("ext-{vol}")).unwrap(),
        node: n(node),
        plugin_node: plugin_node(node),
        secrets: secrets(),
    }
}

pub(crate) fn node_detach(vol: &str, node: &str) -> NodeDetach {
    NodeDetach {
        plugin: plugin(),
        volume: VolumeId::new(vol).unwrap(),
        external_volume: ExternalVolumeId::new(format!("ext-{vol}")).unwrap(),
        node: n(node),
        workload: WorkloadId::new("alloc-1").unwrap(),
        capability: capability(),
        read_only: false,
    }
}

pub(crate) fn node_expand(vol: &str, node: &str) -> NodeExpand {
    NodeExpand {
        plugin: plugin(),
        volume: VolumeId::new(vol).unwrap(),
        external_volume: ExternalVolumeId::new(format!("ext-{vol}")).unwrap(),
        node: n(node),
        workload: WorkloadId::new("alloc-1").unwrap(),
        required_bytes: 10 << 30,
        limit_bytes: 0,
        capability: capability(),
        secrets: secrets(),
    }
}

/// Runs `fut` under the hang guard.
pub(crate) async fn guarded<F: std::future::Future>(fut: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, fut)
        .await
        .expect("hang guard: the call did not finish")
}

/// Polls `cond` until it holds, within the hang guard.
pub(crate) async fn eventually(mut cond: impl FnMut() -> bool) {
    guarded(async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// A raw client of the agent protocol to `addr`, for sending what a correct shim never would.
pub(crate) async fn raw_client(
    addr: SocketAddr,
) -> csi_rpc_shim::wire::pb::agent_client::AgentClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    csi_rpc_shim::wire::pb::agent_client::AgentClient::new(channel)
}

/// Puts credentials and a hop count on a raw request.
pub(crate) fn with_creds<T>(
    msg: T,
    node: &str,
    token: &str,
    hops: Option<u8>,
) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(CALL);
    let md = req.metadata_mut();
    md.insert_bin(
        csi_rpc_shim::auth::NODE_HEADER,
        tonic::metadata::BinaryMetadataValue::from_bytes(node.as_bytes()),
    );
    md.insert(csi_rpc_shim::auth::TOKEN_HEADER, token.parse().unwrap());
    if let Some(h) = hops {
        md.insert(
            csi_rpc_shim::auth::HOPS_HEADER,
            h.to_string().parse().unwrap(),
        );
    }
    req
}

/// Stamps a raw request with the sender's deadline `at` in wall-clock time.
pub(crate) fn stamped<T>(mut req: tonic::Request<T>, at: SystemTime) -> tonic::Request<T> {
    let millis = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    req.metadata_mut().insert(
        csi_rpc_shim::deadline::DEADLINE_HEADER,
        millis.parse().unwrap(),
    );
    req
}

/// The error detail a raw call got back.
pub(crate) fn detail(status: &tonic::Status) -> csi_rpc_shim::wire::pb::ErrorDetail {
    prost::Message::decode(status.details()).expect("status carries an error detail")
}
