//! The Node service: every v1.13 node RPC.

use std::path::Path;

use csi_proto::v1 as pb;
use csi_proto::v1::node_client::NodeClient as Raw;
use csi_structs::{
    CapacityRange, ExternalVolumeId, FieldPath, NodeCapabilities, NodeExpansion, NodeInfo, Problem,
    PublishContext, Secrets, ValidationErrors, VolumeCapability, VolumeContext, VolumeStats,
};

use crate::convert;
use crate::error::{Error, ErrorKind};
use crate::service::{raw_rpc, service_client};
use crate::validate::CsiRequest;

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
        /// `NodeExpandVolume`, raw; [`expand`](Self::expand) takes domain values and answers
        /// the size as `u64`. FAILED_PRECONDITION (cannot grow while in use) is fatal.
        node_expand_volume, Raw<crate::channel::PluginChannel>,
        pb::NodeExpandVolumeRequest => pb::NodeExpandVolumeResponse
    );

    /// `NodeStageVolume` from domain values.
    ///
    /// The staging directory (`staging_target_path`) must exist before the call: the spec
    /// leaves creating it to the orchestrator, and a plugin may refuse a path that is not there.
    /// (The target of [`publish`](Self::publish) is the other way round: the plugin creates it,
    /// its parent must exist.)
    ///
    /// # Errors
    ///
    /// As [`node_stage_volume`](Self::node_stage_volume).
    pub async fn stage(&self, stage: &NodeStage<'_>) -> Result<(), Error> {
        let mut errs = ValidationErrors::new();
        let request = pb::NodeStageVolumeRequest {
            volume_id: stage.volume.as_str().to_owned(),
            publish_context: stage.publish_context.to_wire(),
            staging_target_path: wire_path(
                stage.staging_target_path,
                "staging_target_path",
                &mut errs,
            ),
            volume_capability: Some(stage.capability.into()),
            secrets: stage.secrets.to_wire(),
            volume_context: stage.volume_context.to_wire(),
        };
        self.refuse_bad_paths(&request, errs)?;
        self.node_stage_volume(request).await
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
        staging_target_path: &Path,
    ) -> Result<(), Error> {
        let mut errs = ValidationErrors::new();
        let request = pb::NodeUnstageVolumeRequest {
            volume_id: volume.as_str().to_owned(),
            staging_target_path: wire_path(staging_target_path, "staging_target_path", &mut errs),
        };
        self.refuse_bad_paths(&request, errs)?;
        self.node_unstage_volume(request).await
    }

    /// `NodePublishVolume` from domain values.
    ///
    /// # Errors
    ///
    /// As [`node_publish_volume`](Self::node_publish_volume).
    pub async fn publish(&self, publish: &NodePublish<'_>) -> Result<(), Error> {
        let mut errs = ValidationErrors::new();
        let request = pb::NodePublishVolumeRequest {
            volume_id: publish.volume.as_str().to_owned(),
            publish_context: publish.publish_context.to_wire(),
            staging_target_path: publish
                .staging_target_path
                .map(|p| wire_path(p, "staging_target_path", &mut errs))
                .unwrap_or_default(),
            target_path: wire_path(publish.target_path, "target_path", &mut errs),
            volume_capability: Some(publish.capability.into()),
            readonly: publish.readonly,
            secrets: publish.secrets.to_wire(),
            volume_context: publish.volume_context.to_wire(),
        };
        self.refuse_bad_paths(&request, errs)?;
        self.node_publish_volume(request).await
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
        target_path: &Path,
    ) -> Result<(), Error> {
        let mut errs = ValidationErrors::new();
        let request = pb::NodeUnpublishVolumeRequest {
            volume_id: volume.as_str().to_owned(),
            target_path: wire_path(target_path, "target_path", &mut errs),
        };
        self.refuse_bad_paths(&request, errs)?;
        self.node_unpublish_volume(request).await
    }

    /// `NodeExpandVolume` from domain values: grows the volume (its file system, say) at
    /// `volume_path` on this node, after the controller's expansion answered
    /// `node_expansion_required` (or alone, for a plugin that expands on the node only).
    /// The answer's size is checked: a negative one is an invalid response naming
    /// `capacity_bytes`, and 0 (the plugin did not say) is `None`.
    ///
    /// ```no_run
    /// # async fn run(client: csi_client::CsiClient) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::path::Path;
    /// use csi_client::NodeExpand;
    /// use csi_structs::{CapacityRange, ExternalVolumeId, Secrets};
    ///
    /// let volume = ExternalVolumeId::new("vol-1")?;
    /// let range = CapacityRange::at_least(20 << 30)?;
    /// let grown = client
    ///     .node()
    ///     .expand(&NodeExpand {
    ///         volume: &volume,
    ///         volume_path: Path::new("/var/lib/csi/pods/p1/vol-1"),
    ///         staging_target_path: None,
    ///         capacity_range: Some(&range),
    ///         capability: None,
    ///         secrets: &Secrets::default(),
    ///     })
    ///     .await?;
    /// println!("now {:?} bytes", grown.capacity_bytes);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`node_expand_volume`](Self::node_expand_volume); a path that is not UTF-8 is
    /// refused before sending.
    pub async fn expand(&self, expand: &NodeExpand<'_>) -> Result<NodeExpansion, Error> {
        let mut errs = ValidationErrors::new();
        let request = pb::NodeExpandVolumeRequest {
            volume_id: expand.volume.as_str().to_owned(),
            volume_path: wire_path(expand.volume_path, "volume_path", &mut errs),
            capacity_range: expand.capacity_range.map(Into::into),
            staging_target_path: expand
                .staging_target_path
                .map(|p| wire_path(p, "staging_target_path", &mut errs))
                .unwrap_or_default(),
            volume_capability: expand.capability.map(Into::into),
            secrets: expand.secrets.to_wire(),
        };
        self.refuse_bad_paths(&request, errs)?;
        self.caller
            .unary(
                &self.options,
                request,
                |ch, req| async move { Raw::new(ch).node_expand_volume(req).await },
                convert::wire,
            )
            .await
    }

    /// `NodeGetVolumeStats` of a volume published at `volume_path` (staged at
    /// `staging_target_path`, when the plugin stages): its usage in bytes and inodes, and its
    /// condition from a plugin with node `VOLUME_CONDITION`.
    ///
    /// # Errors
    ///
    /// As [`node_get_volume_stats`](Self::node_get_volume_stats); a path that is not UTF-8
    /// is refused before sending, and a negative number in the answer is an invalid response.
    pub async fn volume_stats(
        &self,
        volume: &ExternalVolumeId,
        volume_path: &Path,
        staging_target_path: Option<&Path>,
    ) -> Result<VolumeStats, Error> {
        let mut errs = ValidationErrors::new();
        let request = pb::NodeGetVolumeStatsRequest {
            volume_id: volume.as_str().to_owned(),
            volume_path: wire_path(volume_path, "volume_path", &mut errs),
            staging_target_path: staging_target_path
                .map(|p| wire_path(p, "staging_target_path", &mut errs))
                .unwrap_or_default(),
        };
        self.refuse_bad_paths(&request, errs)?;
        self.caller
            .unary(
                &self.options,
                request,
                |ch, req| async move { Raw::new(ch).node_get_volume_stats(req).await },
                convert::wire,
            )
            .await
    }

    /// The request's error when a path in it is not UTF-8 (nothing is sent).
    fn refuse_bad_paths<R: CsiRequest>(
        &self,
        request: &R,
        errs: ValidationErrors,
    ) -> Result<(), Error> {
        if errs.is_empty() {
            return Ok(());
        }
        Err(self
            .caller
            .refuse(request.context(), ErrorKind::InvalidRequest(errs)))
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
    /// Where to stage (absolute; no size limit beyond the OS's). The orchestrator creates
    /// this directory before the call; the plugin does not.
    pub staging_target_path: &'a Path,
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
    pub staging_target_path: Option<&'a Path>,
    /// Where to publish (the plugin creates it; its parent exists).
    pub target_path: &'a Path,
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

/// What [`NodeClient::expand`] sends: grow `volume`, published at `volume_path`.
#[derive(Clone, Copy, Debug)]
pub struct NodeExpand<'a> {
    /// The plugin's volume id.
    pub volume: &'a ExternalVolumeId,
    /// Where the volume is published (or staged, for a block volume staged only); absolute.
    pub volume_path: &'a Path,
    /// Where the volume was staged, when the plugin has `STAGE_UNSTAGE_VOLUME`.
    pub staging_target_path: Option<&'a Path>,
    /// The size wanted, usually the range the controller's expansion was asked for; `None`
    /// lets the plugin grow to the volume's size.
    pub capacity_range: Option<&'a CapacityRange>,
    /// How the volume is used, when known.
    pub capability: Option<&'a VolumeCapability>,
    /// Secrets for the plugin; never logged.
    pub secrets: &'a Secrets,
}

/// A node path as the wire carries it (a string); one that is not UTF-8 is named in `errs`
/// and sent as nothing (the request is refused before it is sent).
fn wire_path(path: &Path, field: &'static str, errs: &mut ValidationErrors) -> String {
    match path.to_str() {
        Some(path) => path.to_owned(),
        None => {
            errs.push(FieldPath::named(field), Problem::NotUtf8);
            String::new()
        }
    }
}
