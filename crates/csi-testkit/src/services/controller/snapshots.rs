//! Snapshots: create, delete, list, get.

use csi_proto::v1::*;
use tonic::Status;

use crate::capabilities::PluginService;
use crate::plugin::MockPlugin;
use crate::state::SnapshotRec;
use crate::state::pagination::page;
use crate::validate;

impl MockPlugin {
    pub(super) fn create_snapshot(
        &self,
        req: CreateSnapshotRequest,
    ) -> Result<CreateSnapshotResponse, Status> {
        validate::required("source_volume_id", &req.source_volume_id)?;
        validate::name("name", &req.name)?;
        validate::map("parameters", &req.parameters)?;
        validate::secrets(&req.secrets)?;
        if req.accessibility_requirements.is_some()
            && !self.has_plugin_service(PluginService::SnapshotAccessibilityConstraints)
        {
            return Err(Status::invalid_argument(
                "accessibility_requirements may only be sent to a plugin with plugin capability \
                 SNAPSHOT_ACCESSIBILITY_CONSTRAINTS",
            ));
        }
        let mut inner = self.shared.lock();
        let state = &mut inner.state;
        if let Some(existing) = state
            .snapshot_names
            .get(&req.name)
            .and_then(|id| state.snapshots.get(id))
        {
            return if existing.source_volume_id == req.source_volume_id {
                Ok(CreateSnapshotResponse {
                    snapshot: Some(existing.to_wire()),
                })
            } else {
                Err(Status::already_exists(format!(
                    "a snapshot named {:?} already exists ({}) of volume {}",
                    req.name, existing.id, existing.source_volume_id
                )))
            };
        }
        let size = state
            .volumes
            .get(&req.source_volume_id)
            .map(|v| v.capacity)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "source volume {} does not exist",
                    req.source_volume_id
                ))
            })?;
        let id = state.new_id("snap");
        let seq = state.next_snapshot_seq();
        let snapshot = SnapshotRec {
            id: id.clone(),
            name: Some(req.name.clone()),
            source_volume_id: req.source_volume_id,
            size,
            created: std::time::SystemTime::now(),
            seq,
            group_id: None,
        };
        let wire = snapshot.to_wire();
        state.snapshots.insert(id.clone(), snapshot);
        state.snapshot_names.insert(req.name, id);
        Ok(CreateSnapshotResponse {
            snapshot: Some(wire),
        })
    }

    pub(super) fn delete_snapshot(
        &self,
        req: DeleteSnapshotRequest,
    ) -> Result<DeleteSnapshotResponse, Status> {
        validate::required("snapshot_id", &req.snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let mut inner = self.shared.lock();
        let state = &mut inner.state;
        let Some(snapshot) = state.snapshots.get(&req.snapshot_id) else {
            return Ok(DeleteSnapshotResponse {});
        };
        if let Some(group) = &snapshot.group_id {
            return Err(Status::invalid_argument(format!(
                "snapshot {} belongs to group snapshot {group}; delete it with \
                 DeleteVolumeGroupSnapshot",
                req.snapshot_id
            )));
        }
        if let Some(name) = state
            .snapshots
            .remove(&req.snapshot_id)
            .and_then(|s| s.name)
        {
            state.snapshot_names.remove(&name);
        }
        Ok(DeleteSnapshotResponse {})
    }

    pub(super) fn list_snapshots(
        &self,
        req: ListSnapshotsRequest,
    ) -> Result<ListSnapshotsResponse, Status> {
        validate::optional("starting_token", &req.starting_token)?;
        validate::optional("source_volume_id", &req.source_volume_id)?;
        validate::optional("snapshot_id", &req.snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let inner = self.shared.lock();
        let (snapshots, next_token) = page(
            &inner.state.snapshots,
            |s| {
                (req.snapshot_id.is_empty() || s.id == req.snapshot_id)
                    && (req.source_volume_id.is_empty()
                        || s.source_volume_id == req.source_volume_id)
            },
            req.max_entries,
            &req.starting_token,
        )?;
        Ok(ListSnapshotsResponse {
            entries: snapshots
                .into_iter()
                .map(|s| list_snapshots_response::Entry {
                    snapshot: Some(s.to_wire()),
                })
                .collect(),
            next_token,
        })
    }

    pub(super) fn get_snapshot(
        &self,
        req: GetSnapshotRequest,
    ) -> Result<GetSnapshotResponse, Status> {
        validate::required("snapshot_id", &req.snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let inner = self.shared.lock();
        let snapshot = inner.state.snapshots.get(&req.snapshot_id).ok_or_else(|| {
            Status::not_found(format!("snapshot {} does not exist", req.snapshot_id))
        })?;
        Ok(GetSnapshotResponse {
            snapshot: Some(snapshot.to_wire()),
        })
    }
}
