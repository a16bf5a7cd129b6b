//! Pagination, snapshot metadata streams resumed from `starting_offset`, group snapshots.

use csi_proto::Rpc;
use csi_proto::v1::*;
use csi_testkit::MockPlugin;
use tonic::Code;

use crate::support::*;

#[tokio::test]
async fn list_volumes_pages_through_everything_once() {
    let h = start_default().await;
    let mut created = Vec::new();
    for i in 0..7 {
        created.push(h.create(&format!("pvc-{i}")).await.volume_id);
    }
    created.sort();
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = h
            .controller()
            .list_volumes(ListVolumesRequest {
                max_entries: 3,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 3);
        pages += 1;
        for entry in page.entries {
            assert!(
                entry.status.is_some(),
                "LIST_VOLUMES_PUBLISHED_NODES fills status"
            );
            seen.push(entry.volume.unwrap().volume_id);
        }
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    seen.sort();
    assert_eq!(seen, created);
    assert_eq!(pages, 3);
    let status = code(
        h.controller()
            .list_volumes(ListVolumesRequest {
                max_entries: 3,
                starting_token: "not-a-token".into(),
            })
            .await,
    );
    assert_eq!(status.code(), Code::Aborted);
    let status = code(
        h.controller()
            .list_volumes(ListVolumesRequest {
                max_entries: -1,
                starting_token: String::new(),
            })
            .await,
    );
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn list_snapshots_filters_and_pages() {
    let h = start_default().await;
    let a = h.create("a").await.volume_id;
    let b = h.create("b").await.volume_id;
    for (i, source) in [&a, &a, &b].iter().enumerate() {
        h.controller()
            .create_snapshot(CreateSnapshotRequest {
                source_volume_id: (*source).clone(),
                name: format!("s{i}"),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let of_a = h
        .controller()
        .list_snapshots(ListSnapshotsRequest {
            source_volume_id: a.clone(),
            max_entries: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(of_a.entries.len(), 1);
    assert!(!of_a.next_token.is_empty());
    let rest = h
        .controller()
        .list_snapshots(ListSnapshotsRequest {
            source_volume_id: a.clone(),
            starting_token: of_a.next_token,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest.entries.len(), 1);
    assert!(rest.next_token.is_empty());
}

async fn collect_allocated(
    h: &Harness,
    snapshot_id: &str,
    starting_offset: i64,
) -> (Vec<BlockMetadata>, Option<tonic::Status>) {
    let mut stream = h
        .metadata()
        .get_metadata_allocated(GetMetadataAllocatedRequest {
            snapshot_id: snapshot_id.into(),
            starting_offset,
            max_results: 4,
            ..Default::default()
        })
        .await
        .expect("the stream starts")
        .into_inner();
    let mut blocks = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(message)) => {
                assert_eq!(
                    message.block_metadata_type,
                    BlockMetadataType::FixedLength as i32
                );
                assert!(message.block_metadata.len() <= 4);
                blocks.extend(message.block_metadata);
            }
            Ok(None) => return (blocks, None),
            Err(status) => return (blocks, Some(status)),
        }
    }
}

#[tokio::test]
async fn allocated_metadata_resumes_from_starting_offset() {
    let h = start(MockPlugin::builder()).await;
    let volume = h.create("backup-me").await;
    let snapshot = h.snapshot(&volume, "nightly").await;
    let (full, error) = collect_allocated(&h, &snapshot.snapshot_id, 0).await;
    assert!(error.is_none());
    assert!(full.len() > 10);
    for pair in full.windows(2) {
        assert!(pair[0].byte_offset + pair[0].size_bytes <= pair[1].byte_offset);
    }

    // A stream broken after two messages, resumed right after the last range received.
    h.server
        .faults()
        .on(Rpc::GetMetadataAllocated)
        .fail_stream_after(2, Code::Unavailable, "link lost");
    let (head, error) = collect_allocated(&h, &snapshot.snapshot_id, 0).await;
    assert_eq!(error.map(|s| s.code()), Some(Code::Unavailable));
    assert_eq!(head.len(), 8);
    let last = head.last().unwrap();
    let (tail, error) = collect_allocated(
        &h,
        &snapshot.snapshot_id,
        last.byte_offset + last.size_bytes,
    )
    .await;
    assert!(error.is_none());
    let resumed: Vec<BlockMetadata> = head.into_iter().chain(tail).collect();
    assert_eq!(resumed, full);

    let status = code(
        h.metadata()
            .get_metadata_allocated(GetMetadataAllocatedRequest {
                snapshot_id: snapshot.snapshot_id.clone(),
                starting_offset: volume.capacity_bytes + 1,
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status.code(), Code::OutOfRange);
    let status = code(
        h.metadata()
            .get_metadata_allocated(GetMetadataAllocatedRequest {
                snapshot_id: "snap-ghost".into(),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn delta_metadata_needs_two_snapshots_of_one_volume() {
    let h = start_default().await;
    let a = h.create("a").await.volume_id;
    let b = h.create("b").await.volume_id;
    let snap = |source: &str, name: &str| CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        ..Default::default()
    };
    let mut c = h.controller();
    let base = c
        .create_snapshot(snap(&a, "base"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let target = c
        .create_snapshot(snap(&a, "target"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let other = c
        .create_snapshot(snap(&b, "other"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let delta = |base: &str, target: &str| GetMetadataDeltaRequest {
        base_snapshot_id: base.into(),
        target_snapshot_id: target.into(),
        ..Default::default()
    };
    let mut stream = h
        .metadata()
        .get_metadata_delta(delta(&base.snapshot_id, &target.snapshot_id))
        .await
        .unwrap()
        .into_inner();
    let mut blocks = 0;
    while let Some(message) = stream.message().await.unwrap() {
        blocks += message.block_metadata.len();
    }
    assert!(blocks > 0);
    let status = code(
        h.metadata()
            .get_metadata_delta(delta(&base.snapshot_id, &other.snapshot_id))
            .await,
    );
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = code(
        h.metadata()
            .get_metadata_delta(delta(&target.snapshot_id, &base.snapshot_id))
            .await,
    );
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn group_snapshots_are_created_read_and_deleted_whole() {
    let h = start_default().await;
    let a = h.create("a").await.volume_id;
    let b = h.create("b").await.volume_id;
    let create = CreateVolumeGroupSnapshotRequest {
        name: "group".into(),
        source_volume_ids: vec![a.clone(), b.clone()],
        ..Default::default()
    };
    let group = h
        .group()
        .create_volume_group_snapshot(create.clone())
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(group.snapshots.len(), 2);
    let again = h
        .group()
        .create_volume_group_snapshot(create)
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(again, group, "idempotent by name");
    let ids: Vec<String> = group
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.clone())
        .collect();
    assert!(
        group
            .snapshots
            .iter()
            .all(|s| s.group_snapshot_id == group.group_snapshot_id)
    );

    let status = code(
        h.controller()
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: ids[0].clone(),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "members go with their group"
    );
    let status = code(
        h.group()
            .delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: group.group_snapshot_id.clone(),
                snapshot_ids: vec![ids[0].clone()],
                ..Default::default()
            })
            .await,
    );
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "a wrong member list is detected"
    );
    h.group()
        .delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: group.group_snapshot_id.clone(),
            snapshot_ids: ids.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(h.plugin().snapshot_ids().is_empty());
    let status = code(
        h.group()
            .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
                group_snapshot_id: group.group_snapshot_id,
                snapshot_ids: ids,
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
}
