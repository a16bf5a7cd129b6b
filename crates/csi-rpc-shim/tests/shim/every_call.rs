//! Every call of the protocol crosses the wire and comes back decoded.

use csi_rpc_shim::{
    AgentRpc, ControllerExpand, ControllerQuery, ControllerValidate, CreateSnapshot, CreateVolume,
    DeleteSnapshot, DeleteVolume, ListSnapshots, Validated,
};
use csi_structs::{
    ContentSource, ExternalVolumeId, SnapshotId, Topology, TopologyRequirement, VolumeId,
};

use crate::support::*;

#[tokio::test]
async fn every_controller_call_round_trips() {
    let cluster = Cluster::start(vec![AgentSpec::cluster("ops"), AgentSpec::node("b")]).await;
    cluster.controllers_on(&["b"]);
    let shim = &cluster.agent("ops").shim;
    let q = || ControllerQuery::new(plugin());
    let vol = || VolumeId::new("vol-1").unwrap();
    let ext = || ExternalVolumeId::new("ext-vol-1").unwrap();

    // Topology crosses both ways: the requirement to the plugin, where it is reachable back.
    let zone = |z: &str| Topology::try_from_iter([("topology.example.com/zone", z)]).unwrap();
    let created = guarded(shim.create_volume(
        CreateVolume {
            query: q(),
            volume: vol(),
            required_bytes: 1 << 30,
            limit_bytes: 0,
            capabilities: vec![capability()],
            parameters: Default::default(),
            secrets: secrets(),
            accessibility_requirements: Some(
                TopologyRequirement::new(vec![zone("a"), zone("b")], vec![zone("b")]).unwrap(),
            ),
            content_source: Some(ContentSource::Snapshot(SnapshotId::new("snap-9").unwrap())),
        },
        CALL,
    ))
    .await
    .unwrap();
    assert_eq!(created.accessible_topology, [zone("b")]);
    assert_eq!(
        created.volume_context.get("from-snapshot"),
        Some("snap-9"),
        "the content source crossed the wire"
    );

    let validated = guarded(shim.controller_validate(
        ControllerValidate {
            query: q(),
            volume: vol(),
            external_volume: ext(),
            capabilities: vec![capability()],
            volume_context: Default::default(),
            parameters: Default::default(),
            secrets: secrets(),
        },
        CALL,
    ))
    .await
    .unwrap();
    assert_eq!(validated, Validated::Confirmed);

    let expanded = guarded(shim.controller_expand(
        ControllerExpand {
            query: q(),
            volume: vol(),
            external_volume: ext(),
            required_bytes: 5 << 30,
            limit_bytes: 0,
            capability: Some(capability()),
            secrets: secrets(),
        },
        CALL,
    ))
    .await
    .unwrap();
    assert_eq!(expanded.capacity_bytes, 5 << 30);
    assert!(expanded.node_expansion_required);

    let snap = guarded(shim.create_snapshot(
        CreateSnapshot {
            query: q(),
            volume: vol(),
            source: ext(),
            name: "nightly".into(),
            parameters: Default::default(),
            secrets: secrets(),
        },
        CALL,
    ))
    .await
    .unwrap();
    assert_eq!(snap.snapshot.as_str(), "snap-nightly");
    assert_eq!(snap.source, ext());

    let page = guarded(shim.list_snapshots(
        ListSnapshots {
            query: q(),
            source: Some(ext()),
            snapshot: None,
            max_entries: 10,
            starting_token: String::new(),
            secrets: secrets(),
        },
        CALL,
    ))
    .await
    .unwrap();
    assert!(page.entries.is_empty());

    guarded(shim.delete_snapshot(
        DeleteSnapshot {
            query: q(),
            snapshot: SnapshotId::new("snap-nightly").unwrap(),
            secrets: secrets(),
        },
        CALL,
    ))
    .await
    .unwrap();

    guarded(shim.delete_volume(
        DeleteVolume {
            query: q(),
            volume: vol(),
            external_volume: ext(),
            secrets: secrets(),
        },
        CALL,
    ))
    .await
    .unwrap();

    let b = &cluster.agent("b").plugins;
    for rpc in [
        AgentRpc::ControllerCreateVolume,
        AgentRpc::ControllerValidate,
        AgentRpc::ControllerExpandVolume,
        AgentRpc::ControllerCreateSnapshot,
        AgentRpc::ControllerListSnapshots,
        AgentRpc::ControllerDeleteSnapshot,
        AgentRpc::ControllerDeleteVolume,
    ] {
        assert_eq!(b.calls(rpc), 1, "{rpc}");
    }
    // Secrets arrived intact on every call that carries them.
    for seen in b.seen() {
        assert_eq!(seen.secrets.as_ref(), Some(&secrets()), "{}", seen.rpc);
    }
    assert_eq!(cluster.agent("b").shim.stats().received, 7);
}
