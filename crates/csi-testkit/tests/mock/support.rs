//! Shared helpers: a mock served on a socket in a temporary directory, clients, requests.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::group_controller_client::GroupControllerClient;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::snapshot_metadata_client::SnapshotMetadataClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csi_proto::v1::*;
use csi_testkit::{MockPlugin, MockPluginBuilder, MockServer};
use tempfile::TempDir;
use tonic::transport::Channel;

/// Only a guard against a hang; never a timing assertion.
pub(crate) const GUARD: Duration = Duration::from_secs(20);

pub(crate) struct Harness {
    pub(crate) dir: TempDir,
    pub(crate) server: MockServer,
    pub(crate) channel: Channel,
}

pub(crate) async fn start(builder: MockPluginBuilder) -> Harness {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plugin = builder.build().expect("a valid mock configuration");
    let server = plugin
        .serve_unix(dir.path().join("csi.sock"))
        .await
        .expect("the mock serves on a fresh socket");
    let channel = server.channel().await.expect("a channel to the mock");
    Harness {
        dir,
        server,
        channel,
    }
}

pub(crate) async fn start_default() -> Harness {
    start(MockPlugin::builder().other_node("node-2")).await
}

impl Harness {
    pub(crate) fn plugin(&self) -> &MockPlugin {
        self.server.plugin()
    }
    pub(crate) fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel.clone())
    }
    pub(crate) fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }
    pub(crate) fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }
    pub(crate) fn group(&self) -> GroupControllerClient<Channel> {
        GroupControllerClient::new(self.channel.clone())
    }
    pub(crate) fn metadata(&self) -> SnapshotMetadataClient<Channel> {
        SnapshotMetadataClient::new(self.channel.clone())
    }
    /// A directory the CO created (as it must for staging paths and target parents).
    pub(crate) fn co_dir(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::create_dir_all(&path).expect("create a CO directory");
        path
    }

    /// Snapshots `volume` under `name`.
    pub(crate) async fn snapshot(&self, volume: &Volume, name: &str) -> Snapshot {
        self.controller()
            .create_snapshot(CreateSnapshotRequest {
                source_volume_id: volume.volume_id.clone(),
                name: name.into(),
                ..Default::default()
            })
            .await
            .expect("CreateSnapshot succeeds")
            .into_inner()
            .snapshot
            .expect("CreateSnapshot returns the snapshot")
    }

    /// Publishes `volume` to node-1, stages it and publishes it on the node; returns the
    /// target path.
    pub(crate) async fn attach(&self, volume: &Volume) -> PathBuf {
        let context = self
            .controller()
            .controller_publish_volume(publish_req(volume, "node-1", mount(Mode::SingleNodeWriter)))
            .await
            .expect("ControllerPublishVolume")
            .into_inner()
            .publish_context;
        let staging = self.co_dir(&format!("staging/{}", volume.volume_id));
        let target = self
            .co_dir(&format!("pods/{}", volume.volume_id))
            .join("mount");
        self.node()
            .node_stage_volume(stage_req(volume, &staging, context.clone()))
            .await
            .expect("NodeStageVolume");
        self.node()
            .node_publish_volume(node_publish_req(volume, &staging, &target, context))
            .await
            .expect("NodePublishVolume");
        target
    }

    pub(crate) async fn create(&self, name: &str) -> Volume {
        self.controller()
            .create_volume(create_req(name))
            .await
            .expect("CreateVolume succeeds")
            .into_inner()
            .volume
            .expect("CreateVolume returns the volume")
    }
}

pub(crate) fn mount(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..MountVolume::default()
        })),
    }
}

pub(crate) fn block(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

pub(crate) fn create_req(name: &str) -> CreateVolumeRequest {
    create_with(name, mount(Mode::SingleNodeWriter))
}

pub(crate) fn create_with(name: &str, cap: VolumeCapability) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        ..CreateVolumeRequest::default()
    }
}

pub(crate) fn publish_req(
    volume: &Volume,
    node: &str,
    cap: VolumeCapability,
) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: node.into(),
        volume_capability: Some(cap),
        readonly: false,
        volume_context: volume.volume_context.clone(),
        ..ControllerPublishVolumeRequest::default()
    }
}

pub(crate) fn path_str(path: &std::path::Path) -> String {
    path.to_str()
        .expect("temporary paths are UTF-8")
        .to_string()
}

pub(crate) fn stage_req(
    volume: &Volume,
    staging: &std::path::Path,
    publish_context: HashMap<String, String>,
) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        publish_context,
        staging_target_path: path_str(staging),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        volume_context: volume.volume_context.clone(),
        ..NodeStageVolumeRequest::default()
    }
}

pub(crate) fn node_publish_req(
    volume: &Volume,
    staging: &std::path::Path,
    target: &std::path::Path,
    publish_context: HashMap<String, String>,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        publish_context,
        staging_target_path: path_str(staging),
        target_path: path_str(target),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        readonly: false,
        volume_context: volume.volume_context.clone(),
        ..NodePublishVolumeRequest::default()
    }
}

/// The code of a failed call, panicking with the response if it succeeded.
pub(crate) fn code<T: std::fmt::Debug>(
    result: Result<tonic::Response<T>, tonic::Status>,
) -> tonic::Status {
    match result {
        Ok(response) => panic!("expected an error, got {:?}", response.into_inner()),
        Err(status) => status,
    }
}

/// The RPC capabilities `ControllerGetCapabilities` answers, as their numbers.
pub(crate) async fn controller_rpcs(controller: &mut ControllerClient<Channel>) -> Vec<i32> {
    controller
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .expect("ControllerGetCapabilities")
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| {
            c.r#type
                .map(|controller_service_capability::Type::Rpc(rpc)| rpc.r#type)
        })
        .collect()
}

/// The RPC capabilities `NodeGetCapabilities` answers, as their numbers.
pub(crate) async fn node_rpcs(node: &mut NodeClient<Channel>) -> Vec<i32> {
    node.node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .expect("NodeGetCapabilities")
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| {
            c.r#type
                .map(|node_service_capability::Type::Rpc(rpc)| rpc.r#type)
        })
        .collect()
}
