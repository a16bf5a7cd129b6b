//! Node errors name their paths: an operator sees where NodeStageVolume found another
//! staging, not only which volume.

use csi_client::{Rpc, proto};

use crate::support::{Mock, guard};

#[tokio::test]
async fn node_errors_name_their_paths() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    let node = client.node();
    let staging = "/var/lib/csi/staging/vol-1";
    let target = "/var/lib/pods/p1/volumes/vol-1";
    let capability = || {
        Some(
            (&csi_structs::VolumeCapability::mount(
                csi_structs::AccessMode::SingleNodeWriter,
                csi_structs::MountOptions::new(),
            ))
                .into(),
        )
    };

    mock.faults().on(Rpc::NodeStageVolume).fail(
        csi_client::Code::AlreadyExists,
        "staged at this path with another capability",
    );
    let err = guard(node.node_stage_volume(proto::NodeStageVolumeRequest {
        volume_id: "vol-1".into(),
        staging_target_path: staging.into(),
        volume_capability: capability(),
        ..Default::default()
    }))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Some(csi_client::Code::AlreadyExists), "{err}");
    assert_eq!(err.staging_target_path(), Some(staging));
    assert_eq!(err.target_path(), None);
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "NodeStageVolume volume vol-1 staging_target_path {staging:?}: "
        )),
        "{text}"
    );

    mock.faults()
        .on(Rpc::NodePublishVolume)
        .fail(csi_client::Code::FailedPrecondition, "not staged");
    let err = guard(node.node_publish_volume(proto::NodePublishVolumeRequest {
        volume_id: "vol-1".into(),
        staging_target_path: staging.into(),
        target_path: target.into(),
        volume_capability: capability(),
        ..Default::default()
    }))
    .await
    .unwrap_err();
    assert_eq!(err.staging_target_path(), Some(staging));
    assert_eq!(err.target_path(), Some(target));
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "staging_target_path {staging:?} target_path {target:?}"
        )),
        "{text}"
    );

    // Refused before sending: the path is named too.
    let err = guard(
        node.node_unpublish_volume(proto::NodeUnpublishVolumeRequest {
            volume_id: String::new(),
            target_path: target.into(),
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(err.attempts(), 0, "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("NodeUnpublishVolume target_path {target:?}: ")),
        "{err}"
    );
    assert_eq!(mock.count(Rpc::NodeUnpublishVolume), 0);
}
