//! Property tests: every domain value survives a trip to the wire and back, and no wire
//! input, however broken, makes a conversion panic.

mod support;

use csi_proto::v1;
use csi_proto::v1::volume_capability as vc;
use csi_structs::capability_set::{
    ControllerCapabilities, GroupControllerCapabilities, NodeCapabilities, PluginCapabilities,
};
use csi_structs::confirm::{AskedCapabilities, ValidationResponse};
use csi_structs::*;
use proptest::prelude::*;
use support::*;

proptest! {
    #![proptest_config(config())]

    #[test]
    fn capability_round_trips(cap in capability()) {
        let wire = v1::VolumeCapability::from(&cap);
        prop_assert_eq!(VolumeCapability::try_from(&wire).unwrap(), cap);
    }

    #[test]
    fn capacity_round_trips(r in capacity_range()) {
        prop_assert_eq!(CapacityRange::try_from(v1::CapacityRange::from(&r)).unwrap(), r);
    }

    #[test]
    fn topology_round_trips(t in topology(), req in topology_requirement()) {
        prop_assert_eq!(Topology::try_from(v1::Topology::from(&t)).unwrap(), t);
        prop_assert_eq!(TopologyRequirement::try_from(v1::TopologyRequirement::from(&req)).unwrap(), req);
    }

    #[test]
    fn volume_round_trips(v in volume()) {
        prop_assert_eq!(Volume::try_from(v1::Volume::from(&v)).unwrap(), v.clone());
        prop_assert_eq!(Volume::try_from(v1::CreateVolumeResponse::from(&v)).unwrap(), v);
    }

    #[test]
    fn snapshot_round_trips(s in snapshot()) {
        prop_assert_eq!(Snapshot::try_from(v1::Snapshot::from(&s)).unwrap(), s);
    }

    #[test]
    fn info_round_trips(n in node_info(), p in plugin_info()) {
        prop_assert_eq!(NodeInfo::try_from(v1::NodeGetInfoResponse::from(&n)).unwrap(), n);
        prop_assert_eq!(PluginInfo::try_from(v1::GetPluginInfoResponse::from(&p)).unwrap(), p);
    }

    #[test]
    fn capability_sets_round_trip(
        p in plugin_caps(), c in controller_caps(), n in node_caps(), g in group_caps()
    ) {
        prop_assert_eq!(PluginCapabilities::from(v1::GetPluginCapabilitiesResponse::from(&p)), p);
        prop_assert_eq!(ControllerCapabilities::from(v1::ControllerGetCapabilitiesResponse::from(&c)), c);
        prop_assert_eq!(NodeCapabilities::from(v1::NodeGetCapabilitiesResponse::from(&n)), n);
        prop_assert_eq!(GroupControllerCapabilities::from(v1::GroupControllerGetCapabilitiesResponse::from(&g)), g);
    }

    #[test]
    fn validation_round_trips(caps in capabilities(), ctx in volume_context(), params in parameters(), msg in proptest::option::of("[a-z ]{1,10}")) {
        let mut asked = AskedCapabilities::new(caps);
        asked.volume_context = ctx;
        asked.parameters = params;
        let req = asked.to_request(&ExternalVolumeId::new("v").unwrap(), &Secrets::new());
        prop_assert_eq!(AskedCapabilities::try_from(&req).unwrap(), asked.clone());
        let resp = ValidationResponse {
            confirmed: Some(csi_structs::confirm::Confirmed::echo(&asked)),
            message: msg,
        };
        prop_assert_eq!(ValidationResponse::try_from(v1::ValidateVolumeCapabilitiesResponse::from(&resp)).unwrap(), resp);
    }

    /// Arbitrary (often spec-breaking) wire capabilities: never a panic; a value that parses
    /// is stable through another round trip.
    #[test]
    fn arbitrary_wire_capabilities_never_panic(
        mode in proptest::option::of(any::<i32>()),
        kind in 0u8..3,
        fs in "[ -~]{0,140}",
        flags in proptest::collection::vec("[ -~]{0,40}", 0..4),
    ) {
        let access_type = match kind {
            0 => None,
            1 => Some(vc::AccessType::Block(vc::BlockVolume {})),
            _ => Some(vc::AccessType::Mount(vc::MountVolume { fs_type: fs, mount_flags: flags, volume_mount_group: String::new() })),
        };
        let wire = v1::VolumeCapability { access_mode: mode.map(|mode| vc::AccessMode { mode }), access_type };
        match VolumeCapability::try_from(&wire) {
            Ok(cap) => prop_assert_eq!(VolumeCapability::try_from(v1::VolumeCapability::from(&cap)).unwrap(), cap),
            Err(e) => {
                prop_assert_eq!(e.message, "VolumeCapability");
                prop_assert!(!e.errors.is_empty());
            }
        }
    }

    /// Arbitrary node info answers: never a panic, and errors name the right fields.
    #[test]
    fn arbitrary_node_info_never_panics(
        node_id in "[ -~]{0,300}",
        max in any::<i64>(),
        segs in proptest::collection::hash_map("[ -~]{0,70}", "[ -~]{0,70}", 0..3),
    ) {
        let wire = v1::NodeGetInfoResponse {
            node_id: node_id.clone(),
            max_volumes_per_node: max,
            accessible_topology: Some(v1::Topology { segments: segs }),
        };
        match NodeInfo::try_from(&wire) {
            Ok(info) => {
                prop_assert_eq!(info.node_id.as_str(), node_id.as_str());
                prop_assert!(max >= 0);
            }
            Err(e) => {
                let bad_id = node_id.is_empty() || node_id.len() > 256;
                let names_id = e.errors.violations().iter().any(|v| v.field.to_string() == "node_id");
                prop_assert_eq!(bad_id, names_id);
                let names_max = e.errors.violations().iter().any(|v| v.field.to_string() == "max_volumes_per_node");
                prop_assert_eq!(max < 0, names_max);
            }
        }
    }
}
