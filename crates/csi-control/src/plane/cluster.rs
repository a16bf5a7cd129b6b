//! A cluster node through the front door (cargo feature `etcd`): the settings, joining the
//! membership, and following the other members into the routing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use csi_claims::duty::DutyTiming;
use csi_claims::store::EtcdStore;
use csi_node::Node;
use csi_node::plugins::PluginManager;
use csi_rpc_shim::{Scope, Shim, Token};
use csi_structs::NodeId;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::PlaneError;
use crate::cluster::{MemberRecord, Membership};
use crate::peers::{ClusterMembers, HostedPlugin, NodeAbout, NodePeers};
use crate::stores::EtcdConfig;

/// The file in the control plane's directory that tells this node's restart from another
/// process given the same node id ([`MemberRecord::instance`]).
pub const INSTANCE_FILE: &str = "instance.id";

/// A cluster node's settings ([`ControlPlaneBuilder::cluster`](super::ControlPlaneBuilder::cluster)).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClusterSettings {
    /// The cluster's etcd.
    pub etcd: EtcdConfig,
    /// The token every node of the cluster presents to the others' routing and accepts.
    pub token: Token,
    /// Where the other nodes reach this node's routing (`HOST:PORT`, served by the embedder).
    pub advertise: String,
    /// The lease of the member record (default: 10 s).
    pub lease_ttl: Duration,
    /// The controller duty's timing (default, `None`: its lease `lease_ttl`, with
    /// [`DutyTiming::new`]'s margin).
    pub duty: Option<DutyTiming>,
    /// How often the record's plugins are compared with the node's and the members followed
    /// when nothing changed meanwhile (default: 1 s).
    pub follow_interval: Duration,
    /// The orchestrator's own fields in the record ([`NodeAbout::extra`]); none may take a
    /// name of the record's own ([`RECORD_FIELDS`]).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// The names of a member record's own fields, which [`ClusterSettings::extra`] may not use.
pub const RECORD_FIELDS: [&str; 5] = ["format", "node", "instance", "shim", "plugins"];

impl ClusterSettings {
    /// Refuses an `extra` field that would write over one of the record's own.
    pub(super) fn check(&self) -> Result<(), PlaneError> {
        match RECORD_FIELDS.iter().find(|f| self.extra.contains_key(**f)) {
            Some(field) => Err(PlaneError::RecordField { field }),
            None => Ok(()),
        }
    }
}

/// The default lease of a member record and of the controller duty.
pub const LEASE_TTL: Duration = Duration::from_secs(10);

impl ClusterSettings {
    /// A node of the cluster on `etcd`, reached by the others at `advertise` with `token`;
    /// every other setting at its default.
    pub fn new(etcd: EtcdConfig, token: Token, advertise: impl Into<String>) -> Self {
        Self {
            etcd,
            token,
            advertise: advertise.into(),
            lease_ttl: LEASE_TTL,
            duty: None,
            follow_interval: Duration::from_secs(1),
            extra: serde_json::Map::new(),
        }
    }
}

/// The node in the cluster: its membership and the task that follows the other members.
pub(super) struct Joined {
    pub(super) membership: Arc<Membership<NodeAbout>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Joined {
    /// Stops following the members; the membership, to leave once the node closed.
    pub(super) async fn stop(self) -> Arc<Membership<NodeAbout>> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.membership
    }
}

/// Joins the cluster as `node` (record: `settings.advertise`, the node's plugins, the
/// orchestrator's fields; instance from `<dir>/instance.id`), makes `peers` a member's and
/// starts following the members into `shim` and `peers`.
pub(super) async fn join(
    dir: &Path,
    node: &Node,
    shim: &Shim,
    peers: &Arc<NodePeers>,
    store: &EtcdStore,
    settings: ClusterSettings,
) -> Result<Joined, PlaneError> {
    let duty = match settings.duty {
        Some(duty) => duty,
        None => DutyTiming::new(settings.lease_ttl).map_err(PlaneError::Duty)?,
    };
    let path = dir.join(INSTANCE_FILE);
    let instance = csi_node::state::random_value_file(&path)
        .map_err(|source| PlaneError::Instance { path, source })?;
    let record = MemberRecord::new(
        node.id().as_str(),
        instance,
        NodeAbout {
            shim: settings.advertise,
            plugins: HostedPlugin::of_node(node.plugins()),
            extra: settings.extra,
        },
    );
    let membership = Membership::join(
        store,
        settings.lease_ttl,
        duty,
        &record,
        node.claims().clone(),
    )
    .await
    .map_err(|e| PlaneError::Join(Box::new(e)))?;
    let membership = Arc::new(membership);
    peers.set_cluster(Arc::clone(&membership) as Arc<dyn ClusterMembers>);
    let (stop, stopped) = watch::channel(false);
    let follower = Follower {
        membership: Arc::clone(&membership),
        peers: Arc::clone(peers),
        shim: shim.clone(),
        plugins: node.plugins().clone(),
        token: settings.token,
        routes: BTreeMap::new(),
    };
    let task = tokio::spawn(follower.run(record, settings.follow_interval, stopped));
    Ok(Joined {
        membership,
        stop,
        task,
    })
}

/// Keeps this node's record current and the other members known to the routing.
struct Follower {
    membership: Arc<Membership<NodeAbout>>,
    peers: Arc<NodePeers>,
    shim: Shim,
    plugins: PluginManager,
    token: Token,
    /// The routes given to the routing, by member.
    routes: BTreeMap<NodeId, SocketAddr>,
}

impl Follower {
    async fn run(
        mut self,
        mut record: MemberRecord<NodeAbout>,
        interval: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut changes = self.membership.subscribe();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let plugins = HostedPlugin::of_node(&self.plugins);
            if plugins != record.about.plugins {
                record.about.plugins = plugins;
                if let Err(e) = self.membership.update(&record) {
                    tracing::warn!(error = %e, "cannot publish this node's plugins to the cluster");
                }
            }
            self.follow();
            tokio::select! {
                _ = ticker.tick() => {}
                _ = changes.changed() => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// Routes and tokens for every other member, their plugins reported to the peers; members
    /// gone (their lease expired or they left) reported unreachable.
    fn follow(&mut self) {
        let mut present = Vec::new();
        for m in self.membership.members() {
            let Ok(node) = NodeId::new(m.node.clone()) else {
                continue;
            };
            if &node == self.membership.me() {
                continue;
            }
            let shim = &m.about.shim;
            let Ok(addr) = shim.parse::<SocketAddr>() else {
                tracing::warn!(member = %m.node, shim = %shim, "member has an unusable shim address");
                continue;
            };
            if self.routes.get(&node) != Some(&addr) {
                self.routes.insert(node.clone(), addr);
                tracing::info!(member = %m.node, shim = %shim, "cluster member joined");
                self.shim
                    .update_routes(|r| r.set_direct(node.clone(), addr));
                let token = self.token.clone();
                self.shim
                    .update_tokens(|t| t.insert(node.clone(), token, Scope::Cluster));
            }
            self.peers.report(&node, Ok(m.about.plugins));
            present.push(node);
        }
        let gone: Vec<NodeId> = self
            .routes
            .keys()
            .filter(|n| !present.contains(n))
            .cloned()
            .collect();
        for node in gone {
            self.routes.remove(&node);
            tracing::warn!(member = %node, "cluster member left (its lease expired or it stopped)");
            self.peers.report(
                &node,
                Err("not a cluster member: its lease expired or it stopped".to_owned()),
            );
        }
    }
}
