//! `VolumeCapability` and `CapacityRange` on the wire.

use csi_proto::v1;
use csi_proto::v1::volume_capability as vc;

use super::{by_ref_and_value, finish, non_empty};
use crate::capability::{
    AccessMode, AccessModeError, AccessType, MountFlags, MountOptions, VolumeCapability,
};
use crate::capacity::CapacityRange;
use crate::validation::{FieldPath, Problem, ValidationErrors};

impl From<&MountOptions> for vc::MountVolume {
    fn from(m: &MountOptions) -> Self {
        vc::MountVolume {
            fs_type: m.fs_type().unwrap_or_default().to_string(),
            mount_flags: m.mount_flags().as_slice().to_vec(),
            volume_mount_group: m.volume_mount_group().unwrap_or_default().to_string(),
        }
    }
}

impl From<&AccessType> for vc::AccessType {
    fn from(t: &AccessType) -> Self {
        match t {
            AccessType::Block => vc::AccessType::Block(vc::BlockVolume {}),
            AccessType::Mount(m) => vc::AccessType::Mount(m.into()),
        }
    }
}

impl From<AccessMode> for vc::AccessMode {
    fn from(m: AccessMode) -> Self {
        vc::AccessMode { mode: m.to_wire() }
    }
}

impl From<&VolumeCapability> for v1::VolumeCapability {
    fn from(c: &VolumeCapability) -> Self {
        v1::VolumeCapability {
            access_mode: Some(c.access_mode.into()),
            access_type: Some((&c.access_type).into()),
        }
    }
}

impl From<VolumeCapability> for v1::VolumeCapability {
    fn from(c: VolumeCapability) -> Self {
        (&c).into()
    }
}

/// The access mode of a wire capability, recording a violation at `at.access_mode[.mode]`.
pub(crate) fn access_mode_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    mode: Option<&vc::AccessMode>,
) -> Option<AccessMode> {
    let Some(mode) = mode else {
        errs.push(at.clone().field("access_mode"), Problem::Missing);
        return None;
    };
    match AccessMode::from_wire(mode.mode) {
        Ok(m) => Some(m),
        Err(AccessModeError::Unspecified) => {
            errs.push(
                at.clone().field("access_mode").field("mode"),
                Problem::Missing,
            );
            None
        }
        Err(AccessModeError::Unrecognized(value)) => {
            errs.push(
                at.clone().field("access_mode").field("mode"),
                Problem::UnknownEnumValue { value },
            );
            None
        }
    }
}

/// The access type of a wire capability (`None` in the oneof is recorded as missing).
pub(crate) fn access_type_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    access_type: Option<&vc::AccessType>,
) -> Option<AccessType> {
    match access_type {
        None => {
            errs.push(at.clone().field("access_type"), Problem::Missing);
            None
        }
        Some(vc::AccessType::Block(_)) => Some(AccessType::Block),
        Some(vc::AccessType::Mount(m)) => {
            let opts = mount_from_wire(m);
            let before = errs.len();
            opts.check(errs, &at.clone().field("mount"));
            (errs.len() == before).then_some(AccessType::Mount(opts))
        }
    }
}

pub(crate) fn mount_from_wire(m: &vc::MountVolume) -> MountOptions {
    let mut opts =
        MountOptions::new().with_mount_flags(MountFlags::new(m.mount_flags.iter().cloned()));
    if let Some(fs) = non_empty(&m.fs_type) {
        opts = opts.with_fs_type(fs);
    }
    if let Some(group) = non_empty(&m.volume_mount_group) {
        opts = opts.with_volume_mount_group(group);
    }
    opts
}

/// A wire capability, every problem recorded under `at`.
pub(crate) fn capability_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    w: &v1::VolumeCapability,
) -> Option<VolumeCapability> {
    let mode = access_mode_from_wire(errs, at, w.access_mode.as_ref());
    let access_type = access_type_from_wire(errs, at, w.access_type.as_ref());
    Some(VolumeCapability::new(mode?, access_type?))
}

/// A required list of wire capabilities (at least one), every problem under `at[i]`.
pub(crate) fn capabilities_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    list: &[v1::VolumeCapability],
) -> Option<Vec<VolumeCapability>> {
    if list.is_empty() {
        errs.push(at.clone(), Problem::Missing);
        return None;
    }
    let parsed: Vec<Option<VolumeCapability>> = list
        .iter()
        .enumerate()
        .map(|(i, c)| capability_from_wire(errs, &at.clone().index(i), c))
        .collect();
    parsed.into_iter().collect()
}

impl TryFrom<&v1::VolumeCapability> for VolumeCapability {
    type Error = super::WireError;
    fn try_from(w: &v1::VolumeCapability) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let value = capability_from_wire(&mut errs, &FieldPath::root(), w);
        finish("VolumeCapability", errs, value)
    }
}
by_ref_and_value!(v1::VolumeCapability => VolumeCapability);

impl VolumeCapability {
    /// Checks and converts a wire capability, naming `field` in errors (for example
    /// `volume_capability.access_mode.mode`): access mode set and defined by the spec, access
    /// type set, and for a mount the size limits of [`MountOptions`].
    ///
    /// ```
    /// use csi_proto::v1;
    /// use csi_structs::{FieldPath, VolumeCapability};
    ///
    /// let err = VolumeCapability::from_wire_at(
    ///     &v1::VolumeCapability::default(),
    ///     &FieldPath::named("volume_capability"),
    /// )
    /// .unwrap_err();
    /// assert_eq!(err.violations()[0].field.to_string(), "volume_capability.access_mode");
    /// ```
    ///
    /// # Errors
    ///
    /// Every problem at once: [`Problem::Missing`] for a missing access mode, mode or access
    /// type, [`Problem::UnknownEnumValue`] for a mode the spec does not define, and
    /// [`Problem::TooLong`] for a mount field over its limit.
    pub fn from_wire_at(
        w: &v1::VolumeCapability,
        field: &FieldPath,
    ) -> Result<VolumeCapability, ValidationErrors> {
        let mut errs = ValidationErrors::new();
        let value = capability_from_wire(&mut errs, field, w);
        match value {
            Some(cap) if errs.is_empty() => Ok(cap),
            _ => Err(errs),
        }
    }
}

impl From<&CapacityRange> for v1::CapacityRange {
    fn from(r: &CapacityRange) -> Self {
        v1::CapacityRange {
            required_bytes: super::size_to_wire(r.required_bytes()),
            limit_bytes: super::size_to_wire(r.limit_bytes()),
        }
    }
}

impl From<CapacityRange> for v1::CapacityRange {
    fn from(r: CapacityRange) -> Self {
        (&r).into()
    }
}

pub(crate) fn capacity_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    w: &v1::CapacityRange,
) -> Option<CapacityRange> {
    let required = super::optional_size(errs, at.clone().field("required_bytes"), w.required_bytes);
    let limit = super::optional_size(errs, at.clone().field("limit_bytes"), w.limit_bytes);
    match CapacityRange::new(required?, limit?) {
        Ok(r) => Some(r),
        Err(e) => {
            errs.extend_under(at, e);
            None
        }
    }
}

impl TryFrom<&v1::CapacityRange> for CapacityRange {
    type Error = super::WireError;
    fn try_from(w: &v1::CapacityRange) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let value = capacity_from_wire(&mut errs, &FieldPath::root(), w);
        finish("CapacityRange", errs, value)
    }
}
by_ref_and_value!(v1::CapacityRange => CapacityRange);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::Problem;

    fn fields(err: &super::super::WireError) -> Vec<(String, Problem)> {
        err.errors
            .violations()
            .iter()
            .map(|v| (v.field.to_string(), v.problem.clone()))
            .collect()
    }

    #[test]
    fn broken_capabilities_are_typed_errors() {
        let no_type = v1::VolumeCapability {
            access_mode: Some(vc::AccessMode { mode: 1 }),
            access_type: None,
        };
        let err = VolumeCapability::try_from(&no_type).unwrap_err();
        assert_eq!(err.message, "VolumeCapability");
        assert_eq!(fields(&err), vec![("access_type".into(), Problem::Missing)]);

        let unknown_mode = v1::VolumeCapability {
            access_mode: Some(vc::AccessMode { mode: 42 }),
            access_type: Some(vc::AccessType::Block(vc::BlockVolume {})),
        };
        assert_eq!(
            fields(&VolumeCapability::try_from(unknown_mode).unwrap_err()),
            vec![(
                "access_mode.mode".into(),
                Problem::UnknownEnumValue { value: 42 }
            )]
        );

        let nothing = v1::VolumeCapability::default();
        assert_eq!(
            fields(&VolumeCapability::try_from(nothing).unwrap_err()),
            vec![
                ("access_mode".into(), Problem::Missing),
                ("access_type".into(), Problem::Missing)
            ]
        );

        let zero_mode = v1::VolumeCapability {
            access_mode: Some(vc::AccessMode { mode: 0 }),
            access_type: Some(vc::AccessType::Mount(vc::MountVolume {
                fs_type: "x".repeat(200),
                ..Default::default()
            })),
        };
        assert_eq!(
            fields(&VolumeCapability::try_from(zero_mode).unwrap_err()),
            vec![
                ("access_mode.mode".into(), Problem::Missing),
                (
                    "mount.fs_type".into(),
                    Problem::TooLong {
                        size: 200,
                        limit: 128,
                        unit: crate::validation::SizeUnit::Bytes
                    }
                )
            ]
        );
    }

    #[test]
    fn from_wire_at_names_the_field() {
        let at = FieldPath::named("volume_capabilities").index(1);
        let w = v1::VolumeCapability {
            access_mode: Some(vc::AccessMode { mode: 42 }),
            access_type: Some(vc::AccessType::Mount(vc::MountVolume {
                mount_flags: vec!["x".repeat(4097)],
                ..Default::default()
            })),
        };
        let err = VolumeCapability::from_wire_at(&w, &at).unwrap_err();
        let got: Vec<(String, Problem)> = err
            .violations()
            .iter()
            .map(|v| (v.field.to_string(), v.problem.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "volume_capabilities[1].access_mode.mode".into(),
                    Problem::UnknownEnumValue { value: 42 }
                ),
                (
                    "volume_capabilities[1].mount.mount_flags".into(),
                    Problem::TooLong {
                        size: 4097,
                        limit: 4096,
                        unit: crate::validation::SizeUnit::Bytes
                    }
                ),
            ]
        );
        let ok = v1::VolumeCapability {
            access_mode: Some(vc::AccessMode { mode: 1 }),
            access_type: Some(vc::AccessType::Block(vc::BlockVolume {})),
        };
        let cap = VolumeCapability::from_wire_at(&ok, &at).unwrap();
        assert_eq!(v1::VolumeCapability::from(&cap), ok);
    }

    #[test]
    fn empty_fs_type_is_unspecified() {
        let w = v1::VolumeCapability {
            access_mode: Some(vc::AccessMode { mode: 5 }),
            access_type: Some(vc::AccessType::Mount(vc::MountVolume::default())),
        };
        let c = VolumeCapability::try_from(&w).unwrap();
        assert_eq!(c.mount_options().and_then(MountOptions::fs_type), None);
        assert_eq!(v1::VolumeCapability::from(&c), w);
    }

    #[test]
    fn negative_capacity_is_an_error() {
        let w = v1::CapacityRange {
            required_bytes: -1,
            limit_bytes: 10,
        };
        let err = CapacityRange::try_from(w).unwrap_err();
        assert_eq!(
            fields(&err),
            vec![("required_bytes".into(), Problem::Negative { value: -1 })]
        );
        let w = v1::CapacityRange {
            required_bytes: 10,
            limit_bytes: 5,
        };
        let err = CapacityRange::try_from(w).unwrap_err();
        assert_eq!(err.errors.violations()[0].field.to_string(), "limit_bytes");
        assert!(CapacityRange::try_from(v1::CapacityRange::default()).is_err());
    }
}
