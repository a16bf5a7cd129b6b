//! The durable [`ClaimStore`] on redb.

use std::path::Path;
use std::sync::Arc;

use csi_structs::VolumeId;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::{ClaimStore, StoreError, Stored, Version, codec, encode_for};
use crate::model::VolumeRecord;

/// One table: volume id → 8-byte big-endian version followed by the JSON record
/// ([`codec`](super::encode)).
const VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("csi_claims.volumes");

/// A [`ClaimStore`] in a redb database file: every successful
/// [`compare_and_swap`](ClaimStore::compare_and_swap) is one write transaction committed with
/// immediate durability, so it survives a crash once it returns.
///
/// Each call runs on tokio's blocking pool (a commit waits for the disk), so the store needs a
/// tokio runtime.
///
/// ```
/// use csi_claims::store::{ClaimStore, RedbStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let dir = tempfile::tempdir().unwrap();
/// let store = RedbStore::open(dir.path().join("claims.redb")).unwrap();
/// assert!(store.load_all().await.unwrap().is_empty());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RedbStore {
    db: Arc<Database>,
}

fn redb_err(operation: &'static str) -> impl FnOnce(redb::Error) -> StoreError {
    move |e| StoreError::Redb {
        operation,
        source: Box::new(e),
    }
}

impl RedbStore {
    /// Opens the database at `path`, creating it (and its table) if needed.
    ///
    /// # Errors
    ///
    /// [`StoreError::Redb`] when the file cannot be opened or created (for example because
    /// another process has it open).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let db = Database::create(path).map_err(|e| redb_err("open the database")(e.into()))?;
        Self::from_database(db)
    }

    /// Uses an already opened database, creating the table if needed.
    ///
    /// # Errors
    ///
    /// [`StoreError::Redb`] when the table cannot be created.
    pub fn from_database(db: Database) -> Result<Self, StoreError> {
        let txn = db
            .begin_write()
            .map_err(|e| redb_err("begin a write")(e.into()))?;
        txn.open_table(VOLUMES)
            .map_err(|e| redb_err("create the table")(e.into()))?;
        txn.commit().map_err(|e| redb_err("commit")(e.into()))?;
        Ok(Self { db: Arc::new(db) })
    }

    /// The underlying database.
    pub fn database(&self) -> &Database {
        &self.db
    }
}

fn split(key: &str, value: &[u8]) -> Result<Stored, StoreError> {
    let decode_err = |source| StoreError::Decode {
        key: key.to_owned(),
        source,
    };
    let (head, body) = value.split_at_checked(8).unwrap_or((&[], value));
    let version = <[u8; 8]>::try_from(head)
        .ok()
        .map(u64::from_be_bytes)
        .and_then(Version::from_u64);
    let Some(version) = version else {
        return Err(decode_err(codec::DecodeError::UnsupportedFormat {
            found: "missing or zero version header".to_owned(),
        }));
    };
    let (record, format) = codec::decode(body).map_err(decode_err)?;
    Ok(Stored {
        version,
        record,
        format,
    })
}

fn stored_version(value: &[u8]) -> Option<Version> {
    let head = value.get(..8)?;
    let bytes = <[u8; 8]>::try_from(head).ok()?;
    Version::from_u64(u64::from_be_bytes(bytes))
}

/// Runs `call` on the blocking pool; a call that never finished (its task panicked or was
/// cancelled) is `lost`.
async fn blocking<T: Send + 'static>(
    lost: StoreError,
    call: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(call).await.unwrap_or(Err(lost))
}

#[async_trait::async_trait]
impl ClaimStore for RedbStore {
    async fn load_all(&self) -> Result<Vec<Stored>, StoreError> {
        let this = self.clone();
        blocking(StoreError::LoadInterrupted, move || {
            this.load_all_blocking()
        })
        .await
    }

    async fn load(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError> {
        let (this, key) = (self.clone(), volume.clone());
        let lost = StoreError::Interrupted {
            volume: volume.clone(),
        };
        blocking(lost, move || this.load_blocking(&key)).await
    }

    async fn compare_and_swap(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
    ) -> Result<Option<Version>, StoreError> {
        let encoded = encode_for(volume, new)?;
        let (this, key) = (self.clone(), volume.clone());
        let lost = StoreError::Interrupted {
            volume: volume.clone(),
        };
        blocking(lost, move || this.swap_blocking(&key, expected, encoded)).await
    }
}

impl RedbStore {
    fn load_all_blocking(&self) -> Result<Vec<Stored>, StoreError> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| redb_err("begin a read")(e.into()))?;
        let table = txn
            .open_table(VOLUMES)
            .map_err(|e| redb_err("open the table")(e.into()))?;
        let mut out = Vec::new();
        for item in table
            .iter()
            .map_err(|e| redb_err("iterate the table")(e.into()))?
        {
            let (k, v) = item.map_err(|e| redb_err("read an entry")(e.into()))?;
            out.push(split(k.value(), v.value())?);
        }
        Ok(out)
    }

    fn load_blocking(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError> {
        let txn = self
            .db
            .begin_read()
            .map_err(|e| redb_err("begin a read")(e.into()))?;
        let table = txn
            .open_table(VOLUMES)
            .map_err(|e| redb_err("open the table")(e.into()))?;
        let value = table
            .get(volume.as_str())
            .map_err(|e| redb_err("read an entry")(e.into()))?;
        value.map(|v| split(volume.as_str(), v.value())).transpose()
    }

    fn swap_blocking(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        encoded: Option<Vec<u8>>,
    ) -> Result<Option<Version>, StoreError> {
        let txn = self
            .db
            .begin_write()
            .map_err(|e| redb_err("begin a write")(e.into()))?;
        let written = {
            let mut table = txn
                .open_table(VOLUMES)
                .map_err(|e| redb_err("open the table")(e.into()))?;
            let found = table
                .get(volume.as_str())
                .map_err(|e| redb_err("read an entry")(e.into()))?
                .and_then(|v| stored_version(v.value()));
            if found != expected {
                return Err(StoreError::Conflict {
                    volume: volume.clone(),
                    expected,
                    found,
                });
            }
            match encoded {
                Some(body) => {
                    let version = Version::after(found);
                    let mut value = Vec::with_capacity(8 + body.len());
                    value.extend_from_slice(&version.get().to_be_bytes());
                    value.extend_from_slice(&body);
                    table
                        .insert(volume.as_str(), value.as_slice())
                        .map_err(|e| redb_err("write an entry")(e.into()))?;
                    Some(version)
                }
                None => {
                    table
                        .remove(volume.as_str())
                        .map_err(|e| redb_err("remove an entry")(e.into()))?;
                    None
                }
            }
        };
        txn.commit().map_err(|e| redb_err("commit")(e.into()))?;
        Ok(written)
    }
}
