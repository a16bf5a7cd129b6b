//! The volume book: volumes registered with (or created by) this agent, persisted to
//! `<data_dir>/volumes.json` (mode 0600: it holds the volumes' secrets). Claims live in the
//! claim store; this is what the agent must know to publish a volume and to build detach
//! calls.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use csi_claims::{ControllerRequirement, VolumeInfo};
use csi_node::detach::SecretsLookup;
use csi_structs::{
    AccessMode, AccessType, AccessTypeKind, ExternalVolumeId, MountOptions, PluginId, Secrets,
    SecretsUse, Topology, VolumeCapability, VolumeContext, VolumeId, VolumeSecrets,
};
use serde::{Deserialize, Serialize};

use csi_node::state::{StateFileError, load_json, save_json_private};

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
    /// A delete has begun: no new claim is admitted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
    /// The secrets every call about the volume carries (its set per kind of call). Stored
    /// with the entry (mode 0600 on this node, under the prefix in etcd); never shown.
    #[serde(default, skip_serializing_if = "VolumeSecrets::is_empty")]
    pub secrets: VolumeSecrets,
    /// Where the volume is reachable (from the plugin's `CreateVolume` answer, or given at
    /// registration); empty: from everywhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accessible_topology: Vec<Topology>,
    /// A controller expansion asked for a `NodeExpandVolume` that has not run yet (the volume
    /// was published nowhere): the capacity asked for, expanded on the node at the next claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_expansion: Option<i64>,
    /// Not a volume yet: a `CreateVolume` by this entry's id had an uncertain outcome that
    /// could not be undone, so a volume may exist in the plugin under that name, with an id
    /// the agent does not know (`external_id` is a placeholder). Kept, and shown, until a
    /// later create of the id resolves it or `volume deregister` clears it; no claim,
    /// expansion, snapshot or delete is admitted meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub may_exist: Option<MayExist>,
}

/// Why a volume may exist in a plugin though the agent cannot name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MayExist {
    /// Why the outcome is unknown, e.g. `CreateVolume's answer was unusable`.
    pub why: String,
    /// The failure and the failed undo, as they were answered.
    pub error: String,
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

/// The controller release step's secrets (`ControllerUnpublishVolume` sends the volume's
/// `controller-publish` set, as the spec asks), from the book as it is when the step runs.
impl SecretsLookup for Book {
    fn controller_secrets(&self, volume: &VolumeId) -> Secrets {
        self.get(volume)
            .map(|e| e.secrets.for_use(SecretsUse::ControllerPublish))
            .unwrap_or_default()
    }
}

/// Why the book could not change.
#[derive(Debug, thiserror::Error)]
pub enum BookError {
    /// `volumes.json` could not be written.
    #[error(transparent)]
    State(#[from] StateFileError),
    /// The cluster store failed (cluster mode).
    #[error(transparent)]
    Store(#[from] csi_claims::StoreError),
    /// The volume still has claims (cluster mode: seen by the store itself, so a claim made
    /// by another agent a moment ago counts).
    #[error("volume {volume} still has {claims} claim(s); release them first")]
    Claimed {
        /// The volume.
        volume: VolumeId,
        /// How many.
        claims: usize,
    },
}

/// The book: on this node (`volumes.json`), or in the cluster's etcd. Every change is written
/// before it returns.
#[derive(Debug)]
pub struct Book {
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    File(FileBook),
    #[cfg(feature = "etcd")]
    Cluster(super::cluster::ClusterBook),
}

/// The book on this node, in `volumes.json`.
#[derive(Debug)]
struct FileBook {
    path: PathBuf,
    /// The entries as last written. Locked only to copy or replace the map, never across a
    /// write: a reader does not wait on the disk.
    entries: Mutex<BTreeMap<VolumeId, BookEntry>>,
    /// Held by one change at a time, across its write (up to the state files' write timeout
    /// on a stalled disk); waited for asynchronously.
    writer: tokio::sync::Mutex<()>,
}

impl FileBook {
    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<VolumeId, BookEntry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One change: `change` edits a copy of the entries and says whether it changed anything;
    /// a changed copy is written, and only then replaces the entries. Changes take turns;
    /// readers keep seeing the last written entries meanwhile.
    async fn change<R>(
        &self,
        change: impl FnOnce(&mut BTreeMap<VolumeId, BookEntry>) -> (R, bool),
    ) -> Result<R, BookError> {
        let _turn = self.writer.lock().await;
        let mut next = self.entries().clone();
        let (answer, changed) = change(&mut next);
        if changed {
            save_json_private(&self.path, &next.values().collect::<Vec<_>>())?;
            *self.entries() = next;
        }
        Ok(answer)
    }

    /// Changes the entry of `id` (its id stays): the entry before and after, `None` when the
    /// volume is not registered.
    async fn change_entry(
        &self,
        id: &VolumeId,
        change: impl FnOnce(&mut BookEntry),
    ) -> Result<Option<(BookEntry, BookEntry)>, BookError> {
        self.change(|map| {
            let Some(entry) = map.get_mut(id) else {
                return (None, false);
            };
            let before = entry.clone();
            change(entry);
            entry.id = id.clone();
            (Some((before, entry.clone())), true)
        })
        .await
    }
}

impl Book {
    /// Opens `<data_dir>/volumes.json`.
    ///
    /// # Errors
    ///
    /// When the file exists but is unreadable or damaged.
    pub fn open(data_dir: &Path) -> Result<Self, StateFileError> {
        use std::os::unix::fs::PermissionsExt as _;
        let path = data_dir.join("volumes.json");
        // Written by an agent before secrets were kept: the owner's only from now on.
        if path.exists() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(
                |source| StateFileError::Io {
                    path: path.clone(),
                    source,
                },
            )?;
        }
        let list: Vec<BookEntry> = load_json(&path)?.unwrap_or_default();
        let entries = Mutex::new(list.into_iter().map(|e| (e.id.clone(), e)).collect());
        Ok(Self {
            backend: Backend::File(FileBook {
                path,
                entries,
                writer: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The book of a cluster, kept in etcd.
    #[cfg(feature = "etcd")]
    pub fn cluster(book: super::cluster::ClusterBook) -> Self {
        Self {
            backend: Backend::Cluster(book),
        }
    }

    /// One volume.
    pub fn get(&self, id: &VolumeId) -> Option<BookEntry> {
        match &self.backend {
            Backend::File(file) => file.entries().get(id).cloned(),
            #[cfg(feature = "etcd")]
            Backend::Cluster(book) => book.get(id),
        }
    }

    /// Every volume, by id.
    pub fn list(&self) -> Vec<BookEntry> {
        match &self.backend {
            Backend::File(file) => file.entries().values().cloned().collect(),
            #[cfg(feature = "etcd")]
            Backend::Cluster(book) => book.list(),
        }
    }

    /// Adds a volume; `false` when the id is taken (nothing changes).
    ///
    /// # Errors
    ///
    /// When the change cannot be written (nothing changes).
    pub async fn insert(&self, entry: BookEntry) -> Result<bool, BookError> {
        match &self.backend {
            Backend::File(file) => {
                file.change(|map| {
                    let free = !map.contains_key(&entry.id);
                    if free {
                        map.insert(entry.id.clone(), entry);
                    }
                    (free, free)
                })
                .await
            }
            #[cfg(feature = "etcd")]
            Backend::Cluster(book) => book.insert(&entry).await,
        }
    }

    /// Removes a volume that has no claims.
    ///
    /// # Errors
    ///
    /// When the change cannot be written, or (cluster mode) the store holds claims of it.
    pub async fn remove(&self, id: &VolumeId) -> Result<Option<BookEntry>, BookError> {
        match &self.backend {
            Backend::File(file) => {
                file.change(|map| {
                    let removed = map.remove(id);
                    let changed = removed.is_some();
                    (removed, changed)
                })
                .await
            }
            #[cfg(feature = "etcd")]
            Backend::Cluster(book) => book.remove(id).await,
        }
    }

    /// Changes a volume's entry with `change` (its id stays) and returns the new entry;
    /// `None` when the volume is not (or no longer) registered.
    ///
    /// # Errors
    ///
    /// When the change cannot be written (nothing changes).
    pub async fn update(
        &self,
        id: &VolumeId,
        change: impl Fn(&mut BookEntry),
    ) -> Result<Option<BookEntry>, BookError> {
        match &self.backend {
            Backend::File(file) => Ok(file.change_entry(id, change).await?.map(|(_, after)| after)),
            #[cfg(feature = "etcd")]
            Backend::Cluster(book) => book.update(id, change).await,
        }
    }

    /// Removes a volume whatever claims it has (an operator abandoning it). In cluster mode its
    /// claims record goes in the same transaction, and every agent's driver drops the claims;
    /// on this node the caller forgets them in the claim store first.
    ///
    /// # Errors
    ///
    /// When the change cannot be written (nothing changes).
    pub async fn forget(&self, id: &VolumeId) -> Result<Option<BookEntry>, BookError> {
        match &self.backend {
            Backend::File(_) => self.remove(id).await,
            #[cfg(feature = "etcd")]
            Backend::Cluster(book) => book.remove_forced(id).await,
        }
    }

    /// Marks a volume with no claims as being deleted (no claim is admitted any more) and
    /// returns it.
    ///
    /// # Errors
    ///
    /// [`BookError::Claimed`] (cluster mode: seen by the store itself), or the change cannot
    /// be written.
    pub async fn mark_deleting(&self, id: &VolumeId) -> Result<Option<BookEntry>, BookError> {
        match &self.backend {
            Backend::File(file) => Ok(file
                .change_entry(id, |entry| entry.deleting = true)
                .await?
                .map(|(before, _)| before)),
            #[cfg(feature = "etcd")]
            Backend::Cluster(book) => book.mark_deleting(id).await,
        }
    }

    /// The volume as the store holds it now rather than this agent's copy (in cluster mode
    /// another agent may have begun deleting it a moment ago).
    ///
    /// # Errors
    ///
    /// When the cluster store cannot be read.
    pub async fn confirm(&self, id: &VolumeId) -> Result<Option<BookEntry>, BookError> {
        match &self.backend {
            Backend::File(_) => Ok(self.get(id)),
            #[cfg(feature = "etcd")]
            Backend::Cluster(book) => book.confirm(id).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_testkit::disk::StalledFile;
    use std::time::{Duration, Instant};

    fn entry(id: &str) -> BookEntry {
        BookEntry {
            id: VolumeId::new(id).expect("test invariant: a valid id"),
            external_id: ExternalVolumeId::new(format!("ext-{id}"))
                .expect("test invariant: a valid id"),
            plugin: PluginId::new("mock").expect("test invariant: a valid id"),
            access_mode: AccessMode::SingleNodeWriter,
            attachment: AccessTypeKind::Mount,
            controller_publish: false,
            created: false,
            capacity_bytes: None,
            context: BTreeMap::new(),
            deleting: false,
            secrets: VolumeSecrets::default(),
            accessible_topology: Vec::new(),
            node_expansion: None,
            may_exist: None,
        }
    }

    /// Waits (at most a minute) until whether a write of `path` is under way in this process
    /// is `under_way`.
    fn until_write_of(path: &Path, under_way: bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while csi_node::state::writes_under_way()
            .iter()
            .any(|(p, _)| p == path)
            != under_way
        {
            assert!(Instant::now() < deadline, "hang guard: {path:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_do_not_wait_for_a_stalled_write_and_see_the_last_written_entries() {
        let dir = tempfile::tempdir().expect("temp dir");
        let book = std::sync::Arc::new(Book::open(dir.path()).expect("open"));
        assert!(book.insert(entry("a")).await.expect("write"));

        // The disk stops answering: the next write's temporary file is a FIFO nobody reads.
        let path = dir.path().join("volumes.json");
        let stalled = StalledFile::at(&path.with_extension("json.tmp")).expect("a FIFO");
        let insert = tokio::spawn({
            let book = book.clone();
            async move { book.insert(entry("b")).await }
        });
        tokio::task::spawn_blocking({
            let path = path.clone();
            move || until_write_of(&path, true)
        })
        .await
        .expect("the waiting task");

        // Had the readers waited for the write, they would have answered only once it was
        // given up (after the state files' write timeout).
        let id_a = VolumeId::new("a").expect("test invariant: a valid id");
        let id_b = VolumeId::new("b").expect("test invariant: a valid id");
        assert_eq!(book.get(&id_a), Some(entry("a")));
        assert_eq!(book.get(&id_b), None, "not written yet");
        assert_eq!(book.list(), vec![entry("a")]);

        // The disk answers: the write goes on and fails (a FIFO cannot be synced) rather than
        // having been given up, unless this machine froze for the whole write timeout. The
        // book keeps what was last written, and the next change is written whole.
        tokio::task::spawn_blocking(move || stalled.answer())
            .await
            .expect("the disk task")
            .expect("the FIFO reads");
        let outcome = insert.await.expect("the insert task");
        assert!(
            matches!(outcome, Err(BookError::State(StateFileError::Io { .. }))),
            "the insert was given up while the readers waited: {outcome:?}"
        );
        assert_eq!(book.list(), vec![entry("a")]);
        until_write_of(&path, false);
        assert!(book.insert(entry("b")).await.expect("write"));
        let reopened = Book::open(dir.path()).expect("reopen");
        assert_eq!(reopened.list(), vec![entry("a"), entry("b")]);
    }
}
