//! Distinct identifier types, so that mixing them up is a compile error.
//!
//! CSI has two namespaces of identifiers that look alike: the orchestrator's (its volume id,
//! its node id, its workloads) and the plugin's (the `volume_id` the plugin generated, the
//! `node_id` its `NodeGetInfo` returned). Passing one where the other is meant is a classic
//! production incident, so each is its own type here, with no conversion between them and no
//! `Deref<Target = str>`:
//!
//! ```compile_fail,E0308
//! use csi_structs::{NodeId, PluginNodeId};
//!
//! fn publish_to(node: &PluginNodeId) -> &str { node.as_str() }
//!
//! let ours = NodeId::new("client-7").unwrap();
//! publish_to(&ours); // error: expected `&PluginNodeId`, found `&NodeId`
//! ```
//!
//! The same call with the plugin's node id compiles:
//!
//! ```
//! use csi_structs::PluginNodeId;
//!
//! fn publish_to(node: &PluginNodeId) -> &str { node.as_str() }
//!
//! let theirs = PluginNodeId::new("i-0abc123").unwrap();
//! assert_eq!(publish_to(&theirs), "i-0abc123");
//! ```
//!
//! Every id is non-empty and at most [`MAX_STRING_BYTES`]
//! bytes, except [`PluginNodeId`] which may be
//! [`MAX_PLUGIN_NODE_ID_BYTES`]. Deserializing checks
//! the same rules as [`new`](VolumeId::new).

use std::fmt;

use crate::limits::{MAX_PLUGIN_NODE_ID_BYTES, MAX_STRING_BYTES, check_required};
use crate::validation::{FieldPath, ValidationErrors};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, field = $field:literal, limit = $limit:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The field name used in validation errors for this id.
            pub const FIELD: &'static str = $field;

            /// The largest size, in bytes, this id may have.
            pub const MAX_BYTES: usize = $limit;

            /// Checks `value` and wraps it.
            ///
            /// # Errors
            ///
            /// A [`ValidationErrors`] naming the field when the value is empty or longer than
            #[doc = concat!("[`", stringify!($name), "::MAX_BYTES`] bytes.")]
            pub fn new(value: impl Into<String>) -> Result<Self, ValidationErrors> {
                Self::new_at(value, &FieldPath::named($field))
            }

            /// Like [`new`](Self::new), naming `field` in the error instead of the default
            /// field name.
            ///
            /// # Errors
            ///
            /// As [`new`](Self::new).
            pub fn new_at(
                value: impl Into<String>,
                field: &FieldPath,
            ) -> Result<Self, ValidationErrors> {
                let value = value.into();
                let mut errs = ValidationErrors::new();
                check_required(&mut errs, field, &value, $limit);
                errs.into_result(Self(value))
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id as an owned string.
            pub fn into_inner(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = ValidationErrors;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = ValidationErrors;
            fn try_from(value: &str) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl std::str::FromStr for $name {
            type Err = ValidationErrors;
            fn from_str(value: &str) -> Result<Self, Self::Err> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        /// Maps and sets keyed by the id can be looked up with a `&str`: the id compares,
        /// orders and hashes as its string does.
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

id_type!(
    /// The orchestrator's id for a volume: the name users register it under.
    ///
    /// Not the plugin's id; that is [`ExternalVolumeId`].
    VolumeId, field = "volume_id", limit = MAX_STRING_BYTES
);

id_type!(
    /// The plugin's id for a volume: the `volume_id` that `CreateVolume` returned (or that a
    /// user registered for a pre-provisioned volume), sent in every later CSI call.
    ExternalVolumeId, field = "external_volume_id", limit = MAX_STRING_BYTES
);

id_type!(
    /// The orchestrator's id for a node (a host running the agent).
    ///
    /// Not what a plugin calls the node; that is [`PluginNodeId`].
    NodeId, field = "node_id", limit = MAX_STRING_BYTES
);

id_type!(
    /// The plugin's id for a node: the `node_id` that `NodeGetInfo` returned on that node,
    /// passed to `ControllerPublishVolume` / `ControllerUnpublishVolume`. Up to 256 bytes.
    PluginNodeId, field = "node_id", limit = MAX_PLUGIN_NODE_ID_BYTES
);

id_type!(
    /// The orchestrator's id for a plugin (e.g. `aws-ebs0`), chosen by the operator.
    PluginId, field = "plugin_id", limit = MAX_STRING_BYTES
);

/// A plugin's reported name as the orchestrator's id for it (for an orchestrator that names
/// each plugin after what it says it is). Always valid: a name is 1 to 63 bytes.
impl From<&crate::PluginName> for PluginId {
    fn from(name: &crate::PluginName) -> Self {
        PluginId(name.as_str().to_owned())
    }
}

id_type!(
    /// The plugin's id for a snapshot (`Snapshot.snapshot_id`).
    SnapshotId, field = "snapshot_id", limit = MAX_STRING_BYTES
);

id_type!(
    /// The plugin's id for a group snapshot (`VolumeGroupSnapshot.group_snapshot_id`).
    GroupSnapshotId, field = "group_snapshot_id", limit = MAX_STRING_BYTES
);

id_type!(
    /// The orchestrator's id for a workload (an allocation, a pod…) that claims a volume.
    WorkloadId, field = "workload_id", limit = MAX_STRING_BYTES
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::{Problem, SizeUnit};

    #[test]
    fn a_plugin_name_is_a_valid_plugin_id() {
        let name = crate::PluginName::new("a".repeat(63)).unwrap();
        let id = PluginId::from(&name);
        assert_eq!(PluginId::new(id.as_str()), Ok(id));
    }

    #[test]
    fn limits_per_type() {
        assert!(VolumeId::new("a".repeat(128)).is_ok());
        assert!(VolumeId::new("a".repeat(129)).is_err());
        assert!(PluginNodeId::new("a".repeat(256)).is_ok());
        let err = PluginNodeId::new("a".repeat(257)).unwrap_err();
        assert_eq!(
            err.violations()[0].problem,
            Problem::TooLong {
                size: 257,
                limit: 256,
                unit: SizeUnit::Bytes
            }
        );
        assert!(NodeId::new("a".repeat(129)).is_err());
        let empty = SnapshotId::new("").unwrap_err();
        assert_eq!(empty.violations()[0].field.to_string(), "snapshot_id");
        assert_eq!(empty.violations()[0].problem, Problem::Missing);
    }

    #[test]
    fn accessors_and_display() {
        let id = ExternalVolumeId::new("vol-123").unwrap();
        assert_eq!(id.as_str(), "vol-123");
        assert_eq!(id.to_string(), "vol-123");
        assert_eq!(format!("{id:?}"), "ExternalVolumeId(\"vol-123\")");
        assert_eq!(id, "vol-123");
        assert_eq!(id.into_inner(), "vol-123");
    }

    #[test]
    fn custom_field_name() {
        let err = ExternalVolumeId::new_at("", &FieldPath::named("source_volume_id")).unwrap_err();
        assert_eq!(err.violations()[0].field.to_string(), "source_volume_id");
    }

    #[test]
    fn maps_keyed_by_ids_are_looked_up_with_a_str() {
        let mut by_workload = std::collections::BTreeMap::new();
        by_workload.insert(WorkloadId::new("w1").unwrap(), 1);
        by_workload.insert(WorkloadId::new("w2").unwrap(), 2);
        assert_eq!(by_workload.get("w2"), Some(&2));
        assert_eq!(by_workload.get("w3"), None);
        let plugins: std::collections::HashSet<PluginId> =
            [PluginId::new("mock").unwrap()].into_iter().collect();
        assert!(plugins.contains("mock"));
        assert!(!plugins.contains("mock2"));
    }

    #[test]
    fn serde_is_transparent_and_validates() {
        let id = WorkloadId::new("alloc-1").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"alloc-1\"");
        let back: WorkloadId = serde_json::from_str("\"alloc-1\"").unwrap();
        assert_eq!(back, id);
        assert!(serde_json::from_str::<WorkloadId>("\"\"").is_err());
        let long = format!("\"{}\"", "x".repeat(129));
        assert!(serde_json::from_str::<PluginId>(&long).is_err());
        let long_node = format!("\"{}\"", "x".repeat(200));
        assert!(serde_json::from_str::<PluginNodeId>(&long_node).is_ok());
    }
}
