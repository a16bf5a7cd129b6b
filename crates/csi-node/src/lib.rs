//! The orchestrator's node side of CSI, on csi-client and csi-claims.
//!
//! - [`plugins`]: the plugin manager: plugin instances registered by the embedder or found in
//!   a socket directory (the newest registration of a plugin id wins), fingerprinted and
//!   health-checked with csi-client, every transition a typed event, and a deadline-bounded
//!   wait for a plugin to be usable.
//! - [`volumes`]: the volume manager: stage once per volume, publish per workload, one
//!   operation in flight per volume, usage records persisted one per volume (in a redb
//!   table group-committed with the claims, [`UsageDb`](volumes::UsageDb), or a JSON file)
//!   and restored on restart so the last unmount unstages, a failed mount undone before it returns (what the undo could
//!   not do kept until cleaned up), node expansion. A restored record is a belief to
//!   confirm, not a fact: the volume manager never skips a stage or publish on the strength
//!   of a record it did not itself see succeed since it started, and
//!   [`reconcile`](volumes::VolumeManager::reconcile) confirms the restored records against
//!   their plugins (stage and publish again, both idempotent) after a restart.
//! - [`attach`]: the attach path, counterpart of csi-claims' release pipeline: controller
//!   publish once per volume and node (its `publish_context` kept), stage once per node,
//!   publish per workload, read-only decided from the claim.
//! - [`layout`]: where staging and publish paths live under a node's data directory, with
//!   every id checked so that none escapes its directory.
//! - [`detach`]: csi-claims' [`NodeDetacher`](csi_claims::driver::NodeDetacher) and
//!   [`ControllerDetacher`](csi_claims::driver::ControllerDetacher) implemented with
//!   csi-client, with the node detach policy (a short wait for a missing socket, one attempt:
//!   the release driver is the retry loop).
//! - [`node`]: all of the above opened from one state directory ([`Node::open`]), async and
//!   off the runtime's workers, with one [`Node::close`] that returns once every file is
//!   closed.
//! - `shim` (cargo feature `shim`): csi-rpc-shim's `LocalPlugins` over the plugin manager
//!   and the volume manager, `NodeBackend`: what serves the calls routed to this node; and
//!   `RegistryFeed`, a plugin observer that keeps the shim's registry in step with the
//!   plugins (given to the node with `NodeBuilder::observer`).
//! - [`health`]: the health of the volumes published here (usage, and conditions where the
//!   plugin reports them), with typed events when a volume turns abnormal and recovers.
//! - [`kubelet`]: kubelet's plugin registration protocol, so CSI drivers deployed for
//!   Kubernetes (their `node-driver-registrar` sidecar) register with the plugin manager.
//! - [`secrets`]: a volume's secrets read from an operator's file, refused when other users
//!   could read it.
//! - [`state`]: small JSON state files written atomically (temporary file, `fsync`, rename),
//!   owner-only for the ones that hold secrets.
//!
//! It is what Nomad's client keeps in its `csimanager` package and kubelet in its volume
//! manager, as a library: an orchestrator's node embeds it instead of writing it again. It is
//! not a claim tracker (that is csi-claims, whose release pipeline it serves) and it routes
//! nothing between nodes (that is csi-rpc-shim).
//!
//! `examples/embed_node.rs` in this crate is the whole flow of a node on the library crates
//! alone: the mock plugin registered, a volume created for two access modes and validated,
//! claimed by a writer and a reader and attached, the node restarted and its records
//! confirmed, the volume expanded and snapshotted, both claims released while an unstage
//! fails once (reported as an event and retried), the volume deleted, the plugin deregistered. `cargo run -p csi-node --example embed_node` runs it. The reference agent
//! (`csi-agent`) composes the same pieces.
//!
//! # Example
//!
//! A node opened from its state directory, a plugin registered with it and waited for until
//! it is fingerprinted and healthy, and the node closed again (here the plugin is
//! csi-testkit's mock, serving on a socket in a temporary directory):
//!
//! ```
//! use std::time::Duration;
//! use csi_client::Endpoint;
//! use csi_node::Node;
//! use csi_structs::{NodeId, PluginId};
//! use tokio::time::Instant;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let socket = dir.path().join("csi.sock");
//! # let server = csi_testkit::MockPlugin::builder().build()?.serve_unix(&socket).await?;
//! let node = Node::open(dir.path().join("csi"), NodeId::new("node-1")?).await?;
//! let mock = PluginId::new("mock")?;
//! node.register_plugin(mock.clone(), Endpoint::unix(&socket)?).await?;
//! let ready = node.plugins().wait_for(&mock, Instant::now() + Duration::from_secs(30)).await?;
//! assert!(ready.fingerprint.capabilities.node.requires_staging());
//! // Each workload: node.claims().claim(&info, request), then node.attacher().attach(..);
//! // when it stops: node.claims().release_and_wait_until(..).
//! # drop(ready);
//! node.close().await?;
//! # server.shutdown().await?;
//! # Ok(())
//! # }
//! ```

// The README is the crate's page on crates.io; its examples run as doctests with these docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod attach;
pub mod detach;
pub mod health;
pub mod kubelet;
pub mod layout;
pub mod node;
pub mod plugins;
pub mod secrets;
#[cfg(feature = "shim")]
pub mod shim;
pub mod state;
pub mod volumes;

pub use node::{Node, NodeBuilder, NodeError};

/// Runs `round` every `interval` (the first at once; a late round delays the next) until
/// `stop` completes, dropping a round under way then.
pub(crate) async fn every<F: Future>(
    interval: std::time::Duration,
    stop: impl Future<Output = ()>,
    mut round: impl FnMut() -> F,
) {
    let mut stop = std::pin::pin!(stop);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = ticker.tick() => {}
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = round() => {}
        }
    }
}
