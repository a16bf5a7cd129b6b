//! The CSI domain model: typed ids, capabilities, volumes, secrets, topology and the spec's
//! rules, with conversions to and from the wire types.
//!
//! This crate is what the rest of the workspace speaks instead of prost messages. It is pure:
//! no I/O, no tokio, no tonic. It depends on `csi-proto` only to convert at the edge.
//!
//! What it holds, one concern per module:
//! - [`ids`]: one type per kind of identifier, so an orchestrator node id can never be sent
//!   where the plugin's node id belongs.
//! - [`error_class`]: the [`ErrorClass`] every failed call is sorted into.
//! - [`capability`] and [`capability_set`]: volume capabilities, what a plugin advertises, and
//!   which RPCs that makes mandatory (spec §3.8).
//! - [`validation`] and [`limits`]: the spec's size and syntax rules, reported all at once as
//!   typed [`ValidationErrors`].
//! - [`capacity`], [`topology`], [`maps`], [`secrets`]: the value types of the spec with their
//!   rules; [`Secrets`] never prints a value, and [`volume_secrets`] holds a volume's secrets
//!   with the set each kind of call sends.
//! - [`info`], [`volume`], [`snapshot`], [`expansion`]: what a plugin says about itself, its
//!   node, its volumes (with their status) and snapshots, and the sizes it grew volumes to.
//! - [`registration`]: the orchestrator's record of a volume, and how a user's update merges
//!   onto it.
//! - [`confirm`]: whether a `ValidateVolumeCapabilities` answer really confirms the request.
//! - [`wire`]: conversions to and from `csi-proto` messages; a message that breaks the spec
//!   becomes a typed [`WireError`].
//!
//! What it is not: a client (see `csi-client`), a claim tracker (see `csi-claims`), or a
//! place for policy about timeouts and retries. Nothing here does I/O or reads a clock.
//!
//! ```
//! use csi_proto::v1;
//! use csi_structs::{AccessMode, ErrorClass, ExternalVolumeId, NodeInfo, PluginNodeId, VolumeCapability};
//!
//! // Ids are distinct types, checked on construction.
//! let volume = ExternalVolumeId::new("vol-0abc")?;
//! let node = PluginNodeId::new("i-0123456789")?;
//! assert_eq!(format!("{volume} on {node}"), "vol-0abc on i-0123456789");
//!
//! // Capabilities convert to the wire and back.
//! let cap = VolumeCapability::block(AccessMode::SingleNodeWriter);
//! let wire = v1::VolumeCapability::from(&cap);
//! assert_eq!(VolumeCapability::try_from(&wire).unwrap(), cap);
//!
//! // A plugin answer that breaks the spec is a typed error, not a panic.
//! let bad = v1::NodeGetInfoResponse::default(); // empty node_id
//! assert!(NodeInfo::try_from(bad).is_err());
//!
//! assert!(ErrorClass::Retry.is_retryable());
//! # Ok::<(), csi_structs::ValidationErrors>(())
//! ```

// The README is the crate's page on crates.io; its examples run as doctests with these docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod capability;
pub mod capability_set;
pub mod capacity;
pub mod confirm;
pub mod error_class;
pub mod expansion;
pub mod ids;
pub mod info;
pub mod limits;
pub mod maps;
pub mod registration;
pub mod secrets;
pub mod snapshot;
pub mod topology;
pub mod untrusted;
pub mod validation;
pub mod volume;
pub mod volume_secrets;
pub mod wire;

#[doc(inline)]
pub use capability::{
    AccessMode, AccessModeError, AccessType, AccessTypeKind, MountFlags, MountOptions,
    UnknownAccessMode, VolumeCapability,
};
#[doc(inline)]
pub use capability_set::{
    Capabilities, CapabilityRule, ControllerCapabilities, ControllerCapability,
    GroupControllerCapabilities, GroupControllerCapability, NodeCapabilities, NodeCapability,
    PluginCapabilities, PluginService, Requirement, RpcSupport, VolumeExpansion,
};
#[doc(inline)]
pub use capacity::CapacityRange;
#[doc(inline)]
pub use confirm::{ConfirmPolicy, Confirmation, Mismatch};
#[doc(inline)]
pub use error_class::{ErrorClass, UnknownErrorClass};
#[doc(inline)]
pub use expansion::{ControllerExpansion, NodeExpansion};
#[doc(inline)]
pub use ids::{
    ExternalVolumeId, GroupSnapshotId, NodeId, PluginId, PluginNodeId, SnapshotId, VolumeId,
    WorkloadId,
};
#[doc(inline)]
pub use info::{NodeInfo, PluginInfo, PluginName};
#[doc(inline)]
pub use maps::{Manifest, MutableParameters, Parameters, PublishContext, VolumeContext};
#[doc(inline)]
pub use registration::{RegisteredVolume, VolumeSpec, VolumeUpdate, VolumeUsage};
#[doc(inline)]
pub use secrets::Secrets;
#[doc(inline)]
pub use snapshot::{Snapshot, VolumeGroupSnapshot};
#[doc(inline)]
pub use topology::{Topology, TopologyRequirement};
#[doc(inline)]
pub use validation::{FieldPath, Problem, ValidationErrors, Violation};
#[doc(inline)]
pub use volume::{
    ContentSource, Usage, Volume, VolumeCondition, VolumeStats, VolumeStatus, VolumeWithStatus,
};
#[doc(inline)]
pub use volume_secrets::{SecretsUse, VolumeSecrets};
#[doc(inline)]
pub use wire::WireError;
