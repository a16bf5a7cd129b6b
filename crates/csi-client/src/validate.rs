//! Checks on wire messages: requests before they are sent, responses when they arrive.
//!
//! The limits themselves (128-byte strings, 4 KiB maps, 256-byte plugin node ids, …) and the
//! error vocabulary ([`FieldPath`], [`Problem`], [`ValidationErrors`]) come from `csi-structs`;
//! this module applies them to each CSI message. Every violation names the field path, and no
//! violation ever carries a value (so a secret cannot leak through an error; sizes only).
//!
//! Scalars without presence (`readonly`, `starting_offset`, `max_entries` = 0) are never
//! reported missing, because proto3 cannot tell "false"/"0" from "unset".

use std::collections::HashMap;

use csi_proto::Rpc;
use csi_proto::v1 as pb;
use csi_structs::limits::{
    MAX_MAP_BYTES, MAX_PLUGIN_NODE_ID_BYTES, MAX_STRING_BYTES, map_size, validate_request_name,
};
use csi_structs::validation::{FieldPath, Problem, SizeUnit};
use csi_structs::{
    CapacityRange, ContentSource, Secrets, Snapshot, Topology, TopologyRequirement,
    ValidationErrors, Volume, VolumeCapability, WireError,
};

use crate::error::{CallContext, PathField};

/// A request message: which RPC it belongs to, what it names, and its spec checks.
pub(crate) trait CsiRequest: Clone + Send + Sync + 'static {
    /// The RPC this message is the request of.
    const RPC: Rpc;

    /// The RPC plus the volume/node/snapshot the request names.
    fn context(&self) -> CallContext {
        CallContext::new(Self::RPC)
    }

    /// Required fields and size limits.
    fn check(&self, _errs: &mut Checker) {}
}

/// A response message's spec checks.
pub(crate) trait CsiResponse {
    /// Required fields, size limits, negative numbers.
    fn check(&self, _errs: &mut Checker) {}
}

/// Collects violations.
#[derive(Debug, Default)]
pub(crate) struct Checker {
    errs: ValidationErrors,
}

fn at(name: &'static str) -> FieldPath {
    FieldPath::named(name)
}

impl Checker {
    pub(crate) fn finish(self) -> Result<(), ValidationErrors> {
        self.errs.into_result(())
    }

    fn push(&mut self, field: FieldPath, problem: Problem) {
        self.errs.push(field, problem);
    }

    fn len(&mut self, field: &FieldPath, value: &str, limit: usize) {
        if value.len() > limit {
            self.push(
                field.clone(),
                Problem::TooLong {
                    size: value.len(),
                    limit,
                    unit: SizeUnit::Bytes,
                },
            );
        }
    }

    /// A required string with a byte limit.
    pub(crate) fn required(&mut self, field: FieldPath, value: &str, limit: usize) {
        if value.is_empty() {
            self.push(field, Problem::Missing);
        } else {
            self.len(&field, value, limit);
        }
    }

    /// Files a `csi-structs` wire conversion's violations under `field`.
    fn converted<T>(&mut self, field: &FieldPath, result: Result<T, WireError>) {
        if let Err(e) = result {
            self.errs.extend_under(field, e.errors);
        }
    }

    /// A request `name` (CreateVolume, CreateSnapshot, …), checked by `csi-structs`:
    /// present, at most 128 bytes, none of the control characters the spec bans.
    pub(crate) fn name(&mut self, field: FieldPath, value: &str) {
        if let Err(errs) = validate_request_name(&field, value) {
            self.errs.extend(errs);
        }
    }

    /// A required id (128 bytes).
    pub(crate) fn id(&mut self, field: FieldPath, value: &str) {
        self.required(field, value, MAX_STRING_BYTES);
    }

    /// An optional string (128 bytes).
    pub(crate) fn optional(&mut self, field: FieldPath, value: &str) {
        self.len(&field, value, MAX_STRING_BYTES);
    }

    /// A required path: no size limit (the OS maximum applies), but present.
    pub(crate) fn path(&mut self, field: FieldPath, value: &str) {
        if value.is_empty() {
            self.push(field, Problem::Missing);
        }
    }

    /// A map of at most 4 KiB (keys plus values).
    pub(crate) fn map(&mut self, field: FieldPath, map: &HashMap<String, String>) {
        let size = map_size(map.iter());
        if size > MAX_MAP_BYTES {
            self.push(
                field,
                Problem::TooLong {
                    size,
                    limit: MAX_MAP_BYTES,
                    unit: SizeUnit::Bytes,
                },
            );
        }
    }

    /// A number that must not be negative.
    pub(crate) fn non_negative(&mut self, field: FieldPath, value: i64) {
        if value < 0 {
            self.push(field, Problem::Negative { value });
        }
    }

    /// A required message.
    pub(crate) fn present<T>(&mut self, field: FieldPath, value: &Option<T>) -> bool {
        if value.is_none() {
            self.push(field, Problem::Missing);
            false
        } else {
            true
        }
    }

    /// A required capability, checked by `csi-structs`' wire conversion (access mode known,
    /// access type set, mount option limits).
    pub(crate) fn capability(&mut self, field: FieldPath, cap: &Option<pb::VolumeCapability>) {
        let Some(cap) = cap else {
            self.push(field, Problem::Missing);
            return;
        };
        self.converted(&field, VolumeCapability::try_from(cap));
    }

    /// A secrets map, checked by `csi-structs` (key syntax, 4 KiB); values are never reported.
    pub(crate) fn secrets(&mut self, map: &HashMap<String, String>) {
        if map.is_empty() {
            return;
        }
        if let Err(errs) = Secrets::from_wire_at(map.clone(), &at("secrets")) {
            self.errs.extend(errs);
        }
    }

    pub(crate) fn capabilities(
        &mut self,
        field: FieldPath,
        caps: &[pb::VolumeCapability],
        required: bool,
    ) {
        if required && caps.is_empty() {
            self.push(field.clone(), Problem::Missing);
        }
        for (i, cap) in caps.iter().enumerate() {
            self.capability(field.clone().index(i), &Some(cap.clone()));
        }
    }

    /// A capacity range, checked by `csi-structs` (non-negative, one bound set, limit not
    /// below required).
    pub(crate) fn capacity_range(
        &mut self,
        field: FieldPath,
        range: &Option<pb::CapacityRange>,
        required: bool,
    ) {
        let Some(range) = range else {
            if required {
                self.push(field, Problem::Missing);
            }
            return;
        };
        self.converted(&field, CapacityRange::try_from(range));
    }

    /// An optional topology, checked by `csi-structs` (segment key syntax, values, sizes).
    pub(crate) fn topology(&mut self, field: FieldPath, topo: &Option<pb::Topology>) {
        if let Some(t) = topo {
            self.converted(&field, Topology::try_from(t));
        }
    }

    /// An optional topology requirement, checked by `csi-structs` (each topology, and the
    /// rules tying `preferred` to `requisite`).
    pub(crate) fn topology_requirement(
        &mut self,
        field: FieldPath,
        req: &Option<pb::TopologyRequirement>,
    ) {
        if let Some(r) = req {
            self.converted(&field, TopologyRequirement::try_from(r));
        }
    }

    /// An optional volume content source, checked by `csi-structs` (type set, id valid).
    pub(crate) fn content_source(
        &mut self,
        field: FieldPath,
        src: &Option<pb::VolumeContentSource>,
    ) {
        if let Some(s) = src {
            self.converted(&field, ContentSource::try_from(s));
        }
    }

    /// A required volume, checked by `csi-structs`: the same rules as CreateVolume's answer.
    pub(crate) fn volume(&mut self, field: FieldPath, volume: &Option<pb::Volume>) {
        let Some(v) = volume else {
            self.push(field, Problem::Missing);
            return;
        };
        self.converted(&field, Volume::try_from(v));
    }

    /// A required snapshot, checked by `csi-structs`: the same rules as CreateSnapshot's and
    /// GetSnapshot's answers.
    pub(crate) fn snapshot(&mut self, field: FieldPath, snapshot: &Option<pb::Snapshot>) {
        let Some(s) = snapshot else {
            self.push(field, Problem::Missing);
            return;
        };
        self.converted(&field, Snapshot::try_from(s));
    }

    fn volume_health(&mut self, field: FieldPath, health: &Option<pb::VolumeHealth>) {
        let Some(h) = health else {
            self.push(field, Problem::Missing);
            return;
        };
        self.id(field.field("volume_id"), &h.volume_id);
    }

    fn ids(&mut self, field: FieldPath, ids: &[String]) {
        if ids.is_empty() {
            self.push(field.clone(), Problem::Missing);
        }
        for (i, id) in ids.iter().enumerate() {
            self.id(field.clone().index(i), id);
        }
    }
}

macro_rules! no_checks {
    ($($t:ty),* $(,)?) => { $( impl CsiResponse for $t {} )* };
}

macro_rules! request {
    ($t:ty, $rpc:expr) => {
        impl CsiRequest for $t {
            const RPC: Rpc = $rpc;
        }
    };
    ($t:ty, $rpc:expr, |$r:ident| context $ctx:expr, |$s:ident, $c:ident| $check:block) => {
        impl CsiRequest for $t {
            const RPC: Rpc = $rpc;
            #[allow(unused_variables)]
            fn context(&self) -> CallContext {
                let $r = self;
                $ctx
            }
            #[allow(unused_variables)]
            fn check(&self, $c: &mut Checker) {
                let $s = self;
                $check
            }
        }
    };
}

fn ctx(rpc: Rpc) -> CallContext {
    CallContext::new(rpc)
}

// ---- Identity ----
request!(pb::GetPluginInfoRequest, Rpc::GetPluginInfo);
request!(pb::GetPluginCapabilitiesRequest, Rpc::GetPluginCapabilities);
request!(pb::ProbeRequest, Rpc::Probe);

// Checked by the csi-structs conversion the typed client applies.
no_checks!(pb::GetPluginInfoResponse);
no_checks!(pb::GetPluginCapabilitiesResponse, pb::ProbeResponse);

// ---- Controller ----
request!(pb::CreateVolumeRequest, Rpc::CreateVolume, |r| context ctx(Rpc::CreateVolume), |r, c| {
    c.name(at("name"), &r.name);
    c.capacity_range(at("capacity_range"), &r.capacity_range, false);
    c.capabilities(at("volume_capabilities"), &r.volume_capabilities, true);
    c.map(at("parameters"), &r.parameters);
    c.secrets(&r.secrets);
    c.map(at("mutable_parameters"), &r.mutable_parameters);
    c.content_source(at("volume_content_source"), &r.volume_content_source);
    c.topology_requirement(at("accessibility_requirements"), &r.accessibility_requirements);
});
// Checked by the csi-structs conversion the typed client applies.
no_checks!(pb::CreateVolumeResponse);

request!(pb::DeleteVolumeRequest, Rpc::DeleteVolume, |r| context ctx(Rpc::DeleteVolume).volume(&r.volume_id), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.secrets(&r.secrets);
});

request!(pb::ControllerPublishVolumeRequest, Rpc::ControllerPublishVolume,
    |r| context ctx(Rpc::ControllerPublishVolume).volume(&r.volume_id).node(&r.node_id), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    // A plugin node id may be 256 bytes (NodeGetInfo's limit), so accept that here too.
    c.required(at("node_id"), &r.node_id, MAX_PLUGIN_NODE_ID_BYTES);
    c.capability(at("volume_capability"), &r.volume_capability);
    c.secrets(&r.secrets);
    c.map(at("volume_context"), &r.volume_context);
});
// Checked by the csi-structs conversion the typed client applies.
no_checks!(pb::ControllerPublishVolumeResponse);

request!(pb::ControllerUnpublishVolumeRequest, Rpc::ControllerUnpublishVolume,
    |r| context ctx(Rpc::ControllerUnpublishVolume).volume(&r.volume_id).node(&r.node_id), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    // Empty node_id means "from every node" (spec), so it is optional.
    c.len(&at("node_id"), &r.node_id, MAX_PLUGIN_NODE_ID_BYTES);
    c.secrets(&r.secrets);
});

request!(pb::ValidateVolumeCapabilitiesRequest, Rpc::ValidateVolumeCapabilities,
    |r| context ctx(Rpc::ValidateVolumeCapabilities).volume(&r.volume_id), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.map(at("volume_context"), &r.volume_context);
    c.capabilities(at("volume_capabilities"), &r.volume_capabilities, true);
    c.map(at("parameters"), &r.parameters);
    c.secrets(&r.secrets);
    c.map(at("mutable_parameters"), &r.mutable_parameters);
});
impl CsiResponse for pb::ValidateVolumeCapabilitiesResponse {
    fn check(&self, c: &mut Checker) {
        if let Some(conf) = &self.confirmed {
            c.capabilities(
                at("confirmed").field("volume_capabilities"),
                &conf.volume_capabilities,
                true,
            );
        }
    }
}

request!(pb::ListVolumesRequest, Rpc::ListVolumes, |r| context ctx(Rpc::ListVolumes), |r, c| {
    c.non_negative(at("max_entries"), i64::from(r.max_entries));
    c.optional(at("starting_token"), &r.starting_token);
});
impl CsiResponse for pb::ListVolumesResponse {
    fn check(&self, c: &mut Checker) {
        for (i, e) in self.entries.iter().enumerate() {
            c.volume(at("entries").index(i).field("volume"), &e.volume);
        }
        c.optional(at("next_token"), &self.next_token);
    }
}

request!(pb::ControllerListVolumeHealthRequest, Rpc::ControllerListVolumeHealth, |r| context ctx(Rpc::ControllerListVolumeHealth), |r, c| {
    c.non_negative(at("max_entries"), i64::from(r.max_entries));
    c.optional(at("starting_token"), &r.starting_token);
    c.secrets(&r.secrets);
});
impl CsiResponse for pb::ControllerListVolumeHealthResponse {
    fn check(&self, c: &mut Checker) {
        for (i, h) in self.entries.iter().enumerate() {
            c.volume_health(at("entries").index(i), &Some(h.clone()));
        }
    }
}

request!(pb::ControllerGetVolumeHealthRequest, Rpc::ControllerGetVolumeHealth,
    |r| context ctx(Rpc::ControllerGetVolumeHealth).volume(&r.volume_id), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.secrets(&r.secrets);
});
impl CsiResponse for pb::ControllerGetVolumeHealthResponse {
    fn check(&self, c: &mut Checker) {
        c.volume_health(at("volume_health"), &self.volume_health);
    }
}

request!(pb::GetCapacityRequest, Rpc::GetCapacity, |r| context ctx(Rpc::GetCapacity), |r, c| {
    c.capabilities(at("volume_capabilities"), &r.volume_capabilities, false);
    c.map(at("parameters"), &r.parameters);
    c.topology(at("accessible_topology"), &r.accessible_topology);
});
impl CsiResponse for pb::GetCapacityResponse {
    fn check(&self, c: &mut Checker) {
        c.non_negative(at("available_capacity"), self.available_capacity);
        if let Some(max) = self.maximum_volume_size {
            c.non_negative(at("maximum_volume_size"), max);
        }
        if let Some(min) = self.minimum_volume_size {
            c.non_negative(at("minimum_volume_size"), min);
        }
    }
}

request!(
    pb::ControllerGetCapabilitiesRequest,
    Rpc::ControllerGetCapabilities
);
no_checks!(pb::ControllerGetCapabilitiesResponse);

request!(pb::CreateSnapshotRequest, Rpc::CreateSnapshot,
    |r| context ctx(Rpc::CreateSnapshot).volume(&r.source_volume_id), |r, c| {
    c.id(at("source_volume_id"), &r.source_volume_id);
    c.name(at("name"), &r.name);
    c.secrets(&r.secrets);
    c.map(at("parameters"), &r.parameters);
});
// Checked by the csi-structs conversion the typed client applies.
no_checks!(pb::CreateSnapshotResponse);

request!(pb::DeleteSnapshotRequest, Rpc::DeleteSnapshot,
    |r| context ctx(Rpc::DeleteSnapshot).snapshot(&r.snapshot_id), |r, c| {
    c.id(at("snapshot_id"), &r.snapshot_id);
    c.secrets(&r.secrets);
});

request!(pb::ListSnapshotsRequest, Rpc::ListSnapshots,
    |r| context ctx(Rpc::ListSnapshots).volume(&r.source_volume_id).snapshot(&r.snapshot_id), |r, c| {
    c.non_negative(at("max_entries"), i64::from(r.max_entries));
    c.optional(at("starting_token"), &r.starting_token);
    c.optional(at("source_volume_id"), &r.source_volume_id);
    c.optional(at("snapshot_id"), &r.snapshot_id);
    c.secrets(&r.secrets);
});
impl CsiResponse for pb::ListSnapshotsResponse {
    fn check(&self, c: &mut Checker) {
        for (i, e) in self.entries.iter().enumerate() {
            c.snapshot(at("entries").index(i).field("snapshot"), &e.snapshot);
        }
        c.optional(at("next_token"), &self.next_token);
    }
}

request!(pb::GetSnapshotRequest, Rpc::GetSnapshot,
    |r| context ctx(Rpc::GetSnapshot).snapshot(&r.snapshot_id), |r, c| {
    c.id(at("snapshot_id"), &r.snapshot_id);
    c.secrets(&r.secrets);
});
// Checked by the csi-structs conversion the typed client applies.
no_checks!(pb::GetSnapshotResponse);

request!(pb::ControllerExpandVolumeRequest, Rpc::ControllerExpandVolume,
    |r| context ctx(Rpc::ControllerExpandVolume).volume(&r.volume_id), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.capacity_range(at("capacity_range"), &r.capacity_range, true);
    c.secrets(&r.secrets);
    if r.volume_capability.is_some() {
        c.capability(at("volume_capability"), &r.volume_capability);
    }
});
impl CsiResponse for pb::ControllerExpandVolumeResponse {
    fn check(&self, c: &mut Checker) {
        c.non_negative(at("capacity_bytes"), self.capacity_bytes);
    }
}

request!(pb::ControllerGetVolumeRequest, Rpc::ControllerGetVolume,
    |r| context ctx(Rpc::ControllerGetVolume).volume(&r.volume_id), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
});
impl CsiResponse for pb::ControllerGetVolumeResponse {
    fn check(&self, c: &mut Checker) {
        c.volume(at("volume"), &self.volume);
        c.present(at("status"), &self.status);
    }
}

request!(pb::ControllerModifyVolumeRequest, Rpc::ControllerModifyVolume,
    |r| context ctx(Rpc::ControllerModifyVolume).volume(&r.volume_id), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.secrets(&r.secrets);
    if r.mutable_parameters.is_empty() {
        c.push(at("mutable_parameters"), Problem::Missing);
    }
    c.map(at("mutable_parameters"), &r.mutable_parameters);
});

no_checks!(
    pb::DeleteVolumeResponse,
    pb::ControllerUnpublishVolumeResponse,
    pb::DeleteSnapshotResponse,
    pb::ControllerModifyVolumeResponse,
);

// ---- GroupController ----
request!(
    pb::GroupControllerGetCapabilitiesRequest,
    Rpc::GroupControllerGetCapabilities
);
no_checks!(pb::GroupControllerGetCapabilitiesResponse);

request!(pb::CreateVolumeGroupSnapshotRequest, Rpc::CreateVolumeGroupSnapshot, |r| context ctx(Rpc::CreateVolumeGroupSnapshot), |r, c| {
    c.name(at("name"), &r.name);
    c.ids(at("source_volume_ids"), &r.source_volume_ids);
    c.secrets(&r.secrets);
    c.map(at("parameters"), &r.parameters);
});
// Checked by the csi-structs conversion the typed client applies.
no_checks!(pb::CreateVolumeGroupSnapshotResponse);

request!(pb::DeleteVolumeGroupSnapshotRequest, Rpc::DeleteVolumeGroupSnapshot, |r| context ctx(Rpc::DeleteVolumeGroupSnapshot), |r, c| {
    c.id(at("group_snapshot_id"), &r.group_snapshot_id);
    c.ids(at("snapshot_ids"), &r.snapshot_ids);
    c.secrets(&r.secrets);
});
no_checks!(pb::DeleteVolumeGroupSnapshotResponse);

request!(pb::GetVolumeGroupSnapshotRequest, Rpc::GetVolumeGroupSnapshot, |r| context ctx(Rpc::GetVolumeGroupSnapshot), |r, c| {
    c.id(at("group_snapshot_id"), &r.group_snapshot_id);
    c.ids(at("snapshot_ids"), &r.snapshot_ids);
    c.secrets(&r.secrets);
});
// Checked by the csi-structs conversion the typed client applies.
no_checks!(pb::GetVolumeGroupSnapshotResponse);

// ---- SnapshotMetadata (stream openings; messages are checked by the stream wrapper) ----
request!(pb::GetMetadataAllocatedRequest, Rpc::GetMetadataAllocated,
    |r| context ctx(Rpc::GetMetadataAllocated).snapshot(&r.snapshot_id), |r, c| {
    c.id(at("snapshot_id"), &r.snapshot_id);
    c.non_negative(at("starting_offset"), r.starting_offset);
    c.non_negative(at("max_results"), i64::from(r.max_results));
    c.secrets(&r.secrets);
});
request!(pb::GetMetadataDeltaRequest, Rpc::GetMetadataDelta,
    |r| context ctx(Rpc::GetMetadataDelta).snapshot(&r.target_snapshot_id), |r, c| {
    c.id(at("base_snapshot_id"), &r.base_snapshot_id);
    c.id(at("target_snapshot_id"), &r.target_snapshot_id);
    c.non_negative(at("starting_offset"), r.starting_offset);
    c.non_negative(at("max_results"), i64::from(r.max_results));
    c.secrets(&r.secrets);
});

/// Checks one message of a snapshot-metadata stream (shape only; ordering is the stream's job).
pub(crate) fn check_block_metadata(c: &mut Checker, capacity: i64, blocks: &[pb::BlockMetadata]) {
    c.non_negative(at("volume_capacity_bytes"), capacity);
    for (i, b) in blocks.iter().enumerate() {
        let f = at("block_metadata").index(i);
        c.non_negative(f.clone().field("byte_offset"), b.byte_offset);
        if b.size_bytes <= 0 {
            if b.size_bytes < 0 {
                c.non_negative(f.field("size_bytes"), b.size_bytes);
            } else {
                c.push(f.field("size_bytes"), Problem::Missing);
            }
        }
    }
}

// ---- Node ----
request!(pb::NodeStageVolumeRequest, Rpc::NodeStageVolume,
    |r| context ctx(Rpc::NodeStageVolume).volume(&r.volume_id)
        .with_path(PathField::StagingTargetPath, &r.staging_target_path), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.map(at("publish_context"), &r.publish_context);
    c.path(at("staging_target_path"), &r.staging_target_path);
    c.capability(at("volume_capability"), &r.volume_capability);
    c.secrets(&r.secrets);
    c.map(at("volume_context"), &r.volume_context);
});
request!(pb::NodeUnstageVolumeRequest, Rpc::NodeUnstageVolume,
    |r| context ctx(Rpc::NodeUnstageVolume).volume(&r.volume_id)
        .with_path(PathField::StagingTargetPath, &r.staging_target_path), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.path(at("staging_target_path"), &r.staging_target_path);
});
request!(pb::NodePublishVolumeRequest, Rpc::NodePublishVolume,
    |r| context ctx(Rpc::NodePublishVolume).volume(&r.volume_id)
        .with_path(PathField::StagingTargetPath, &r.staging_target_path)
        .with_path(PathField::TargetPath, &r.target_path), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.map(at("publish_context"), &r.publish_context);
    c.path(at("target_path"), &r.target_path);
    c.capability(at("volume_capability"), &r.volume_capability);
    c.secrets(&r.secrets);
    c.map(at("volume_context"), &r.volume_context);
});
request!(pb::NodeUnpublishVolumeRequest, Rpc::NodeUnpublishVolume,
    |r| context ctx(Rpc::NodeUnpublishVolume).volume(&r.volume_id)
        .with_path(PathField::TargetPath, &r.target_path), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.path(at("target_path"), &r.target_path);
});
request!(pb::NodeGetVolumeStatsRequest, Rpc::NodeGetVolumeStats,
    |r| context ctx(Rpc::NodeGetVolumeStats).volume(&r.volume_id)
        .with_path(PathField::VolumePath, &r.volume_path)
        .with_path(PathField::StagingTargetPath, &r.staging_target_path), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.path(at("volume_path"), &r.volume_path);
});
impl CsiResponse for pb::NodeGetVolumeStatsResponse {
    fn check(&self, c: &mut Checker) {
        for (i, u) in self.usage.iter().enumerate() {
            let f = at("usage").index(i);
            c.non_negative(f.clone().field("available"), u.available);
            c.non_negative(f.clone().field("total"), u.total);
            c.non_negative(f.field("used"), u.used);
        }
    }
}
request!(pb::NodeGetVolumeHealthRequest, Rpc::NodeGetVolumeHealth,
    |r| context ctx(Rpc::NodeGetVolumeHealth).volume(&r.volume_id)
        .with_path(PathField::VolumePublishPath, &r.volume_publish_path)
        .with_path(PathField::StagingTargetPath, &r.staging_target_path), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
});
impl CsiResponse for pb::NodeGetVolumeHealthResponse {
    fn check(&self, c: &mut Checker) {
        c.volume_health(at("volume_health"), &self.volume_health);
    }
}
request!(pb::NodeGetStorageHealthRequest, Rpc::NodeGetStorageHealth, |r| context ctx(Rpc::NodeGetStorageHealth), |r, c| {
    c.secrets(&r.secrets);
});
no_checks!(pb::NodeGetStorageHealthResponse);
request!(pb::NodeExpandVolumeRequest, Rpc::NodeExpandVolume,
    |r| context ctx(Rpc::NodeExpandVolume).volume(&r.volume_id)
        .with_path(PathField::VolumePath, &r.volume_path)
        .with_path(PathField::StagingTargetPath, &r.staging_target_path), |r, c| {
    c.id(at("volume_id"), &r.volume_id);
    c.path(at("volume_path"), &r.volume_path);
    c.capacity_range(at("capacity_range"), &r.capacity_range, false);
    if r.volume_capability.is_some() {
        c.capability(at("volume_capability"), &r.volume_capability);
    }
    c.secrets(&r.secrets);
});
impl CsiResponse for pb::NodeExpandVolumeResponse {
    fn check(&self, c: &mut Checker) {
        c.non_negative(at("capacity_bytes"), self.capacity_bytes);
    }
}
request!(pb::NodeGetCapabilitiesRequest, Rpc::NodeGetCapabilities);
no_checks!(pb::NodeGetCapabilitiesResponse);
request!(pb::NodeGetInfoRequest, Rpc::NodeGetInfo);
// Checked by the csi-structs conversion the typed client applies.
no_checks!(pb::NodeGetInfoResponse);
no_checks!(
    pb::NodeStageVolumeResponse,
    pb::NodeUnstageVolumeResponse,
    pb::NodePublishVolumeResponse,
    pb::NodeUnpublishVolumeResponse,
);

/// Runs a request's checks.
pub(crate) fn check_request<R: CsiRequest>(req: &R) -> Result<(), ValidationErrors> {
    let mut c = Checker::default();
    req.check(&mut c);
    c.finish()
}

/// Runs a response's checks.
pub(crate) fn check_response<R: CsiResponse>(resp: &R) -> Result<(), ValidationErrors> {
    let mut c = Checker::default();
    resp.check(&mut c);
    c.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(errs: &ValidationErrors) -> Vec<String> {
        errs.violations()
            .iter()
            .map(|v| v.field.to_string())
            .collect()
    }

    #[test]
    fn node_publish_missing_fields_are_named() {
        let req = pb::NodePublishVolumeRequest::default();
        let errs = check_request(&req).unwrap_err();
        assert_eq!(
            fields(&errs),
            ["volume_id", "target_path", "volume_capability"]
        );
    }

    #[test]
    fn secrets_too_large_reports_size_not_value() {
        let mut req = pb::DeleteVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        };
        req.secrets.insert("k".into(), "s3cr3t".repeat(1000));
        let errs = check_request(&req).unwrap_err();
        assert_eq!(fields(&errs), ["secrets"]);
        assert!(!errs.to_string().contains("s3cr3t"));
        assert!(matches!(
            errs.violations()[0].problem,
            Problem::TooLong { limit: 4096, .. }
        ));

        // Secret keys follow the spec's syntax (csi-structs checks it); the value never shows.
        let mut req = pb::DeleteVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        };
        req.secrets.insert("bad key".into(), "hunter2".into());
        let errs = check_request(&req).unwrap_err();
        assert!(fields(&errs)[0].starts_with("secrets"), "{errs}");
        assert!(matches!(
            errs.violations()[0].problem,
            Problem::InvalidCharacter { character: ' ', .. }
        ));
        assert!(!format!("{errs} {errs:?}").contains("hunter2"));
    }

    #[test]
    fn capability_parts_are_checked() {
        let req = pb::ControllerPublishVolumeRequest {
            volume_id: "v".into(),
            node_id: "n".repeat(200), // over 128 but within the 256 a plugin node id may have
            volume_capability: Some(pb::VolumeCapability {
                access_mode: Some(pb::volume_capability::AccessMode { mode: 0 }),
                access_type: None,
            }),
            ..Default::default()
        };
        let errs = check_request(&req).unwrap_err();
        assert_eq!(
            fields(&errs),
            [
                "volume_capability.access_mode.mode",
                "volume_capability.access_type"
            ]
        );
    }

    #[test]
    fn capacity_range_rules() {
        let mut req = pb::ControllerExpandVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        };
        assert_eq!(
            fields(&check_request(&req).unwrap_err()),
            ["capacity_range"]
        );
        req.capacity_range = Some(pb::CapacityRange {
            required_bytes: 10,
            limit_bytes: 5,
        });
        let errs = check_request(&req).unwrap_err();
        assert!(matches!(
            errs.violations()[0].problem,
            Problem::LimitBelowRequired { .. }
        ));
        req.capacity_range = Some(pb::CapacityRange {
            required_bytes: -1,
            limit_bytes: 0,
        });
        let errs = check_request(&req).unwrap_err();
        assert!(matches!(
            errs.violations()[0].problem,
            Problem::Negative { value: -1 }
        ));
        req.capacity_range = Some(pb::CapacityRange {
            required_bytes: 10,
            limit_bytes: 0,
        });
        assert!(check_request(&req).is_ok());
    }

    #[test]
    fn unpublish_without_node_means_all_nodes() {
        let req = pb::ControllerUnpublishVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        };
        assert!(check_request(&req).is_ok());
        assert!(req.context().node_id().is_none());
    }

    #[test]
    fn responses_missing_ids_and_negative_numbers() {
        let resp = pb::ListVolumesResponse {
            entries: vec![
                pb::list_volumes_response::Entry {
                    volume: Some(pb::Volume {
                        capacity_bytes: -5,
                        ..Default::default()
                    }),
                    status: None,
                },
                pb::list_volumes_response::Entry {
                    volume: None,
                    status: None,
                },
            ],
            next_token: String::new(),
        };
        let errs = check_response(&resp).unwrap_err();
        assert_eq!(
            fields(&errs),
            [
                "entries[0].volume.volume_id",
                "entries[0].volume.capacity_bytes",
                "entries[1].volume"
            ]
        );
        let errs = check_response(&pb::GetCapacityResponse {
            available_capacity: -1,
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(fields(&errs), ["available_capacity"]);
        let errs =
            check_response(&pb::NodeExpandVolumeResponse { capacity_bytes: -1 }).unwrap_err();
        assert_eq!(fields(&errs), ["capacity_bytes"]);
        assert!(
            check_response(&pb::GetCapacityResponse {
                available_capacity: 0,
                maximum_volume_size: Some(1),
                minimum_volume_size: None
            })
            .is_ok()
        );
    }

    #[test]
    fn request_names_with_banned_control_characters_are_refused() {
        let create_volume = pb::CreateVolumeRequest {
            name: "vol\u{7}1".into(),
            volume_capabilities: vec![pb::VolumeCapability {
                access_mode: Some(pb::volume_capability::AccessMode { mode: 1 }),
                access_type: Some(pb::volume_capability::AccessType::Block(
                    pb::volume_capability::BlockVolume {},
                )),
            }],
            ..Default::default()
        };
        let create_snapshot = pb::CreateSnapshotRequest {
            source_volume_id: "v".into(),
            name: "snap\u{1b}".into(),
            ..Default::default()
        };
        let create_group = pb::CreateVolumeGroupSnapshotRequest {
            name: "\0group".into(),
            source_volume_ids: vec!["v".into()],
            ..Default::default()
        };
        for (errs, character, position) in [
            (check_request(&create_volume).unwrap_err(), '\u{7}', 3),
            (check_request(&create_snapshot).unwrap_err(), '\u{1b}', 4),
            (check_request(&create_group).unwrap_err(), '\0', 0),
        ] {
            assert_eq!(fields(&errs), ["name"]);
            assert!(
                matches!(
                    errs.violations()[0].problem,
                    Problem::InvalidCharacter { character: c, position: p, .. }
                        if c == character && p == position
                ),
                "{errs:?}"
            );
        }
        // The same names without the control character pass.
        let mut ok = create_volume;
        ok.name = "vol-1".into();
        assert!(check_request(&ok).is_ok());
    }

    #[test]
    fn topologies_in_requests_are_checked_by_csi_structs() {
        let bad_key = pb::Topology {
            segments: [("bad key".to_string(), "a".to_string())].into(),
        };
        let req = pb::GetCapacityRequest {
            accessible_topology: Some(bad_key.clone()),
            ..Default::default()
        };
        let errs = check_request(&req).unwrap_err();
        assert!(
            fields(&errs)[0].starts_with("accessible_topology.segments"),
            "{errs}"
        );
        let req = pb::CreateVolumeRequest {
            name: "vol-1".into(),
            volume_capabilities: vec![pb::VolumeCapability {
                access_mode: Some(pb::volume_capability::AccessMode { mode: 1 }),
                access_type: Some(pb::volume_capability::AccessType::Block(
                    pb::volume_capability::BlockVolume {},
                )),
            }],
            accessibility_requirements: Some(pb::TopologyRequirement {
                requisite: vec![bad_key],
                preferred: vec![],
            }),
            volume_content_source: Some(pb::VolumeContentSource { r#type: None }),
            ..Default::default()
        };
        let errs = check_request(&req).unwrap_err();
        let got = fields(&errs);
        assert_eq!(got.len(), 2, "{errs}");
        assert_eq!(got[0], "volume_content_source.type");
        assert!(
            got[1].starts_with("accessibility_requirements.requisite[0].segments"),
            "{errs}"
        );
    }

    #[test]
    fn listed_volumes_and_snapshots_get_the_create_rules() {
        let bad_key = pb::Topology {
            segments: [("bad key".to_string(), "a".to_string())].into(),
        };
        let resp = pb::ListVolumesResponse {
            entries: vec![pb::list_volumes_response::Entry {
                volume: Some(pb::Volume {
                    volume_id: "v".into(),
                    accessible_topology: vec![bad_key.clone()],
                    ..Default::default()
                }),
                status: None,
            }],
            next_token: String::new(),
        };
        let errs = check_response(&resp).unwrap_err();
        assert_eq!(errs.violations().len(), 1, "{errs}");
        assert!(
            fields(&errs)[0].starts_with("entries[0].volume.accessible_topology[0].segments"),
            "{errs}"
        );
        assert!(matches!(
            errs.violations()[0].problem,
            Problem::InvalidCharacter { character: ' ', .. }
        ));
        // CreateVolume's answer is judged the same way (one home for the rule).
        let created = Volume::try_from(&pb::CreateVolumeResponse {
            volume: resp.entries[0].volume.clone(),
        })
        .unwrap_err();
        assert_eq!(
            created.errors.violations()[0].field.to_string(),
            fields(&errs)[0].trim_start_matches("entries[0].")
        );

        let resp = pb::ControllerGetVolumeResponse {
            volume: resp.entries[0].volume.clone(),
            status: Some(Default::default()),
        };
        let errs = check_response(&resp).unwrap_err();
        assert!(
            fields(&errs)[0].starts_with("volume.accessible_topology[0].segments"),
            "{errs}"
        );

        let resp = pb::ListSnapshotsResponse {
            entries: vec![pb::list_snapshots_response::Entry {
                snapshot: Some(pb::Snapshot {
                    snapshot_id: "s".into(),
                    source_volume_id: "v".into(),
                    creation_time: Some(Default::default()),
                    group_snapshot_id: "g".repeat(129),
                    accessible_topology: vec![bad_key],
                    ..Default::default()
                }),
            }],
            next_token: String::new(),
        };
        let errs = check_response(&resp).unwrap_err();
        let got = fields(&errs);
        assert_eq!(got.len(), 2, "{errs}");
        assert_eq!(got[0], "entries[0].snapshot.group_snapshot_id");
        assert!(
            got[1].starts_with("entries[0].snapshot.accessible_topology[0].segments"),
            "{errs}"
        );
    }

    #[test]
    fn contexts_name_the_objects() {
        let req = pb::ControllerPublishVolumeRequest {
            volume_id: "v1".into(),
            node_id: "n1".into(),
            ..Default::default()
        };
        let ctx = req.context();
        assert_eq!(ctx.rpc(), Rpc::ControllerPublishVolume);
        assert_eq!(ctx.volume_id().map(|v| v.as_str()), Some("v1"));
        assert_eq!(ctx.node_id().map(|v| v.as_str()), Some("n1"));
    }

    #[test]
    fn node_contexts_name_their_paths() {
        use PathField::*;
        fn paths(ctx: CallContext) -> Vec<(PathField, String)> {
            ctx.paths().map(|(f, p)| (f, p.to_owned())).collect()
        }
        let named = |pairs: &[(PathField, &str)]| -> Vec<(PathField, String)> {
            pairs.iter().map(|&(f, p)| (f, p.to_owned())).collect()
        };
        let stage = pb::NodeStageVolumeRequest {
            staging_target_path: "/s".into(),
            ..Default::default()
        };
        assert_eq!(paths(stage.context()), named(&[(StagingTargetPath, "/s")]));
        let unstage = pb::NodeUnstageVolumeRequest {
            staging_target_path: "/s".into(),
            ..Default::default()
        };
        assert_eq!(
            paths(unstage.context()),
            named(&[(StagingTargetPath, "/s")])
        );
        let publish = pb::NodePublishVolumeRequest {
            staging_target_path: "/s".into(),
            target_path: "/t".into(),
            ..Default::default()
        };
        assert_eq!(
            paths(publish.context()),
            named(&[(StagingTargetPath, "/s"), (TargetPath, "/t")])
        );
        // Without staging (no STAGE_UNSTAGE_VOLUME), only the target.
        let publish = pb::NodePublishVolumeRequest {
            target_path: "/t".into(),
            ..Default::default()
        };
        assert_eq!(paths(publish.context()), named(&[(TargetPath, "/t")]));
        let unpublish = pb::NodeUnpublishVolumeRequest {
            target_path: "/t".into(),
            ..Default::default()
        };
        assert_eq!(paths(unpublish.context()), named(&[(TargetPath, "/t")]));
        let stats = pb::NodeGetVolumeStatsRequest {
            volume_path: "/v".into(),
            staging_target_path: "/s".into(),
            ..Default::default()
        };
        assert_eq!(
            paths(stats.context()),
            named(&[(VolumePath, "/v"), (StagingTargetPath, "/s")])
        );
        let health = pb::NodeGetVolumeHealthRequest {
            volume_publish_path: "/p".into(),
            ..Default::default()
        };
        assert_eq!(paths(health.context()), named(&[(VolumePublishPath, "/p")]));
        let expand = pb::NodeExpandVolumeRequest {
            volume_path: "/v".into(),
            ..Default::default()
        };
        assert_eq!(paths(expand.context()), named(&[(VolumePath, "/v")]));
    }
}
