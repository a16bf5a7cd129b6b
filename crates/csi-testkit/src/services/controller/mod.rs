//! Controller: volumes, controller publications, snapshots, capacity, expansion and health.
//! The rpc logic lives in one file per concern; this file is the tonic service.

mod publish;
mod snapshots;
mod volumes;

pub(crate) use publish::check_context;

use csi_proto::Rpc;
use csi_proto::v1::controller_server::Controller;
use csi_proto::v1::controller_service_capability::{self, Rpc as CapRpc};
use csi_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::capabilities::{ControllerCapability, PluginService};
use crate::dispatch::Target;
use crate::plugin::MockPlugin;
use crate::services::Svc;

impl MockPlugin {
    pub(crate) fn has_controller_cap(&self, cap: ControllerCapability) -> bool {
        self.config().controller_caps.contains(&cap)
    }

    pub(crate) fn has_plugin_service(&self, service: PluginService) -> bool {
        self.config().plugin_caps.services.contains(&service)
    }

    pub(crate) fn controller_capabilities(&self) -> ControllerGetCapabilitiesResponse {
        ControllerGetCapabilitiesResponse {
            capabilities: self
                .config()
                .controller_caps
                .iter()
                .map(|cap| ControllerServiceCapability {
                    r#type: Some(controller_service_capability::Type::Rpc(CapRpc {
                        r#type: *cap as i32,
                    })),
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl Controller for Svc {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let name = request.get_ref().name.clone();
        let target = Target::snapshot("volume-name", &name).with_volume(&name);
        let scope = self.0.begin(Rpc::CreateVolume, &request, target).await?;
        let result = self.0.create_volume(request.into_inner());
        if let Ok(CreateVolumeResponse { volume: Some(v) }) = &result {
            scope.set_volume(&v.volume_id);
        }
        scope.finish(result)
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self.0.begin(Rpc::DeleteVolume, &request, target).await?;
        scope.finish(self.0.delete_volume(request.into_inner()))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let r = request.get_ref();
        let target = Target::volume(&r.volume_id).with_node(&r.node_id);
        let scope = self
            .0
            .begin(Rpc::ControllerPublishVolume, &request, target)
            .await?;
        scope.finish(self.0.controller_publish(request.into_inner()))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let r = request.get_ref();
        let target = Target::volume(&r.volume_id).with_node(&r.node_id);
        let scope = self
            .0
            .begin(Rpc::ControllerUnpublishVolume, &request, target)
            .await?;
        scope.finish(self.0.controller_unpublish(request.into_inner()))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::ValidateVolumeCapabilities, &request, target)
            .await?;
        scope.finish(self.0.validate_capabilities(request.into_inner()))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::ListVolumes, &request, Target::none())
            .await?;
        scope.finish(self.0.list_volumes(request.into_inner()))
    }

    async fn controller_list_volume_health(
        &self,
        request: Request<ControllerListVolumeHealthRequest>,
    ) -> Result<Response<ControllerListVolumeHealthResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::ControllerListVolumeHealth, &request, Target::none())
            .await?;
        scope.finish(self.0.controller_list_health(request.into_inner()))
    }

    async fn controller_get_volume_health(
        &self,
        request: Request<ControllerGetVolumeHealthRequest>,
    ) -> Result<Response<ControllerGetVolumeHealthResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::ControllerGetVolumeHealth, &request, target)
            .await?;
        scope.finish(self.0.controller_volume_health(request.into_inner()))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::GetCapacity, &request, Target::none())
            .await?;
        scope.finish(self.0.get_capacity(request.into_inner()))
    }

    async fn controller_get_capabilities(
        &self,
        request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::ControllerGetCapabilities, &request, Target::none())
            .await?;
        scope.finish(Ok(self.0.controller_capabilities()))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let r = request.get_ref();
        let target = Target::snapshot("snapshot-name", &r.name).with_volume(&r.source_volume_id);
        let scope = self.0.begin(Rpc::CreateSnapshot, &request, target).await?;
        scope.finish(self.0.create_snapshot(request.into_inner()))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let target = Target::snapshot("snapshot", &request.get_ref().snapshot_id);
        let scope = self.0.begin(Rpc::DeleteSnapshot, &request, target).await?;
        scope.finish(self.0.delete_snapshot(request.into_inner()))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().source_volume_id);
        let scope = self.0.begin(Rpc::ListSnapshots, &request, target).await?;
        scope.finish(self.0.list_snapshots(request.into_inner()))
    }

    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::GetSnapshot, &request, Target::none())
            .await?;
        scope.finish(self.0.get_snapshot(request.into_inner()))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::ControllerExpandVolume, &request, target)
            .await?;
        scope.finish(self.0.controller_expand(request.into_inner()))
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::ControllerGetVolume, &request, target)
            .await?;
        scope.finish(self.0.get_volume(request.into_inner()))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::ControllerModifyVolume, &request, target)
            .await?;
        scope.finish(self.0.modify_volume(request.into_inner()))
    }
}
