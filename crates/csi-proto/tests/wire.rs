//! Wire vectors derived by hand from the schema: for each message, the tag byte is
//! `(field_number << 3) | wire_type` (0 = varint, 2 = length-delimited), lengths are the byte
//! counts of what follows, and fields go out in field-number order (oneof members at their own
//! number). Each vector must encode to exactly these bytes and decode back to the same message.

use std::collections::HashMap;
use std::fmt::Debug;

use csi_proto::v1::{
    self, ListVolumesResponse, NodeGetInfoResponse, NodeGetVolumeStatsResponse, Snapshot, Topology,
    VolumeCapability, VolumeCondition, VolumeUsage, controller_service_capability,
    list_volumes_response, plugin_capability, volume_capability,
};
use prost::Message;

fn roundtrip<M: Message + Default + PartialEq + Debug>(msg: M, bytes: &[u8]) {
    assert_eq!(msg.encode_to_vec(), bytes, "encoding of {msg:?}");
    let decoded = M::decode(bytes).expect("vector decodes");
    assert_eq!(decoded, msg);
}

#[test]
fn probe_response_wrapper_presence() {
    // ready (1, message) = BoolValue { value (1, varint) = 1 }
    roundtrip(
        v1::ProbeResponse { ready: Some(true) },
        &[0x0a, 0x02, 0x08, 0x01],
    );
    // A present BoolValue holding false is an empty message, but still on the wire.
    roundtrip(v1::ProbeResponse { ready: Some(false) }, &[0x0a, 0x00]);
    // Absent: nothing at all (and the CO must read it as ready).
    roundtrip(v1::ProbeResponse { ready: None }, &[]);
}

#[test]
fn plugin_info_with_map() {
    let msg = v1::GetPluginInfoResponse {
        name: "ab".into(),
        vendor_version: "1".into(),
        manifest: HashMap::from([("k".into(), "v".into())]),
    };
    #[rustfmt::skip]
    let bytes = [
        0x0a, 0x02, b'a', b'b',          // name (1)
        0x12, 0x01, b'1',                // vendor_version (2)
        0x1a, 0x06,                      // manifest (3): one entry of 6 bytes
        0x0a, 0x01, b'k',                //   key (1)
        0x12, 0x01, b'v',                //   value (2)
    ];
    roundtrip(msg, &bytes);
}

#[test]
fn mount_capability_oneof_repeated_and_enum() {
    let msg = VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: "ext4".into(),
                mount_flags: vec!["ro".into(), "noatime".into()],
                volume_mount_group: String::new(),
            },
        )),
    };
    #[rustfmt::skip]
    let bytes = [
        0x12, 0x13,                                  // mount (2, oneof access_type): 19 bytes
        0x0a, 0x04, b'e', b'x', b't', b'4',          //   fs_type (1)
        0x12, 0x02, b'r', b'o',                      //   mount_flags (2)
        0x12, 0x07, b'n', b'o', b'a', b't', b'i', b'm', b'e',
        0x1a, 0x02,                                  // access_mode (3)
        0x08, 0x01,                                  //   mode (1) = SINGLE_NODE_WRITER
    ];
    roundtrip(msg, &bytes);
}

#[test]
fn block_capability_empty_nested_message() {
    let msg = VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume {},
        )),
    };
    // block (1) is an empty message; it is present, so it is written with length 0.
    roundtrip(msg, &[0x0a, 0x00, 0x1a, 0x02, 0x08, 0x05]);
}

#[test]
fn capacity_range_multi_byte_and_negative_varints() {
    // 1 GiB = 2^30: five 7-bit groups, the last holding 2^30 >> 28 = 4. limit_bytes = 0 is omitted.
    roundtrip(
        v1::CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        },
        &[0x08, 0x80, 0x80, 0x80, 0x80, 0x04],
    );
    // A negative int64 is sign-extended to 64 bits: ten varint bytes.
    #[rustfmt::skip]
    let negative = [0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
    roundtrip(
        v1::CapacityRange {
            required_bytes: -1,
            limit_bytes: 0,
        },
        &negative,
    );
}

#[test]
fn node_info_with_nested_topology_map() {
    let msg = NodeGetInfoResponse {
        node_id: "n1".into(),
        max_volumes_per_node: 16,
        accessible_topology: Some(Topology {
            segments: HashMap::from([("zone".into(), "a".into())]),
        }),
    };
    #[rustfmt::skip]
    let bytes = [
        0x0a, 0x02, b'n', b'1',                      // node_id (1)
        0x10, 0x10,                                  // max_volumes_per_node (2) = 16
        0x1a, 0x0b,                                  // accessible_topology (3): 11 bytes
        0x0a, 0x09,                                  //   segments (1): entry of 9 bytes
        0x0a, 0x04, b'z', b'o', b'n', b'e',          //     key
        0x12, 0x01, b'a',                            //     value
    ];
    roundtrip(msg, &bytes);
}

#[test]
fn controller_capability_nested_oneof_enum() {
    let msg = v1::ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc {
                r#type: controller_service_capability::rpc::Type::PublishUnpublishVolume as i32,
            },
        )),
    };
    roundtrip(msg, &[0x0a, 0x02, 0x08, 0x02]);
}

#[test]
fn plugin_capability_second_oneof_member() {
    let msg = v1::PluginCapability {
        r#type: Some(plugin_capability::Type::VolumeExpansion(
            plugin_capability::VolumeExpansion {
                r#type: plugin_capability::volume_expansion::Type::Online as i32,
            },
        )),
    };
    roundtrip(msg, &[0x12, 0x02, 0x08, 0x01]);
}

#[test]
fn get_capacity_int64_wrappers() {
    let msg = v1::GetCapacityResponse {
        available_capacity: 300,
        maximum_volume_size: Some(0),
        minimum_volume_size: None,
    };
    // 300 = 0b1_0010_1100: low group 0x2c with the continuation bit (0xac), then 0x02.
    // maximum_volume_size is present with value 0: an empty Int64Value. minimum is absent.
    roundtrip(msg, &[0x08, 0xac, 0x02, 0x12, 0x00]);
}

#[test]
fn snapshot_with_timestamp_and_bool() {
    let msg = Snapshot {
        size_bytes: 0,
        snapshot_id: "s".into(),
        source_volume_id: "v".into(),
        creation_time: Some(prost_types::Timestamp {
            seconds: 1,
            nanos: 0,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
        accessible_topology: Vec::new(),
    };
    #[rustfmt::skip]
    let bytes = [
        0x12, 0x01, b's',                // snapshot_id (2)
        0x1a, 0x01, b'v',                // source_volume_id (3)
        0x22, 0x02, 0x08, 0x01,          // creation_time (4): seconds (1) = 1
        0x28, 0x01,                      // ready_to_use (5)
    ];
    roundtrip(msg, &bytes);
}

#[test]
fn list_volumes_repeated_nested_entries() {
    let msg = ListVolumesResponse {
        entries: vec![list_volumes_response::Entry {
            volume: Some(v1::Volume {
                volume_id: "v1".into(),
                ..Default::default()
            }),
            status: Some(list_volumes_response::VolumeStatus {
                published_node_ids: vec!["n".into()],
                volume_condition: None,
            }),
        }],
        next_token: "t".into(),
    };
    #[rustfmt::skip]
    let bytes = [
        0x0a, 0x0b,                      // entries (1): 11 bytes
        0x0a, 0x04,                      //   volume (1): 4 bytes
        0x12, 0x02, b'v', b'1',          //     volume_id (2)
        0x12, 0x03,                      //   status (2): 3 bytes
        0x0a, 0x01, b'n',                //     published_node_ids (1)
        0x12, 0x01, b't',                // next_token (2)
    ];
    roundtrip(msg, &bytes);
}

#[test]
fn v1_12_volume_condition_still_decodes() {
    let msg = NodeGetVolumeStatsResponse {
        usage: vec![VolumeUsage {
            available: 1,
            total: 2,
            used: 1,
            unit: v1::volume_usage::Unit::Bytes as i32,
        }],
        volume_condition: Some(VolumeCondition {
            abnormal: true,
            message: "x".into(),
        }),
    };
    #[rustfmt::skip]
    let bytes = [
        0x0a, 0x08,                                  // usage (1): 8 bytes
        0x08, 0x01, 0x10, 0x02, 0x18, 0x01, 0x20, 0x01, // available, total, used, unit = BYTES
        0x12, 0x05,                                  // volume_condition (2), a v1.12 field
        0x08, 0x01,                                  //   abnormal (1)
        0x12, 0x01, b'x',                            //   message (2)
    ];
    roundtrip(msg, &bytes);
}

#[test]
fn unknown_enum_numbers_are_kept_not_rejected() {
    // mode (1) = 42, a value no CSI version defines: prost keeps the raw number.
    let decoded = volume_capability::AccessMode::decode(&[0x08, 0x2a][..]).expect("decodes");
    assert_eq!(decoded.mode, 42);
    assert!(volume_capability::access_mode::Mode::try_from(decoded.mode).is_err());
    assert_eq!(decoded.encode_to_vec(), [0x08, 0x2a]);
}

#[test]
fn unknown_fields_from_newer_plugins_are_skipped() {
    // Probe response with ready = true and an unknown field 9 (varint 7) after it.
    let decoded = v1::ProbeResponse::decode(&[0x0a, 0x02, 0x08, 0x01, 0x48, 0x07][..])
        .expect("unknown fields are skipped");
    assert_eq!(decoded.ready, Some(true));
}
