//! csi-node's side of csi-rpc-shim (`NodeBackend`): what it says of the local plugins, and
//! the calls it serves, on the mock plugin.
#![cfg(feature = "shim")]

mod support;

use std::time::Duration;

use csi_node::shim::NodeBackend;
use csi_rpc_shim::{
    CallContext, ControllerQuery, CreateVolume, DeleteVolume, LocalPlugins, LocalStatus,
    PluginFailure, ServiceKind,
};
use csi_structs::{
    AccessMode, ErrorClass, MountOptions, NodeId, Parameters, PluginId, Secrets, VolumeCapability,
    VolumeId,
};
use support::mock_plugin;

fn context() -> CallContext {
    CallContext {
        deadline: tokio::time::Instant::now() + Duration::from_secs(30),
        origin: NodeId::new("n1").expect("id"),
        hops: 0,
    }
}

#[tokio::test]
async fn a_healthy_local_plugin_serves_controller_calls_and_an_unknown_one_is_missing() {
    let plugin = mock_plugin().await;
    let backend = NodeBackend::new(plugin.plugins.clone(), plugin.volumes("csi"));
    assert_eq!(
        backend.status(&plugin.id, ServiceKind::Controller),
        LocalStatus::Healthy
    );
    assert_eq!(
        backend.status(&plugin.id, ServiceKind::Node),
        LocalStatus::Healthy
    );
    let other = PluginId::new("other").expect("id");
    assert_eq!(
        backend.status(&other, ServiceKind::Controller),
        LocalStatus::Missing
    );

    let capability = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
    let create = |plugin: &PluginId| CreateVolume {
        query: ControllerQuery::new(plugin.clone()),
        volume: VolumeId::new("data").expect("id"),
        required_bytes: 1 << 30,
        limit_bytes: 0,
        capabilities: vec![capability.clone()],
        parameters: Parameters::default(),
        secrets: Secrets::default(),
        accessibility_requirements: None,
    };
    let created = backend
        .create_volume(&context(), create(&plugin.id))
        .await
        .expect("created through the backend");
    assert_eq!(created.capacity_bytes, 1 << 30);
    assert_eq!(plugin.mock.volumes().len(), 1);

    // A plugin not here is refused before any call, as one to try elsewhere.
    let err = backend
        .create_volume(&context(), create(&other))
        .await
        .expect_err("no such plugin here");
    assert_eq!(err.class, ErrorClass::RetryElsewhere);
    assert_eq!(err.failure, PluginFailure::Unreachable);

    backend
        .delete_volume(
            &context(),
            DeleteVolume {
                query: ControllerQuery::new(plugin.id.clone()),
                volume: VolumeId::new("data").expect("id"),
                external_volume: created.external_volume,
                secrets: Secrets::default(),
            },
        )
        .await
        .expect("deleted");
    assert!(plugin.mock.volumes().is_empty());
}
