//! The state file: a restarted mock keeps its volumes, snapshots, publications and stagings;
//! a damaged file is an error naming it; ids never repeat across restarts.

use std::os::unix::fs::PermissionsExt;

use csi_proto::v1::*;
use csi_testkit::{ConfigError, MockPlugin, StateFileError};

use crate::support::start;

#[tokio::test]
async fn a_restarted_mock_keeps_what_it_had_and_numbers_on() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let h = start(MockPlugin::builder().state_file(&state)).await;
    let volume = h.create("kept").await;
    let target = h.attach(&volume).await;
    let snapshot = h.snapshot(&volume, "snap").await;
    h.server.shutdown().await.unwrap();
    let mode = std::fs::metadata(&state).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the state file is private");

    let again = start(MockPlugin::builder().state_file(&state)).await;
    let plugin = again.plugin();
    assert_eq!(plugin.volumes(), std::slice::from_ref(&volume));
    assert_eq!(plugin.published_nodes(&volume.volume_id), ["node-1"]);
    assert_eq!(plugin.staged().len(), 1);
    assert_eq!(plugin.published().len(), 1);
    assert_eq!(
        plugin.snapshot_ids(),
        std::slice::from_ref(&snapshot.snapshot_id)
    );
    // The same CreateVolume is still idempotent, and a new one gets a new id.
    let same = again.create("kept").await;
    assert_eq!(same.volume_id, volume.volume_id);
    let other = again.create("new").await;
    assert_ne!(other.volume_id, volume.volume_id);
    assert_ne!(other.volume_id, snapshot.snapshot_id);
    // The node side remembers too: unpublishing works on the restarted mock.
    again
        .node()
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            target_path: target.to_string_lossy().into_owned(),
        })
        .await
        .unwrap();
    assert!(again.plugin().published().is_empty());
}

#[test]
fn a_damaged_state_file_is_an_error_naming_it_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    std::fs::write(&state, b"{\"version\": 1, \"volumes\": [").unwrap();
    let err = MockPlugin::builder()
        .state_file(&state)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::StateFile(StateFileError::Parse { .. })),
        "{err}"
    );
    assert!(err.to_string().contains(&*state.to_string_lossy()), "{err}");
    assert_eq!(
        std::fs::read(&state).unwrap(),
        b"{\"version\": 1, \"volumes\": [",
        "never replaced"
    );
    std::fs::write(&state, b"").unwrap();
    assert!(MockPlugin::builder().state_file(&state).build().is_err());
}

#[tokio::test]
async fn tagged_ids_differ_between_runs() {
    let first = start(MockPlugin::builder().id_tag("a1")).await;
    let second = start(MockPlugin::builder().id_tag("b2")).await;
    let one = first.create("data").await.volume_id;
    let two = second.create("data").await.volume_id;
    assert_ne!(one, two);
    assert!(one.contains("-a1-"), "{one}");
    for bad in ["", "has space", &"x".repeat(33)] {
        assert!(
            matches!(
                MockPlugin::builder().id_tag(bad).build(),
                Err(ConfigError::InvalidIdTag { .. })
            ),
            "{bad:?}"
        );
    }
}
