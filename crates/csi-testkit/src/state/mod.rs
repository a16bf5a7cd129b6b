//! The mock's in-memory storage state: volumes, snapshots, group snapshots, controller
//! publications per node, and node staging and publishing per node and path (one storage
//! model may be served as several nodes: [`MockPlugin::as_node`](crate::MockPlugin::as_node)).
//!
//! Plain data with small helpers; the rpc rules that change it live in `services`. It sits
//! inside the plugin's one `Mutex`, which is only ever held for short, synchronous sections.

pub(crate) mod pagination;
pub(crate) mod persist;

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use csi_proto::v1::{
    Snapshot, Topology, TopologyRequirement, Volume, VolumeCapability, VolumeContentSource,
    VolumeGroupSnapshot,
};

use crate::config::SeedVolume;

/// String maps as the wire types carry them.
pub(crate) type StringMap = HashMap<String, String>;

/// A path on a node: (node id, path). Two nodes may use the same path for different things.
pub(crate) type NodePathKey = (String, String);

/// The key of `path` on `node`.
pub(crate) fn at(node: &str, path: &str) -> NodePathKey {
    (node.to_owned(), path.to_owned())
}

/// A volume the mock knows.
#[derive(Clone, Debug)]
pub(crate) struct VolumeRec {
    pub(crate) id: String,
    /// The `CreateVolume` name; `None` for pre-provisioned volumes.
    pub(crate) name: Option<String>,
    pub(crate) capacity: i64,
    /// The capabilities it was created with; empty means "anything" (pre-provisioned).
    pub(crate) capabilities: Vec<VolumeCapability>,
    pub(crate) parameters: StringMap,
    pub(crate) mutable_parameters: StringMap,
    pub(crate) context: StringMap,
    pub(crate) content_source: Option<VolumeContentSource>,
    pub(crate) requirements: Option<TopologyRequirement>,
    pub(crate) accessible_topology: Vec<Topology>,
}

impl VolumeRec {
    pub(crate) fn to_wire(&self) -> Volume {
        Volume {
            capacity_bytes: self.capacity,
            volume_id: self.id.clone(),
            volume_context: self.context.clone(),
            content_source: self.content_source.clone(),
            accessible_topology: self.accessible_topology.clone(),
        }
    }
}

/// A controller publication of one volume to one node.
#[derive(Clone, Debug)]
pub(crate) struct PublicationRec {
    pub(crate) capability: VolumeCapability,
    pub(crate) readonly: bool,
    pub(crate) publish_context: StringMap,
}

/// A volume staged at one staging path on one node.
#[derive(Clone, Debug)]
pub(crate) struct StagedRec {
    pub(crate) volume_id: String,
    pub(crate) capability: VolumeCapability,
}

/// A volume published at one target path on one node.
#[derive(Clone, Debug)]
pub(crate) struct PublishedRec {
    pub(crate) volume_id: String,
    pub(crate) capability: VolumeCapability,
    pub(crate) readonly: bool,
    pub(crate) staging_path: String,
    /// Whether the mock created a file (block) rather than a directory (mount).
    pub(crate) block: bool,
}

/// A snapshot.
#[derive(Clone, Debug)]
pub(crate) struct SnapshotRec {
    pub(crate) id: String,
    pub(crate) name: Option<String>,
    pub(crate) source_volume_id: String,
    pub(crate) size: i64,
    pub(crate) created: SystemTime,
    /// Creation order, used by the block-metadata model.
    pub(crate) seq: u64,
    pub(crate) group_id: Option<String>,
}

impl SnapshotRec {
    pub(crate) fn to_wire(&self) -> Snapshot {
        Snapshot {
            size_bytes: self.size,
            snapshot_id: self.id.clone(),
            source_volume_id: self.source_volume_id.clone(),
            creation_time: Some(prost_types::Timestamp::from(self.created)),
            ready_to_use: true,
            group_snapshot_id: self.group_id.clone().unwrap_or_default(),
            accessible_topology: Vec::new(),
        }
    }
}

/// A volume group snapshot.
#[derive(Clone, Debug)]
pub(crate) struct GroupRec {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) source_volume_ids: Vec<String>,
    pub(crate) snapshot_ids: Vec<String>,
    pub(crate) parameters: StringMap,
    pub(crate) created: SystemTime,
}

/// Everything the mock remembers about storage.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) volumes: BTreeMap<String, VolumeRec>,
    pub(crate) volume_names: HashMap<String, String>,
    pub(crate) snapshots: BTreeMap<String, SnapshotRec>,
    pub(crate) snapshot_names: HashMap<String, String>,
    pub(crate) groups: BTreeMap<String, GroupRec>,
    pub(crate) group_names: HashMap<String, String>,
    /// Keyed by (volume id, node id).
    pub(crate) publications: BTreeMap<(String, String), PublicationRec>,
    /// Keyed by (node id, staging path).
    pub(crate) staged: BTreeMap<NodePathKey, StagedRec>,
    /// Keyed by (node id, target path).
    pub(crate) published: BTreeMap<NodePathKey, PublishedRec>,
    next_id: u64,
    next_snapshot_seq: u64,
    /// Put into every id the mock makes (`vol-<tag>-<n>`), so that ids of two runs differ.
    id_tag: Option<String>,
}

impl State {
    /// A state (loaded from a state file, or fresh) with the pre-provisioned volumes it does
    /// not have yet, making ids with `id_tag`.
    pub(crate) fn with_seeds(
        mut state: State,
        seeds: Vec<SeedVolume>,
        id_tag: Option<String>,
    ) -> Self {
        state.id_tag = id_tag;
        for seed in seeds {
            if state.volumes.contains_key(&seed.volume_id) {
                continue;
            }
            state.volumes.insert(
                seed.volume_id.clone(),
                VolumeRec {
                    id: seed.volume_id,
                    name: None,
                    capacity: seed.capacity_bytes,
                    capabilities: Vec::new(),
                    parameters: StringMap::new(),
                    mutable_parameters: StringMap::new(),
                    context: seed.volume_context.into_iter().collect(),
                    content_source: None,
                    requirements: None,
                    accessible_topology: Vec::new(),
                },
            );
        }
        state
    }

    /// A fresh id `<prefix>-<n>` not used by any volume, snapshot or group.
    pub(crate) fn new_id(&mut self, prefix: &str) -> String {
        loop {
            self.next_id += 1;
            let id = match &self.id_tag {
                Some(tag) => format!("{prefix}-{tag}-{}", self.next_id),
                None => format!("{prefix}-{}", self.next_id),
            };
            let taken = self.volumes.contains_key(&id)
                || self.snapshots.contains_key(&id)
                || self.groups.contains_key(&id);
            if !taken {
                return id;
            }
        }
    }

    pub(crate) fn next_snapshot_seq(&mut self) -> u64 {
        self.next_snapshot_seq += 1;
        self.next_snapshot_seq
    }

    /// Bytes taken by all volumes.
    pub(crate) fn used_bytes(&self) -> i64 {
        self.volumes.values().map(|v| v.capacity).sum()
    }

    /// The nodes a volume is controller-published to.
    pub(crate) fn published_nodes(&self, volume_id: &str) -> Vec<String> {
        self.publications
            .keys()
            .filter(|(v, _)| v == volume_id)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// How many volumes are controller-published to a node.
    pub(crate) fn volumes_on_node(&self, node_id: &str) -> usize {
        self.publications
            .keys()
            .filter(|(_, n)| n == node_id)
            .count()
    }

    /// Staging paths where a volume is staged on `node`.
    pub(crate) fn staged_paths_on(&self, node: &str, volume_id: &str) -> Vec<String> {
        paths_on(&self.staged, node, |s| s.volume_id == volume_id)
    }

    /// Target paths where a volume is published on `node`.
    pub(crate) fn target_paths_on(&self, node: &str, volume_id: &str) -> Vec<String> {
        paths_on(&self.published, node, |p| p.volume_id == volume_id)
    }

    /// Every staging and target path of a volume on any node, as `node:path`, staging paths
    /// first.
    pub(crate) fn node_uses(&self, volume_id: &str) -> Vec<String> {
        let staged = self
            .staged
            .iter()
            .filter(|(_, s)| s.volume_id == volume_id)
            .map(|(k, _)| k);
        let published = self
            .published
            .iter()
            .filter(|(_, p)| p.volume_id == volume_id)
            .map(|(k, _)| k);
        staged
            .chain(published)
            .map(|(node, path)| format!("{node}:{path}"))
            .collect()
    }

    /// The group snapshot as the wire type.
    pub(crate) fn group_to_wire(&self, group: &GroupRec) -> VolumeGroupSnapshot {
        VolumeGroupSnapshot {
            group_snapshot_id: group.id.clone(),
            snapshots: group
                .snapshot_ids
                .iter()
                .filter_map(|id| self.snapshots.get(id))
                .map(SnapshotRec::to_wire)
                .collect(),
            creation_time: Some(prost_types::Timestamp::from(group.created)),
            ready_to_use: true,
        }
    }
}

/// The paths on `node` of the records `keep` selects.
fn paths_on<R>(
    records: &BTreeMap<NodePathKey, R>,
    node: &str,
    keep: impl Fn(&R) -> bool,
) -> Vec<String> {
    records
        .iter()
        .filter(|((n, _), r)| n == node && keep(r))
        .map(|((_, path), _)| path.clone())
        .collect()
}
