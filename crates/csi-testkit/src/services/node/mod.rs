//! Node: staging and publishing with real directories, stats, expansion, info, health.
//!
//! Who creates what (csi-spec §3.13): the CO creates the staging directory, so the mock only
//! checks it exists; the mock creates the target (a directory for mount access, a file standing
//! in for the device node for block access) under a parent the CO created, and removes it on
//! unpublish. Nothing is mounted, so tests run unprivileged.

mod publish;
mod rules;
mod stage;
mod usage;

use csi_proto::Rpc;
use csi_proto::v1::node_server::Node;
use csi_proto::v1::*;
use tonic::{Request, Response, Status};

use crate::dispatch::Target;
use crate::services::Svc;
use crate::validate;

#[tonic::async_trait]
impl Node for Svc {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self.0.begin(Rpc::NodeStageVolume, &request, target).await?;
        scope.finish(self.0.node_stage(request.into_inner()))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodeUnstageVolume, &request, target)
            .await?;
        scope.finish(self.0.node_unstage(request.into_inner()))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodePublishVolume, &request, target)
            .await?;
        scope.finish(self.0.node_publish(request.into_inner()))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodeUnpublishVolume, &request, target)
            .await?;
        scope.finish(self.0.node_unpublish(request.into_inner()))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodeGetVolumeStats, &request, target)
            .await?;
        scope.finish(self.0.node_stats(request.into_inner()))
    }

    async fn node_get_volume_health(
        &self,
        request: Request<NodeGetVolumeHealthRequest>,
    ) -> Result<Response<NodeGetVolumeHealthResponse>, Status> {
        let target = Target::read_volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodeGetVolumeHealth, &request, target)
            .await?;
        scope.finish(self.0.node_volume_health(request.into_inner()))
    }

    async fn node_get_storage_health(
        &self,
        request: Request<NodeGetStorageHealthRequest>,
    ) -> Result<Response<NodeGetStorageHealthResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::NodeGetStorageHealth, &request, Target::none())
            .await?;
        let result = validate::secrets(&request.get_ref().secrets)
            .map(|()| NodeGetStorageHealthResponse::default());
        scope.finish(result)
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let target = Target::volume(&request.get_ref().volume_id);
        let scope = self
            .0
            .begin(Rpc::NodeExpandVolume, &request, target)
            .await?;
        scope.finish(self.0.node_expand(request.into_inner()))
    }

    async fn node_get_capabilities(
        &self,
        request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::NodeGetCapabilities, &request, Target::none())
            .await?;
        scope.finish(Ok(self.0.node_capabilities()))
    }

    async fn node_get_info(
        &self,
        request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::NodeGetInfo, &request, Target::none())
            .await?;
        scope.finish(Ok(self.0.node_info()))
    }
}
