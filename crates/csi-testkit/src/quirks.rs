//! Quirks: switches that make the mock behave like real plugins that bend the spec.

use std::time::Duration;

/// One way real plugins deviate from the spec, switched on with
/// [`MockPluginBuilder::quirk`](crate::MockPluginBuilder::quirk) or at run time with
/// [`MockPlugin::set_quirk`](crate::MockPlugin::set_quirk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Quirk {
    /// `ValidateVolumeCapabilities` never sets `confirmed`, even when it supports everything.
    NeverConfirm,
    /// `ValidateVolumeCapabilities` confirms a capability other than the one asked for (a
    /// different access mode).
    ConfirmDifferentCapability,
    /// `ValidateVolumeCapabilities` confirms the capabilities with access mode UNKNOWN.
    ConfirmUnknownAccessMode,
    /// `ValidateVolumeCapabilities` echoes a different `fs_type` than the one asked for.
    EchoDifferentFsType,
    /// `Probe` answers OK without `ready` (which means ready).
    ProbeReadyAbsent,
    /// `Probe` answers OK with `ready = false`.
    ProbeNotReady,
    /// The socket appears only this long after the server was started.
    LateSocket(Duration),
    /// A repeated `NodeUnpublishVolume`, `NodeUnstageVolume` or `ControllerUnpublishVolume`
    /// for something no longer published answers NOT_FOUND instead of OK.
    NotFoundOnRepeatedUnpublish,
    /// Argument checks come before the existence check where real plugins and csi-sanity
    /// expect the reverse, as this mock once did: `ControllerModifyVolume` without
    /// `mutable_parameters`, `NodeGetVolumeStats` and `NodeExpandVolume` with a relative
    /// `volume_path`, and `GetVolumeGroupSnapshot` / `DeleteVolumeGroupSnapshot` without
    /// `snapshot_ids` answer INVALID_ARGUMENT even when the object does not exist.
    ArgumentChecksFirst,
    /// `CreateVolume` and `ControllerModifyVolume` accept any `mutable_parameters` key, not
    /// only the configured ones (as this mock once did).
    AnyMutableParameterKey,
    /// `CreateVolume` without accessibility requirements answers a volume reachable from
    /// somewhere the node is not: the node's topology keys, each with the value `elsewhere`
    /// (a mock without a topology answers as usual).
    VolumesElsewhere,
    /// `ControllerGetVolume`, `ListVolumes` and `NodeGetVolumeStats` leave `volume_condition`
    /// unset although the plugin advertises `VOLUME_CONDITION` (the conditions set with
    /// [`MockPlugin::set_volume_condition`](crate::MockPlugin::set_volume_condition) are kept,
    /// and reported again once the quirk is cleared).
    NoVolumeCondition,
}

/// What `Probe` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum ProbeAnswer {
    #[default]
    Ready,
    NotReady,
    Absent,
}

/// The set of active quirks, as the handlers read them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Quirks {
    pub(crate) never_confirm: bool,
    pub(crate) confirm_different_capability: bool,
    pub(crate) confirm_unknown_access_mode: bool,
    pub(crate) echo_different_fs_type: bool,
    pub(crate) probe: ProbeAnswer,
    pub(crate) late_socket: Option<Duration>,
    pub(crate) not_found_on_repeated_unpublish: bool,
    pub(crate) argument_checks_first: bool,
    pub(crate) any_mutable_parameter_key: bool,
    pub(crate) volumes_elsewhere: bool,
    pub(crate) no_volume_condition: bool,
}

impl Quirks {
    pub(crate) fn set(&mut self, quirk: Quirk) {
        match quirk {
            Quirk::NeverConfirm => self.never_confirm = true,
            Quirk::ConfirmDifferentCapability => self.confirm_different_capability = true,
            Quirk::ConfirmUnknownAccessMode => self.confirm_unknown_access_mode = true,
            Quirk::EchoDifferentFsType => self.echo_different_fs_type = true,
            Quirk::ProbeReadyAbsent => self.probe = ProbeAnswer::Absent,
            Quirk::ProbeNotReady => self.probe = ProbeAnswer::NotReady,
            Quirk::LateSocket(delay) => self.late_socket = Some(delay),
            Quirk::NotFoundOnRepeatedUnpublish => self.not_found_on_repeated_unpublish = true,
            Quirk::ArgumentChecksFirst => self.argument_checks_first = true,
            Quirk::AnyMutableParameterKey => self.any_mutable_parameter_key = true,
            Quirk::VolumesElsewhere => self.volumes_elsewhere = true,
            Quirk::NoVolumeCondition => self.no_volume_condition = true,
        }
    }
}
