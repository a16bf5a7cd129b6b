//! The state one run carries from check to check: clients, capabilities, and what to undo.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use csi_proto::v1;
use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::group_controller_client::GroupControllerClient;
use csi_proto::v1::group_controller_service_capability::rpc::Type as GroupCap;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use tonic::Code;
use tonic::transport::Channel;

use super::calls::CallError;
use super::caps::{Caps, Gate, NodeService};
use super::{Options, PluginIdentity};

/// Why a check stopped early: it failed, or it does not apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Fail(String),
    Skip(String),
}

impl Stop {
    pub(crate) fn fail(reason: impl Into<String>) -> Self {
        Stop::Fail(reason.into())
    }

    pub(crate) fn skip(reason: impl Into<String>) -> Self {
        Stop::Skip(reason.into())
    }
}

impl From<CallError> for Stop {
    fn from(err: CallError) -> Self {
        Stop::Fail(err.to_string())
    }
}

/// What a check returns: `Ok` is a pass.
pub(crate) type Step = Result<(), Stop>;

/// Fails with the joined problems, if there are any.
pub(crate) fn verdict(problems: Vec<String>) -> Step {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Stop::Fail(problems.join("; ")))
    }
}

/// Something the suite created and must remove after the check, whatever its outcome.
#[derive(Clone, Debug)]
pub(crate) enum Undo {
    DeleteVolume(String),
    DeleteSnapshot(String),
    DeleteGroupSnapshot { group: String, members: Vec<String> },
    ControllerUnpublish { volume: String, node: String },
    NodeUnstage { volume: String, path: String },
    NodeUnpublish { volume: String, path: String },
}

pub(crate) struct Ctx {
    pub(crate) options: Options,
    pub(crate) identity: IdentityClient<Channel>,
    pub(crate) controller: ControllerClient<Channel>,
    pub(crate) node: NodeClient<Channel>,
    pub(crate) group: GroupControllerClient<Channel>,
    pub(crate) caps: Caps,
    /// From NodeGetInfo, when the node service answered it.
    pub(crate) node_id: Option<String>,
    /// From GetPluginInfo, set by the `PluginInfo` check.
    pub(crate) plugin: Option<PluginIdentity>,
    /// `<scratch>/csi-conformance-<run id>`, created by the run, removed at its end.
    pub(crate) run_dir: PathBuf,
    run_id: String,
    /// Numbers names and directories; atomic so name building needs only `&self`.
    counter: AtomicU32,
    undo: Vec<Undo>,
}

impl Ctx {
    pub(crate) fn new(options: Options, channel: Channel, run_id: String) -> Self {
        let run_dir = options
            .scratch_dir
            .join(format!("csi-conformance-{run_id}"));
        Self {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel.clone()),
            group: GroupControllerClient::new(channel),
            options,
            caps: Caps {
                plugin: BTreeSet::new(),
                expansion: BTreeSet::new(),
                controller: BTreeSet::new(),
                node: BTreeSet::new(),
                group: BTreeSet::new(),
                node_service: NodeService::Absent,
                problems: Vec::new(),
            },
            node_id: None,
            plugin: None,
            run_dir,
            run_id,
            counter: AtomicU32::new(0),
            undo: Vec::new(),
        }
    }

    /// The configured secrets, for every request that carries a `secrets` field.
    pub(crate) fn secrets(&self) -> std::collections::HashMap<String, String> {
        self.options.secrets.clone()
    }

    pub(crate) fn require(&self, gate: Gate) -> Step {
        self.caps.require(gate)
    }

    /// A name no other object of this run has: `csi-conformance-<run>-<n>-<tag>`.
    pub(crate) fn unique_name(&self, tag: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        format!("csi-conformance-{}-{n}-{tag}", self.run_id)
    }

    /// An id that names nothing on the plugin.
    pub(crate) fn absent_id(&self, kind: &str) -> String {
        self.unique_name(&format!("absent-{kind}"))
    }

    /// The capability every test volume is created with: mount, SINGLE_NODE_WRITER.
    pub(crate) fn capability(&self) -> v1::VolumeCapability {
        v1::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }
    }

    pub(crate) fn capacity(&self, bytes: i64) -> Option<v1::CapacityRange> {
        Some(v1::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        })
    }

    pub(crate) fn create_request(&self, name: String) -> v1::CreateVolumeRequest {
        v1::CreateVolumeRequest {
            name,
            capacity_range: self.capacity(self.options.volume_size),
            volume_capabilities: vec![self.capability()],
            parameters: self.options.parameters.clone(),
            secrets: self.secrets(),
            ..Default::default()
        }
    }

    /// Creates a volume that is deleted after the check; skips without CREATE_DELETE_VOLUME.
    pub(crate) async fn new_volume(&mut self) -> Result<v1::Volume, Stop> {
        self.require(Gate::Controller(CtrlCap::CreateDeleteVolume))?;
        let name = self.unique_name("vol");
        let response = self
            .create_volume(self.create_request(name.clone()))
            .await?;
        let volume = response.volume.ok_or_else(|| {
            Stop::fail(format!(
                "CreateVolume {name:?} answered OK without a volume"
            ))
        })?;
        if volume.volume_id.is_empty() {
            return Err(Stop::fail(format!(
                "CreateVolume {name:?} returned an empty volume_id"
            )));
        }
        self.undo(Undo::DeleteVolume(volume.volume_id.clone()));
        Ok(volume)
    }

    /// An existing volume id when the plugin can create one, else an id that names nothing.
    ///
    /// Required-field checks use it so that a plugin which looks the volume up before it
    /// validates the request is not blamed for answering NOT_FOUND.
    pub(crate) async fn some_volume_id(&mut self) -> Result<String, Stop> {
        if self.caps.has_controller(CtrlCap::CreateDeleteVolume) {
            Ok(self.new_volume().await?.volume_id)
        } else {
            Ok(self.absent_id("volume"))
        }
    }

    /// Creates a snapshot of `source` that is deleted after the check.
    pub(crate) async fn new_snapshot(&mut self, source: &str) -> Result<v1::Snapshot, Stop> {
        self.require(Gate::Controller(CtrlCap::CreateDeleteSnapshot))?;
        let name = self.unique_name("snap");
        let response = self
            .create_snapshot(v1::CreateSnapshotRequest {
                source_volume_id: source.to_owned(),
                name: name.clone(),
                secrets: self.secrets(),
                ..Default::default()
            })
            .await?;
        let snapshot = response.snapshot.ok_or_else(|| {
            Stop::fail(format!(
                "CreateSnapshot {name:?} answered OK without a snapshot"
            ))
        })?;
        if snapshot.snapshot_id.is_empty() {
            return Err(Stop::fail(format!(
                "CreateSnapshot {name:?} returned an empty snapshot_id"
            )));
        }
        self.undo(Undo::DeleteSnapshot(snapshot.snapshot_id.clone()));
        Ok(snapshot)
    }

    /// Creates a group snapshot of `sources` that is deleted after the check.
    pub(crate) async fn new_group_snapshot(
        &mut self,
        sources: Vec<String>,
    ) -> Result<v1::VolumeGroupSnapshot, Stop> {
        self.require(Gate::Group(GroupCap::CreateDeleteGetVolumeGroupSnapshot))?;
        let name = self.unique_name("group");
        let group = self
            .create_volume_group_snapshot(v1::CreateVolumeGroupSnapshotRequest {
                name: name.clone(),
                source_volume_ids: sources,
                secrets: self.secrets(),
                parameters: Default::default(),
            })
            .await?
            .group_snapshot
            .ok_or_else(|| {
                Stop::fail(format!(
                    "CreateVolumeGroupSnapshot {name:?} answered OK without a group snapshot"
                ))
            })?;
        if group.group_snapshot_id.is_empty() {
            return Err(Stop::fail(format!(
                "CreateVolumeGroupSnapshot {name:?} returned an empty group_snapshot_id"
            )));
        }
        self.undo(Undo::DeleteGroupSnapshot {
            group: group.group_snapshot_id.clone(),
            members: member_ids(&group),
        });
        Ok(group)
    }

    /// The plugin's node id; skips when the node service did not give one.
    pub(crate) fn require_node_id(&self) -> Result<String, Stop> {
        self.require(Gate::NodeService)?;
        self.node_id
            .clone()
            .ok_or_else(|| Stop::fail("no node id: NodeGetInfo did not answer with one"))
    }

    /// A fresh empty directory under the run directory.
    pub(crate) fn new_dir(&self, tag: &str) -> Result<PathBuf, Stop> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let dir = self.run_dir.join(format!("{n}-{tag}"));
        std::fs::create_dir_all(&dir).map_err(|err| {
            Stop::fail(format!(
                "cannot create scratch directory {}: {err}",
                dir.display()
            ))
        })?;
        Ok(dir)
    }

    pub(crate) fn undo(&mut self, undo: Undo) {
        self.undo.push(undo);
    }

    /// Undoes everything the last check created, newest first. Returns what could not be undone.
    pub(crate) async fn clean_up(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        while let Some(undo) = self.undo.pop() {
            let (what, result) = match &undo {
                Undo::NodeUnpublish { volume, path } => (
                    format!("volume {volume} published at {path}"),
                    self.node_unpublish_volume(v1::NodeUnpublishVolumeRequest {
                        volume_id: volume.clone(),
                        target_path: path.clone(),
                    })
                    .await
                    .map(drop),
                ),
                Undo::NodeUnstage { volume, path } => (
                    format!("volume {volume} staged at {path}"),
                    self.node_unstage_volume(v1::NodeUnstageVolumeRequest {
                        volume_id: volume.clone(),
                        staging_target_path: path.clone(),
                    })
                    .await
                    .map(drop),
                ),
                Undo::ControllerUnpublish { volume, node } => (
                    format!("volume {volume} published to node {node}"),
                    self.controller_unpublish_volume(v1::ControllerUnpublishVolumeRequest {
                        volume_id: volume.clone(),
                        node_id: node.clone(),
                        secrets: self.secrets(),
                    })
                    .await
                    .map(drop),
                ),
                Undo::DeleteSnapshot(id) => (
                    format!("snapshot {id}"),
                    self.delete_snapshot(v1::DeleteSnapshotRequest {
                        snapshot_id: id.clone(),
                        secrets: self.secrets(),
                    })
                    .await
                    .map(drop),
                ),
                Undo::DeleteGroupSnapshot { group, members } => (
                    format!("group snapshot {group}"),
                    self.delete_volume_group_snapshot(v1::DeleteVolumeGroupSnapshotRequest {
                        group_snapshot_id: group.clone(),
                        snapshot_ids: members.clone(),
                        secrets: self.secrets(),
                    })
                    .await
                    .map(drop),
                ),
                Undo::DeleteVolume(id) => (
                    format!("volume {id}"),
                    self.delete_volume(v1::DeleteVolumeRequest {
                        volume_id: id.clone(),
                        secrets: self.secrets(),
                    })
                    .await
                    .map(drop),
                ),
            };
            match result {
                // Already gone is as good as removed.
                Ok(()) => {}
                Err(err) if err.code() == Some(Code::NotFound) => {}
                Err(err) => problems.push(format!("{what}: {err}")),
            }
        }
        problems
    }
}

/// The ids of a group snapshot's members, in the order the plugin listed them.
pub(crate) fn member_ids(group: &v1::VolumeGroupSnapshot) -> Vec<String> {
    group
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.clone())
        .collect()
}
