//! The decision side of `serve`: the operations behind the control API (register, create,
//! claim, release, delete, status), composed from the claim driver, the shim and the node
//! volume manager.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use csi_claims::driver::{ClaimsHandle, DriverError};
use csi_claims::machine::{LastError, Pending};
use csi_claims::store::{ClaimStore, Forgetting};
use csi_claims::{Claim, ClaimMode, ClaimRequest, VolumeStatus};
use csi_rpc_shim::{
    ControllerAttach, ControllerExpand, ControllerQuery, ControllerValidate, CreateSnapshot,
    CreateVolume, CreatedVolume, DeleteSnapshot, DeleteVolume, ListSnapshots, ListVolumes,
    NodeExpand, PluginFailure, Shim, ShimError, SnapshotInfo, Validated,
};
use csi_structs::topology::check_accessible;
use csi_structs::{
    AccessMode, AccessTypeKind, Capabilities, ErrorClass, ExternalVolumeId, NodeId, Parameters,
    PluginId, PluginService, PublishContext, Secrets, SecretsUse, Topology, TopologyRequirement,
    VolumeContext, VolumeExpansion, VolumeId, WorkloadId,
};

use super::plugins::Plugins;
use crate::metrics::{Gauges, Metrics};
use crate::ops::api;
use csi_node::shim::plugin_failure;
// The volume book is csi-control's catalog; the agent keeps calling it the book.
use csi_control::catalog::{
    CatalogEntry as BookEntry, CatalogError as BookError, MayExist, VolumeCatalog,
};
use csi_node::layout::Usage;
use csi_node::state::StateFileError;
use csi_node::volumes::{
    ExpandRequest, MountRequest, PendingStep, Reconciliation, Republish, Restore, Restored,
    StepState, VolumeError, VolumeManager,
};

/// What the agent knows about a peer.
#[derive(Clone, Debug, Default)]
pub struct PeerState {
    /// Whether the last poll answered.
    pub reachable: bool,
    /// Its plugins, from the last answer.
    pub plugins: Vec<api::PeerPlugin>,
    /// The last poll error.
    pub last_error: Option<String>,
}

/// Whose snapshots a snapshot call is about.
#[derive(Clone, Copy, Debug)]
pub enum SnapshotsOf<'a> {
    /// A registered volume's (its plugin, its secrets).
    Volume(&'a str),
    /// A plugin's, any volume (no secrets).
    Plugin(&'a str),
}

/// What the agent asks of the cluster, in cluster mode.
#[async_trait::async_trait]
pub trait ClusterStatus: std::fmt::Debug + Send + Sync {
    /// The store, the members and the controller duty's holder.
    fn view(&self) -> api::ClusterView;

    /// Reports `node` gone for good to every agent (their drivers skip its node steps).
    ///
    /// # Errors
    ///
    /// When the store cannot be written.
    async fn report_node_gone(&self, node: &NodeId) -> Result<(), csi_claims::StoreError>;
}

/// A failed control operation.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No such volume or plugin.
    #[error("no {what} {id:?}")]
    NotFound {
        /// `volume` or `plugin`.
        what: &'static str,
        /// The id asked for.
        id: String,
    },
    /// A field of the request is invalid.
    #[error("field `{field}`: {reason}")]
    BadRequest {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The request conflicts with the current state.
    #[error("{0}")]
    Conflict(String),
    /// The plugin cannot do what was asked (a capability it does not advertise), or not in
    /// the volume's present state.
    #[error("{0}")]
    Unsupported(String),
    /// The claim layer refused or stopped.
    #[error(transparent)]
    Claims(#[from] DriverError),
    /// A plugin call (local or through a peer) failed.
    #[error("{step}: {detail}")]
    Plugin {
        /// What was being done.
        step: &'static str,
        /// The error class.
        class: ErrorClass,
        /// The control API's kind: who said what ([`call_kind`]).
        kind: &'static str,
        /// The error.
        detail: String,
    },
    /// A state file could not be written (the volume book, say): the agent's own disk, never
    /// the plugin's fault.
    #[error(transparent)]
    State(#[from] StateFileError),
    /// The agent's own I/O failed while serving the request (a directory or the usage records
    /// under the data directory could not be written), never the plugin's fault.
    #[error("{step}: {detail}")]
    Local {
        /// What was being done.
        step: &'static str,
        /// The error, naming the file.
        detail: String,
        /// Whether it was the node's database (the usage records, kept in the claim store's
        /// file or `node/node.redb`): answered as a store failure, like the claims'.
        store: bool,
    },
    /// The cluster store failed (cluster mode).
    #[error(transparent)]
    Store(#[from] csi_claims::StoreError),
}

impl From<BookError> for AgentError {
    fn from(e: BookError) -> Self {
        match e {
            BookError::State(e) => AgentError::State(e),
            BookError::Store(e) => AgentError::Store(e),
            claimed @ BookError::Claimed { .. } => AgentError::Conflict(claimed.to_string()),
        }
    }
}

impl AgentError {
    /// The HTTP status, the kind and the class of the error answer. The agent's own
    /// failures (`store`: the claim store, the node's usage records or, in cluster mode,
    /// etcd; `local_io`: a state file or directory under the data directory) are 503 with class `retry`, answered at once,
    /// and never `plugin`.
    pub fn parts(&self) -> (u16, &'static str, Option<ErrorClass>) {
        match self {
            AgentError::NotFound { .. } => (404, "not_found", None),
            AgentError::BadRequest { .. } => (400, "bad_request", None),
            AgentError::Conflict(_) => (409, "conflict", None),
            AgentError::Unsupported(_) => (409, "unsupported", None),
            AgentError::Claims(DriverError::Stopped) => (503, "stopping", None),
            AgentError::Claims(e) if e.is_store_failure() => {
                (503, "store", Some(ErrorClass::Retry))
            }
            AgentError::Claims(_) => (409, "claim", None),
            AgentError::Plugin { class, kind, .. } => (502, kind, Some(*class)),
            AgentError::Local { store: true, .. } => (503, "store", Some(ErrorClass::Retry)),
            AgentError::State(_) | AgentError::Local { .. } => {
                (503, "local_io", Some(ErrorClass::Retry))
            }
            AgentError::Store(e) if e.is_permanent() => (400, "store", None),
            AgentError::Store(_) => (503, "store", Some(ErrorClass::Retry)),
        }
    }
}

/// The control API's kind of a failed plugin call: `plugin` when the plugin answered with
/// an error status, otherwise what happened without one: `plugin_answer` (its answer was
/// unusable), `deadline` (a deadline of ours passed), `plugin_unreachable`,
/// `invalid_request` (refused before sending) or `agent` (the serving agent's own failure);
/// a node operation refused because the plugin is not known to be healthy is
/// `plugin_unhealthy`.
pub fn call_kind(failure: PluginFailure) -> &'static str {
    match failure {
        PluginFailure::UnusableAnswer => "plugin_answer",
        PluginFailure::Deadline => "deadline",
        PluginFailure::Unreachable => "plugin_unreachable",
        PluginFailure::NotSent => "invalid_request",
        PluginFailure::Agent => "agent",
        _ => "plugin",
    }
}

/// Why a failed `CreateVolume` of this [`call_kind`] may have made a volume, for people.
fn why_create_may_exist(kind: &str) -> &'static str {
    match kind {
        "plugin_answer" => "CreateVolume's answer was unusable",
        "deadline" => "CreateVolume's deadline passed",
        _ => "CreateVolume's outcome is uncertain",
    }
}

/// The control API's kind of a failed call through the shim.
fn shim_kind(e: &ShimError) -> &'static str {
    match e {
        ShimError::Plugin { error, .. } => call_kind(error.failure),
        ShimError::DeadlineExceeded { .. } => "deadline",
        _ => "plugin",
    }
}

impl AgentError {
    /// A plugin call made through the shim failed during `step`.
    fn shim(step: &'static str, e: &ShimError) -> AgentError {
        AgentError::Plugin {
            step,
            class: e.class(),
            kind: shim_kind(e),
            detail: e.to_string(),
        }
    }

    /// A node operation failed during `step`.
    fn node(step: &'static str, e: &VolumeError) -> AgentError {
        // Our own disk: the usage records or a directory could not be written.
        if let VolumeError::Dir { .. } | VolumeError::Usage { .. } = e {
            let store = matches!(e, VolumeError::Usage { source, .. }
                if matches!(**source, StateFileError::Store { .. }));
            return AgentError::Local {
                step,
                detail: e.to_string(),
                store,
            };
        }
        if let VolumeError::Path(p) = e {
            return bad(p.field, p);
        }
        fn kind(e: &VolumeError) -> &'static str {
            match e {
                VolumeError::NotUndone { failed, .. } => kind(failed),
                VolumeError::NotConfirmed { source, .. } => kind(source),
                VolumeError::Call { source, .. } => call_kind(plugin_failure(source)),
                VolumeError::PluginMissing { .. } => call_kind(PluginFailure::Unreachable),
                VolumeError::NotHealthy { .. } => "plugin_unhealthy",
                VolumeError::Unsupported { .. }
                | VolumeError::NotHere { .. }
                | VolumeError::Path(_)
                | VolumeError::Dir { .. }
                | VolumeError::Usage { .. } => call_kind(PluginFailure::Agent),
            }
        }
        AgentError::Plugin {
            step,
            class: e.class(),
            kind: kind(e),
            detail: e.to_string(),
        }
    }
}

fn bad(field: &'static str, reason: impl std::fmt::Display) -> AgentError {
    AgentError::BadRequest {
        field,
        reason: reason.to_string(),
    }
}

fn deleting(volume: &VolumeId) -> AgentError {
    AgentError::Conflict(format!(
        "volume {volume} is being deleted; it admits no new claim"
    ))
}

fn parse_volume_id(id: &str) -> Result<VolumeId, AgentError> {
    VolumeId::new(id).map_err(|e| bad("id", e))
}

fn parse_attachment(text: &str) -> Result<AccessTypeKind, AgentError> {
    match text {
        "mount" | "file-system" | "filesystem" => Ok(AccessTypeKind::Mount),
        "block" | "block-device" => Ok(AccessTypeKind::Block),
        other => Err(bad(
            "attachment",
            format!("{other:?} is not `mount` or `block`"),
        )),
    }
}

/// Topologies given as maps of segments, each checked (spec §3.12), naming `field` and the
/// entry.
fn parse_topologies(
    field: &'static str,
    list: Vec<BTreeMap<String, String>>,
) -> Result<Vec<Topology>, AgentError> {
    list.into_iter()
        .enumerate()
        .map(|(i, map)| Topology::new(map).map_err(|e| bad(field, format!("entry {i}: {e}"))))
        .collect()
}

fn parse_access_mode(text: &str) -> Result<AccessMode, AgentError> {
    text.parse::<AccessMode>()
        .map_err(|e| bad("access_mode", e))
}

/// The running agent's decision side.
#[derive(Debug)]
pub struct Agent {
    /// This node.
    pub me: NodeId,
    /// The local plugins.
    pub plugins: Plugins,
    /// The node volume manager.
    pub volumes: VolumeManager,
    /// Registered volumes (shared with the release step's secrets lookup).
    pub book: std::sync::Arc<dyn VolumeCatalog>,
    /// The claim driver.
    pub claims: ClaimsHandle,
    /// The shim.
    pub shim: Shim,
    /// Call metrics.
    pub metrics: Metrics,
    /// Peers, by node.
    pub peers: Mutex<BTreeMap<NodeId, PeerState>>,
    /// The deadline of one call.
    pub call_timeout: Duration,
    /// Cluster mode's members and duty, for `status` (`None`: the embedded store).
    pub cluster: Option<std::sync::Arc<dyn ClusterStatus>>,
    /// The claim store of this node, through which a forced deregistration forgets a volume's
    /// claims (`None` in cluster mode: the volume's record and its claims go together).
    pub forgetting: Option<Arc<Forgetting<dyn ClaimStore>>>,
    /// Ids whose `CreateVolume`, or the undo of an uncertain one, is in flight on this agent.
    /// A second create of the same id is refused meanwhile, so an undo never deletes the
    /// volume a concurrent create of the same name was given.
    pub creating: Mutex<BTreeSet<VolumeId>>,
    /// How the usage records restored at start were confirmed ([`reconcile_node`]); `None`
    /// until it finished.
    ///
    /// [`reconcile_node`]: Agent::reconcile_node
    pub reconciled: Mutex<Option<api::ReconcileView>>,
}

/// An id in [`Agent::creating`], taken out again when dropped.
struct Creating<'a> {
    ids: &'a Mutex<BTreeSet<VolumeId>>,
    id: VolumeId,
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

impl Agent {
    /// A volume of the book; one that may exist only (an uncertain create not undone) is
    /// refused, naming it.
    fn entry(&self, id: &str) -> Result<BookEntry, AgentError> {
        let entry = self.any_entry(id)?;
        if let Some(may) = &entry.may_exist {
            return Err(AgentError::Conflict(format!(
                "volume {} is not created: it may exist in plugin {} under name {} ({}); \
                 `volume create` of the id again resolves it, `volume deregister` clears it",
                entry.id, entry.plugin, entry.id, may.why
            )));
        }
        Ok(entry)
    }

    /// A volume of the book, including one that may exist only.
    fn any_entry(&self, id: &str) -> Result<BookEntry, AgentError> {
        let vid = parse_volume_id(id)?;
        self.book.get(&vid).ok_or_else(|| AgentError::NotFound {
            what: "volume",
            id: id.to_owned(),
        })
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, PeerState>> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `plugin` needs controller publish, from any fingerprint seen (here or on a peer).
    fn controller_publish_of(&self, plugin: &PluginId) -> Option<bool> {
        let local = self
            .plugins
            .views()
            .into_iter()
            .find(|v| v.id == plugin.as_str() && v.name.is_some())
            .filter(|v| v.controller)
            .map(|v| v.controller_publish);
        local.or_else(|| {
            self.peers()
                .values()
                .flat_map(|p| p.plugins.iter())
                .find(|p| p.id == plugin.as_str() && p.controller.is_some())
                .map(|p| p.controller_publish)
        })
    }

    /// What `plugin`'s controller advertises, from a fingerprint here or a peer's report.
    fn controller_capabilities(&self, plugin: &PluginId) -> Option<Capabilities> {
        let local = self
            .plugins
            .client(plugin)
            .map(|(_, fp)| fp.capabilities.clone())
            .filter(|c| c.plugin.has_controller_service());
        local.or_else(|| {
            self.peers()
                .values()
                .flat_map(|p| p.plugins.iter())
                .filter(|p| p.id == plugin.as_str() && p.controller.is_some())
                .find_map(|p| p.capabilities.clone())
        })
    }

    /// Registers an existing volume. When a controller of the plugin is known (here or on a
    /// peer), the volume's capability is validated first (`ValidateVolumeCapabilities`).
    ///
    /// # Errors
    ///
    /// [`AgentError`] naming the bad field, a capability the plugin does not confirm, or a
    /// conflict when the id is taken.
    pub async fn register(&self, r: api::RegisterVolume) -> Result<api::VolumeView, AgentError> {
        let id = parse_volume_id(&r.id)?;
        if self.book.get(&id).is_some() {
            return Err(AgentError::Conflict(format!(
                "volume {id} is already registered"
            )));
        }
        let plugin = PluginId::new(r.plugin.clone()).map_err(|e| bad("plugin", e))?;
        let controller_publish = match r.controller_publish {
            Some(c) => c,
            None => self.controller_publish_of(&plugin).ok_or_else(|| {
                bad(
                    "controller_publish",
                    format!(
                        "plugin {plugin} has no fingerprinted controller here or on a peer; \
                         say whether the volume needs controller publish"
                    ),
                )
            })?,
        };
        VolumeContext::try_new(r.context.clone()).map_err(|e| bad("context", e))?;
        let entry = BookEntry {
            id,
            external_id: ExternalVolumeId::new(r.external_id).map_err(|e| bad("external_id", e))?,
            plugin,
            access_mode: parse_access_mode(&r.access_mode)?,
            attachment: parse_attachment(&r.attachment)?,
            controller_publish,
            created: false,
            deleting: false,
            capacity_bytes: None,
            context: r.context,
            secrets: r.secrets,
            accessible_topology: parse_topologies("accessible_topology", r.accessible_topology)?,
            node_expansion: None,
            may_exist: None,
        };
        self.check_volume_id(&entry)?;
        if self.controller_publish_of(&entry.plugin).is_some() {
            self.validate(&entry).await?;
        }
        self.insert(entry).await
    }

    async fn validate(&self, entry: &BookEntry) -> Result<(), AgentError> {
        let answer = self
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
                self.call_timeout,
            )
            .await
            .map_err(|e| AgentError::shim("ValidateVolumeCapabilities", &e))?;
        match answer {
            Validated::Confirmed => Ok(()),
            Validated::NotConfirmed { message } => Err(bad(
                "access_mode",
                format!(
                    "plugin {} does not confirm the capability: {message}",
                    entry.plugin
                ),
            )),
        }
    }

    async fn insert(&self, entry: BookEntry) -> Result<api::VolumeView, AgentError> {
        let id = entry.id.clone();
        self.check_volume_id(&entry)?;
        if !self.book.insert(entry).await? {
            return Err(AgentError::Conflict(format!(
                "volume {id} is already registered"
            )));
        }
        tracing::info!(volume = %id, "volume registered");
        self.volume(id.as_str())
    }

    fn check_volume_id(&self, entry: &BookEntry) -> Result<(), AgentError> {
        self.volumes
            .layout()
            .staging_path(&entry.id)
            .map(drop)
            .map_err(|e| bad("id", e))
    }

    /// Creates a volume through a controller of its plugin (here or on a peer) and registers it.
    /// A creation whose outcome is uncertain is undone before the answer (logged, then
    /// `CreateVolume` again by name and `DeleteVolume` of the id it gives); one create per id
    /// runs at a time here.
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn create(&self, r: api::CreateVolume) -> Result<api::VolumeView, AgentError> {
        let id = parse_volume_id(&r.id)?;
        if self.book.get(&id).is_some_and(|e| e.may_exist.is_none()) {
            return Err(AgentError::Conflict(format!(
                "volume {id} is already registered"
            )));
        }
        if !self
            .creating
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.clone())
        {
            return Err(AgentError::Conflict(format!(
                "volume {id} is being created (or its uncertain creation undone)"
            )));
        }
        let _creating = Creating {
            ids: &self.creating,
            id: id.clone(),
        };
        let plugin = PluginId::new(r.plugin.clone()).map_err(|e| bad("plugin", e))?;
        let access_mode = parse_access_mode(&r.access_mode)?;
        let attachment = parse_attachment(&r.attachment)?;
        if r.capacity_bytes < 0 {
            return Err(bad("capacity_bytes", "must not be negative"));
        }
        let parameters = Parameters::try_new(r.parameters).map_err(|e| bad("parameters", e))?;
        let accessibility_requirements = self.requirement(
            &plugin,
            parse_topologies("requisite_topology", r.requisite_topology)?,
            parse_topologies("preferred_topology", r.preferred_topology)?,
        )?;
        let draft = BookEntry {
            id: id.clone(),
            external_id: ExternalVolumeId::new("pending").map_err(|e| bad("id", e))?,
            plugin: plugin.clone(),
            access_mode,
            attachment,
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
        self.check_volume_id(&draft)?;
        // Read again under the id's turn: a create that made it meanwhile has ended.
        let left = self.book.get(&id);
        if left.as_ref().is_some_and(|e| e.may_exist.is_none()) {
            return Err(AgentError::Conflict(format!(
                "volume {id} is already registered"
            )));
        }
        let request = CreateVolume {
            query: ControllerQuery::new(plugin.clone()),
            volume: id.clone(),
            required_bytes: r.capacity_bytes,
            limit_bytes: 0,
            capabilities: vec![draft.capability()],
            parameters,
            secrets: draft.secrets.for_use(SecretsUse::Create),
            accessibility_requirements,
        };
        let delete_secrets = draft.secrets.for_use(SecretsUse::Delete);
        if let Some(left) = left {
            self.resolve_may_exist(&left, &request, &delete_secrets)
                .await?;
        }
        let created = match self
            .shim
            .create_volume(request.clone(), self.call_timeout)
            .await
        {
            Ok(created) => created,
            Err(e) if e.class() == ErrorClass::Uncertain => {
                let failed = self.undo_create(request, delete_secrets, &e).await;
                if failed.parts().2 == Some(ErrorClass::Uncertain) {
                    return Err(self.remember_may_exist(draft, &e, failed).await);
                }
                return Err(failed);
            }
            Err(e) => return Err(AgentError::shim("CreateVolume", &e)),
        };
        let controller_publish = self.controller_publish_of(&plugin).unwrap_or(true);
        self.insert(BookEntry {
            external_id: created.external_volume,
            controller_publish,
            capacity_bytes: Some(created.capacity_bytes),
            context: created.volume_context.into_inner(),
            accessible_topology: created.accessible_topology,
            ..draft
        })
        .await
    }

    /// The `accessibility_requirements` of a create: none without topologies; with them, only
    /// for a plugin that advertises `VOLUME_ACCESSIBILITY_CONSTRAINTS` (the spec forbids
    /// sending them otherwise).
    fn requirement(
        &self,
        plugin: &PluginId,
        requisite: Vec<Topology>,
        preferred: Vec<Topology>,
    ) -> Result<Option<TopologyRequirement>, AgentError> {
        if requisite.is_empty() && preferred.is_empty() {
            return Ok(None);
        }
        let caps = self.controller_capabilities(plugin).ok_or_else(|| {
            bad(
                "requisite_topology",
                format!(
                    "plugin {plugin} has no fingerprinted controller here or on a peer, so \
                     whether it takes topology is not known"
                ),
            )
        })?;
        if !caps.plugin.has_accessibility_constraints() {
            return Err(bad(
                "requisite_topology",
                format!(
                    "plugin {plugin} does not advertise {}: it takes no topology requirement",
                    PluginService::VolumeAccessibilityConstraints
                ),
            ));
        }
        TopologyRequirement::new(requisite, preferred)
            .map(Some)
            .map_err(|e| bad("preferred_topology", e))
    }

    /// Keeps in the book that a volume may exist in `draft`'s plugin under its id, after an
    /// uncertain `CreateVolume` (`error`) whose undo failed (`failed`, the answer): shown by
    /// `volume list` and `volume status`, across restarts, until a later create of the id
    /// resolves it or `volume deregister` clears it. Returns the answer, saying whether it
    /// was kept.
    async fn remember_may_exist(
        &self,
        draft: BookEntry,
        error: &ShimError,
        failed: AgentError,
    ) -> AgentError {
        let why = why_create_may_exist(shim_kind(error));
        let id = draft.id.clone();
        let plugin = draft.plugin.clone();
        let entry = BookEntry {
            may_exist: Some(MayExist {
                why: why.to_owned(),
                error: failed.to_string(),
            }),
            ..draft
        };
        let kept = match self.book.insert(entry).await {
            Ok(true) => {
                tracing::warn!(
                    volume = %id, plugin = %plugin, why,
                    "a volume may exist in the plugin under this name; kept in the volume book                      until a create of the id resolves it or it is deregistered"
                );
                "kept in the volume book (`volume status` shows it) until `volume create` of                  the id again resolves it or `volume deregister` clears it"
                    .to_owned()
            }
            Ok(false) => "already kept in the volume book".to_owned(),
            Err(e) => {
                tracing::error!(volume = %id, error = %e, "the volume that may exist could not be kept in the volume book");
                format!("it could not be kept in the volume book: {e}")
            }
        };
        match failed {
            AgentError::Plugin {
                step,
                class,
                kind,
                detail,
            } => AgentError::Plugin {
                step,
                class,
                kind,
                detail: format!("{detail}; {kept}"),
            },
            other => other,
        }
    }

    /// Resolves a volume that may exist (`left`) before a new create of its id: `CreateVolume`
    /// by the name with the new `request`, then `DeleteVolume` of what it gives; the entry
    /// goes once that worked.
    async fn resolve_may_exist(
        &self,
        left: &BookEntry,
        request: &CreateVolume,
        delete_secrets: &Secrets,
    ) -> Result<(), AgentError> {
        if left.plugin != request.query.plugin {
            return Err(AgentError::Conflict(format!(
                "volume {} may exist in plugin {} under name {}; create it again with plugin {},                  or deregister it",
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
                self.book.remove(&left.id).await?;
                Ok(())
            }
            Err(undo) => Err(AgentError::Plugin {
                step: "CreateVolume",
                class: undo.class(),
                kind: shim_kind(&undo),
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
            || self.shim.create_volume(request.clone(), self.call_timeout),
            |created: &CreatedVolume| {
                let delete = DeleteVolume {
                    query: ControllerQuery::new(plugin.clone()),
                    volume: name.clone(),
                    external_volume: created.external_volume.clone(),
                    secrets: delete_secrets.clone(),
                };
                self.shim.delete_volume(delete, self.call_timeout)
            },
        )
        .await
    }

    /// Undoes a `CreateVolume` whose outcome is uncertain (the volume may exist; its id is
    /// unknown): logged first, then `CreateVolume` again by name until an answer is usable
    /// and `DeleteVolume` of the id it gives ([`csi_client::undo_create_with`]). The error
    /// says which: undone (class retry: nothing is left, creating again is safe), or a volume
    /// named like the orchestrator's id may be left behind (uncertain).
    async fn undo_create(
        &self,
        request: CreateVolume,
        delete_secrets: Secrets,
        error: &ShimError,
    ) -> AgentError {
        let name = request.volume.clone();
        let plugin = request.query.plugin.clone();
        tracing::warn!(
            volume = %name, plugin = %plugin, error = %error,
            "CreateVolume's outcome is uncertain; undoing it: CreateVolume again by name, then DeleteVolume"
        );
        let undo = self.undo_by_name(request, delete_secrets).await;
        let kind = shim_kind(error);
        match undo {
            Ok(created) => {
                tracing::info!(
                    volume = %name, external_id = %created.external_volume,
                    "uncertain CreateVolume undone: the volume it made is deleted"
                );
                AgentError::Plugin {
                    step: "CreateVolume",
                    class: ErrorClass::Retry,
                    kind,
                    detail: format!(
                        "{error}; undone: CreateVolume again by name gave volume {}, now deleted",
                        created.external_volume
                    ),
                }
            }
            Err(undo) => {
                tracing::error!(
                    volume = %name, error = %undo,
                    "uncertain CreateVolume not undone: a volume of this name may be left behind"
                );
                AgentError::Plugin {
                    step: "CreateVolume",
                    class: ErrorClass::Uncertain,
                    kind,
                    detail: format!(
                        "{error}; the undo failed, a volume named {name} may be left behind in plugin {plugin} \
                         (create it again with the same id to find it): {undo}"
                    ),
                }
            }
        }
    }

    /// Claims a volume for a workload on this node and publishes it here: claim (durable),
    /// controller publish through the shim when the plugin needs it, then stage and publish.
    /// When publishing fails after the claim, the claim is released at once so the release
    /// pipeline undoes whatever may have happened (including uncertain outcomes), and the
    /// answer waits for that (up to `call_timeout`) and says how it ended.
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn claim(&self, id: &str, r: api::ClaimVolume) -> Result<api::ClaimView, AgentError> {
        let entry = self.entry(id)?;
        if entry.deleting {
            return Err(deleting(&entry.id));
        }
        let workload = WorkloadId::new(r.workload).map_err(|e| bad("workload", e))?;
        let mode = match r.mode.as_str() {
            "read" => ClaimMode::Read,
            "write" => ClaimMode::Write,
            other => return Err(bad("mode", format!("{other:?} is not `read` or `write`"))),
        };
        // Nothing is published through a plugin whose health is not known to be good: refused
        // (retryably, naming the plugin and its health) before the claim.
        let ready = self
            .volumes
            .publishable(&entry.plugin)
            .map_err(|e| AgentError::node("claim", &e))?;
        let plugin_node = ready
            .fingerprint
            .node
            .as_ref()
            .map(|n| n.node_id.clone())
            .ok_or_else(|| AgentError::Conflict("node plugin reported no node id".into()))?;
        // Refused before anything is recorded or called: the plugin could only fail late.
        let node_topology = ready
            .fingerprint
            .node
            .as_ref()
            .and_then(|n| n.topology.as_ref());
        if let Err(refused) = check_accessible(&entry.accessible_topology, node_topology) {
            return Err(AgentError::Conflict(format!(
                "volume {} is {refused} (plugin {} on node {})",
                entry.id, entry.plugin, self.me,
            )));
        }
        let read_only = mode == ClaimMode::Read || entry.access_mode.is_read_only();
        // Refuse a workload id that cannot name its publish directory before claiming.
        self.volumes
            .layout()
            .target_path(
                &entry.id,
                &workload,
                &Usage::of(&entry.capability(), read_only),
            )
            .map_err(|e| bad("workload", e))?;
        let claim = self
            .claims
            .claim(
                &entry.info(),
                ClaimRequest {
                    volume: entry.id.clone(),
                    workload: workload.clone(),
                    node: self.me.clone(),
                    plugin_node: plugin_node.clone(),
                    mode,
                    access_mode: entry.access_mode,
                    attachment: entry.attachment,
                },
            )
            .await?;
        tracing::info!(volume = %entry.id, workload = %workload, "claim durable");
        // In a cluster another agent may have deleted the volume between our read of the
        // book and the claim: its delete compares the claims key, so it either failed (our
        // claim came first) or came first, and then the volume is gone now.
        let refusal = match self.book.confirm(&entry.id).await {
            Ok(Some(now)) if !now.deleting => None,
            Ok(Some(_)) => Some(deleting(&entry.id)),
            Ok(None) => Some(AgentError::NotFound {
                what: "volume",
                id: id.to_owned(),
            }),
            Err(e) => Some(e.into()),
        };
        if let Some(refusal) = refusal {
            tracing::warn!(volume = %entry.id, workload = %workload, error = %refusal, "claim given up: the volume is being deleted");
            if let Err(r) = self.claims.release(&entry.id, &workload).await {
                tracing::warn!(volume = %entry.id, workload = %workload, error = %r, "release of the given-up claim was refused");
            }
            return Err(refusal);
        }
        match self
            .publish(&entry, &workload, &plugin_node, read_only)
            .await
        {
            Ok(target) => {
                self.pending_node_expansion(&entry).await;
                Ok(claim_view(&claim, Some(target.display().to_string())))
            }
            Err(mut e) => {
                tracing::warn!(volume = %entry.id, workload = %workload, error = %e, "publishing failed; releasing the claim");
                // The release undoes whatever the publish may have done (an uncertain
                // controller publish included); the answer waits for it, up to a call's time.
                let deadline = tokio::time::Instant::now() + self.call_timeout;
                let undone = match self
                    .claims
                    .release_and_wait_until(&entry.id, &workload, deadline)
                    .await
                {
                    Ok(_) => {
                        "the claim is released and whatever the publish may have done is undone"
                            .to_owned()
                    }
                    Err(r) => {
                        tracing::warn!(volume = %entry.id, workload = %workload, error = %r, "release after failed publish not finished");
                        format!(
                            "the claim's release, which undoes whatever the publish may have done, is not finished: {r}"
                        )
                    }
                };
                if let AgentError::Plugin { detail, .. } = &mut e {
                    detail.push_str("; ");
                    detail.push_str(&undone);
                }
                Err(e)
            }
        }
    }

    async fn publish(
        &self,
        entry: &BookEntry,
        workload: &WorkloadId,
        plugin_node: &csi_structs::PluginNodeId,
        read_only: bool,
    ) -> Result<std::path::PathBuf, AgentError> {
        let publish_context = if entry.controller_publish {
            self.shim
                .controller_attach(
                    ControllerAttach {
                        query: ControllerQuery::new(entry.plugin.clone()),
                        volume: entry.id.clone(),
                        external_volume: entry.external_id.clone(),
                        node: self.me.clone(),
                        plugin_node: plugin_node.clone(),
                        capability: entry.capability(),
                        // The attachment is the volume's on this node, shared by every claim
                        // here (read or write), so it is read-only only when the access mode
                        // is; a read claim is read-only at its own NodePublishVolume. A
                        // per-claim value would make a write claim after a read claim on the
                        // same node an ALREADY_EXISTS (published with another readonly). The
                        // backend that calls the plugin sends it only with PUBLISH_READONLY.
                        read_only: entry.access_mode.is_read_only(),
                        secrets: entry.secrets.for_use(SecretsUse::ControllerPublish),
                        volume_context: entry.volume_context(),
                    },
                    self.call_timeout,
                )
                .await
                .map_err(|e| AgentError::shim("ControllerPublishVolume", &e))?
                .publish_context
        } else {
            PublishContext::default()
        };
        self.volumes
            .mount(&MountRequest {
                plugin: entry.plugin.clone(),
                volume: entry.id.clone(),
                external_id: entry.external_id.clone(),
                capability: entry.capability(),
                read_only,
                workload: workload.clone(),
                publish_context,
                volume_context: entry.volume_context(),
                secrets: entry.secrets.clone(),
            })
            .await
            .map_err(|e| AgentError::node("mount", &e))
    }

    /// Grows a volume: `ControllerExpandVolume` when the plugin has controller
    /// `EXPAND_VOLUME` (a published volume only with `VolumeExpansion` `ONLINE`), then
    /// `NodeExpandVolume` on every node where it is published when the controller says so, or
    /// when the plugin expands on the node only; the new capacity is recorded. A node
    /// expansion with no node to run on waits for the volume's next claim.
    ///
    /// # Errors
    ///
    /// [`AgentError::Unsupported`] when the plugin cannot expand it (no `EXPAND_VOLUME`; an
    /// offline-only plugin and a published volume; node-only expansion of a volume published
    /// nowhere), [`AgentError::BadRequest`] for a capacity below the current one, and the
    /// calls' errors (a node's saying what the controller step already did).
    pub async fn expand(
        &self,
        id: &str,
        r: api::ExpandVolume,
    ) -> Result<api::ExpandView, AgentError> {
        let entry = self.entry(id)?;
        if entry.deleting {
            return Err(deleting(&entry.id));
        }
        let wanted = r.capacity_bytes;
        if wanted <= 0 {
            return Err(bad("capacity_bytes", "must be more than 0"));
        }
        if let Some(current) = entry.capacity_bytes.filter(|c| wanted < *c) {
            return Err(bad(
                "capacity_bytes",
                format!("{wanted} is below the volume's {current} bytes; volumes only grow"),
            ));
        }
        let plugin = &entry.plugin;
        let controller = self.controller_capabilities(plugin);
        let controller_can = controller
            .as_ref()
            .is_some_and(|c| c.controller.can_expand());
        let node_can = self.node_can_expand(plugin);
        if !controller_can && !node_can {
            return Err(AgentError::Unsupported(format!(
                "plugin {plugin} cannot expand volumes: it advertises neither controller \
                 EXPAND_VOLUME nor node EXPAND_VOLUME"
            )));
        }
        let claims = self
            .claims
            .record(&entry.id)
            .map(|r| r.claims().to_vec())
            .unwrap_or_default();
        // One workload per node where the volume is mounted now.
        let mounted: BTreeMap<NodeId, WorkloadId> = claims
            .iter()
            .filter(|c| !c.state().is_releasing())
            .map(|c| (c.node().clone(), c.workload().clone()))
            .collect();
        let mut capacity = wanted;
        let node_step = if controller_can {
            let online = controller
                .as_ref()
                .is_some_and(|c| c.plugin.has_expansion(VolumeExpansion::Online));
            if !online && !claims.is_empty() {
                let nodes: BTreeSet<String> = claims.iter().map(|c| c.node().to_string()).collect();
                return Err(AgentError::Unsupported(format!(
                    "plugin {plugin} expands volumes offline only (it does not advertise \
                     VolumeExpansion {}) and volume {} is published ({} claim(s), on {}): \
                     release them, then expand",
                    VolumeExpansion::Online,
                    entry.id,
                    claims.len(),
                    nodes.into_iter().collect::<Vec<_>>().join(", ")
                )));
            }
            let expanded = self
                .shim
                .controller_expand(
                    ControllerExpand {
                        query: ControllerQuery::new(plugin.clone()),
                        volume: entry.id.clone(),
                        external_volume: entry.external_id.clone(),
                        required_bytes: wanted,
                        limit_bytes: 0,
                        capability: Some(entry.capability()),
                        secrets: entry.secrets.for_use(SecretsUse::ControllerExpand),
                    },
                    self.call_timeout,
                )
                .await
                .map_err(|e| AgentError::shim("ControllerExpandVolume", &e))?;
            if expanded.capacity_bytes > 0 {
                capacity = expanded.capacity_bytes;
            }
            tracing::info!(volume = %entry.id, capacity_bytes = capacity, node_expansion_required = expanded.node_expansion_required, "volume expanded by the controller");
            expanded.node_expansion_required
        } else if mounted.is_empty() {
            return Err(AgentError::Unsupported(format!(
                "plugin {plugin} expands volumes on the node only (no controller EXPAND_VOLUME) \
                 and volume {} is published nowhere: claim it, then expand",
                entry.id
            )));
        } else {
            true
        };
        self.book
            .update(&entry.id, &|e| {
                e.capacity_bytes = Some(capacity);
                e.node_expansion = node_step.then_some(wanted);
            })
            .await?;
        let mut nodes_expanded = Vec::new();
        if node_step {
            for (node, workload) in &mounted {
                let grown = self
                    .shim
                    .node_expand(
                        NodeExpand {
                            plugin: plugin.clone(),
                            volume: entry.id.clone(),
                            external_volume: entry.external_id.clone(),
                            node: node.clone(),
                            workload: workload.clone(),
                            required_bytes: wanted,
                            limit_bytes: 0,
                            capability: entry.capability(),
                            secrets: entry.secrets.for_use(SecretsUse::NodeExpand),
                        },
                        self.call_timeout,
                    )
                    .await
                    .map_err(|e| AgentError::Plugin {
                        step: "NodeExpandVolume",
                        class: e.class(),
                        kind: shim_kind(&e),
                        detail: format!(
                            "on node {node}: {e}; {}run `volume expand` again to finish",
                            if controller_can {
                                format!(
                                    "ControllerExpandVolume already grew it to {capacity} bytes; "
                                )
                            } else {
                                String::new()
                            }
                        ),
                    })?;
                if !controller_can && grown.capacity_bytes > capacity {
                    capacity = grown.capacity_bytes;
                }
                nodes_expanded.push(node.to_string());
            }
            if !mounted.is_empty() {
                self.book
                    .update(&entry.id, &|e| {
                        e.capacity_bytes = Some(capacity);
                        e.node_expansion = None;
                    })
                    .await?;
            }
        }
        let volume = self.volume(id)?;
        Ok(api::ExpandView {
            node_expansion_pending: volume.node_expansion_pending,
            volume,
            controller_expanded: controller_can,
            nodes_expanded,
        })
    }

    /// Whether a node instance of `plugin` (here or on a peer) advertises `EXPAND_VOLUME`.
    fn node_can_expand(&self, plugin: &PluginId) -> bool {
        let local = self
            .plugins
            .client(plugin)
            .is_some_and(|(_, fp)| fp.serves_node() && fp.capabilities.node.can_expand());
        local
            || self
                .peers()
                .values()
                .flat_map(|p| p.plugins.iter())
                .filter(|p| p.id == plugin.as_str() && p.node.is_some())
                .any(|p| p.capabilities.as_ref().is_some_and(|c| c.node.can_expand()))
    }

    /// The `NodeExpandVolume` an expansion left for the volume's next claim, run here now
    /// that it is published (the spec's order for offline expansion: controller expand,
    /// stage and publish, then node expand). A failure is logged and the expansion stays
    /// pending for the next claim or `volume expand`.
    async fn pending_node_expansion(&self, entry: &BookEntry) {
        let Some(wanted) = entry.node_expansion else {
            return;
        };
        let Ok(capacity) = csi_structs::CapacityRange::new(u64::try_from(wanted).ok(), None) else {
            return;
        };
        let request = ExpandRequest {
            plugin: entry.plugin.clone(),
            volume: entry.id.clone(),
            external_id: entry.external_id.clone(),
            capacity,
            capability: Some(entry.capability()),
            secrets: entry.secrets.for_use(SecretsUse::NodeExpand),
        };
        match self.volumes.expand(&request).await {
            Ok(_) => {
                tracing::info!(volume = %entry.id, capacity_bytes = wanted, "pending node expansion done");
                if let Err(e) = self
                    .book
                    .update(&entry.id, &|e| e.node_expansion = None)
                    .await
                {
                    tracing::warn!(volume = %entry.id, error = %e, "the done node expansion could not be recorded; it runs again");
                }
            }
            Err(e) => {
                tracing::warn!(volume = %entry.id, error = %e, "pending node expansion failed; it stays pending");
            }
        }
    }

    /// Releases every claim of a volume on one node (the node steps through that node's
    /// agent, then the controller step). With `node_gone` the node is reported gone for good
    /// first: every claim made from it (on every volume) is released without node steps, and
    /// the controller step runs even though its agent is not there.
    ///
    /// # Errors
    ///
    /// [`AgentError::Conflict`] when the volume has no claim on the node,
    /// [`AgentError::BadRequest`] for `node_gone` on this agent's own node.
    pub async fn detach(
        &self,
        id: &str,
        r: api::DetachVolume,
    ) -> Result<api::DetachView, AgentError> {
        let entry = self.entry(id)?;
        let node = NodeId::new(r.node).map_err(|e| bad("node", e))?;
        if r.node_gone && node == self.me {
            return Err(bad(
                "node_gone",
                format!("node {node} is this agent's own node, not gone; detach without it"),
            ));
        }
        let on_node: Vec<Claim> = self
            .claims
            .record(&entry.id)
            .map(|r| r.claims().to_vec())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.node() == &node)
            .collect();
        if on_node.is_empty() {
            let hint = if self.cluster.is_none() && node != self.me {
                " (without a cluster store each agent keeps the claims of its own node: run \
                 this on that node's agent)"
            } else {
                ""
            };
            return Err(AgentError::Conflict(format!(
                "volume {} has no claim on node {node} here{hint}",
                entry.id
            )));
        }
        if r.node_gone {
            match &self.cluster {
                Some(cluster) => cluster.report_node_gone(&node).await?,
                None => self.claims.node_gone(&node),
            }
            tracing::warn!(node = %node, volume = %entry.id, "node reported gone for good by an operator");
        }
        let mut releasing = Vec::new();
        for claim in &on_node {
            if !claim.state().is_releasing() {
                self.claims.release(&entry.id, claim.workload()).await?;
            }
            releasing.push(claim.workload().to_string());
        }
        tracing::info!(volume = %entry.id, node = %node, claims = releasing.len(), node_gone = r.node_gone, "detach of a node's claims durable");
        let note = (!r.node_gone && self.node_reachable(&node) == Some(false)).then(|| {
            format!(
                "node {node}'s agent is not reachable now: its node steps wait for it; if the \
                 node is gone for good, detach again with --node-gone"
            )
        });
        Ok(api::DetachView {
            volume: self.volume(id)?,
            releasing,
            node_gone: r.node_gone,
            note,
        })
    }

    /// Whether `node`'s agent answers (`None`: not known here).
    fn node_reachable(&self, node: &NodeId) -> Option<bool> {
        if node == &self.me {
            return Some(true);
        }
        if let Some(cluster) = &self.cluster {
            let members = cluster.view().members;
            return Some(members.iter().any(|m| m.node == node.as_str()));
        }
        self.peers().get(node).map(|p| p.reachable)
    }

    /// Drops a volume from the agent without calling the plugin. Without `force` it must have
    /// no claims; with `force` (and `confirmed`) its claims are forgotten, not released. The
    /// answer lists what stays in the plugin and on nodes, with the call that would remove
    /// each.
    ///
    /// # Errors
    ///
    /// [`AgentError::Conflict`] for claims without `force`, [`AgentError::BadRequest`]
    /// (field `confirmed`, listing what would be left) for `force` without `confirmed`.
    pub async fn deregister(
        &self,
        id: &str,
        r: api::DeregisterVolume,
    ) -> Result<api::DeregisterView, AgentError> {
        let entry = self.any_entry(id)?;
        let view = self.view(&entry);
        let claims = self
            .claims
            .record(&entry.id)
            .map(|r| r.claims().to_vec())
            .unwrap_or_default();
        let left = self.leftovers(&entry, &claims);
        if !claims.is_empty() && !r.force {
            return Err(AgentError::Conflict(format!(
                "volume {id} still has {} claim(s); release them (or `volume detach` a gone \
                 node's), or deregister with --force to forget them",
                claims.len()
            )));
        }
        if r.force && !r.confirmed {
            return Err(bad(
                "confirmed",
                format!(
                    "a forced deregistration forgets {} claim(s) of volume {id} without \
                     releasing them, and leaves: {}; confirm it (--yes) to go ahead",
                    claims.len(),
                    left.join("; ")
                ),
            ));
        }
        if claims.is_empty() {
            // As `delete`: no claim is admitted from here on.
            if self.book.mark_deleting(&entry.id).await?.is_none() {
                return Err(AgentError::NotFound {
                    what: "volume",
                    id: id.to_owned(),
                });
            }
            self.book.remove(&entry.id).await?;
        } else {
            if let Some(store) = &self.forgetting {
                store.forget(&entry.id).await?;
            }
            self.book.forget(&entry.id).await?;
            tracing::warn!(volume = %entry.id, claims = claims.len(), "volume deregistered by force: its claims are forgotten, not released");
        }
        tracing::info!(volume = %entry.id, "volume deregistered; the plugin keeps it");
        Ok(api::DeregisterView {
            volume: view,
            dropped_claims: claims.len(),
            left_in_plugin: left,
        })
    }

    /// What stays behind when the agent forgets `entry` with `claims`: the volume in the
    /// plugin, the node and controller steps not done, and this node's usage record.
    fn leftovers(&self, entry: &BookEntry, claims: &[Claim]) -> Vec<String> {
        if let Some(may) = &entry.may_exist {
            return vec![format!(
                "a volume that may exist in plugin {} under name {} ({}): CreateVolume by that \
                 name, then DeleteVolume of the id it gives, removes it",
                entry.plugin, entry.id, may.why
            )];
        }
        let mut out = vec![format!(
            "volume {} in plugin {}{}: DeleteVolume removes it",
            entry.external_id,
            entry.plugin,
            if entry.created {
                " (created by this agent)"
            } else {
                ""
            }
        )];
        let mut attached = BTreeSet::new();
        for c in claims {
            if c.state().node_step().is_none() {
                let at = (c.node() == &self.me)
                    .then(|| self.volumes.published(&entry.id, c.workload()))
                    .flatten()
                    .map(|p| format!(" at {}", p.display()))
                    .unwrap_or_default();
                out.push(format!(
                    "publication for workload {} on node {}{at}: NodeUnpublishVolume (and \
                     NodeUnstageVolume with the node's last one) not done",
                    c.workload(),
                    c.node()
                ));
            }
            if entry.controller_publish
                && c.state().controller_step().is_none()
                && attached.insert(c.node().clone())
            {
                out.push(format!(
                    "attachment to node {} (plugin node {}): ControllerUnpublishVolume not done",
                    c.node(),
                    c.plugin_node()
                ));
            }
        }
        if self
            .volumes
            .records()
            .iter()
            .any(|r| r.volume == entry.id.as_str())
        {
            out.push(
                "this node's usage record of the volume (in the node's database), kept while \
                 its mounts may exist"
                    .to_owned(),
            );
        }
        out
    }

    /// Refuses, naming what is missing, unless `plugin`'s controller (here or on a peer)
    /// advertises what `rpc` needs.
    fn require(&self, plugin: &PluginId, rpc: csi_client::Rpc) -> Result<(), AgentError> {
        let caps = self
            .controller_capabilities(plugin)
            .ok_or_else(|| AgentError::Plugin {
                step: rpc.name(),
                class: ErrorClass::RetryElsewhere,
                kind: call_kind(PluginFailure::Unreachable),
                detail: format!(
                    "plugin {plugin} has no fingerprinted controller here or on a peer"
                ),
            })?;
        match caps.unmet(csi_structs::capability_set::requirement_for(rpc)) {
            None => Ok(()),
            Some(missing) => Err(AgentError::Unsupported(format!(
                "plugin {plugin} does not advertise {missing}: it serves no {}",
                rpc.name()
            ))),
        }
    }

    /// The plugin's own listing (`ListVolumes`, every page), each volume with the agent's id
    /// for it when the agent knows it.
    ///
    /// # Errors
    ///
    /// [`AgentError::Unsupported`] without `LIST_VOLUMES`, and the call's error.
    pub async fn list_external(
        &self,
        plugin: &str,
    ) -> Result<Vec<api::ExternalVolumeView>, AgentError> {
        let plugin = PluginId::new(plugin).map_err(|e| bad("plugin", e))?;
        self.require(&plugin, csi_client::Rpc::ListVolumes)?;
        let page = self
            .shim
            .list_volumes(
                ListVolumes {
                    query: ControllerQuery::new(plugin.clone()),
                    max_entries: 0,
                    starting_token: String::new(),
                },
                self.call_timeout,
            )
            .await
            .map_err(|e| AgentError::shim("ListVolumes", &e))?;
        let known = self.known_volumes(&plugin);
        Ok(page
            .entries
            .into_iter()
            .map(|v| api::ExternalVolumeView {
                known_as: known.get(&v.external_volume).map(ToString::to_string),
                external_id: v.external_volume.to_string(),
                capacity_bytes: v.capacity_bytes,
                published_nodes: v.published_nodes.iter().map(ToString::to_string).collect(),
            })
            .collect())
    }

    /// The agent's volumes of `plugin`, by the plugin's id.
    fn known_volumes(&self, plugin: &PluginId) -> BTreeMap<ExternalVolumeId, VolumeId> {
        self.book
            .list()
            .into_iter()
            .filter(|e| &e.plugin == plugin)
            .map(|e| (e.external_id, e.id))
            .collect()
    }

    fn snapshot_view(&self, plugin: &PluginId, s: SnapshotInfo) -> api::SnapshotView {
        let source_volume = self
            .known_volumes(plugin)
            .get(&s.source)
            .map(ToString::to_string);
        api::SnapshotView {
            plugin: plugin.to_string(),
            snapshot_id: s.snapshot.to_string(),
            source_external_id: s.source.to_string(),
            source_volume,
            size_bytes: s.size_bytes,
            ready_to_use: s.ready_to_use,
        }
    }

    /// Cuts a snapshot of a volume (`CreateSnapshot`, with the volume's `snapshot` secrets).
    ///
    /// # Errors
    ///
    /// [`AgentError::Unsupported`] without `CREATE_DELETE_SNAPSHOT`,
    /// [`AgentError::BadRequest`] for a name or parameters the spec does not allow, and the
    /// call's error.
    pub async fn create_snapshot(
        &self,
        id: &str,
        r: api::CreateSnapshot,
    ) -> Result<api::SnapshotView, AgentError> {
        let entry = self.entry(id)?;
        self.require(&entry.plugin, csi_client::Rpc::CreateSnapshot)?;
        csi_structs::limits::validate_request_name(&csi_structs::FieldPath::named("name"), &r.name)
            .map_err(|e| bad("name", e))?;
        let parameters = Parameters::try_new(r.parameters).map_err(|e| bad("parameters", e))?;
        let snapshot = self
            .shim
            .create_snapshot(
                CreateSnapshot {
                    query: ControllerQuery::new(entry.plugin.clone()),
                    volume: entry.id.clone(),
                    source: entry.external_id.clone(),
                    name: r.name,
                    parameters,
                    secrets: entry.secrets.for_use(SecretsUse::Snapshot),
                },
                self.call_timeout,
            )
            .await
            .map_err(|e| AgentError::shim("CreateSnapshot", &e))?;
        tracing::info!(volume = %entry.id, snapshot = %snapshot.snapshot, ready = snapshot.ready_to_use, "snapshot cut");
        Ok(self.snapshot_view(&entry.plugin, snapshot))
    }

    /// Every snapshot (`ListSnapshots`, every page) of a volume, or of a plugin.
    ///
    /// # Errors
    ///
    /// [`AgentError::Unsupported`] without `LIST_SNAPSHOTS`, and the call's error.
    pub async fn list_snapshots(
        &self,
        of: SnapshotsOf<'_>,
    ) -> Result<Vec<api::SnapshotView>, AgentError> {
        let (plugin, source, secrets) = self.snapshots_of(of)?;
        self.require(&plugin, csi_client::Rpc::ListSnapshots)?;
        let page = self
            .shim
            .list_snapshots(
                ListSnapshots {
                    query: ControllerQuery::new(plugin.clone()),
                    source,
                    snapshot: None,
                    max_entries: 0,
                    starting_token: String::new(),
                    secrets,
                },
                self.call_timeout,
            )
            .await
            .map_err(|e| AgentError::shim("ListSnapshots", &e))?;
        Ok(page
            .entries
            .into_iter()
            .map(|s| self.snapshot_view(&plugin, s))
            .collect())
    }

    /// Deletes a snapshot of a volume (with its `snapshot` secrets) or of a plugin.
    ///
    /// # Errors
    ///
    /// [`AgentError::Unsupported`] without `CREATE_DELETE_SNAPSHOT`, and the call's error.
    pub async fn delete_snapshot(
        &self,
        of: SnapshotsOf<'_>,
        snapshot: &str,
    ) -> Result<api::SnapshotDeleted, AgentError> {
        let (plugin, _, secrets) = self.snapshots_of(of)?;
        self.require(&plugin, csi_client::Rpc::DeleteSnapshot)?;
        let snapshot = csi_structs::SnapshotId::new(snapshot).map_err(|e| bad("snapshot", e))?;
        self.shim
            .delete_snapshot(
                DeleteSnapshot {
                    query: ControllerQuery::new(plugin.clone()),
                    snapshot: snapshot.clone(),
                    secrets,
                },
                self.call_timeout,
            )
            .await
            .map_err(|e| AgentError::shim("DeleteSnapshot", &e))?;
        tracing::info!(plugin = %plugin, snapshot = %snapshot, "snapshot deleted");
        Ok(api::SnapshotDeleted {
            plugin: plugin.to_string(),
            snapshot_id: snapshot.to_string(),
        })
    }

    /// The plugin, the source filter and the secrets of a snapshot call.
    fn snapshots_of(
        &self,
        of: SnapshotsOf<'_>,
    ) -> Result<(PluginId, Option<ExternalVolumeId>, Secrets), AgentError> {
        match of {
            SnapshotsOf::Volume(id) => {
                let entry = self.entry(id)?;
                let secrets = entry.secrets.for_use(SecretsUse::Snapshot);
                Ok((entry.plugin, Some(entry.external_id), secrets))
            }
            SnapshotsOf::Plugin(plugin) => Ok((
                PluginId::new(plugin).map_err(|e| bad("plugin", e))?,
                None,
                Secrets::default(),
            )),
        }
    }

    /// Starts releasing a claim; returns once the release is durable.
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn release(
        &self,
        id: &str,
        r: api::ReleaseVolume,
    ) -> Result<api::VolumeView, AgentError> {
        let entry = self.entry(id)?;
        let workload = WorkloadId::new(r.workload).map_err(|e| bad("workload", e))?;
        self.claims.release(&entry.id, &workload).await?;
        tracing::info!(volume = %entry.id, workload = %workload, "release durable");
        self.volume(id)
    }

    /// Deletes a volume with no claims: in the plugin when the agent created it, then from
    /// the book.
    ///
    /// # Errors
    ///
    /// [`AgentError::Conflict`] while claims remain.
    pub async fn delete(&self, id: &str) -> Result<api::VolumeView, AgentError> {
        let entry = self.entry(id)?;
        let view = self.volume(id)?;
        if !view.claims.is_empty() {
            return Err(AgentError::Conflict(format!(
                "volume {id} still has {} claim(s); release them first",
                view.claims.len()
            )));
        }
        // No claim is admitted from here on; in a cluster, a claim another agent made a
        // moment ago makes this fail instead.
        let Some(entry) = self.book.mark_deleting(&entry.id).await? else {
            return Err(AgentError::NotFound {
                what: "volume",
                id: id.to_owned(),
            });
        };
        if entry.created {
            self.shim
                .delete_volume(
                    DeleteVolume {
                        query: ControllerQuery::new(entry.plugin.clone()),
                        volume: entry.id.clone(),
                        external_volume: entry.external_id.clone(),
                        secrets: entry.secrets.for_use(SecretsUse::Delete),
                    },
                    self.call_timeout,
                )
                .await
                .map_err(|e| AgentError::shim("DeleteVolume", &e))?;
        }
        self.book.remove(&entry.id).await?;
        tracing::info!(volume = %entry.id, "volume deleted");
        Ok(view)
    }

    /// One volume with its claims and release.
    ///
    /// # Errors
    ///
    /// [`AgentError::NotFound`].
    pub fn volume(&self, id: &str) -> Result<api::VolumeView, AgentError> {
        let entry = self.any_entry(id)?;
        Ok(self.view(&entry))
    }

    fn view(&self, entry: &BookEntry) -> api::VolumeView {
        // Only stored claims: one being written is not shown as taken before it is durable.
        let claims: Vec<api::ClaimView> = self
            .claims
            .stored_record(&entry.id)
            .map(|r| {
                r.claims()
                    .iter()
                    .map(|c| {
                        let target = (c.node() == &self.me)
                            .then(|| self.volumes.published(c.volume(), c.workload()))
                            .flatten();
                        claim_view(c, target.map(|t| t.display().to_string()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let release = self
            .claims
            .status(&entry.id)
            .filter(|s| s.last_error.is_some() || s.claims.iter().any(|c| c.state().is_releasing()))
            .map(|s| release_view(&s));
        api::VolumeView {
            id: entry.id.to_string(),
            external_id: entry.external_id.to_string(),
            plugin: entry.plugin.to_string(),
            access_mode: entry.access_mode.wire_name().to_owned(),
            attachment: entry.attachment.to_string(),
            controller_publish: entry.controller_publish,
            created: entry.created,
            secret_names: entry.secret_names(),
            capacity_bytes: entry.capacity_bytes,
            accessible_topology: entry
                .accessible_topology
                .iter()
                .map(|t| t.as_map().clone())
                .collect(),
            node_expansion_pending: entry.node_expansion.is_some(),
            claims,
            release,
            calls_in_flight: self.calls_in_flight(entry),
            may_exist: entry.may_exist.as_ref().map(|may| api::MayExistView {
                plugin: entry.plugin.to_string(),
                name: entry.id.to_string(),
                why: may.why.clone(),
                error: may.error.clone(),
            }),
        }
    }

    /// This agent's plugin calls about `entry`'s volume in flight now.
    fn calls_in_flight(&self, entry: &BookEntry) -> Vec<api::CallInFlightView> {
        let now = std::time::Instant::now();
        self.plugins
            .calls_in_flight()
            .for_volume(&entry.external_id)
            .into_iter()
            .map(|call| api::CallInFlightView {
                rpc: call.rpc.name().to_owned(),
                waiting: match call.waiting {
                    csi_client::Waiting::Turn => "turn",
                    csi_client::Waiting::Backoff => "backoff",
                    _ => "answer",
                }
                .to_owned(),
                attempt: call.attempt,
                max_attempts: call.max_attempts,
                attempt_deadline_ms: u64::try_from(call.attempt_deadline.as_millis())
                    .unwrap_or(u64::MAX),
                elapsed_ms: u64::try_from(call.elapsed_at(now).as_millis()).unwrap_or(u64::MAX),
                summary: call.to_string(),
            })
            .collect()
    }

    /// Every registered volume.
    pub fn volumes(&self) -> Vec<api::VolumeView> {
        self.book.list().iter().map(|e| self.view(e)).collect()
    }

    /// Local plugins, then the plugins peers reported.
    pub fn plugin_views(&self) -> Vec<api::PluginView> {
        let mut out = self.plugins.views();
        let in_use = self.volumes.in_use();
        for v in &mut out {
            v.in_use = in_use.get(v.id.as_str()).copied().unwrap_or(0);
        }
        for (node, peer) in self.peers().iter() {
            for p in &peer.plugins {
                let healthy = p.controller.unwrap_or(true) && p.node.as_ref().is_none_or(|n| n.1);
                out.push(api::PluginView {
                    id: p.id.clone(),
                    node: node.to_string(),
                    socket: None,
                    health: if !peer.reachable {
                        "unknown".into()
                    } else if healthy {
                        "healthy".into()
                    } else {
                        "unhealthy".into()
                    },
                    health_reason: None,
                    name: None,
                    version: None,
                    controller: p.controller.is_some(),
                    node_service: p.node.is_some(),
                    plugin_node: p.node.as_ref().map(|n| n.0.clone()),
                    controller_publish: p.controller_publish,
                    staging: false,
                    fingerprints: 0,
                    last_error: None,
                    in_use: 0,
                });
            }
        }
        out
    }

    /// Claims per state over every registered volume.
    pub fn claim_counts(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for e in self.book.list() {
            if let Some(r) = self.claims.stored_record(&e.id) {
                for c in r.claims() {
                    *counts.entry(c.state().name().to_owned()).or_default() += 1;
                }
            }
        }
        counts
    }

    /// `csi-agent status`.
    pub fn status(&self) -> api::StatusView {
        api::StatusView {
            node: self.me.to_string(),
            plugins: self.plugin_views(),
            peers: self
                .peers()
                .iter()
                .map(|(n, p)| api::PeerView {
                    node: n.to_string(),
                    reachable: p.reachable,
                    plugins: p.plugins.len(),
                    last_error: p.last_error.clone(),
                })
                .collect(),
            volumes: self.book.list().len(),
            claims: self.claim_counts(),
            stuck: self.claims.stuck().iter().map(release_view).collect(),
            uncertain: self
                .volumes
                .uncertain()
                .into_iter()
                .map(|p| api::UncertainView {
                    volume: p.volume.into_inner(),
                    workload: p
                        .workload
                        .map_or_else(|| "-".into(), WorkloadId::into_inner),
                    step: match p.step {
                        PendingStep::Stage => "stage",
                        PendingStep::Publish => "publish",
                    }
                    .into(),
                    path: p.path.display().to_string(),
                })
                .collect(),
            cluster: self.cluster.as_ref().map(|c| c.view()),
            store_failure: self.claims.store_failure(),
            failing_files: failing_files(),
            reconcile: self
                .reconciled
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }

    /// Confirms the node's usage records restored at start against their plugins (csi-node's
    /// [`VolumeManager::reconcile`]), after waiting up to `wait` for each of their plugins to
    /// be fingerprinted and healthy. A publication whose claim is taken on this node is
    /// staged and published again with the book's capability, context and secrets (read-only
    /// as the claim says); every other one (a claim releasing or unknown) is kept for its
    /// release. The outcome is logged and kept for `status`.
    pub async fn reconcile_node(&self, wait: Duration) -> api::ReconcileView {
        let records = self.volumes.records();
        let plugins: BTreeSet<PluginId> = records.iter().map(|r| r.plugin.clone()).collect();
        let deadline = tokio::time::Instant::now() + wait;
        let mut plugins_not_ready = Vec::new();
        for id in plugins {
            if let Err(e) = self.plugins.manager().wait_for(&id, deadline).await {
                tracing::warn!(plugin = %id, error = %e, "plugin of restored usage records not ready; their records are kept");
                plugins_not_ready.push(id.into_inner());
            }
        }
        let lookup = |p: &Restored| self.restore(p);
        let report = self.volumes.reconcile(&lookup).await;
        let view = api::ReconcileView {
            plugins_not_ready,
            records: report.records.iter().map(reconciled_view).collect(),
        };
        let count = |action: &str| view.records.iter().filter(|r| r.action == action).count();
        tracing::info!(
            records = view.records.len(),
            republished = count("republished"),
            released = count("released") + count("cleaned"),
            kept = count("kept"),
            not_confirmed = report.failed().count(),
            "usage records restored at start confirmed with their plugins"
        );
        *self
            .reconciled
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(view.clone());
        view
    }

    /// What a restored publication needs to be published again: its claim taken on this
    /// node and the volume in the book; otherwise it is kept for its release.
    fn restore(&self, p: &Restored) -> Restore {
        let Some(entry) = self.book.get(&p.volume).filter(|e| e.plugin == p.plugin) else {
            return Restore::Keep;
        };
        let Some(record) = self.claims.record(&p.volume) else {
            return Restore::Keep;
        };
        let Some(claim) = record.claims().iter().find(|c| {
            c.workload() == &p.workload && c.node() == &self.me && !c.state().is_releasing()
        }) else {
            return Restore::Keep;
        };
        Restore::Republish(Republish {
            capability: entry.capability(),
            read_only: csi_node::attach::read_only(claim),
            volume_context: entry.volume_context(),
            secrets: entry.secrets.clone(),
        })
    }

    /// The metrics page.
    pub fn metrics_text(&self) -> String {
        let mut plugins = BTreeMap::new();
        for v in self.plugin_views() {
            *plugins.entry(v.health).or_default() += 1;
        }
        self.metrics.render(&Gauges {
            claims: self.claim_counts(),
            stuck_releases: self.claims.stuck().len() as u64,
            plugins,
            store_failing: self.claims.store_failure().is_some(),
            failing_files: failing_files().len() as u64,
        })
    }
}

/// One record's confirmation for the API.
fn reconciled_view(r: &Reconciliation) -> api::ReconciledView {
    let state = |s: Option<StepState>| match s {
        Some(StepState::Done) => "done",
        Some(StepState::Uncertain) => "uncertain",
        Some(StepState::Started) => "started",
        None => "-",
    };
    let error = r.error();
    api::ReconciledView {
        plugin: r.plugin.to_string(),
        volume: r.volume.to_string(),
        workload: r
            .workload
            .as_ref()
            .map_or_else(|| "-".to_owned(), ToString::to_string),
        found: format!(
            "stage {}, publish {}",
            state(r.found.stage),
            state(r.found.publish)
        ),
        action: r.action().to_owned(),
        error: error.map(ToString::to_string),
        class: error.map(|e| e.class().as_str().to_owned()),
    }
}

/// The state files whose last write failed, as `<file>: <error>`.
fn failing_files() -> Vec<String> {
    csi_node::state::failing()
        .into_iter()
        .map(|(_, error)| error)
        .collect()
}

/// A claim for the API.
pub fn claim_view(c: &Claim, target_path: Option<String>) -> api::ClaimView {
    api::ClaimView {
        volume: c.volume().to_string(),
        workload: c.workload().to_string(),
        node: c.node().to_string(),
        plugin_node: c.plugin_node().to_string(),
        mode: c.mode().as_str().to_owned(),
        access_mode: c.access_mode().wire_name().to_owned(),
        state: c.state().name().to_owned(),
        target_path,
    }
}

/// A release for the API.
pub fn release_view(s: &VolumeStatus) -> api::ReleaseView {
    let (pending, pending_workload) = match &s.pending {
        Pending::Nothing => ("nothing", None),
        Pending::NodeDetach(w) => ("node_detach", Some(w.to_string())),
        Pending::ControllerDetach(w) => ("controller_detach", Some(w.to_string())),
        Pending::ControllerSlot(w) => ("controller_slot", Some(w.to_string())),
        Pending::Backoff { step, .. } => ("backoff", step.workload().map(ToString::to_string)),
    };
    let backoff_step = match &s.pending {
        Pending::Backoff { step, .. } => Some(step.name().to_owned()),
        _ => None,
    };
    let (last_error, last_error_class) = match &s.last_error {
        Some(LastError::Detach { error, .. }) => (
            Some(error.to_string()),
            Some(error.class.as_str().to_owned()),
        ),
        Some(LastError::Store { detail, .. }) => (Some(detail.clone()), Some("store".to_owned())),
        None => (None, None),
    };
    let now = Instant::now();
    api::ReleaseView {
        volume: s.volume.to_string(),
        pending: pending.to_owned(),
        pending_workload,
        backoff_step,
        attempts: s.attempts,
        last_error,
        last_error_class,
        next_retry_ms: s.next_retry.map(|at| {
            u64::try_from(at.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)
        }),
        durable: s.durable,
        claims: s.claims.iter().map(|c| claim_view(c, None)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_rpc_shim::{AgentRpc, GrpcCode, PluginError};

    fn through_shim(error: PluginError) -> AgentError {
        let e = ShimError::Plugin {
            rpc: AgentRpc::ControllerCreateVolume,
            node: NodeId::new("n1").unwrap(),
            error,
        };
        AgentError::shim("CreateVolume", &e)
    }

    fn status(pending: Pending, next_retry: Option<Instant>) -> VolumeStatus {
        VolumeStatus {
            volume: csi_structs::VolumeId::new("v1").unwrap(),
            claims: Vec::new(),
            pending,
            attempts: 1,
            last_error: None,
            next_retry,
            durable: true,
        }
    }

    #[test]
    fn a_release_backing_off_shows_the_step_and_stays_readable_by_older_clients() {
        use csi_claims::machine::RetriedStep;
        let until = Instant::now() + Duration::from_secs(60);
        let workload = csi_structs::WorkloadId::new("w1").unwrap();
        let node = release_view(&status(
            Pending::Backoff {
                step: RetriedStep::NodeDetach(workload.clone()),
                until,
            },
            Some(until),
        ));
        assert_eq!(node.pending, "backoff");
        assert_eq!(node.pending_workload.as_deref(), Some("w1"));
        assert_eq!(node.backoff_step.as_deref(), Some("node_detach"));
        assert!(node.next_retry_ms.is_some_and(|ms| ms > 50_000), "{node:?}");
        let store = release_view(&status(
            Pending::Backoff {
                step: RetriedStep::StoreRead,
                until,
            },
            Some(until),
        ));
        assert_eq!(
            (store.pending_workload, store.backoff_step.as_deref()),
            (None, Some("store_read"))
        );

        // Not backing off: no new field in the JSON, and older JSON without it still reads.
        let calling = release_view(&status(Pending::ControllerDetach(workload), None));
        assert_eq!(calling.pending, "controller_detach");
        let json = serde_json::to_value(&calling).unwrap();
        assert!(json.get("backoff_step").is_none(), "{json}");
        let older: api::ReleaseView = serde_json::from_value(json).unwrap();
        assert_eq!(older.backoff_step, None);
        let idle = release_view(&status(Pending::Nothing, None));
        assert_eq!(
            (idle.pending.as_str(), idle.backoff_step),
            ("nothing", None)
        );
    }

    #[test]
    fn a_volume_that_may_exist_says_why() {
        assert_eq!(
            why_create_may_exist(call_kind(PluginFailure::UnusableAnswer)),
            "CreateVolume's answer was unusable"
        );
        assert_eq!(
            why_create_may_exist(call_kind(PluginFailure::Deadline)),
            "CreateVolume's deadline passed"
        );
        assert_eq!(
            why_create_may_exist("plugin"),
            "CreateVolume's outcome is uncertain"
        );
    }

    #[test]
    fn the_kind_says_who_said_what() {
        let answered = through_shim(PluginError::new(
            ErrorClass::Fatal,
            GrpcCode::InvalidArgument,
            "CreateVolume: plugin returned InvalidArgument: bad size",
        ));
        assert_eq!(answered.parts(), (502, "plugin", Some(ErrorClass::Fatal)));

        // The plugin answered OK and we refused its answer: not the plugin's status, and
        // the volume may exist.
        let refused = through_shim(PluginError::failed(
            ErrorClass::Uncertain,
            PluginFailure::UnusableAnswer,
            "CreateVolume: the plugin's answer was unusable: a message of 5000000 bytes is over \
             the 4194304-byte decode limit",
        ));
        assert_eq!(
            refused.parts(),
            (502, "plugin_answer", Some(ErrorClass::Uncertain))
        );
        let text = refused.to_string();
        assert!(
            text.contains("plugin's answer was unusable (uncertain)"),
            "{text}"
        );
        assert!(!text.contains("plugin answered"), "{text}");

        // Our deadline is not the plugin's DEADLINE_EXCEEDED.
        let late = through_shim(PluginError::failed(
            ErrorClass::Uncertain,
            PluginFailure::Deadline,
            "the caller's deadline passed before the plugin answered",
        ));
        assert_eq!(late.parts().1, "deadline");
        assert!(!late.to_string().contains("DeadlineExceeded"), "{late}");
        let shim_late = AgentError::shim(
            "CreateVolume",
            &ShimError::DeadlineExceeded {
                rpc: AgentRpc::ControllerCreateVolume,
                node: None,
            },
        );
        assert_eq!(shim_late.parts().1, "deadline");
    }

    fn vid(s: &str) -> VolumeId {
        VolumeId::new(s).expect("id")
    }

    #[test]
    fn our_own_failures_are_503_with_their_own_kind_never_plugin() {
        let reason = "claim store redb /data/claims.redb failed to commit: I/O error: \
                      No space left on device (os error 28)";
        let not_stored = AgentError::Claims(DriverError::NotStored {
            what: "claim",
            volume: vid("v"),
            workload: WorkloadId::new("w").expect("id"),
            reason: reason.to_owned(),
        });
        let waiting = AgentError::Claims(DriverError::Claim(
            csi_claims::ClaimError::StoreUnavailable {
                volume: vid("v"),
                reason: reason.to_owned(),
            },
        ));
        for e in [&not_stored, &waiting] {
            assert_eq!(e.parts(), (503, "store", Some(ErrorClass::Retry)), "{e}");
            assert!(e.to_string().contains("/data/claims.redb"), "{e}");
        }
        let state = AgentError::State(StateFileError::Io {
            path: "/data/volumes.json".into(),
            source: std::io::Error::from_raw_os_error(28),
        });
        let dir = AgentError::node(
            "mount",
            &VolumeError::Dir {
                volume: vid("v"),
                action: "create",
                path: "/data/node/staging/v".into(),
                source: Arc::new(std::io::Error::from_raw_os_error(28)),
            },
        );
        for e in [&state, &dir] {
            assert_eq!(e.parts(), (503, "local_io", Some(ErrorClass::Retry)), "{e}");
            assert!(!e.to_string().contains("plugin"), "{e}");
        }
        // The usage records in the node's database: a store failure, as the claims' are.
        let usage = AgentError::node(
            "mount",
            &VolumeError::Usage {
                volume: vid("v"),
                source: Arc::new(StateFileError::Store {
                    path: "/data/claims.redb".into(),
                    detail: "claim store redb /data/claims.redb failed to commit".into(),
                }),
            },
        );
        assert_eq!(
            usage.parts(),
            (503, "store", Some(ErrorClass::Retry)),
            "{usage}"
        );
        assert!(usage.to_string().contains("/data/claims.redb"), "{usage}");
        // A refused claim is still the caller's business, not a failure of ours.
        let denied = AgentError::Claims(DriverError::Claim(csi_claims::ClaimError::Reloading {
            volume: vid("v"),
        }));
        assert_eq!(denied.parts().1, "claim");
    }
}
