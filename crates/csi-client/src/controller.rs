//! The Controller service: every v1.13 controller RPC.

use std::future::Future;

use csi_proto::v1 as pb;
use csi_proto::v1::controller_client::ControllerClient as Raw;
use csi_structs::confirm::{AskedCapabilities, ValidationResponse, confirm};
use csi_structs::{
    ConfirmPolicy, Confirmation, ControllerCapabilities, ErrorClass, ExternalVolumeId,
    PluginNodeId, PublishContext, Secrets, Snapshot, Volume, VolumeCapability, VolumeContext,
    VolumeSpec,
};

use crate::convert;
use crate::error::Error;
use crate::paging;
use crate::policy::Backoff;
use crate::service::{raw_rpc, service_client, typed_rpc};

/// Most rounds of `CreateVolume` [`undo_create_with`] sends to learn the id of a volume
/// whose creation was uncertain (each round is a whole call, retried per its policy).
pub const UNDO_CREATE_ROUNDS: u32 = 3;

/// The undo of a `CreateVolume` whose outcome is uncertain, over any way of calling the
/// plugin (csi-client's [`ControllerClient::undo_create`], or a composer's routed calls).
///
/// `create` sends the same `CreateVolume` again (same name, same parameters); it is called
/// until it succeeds, at most [`UNDO_CREATE_ROUNDS`] times, with `backoff`'s pauses between
/// rounds, and only while its failure is retryable by `class_of` (retry, retry elsewhere,
/// uncertain). Then `delete` removes the volume it returned; a failure `class_of` calls
/// [`AlreadyDone`](ErrorClass::AlreadyDone) counts as deleted. Returns what `create`
/// returned.
///
/// # Errors
///
/// The last `create` error, or the `delete` error: a volume of that name may be left behind.
pub async fn undo_create_with<V, E, C, CF, D, DF>(
    backoff: Backoff,
    class_of: impl Fn(&E) -> ErrorClass,
    mut create: C,
    delete: D,
) -> Result<V, E>
where
    C: FnMut() -> CF,
    CF: Future<Output = Result<V, E>>,
    D: FnOnce(&V) -> DF,
    DF: Future<Output = Result<(), E>>,
{
    let mut pauses = backoff.delays(UNDO_CREATE_ROUNDS.saturating_sub(1));
    let created = loop {
        match create().await {
            Ok(created) => break created,
            Err(e) if class_of(&e).is_retryable() => match pauses.next() {
                Some(pause) => tokio::time::sleep(pause).await,
                None => return Err(e),
            },
            Err(e) => return Err(e),
        }
    };
    match delete(&created).await {
        Err(e) if class_of(&e) != ErrorClass::AlreadyDone => Err(e),
        _ => Ok(created),
    }
}

service_client!(
    /// Client of the Controller service. Cheap to clone; shares the connection of the
    /// [`CsiClient`](crate::CsiClient) it came from.
    ///
    /// Mutations (create, delete, publish, unpublish, expand, modify, snapshots) run under
    /// long deadlines and are retried on transient failures: the spec requires them to be
    /// idempotent. Errors carry the volume (and node) the request named.
    ControllerClient
);

impl ControllerClient {
    typed_rpc!(
        /// `CreateVolume`. The answer must carry a volume with a non-empty id and a
        /// non-negative capacity (0 = unknown becomes `None`). A deadline or lost connection
        /// is [`Uncertain`](csi_structs::ErrorClass::Uncertain): call again with the same
        /// `name` to learn the outcome.
        create_volume, Raw<crate::channel::PluginChannel>, pb::CreateVolumeRequest => Volume, convert::wire
    );
    raw_rpc!(
        /// `DeleteVolume`. NOT_FOUND is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
        delete_volume, Raw<crate::channel::PluginChannel>, pb::DeleteVolumeRequest => ()
    );
    typed_rpc!(
        /// `ControllerPublishVolume`; the returned `publish_context` goes to the node calls.
        controller_publish_volume, Raw<crate::channel::PluginChannel>,
        pb::ControllerPublishVolumeRequest => PublishContext, convert::wire
    );
    raw_rpc!(
        /// `ControllerUnpublishVolume` (an empty `node_id` means every node). NOT_FOUND is
        /// [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
        controller_unpublish_volume, Raw<crate::channel::PluginChannel>,
        pb::ControllerUnpublishVolumeRequest => ()
    );
    raw_rpc!(
        /// `ListVolumes`, one page. ABORTED (bad `starting_token`) is fatal: restart the listing.
        list_volumes, Raw<crate::channel::PluginChannel>, pb::ListVolumesRequest => pb::ListVolumesResponse
    );
    raw_rpc!(
        /// `ControllerListVolumeHealth` (alpha), one page.
        controller_list_volume_health, Raw<crate::channel::PluginChannel>,
        pb::ControllerListVolumeHealthRequest => pb::ControllerListVolumeHealthResponse
    );
    raw_rpc!(
        /// `ControllerGetVolumeHealth` (alpha).
        controller_get_volume_health, Raw<crate::channel::PluginChannel>,
        pb::ControllerGetVolumeHealthRequest => pb::ControllerGetVolumeHealthResponse
    );
    raw_rpc!(
        /// `GetCapacity`; negative capacities are invalid responses.
        get_capacity, Raw<crate::channel::PluginChannel>, pb::GetCapacityRequest => pb::GetCapacityResponse
    );
    typed_rpc!(
        /// `CreateSnapshot`; call again with the same `name` until `ready_to_use`.
        create_snapshot, Raw<crate::channel::PluginChannel>, pb::CreateSnapshotRequest => Snapshot, convert::wire
    );
    raw_rpc!(
        /// `DeleteSnapshot`. NOT_FOUND is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
        delete_snapshot, Raw<crate::channel::PluginChannel>, pb::DeleteSnapshotRequest => ()
    );
    raw_rpc!(
        /// `ListSnapshots`, one page.
        list_snapshots, Raw<crate::channel::PluginChannel>, pb::ListSnapshotsRequest => pb::ListSnapshotsResponse
    );
    typed_rpc!(
        /// `GetSnapshot` (alpha).
        get_snapshot, Raw<crate::channel::PluginChannel>, pb::GetSnapshotRequest => Snapshot, convert::wire
    );
    raw_rpc!(
        /// `ControllerExpandVolume`.
        controller_expand_volume, Raw<crate::channel::PluginChannel>,
        pb::ControllerExpandVolumeRequest => pb::ControllerExpandVolumeResponse
    );
    raw_rpc!(
        /// `ControllerGetVolume` (alpha).
        controller_get_volume, Raw<crate::channel::PluginChannel>,
        pb::ControllerGetVolumeRequest => pb::ControllerGetVolumeResponse
    );
    raw_rpc!(
        /// `ControllerModifyVolume`.
        controller_modify_volume, Raw<crate::channel::PluginChannel>, pb::ControllerModifyVolumeRequest => ()
    );

    /// `ListVolumes`, every page: follows `next_token` from `request`'s `starting_token` until
    /// the plugin ends the listing (see [`paging`]: each page is retried on its
    /// own, a repeated token or a listing past [`MAX_PAGES`](crate::paging::MAX_PAGES) is an
    /// invalid response, and ABORTED on a later page lists again from the start).
    ///
    /// # Errors
    ///
    /// The first page call that failed, or the invalid response that ended the listing.
    pub async fn list_all_volumes(
        &self,
        request: pb::ListVolumesRequest,
    ) -> Result<Vec<pb::list_volumes_response::Entry>, Error> {
        paging::every_page(request, paging::MAX_PAGES, |req| self.list_volumes(req)).await
    }

    /// `ListSnapshots`, every page (as [`list_all_volumes`](Self::list_all_volumes)).
    ///
    /// # Errors
    ///
    /// The first page call that failed, or the invalid response that ended the listing.
    pub async fn list_all_snapshots(
        &self,
        request: pb::ListSnapshotsRequest,
    ) -> Result<Vec<pb::list_snapshots_response::Entry>, Error> {
        paging::every_page(request, paging::MAX_PAGES, |req| self.list_snapshots(req)).await
    }

    /// `ControllerListVolumeHealth` (alpha), every page (as
    /// [`list_all_volumes`](Self::list_all_volumes)).
    ///
    /// # Errors
    ///
    /// The first page call that failed, or the invalid response that ended the listing.
    pub async fn controller_list_all_volume_health(
        &self,
        request: pb::ControllerListVolumeHealthRequest,
    ) -> Result<Vec<pb::VolumeHealth>, Error> {
        paging::every_page(request, paging::MAX_PAGES, |req| {
            self.controller_list_volume_health(req)
        })
        .await
    }

    /// `CreateVolume` from the orchestrator's volume spec (the request is
    /// [`CreateVolumeRequest::from(spec)`](pb::CreateVolumeRequest): its `name` is the
    /// volume's id, so calling again after an uncertain answer finds the same volume). Record
    /// the answer with [`RegisteredVolume::record_created`](csi_structs::RegisteredVolume::record_created).
    ///
    /// # Errors
    ///
    /// As [`create_volume`](Self::create_volume).
    pub async fn create(&self, spec: &VolumeSpec) -> Result<Volume, Error> {
        self.create_volume(spec.into()).await
    }

    /// Undoes a `CreateVolume` whose outcome is uncertain (a deadline, a lost connection, an
    /// answer that could not be used): the volume may exist, and nobody knows its id.
    ///
    /// CSI deletes a volume by id only, but `CreateVolume` is idempotent by name: sent again
    /// with the same `name` and parameters it answers with the volume it already created, or
    /// creates it now. So this sends `request` again until an answer is usable, then deletes
    /// the volume it names with `delete_secrets` (see [`undo_create_with`] for the rounds).
    /// Returns the id deleted.
    ///
    /// Record `request.name` before calling this: if it fails, a volume of that name may be
    /// left behind, and this is the call that removes it.
    ///
    /// # Errors
    ///
    /// The `CreateVolume` error of the last round, or the `DeleteVolume` error. Either way a
    /// volume named `request.name` may be left behind.
    pub async fn undo_create(
        &self,
        request: pb::CreateVolumeRequest,
        delete_secrets: &Secrets,
    ) -> Result<ExternalVolumeId, Error> {
        let backoff = self
            .caller
            .policies()
            .get(csi_proto::Rpc::CreateVolume)
            .with_options(&self.options)
            .backoff;
        let volume = undo_create_with(
            backoff,
            Error::class,
            || self.create_volume(request.clone()),
            |volume: &Volume| {
                let id = volume.volume_id.clone();
                async move { self.delete(&id, delete_secrets).await }
            },
        )
        .await?;
        Ok(volume.volume_id)
    }

    /// `ControllerPublishVolume` from domain values: makes `volume` usable on `node` (the id
    /// the node's `NodeGetInfo` returned) with `capability`.
    ///
    /// # Errors
    ///
    /// As [`controller_publish_volume`](Self::controller_publish_volume).
    pub async fn publish(
        &self,
        volume: &ExternalVolumeId,
        node: &PluginNodeId,
        capability: &VolumeCapability,
        readonly: bool,
        volume_context: &VolumeContext,
        secrets: &Secrets,
    ) -> Result<PublishContext, Error> {
        self.controller_publish_volume(pb::ControllerPublishVolumeRequest {
            volume_id: volume.as_str().to_owned(),
            node_id: node.as_str().to_owned(),
            volume_capability: Some(capability.into()),
            readonly,
            secrets: secrets.to_wire(),
            volume_context: volume_context.to_wire(),
        })
        .await
    }

    /// `ControllerUnpublishVolume` from domain values; `node: None` unpublishes from every
    /// node. NOT_FOUND is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
    ///
    /// # Errors
    ///
    /// As [`controller_unpublish_volume`](Self::controller_unpublish_volume).
    pub async fn unpublish(
        &self,
        volume: &ExternalVolumeId,
        node: Option<&PluginNodeId>,
        secrets: &Secrets,
    ) -> Result<(), Error> {
        self.controller_unpublish_volume(pb::ControllerUnpublishVolumeRequest {
            volume_id: volume.as_str().to_owned(),
            node_id: node.map(|n| n.as_str().to_owned()).unwrap_or_default(),
            secrets: secrets.to_wire(),
        })
        .await
    }

    /// `DeleteVolume` from domain values. NOT_FOUND is
    /// [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
    ///
    /// # Errors
    ///
    /// As [`delete_volume`](Self::delete_volume).
    pub async fn delete(&self, volume: &ExternalVolumeId, secrets: &Secrets) -> Result<(), Error> {
        self.delete_volume(pb::DeleteVolumeRequest {
            volume_id: volume.as_str().to_owned(),
            secrets: secrets.to_wire(),
        })
        .await
    }

    /// `ValidateVolumeCapabilities` through `csi-structs`' confirmation (spec §3.10): the
    /// plugin's `confirmed` is compared field by field with what was asked. The answer is
    /// [`Confirmation::Confirmed`], [`Confirmation::AcceptedUnconfirmed`] (no `confirmed`,
    /// accepted only under [`ConfirmPolicy::Lenient`]), or [`Confirmation::NotConfirmed`]
    /// with every mismatch, each naming its field, and the plugin's message.
    ///
    /// # Errors
    ///
    /// Any call failure; NOT_FOUND (no such volume) is fatal. A "not confirmed" answer is
    /// not an error.
    pub async fn validate_volume_capabilities(
        &self,
        volume_id: &ExternalVolumeId,
        asked: &AskedCapabilities,
        secrets: &Secrets,
        policy: ConfirmPolicy,
    ) -> Result<Confirmation, Error> {
        let request = asked.to_request(volume_id, secrets);
        self.caller
            .unary(
                &self.options,
                request,
                |ch, req| async move { Raw::new(ch).validate_volume_capabilities(req).await },
                |resp: pb::ValidateVolumeCapabilitiesResponse| {
                    let answer = ValidationResponse::try_from(&resp).map_err(convert::invalid)?;
                    Ok(confirm(asked, &answer, policy))
                },
            )
            .await
    }

    /// `ValidateVolumeCapabilities`, raw: the caller compares `confirmed` with its request
    /// itself (spec §3.10).
    ///
    /// # Errors
    ///
    /// An [`Error`] with the RPC's class; NOT_FOUND (no such volume) is fatal.
    pub async fn validate_volume_capabilities_raw(
        &self,
        request: pb::ValidateVolumeCapabilitiesRequest,
    ) -> Result<pb::ValidateVolumeCapabilitiesResponse, Error> {
        self.caller
            .unary(
                &self.options,
                request,
                |ch, req| async move { Raw::new(ch).validate_volume_capabilities(req).await },
                Ok,
            )
            .await
    }

    /// `ControllerGetCapabilities`: what the controller advertises. Unknown numbers are kept
    /// aside and ignored (spec §3.15).
    ///
    /// # Errors
    ///
    /// Any call failure.
    pub async fn controller_get_capabilities(&self) -> Result<ControllerCapabilities, Error> {
        self.caller
            .unary(
                &self.options,
                pb::ControllerGetCapabilitiesRequest {},
                |ch, req| async move { Raw::new(ch).controller_get_capabilities(req).await },
                |resp| Ok(ControllerCapabilities::from(resp)),
            )
            .await
    }
}
