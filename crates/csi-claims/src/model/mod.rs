//! The claim model: who holds which volume, how, and how far its release has come.
//!
//! - [`claim`]: a [`Claim`], what a workload asks for ([`ClaimRequest`]) and its [`ClaimMode`].
//!   The attachment mode is [`csi_structs::AccessTypeKind`] (block or mount).
//! - [`volume`]: what the claim layer must know about a volume ([`VolumeInfo`]) and the unit
//!   that is stored and compare-and-swapped: a [`VolumeRecord`] with all claims on one volume.
//!
//! Claim states live in [`crate::state`].

pub mod claim;
pub mod volume;

pub use claim::{Claim, ClaimMode, ClaimRequest};
pub use volume::{ControllerRequirement, VolumeInfo, VolumeRecord};
