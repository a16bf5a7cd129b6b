//! Snapshots, and the plugin's own listing of its volumes.

use std::collections::BTreeMap;

use csi_rpc_shim::{
    ControllerQuery, CreateSnapshot, DeleteSnapshot, ListSnapshots, ListVolumes, SnapshotInfo,
};
use csi_structs::wire::size_from_wire;
use csi_structs::{
    ExternalVolumeId, Parameters, PluginId, PluginNodeId, Secrets, SecretsUse, SnapshotId, VolumeId,
};

use super::error::invalid;
use super::{ServiceError, ServiceEvent, VolumeService};

/// Whose snapshots a snapshot call is about.
#[derive(Clone, Debug)]
pub enum SnapshotsOf {
    /// A volume's (its plugin, its `snapshot` secrets, its snapshots only when listing).
    Volume(VolumeId),
    /// A plugin's, of any volume (no secrets).
    Plugin(PluginId),
}

/// A snapshot to cut: [`VolumeService::create_snapshot`].
#[derive(Clone, Debug)]
pub struct NewSnapshot {
    /// The `CreateSnapshot` name (the spec's limits apply).
    pub name: String,
    /// The plugin's parameters.
    pub parameters: Parameters,
}

impl NewSnapshot {
    /// A snapshot named `name`, with no parameters; set
    /// [`parameters`](Self::parameters) on the result for a plugin that wants some.
    pub fn new(name: impl Into<String>) -> Self {
        NewSnapshot {
            name: name.into(),
            parameters: Parameters::default(),
        }
    }
}

/// A snapshot, with the orchestrator's id of its source volume when it knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Its plugin.
    pub plugin: PluginId,
    /// The plugin's id of the snapshot.
    pub id: SnapshotId,
    /// The plugin's id of the volume it was cut from.
    pub source: ExternalVolumeId,
    /// The catalog's id of that volume, when the catalog has it.
    pub source_volume: Option<VolumeId>,
    /// Its size in bytes; `None` when the plugin does not know it (0 on the wire).
    pub size_bytes: Option<u64>,
    /// Whether it can be used as a volume source yet.
    pub ready_to_use: bool,
}

/// A volume of the plugin's own listing, with the catalog's id for it when there is one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExternalVolume {
    /// The plugin's id of the volume.
    pub external_id: ExternalVolumeId,
    /// Its size in bytes; `None` when the plugin does not know it (0 on the wire).
    pub capacity_bytes: Option<u64>,
    /// The plugin's ids of the nodes it is published to, when the plugin reports them.
    pub published_nodes: Vec<PluginNodeId>,
    /// The catalog's id of it.
    pub known_as: Option<VolumeId>,
}

impl VolumeService {
    /// The plugin's own listing (`ListVolumes`, every page), each volume with the catalog's
    /// id for it when there is one.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Unsupported`] without `LIST_VOLUMES`, and the call's error.
    pub async fn list_external(
        &self,
        plugin: &PluginId,
    ) -> Result<Vec<ExternalVolume>, ServiceError> {
        self.require(plugin, csi_client::Rpc::ListVolumes)?;
        let page = self
            .inner
            .shim
            .list_volumes(
                ListVolumes {
                    query: ControllerQuery::new(plugin.clone()),
                    max_entries: 0,
                    starting_token: String::new(),
                },
                self.inner.call_timeout,
            )
            .await
            .map_err(|e| ServiceError::shim("ListVolumes", &e))?;
        let known = self.known_volumes(plugin);
        Ok(page
            .entries
            .into_iter()
            .map(|listed| ExternalVolume {
                known_as: known.get(&listed.external_volume).cloned(),
                capacity_bytes: size_from_wire(listed.capacity_bytes),
                published_nodes: listed.published_nodes,
                external_id: listed.external_volume,
            })
            .collect())
    }

    /// The catalog's volumes of `plugin`, by the plugin's id.
    fn known_volumes(&self, plugin: &PluginId) -> BTreeMap<ExternalVolumeId, VolumeId> {
        self.inner
            .catalog
            .list()
            .into_iter()
            .filter(|e| &e.plugin == plugin)
            .map(|e| (e.external_id, e.id))
            .collect()
    }

    fn snapshot(&self, plugin: &PluginId, info: SnapshotInfo) -> Snapshot {
        Snapshot {
            source_volume: self.known_volumes(plugin).get(&info.source).cloned(),
            plugin: plugin.clone(),
            id: info.snapshot,
            source: info.source,
            size_bytes: size_from_wire(info.size_bytes),
            ready_to_use: info.ready_to_use,
        }
    }

    /// Cuts a snapshot of a volume (`CreateSnapshot`, with the volume's `snapshot` secrets).
    ///
    /// # Errors
    ///
    /// [`ServiceError::Unsupported`] without `CREATE_DELETE_SNAPSHOT`,
    /// [`ServiceError::Invalid`] for a name the spec does not allow, and the call's error.
    pub async fn create_snapshot(
        &self,
        volume: &VolumeId,
        r: NewSnapshot,
    ) -> Result<Snapshot, ServiceError> {
        self.to_the_end("create_snapshot", Some(volume), |s| {
            let volume = volume.clone();
            async move { s.run_create_snapshot(&volume, r).await }
        })
        .await
    }

    /// [`create_snapshot`](Self::create_snapshot), in its task.
    async fn run_create_snapshot(
        &self,
        volume: &VolumeId,
        r: NewSnapshot,
    ) -> Result<Snapshot, ServiceError> {
        let entry = self.entry(volume)?;
        self.require(&entry.plugin, csi_client::Rpc::CreateSnapshot)?;
        csi_structs::limits::validate_request_name(&csi_structs::FieldPath::named("name"), &r.name)
            .map_err(|e| invalid("name", e))?;
        let info = self
            .inner
            .shim
            .create_snapshot(
                CreateSnapshot {
                    query: ControllerQuery::new(entry.plugin.clone()),
                    volume: entry.id.clone(),
                    source: entry.external_id.clone(),
                    name: r.name,
                    parameters: r.parameters,
                    secrets: entry.secrets.for_use(SecretsUse::Snapshot),
                },
                self.inner.call_timeout,
            )
            .await
            .map_err(|e| ServiceError::shim("CreateSnapshot", &e))?;
        tracing::info!(volume = %entry.id, snapshot = %info.snapshot, ready = info.ready_to_use, "snapshot cut");
        self.emit(ServiceEvent::SnapshotCut {
            volume: entry.id.clone(),
            snapshot: info.snapshot.clone(),
            ready_to_use: info.ready_to_use,
        });
        Ok(self.snapshot(&entry.plugin, info))
    }

    /// Every snapshot (`ListSnapshots`, every page) of a volume, or of a plugin.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Unsupported`] without `LIST_SNAPSHOTS`, and the call's error.
    pub async fn list_snapshots(&self, of: &SnapshotsOf) -> Result<Vec<Snapshot>, ServiceError> {
        let (plugin, source, secrets) = self.snapshots_of(of)?;
        self.require(&plugin, csi_client::Rpc::ListSnapshots)?;
        let page = self
            .inner
            .shim
            .list_snapshots(
                ListSnapshots {
                    query: ControllerQuery::new(plugin.clone()),
                    source,
                    snapshot: None,
                    max_entries: 0,
                    starting_token: String::new(),
                    secrets,
                },
                self.inner.call_timeout,
            )
            .await
            .map_err(|e| ServiceError::shim("ListSnapshots", &e))?;
        Ok(page
            .entries
            .into_iter()
            .map(|s| self.snapshot(&plugin, s))
            .collect())
    }

    /// Deletes a snapshot of a volume (with its `snapshot` secrets) or of a plugin. Returns
    /// the plugin it was deleted in.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Unsupported`] without `CREATE_DELETE_SNAPSHOT`, and the call's error.
    pub async fn delete_snapshot(
        &self,
        of: &SnapshotsOf,
        snapshot: &SnapshotId,
    ) -> Result<PluginId, ServiceError> {
        let volume = match of {
            SnapshotsOf::Volume(id) => Some(id),
            SnapshotsOf::Plugin(_) => None,
        };
        self.to_the_end("delete_snapshot", volume, |s| {
            let (of, snapshot) = (of.clone(), snapshot.clone());
            async move { s.run_delete_snapshot(&of, &snapshot).await }
        })
        .await
    }

    /// [`delete_snapshot`](Self::delete_snapshot), in its task.
    async fn run_delete_snapshot(
        &self,
        of: &SnapshotsOf,
        snapshot: &SnapshotId,
    ) -> Result<PluginId, ServiceError> {
        let (plugin, _, secrets) = self.snapshots_of(of)?;
        self.require(&plugin, csi_client::Rpc::DeleteSnapshot)?;
        self.inner
            .shim
            .delete_snapshot(
                DeleteSnapshot {
                    query: ControllerQuery::new(plugin.clone()),
                    snapshot: snapshot.clone(),
                    secrets,
                },
                self.inner.call_timeout,
            )
            .await
            .map_err(|e| ServiceError::shim("DeleteSnapshot", &e))?;
        tracing::info!(plugin = %plugin, snapshot = %snapshot, "snapshot deleted");
        self.emit(ServiceEvent::SnapshotDeleted {
            plugin: plugin.clone(),
            snapshot: snapshot.clone(),
        });
        Ok(plugin)
    }

    /// The plugin, the source filter and the secrets of a snapshot call.
    fn snapshots_of(
        &self,
        of: &SnapshotsOf,
    ) -> Result<(PluginId, Option<ExternalVolumeId>, Secrets), ServiceError> {
        match of {
            SnapshotsOf::Volume(id) => {
                let entry = self.entry(id)?;
                let secrets = entry.secrets.for_use(SecretsUse::Snapshot);
                Ok((entry.plugin, Some(entry.external_id), secrets))
            }
            SnapshotsOf::Plugin(plugin) => Ok((plugin.clone(), None, Secrets::default())),
        }
    }
}
