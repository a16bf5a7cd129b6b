//! The checks the suite knows, each with a stable id and a one-line description.

use std::fmt;

use csi_proto::Rpc;

/// One conformance check.
///
/// Families parameterised by an RPC ([`Check::RequiredFields`], [`Check::NotFound`],
/// [`Check::Idempotent`], [`Check::Pagination`]) exist only for the RPCs listed in
/// [`Check::all`]; the id of every check is stable and unique, e.g.
/// `required-fields/CreateVolume`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Check {
    /// GetPluginInfo: the name follows the spec's domain-name syntax (≤63 characters) and
    /// `vendor_version` is set.
    PluginInfo,
    /// Probe answers OK, with `ready` absent or true.
    Probe,
    /// The plugin, controller, node and group-controller capabilities could be read and do not
    /// contradict one another (e.g. LIST_VOLUMES_PUBLISHED_NODES without PUBLISH_UNPUBLISH_VOLUME).
    CapabilitiesCoherent,
    /// NodeGetInfo returns a non-empty node id of at most 256 bytes and sane limits.
    NodeGetInfo,
    /// Every RPC the plugin advertises answers a valid request with OK (never UNIMPLEMENTED).
    AdvertisedRpcsAnswer,
    /// Every RPC whose capability is not advertised answers UNIMPLEMENTED.
    UnadvertisedRpcsUnimplemented,
    /// Requests missing each required field are rejected with INVALID_ARGUMENT.
    RequiredFields(Rpc),
    /// Requests naming an unknown volume, snapshot or node are answered NOT_FOUND, also when
    /// an argument that can only be judged against the object is missing or odd (a
    /// ControllerModifyVolume without `mutable_parameters`, a relative `volume_path`, a
    /// GetVolumeGroupSnapshot without `snapshot_ids`): real plugins and csi-sanity look the
    /// object up first.
    NotFound(Rpc),
    /// Repeating the call gives OK and the same result.
    Idempotent(Rpc),
    /// Walking the list with `max_entries` and `next_token` sees every entry, pages honour
    /// `max_entries`, and an invalid `starting_token` is answered ABORTED.
    Pagination(Rpc),
    /// ValidateVolumeCapabilities confirms exactly the capabilities a volume was created with.
    ValidateConfirms,
    /// Stage → publish → target exists → unpublish → target gone → unstage, each step repeated.
    NodeLifecycle,
    /// A full volume lifecycle succeeds with the configured secrets in every request.
    SecretsPassedThrough,
    /// CreateVolume accepts a name of exactly 128 bytes (the spec's string limit), and the ids
    /// and volume context the plugin returns stay within the spec's limits.
    SizeLimits,
    /// CreateVolume and ControllerModifyVolume refuse a `mutable_parameters` key the plugin
    /// cannot support with INVALID_ARGUMENT (and change nothing), and accept the keys given
    /// with [`Options::mutable_parameter`](super::Options::mutable_parameter).
    MutableParameterKeys,
    /// With controller `VOLUME_CONDITION` (CSI v1.3 to v1.12): ControllerGetVolume (with
    /// `GET_VOLUME`) answers `status.volume_condition`, and every ListVolumes entry (with
    /// `LIST_VOLUMES`) carries `status.volume_condition`. Skipped when the capability is not
    /// advertised, or neither RPC is.
    ControllerVolumeCondition,
    /// With node `VOLUME_CONDITION` (CSI v1.3 to v1.12): NodeGetVolumeStats of a volume
    /// published on the node answers `volume_condition`. Skipped when the capability is not
    /// advertised.
    NodeVolumeCondition,
}

/// RPCs with a [`Check::RequiredFields`] check, in run order.
pub const REQUIRED_FIELDS_RPCS: &[Rpc] = &[
    Rpc::CreateVolume,
    Rpc::DeleteVolume,
    Rpc::ControllerPublishVolume,
    Rpc::ControllerUnpublishVolume,
    Rpc::ValidateVolumeCapabilities,
    Rpc::ControllerGetVolume,
    Rpc::ControllerExpandVolume,
    Rpc::ControllerModifyVolume,
    Rpc::CreateSnapshot,
    Rpc::DeleteSnapshot,
    Rpc::GetSnapshot,
    Rpc::CreateVolumeGroupSnapshot,
    Rpc::GetVolumeGroupSnapshot,
    Rpc::DeleteVolumeGroupSnapshot,
    Rpc::NodeStageVolume,
    Rpc::NodeUnstageVolume,
    Rpc::NodePublishVolume,
    Rpc::NodeUnpublishVolume,
    Rpc::NodeGetVolumeStats,
    Rpc::NodeExpandVolume,
];

/// RPCs with a [`Check::NotFound`] check, in run order.
pub const NOT_FOUND_RPCS: &[Rpc] = &[
    Rpc::CreateVolume,
    Rpc::ControllerPublishVolume,
    Rpc::ValidateVolumeCapabilities,
    Rpc::ControllerGetVolume,
    Rpc::ControllerExpandVolume,
    Rpc::ControllerModifyVolume,
    Rpc::GetSnapshot,
    Rpc::GetVolumeGroupSnapshot,
    Rpc::NodeGetVolumeStats,
    Rpc::NodeExpandVolume,
];

/// RPCs with a [`Check::Idempotent`] check, in run order. The node RPCs' repeats are part
/// of [`Check::NodeLifecycle`].
pub const IDEMPOTENT_RPCS: &[Rpc] = &[
    Rpc::CreateVolume,
    Rpc::DeleteVolume,
    Rpc::ControllerPublishVolume,
    Rpc::ControllerUnpublishVolume,
    Rpc::ControllerExpandVolume,
    Rpc::ControllerModifyVolume,
    Rpc::CreateSnapshot,
    Rpc::DeleteSnapshot,
    Rpc::CreateVolumeGroupSnapshot,
    Rpc::DeleteVolumeGroupSnapshot,
];

/// RPCs with a [`Check::Pagination`] check.
pub const PAGINATION_RPCS: &[Rpc] = &[Rpc::ListVolumes, Rpc::ListSnapshots];

impl Check {
    /// Every check, in the order the suite runs them.
    pub fn all() -> Vec<Check> {
        let mut all = vec![
            Check::PluginInfo,
            Check::Probe,
            Check::CapabilitiesCoherent,
            Check::NodeGetInfo,
            Check::AdvertisedRpcsAnswer,
            Check::UnadvertisedRpcsUnimplemented,
        ];
        all.extend(
            REQUIRED_FIELDS_RPCS
                .iter()
                .map(|&rpc| Check::RequiredFields(rpc)),
        );
        all.extend(NOT_FOUND_RPCS.iter().map(|&rpc| Check::NotFound(rpc)));
        all.extend(IDEMPOTENT_RPCS.iter().map(|&rpc| Check::Idempotent(rpc)));
        all.extend(PAGINATION_RPCS.iter().map(|&rpc| Check::Pagination(rpc)));
        all.extend([
            Check::ValidateConfirms,
            Check::NodeLifecycle,
            Check::SecretsPassedThrough,
            Check::SizeLimits,
            Check::MutableParameterKeys,
            Check::ControllerVolumeCondition,
            Check::NodeVolumeCondition,
        ]);
        all
    }

    /// The stable id, e.g. `identity/probe` or `not-found/ControllerGetVolume`.
    pub fn id(self) -> String {
        match self {
            Check::PluginInfo => "identity/plugin-info".into(),
            Check::Probe => "identity/probe".into(),
            Check::CapabilitiesCoherent => "capabilities/coherent".into(),
            Check::NodeGetInfo => "node/get-info".into(),
            Check::AdvertisedRpcsAnswer => "capabilities/advertised-rpcs-answer".into(),
            Check::UnadvertisedRpcsUnimplemented => {
                "capabilities/unadvertised-rpcs-unimplemented".into()
            }
            Check::RequiredFields(rpc) => format!("required-fields/{}", rpc.name()),
            Check::NotFound(rpc) => format!("not-found/{}", rpc.name()),
            Check::Idempotent(rpc) => format!("idempotent/{}", rpc.name()),
            Check::Pagination(rpc) => format!("pagination/{}", rpc.name()),
            Check::ValidateConfirms => "controller/validate-confirms".into(),
            Check::NodeLifecycle => "node/lifecycle".into(),
            Check::SecretsPassedThrough => "secrets/passed-through".into(),
            Check::SizeLimits => "limits/string-sizes".into(),
            Check::MutableParameterKeys => "controller/mutable-parameter-keys".into(),
            Check::ControllerVolumeCondition => "controller/volume-condition".into(),
            Check::NodeVolumeCondition => "node/volume-condition".into(),
        }
    }

    /// What the check verifies, in one line.
    pub fn description(self) -> String {
        match self {
            Check::PluginInfo => "GetPluginInfo returns a valid name and a vendor version".into(),
            Check::Probe => "Probe answers OK with ready absent or true".into(),
            Check::CapabilitiesCoherent => {
                "capabilities can be read and are mutually consistent".into()
            }
            Check::NodeGetInfo => "NodeGetInfo returns a node id of 1 to 256 bytes".into(),
            Check::AdvertisedRpcsAnswer => "every advertised RPC answers a valid request".into(),
            Check::UnadvertisedRpcsUnimplemented => {
                "RPCs whose capability is absent answer UNIMPLEMENTED".into()
            }
            Check::RequiredFields(rpc) => {
                format!(
                    "{} rejects each missing required field with INVALID_ARGUMENT",
                    rpc.name()
                )
            }
            Check::NotFound(rpc) => format!("{} answers NOT_FOUND for unknown objects", rpc.name()),
            Check::Idempotent(rpc) => {
                format!("{} repeated gives OK and the same result", rpc.name())
            }
            Check::Pagination(rpc) => {
                format!(
                    "{} pages with max_entries/next_token and misses nothing",
                    rpc.name()
                )
            }
            Check::ValidateConfirms => {
                "ValidateVolumeCapabilities confirms the capabilities a volume was created with"
                    .into()
            }
            Check::NodeLifecycle => {
                "stage, publish, unpublish, unstage (each repeated) create and remove the paths"
                    .into()
            }
            Check::SecretsPassedThrough => {
                "a volume lifecycle succeeds with the configured secrets".into()
            }
            Check::SizeLimits => {
                "a 128-byte name is accepted; returned ids and contexts fit the spec's limits"
                    .into()
            }
            Check::MutableParameterKeys => {
                "an unsupported mutable_parameters key is refused, the configured ones accepted"
                    .into()
            }
            Check::ControllerVolumeCondition => {
                "with controller VOLUME_CONDITION, ControllerGetVolume and ListVolumes report \
                 each volume's condition"
                    .into()
            }
            Check::NodeVolumeCondition => {
                "with node VOLUME_CONDITION, NodeGetVolumeStats reports the volume's condition"
                    .into()
            }
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id())
    }
}

impl serde::Serialize for Check {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique() {
        let all = Check::all();
        let mut ids: Vec<String> = all.iter().map(|c| c.id()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), all.len());
    }
}
