//! Snapshots and the plugin's own volume list through `serve`, each only when the plugin
//! advertises the capability.

use csi_agent::ops::api::{ExternalVolumeView, SnapshotDeleted, SnapshotView, VolumeView};
use csi_client::Rpc;
use csi_testkit::capabilities::CONTROLLER_IMPLEMENTED;
use csi_testkit::{ControllerCapability, MockPlugin};

use crate::serve::{cli, json, one_agent};
use crate::support::file_with_mode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_cut_listed_and_deleted_and_the_plugin_s_volumes_listed() {
    let mock = MockPlugin::builder()
        .volume("pre-1", 1 << 20)
        .build()
        .expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let dir = tempfile::tempdir().expect("temp dir");
    let secrets = file_with_mode(dir.path(), "v1.secrets", "[snapshot]\nsnap-key=s\n", 0o600);
    let v1: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "mock",
            "--secrets-file",
            &secrets,
        ],
    )
    .await;

    // The plugin's own list: both volumes, the one the agent knows named.
    let listed: Vec<ExternalVolumeView> =
        json(&data, &["volume", "list", "--plugin", "mock", "--external"]).await;
    let mut seen: Vec<(String, Option<String>)> = listed
        .iter()
        .map(|v| (v.external_id.clone(), v.known_as.clone()))
        .collect();
    seen.sort();
    let mut expected = vec![
        ("pre-1".to_owned(), None),
        (v1.external_id.clone(), Some("v1".to_owned())),
    ];
    expected.sort();
    assert_eq!(seen, expected);
    let table = cli(&data, &["volume", "list", "--plugin", "mock", "--external"])
        .await
        .expect("table");
    assert!(table.starts_with("EXTERNAL-ID"), "{table}");
    let mine: Vec<VolumeView> = json(&data, &["volume", "list", "--plugin", "mock"]).await;
    assert_eq!(mine.len(), 1);
    let bad = cli(&data, &["volume", "list", "--external"])
        .await
        .expect_err("--external needs --plugin");
    assert!(bad.contains("--plugin"), "{bad}");

    let cut: SnapshotView = json(
        &data,
        &["volume", "snapshot", "create", "v1", "--name", "nightly"],
    )
    .await;
    assert_eq!(cut.source_external_id, v1.external_id);
    assert_eq!(cut.source_volume.as_deref(), Some("v1"));
    assert!(cut.ready_to_use);
    let request = mock
        .calls()
        .last(Rpc::CreateSnapshot)
        .expect("called")
        .request;
    assert!(request.contains("\"snap-key\""), "{request}");
    // The name is the idempotency key: the same name answers the same snapshot.
    let again: SnapshotView = json(
        &data,
        &["volume", "snapshot", "create", "v1", "--name", "nightly"],
    )
    .await;
    assert_eq!(again.snapshot_id, cut.snapshot_id);
    let bad_name = cli(
        &data,
        &[
            "volume",
            "snapshot",
            "create",
            "v1",
            "--name",
            "night\u{7}ly",
        ],
    )
    .await
    .expect_err("a name the spec bans");
    assert!(bad_name.contains("name"), "{bad_name}");

    let of_volume: Vec<SnapshotView> = json(&data, &["volume", "snapshot", "list", "v1"]).await;
    assert_eq!(of_volume, std::slice::from_ref(&cut));
    let of_plugin: Vec<SnapshotView> =
        json(&data, &["volume", "snapshot", "list", "--plugin", "mock"]).await;
    assert_eq!(of_plugin, std::slice::from_ref(&cut));
    let deleted: SnapshotDeleted = json(
        &data,
        &[
            "volume",
            "snapshot",
            "delete",
            &cut.snapshot_id,
            "--volume",
            "v1",
        ],
    )
    .await;
    assert_eq!(deleted.snapshot_id, cut.snapshot_id);
    let request = mock
        .calls()
        .last(Rpc::DeleteSnapshot)
        .expect("called")
        .request;
    assert!(request.contains("\"snap-key\""), "{request}");
    let empty = cli(&data, &["volume", "snapshot", "list", "v1"])
        .await
        .expect("listed");
    assert_eq!(empty, "no snapshots\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_capabilities_each_is_refused_naming_it() {
    let mock = MockPlugin::builder()
        .controller_capabilities(CONTROLLER_IMPLEMENTED.iter().copied().filter(|c| {
            !matches!(
                c,
                ControllerCapability::CreateDeleteSnapshot
                    | ControllerCapability::ListSnapshots
                    | ControllerCapability::ListVolumes
                    | ControllerCapability::ListVolumesPublishedNodes
            )
        }))
        .build()
        .expect("mock without snapshots or listing");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let _: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    let calls = mock.calls().snapshot().without_discovery().len();
    for (args, capability) in [
        (
            &["volume", "list", "--plugin", "mock", "--external"][..],
            "LIST_VOLUMES",
        ),
        (
            &["volume", "snapshot", "create", "v1", "--name", "n"],
            "CREATE_DELETE_SNAPSHOT",
        ),
        (&["volume", "snapshot", "list", "v1"], "LIST_SNAPSHOTS"),
        (
            &["volume", "snapshot", "delete", "snap-1", "--plugin", "mock"],
            "CREATE_DELETE_SNAPSHOT",
        ),
    ] {
        let refused = cli(&data, args).await.expect_err("not advertised");
        assert!(
            refused.contains(capability) && refused.contains("does not advertise"),
            "{args:?}: {refused}"
        );
    }
    let unknown = cli(&data, &["volume", "snapshot", "list", "--plugin", "nope"])
        .await
        .expect_err("no such plugin");
    assert!(unknown.contains("no fingerprinted controller"), "{unknown}");
    assert_eq!(
        mock.calls().snapshot().without_discovery().len(),
        calls,
        "no plugin call but discovery"
    );
}
