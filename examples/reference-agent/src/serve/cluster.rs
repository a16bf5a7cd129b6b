//! Cluster mode (cargo feature `etcd`, `--store etcd://...`): agents share one etcd.
//!
//! Under the key prefix (`/csi-agent` by default):
//! - `claims/<volume>`: the claims of each volume (csi-claims' `EtcdStore`), so a claim is
//!   admitted against every agent's claims of the volume in one compare-and-swap;
//! - `volumes/<volume>`: the volume book (csi-control's `EtcdCatalog`), so every agent sees
//!   every volume exactly once;
//! - `members/<node>`, `gone/<node>` and `leader/controller-duty`: csi-control's
//!   [`Membership`] (see [`csi_control::cluster`]): each agent's record under a lease, which
//!   replaces the static `--peer` list; the nodes an operator reported gone for good (`volume
//!   detach --node-gone`: every agent's driver skips their node steps, so the duty holder runs
//!   the controller step without them); and the agent that performs controller-side release
//!   steps (one at a time, elected; another takes over within the lease TTL when it dies).
//!
//! What is the agent's own stays here: what it says of itself in its record ([`MemberInfo`]:
//! its control API, its shim address and its plugins, written beside the library's `format`,
//! `node` and `instance` exactly as before the move), the `status` view of the cluster
//! ([`Cluster`], the agent's [`ClusterStatus`]), and [`run`], which keeps the record current
//! and feeds the other members' routes, tokens and plugins to the shim and the registry.
//!
//! Node-side release steps stay with the node's own agent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use csi_claims::duty::Duty;
use csi_claims::store::EtcdStore;
use csi_claims::{StoreError, driver::ClaimsHandle};
use csi_control::cluster::{JoinError, MemberRecord, Membership};
use csi_rpc_shim::{Scope, Token};
use csi_structs::NodeId;
use serde::{Deserialize, Serialize};

use super::agent::{Agent, ClusterStatus};
use super::peers;
use crate::config::EtcdSettings;
use crate::ops::api;

/// What an agent says of itself under `members/<node>`, beside the record's `format`, `node`
/// and `instance`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Its control API (loopback: for the operator on that host).
    pub http: String,
    /// Its agent-to-agent (shim) address.
    pub shim: String,
    /// Its fingerprinted plugins.
    pub plugins: Vec<api::PeerPlugin>,
}

/// An agent's record under `members/<node>`.
pub type AgentRecord = MemberRecord<MemberInfo>;

/// This agent in the cluster: its [`Membership`], and how `status` names the store.
#[derive(Debug)]
pub struct Cluster {
    /// This agent's membership, the other members, and the controller duty.
    pub membership: Membership<MemberInfo>,
    /// The store as the operator wrote it ([`EtcdSettings::display`]).
    store: String,
    /// The key prefix.
    prefix: String,
}

impl Cluster {
    /// Joins the cluster (see [`Membership::join`]) with the lease and duty timing of
    /// `settings`.
    ///
    /// # Errors
    ///
    /// Why cluster mode could not start, as `serve` reports it (another agent has this node
    /// id, say).
    pub async fn join(
        store: &EtcdStore,
        settings: &EtcdSettings,
        record: &AgentRecord,
        claims: ClaimsHandle,
    ) -> Result<Self, String> {
        // The configuration checked the TTL and the margin (`lease_margin`).
        let membership = Membership::join(store, settings.lease_ttl, settings.duty, record, claims)
            .await
            .map_err(|e| match e {
                JoinError::DuplicateNode { node, other } => format!(
                    "node id {node} is already a member of the cluster (agent at {}, another \
                     data directory); every agent needs its own node id",
                    other.about.shim
                ),
                e => e.to_string(),
            })?;
        Ok(Self {
            membership,
            store: settings.display(),
            prefix: settings.store.prefix.clone(),
        })
    }
}

/// This agent's hold on the controller duty, as `status` shows it.
fn duty_view(duty: &Duty) -> api::DutyView {
    // The driver's clock (tokio's, which tests may pause).
    let now = tokio::time::Instant::now();
    let left = duty
        .until()
        .map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
    api::DutyView {
        holds: duty.holds(now),
        confirmed_for_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
        revision: duty.fence().revision,
    }
}

#[async_trait::async_trait]
impl ClusterStatus for Cluster {
    async fn report_node_gone(&self, node: &NodeId) -> Result<(), StoreError> {
        self.membership.report_node_gone(node).await
    }

    fn view(&self) -> api::ClusterView {
        let m = &self.membership;
        api::ClusterView {
            store: self.store.clone(),
            prefix: self.prefix.clone(),
            controller_duty: m.duty_holder(),
            held_duty: m.held_duty().map(|duty| duty_view(&duty)),
            members: m
                .members()
                .into_iter()
                .map(|r| api::MemberView {
                    me: r.node == m.me().as_str(),
                    node: r.node,
                    http: r.about.http,
                    shim: r.about.shim,
                    plugins: r.about.plugins.into_iter().map(|p| p.id).collect(),
                })
                .collect(),
            outage: m.outage(),
        }
    }
}

/// Keeps this agent's record current and the other members known to the shim and the
/// registry, until `stop`.
pub async fn run(
    agent: Arc<Agent>,
    cluster: Arc<Cluster>,
    mut record: AgentRecord,
    token: Token,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let membership = &cluster.membership;
    let mut changes = membership.subscribe();
    let mut routes = BTreeMap::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let plugins = agent.plugins.peer_view();
        if plugins != record.about.plugins {
            record.about.plugins = plugins;
            if let Err(e) = membership.update(&record) {
                tracing::warn!(error = %e, "cannot publish this agent's plugins to the cluster");
            }
        }
        follow_members(&agent, membership, &token, &mut routes);
        tokio::select! {
            _ = ticker.tick() => {}
            _ = changes.changed() => {}
            _ = stop.changed() => return,
        }
    }
}

/// Routes and tokens for every other member; members gone (their lease expired) are marked
/// down.
fn follow_members(
    agent: &Agent,
    membership: &Membership<MemberInfo>,
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
        let shim = &m.about.shim;
        let Ok(addr) = shim.parse::<SocketAddr>() else {
            tracing::warn!(member = %m.node, shim = %shim, "member has an unusable shim address");
            continue;
        };
        if routes.get(&node) != Some(&addr) {
            routes.insert(node.clone(), addr);
            tracing::info!(member = %m.node, shim = %shim, "cluster member joined");
            agent
                .service
                .shim()
                .update_routes(|r| r.set_direct(node.clone(), addr));
            agent
                .service
                .shim()
                .update_tokens(|t| t.insert(node.clone(), token.clone(), Scope::Cluster));
        }
        peers::apply(agent, &node, Ok(m.about.plugins.clone()));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The record as agents wrote it before membership moved to csi-control, field for field.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    struct OldMemberRecord {
        format: u32,
        node: String,
        instance: String,
        http: String,
        shim: String,
        plugins: Vec<api::PeerPlugin>,
    }

    fn plugins() -> Vec<api::PeerPlugin> {
        // Known and unknown capabilities: sets, enums and numbers inside the flattened part.
        let mut capabilities = csi_structs::Capabilities::default();
        capabilities.plugin.insert_service_wire(1);
        capabilities.controller.insert_wire(1);
        capabilities.controller.insert_wire(999);
        capabilities.node.insert_wire(1);
        vec![
            api::PeerPlugin {
                id: "ebs".into(),
                controller: Some(true),
                node: Some(("i-0a".into(), true)),
                controller_publish: true,
                capabilities: Some(capabilities),
            },
            api::PeerPlugin {
                id: "nfs".into(),
                controller: None,
                node: Some(("n-1".into(), false)),
                controller_publish: false,
                capabilities: None,
            },
        ]
    }

    #[test]
    fn an_agents_record_is_the_json_agents_wrote_before_the_move_and_reads_theirs() {
        let new = AgentRecord::new(
            "n1",
            "3f2a9c",
            MemberInfo {
                http: "127.0.0.1:8080".into(),
                shim: "10.0.0.1:9000".into(),
                plugins: plugins(),
            },
        );
        let old = OldMemberRecord {
            format: 1,
            node: "n1".into(),
            instance: "3f2a9c".into(),
            http: "127.0.0.1:8080".into(),
            shim: "10.0.0.1:9000".into(),
            plugins: plugins(),
        };
        let written = serde_json::to_string(&new).expect("encodes");
        assert_eq!(written, serde_json::to_string(&old).expect("encodes"));
        assert!(
            written.starts_with(
                r#"{"format":1,"node":"n1","instance":"3f2a9c","http":"127.0.0.1:8080","shim":"10.0.0.1:9000","plugins":[{"id":"ebs","#
            ),
            "{written}"
        );
        // Each side reads the other's.
        let read_old: OldMemberRecord = serde_json::from_str(&written).expect("old reads new");
        assert_eq!(read_old, old);
        let old_written = serde_json::to_vec(&old).expect("encodes");
        let read_new: AgentRecord = serde_json::from_slice(&old_written).expect("new reads old");
        assert_eq!(read_new, new);
    }
}
