//! The agent protocol on the wire: the generated messages and stubs ([`pb`]), and the helpers
//! that turn them into domain types, validating every field like user input.
//!
//! Messages with a `secrets` field get a `Debug` generated from the descriptor that prints the
//! secret keys but never a value ([`SECRET_MESSAGES`] lists them).

use std::fmt;
use std::time::Duration;

use csi_structs::capability::AccessModeError;
use csi_structs::limits::MAX_STRING_BYTES;
use csi_structs::validation::SizeUnit;
use csi_structs::{
    AccessMode, AccessType, ContentSource, ExternalVolumeId, FieldPath, MountFlags, MountOptions,
    NodeId, Parameters, PluginId, PluginNodeId, Problem, PublishContext, Secrets, SnapshotId,
    Topology, TopologyRequirement, ValidationErrors, VolumeCapability, VolumeContext, VolumeId,
    WorkloadId,
};

use std::collections::BTreeMap;

/// Messages, enums, the client (`agent_client`) and the server (`agent_server`) of package
/// `csisdk.agent.v1`.
#[allow(
    missing_docs,
    clippy::all,
    unreachable_pub,
    missing_debug_implementations
)]
pub mod pb {
    tonic::include_proto!("csisdk.agent.v1");
}

include!(concat!(env!("OUT_DIR"), "/secret_debug.rs"));

/// The protobuf package of the agent protocol. The `v1` is its version: an incompatible
/// change gets a new package, served beside the old one.
pub const PACKAGE: &str = "csisdk.agent.v1";

/// The largest encoded request or response an agent accepts, in bytes. Every field has a
/// limit far below this; the cap stops a peer from making us buffer megabytes.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// The longest plugin or reason message carried in an error, in bytes; longer ones are cut.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;

/// A problem with an enum-valued field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnumProblem {
    /// The access mode number is unset or unknown.
    #[error(transparent)]
    AccessMode(#[from] AccessModeError),
    /// The access type is unset or unknown.
    #[error("access type is unset or unknown ({0})")]
    AccessType(i32),
}

/// A message from another agent (or from a caller) broke the protocol's rules. Lists every
/// problem found, each naming its field.
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
pub struct InvalidMessage {
    /// Size, id and required-field violations.
    pub violations: ValidationErrors,
    /// Enum fields with values outside their range.
    pub enums: Vec<(FieldPath, EnumProblem)>,
}

impl InvalidMessage {
    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.violations.is_empty() && self.enums.is_empty()
    }

    /// One line per problem, naming the field, as carried in an error detail.
    pub fn lines(&self) -> Vec<String> {
        self.violations
            .violations()
            .iter()
            .map(ToString::to_string)
            .chain(self.enums.iter().map(|(f, p)| format!("{f} {p}")))
            .collect()
    }
}

impl fmt::Display for InvalidMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid message: {}", self.lines().join("; "))
    }
}

/// Ids that can be parsed from a wire string.
pub(crate) trait WireId: Sized {
    fn parse(value: String, field: &FieldPath) -> Result<Self, ValidationErrors>;
    fn to_wire(&self) -> String;
}

macro_rules! wire_id {
    ($($t:ty),*) => {$(
        impl WireId for $t {
            fn parse(value: String, field: &FieldPath) -> Result<Self, ValidationErrors> {
                <$t>::new_at(value, field)
            }
            fn to_wire(&self) -> String {
                self.as_str().to_owned()
            }
        }
    )*};
}
wire_id!(
    VolumeId,
    ExternalVolumeId,
    NodeId,
    PluginId,
    PluginNodeId,
    SnapshotId,
    WorkloadId
);

/// String maps that can be parsed from a wire map.
pub(crate) trait WireMap: Sized {
    fn parse(value: BTreeMap<String, String>, field: &FieldPath) -> Result<Self, ValidationErrors>;
    fn to_wire_map(&self) -> BTreeMap<String, String>;
}

macro_rules! wire_map {
    ($($t:ty),*) => {$(
        impl WireMap for $t {
            fn parse(value: BTreeMap<String, String>, field: &FieldPath) -> Result<Self, ValidationErrors> {
                <$t>::try_new_at(value, field)
            }
            fn to_wire_map(&self) -> BTreeMap<String, String> {
                self.clone().into()
            }
        }
    )*};
}
wire_map!(Parameters, VolumeContext, PublishContext, Secrets);

/// Collects every problem of one message while decoding it.
#[derive(Default)]
pub(crate) struct Decoder {
    found: InvalidMessage,
}

impl Decoder {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn at(field: &'static str) -> FieldPath {
        FieldPath::named(field)
    }

    /// A required id.
    pub(crate) fn id<T: WireId>(&mut self, field: &'static str, value: String) -> Option<T> {
        self.id_at(&Self::at(field), value)
    }

    pub(crate) fn id_at<T: WireId>(&mut self, field: &FieldPath, value: String) -> Option<T> {
        match T::parse(value, field) {
            Ok(id) => Some(id),
            Err(e) => {
                self.found.violations.extend(e);
                None
            }
        }
    }

    /// An optional id: empty means absent.
    pub(crate) fn opt_id<T: WireId>(
        &mut self,
        field: &'static str,
        value: String,
    ) -> Option<Option<T>> {
        if value.is_empty() {
            Some(None)
        } else {
            self.id(field, value).map(Some)
        }
    }

    /// An optional string of at most 128 bytes.
    pub(crate) fn string(&mut self, field: &'static str, value: String) -> String {
        self.check_string(field, &value);
        value
    }

    pub(crate) fn check_string(&mut self, field: &'static str, value: &str) {
        if value.len() > MAX_STRING_BYTES {
            self.found.violations.push(
                Self::at(field),
                Problem::TooLong {
                    size: value.len(),
                    limit: MAX_STRING_BYTES,
                    unit: SizeUnit::Bytes,
                },
            );
        }
    }

    /// A create request's `name` (the plugin's idempotency key): required, at most 128 bytes,
    /// and none of the control characters the spec bans, by csi-structs' one rule.
    pub(crate) fn request_name(&mut self, field: &'static str, value: String) -> String {
        if let Err(errors) = csi_structs::limits::validate_request_name(&Self::at(field), &value) {
            self.found.violations.extend(errors);
        }
        value
    }

    /// A size in bytes or a count: never negative.
    pub(crate) fn non_negative<T: Into<i64> + Copy>(&mut self, field: &'static str, value: T) -> T {
        self.non_negative_at(&Self::at(field), value)
    }

    /// A size in bytes or a count at a nested path (a list entry's field): never negative.
    pub(crate) fn non_negative_at<T: Into<i64> + Copy>(
        &mut self,
        field: &FieldPath,
        value: T,
    ) -> T {
        let v: i64 = value.into();
        if v < 0 {
            self.found
                .violations
                .push(field.clone(), Problem::Negative { value: v });
        }
        value
    }

    /// A capacity range sent as two byte counts, `required_bytes` and `limit_bytes` (0: unset):
    /// neither negative, and, when any is set, csi-structs' `CapacityRange` rules (a limit not
    /// below the requirement, no bound over `i64::MAX`).
    pub(crate) fn capacity(&mut self, required: i64, limit: i64) -> (i64, i64) {
        let required = self.non_negative("required_bytes", required);
        let limit = self.non_negative("limit_bytes", limit);
        if (required > 0 || limit > 0)
            && let Err(errors) = csi_structs::CapacityRange::new(
                u64::try_from(required).ok(),
                u64::try_from(limit).ok(),
            )
        {
            self.found.violations.extend(errors);
        }
        (required, limit)
    }

    /// A string map (context, parameters, secrets) under its own rules: 4 KiB, and for
    /// secrets the key syntax too.
    pub(crate) fn map<M: WireMap>(
        &mut self,
        field: &'static str,
        value: BTreeMap<String, String>,
    ) -> Option<M> {
        match M::parse(value, &Self::at(field)) {
            Ok(m) => Some(m),
            Err(e) => {
                self.found.violations.extend(e);
                None
            }
        }
    }

    /// A required capability.
    pub(crate) fn capability(
        &mut self,
        field: &'static str,
        value: Option<pb::Capability>,
    ) -> Option<VolumeCapability> {
        match value {
            Some(c) => self.capability_at(&Self::at(field), c),
            None => {
                self.found
                    .violations
                    .push(Self::at(field), Problem::Missing);
                None
            }
        }
    }

    /// A list of at least one capability.
    pub(crate) fn capabilities(
        &mut self,
        field: &'static str,
        value: Vec<pb::Capability>,
    ) -> Option<Vec<VolumeCapability>> {
        if value.is_empty() {
            self.found
                .violations
                .push(Self::at(field), Problem::Missing);
            return None;
        }
        let mut out = Vec::with_capacity(value.len());
        for (i, c) in value.into_iter().enumerate() {
            if let Some(cap) = self.capability_at(&Self::at(field).index(i), c) {
                out.push(cap);
            }
        }
        Some(out)
    }

    pub(crate) fn capability_at(
        &mut self,
        at: &FieldPath,
        c: pb::Capability,
    ) -> Option<VolumeCapability> {
        let mode = match AccessMode::from_wire(c.access_mode) {
            Ok(m) => Some(m),
            Err(e) => {
                self.found
                    .enums
                    .push((at.clone().field("access_mode"), e.into()));
                None
            }
        };
        let access_type = match pb::AccessType::try_from(c.access_type) {
            Ok(pb::AccessType::Block) => Some(AccessType::Block),
            Ok(pb::AccessType::Mount) => Some(AccessType::Mount(
                MountOptions::new()
                    .with_fs_type(c.fs_type)
                    .with_mount_flags(MountFlags::new(c.mount_flags))
                    .with_volume_mount_group(c.volume_mount_group),
            )),
            Ok(pb::AccessType::Unspecified) | Err(_) => {
                self.found.enums.push((
                    at.clone().field("access_type"),
                    EnumProblem::AccessType(c.access_type),
                ));
                None
            }
        };
        let cap = VolumeCapability::new(mode?, access_type?);
        if let Err(e) = cap.validate() {
            self.found.violations.extend_under(at, e);
        }
        Some(cap)
    }

    /// A list of topologies (empty: reachable from everywhere), each by csi-structs' rules.
    pub(crate) fn topologies(
        &mut self,
        field: &'static str,
        value: Vec<pb::Topology>,
    ) -> Option<Vec<Topology>> {
        self.topologies_at(&Self::at(field), value)
    }

    fn topologies_at(&mut self, at: &FieldPath, value: Vec<pb::Topology>) -> Option<Vec<Topology>> {
        let mut out = Vec::with_capacity(value.len());
        let mut complete = true;
        for (i, t) in value.into_iter().enumerate() {
            let segments: std::collections::HashMap<String, String> =
                t.segments.into_iter().collect();
            match Topology::from_wire_at(&segments, &at.clone().index(i)) {
                Ok(t) => out.push(t),
                Err(e) => {
                    self.found.violations.extend(e);
                    complete = false;
                }
            }
        }
        complete.then_some(out)
    }

    /// An optional topology requirement, by csi-structs' rules (a list set, preferred ones
    /// among the requisite ones).
    pub(crate) fn requirement(
        &mut self,
        field: &'static str,
        value: Option<pb::TopologyRequirement>,
    ) -> Option<Option<TopologyRequirement>> {
        let Some(r) = value else {
            return Some(None);
        };
        let at = Self::at(field);
        let requisite = self.topologies_at(&at.clone().field("requisite"), r.requisite);
        let preferred = self.topologies_at(&at.clone().field("preferred"), r.preferred);
        match TopologyRequirement::new(requisite?, preferred?) {
            Ok(r) => Some(Some(r)),
            Err(e) => {
                self.found.violations.extend_under(&at, e);
                None
            }
        }
    }

    /// A create's content source: absent is `Some(None)`; one without a type is missing.
    pub(crate) fn content_source(
        &mut self,
        field: &'static str,
        value: Option<pb::VolumeContentSource>,
    ) -> Option<Option<ContentSource>> {
        let Some(source) = value else {
            return Some(None);
        };
        let at = Self::at(field);
        match source.r#type {
            Some(pb::volume_content_source::Type::SnapshotId(id)) => self
                .id_at(&at.field("snapshot_id"), id)
                .map(|id| Some(ContentSource::Snapshot(id))),
            Some(pb::volume_content_source::Type::VolumeId(id)) => self
                .id_at(&at.field("volume_id"), id)
                .map(|id| Some(ContentSource::Volume(id))),
            None => {
                self.found.violations.push(at, Problem::Missing);
                None
            }
        }
    }

    /// `Ok(value)` when nothing was found and `build` produced the value.
    pub(crate) fn finish<T>(self, build: impl FnOnce() -> Option<T>) -> Result<T, InvalidMessage> {
        if !self.found.is_empty() {
            return Err(self.found);
        }
        // Every `None` above records a problem, so with nothing found `build` returns `Some`;
        // should that ever not hold, the caller still gets an error instead of a panic.
        build().ok_or(self.found)
    }
}

/// The wire form of a topology.
pub(crate) fn topology_to_wire(t: &Topology) -> pb::Topology {
    pb::Topology {
        segments: t.as_map().clone(),
    }
}

/// The wire form of a topology requirement.
/// A content source as the agents' wire carries it.
pub(crate) fn content_source_to_wire(source: &ContentSource) -> pb::VolumeContentSource {
    use pb::volume_content_source::Type;
    pb::VolumeContentSource {
        r#type: Some(match source {
            ContentSource::Snapshot(id) => Type::SnapshotId(id.to_wire()),
            ContentSource::Volume(id) => Type::VolumeId(id.to_wire()),
        }),
    }
}

pub(crate) fn requirement_to_wire(r: &TopologyRequirement) -> pb::TopologyRequirement {
    pb::TopologyRequirement {
        requisite: r.requisite().iter().map(topology_to_wire).collect(),
        preferred: r.preferred().iter().map(topology_to_wire).collect(),
    }
}

/// The wire form of a capability.
pub(crate) fn capability_to_wire(cap: &VolumeCapability) -> pb::Capability {
    match &cap.access_type {
        AccessType::Block => pb::Capability {
            access_mode: cap.access_mode.to_wire(),
            access_type: pb::AccessType::Block as i32,
            ..Default::default()
        },
        AccessType::Mount(m) => pb::Capability {
            access_mode: cap.access_mode.to_wire(),
            access_type: pb::AccessType::Mount as i32,
            fs_type: m.fs_type().unwrap_or_default().to_owned(),
            mount_flags: m.mount_flags().as_slice().to_vec(),
            volume_mount_group: m.volume_mount_group().unwrap_or_default().to_owned(),
        },
    }
}

/// Reads a `grpc-timeout` header value: up to 8 digits and a unit (`H`, `M`, `S`, `m`, `u`,
/// `n`). `None` when it is malformed.
pub(crate) fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Cuts `message` to at most [`MAX_ERROR_MESSAGE_BYTES`], on a character boundary.
pub(crate) fn cap_message(mut message: String) -> String {
    if message.len() > MAX_ERROR_MESSAGE_BYTES {
        let mut end = MAX_ERROR_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_values() {
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(parse_grpc_timeout("123456789m"), None);
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout(""), None);
        assert_eq!(parse_grpc_timeout("1x"), None);
        assert_eq!(parse_grpc_timeout("-1S"), None);
    }

    #[test]
    fn capability_round_trip_and_bad_enums() {
        let cap = VolumeCapability::mount(
            AccessMode::MultiNodeReaderOnly,
            MountOptions::new().with_fs_type("ext4").with_flags(["ro"]),
        );
        let mut d = Decoder::new();
        let back = d.capability_at(&FieldPath::named("c"), capability_to_wire(&cap));
        assert_eq!(back, Some(cap));

        let mut d = Decoder::new();
        let bad = pb::Capability {
            access_mode: 0,
            access_type: 9,
            ..Default::default()
        };
        assert_eq!(d.capability_at(&FieldPath::named("c"), bad), None);
        let err = d.finish(|| Some(())).unwrap_err();
        let lines = err.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("c.access_mode"), "{lines:?}");
        assert!(lines[1].starts_with("c.access_type"), "{lines:?}");
    }

    #[test]
    fn message_cap_respects_char_boundaries() {
        let long = "é".repeat(MAX_ERROR_MESSAGE_BYTES);
        let cut = cap_message(long);
        assert!(cut.len() <= MAX_ERROR_MESSAGE_BYTES);
        assert!(cut.chars().all(|c| c == 'é'));
    }

    #[test]
    fn secret_messages_print_no_secret_value() {
        assert!(SECRET_MESSAGES.contains(&"csisdk.agent.v1.ControllerAttachRequest"));
        let mut req = pb::NodeExpandRequest {
            volume_id: "vol-1".into(),
            ..Default::default()
        };
        req.secrets.insert("password".into(), "hunter2".into());
        let shown = format!("{req:?}");
        assert!(
            shown.contains("vol-1") && shown.contains("password"),
            "{shown}"
        );
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
