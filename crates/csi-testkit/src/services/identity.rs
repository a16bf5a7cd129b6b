//! Identity: plugin info, plugin capabilities, Probe (with the readiness quirks).

use csi_proto::Rpc;
use csi_proto::v1::identity_server::Identity;
use csi_proto::v1::plugin_capability::{self, VolumeExpansion};
use csi_proto::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use crate::dispatch::Target;
use crate::quirks::ProbeAnswer;
use crate::services::Svc;

#[tonic::async_trait]
impl Identity for Svc {
    async fn get_plugin_info(
        &self,
        request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::GetPluginInfo, &request, Target::none())
            .await?;
        let config = self.0.config();
        scope.finish(Ok(GetPluginInfoResponse {
            name: config.name.clone(),
            vendor_version: config.vendor_version.clone(),
            manifest: config.manifest.clone().into_iter().collect(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let scope = self
            .0
            .begin(Rpc::GetPluginCapabilities, &request, Target::none())
            .await?;
        let caps = &self.0.config().plugin_caps;
        let mut capabilities: Vec<PluginCapability> = caps
            .services
            .iter()
            .map(|service| PluginCapability {
                r#type: Some(plugin_capability::Type::Service(
                    plugin_capability::Service {
                        r#type: *service as i32,
                    },
                )),
            })
            .collect();
        if let Some(expansion) = caps.expansion {
            capabilities.push(PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(VolumeExpansion {
                    r#type: expansion as i32,
                })),
            });
        }
        scope.finish(Ok(GetPluginCapabilitiesResponse { capabilities }))
    }

    async fn probe(
        &self,
        request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        let scope = self.0.begin(Rpc::Probe, &request, Target::none()).await?;
        let ready = match self.0.shared.lock().quirks.probe {
            ProbeAnswer::Ready => Some(true),
            ProbeAnswer::NotReady => Some(false),
            ProbeAnswer::Absent => None,
        };
        scope.finish(Ok(ProbeResponse { ready }))
    }
}
