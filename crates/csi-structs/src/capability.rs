//! Volume capabilities: how a volume is accessed ([`AccessMode`]) and attached
//! ([`AccessType`]: raw block or a mounted filesystem with [`MountOptions`]).
//!
//! ```
//! use csi_structs::{AccessMode, AccessType, MountOptions, VolumeCapability};
//!
//! let cap = VolumeCapability::new(
//!     AccessMode::SingleNodeWriter,
//!     AccessType::Mount(MountOptions::new().with_fs_type("ext4").with_flags(["noatime"])),
//! );
//! assert!(cap.is_single_node() && !cap.is_read_only());
//! assert_eq!(cap.mount_options().and_then(|m| m.fs_type()), Some("ext4"));
//! // Mount flags may carry credentials, so they never print.
//! assert!(!format!("{cap:?}").contains("noatime"));
//! cap.validate().unwrap();
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::hash::{Hash, Hasher};

use csi_proto::v1::volume_capability::access_mode::Mode as WireMode;

use crate::limits::{MAX_MOUNT_FLAGS_BYTES, MAX_STRING_BYTES, check_len};
use crate::validation::{FieldPath, Problem, SizeUnit, ValidationErrors};

/// How a volume may be used across nodes and writers (`VolumeCapability.AccessMode.Mode`).
///
/// All seven modes of the spec. There is no `Unknown` variant and no `Default`: the wire's
/// `UNKNOWN` (0) means "unset", and [`AccessMode::from_wire`] rejects it with
/// [`AccessModeError::Unspecified`]. (In a `ValidateVolumeCapabilities` answer an `UNKNOWN`
/// mode is read as "the plugin did not validate the mode"; see
/// [`confirm`](crate::confirm).)
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum AccessMode {
    /// One node, read-write (`SINGLE_NODE_WRITER` = 1).
    SingleNodeWriter,
    /// One node, read-only (`SINGLE_NODE_READER_ONLY` = 2).
    SingleNodeReaderOnly,
    /// Many nodes, read-only (`MULTI_NODE_READER_ONLY` = 3).
    MultiNodeReaderOnly,
    /// Many nodes, at most one of them writing (`MULTI_NODE_SINGLE_WRITER` = 4).
    MultiNodeSingleWriter,
    /// Many nodes, all may write (`MULTI_NODE_MULTI_WRITER` = 5).
    MultiNodeMultiWriter,
    /// One workload on one node, read-write (`SINGLE_NODE_SINGLE_WRITER` = 6, alpha; needs the
    /// `SINGLE_NODE_MULTI_WRITER` capability).
    SingleNodeSingleWriter,
    /// Many workloads on one node, all may write (`SINGLE_NODE_MULTI_WRITER` = 7, alpha; needs
    /// the `SINGLE_NODE_MULTI_WRITER` capability).
    SingleNodeMultiWriter,
}

/// Why a wire access-mode number is not an [`AccessMode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessModeError {
    /// The number was 0 (`UNKNOWN`): the mode was not set.
    #[error("access mode is UNKNOWN (0), i.e. unset")]
    Unspecified,
    /// The number is not a mode this crate knows (a newer spec, or garbage).
    #[error("access mode {0} is not a known CSI access mode")]
    Unrecognized(i32),
}

impl AccessMode {
    /// Every mode, in wire order.
    pub const ALL: [AccessMode; 7] = [
        AccessMode::SingleNodeWriter,
        AccessMode::SingleNodeReaderOnly,
        AccessMode::MultiNodeReaderOnly,
        AccessMode::MultiNodeSingleWriter,
        AccessMode::MultiNodeMultiWriter,
        AccessMode::SingleNodeSingleWriter,
        AccessMode::SingleNodeMultiWriter,
    ];

    /// The mode for a wire number.
    ///
    /// # Errors
    ///
    /// [`AccessModeError::Unspecified`] for 0 (`UNKNOWN`), [`AccessModeError::Unrecognized`]
    /// for a number the spec (v1.13) does not define.
    pub fn from_wire(value: i32) -> Result<Self, AccessModeError> {
        match WireMode::try_from(value) {
            Ok(WireMode::Unknown) => Err(AccessModeError::Unspecified),
            Ok(WireMode::SingleNodeWriter) => Ok(AccessMode::SingleNodeWriter),
            Ok(WireMode::SingleNodeReaderOnly) => Ok(AccessMode::SingleNodeReaderOnly),
            Ok(WireMode::MultiNodeReaderOnly) => Ok(AccessMode::MultiNodeReaderOnly),
            Ok(WireMode::MultiNodeSingleWriter) => Ok(AccessMode::MultiNodeSingleWriter),
            Ok(WireMode::MultiNodeMultiWriter) => Ok(AccessMode::MultiNodeMultiWriter),
            Ok(WireMode::SingleNodeSingleWriter) => Ok(AccessMode::SingleNodeSingleWriter),
            Ok(WireMode::SingleNodeMultiWriter) => Ok(AccessMode::SingleNodeMultiWriter),
            Err(_) => Err(AccessModeError::Unrecognized(value)),
        }
    }

    /// The wire number of this mode.
    pub const fn to_wire(self) -> i32 {
        self.wire_mode() as i32
    }

    /// The prost enum value of this mode.
    pub const fn wire_mode(self) -> WireMode {
        match self {
            AccessMode::SingleNodeWriter => WireMode::SingleNodeWriter,
            AccessMode::SingleNodeReaderOnly => WireMode::SingleNodeReaderOnly,
            AccessMode::MultiNodeReaderOnly => WireMode::MultiNodeReaderOnly,
            AccessMode::MultiNodeSingleWriter => WireMode::MultiNodeSingleWriter,
            AccessMode::MultiNodeMultiWriter => WireMode::MultiNodeMultiWriter,
            AccessMode::SingleNodeSingleWriter => WireMode::SingleNodeSingleWriter,
            AccessMode::SingleNodeMultiWriter => WireMode::SingleNodeMultiWriter,
        }
    }

    /// The spec's name, e.g. `SINGLE_NODE_WRITER`.
    pub const fn wire_name(self) -> &'static str {
        match self {
            AccessMode::SingleNodeWriter => "SINGLE_NODE_WRITER",
            AccessMode::SingleNodeReaderOnly => "SINGLE_NODE_READER_ONLY",
            AccessMode::MultiNodeReaderOnly => "MULTI_NODE_READER_ONLY",
            AccessMode::MultiNodeSingleWriter => "MULTI_NODE_SINGLE_WRITER",
            AccessMode::MultiNodeMultiWriter => "MULTI_NODE_MULTI_WRITER",
            AccessMode::SingleNodeSingleWriter => "SINGLE_NODE_SINGLE_WRITER",
            AccessMode::SingleNodeMultiWriter => "SINGLE_NODE_MULTI_WRITER",
        }
    }

    /// Whether the volume may be published to several nodes at once (`MULTI_NODE_*`).
    pub const fn is_multi_node(self) -> bool {
        matches!(
            self,
            AccessMode::MultiNodeReaderOnly
                | AccessMode::MultiNodeSingleWriter
                | AccessMode::MultiNodeMultiWriter
        )
    }

    /// Whether the volume is confined to one node (`SINGLE_NODE_*`).
    pub const fn is_single_node(self) -> bool {
        !self.is_multi_node()
    }

    /// Whether nobody may write (`*_READER_ONLY`).
    pub const fn is_read_only(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
        )
    }

    /// Whether several writers may be active at once (`MULTI_NODE_MULTI_WRITER`,
    /// `SINGLE_NODE_MULTI_WRITER`).
    pub const fn allows_multiple_writers(self) -> bool {
        matches!(
            self,
            AccessMode::MultiNodeMultiWriter | AccessMode::SingleNodeMultiWriter
        )
    }

    /// Whether one node may hold several publications (target paths) of the volume:
    /// `MULTI_NODE_*` and `SINGLE_NODE_MULTI_WRITER` (spec §4.5).
    pub const fn allows_multiple_publications_per_node(self) -> bool {
        self.is_multi_node() || matches!(self, AccessMode::SingleNodeMultiWriter)
    }

    /// Whether this mode needs the plugin's `SINGLE_NODE_MULTI_WRITER` capability (the alpha
    /// modes 6 and 7).
    pub const fn needs_single_node_multi_writer_capability(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeSingleWriter | AccessMode::SingleNodeMultiWriter
        )
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.wire_name())
    }
}

/// A string that names no [`AccessMode`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown access mode {value:?} (expected e.g. single-node-writer, single_node_writer or SINGLE_NODE_WRITER)"
)]
pub struct UnknownAccessMode {
    /// The string received.
    pub value: String,
}

impl std::str::FromStr for AccessMode {
    type Err = UnknownAccessMode;

    /// Parses the spec's name (`SINGLE_NODE_WRITER`) in any case, with `_` or `-` between
    /// words (`single-node-writer`, the form job files commonly use).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let normalized = s.trim().replace('-', "_").to_ascii_uppercase();
        AccessMode::ALL
            .into_iter()
            .find(|m| m.wire_name() == normalized)
            .ok_or_else(|| UnknownAccessMode {
                value: s.to_string(),
            })
    }
}

impl TryFrom<i32> for AccessMode {
    type Error = AccessModeError;
    fn try_from(value: i32) -> Result<Self, Self::Error> {
        AccessMode::from_wire(value)
    }
}

impl From<AccessMode> for i32 {
    fn from(mode: AccessMode) -> i32 {
        mode.to_wire()
    }
}

/// Mount flags (`MountVolume.mount_flags`) with set semantics.
///
/// Order and repetition do not matter for equality or hashing: `["ro", "noatime"]` equals
/// `["noatime", "ro", "ro"]`. The flags are kept in the order given, so a round trip through
/// the wire preserves them exactly.
///
/// Mount flags can carry credentials (`password=…`), so `Debug` and `Display` print only how
/// many there are. Read them with [`iter`](Self::iter) when you must.
#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct MountFlags(Vec<String>);

impl MountFlags {
    /// No flags.
    pub const fn none() -> Self {
        Self(Vec::new())
    }

    /// Flags from any list of strings, kept in the order given.
    pub fn new<I, S>(flags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self(flags.into_iter().map(Into::into).collect())
    }

    /// The flags, in the order given. Handle with care: they may hold credentials.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// The flags as a slice, in the order given. Handle with care: they may hold credentials.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// The flags by value.
    pub fn into_vec(self) -> Vec<String> {
        self.0
    }

    /// How many flags were given (repetitions included).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no flags.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `flag` is one of the flags.
    pub fn contains(&self, flag: &str) -> bool {
        self.0.iter().any(|f| f == flag)
    }

    /// The distinct flags, sorted.
    pub fn to_set(&self) -> BTreeSet<&str> {
        self.0.iter().map(String::as_str).collect()
    }

    /// The total size of all flags in bytes, as limited by
    /// [`MAX_MOUNT_FLAGS_BYTES`].
    pub fn total_bytes(&self) -> usize {
        self.0.iter().map(String::len).sum()
    }

    /// How the distinct flags of `self` and `other` differ, by count only (never by value):
    /// `(only_in_self, only_in_other)`.
    pub fn difference_counts(&self, other: &MountFlags) -> (usize, usize) {
        let a = self.to_set();
        let b = other.to_set();
        (a.difference(&b).count(), b.difference(&a).count())
    }
}

impl PartialEq for MountFlags {
    fn eq(&self, other: &Self) -> bool {
        self.to_set() == other.to_set()
    }
}

impl Eq for MountFlags {}

impl Hash for MountFlags {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.to_set().hash(state);
    }
}

impl fmt::Debug for MountFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MountFlags(<{} redacted>)", self.0.len())
    }
}

impl fmt::Display for MountFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} mount flags redacted>", self.0.len())
    }
}

impl<S: Into<String>> FromIterator<S> for MountFlags {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        Self::new(iter)
    }
}

/// How a filesystem volume is mounted (`VolumeCapability.MountVolume`).
///
/// An empty fs type or mount group on the wire means "unspecified" and is `None` here; the
/// builders store an empty string as `None` too, so there is one representation of "unset".
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct MountOptions {
    #[serde(default, deserialize_with = "empty_as_none")]
    fs_type: Option<String>,
    #[serde(default)]
    mount_flags: MountFlags,
    #[serde(default, deserialize_with = "empty_as_none")]
    volume_mount_group: Option<String>,
}

/// Deserializes `""` as `None`, keeping one representation of "unspecified".
fn empty_as_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let value: Option<String> = serde::Deserialize::deserialize(d)?;
    Ok(value.filter(|v| !v.is_empty()))
}

fn non_empty(value: String) -> Option<String> {
    if value.is_empty() { None } else { Some(value) }
}

impl MountOptions {
    /// No fs type, no flags, no mount group: the plugin chooses.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the filesystem type (`""` = unspecified).
    #[must_use]
    pub fn with_fs_type(mut self, fs_type: impl Into<String>) -> Self {
        self.fs_type = non_empty(fs_type.into());
        self
    }

    /// Sets the mount flags.
    #[must_use]
    pub fn with_flags<I, S>(mut self, flags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.mount_flags = MountFlags::new(flags);
        self
    }

    /// Sets the mount flags.
    #[must_use]
    pub fn with_mount_flags(mut self, flags: MountFlags) -> Self {
        self.mount_flags = flags;
        self
    }

    /// Sets the volume mount group (a group id the plugin applies to the mount; needs the
    /// node's `VOLUME_MOUNT_GROUP` capability). `""` = unspecified.
    #[must_use]
    pub fn with_volume_mount_group(mut self, group: impl Into<String>) -> Self {
        self.volume_mount_group = non_empty(group.into());
        self
    }

    /// The filesystem type, if specified.
    pub fn fs_type(&self) -> Option<&str> {
        self.fs_type.as_deref()
    }

    /// The mount flags.
    pub fn mount_flags(&self) -> &MountFlags {
        &self.mount_flags
    }

    /// The volume mount group, if specified.
    pub fn volume_mount_group(&self) -> Option<&str> {
        self.volume_mount_group.as_deref()
    }

    /// Checks the size limits: fs type and mount group at most 128 bytes, all flags together
    /// at most 4 KiB. Paths in errors are relative to the `MountVolume` message.
    ///
    /// # Errors
    ///
    /// Every limit exceeded, at once.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errs = ValidationErrors::new();
        self.check(&mut errs, &FieldPath::root());
        errs.into_result(())
    }

    pub(crate) fn check(&self, errs: &mut ValidationErrors, at: &FieldPath) {
        if let Some(fs) = &self.fs_type {
            check_len(errs, &at.clone().field("fs_type"), fs, MAX_STRING_BYTES);
        }
        if let Some(group) = &self.volume_mount_group {
            check_len(
                errs,
                &at.clone().field("volume_mount_group"),
                group,
                MAX_STRING_BYTES,
            );
        }
        let total = self.mount_flags.total_bytes();
        if total > MAX_MOUNT_FLAGS_BYTES {
            errs.push(
                at.clone().field("mount_flags"),
                Problem::TooLong {
                    size: total,
                    limit: MAX_MOUNT_FLAGS_BYTES,
                    unit: SizeUnit::Bytes,
                },
            );
        }
    }
}

/// Whether a volume is attached as a raw block device or as a mounted filesystem
/// (the `access_type` oneof). No default: a capability always says which.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessType {
    /// A raw block device.
    Block,
    /// A mounted filesystem.
    Mount(MountOptions),
}

impl AccessType {
    /// Which kind this is, without the mount options.
    pub const fn kind(&self) -> AccessTypeKind {
        match self {
            AccessType::Block => AccessTypeKind::Block,
            AccessType::Mount(_) => AccessTypeKind::Mount,
        }
    }

    /// The mount options, for a filesystem.
    pub fn mount_options(&self) -> Option<&MountOptions> {
        match self {
            AccessType::Block => None,
            AccessType::Mount(m) => Some(m),
        }
    }
}

/// The kind of an [`AccessType`], without its options: what error messages may show.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum AccessTypeKind {
    /// A raw block device.
    Block,
    /// A mounted filesystem.
    Mount,
}

impl fmt::Display for AccessTypeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessTypeKind::Block => "block",
            AccessTypeKind::Mount => "mount",
        })
    }
}

/// A way to use a volume: access mode plus access type (`csi.v1.VolumeCapability`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct VolumeCapability {
    /// How the volume is shared.
    pub access_mode: AccessMode,
    /// How the volume is attached.
    pub access_type: AccessType,
}

impl VolumeCapability {
    /// A capability from its two parts.
    pub const fn new(access_mode: AccessMode, access_type: AccessType) -> Self {
        Self {
            access_mode,
            access_type,
        }
    }

    /// A raw block capability.
    pub const fn block(access_mode: AccessMode) -> Self {
        Self::new(access_mode, AccessType::Block)
    }

    /// A filesystem capability with these mount options.
    pub const fn mount(access_mode: AccessMode, options: MountOptions) -> Self {
        Self::new(access_mode, AccessType::Mount(options))
    }

    /// Whether this is a raw block capability.
    pub const fn is_block(&self) -> bool {
        matches!(self.access_type, AccessType::Block)
    }

    /// Whether this is a filesystem capability.
    pub const fn is_mount(&self) -> bool {
        matches!(self.access_type, AccessType::Mount(_))
    }

    /// The mount options, for a filesystem capability.
    pub fn mount_options(&self) -> Option<&MountOptions> {
        self.access_type.mount_options()
    }

    /// See [`AccessMode::is_multi_node`].
    pub const fn is_multi_node(&self) -> bool {
        self.access_mode.is_multi_node()
    }

    /// See [`AccessMode::is_single_node`].
    pub const fn is_single_node(&self) -> bool {
        self.access_mode.is_single_node()
    }

    /// See [`AccessMode::is_read_only`].
    pub const fn is_read_only(&self) -> bool {
        self.access_mode.is_read_only()
    }

    /// See [`AccessMode::allows_multiple_writers`].
    pub const fn allows_multiple_writers(&self) -> bool {
        self.access_mode.allows_multiple_writers()
    }

    /// Checks the size limits of the mount options. Paths are relative to the capability,
    /// e.g. `mount.fs_type`.
    ///
    /// # Errors
    ///
    /// Every limit exceeded, at once.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errs = ValidationErrors::new();
        self.check(&mut errs, &FieldPath::root());
        errs.into_result(())
    }

    pub(crate) fn check(&self, errs: &mut ValidationErrors, at: &FieldPath) {
        if let AccessType::Mount(m) = &self.access_type {
            m.check(errs, &at.clone().field("mount"));
        }
    }
}

/// Checks a list of capabilities, naming each by its index, e.g.
/// `volume_capabilities[1].mount.fs_type`.
///
/// # Errors
///
/// Every limit exceeded in every capability, at once; [`Problem::Missing`] when the list is
/// empty (the spec requires at least one).
pub fn validate_capabilities(
    field: &'static str,
    caps: &[VolumeCapability],
) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::new();
    check_capabilities(&mut errs, &FieldPath::named(field), caps);
    errs.into_result(())
}

pub(crate) fn check_capabilities(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    caps: &[VolumeCapability],
) {
    if caps.is_empty() {
        errs.push(at.clone(), Problem::Missing);
    }
    for (i, cap) in caps.iter().enumerate() {
        cap.check(errs, &at.clone().index(i));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_numbers_table() {
        let table = [
            (1, AccessMode::SingleNodeWriter),
            (2, AccessMode::SingleNodeReaderOnly),
            (3, AccessMode::MultiNodeReaderOnly),
            (4, AccessMode::MultiNodeSingleWriter),
            (5, AccessMode::MultiNodeMultiWriter),
            (6, AccessMode::SingleNodeSingleWriter),
            (7, AccessMode::SingleNodeMultiWriter),
        ];
        for (n, mode) in table {
            assert_eq!(AccessMode::from_wire(n), Ok(mode));
            assert_eq!(mode.to_wire(), n);
        }
        assert_eq!(AccessMode::from_wire(0), Err(AccessModeError::Unspecified));
        assert_eq!(
            AccessMode::from_wire(8),
            Err(AccessModeError::Unrecognized(8))
        );
        assert_eq!(
            AccessMode::from_wire(-1),
            Err(AccessModeError::Unrecognized(-1))
        );
    }

    #[test]
    fn mode_names_parse() {
        for mode in AccessMode::ALL {
            assert_eq!(mode.wire_name().parse::<AccessMode>(), Ok(mode));
            assert_eq!(
                mode.wire_name()
                    .to_lowercase()
                    .replace('_', "-")
                    .parse::<AccessMode>(),
                Ok(mode)
            );
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json.trim_matches('"').parse::<AccessMode>(), Ok(mode));
        }
        assert!("single-node".parse::<AccessMode>().is_err());
        assert!("".parse::<AccessMode>().is_err());
    }

    #[test]
    fn mode_predicates_table() {
        // mode, multi-node, read-only, multiple writers, multiple publications per node
        let table = [
            (AccessMode::SingleNodeWriter, false, false, false, false),
            (AccessMode::SingleNodeReaderOnly, false, true, false, false),
            (AccessMode::MultiNodeReaderOnly, true, true, false, true),
            (AccessMode::MultiNodeSingleWriter, true, false, false, true),
            (AccessMode::MultiNodeMultiWriter, true, false, true, true),
            (
                AccessMode::SingleNodeSingleWriter,
                false,
                false,
                false,
                false,
            ),
            (AccessMode::SingleNodeMultiWriter, false, false, true, true),
        ];
        for (mode, multi, ro, writers, pubs) in table {
            assert_eq!(mode.is_multi_node(), multi, "{mode}");
            assert_eq!(mode.is_single_node(), !multi, "{mode}");
            assert_eq!(mode.is_read_only(), ro, "{mode}");
            assert_eq!(mode.allows_multiple_writers(), writers, "{mode}");
            assert_eq!(mode.allows_multiple_publications_per_node(), pubs, "{mode}");
        }
    }

    #[test]
    fn mount_flags_are_a_set_and_redacted() {
        let a = MountFlags::new(["ro", "password=hunter2"]);
        let b = MountFlags::new(["password=hunter2", "ro", "ro"]);
        assert_eq!(a, b);
        assert_ne!(a, MountFlags::new(["ro"]));
        let hash = |f: &MountFlags| {
            use std::collections::hash_map::DefaultHasher;
            let mut h = DefaultHasher::new();
            f.hash(&mut h);
            h.finish()
        };
        assert_eq!(hash(&a), hash(&b));
        for shown in [
            format!("{a:?}"),
            a.to_string(),
            format!("{:?}", MountOptions::new().with_mount_flags(a.clone())),
        ] {
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        assert_eq!(
            a.difference_counts(&MountFlags::new(["ro", "x", "y"])),
            (1, 2)
        );
    }

    #[test]
    fn empty_strings_mean_unspecified() {
        let m = MountOptions::new()
            .with_fs_type("")
            .with_volume_mount_group("");
        assert_eq!(m, MountOptions::new());
        assert_eq!(m.fs_type(), None);
    }

    #[test]
    fn validation_names_paths_and_limits() {
        let caps = vec![
            VolumeCapability::block(AccessMode::SingleNodeWriter),
            VolumeCapability::mount(
                AccessMode::SingleNodeWriter,
                MountOptions::new()
                    .with_fs_type("x".repeat(129))
                    .with_volume_mount_group("g".repeat(130))
                    .with_flags(vec!["f".repeat(2049), "g".repeat(2048)]),
            ),
        ];
        let errs = validate_capabilities("volume_capabilities", &caps).unwrap_err();
        let got: Vec<(String, Problem)> = errs
            .into_iter()
            .map(|v| (v.field.to_string(), v.problem))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "volume_capabilities[1].mount.fs_type".to_string(),
                    Problem::TooLong {
                        size: 129,
                        limit: 128,
                        unit: SizeUnit::Bytes
                    }
                ),
                (
                    "volume_capabilities[1].mount.volume_mount_group".to_string(),
                    Problem::TooLong {
                        size: 130,
                        limit: 128,
                        unit: SizeUnit::Bytes
                    }
                ),
                (
                    "volume_capabilities[1].mount.mount_flags".to_string(),
                    Problem::TooLong {
                        size: 4097,
                        limit: 4096,
                        unit: SizeUnit::Bytes
                    }
                ),
            ]
        );
        let none = validate_capabilities("volume_capabilities", &[]).unwrap_err();
        assert_eq!(none.violations()[0].problem, Problem::Missing);
    }

    #[test]
    fn empty_strings_deserialize_as_unspecified() {
        let m: MountOptions =
            serde_json::from_str(r#"{"fs_type":"","volume_mount_group":"","mount_flags":[]}"#)
                .unwrap();
        assert_eq!(m, MountOptions::new());
        let m: MountOptions = serde_json::from_str("{}").unwrap();
        assert_eq!(m, MountOptions::new());
    }

    #[test]
    fn serde_shape() {
        let cap = VolumeCapability::mount(
            AccessMode::MultiNodeReaderOnly,
            MountOptions::new().with_fs_type("xfs"),
        );
        let json = serde_json::to_value(&cap).unwrap();
        assert_eq!(json["access_mode"], "multi_node_reader_only");
        assert_eq!(json["access_type"]["mount"]["fs_type"], "xfs");
        let back: VolumeCapability = serde_json::from_value(json).unwrap();
        assert_eq!(back, cap);
        let block =
            serde_json::to_value(VolumeCapability::block(AccessMode::SingleNodeWriter)).unwrap();
        assert_eq!(block["access_type"], "block");
    }
}
