//! The catalog on one node: `volumes.json` in a directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use csi_node::state::{StateFileError, load_json, save_json_private};
use csi_structs::VolumeId;

use super::{CatalogEntry, CatalogError, VolumeCatalog};

/// The file's name in the directory the catalog is opened in.
const FILE_NAME: &str = "volumes.json";

/// The catalog on one node, in `<dir>/volumes.json`: a JSON list of [`CatalogEntry`],
/// replaced atomically (temporary file, `fsync`, rename) and owner-only (mode 0600: it holds
/// the volumes' secrets).
///
/// Changes take turns, each written before it returns; readers never wait for a change, not
/// even one stuck on a stalled disk: they see the entries as last written.
#[derive(Debug)]
pub struct FileCatalog {
    path: PathBuf,
    /// The entries as last written. Locked only to copy or replace the map, never across a
    /// write: a reader does not wait on the disk.
    entries: Mutex<BTreeMap<VolumeId, CatalogEntry>>,
    /// Held by one change at a time, across its write (up to the state files' write timeout
    /// on a stalled disk); waited for asynchronously.
    writer: tokio::sync::Mutex<()>,
}

impl FileCatalog {
    /// Opens `<dir>/volumes.json` (none yet: an empty catalog, the file written at the first
    /// change), reading it on Tokio's blocking pool rather than the runtime's workers.
    ///
    /// # Errors
    ///
    /// When the file exists but is unreadable or damaged; the error names the file.
    pub async fn open(dir: &Path) -> Result<Self, StateFileError> {
        let owned = dir.to_owned();
        match tokio::task::spawn_blocking(move || Self::open_blocking(&owned)).await {
            Ok(opened) => opened,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(StateFileError::Io {
                path: dir.join(FILE_NAME),
                source: std::io::Error::other(format!("the open was interrupted: {e}")),
            }),
        }
    }

    /// [`open`](Self::open), on the calling thread: for a caller outside a runtime.
    ///
    /// # Errors
    ///
    /// When the file exists but is unreadable or damaged; the error names the file.
    pub fn open_blocking(dir: &Path) -> Result<Self, StateFileError> {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join(FILE_NAME);
        // Written before secrets were kept in it: the owner's only from now on.
        if path.exists() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(
                |source| StateFileError::Io {
                    path: path.clone(),
                    source,
                },
            )?;
        }
        let list: Vec<CatalogEntry> = load_json(&path)?.unwrap_or_default();
        let entries = Mutex::new(list.into_iter().map(|e| (e.id.clone(), e)).collect());
        Ok(Self {
            path,
            entries,
            writer: tokio::sync::Mutex::new(()),
        })
    }

    /// The file: `volumes.json` in the directory it was opened in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn entries(&self) -> MutexGuard<'_, BTreeMap<VolumeId, CatalogEntry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One change: `change` edits a copy of the entries and says whether it changed anything;
    /// a changed copy is written, and only then replaces the entries. Changes take turns;
    /// readers keep seeing the last written entries meanwhile.
    async fn change<R>(
        &self,
        change: impl FnOnce(&mut BTreeMap<VolumeId, CatalogEntry>) -> (R, bool),
    ) -> Result<R, CatalogError> {
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
        change: impl FnOnce(&mut CatalogEntry),
    ) -> Result<Option<(CatalogEntry, CatalogEntry)>, CatalogError> {
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

#[async_trait::async_trait]
impl VolumeCatalog for FileCatalog {
    fn get(&self, id: &VolumeId) -> Option<CatalogEntry> {
        self.entries().get(id).cloned()
    }

    fn list(&self) -> Vec<CatalogEntry> {
        self.entries().values().cloned().collect()
    }

    async fn insert(&self, entry: CatalogEntry) -> Result<bool, CatalogError> {
        self.change(|map| {
            let free = !map.contains_key(&entry.id);
            if free {
                map.insert(entry.id.clone(), entry);
            }
            (free, free)
        })
        .await
    }

    async fn remove(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError> {
        self.change(|map| {
            let removed = map.remove(id);
            let changed = removed.is_some();
            (removed, changed)
        })
        .await
    }

    async fn update(
        &self,
        id: &VolumeId,
        change: &(dyn for<'e> Fn(&'e mut CatalogEntry) + Send + Sync),
    ) -> Result<Option<CatalogEntry>, CatalogError> {
        Ok(self.change_entry(id, change).await?.map(|(_, after)| after))
    }

    async fn forget(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError> {
        // On one node the claims are the caller's to forget; the entry goes like any other.
        self.remove(id).await
    }

    async fn mark_deleting(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError> {
        Ok(self
            .change_entry(id, |entry| entry.deleting = true)
            .await?
            .map(|(before, _)| before))
    }

    async fn confirm(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError> {
        // This process is the file's only writer: its copy is what the file holds.
        Ok(self.get(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_structs::{AccessMode, AccessTypeKind, ExternalVolumeId, PluginId, VolumeSecrets};
    use csi_testkit::disk::StalledFile;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn id(id: &str) -> VolumeId {
        VolumeId::new(id).expect("test invariant: a valid id")
    }

    fn entry(name: &str) -> CatalogEntry {
        CatalogEntry {
            id: id(name),
            external_id: ExternalVolumeId::new(format!("ext-{name}"))
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

    #[tokio::test]
    async fn changes_are_written_and_a_reopened_catalog_sees_them() {
        let dir = tempfile::tempdir().expect("temp dir");
        let catalog: Arc<dyn VolumeCatalog> =
            Arc::new(FileCatalog::open(dir.path()).await.expect("open"));
        assert_eq!(catalog.list(), vec![]);
        assert!(catalog.insert(entry("a")).await.expect("write"));
        assert!(catalog.insert(entry("b")).await.expect("write"));
        assert!(catalog.insert(entry("c")).await.expect("write"));

        // A taken id: refused, and the entry there stays.
        let mut other = entry("a");
        other.created = true;
        assert!(!catalog.insert(other).await.expect("write"));
        assert_eq!(catalog.get(&id("a")), Some(entry("a")));

        // An update changes everything but the id; a missing volume is not added.
        let grown = catalog
            .update(&id("a"), &|e| {
                e.capacity_bytes = Some(4096);
                e.id = VolumeId::new("elsewhere").expect("test invariant: a valid id");
            })
            .await
            .expect("write");
        let mut expected = entry("a");
        expected.capacity_bytes = Some(4096);
        assert_eq!(grown, Some(expected.clone()));
        let missing = catalog
            .update(&id("nope"), &|e| e.capacity_bytes = Some(1))
            .await
            .expect("nothing to write");
        assert_eq!(missing, None);
        assert_eq!(catalog.get(&id("nope")), None);

        // Marked as being deleted: the entry as it was before the mark.
        let marked = catalog.mark_deleting(&id("b")).await.expect("write");
        assert_eq!(marked, Some(entry("b")));
        assert!(catalog.get(&id("b")).is_some_and(|e| e.deleting));
        assert_eq!(
            catalog.confirm(&id("b")).await.expect("read"),
            catalog.get(&id("b"))
        );

        // Removed, forgotten, and removing again finds nothing.
        assert_eq!(
            catalog.remove(&id("c")).await.expect("write"),
            Some(entry("c"))
        );
        assert_eq!(catalog.remove(&id("c")).await.expect("write"), None);
        assert_eq!(catalog.get(&id("c")), None);

        // The file is the owner's only, and a reopened catalog sees the same entries.
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.path().join("volumes.json");
        let mode = std::fs::metadata(&path)
            .expect("the file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let reopened = FileCatalog::open_blocking(dir.path()).expect("reopen");
        assert_eq!(reopened.path(), path);
        assert_eq!(reopened.list(), catalog.list());
        assert_eq!(reopened.list().len(), 2);

        assert!(catalog.forget(&id("b")).await.expect("write").is_some());
        let reopened = FileCatalog::open(dir.path()).await.expect("reopen");
        assert_eq!(reopened.list(), vec![expected]);
    }

    #[tokio::test]
    async fn a_damaged_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("volumes.json");
        std::fs::write(&path, b"[{\"id\": \"a\", ").expect("write the damaged file");
        let error = FileCatalog::open(dir.path())
            .await
            .expect_err("a damaged file opens");
        assert!(
            matches!(&error, StateFileError::Damaged { path: p, .. } if *p == path),
            "{error:?}"
        );
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "{error}"
        );
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
        let catalog = Arc::new(FileCatalog::open(dir.path()).await.expect("open"));
        assert!(catalog.insert(entry("a")).await.expect("write"));

        // The disk stops answering: the next write's temporary file is a FIFO nobody reads.
        let path = dir.path().join("volumes.json");
        let stalled = StalledFile::at(&path.with_extension("json.tmp")).expect("a FIFO");
        let insert = tokio::spawn({
            let catalog = catalog.clone();
            async move { catalog.insert(entry("b")).await }
        });
        tokio::task::spawn_blocking({
            let path = path.clone();
            move || until_write_of(&path, true)
        })
        .await
        .expect("the waiting task");

        // Had the readers waited for the write, they would have answered only once it was
        // given up (after the state files' write timeout).
        assert_eq!(catalog.get(&id("a")), Some(entry("a")));
        assert_eq!(catalog.get(&id("b")), None, "not written yet");
        assert_eq!(catalog.list(), vec![entry("a")]);

        // The disk answers: the write goes on and fails (a FIFO cannot be synced) rather than
        // having been given up, unless this machine froze for the whole write timeout. The
        // catalog keeps what was last written, and the next change is written whole.
        tokio::task::spawn_blocking(move || stalled.answer())
            .await
            .expect("the disk task")
            .expect("the FIFO reads");
        let outcome = insert.await.expect("the insert task");
        assert!(
            matches!(outcome, Err(CatalogError::State(StateFileError::Io { .. }))),
            "the insert was given up while the readers waited: {outcome:?}"
        );
        assert_eq!(catalog.list(), vec![entry("a")]);
        until_write_of(&path, false);
        assert!(catalog.insert(entry("b")).await.expect("write"));
        let reopened = FileCatalog::open(dir.path()).await.expect("reopen");
        assert_eq!(reopened.list(), vec![entry("a"), entry("b")]);
    }
}
