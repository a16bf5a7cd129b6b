//! [`CsiClient`]: one plugin endpoint, one connection (a few under load), every service
//! client.

use std::sync::Arc;
use std::time::Duration;

use crate::budget::RetryBudget;
use crate::call::Caller;
use crate::channel::{LayerStack, PluginChannel};
use crate::connection::{ConnectOptions, Connection};
use crate::controller::ControllerClient;
use crate::endpoint::{Endpoint, EndpointError};
use crate::error::Error;
use crate::fingerprint::{self, Fingerprint};
use crate::group_controller::GroupControllerClient;
use crate::health::HealthWatcher;
use crate::identity::IdentityClient;
use crate::inflight::CallsInFlight;
use crate::node::NodeClient;
use crate::observe::CallObserver;
use crate::policy::{PolicyTable, RpcPolicy};
use crate::snapshot_metadata::SnapshotMetadataClient;
use crate::turns::VolumeTurns;

/// A client of one CSI plugin: hands out the per-service clients, all sharing one lazily
/// dialled connection (more under load, at most four), one policy table,
/// one retry budget and one observer. Cheap to clone.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use csi_client::CsiClient;
///
/// let client = CsiClient::builder("unix:///run/csi/plugin.sock".parse()?).build();
/// let info = client.identity().get_plugin_info().await?;
/// println!("{} {}", info.name, info.vendor_version);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct CsiClient {
    caller: Caller,
}

impl CsiClient {
    /// A builder for a client of `endpoint`.
    pub fn builder(endpoint: Endpoint) -> CsiClientBuilder {
        CsiClientBuilder {
            endpoint,
            connect: ConnectOptions::DEFAULT,
            policies: PolicyTable::default(),
            budget: None,
            observer: None,
            layers: None,
            turns: None,
            calls: None,
        }
    }

    /// A client of `endpoint` with every default. Dials nothing until the first call.
    pub fn new(endpoint: Endpoint) -> Self {
        Self::builder(endpoint).build()
    }

    /// A client of the endpoint in `CSI_ENDPOINT`, with every default.
    ///
    /// # Errors
    ///
    /// The variable is unset or malformed.
    pub fn from_env() -> Result<Self, EndpointError> {
        Ok(Self::new(Endpoint::from_env()?))
    }

    /// The Identity service.
    pub fn identity(&self) -> IdentityClient {
        IdentityClient::new(self.caller.clone())
    }

    /// The Controller service.
    pub fn controller(&self) -> ControllerClient {
        ControllerClient::new(self.caller.clone())
    }

    /// The Node service.
    pub fn node(&self) -> NodeClient {
        NodeClient::new(self.caller.clone())
    }

    /// The GroupController service.
    pub fn group_controller(&self) -> GroupControllerClient {
        GroupControllerClient::new(self.caller.clone())
    }

    /// The SnapshotMetadata service (alpha).
    pub fn snapshot_metadata(&self) -> SnapshotMetadataClient {
        SnapshotMetadataClient::new(self.caller.clone())
    }

    /// The shared connection.
    pub fn connection(&self) -> &Connection {
        self.caller.connection()
    }

    /// The policy table this client runs under.
    pub fn policies(&self) -> &PolicyTable {
        self.caller.policies()
    }

    /// The retry budget shared by this client's calls.
    pub fn retry_budget(&self) -> &Arc<RetryBudget> {
        self.caller.budget()
    }

    /// The volumes' turns this client's calls take: at most one call in flight per volume
    /// (see [`VolumeTurns`]).
    pub fn volume_turns(&self) -> &Arc<VolumeTurns> {
        self.caller.turns()
    }

    /// The calls in flight of this client (and of every client sharing its list): what each
    /// waits on and since when (see [`CallsInFlight`]).
    pub fn calls_in_flight(&self) -> &Arc<CallsInFlight> {
        self.caller.calls()
    }

    /// Gathers plugin info, plugin/controller/group-controller/node capabilities and node
    /// info into one value (see [`Fingerprint`]).
    ///
    /// # Errors
    ///
    /// The first call that fails, except UNIMPLEMENTED on the node calls (a controller-only
    /// plugin), which leaves the node part empty.
    pub async fn fingerprint(&self) -> Result<Fingerprint, Error> {
        fingerprint::gather(self).await
    }

    /// Starts a health watcher probing every `interval` (see [`HealthWatcher`]).
    /// Must be called within a tokio runtime.
    pub fn watch_health(&self, interval: Duration) -> HealthWatcher {
        HealthWatcher::spawn(self.identity(), self.connection().clone(), interval)
    }
}

/// Configures a [`CsiClient`].
#[derive(Debug)]
pub struct CsiClientBuilder {
    endpoint: Endpoint,
    connect: ConnectOptions,
    policies: PolicyTable,
    budget: Option<Arc<RetryBudget>>,
    observer: Option<Arc<dyn CallObserver>>,
    layers: Option<LayerStack>,
    turns: Option<Arc<VolumeTurns>>,
    calls: Option<Arc<CallsInFlight>>,
}

impl CsiClientBuilder {
    /// How the connection dials (socket wait, backoff, keep-alive).
    #[must_use]
    pub fn connect_options(mut self, options: ConnectOptions) -> Self {
        self.connect = options;
        self
    }

    /// Replaces the whole policy table.
    #[must_use]
    pub fn policies(mut self, policies: PolicyTable) -> Self {
        self.policies = policies;
        self
    }

    /// Changes the policy of one RPC.
    #[must_use]
    pub fn policy(mut self, rpc: csi_proto::Rpc, change: impl FnOnce(&mut RpcPolicy)) -> Self {
        self.policies.update(rpc, change);
        self
    }

    /// Shares a retry budget (for example one per plugin across several clients).
    #[must_use]
    pub fn retry_budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Shares the volumes' turns with other clients of the same plugin, so that at most one
    /// call per volume is in flight across all of them (see [`VolumeTurns`]). Without it, the
    /// client and its clones have turns of their own.
    #[must_use]
    pub fn volume_turns(mut self, turns: Arc<VolumeTurns>) -> Self {
        self.turns = Some(turns);
        self
    }

    /// Lists this client's calls in flight in `calls`, which other clients may share (one
    /// list for every plugin, say), so that an embedder can show what a long call waits on.
    /// Without it, the client and its clones have a list of their own.
    #[must_use]
    pub fn calls_in_flight(mut self, calls: Arc<CallsInFlight>) -> Self {
        self.calls = Some(calls);
        self
    }

    /// Receives an event per attempt and per call, for metrics.
    #[must_use]
    pub fn observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Wraps the shared HTTP/2 channel in a tower [`Layer`](tower::Layer), for metrics,
    /// logging or anything else that works per HTTP request.
    ///
    /// The layer wraps a [`PluginChannel`] and must give back a cloneable, `Send + Sync`
    /// service of `http::Request<tonic::body::Body>` answering
    /// `http::Response<tonic::body::Body>`; its errors must convert into
    /// [`tower::BoxError`] and should pass through unchanged (the client tells a lost
    /// connection or its own deadline from a plugin's answer by the error types).
    ///
    /// The stack is built once per connection, after the first dial, and shared by all
    /// service clients. Each call of `layer` wraps what was added before: the last layer
    /// added is the outermost. A layer sees every *attempt* (a retried call passes through it
    /// once per attempt), below the retry loop and above reconnects; attempts that fail
    /// before the first connection exists do not reach it. For per-call events with the
    /// client's error classes, use [`observer`](Self::observer) instead.
    ///
    /// See [`metrics::MetricsLayer`](crate::metrics::MetricsLayer) for a ready-made one.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use csi_client::CsiClient;
    /// use csi_client::metrics::{InMemoryMetrics, MetricsLayer};
    ///
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let metrics = Arc::new(InMemoryMetrics::new());
    /// let client = CsiClient::builder("unix:///run/csi/plugin.sock".parse()?)
    ///     .layer(MetricsLayer::new(metrics.clone()))
    ///     .build();
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: tower::Layer<PluginChannel> + Send + Sync + 'static,
        L::Service: tower::Service<
                http::Request<tonic::body::Body>,
                Response = http::Response<tonic::body::Body>,
            > + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Error:
            Into<tower::BoxError>,
        <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Future: Send + 'static,
    {
        self.layers = Some(LayerStack::push(self.layers.take(), layer));
        self
    }

    /// Builds the client. Dials nothing.
    pub fn build(self) -> CsiClient {
        let connection = Connection::layered(self.endpoint, self.connect, self.layers);
        CsiClient {
            caller: Caller::new(
                connection,
                self.policies,
                self.budget.unwrap_or_default(),
                self.observer,
                self.turns.unwrap_or_default(),
                self.calls.unwrap_or_default(),
            ),
        }
    }
}
