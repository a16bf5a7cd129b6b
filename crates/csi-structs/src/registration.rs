//! The orchestrator's record of a volume: which fields the user sets ([`VolumeSpec`]),
//! which the orchestrator owns ([`OrchestratorFields`]), and how a user's update is merged
//! onto a stored volume ([`RegisteredVolume::merge`]).
//!
//! # Who owns what
//!
//! | field | set by | on update |
//! |---|---|---|
//! | `id` | user | identifies the volume; must match |
//! | `name` | user | immutable once set |
//! | `plugin_id` | user | immutable |
//! | `external_id` | user (register) or plugin (create) | immutable once set |
//! | `content_source` | user (create) | immutable once set |
//! | `parameters` | user | immutable once set (non-empty): the spec fixes them at creation |
//! | `volume_context` | user (register) or plugin (create) | immutable once set (non-empty): the spec says the same volume always has the same context |
//! | `requested_topology` | user | immutable once the volume has an accessible topology |
//! | `requested_capabilities` | user | replaced; while in use it must keep the capability in use |
//! | `mount_options` | user | replaced only while not in use |
//! | `secrets` | user | replaced when supplied; **kept when omitted** |
//! | `mutable_parameters` | user | replaced when supplied (the caller then runs `ControllerModifyVolume`) |
//! | `capacity` | user | replaced; the limit may not fall below the current capacity |
//! | origin, current capacity, accessible topology, provider | orchestrator ([`OrchestratorFields`]) | never touched by a merge |
//!
//! # Omitted versus empty
//!
//! Every field of [`VolumeUpdate`] is an `Option`: `None` means "the user did not say",
//! `Some(empty)` means "the user set it to empty". So omitting `secrets` keeps the stored
//! secrets, while `Some(Secrets::new())` clears them; `Some(VolumeContext::new())` on a
//! volume with a context is a change, and rejected.
//!
//! # Merge never half-applies
//!
//! [`RegisteredVolume::merge`] takes `&self` and returns a new value: on error nothing
//! changed, and every rejected field is reported at once.
//!
//! ```
//! use csi_structs::registration::{RegisteredVolume, VolumeSpec, VolumeUpdate, VolumeUsage, VolumeField, MergeError};
//! use csi_structs::{AccessMode, ExternalVolumeId, PluginId, Parameters, Secrets, VolumeCapability, VolumeId};
//!
//! let mut spec = VolumeSpec::new(
//!     VolumeId::new("db")?,
//!     PluginId::new("ebs")?,
//!     vec![VolumeCapability::block(AccessMode::SingleNodeWriter)],
//! );
//! spec.external_id = Some(ExternalVolumeId::new("vol-0abc")?);
//! spec.secrets = Secrets::try_from_iter([("token", "s3cret-marker")])?;
//! spec.parameters = Parameters::try_from_iter([("type", "gp3")])?;
//! let stored = RegisteredVolume::register(spec)?;
//!
//! // Omitting secrets keeps them; changing parameters is refused, naming the field.
//! let mut update = VolumeUpdate::new(VolumeId::new("db")?);
//! update.parameters = Some(Parameters::try_from_iter([("type", "io2")])?);
//! let err = stored.merge(update, &VolumeUsage::NotInUse).unwrap_err();
//! assert_eq!(err.errors, vec![MergeError::Immutable { field: VolumeField::Parameters }]);
//!
//! let merged = stored.merge(VolumeUpdate::new(VolumeId::new("db")?), &VolumeUsage::NotInUse).unwrap();
//! assert_eq!(merged.volume.spec().secrets.expose("token"), Some("s3cret-marker"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeSet;
use std::fmt;

use crate::capability::{
    AccessMode, AccessTypeKind, MountOptions, VolumeCapability, check_capabilities,
};
use crate::capacity::CapacityRange;
use crate::ids::{ExternalVolumeId, PluginId, VolumeId};
use crate::info::PluginInfo;
use crate::limits::{MAX_STRING_BYTES, check_len, check_name_chars};
use crate::maps::{MutableParameters, Parameters, VolumeContext};
use crate::secrets::Secrets;
use crate::topology::{Topology, TopologyRequirement};
use crate::validation::{FieldPath, Problem, ValidationErrors};
use crate::volume::{ContentSource, Volume};

/// The fields a user sets when registering or creating a volume.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeSpec {
    /// The orchestrator's id for the volume.
    pub id: VolumeId,
    /// A display name (at most 128 bytes, no control characters).
    pub name: Option<String>,
    /// The plugin that serves the volume.
    pub plugin_id: PluginId,
    /// The plugin's id for the volume: given by the user when registering an existing
    /// volume, returned by the plugin when the orchestrator creates it.
    pub external_id: Option<ExternalVolumeId>,
    /// The ways the volume may be used (at least one).
    pub requested_capabilities: Vec<VolumeCapability>,
    /// Where a new volume must or should be reachable.
    pub requested_topology: Option<TopologyRequirement>,
    /// Default mount options for filesystem use.
    pub mount_options: MountOptions,
    /// Secrets passed to the plugin's calls.
    pub secrets: Secrets,
    /// Creation parameters.
    pub parameters: Parameters,
    /// Parameters `ControllerModifyVolume` may change.
    pub mutable_parameters: MutableParameters,
    /// The volume's context, passed unchanged to validation and publishing calls.
    pub volume_context: VolumeContext,
    /// The requested size range.
    pub capacity: Option<CapacityRange>,
    /// What a new volume is made from.
    pub content_source: Option<ContentSource>,
}

impl VolumeSpec {
    /// A spec with the required fields and everything else empty.
    pub fn new(
        id: VolumeId,
        plugin_id: PluginId,
        requested_capabilities: Vec<VolumeCapability>,
    ) -> Self {
        Self {
            id,
            name: None,
            plugin_id,
            external_id: None,
            requested_capabilities,
            requested_topology: None,
            mount_options: MountOptions::new(),
            secrets: Secrets::new(),
            parameters: Parameters::new(),
            mutable_parameters: MutableParameters::new(),
            volume_context: VolumeContext::new(),
            capacity: None,
            content_source: None,
        }
    }

    /// Checks what the types alone cannot: the name, at least one capability, the size
    /// limits of every capability and of the mount options.
    ///
    /// # Errors
    ///
    /// Every problem at once, e.g. `requested_capabilities[1].mount.fs_type`.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errs = ValidationErrors::new();
        self.check(&mut errs);
        errs.into_result(())
    }

    fn check(&self, errs: &mut ValidationErrors) {
        if let Some(name) = &self.name {
            let f = FieldPath::named("name");
            check_len(errs, &f, name, MAX_STRING_BYTES);
            check_name_chars(errs, &f, name);
        }
        check_capabilities(
            errs,
            &FieldPath::named("requested_capabilities"),
            &self.requested_capabilities,
        );
        self.mount_options
            .check(errs, &FieldPath::named("mount_options"));
    }
}

/// How a volume came to be known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeOrigin {
    /// An existing volume the user registered.
    Registered,
    /// A volume the orchestrator asked the plugin to create.
    Created,
}

/// The fields only the orchestrator sets. A user's update never touches them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OrchestratorFields {
    /// Registered or created.
    pub origin: VolumeOrigin,
    /// The size the plugin reported (creation or expansion); `None` if unknown.
    pub capacity_bytes: Option<u64>,
    /// Where the volume is reachable; empty means everywhere.
    pub accessible_topology: Vec<Topology>,
    /// The plugin's self-description when the volume was last registered or created.
    pub provider: Option<PluginInfo>,
}

/// A volume as the orchestrator stores it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegisteredVolume {
    spec: VolumeSpec,
    owned: OrchestratorFields,
}

/// Whether the volume is in use while an update arrives, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeUsage {
    /// No workload holds the volume.
    NotInUse,
    /// Workloads hold the volume with this access mode and type.
    InUse {
        /// The access mode in use.
        access_mode: AccessMode,
        /// The access type in use.
        access_type: AccessTypeKind,
    },
}

/// A user-settable field of a volume, as named in merge errors and change sets.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum VolumeField {
    /// `name`.
    Name,
    /// `plugin_id`.
    PluginId,
    /// `external_id`.
    ExternalId,
    /// `requested_capabilities`.
    RequestedCapabilities,
    /// `requested_topology`.
    RequestedTopology,
    /// `mount_options`.
    MountOptions,
    /// `secrets`.
    Secrets,
    /// `parameters`.
    Parameters,
    /// `mutable_parameters`.
    MutableParameters,
    /// `volume_context`.
    VolumeContext,
    /// `capacity`.
    Capacity,
    /// `content_source`.
    ContentSource,
}

impl VolumeField {
    /// The field's name.
    pub const fn as_str(self) -> &'static str {
        match self {
            VolumeField::Name => "name",
            VolumeField::PluginId => "plugin_id",
            VolumeField::ExternalId => "external_id",
            VolumeField::RequestedCapabilities => "requested_capabilities",
            VolumeField::RequestedTopology => "requested_topology",
            VolumeField::MountOptions => "mount_options",
            VolumeField::Secrets => "secrets",
            VolumeField::Parameters => "parameters",
            VolumeField::MutableParameters => "mutable_parameters",
            VolumeField::VolumeContext => "volume_context",
            VolumeField::Capacity => "capacity",
            VolumeField::ContentSource => "content_source",
        }
    }
}

impl fmt::Display for VolumeField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A user's update of a registered volume. `None` = omitted (keep), `Some` = set.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeUpdate {
    /// The volume to update; must equal the stored id.
    pub id: VolumeId,
    /// New display name (immutable once set).
    #[serde(default)]
    pub name: Option<String>,
    /// The plugin (immutable).
    #[serde(default)]
    pub plugin_id: Option<PluginId>,
    /// The plugin's id for the volume (immutable once set).
    #[serde(default)]
    pub external_id: Option<ExternalVolumeId>,
    /// New capabilities.
    #[serde(default)]
    pub requested_capabilities: Option<Vec<VolumeCapability>>,
    /// New topology request.
    #[serde(default)]
    pub requested_topology: Option<TopologyRequirement>,
    /// New mount options.
    #[serde(default)]
    pub mount_options: Option<MountOptions>,
    /// New secrets (`Some(empty)` clears them).
    #[serde(default)]
    pub secrets: Option<Secrets>,
    /// Parameters (immutable once set).
    #[serde(default)]
    pub parameters: Option<Parameters>,
    /// New mutable parameters.
    #[serde(default)]
    pub mutable_parameters: Option<MutableParameters>,
    /// Volume context (immutable once set).
    #[serde(default)]
    pub volume_context: Option<VolumeContext>,
    /// New size range.
    #[serde(default)]
    pub capacity: Option<CapacityRange>,
    /// Content source (immutable once set).
    #[serde(default)]
    pub content_source: Option<ContentSource>,
}

impl VolumeUpdate {
    /// An update of `id` that changes nothing.
    pub fn new(id: VolumeId) -> Self {
        Self {
            id,
            name: None,
            plugin_id: None,
            external_id: None,
            requested_capabilities: None,
            requested_topology: None,
            mount_options: None,
            secrets: None,
            parameters: None,
            mutable_parameters: None,
            volume_context: None,
            capacity: None,
            content_source: None,
        }
    }

    /// An update from a full spec (a user re-registering a volume from a file). Empty maps,
    /// default mount options and absent options count as **omitted**, so re-registering
    /// without secrets keeps the stored ones. Build a `VolumeUpdate` directly to clear a
    /// field.
    pub fn from_spec(spec: VolumeSpec) -> Self {
        fn some_if<T>(keep: bool, v: T) -> Option<T> {
            keep.then_some(v)
        }
        Self {
            id: spec.id,
            name: spec.name,
            plugin_id: Some(spec.plugin_id),
            external_id: spec.external_id,
            requested_capabilities: some_if(
                !spec.requested_capabilities.is_empty(),
                spec.requested_capabilities,
            ),
            requested_topology: spec.requested_topology,
            mount_options: some_if(
                spec.mount_options != MountOptions::new(),
                spec.mount_options,
            ),
            secrets: some_if(!spec.secrets.is_empty(), spec.secrets),
            parameters: some_if(!spec.parameters.is_empty(), spec.parameters),
            mutable_parameters: some_if(
                !spec.mutable_parameters.is_empty(),
                spec.mutable_parameters,
            ),
            volume_context: some_if(!spec.volume_context.is_empty(), spec.volume_context),
            capacity: spec.capacity,
            content_source: spec.content_source,
        }
    }
}

/// One reason a merge was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// The update is for another volume.
    #[error("update for volume {update} cannot be applied to volume {stored}")]
    IdMismatch {
        /// The stored volume's id.
        stored: VolumeId,
        /// The update's id.
        update: VolumeId,
    },
    /// The update changes a field that is immutable (once set).
    #[error("{field} cannot be changed once set")]
    Immutable {
        /// The field.
        field: VolumeField,
    },
    /// The requested topology changes after the volume got an accessible topology.
    #[error("requested_topology cannot be changed once the volume has an accessible topology")]
    TopologyFixed,
    /// The new capabilities drop the one workloads currently use.
    #[error(
        "requested_capabilities must keep the capability in use ({access_mode}, {access_type})"
    )]
    InUseCapabilityDropped {
        /// The access mode in use.
        access_mode: AccessMode,
        /// The access type in use.
        access_type: AccessTypeKind,
    },
    /// Mount options change while the volume is in use.
    #[error("mount_options cannot be changed while the volume is in use")]
    MountOptionsChangedWhileInUse,
    /// The new capacity limit is below the volume's current size (volumes do not shrink).
    #[error(
        "capacity limit {limit_bytes} bytes is below the current capacity {current_bytes} bytes"
    )]
    CapacityBelowCurrent {
        /// The requested limit.
        limit_bytes: u64,
        /// The current size.
        current_bytes: u64,
    },
    /// The merged spec breaks a validation rule.
    #[error("the merged volume is invalid: {0}")]
    InvalidSpec(ValidationErrors),
}

/// Every reason a merge onto one volume was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot update volume {volume}: {}", list(.errors))]
pub struct MergeErrors {
    /// The stored volume's id.
    pub volume: VolumeId,
    /// Every reason, at once (never empty).
    pub errors: Vec<MergeError>,
}

fn list(errors: &[MergeError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A successful merge: the new volume and which user fields changed (so the caller knows
/// whether to expand, modify or re-validate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    /// The volume after the update.
    pub volume: RegisteredVolume,
    /// The fields whose value changed.
    pub changed: BTreeSet<VolumeField>,
}

impl RegisteredVolume {
    /// Records an existing volume the user registers. The accessible topology starts as the
    /// requested `requisite` topologies (the user's statement of where the volume lives).
    ///
    /// # Errors
    ///
    /// The spec's validation errors, plus `external_id` [`Problem::Missing`]: a registered
    /// volume must name the plugin's volume.
    pub fn register(spec: VolumeSpec) -> Result<Self, ValidationErrors> {
        let mut errs = ValidationErrors::new();
        spec.check(&mut errs);
        if spec.external_id.is_none() {
            errs.push(FieldPath::named("external_id"), Problem::Missing);
        }
        let accessible_topology = spec
            .requested_topology
            .as_ref()
            .map(|t| t.requisite().to_vec())
            .unwrap_or_default();
        errs.into_result(Self {
            spec,
            owned: OrchestratorFields {
                origin: VolumeOrigin::Registered,
                capacity_bytes: None,
                accessible_topology,
                provider: None,
            },
        })
    }

    /// Records a volume the orchestrator is about to create; [`record_created`](Self::record_created)
    /// fills in what the plugin returns.
    ///
    /// # Errors
    ///
    /// The spec's validation errors, plus `external_id` [`Problem::NotAllowed`] (the plugin
    /// chooses it) and `volume_context` [`Problem::NotAllowed`] (the plugin returns it).
    pub fn for_creation(spec: VolumeSpec) -> Result<Self, ValidationErrors> {
        let mut errs = ValidationErrors::new();
        spec.check(&mut errs);
        if spec.external_id.is_some() {
            errs.push(FieldPath::named("external_id"), Problem::NotAllowed);
        }
        if !spec.volume_context.is_empty() {
            errs.push(FieldPath::named("volume_context"), Problem::NotAllowed);
        }
        errs.into_result(Self {
            spec,
            owned: OrchestratorFields {
                origin: VolumeOrigin::Created,
                capacity_bytes: None,
                accessible_topology: Vec::new(),
                provider: None,
            },
        })
    }

    /// Rebuilds a stored volume from its parts (e.g. read back from storage).
    pub fn from_parts(spec: VolumeSpec, owned: OrchestratorFields) -> Self {
        Self { spec, owned }
    }

    /// The user-set fields.
    pub fn spec(&self) -> &VolumeSpec {
        &self.spec
    }

    /// The orchestrator-owned fields.
    pub fn owned(&self) -> &OrchestratorFields {
        &self.owned
    }

    /// The orchestrator's id.
    pub fn id(&self) -> &VolumeId {
        &self.spec.id
    }

    /// The plugin's id, once known.
    pub fn external_id(&self) -> Option<&ExternalVolumeId> {
        self.spec.external_id.as_ref()
    }

    /// Records what `CreateVolume` returned: the plugin's id, context, size and topology.
    pub fn record_created(&mut self, volume: &Volume) {
        self.spec.external_id = Some(volume.volume_id.clone());
        self.spec.volume_context = volume.volume_context.clone();
        self.owned.capacity_bytes = volume.capacity_bytes;
        self.owned.accessible_topology = volume.accessible_topology.clone();
    }

    /// Records the size after an expansion.
    pub fn record_capacity(&mut self, capacity_bytes: Option<u64>) {
        self.owned.capacity_bytes = capacity_bytes;
    }

    /// Records the plugin's self-description.
    pub fn record_provider(&mut self, provider: PluginInfo) {
        self.owned.provider = Some(provider);
    }

    /// Merges a user's update onto this volume, returning the result; `self` is never
    /// changed. Orchestrator-owned fields are copied as they are.
    ///
    /// # Errors
    ///
    /// Every refused change at once, see [`MergeError`].
    pub fn merge(&self, update: VolumeUpdate, usage: &VolumeUsage) -> Result<Merged, MergeErrors> {
        let mut errors = Vec::new();
        let mut changed = BTreeSet::new();
        let mut spec = self.spec.clone();
        let stored = &self.spec;

        if update.id != stored.id {
            errors.push(MergeError::IdMismatch {
                stored: stored.id.clone(),
                update: update.id.clone(),
            });
        }

        // Immutable once set: a different value is refused when one is stored.
        fn once_set<T: PartialEq>(
            errors: &mut Vec<MergeError>,
            changed: &mut BTreeSet<VolumeField>,
            field: VolumeField,
            stored: &mut T,
            is_set: bool,
            new: Option<T>,
        ) {
            if let Some(new) = new
                && new != *stored
            {
                if is_set {
                    errors.push(MergeError::Immutable { field });
                } else {
                    *stored = new;
                    changed.insert(field);
                }
            }
        }
        let name_set = stored.name.is_some();
        once_set(
            &mut errors,
            &mut changed,
            VolumeField::Name,
            &mut spec.name,
            name_set,
            update.name.map(Some),
        );
        once_set(
            &mut errors,
            &mut changed,
            VolumeField::PluginId,
            &mut spec.plugin_id,
            true,
            update.plugin_id,
        );
        let ext_set = stored.external_id.is_some();
        once_set(
            &mut errors,
            &mut changed,
            VolumeField::ExternalId,
            &mut spec.external_id,
            ext_set,
            update.external_id.map(Some),
        );
        let src_set = stored.content_source.is_some();
        once_set(
            &mut errors,
            &mut changed,
            VolumeField::ContentSource,
            &mut spec.content_source,
            src_set,
            update.content_source.map(Some),
        );
        let params_set = !stored.parameters.is_empty();
        once_set(
            &mut errors,
            &mut changed,
            VolumeField::Parameters,
            &mut spec.parameters,
            params_set,
            update.parameters,
        );
        let ctx_set = !stored.volume_context.is_empty();
        once_set(
            &mut errors,
            &mut changed,
            VolumeField::VolumeContext,
            &mut spec.volume_context,
            ctx_set,
            update.volume_context,
        );

        if let Some(t) = update.requested_topology
            && Some(&t) != stored.requested_topology.as_ref()
        {
            if self.owned.accessible_topology.is_empty() {
                spec.requested_topology = Some(t);
                changed.insert(VolumeField::RequestedTopology);
            } else {
                errors.push(MergeError::TopologyFixed);
            }
        }

        if let Some(caps) = update.requested_capabilities {
            if let VolumeUsage::InUse {
                access_mode,
                access_type,
            } = *usage
                && !caps
                    .iter()
                    .any(|c| c.access_mode == access_mode && c.access_type.kind() == access_type)
            {
                errors.push(MergeError::InUseCapabilityDropped {
                    access_mode,
                    access_type,
                });
            }
            if caps != stored.requested_capabilities {
                spec.requested_capabilities = caps;
                changed.insert(VolumeField::RequestedCapabilities);
            }
        }

        if let Some(m) = update.mount_options
            && m != stored.mount_options
        {
            if matches!(usage, VolumeUsage::InUse { .. }) {
                errors.push(MergeError::MountOptionsChangedWhileInUse);
            } else {
                spec.mount_options = m;
                changed.insert(VolumeField::MountOptions);
            }
        }

        if let Some(s) = update.secrets
            && s != stored.secrets
        {
            spec.secrets = s;
            changed.insert(VolumeField::Secrets);
        }
        if let Some(m) = update.mutable_parameters
            && m != stored.mutable_parameters
        {
            spec.mutable_parameters = m;
            changed.insert(VolumeField::MutableParameters);
        }

        if let Some(c) = update.capacity {
            if let (Some(limit), Some(current)) = (c.limit_bytes(), self.owned.capacity_bytes)
                && limit < current
            {
                errors.push(MergeError::CapacityBelowCurrent {
                    limit_bytes: limit,
                    current_bytes: current,
                });
            }
            if Some(c) != stored.capacity {
                spec.capacity = Some(c);
                changed.insert(VolumeField::Capacity);
            }
        }

        if let Err(e) = spec.validate() {
            errors.push(MergeError::InvalidSpec(e));
        }

        if errors.is_empty() {
            Ok(Merged {
                volume: RegisteredVolume {
                    spec,
                    owned: self.owned.clone(),
                },
                changed,
            })
        } else {
            Err(MergeErrors {
                volume: self.spec.id.clone(),
                errors,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vid(s: &str) -> VolumeId {
        VolumeId::new(s).unwrap()
    }

    fn stored() -> RegisteredVolume {
        let mut spec = VolumeSpec::new(
            vid("db"),
            PluginId::new("ebs").unwrap(),
            vec![VolumeCapability::mount(
                AccessMode::SingleNodeWriter,
                MountOptions::new(),
            )],
        );
        spec.name = Some("database".into());
        spec.external_id = Some(ExternalVolumeId::new("vol-1").unwrap());
        spec.secrets = Secrets::try_from_iter([("token", "s3cret-marker")]).unwrap();
        spec.parameters = Parameters::try_from_iter([("type", "gp3")]).unwrap();
        spec.volume_context = VolumeContext::try_from_iter([("fs", "ext4")]).unwrap();
        spec.mount_options = MountOptions::new().with_fs_type("ext4");
        let mut v = RegisteredVolume::register(spec).unwrap();
        v.record_capacity(Some(100));
        v
    }

    #[test]
    fn immutable_fields_table() {
        let base = stored();
        type Edit = fn(&mut VolumeUpdate);
        let cases: Vec<(&str, Edit, Vec<MergeError>)> = vec![
            ("nothing", |_| {}, vec![]),
            (
                "same values",
                |u| {
                    u.name = Some("database".into());
                    u.parameters = Some(Parameters::try_from_iter([("type", "gp3")]).unwrap());
                    u.volume_context =
                        Some(VolumeContext::try_from_iter([("fs", "ext4")]).unwrap());
                },
                vec![],
            ),
            (
                "name",
                |u| u.name = Some("other".into()),
                vec![MergeError::Immutable {
                    field: VolumeField::Name,
                }],
            ),
            (
                "plugin",
                |u| u.plugin_id = Some(PluginId::new("gce").unwrap()),
                vec![MergeError::Immutable {
                    field: VolumeField::PluginId,
                }],
            ),
            (
                "external id",
                |u| u.external_id = Some(ExternalVolumeId::new("vol-2").unwrap()),
                vec![MergeError::Immutable {
                    field: VolumeField::ExternalId,
                }],
            ),
            (
                "parameters",
                |u| u.parameters = Some(Parameters::new()),
                vec![MergeError::Immutable {
                    field: VolumeField::Parameters,
                }],
            ),
            (
                "context cleared",
                |u| u.volume_context = Some(VolumeContext::new()),
                vec![MergeError::Immutable {
                    field: VolumeField::VolumeContext,
                }],
            ),
            (
                "content source added",
                |u| {
                    u.content_source = Some(ContentSource::Snapshot(
                        crate::SnapshotId::new("s").unwrap(),
                    ));
                },
                vec![],
            ),
            (
                "capacity below current",
                |u| u.capacity = Some(CapacityRange::at_most(50).unwrap()),
                vec![MergeError::CapacityBelowCurrent {
                    limit_bytes: 50,
                    current_bytes: 100,
                }],
            ),
            (
                "all at once",
                |u| {
                    u.name = Some("x".into());
                    u.plugin_id = Some(PluginId::new("x").unwrap());
                    u.requested_capabilities = Some(vec![]);
                },
                vec![
                    MergeError::Immutable {
                        field: VolumeField::Name,
                    },
                    MergeError::Immutable {
                        field: VolumeField::PluginId,
                    },
                    MergeError::InvalidSpec(ValidationErrors::single(
                        FieldPath::named("requested_capabilities"),
                        Problem::Missing,
                    )),
                ],
            ),
        ];
        for (name, edit, expected) in cases {
            let mut u = VolumeUpdate::new(vid("db"));
            edit(&mut u);
            let got = base
                .merge(u, &VolumeUsage::NotInUse)
                .err()
                .map(|e| e.errors)
                .unwrap_or_default();
            assert_eq!(got, expected, "{name}");
        }
    }

    #[test]
    fn secrets_omitted_keep_empty_clears() {
        let base = stored();
        let kept = base
            .merge(VolumeUpdate::new(vid("db")), &VolumeUsage::NotInUse)
            .unwrap();
        assert_eq!(
            kept.volume.spec().secrets.expose("token"),
            Some("s3cret-marker")
        );
        assert!(kept.changed.is_empty());
        let mut u = VolumeUpdate::new(vid("db"));
        u.secrets = Some(Secrets::new());
        let cleared = base.merge(u, &VolumeUsage::NotInUse).unwrap();
        assert!(cleared.volume.spec().secrets.is_empty());
        assert_eq!(cleared.changed, BTreeSet::from([VolumeField::Secrets]));
        // A re-registration from a spec file without secrets keeps them.
        let mut spec = base.spec().clone();
        spec.secrets = Secrets::new();
        let again = base
            .merge(VolumeUpdate::from_spec(spec), &VolumeUsage::NotInUse)
            .unwrap();
        assert_eq!(
            again.volume.spec().secrets.expose("token"),
            Some("s3cret-marker")
        );
    }

    #[test]
    fn in_use_rules() {
        let base = stored();
        let usage = VolumeUsage::InUse {
            access_mode: AccessMode::SingleNodeWriter,
            access_type: AccessTypeKind::Mount,
        };
        let mut u = VolumeUpdate::new(vid("db"));
        u.requested_capabilities =
            Some(vec![VolumeCapability::block(AccessMode::SingleNodeWriter)]);
        u.mount_options = Some(MountOptions::new().with_fs_type("xfs"));
        let err = base.merge(u.clone(), &usage).unwrap_err();
        assert_eq!(
            err.errors,
            vec![
                MergeError::InUseCapabilityDropped {
                    access_mode: AccessMode::SingleNodeWriter,
                    access_type: AccessTypeKind::Mount
                },
                MergeError::MountOptionsChangedWhileInUse
            ]
        );
        assert!(
            err.to_string().starts_with("cannot update volume db: "),
            "{err}"
        );
        let ok = base.merge(u, &VolumeUsage::NotInUse).unwrap();
        assert_eq!(
            ok.changed,
            BTreeSet::from([
                VolumeField::RequestedCapabilities,
                VolumeField::MountOptions
            ])
        );
    }

    #[test]
    fn topology_fixed_once_accessible() {
        let t = Topology::try_from_iter([("zone", "a")]).unwrap();
        let req = TopologyRequirement::new(vec![t.clone()], vec![]).unwrap();
        let mut spec = stored().spec().clone();
        spec.requested_topology = Some(req);
        let v = RegisteredVolume::register(spec).unwrap();
        assert_eq!(v.owned().accessible_topology, vec![t]);
        let mut u = VolumeUpdate::new(vid("db"));
        u.requested_topology = Some(
            TopologyRequirement::new(
                vec![Topology::try_from_iter([("zone", "b")]).unwrap()],
                vec![],
            )
            .unwrap(),
        );
        assert_eq!(
            v.merge(u, &VolumeUsage::NotInUse).unwrap_err().errors,
            vec![MergeError::TopologyFixed]
        );
    }

    #[test]
    fn register_and_create_rules() {
        let mut spec = stored().spec().clone();
        spec.external_id = None;
        spec.name = Some("bad\u{1}".into());
        let err = RegisteredVolume::register(spec.clone()).unwrap_err();
        let fields: Vec<String> = err
            .violations()
            .iter()
            .map(|v| v.field.to_string())
            .collect();
        assert_eq!(fields, ["name", "external_id"]);
        spec.name = None;
        let err = RegisteredVolume::for_creation(spec.clone()).unwrap_err();
        assert_eq!(err.violations()[0].field.to_string(), "volume_context");
        spec.volume_context = VolumeContext::new();
        let mut v = RegisteredVolume::for_creation(spec).unwrap();
        let created = Volume {
            capacity_bytes: Some(1 << 30),
            ..Volume::new(ExternalVolumeId::new("vol-9").unwrap())
        };
        v.record_created(&created);
        assert_eq!(v.external_id().map(ExternalVolumeId::as_str), Some("vol-9"));
        assert_eq!(v.owned().capacity_bytes, Some(1 << 30));
        assert_eq!(v.owned().origin, VolumeOrigin::Created);
    }

    #[test]
    fn wrong_id_is_refused() {
        let err = stored()
            .merge(VolumeUpdate::new(vid("other")), &VolumeUsage::NotInUse)
            .unwrap_err();
        assert_eq!(
            err.errors,
            vec![MergeError::IdMismatch {
                stored: vid("db"),
                update: vid("other")
            }]
        );
    }

    #[test]
    fn debug_of_a_volume_hides_secrets() {
        let v = stored();
        let shown = format!("{v:?}");
        assert!(!shown.contains("s3cret-marker"), "{shown}");
        assert!(shown.contains("token"));
    }
}
