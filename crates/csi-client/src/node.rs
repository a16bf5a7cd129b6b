//! The Node service: every v1.13 node RPC.

use csi_proto::v1 as pb;
use csi_proto::v1::node_client::NodeClient as Raw;
use csi_structs::{
    ExternalVolumeId, NodeCapabilities, NodeInfo, PublishContext, Secrets, VolumeCapability,
    VolumeContext,
};

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
        node_stage_volume, Raw<crate::channel::PluginChannel>, pb::NodeStageVolumeRequest => ()
    );
    raw_rpc!(
        /// `NodeUnstageVolume`. NOT_FOUND is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
        node_unstage_volume, Raw<crate::channel::PluginChannel>, pb::NodeUnstageVolumeRequest => ()
    );
    raw_rpc!(
        /// `NodePublishVolume`.
        node_publish_volume, Raw<crate::channel::PluginChannel>, pb::NodePublishVolumeRequest => ()
    );
    raw_rpc!(
        /// `NodeUnpublishVolume`. NOT_FOUND is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
        node_unpublish_volume, Raw<crate::channel::PluginChannel>, pb::NodeUnpublishVolumeRequest => ()
    );
    raw_rpc!(
        /// `NodeGetVolumeStats`; negative usage numbers are invalid responses.
        node_get_volume_stats, Raw<crate::channel::PluginChannel>,
        pb::NodeGetVolumeStatsRequest => pb::NodeGetVolumeStatsResponse
    );
    raw_rpc!(
        /// `NodeGetVolumeHealth` (alpha).
        node_get_volume_health, Raw<crate::channel::PluginChannel>,
        pb::NodeGetVolumeHealthRequest => pb::NodeGetVolumeHealthResponse
    );
    raw_rpc!(
        /// `NodeGetStorageHealth` (alpha).
        node_get_storage_health, Raw<crate::channel::PluginChannel>,
        pb::NodeGetStorageHealthRequest => pb::NodeGetStorageHealthResponse
    );
    raw_rpc!(
        /// `NodeExpandVolume`. FAILED_PRECONDITION (cannot grow while in use) is fatal.
        node_expand_volume, Raw<crate::channel::PluginChannel>,
        pb::NodeExpandVolumeRequest => pb::NodeExpandVolumeResponse
    );

    /// `NodeStageVolume` from domain values.
    ///
    /// # Errors
    ///
    /// As [`node_stage_volume`](Self::node_stage_volume).
    pub async fn stage(&self, stage: &NodeStage<'_>) -> Result<(), Error> {
        self.node_stage_volume(pb::NodeStageVolumeRequest {
            volume_id: stage.volume.as_str().to_owned(),
            publish_context: stage.publish_context.to_wire(),
            staging_target_path: stage.staging_target_path.to_owned(),
            volume_capability: Some(stage.capability.into()),
            secrets: stage.secrets.to_wire(),
            volume_context: stage.volume_context.to_wire(),
        })
        .await
    }

    /// `NodeUnstageVolume` from domain values. NOT_FOUND is
    /// [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
    ///
    /// # Errors
    ///
    /// As [`node_unstage_volume`](Self::node_unstage_volume).
    pub async fn unstage(
        &self,
        volume: &ExternalVolumeId,
        staging_target_path: &str,
    ) -> Result<(), Error> {
        self.node_unstage_volume(pb::NodeUnstageVolumeRequest {
            volume_id: volume.as_str().to_owned(),
            staging_target_path: staging_target_path.to_owned(),
        })
        .await
    }

    /// `NodePublishVolume` from domain values.
    ///
    /// # Errors
    ///
    /// As [`node_publish_volume`](Self::node_publish_volume).
    pub async fn publish(&self, publish: &NodePublish<'_>) -> Result<(), Error> {
        self.node_publish_volume(pb::NodePublishVolumeRequest {
            volume_id: publish.volume.as_str().to_owned(),
            publish_context: publish.publish_context.to_wire(),
            staging_target_path: publish.staging_target_path.unwrap_or_default().to_owned(),
            target_path: publish.target_path.to_owned(),
            volume_capability: Some(publish.capability.into()),
            readonly: publish.readonly,
            secrets: publish.secrets.to_wire(),
            volume_context: publish.volume_context.to_wire(),
        })
        .await
    }

    /// `NodeUnpublishVolume` from domain values. NOT_FOUND is
    /// [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
    ///
    /// # Errors
    ///
    /// As [`node_unpublish_volume`](Self::node_unpublish_volume).
    pub async fn unpublish(
        &self,
        volume: &ExternalVolumeId,
        target_path: &str,
    ) -> Result<(), Error> {
        self.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
            volume_id: volume.as_str().to_owned(),
            target_path: target_path.to_owned(),
        })
        .await
    }

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

/// What [`NodeClient::stage`] sends: stage `volume` at `staging_target_path` (a directory the
/// orchestrator created).
#[derive(Clone, Copy, Debug)]
pub struct NodeStage<'a> {
    /// The plugin's volume id.
    pub volume: &'a ExternalVolumeId,
    /// Where to stage (absolute; no size limit beyond the OS's).
    pub staging_target_path: &'a str,
    /// How the volume will be used.
    pub capability: &'a VolumeCapability,
    /// What `ControllerPublishVolume` returned for this node (empty without controller publish).
    pub publish_context: &'a PublishContext,
    /// The volume's context from `CreateVolume`.
    pub volume_context: &'a VolumeContext,
    /// Secrets for the plugin; never logged.
    pub secrets: &'a Secrets,
}

/// What [`NodeClient::publish`] sends: publish `volume` at `target_path`.
#[derive(Clone, Copy, Debug)]
pub struct NodePublish<'a> {
    /// The plugin's volume id.
    pub volume: &'a ExternalVolumeId,
    /// Where the volume was staged; required when the plugin has `STAGE_UNSTAGE_VOLUME`.
    pub staging_target_path: Option<&'a str>,
    /// Where to publish (the plugin creates it; its parent exists).
    pub target_path: &'a str,
    /// How the volume will be used.
    pub capability: &'a VolumeCapability,
    /// Publish read-only.
    pub readonly: bool,
    /// What `ControllerPublishVolume` returned for this node (empty without controller publish).
    pub publish_context: &'a PublishContext,
    /// The volume's context from `CreateVolume`.
    pub volume_context: &'a VolumeContext,
    /// Secrets for the plugin; never logged.
    pub secrets: &'a Secrets,
}
