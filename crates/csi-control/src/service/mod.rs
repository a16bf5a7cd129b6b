//! The volume service: the operations an orchestrator's control plane runs on volumes,
//! over the [catalog](crate::catalog), the claim driver, csi-rpc-shim's [`Shim`] and this
//! node's plugin and volume managers.
//!
//! | operation | what it does |
//! |---|---|
//! | [`register_volume`](VolumeService::register_volume) | records an existing volume, validated against its plugin's controller when one is known |
//! | [`create`](VolumeService::create) | `CreateVolume` through a controller (here or on a peer), an uncertain outcome undone before the answer |
//! | [`claim`](VolumeService::claim) | a durable claim (waiting for releasing claims in its way), then controller publish through the shim when the node has none, then stage and publish here |
//! | [`release`](VolumeService::release) | starts a claim's release (the release pipeline runs its steps) |
//! | [`expand`](VolumeService::expand) | `ControllerExpandVolume`, then `NodeExpandVolume` where the volume is published |
//! | [`create_snapshot`](VolumeService::create_snapshot), [`list_snapshots`](VolumeService::list_snapshots), [`delete_snapshot`](VolumeService::delete_snapshot) | snapshots of a volume, or of a plugin |
//! | [`detach`](VolumeService::detach) | releases every claim of a volume on one node, which may be gone for good |
//! | [`deregister_volume`](VolumeService::deregister_volume) | forgets a volume without calling its plugin, saying what stays behind |
//! | [`delete`](VolumeService::delete) | `DeleteVolume` (when the orchestrator created it) and out of the catalog |
//! | [`reconcile_node`](VolumeService::reconcile_node) | after a restart, confirms the node's usage records with their plugins, and releases those of claims let go while the node was reported gone |
//! | [`blocked_releases`](VolumeService::blocked_releases) | the releases waiting for something that is not there (a node that is down), followed over time by [`ReleaseWaits`] |
//!
//! Each operation checks its request against the volume, the catalog and the plugin's
//! advertised capabilities before any plugin call, and fails with a [`ServiceError`] that
//! names the field, the plugin or the state in the way. What it did is also sent as a
//! [`ServiceEvent`] to every [`subscribe`](VolumeService::subscribe)r.
//!
//! Capabilities come from this node's fingerprints first, then from what [`Peers`] report
//! (a cluster's other nodes); without peers, only local plugins are known.
//!
//! # Dropping the future
//!
//! Dropping the future of an operation does not cancel the operation. Each operation that
//! changes something (register, create, claim, release, expand, snapshot creation and
//! deletion, detach, deregister, delete) runs in a Tokio task of its own, and the future only
//! waits for its answer: an HTTP client that times out, or a `select!` that takes another
//! branch, leaves the operation running to its end, or to its undo, exactly as if it had been
//! awaited. A claim whose caller left while `NodeStageVolume` hung is staged and published
//! once the plugin answers, or released and undone if the plugin fails it: never taken with
//! nothing mounted. The operation then logs one line naming it, its volume, that its caller
//! hung up, and how it ended.
//!
//! To learn how it ended, ask again or read the outcome ([`volume`](VolumeService::volume),
//! the [`ServiceEvent`]s of [`subscribe`](VolumeService::subscribe)). Asking again is safe: a
//! claim asked again answers the same claim and target path, a release of a claim already
//! freed answers that there is no such claim, a create of an id that exists now answers that
//! it is taken. [`wait_idle`](VolumeService::wait_idle) waits until no operation runs, those
//! whose callers left included. The reads ([`list_external`](VolumeService::list_external),
//! [`list_snapshots`](VolumeService::list_snapshots)) are plain futures, and so is
//! [`reconcile_node`](VolumeService::reconcile_node), which its caller may stop (a control
//! plane closing does).

mod claim;
mod create;
mod error;
mod events;
mod expand;
mod forget;
mod reconcile;
mod run;
mod snapshots;
mod waits;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use csi_claims::driver::ClaimsHandle;
use csi_claims::store::{ClaimStore, Forgetting};
use csi_claims::{Claim, ReleaseStatus, StoreError};
use csi_node::plugins::PluginManager;
use csi_node::volumes::VolumeManager;
use csi_rpc_shim::Shim;
use csi_structs::{Capabilities, NodeId, PluginId, VolumeId};
use tokio::sync::{broadcast, watch};

use crate::catalog::{CatalogEntry, VolumeCatalog};

pub use claim::{ClaimVolume, Claimed, DetachVolume, Detached};
pub use create::{NewVolume, NewVolumeSource, RegisterVolume};
pub use error::{CallFailure, ServiceError};
pub use events::{ReleaseStepFailed, ServiceEvent};
pub use expand::Expanded;
pub use forget::{Deregistered, Leftover};
pub use reconcile::{NodeReconciled, ReleasedWhileGone, WhileGone};
pub use snapshots::{ExternalVolume, NewSnapshot, Snapshot, SnapshotsOf};
pub use waits::{BlockedOn, BlockedRelease, ReleaseWaits};

use error::{invalid, no_volume};

/// A plugin as another node reported it (its fingerprint, in short).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerPlugin {
    /// The node it runs on.
    pub node: NodeId,
    /// The plugin.
    pub plugin: PluginId,
    /// Whether it serves the controller service there.
    pub controller: bool,
    /// Whether it serves the node service there.
    pub node_service: bool,
    /// Whether its volumes need `ControllerPublishVolume`.
    pub controller_publish: bool,
    /// What it advertises, when the peer said.
    pub capabilities: Option<Capabilities>,
}

/// What the service learns from the other nodes of a cluster.
///
/// [`NoPeers`] is a node on its own. An orchestrator with peers implements it over whatever
/// it keeps of them (the reference agent: its peers' last reports and the cluster's members).
#[async_trait::async_trait]
pub trait Peers: std::fmt::Debug + Send + Sync {
    /// The plugins other nodes reported.
    fn plugins(&self) -> Vec<PeerPlugin>;

    /// Whether `node`'s agent answers now (`None`: not known).
    fn reachable(&self, node: &NodeId) -> Option<bool>;

    /// Whether the claims of every node are in one shared store (a cluster), so a node's
    /// claims can be released from any other. Without it each node keeps its own.
    fn shares_claims(&self) -> bool;

    /// Reports `node` gone for good to every node, whose drivers then skip its node steps.
    /// `Ok(false)`: there is no one to tell, and the service tells its own driver.
    ///
    /// # Errors
    ///
    /// When the shared store cannot be written.
    async fn report_node_gone(&self, node: &NodeId) -> Result<bool, StoreError>;
}

/// A node on its own: no peers, claims kept per node.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPeers;

#[async_trait::async_trait]
impl Peers for NoPeers {
    fn plugins(&self) -> Vec<PeerPlugin> {
        Vec::new()
    }

    fn reachable(&self, _: &NodeId) -> Option<bool> {
        None
    }

    fn shares_claims(&self) -> bool {
        false
    }

    async fn report_node_gone(&self, _: &NodeId) -> Result<bool, StoreError> {
        Ok(false)
    }
}

/// The control plane's volume operations on one node (module docs: [`self`]).
///
/// Cheap to share behind an `Arc`; every operation takes `&self`. An operation that changes
/// something runs to its end even when the future it returned is dropped (module docs:
/// [Dropping the future](self#dropping-the-future)).
#[derive(Debug)]
pub struct VolumeService {
    inner: Arc<Inner>,
}

/// What every handle of one service shares: a task running an operation to its end holds
/// one ([`VolumeService::to_the_end`]).
#[derive(Debug)]
struct Inner {
    me: NodeId,
    catalog: Arc<dyn VolumeCatalog>,
    claims: ClaimsHandle,
    shim: Shim,
    plugins: PluginManager,
    volumes: VolumeManager,
    peers: Arc<dyn Peers>,
    forgetting: Option<Arc<Forgetting<dyn ClaimStore>>>,
    call_timeout: Duration,
    /// Ids whose `CreateVolume`, or the undo of an uncertain one, is in flight here. A second
    /// create of the same id is refused meanwhile, so an undo never deletes the volume a
    /// concurrent create of the same name was given.
    creating: Mutex<BTreeSet<VolumeId>>,
    events: broadcast::Sender<ServiceEvent>,
    /// How many operations run now, their callers gone or not ([`VolumeService::wait_idle`]).
    running: watch::Sender<usize>,
}

/// Builds a [`VolumeService`]: [`VolumeService::builder`].
#[derive(Debug)]
pub struct VolumeServiceBuilder {
    inner: Inner,
}

impl VolumeServiceBuilder {
    /// What the other nodes report (default: [`NoPeers`]).
    pub fn peers(mut self, peers: Arc<dyn Peers>) -> Self {
        self.inner.peers = peers;
        self
    }

    /// The claim store a forced [`deregister_volume`](VolumeService::deregister_volume) forgets a volume's
    /// claims through (csi-claims' [`Forgetting`] over the store the driver runs on). Without
    /// it a forced deregistration of a volume with claims is refused, unless [`Peers`] says
    /// the claims are shared, where the catalog's record and the claims go together.
    pub fn forgetting(mut self, store: Arc<Forgetting<dyn ClaimStore>>) -> Self {
        self.inner.forgetting = Some(store);
        self
    }

    /// The deadline of each plugin call the service makes, of the wait for a failed
    /// claim's release, and of a claim's wait for the releasing claims in its way
    /// ([`VolumeService::claim`]) (default: 30 s).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.inner.call_timeout = timeout;
        self
    }

    /// The service. Inside a Tokio runtime it also starts following the claim driver, so
    /// that every release's progress reaches [`VolumeService::subscribe`]rs as
    /// [`ServiceEvent`]s (the follower ends with the driver); outside one, spawn
    /// [`VolumeService::follow_releases`] once a runtime runs.
    pub fn build(self) -> VolumeService {
        let service = VolumeService {
            inner: Arc::new(self.inner),
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(service.follow_releases());
        }
        service
    }
}

/// How many events a slow subscriber may fall behind before it misses some.
const EVENT_BACKLOG: usize = 256;

impl VolumeService {
    /// A service for node `me` over its catalog, claim driver, shim (the way to every node's
    /// plugins, this one's included) and this node's plugin and volume managers.
    pub fn builder(
        me: NodeId,
        catalog: Arc<dyn VolumeCatalog>,
        claims: ClaimsHandle,
        shim: Shim,
        plugins: PluginManager,
        volumes: VolumeManager,
    ) -> VolumeServiceBuilder {
        VolumeServiceBuilder {
            inner: Inner {
                me,
                catalog,
                claims,
                shim,
                plugins,
                volumes,
                peers: Arc::new(NoPeers),
                forgetting: None,
                call_timeout: Duration::from_secs(30),
                creating: Mutex::new(BTreeSet::new()),
                events: broadcast::channel(EVENT_BACKLOG).0,
                running: watch::channel(0).0,
            },
        }
    }

    /// A service over csi-node's [`Node`](csi_node::Node): its id, claims, plugins and
    /// volumes, and its claim store to forget claims through when it has one
    /// ([`Node::forgetting`](csi_node::Node::forgetting)). Drop the service, and let its
    /// operations end ([`wait_idle`](VolumeService::wait_idle)), before
    /// [`Node::close`](csi_node::Node::close): they hold the node's managers.
    pub fn for_node(
        node: &csi_node::Node,
        catalog: Arc<dyn VolumeCatalog>,
        shim: Shim,
    ) -> VolumeServiceBuilder {
        let builder = Self::builder(
            node.id().clone(),
            catalog,
            node.claims().clone(),
            shim,
            node.plugins().clone(),
            node.volumes().clone(),
        );
        match node.forgetting() {
            Some(store) => builder.forgetting(Arc::clone(store)),
            None => builder,
        }
    }

    /// Every [`ServiceEvent`] from now on. A receiver that falls more than 256 events behind
    /// misses the oldest (and is told so by `recv`).
    pub fn subscribe(&self) -> broadcast::Receiver<ServiceEvent> {
        self.inner.events.subscribe()
    }

    /// Passes the claim driver's release progress on to the service's subscribers
    /// ([`ServiceEvent::from_claims`]): it subscribes at once, and the future it returns
    /// forwards until the driver has stopped and its handles are dropped.
    /// [`VolumeServiceBuilder::build`] spawns it inside a runtime; run it only for a service
    /// built outside one.
    pub fn follow_releases(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut claims = self.inner.claims.subscribe();
        let events = self.inner.events.clone();
        async move {
            loop {
                match claims.recv().await {
                    Ok(event) => {
                        if let Some(event) = ServiceEvent::from_claims(&event) {
                            let _ = events.send(event);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            missed,
                            "release progress events missed: the service fell behind the claim driver"
                        );
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    }

    /// The deadline of each plugin call the service makes
    /// ([`VolumeServiceBuilder::call_timeout`]).
    pub fn call_timeout(&self) -> Duration {
        self.inner.call_timeout
    }

    /// This node.
    pub fn node(&self) -> &NodeId {
        &self.inner.me
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<dyn VolumeCatalog> {
        &self.inner.catalog
    }

    /// The claim driver.
    pub fn claims(&self) -> &ClaimsHandle {
        &self.inner.claims
    }

    /// The shim the service calls plugins through.
    pub fn shim(&self) -> &Shim {
        &self.inner.shim
    }

    /// This node's volume manager.
    pub fn volumes(&self) -> &VolumeManager {
        &self.inner.volumes
    }

    /// What the other nodes report.
    pub fn peers(&self) -> &Arc<dyn Peers> {
        &self.inner.peers
    }

    fn emit(&self, event: ServiceEvent) {
        // No subscriber is not an error.
        let _ = self.inner.events.send(event);
    }

    /// A volume of the catalog; one that may exist only (an uncertain create not undone) is
    /// refused, naming it.
    fn entry(&self, id: &VolumeId) -> Result<CatalogEntry, ServiceError> {
        let entry = self.any_entry(id)?;
        if let Some(may) = &entry.may_exist {
            return Err(ServiceError::Conflict(format!(
                "volume {} is not created: it may exist in plugin {} under name {} ({}); \
                 `volume create` of the id again resolves it, `volume deregister` clears it",
                entry.id, entry.plugin, entry.id, may.why
            )));
        }
        Ok(entry)
    }

    /// A volume of the catalog, including one that may exist only.
    fn any_entry(&self, id: &VolumeId) -> Result<CatalogEntry, ServiceError> {
        self.inner.catalog.get(id).ok_or_else(|| no_volume(id))
    }

    /// Whether `plugin` needs controller publish, from any fingerprint seen (here or on a
    /// peer); `None` when no controller of it was fingerprinted anywhere.
    pub fn controller_publish_of(&self, plugin: &PluginId) -> Option<bool> {
        let local = self
            .inner
            .plugins
            .get(plugin)
            .filter(|p| p.fingerprint.capabilities.plugin.has_controller_service())
            .map(|p| {
                p.fingerprint
                    .capabilities
                    .lifecycle_requires(csi_client::Rpc::ControllerPublishVolume)
            });
        local.or_else(|| {
            self.inner
                .peers
                .plugins()
                .into_iter()
                .find(|p| &p.plugin == plugin && p.controller)
                .map(|p| p.controller_publish)
        })
    }

    /// What `plugin`'s controller advertises, from a fingerprint here or a peer's report.
    pub fn controller_capabilities(&self, plugin: &PluginId) -> Option<Capabilities> {
        let local = self
            .inner
            .plugins
            .get(plugin)
            .map(|p| p.fingerprint.capabilities.clone())
            .filter(|c| c.plugin.has_controller_service());
        local.or_else(|| {
            self.inner
                .peers
                .plugins()
                .into_iter()
                .filter(|p| &p.plugin == plugin && p.controller)
                .find_map(|p| p.capabilities)
        })
    }

    /// Refuses a plugin that no node knows: not registered here, not reported by a peer and
    /// not in the routing's registry. What an operator mistyped must not read like an outage
    /// (a retryable "no instance"): the error names the plugin field and the known plugins.
    fn known_plugin(&self, plugin: &PluginId) -> Result<(), ServiceError> {
        let routed = self.inner.shim.registry().controllers(plugin);
        if !routed.ready.is_empty() || !routed.refused.is_empty() {
            return Ok(());
        }
        let mut known: BTreeSet<PluginId> = self
            .inner
            .plugins
            .list()
            .into_iter()
            .map(|s| s.plugin)
            .collect();
        known.extend(self.inner.peers.plugins().into_iter().map(|p| p.plugin));
        if known.contains(plugin) {
            return Ok(());
        }
        let names: Vec<String> = known.iter().map(ToString::to_string).collect();
        Err(invalid(
            "plugin",
            format!(
                "no plugin {plugin} is registered on this node or reported by another node; \
                 known plugins: {}",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ),
        ))
    }

    /// Whether a node instance of `plugin` (here or on a peer) advertises `EXPAND_VOLUME`.
    fn node_can_expand(&self, plugin: &PluginId) -> bool {
        let local = self.inner.plugins.get(plugin).is_some_and(|p| {
            p.fingerprint.serves_node() && p.fingerprint.capabilities.node.can_expand()
        });
        local
            || self
                .inner
                .peers
                .plugins()
                .into_iter()
                .filter(|p| &p.plugin == plugin && p.node_service)
                .any(|p| p.capabilities.as_ref().is_some_and(|c| c.node.can_expand()))
    }

    /// Whether `node`'s agent answers (`None`: not known here).
    fn node_reachable(&self, node: &NodeId) -> Option<bool> {
        if node == &self.inner.me {
            return Some(true);
        }
        self.inner.peers.reachable(node)
    }

    /// Refuses, naming what is missing, unless `plugin`'s controller (here or on a peer)
    /// advertises what `rpc` needs.
    fn require(&self, plugin: &PluginId, rpc: csi_client::Rpc) -> Result<(), ServiceError> {
        let caps = self
            .controller_capabilities(plugin)
            .ok_or_else(|| ServiceError::Call {
                step: rpc.name(),
                class: csi_structs::ErrorClass::RetryElsewhere,
                failure: CallFailure::Unreachable,
                detail: format!(
                    "plugin {plugin} has no fingerprinted controller here or on a peer"
                ),
            })?;
        match caps.unmet(csi_structs::capability_set::requirement_for(rpc)) {
            None => Ok(()),
            Some(missing) => Err(ServiceError::Unsupported(format!(
                "plugin {plugin} does not advertise {missing}: it serves no {}",
                rpc.name()
            ))),
        }
    }

    /// The stored claims of a volume (one being written is not shown before it is durable).
    fn claims_of(&self, volume: &VolumeId) -> Vec<Claim> {
        self.inner
            .claims
            .record(volume)
            .map(|r| r.claims().to_vec())
            .unwrap_or_default()
    }

    /// One volume as the service sees it: its catalog entry, its stored claims (with their
    /// publish directory on this node) and its release, when one is under way or failing.
    ///
    /// # Errors
    ///
    /// [`ServiceError::NotFound`].
    pub fn volume(&self, id: &VolumeId) -> Result<VolumeState, ServiceError> {
        let entry = self.any_entry(id)?;
        Ok(self.state(entry))
    }

    /// Every volume of the catalog, as [`volume`](Self::volume) shows it.
    pub fn volume_states(&self) -> Vec<VolumeState> {
        self.inner
            .catalog
            .list()
            .into_iter()
            .map(|e| self.state(e))
            .collect()
    }

    /// `entry` as [`volume`](Self::volume) shows it, with its claims and release now.
    pub fn state(&self, entry: CatalogEntry) -> VolumeState {
        let claims = self
            .inner
            .claims
            .stored_record(&entry.id)
            .map(|r| {
                r.claims()
                    .iter()
                    .map(|c| {
                        let target_path = (c.node() == &self.inner.me)
                            .then(|| self.inner.volumes.published(c.volume(), c.workload()))
                            .flatten();
                        (c.clone(), target_path)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let release = self.inner.claims.status(&entry.id).filter(|s| {
            s.last_error.is_some() || s.claims.iter().any(|c| c.state().is_releasing())
        });
        VolumeState {
            entry,
            claims,
            release,
        }
    }

    /// Claims per state name over every volume of the catalog.
    pub fn claim_counts(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for e in self.inner.catalog.list() {
            if let Some(r) = self.inner.claims.stored_record(&e.id) {
                for c in r.claims() {
                    *counts.entry(c.state().name().to_owned()).or_default() += 1;
                }
            }
        }
        counts
    }

    /// Refuses an id that cannot name a directory on this node.
    fn check_volume_id(&self, id: &VolumeId) -> Result<(), ServiceError> {
        self.inner
            .volumes
            .layout()
            .staging_path(id)
            .map(drop)
            .map_err(|e| invalid("id", e))
    }

    /// Takes `id`'s turn to create, refusing while another create of it runs here.
    fn creating(&self, id: &VolumeId) -> Result<CreateTurn<'_>, ServiceError> {
        if !self
            .inner
            .creating
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.clone())
        {
            return Err(ServiceError::Conflict(format!(
                "volume {id} is being created (or its uncertain creation undone)"
            )));
        }
        Ok(CreateTurn {
            ids: &self.inner.creating,
            id: id.clone(),
        })
    }
}

/// One volume: [`VolumeService::volume`].
#[derive(Clone, Debug)]
pub struct VolumeState {
    /// Its catalog entry.
    pub entry: CatalogEntry,
    /// Its stored claims, each with its publish directory when it is on this node and
    /// published.
    pub claims: Vec<(Claim, Option<PathBuf>)>,
    /// Its release, when a claim is releasing or the last step failed.
    pub release: Option<ReleaseStatus>,
}

impl std::fmt::Display for VolumeState {
    /// `volume v1 (plugin ebs): 2 claim(s)`, then its release's line when it has one
    /// ([`ReleaseStatus`]'s, plugin text escaped). Never a secret: the entry's secrets are
    /// not shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "volume {} (plugin {}): {} claim(s)",
            self.entry.id,
            self.entry.plugin,
            self.claims.len()
        )?;
        if let Some(release) = &self.release {
            write!(f, "; release: {}", release.progress())?;
        }
        Ok(())
    }
}

/// An id in [`VolumeService::creating`], taken out again when dropped.
struct CreateTurn<'a> {
    ids: &'a Mutex<BTreeSet<VolumeId>>,
    id: VolumeId,
}

impl Drop for CreateTurn<'_> {
    fn drop(&mut self) {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}
