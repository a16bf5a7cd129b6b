//! The orchestrator's node side of CSI, on csi-client and csi-claims.
//!
//! - [`plugins`]: the plugin manager: plugin instances registered by the embedder or found in
//!   a socket directory (the newest registration of a plugin id wins), fingerprinted and
//!   health-checked with csi-client, every transition a typed event, and a deadline-bounded
//!   wait for a plugin to be usable.
//! - [`volumes`]: the volume manager: stage once per volume, publish per workload, one
//!   operation in flight per volume, usage records persisted (and restored on restart) so
//!   the last unmount unstages, uncertain outcomes kept until cleaned up, node expansion.
//! - [`attach`]: the attach path, counterpart of csi-claims' release pipeline: controller
//!   publish once per volume and node (its `publish_context` kept), stage once per node,
//!   publish per workload, read-only decided from the claim.
//! - [`layout`]: where staging and publish paths live under a node's data directory, with
//!   every id checked so that none escapes its directory.
//! - [`detach`]: csi-claims' [`NodeDetacher`](csi_claims::driver::NodeDetacher) and
//!   [`ControllerDetacher`](csi_claims::driver::ControllerDetacher) implemented with
//!   csi-client, with the node detach policy (a short wait for a missing socket, one attempt:
//!   the release driver is the retry loop).
//! - [`state`]: small JSON state files written atomically (temporary file, `fsync`, rename).
//!
//! The reference agent (`csi-agent`) composes these; an orchestrator's node embeds them the
//! same way.

pub mod attach;
pub mod detach;
pub mod layout;
pub mod plugins;
pub mod state;
pub mod volumes;
