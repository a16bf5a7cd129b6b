//! Peer discovery: every interval, ask each configured peer for its fingerprinted plugins
//! (`GET /peer/v1/plugins` with the cluster token) and report them to the control plane's
//! peers (csi-control's `NodePeers`), which feed the routing, so controller calls can be
//! routed to the peer that hosts the controller. A peer that does not answer is marked down
//! (its instances stay known but are not chosen).

use std::sync::Arc;
use std::time::Duration;

use super::agent::Agent;
use crate::config::Peer;
use crate::ops::api::PeerPlugins;
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
    agent.peers.report(
        &peer.node,
        answer.map(|a| a.plugins).map_err(|e| e.to_string()),
    );
}
