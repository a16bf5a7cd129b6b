//! Peer discovery: every interval, ask each configured peer for its fingerprinted plugins
//! (`GET /peer/v1/plugins` with the cluster token) and feed the shim's registry, so controller
//! calls can be routed to the peer that hosts the controller. A peer that does not answer is
//! marked down (its instances stay known but are not chosen).

use std::sync::Arc;
use std::time::Duration;

use csi_rpc_shim::{Health, Instance, NodeStatus, ServiceKind};
use csi_structs::{NodeId, PluginId, PluginNodeId};

use super::agent::Agent;
use crate::config::Peer;
use crate::ops::api::{PeerPlugin, PeerPlugins};
use crate::ops::client;

/// Polls `peers` until `stop` is set.
pub async fn run(
    agent: Arc<Agent>,
    peers: Vec<Peer>,
    token: String,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => return,
        }
        for peer in &peers {
            poll(&agent, peer, &token, interval).await;
        }
    }
}

async fn poll(agent: &Agent, peer: &Peer, token: &str, limit: Duration) {
    let answer = client::call::<(), PeerPlugins>(
        peer.http,
        Some(token),
        hyper::Method::GET,
        "/peer/v1/plugins",
        None,
        limit.max(Duration::from_secs(1)),
    )
    .await;
    apply(
        agent,
        &peer.node,
        answer.map(|a| a.plugins).map_err(|e| e.to_string()),
    );
}

/// Feeds the shim's registry with what a peer hosts (`Ok`), or marks it down (`Err`, why).
pub fn apply(agent: &Agent, node: &NodeId, answer: Result<Vec<PeerPlugin>, String>) {
    let registry = agent.service.shim().registry();
    let mut peers = agent.peers.states();
    let state = peers.entry(node.clone()).or_default();
    match answer {
        Ok(plugins) => {
            if !state.reachable {
                tracing::info!(peer = %node, plugins = plugins.len(), "peer reachable");
            }
            registry.set_node_status(node, NodeStatus::Ready);
            for old in &state.plugins {
                if !plugins.iter().any(|p| p.id == old.id)
                    && let Ok(id) = PluginId::new(old.id.clone())
                {
                    registry.remove(node, &id, ServiceKind::Controller);
                    registry.remove(node, &id, ServiceKind::Node);
                }
            }
            for p in &plugins {
                let Ok(id) = PluginId::new(p.id.clone()) else {
                    continue;
                };
                let health = |ok: bool| {
                    if ok {
                        Health::Healthy
                    } else {
                        Health::unhealthy("peer reports it unhealthy")
                    }
                };
                match p.controller {
                    Some(ok) => registry.update(node, &id, Instance::Controller(health(ok))),
                    None => registry.remove(node, &id, ServiceKind::Controller),
                }
                match &p.node {
                    Some((node_id, ok)) => {
                        if let Ok(plugin_node) = PluginNodeId::new(node_id.clone()) {
                            registry.update(
                                node,
                                &id,
                                Instance::Node {
                                    plugin_node,
                                    health: health(*ok),
                                },
                            );
                        }
                    }
                    None => registry.remove(node, &id, ServiceKind::Node),
                }
            }
            state.reachable = true;
            state.plugins = plugins;
            state.last_error = None;
        }
        Err(e) => {
            if state.reachable || state.last_error.is_none() {
                tracing::warn!(peer = %node, error = %e, "peer unreachable");
            }
            registry.set_node_status(node, NodeStatus::Down);
            state.reachable = false;
            state.last_error = Some(e);
        }
    }
}
