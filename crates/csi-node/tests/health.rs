//! Volume health on the node: the monitor polls `NodeGetVolumeStats` and
//! `ControllerGetVolume` of the mock for the volumes published here, keeps their usage and
//! conditions, and tells when one turns abnormal and when it recovers.

mod support;

use csi_client::Endpoint;
use csi_node::Node;
use csi_node::health::{ConditionSource, HealthMonitor, VolumeHealthEvent};
use csi_node::volumes::MountRequest;
use csi_structs::{
    AccessMode, ExternalVolumeId, MountOptions, NodeId, PluginId, Secrets, VolumeCapability,
    VolumeContext, VolumeId, WorkloadId,
};
use csi_testkit::capabilities::CONTROLLER_IMPLEMENTED;
use csi_testkit::{ControllerCapability, MockPlugin, MockServer};
use support::{GUARD, create_and_attach};

/// A node with `mock` registered, and volume `data` created, attached and published for `w1`.
struct Published {
    _dir: tempfile::TempDir,
    _server: MockServer,
    node: Node,
    volume: VolumeId,
    external: ExternalVolumeId,
}

async fn published(mock: &MockPlugin) -> Published {
    let dir = tempfile::tempdir().expect("dir");
    let socket = dir.path().join("mock.sock");
    let server = mock.serve_unix(&socket).await.expect("serves");
    let node = Node::open(dir.path().join("node"), NodeId::new("n1").expect("id"))
        .await
        .expect("opens");
    let plugin = PluginId::new("mock").expect("id");
    node.register_plugin(plugin.clone(), Endpoint::unix(&socket).expect("endpoint"))
        .await
        .expect("registered");
    node.wait_for(&plugin, GUARD)
        .await
        .expect("healthy (hang guard)");
    let capability = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
    let (volume, external, context) =
        create_and_attach(node.plugins(), &plugin, "data", &capability).await;
    node.volumes()
        .mount(&MountRequest {
            plugin,
            volume: volume.clone(),
            external_id: external.clone(),
            capability,
            read_only: false,
            workload: WorkloadId::new("w1").expect("id"),
            publish_context: context,
            volume_context: VolumeContext::new(),
            secrets: Secrets::new().into(),
        })
        .await
        .expect("published");
    Published {
        _dir: dir,
        _server: server,
        node,
        volume,
        external,
    }
}

#[tokio::test]
async fn a_volume_turning_abnormal_is_told_once_and_its_recovery_too() {
    let mock = MockPlugin::builder()
        .volume_condition()
        .build()
        .expect("mock");
    let Published {
        node,
        volume,
        external,
        _dir,
        _server,
    } = published(&mock).await;
    let monitor = HealthMonitor::new(node.plugins().clone(), node.volumes().clone());
    let mut events = monitor.subscribe();
    assert!(monitor.poll().await.is_empty(), "normal: nothing to tell");
    let health = monitor.health();
    let seen = health.get(&volume).expect("the published volume is polled");
    assert!(
        seen.controller.as_ref().is_some_and(|c| !c.abnormal),
        "{seen:?}"
    );
    assert!(seen.node.as_ref().is_some_and(|c| !c.abnormal), "{seen:?}");
    assert!(seen.bytes.is_some_and(|b| b.total > 0), "{seen:?}");
    assert!(seen.inodes.is_some(), "{seen:?}");

    mock.set_volume_condition(external.as_str(), true, "disk detached");
    let told = monitor.poll().await;
    let mut sources: Vec<ConditionSource> = told
        .iter()
        .map(|e| match e {
            VolumeHealthEvent::Abnormal {
                volume: v,
                message,
                source,
                ..
            } => {
                assert_eq!((v, message.as_str()), (&volume, "disk detached"));
                *source
            }
            other => panic!("{other:?}"),
        })
        .collect();
    sources.sort();
    assert_eq!(
        sources,
        [ConditionSource::Controller, ConditionSource::Node]
    );
    assert_eq!(monitor.health()[&volume].abnormal().len(), 2);
    assert!(matches!(
        events.try_recv(),
        Ok(VolumeHealthEvent::Abnormal { .. })
    ));
    // Still abnormal, same words: nothing new.
    assert!(monitor.poll().await.is_empty());

    mock.clear_volume_condition(external.as_str());
    let told = monitor.poll().await;
    assert_eq!(told.len(), 2, "{told:?}");
    assert!(
        told.iter()
            .all(|e| matches!(e, VolumeHealthEvent::Recovered { .. })),
        "{told:?}"
    );
    assert!(monitor.health()[&volume].abnormal().is_empty());
    drop(monitor);
    node.close().await.expect("closed");
}

#[tokio::test]
async fn without_volume_condition_only_usage_is_kept() {
    let mock = MockPlugin::builder().build().expect("mock");
    let Published {
        node,
        volume,
        external,
        _dir,
        _server,
    } = published(&mock).await;
    // A condition the plugin would not report, as it does not advertise VOLUME_CONDITION.
    mock.set_volume_condition(external.as_str(), true, "ignored");
    let monitor = HealthMonitor::new(node.plugins().clone(), node.volumes().clone());
    assert!(monitor.poll().await.is_empty());
    let seen = monitor.health()[&volume].clone();
    assert_eq!((seen.controller, seen.node), (None, None));
    assert!(seen.bytes.is_some());
    drop(monitor);
    node.close().await.expect("closed");
}

#[tokio::test]
async fn a_controller_without_get_volume_is_asked_through_list_volumes() {
    let mock = MockPlugin::builder()
        .controller_capabilities(
            CONTROLLER_IMPLEMENTED
                .iter()
                .copied()
                .filter(|c| *c != ControllerCapability::GetVolume)
                .chain([ControllerCapability::VolumeCondition]),
        )
        .build()
        .expect("mock");
    let Published {
        node,
        volume,
        external,
        _dir,
        _server,
    } = published(&mock).await;
    let monitor = HealthMonitor::new(node.plugins().clone(), node.volumes().clone());
    mock.set_volume_condition(external.as_str(), true, "pool degraded");
    let told = monitor.poll().await;
    assert!(
        matches!(&told[..], [VolumeHealthEvent::Abnormal { source: ConditionSource::Controller, message, .. }] if message == "pool degraded"),
        "{told:?}"
    );
    assert_eq!(mock.calls().count(csi_client::Rpc::ControllerGetVolume), 0);
    assert!(mock.calls().count(csi_client::Rpc::ListVolumes) >= 1);
    assert_eq!(
        monitor.health()[&volume].node,
        None,
        "the node does not advertise it"
    );
    drop(monitor);
    node.close().await.expect("closed");
}
