//! Checks of the compiled schema itself: element counts against the wire-schema digest, the
//! secret options, the rpc table, and that no `Debug` output ever shows a secret value.
//!
//! Every message is built generically from the descriptor (prost-reflect), encoded, decoded into
//! the generated prost type and printed, so a message added to the proto is covered without
//! anyone touching this file.

use std::collections::BTreeSet;

use csi_proto::{FILE_DESCRIPTOR_SET, Rpc, SECRET_FIELDS, Service, paths};
use prost_reflect::{
    DescriptorPool, DynamicMessage, ExtensionDescriptor, FieldDescriptor, Kind, MapKey,
    MessageDescriptor, ReflectMessage, Value,
};

include!(concat!(env!("OUT_DIR"), "/debug_dispatch.rs"));

const SECRET_MARKER: &str = "S3CR3T-MARKER";

fn pool() -> DescriptorPool {
    DescriptorPool::decode(FILE_DESCRIPTOR_SET).expect("the embedded descriptor set decodes")
}

fn ext(pool: &DescriptorPool, name: &str) -> ExtensionDescriptor {
    pool.get_extension_by_name(&format!("csi.v1.{name}"))
        .unwrap_or_else(|| panic!("extension csi.v1.{name} is declared"))
}

fn flag(options: &DynamicMessage, ext: &ExtensionDescriptor) -> bool {
    options.get_extension(ext).as_bool().unwrap_or(false)
}

fn csi_messages(pool: &DescriptorPool) -> Vec<MessageDescriptor> {
    pool.all_messages()
        .filter(|m| m.package_name() == "csi.v1" && !m.is_map_entry())
        .collect()
}

#[test]
fn element_counts_match_v1_13_plus_the_v1_12_volume_condition() {
    let pool = pool();
    let services: Vec<_> = pool
        .services()
        .filter(|s| s.package_name() == "csi.v1")
        .collect();
    assert_eq!(services.len(), 5);
    let rpcs: usize = services.iter().map(|s| s.methods().len()).sum();
    assert_eq!(rpcs, 36);

    let messages = csi_messages(&pool);
    // 104 messages in v1.13.0, plus VolumeCondition kept from v1.12.
    assert_eq!(messages.len(), 105);
    let fields: Vec<FieldDescriptor> = messages.iter().flat_map(|m| m.fields()).collect();
    // 216 fields in v1.13.0, plus VolumeCondition's two and the three volume_condition fields.
    assert_eq!(fields.len(), 221);
    assert_eq!(fields.iter().filter(|f| f.is_map()).count(), 43);
    assert_eq!(
        fields.iter().filter(|f| f.is_list() && !f.is_map()).count(),
        27
    );
    assert_eq!(
        fields
            .iter()
            .filter(|f| f.containing_oneof().is_some())
            .count(),
        9
    );

    let enums: Vec<_> = pool
        .all_enums()
        .filter(|e| e.package_name() == "csi.v1")
        .collect();
    assert_eq!(enums.len(), 10);
    // 57 values in v1.13.0, plus the two VOLUME_CONDITION capability values.
    assert_eq!(enums.iter().map(|e| e.values().len()).sum::<usize>(), 59);
}

#[test]
fn option_markers_match_the_schema() {
    let pool = pool();
    let secret = ext(&pool, "csi_secret");
    let alpha_field = ext(&pool, "alpha_field");
    let alpha_message = ext(&pool, "alpha_message");
    let alpha_enum_value = ext(&pool, "alpha_enum_value");
    let alpha_method = ext(&pool, "alpha_method");
    let alpha_service = ext(&pool, "alpha_service");
    assert_eq!(secret.number(), 1059);
    assert_eq!(alpha_field.number(), 1060);

    let messages = csi_messages(&pool);
    let fields: Vec<FieldDescriptor> = messages.iter().flat_map(|m| m.fields()).collect();
    let secret_fields: Vec<_> = fields
        .iter()
        .filter(|f| flag(&f.options(), &secret))
        .collect();
    assert_eq!(secret_fields.len(), 22);
    assert!(
        secret_fields
            .iter()
            .all(|f| f.name() == "secrets" && f.is_map())
    );
    // v1.13's four alpha fields plus two of the three restored volume_condition fields.
    assert_eq!(
        fields
            .iter()
            .filter(|f| flag(&f.options(), &alpha_field))
            .count(),
        6
    );
    assert_eq!(
        messages
            .iter()
            .filter(|m| flag(&m.options(), &alpha_message))
            .count(),
        14
    );
    let values: Vec<_> = pool
        .all_enums()
        .filter(|e| e.package_name() == "csi.v1")
        .flat_map(|e| e.values().collect::<Vec<_>>())
        .collect();
    assert_eq!(
        values
            .iter()
            .filter(|v| flag(&v.options(), &alpha_enum_value))
            .count(),
        14
    );
    let methods: Vec<_> = pool
        .services()
        .flat_map(|s| s.methods().collect::<Vec<_>>())
        .collect();
    assert_eq!(
        methods
            .iter()
            .filter(|m| flag(&m.options(), &alpha_method))
            .count(),
        6
    );
    assert_eq!(
        pool.services()
            .filter(|s| flag(&s.options(), &alpha_service))
            .map(|s| s.name().to_owned())
            .collect::<Vec<_>>(),
        ["SnapshotMetadata"]
    );

    // The generated SECRET_FIELDS list is exactly what the descriptor marks.
    let from_descriptor: BTreeSet<(String, String)> = secret_fields
        .iter()
        .map(|f| {
            (
                f.parent_message().full_name().to_owned(),
                f.name().to_owned(),
            )
        })
        .collect();
    let generated: BTreeSet<(String, String)> = SECRET_FIELDS
        .iter()
        .map(|(m, f)| ((*m).to_owned(), (*f).to_owned()))
        .collect();
    assert_eq!(from_descriptor, generated);
}

#[test]
fn rpc_table_matches_the_services() {
    let pool = pool();
    let mut from_descriptor = Vec::new();
    for service in pool.services().filter(|s| s.package_name() == "csi.v1") {
        for method in service.methods() {
            from_descriptor.push((
                format!("/csi.v1.{}/{}", service.name(), method.name()),
                method.is_server_streaming(),
            ));
        }
    }
    let from_table: Vec<(String, bool)> = Rpc::ALL
        .iter()
        .map(|rpc| (rpc.path().to_owned(), rpc.is_server_streaming()))
        .collect();
    assert_eq!(from_table, from_descriptor);

    for rpc in Rpc::ALL {
        assert_eq!(Rpc::from_path(rpc.path()), Some(*rpc));
        assert_eq!(
            rpc.path(),
            format!("/csi.v1.{}/{}", rpc.service().name(), rpc.name())
        );
    }
    assert_eq!(Rpc::from_path("/csi.v1.Node/NoSuchRpc"), None);
    assert_eq!(paths::NODE_PUBLISH_VOLUME, "/csi.v1.Node/NodePublishVolume");
    assert_eq!(paths::PROBE, "/csi.v1.Identity/Probe");
    assert_eq!(Rpc::GetMetadataDelta.service(), Service::SnapshotMetadata);
    assert!(Rpc::GetMetadataAllocated.is_alpha() && Rpc::NodeGetVolumeHealth.is_alpha());
    assert!(!Rpc::NodePublishVolume.is_alpha());
    assert_eq!(Rpc::ALL.iter().filter(|r| r.is_alpha()).count(), 8);
    assert_eq!(csi_proto::SPEC_VERSION, "1.13.0");
}

/// A value for `field` in a filled message: secrets carry the marker, everything else a
/// visible value naming the field.
fn fill(field: &FieldDescriptor, secret: &ExtensionDescriptor, depth: usize) -> Option<Value> {
    let is_secret = flag(&field.options(), secret);
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return None;
        };
        let key_field = entry.map_entry_key_field();
        let value_field = entry.map_entry_value_field();
        if key_field.kind() != Kind::String || value_field.kind() != Kind::String {
            return None;
        }
        let value = if is_secret {
            format!("{SECRET_MARKER}-{}", field.name())
        } else {
            format!("visible-{}", field.name())
        };
        let mut map = std::collections::HashMap::new();
        map.insert(
            MapKey::String(format!("key-{}", field.name())),
            Value::String(value),
        );
        return Some(Value::Map(map));
    }
    let single = match field.kind() {
        Kind::String => Value::String(format!("visible-{}", field.name())),
        Kind::Bool => Value::Bool(true),
        Kind::Int64 => Value::I64(4242),
        Kind::Int32 => Value::I32(42),
        Kind::Enum(e) => Value::EnumNumber(e.values().last().map_or(1, |v| v.number())),
        Kind::Message(m) if depth < 4 => Value::Message(filled(&m, secret, depth + 1)),
        _ => return None,
    };
    Some(if field.is_list() {
        Value::List(vec![single])
    } else {
        single
    })
}

fn filled(
    message: &MessageDescriptor,
    secret: &ExtensionDescriptor,
    depth: usize,
) -> DynamicMessage {
    let mut msg = DynamicMessage::new(message.clone());
    let mut oneofs_seen = BTreeSet::new();
    for field in message.fields() {
        if let Some(oneof) = field.containing_oneof() {
            // Fill only the first member of each oneof.
            if !oneofs_seen.insert(oneof.name().to_owned()) {
                continue;
            }
        }
        if let Some(value) = fill(&field, secret, depth) {
            msg.set_field(&field, value);
        }
    }
    msg
}

#[test]
fn debug_never_prints_a_secret_value_and_still_prints_the_rest() {
    let pool = pool();
    let secret = ext(&pool, "csi_secret");
    let mut with_secrets = 0;
    for message in csi_messages(&pool) {
        let dynamic = filled(&message, &secret, 0);
        let bytes = prost::Message::encode_to_vec(&dynamic);
        let printed = decode_debug(message.full_name(), &bytes)
            .unwrap_or_else(|| panic!("{} has no generated type", message.full_name()))
            .unwrap_or_else(|e| panic!("{} does not decode: {e}", message.full_name()));

        assert!(
            !printed.contains(SECRET_MARKER),
            "{} prints a secret: {printed}",
            message.full_name()
        );
        for field in message.fields() {
            if field.containing_oneof().is_some() {
                continue;
            }
            if flag(&field.options(), &secret) {
                with_secrets += 1;
                // The key is shown so a missing secret can be diagnosed; its value is not.
                assert!(
                    printed.contains(&format!("key-{}", field.name())),
                    "{printed}"
                );
                assert!(printed.contains("<redacted>"), "{printed}");
            } else if field.kind() == Kind::String || field.is_map() {
                assert!(
                    printed.contains(&format!("visible-{}", field.name())),
                    "{} hides non-secret field {}: {printed}",
                    message.full_name(),
                    field.name()
                );
            }
        }
        // A message built by the test really carries its marker on the wire.
        if message.fields().any(|f| flag(&f.options(), &secret)) {
            let decoded = DynamicMessage::decode(message.clone(), bytes.as_slice())
                .expect("re-decodes dynamically");
            assert!(format!("{decoded:?}").contains(SECRET_MARKER));
        }
        assert_eq!(dynamic.descriptor().full_name(), message.full_name());
    }
    assert_eq!(with_secrets, 22);
}
