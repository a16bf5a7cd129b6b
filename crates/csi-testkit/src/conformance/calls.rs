//! Timed calls to every unary RPC, typed, plus [`Call`] for table-driven checks.

use std::future::Future;
use std::time::Duration;

use csi_proto::Rpc;
use csi_proto::v1;
use tonic::Code;

use super::ctx::Ctx;

/// A call that did not answer OK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The plugin answered with a non-OK status; `has_details` when it carried
    /// `status.details`, which the spec requires to be empty.
    Status {
        rpc: Rpc,
        code: Code,
        message: String,
        has_details: bool,
    },
    /// No answer within the per-call deadline.
    TimedOut { rpc: Rpc, after: Duration },
}

impl CallError {
    /// The status code, when the plugin answered.
    pub(crate) fn code(&self) -> Option<Code> {
        match self {
            CallError::Status { code, .. } => Some(*code),
            CallError::TimedOut { .. } => None,
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Status {
                rpc, code, message, ..
            } => {
                write!(f, "{} answered {}", rpc.name(), code_name(*code))?;
                if !message.is_empty() {
                    write!(f, " ({message})")?;
                }
                Ok(())
            }
            CallError::TimedOut { rpc, after } => {
                write!(f, "{} did not answer within {after:?}", rpc.name())
            }
        }
    }
}

pub(crate) use crate::fault_spec::code_name;

/// `Ok(())` when `result` is the error `want` with a message and no details (spec §3.7),
/// else a sentence saying what came instead.
pub(crate) fn expect_code<T>(
    result: Result<T, CallError>,
    rpc: Rpc,
    want: Code,
    case: &str,
) -> Result<(), String> {
    let name = code_name(want);
    match result {
        Ok(_) => Err(format!(
            "{case}: {} answered OK, expected {name}",
            rpc.name()
        )),
        Err(CallError::Status {
            code,
            message,
            has_details,
            ..
        }) if code == want => {
            if message.is_empty() {
                Err(format!(
                    "{case}: {} answered {name} without a status message (required for every error)",
                    rpc.name()
                ))
            } else if has_details {
                Err(format!(
                    "{case}: {} answered {name} with status details (the spec requires them empty)",
                    rpc.name()
                ))
            } else {
                Ok(())
            }
        }
        Err(err) => Err(format!("{case}: {err}, expected {name}")),
    }
}

impl Ctx {
    /// Runs one call under the per-call deadline (also sent to the plugin as `grpc-timeout`).
    async fn timed<T>(
        &self,
        rpc: Rpc,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CallError> {
        let after = self.options.timeout;
        match tokio::time::timeout(after, call).await {
            Err(_elapsed) => Err(CallError::TimedOut { rpc, after }),
            Ok(Err(status)) => Err(CallError::Status {
                rpc,
                code: status.code(),
                message: status.message().to_owned(),
                has_details: !status.details().is_empty(),
            }),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    fn request<M>(&self, message: M) -> tonic::Request<M> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.options.timeout);
        request
    }
}

macro_rules! unary_rpcs {
    ($( $variant:ident => $client:ident . $method:ident ( $req:ident ) -> $resp:ident ; )*) => {
        /// A request to one unary RPC; the variant names the RPC.
        #[derive(Clone, Debug)]
        #[allow(dead_code, reason = "one variant per unary RPC; not every RPC appears in a table-driven check")]
        pub(crate) enum Call {
            $( $variant(v1::$req), )*
        }

        impl Ctx {
            $(
                pub(crate) async fn $method(&self, message: v1::$req) -> Result<v1::$resp, CallError> {
                    let mut client = self.$client.clone();
                    let request = self.request(message);
                    self.timed(Rpc::$variant, client.$method(request)).await
                }
            )*

            /// Sends any request and keeps only whether it succeeded.
            pub(crate) async fn send(&self, call: Call) -> Result<(), CallError> {
                match call {
                    $( Call::$variant(message) => self.$method(message).await.map(drop), )*
                }
            }
        }
    };
}

unary_rpcs! {
    GetPluginInfo => identity.get_plugin_info(GetPluginInfoRequest) -> GetPluginInfoResponse;
    GetPluginCapabilities => identity.get_plugin_capabilities(GetPluginCapabilitiesRequest) -> GetPluginCapabilitiesResponse;
    Probe => identity.probe(ProbeRequest) -> ProbeResponse;
    CreateVolume => controller.create_volume(CreateVolumeRequest) -> CreateVolumeResponse;
    DeleteVolume => controller.delete_volume(DeleteVolumeRequest) -> DeleteVolumeResponse;
    ControllerPublishVolume => controller.controller_publish_volume(ControllerPublishVolumeRequest) -> ControllerPublishVolumeResponse;
    ControllerUnpublishVolume => controller.controller_unpublish_volume(ControllerUnpublishVolumeRequest) -> ControllerUnpublishVolumeResponse;
    ValidateVolumeCapabilities => controller.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse;
    ListVolumes => controller.list_volumes(ListVolumesRequest) -> ListVolumesResponse;
    ControllerListVolumeHealth => controller.controller_list_volume_health(ControllerListVolumeHealthRequest) -> ControllerListVolumeHealthResponse;
    ControllerGetVolumeHealth => controller.controller_get_volume_health(ControllerGetVolumeHealthRequest) -> ControllerGetVolumeHealthResponse;
    GetCapacity => controller.get_capacity(GetCapacityRequest) -> GetCapacityResponse;
    ControllerGetCapabilities => controller.controller_get_capabilities(ControllerGetCapabilitiesRequest) -> ControllerGetCapabilitiesResponse;
    CreateSnapshot => controller.create_snapshot(CreateSnapshotRequest) -> CreateSnapshotResponse;
    DeleteSnapshot => controller.delete_snapshot(DeleteSnapshotRequest) -> DeleteSnapshotResponse;
    ListSnapshots => controller.list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse;
    GetSnapshot => controller.get_snapshot(GetSnapshotRequest) -> GetSnapshotResponse;
    ControllerExpandVolume => controller.controller_expand_volume(ControllerExpandVolumeRequest) -> ControllerExpandVolumeResponse;
    ControllerGetVolume => controller.controller_get_volume(ControllerGetVolumeRequest) -> ControllerGetVolumeResponse;
    ControllerModifyVolume => controller.controller_modify_volume(ControllerModifyVolumeRequest) -> ControllerModifyVolumeResponse;
    GroupControllerGetCapabilities => group.group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest) -> GroupControllerGetCapabilitiesResponse;
    CreateVolumeGroupSnapshot => group.create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest) -> CreateVolumeGroupSnapshotResponse;
    DeleteVolumeGroupSnapshot => group.delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest) -> DeleteVolumeGroupSnapshotResponse;
    GetVolumeGroupSnapshot => group.get_volume_group_snapshot(GetVolumeGroupSnapshotRequest) -> GetVolumeGroupSnapshotResponse;
    NodeStageVolume => node.node_stage_volume(NodeStageVolumeRequest) -> NodeStageVolumeResponse;
    NodeUnstageVolume => node.node_unstage_volume(NodeUnstageVolumeRequest) -> NodeUnstageVolumeResponse;
    NodePublishVolume => node.node_publish_volume(NodePublishVolumeRequest) -> NodePublishVolumeResponse;
    NodeUnpublishVolume => node.node_unpublish_volume(NodeUnpublishVolumeRequest) -> NodeUnpublishVolumeResponse;
    NodeGetVolumeStats => node.node_get_volume_stats(NodeGetVolumeStatsRequest) -> NodeGetVolumeStatsResponse;
    NodeGetVolumeHealth => node.node_get_volume_health(NodeGetVolumeHealthRequest) -> NodeGetVolumeHealthResponse;
    NodeGetStorageHealth => node.node_get_storage_health(NodeGetStorageHealthRequest) -> NodeGetStorageHealthResponse;
    NodeExpandVolume => node.node_expand_volume(NodeExpandVolumeRequest) -> NodeExpandVolumeResponse;
    NodeGetCapabilities => node.node_get_capabilities(NodeGetCapabilitiesRequest) -> NodeGetCapabilitiesResponse;
    NodeGetInfo => node.node_get_info(NodeGetInfoRequest) -> NodeGetInfoResponse;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code, message: &str, has_details: bool) -> Result<(), CallError> {
        Err(CallError::Status {
            rpc: Rpc::DeleteVolume,
            code,
            message: message.into(),
            has_details,
        })
    }

    #[test]
    fn the_expected_code_needs_a_message_and_no_details() {
        let want = Code::InvalidArgument;
        let rpc = Rpc::DeleteVolume;
        assert_eq!(
            expect_code(status(want, "volume_id is required", false), rpc, want, "c"),
            Ok(())
        );
        let silent = expect_code(status(want, "", false), rpc, want, "c").unwrap_err();
        assert!(silent.contains("without a status message"), "{silent}");
        let detailed = expect_code(status(want, "m", true), rpc, want, "c").unwrap_err();
        assert!(detailed.contains("status details"), "{detailed}");
        let wrong = expect_code(
            status(Code::NotFound, "m", false),
            rpc,
            want,
            "without volume_id",
        )
        .unwrap_err();
        assert_eq!(
            wrong,
            "without volume_id: DeleteVolume answered NOT_FOUND (m), expected INVALID_ARGUMENT"
        );
        let ok = expect_code(Ok(()), rpc, want, "c").unwrap_err();
        assert_eq!(ok, "c: DeleteVolume answered OK, expected INVALID_ARGUMENT");
    }
}
