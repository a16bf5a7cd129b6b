//! Capacity, expansion, modification, restore and clone, volume reads and health.

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_testkit::{MockPlugin, VolumeExpansion};
use tonic::Code;

use crate::support::*;

const GIB: i64 = 1 << 30;

fn expand(volume_id: &str, bytes: i64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: volume_id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn capacity_follows_volumes_and_expansion() {
    let h = start(
        MockPlugin::builder()
            .capacity(10 * GIB)
            .max_volume_size(4 * GIB),
    )
    .await;
    let capacity = |h: &Harness| {
        let mut c = h.controller();
        async move {
            c.get_capacity(GetCapacityRequest::default())
                .await
                .unwrap()
                .into_inner()
        }
    };
    assert_eq!(capacity(&h).await.available_capacity, 10 * GIB);
    let volume = h.create("grow").await;
    assert_eq!(capacity(&h).await.available_capacity, 9 * GIB);
    assert_eq!(capacity(&h).await.maximum_volume_size, Some(4 * GIB));

    let grown = h
        .controller()
        .controller_expand_volume(expand(&volume.volume_id, 3 * GIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 3 * GIB);
    assert!(grown.node_expansion_required);
    let same = h
        .controller()
        .controller_expand_volume(expand(&volume.volume_id, GIB))
        .await
        .expect("already large enough: OK")
        .into_inner();
    assert_eq!(same.capacity_bytes, 3 * GIB, "never shrinks");
    assert_eq!(capacity(&h).await.available_capacity, 7 * GIB);
    let status = code(
        h.controller()
            .controller_expand_volume(expand(&volume.volume_id, 5 * GIB))
            .await,
    );
    assert_eq!(status.code(), Code::OutOfRange);
    let status = code(
        h.controller()
            .controller_expand_volume(expand("vol-ghost", GIB))
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
    let mut no_range = expand(&volume.volume_id, GIB);
    no_range.capacity_range = None;
    let status = code(h.controller().controller_expand_volume(no_range).await);
    assert!(status.message().contains("capacity_range"));

    // Node expansion at the staging path reports the new size.
    let ctx = h
        .controller()
        .controller_publish_volume(publish_req(
            &volume,
            "node-1",
            mount(Mode::SingleNodeWriter),
        ))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let staging = h.co_dir("staging");
    h.node()
        .node_stage_volume(stage_req(&volume, &staging, ctx))
        .await
        .unwrap();
    let node = h
        .node()
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: volume.volume_id.clone(),
            volume_path: path_str(&staging),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node.capacity_bytes, 3 * GIB);
    let status = code(
        h.node()
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: volume.volume_id.clone(),
                volume_path: path_str(&h.co_dir("elsewhere")),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn offline_expansion_refuses_published_volumes() {
    let h = start(MockPlugin::builder().volume_expansion(Some(VolumeExpansion::Offline))).await;
    let volume = h.create("offline").await;
    h.controller()
        .controller_publish_volume(publish_req(
            &volume,
            "node-1",
            mount(Mode::SingleNodeWriter),
        ))
        .await
        .unwrap();
    let status = code(
        h.controller()
            .controller_expand_volume(expand(&volume.volume_id, 2 * GIB))
            .await,
    );
    assert_eq!(status.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn modify_get_restore_clone_and_health() {
    let h = start_default().await;
    let volume = h.create("src").await;
    let modify = |params: &[(&str, &str)], id: &str| ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let status = code(
        h.controller()
            .controller_modify_volume(modify(&[("iops", "3000")], &volume.volume_id))
            .await,
    );
    assert_eq!(status.code(), Code::InvalidArgument, "no key is configured");
    assert!(status.message().contains("\"iops\""), "{status:?}");
    let status = code(
        h.controller()
            .controller_modify_volume(modify(&[("iops", "1")], "vol-ghost"))
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);

    h.controller()
        .controller_publish_volume(publish_req(
            &volume,
            "node-2",
            mount(Mode::SingleNodeWriter),
        ))
        .await
        .unwrap();
    let got = h
        .controller()
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: volume.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.as_ref(), Some(&volume));
    assert_eq!(got.status.unwrap().published_node_ids, vec!["node-2"]);

    let snapshot = h.snapshot(&volume, "snap").await;
    assert!(snapshot.ready_to_use && snapshot.creation_time.is_some());
    assert_eq!(snapshot.size_bytes, volume.capacity_bytes);
    let mut restore = create_req("restored");
    restore.capacity_range = None;
    restore.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: snapshot.snapshot_id.clone(),
            },
        )),
    });
    let restored = h
        .controller()
        .create_volume(restore)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(restored.capacity_bytes >= snapshot.size_bytes);
    assert!(restored.content_source.is_some());
    let mut clone = create_req("clone");
    clone.capacity_range = Some(CapacityRange {
        required_bytes: 0,
        limit_bytes: volume.capacity_bytes / 2,
    });
    clone.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: volume.volume_id.clone(),
            },
        )),
    });
    let status = code(h.controller().create_volume(clone).await);
    assert_eq!(status.code(), Code::OutOfRange, "smaller than its source");

    let health = h
        .controller()
        .controller_get_volume_health(ControllerGetVolumeHealthRequest {
            volume_id: volume.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume_health
        .unwrap();
    assert!(health.health_statuses.is_empty());
    let status = code(
        h.controller()
            .controller_list_volume_health(ControllerListVolumeHealthRequest {
                starting_token: "bogus".into(),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status.code(), Code::Aborted);
}

#[tokio::test]
async fn an_answer_many_times_the_codecs_first_buffer_arrives_whole() {
    // The generated code's buffers start at csi_proto::codec::BUFFER_SIZE and grow with the
    // message: a listing of 300 volumes is many times that, in both directions' codecs.
    let count = 300;
    let builder = (0..count).fold(MockPlugin::builder(), |builder, i| {
        builder.volume(format!("volume-with-a-long-name-{i:04}"), 1 << 20)
    });
    let h = start(builder).await;
    let page = h
        .controller()
        .list_volumes(ListVolumesRequest::default())
        .await
        .expect("one page of every volume")
        .into_inner();
    assert!(
        prost::Message::encoded_len(&page) > 8 * csi_proto::codec::BUFFER_SIZE,
        "the answer is larger than the first buffer"
    );
    let mut ids: Vec<_> = page
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone()))
        .collect();
    ids.sort();
    assert_eq!(ids.len(), count);
    assert_eq!(ids[0], "volume-with-a-long-name-0000");
    assert_eq!(ids[count - 1], "volume-with-a-long-name-0299");
}
