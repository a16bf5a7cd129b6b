//! What a plugin advertises: capability sets for the plugin as a whole and for its
//! Controller, Node and GroupController services, and the rules of csi-spec §3.8 that follow
//! from them ("does this plugin need `ControllerPublishVolume`?", "may I call `GetSnapshot`?").
//!
//! Unknown capability numbers (a newer spec, or `UNKNOWN` = 0) are kept aside in each set's
//! [`unknown`](ControllerCapabilities::unknown) list and otherwise ignored, as spec §3.15 asks:
//! a newer plugin must not be rejected for advertising something we do not know.
//!
//! ```
//! use csi_proto::Rpc;
//! use csi_structs::capability_set::{
//!     Capabilities, ControllerCapabilities, ControllerCapability, NodeCapabilities,
//!     NodeCapability, PluginCapabilities, PluginService,
//! };
//!
//! let caps = Capabilities {
//!     plugin: PluginCapabilities::from_services([PluginService::ControllerService]),
//!     controller: ControllerCapabilities::from_iter([
//!         ControllerCapability::CreateDeleteVolume,
//!         ControllerCapability::PublishUnpublishVolume,
//!     ]),
//!     node: NodeCapabilities::from_iter([NodeCapability::StageUnstageVolume]),
//!     ..Capabilities::default()
//! };
//! assert!(caps.controller.requires_controller_publish());
//! assert!(caps.node.requires_staging());
//! assert!(caps.support(Rpc::NodeGetInfo).is_required());
//! assert!(!caps.support(Rpc::GetSnapshot).is_required());
//! assert!(caps.rule_violations().is_empty());
//! ```

use std::collections::BTreeSet;
use std::fmt;

use csi_proto::Rpc;

macro_rules! capability_enum {
    (
        $(#[$doc:meta])*
        $name:ident : $wire:path {
            $( $(#[$vdoc:meta])* $variant:ident = $num:literal => $wname:literal, )+
        }
    ) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
            serde::Serialize, serde::Deserialize,
        )]
        #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
        pub enum $name {
            $( $(#[$vdoc])* $variant, )+
        }

        impl $name {
            /// Every value, in wire order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The value for a wire number, or `None` for 0 (`UNKNOWN`) and numbers this crate
            /// does not know.
            pub const fn from_wire(value: i32) -> Option<Self> {
                match value {
                    $( $num => Some($name::$variant), )+
                    _ => None,
                }
            }

            /// The wire number.
            pub const fn to_wire(self) -> i32 {
                match self {
                    $( $name::$variant => $num, )+
                }
            }

            /// The prost enum value.
            pub const fn wire(self) -> $wire {
                match self {
                    $( $name::$variant => <$wire>::$variant, )+
                }
            }

            /// The spec's name, e.g. `PUBLISH_UNPUBLISH_VOLUME`.
            pub const fn wire_name(self) -> &'static str {
                match self {
                    $( $name::$variant => $wname, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.wire_name())
            }
        }
    };
}

capability_enum! {
    /// A service-level plugin capability (`PluginCapability.Service.Type`).
    PluginService: csi_proto::v1::plugin_capability::service::Type {
        /// The plugin serves the Controller service.
        ControllerService = 1 => "CONTROLLER_SERVICE",
        /// Volumes may not be equally reachable from every node; topology applies.
        VolumeAccessibilityConstraints = 2 => "VOLUME_ACCESSIBILITY_CONSTRAINTS",
        /// The plugin serves the GroupController service.
        GroupControllerService = 3 => "GROUP_CONTROLLER_SERVICE",
        /// The plugin serves the SnapshotMetadata service (alpha).
        SnapshotMetadataService = 4 => "SNAPSHOT_METADATA_SERVICE",
        /// Snapshots carry topology (alpha, v1.13).
        SnapshotAccessibilityConstraints = 5 => "SNAPSHOT_ACCESSIBILITY_CONSTRAINTS",
    }
}

capability_enum! {
    /// A volume-expansion plugin capability (`PluginCapability.VolumeExpansion.Type`).
    VolumeExpansion: csi_proto::v1::plugin_capability::volume_expansion::Type {
        /// Volumes may be expanded while published.
        Online = 1 => "ONLINE",
        /// Volumes may only be expanded while not published.
        Offline = 2 => "OFFLINE",
    }
}

capability_enum! {
    /// A Controller service capability (`ControllerServiceCapability.RPC.Type`).
    ControllerCapability: csi_proto::v1::controller_service_capability::rpc::Type {
        /// `CreateVolume`, `DeleteVolume`.
        CreateDeleteVolume = 1 => "CREATE_DELETE_VOLUME",
        /// `ControllerPublishVolume`, `ControllerUnpublishVolume`, and `NodeGetInfo` on nodes.
        PublishUnpublishVolume = 2 => "PUBLISH_UNPUBLISH_VOLUME",
        /// `ListVolumes`.
        ListVolumes = 3 => "LIST_VOLUMES",
        /// `GetCapacity`.
        GetCapacity = 4 => "GET_CAPACITY",
        /// `CreateSnapshot`, `DeleteSnapshot`.
        CreateDeleteSnapshot = 5 => "CREATE_DELETE_SNAPSHOT",
        /// `ListSnapshots`.
        ListSnapshots = 6 => "LIST_SNAPSHOTS",
        /// `CreateVolume` accepts a volume as content source.
        CloneVolume = 7 => "CLONE_VOLUME",
        /// `ControllerPublishVolume` may be asked for read-only.
        PublishReadonly = 8 => "PUBLISH_READONLY",
        /// `ControllerExpandVolume`.
        ExpandVolume = 9 => "EXPAND_VOLUME",
        /// Volume listings report the nodes each volume is published to.
        ListVolumesPublishedNodes = 10 => "LIST_VOLUMES_PUBLISHED_NODES",
        /// Volume condition in listings (alpha, v1.3–v1.12 only; reserved in v1.13).
        VolumeCondition = 11 => "VOLUME_CONDITION",
        /// `ControllerGetVolume` (alpha).
        GetVolume = 12 => "GET_VOLUME",
        /// The single-node access modes 6 and 7 (alpha).
        SingleNodeMultiWriter = 13 => "SINGLE_NODE_MULTI_WRITER",
        /// `ControllerModifyVolume`, and `mutable_parameters` in `CreateVolume`.
        ModifyVolume = 14 => "MODIFY_VOLUME",
        /// `GetSnapshot` (alpha).
        GetSnapshot = 15 => "GET_SNAPSHOT",
        /// `ControllerGetVolumeHealth` (alpha, v1.13).
        GetVolumeHealth = 16 => "GET_VOLUME_HEALTH",
        /// `ControllerListVolumeHealth` (alpha, v1.13).
        ListVolumeHealth = 17 => "LIST_VOLUME_HEALTH",
    }
}

capability_enum! {
    /// A Node service capability (`NodeServiceCapability.RPC.Type`).
    NodeCapability: csi_proto::v1::node_service_capability::rpc::Type {
        /// `NodeStageVolume`, `NodeUnstageVolume`; staging is mandatory before publishing.
        StageUnstageVolume = 1 => "STAGE_UNSTAGE_VOLUME",
        /// `NodeGetVolumeStats`.
        GetVolumeStats = 2 => "GET_VOLUME_STATS",
        /// `NodeExpandVolume`.
        ExpandVolume = 3 => "EXPAND_VOLUME",
        /// Volume condition in `NodeGetVolumeStats` (alpha, v1.3–v1.12 only).
        VolumeCondition = 4 => "VOLUME_CONDITION",
        /// The single-node access modes 6 and 7 (alpha).
        SingleNodeMultiWriter = 5 => "SINGLE_NODE_MULTI_WRITER",
        /// The plugin applies `volume_mount_group` to mounts.
        VolumeMountGroup = 6 => "VOLUME_MOUNT_GROUP",
        /// `NodeGetVolumeHealth` (alpha, v1.13).
        GetVolumeHealth = 7 => "GET_VOLUME_HEALTH",
        /// `NodeGetStorageHealth` (alpha, v1.13).
        GetStorageHealth = 8 => "GET_STORAGE_HEALTH",
    }
}

capability_enum! {
    /// A GroupController service capability (`GroupControllerServiceCapability.RPC.Type`).
    GroupControllerCapability: csi_proto::v1::group_controller_service_capability::rpc::Type {
        /// `CreateVolumeGroupSnapshot`, `DeleteVolumeGroupSnapshot`, `GetVolumeGroupSnapshot`.
        CreateDeleteGetVolumeGroupSnapshot = 1 => "CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT",
    }
}

macro_rules! capability_set {
    ($(#[$doc:meta])* $name:ident of $cap:ident) => {
        $(#[$doc])*
        ///
        /// The empty set (`Default`) means "advertises nothing".
        #[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        pub struct $name {
            known: BTreeSet<$cap>,
            #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
            unknown: BTreeSet<i32>,
        }

        impl $name {
            /// The empty set.
            pub const fn new() -> Self {
                Self { known: BTreeSet::new(), unknown: BTreeSet::new() }
            }

            /// Whether `cap` is advertised.
            pub fn contains(&self, cap: $cap) -> bool {
                self.known.contains(&cap)
            }

            /// Adds `cap`.
            pub fn insert(&mut self, cap: $cap) {
                self.known.insert(cap);
            }

            /// Adds a wire number: known numbers become capabilities, others (including
            /// 0 = `UNKNOWN`) are kept in [`unknown`](Self::unknown) and ignored.
            pub fn insert_wire(&mut self, value: i32) {
                match $cap::from_wire(value) {
                    Some(cap) => {
                        self.known.insert(cap);
                    }
                    None => {
                        self.unknown.insert(value);
                    }
                }
            }

            /// The advertised capabilities this crate knows, in wire order.
            pub fn iter(&self) -> impl Iterator<Item = $cap> + '_ {
                self.known.iter().copied()
            }

            /// Wire numbers advertised that this crate does not know (ignored by every rule).
            pub fn unknown(&self) -> impl Iterator<Item = i32> + '_ {
                self.unknown.iter().copied()
            }

            /// Whether no known capability is advertised.
            pub fn is_empty(&self) -> bool {
                self.known.is_empty()
            }

            /// How many known capabilities are advertised.
            pub fn len(&self) -> usize {
                self.known.len()
            }
        }

        impl FromIterator<$cap> for $name {
            fn from_iter<I: IntoIterator<Item = $cap>>(iter: I) -> Self {
                Self { known: iter.into_iter().collect(), unknown: BTreeSet::new() }
            }
        }

        impl Extend<$cap> for $name {
            fn extend<I: IntoIterator<Item = $cap>>(&mut self, iter: I) {
                self.known.extend(iter);
            }
        }
    };
}

capability_set!(
    /// What `ControllerGetCapabilities` returned.
    ControllerCapabilities of ControllerCapability
);
capability_set!(
    /// What `NodeGetCapabilities` returned.
    NodeCapabilities of NodeCapability
);
capability_set!(
    /// What `GroupControllerGetCapabilities` returned.
    GroupControllerCapabilities of GroupControllerCapability
);

impl ControllerCapabilities {
    /// Whether the CO must call `ControllerPublishVolume` before using a volume on a node
    /// (and `ControllerUnpublishVolume` after), pass `publish_context` to node calls, and
    /// learn each node's id from `NodeGetInfo` (`PUBLISH_UNPUBLISH_VOLUME`).
    ///
    /// This set alone cannot see whether the plugin advertises `CONTROLLER_SERVICE`; with a
    /// whole [`Capabilities`], ask
    /// [`lifecycle_requires(Rpc::ControllerPublishVolume)`](Capabilities::lifecycle_requires),
    /// which also checks the service.
    pub fn requires_controller_publish(&self) -> bool {
        self.contains(ControllerCapability::PublishUnpublishVolume)
    }

    /// Whether volumes can be created and deleted (`CREATE_DELETE_VOLUME`).
    pub fn can_create_delete(&self) -> bool {
        self.contains(ControllerCapability::CreateDeleteVolume)
    }

    /// Whether `ControllerExpandVolume` is offered (`EXPAND_VOLUME`).
    pub fn can_expand(&self) -> bool {
        self.contains(ControllerCapability::ExpandVolume)
    }

    /// Whether `readonly = true` may be sent to `ControllerPublishVolume`
    /// (`PUBLISH_READONLY`); without it the CO must send `false`.
    pub fn allows_readonly_publish(&self) -> bool {
        self.contains(ControllerCapability::PublishReadonly)
    }

    /// Whether `mutable_parameters` may be sent (`MODIFY_VOLUME`).
    pub fn allows_mutable_parameters(&self) -> bool {
        self.contains(ControllerCapability::ModifyVolume)
    }

    /// Whether listings must report published nodes (`LIST_VOLUMES_PUBLISHED_NODES`).
    pub fn reports_published_nodes(&self) -> bool {
        self.contains(ControllerCapability::ListVolumesPublishedNodes)
    }
}

impl NodeCapabilities {
    /// Whether the CO must call `NodeStageVolume` once per volume and node before any
    /// `NodePublishVolume`, send `staging_target_path` with each publish, and ref-count
    /// publications to call `NodeUnstageVolume` last (`STAGE_UNSTAGE_VOLUME`).
    pub fn requires_staging(&self) -> bool {
        self.contains(NodeCapability::StageUnstageVolume)
    }

    /// Whether `NodeExpandVolume` is offered (`EXPAND_VOLUME`).
    pub fn can_expand(&self) -> bool {
        self.contains(NodeCapability::ExpandVolume)
    }

    /// Whether the plugin honours `MountVolume.volume_mount_group` (`VOLUME_MOUNT_GROUP`).
    pub fn supports_volume_mount_group(&self) -> bool {
        self.contains(NodeCapability::VolumeMountGroup)
    }

    /// Whether `NodeGetVolumeStats` is offered (`GET_VOLUME_STATS`, or the v1.12
    /// `VOLUME_CONDITION`).
    pub fn can_get_volume_stats(&self) -> bool {
        self.contains(NodeCapability::GetVolumeStats)
            || self.contains(NodeCapability::VolumeCondition)
    }
}

/// What `GetPluginCapabilities` returned: services and volume-expansion modes.
///
/// The empty set (`Default`) means "advertises nothing": a node-only plugin without
/// expansion.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PluginCapabilities {
    services: BTreeSet<PluginService>,
    expansion: BTreeSet<VolumeExpansion>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    unknown_services: BTreeSet<i32>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    unknown_expansion: BTreeSet<i32>,
}

impl PluginCapabilities {
    /// The empty set.
    pub const fn new() -> Self {
        Self {
            services: BTreeSet::new(),
            expansion: BTreeSet::new(),
            unknown_services: BTreeSet::new(),
            unknown_expansion: BTreeSet::new(),
        }
    }

    /// A set with these services and no expansion.
    pub fn from_services(services: impl IntoIterator<Item = PluginService>) -> Self {
        Self {
            services: services.into_iter().collect(),
            ..Self::new()
        }
    }

    /// Adds expansion modes.
    #[must_use]
    pub fn with_expansion(mut self, modes: impl IntoIterator<Item = VolumeExpansion>) -> Self {
        self.expansion.extend(modes);
        self
    }

    /// Whether the service capability is advertised.
    pub fn has_service(&self, service: PluginService) -> bool {
        self.services.contains(&service)
    }

    /// Whether the expansion mode is advertised.
    pub fn has_expansion(&self, mode: VolumeExpansion) -> bool {
        self.expansion.contains(&mode)
    }

    /// Adds a service.
    pub fn insert_service(&mut self, service: PluginService) {
        self.services.insert(service);
    }

    /// Adds an expansion mode.
    pub fn insert_expansion(&mut self, mode: VolumeExpansion) {
        self.expansion.insert(mode);
    }

    /// Adds a service by wire number; unknown numbers are kept aside and ignored.
    pub fn insert_service_wire(&mut self, value: i32) {
        match PluginService::from_wire(value) {
            Some(s) => {
                self.services.insert(s);
            }
            None => {
                self.unknown_services.insert(value);
            }
        }
    }

    /// Adds an expansion mode by wire number; unknown numbers are kept aside and ignored.
    pub fn insert_expansion_wire(&mut self, value: i32) {
        match VolumeExpansion::from_wire(value) {
            Some(m) => {
                self.expansion.insert(m);
            }
            None => {
                self.unknown_expansion.insert(value);
            }
        }
    }

    /// The advertised services this crate knows.
    pub fn services(&self) -> impl Iterator<Item = PluginService> + '_ {
        self.services.iter().copied()
    }

    /// The advertised expansion modes this crate knows.
    pub fn expansion(&self) -> impl Iterator<Item = VolumeExpansion> + '_ {
        self.expansion.iter().copied()
    }

    /// Service numbers advertised that this crate does not know (ignored).
    pub fn unknown_services(&self) -> impl Iterator<Item = i32> + '_ {
        self.unknown_services.iter().copied()
    }

    /// Expansion numbers advertised that this crate does not know (ignored).
    pub fn unknown_expansion(&self) -> impl Iterator<Item = i32> + '_ {
        self.unknown_expansion.iter().copied()
    }

    /// Whether the plugin serves the Controller service (`CONTROLLER_SERVICE`).
    pub fn has_controller_service(&self) -> bool {
        self.has_service(PluginService::ControllerService)
    }

    /// Whether topology applies to volumes (`VOLUME_ACCESSIBILITY_CONSTRAINTS`).
    pub fn has_accessibility_constraints(&self) -> bool {
        self.has_service(PluginService::VolumeAccessibilityConstraints)
    }

    /// Whether the plugin serves the GroupController service.
    pub fn has_group_controller_service(&self) -> bool {
        self.has_service(PluginService::GroupControllerService)
    }
}

/// Everything a plugin advertised, as one value the rules of spec §3.8 are asked on.
///
/// Sets of services the plugin does not offer (or that were not fetched) are empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Capabilities {
    /// From `GetPluginCapabilities`.
    pub plugin: PluginCapabilities,
    /// From `ControllerGetCapabilities` (empty without a Controller service).
    pub controller: ControllerCapabilities,
    /// From `NodeGetCapabilities` (empty without a Node service).
    pub node: NodeCapabilities,
    /// From `GroupControllerGetCapabilities` (empty without a GroupController service).
    pub group_controller: GroupControllerCapabilities,
}

/// What makes an RPC mandatory for a plugin (spec §3.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Requirement {
    /// Every plugin component serves it (the Identity service).
    Always,
    /// Every Node service serves it (`NodeGetCapabilities`, `NodePublishVolume`,
    /// `NodeUnpublishVolume`).
    NodeService,
    /// The plugin capability must be advertised.
    Plugin(PluginService),
    /// The controller capability must be advertised.
    Controller(ControllerCapability),
    /// The node capability must be advertised.
    Node(NodeCapability),
    /// Either node capability (`NodeGetVolumeStats`: `GET_VOLUME_STATS`, or the v1.12
    /// `VOLUME_CONDITION`).
    NodeEither(NodeCapability, NodeCapability),
    /// The group controller capability must be advertised.
    GroupController(GroupControllerCapability),
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Requirement::Always => f.write_str("always (Identity service)"),
            Requirement::NodeService => f.write_str("always (Node service)"),
            Requirement::Plugin(c) => write!(f, "plugin capability {c}"),
            Requirement::Controller(c) => write!(f, "controller capability {c}"),
            Requirement::Node(c) => write!(f, "node capability {c}"),
            Requirement::NodeEither(a, b) => write!(f, "node capability {a} or {b}"),
            Requirement::GroupController(c) => write!(f, "group controller capability {c}"),
        }
    }
}

/// The answer to "may I call this RPC?" for a plugin's [`Capabilities`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RpcSupport {
    /// The plugin must serve the RPC: its requirement is met.
    Required(Requirement),
    /// The plugin need not serve the RPC (it should answer `UNIMPLEMENTED`): the requirement
    /// is not advertised. Do not call it.
    NotAdvertised(Requirement),
}

impl RpcSupport {
    /// Whether the plugin must serve the RPC (so the CO may call it).
    pub const fn is_required(self) -> bool {
        matches!(self, RpcSupport::Required(_))
    }

    /// The requirement behind the answer.
    pub const fn requirement(self) -> Requirement {
        match self {
            RpcSupport::Required(r) | RpcSupport::NotAdvertised(r) => r,
        }
    }
}

/// What makes `rpc` mandatory for a plugin (spec §3.8).
///
/// `NodeGetInfo` is mandatory only with controller `PUBLISH_UNPUBLISH_VOLUME`, not on every
/// Node service: csi-spec §2.3 (NodeGetInfo) says "MUST if the plugin has controller
/// PUBLISH_UNPUBLISH_VOLUME", §3.8 lists it under that capability and not among the Node
/// service's always-required RPCs, and §4.5 says that without the capability "NodeGetInfo is
/// not mandatory". A CO may still call it (most do, for the node id at registration) but must
/// then accept `UNIMPLEMENTED`. The capability belongs to the plugin's Controller service: a
/// [`Capabilities`] read from a node-only instance (no `CONTROLLER_SERVICE` there) answers
/// "not advertised", so ask it of the capabilities of the instance that serves the
/// controller.
///
/// ```
/// use csi_proto::Rpc;
/// use csi_structs::capability_set::{ControllerCapability, Requirement, requirement_for};
///
/// assert_eq!(requirement_for(Rpc::NodePublishVolume), Requirement::NodeService);
/// assert_eq!(
///     requirement_for(Rpc::NodeGetInfo),
///     Requirement::Controller(ControllerCapability::PublishUnpublishVolume)
/// );
/// ```
pub const fn requirement_for(rpc: Rpc) -> Requirement {
    use ControllerCapability as C;
    use NodeCapability as N;
    match rpc {
        Rpc::GetPluginInfo | Rpc::GetPluginCapabilities | Rpc::Probe => Requirement::Always,
        Rpc::ControllerGetCapabilities | Rpc::ValidateVolumeCapabilities => {
            Requirement::Plugin(PluginService::ControllerService)
        }
        Rpc::CreateVolume | Rpc::DeleteVolume => Requirement::Controller(C::CreateDeleteVolume),
        Rpc::ControllerPublishVolume | Rpc::ControllerUnpublishVolume => {
            Requirement::Controller(C::PublishUnpublishVolume)
        }
        Rpc::ListVolumes => Requirement::Controller(C::ListVolumes),
        Rpc::GetCapacity => Requirement::Controller(C::GetCapacity),
        Rpc::CreateSnapshot | Rpc::DeleteSnapshot => {
            Requirement::Controller(C::CreateDeleteSnapshot)
        }
        Rpc::ListSnapshots => Requirement::Controller(C::ListSnapshots),
        Rpc::GetSnapshot => Requirement::Controller(C::GetSnapshot),
        Rpc::ControllerExpandVolume => Requirement::Controller(C::ExpandVolume),
        Rpc::ControllerGetVolume => Requirement::Controller(C::GetVolume),
        Rpc::ControllerModifyVolume => Requirement::Controller(C::ModifyVolume),
        Rpc::ControllerGetVolumeHealth => Requirement::Controller(C::GetVolumeHealth),
        Rpc::ControllerListVolumeHealth => Requirement::Controller(C::ListVolumeHealth),
        Rpc::GroupControllerGetCapabilities => {
            Requirement::Plugin(PluginService::GroupControllerService)
        }
        Rpc::CreateVolumeGroupSnapshot
        | Rpc::DeleteVolumeGroupSnapshot
        | Rpc::GetVolumeGroupSnapshot => Requirement::GroupController(
            GroupControllerCapability::CreateDeleteGetVolumeGroupSnapshot,
        ),
        Rpc::GetMetadataAllocated | Rpc::GetMetadataDelta => {
            Requirement::Plugin(PluginService::SnapshotMetadataService)
        }
        Rpc::NodeStageVolume | Rpc::NodeUnstageVolume => Requirement::Node(N::StageUnstageVolume),
        Rpc::NodePublishVolume | Rpc::NodeUnpublishVolume | Rpc::NodeGetCapabilities => {
            Requirement::NodeService
        }
        Rpc::NodeGetVolumeStats => Requirement::NodeEither(N::GetVolumeStats, N::VolumeCondition),
        Rpc::NodeGetVolumeHealth => Requirement::Node(N::GetVolumeHealth),
        Rpc::NodeGetStorageHealth => Requirement::Node(N::GetStorageHealth),
        Rpc::NodeExpandVolume => Requirement::Node(N::ExpandVolume),
        // Mandatory with controller publish only (it feeds ControllerPublishVolume's
        // node_id); see the doc comment for the spec text.
        Rpc::NodeGetInfo => Requirement::Controller(C::PublishUnpublishVolume),
    }
}

/// A rule of spec §3.8 that a plugin's advertised capabilities break.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CapabilityRule {
    /// `LIST_VOLUMES_PUBLISHED_NODES` requires `PUBLISH_UNPUBLISH_VOLUME`.
    ListPublishedNodesNeedsPublishUnpublish,
    /// Controller `LIST_VOLUME_HEALTH` requires controller `GET_VOLUME_HEALTH`.
    ListVolumeHealthNeedsGetVolumeHealth,
    /// `VolumeExpansion.ONLINE` requires controller or node `EXPAND_VOLUME`.
    OnlineExpansionNeedsExpandVolume,
    /// `VolumeExpansion.OFFLINE` requires controller `EXPAND_VOLUME`.
    OfflineExpansionNeedsControllerExpandVolume,
    /// Controller capabilities were reported but the plugin does not advertise
    /// `CONTROLLER_SERVICE`.
    ControllerCapabilitiesWithoutControllerService,
    /// Group controller capabilities were reported but the plugin does not advertise
    /// `GROUP_CONTROLLER_SERVICE`.
    GroupCapabilitiesWithoutGroupControllerService,
    /// `CLONE_VOLUME` extends `CreateVolume`, so it implies `CREATE_DELETE_VOLUME`.
    CloneVolumeNeedsCreateDeleteVolume,
    /// `PUBLISH_READONLY` extends `ControllerPublishVolume`, so it implies
    /// `PUBLISH_UNPUBLISH_VOLUME`.
    PublishReadonlyNeedsPublishUnpublish,
}

impl fmt::Display for CapabilityRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CapabilityRule::ListPublishedNodesNeedsPublishUnpublish => {
                "LIST_VOLUMES_PUBLISHED_NODES is advertised without PUBLISH_UNPUBLISH_VOLUME"
            }
            CapabilityRule::ListVolumeHealthNeedsGetVolumeHealth => {
                "controller LIST_VOLUME_HEALTH is advertised without GET_VOLUME_HEALTH"
            }
            CapabilityRule::OnlineExpansionNeedsExpandVolume => {
                "ONLINE volume expansion is advertised without controller or node EXPAND_VOLUME"
            }
            CapabilityRule::OfflineExpansionNeedsControllerExpandVolume => {
                "OFFLINE volume expansion is advertised without controller EXPAND_VOLUME"
            }
            CapabilityRule::ControllerCapabilitiesWithoutControllerService => {
                "controller capabilities are reported without the CONTROLLER_SERVICE plugin capability"
            }
            CapabilityRule::GroupCapabilitiesWithoutGroupControllerService => {
                "group controller capabilities are reported without the GROUP_CONTROLLER_SERVICE plugin capability"
            }
            CapabilityRule::CloneVolumeNeedsCreateDeleteVolume => {
                "CLONE_VOLUME is advertised without CREATE_DELETE_VOLUME"
            }
            CapabilityRule::PublishReadonlyNeedsPublishUnpublish => {
                "PUBLISH_READONLY is advertised without PUBLISH_UNPUBLISH_VOLUME"
            }
        })
    }
}

impl Capabilities {
    /// Everything advertised, one `service:NAME` each in the spec's names, for an operator
    /// to read: `plugin:CONTROLLER_SERVICE`, `expansion:ONLINE`, `controller:EXPAND_VOLUME`,
    /// `node:STAGE_UNSTAGE_VOLUME`, `group_controller:...`; a number this crate does not
    /// know is `controller:#999`.
    ///
    /// ```
    /// use csi_structs::{Capabilities, ControllerCapability, VolumeExpansion};
    ///
    /// let mut caps = Capabilities::default();
    /// caps.plugin.insert_expansion(VolumeExpansion::Offline);
    /// caps.controller.insert(ControllerCapability::ExpandVolume);
    /// caps.controller.insert_wire(999);
    /// assert_eq!(
    ///     caps.advertised(),
    ///     ["expansion:OFFLINE", "controller:EXPAND_VOLUME", "controller:#999"]
    /// );
    /// ```
    pub fn advertised(&self) -> Vec<String> {
        fn named<T: fmt::Display>(
            service: &str,
            known: impl Iterator<Item = T>,
            unknown: impl Iterator<Item = i32>,
        ) -> impl Iterator<Item = String> {
            let known = known
                .map(move |c| format!("{service}:{c}"))
                .collect::<Vec<_>>();
            let unknown = unknown
                .map(move |n| format!("{service}:#{n}"))
                .collect::<Vec<_>>();
            known.into_iter().chain(unknown)
        }
        let p = &self.plugin;
        named("plugin", p.services(), p.unknown_services())
            .chain(named("expansion", p.expansion(), p.unknown_expansion()))
            .chain(named(
                "controller",
                self.controller.iter(),
                self.controller.unknown(),
            ))
            .chain(named("node", self.node.iter(), self.node.unknown()))
            .chain(named(
                "group_controller",
                self.group_controller.iter(),
                self.group_controller.unknown(),
            ))
            .collect()
    }

    /// Whether `requirement` is advertised.
    ///
    /// A controller capability counts only when the plugin also advertises
    /// `CONTROLLER_SERVICE`, and a group controller capability only with
    /// `GROUP_CONTROLLER_SERVICE`: spec §3.8 has the CO call the RPCs a service's
    /// capabilities enable only through a service the plugin advertises, so without it
    /// nothing obliges the plugin to serve them. [`Requirement::NodeService`] holds on every
    /// value: whether a Node service answers is known only by calling it.
    ///
    /// ```
    /// use csi_structs::capability_set::{
    ///     Capabilities, ControllerCapability, PluginCapabilities, PluginService, Requirement,
    /// };
    ///
    /// let create = Requirement::Controller(ControllerCapability::CreateDeleteVolume);
    /// let mut caps = Capabilities {
    ///     controller: [ControllerCapability::CreateDeleteVolume].into_iter().collect(),
    ///     ..Capabilities::default()
    /// };
    /// assert!(!caps.satisfies(create));
    /// caps.plugin = PluginCapabilities::from_services([PluginService::ControllerService]);
    /// assert!(caps.satisfies(create));
    /// ```
    pub fn satisfies(&self, requirement: Requirement) -> bool {
        self.unmet(requirement).is_none()
    }

    /// What is missing for `requirement`, or `None` when it is advertised (the same rule as
    /// [`satisfies`](Self::satisfies)).
    ///
    /// For a controller or group controller capability whose service is not advertised, the
    /// answer is the service ([`Requirement::Plugin`]), so a message can name the real
    /// cause; otherwise it is `requirement` itself.
    pub fn unmet(&self, requirement: Requirement) -> Option<Requirement> {
        let service = match requirement {
            Requirement::Controller(_) => Some(PluginService::ControllerService),
            Requirement::GroupController(_) => Some(PluginService::GroupControllerService),
            _ => None,
        };
        if let Some(service) = service
            && !self.plugin.has_service(service)
        {
            return Some(Requirement::Plugin(service));
        }
        let advertised = match requirement {
            Requirement::Always | Requirement::NodeService => true,
            Requirement::Plugin(s) => self.plugin.has_service(s),
            Requirement::Controller(c) => self.controller.contains(c),
            Requirement::Node(c) => self.node.contains(c),
            Requirement::NodeEither(a, b) => self.node.contains(a) || self.node.contains(b),
            Requirement::GroupController(c) => self.group_controller.contains(c),
        };
        (!advertised).then_some(requirement)
    }

    /// Whether the plugin must serve `rpc`, given what it advertised (spec §3.8).
    ///
    /// [`RpcSupport::NotAdvertised`] means the CO should not call it: the plugin may answer
    /// `UNIMPLEMENTED`, which is final.
    pub fn support(&self, rpc: Rpc) -> RpcSupport {
        let requirement = requirement_for(rpc);
        if self.satisfies(requirement) {
            RpcSupport::Required(requirement)
        } else {
            RpcSupport::NotAdvertised(requirement)
        }
    }

    /// Whether the CO may call `rpc` (shorthand for `support(rpc).is_required()`).
    pub fn may_call(&self, rpc: Rpc) -> bool {
        self.support(rpc).is_required()
    }

    /// Whether the volume lifecycle obliges the CO to call `rpc` around every use of a
    /// volume: `ControllerPublishVolume`/`ControllerUnpublishVolume` and `NodeGetInfo` with
    /// `PUBLISH_UNPUBLISH_VOLUME` (counted, as in [`satisfies`](Self::satisfies), only with
    /// `CONTROLLER_SERVICE`), `NodeStageVolume`/`NodeUnstageVolume` with
    /// `STAGE_UNSTAGE_VOLUME`, and always `NodePublishVolume`/`NodeUnpublishVolume`
    /// (spec §4).
    pub fn lifecycle_requires(&self, rpc: Rpc) -> bool {
        match rpc {
            Rpc::ControllerPublishVolume | Rpc::ControllerUnpublishVolume | Rpc::NodeGetInfo => {
                self.satisfies(Requirement::Controller(
                    ControllerCapability::PublishUnpublishVolume,
                ))
            }
            Rpc::NodeStageVolume | Rpc::NodeUnstageVolume => self.node.requires_staging(),
            Rpc::NodePublishVolume | Rpc::NodeUnpublishVolume => true,
            _ => false,
        }
    }

    /// Whether the plugin can serve `mode` (the alpha modes 6 and 7 need
    /// `SINGLE_NODE_MULTI_WRITER` on the services involved: the controller's when it has a
    /// Controller service, and the node's).
    pub fn supports_access_mode(&self, mode: crate::AccessMode) -> bool {
        if !mode.needs_single_node_multi_writer_capability() {
            return true;
        }
        let controller_ok = !self.plugin.has_controller_service()
            || self
                .controller
                .contains(ControllerCapability::SingleNodeMultiWriter);
        controller_ok && self.node.contains(NodeCapability::SingleNodeMultiWriter)
    }

    /// The advertised capabilities `cap` needs but the plugin lacks: `SINGLE_NODE_MULTI_WRITER`
    /// (controller side when there is a Controller service, and node side) for the alpha
    /// modes 6 and 7, and node `VOLUME_MOUNT_GROUP` when a mount group is set. Empty when the
    /// plugin can serve `cap`.
    pub fn missing_for(&self, cap: &crate::VolumeCapability) -> Vec<Requirement> {
        let mut out = Vec::new();
        if cap.access_mode.needs_single_node_multi_writer_capability() {
            if self.plugin.has_controller_service()
                && !self
                    .controller
                    .contains(ControllerCapability::SingleNodeMultiWriter)
            {
                out.push(Requirement::Controller(
                    ControllerCapability::SingleNodeMultiWriter,
                ));
            }
            if !self.node.contains(NodeCapability::SingleNodeMultiWriter) {
                out.push(Requirement::Node(NodeCapability::SingleNodeMultiWriter));
            }
        }
        if cap
            .mount_options()
            .and_then(crate::MountOptions::volume_mount_group)
            .is_some()
            && !self.node.supports_volume_mount_group()
        {
            out.push(Requirement::Node(NodeCapability::VolumeMountGroup));
        }
        out
    }

    /// Every rule of spec §3.8 the advertised capabilities break, in a stable order. Empty
    /// when consistent. Callers decide whether to refuse the plugin or only warn.
    pub fn rule_violations(&self) -> Vec<CapabilityRule> {
        use ControllerCapability as C;
        let c = &self.controller;
        let mut out = Vec::new();
        if c.contains(C::ListVolumesPublishedNodes) && !c.contains(C::PublishUnpublishVolume) {
            out.push(CapabilityRule::ListPublishedNodesNeedsPublishUnpublish);
        }
        if c.contains(C::ListVolumeHealth) && !c.contains(C::GetVolumeHealth) {
            out.push(CapabilityRule::ListVolumeHealthNeedsGetVolumeHealth);
        }
        if self.plugin.has_expansion(VolumeExpansion::Online)
            && !c.contains(C::ExpandVolume)
            && !self.node.contains(NodeCapability::ExpandVolume)
        {
            out.push(CapabilityRule::OnlineExpansionNeedsExpandVolume);
        }
        if self.plugin.has_expansion(VolumeExpansion::Offline) && !c.contains(C::ExpandVolume) {
            out.push(CapabilityRule::OfflineExpansionNeedsControllerExpandVolume);
        }
        if !c.is_empty() && !self.plugin.has_controller_service() {
            out.push(CapabilityRule::ControllerCapabilitiesWithoutControllerService);
        }
        if !self.group_controller.is_empty() && !self.plugin.has_group_controller_service() {
            out.push(CapabilityRule::GroupCapabilitiesWithoutGroupControllerService);
        }
        if c.contains(C::CloneVolume) && !c.contains(C::CreateDeleteVolume) {
            out.push(CapabilityRule::CloneVolumeNeedsCreateDeleteVolume);
        }
        if c.contains(C::PublishReadonly) && !c.contains(C::PublishUnpublishVolume) {
            out.push(CapabilityRule::PublishReadonlyNeedsPublishUnpublish);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ControllerCapability as C;
    use NodeCapability as N;

    #[test]
    fn wire_numbers_round_trip_and_unknown_is_kept_aside() {
        for c in ControllerCapability::ALL {
            assert_eq!(ControllerCapability::from_wire(c.to_wire()), Some(*c));
            assert_eq!(c.wire() as i32, c.to_wire());
            assert_eq!(c.wire().as_str_name(), c.wire_name());
        }
        for c in NodeCapability::ALL {
            assert_eq!(c.wire() as i32, c.to_wire());
            assert_eq!(c.wire().as_str_name(), c.wire_name());
        }
        for c in PluginService::ALL {
            assert_eq!(c.wire() as i32, c.to_wire());
            assert_eq!(c.wire().as_str_name(), c.wire_name());
        }
        let mut set = ControllerCapabilities::new();
        set.insert_wire(2);
        set.insert_wire(0);
        set.insert_wire(99);
        assert!(set.requires_controller_publish());
        assert_eq!(set.len(), 1);
        assert_eq!(set.unknown().collect::<Vec<_>>(), vec![0, 99]);
    }

    fn caps(plugin: &[PluginService], exp: &[VolumeExpansion], c: &[C], n: &[N]) -> Capabilities {
        Capabilities {
            plugin: PluginCapabilities::from_services(plugin.iter().copied())
                .with_expansion(exp.iter().copied()),
            controller: c.iter().copied().collect(),
            node: n.iter().copied().collect(),
            group_controller: GroupControllerCapabilities::new(),
        }
    }

    #[test]
    fn rule_violations_table() {
        use CapabilityRule as R;
        use PluginService::ControllerService as CS;
        use VolumeExpansion::{Offline, Online};
        let cases: Vec<(Capabilities, Vec<CapabilityRule>)> = vec![
            (caps(&[], &[], &[], &[]), vec![]),
            (
                caps(
                    &[CS],
                    &[],
                    &[C::PublishUnpublishVolume, C::ListVolumesPublishedNodes],
                    &[],
                ),
                vec![],
            ),
            (
                caps(&[CS], &[], &[C::ListVolumesPublishedNodes], &[]),
                vec![R::ListPublishedNodesNeedsPublishUnpublish],
            ),
            (
                caps(&[CS], &[], &[C::ListVolumeHealth], &[]),
                vec![R::ListVolumeHealthNeedsGetVolumeHealth],
            ),
            (
                caps(&[CS], &[], &[C::ListVolumeHealth, C::GetVolumeHealth], &[]),
                vec![],
            ),
            (
                caps(&[], &[Online], &[], &[]),
                vec![R::OnlineExpansionNeedsExpandVolume],
            ),
            (caps(&[], &[Online], &[], &[N::ExpandVolume]), vec![]),
            (
                caps(&[], &[Offline], &[], &[N::ExpandVolume]),
                vec![R::OfflineExpansionNeedsControllerExpandVolume],
            ),
            (
                caps(&[CS], &[Offline, Online], &[C::ExpandVolume], &[]),
                vec![],
            ),
            (
                caps(&[], &[], &[C::CreateDeleteVolume], &[]),
                vec![R::ControllerCapabilitiesWithoutControllerService],
            ),
            (
                caps(&[CS], &[], &[C::CloneVolume], &[]),
                vec![R::CloneVolumeNeedsCreateDeleteVolume],
            ),
            (
                caps(&[CS], &[], &[C::PublishReadonly], &[]),
                vec![R::PublishReadonlyNeedsPublishUnpublish],
            ),
        ];
        for (i, (c, expected)) in cases.into_iter().enumerate() {
            assert_eq!(c.rule_violations(), expected, "case {i}");
        }
        let mut g = Capabilities::default();
        g.group_controller
            .insert(GroupControllerCapability::CreateDeleteGetVolumeGroupSnapshot);
        assert_eq!(
            g.rule_violations(),
            vec![R::GroupCapabilitiesWithoutGroupControllerService]
        );
    }

    #[test]
    fn rpc_support_table() {
        use PluginService::ControllerService as CS;
        let minimal = caps(&[], &[], &[], &[]);
        let full = caps(
            &[CS],
            &[],
            &[
                C::CreateDeleteVolume,
                C::PublishUnpublishVolume,
                C::GetSnapshot,
            ],
            &[N::StageUnstageVolume, N::VolumeCondition],
        );
        // rpc, minimal plugin may call, full plugin may call
        let table = [
            (Rpc::Probe, true, true),
            (Rpc::GetPluginInfo, true, true),
            (Rpc::ValidateVolumeCapabilities, false, true),
            (Rpc::ControllerGetCapabilities, false, true),
            (Rpc::CreateVolume, false, true),
            (Rpc::ControllerPublishVolume, false, true),
            (Rpc::NodeGetInfo, false, true),
            (Rpc::NodeStageVolume, false, true),
            (Rpc::NodePublishVolume, true, true),
            (Rpc::NodeGetVolumeStats, false, true),
            (Rpc::GetSnapshot, false, true),
            (Rpc::ListSnapshots, false, false),
            (Rpc::ControllerExpandVolume, false, false),
            (Rpc::GroupControllerGetCapabilities, false, false),
            (Rpc::GetMetadataDelta, false, false),
        ];
        for (rpc, min_ok, full_ok) in table {
            assert_eq!(minimal.may_call(rpc), min_ok, "minimal {}", rpc.name());
            assert_eq!(full.may_call(rpc), full_ok, "full {}", rpc.name());
        }
        assert_eq!(
            full.support(Rpc::ListSnapshots),
            RpcSupport::NotAdvertised(Requirement::Controller(C::ListSnapshots))
        );
        // Every rpc has a requirement; none panics.
        for rpc in Rpc::ALL {
            let _ = full.support(*rpc);
        }
    }

    #[test]
    fn controller_capabilities_count_only_with_controller_service() {
        use PluginService::ControllerService as CS;
        let advertised = [C::CreateDeleteVolume, C::PublishUnpublishVolume];
        let without = caps(&[], &[], &advertised, &[N::StageUnstageVolume]);
        let with = caps(&[CS], &[], &advertised, &[N::StageUnstageVolume]);
        let create = Requirement::Controller(C::CreateDeleteVolume);
        assert!(!without.satisfies(create));
        assert_eq!(
            without.unmet(create),
            Some(Requirement::Plugin(PluginService::ControllerService))
        );
        assert_eq!(
            without.support(Rpc::CreateVolume),
            RpcSupport::NotAdvertised(create)
        );
        for rpc in [
            Rpc::CreateVolume,
            Rpc::DeleteVolume,
            Rpc::ControllerPublishVolume,
            Rpc::ControllerUnpublishVolume,
            Rpc::NodeGetInfo,
        ] {
            assert!(!without.may_call(rpc), "without service: {}", rpc.name());
            assert!(with.may_call(rpc), "with service: {}", rpc.name());
        }
        for rpc in [
            Rpc::ControllerPublishVolume,
            Rpc::ControllerUnpublishVolume,
            Rpc::NodeGetInfo,
        ] {
            assert!(!without.lifecycle_requires(rpc), "{}", rpc.name());
            assert!(with.lifecycle_requires(rpc), "{}", rpc.name());
        }
        // Node rules do not depend on a plugin service.
        assert!(without.may_call(Rpc::NodeStageVolume));
        assert!(without.lifecycle_requires(Rpc::NodeStageVolume));
        assert_eq!(with.unmet(create), None);
        assert_eq!(
            with.unmet(Requirement::Controller(C::ListSnapshots)),
            Some(Requirement::Controller(C::ListSnapshots))
        );
    }

    #[test]
    fn group_capabilities_count_only_with_group_controller_service() {
        use GroupControllerCapability::CreateDeleteGetVolumeGroupSnapshot as G;
        let mut caps = caps(&[PluginService::ControllerService], &[], &[], &[]);
        caps.group_controller.insert(G);
        let requirement = Requirement::GroupController(G);
        // CONTROLLER_SERVICE does not stand in for GROUP_CONTROLLER_SERVICE.
        assert_eq!(
            caps.unmet(requirement),
            Some(Requirement::Plugin(PluginService::GroupControllerService))
        );
        for rpc in [
            Rpc::CreateVolumeGroupSnapshot,
            Rpc::DeleteVolumeGroupSnapshot,
            Rpc::GetVolumeGroupSnapshot,
            Rpc::GroupControllerGetCapabilities,
        ] {
            assert!(!caps.may_call(rpc), "{}", rpc.name());
        }
        caps.plugin
            .insert_service(PluginService::GroupControllerService);
        assert!(caps.satisfies(requirement));
        assert!(caps.may_call(Rpc::CreateVolumeGroupSnapshot));
        caps.group_controller = GroupControllerCapabilities::new();
        assert_eq!(caps.unmet(requirement), Some(requirement));
        assert!(caps.may_call(Rpc::GroupControllerGetCapabilities));
    }

    #[test]
    fn node_get_info_is_mandatory_only_with_controller_publish() {
        // A node-only plugin (no CONTROLLER_SERVICE, so no controller publish): the Node
        // service's always-required RPCs are mandatory, NodeGetInfo is not (spec §2.3, §4.5).
        let node_only = caps(&[], &[], &[], &[N::StageUnstageVolume]);
        for rpc in [
            Rpc::NodeGetCapabilities,
            Rpc::NodePublishVolume,
            Rpc::NodeUnpublishVolume,
        ] {
            assert_eq!(
                node_only.support(rpc),
                RpcSupport::Required(Requirement::NodeService),
                "{}",
                rpc.name()
            );
        }
        assert_eq!(
            node_only.support(Rpc::NodeGetInfo),
            RpcSupport::NotAdvertised(Requirement::Controller(C::PublishUnpublishVolume))
        );
        let publishing = caps(
            &[PluginService::ControllerService],
            &[],
            &[C::PublishUnpublishVolume],
            &[],
        );
        assert_eq!(
            publishing.support(Rpc::NodeGetInfo),
            RpcSupport::Required(Requirement::Controller(C::PublishUnpublishVolume))
        );
    }

    #[test]
    fn lifecycle_table() {
        let minimal = caps(&[], &[], &[], &[]);
        let full = caps(
            &[PluginService::ControllerService],
            &[],
            &[C::PublishUnpublishVolume],
            &[N::StageUnstageVolume],
        );
        for rpc in [
            Rpc::ControllerPublishVolume,
            Rpc::ControllerUnpublishVolume,
            Rpc::NodeGetInfo,
            Rpc::NodeStageVolume,
            Rpc::NodeUnstageVolume,
        ] {
            assert!(!minimal.lifecycle_requires(rpc), "{}", rpc.name());
            assert!(full.lifecycle_requires(rpc), "{}", rpc.name());
        }
        assert!(minimal.lifecycle_requires(Rpc::NodePublishVolume));
        assert!(!full.lifecycle_requires(Rpc::CreateVolume));
    }

    #[test]
    fn alpha_modes_need_capability() {
        use crate::AccessMode;
        let none = caps(&[PluginService::ControllerService], &[], &[], &[]);
        assert!(none.supports_access_mode(AccessMode::SingleNodeWriter));
        assert!(!none.supports_access_mode(AccessMode::SingleNodeMultiWriter));
        let both = caps(
            &[PluginService::ControllerService],
            &[],
            &[C::SingleNodeMultiWriter],
            &[N::SingleNodeMultiWriter],
        );
        assert!(both.supports_access_mode(AccessMode::SingleNodeSingleWriter));
        let node_only = caps(&[], &[], &[], &[N::SingleNodeMultiWriter]);
        assert!(node_only.supports_access_mode(AccessMode::SingleNodeMultiWriter));
    }

    #[test]
    fn missing_for_capability() {
        use crate::{AccessMode, MountOptions, VolumeCapability};
        let with_group = VolumeCapability::mount(
            AccessMode::SingleNodeMultiWriter,
            MountOptions::new().with_volume_mount_group("1000"),
        );
        let none = caps(&[PluginService::ControllerService], &[], &[], &[]);
        assert_eq!(
            none.missing_for(&with_group),
            vec![
                Requirement::Controller(C::SingleNodeMultiWriter),
                Requirement::Node(N::SingleNodeMultiWriter),
                Requirement::Node(N::VolumeMountGroup),
            ]
        );
        let all = caps(
            &[PluginService::ControllerService],
            &[],
            &[C::SingleNodeMultiWriter],
            &[N::SingleNodeMultiWriter, N::VolumeMountGroup],
        );
        assert!(all.missing_for(&with_group).is_empty());
        assert!(
            none.missing_for(&VolumeCapability::block(AccessMode::SingleNodeWriter))
                .is_empty()
        );
    }
}
