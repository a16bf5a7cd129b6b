//! Register and create, with the undo of a `CreateVolume` whose outcome is uncertain.

use std::collections::BTreeMap;

use csi_rpc_shim::{
    ControllerQuery, ControllerValidate, CreateVolume, CreatedVolume, DeleteVolume, ShimError,
    Validated,
};
use csi_structs::wire::size_from_wire;
use csi_structs::{
    AccessMode, AccessTypeKind, ContentSource, ControllerCapability, ErrorClass, ExternalVolumeId,
    Parameters, PluginId, PluginService, Secrets, SecretsUse, SnapshotId, Topology,
    TopologyRequirement, VolumeContext, VolumeId, VolumeSecrets,
};

use super::error::{CallFailure, deleting, invalid, wire_size};
use super::{ServiceError, ServiceEvent, VolumeService};
use crate::catalog::{CatalogEntry, MayExist};

/// An existing volume to register: [`VolumeService::register_volume`].
#[derive(Clone, Debug)]
pub struct RegisterVolume {
    /// The orchestrator's id.
    pub id: VolumeId,
    /// The plugin's id of the volume.
    pub external_id: ExternalVolumeId,
    /// Its plugin.
    pub plugin: PluginId,
    /// The access mode every claim uses.
    pub access_mode: AccessMode,
    /// Block or mount.
    pub attachment: AccessTypeKind,
    /// Whether it needs `ControllerPublishVolume`; `None`: as the plugin's fingerprint (here
    /// or on a peer) says, refused when there is none.
    pub controller_publish: Option<bool>,
    /// Its volume context.
    pub context: VolumeContext,
    /// The secrets of its calls.
    pub secrets: VolumeSecrets,
    /// Where it is reachable (empty: everywhere).
    pub accessible_topology: Vec<Topology>,
}

impl RegisterVolume {
    /// The mount volume `external_id` of `plugin`, registered as `id` with `access_mode`:
    /// controller publish as the plugin's fingerprint says, no context, secrets or topology;
    /// set the other fields on the result.
    pub fn new(
        id: VolumeId,
        external_id: ExternalVolumeId,
        plugin: PluginId,
        access_mode: AccessMode,
    ) -> Self {
        RegisterVolume {
            id,
            external_id,
            plugin,
            access_mode,
            attachment: AccessTypeKind::Mount,
            controller_publish: None,
            context: VolumeContext::default(),
            secrets: VolumeSecrets::default(),
            accessible_topology: Vec::new(),
        }
    }
}

/// A volume to create: [`VolumeService::create`].
#[derive(Clone, Debug)]
pub struct NewVolume {
    /// The orchestrator's id, also the `CreateVolume` name.
    pub id: VolumeId,
    /// The plugin to create it in.
    pub plugin: PluginId,
    /// The access mode every claim uses.
    pub access_mode: AccessMode,
    /// Block or mount.
    pub attachment: AccessTypeKind,
    /// The size asked for (0: the plugin's default).
    pub capacity_bytes: u64,
    /// The plugin's parameters.
    pub parameters: Parameters,
    /// The secrets of its calls.
    pub secrets: VolumeSecrets,
    /// Where it must be reachable from (one of them).
    pub requisite_topology: Vec<Topology>,
    /// Where it should preferably be.
    pub preferred_topology: Vec<Topology>,
    /// What it is made from (`None`: empty).
    pub source: Option<NewVolumeSource>,
}

impl NewVolume {
    /// A mount volume `id` in `plugin` with `access_mode`, of the plugin's default size,
    /// empty, with no parameters, secrets or topology; set the other fields on the result
    /// (`NewVolume { capacity_bytes: 1 << 30, ..NewVolume::new(id, plugin, mode) }`).
    pub fn new(id: VolumeId, plugin: PluginId, access_mode: AccessMode) -> Self {
        NewVolume {
            id,
            plugin,
            access_mode,
            attachment: AccessTypeKind::Mount,
            capacity_bytes: 0,
            parameters: Parameters::default(),
            secrets: VolumeSecrets::default(),
            requisite_topology: Vec::new(),
            preferred_topology: Vec::new(),
            source: None,
        }
    }
}

/// What a new volume is made from ([`NewVolume::source`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewVolumeSource {
    /// A snapshot of the plugin (its id, as `list_snapshots` shows it); the plugin needs
    /// controller `CREATE_DELETE_SNAPSHOT`.
    Snapshot(SnapshotId),
    /// A copy of a volume of the catalog, in the same plugin; the plugin needs controller
    /// `CLONE_VOLUME`.
    Clone(VolumeId),
}

impl VolumeService {
    /// Registers an existing volume. When a controller of the plugin is known (here or on a
    /// peer), the volume's capability is validated first (`ValidateVolumeCapabilities`).
    ///
    /// # Errors
    ///
    /// [`ServiceError::Conflict`] when the id is taken, [`ServiceError::Invalid`] naming the
    /// field (`controller_publish` unknown, an id that cannot name a directory, a capability
    /// the plugin does not confirm, as `access_mode`), and the validation call's error.
    pub async fn register_volume(&self, r: RegisterVolume) -> Result<CatalogEntry, ServiceError> {
        let volume = r.id.clone();
        self.to_the_end("register_volume", Some(&volume), move |s| async move {
            s.run_register_volume(r).await
        })
        .await
    }

    /// [`register_volume`](Self::register_volume), in its task.
    async fn run_register_volume(&self, r: RegisterVolume) -> Result<CatalogEntry, ServiceError> {
        if self.inner.catalog.get(&r.id).is_some() {
            return Err(taken(&r.id));
        }
        let controller_publish = match r.controller_publish {
            Some(c) => c,
            None => self.controller_publish_of(&r.plugin).ok_or_else(|| {
                invalid(
                    "controller_publish",
                    format!(
                        "plugin {} has no fingerprinted controller here or on a peer; \
                         say whether the volume needs controller publish",
                        r.plugin
                    ),
                )
            })?,
        };
        let entry = CatalogEntry {
            id: r.id,
            external_id: r.external_id,
            plugin: r.plugin,
            access_mode: r.access_mode,
            attachment: r.attachment,
            controller_publish,
            created: false,
            deleting: false,
            capacity_bytes: None,
            context: r.context.into_inner(),
            secrets: r.secrets,
            accessible_topology: r.accessible_topology,
            node_expansion: None,
            may_exist: None,
        };
        self.check_volume_id(&entry.id)?;
        if self.controller_publish_of(&entry.plugin).is_some() {
            self.validate(&entry).await?;
        }
        self.insert(entry).await
    }

    async fn validate(&self, entry: &CatalogEntry) -> Result<(), ServiceError> {
        let answer = self
            .inner
            .shim
            .controller_validate(
                ControllerValidate {
                    query: ControllerQuery::new(entry.plugin.clone()),
                    volume: entry.id.clone(),
                    external_volume: entry.external_id.clone(),
                    capabilities: vec![entry.capability()],
                    volume_context: entry.volume_context(),
                    parameters: Parameters::default(),
                    secrets: entry.secrets.for_use(SecretsUse::Validate),
                },
                self.inner.call_timeout,
            )
            .await
            .map_err(|e| ServiceError::shim("ValidateVolumeCapabilities", &e))?;
        match answer {
            Validated::Confirmed => Ok(()),
            Validated::NotConfirmed { message } => Err(invalid(
                "access_mode",
                format!(
                    "plugin {} does not confirm the capability: {message}",
                    entry.plugin
                ),
            )),
        }
    }

    async fn insert(&self, entry: CatalogEntry) -> Result<CatalogEntry, ServiceError> {
        let id = entry.id.clone();
        self.check_volume_id(&id)?;
        if !self.inner.catalog.insert(entry.clone()).await? {
            return Err(taken(&id));
        }
        tracing::info!(volume = %id, "volume registered");
        self.emit(ServiceEvent::VolumeRegistered {
            volume: id,
            plugin: entry.plugin.clone(),
            created: entry.created,
        });
        Ok(entry)
    }

    /// Creates a volume through a controller of its plugin (here or on a peer) and registers
    /// it. A creation whose outcome is uncertain is undone before the answer (logged, then
    /// `CreateVolume` again by name and `DeleteVolume` of the id it gives); when the undo
    /// fails too, the catalog keeps that the volume may exist (shown, refused by every other
    /// operation) until a create of the id resolves it or a deregistration clears it. One
    /// create per id runs at a time here.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Conflict`] for a taken id or a create of it in flight,
    /// [`ServiceError::Invalid`] naming the field (a plugin no node knows, with the known
    /// ones; a topology the plugin takes none of, a size over the wire's limit), and the
    /// call's error: class
    /// [`Retry`](ErrorClass::Retry) when an uncertain create was undone,
    /// [`Uncertain`](ErrorClass::Uncertain) when it may have left a volume.
    pub async fn create(&self, r: NewVolume) -> Result<CatalogEntry, ServiceError> {
        let volume = r.id.clone();
        self.to_the_end("create", Some(&volume), move |s| async move {
            s.run_create(r).await
        })
        .await
    }

    /// [`create`](Self::create), in its task.
    async fn run_create(&self, r: NewVolume) -> Result<CatalogEntry, ServiceError> {
        let id = r.id;
        if self
            .inner
            .catalog
            .get(&id)
            .is_some_and(|e| e.may_exist.is_none())
        {
            return Err(taken(&id));
        }
        let _turn = self.creating(&id)?;
        let required_bytes = wire_size("capacity_bytes", r.capacity_bytes)?;
        let accessibility_requirements =
            self.requirement(&r.plugin, r.requisite_topology, r.preferred_topology)?;
        let content_source = match &r.source {
            Some(source) => Some(self.content_source(&r.plugin, source)?),
            None => None,
        };
        // After the fields are checked, so a broken field is named before the plugin.
        self.known_plugin(&r.plugin)?;
        let draft = CatalogEntry {
            id: id.clone(),
            external_id: ExternalVolumeId::new("pending").map_err(|e| invalid("id", e))?,
            plugin: r.plugin.clone(),
            access_mode: r.access_mode,
            attachment: r.attachment,
            controller_publish: false,
            created: true,
            deleting: false,
            capacity_bytes: None,
            context: BTreeMap::new(),
            secrets: r.secrets,
            accessible_topology: Vec::new(),
            node_expansion: None,
            may_exist: None,
        };
        self.check_volume_id(&id)?;
        // Read again under the id's turn: a create that made it meanwhile has ended.
        let left = self.inner.catalog.get(&id);
        if left.as_ref().is_some_and(|e| e.may_exist.is_none()) {
            return Err(taken(&id));
        }
        let request = CreateVolume {
            query: ControllerQuery::new(r.plugin.clone()),
            volume: id.clone(),
            required_bytes,
            limit_bytes: 0,
            capabilities: vec![draft.capability()],
            parameters: r.parameters,
            secrets: draft.secrets.for_use(SecretsUse::Create),
            accessibility_requirements,
            content_source,
        };
        let delete_secrets = draft.secrets.for_use(SecretsUse::Delete);
        if let Some(left) = left {
            self.resolve_may_exist(&left, &request, &delete_secrets)
                .await?;
        }
        let created = match self
            .inner
            .shim
            .create_volume(request.clone(), self.inner.call_timeout)
            .await
        {
            Ok(created) => created,
            Err(e) if e.class() == ErrorClass::Uncertain => {
                let failed = self.undo_create(request, delete_secrets, &e).await;
                if failed.class() == Some(ErrorClass::Uncertain) {
                    return Err(self.remember_may_exist(draft, &e, failed).await);
                }
                return Err(failed);
            }
            Err(e) => return Err(ServiceError::shim("CreateVolume", &e)),
        };
        let controller_publish = self.controller_publish_of(&r.plugin).unwrap_or(true);
        self.insert(CatalogEntry {
            external_id: created.external_volume,
            controller_publish,
            capacity_bytes: size_from_wire(created.capacity_bytes),
            context: created.volume_context.into_inner(),
            accessible_topology: created.accessible_topology,
            ..draft
        })
        .await
    }

    /// The plugin's `VolumeContentSource` for `source`, refused before any call when the
    /// plugin's controller does not advertise what it needs, or the volume to clone is not
    /// the plugin's (or not a volume yet, or being deleted).
    fn content_source(
        &self,
        plugin: &PluginId,
        source: &NewVolumeSource,
    ) -> Result<ContentSource, ServiceError> {
        let (field, needs, what) = match source {
            NewVolumeSource::Snapshot(id) => (
                "snapshot",
                ControllerCapability::CreateDeleteSnapshot,
                format!("restore snapshot {id}"),
            ),
            NewVolumeSource::Clone(id) => (
                "clone",
                ControllerCapability::CloneVolume,
                format!("clone volume {id}"),
            ),
        };
        let caps = self.controller_capabilities(plugin).ok_or_else(|| {
            invalid(
                field,
                format!(
                    "plugin {plugin} has no fingerprinted controller here or on a peer, so \
                     whether it can {what} is not known"
                ),
            )
        })?;
        if !caps.controller.contains(needs) {
            return Err(ServiceError::Unsupported(format!(
                "plugin {plugin} does not advertise controller {}: it cannot {what}",
                needs.wire_name()
            )));
        }
        match source {
            NewVolumeSource::Snapshot(id) => Ok(ContentSource::Snapshot(id.clone())),
            NewVolumeSource::Clone(id) => {
                let from = self.entry(id)?;
                if &from.plugin != plugin {
                    return Err(invalid(
                        "clone",
                        format!(
                            "volume {id} is in plugin {}, not {plugin}: a clone is made in its \
                             source's plugin",
                            from.plugin
                        ),
                    ));
                }
                if from.deleting {
                    return Err(deleting(id));
                }
                Ok(ContentSource::Volume(from.external_id))
            }
        }
    }

    /// The `accessibility_requirements` of a create: none without topologies; with them, only
    /// for a plugin that advertises `VOLUME_ACCESSIBILITY_CONSTRAINTS` (the spec forbids
    /// sending them otherwise).
    fn requirement(
        &self,
        plugin: &PluginId,
        requisite: Vec<Topology>,
        preferred: Vec<Topology>,
    ) -> Result<Option<TopologyRequirement>, ServiceError> {
        if requisite.is_empty() && preferred.is_empty() {
            return Ok(None);
        }
        let caps = self.controller_capabilities(plugin).ok_or_else(|| {
            invalid(
                "requisite_topology",
                format!(
                    "plugin {plugin} has no fingerprinted controller here or on a peer, so \
                     whether it takes topology is not known"
                ),
            )
        })?;
        if !caps.plugin.has_accessibility_constraints() {
            return Err(invalid(
                "requisite_topology",
                format!(
                    "plugin {plugin} does not advertise {}: it takes no topology requirement",
                    PluginService::VolumeAccessibilityConstraints
                ),
            ));
        }
        TopologyRequirement::new(requisite, preferred)
            .map(Some)
            .map_err(|e| invalid("preferred_topology", e))
    }

    /// Keeps in the catalog that a volume may exist in `draft`'s plugin under its id, after an
    /// uncertain `CreateVolume` (`error`) whose undo failed (`failed`, the answer). Returns the
    /// answer, saying whether it was kept.
    async fn remember_may_exist(
        &self,
        draft: CatalogEntry,
        error: &ShimError,
        failed: ServiceError,
    ) -> ServiceError {
        let why = CallFailure::of_shim(error).why_create_may_exist();
        let id = draft.id.clone();
        let plugin = draft.plugin.clone();
        let entry = CatalogEntry {
            may_exist: Some(MayExist {
                why: why.to_owned(),
                error: failed.to_string(),
            }),
            ..draft
        };
        let kept = match self.inner.catalog.insert(entry).await {
            Ok(true) => {
                tracing::warn!(
                    volume = %id, plugin = %plugin, why,
                    "a volume may exist in the plugin under this name; kept in the volume book \
                     until a create of the id resolves it or it is deregistered"
                );
                self.emit(ServiceEvent::MayExist {
                    volume: id,
                    plugin,
                    why,
                });
                "kept in the volume book (`volume status` shows it) until `volume create` of \
                 the id again resolves it or `volume deregister` clears it"
                    .to_owned()
            }
            Ok(false) => "already kept in the volume book".to_owned(),
            Err(e) => {
                tracing::error!(volume = %id, error = %e, "the volume that may exist could not be kept in the volume book");
                format!("it could not be kept in the volume book: {e}")
            }
        };
        failed.with_note(&kept)
    }

    /// Resolves a volume that may exist (`left`) before a new create of its id: `CreateVolume`
    /// by the name with the new `request`, then `DeleteVolume` of what it gives; the entry
    /// goes once that worked.
    async fn resolve_may_exist(
        &self,
        left: &CatalogEntry,
        request: &CreateVolume,
        delete_secrets: &Secrets,
    ) -> Result<(), ServiceError> {
        if left.plugin != request.query.plugin {
            return Err(ServiceError::Conflict(format!(
                "volume {} may exist in plugin {} under name {}; create it again with plugin {}, \
                 or deregister it",
                left.id, left.plugin, left.id, left.plugin
            )));
        }
        match self
            .undo_by_name(request.clone(), delete_secrets.clone())
            .await
        {
            Ok(created) => {
                tracing::info!(
                    volume = %left.id, plugin = %left.plugin, external_id = %created.external_volume,
                    "the volume that may have existed is resolved: CreateVolume by name gave it, DeleteVolume removed it"
                );
                self.inner.catalog.remove(&left.id).await?;
                self.emit(ServiceEvent::CreateUndone {
                    volume: left.id.clone(),
                    plugin: left.plugin.clone(),
                    external_id: created.external_volume,
                });
                Ok(())
            }
            Err(undo) => Err(ServiceError::Call {
                step: "CreateVolume",
                class: undo.class(),
                failure: CallFailure::of_shim(&undo),
                detail: format!(
                    "volume {} may exist in plugin {} under name {}; resolving it (CreateVolume \
                     by name, then DeleteVolume) failed, so it is kept: {undo}",
                    left.id, left.plugin, left.id
                ),
            }),
        }
    }

    /// `CreateVolume` again by `request`'s name until an answer is usable, then `DeleteVolume`
    /// of the id it gives ([`csi_client::undo_create_with`]).
    async fn undo_by_name(
        &self,
        request: CreateVolume,
        delete_secrets: Secrets,
    ) -> Result<CreatedVolume, ShimError> {
        let name = request.volume.clone();
        let plugin = request.query.plugin.clone();
        csi_client::undo_create_with(
            csi_client::default_policy(csi_client::Rpc::CreateVolume).backoff,
            ShimError::class,
            || {
                self.inner
                    .shim
                    .create_volume(request.clone(), self.inner.call_timeout)
            },
            |created: &CreatedVolume| {
                let delete = DeleteVolume {
                    query: ControllerQuery::new(plugin.clone()),
                    volume: name.clone(),
                    external_volume: created.external_volume.clone(),
                    secrets: delete_secrets.clone(),
                };
                self.inner
                    .shim
                    .delete_volume(delete, self.inner.call_timeout)
            },
        )
        .await
    }

    /// Undoes a `CreateVolume` whose outcome is uncertain (the volume may exist; its id is
    /// unknown): logged first, then [`undo_by_name`](Self::undo_by_name). The error says
    /// which: undone (class retry: nothing is left, creating again is safe), or a volume
    /// named like the orchestrator's id may be left behind (uncertain).
    async fn undo_create(
        &self,
        request: CreateVolume,
        delete_secrets: Secrets,
        error: &ShimError,
    ) -> ServiceError {
        let name = request.volume.clone();
        let plugin = request.query.plugin.clone();
        tracing::warn!(
            volume = %name, plugin = %plugin, error = %error,
            "CreateVolume's outcome is uncertain; undoing it: CreateVolume again by name, then DeleteVolume"
        );
        let undo = self.undo_by_name(request, delete_secrets).await;
        let failure = CallFailure::of_shim(error);
        match undo {
            Ok(created) => {
                tracing::info!(
                    volume = %name, external_id = %created.external_volume,
                    "uncertain CreateVolume undone: the volume it made is deleted"
                );
                let detail = format!(
                    "{error}; undone: CreateVolume again by name gave volume {}, now deleted",
                    created.external_volume
                );
                self.emit(ServiceEvent::CreateUndone {
                    volume: name,
                    plugin,
                    external_id: created.external_volume,
                });
                ServiceError::Call {
                    step: "CreateVolume",
                    class: ErrorClass::Retry,
                    failure,
                    detail,
                }
            }
            Err(undo) => {
                tracing::error!(
                    volume = %name, error = %undo,
                    "uncertain CreateVolume not undone: a volume of this name may be left behind"
                );
                ServiceError::Call {
                    step: "CreateVolume",
                    class: ErrorClass::Uncertain,
                    failure,
                    detail: format!(
                        "{error}; the undo failed, a volume named {name} may be left behind in plugin {plugin} \
                         (create it again with the same id to find it): {undo}"
                    ),
                }
            }
        }
    }
}

fn taken(id: &VolumeId) -> ServiceError {
    ServiceError::Conflict(format!("volume {id} is already registered"))
}
