//! The volume book: volumes registered with (or created by) this agent, persisted to
//! `<data_dir>/volumes.json`. Claims live in the claim store; this is what the agent must
//! know to publish a volume and to build detach calls.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use csi_claims::{ControllerRequirement, VolumeInfo};
use csi_structs::{
    AccessMode, AccessType, AccessTypeKind, ExternalVolumeId, MountOptions, PluginId,
    VolumeCapability, VolumeContext, VolumeId,
};
use serde::{Deserialize, Serialize};

use super::store::{StateFileError, load_json, save_json};

/// One registered volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookEntry {
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
    /// Whether this agent created it in the plugin.
    pub created: bool,
    /// Capacity, when known.
    pub capacity_bytes: Option<i64>,
    /// The volume context (from creation or registration).
    pub context: BTreeMap<String, String>,
}

impl BookEntry {
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

    /// The volume context as the typed map; entries that break its limits are dropped with a
    /// warning (they were checked at registration).
    pub fn volume_context(&self) -> VolumeContext {
        VolumeContext::try_new(self.context.clone()).unwrap_or_else(|e| {
            tracing::warn!(volume = %self.id, error = %e, "stored volume context is invalid; sending none");
            VolumeContext::default()
        })
    }
}

/// The book. Every change is written before it returns.
#[derive(Debug)]
pub struct Book {
    path: PathBuf,
    entries: Mutex<BTreeMap<VolumeId, BookEntry>>,
}

impl Book {
    /// Opens `<data_dir>/volumes.json`.
    ///
    /// # Errors
    ///
    /// When the file exists but is unreadable or damaged.
    pub fn open(data_dir: &Path) -> Result<Self, StateFileError> {
        let path = data_dir.join("volumes.json");
        let list: Vec<BookEntry> = load_json(&path)?.unwrap_or_default();
        Ok(Self {
            path,
            entries: Mutex::new(list.into_iter().map(|e| (e.id.clone(), e)).collect()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<VolumeId, BookEntry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One volume.
    pub fn get(&self, id: &VolumeId) -> Option<BookEntry> {
        self.lock().get(id).cloned()
    }

    /// Every volume, by id.
    pub fn list(&self) -> Vec<BookEntry> {
        self.lock().values().cloned().collect()
    }

    /// Adds a volume; `false` when the id is taken (nothing changes).
    ///
    /// # Errors
    ///
    /// When the file cannot be written (nothing changes).
    pub fn insert(&self, entry: BookEntry) -> Result<bool, StateFileError> {
        let mut map = self.lock();
        if map.contains_key(&entry.id) {
            return Ok(false);
        }
        let mut next = map.clone();
        next.insert(entry.id.clone(), entry);
        save_json(&self.path, &next.values().collect::<Vec<_>>())?;
        *map = next;
        Ok(true)
    }

    /// Removes a volume.
    ///
    /// # Errors
    ///
    /// When the file cannot be written (nothing changes).
    pub fn remove(&self, id: &VolumeId) -> Result<Option<BookEntry>, StateFileError> {
        let mut map = self.lock();
        let mut next = map.clone();
        let removed = next.remove(id);
        if removed.is_some() {
            save_json(&self.path, &next.values().collect::<Vec<_>>())?;
            *map = next;
        }
        Ok(removed)
    }
}
