//! How many nodes and target paths a volume may have, per access mode (csi-spec §4.5, the
//! tables of `ControllerPublishVolume` and of a second `NodePublishVolume`), and one storage
//! model served as two nodes (`MockPlugin::as_node`).

use std::collections::HashMap;
use std::path::Path;

use csi_proto::Rpc;
use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_testkit::{ConfigError, MockPlugin, MockServer};
use tonic::Code;
use tonic::transport::Channel;

use crate::support::*;

/// Every access mode, in wire order.
const MODES: [Mode; 7] = [
    Mode::SingleNodeWriter,
    Mode::SingleNodeReaderOnly,
    Mode::MultiNodeReaderOnly,
    Mode::MultiNodeSingleWriter,
    Mode::MultiNodeMultiWriter,
    Mode::SingleNodeSingleWriter,
    Mode::SingleNodeMultiWriter,
];

fn multi_node(mode: Mode) -> bool {
    matches!(
        mode,
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter
    )
}

/// One node of the storage: its server and a channel to it.
struct NodeEnd {
    server: MockServer,
    channel: Channel,
}

impl NodeEnd {
    async fn serve(plugin: &MockPlugin, socket: &Path) -> NodeEnd {
        let server = plugin.serve_unix(socket).await.expect("serves");
        let channel = server.channel().await.expect("a channel");
        NodeEnd { server, channel }
    }
    fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }
    fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }
}

/// Controller publish to `node_id`, stage at `staging` and publish at `target` through
/// `channel`, all with `cap`, the publish with `readonly`: the calls a CO makes for one
/// workload on a node. Returns the first failure.
async fn attach(
    channel: &Channel,
    volume: &Volume,
    node_id: &str,
    cap: &VolumeCapability,
    (staging, target): (&Path, &Path),
    readonly: bool,
) -> Result<(), tonic::Status> {
    let context = ControllerClient::new(channel.clone())
        .controller_publish_volume(publish_req(volume, node_id, cap.clone()))
        .await?
        .into_inner()
        .publish_context;
    let mut node = NodeClient::new(channel.clone());
    let mut stage = stage_req(volume, staging, context.clone());
    stage.volume_capability = Some(cap.clone());
    node.node_stage_volume(stage).await?;
    let mut publish = node_publish_req(volume, staging, target, context);
    publish.volume_capability = Some(cap.clone());
    publish.readonly = readonly;
    node.node_publish_volume(publish).await?;
    Ok(())
}

fn created(volume: Result<tonic::Response<CreateVolumeResponse>, tonic::Status>) -> Volume {
    volume
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume")
}

#[tokio::test]
async fn a_second_target_path_on_a_node_follows_the_access_mode() {
    let h = start_default().await;
    for mode in MODES {
        let cap = mount(mode);
        let name = format!("{mode:?}");
        let volume = created(
            h.controller()
                .create_volume(create_with(&name, cap.clone()))
                .await,
        );
        let staging = h.co_dir(&format!("staging/{name}"));
        let pods = h.co_dir(&format!("pods/{name}"));
        let at = |workload: &str| (staging.clone(), pods.join(workload));
        let (s, t) = at("a");
        attach(&h.channel, &volume, "node-1", &cap, (&s, &t), false)
            .await
            .unwrap_or_else(|s| panic!("{name}: the first workload: {s:?}"));
        // The same target path again is idempotent in every mode.
        attach(&h.channel, &volume, "node-1", &cap, (&s, &t), false)
            .await
            .unwrap_or_else(|s| panic!("{name}: the same target path again: {s:?}"));
        // A second workload (a reader) at a target path of its own.
        let (s, t) = at("b");
        let second = attach(&h.channel, &volume, "node-1", &cap, (&s, &t), true).await;
        if multi_node(mode) || mode == Mode::SingleNodeMultiWriter {
            second.unwrap_or_else(|s| panic!("{name}: a second target path: {s:?}"));
            // A second read-write publication too: the spec states no refusal, not even for
            // MULTI_NODE_SINGLE_WRITER.
            let (s, t) = at("c");
            attach(&h.channel, &volume, "node-1", &cap, (&s, &t), false)
                .await
                .unwrap_or_else(|s| panic!("{name}: a third target path: {s:?}"));
        } else {
            let status = second.expect_err(&name);
            assert_eq!(
                status.code(),
                Code::FailedPrecondition,
                "{name}: {status:?}"
            );
            assert!(
                status.message().contains("allows one target path per node"),
                "{name}: {}",
                status.message()
            );
            assert!(
                !pods.join("b").exists(),
                "{name}: nothing made at the target"
            );
        }
        // A second node: only MULTI_NODE_* (node-2 is a node the controller knows).
        let publish = h
            .controller()
            .controller_publish_volume(publish_req(&volume, "node-2", cap.clone()))
            .await;
        if multi_node(mode) {
            publish.unwrap_or_else(|s| panic!("{name}: a second node: {s:?}"));
        } else {
            let status = code(publish);
            assert_eq!(
                status.code(),
                Code::FailedPrecondition,
                "{name}: {status:?}"
            );
            assert!(
                status.message().contains("node-1"),
                "{name}: names the holder"
            );
        }
    }
}

#[tokio::test]
async fn one_storage_served_as_two_nodes_keeps_node_state_per_node() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = MockPlugin::builder().build().expect("mock");
    let second = first.as_node("node-2").expect("a second node");
    assert_eq!((first.node_id(), second.node_id()), ("node-1", "node-2"));
    let a = NodeEnd::serve(&first, &dir.path().join("a.sock")).await;
    let b = NodeEnd::serve(&second, &dir.path().join("b.sock")).await;
    let info = b
        .node()
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("NodeGetInfo")
        .into_inner();
    assert_eq!(info.node_id, "node-2");

    // One controller: a volume created through one node is the other's too.
    let cap = mount(Mode::MultiNodeMultiWriter);
    let volume = created(
        a.controller()
            .create_volume(create_with("shared", cap.clone()))
            .await,
    );
    assert_eq!(second.volumes().len(), 1);

    // The same staging and target paths on both nodes are two nodes' business.
    let staging = dir.path().join("staging");
    let pods = dir.path().join("pods");
    std::fs::create_dir_all(&staging).expect("staging dir");
    std::fs::create_dir_all(&pods).expect("pods dir");
    let target = pods.join("w");
    attach(
        &a.channel,
        &volume,
        "node-1",
        &cap,
        (&staging, &target),
        false,
    )
    .await
    .expect("attached on node-1");
    attach(
        &b.channel,
        &volume,
        "node-2",
        &cap,
        (&staging, &target),
        false,
    )
    .await
    .expect("attached on node-2");
    assert_eq!(first.staged().len(), 1);
    assert_eq!(second.staged().len(), 1);
    assert_eq!(first.published().len(), 1);
    assert_eq!(second.published().len(), 1);
    assert_eq!(
        first.published_nodes(&volume.volume_id),
        ["node-1", "node-2"]
    );

    // One call log, naming the node that served each node call.
    let stages: Vec<Option<String>> = first
        .calls()
        .of(Rpc::NodeStageVolume)
        .records()
        .iter()
        .map(|r| r.node_id.clone())
        .collect();
    assert_eq!(
        stages,
        [Some("node-1".to_owned()), Some("node-2".to_owned())]
    );

    // Node-2's publication holds its controller unpublish, and not node-1's.
    let unpublish = |node: &str| ControllerUnpublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: node.into(),
        ..ControllerUnpublishVolumeRequest::default()
    };
    let status = code(
        a.controller()
            .controller_unpublish_volume(unpublish("node-2"))
            .await,
    );
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("node-2"), "{}", status.message());
    b.node()
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            target_path: path_str(&target),
        })
        .await
        .expect("unpublished on node-2");
    b.node()
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: volume.volume_id.clone(),
            staging_target_path: path_str(&staging),
        })
        .await
        .expect("unstaged on node-2");
    a.controller()
        .controller_unpublish_volume(unpublish("node-2"))
        .await
        .expect("controller unpublished from node-2");
    assert!(second.staged().is_empty() && second.published().is_empty());
    assert_eq!(first.published().len(), 1, "node-1 keeps its publication");
    a.server.shutdown().await.expect("shut down");
    b.server.shutdown().await.expect("shut down");
}

#[tokio::test]
async fn a_second_node_is_refused_a_single_node_volume_the_first_holds() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = MockPlugin::builder().build().expect("mock");
    let second = first.as_node("node-2").expect("a second node");
    let b = NodeEnd::serve(&second, &dir.path().join("b.sock")).await;
    let cap = mount(Mode::SingleNodeWriter);
    let volume = created(
        b.controller()
            .create_volume(create_with("rwo", cap.clone()))
            .await,
    );
    b.controller()
        .controller_publish_volume(publish_req(&volume, "node-1", cap.clone()))
        .await
        .expect("published to node-1");
    let status = code(
        b.controller()
            .controller_publish_volume(publish_req(&volume, "node-2", cap.clone()))
            .await,
    );
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("node-1"), "{}", status.message());
    // Node-2's node calls need a publication to node-2, not node-1's.
    let staging = dir.path().join("staging");
    std::fs::create_dir_all(&staging).expect("staging dir");
    let status = code(
        b.node()
            .node_stage_volume(stage_req(&volume, &staging, HashMap::new()))
            .await,
    );
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("node-2"), "{}", status.message());
    // Nodes nobody serves or configured stay unknown.
    let status = code(
        b.controller()
            .controller_publish_volume(publish_req(&volume, "node-3", cap))
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
    assert!(matches!(
        first.as_node(""),
        Err(ConfigError::InvalidNodeId { len: 0, .. })
    ));
    b.server.shutdown().await.expect("shut down");
}
