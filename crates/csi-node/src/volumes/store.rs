//! Where the volume manager keeps its usage records: a [`UsageStore`].
//!
//! The manager changes one volume's record at a time and writes that record alone; the store
//! makes it durable before the write returns. Two stores come with the crate:
//!
//! - [`UsageDb`]: one record per volume in a table of a redb database (csi-claims'
//!   [`RedbStore`], the node's claim store when it has one), written through the database's
//!   group commit: the records of concurrent operations, the claims' included, go to disk in
//!   one transaction and one `fsync`. What a node should use.
//! - [`UsageJson`]: the whole set of records in one JSON file, rewritten atomically (temporary
//!   file, `fsync`, `rename`) on every change, one change at a time. Simple to read by hand;
//!   its cost grows with the number of volumes, and its changes take turns on the disk.
//!
//! [`UsageDb::open`] moves the records of a JSON usage file into the database once (any
//! format [`UsageFile::load`] reads), in one transaction, then renames the file
//! `<file>.migrated`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use csi_claims::store::{RedbRecords, RedbStore, StoreError};

use super::usage::{UsageFile, VolumeEntry, check_record};
use crate::state::{StateFileError, WRITE_TIMEOUT, save_json};

/// Durable usage records, one per volume (see the [module docs](self)).
#[async_trait::async_trait]
pub trait UsageStore: Send + Sync + std::fmt::Debug + 'static {
    /// Where the records are, as errors name them.
    fn path(&self) -> &Path;

    /// Every record, by key ([`key`](super::usage::key)), as the volume manager opens.
    ///
    /// # Errors
    ///
    /// A [`StateFileError`] naming [`path`](Self::path) (and the record's key when one record
    /// cannot be used).
    fn load(&self) -> Result<BTreeMap<String, VolumeEntry>, StateFileError>;

    /// Writes the record of `key` (`None` removes it), durably before it returns. The
    /// volume manager never has two writes of one key under way at once.
    ///
    /// # Errors
    ///
    /// A [`StateFileError`] naming [`path`](Self::path): nothing was written, or (for
    /// [`StateFileError::TimedOut`] and a failed commit) whether it was is unknown.
    async fn write(&self, key: &str, entry: Option<&VolumeEntry>) -> Result<(), StateFileError>;
}

/// The usage records as one JSON file, rewritten whole on each change (see the
/// [module docs](self)).
#[derive(Debug)]
pub struct UsageJson {
    file: PathBuf,
    /// The records as last written.
    written: Mutex<BTreeMap<String, VolumeEntry>>,
    /// Held by one write at a time, across the write.
    turn: tokio::sync::Mutex<()>,
}

impl UsageJson {
    /// The store on `file` (created by the first write). Call [`load`](UsageStore::load)
    /// before writing: a write rewrites the whole file from what was loaded and written since.
    pub fn new(file: impl Into<PathBuf>) -> Self {
        Self {
            file: file.into(),
            written: Mutex::new(BTreeMap::new()),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    fn written(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, VolumeEntry>> {
        self.written.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait::async_trait]
impl UsageStore for UsageJson {
    fn path(&self) -> &Path {
        &self.file
    }

    /// Reads the file; one in the older format is migrated and written back.
    fn load(&self) -> Result<BTreeMap<String, VolumeEntry>, StateFileError> {
        let (usage, migrated) = UsageFile::load(&self.file)?;
        if migrated {
            save_json(&self.file, &usage)?;
            tracing::info!(file = %self.file.display(), volumes = usage.volumes.len(),
                "usage records migrated to one record per volume");
        }
        *self.written() = usage.volumes.clone();
        Ok(usage.volumes)
    }

    async fn write(&self, key: &str, entry: Option<&VolumeEntry>) -> Result<(), StateFileError> {
        let _turn = self.turn.lock().await;
        let mut next = UsageFile {
            volumes: self.written().clone(),
            ..UsageFile::default()
        };
        match entry {
            Some(entry) => next.volumes.insert(key.to_owned(), entry.clone()),
            None => next.volumes.remove(key),
        };
        save_json(&self.file, &next)?;
        *self.written() = next.volumes;
        Ok(())
    }
}

/// The table of a [`RedbStore`] the reference layout keeps usage records in.
pub const USAGE_TABLE: &str = "csi_node.usage";

/// The usage records as one record per volume in a redb table (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct UsageDb {
    records: RedbRecords,
    file: PathBuf,
}

impl UsageDb {
    /// The records in table [`USAGE_TABLE`] of `store`, whose file is `file` (named by
    /// errors). When `legacy` names a JSON usage file that exists, its records are moved into
    /// the table first, in one transaction, and the file is renamed `<legacy>.migrated`; a
    /// crash in between moves them again at the next open, the same records.
    ///
    /// Blocks on the disk: call it at startup, or off the runtime.
    ///
    /// # Errors
    ///
    /// A [`StateFileError`] naming the JSON file when it cannot be read or renamed, or the
    /// database when the records cannot be written.
    pub fn open(
        store: &RedbStore,
        file: impl Into<PathBuf>,
        legacy: Option<&Path>,
    ) -> Result<Self, StateFileError> {
        let file = file.into();
        let records = store
            .records(USAGE_TABLE)
            .map_err(|e| store_error(&file, &e))?;
        let db = Self { records, file };
        if let Some(legacy) = legacy {
            db.import(legacy)?;
        }
        Ok(db)
    }

    /// Moves the records of the JSON file `legacy` into the table (see [`open`](Self::open)).
    fn import(&self, legacy: &Path) -> Result<(), StateFileError> {
        if !legacy.exists() {
            return Ok(());
        }
        let (usage, _) = UsageFile::load(legacy)?;
        let encoded = usage
            .volumes
            .iter()
            .map(|(key, entry)| Ok((key.clone(), encode(&self.file, key, entry)?)))
            .collect::<Result<Vec<_>, StateFileError>>()?;
        self.records
            .put_all_blocking(&encoded)
            .map_err(|e| store_error(&self.file, &e))?;
        let mut moved = legacy.as_os_str().to_owned();
        moved.push(".migrated");
        let io = |source| StateFileError::Io {
            path: legacy.to_owned(),
            source,
        };
        std::fs::rename(legacy, PathBuf::from(moved)).map_err(io)?;
        if let Some(dir) = legacy.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io)?;
        }
        tracing::info!(file = %legacy.display(), into = %self.file.display(),
            volumes = encoded.len(), "usage records moved into the node's database");
        Ok(())
    }
}

/// A record as stored: its JSON.
fn encode(file: &Path, key: &str, entry: &VolumeEntry) -> Result<Vec<u8>, StateFileError> {
    serde_json::to_vec(entry).map_err(|e| StateFileError::Record {
        path: file.to_owned(),
        key: key.to_owned(),
        reason: format!("cannot be encoded: {e}"),
    })
}

/// A failure of the database, as the volume manager reports a usage file's.
fn store_error(file: &Path, e: &StoreError) -> StateFileError {
    StateFileError::Store {
        path: file.to_owned(),
        detail: csi_claims::error::error_chain(e),
    }
}

#[async_trait::async_trait]
impl UsageStore for UsageDb {
    fn path(&self) -> &Path {
        &self.file
    }

    fn load(&self) -> Result<BTreeMap<String, VolumeEntry>, StateFileError> {
        let rows = self
            .records
            .read_all()
            .map_err(|e| store_error(&self.file, &e))?;
        let mut out = BTreeMap::new();
        for (key, value) in rows {
            let entry: VolumeEntry =
                serde_json::from_slice(&value).map_err(|e| StateFileError::Record {
                    path: self.file.clone(),
                    key: key.clone(),
                    reason: format!("not a usage record: {e}"),
                })?;
            check_record(&self.file, &key, &entry)?;
            out.insert(key, entry);
        }
        Ok(out)
    }

    async fn write(&self, key: &str, entry: Option<&VolumeEntry>) -> Result<(), StateFileError> {
        let value = entry
            .map(|entry| encode(&self.file, key, entry))
            .transpose()?;
        match tokio::time::timeout(WRITE_TIMEOUT, self.records.put(key, value)).await {
            Ok(written) => written.map_err(|e| store_error(&self.file, &e)),
            Err(_) => Err(StateFileError::TimedOut {
                path: self.file.clone(),
                after: WRITE_TIMEOUT,
            }),
        }
    }
}
