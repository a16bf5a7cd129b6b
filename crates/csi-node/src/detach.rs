//! csi-claims' detacher traits implemented with csi-client.
//!
//! The release pipeline of `csi-claims` asks for three calls through two traits:
//! [`NodeDetacher`](csi_claims::driver::NodeDetacher) (`NodeUnpublishVolume`, then
//! `NodeUnstageVolume` when the claim was the last user on its node) and
//! [`ControllerDetacher`](csi_claims::driver::ControllerDetacher)
//! (`ControllerUnpublishVolume`). [`ClientNodeDetacher`] and [`ClientControllerDetacher`]
//! make those calls with a [`CsiClient`](csi_client::CsiClient):
//!
//! - The plugin's answer keeps the [`ErrorClass`](csi_structs::ErrorClass) csi-client gave
//!   it ([`detach_error`]); nothing is reclassified, and never from message text.
//! - Node paths come from the agent's [`Layout`](crate::layout::Layout), derived from the
//!   ids in the request, so a restarted agent finds the same paths.
//! - Directories the orchestrator created (the staging directory, the target's parents) are
//!   removed once the plugin is done with them.
//! - [`VolumeNodeDetacher`] performs the node step through the node's
//!   [`VolumeManager`](crate::volumes::VolumeManager) instead: its usage records decide
//!   about unstaging and its per-volume turns keep the step from racing a mount.
//!   [`ClientControllerDetacher::over`] a [`PluginManager`](crate::plugins::PluginManager)
//!   reaches every plugin's controller.
//! - With the cargo feature `shim`, `ShimDetacher` makes both steps through csi-rpc-shim,
//!   on whichever agent hosts the plugin.
//! - Node detach calls run under a [`NodeDetachPolicy`]: a short wait for a missing socket
//!   and one attempt, because the release driver is the retry loop (csi-client's defaults
//!   would hold a release for about two minutes against a missing node plugin).
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use csi_node::detach::{
//!     ClientControllerDetacher, ClientNodeDetacher, NoSecrets, NodeDetachPolicy,
//! };
//! use csi_node::layout::Layout;
//! use csi_claims::MemoryStore;
//! use csi_claims::driver::{ClaimsDriver, DriverConfig};
//! use csi_client::{CsiClient, Endpoint};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let endpoint = "unix:///run/csi/csi.sock".parse::<Endpoint>()?;
//! let client = CsiClient::new(endpoint.clone());
//! let fingerprint = client.fingerprint().await?;
//! // Node detach calls get their own client: a missing plugin is reported in about a second.
//! let node = ClientNodeDetacher::new(
//!     NodeDetachPolicy::DEFAULT.client(endpoint),
//!     Layout::new("/var/lib/csi-agent"),
//!     fingerprint.capabilities.node.requires_staging(),
//! );
//! let controller = ClientControllerDetacher::new(client, Arc::new(NoSecrets));
//! let (claims, driver) = ClaimsDriver::start(
//!     Arc::new(MemoryStore::new()),
//!     Arc::new(node),
//!     Arc::new(controller),
//!     DriverConfig::default(),
//! )
//! .await?;
//! # drop((claims, driver));
//! # Ok(()) }
//! ```

mod cleanup;
mod controller;
mod detach_policy;
mod error;
mod managed;
mod node;
#[cfg(feature = "shim")]
mod shim;

pub use cleanup::remove_empty_dirs;
pub use controller::{ClientControllerDetacher, NoSecrets, SecretsLookup};
pub use detach_policy::{AttemptsOutOfRange, NODE_DETACH_RPCS, NodeDetachPolicy};
pub use error::detach_error;
pub use managed::VolumeNodeDetacher;
pub use node::ClientNodeDetacher;
#[cfg(feature = "shim")]
pub use shim::ShimDetacher;
