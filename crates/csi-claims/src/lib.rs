//! Volume claims for CSI orchestrators: who holds which volume, and a release pipeline that
//! never strands one.
//!
//! A workload *claims* a volume before it is published to it, and the claim is *released*
//! when the workload stops: node detach (`NodeUnpublishVolume`, then `NodeUnstageVolume` when
//! it was the last user on its node), then controller detach (`ControllerUnpublishVolume`
//! with the plugin's volume id and the plugin's node id), then *free*. Orchestrators lose
//! volumes here: lossy checkpoints, retry loops without backoff, claims stuck forever when a
//! node plugin vanished (all of it in Nomad's CSI history). This crate is built so
//! that none of that can happen:
//!
//! - [`model`] and [`state`]: a claim carries everything its release needs (including the
//!   plugin's node id), as explicit enums without meaningful zero values, and every state
//!   change is checkpointed with the whole claim.
//! - [`accounting`]: per-volume limits from the access mode, denied claims as typed errors
//!   naming the volume, the mode and the holders; capacity comes back only when freed.
//! - [`transition`] and [`machine`]: the pure, sans-I/O [`ReleaseMachine`] (no clock, no
//!   tokio, no I/O): inputs in, [`Action`]s and [`Event`]s out, [`poll_timeout`] for retries.
//! - [`backoff`]: per-volume capped exponential backoff with seeded jitter.
//! - [`store`]: [`ClaimStore`] with compare-and-swap per volume; [`MemoryStore`], the
//!   durable [`RedbStore`], and with the `etcd` feature `EtcdStore`, shared by a cluster of
//!   agents, with a watch and an election for the controller-side release steps.
//! - [`error`]: [`Error`], every error of the crate with its
//!   [`ErrorClass`](csi_structs::ErrorClass).
//! - [`duty`]: the controller duty of agents sharing a store, as its holder knows it: a
//!   fence the store compares and a local deadline, so that an agent paused past its lease
//!   never starts a controller-side step.
//! - [`driver`]: a thin tokio loop that performs the machine's actions through the
//!   [`NodeDetacher`](driver::NodeDetacher) and [`ControllerDetacher`](driver::ControllerDetacher)
//!   traits and the store.
//!
//! What it is not: a CSI client. The detacher traits are implemented in `csi-client` terms by
//! the layer that composes the crates (the reference agent), so this crate is testable
//! without sockets.
//!
//! [`poll_timeout`]: ReleaseMachine::poll_timeout
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use async_trait::async_trait;
//! use csi_claims::driver::{ClaimsDriver, ControllerDetacher, DriverConfig, NodeDetacher};
//! use csi_claims::{
//!     ClaimMode, ClaimRequest, ClaimState, ControllerDetachRequest, ControllerRequirement,
//!     DetachError, MemoryStore, NodeDetachRequest, VolumeInfo,
//! };
//! use csi_structs::*;
//!
//! struct Node;
//! #[async_trait]
//! impl NodeDetacher for Node {
//!     async fn node_unpublish(&self, _: &NodeDetachRequest) -> Result<(), DetachError> { Ok(()) }
//!     async fn node_unstage(&self, _: &NodeDetachRequest) -> Result<(), DetachError> { Ok(()) }
//! }
//! struct Controller;
//! #[async_trait]
//! impl ControllerDetacher for Controller {
//!     async fn controller_unpublish(&self, _: &ControllerDetachRequest) -> Result<(), DetachError> {
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (claims, driver) = ClaimsDriver::start(
//!     Arc::new(MemoryStore::new()),
//!     Arc::new(Node),
//!     Arc::new(Controller),
//!     DriverConfig::default(),
//! )
//! .await?;
//! let info = VolumeInfo {
//!     id: VolumeId::new("db")?,
//!     external_id: ExternalVolumeId::new("vol-0a")?,
//!     plugin: PluginId::new("ebs")?,
//!     controller: ControllerRequirement::Required,
//! };
//! let web = WorkloadId::new("web-1")?;
//! let claim = claims
//!     .claim(&info, ClaimRequest {
//!         volume: info.id.clone(),
//!         workload: web.clone(),
//!         node: NodeId::new("n1")?,
//!         plugin_node: PluginNodeId::new("i-1")?,
//!         mode: ClaimMode::Write,
//!         access_mode: AccessMode::SingleNodeWriter,
//!         attachment: AccessTypeKind::Mount,
//!     })
//!     .await?;
//! assert_eq!(claim.state(), &ClaimState::Taken);
//!
//! let freed = claims.release_and_wait(&info.id, &web).await?;
//! assert!(matches!(freed.state(), ClaimState::Freed(_)));
//! driver.shutdown().await;
//! # Ok(())
//! # }
//! ```

// The README is the crate's page on crates.io; its examples run as doctests with these docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod accounting;
pub mod backoff;
pub mod detach;
pub mod driver;
pub mod duty;
pub mod error;
pub mod machine;
pub mod model;
pub mod state;
pub mod store;
pub mod transition;

#[doc(inline)]
pub use accounting::{ClaimDenied, DenyReason};
#[doc(inline)]
pub use detach::{ControllerDetachRequest, DetachError, DetachRpc, NodeDetachRequest};
#[doc(inline)]
pub use error::Error;
#[doc(inline)]
pub use machine::{
    Action, Admitted, ClaimError, Duties, Event, MachineConfig, NodeDuties, ReleaseError,
    ReleaseMachine, ReleaseStarted, ReleaseStatus, Ticket,
};
#[doc(inline)]
pub use model::{Claim, ClaimMode, ClaimRequest, ControllerRequirement, VolumeInfo, VolumeRecord};
#[doc(inline)]
pub use state::{ClaimState, ControllerStep, NodeStep};
#[doc(inline)]
pub use store::{ClaimStore, MemoryStore, RedbStore, StoreError, Version};
