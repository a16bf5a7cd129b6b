//! The Controller service: every v1.13 controller RPC.

use std::future::Future;

use csi_proto::v1 as pb;
use csi_proto::v1::controller_client::ControllerClient as Raw;
use csi_structs::confirm::{AskedCapabilities, ValidationResponse, confirm};
use csi_structs::{
    CapacityRange, ConfirmPolicy, Confirmation, ControllerCapabilities, ControllerExpansion,
    ErrorClass, ExternalVolumeId, FieldPath, Parameters, PluginNodeId, Problem, PublishContext,
    Secrets, Snapshot, SnapshotId, ValidationErrors, Volume, VolumeCapability, VolumeContext,
    VolumeSpec, VolumeWithStatus,
};

use crate::convert;
use crate::error::{Error, ErrorKind, ResponseError};
use crate::paging;
use crate::policy::{Backoff, Failure, classify_failure};
use crate::service::{raw_rpc, service_client, typed_rpc};
use crate::validate::CsiRequest;

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
        /// `CreateSnapshot` from a raw request, for what [`create_snapshot`](Self::create_snapshot)
        /// does not send (the alpha `accessibility_requirements`); call again with the same
        /// `name` until `ready_to_use`.
        create_snapshot_raw = create_snapshot, Raw<crate::channel::PluginChannel>,
        pb::CreateSnapshotRequest => Snapshot, convert::wire
    );
    raw_rpc!(
        /// `DeleteSnapshot` from a raw request; [`delete_snapshot`](Self::delete_snapshot)
        /// takes domain values. NOT_FOUND is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone).
        delete_snapshot_raw = delete_snapshot, Raw<crate::channel::PluginChannel>,
        pb::DeleteSnapshotRequest => ()
    );
    raw_rpc!(
        /// `ListSnapshots`, one page, raw; [`list_snapshots_page`](Self::list_snapshots_page)
        /// answers csi-structs snapshots.
        list_snapshots, Raw<crate::channel::PluginChannel>, pb::ListSnapshotsRequest => pb::ListSnapshotsResponse
    );
    typed_rpc!(
        /// `GetSnapshot` (alpha).
        get_snapshot, Raw<crate::channel::PluginChannel>, pb::GetSnapshotRequest => Snapshot, convert::wire
    );
    raw_rpc!(
        /// `ControllerExpandVolume`, raw; [`expand`](Self::expand) takes domain values and
        /// answers the size as `u64`.
        controller_expand_volume, Raw<crate::channel::PluginChannel>,
        pb::ControllerExpandVolumeRequest => pb::ControllerExpandVolumeResponse
    );
    raw_rpc!(
        /// `ControllerGetVolume` (alpha), raw; [`get_volume`](Self::get_volume) answers
        /// domain values.
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

    /// `ListVolumes`, every page (as [`list_all_volumes`](Self::list_all_volumes)), as
    /// csi-structs values: each entry's volume with its status, the plugin's ids of the nodes
    /// it is published to and its condition. Each entry is converted and checked as
    /// [`get_volume`](Self::get_volume)'s answer is (a ListVolumes entry has the same `volume`
    /// and `status`), in the plugin's order.
    ///
    /// `max_entries` is the most entries the plugin should put in one page (0: as many as it
    /// chooses; more than `i32::MAX` asks for `i32::MAX`); the listing is complete either way.
    ///
    /// An entry without `status` is allowed: a plugin without `LIST_VOLUMES_PUBLISHED_NODES`
    /// and `VOLUME_CONDITION` sends none. Its status is then empty (no published nodes, no
    /// condition), as it is from a plugin that sends a status without those fields.
    ///
    /// ```no_run
    /// # async fn run(client: csi_client::CsiClient) -> Result<(), Box<dyn std::error::Error>> {
    /// let volumes = client.controller().list_all_volumes_with_status(0).await?;
    /// for v in &volumes {
    ///     let abnormal = v.status.condition.as_ref().is_some_and(|c| c.abnormal);
    ///     println!(
    ///         "{} on {} node(s), abnormal: {abnormal}",
    ///         v.volume.volume_id,
    ///         v.status.published_nodes.len()
    ///     );
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The first page call that failed, or the invalid response that ended the listing; an
    /// entry that breaks the spec is an invalid response naming its field, never a panic.
    /// Each page's volumes are checked on arrival, so an entry without a volume, with an
    /// empty volume id or a negative size is named by its place in its page (e.g.
    /// `entries[1].volume`); a status that breaks the spec (an empty or too long published
    /// node id) by the entry's place in the whole listing (e.g.
    /// `entries[3].status.published_node_ids[0]`).
    pub async fn list_all_volumes_with_status(
        &self,
        max_entries: u32,
    ) -> Result<Vec<VolumeWithStatus>, Error> {
        let request = pb::ListVolumesRequest {
            max_entries: i32::try_from(max_entries).unwrap_or(i32::MAX),
            starting_token: String::new(),
        };
        let context = request.context();
        let entries = self.list_all_volumes(request).await?;
        listed_volumes(entries).map_err(|errs| invalid_listing(context, errs))
    }

    /// `ListSnapshots`, every page (as [`list_all_volumes`](Self::list_all_volumes)), raw;
    /// [`list_all_snapshots_matching`](Self::list_all_snapshots_matching) answers csi-structs
    /// snapshots.
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

    /// `ControllerExpandVolume` from domain values: grows `volume` to a size within
    /// `capacity` (typically [`CapacityRange::at_least`]). `capability` says how the volume is
    /// used, when the orchestrator knows. The answer's size is checked (a negative one is an
    /// invalid response naming `capacity_bytes`); when `node_expansion_required` is set,
    /// [`NodeClient::expand`](crate::NodeClient::expand) must follow on every node where the
    /// volume is published.
    ///
    /// Expansion is idempotent (spec): a volume already at least that large answers OK with
    /// its size, so a call whose outcome was uncertain is simply sent again.
    ///
    /// ```no_run
    /// # async fn run(client: csi_client::CsiClient) -> Result<(), Box<dyn std::error::Error>> {
    /// use csi_structs::{CapacityRange, ExternalVolumeId, Secrets};
    ///
    /// let volume = ExternalVolumeId::new("vol-1")?;
    /// let grown = client
    ///     .controller()
    ///     .expand(&volume, &CapacityRange::at_least(20 << 30)?, None, &Secrets::default())
    ///     .await?;
    /// println!("{} bytes, node step needed: {}", grown.capacity_bytes, grown.node_expansion_required);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`controller_expand_volume`](Self::controller_expand_volume): an invalid range or
    /// capability is refused before sending; OUT_OF_RANGE (larger than the plugin allows) and
    /// FAILED_PRECONDITION (in use, and the plugin only expands offline) are fatal.
    pub async fn expand(
        &self,
        volume: &ExternalVolumeId,
        capacity: &CapacityRange,
        capability: Option<&VolumeCapability>,
        secrets: &Secrets,
    ) -> Result<ControllerExpansion, Error> {
        self.caller
            .unary(
                &self.options,
                pb::ControllerExpandVolumeRequest {
                    volume_id: volume.as_str().to_owned(),
                    capacity_range: Some(capacity.into()),
                    secrets: secrets.to_wire(),
                    volume_capability: capability.map(Into::into),
                },
                |ch, req| async move { Raw::new(ch).controller_expand_volume(req).await },
                convert::wire,
            )
            .await
    }

    /// `ControllerGetVolume` (alpha) from domain values: the volume, the plugin's ids of the
    /// nodes it is published to and its condition, each checked (a published node id that
    /// is empty or too long is an invalid response naming it).
    ///
    /// # Errors
    ///
    /// As [`controller_get_volume`](Self::controller_get_volume); NOT_FOUND (no such volume)
    /// is fatal.
    pub async fn get_volume(&self, volume: &ExternalVolumeId) -> Result<VolumeWithStatus, Error> {
        self.caller
            .unary(
                &self.options,
                pb::ControllerGetVolumeRequest {
                    volume_id: volume.as_str().to_owned(),
                },
                |ch, req| async move { Raw::new(ch).controller_get_volume(req).await },
                convert::wire,
            )
            .await
    }

    /// `CreateSnapshot` from domain values: a snapshot of `source` named `name` (the
    /// idempotency key: sending the same name again answers the same snapshot, so a call
    /// whose outcome was uncertain is sent again with it). Call again until the answer is
    /// `ready_to_use` before restoring from it.
    ///
    /// ```no_run
    /// # async fn run(client: csi_client::CsiClient) -> Result<(), Box<dyn std::error::Error>> {
    /// use csi_structs::{ExternalVolumeId, Parameters, Secrets};
    ///
    /// let controller = client.controller();
    /// let volume = ExternalVolumeId::new("vol-1")?;
    /// let secrets = Secrets::default();
    /// let snapshot = controller
    ///     .create_snapshot(&volume, "nightly-2024-06-01", &Parameters::default(), &secrets)
    ///     .await?;
    /// assert_eq!(snapshot.source_volume_id, volume);
    /// controller.delete_snapshot(&snapshot.snapshot_id, &secrets).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`create_snapshot_raw`](Self::create_snapshot_raw): a name that breaks the spec's
    /// rules is refused before sending; ALREADY_EXISTS (the name is taken by a snapshot of
    /// another volume) is fatal; a deadline or lost connection is
    /// [`Uncertain`](csi_structs::ErrorClass::Uncertain).
    pub async fn create_snapshot(
        &self,
        source: &ExternalVolumeId,
        name: &str,
        parameters: &Parameters,
        secrets: &Secrets,
    ) -> Result<Snapshot, Error> {
        self.create_snapshot_raw(pb::CreateSnapshotRequest {
            source_volume_id: source.as_str().to_owned(),
            name: name.to_owned(),
            secrets: secrets.to_wire(),
            parameters: parameters.to_wire(),
            accessibility_requirements: None,
        })
        .await
    }

    /// `DeleteSnapshot` from domain values. Deleting a snapshot that is already gone answers
    /// OK (spec); a plugin that answers NOT_FOUND instead gets an error of class
    /// [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone), which the caller counts as
    /// deleted. A snapshot that [belongs to a group](Snapshot::is_group_member) is deleted
    /// with its group instead.
    ///
    /// # Errors
    ///
    /// As [`delete_snapshot_raw`](Self::delete_snapshot_raw).
    pub async fn delete_snapshot(
        &self,
        snapshot: &SnapshotId,
        secrets: &Secrets,
    ) -> Result<(), Error> {
        self.delete_snapshot_raw(pb::DeleteSnapshotRequest {
            snapshot_id: snapshot.as_str().to_owned(),
            secrets: secrets.to_wire(),
        })
        .await
    }

    /// `ListSnapshots`, every page (as [`list_all_volumes`](Self::list_all_volumes)), of the
    /// snapshots `filter` selects, as csi-structs snapshots.
    ///
    /// ```no_run
    /// # async fn run(client: csi_client::CsiClient) -> Result<(), Box<dyn std::error::Error>> {
    /// use csi_client::SnapshotFilter;
    /// use csi_structs::{ExternalVolumeId, Secrets};
    ///
    /// let volume = ExternalVolumeId::new("vol-1")?;
    /// let snapshots = client
    ///     .controller()
    ///     .list_all_snapshots_matching(&SnapshotFilter::of_volume(volume), &Secrets::default())
    ///     .await?;
    /// for s in &snapshots {
    ///     println!("{} ready: {}", s.snapshot_id, s.ready_to_use);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The first page call that failed, or the invalid response that ended the listing (an
    /// entry that breaks the spec names its place in the listing, e.g.
    /// `entries[3].snapshot.size_bytes`).
    pub async fn list_all_snapshots_matching(
        &self,
        filter: &SnapshotFilter,
        secrets: &Secrets,
    ) -> Result<Vec<Snapshot>, Error> {
        let request = filter.to_request(secrets, 0, String::new());
        let context = request.context();
        let entries = self.list_all_snapshots(request).await?;
        listed_snapshots(&entries).map_err(|errs| invalid_listing(context, errs))
    }

    /// `ListSnapshots`, one page of the snapshots `filter` selects: at most `max_entries`
    /// (0: as many as the plugin chooses; more than `i32::MAX` asks for `i32::MAX`), from
    /// `starting_token` (`None`: from the start).
    ///
    /// # Errors
    ///
    /// As [`list_snapshots`](Self::list_snapshots): ABORTED (the plugin no longer accepts
    /// `starting_token`) is fatal; list again from the start.
    pub async fn list_snapshots_page(
        &self,
        filter: &SnapshotFilter,
        secrets: &Secrets,
        max_entries: u32,
        starting_token: Option<&str>,
    ) -> Result<SnapshotPage, Error> {
        let max_entries = i32::try_from(max_entries).unwrap_or(i32::MAX);
        let request = filter.to_request(
            secrets,
            max_entries,
            starting_token.unwrap_or_default().to_owned(),
        );
        self.caller
            .unary(
                &self.options,
                request,
                |ch, req| async move { Raw::new(ch).list_snapshots(req).await },
                |page: pb::ListSnapshotsResponse| {
                    let snapshots = listed_snapshots(&page.entries)
                        .map_err(|errs| ErrorKind::InvalidResponse(ResponseError::Fields(errs)))?;
                    Ok(SnapshotPage {
                        snapshots,
                        next_token: Some(page.next_token).filter(|t| !t.is_empty()),
                    })
                },
            )
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

/// Which snapshots a listing asks for (`ListSnapshots`' `source_volume_id` and
/// `snapshot_id`). Both set selects that snapshot only if it was cut from that volume; neither
/// set lists every snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotFilter {
    /// Only snapshots of this volume.
    pub source_volume: Option<ExternalVolumeId>,
    /// Only this snapshot.
    pub snapshot: Option<SnapshotId>,
}

impl SnapshotFilter {
    /// Every snapshot of the plugin.
    pub fn all() -> Self {
        Self::default()
    }

    /// The snapshots cut from `volume`.
    pub fn of_volume(volume: ExternalVolumeId) -> Self {
        Self {
            source_volume: Some(volume),
            snapshot: None,
        }
    }

    /// The snapshot `snapshot` (none when it does not exist: the spec answers an empty list,
    /// not NOT_FOUND).
    pub fn with_id(snapshot: SnapshotId) -> Self {
        Self {
            source_volume: None,
            snapshot: Some(snapshot),
        }
    }

    fn to_request(
        &self,
        secrets: &Secrets,
        max_entries: i32,
        starting_token: String,
    ) -> pb::ListSnapshotsRequest {
        pb::ListSnapshotsRequest {
            max_entries,
            starting_token,
            source_volume_id: self
                .source_volume
                .as_ref()
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default(),
            snapshot_id: self
                .snapshot
                .as_ref()
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default(),
            secrets: secrets.to_wire(),
        }
    }
}

/// One page of [`ControllerClient::list_snapshots_page`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotPage {
    /// The page's snapshots, in the plugin's order.
    pub snapshots: Vec<Snapshot>,
    /// Where the next page starts; `None` when this page ends the listing.
    pub next_token: Option<String>,
}

/// The error of a listing whose pages were answered but whose entries break the spec.
fn invalid_listing(context: crate::error::CallContext, errs: ValidationErrors) -> Error {
    let class = classify_failure(context.rpc(), Failure::InvalidResponse);
    Error::new(
        context,
        ErrorKind::InvalidResponse(ResponseError::Fields(errs)),
        class,
        1,
    )
}

/// The entries of a `ListVolumes` listing as volumes with their status. Each entry goes
/// through `ControllerGetVolume`'s conversion (same `volume` and `status` fields; the one
/// place the rules live), with a missing `status` taken as an empty one: unlike
/// `ControllerGetVolume`'s, it is optional here. The violations name each entry by its place
/// in the listing.
fn listed_volumes(
    entries: Vec<pb::list_volumes_response::Entry>,
) -> Result<Vec<VolumeWithStatus>, ValidationErrors> {
    let mut errs = ValidationErrors::new();
    let mut volumes = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let status = entry.status.unwrap_or_default();
        let answer = pb::ControllerGetVolumeResponse {
            volume: entry.volume,
            status: Some(pb::controller_get_volume_response::VolumeStatus {
                published_node_ids: status.published_node_ids,
                volume_condition: status.volume_condition,
            }),
        };
        match VolumeWithStatus::try_from(answer) {
            Ok(volume) => volumes.push(volume),
            Err(e) => errs.extend_under(&FieldPath::named("entries").index(i), e.errors),
        }
    }
    errs.into_result(volumes)
}

/// The entries of a `ListSnapshots` listing as csi-structs snapshots; the violations name
/// each entry by its place in the listing.
fn listed_snapshots(
    entries: &[pb::list_snapshots_response::Entry],
) -> Result<Vec<Snapshot>, ValidationErrors> {
    let mut errs = ValidationErrors::new();
    let mut snapshots = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let at = FieldPath::named("entries").index(i).field("snapshot");
        match entry.snapshot.as_ref().map(Snapshot::try_from) {
            Some(Ok(snapshot)) => snapshots.push(snapshot),
            Some(Err(e)) => errs.extend_under(&at, e.errors),
            None => errs.push(at, Problem::Missing),
        }
    }
    errs.into_result(snapshots)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each violation's field and problem, in order.
    fn by_field(errs: ValidationErrors) -> Vec<(String, Problem)> {
        errs.into_iter()
            .map(|v| (v.field.to_string(), v.problem))
            .collect()
    }

    #[test]
    fn listed_snapshots_name_the_entry() {
        let good = pb::Snapshot {
            snapshot_id: "snap-1".into(),
            source_volume_id: "vol-1".into(),
            size_bytes: 5,
            creation_time: Some(Default::default()),
            ..Default::default()
        };
        let entry = |s: Option<pb::Snapshot>| pb::list_snapshots_response::Entry { snapshot: s };
        let ok = listed_snapshots(&[entry(Some(good.clone()))]).unwrap();
        assert_eq!(ok[0].size_bytes, Some(5));

        let negative = pb::Snapshot {
            size_bytes: -1,
            ..good.clone()
        };
        let errs =
            listed_snapshots(&[entry(Some(good)), entry(Some(negative)), entry(None)]).unwrap_err();
        let got = by_field(errs);
        assert_eq!(
            got,
            [
                (
                    "entries[1].snapshot.size_bytes".to_owned(),
                    Problem::Negative { value: -1 }
                ),
                ("entries[2].snapshot".to_owned(), Problem::Missing),
            ]
        );
    }

    #[test]
    fn listed_volumes_get_the_get_volume_rules_and_name_the_entry() {
        use pb::list_volumes_response::{Entry, VolumeStatus};
        let volume = |id: &str| {
            Some(pb::Volume {
                volume_id: id.into(),
                capacity_bytes: 1 << 30,
                ..Default::default()
            })
        };
        let status = |nodes: &[&str], abnormal: Option<bool>| {
            Some(VolumeStatus {
                published_node_ids: nodes.iter().map(|n| (*n).to_owned()).collect(),
                volume_condition: abnormal.map(|abnormal| pb::VolumeCondition {
                    abnormal,
                    message: "m".into(),
                }),
            })
        };
        let ok = listed_volumes(vec![
            Entry {
                volume: volume("vol-1"),
                status: status(&["node-a", "node-b"], Some(true)),
            },
            // No status: a plugin without LIST_VOLUMES_PUBLISHED_NODES and VOLUME_CONDITION.
            Entry {
                volume: volume("vol-2"),
                status: None,
            },
        ])
        .unwrap();
        assert_eq!(ok[0].volume.volume_id.as_str(), "vol-1");
        assert_eq!(ok[0].volume.capacity_bytes, Some(1 << 30));
        let nodes: Vec<&str> = ok[0]
            .status
            .published_nodes
            .iter()
            .map(|n| n.as_str())
            .collect();
        assert_eq!(nodes, ["node-a", "node-b"]);
        assert!(ok[0].status.condition.as_ref().is_some_and(|c| c.abnormal));
        assert_eq!(ok[1].status, csi_structs::VolumeStatus::default());

        let errs = listed_volumes(vec![
            Entry {
                volume: volume("vol-1"),
                status: status(&[], None),
            },
            Entry {
                volume: None,
                status: None,
            },
            Entry {
                volume: volume(""),
                status: status(&["node-a", ""], Some(false)),
            },
        ])
        .unwrap_err();
        let got = by_field(errs);
        assert_eq!(
            got,
            [
                ("entries[1].volume".to_owned(), Problem::Missing),
                ("entries[2].volume.volume_id".to_owned(), Problem::Missing),
                (
                    "entries[2].status.published_node_ids[1]".to_owned(),
                    Problem::Missing
                ),
            ]
        );
    }

    #[test]
    fn snapshot_filters_fill_the_request() {
        let secrets = Secrets::default();
        let all = SnapshotFilter::all().to_request(&secrets, 0, String::new());
        assert!(all.source_volume_id.is_empty() && all.snapshot_id.is_empty());
        let volume = ExternalVolumeId::new("vol-1").unwrap();
        let of = SnapshotFilter::of_volume(volume).to_request(&secrets, 3, "t".into());
        assert_eq!(
            (of.source_volume_id.as_str(), of.snapshot_id.as_str()),
            ("vol-1", "")
        );
        assert_eq!((of.max_entries, of.starting_token.as_str()), (3, "t"));
        let one = SnapshotFilter::with_id(SnapshotId::new("snap-1").unwrap()).to_request(
            &secrets,
            0,
            String::new(),
        );
        assert_eq!(
            (one.source_volume_id.as_str(), one.snapshot_id.as_str()),
            ("", "snap-1")
        );
    }
}
