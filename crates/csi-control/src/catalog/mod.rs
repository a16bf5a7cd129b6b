//! The volume catalog: the volumes registered with (or created by) the orchestrator, with
//! what it must know to claim and publish them and to build their detach calls. Claims live
//! in csi-claims' claim store, not here.
//!
//! [`VolumeCatalog`] is the catalog whatever keeps it: [`FileCatalog`] on one node
//! (`volumes.json`), `EtcdCatalog` (cargo feature `etcd`) in a cluster's etcd. Every change is
//! written before it returns; reads answer from memory and never wait on the disk or the
//! network.

use std::collections::BTreeMap;
use std::sync::Arc;

use csi_claims::{ControllerRequirement, VolumeInfo};
use csi_node::detach::SecretsLookup;
use csi_node::state::StateFileError;
use csi_structs::{
    AccessMode, AccessType, AccessTypeKind, ExternalVolumeId, MountOptions, PluginId, Secrets,
    SecretsUse, Topology, VolumeCapability, VolumeContext, VolumeId, VolumeSecrets,
};
use serde::{Deserialize, Serialize};

#[cfg(feature = "etcd")]
mod etcd;
mod file;

#[cfg(feature = "etcd")]
pub use etcd::EtcdCatalog;
pub use file::FileCatalog;

/// One registered volume.
///
/// Serialized as it is stored: the records of `volumes.json`, and (inside a `format`
/// wrapper) the values under `<prefix>/volumes/` in etcd. Optional fields are left out when
/// empty, and default when missing, so older files read unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// The orchestrator's id.
    pub id: VolumeId,
    /// The plugin's id.
    pub external_id: ExternalVolumeId,
    /// The plugin.
    pub plugin: PluginId,
    /// The access mode every claim uses.
    pub access_mode: AccessMode,
    /// Block or mount.
    pub attachment: AccessTypeKind,
    /// Whether releases need `ControllerUnpublishVolume`.
    pub controller_publish: bool,
    /// Whether the orchestrator created it in the plugin.
    pub created: bool,
    /// Capacity in bytes, when known. (Sizes are `u64` here: the wire's `int64` fields are
    /// checked where they are read and written, and a negative size was never stored.)
    pub capacity_bytes: Option<u64>,
    /// The volume context (from creation or registration).
    pub context: BTreeMap<String, String>,
    /// A delete has begun: no new claim is admitted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
    /// The secrets every call about the volume carries (its set per kind of call). Stored
    /// with the entry (mode 0600 on one node, under the prefix in etcd); never shown.
    #[serde(default, skip_serializing_if = "VolumeSecrets::is_empty")]
    pub secrets: VolumeSecrets,
    /// Where the volume is reachable (from the plugin's `CreateVolume` answer, or given at
    /// registration); empty: from everywhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accessible_topology: Vec<Topology>,
    /// A controller expansion asked for a `NodeExpandVolume` that has not run yet (the volume
    /// was published nowhere): the capacity asked for, expanded on the node at the next claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_expansion: Option<u64>,
    /// Not a volume yet: a `CreateVolume` by this entry's id had an uncertain outcome that
    /// could not be undone, so a volume may exist in the plugin under that name, with an id
    /// the orchestrator does not know (`external_id` is a placeholder). Kept, and shown, until
    /// a later create of the id resolves it or a deregistration clears it; no claim,
    /// expansion, snapshot or delete is admitted meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub may_exist: Option<MayExist>,
}

/// Why a volume may exist in a plugin though the orchestrator cannot name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MayExist {
    /// Why the outcome is unknown, e.g. `CreateVolume's answer was unusable`.
    pub why: String,
    /// The failure and the failed undo, as they were answered.
    pub error: String,
}

impl CatalogEntry {
    /// The capability every claim of this volume uses.
    pub fn capability(&self) -> VolumeCapability {
        match self.attachment {
            AccessTypeKind::Block => VolumeCapability::block(self.access_mode),
            AccessTypeKind::Mount => {
                VolumeCapability::new(self.access_mode, AccessType::Mount(MountOptions::new()))
            }
        }
    }

    /// What the claim layer needs.
    pub fn info(&self) -> VolumeInfo {
        VolumeInfo {
            id: self.id.clone(),
            external_id: self.external_id.clone(),
            plugin: self.plugin.clone(),
            controller: if self.controller_publish {
                ControllerRequirement::Required
            } else {
                ControllerRequirement::NotRequired
            },
        }
    }

    /// The names of its secrets, `section/name` for a per-call one: what a view may show.
    pub fn secret_names(&self) -> Vec<String> {
        self.secrets
            .keys()
            .into_iter()
            .map(|(section, key)| match section {
                Some(s) => format!("{s}/{key}"),
                None => key,
            })
            .collect()
    }

    /// The volume context as the typed map; entries that break its limits are dropped with a
    /// warning (they were checked at registration).
    pub fn volume_context(&self) -> VolumeContext {
        VolumeContext::try_new(self.context.clone()).unwrap_or_else(|e| {
            tracing::warn!(volume = %self.id, error = %e, "stored volume context is invalid; sending none");
            VolumeContext::default()
        })
    }
}

/// Why the catalog could not change.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// `volumes.json` could not be written (the error names the file).
    #[error(transparent)]
    State(#[from] StateFileError),
    /// The cluster store failed (etcd).
    #[error(transparent)]
    Store(#[from] csi_claims::StoreError),
    /// The volume still has claims (etcd: seen by the store itself, so a claim made by
    /// another orchestrator a moment ago counts).
    #[error("volume {volume} still has {claims} claim(s); release them first")]
    Claimed {
        /// The volume.
        volume: VolumeId,
        /// How many.
        claims: usize,
    },
}

/// The volume catalog, whatever keeps it. Every change is written before it returns (and
/// nothing changes when the write fails); reads answer from what was last written.
///
/// Object-safe: hold an `Arc<dyn VolumeCatalog>`.
#[async_trait::async_trait]
pub trait VolumeCatalog: std::fmt::Debug + Send + Sync {
    /// One volume.
    fn get(&self, id: &VolumeId) -> Option<CatalogEntry>;

    /// Every volume, by id (in etcd, every one whose record decodes).
    fn list(&self) -> Vec<CatalogEntry>;

    /// Adds a volume; `false` when the id is taken (nothing changes).
    ///
    /// # Errors
    ///
    /// When the change cannot be written (nothing changes).
    async fn insert(&self, entry: CatalogEntry) -> Result<bool, CatalogError>;

    /// Removes a volume that has no claims.
    ///
    /// # Errors
    ///
    /// When the change cannot be written, or (etcd) the store holds claims of it:
    /// [`CatalogError::Claimed`].
    async fn remove(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError>;

    /// Changes a volume's entry with `change` (its id stays) and returns the new entry;
    /// `None` when the volume is not (or no longer) registered. `change` may run more than
    /// once (etcd: again when another orchestrator changed the volume in between).
    ///
    /// # Errors
    ///
    /// When the change cannot be written (nothing changes).
    // The lifetime of the entry is spelled out: `async_trait` would name an elided one, and
    // `change` would then take only entries that outlive the call.
    async fn update(
        &self,
        id: &VolumeId,
        change: &(dyn for<'e> Fn(&'e mut CatalogEntry) + Send + Sync),
    ) -> Result<Option<CatalogEntry>, CatalogError>;

    /// Removes a volume whatever claims it has (an operator abandoning it). In etcd its
    /// claims record goes in the same transaction, and every agent's driver drops the claims;
    /// on one node the caller forgets them in the claim store first.
    ///
    /// # Errors
    ///
    /// When the change cannot be written (nothing changes).
    async fn forget(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError>;

    /// Marks a volume with no claims as being deleted (no claim is admitted any more) and
    /// returns it as it was before the mark.
    ///
    /// # Errors
    ///
    /// [`CatalogError::Claimed`] (etcd: seen by the store itself), or the change cannot be
    /// written.
    async fn mark_deleting(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError>;

    /// The volume as the store holds it now rather than this process's copy (in etcd another
    /// orchestrator may have begun deleting it a moment ago).
    ///
    /// # Errors
    ///
    /// When the cluster store cannot be read.
    async fn confirm(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError>;
}

/// The controller release step's secrets (`ControllerUnpublishVolume` sends the volume's
/// `controller-publish` set, as the spec asks), from a catalog as it is when the step runs:
/// csi-node's [`SecretsLookup`] over any [`VolumeCatalog`].
#[derive(Clone, Debug)]
pub struct CatalogSecrets {
    catalog: Arc<dyn VolumeCatalog>,
}

impl CatalogSecrets {
    /// The lookup over `catalog`.
    pub fn new(catalog: Arc<dyn VolumeCatalog>) -> Self {
        Self { catalog }
    }
}

impl SecretsLookup for CatalogSecrets {
    fn controller_secrets(&self, volume: &VolumeId) -> Secrets {
        controller_secrets(self.catalog.as_ref(), volume)
    }
}

/// The volume's `controller-publish` secrets, none when it is not in `catalog`.
fn controller_secrets(catalog: &dyn VolumeCatalog, volume: &VolumeId) -> Secrets {
    catalog
        .get(volume)
        .map(|e| e.secrets.for_use(SecretsUse::ControllerPublish))
        .unwrap_or_default()
}

impl SecretsLookup for FileCatalog {
    fn controller_secrets(&self, volume: &VolumeId) -> Secrets {
        controller_secrets(self, volume)
    }
}

#[cfg(feature = "etcd")]
impl SecretsLookup for EtcdCatalog {
    fn controller_secrets(&self, volume: &VolumeId) -> Secrets {
        controller_secrets(self, volume)
    }
}
