//! What a plugin says about itself ([`PluginInfo`], from `GetPluginInfo`) and about the node
//! it runs on ([`NodeInfo`], from `NodeGetInfo`).
//!
//! ```
//! use csi_structs::{PluginName, NodeInfo, PluginNodeId};
//! use std::num::NonZeroU64;
//!
//! use csi_structs::{Manifest, PluginInfo};
//!
//! let name = PluginName::new("ebs.csi.example.com")?;
//! assert!(PluginName::new("-bad").is_err());
//! let plugin = PluginInfo::new(name, "1.4.0", Manifest::new())?;
//! assert!(PluginInfo::new(plugin.name.clone(), "", Manifest::new()).is_err());
//! let info = NodeInfo {
//!     node_id: PluginNodeId::new("i-0abc")?,
//!     max_volumes: NonZeroU64::new(25),
//!     topology: None,
//! };
//! assert_eq!(info.max_volumes.map(NonZeroU64::get), Some(25));
//! # Ok::<(), csi_structs::ValidationErrors>(())
//! ```

use std::fmt;
use std::num::NonZeroU64;

use crate::ids::PluginNodeId;
use crate::maps::Manifest;
use crate::topology::{Topology, check_name_like};
use crate::validation::{FieldPath, Syntax, ValidationErrors};

/// A plugin's self-reported name (`GetPluginInfoResponse.name`): domain-name style, at most
/// 63 characters, alphanumerics at both ends, `-`, `.` and alphanumerics inside (spec §2.1).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PluginName(String);

impl PluginName {
    /// Checks and wraps `name`.
    ///
    /// # Errors
    ///
    /// Every broken rule of spec §2.1, under the field `name`.
    pub fn new(name: impl Into<String>) -> Result<Self, ValidationErrors> {
        Self::new_at(name, &FieldPath::named("name"))
    }

    /// Like [`new`](Self::new), naming `field` in errors.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn new_at(name: impl Into<String>, field: &FieldPath) -> Result<Self, ValidationErrors> {
        let name = name.into();
        let mut errs = ValidationErrors::new();
        check_name_like(&mut errs, field, &name, Syntax::PluginName);
        errs.into_result(Self(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PluginName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for PluginName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PluginName({:?})", self.0)
    }
}

impl TryFrom<String> for PluginName {
    type Error = ValidationErrors;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<PluginName> for String {
    fn from(n: PluginName) -> String {
        n.0
    }
}

/// The answer of `GetPluginInfo`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PluginInfo {
    /// The plugin's name (e.g. `ebs.csi.example.com`).
    pub name: PluginName,
    /// The plugin's version, opaque to the orchestrator; non-empty, at most 128 bytes.
    pub vendor_version: String,
    /// Anything else the plugin wants to say, opaque.
    pub manifest: Manifest,
}

impl PluginInfo {
    /// Checks `vendor_version` (non-empty, at most 128 bytes; the name and manifest are
    /// checked by their types) and builds the info.
    ///
    /// # Errors
    ///
    /// `vendor_version` [`Problem::Missing`](crate::Problem::Missing) or
    /// [`Problem::TooLong`](crate::Problem::TooLong).
    pub fn new(
        name: PluginName,
        vendor_version: impl Into<String>,
        manifest: Manifest,
    ) -> Result<Self, ValidationErrors> {
        let vendor_version = vendor_version.into();
        let mut errs = ValidationErrors::new();
        crate::limits::check_required(
            &mut errs,
            &FieldPath::named("vendor_version"),
            &vendor_version,
            crate::limits::MAX_STRING_BYTES,
        );
        errs.into_result(Self {
            name,
            vendor_version,
            manifest,
        })
    }
}

/// The answer of `NodeGetInfo`: who the node is to the plugin.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    /// The node id to pass to `ControllerPublishVolume` (at most 256 bytes).
    pub node_id: PluginNodeId,
    /// How many volumes the plugin can publish on this node; `None` (wire 0) means the
    /// plugin sets no limit and the orchestrator decides.
    pub max_volumes: Option<NonZeroU64>,
    /// Where the node sits; `None` means it has no topology constraints.
    pub topology: Option<Topology>,
}
