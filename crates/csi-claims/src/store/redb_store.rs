//! The durable [`ClaimStore`] on redb, closed after an I/O error and opened again with backoff.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use csi_structs::VolumeId;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::{ClaimStore, StoreError, Stored, Version, codec, encode_for};
use crate::model::VolumeRecord;

/// One table: volume id → 8-byte big-endian version followed by the JSON record
/// ([`codec`](super::encode)).
const VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("csi_claims.volumes");

/// How long a store closed after an I/O error waits before opening its file again.
pub const REOPEN_FIRST_DELAY: Duration = Duration::from_millis(50);

/// The longest wait between two attempts to open the file again (the wait doubles from
/// [`REOPEN_FIRST_DELAY`] up to this).
pub const REOPEN_MAX_DELAY: Duration = Duration::from_secs(5);

/// Opens the database again after an I/O error.
type Opener = dyn Fn() -> Result<Database, redb::DatabaseError> + Send + Sync;

/// A [`ClaimStore`] in a redb database file: every successful
/// [`compare_and_swap`](ClaimStore::compare_and_swap) is one write transaction committed with
/// immediate durability, so it survives a crash once it returns.
///
/// Each call runs on tokio's blocking pool (a commit waits for the disk), so the store needs a
/// tokio runtime.
///
/// # When the disk fails
///
/// After an I/O error (a full disk, say) redb refuses every further call ("Previous I/O error
/// occurred. Please close and re-open the database"). The store then closes the database and
/// answers every call at once with [`StoreError::Unavailable`], naming the file and the
/// error, without touching the disk; it opens the file again [`REOPEN_FIRST_DELAY`] later,
/// then with a doubling wait of at most [`REOPEN_MAX_DELAY`], on the first call after each
/// wait. Opening recovers the last committed state, so a store whose disk has space again
/// works again without a restart. A write that failed may or may not have been committed:
/// read the record again before relying on it (the claim driver does).
///
/// redb panics on some damaged files instead of reporting them, on open and on a read. The
/// store catches that panic and answers it as a damaged file ([`StoreError::Redb`] naming it),
/// and closes the database the same way.
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
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// `redb <file>`, for errors and logs.
    name: String,
    /// How to open the database again; `None` when the caller opened it.
    open: Option<Box<Opener>>,
    health: Mutex<Health>,
}

/// Whether the database is open, and if not, why and when it is opened again.
enum Health {
    Open(Arc<Database>),
    /// Closed after an I/O error; opened again on the first call from `retry_at` on.
    Closed {
        reason: String,
        /// Failed attempts to open it again.
        attempts: u32,
        retry_at: Instant,
    },
    /// One call is opening it again; the others are refused meanwhile.
    Reopening {
        reason: String,
    },
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open = matches!(*self.inner.health(), Health::Open(_));
        f.debug_struct("RedbStore")
            .field("store", &self.inner.name)
            .field("open", &open)
            .finish()
    }
}

impl Inner {
    fn health(&self) -> MutexGuard<'_, Health> {
        // Every critical section only swaps the state; a panic cannot leave it half-changed.
        self.health.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The wait before attempt `attempts + 1` to open the file again.
fn reopen_delay(attempts: u32) -> Duration {
    REOPEN_FIRST_DELAY
        .saturating_mul(1 << attempts.min(16))
        .min(REOPEN_MAX_DELAY)
}

/// Whether redb latched an I/O failure: the database must be closed and opened again.
fn is_io_failure(e: &redb::Error) -> bool {
    matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo)
}

/// Whether `e` is [`RedbStore::with_database`]'s answer to a panic inside redb: the database
/// is closed too, since a panic may have left its state in memory half changed.
fn is_panic(e: &redb::Error) -> bool {
    matches!(e, redb::Error::Corrupted(reason) if reason == PANICKED)
}

impl RedbStore {
    /// Opens the database at `path`, creating it (and its table) if needed. After an I/O
    /// error the file is opened again the same way (see the type's docs).
    ///
    /// A new database is created under another name (`<path>.new`) and renamed into place, so
    /// a crash while creating it never leaves an empty file at `path`. An empty file there is
    /// therefore a store that lost its content, and is refused: redb would start it over with
    /// no claims, and every claim it held would be forgotten without a word.
    ///
    /// # Errors
    ///
    /// [`StoreError::Redb`] naming the file when it cannot be opened or created (for example
    /// because another process has it open), when it is empty, or when it is damaged (also
    /// when redb panics reading it, as it does on some damaged files).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path: PathBuf = path.as_ref().to_path_buf();
        let name = format!("redb {}", path.display());
        Self::with_opener(name, move || open_file(&path))
    }

    /// Opens the database with `open`, and again with it after an I/O error (see the type's
    /// docs): for a database on a backend of your own, or with settings of your own.
    /// `name` names the store in errors and logs (its file, say).
    ///
    /// ```
    /// use csi_claims::store::RedbStore;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("claims.redb");
    /// let store = RedbStore::with_opener(format!("redb {}", path.display()), move || {
    ///     redb::Builder::new().set_cache_size(1 << 20).create(&path)
    /// })
    /// .unwrap();
    /// # let _ = store;
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Redb`] when `open` fails or the table cannot be created.
    pub fn with_opener(
        name: impl Into<String>,
        open: impl Fn() -> Result<Database, redb::DatabaseError> + Send + Sync + 'static,
    ) -> Result<Self, StoreError> {
        let name = name.into();
        let db = guarded(&open).map_err(|e| StoreError::Redb {
            store: name.clone(),
            operation: "open the database",
            source: Box::new(e.into()),
        })?;
        create_table(&name, &db)?;
        Ok(Self {
            inner: Arc::new(Inner {
                name,
                open: Some(Box::new(open)),
                health: Mutex::new(Health::Open(Arc::new(db))),
            }),
        })
    }

    /// Uses an already opened database, creating the table if needed. The store cannot open
    /// it again after an I/O error: it then refuses every call until restarted. Prefer
    /// [`open`](Self::open) or [`with_opener`](Self::with_opener).
    ///
    /// # Errors
    ///
    /// [`StoreError::Redb`] when the table cannot be created.
    pub fn from_database(db: Database) -> Result<Self, StoreError> {
        let name = "redb (a database opened by the caller)".to_owned();
        create_table(&name, &db)?;
        Ok(Self {
            inner: Arc::new(Inner {
                name,
                open: None,
                health: Mutex::new(Health::Open(Arc::new(db))),
            }),
        })
    }

    /// The database, while it is open (`None` while it is closed after an I/O error). The
    /// store contains a panic of redb's when it closes the database; a handle that outlives
    /// the store closes it where the handle is dropped, without that guard.
    pub fn database(&self) -> Option<Arc<Database>> {
        match &*self.inner.health() {
            Health::Open(db) => Some(Arc::clone(db)),
            Health::Closed { .. } | Health::Reopening { .. } => None,
        }
    }

    /// `redb` and the file, as errors name the store.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    fn err(&self, operation: &'static str) -> impl FnOnce(redb::Error) -> StoreError + '_ {
        move |e| StoreError::Redb {
            store: self.inner.name.clone(),
            operation,
            source: Box::new(e),
        }
    }

    fn unavailable(&self, reason: String) -> StoreError {
        StoreError::Unavailable {
            store: self.inner.name.clone(),
            reason,
        }
    }

    /// The open database; opens it again when it was closed and its wait is over.
    fn database_now(&self) -> Result<Arc<Database>, StoreError> {
        let reason = {
            let mut health = self.inner.health();
            let now = Instant::now();
            match &*health {
                Health::Open(db) => return Ok(Arc::clone(db)),
                Health::Reopening { reason } => {
                    return Err(self.unavailable(format!("{reason}; being opened again now")));
                }
                Health::Closed { reason, .. } if self.inner.open.is_none() => {
                    return Err(self.unavailable(format!(
                        "{reason}; it was opened by the caller and cannot be opened again"
                    )));
                }
                Health::Closed {
                    reason, retry_at, ..
                } if now < *retry_at => {
                    let wait = retry_at.saturating_duration_since(now);
                    return Err(self.unavailable(format!(
                        "{reason}; opened again in {} ms",
                        wait.as_millis().max(1)
                    )));
                }
                Health::Closed { reason, .. } => {
                    let reason = reason.clone();
                    let previous = std::mem::replace(
                        &mut *health,
                        Health::Reopening {
                            reason: reason.clone(),
                        },
                    );
                    let attempts = match previous {
                        Health::Closed { attempts, .. } => attempts,
                        _ => 0,
                    };
                    (reason, attempts)
                }
            }
        };
        let (reason, attempts) = reason;
        // Opened outside the lock: a repair on open may take a while, and other calls are
        // refused at once meanwhile.
        let opened = match &self.inner.open {
            Some(open) => match guarded(open) {
                Ok(db) => create_table(&self.inner.name, &db)
                    .map(|()| db)
                    .map_err(|e| crate::error::error_chain(&e)),
                Err(e) => Err(e.to_string()),
            },
            None => Err("it cannot be opened again".to_owned()),
        };
        let mut health = self.inner.health();
        match opened {
            Ok(db) => {
                tracing::info!(store = %self.inner.name, after = %reason,
                    "claim store opened again; it works again");
                let db = Arc::new(db);
                *health = Health::Open(Arc::clone(&db));
                Ok(db)
            }
            Err(e) => {
                let attempts = attempts.saturating_add(1);
                let wait = reopen_delay(attempts);
                tracing::debug!(store = %self.inner.name, error = %e, ?wait,
                    "claim store could not be opened again yet");
                *health = Health::Closed {
                    reason: reason.clone(),
                    attempts,
                    retry_at: Instant::now() + wait,
                };
                Err(self.unavailable(format!(
                    "{reason}; opening it again failed ({e}), next attempt in {} ms",
                    wait.as_millis()
                )))
            }
        }
    }

    /// Runs `call` on the open database; an I/O failure closes it (see the type's docs), and
    /// so does a panic inside redb, which some damaged files cause on a read as well as on
    /// open: it is answered as a damaged file, naming it.
    fn with_database<T>(
        &self,
        call: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let db = self.database_now()?;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(&db)))
            .unwrap_or_else(|_| {
                Err(StoreError::Redb {
                    store: self.inner.name.clone(),
                    operation: "read or write the file",
                    source: Box::new(redb::Error::Corrupted(PANICKED.to_owned())),
                })
            });
        if let Err(StoreError::Redb { source, .. }) = &result
            && (is_io_failure(source) || is_panic(source))
        {
            let mut health = self.inner.health();
            if let Health::Open(current) = &*health
                && Arc::ptr_eq(current, &db)
            {
                let what = if is_panic(source) {
                    "a damaged file"
                } else {
                    "an I/O error"
                };
                let reason = format!("closed after {what}: {source}");
                tracing::warn!(store = %self.inner.name, error = %source,
                    "claim store closed after {what}; every call fails at once until \
                     it is opened again (first attempt in {} ms, then with backoff)",
                    REOPEN_FIRST_DELAY.as_millis());
                *health = Health::Closed {
                    reason,
                    attempts: 0,
                    retry_at: Instant::now() + REOPEN_FIRST_DELAY,
                };
            }
        }
        // Dropping the last handle (here, once no other call uses it) closes the database.
        close(&self.inner.name, db);
        result
    }
}

/// Drops a handle of the database. Dropping the last one closes it, which writes to the file,
/// and redb may panic doing so on a damaged file: the panic is contained here.
fn close(store: &str, db: Arc<Database>) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db))).is_err() {
        tracing::warn!(
            store,
            "redb panicked closing the claim store's file: it is damaged"
        );
    }
}

impl Drop for Inner {
    /// Closes the database (when no call holds it), containing a panic of redb's.
    fn drop(&mut self) {
        let health = std::mem::replace(
            self.health
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
            Health::Reopening {
                reason: "the store was dropped".to_owned(),
            },
        );
        if let Health::Open(db) = health {
            close(&self.name, db);
        }
    }
}

/// What redb says when it panicked reading a file.
const PANICKED: &str = "redb panicked reading the file: it is damaged";

/// Runs `open`, answering a panic inside redb (it panics on some damaged files instead of
/// reporting them corrupted) as a corrupted database.
fn guarded(
    open: impl FnOnce() -> Result<Database, redb::DatabaseError>,
) -> Result<Database, redb::DatabaseError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(open)).unwrap_or_else(|_| {
        Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(
            PANICKED.to_owned(),
        )))
    })
}

/// Opens the database file at `path` for [`RedbStore::open`]: refuses an empty file, and
/// creates a missing one, with its table, under another name before renaming it into place.
///
/// An existing file must hold the table: every file this store creates has it from the start.
/// Damage may make redb read the file's list of tables as empty, and creating the table then
/// would start the store over with no claims and no error.
///
/// redb's integrity check on open is not used: where the newest commit fails it, redb repairs
/// the file by going back to the commit before, which would lose an acknowledged write
/// without a word, where a plain read of a damaged page is an error.
fn open_file(path: &Path) -> Result<Database, redb::DatabaseError> {
    use redb::{DatabaseError, StorageError};
    let io = |e| DatabaseError::Storage(StorageError::Io(e));
    match std::fs::metadata(path) {
        Ok(m) if m.len() == 0 => Err(DatabaseError::Storage(StorageError::Corrupted(
            "the file is empty: this store never leaves an empty file, so the claims it held \
             were lost; it is not started over with none (move the file away to start a new \
             store)"
                .to_owned(),
        ))),
        Ok(_) => {
            let db = Database::create(path)?;
            if !has_table(&db).map_err(database_error)? {
                return Err(DatabaseError::Storage(StorageError::Corrupted(
                    "the claims table is missing: this store creates it with the file, so the \
                     file is damaged; it is not started over with no claims (move the file \
                     away to start a new store)"
                        .to_owned(),
                )));
            }
            Ok(db)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut fresh = path.as_os_str().to_owned();
            fresh.push(".new");
            let fresh = PathBuf::from(fresh);
            match std::fs::remove_file(&fresh) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
                _ => {}
            }
            let db = Database::create(&fresh)?;
            let with_table = || -> Result<(), redb::Error> {
                let txn = db.begin_write()?;
                txn.open_table(VOLUMES)?;
                txn.commit()?;
                Ok(())
            };
            with_table().map_err(database_error)?;
            drop(db);
            std::fs::rename(&fresh, path).map_err(io)?;
            // The rename itself survives a power loss once the directory is synced.
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(io)?;
            }
            Database::create(path)
        }
        Err(e) => Err(io(e)),
    }
}

/// `e` as an error of opening the file (which is what the caller of [`open_file`] gets).
fn database_error(e: redb::Error) -> redb::DatabaseError {
    use redb::{DatabaseError, StorageError};
    match e {
        redb::Error::Io(io) => DatabaseError::Storage(StorageError::Io(io)),
        redb::Error::Corrupted(reason) => DatabaseError::Storage(StorageError::Corrupted(reason)),
        other => DatabaseError::Storage(StorageError::Io(std::io::Error::other(other.to_string()))),
    }
}

/// Whether the claims table exists in `db`.
fn has_table(db: &Database) -> Result<bool, redb::Error> {
    let txn = db.begin_read()?;
    match txn.open_table(VOLUMES) {
        Ok(_) => Ok(true),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn create_table(name: &str, db: &Database) -> Result<(), StoreError> {
    // redb may panic on a damaged file here too.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        create_table_unguarded(name, db)
    }))
    .unwrap_or_else(|_| {
        Err(StoreError::Redb {
            store: name.to_owned(),
            operation: "create the table",
            source: Box::new(redb::Error::Corrupted(PANICKED.to_owned())),
        })
    })
}

fn create_table_unguarded(name: &str, db: &Database) -> Result<(), StoreError> {
    let err = |operation: &'static str| {
        move |e: redb::Error| StoreError::Redb {
            store: name.to_owned(),
            operation,
            source: Box::new(e),
        }
    };
    let txn = db
        .begin_write()
        .map_err(|e| err("begin a write")(e.into()))?;
    txn.open_table(VOLUMES)
        .map_err(|e| err("create the table")(e.into()))?;
    txn.commit().map_err(|e| err("commit")(e.into()))?;
    Ok(())
}

fn split(store: &str, key: &str, value: &[u8]) -> Result<Stored, StoreError> {
    let decode_err = |source| StoreError::Decode {
        store: store.to_owned(),
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
            this.with_database(|db| this.load_all_blocking(db))
        })
        .await
    }

    async fn load(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError> {
        let (this, key) = (self.clone(), volume.clone());
        let lost = StoreError::Interrupted {
            volume: volume.clone(),
        };
        blocking(lost, move || {
            this.with_database(|db| this.load_blocking(db, &key))
        })
        .await
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
        blocking(lost, move || {
            this.with_database(|db| this.swap_blocking(db, &key, expected, encoded))
        })
        .await
    }
}

impl RedbStore {
    fn load_all_blocking(&self, db: &Database) -> Result<Vec<Stored>, StoreError> {
        let txn = db
            .begin_read()
            .map_err(|e| self.err("begin a read")(e.into()))?;
        let table = txn
            .open_table(VOLUMES)
            .map_err(|e| self.err("open the table")(e.into()))?;
        let mut out = Vec::new();
        for item in table
            .iter()
            .map_err(|e| self.err("iterate the table")(e.into()))?
        {
            let (k, v) = item.map_err(|e| self.err("read an entry")(e.into()))?;
            out.push(split(&self.inner.name, k.value(), v.value())?);
        }
        Ok(out)
    }

    fn load_blocking(
        &self,
        db: &Database,
        volume: &VolumeId,
    ) -> Result<Option<Stored>, StoreError> {
        let txn = db
            .begin_read()
            .map_err(|e| self.err("begin a read")(e.into()))?;
        let table = txn
            .open_table(VOLUMES)
            .map_err(|e| self.err("open the table")(e.into()))?;
        let value = table
            .get(volume.as_str())
            .map_err(|e| self.err("read an entry")(e.into()))?;
        value
            .map(|v| split(&self.inner.name, volume.as_str(), v.value()))
            .transpose()
    }

    fn swap_blocking(
        &self,
        db: &Database,
        volume: &VolumeId,
        expected: Option<Version>,
        encoded: Option<Vec<u8>>,
    ) -> Result<Option<Version>, StoreError> {
        let txn = db
            .begin_write()
            .map_err(|e| self.err("begin a write")(e.into()))?;
        let written = {
            let mut table = txn
                .open_table(VOLUMES)
                .map_err(|e| self.err("open the table")(e.into()))?;
            let found = table
                .get(volume.as_str())
                .map_err(|e| self.err("read an entry")(e.into()))?
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
                        .map_err(|e| self.err("write an entry")(e.into()))?;
                    Some(version)
                }
                None => {
                    table
                        .remove(volume.as_str())
                        .map_err(|e| self.err("remove an entry")(e.into()))?;
                    None
                }
            }
        };
        txn.commit().map_err(|e| self.err("commit")(e.into()))?;
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reopen_wait_doubles_up_to_its_cap() {
        assert_eq!(reopen_delay(0), REOPEN_FIRST_DELAY);
        assert_eq!(reopen_delay(1), REOPEN_FIRST_DELAY * 2);
        assert_eq!(reopen_delay(3), REOPEN_FIRST_DELAY * 8);
        assert_eq!(reopen_delay(40), REOPEN_MAX_DELAY);
    }

    /// Found by the crash campaign (seed 10, case 1414, release build): redb panicked while
    /// iterating a damaged table, after the file had opened, and the load ended as "did not
    /// finish" without naming the file.
    #[tokio::test]
    async fn a_panic_inside_redb_on_a_read_names_the_file_and_closes_the_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("claims.redb");
        let store = RedbStore::open(&path).expect("opens");
        let err = store
            .with_database(|_| -> Result<(), StoreError> { panic!("as redb does on damage") })
            .expect_err("a panic is an error");
        let text = crate::error::error_chain(&err);
        assert!(text.contains("claims.redb"), "{text}");
        assert!(text.contains("damaged"), "{text}");
        assert!(err.is_unavailable() && !err.is_permanent(), "{text}");
        // Closed: the next call is refused at once, naming the file and why, until the wait
        // before opening it again is over; then it opens again (the file is whole).
        let refused = store.load_all().await.expect_err("closed");
        let text = refused.to_string();
        assert!(text.contains("claims.redb"), "{text}");
        assert!(text.contains("closed after a damaged file"), "{text}");
        tokio::time::sleep(REOPEN_FIRST_DELAY * 2).await;
        assert_eq!(store.load_all().await.expect("opened again").len(), 0);
    }
}
