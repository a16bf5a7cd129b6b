//! The typed expand, get-volume and snapshot calls against the mock plugin: sizes as `u64`,
//! the node step the controller asks for, the published node in the volume's status, and a
//! snapshot created, listed by its source, deleted (twice) and a NOT_FOUND delete.

use csi_client::{Code, ErrorClass, ErrorKind, NodeExpand, Rpc};
use csi_client::{SnapshotFilter, SnapshotPage};
use csi_structs::{
    AccessMode, CapacityRange, ExternalVolumeId, MountOptions, Parameters, PublishContext, Secrets,
    VolumeCapability, VolumeContext,
};

use crate::support::{Mock, guard};

const GIB: u64 = 1 << 30;

fn vol(id: &str) -> ExternalVolumeId {
    ExternalVolumeId::new(id).unwrap()
}

fn mount() -> VolumeCapability {
    VolumeCapability::mount(
        AccessMode::SingleNodeWriter,
        MountOptions::new().with_fs_type("ext4"),
    )
}

#[tokio::test]
async fn expand_grows_the_volume_and_says_whether_the_node_must_follow() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    let controller = client.controller();
    let secrets = Secrets::default();
    let mount = mount();

    let grown = guard(controller.expand(
        &vol("vol-1"),
        &CapacityRange::at_least(2 * GIB).unwrap(),
        Some(&mount),
        &secrets,
    ))
    .await
    .unwrap();
    assert_eq!(grown.capacity_bytes, 2 * GIB);
    assert!(
        grown.node_expansion_required,
        "a mounted volume's file system grows on the node"
    );

    // A block volume has no file system to grow on the node.
    let block = VolumeCapability::block(AccessMode::SingleNodeWriter);
    let grown = guard(controller.expand(
        &vol("vol-1"),
        &CapacityRange::at_least(3 * GIB).unwrap(),
        Some(&block),
        &secrets,
    ))
    .await
    .unwrap();
    assert_eq!(grown.capacity_bytes, 3 * GIB);
    assert!(!grown.node_expansion_required);

    // Asking for less than the volume has answers its size: expansion never shrinks.
    let again = guard(controller.expand(
        &vol("vol-1"),
        &CapacityRange::at_least(GIB).unwrap(),
        None,
        &secrets,
    ))
    .await
    .unwrap();
    assert_eq!(again.capacity_bytes, 3 * GIB);

    let got = guard(controller.get_volume(&vol("vol-1"))).await.unwrap();
    assert_eq!(got.volume.capacity_bytes, Some(3 * GIB));

    // A missing volume is the plugin's NOT_FOUND, and names the volume.
    let err = guard(controller.expand(
        &vol("vol-ghost"),
        &CapacityRange::at_least(GIB).unwrap(),
        None,
        &secrets,
    ))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Some(Code::NotFound), "{err}");
    assert!(err.to_string().contains("vol-ghost"), "{err}");
}

#[tokio::test]
async fn expand_on_the_node_and_get_volume_report_the_published_volume() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    let (controller, node) = (client.controller(), client.node());
    let volume = vol("vol-1");
    let cap = mount();
    let secrets = Secrets::default();
    let context = VolumeContext::default();
    let node_id = guard(node.node_get_info()).await.unwrap().node_id;

    let before = guard(controller.get_volume(&volume)).await.unwrap();
    assert!(before.status.published_nodes.is_empty());

    let range = CapacityRange::at_least(2 * GIB).unwrap();
    let grown = guard(controller.expand(&volume, &range, Some(&cap), &secrets))
        .await
        .unwrap();
    assert!(grown.node_expansion_required);

    let publish_context: PublishContext =
        guard(controller.publish(&volume, &node_id, &cap, false, &context, &secrets))
            .await
            .unwrap();
    let got = guard(controller.get_volume(&volume)).await.unwrap();
    assert_eq!(got.volume.volume_id, volume);
    assert_eq!(got.status.published_nodes, std::slice::from_ref(&node_id));
    assert_eq!(got.status.condition, None, "the mock reports no condition");

    let (staging, target) = mock
        .stage_and_publish(&node, &volume, &cap, &publish_context)
        .await;

    let on_node = guard(node.expand(&NodeExpand {
        volume: &volume,
        volume_path: &target,
        staging_target_path: Some(&staging),
        capacity_range: Some(&range),
        capability: Some(&cap),
        secrets: &secrets,
    }))
    .await
    .unwrap();
    assert_eq!(on_node.capacity_bytes, Some(2 * GIB));

    // Where the volume is not published, the node says NOT_FOUND, and the error names the path.
    let elsewhere = mock.dir.path().join("elsewhere");
    let err = guard(node.expand(&NodeExpand {
        volume: &volume,
        volume_path: &elsewhere,
        staging_target_path: None,
        capacity_range: None,
        capability: None,
        secrets: &secrets,
    }))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Some(Code::NotFound), "{err}");
    assert!(err.to_string().contains("elsewhere"), "{err}");
}

#[tokio::test]
async fn a_snapshot_is_created_listed_by_its_source_and_deleted() {
    let mock = Mock::start(
        csi_testkit::MockPlugin::builder()
            .volume("vol-1", 1 << 30)
            .volume("vol-2", 1 << 20)
            .build()
            .unwrap(),
    )
    .await;
    let client = mock.client(|_| {});
    let controller = client.controller();
    let (secrets, params) = (Secrets::default(), Parameters::default());

    let snap = guard(controller.create_snapshot(&vol("vol-1"), "snap-a", &params, &secrets))
        .await
        .unwrap();
    assert_eq!(snap.source_volume_id, vol("vol-1"));
    assert_eq!(snap.size_bytes, Some(GIB));
    // The name is the idempotency key: the same snapshot again.
    let again = guard(controller.create_snapshot(&vol("vol-1"), "snap-a", &params, &secrets))
        .await
        .unwrap();
    assert_eq!(again.snapshot_id, snap.snapshot_id);
    let other = guard(controller.create_snapshot(&vol("vol-2"), "snap-b", &params, &secrets))
        .await
        .unwrap();
    // The same name for another volume's snapshot is refused.
    let taken = guard(controller.create_snapshot(&vol("vol-2"), "snap-a", &params, &secrets))
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Some(Code::AlreadyExists), "{taken}");

    let ids = |snapshots: &[csi_structs::Snapshot]| -> Vec<String> {
        snapshots
            .iter()
            .map(|s| s.snapshot_id.as_str().to_owned())
            .collect()
    };
    let of_1 = guard(
        controller.list_all_snapshots_matching(&SnapshotFilter::of_volume(vol("vol-1")), &secrets),
    )
    .await
    .unwrap();
    assert_eq!(ids(&of_1), [snap.snapshot_id.as_str()]);
    assert_eq!(of_1[0], snap);
    let by_id = guard(controller.list_all_snapshots_matching(
        &SnapshotFilter::with_id(other.snapshot_id.clone()),
        &secrets,
    ))
    .await
    .unwrap();
    assert_eq!(ids(&by_id), [other.snapshot_id.as_str()]);
    let mut all = ids(&guard(
        controller.list_all_snapshots_matching(&SnapshotFilter::all(), &secrets),
    )
    .await
    .unwrap());
    all.sort();
    let mut both = vec![
        snap.snapshot_id.as_str().to_owned(),
        other.snapshot_id.as_str().to_owned(),
    ];
    both.sort();
    assert_eq!(all, both);

    // One page at a time: a token after the first, none after the last.
    let first: SnapshotPage =
        guard(controller.list_snapshots_page(&SnapshotFilter::all(), &secrets, 1, None))
            .await
            .unwrap();
    assert_eq!(first.snapshots.len(), 1);
    let token = first.next_token.expect("a second page");
    let second =
        guard(controller.list_snapshots_page(&SnapshotFilter::all(), &secrets, 1, Some(&token)))
            .await
            .unwrap();
    assert_eq!(second.snapshots.len(), 1);
    assert_eq!(second.next_token, None);
    let mut paged = ids(&[first.snapshots, second.snapshots].concat());
    paged.sort();
    assert_eq!(paged, both);

    guard(controller.delete_snapshot(&snap.snapshot_id, &secrets))
        .await
        .unwrap();
    // Deleting a snapshot that is gone answers OK (spec): delete is idempotent.
    guard(controller.delete_snapshot(&snap.snapshot_id, &secrets))
        .await
        .unwrap();
    let of_1 = guard(
        controller.list_all_snapshots_matching(&SnapshotFilter::of_volume(vol("vol-1")), &secrets),
    )
    .await
    .unwrap();
    assert!(of_1.is_empty(), "{of_1:?}");
    assert_eq!(mock.plugin.snapshot_ids(), [other.snapshot_id.as_str()]);
}

#[tokio::test]
async fn a_plugin_answering_not_found_to_delete_snapshot_means_already_deleted() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::DeleteSnapshot)
        .fail(Code::NotFound, "no such snapshot")
        .install();
    let client = mock.client(|_| {});
    let snapshot = csi_structs::SnapshotId::new("snap-gone").unwrap();
    let err = guard(
        client
            .controller()
            .delete_snapshot(&snapshot, &Secrets::default()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.class(), ErrorClass::AlreadyDone, "{err}");
    assert_eq!(err.attempts(), 1, "already done is not retried");
    assert_eq!(mock.count(Rpc::DeleteSnapshot), 1);
    assert!(err.to_string().contains("snap-gone"), "{err}");
}

#[tokio::test]
async fn secrets_of_the_typed_calls_never_reach_an_error_or_a_debug() {
    let mock = Mock::default().await;
    for rpc in [Rpc::ControllerExpandVolume, Rpc::CreateSnapshot] {
        mock.faults()
            .on(rpc)
            .fail(Code::PermissionDenied, "denied")
            .install();
    }
    let client = mock.client(|_| {});
    let secrets = Secrets::try_from_iter([("token", "s3cr3t-value")]).unwrap();
    let expand = guard(client.controller().expand(
        &vol("vol-1"),
        &CapacityRange::at_least(2 * GIB).unwrap(),
        None,
        &secrets,
    ))
    .await
    .unwrap_err();
    let create = guard(client.controller().create_snapshot(
        &vol("vol-1"),
        "snap-1",
        &Parameters::default(),
        &secrets,
    ))
    .await
    .unwrap_err();
    let path = mock.dir.path().join("target");
    let node = NodeExpand {
        volume: &vol("vol-1"),
        volume_path: &path,
        staging_target_path: None,
        capacity_range: None,
        capability: None,
        secrets: &secrets,
    };
    let shown = format!("{expand} {expand:?} {create} {create:?} {node:?}");
    assert!(
        shown.contains("PermissionDenied") || shown.contains("permission"),
        "{shown}"
    );
    assert!(!shown.contains("s3cr3t-value"), "{shown}");
}

#[tokio::test]
async fn a_node_expand_path_that_is_not_utf8_is_refused_before_sending() {
    use std::os::unix::ffi::OsStrExt;
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    let bad = std::path::Path::new(std::ffi::OsStr::from_bytes(b"/target/\xff"));
    let err = guard(client.node().expand(&NodeExpand {
        volume: &vol("vol-1"),
        volume_path: bad,
        staging_target_path: None,
        capacity_range: None,
        capability: None,
        secrets: &Secrets::default(),
    }))
    .await
    .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidRequest(_)), "{err}");
    assert!(err.to_string().contains("volume_path"), "{err}");
    assert_eq!(err.attempts(), 0);
    assert_eq!(mock.count(Rpc::NodeExpandVolume), 0, "nothing was sent");
}
