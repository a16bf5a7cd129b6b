//! Request checks the spec demands of every plugin (csi-spec §3.4, §3.5, §3.6, §3.9): required
//! fields, size limits, well-formed capabilities. Each failure is INVALID_ARGUMENT naming the
//! field and, for sizes, the limit. The limits and the map-size rule are csi-structs' (one
//! home for them); the checks answer with gRPC statuses because that is what a plugin sends.

use std::collections::HashMap;
use std::path::Path;

use csi_proto::v1::volume_capability::AccessType;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::{CapacityRange, VolumeCapability};
use tonic::Status;

use csi_structs::limits::{MAX_MAP_BYTES, MAX_STRING_BYTES};
use csi_structs::{FieldPath, Secrets, ValidationErrors};

/// The limit on node ids (`NodeGetInfoResponse.node_id`), also accepted in requests (csi-spec
/// §5: requests only inherit the 128-byte limit, but must accept what NodeGetInfo may return).
pub(crate) const MAX_NODE_ID_BYTES: usize = csi_structs::limits::MAX_PLUGIN_NODE_ID_BYTES;

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

/// A required string: present and at most `limit` bytes.
pub(crate) fn required(field: &str, value: &str) -> Result<(), Status> {
    required_within(field, value, MAX_STRING_BYTES)
}

/// A required string with its own limit.
pub(crate) fn required_within(field: &str, value: &str, limit: usize) -> Result<(), Status> {
    if value.is_empty() {
        return Err(invalid(format!("{field} is required")));
    }
    optional_within(field, value, limit)
}

/// An optional string: at most 128 bytes.
pub(crate) fn optional(field: &str, value: &str) -> Result<(), Status> {
    optional_within(field, value, MAX_STRING_BYTES)
}

fn optional_within(field: &str, value: &str, limit: usize) -> Result<(), Status> {
    if value.len() > limit {
        return Err(invalid(format!(
            "{field} is {} bytes; the limit is {limit} bytes",
            value.len()
        )));
    }
    Ok(())
}

/// A `name` field: required, within the size limit, without the banned control characters.
pub(crate) fn name(field: &str, value: &str) -> Result<(), Status> {
    required(field, value)?;
    if value.chars().any(csi_structs::limits::is_banned_in_name) {
        return Err(invalid(format!(
            "{field} contains a control character the spec forbids"
        )));
    }
    Ok(())
}

/// A map field: at most 4 KiB of keys and values.
pub(crate) fn map(field: &str, value: &HashMap<String, String>) -> Result<(), Status> {
    let size = csi_structs::limits::map_size(value);
    if size > MAX_MAP_BYTES {
        return Err(invalid(format!(
            "{field} is {size} bytes; the limit is {MAX_MAP_BYTES} bytes"
        )));
    }
    Ok(())
}

/// A secrets map: csi-structs' rules (the size limit, and keys made of alphanumerics, `-`, `_`
/// and `.` only). Its messages name the field, the key and the limit, never a value.
pub(crate) fn secrets(value: &HashMap<String, String>) -> Result<(), Status> {
    Secrets::from_wire_at(value.clone(), &FieldPath::named(Secrets::FIELD))
        .map(drop)
        .map_err(from_violations)
}

/// INVALID_ARGUMENT carrying csi-structs' list of violations (each names its field and, for
/// sizes, the limit).
fn from_violations(errs: ValidationErrors) -> Status {
    invalid(errs.to_string())
}

/// A required absolute path (paths are exempt from the 128-byte limit).
pub(crate) fn path(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(invalid(format!("{field} is required")));
    }
    if !Path::new(value).is_absolute() {
        return Err(invalid(format!(
            "{field} {value:?} must be an absolute path"
        )));
    }
    Ok(())
}

/// A required volume capability, checked by csi-structs: access mode set and known, access
/// type set, mount fields within their limits.
pub(crate) fn capability(
    field: &'static str,
    cap: Option<&VolumeCapability>,
) -> Result<(), Status> {
    capability_at(&FieldPath::named(field), cap)
}

/// [`capability`] for a field that is not a plain name (e.g. an element of a list).
pub(crate) fn capability_at(
    field: &FieldPath,
    cap: Option<&VolumeCapability>,
) -> Result<(), Status> {
    let cap = cap.ok_or_else(|| invalid(format!("{field} is required")))?;
    csi_structs::VolumeCapability::from_wire_at(cap, field)
        .map(drop)
        .map_err(from_violations)
}

/// A required, non-empty list of volume capabilities.
pub(crate) fn capabilities(field: &'static str, caps: &[VolumeCapability]) -> Result<(), Status> {
    if caps.is_empty() {
        return Err(invalid(format!("{field} is required (at least one)")));
    }
    for (i, cap) in caps.iter().enumerate() {
        capability_at(&FieldPath::named(field).index(i), Some(cap))?;
    }
    Ok(())
}

/// A capacity range: no negative numbers, and `limit_bytes` not below `required_bytes`.
pub(crate) fn capacity_range(field: &str, range: &CapacityRange) -> Result<(), Status> {
    if range.required_bytes < 0 || range.limit_bytes < 0 {
        return Err(invalid(format!(
            "{field} has a negative size (required_bytes {}, limit_bytes {})",
            range.required_bytes, range.limit_bytes
        )));
    }
    if range.limit_bytes > 0 && range.required_bytes > range.limit_bytes {
        return Err(invalid(format!(
            "{field}.required_bytes {} exceeds limit_bytes {}",
            range.required_bytes, range.limit_bytes
        )));
    }
    Ok(())
}

/// The access mode of a capability that passed [`capability`].
pub(crate) fn mode_of(cap: &VolumeCapability) -> Mode {
    cap.access_mode
        .and_then(|m| Mode::try_from(m.mode).ok())
        .unwrap_or(Mode::Unknown)
}

/// Whether a capability asks for a block device.
pub(crate) fn is_block(cap: &VolumeCapability) -> bool {
    matches!(cap.access_type, Some(AccessType::Block(_)))
}

/// The access modes a plugin may only be sent with its `SINGLE_NODE_MULTI_WRITER`
/// capability (csi-spec §3.8; csi-structs'
/// [`needs_single_node_multi_writer_capability`](csi_structs::AccessMode::needs_single_node_multi_writer_capability));
/// `Err` names the field and the capability.
pub(crate) fn single_node_modes(
    field: &str,
    caps: &[&VolumeCapability],
    advertised: bool,
    service: &str,
) -> Result<(), Status> {
    if advertised {
        return Ok(());
    }
    match caps
        .iter()
        .filter_map(|c| structs_mode(mode_of(c)))
        .find(|m| m.needs_single_node_multi_writer_capability())
    {
        Some(mode) => Err(invalid(format!(
            "{field}: access mode {} needs {service} capability SINGLE_NODE_MULTI_WRITER, which \
             this plugin does not advertise",
            mode.wire_name()
        ))),
        None => Ok(()),
    }
}

/// csi-structs' access mode for a wire mode (`None` for unspecified or unknown).
fn structs_mode(mode: Mode) -> Option<csi_structs::AccessMode> {
    csi_structs::AccessMode::from_wire(mode as i32).ok()
}

/// Whether an access mode allows use from several nodes
/// ([`csi_structs::AccessMode::is_multi_node`]).
pub(crate) fn is_multi_node(mode: Mode) -> bool {
    structs_mode(mode).is_some_and(csi_structs::AccessMode::is_multi_node)
}

/// Whether a volume created with `created` (empty = anything) supports `wanted`: the same
/// access type and one of its access modes.
pub(crate) fn supports(created: &[VolumeCapability], wanted: &VolumeCapability) -> bool {
    created.is_empty()
        || created
            .iter()
            .any(|c| mode_of(c) == mode_of(wanted) && is_block(c) == is_block(wanted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::v1::volume_capability::{AccessMode, MountVolume};

    fn mount(mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }
    }

    #[test]
    fn messages_name_field_and_limit() {
        let err = required("volume_id", "").unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("volume_id"));
        let err = required("name", &"x".repeat(129)).unwrap_err();
        assert!(err.message().contains("129") && err.message().contains("128"));
        let big: HashMap<String, String> = [("k".to_string(), "v".repeat(4096))].into();
        assert!(
            map("parameters", &big)
                .unwrap_err()
                .message()
                .contains("4096")
        );
    }

    #[test]
    fn capability_needs_mode_and_type() {
        assert!(capability("volume_capability", None).is_err());
        let mut cap = mount(Mode::SingleNodeWriter);
        assert!(capability("c", Some(&cap)).is_ok());
        cap.access_type = None;
        assert!(
            capability("c", Some(&cap))
                .unwrap_err()
                .message()
                .contains("access_type")
        );
        let cap = mount(Mode::Unknown);
        assert!(
            capability("c", Some(&cap))
                .unwrap_err()
                .message()
                .contains("mode")
        );
    }

    #[test]
    fn capability_and_secret_messages_name_field_and_limit() {
        let mut cap = mount(Mode::SingleNodeWriter);
        cap.access_type = Some(AccessType::Mount(MountVolume {
            fs_type: "x".repeat(200),
            ..MountVolume::default()
        }));
        let err = capability("volume_capability", Some(&cap)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let text = err.message();
        assert!(text.contains("volume_capability.mount.fs_type"), "{text}");
        assert!(text.contains("200") && text.contains("128"), "{text}");
        let err = capabilities(
            "volume_capabilities",
            &[mount(Mode::SingleNodeWriter), mount(Mode::Unknown)],
        )
        .unwrap_err();
        assert!(
            err.message()
                .contains("volume_capabilities[1].access_mode.mode"),
            "{}",
            err.message()
        );
        let big: HashMap<String, String> = [("k".to_string(), "v".repeat(4096))].into();
        let text = secrets(&big).unwrap_err().message().to_string();
        assert!(text.contains("secrets") && text.contains("4096"), "{text}");
    }

    #[test]
    fn mode_rules_follow_csi_structs() {
        assert!(is_multi_node(Mode::MultiNodeReaderOnly));
        assert!(!is_multi_node(Mode::SingleNodeMultiWriter));
        assert!(!is_multi_node(Mode::Unknown));
        let alpha = mount(Mode::SingleNodeSingleWriter);
        let err = single_node_modes("volume_capability", &[&alpha], false, "node").unwrap_err();
        assert!(
            err.message().contains("SINGLE_NODE_SINGLE_WRITER"),
            "{}",
            err.message()
        );
        assert!(single_node_modes("volume_capability", &[&alpha], true, "node").is_ok());
        let plain = mount(Mode::SingleNodeWriter);
        assert!(single_node_modes("volume_capability", &[&plain], false, "node").is_ok());
    }

    #[test]
    fn secret_key_errors_do_not_echo_values() {
        let secrets_map: HashMap<String, String> =
            [("bad key".to_string(), "hunter2".to_string())].into();
        let err = secrets(&secrets_map).unwrap_err();
        assert!(!err.message().contains("hunter2"));
    }

    #[test]
    fn support_follows_mode_and_type() {
        let created = [mount(Mode::SingleNodeWriter)];
        assert!(supports(&created, &mount(Mode::SingleNodeWriter)));
        assert!(!supports(&created, &mount(Mode::MultiNodeMultiWriter)));
        assert!(supports(&[], &mount(Mode::MultiNodeMultiWriter)));
    }
}
