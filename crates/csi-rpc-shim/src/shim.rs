//! [`Shim`]: the router. Local callers hand it a call; it serves it with this node's plugins,
//! sends it to the agent that can, or relays it once for another agent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use csi_structs::untrusted::escaped;
use csi_structs::{NodeId, PluginId};
use tokio::time::{Instant, timeout_at};

use crate::auth::{Credentials, Denied, HOPS_HEADER, Principal, Scope, TokenBook};
use crate::backend::{LocalPlugins, LocalStatus, ShimContext};
use crate::deadline::{self, DEFAULT_CLOCK_SKEW_MARGIN, WallClock};
use crate::error::{Refusal, RefusalReason, ShimError};
use crate::forward::{self, Presented};
use crate::ops::{Acting, Op, Routing};
use crate::peers::{PeerPool, Route, Routes};
use crate::registry::{NodePlugin, Registry};
use crate::request::{
    ControllerAttach, ControllerAttached, ControllerDetach, ControllerExpand, ControllerExpanded,
    ControllerValidate, CreateSnapshot, CreateVolume, CreatedVolume, DeleteSnapshot, DeleteVolume,
    ListSnapshots, ListVolumes, NodeDetach, NodeExpand, NodeExpanded, SnapshotInfo, SnapshotPage,
    Validated, VolumePage,
};
use crate::routing::{Chooser, Strategy};
use crate::wire::parse_grpc_timeout;

/// The longest timeout a local caller may ask for; longer ones are cut to it.
pub const MAX_LOCAL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// How one agent's shim behaves.
#[derive(Clone, Debug)]
pub struct ShimConfig {
    /// This agent's node id and token, sent on every call it makes.
    pub credentials: Credentials,
    /// What this agent's own callers may do (the same rules remote callers face).
    pub scope: Scope,
    /// How controller instances are ordered.
    pub strategy: Strategy,
    /// The longest a call received from another agent may run, whatever its `grpc-timeout`
    /// says (and the limit when it sends none), counted from its arrival: [`Shim::serve`]
    /// also ends a call whose request never finishes arriving by then. Default 5 minutes.
    pub max_remote_timeout: Duration,
    /// How long dialling another agent may take. Default 5 seconds; every call is also bounded
    /// by its deadline.
    pub connect_timeout: Duration,
    /// How far this agent's wall clock may lag the senders' (see [`deadline`]). A call
    /// received from another agent carries its sender's deadline as wall-clock time; it is
    /// refused, before any plugin call, when `now + clock_skew_margin >= deadline` by
    /// [`wall_clock`](Self::wall_clock), and the plugin call gets no more than
    /// `deadline - (now + clock_skew_margin)`. Default
    /// [`DEFAULT_CLOCK_SKEW_MARGIN`] (250 ms); the agents' clocks must agree within it.
    pub clock_skew_margin: Duration,
    /// The wall clock that deadlines are stamped and checked with. Default the system clock;
    /// a simulation or a test gives [`WallClock::following_tokio`].
    pub wall_clock: WallClock,
    /// TLS for agent links (feature `tls`; default none: plain HTTP/2). With it the shim dials
    /// `https://` and [`Shim::serve`] accepts TLS only. See
    /// [`TlsConfig::from_pem`](crate::TlsConfig::from_pem).
    #[cfg(feature = "tls")]
    pub tls: Option<crate::tls::TlsConfig>,
}

impl ShimConfig {
    /// Defaults for an agent with these credentials and scope: sticky controller choice,
    /// 5 minute cap on remote calls, 5 second connect timeout, 250 ms clock-skew margin on
    /// the system clock.
    pub fn new(credentials: Credentials, scope: Scope) -> Self {
        Self {
            credentials,
            scope,
            strategy: Strategy::Sticky,
            max_remote_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(5),
            clock_skew_margin: DEFAULT_CLOCK_SKEW_MARGIN,
            wall_clock: WallClock::system(),
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// Counters of what a shim did, for tests, metrics and the hop-cost benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShimStats {
    /// Calls received from other agents (authenticated or not).
    pub received: u64,
    /// Calls served by this node's plugins (from local callers or other agents).
    pub served_here: u64,
    /// Calls this agent sent to another agent for its own callers.
    pub sent: u64,
    /// Calls received from another agent and relayed to a third.
    pub relayed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    served_here: AtomicU64,
    sent: AtomicU64,
    relayed: AtomicU64,
}

/// `deadline`, or `left` from now when that is sooner (a stamp far in the future cannot
/// overflow the clock).
fn within(deadline: Instant, left: Duration) -> Instant {
    Instant::now()
        .checked_add(left)
        .map_or(deadline, |stamped| deadline.min(stamped))
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Inner {
    me: NodeId,
    own: Presented,
    scope: Scope,
    max_remote_timeout: Duration,
    clock_skew_margin: Duration,
    wall_clock: WallClock,
    registry: Arc<Registry>,
    plugins: Arc<dyn LocalPlugins>,
    routes: RwLock<Routes>,
    tokens: RwLock<TokenBook>,
    pool: PeerPool,
    chooser: Chooser,
    counters: Counters,
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::TlsConfig>,
}

/// One agent's router for CSI calls. Cheap to clone (one `Arc`).
///
/// Outgoing: call the method for the operation ([`Shim::controller_attach`],
/// [`Shim::node_detach`], …) with a timeout. Incoming: serve [`Shim::agent_service`] (or call
/// [`Shim::serve`]) so other agents can reach this node's plugins.
#[derive(Clone)]
pub struct Shim {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Shim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shim")
            .field("node", &self.inner.me)
            .field("scope", &self.inner.scope)
            .finish_non_exhaustive()
    }
}

impl Shim {
    /// A shim for the agent described by `config`, serving calls with `plugins`, choosing
    /// targets from `registry`, reaching peers through `routes` and accepting callers listed
    /// in `tokens`.
    pub fn new(
        config: ShimConfig,
        registry: Arc<Registry>,
        plugins: Arc<dyn LocalPlugins>,
        tokens: TokenBook,
        routes: Routes,
    ) -> Self {
        let own = Presented {
            node: config.credentials.node.as_str().to_owned(),
            token: config.credentials.token.expose().to_owned(),
        };
        Self {
            inner: Arc::new(Inner {
                me: config.credentials.node.clone(),
                own,
                scope: config.scope,
                max_remote_timeout: config.max_remote_timeout,
                clock_skew_margin: config.clock_skew_margin,
                wall_clock: config.wall_clock,
                registry,
                plugins,
                routes: RwLock::new(routes),
                tokens: RwLock::new(tokens),
                pool: PeerPool::new(
                    config.connect_timeout,
                    #[cfg(feature = "tls")]
                    config.tls.clone(),
                ),
                chooser: Chooser::new(config.strategy),
                counters: Counters::default(),
                #[cfg(feature = "tls")]
                tls: config.tls,
            }),
        }
    }

    /// This agent's node id.
    pub fn node_id(&self) -> &NodeId {
        &self.inner.me
    }

    /// The registry the shim routes by.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.inner.registry
    }

    /// Changes the routes (a node joined, moved or left).
    pub fn update_routes(&self, change: impl FnOnce(&mut Routes)) {
        change(
            &mut self
                .inner
                .routes
                .write()
                .unwrap_or_else(PoisonError::into_inner),
        );
    }

    /// Changes who may call this agent (a token rotated, a node left).
    pub fn update_tokens(&self, change: impl FnOnce(&mut TokenBook)) {
        change(
            &mut self
                .inner
                .tokens
                .write()
                .unwrap_or_else(PoisonError::into_inner),
        );
    }

    /// What the shim has done so far.
    pub fn stats(&self) -> ShimStats {
        let c = &self.inner.counters;
        ShimStats {
            received: c.received.load(Ordering::Relaxed),
            served_here: c.served_here.load(Ordering::Relaxed),
            sent: c.sent.load(Ordering::Relaxed),
            relayed: c.relayed.load(Ordering::Relaxed),
        }
    }

    #[cfg(feature = "tls")]
    pub(crate) fn tls(&self) -> Option<&crate::tls::TlsConfig> {
        self.inner.tls.as_ref()
    }

    pub(crate) fn max_remote_timeout(&self) -> Duration {
        self.inner.max_remote_timeout
    }

    pub(crate) fn max_message_bytes(&self) -> usize {
        crate::wire::MAX_MESSAGE_BYTES
    }

    // ---- outgoing ---------------------------------------------------------------------------

    /// Runs a call for a local caller, within `timeout`.
    async fn call<O: Op>(&self, op: O, timeout: Duration) -> Result<O::Output, ShimError> {
        let deadline = Instant::now() + timeout.min(MAX_LOCAL_TIMEOUT);
        let me = &self.inner.me;
        op.check(me)
            .map_err(|error| ShimError::InvalidRequest { rpc: O::RPC, error })?;
        let principal = Principal {
            node: me.clone(),
            scope: self.inner.scope,
        };
        self.authorize(&principal, &op)?;
        match op.routing() {
            Routing::Node { plugin, node } => {
                let (plugin, node) = (plugin.clone(), node.clone());
                self.node_call(op, plugin, node, deadline).await
            }
            Routing::Controller { query, key } => {
                let plugin = query.plugin.clone();
                let preferred = query.preferred_node.clone();
                let key = key.to_owned();
                self.controller_call(op, plugin, &key, preferred.as_ref(), deadline)
                    .await
            }
        }
    }

    async fn node_call<O: Op>(
        &self,
        op: O,
        plugin: PluginId,
        node: NodeId,
        deadline: Instant,
    ) -> Result<O::Output, ShimError> {
        let rpc = O::RPC;
        let service = rpc.service();
        match self.inner.registry.node_plugin(&node, &plugin) {
            NodePlugin::Ready { .. } => {}
            NodePlugin::NodeGone => return Err(ShimError::NodeGone { rpc, node }),
            NodePlugin::UnknownNode => return Err(ShimError::UnknownNode { rpc, node }),
            NodePlugin::NodeDown => return Err(ShimError::NodeDown { rpc, node }),
            NodePlugin::Missing => {
                return Err(ShimError::PluginMissing {
                    rpc,
                    plugin,
                    node,
                    service,
                });
            }
            // Health is advice for a release step: it is sent whatever the last probe said.
            NodePlugin::Unhealthy { reason } if O::RELEASE_STEP => {
                tracing::debug!(rpc = %rpc, %plugin, %node, reason = %escaped(&reason), "node plugin reported unhealthy; the release step is sent anyway");
            }
            NodePlugin::Unhealthy { reason } => {
                return Err(ShimError::PluginUnhealthy {
                    rpc,
                    plugin,
                    node,
                    service,
                    reason,
                });
            }
        }
        self.attempt_until(op, &plugin, &node, deadline).await
    }

    async fn controller_call<O: Op>(
        &self,
        op: O,
        plugin: PluginId,
        key: &str,
        preferred: Option<&NodeId>,
        deadline: Instant,
    ) -> Result<O::Output, ShimError> {
        let view = self.inner.registry.controllers(&plugin);
        let mut refusals = view.refused;
        let mut order = self.inner.chooser.order(key, view.ready, preferred);
        if O::RELEASE_STEP {
            // Health is advice for a release step: the instances reported unhealthy are
            // tried too, after the healthy ones.
            let (unhealthy, rest): (Vec<Refusal>, Vec<Refusal>) = refusals
                .into_iter()
                .partition(|r| matches!(r.reason, RefusalReason::Unhealthy { .. }));
            refusals = rest;
            order.extend(unhealthy.into_iter().map(|r| r.node));
        }
        let mut maybe_sent = false;
        for node in order {
            match self
                .attempt_until(op.clone(), &plugin, &node, deadline)
                .await
            {
                Ok(out) => return Ok(out),
                Err(e) => match e.as_refusal() {
                    Some((reason, sent)) => {
                        tracing::debug!(rpc = %O::RPC, %node, %reason, "controller refused; failing over");
                        maybe_sent |= sent;
                        refusals.push(Refusal { node, reason });
                    }
                    None => return Err(e),
                },
            }
        }
        Err(ShimError::NoController {
            rpc: O::RPC,
            plugin,
            refusals,
            maybe_sent,
        })
    }

    /// One attempt at `target`, bounded by `deadline`.
    async fn attempt_until<O: Op>(
        &self,
        op: O,
        plugin: &PluginId,
        target: &NodeId,
        deadline: Instant,
    ) -> Result<O::Output, ShimError> {
        match timeout_at(deadline, self.attempt(op, plugin, target, deadline)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(ShimError::DeadlineExceeded {
                rpc: O::RPC,
                node: Some(target.clone()),
            }),
        }
    }

    async fn attempt<O: Op>(
        &self,
        op: O,
        plugin: &PluginId,
        target: &NodeId,
        deadline: Instant,
    ) -> Result<O::Output, ShimError> {
        let me = &self.inner.me;
        let route = self
            .inner
            .routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .resolve(me, target);
        let (sent_to, addr) = match route {
            Route::Local => {
                let ctx = ShimContext {
                    deadline,
                    origin: me.clone(),
                    hops: 0,
                };
                return self.serve_here(op, ctx, None).await;
            }
            Route::Direct(addr) => (target.clone(), addr),
            Route::Via { relay, addr } => (relay, addr),
            Route::None => {
                return Err(ShimError::NoRoute {
                    rpc: O::RPC,
                    node: target.clone(),
                });
            }
        };
        let Some(channel) = self.inner.pool.channel(addr) else {
            return Err(ShimError::PeerUnreachable {
                rpc: O::RPC,
                node: sent_to,
            });
        };
        bump(&self.inner.counters.sent);
        let wire = op.to_wire(target);
        let stamp = self.inner.wall_clock.at(deadline);
        match forward::unary::<O>(channel, wire, &self.inner.own, 0, deadline, Some(stamp)).await {
            Ok(out) => O::output_from_wire(out).map_err(|e| ShimError::Protocol {
                rpc: O::RPC,
                node: sent_to,
                problem: crate::error::ProtocolProblem::BadResponse(e),
            }),
            Err(status) => Err(forward::classify(
                O::RPC,
                plugin,
                &sent_to,
                target,
                &status,
                deadline,
            )),
        }
    }

    /// Serves a call with this node's plugins. `stamp` is the sender's deadline in wall-clock
    /// time when another agent sent one: checked last thing before the plugin call, which
    /// never gets a call whose sender's deadline has passed, nor more than the time left.
    async fn serve_here<O: Op>(
        &self,
        op: O,
        mut ctx: ShimContext,
        stamp: Option<SystemTime>,
    ) -> Result<O::Output, ShimError> {
        let rpc = O::RPC;
        let service = rpc.service();
        let me = &self.inner.me;
        let plugin = op.routing().plugin().clone();
        match self.inner.plugins.status(&plugin, service) {
            LocalStatus::Healthy => {}
            // Health is advice for a release step: it is sent whatever the last probe said.
            LocalStatus::Unhealthy { reason } if O::RELEASE_STEP => {
                tracing::debug!(rpc = %rpc, %plugin, reason = %escaped(&reason), "plugin reported unhealthy here; the release step is served anyway");
            }
            LocalStatus::Missing => {
                return Err(ShimError::PluginMissing {
                    rpc,
                    plugin,
                    node: me.clone(),
                    service,
                });
            }
            LocalStatus::Unhealthy { reason } => {
                return Err(ShimError::PluginUnhealthy {
                    rpc,
                    plugin,
                    node: me.clone(),
                    service,
                    reason,
                });
            }
        }
        if let Some(stamp) = stamp {
            let left = self.time_left(&op, &ctx.origin, stamp)?;
            ctx.deadline = within(ctx.deadline, left);
        }
        bump(&self.inner.counters.served_here);
        op.serve(&*self.inner.plugins, &ctx)
            .await
            .map_err(|error| ShimError::Plugin {
                rpc,
                node: me.clone(),
                error,
            })
    }

    /// The time a call received with the stamped deadline `stamp` may still take here: until
    /// `stamp`, less the clock-skew margin, by this agent's wall clock. When none is left the
    /// call is refused as [`ShimError::DeadlineExceeded`] (the class the sender gives its own
    /// deadline passing) and the refusal is logged with the call, the volume, the sender
    /// (`origin`) and how late it is.
    fn time_left<O: Op>(
        &self,
        op: &O,
        origin: &NodeId,
        stamp: SystemTime,
    ) -> Result<Duration, ShimError> {
        let now = self.inner.wall_clock.now();
        let margin = self.inner.clock_skew_margin;
        let line = now.checked_add(margin).unwrap_or(now);
        match stamp.duration_since(line) {
            Ok(left) if !left.is_zero() => Ok(left),
            _ => {
                tracing::warn!(
                    rpc = %O::RPC,
                    volume = op.volume().map_or("-", |v| v.as_str()),
                    origin = %origin,
                    late_ms = deadline::late_millis(now, stamp),
                    margin_ms = margin.as_millis(),
                    "refused a call received after its sender's deadline (late_ms below 0: \
                     within the clock-skew margin); the plugin was not called"
                );
                Err(ShimError::DeadlineExceeded {
                    rpc: O::RPC,
                    node: Some(self.inner.me.clone()),
                })
            }
        }
    }

    fn authorize<O: Op>(&self, who: &Principal, op: &O) -> Result<(), ShimError> {
        let denied = |denied| ShimError::Denied {
            rpc: O::RPC,
            denied,
        };
        if who.scope == Scope::Cluster {
            return Ok(());
        }
        match op.acting() {
            Acting::ReadOnly => Ok(()),
            Acting::ClusterWide => Err(denied(Denied::ClusterOnly {
                caller: who.node.clone(),
            })),
            Acting::ForNode {
                node,
                plugin,
                plugin_node,
            } => {
                if *node != who.node {
                    return Err(denied(Denied::OtherNode {
                        caller: who.node.clone(),
                        subject: node.clone(),
                    }));
                }
                if let Some(claimed) = plugin_node {
                    let own = self.inner.registry.plugin_node_id(node, plugin);
                    if own.as_ref() != Some(claimed) {
                        return Err(denied(Denied::OtherPluginNode {
                            caller: who.node.clone(),
                        }));
                    }
                }
                Ok(())
            }
        }
    }

    // ---- incoming ---------------------------------------------------------------------------

    /// Serves one call received from another agent.
    pub(crate) async fn serve_remote<O: Op>(
        &self,
        request: tonic::Request<O::Wire>,
    ) -> Result<tonic::Response<O::WireOut>, tonic::Status> {
        bump(&self.inner.counters.received);
        let me = &self.inner.me;
        let received = Instant::now();
        let md = request.metadata();
        let timeout = md
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .map_or(self.inner.max_remote_timeout, |t| {
                t.min(self.inner.max_remote_timeout)
            });
        let deadline = received + timeout;
        let fail = |e: ShimError| e.to_status(me);

        let unauthenticated = || {
            fail(ShimError::Unauthenticated {
                rpc: O::RPC,
                node: me.clone(),
            })
        };
        let presented = Presented::from_metadata(md).ok_or_else(unauthenticated)?;
        let principal = self
            .inner
            .tokens
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .authenticate(&presented.node, &presented.token)
            .ok_or_else(unauthenticated)?;
        // A hop count that does not parse is treated as "already relayed": never forwarded.
        let hops: u8 = match md.get(HOPS_HEADER) {
            None => 0,
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(u8::MAX),
        };
        // The sender's deadline in wall-clock time: none from an agent that predates it (the
        // `grpc-timeout` alone bounds the call then); one that does not parse is refused.
        let stamp = deadline::from_metadata(md).map_err(|e| {
            tracing::debug!(rpc = %O::RPC, origin = %principal.node, error = %e, "agent call refused");
            fail(ShimError::Rejected {
                rpc: O::RPC,
                node: me.clone(),
                violations: vec![crate::wire::cap_message(e.to_string())],
            })
        })?;
        let (op, target) = O::from_wire(request.into_inner())
            .map_err(|error| fail(ShimError::InvalidRequest { rpc: O::RPC, error }))?;
        self.authorize(&principal, &op).map_err(fail)?;
        tracing::debug!(rpc = %O::RPC, origin = %principal.node, %target, hops, "agent call received");

        let work = async {
            if target == *me {
                let ctx = ShimContext {
                    deadline,
                    origin: principal.node.clone(),
                    hops,
                };
                return self
                    .serve_here(op, ctx, stamp)
                    .await
                    .map(O::output_to_wire)
                    .map_err(fail);
            }
            if hops >= 1 {
                return Err(fail(ShimError::HopLimit {
                    rpc: O::RPC,
                    node: me.clone(),
                }));
            }
            let addr = self
                .inner
                .routes
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .direct(&target);
            let Some(channel) = addr.and_then(|a| self.inner.pool.channel(a)) else {
                return Err(fail(ShimError::NoRoute {
                    rpc: O::RPC,
                    node: target.clone(),
                }));
            };
            // A call past its sender's deadline goes no further; one with time left is passed
            // on with the sender's stamp, or, from a sender without one, with this agent's.
            let (deadline, stamp) = match stamp {
                Some(stamp) => {
                    let left = self.time_left(&op, &principal.node, stamp).map_err(fail)?;
                    (within(deadline, left), stamp)
                }
                None => (deadline, self.inner.wall_clock.at(deadline)),
            };
            bump(&self.inner.counters.relayed);
            let plugin = op.routing().plugin().clone();
            let wire = op.to_wire(&target);
            forward::unary::<O>(channel, wire, &presented, hops + 1, deadline, Some(stamp))
                .await
                .map_err(|status| {
                    if status.details().is_empty() {
                        fail(forward::classify(
                            O::RPC,
                            &plugin,
                            &target,
                            &target,
                            &status,
                            deadline,
                        ))
                    } else {
                        // The target's own answer: pass it back unchanged.
                        tonic::Status::with_details(
                            status.code(),
                            status.message(),
                            status.details().to_vec().into(),
                        )
                    }
                })
        };
        match timeout_at(deadline, work).await {
            Ok(result) => result.map(tonic::Response::new),
            Err(_elapsed) => Err(fail(ShimError::DeadlineExceeded {
                rpc: O::RPC,
                node: Some(target),
            })),
        }
    }
}

macro_rules! calls {
    ($($(#[$doc:meta])* $method:ident($req:ty) -> $out:ty;)*) => {
        impl Shim {
            $(
                $(#[$doc])*
                ///
                /// # Errors
                ///
                /// A [`ShimError`] naming the call, the node and the reason; read
                /// [`ShimError::class`] to decide what to do.
                pub async fn $method(&self, request: $req, timeout: Duration) -> Result<$out, ShimError> {
                    self.call(request, timeout).await
                }
            )*
        }
    };
}

calls! {
    /// Attaches a volume to a node through a controller instance of the plugin, failing over
    /// to the next instance on "retry elsewhere" or `UNAVAILABLE`.
    controller_attach(ControllerAttach) -> ControllerAttached;
    /// Detaches a volume from a node through a controller instance, with failover.
    controller_detach(ControllerDetach) -> ();
    /// Validates capabilities through a controller instance, with failover.
    controller_validate(ControllerValidate) -> Validated;
    /// Creates a volume through a controller instance, with failover. Cluster scope only.
    create_volume(CreateVolume) -> CreatedVolume;
    /// Deletes a volume through a controller instance, with failover. Cluster scope only.
    delete_volume(DeleteVolume) -> ();
    /// Expands a volume through a controller instance, with failover. Cluster scope only.
    controller_expand(ControllerExpand) -> ControllerExpanded;
    /// Lists one page of volumes through a controller instance, with failover.
    list_volumes(ListVolumes) -> VolumePage;
    /// Creates a snapshot through a controller instance, with failover. Cluster scope only.
    create_snapshot(CreateSnapshot) -> SnapshotInfo;
    /// Deletes a snapshot through a controller instance, with failover. Cluster scope only.
    delete_snapshot(DeleteSnapshot) -> ();
    /// Lists one page of snapshots through a controller instance, with failover.
    list_snapshots(ListSnapshots) -> SnapshotPage;
    /// Unpublishes then unstages a volume on the node that owns it, and only there.
    /// A node that left the cluster answers [`ShimError::NodeGone`].
    node_detach(NodeDetach) -> ();
    /// Expands a volume's filesystem on the node that uses it, and only there.
    node_expand(NodeExpand) -> NodeExpanded;
}
