//! Cluster mode (cargo feature `etcd`, `--store etcd://...`): agents share one etcd.
//!
//! Under the key prefix (`/csi-agent` by default):
//! - `claims/<volume>`: the claims of each volume (csi-claims' `EtcdStore`), so a claim is
//!   admitted against every agent's claims of the volume in one compare-and-swap;
//! - `volumes/<volume>`: the volume book (csi-control's `EtcdCatalog`), so every agent sees
//!   every volume exactly once;
//! - `members/<node>`: each agent's [`MemberRecord`] under a lease ([`Membership`]): its
//!   addresses and plugins, which replace the static `--peer` list;
//! - `leader/controller-duty`: the agent that performs controller-side release steps (one at a
//!   time, elected; another takes over within the lease TTL when it dies);
//! - `gone/<node>`: nodes an operator reported gone for good (`volume detach --node-gone`):
//!   every agent's driver skips their node steps, so the duty holder runs the controller step
//!   without them. A gone node's agent that joins again removes its key.
//!
//! Node-side release steps stay with the node's own agent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use csi_claims::duty::Duty;
use csi_claims::store::etcd_client::{Txn, TxnOp};
use csi_claims::store::{ControllerElection, EtcdStore, Held, HeldKey, Mirror};
use csi_claims::{StoreError, driver::ClaimsHandle};
use csi_rpc_shim::{Scope, Token};
use csi_structs::NodeId;
use serde::{Deserialize, Serialize};

use super::agent::{Agent, ClusterStatus};
use super::peers;
use crate::config::EtcdSettings;
use crate::ops::api;

/// The format of the values this agent writes under `members/` and `gone/` (csi-control's
/// catalog writes the same under `volumes/`).
const FORMAT: u32 = 1;

/// What an agent says of itself under `members/<node>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// The value format.
    pub format: u32,
    /// Its node id.
    pub node: String,
    /// Identifies one data directory: a restarted agent keeps it, another agent that was
    /// given the same node id by mistake does not.
    pub instance: String,
    /// Its control API (loopback: for the operator on that host).
    pub http: String,
    /// Its agent-to-agent (shim) address.
    pub shim: String,
    /// Its fingerprinted plugins.
    pub plugins: Vec<api::PeerPlugin>,
}

/// This agent's membership, the other members, and the controller duty.
#[derive(Debug)]
pub struct Membership {
    settings: EtcdSettings,
    me: NodeId,
    store: EtcdStore,
    members: Mirror,
    /// `gone/<node>`: nodes reported gone for good.
    gone: Mirror,
    /// This agent's membership, until it leaves.
    held: Mutex<Option<HeldKey>>,
    election: Mutex<Option<ControllerElection>>,
    /// The driver the election hands the duty to, asked what it holds.
    claims: ClaimsHandle,
}

/// Why cluster mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// etcd failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another live agent uses this node id.
    #[error(
        "node id {node} is already a member of the cluster (agent at {shim}, another data \
         directory); every agent needs its own node id"
    )]
    DuplicateNode {
        /// The node id.
        node: String,
        /// The other agent's shim address.
        shim: String,
    },
}

impl Membership {
    /// Checks that no other live agent has this node id, then registers this agent under a
    /// lease and campaigns for the controller duty.
    ///
    /// # Errors
    ///
    /// [`JoinError`].
    pub async fn join(
        store: &EtcdStore,
        settings: EtcdSettings,
        record: &MemberRecord,
        claims: ClaimsHandle,
    ) -> Result<Self, JoinError> {
        let me = NodeId::new(record.node.clone()).map_err(|e| StoreError::Etcd {
            endpoints: settings.endpoints.join(","),
            operation: "join the cluster".into(),
            detail: e.to_string(),
        })?;
        let members = store.mirror("members").await?;
        if let Some(found) = members.get(me.as_str())
            && let Ok(other) = serde_json::from_slice::<MemberRecord>(&found.value)
            && other.instance != record.instance
        {
            return Err(JoinError::DuplicateNode {
                node: other.node,
                shim: other.shim,
            });
        }
        // This node is back, if it was reported gone.
        let gone = store.mirror("gone").await?;
        let back = Txn::new().and_then([TxnOp::delete(gone.key(me.as_str()), None)]);
        store
            .txn(|| format!("clear node {me}'s gone mark"), back)
            .await?;
        let held = store.hold_key(
            members.key(me.as_str()),
            encode_member(record),
            settings.lease_ttl,
        );
        // The configuration checked the TTL and the margin (`lease_margin`).
        let election = store.elect_controller_duty(me.as_str(), settings.duty, claims.clone());
        Ok(Self {
            settings,
            me,
            claims,
            store: store.clone(),
            members,
            gone,
            held: Mutex::new(Some(held)),
            election: Mutex::new(Some(election)),
        })
    }

    /// Publishes a new record of this agent (its plugins changed).
    pub fn update(&self, record: &MemberRecord) {
        if let Some(held) = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            held.set(encode_member(record));
        }
    }

    /// The members that decode, by node.
    pub fn members(&self) -> Vec<MemberRecord> {
        self.members
            .list()
            .into_iter()
            .filter_map(|(name, e)| {
                serde_json::from_slice::<MemberRecord>(&e.value)
                    .ok()
                    .filter(|m| m.node == name && m.format == FORMAT)
            })
            .collect()
    }

    /// Wakes when the members change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.members.subscribe()
    }

    /// The nodes reported gone for good.
    pub fn gone_nodes(&self) -> std::collections::BTreeSet<NodeId> {
        self.gone
            .list()
            .into_iter()
            .filter_map(|(name, _)| NodeId::new(name).ok())
            .collect()
    }

    /// Gives up the controller duty and the membership at once (a clean stop), so the others
    /// need not wait for the leases to expire.
    pub async fn leave(&self) {
        let election = self
            .election
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(e) = election {
            e.resign().await;
        }
        let held = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(held) = held {
            held.release().await;
        }
    }

    fn duty_holder(&self) -> Option<String> {
        self.election
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(ControllerElection::leader)
    }
}

/// This agent's hold on the controller duty, as `status` shows it.
fn duty_view(duty: &Duty) -> api::DutyView {
    // The driver's clock (tokio's, which tests may pause).
    let now = tokio::time::Instant::now().into_std();
    let left = duty
        .until()
        .map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
    api::DutyView {
        holds: duty.holds(now),
        confirmed_for_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
        revision: duty.fence().revision,
    }
}

fn encode_member(record: &MemberRecord) -> Vec<u8> {
    // A record of strings and booleans always encodes.
    serde_json::to_vec(record).unwrap_or_default()
}

#[async_trait::async_trait]
impl ClusterStatus for Membership {
    async fn report_node_gone(&self, node: &NodeId) -> Result<(), StoreError> {
        let key = self.gone.key(node.as_str());
        let value = serde_json::json!({ "format": FORMAT, "reported_by": self.me.as_str() })
            .to_string()
            .into_bytes();
        let put = Txn::new().and_then([TxnOp::put(key.as_str(), value, None)]);
        self.store
            .txn(|| format!("report node {node} gone"), put)
            .await?;
        Ok(())
    }

    fn view(&self) -> api::ClusterView {
        let held = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(HeldKey::state);
        let outage = self.members.outage().or_else(|| match held {
            Some(Held::Failing(e)) => Some(format!("membership: {e}")),
            _ => None,
        });
        api::ClusterView {
            store: self.settings.display(),
            prefix: self.settings.prefix.clone(),
            controller_duty: self.duty_holder(),
            held_duty: self.claims.duty().map(|duty| duty_view(&duty)),
            members: self
                .members()
                .into_iter()
                .map(|m| api::MemberView {
                    me: m.node == self.me.as_str(),
                    node: m.node,
                    http: m.http,
                    shim: m.shim,
                    plugins: m.plugins.into_iter().map(|p| p.id).collect(),
                })
                .collect(),
            outage,
        }
    }
}

/// Keeps this agent's record current and the other members known to the shim and the
/// registry, until `stop`.
pub async fn run(
    agent: Arc<Agent>,
    membership: Arc<Membership>,
    mut record: MemberRecord,
    token: Token,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut changes = membership.subscribe();
    let mut gone_changes = membership.gone.subscribe();
    let mut gone = std::collections::BTreeSet::new();
    let mut routes = BTreeMap::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let plugins = agent.plugins.peer_view();
        if plugins != record.plugins {
            record.plugins = plugins;
            membership.update(&record);
        }
        follow_members(&agent, &membership, &token, &mut routes);
        follow_gone(&agent, &membership, &mut gone);
        tokio::select! {
            _ = ticker.tick() => {}
            _ = changes.changed() => {}
            _ = gone_changes.changed() => {}
            _ = stop.changed() => return,
        }
    }
}

/// Tells this agent's driver of the nodes reported gone for good (their node steps are
/// skipped) and of the ones back.
fn follow_gone(
    agent: &Agent,
    membership: &Membership,
    applied: &mut std::collections::BTreeSet<NodeId>,
) {
    let now = membership.gone_nodes();
    for node in now.difference(applied) {
        tracing::warn!(node = %node, "node reported gone for good: its claims are released without their node steps");
        agent.claims().node_gone(node);
    }
    for node in applied.difference(&now) {
        tracing::info!(node = %node, "node no longer reported gone");
        agent.claims().node_returned(node);
    }
    *applied = now;
}

/// Routes and tokens for every other member; members gone (their lease expired) are marked
/// down.
fn follow_members(
    agent: &Agent,
    membership: &Membership,
    token: &Token,
    routes: &mut BTreeMap<NodeId, SocketAddr>,
) {
    let members = membership.members();
    let mut present = Vec::new();
    for m in &members {
        let Ok(node) = NodeId::new(m.node.clone()) else {
            continue;
        };
        if node == agent.me {
            continue;
        }
        let Ok(addr) = m.shim.parse::<SocketAddr>() else {
            tracing::warn!(member = %m.node, shim = %m.shim, "member has an unusable shim address");
            continue;
        };
        if routes.get(&node) != Some(&addr) {
            routes.insert(node.clone(), addr);
            tracing::info!(member = %m.node, shim = %m.shim, "cluster member joined");
            agent
                .service
                .shim()
                .update_routes(|r| r.set_direct(node.clone(), addr));
            agent
                .service
                .shim()
                .update_tokens(|t| t.insert(node.clone(), token.clone(), Scope::Cluster));
        }
        peers::apply(agent, &node, Ok(m.plugins.clone()));
        present.push(node);
    }
    let gone: Vec<NodeId> = routes
        .keys()
        .filter(|n| !present.contains(n))
        .cloned()
        .collect();
    for node in gone {
        if routes.remove(&node).is_some() {
            tracing::warn!(member = %node, "cluster member left (its lease expired or it stopped)");
        }
        peers::apply(
            agent,
            &node,
            Err("not a cluster member: its lease expired or it stopped".to_owned()),
        );
    }
}
