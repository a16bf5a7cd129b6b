//! Volumes made from a snapshot or a clone through `serve` (`volume create --snapshot ID |
//! --clone VOLUME`), and refused clearly when the plugin lacks the capability.

use csi_agent::ops::api::{SnapshotView, VolumeView};
use csi_client::Rpc;
use csi_testkit::capabilities::CONTROLLER_IMPLEMENTED;
use csi_testkit::{ControllerCapability, MockPlugin};

use crate::serve::{cli, json, one_agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_create_restores_a_snapshot_and_clones_a_volume() {
    let mock = MockPlugin::builder().build().expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let v1: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "mock",
            "--capacity",
            "2Mi",
        ],
    )
    .await;
    let snap: SnapshotView = json(
        &data,
        &["volume", "snapshot", "create", "v1", "--name", "nightly"],
    )
    .await;

    let restored: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "v2",
            "--plugin",
            "mock",
            "--snapshot",
            &snap.snapshot_id,
        ],
    )
    .await;
    assert!(
        restored.capacity_bytes.is_some_and(|c| c >= 2 << 20),
        "at least the snapshot's size: {restored:?}"
    );
    let sent = mock.calls().last(Rpc::CreateVolume).expect("sent").request;
    assert!(sent.contains(&snap.snapshot_id), "{sent}");

    let _: VolumeView = json(
        &data,
        &[
            "volume", "create", "v3", "--plugin", "mock", "--clone", "v1",
        ],
    )
    .await;
    let sent = mock.calls().last(Rpc::CreateVolume).expect("sent").request;
    assert!(sent.contains(&v1.external_id), "{sent}");
    assert_eq!(mock.volumes().len(), 3);

    // Both at once, a snapshot the plugin does not have, a volume the agent does not know.
    let both = cli(
        &data,
        &[
            "volume",
            "create",
            "v4",
            "--plugin",
            "mock",
            "--snapshot",
            "s",
            "--clone",
            "v1",
        ],
    )
    .await
    .expect_err("one source");
    assert!(
        both.contains("--snapshot") && both.contains("--clone"),
        "{both}"
    );
    let missing = cli(
        &data,
        &[
            "volume",
            "create",
            "v4",
            "--plugin",
            "mock",
            "--snapshot",
            "no-such-snap",
        ],
    )
    .await
    .expect_err("no such snapshot");
    assert!(missing.contains("no-such-snap"), "{missing}");
    let unknown = cli(
        &data,
        &[
            "volume", "create", "v4", "--plugin", "mock", "--clone", "nope",
        ],
    )
    .await
    .expect_err("no such volume");
    assert!(unknown.contains("nope"), "{unknown}");
    assert!(
        cli(&data, &["volume", "status", "v4"]).await.is_err(),
        "not registered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_is_refused_before_any_call_by_a_plugin_without_clone_volume() {
    let mock = MockPlugin::builder()
        .controller_capabilities(
            CONTROLLER_IMPLEMENTED
                .iter()
                .copied()
                .filter(|c| *c != ControllerCapability::CloneVolume),
        )
        .build()
        .expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let _: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    let creates = mock.calls().count(Rpc::CreateVolume);
    let refused = cli(
        &data,
        &[
            "volume", "create", "v2", "--plugin", "mock", "--clone", "v1",
        ],
    )
    .await
    .expect_err("no CLONE_VOLUME");
    assert!(refused.contains("CLONE_VOLUME"), "{refused}");
    assert_eq!(mock.calls().count(Rpc::CreateVolume), creates);
}
