//! The Node service: every v1.13 node RPC.

use csi_proto::v1 as pb;
use csi_proto::v1::node_client::NodeClient as Raw;
use csi_structs::{NodeCapabilities, NodeInfo};

use crate::convert;
use crate::error::Error;
use crate::service::{raw_rpc, service_client};

service_client!(
    /// Client of the Node service. Cheap to clone; shares the connection of the
    /// [`CsiClient`](crate::CsiClient) it came from.
    ///
    /// Unlike Nomad's mount calls, every node RPC runs under a deadline. A deadline or lost
    /// connection on stage/publish/unpublish/unstage/expand is
    /// [`Uncertain`](csi_structs::ErrorClass::Uncertain): the mount may exist; retry to
    /// completion or undo it.
    NodeClient
);

impl NodeClient {
    raw_rpc!(
        /// `NodeStageVolume`.
        node_stage_volume, Raw<tonic::transport::Channel>, pb::NodeStageVolumeRequest => ()
    );
    raw_rpc!(
        /// `NodeUnstageVolume`. NOT_FOUND is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
        node_unstage_volume, Raw<tonic::transport::Channel>, pb::NodeUnstageVolumeRequest => ()
    );
    raw_rpc!(
        /// `NodePublishVolume`.
        node_publish_volume, Raw<tonic::transport::Channel>, pb::NodePublishVolumeRequest => ()
    );
    raw_rpc!(
        /// `NodeUnpublishVolume`. NOT_FOUND is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
        node_unpublish_volume, Raw<tonic::transport::Channel>, pb::NodeUnpublishVolumeRequest => ()
    );
    raw_rpc!(
        /// `NodeGetVolumeStats`; negative usage numbers are invalid responses.
        node_get_volume_stats, Raw<tonic::transport::Channel>,
        pb::NodeGetVolumeStatsRequest => pb::NodeGetVolumeStatsResponse
    );
    raw_rpc!(
        /// `NodeGetVolumeHealth` (alpha).
        node_get_volume_health, Raw<tonic::transport::Channel>,
        pb::NodeGetVolumeHealthRequest => pb::NodeGetVolumeHealthResponse
    );
    raw_rpc!(
        /// `NodeGetStorageHealth` (alpha).
        node_get_storage_health, Raw<tonic::transport::Channel>,
        pb::NodeGetStorageHealthRequest => pb::NodeGetStorageHealthResponse
    );
    raw_rpc!(
        /// `NodeExpandVolume`. FAILED_PRECONDITION (cannot grow while in use) is fatal.
        node_expand_volume, Raw<tonic::transport::Channel>,
        pb::NodeExpandVolumeRequest => pb::NodeExpandVolumeResponse
    );

    /// `NodeGetCapabilities`. Unknown numbers are kept aside and ignored (spec §3.15).
    ///
    /// # Errors
    ///
    /// Any call failure.
    pub async fn node_get_capabilities(&self) -> Result<NodeCapabilities, Error> {
        self.caller
            .unary(
                &self.options,
                pb::NodeGetCapabilitiesRequest {},
                |ch, req| async move { Raw::new(ch).node_get_capabilities(req).await },
                |resp| Ok(NodeCapabilities::from(resp)),
            )
            .await
    }

    /// `NodeGetInfo`: the plugin's id for this node, its volume limit (`None` = no limit;
    /// the wire's 0) and its topology.
    ///
    /// # Errors
    ///
    /// Any call failure; an empty or oversized node id, a negative limit or a bad topology is
    /// an invalid response naming the field.
    pub async fn node_get_info(&self) -> Result<NodeInfo, Error> {
        self.caller
            .unary(
                &self.options,
                pb::NodeGetInfoRequest {},
                |ch, req| async move { Raw::new(ch).node_get_info(req).await },
                convert::wire,
            )
            .await
    }
}
