//! [`ControllerExpansion`] and [`NodeExpansion`]: what a plugin says after growing a volume.
//!
//! Sizes are `u64`: a plugin that answers a negative size breaks the spec, and its answer is
//! refused by the wire conversion ([`wire`](crate::wire)) with the field named, never
//! wrapped around.
//!
//! ```
//! use csi_proto::v1;
//! use csi_structs::{ControllerExpansion, NodeExpansion};
//!
//! let grown = ControllerExpansion::try_from(v1::ControllerExpandVolumeResponse {
//!     capacity_bytes: 2 << 30,
//!     node_expansion_required: true,
//! })
//! .unwrap();
//! assert_eq!(grown.capacity_bytes, 2 << 30);
//! assert!(grown.node_expansion_required);
//!
//! // The node's answer may leave the size unsaid (0 on the wire).
//! let node = NodeExpansion::try_from(v1::NodeExpandVolumeResponse { capacity_bytes: 0 }).unwrap();
//! assert_eq!(node.capacity_bytes, None);
//!
//! let bad = v1::NodeExpandVolumeResponse { capacity_bytes: -1 };
//! let err = NodeExpansion::try_from(bad).unwrap_err();
//! assert_eq!(err.errors.violations()[0].field.to_string(), "capacity_bytes");
//! ```

/// The answer to `ControllerExpandVolume`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ControllerExpansion {
    /// The volume's size after the expansion. The spec requires it; proto3 cannot tell an
    /// unset size from 0, so a plugin that leaves it out answers 0.
    pub capacity_bytes: u64,
    /// Whether `NodeExpandVolume` must follow on every node where the volume is published
    /// (for example to grow the file system).
    pub node_expansion_required: bool,
}

/// The answer to `NodeExpandVolume`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct NodeExpansion {
    /// The volume's size after the expansion; `None` (wire 0) when the plugin does not say
    /// (the field is optional).
    pub capacity_bytes: Option<u64>,
}
