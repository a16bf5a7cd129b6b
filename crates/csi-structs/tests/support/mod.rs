//! Proptest strategies for the domain types, shared by the property tests.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use csi_structs::capability_set::{
    ControllerCapabilities, ControllerCapability, GroupControllerCapabilities,
    GroupControllerCapability, NodeCapabilities, NodeCapability, PluginCapabilities, PluginService,
    VolumeExpansion,
};
use csi_structs::registration::{
    OrchestratorFields, RegisteredVolume, VolumeOrigin, VolumeSpec, VolumeUpdate, VolumeUsage,
};
use csi_structs::*;
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;

/// The case count for every property: modest, so CI stays fast.
pub fn config() -> ProptestConfig {
    ProptestConfig {
        // Shrunk failures are printed; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::with_cases(256)
    }
}

/// Omitted, the stored value again, or something random: so merges succeed often enough to
/// test the success path, and fail often enough to test the refusals.
fn pick<T: Clone + std::fmt::Debug + 'static>(
    same: T,
    random: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<Option<T>> {
    prop_oneof![
        3 => Just(None),
        2 => Just(Some(same)),
        1 => random.prop_map(Some),
    ]
    .boxed()
}

pub fn access_mode() -> impl Strategy<Value = AccessMode> {
    proptest::sample::select(AccessMode::ALL.to_vec())
}

/// Mount flags, some of which look like credentials.
pub fn flags() -> impl Strategy<Value = Vec<String>> {
    vec("[a-z]{1,6}(=[a-zA-Z0-9]{1,6})?", 0..5)
}

pub fn mount_options() -> impl Strategy<Value = MountOptions> {
    (
        option::of("[a-z0-9]{1,8}"),
        flags(),
        option::of("[0-9]{1,5}"),
    )
        .prop_map(|(fs, flags, group)| {
            let mut m = MountOptions::new().with_flags(flags);
            if let Some(fs) = fs {
                m = m.with_fs_type(fs);
            }
            if let Some(g) = group {
                m = m.with_volume_mount_group(g);
            }
            m
        })
}

pub fn access_type() -> impl Strategy<Value = AccessType> {
    prop_oneof![
        Just(AccessType::Block),
        mount_options().prop_map(AccessType::Mount),
    ]
}

pub fn capability() -> impl Strategy<Value = VolumeCapability> {
    (access_mode(), access_type()).prop_map(|(m, t)| VolumeCapability::new(m, t))
}

pub fn capabilities() -> impl Strategy<Value = Vec<VolumeCapability>> {
    vec(capability(), 1..4)
}

pub fn small_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map("[a-zA-Z0-9._-]{1,8}", "[ -~]{0,12}", 0..4)
}

pub fn parameters() -> impl Strategy<Value = Parameters> {
    small_map().prop_map(|m| Parameters::try_new(m).expect("small maps are under 4 KiB"))
}

pub fn mutable_parameters() -> impl Strategy<Value = MutableParameters> {
    small_map().prop_map(|m| MutableParameters::try_new(m).expect("small maps are under 4 KiB"))
}

pub fn volume_context() -> impl Strategy<Value = VolumeContext> {
    small_map().prop_map(|m| VolumeContext::try_new(m).expect("small maps are under 4 KiB"))
}

pub fn manifest() -> impl Strategy<Value = Manifest> {
    small_map().prop_map(|m| Manifest::try_new(m).expect("small maps are under 4 KiB"))
}

pub fn secrets() -> impl Strategy<Value = Secrets> {
    btree_map("[a-zA-Z0-9._-]{1,8}", "[ -~]{0,12}", 0..4)
        .prop_map(|m| Secrets::try_new(m).expect("generated keys use the allowed characters"))
}

const NAME: &str = "[a-zA-Z0-9]([a-zA-Z0-9._-]{0,8}[a-zA-Z0-9])?";

pub fn topology() -> impl Strategy<Value = Topology> {
    let key = (
        option::of("[a-z0-9]{1,6}(\\.[a-z0-9]{1,6}){0,2}"),
        "[a-z0-9]([a-z0-9._-]{0,6}[a-z0-9])?",
    )
        .prop_map(|(p, n)| match p {
            Some(p) => format!("{p}/{n}"),
            None => n,
        });
    // Lower-case keys only, so no two differ only in case.
    btree_map(key, NAME, 1..4)
        .prop_map(|m| Topology::new(m).expect("generated segments follow the syntax"))
}

pub fn topology_requirement() -> impl Strategy<Value = TopologyRequirement> {
    vec(topology(), 0..3).prop_flat_map(|requisite| {
        let preferred: BoxedStrategy<Vec<Topology>> = if requisite.is_empty() {
            vec(topology(), 1..3).boxed()
        } else {
            proptest::sample::subsequence(requisite.clone(), 0..=requisite.len()).boxed()
        };
        (Just(requisite), preferred).prop_map(|(r, p)| {
            TopologyRequirement::new(r, p).expect("preferred is a subset or requisite is empty")
        })
    })
}

pub fn capacity_range() -> impl Strategy<Value = CapacityRange> {
    let size = 1u64..(i64::MAX as u64);
    prop_oneof![
        size.clone()
            .prop_map(|r| CapacityRange::at_least(r).expect("non-zero")),
        size.clone()
            .prop_map(|l| CapacityRange::at_most(l).expect("non-zero")),
        (size.clone(), size)
            .prop_map(|(a, b)| CapacityRange::between(a.min(b), a.max(b)).expect("ordered")),
    ]
}

pub fn id<T: TryFrom<String> + std::fmt::Debug>() -> impl Strategy<Value = T>
where
    T::Error: std::fmt::Debug,
{
    "[a-zA-Z0-9-]{1,20}".prop_map(|s| T::try_from(s).expect("short non-empty ids are valid"))
}

pub fn content_source() -> impl Strategy<Value = ContentSource> {
    prop_oneof![
        id::<SnapshotId>().prop_map(ContentSource::Snapshot),
        id::<ExternalVolumeId>().prop_map(ContentSource::Volume),
    ]
}

pub fn volume() -> impl Strategy<Value = Volume> {
    (
        id::<ExternalVolumeId>(),
        option::of(1u64..(i64::MAX as u64)),
        volume_context(),
        option::of(content_source()),
        vec(topology(), 0..3),
    )
        .prop_map(
            |(volume_id, capacity_bytes, volume_context, content_source, accessible_topology)| {
                Volume {
                    volume_id,
                    capacity_bytes,
                    volume_context,
                    content_source,
                    accessible_topology,
                }
            },
        )
}

pub fn time() -> impl Strategy<Value = SystemTime> {
    (0u64..4_000_000_000, 0u32..1_000_000_000)
        .prop_map(|(s, n)| UNIX_EPOCH + Duration::from_secs(s) + Duration::from_nanos(u64::from(n)))
}

pub fn snapshot() -> impl Strategy<Value = Snapshot> {
    (
        id::<SnapshotId>(),
        id::<ExternalVolumeId>(),
        option::of(1u64..(i64::MAX as u64)),
        time(),
        any::<bool>(),
        option::of(id::<GroupSnapshotId>()),
        vec(topology(), 0..2),
    )
        .prop_map(
            |(
                snapshot_id,
                source_volume_id,
                size_bytes,
                creation_time,
                ready_to_use,
                group_snapshot_id,
                accessible_topology,
            )| Snapshot {
                snapshot_id,
                source_volume_id,
                size_bytes,
                creation_time,
                ready_to_use,
                group_snapshot_id,
                accessible_topology,
            },
        )
}

pub fn node_info() -> impl Strategy<Value = NodeInfo> {
    (
        "[a-zA-Z0-9-]{1,250}".prop_map(|s| PluginNodeId::new(s).expect("at most 256 bytes")),
        option::of(1u64..(i64::MAX as u64)),
        option::of(topology()),
    )
        .prop_map(|(node_id, max, topology)| NodeInfo {
            node_id,
            max_volumes: max.and_then(NonZeroU64::new),
            topology,
        })
}

pub fn plugin_info() -> impl Strategy<Value = PluginInfo> {
    (
        "[a-zA-Z0-9]([a-zA-Z0-9.-]{0,40}[a-zA-Z0-9])?"
            .prop_map(|s| PluginName::new(s).expect("follows §2.1")),
        "[ -~]{1,30}",
        manifest(),
    )
        .prop_map(|(name, vendor_version, manifest)| PluginInfo {
            name,
            vendor_version,
            manifest,
        })
}

pub fn controller_caps() -> impl Strategy<Value = ControllerCapabilities> {
    (
        proptest::sample::subsequence(
            ControllerCapability::ALL.to_vec(),
            0..=ControllerCapability::ALL.len(),
        ),
        vec(18i32..200, 0..2),
    )
        .prop_map(|(known, unknown)| {
            let mut c: ControllerCapabilities = known.into_iter().collect();
            for n in unknown {
                c.insert_wire(n);
            }
            c
        })
}

pub fn node_caps() -> impl Strategy<Value = NodeCapabilities> {
    (
        proptest::sample::subsequence(NodeCapability::ALL.to_vec(), 0..=NodeCapability::ALL.len()),
        vec(9i32..200, 0..2),
    )
        .prop_map(|(known, unknown)| {
            let mut c: NodeCapabilities = known.into_iter().collect();
            for n in unknown {
                c.insert_wire(n);
            }
            c
        })
}

pub fn group_caps() -> impl Strategy<Value = GroupControllerCapabilities> {
    any::<bool>().prop_map(|on| {
        let mut c = GroupControllerCapabilities::new();
        if on {
            c.insert(GroupControllerCapability::CreateDeleteGetVolumeGroupSnapshot);
        }
        c
    })
}

pub fn plugin_caps() -> impl Strategy<Value = PluginCapabilities> {
    (
        proptest::sample::subsequence(PluginService::ALL.to_vec(), 0..=PluginService::ALL.len()),
        proptest::sample::subsequence(
            VolumeExpansion::ALL.to_vec(),
            0..=VolumeExpansion::ALL.len(),
        ),
        vec(6i32..100, 0..2),
    )
        .prop_map(|(services, exp, unknown)| {
            let mut c = PluginCapabilities::from_services(services).with_expansion(exp);
            for n in unknown {
                c.insert_service_wire(n);
            }
            c
        })
}

pub fn spec() -> impl Strategy<Value = VolumeSpec> {
    (
        (
            id::<VolumeId>(),
            option::of("[a-z ]{1,20}"),
            id::<PluginId>(),
            option::of(id::<ExternalVolumeId>()),
        ),
        (
            capabilities(),
            option::of(topology_requirement()),
            mount_options(),
            secrets(),
        ),
        (
            parameters(),
            mutable_parameters(),
            volume_context(),
            option::of(capacity_range()),
            option::of(content_source()),
        ),
    )
        .prop_map(
            |(
                (id, name, plugin_id, external_id),
                (caps, topo, mount, secrets),
                (params, mutable, ctx, capacity, source),
            )| {
                let mut s = VolumeSpec::new(id, plugin_id, caps);
                s.name = name;
                s.external_id = external_id;
                s.requested_topology = topo;
                s.mount_options = mount;
                s.secrets = secrets;
                s.parameters = params;
                s.mutable_parameters = mutable;
                s.volume_context = ctx;
                s.capacity = capacity;
                s.content_source = source;
                s
            },
        )
}

pub fn owned() -> impl Strategy<Value = OrchestratorFields> {
    (
        prop_oneof![Just(VolumeOrigin::Registered), Just(VolumeOrigin::Created)],
        option::of(1u64..1_000_000),
        vec(topology(), 0..2),
        option::of(plugin_info()),
    )
        .prop_map(|(origin, capacity_bytes, accessible_topology, provider)| {
            OrchestratorFields {
                origin,
                capacity_bytes,
                accessible_topology,
                provider,
            }
        })
}

pub fn registered() -> impl Strategy<Value = RegisteredVolume> {
    (spec(), owned()).prop_map(|(s, o)| RegisteredVolume::from_parts(s, o))
}

/// An update of `stored` where each field is omitted, repeated or set to something random.
pub fn update_for(stored: &RegisteredVolume) -> impl Strategy<Value = VolumeUpdate> + use<> {
    let sp = stored.spec().clone();
    let volume = sp.id.clone();
    (
        (
            pick(sp.name.clone().unwrap_or_default(), "[a-z ]{1,20}"),
            pick(sp.plugin_id.clone(), id::<PluginId>()),
            pick(
                sp.external_id
                    .clone()
                    .unwrap_or_else(|| ExternalVolumeId::new("fresh").expect("valid")),
                id::<ExternalVolumeId>(),
            ),
            pick(sp.requested_capabilities.clone(), vec(capability(), 0..3)),
        ),
        (
            proptest::option::of(topology_requirement()),
            pick(sp.mount_options.clone(), mount_options()),
            pick(sp.secrets.clone(), secrets()),
            pick(sp.parameters.clone(), parameters()),
        ),
        (
            pick(sp.mutable_parameters.clone(), mutable_parameters()),
            pick(sp.volume_context.clone(), volume_context()),
            proptest::option::of(capacity_range()),
            proptest::option::of(content_source()),
        ),
    )
        .prop_map(
            move |(
                (name, plugin_id, external_id, caps),
                (topo, mount, secrets, params),
                (mutable, ctx, capacity, source),
            )| {
                let mut u = VolumeUpdate::new(volume.clone());
                u.name = name.filter(|n| !n.is_empty());
                u.plugin_id = plugin_id;
                u.external_id = external_id;
                u.requested_capabilities = caps;
                u.requested_topology = topo;
                u.mount_options = mount;
                u.secrets = secrets;
                u.parameters = params;
                u.mutable_parameters = mutable;
                u.volume_context = ctx;
                u.capacity = capacity;
                u.content_source = source;
                u
            },
        )
}

pub fn usage() -> impl Strategy<Value = VolumeUsage> {
    prop_oneof![
        Just(VolumeUsage::NotInUse),
        (
            access_mode(),
            prop_oneof![Just(AccessTypeKind::Block), Just(AccessTypeKind::Mount)]
        )
            .prop_map(|(access_mode, access_type)| VolumeUsage::InUse {
                access_mode,
                access_type
            }),
    ]
}
