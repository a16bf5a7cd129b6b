//! The GroupController service: volume group snapshots.

use csi_proto::v1 as pb;
use csi_proto::v1::group_controller_client::GroupControllerClient as Raw;
use csi_structs::GroupControllerCapabilities;

use crate::convert;
use crate::error::Error;
use crate::service::{raw_rpc, service_client};

service_client!(
    /// Client of the GroupController service. Cheap to clone; shares the connection of the
    /// [`CsiClient`](crate::CsiClient) it came from.
    GroupControllerClient
);

impl GroupControllerClient {
    raw_rpc!(
        /// `CreateVolumeGroupSnapshot`; call again with the same `name` until `ready_to_use`.
        create_volume_group_snapshot, Raw<tonic::transport::Channel>,
        pb::CreateVolumeGroupSnapshotRequest => pb::CreateVolumeGroupSnapshotResponse
    );
    raw_rpc!(
        /// `DeleteVolumeGroupSnapshot`. NOT_FOUND is
        /// [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
        delete_volume_group_snapshot, Raw<tonic::transport::Channel>,
        pb::DeleteVolumeGroupSnapshotRequest => ()
    );
    raw_rpc!(
        /// `GetVolumeGroupSnapshot`.
        get_volume_group_snapshot, Raw<tonic::transport::Channel>,
        pb::GetVolumeGroupSnapshotRequest => pb::GetVolumeGroupSnapshotResponse
    );

    /// `GroupControllerGetCapabilities`.
    ///
    /// # Errors
    ///
    /// Any call failure.
    pub async fn group_controller_get_capabilities(
        &self,
    ) -> Result<GroupControllerCapabilities, Error> {
        self.caller
            .unary(
                &self.options,
                pb::GroupControllerGetCapabilitiesRequest {},
                |ch, req| async move { Raw::new(ch).group_controller_get_capabilities(req).await },
                |resp| Ok(convert::group_controller_capabilities(&resp)),
            )
            .await
    }
}
