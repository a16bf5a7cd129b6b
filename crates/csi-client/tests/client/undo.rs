//! Undoing a CreateVolume whose outcome is uncertain: CreateVolume again by name until the
//! answer is usable, then DeleteVolume the id it names.

use csi_client::{Code, ErrorClass, Rpc, UNDO_CREATE_ROUNDS, proto};
use csi_structs::Secrets;
use csi_testkit::FaultStep;

use crate::support::{Mock, guard};

fn request(name: &str) -> proto::CreateVolumeRequest {
    proto::CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![
            (&csi_structs::VolumeCapability::block(csi_structs::AccessMode::SingleNodeWriter))
                .into(),
        ],
        ..Default::default()
    }
}

/// A mock plugin with no volume.
async fn empty_mock() -> Mock {
    Mock::start(
        csi_testkit::MockPlugin::builder()
            .build()
            .expect("test invariant: the default mock config is valid"),
    )
    .await
}

/// Undoes the creation of a volume named `name` (no secrets).
async fn undo(
    client: &csi_client::CsiClient,
    name: &str,
) -> Result<csi_structs::ExternalVolumeId, csi_client::Error> {
    guard(
        client
            .controller()
            .undo_create(request(name), &Secrets::default()),
    )
    .await
}

#[tokio::test]
async fn a_volume_the_plugin_did_create_is_found_by_name_and_deleted() {
    let mock = empty_mock().await;
    let client = mock.client(|_| {});
    // The plugin created the volume; say its answer was lost.
    let created = guard(client.controller().create_volume(request("pvc-lost")))
        .await
        .unwrap();
    assert_eq!(mock.plugin.volumes().len(), 1);
    let deleted = undo(&client, "pvc-lost").await.unwrap();
    assert_eq!(deleted, created.volume_id, "the same volume, by name");
    assert!(mock.plugin.volumes().is_empty(), "nothing left behind");
    assert_eq!(mock.count(Rpc::CreateVolume), 2);
    assert_eq!(mock.count(Rpc::DeleteVolume), 1);
}

#[tokio::test]
async fn an_uncertain_create_is_undone_whatever_it_did() {
    let mock = empty_mock().await;
    let client = mock.client(|_| {});
    mock.faults()
        .on(Rpc::CreateVolume)
        .fail(Code::Internal, "backend timed out")
        .install();
    let err = guard(client.controller().create_volume(request("pvc-1")))
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Uncertain);
    // The undo creates it now (it did not exist) and deletes it: either way nothing is left.
    undo(&client, "pvc-1").await.unwrap();
    assert!(mock.plugin.volumes().is_empty(), "nothing left behind");
    assert_eq!(mock.count(Rpc::DeleteVolume), 1);
}

#[tokio::test]
async fn an_undo_that_never_gets_a_usable_answer_gives_up_and_says_so() {
    let mock = empty_mock().await;
    // One attempt per round, so the rounds are counted exactly.
    let client = mock.client(|t| t.update(Rpc::CreateVolume, |p| p.max_attempts = 1));
    mock.faults()
        .on(Rpc::CreateVolume)
        .forever(FaultStep::Fail {
            code: Code::Unavailable,
            message: "down".into(),
        });
    let err = undo(&client, "pvc-2").await.unwrap_err();
    assert_eq!(err.rpc(), Rpc::CreateVolume);
    assert_eq!(err.code(), Some(Code::Unavailable));
    assert_eq!(mock.count(Rpc::CreateVolume), UNDO_CREATE_ROUNDS as usize);
    assert_eq!(mock.count(Rpc::DeleteVolume), 0);

    // A failure no retry changes ends the undo at once.
    mock.faults().clear();
    mock.faults()
        .on(Rpc::CreateVolume)
        .fail(Code::InvalidArgument, "no")
        .install();
    let before = mock.count(Rpc::CreateVolume);
    let err = undo(&client, "pvc-3").await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Fatal);
    assert_eq!(mock.count(Rpc::CreateVolume), before + 1);
}
