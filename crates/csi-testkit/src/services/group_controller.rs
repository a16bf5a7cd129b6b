//! GroupController: volume group snapshots whose members are ordinary snapshots.

use std::collections::BTreeSet;
use std::time::SystemTime;

use csi_proto::Rpc;
use csi_proto::v1::group_controller_server::GroupController;
use csi_proto::v1::group_controller_service_capability::{self, Rpc as CapRpc};
use csi_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::dispatch::Target;
use crate::plugin::MockPlugin;
use crate::services::Svc;
use crate::state::{GroupRec, SnapshotRec};
use crate::validate;

fn check_ids(field: &str, ids: &[String]) -> Result<BTreeSet<String>, Status> {
    if ids.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{field} is required (at least one)"
        )));
    }
    for (i, id) in ids.iter().enumerate() {
        validate::required(&format!("{field}[{i}]"), id)?;
    }
    let set: BTreeSet<String> = ids.iter().cloned().collect();
    if set.len() != ids.len() {
        return Err(Status::invalid_argument(format!(
            "{field} lists an id twice"
        )));
    }
    Ok(set)
}

impl MockPlugin {
    fn create_group(
        &self,
        req: CreateVolumeGroupSnapshotRequest,
    ) -> Result<CreateVolumeGroupSnapshotResponse, Status> {
        validate::name("name", &req.name)?;
        let sources = check_ids("source_volume_ids", &req.source_volume_ids)?;
        validate::map("parameters", &req.parameters)?;
        validate::secrets(&req.secrets)?;
        let mut inner = self.shared.lock();
        let state = &mut inner.state;
        if let Some(existing) = state
            .group_names
            .get(&req.name)
            .and_then(|id| state.groups.get(id))
        {
            let same_sources = existing
                .source_volume_ids
                .iter()
                .cloned()
                .collect::<BTreeSet<_>>()
                == sources;
            return if same_sources && existing.parameters == req.parameters {
                Ok(CreateVolumeGroupSnapshotResponse {
                    group_snapshot: Some(state.group_to_wire(existing)),
                })
            } else {
                Err(Status::already_exists(format!(
                    "a group snapshot named {:?} already exists ({}) with different \
                     source_volume_ids or parameters",
                    req.name, existing.id
                )))
            };
        }
        let mut sizes = Vec::new();
        for id in &req.source_volume_ids {
            let volume = state
                .volumes
                .get(id)
                .ok_or_else(|| Status::not_found(format!("source volume {id} does not exist")))?;
            sizes.push((id.clone(), volume.capacity));
        }
        let group_id = state.new_id("group");
        let created = SystemTime::now();
        let mut snapshot_ids = Vec::new();
        for (volume_id, size) in sizes {
            let id = state.new_id("snap");
            let seq = state.next_snapshot_seq();
            state.snapshots.insert(
                id.clone(),
                SnapshotRec {
                    id: id.clone(),
                    name: None,
                    source_volume_id: volume_id,
                    size,
                    created,
                    seq,
                    group_id: Some(group_id.clone()),
                },
            );
            snapshot_ids.push(id);
        }
        let group = GroupRec {
            id: group_id.clone(),
            name: req.name.clone(),
            source_volume_ids: req.source_volume_ids,
            snapshot_ids,
            parameters: req.parameters,
            created,
        };
        let wire = state.group_to_wire(&group);
        state.groups.insert(group_id.clone(), group);
        state.group_names.insert(req.name, group_id);
        Ok(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(wire),
        })
    }

    /// Checks the caller's member list against the group's.
    fn check_members(group: &GroupRec, ids: &BTreeSet<String>) -> Result<(), Status> {
        let members: BTreeSet<String> = group.snapshot_ids.iter().cloned().collect();
        if members != *ids {
            return Err(Status::invalid_argument(format!(
                "snapshot_ids do not match the members of group snapshot {} ({})",
                group.id,
                group.snapshot_ids.join(", ")
            )));
        }
        Ok(())
    }

    fn delete_group(
        &self,
        req: DeleteVolumeGroupSnapshotRequest,
    ) -> Result<DeleteVolumeGroupSnapshotResponse, Status> {
        validate::required("group_snapshot_id", &req.group_snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let mut inner = self.shared.lock();
        if inner.quirks.argument_checks_first {
            check_ids("snapshot_ids", &req.snapshot_ids)?;
        }
        let state = &mut inner.state;
        // Gone already: OK whatever the member list says (csi-sanity deletes an unknown id
        // without snapshot_ids and expects OK).
        let Some(group) = state.groups.get(&req.group_snapshot_id) else {
            return Ok(DeleteVolumeGroupSnapshotResponse {});
        };
        let ids = check_ids("snapshot_ids", &req.snapshot_ids)?;
        Self::check_members(group, &ids)?;
        if let Some(group) = state.groups.remove(&req.group_snapshot_id) {
            for id in &group.snapshot_ids {
                state.snapshots.remove(id);
            }
            state.group_names.remove(&group.name);
        }
        Ok(DeleteVolumeGroupSnapshotResponse {})
    }

    fn get_group(
        &self,
        req: GetVolumeGroupSnapshotRequest,
    ) -> Result<GetVolumeGroupSnapshotResponse, Status> {
        validate::required("group_snapshot_id", &req.group_snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let inner = self.shared.lock();
        if inner.quirks.argument_checks_first {
            check_ids("snapshot_ids", &req.snapshot_ids)?;
        }
        let group = inner
            .state
            .groups
            .get(&req.group_snapshot_id)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "group snapshot {} does not exist",
                    req.group_snapshot_id
                ))
            })?;
        let ids = check_ids("snapshot_ids", &req.snapshot_ids)?;
        Self::check_members(group, &ids)?;
        Ok(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(inner.state.group_to_wire(group)),
        })
    }
}

#[tonic::async_trait]
impl GroupController for Svc {
    async fn group_controller_get_capabilities(
        &self,
        request: Request<GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<GroupControllerGetCapabilitiesResponse>, Status> {
        let scope = self
            .0
            .begin(
                Rpc::GroupControllerGetCapabilities,
                &request,
                Target::none(),
            )
            .await?;
        scope.finish(Ok(GroupControllerGetCapabilitiesResponse {
            capabilities: self
                .0
                .config()
                .group_caps
                .iter()
                .map(|cap| GroupControllerServiceCapability {
                    r#type: Some(group_controller_service_capability::Type::Rpc(CapRpc {
                        r#type: *cap as i32,
                    })),
                })
                .collect(),
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<CreateVolumeGroupSnapshotResponse>, Status> {
        let target = Target::snapshot("group-name", &request.get_ref().name);
        let scope = self
            .0
            .begin(Rpc::CreateVolumeGroupSnapshot, &request, target)
            .await?;
        scope.finish(self.0.create_group(request.into_inner()))
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<DeleteVolumeGroupSnapshotResponse>, Status> {
        let target = Target::snapshot("group", &request.get_ref().group_snapshot_id);
        let scope = self
            .0
            .begin(Rpc::DeleteVolumeGroupSnapshot, &request, target)
            .await?;
        scope.finish(self.0.delete_group(request.into_inner()))
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<GetVolumeGroupSnapshotResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::GetVolumeGroupSnapshot, &request, Target::none())
            .await?;
        scope.finish(self.0.get_group(request.into_inner()))
    }
}
