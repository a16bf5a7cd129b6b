//! The durable [`ClaimStore`] on redb, closed after an I/O error and opened again with backoff,
//! its writes group-committed by one writer thread.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use csi_structs::VolumeId;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::{ClaimStore, StoreError, Stored, Version, codec, encode_for};
use crate::model::VolumeRecord;

/// One table: volume id → 8-byte big-endian version followed by the JSON record
/// ([`codec`](super::encode)).
const VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new(VOLUMES_TABLE);

/// The claims table's name, which [`RedbStore::records`] refuses.
const VOLUMES_TABLE: &str = "csi_claims.volumes";

/// How long a store closed after an I/O error waits before opening its file again.
pub const REOPEN_FIRST_DELAY: Duration = Duration::from_millis(50);

/// The longest wait between two attempts to open the file again (the wait doubles from
/// [`REOPEN_FIRST_DELAY`] up to this).
pub const REOPEN_MAX_DELAY: Duration = Duration::from_secs(5);

/// Opens the database again after an I/O error.
type Opener = dyn Fn() -> Result<Database, redb::DatabaseError> + Send + Sync;

/// A [`ClaimStore`] in a redb database file: every successful
/// [`compare_and_swap`](ClaimStore::compare_and_swap) is committed with immediate durability,
/// so it survives a crash once it returns.
///
/// # Group commit
///
/// Writes do not take turns on the disk. One writer at a time (a thread borrowed from tokio's
/// blocking pool while there is something to write, never a thread per write) takes every
/// write queued since its last commit (at most [`MAX_BATCH`]) into one transaction, commits it
/// with one `fsync`, and then answers each caller: 32 callers on 32 volumes cost about one
/// commit, not 32 in a row. Each compare-and-swap is checked on its own inside the transaction, so a stale
/// write is refused ([`StoreError::Conflict`]) without failing the others; a failed commit
/// fails every write of the batch (and none of them is known not to have landed). Records of
/// other tables in the same file ([`RedbStore::records`]) go through the same writer, so a
/// node's claims and its usage records share the commits. Reads do not wait for the writer:
/// each runs on tokio's blocking pool on its own read transaction, so the store needs a tokio
/// runtime.
///
/// A commit that hangs (a stalled disk) holds the writer. A write asked for while the batch
/// under way has been running longer than [`STALL_AFTER`] is refused at once
/// ([`StoreError::Unavailable`], nothing written) rather than queued behind it; the caller's
/// own timeout (the claim driver's `store_timeout`) bounds the wait of a write already queued.
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
    inner: Arc<Shared>,
}

/// The most writes one transaction takes: a longer queue is committed in several.
pub const MAX_BATCH: usize = 512;

/// How long a commit may run before further writes are refused at once instead of queued
/// behind it (a stalled disk).
pub const STALL_AFTER: Duration = Duration::from_secs(10);

/// The store, as its handles and its writer share it.
struct Shared {
    /// `redb <file>`, for errors and logs.
    name: String,
    /// How to open the database again; `None` when the caller opened it.
    open: Option<Box<Opener>>,
    health: Mutex<Health>,
    /// When the batch under way started (`None`: no commit under way).
    committing_since: Mutex<Option<Instant>>,
    /// The writes waiting for the next commit.
    queue: Mutex<Queue>,
    /// Dropped with the store, once its database is closed: what [`RedbStore::close`]
    /// waits for.
    dropped: tokio::sync::watch::Sender<()>,
}

/// The writes waiting for the writer, and whether a writer runs.
#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    /// A writer is on the blocking pool: it takes `jobs` before it ends.
    writing: bool,
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

/// A lock whose critical sections only swap a value: a panic cannot leave it half-changed.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn health(&self) -> MutexGuard<'_, Health> {
        lock(&self.health)
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

/// Whether `e` is [`Shared::with_database`]'s answer to a panic inside redb: the database
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
        Self::start(name, Some(Box::new(open)), db)
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
        Self::start(name, None, db)
    }

    /// The store on `db`.
    fn start(name: String, open: Option<Box<Opener>>, db: Database) -> Result<Self, StoreError> {
        Ok(Self {
            inner: Arc::new(Shared {
                name,
                open,
                health: Mutex::new(Health::Open(Arc::new(db))),
                committing_since: Mutex::new(None),
                queue: Mutex::new(Queue::default()),
                dropped: tokio::sync::watch::Sender::new(()),
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

    /// Writes queued for the next commit (not counting the batch being committed): for a
    /// status page, or a test that waits until its writes are queued.
    pub fn writes_waiting(&self) -> usize {
        lock(&self.inner.queue).jobs.len()
    }

    /// `redb` and the file, as errors name the store.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Queues `write` for the writer and waits for its commit; `lost` when the writer ended
    /// without answering (its outcome is unknown).
    async fn submit(&self, write: Write, lost: StoreError) -> Result<Option<Version>, StoreError> {
        if let Some(since) = *lock(&self.inner.committing_since) {
            let running = since.elapsed();
            if running > STALL_AFTER {
                return Err(self.inner.unavailable(format!(
                    "a commit has not finished after {} s (stalled disk?); nothing was written",
                    running.as_secs()
                )));
            }
        }
        let (answer, answered) = tokio::sync::oneshot::channel();
        let start_writer = {
            let mut queue = lock(&self.inner.queue);
            queue.jobs.push(Job { write, answer });
            !std::mem::replace(&mut queue.writing, true)
        };
        if start_writer {
            let shared = Arc::clone(&self.inner);
            // On the blocking pool rather than a thread of its own: tokio then knows the
            // store is busy on the disk (a paused test clock does not jump past a commit).
            drop(tokio::task::spawn_blocking(move || {
                Shared::write_queued(Writer {
                    shared,
                    done: false,
                });
            }));
        }
        answered.await.unwrap_or(Err(lost))
    }

    /// Runs `call` on the open database, as every read does (see [`Shared::with_database`]).
    pub(super) fn with_database<T>(
        &self,
        call: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.inner.with_database(call)
    }

    /// A table of records of `table`'s own in this store's file, written through the store's
    /// writer: see [`RedbRecords`].
    ///
    /// ```
    /// use csi_claims::store::RedbStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = RedbStore::open(dir.path().join("node.redb")).unwrap();
    /// let usage = store.records("my_orchestrator.usage").unwrap();
    /// usage.put("web/db", Some(b"{}".to_vec())).await.unwrap();
    /// assert_eq!(usage.read_all().unwrap(), vec![("web/db".to_owned(), b"{}".to_vec())]);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::TableName`] when `table` is empty, longer than 255 bytes, or the claims'
    /// own table.
    pub fn records(&self, table: &str) -> Result<RedbRecords, StoreError> {
        if table.is_empty() || table.len() > 255 || table == VOLUMES_TABLE {
            return Err(StoreError::TableName {
                store: self.inner.name.clone(),
                table: table.chars().take(300).collect(),
                claims: VOLUMES_TABLE,
            });
        }
        Ok(RedbRecords {
            store: self.clone(),
            table: Arc::from(table),
        })
    }

    /// Lets go of this handle and waits, at most `within`, until the database is closed:
    /// every other handle of the store (its clones, the [`RedbRecords`] of its tables, a
    /// driver's) has been dropped and a commit under way has ended. The file can then be
    /// opened again, by this process or another.
    ///
    /// A [`Database`] taken with [`database`](Self::database) keeps the file open until it
    /// is dropped too, whatever this says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use csi_claims::store::RedbStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("node.redb");
    /// let store = RedbStore::open(&path).unwrap();
    /// store.close(Duration::from_secs(10)).await.unwrap();
    /// // Closed: it opens again at once.
    /// let again = RedbStore::open(&path).unwrap();
    /// # drop(again);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] naming the file when another handle still holds it after
    /// `within` (this handle is let go of either way).
    pub async fn close(self, within: Duration) -> Result<(), StoreError> {
        let mut dropped = self.inner.dropped.subscribe();
        let name = self.inner.name.clone();
        drop(self);
        // The sender goes with the store, after its database was closed: `changed` then
        // answers an error. Nothing is ever sent, so an `Ok` cannot come.
        match tokio::time::timeout(within, dropped.changed()).await {
            Ok(_) => Ok(()),
            Err(_) => Err(StoreError::Unavailable {
                store: name,
                reason: format!(
                    "not closed after {within:?}: another handle of the store (a clone, the \
                     records of a table, a driver) is still held"
                ),
            }),
        }
    }
}

/// One write waiting for the writer.
struct Job {
    write: Write,
    answer: tokio::sync::oneshot::Sender<Result<Option<Version>, StoreError>>,
}

/// The writer's hold on the store. Should the writer end without taking the queue (its task
/// dropped before it ran, at a runtime's shutdown), the writes queued are failed, nothing
/// written, rather than left waiting for a writer that never comes.
struct Writer {
    shared: Arc<Shared>,
    /// Set once the writer handed the queue back (`writing` cleared under its lock).
    done: bool,
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut queue = lock(&self.shared.queue);
        if std::mem::replace(&mut queue.writing, false) {
            for job in queue.jobs.drain(..) {
                let _ = job.answer.send(Err(self.shared.unavailable(
                    "its writer stopped before this write (is the runtime shutting down?); \
                     nothing was written"
                        .to_owned(),
                )));
            }
        }
    }
}

/// Sends each job its answer (a caller that stopped waiting is skipped).
fn answer(batch: Vec<Job>, answers: Vec<Result<Option<Version>, StoreError>>) {
    for (job, answer) in batch.into_iter().zip(answers) {
        let _ = job.answer.send(answer);
    }
}

/// What a [`Job`] writes.
enum Write {
    /// A claim record's compare-and-swap (`encoded: None` removes it).
    Swap {
        volume: VolumeId,
        expected: Option<Version>,
        encoded: Option<Vec<u8>>,
    },
    /// A record of another table, put or removed (`value: None`).
    Put {
        table: Arc<str>,
        key: String,
        value: Option<Vec<u8>>,
    },
}

impl Shared {
    /// The writer: while writes are queued, takes them (at most [`MAX_BATCH`]), commits them
    /// in one transaction and answers each caller. It lets go of the store before the last
    /// answers go out, so a caller that drops the store once answered can open its file again
    /// at once.
    fn write_queued(mut writer: Writer) {
        let shared = Arc::clone(&writer.shared);
        let mut batch = Vec::new();
        loop {
            {
                let mut queue = lock(&shared.queue);
                // A caller that stopped waiting (timed out, or its task was dropped) takes the
                // outcome as unknown: its write need not be made.
                queue.jobs.retain(|job| !job.answer.is_closed());
                if queue.jobs.is_empty() {
                    queue.writing = false;
                    writer.done = true;
                    return;
                }
                let take = queue.jobs.len().min(MAX_BATCH);
                batch.extend(queue.jobs.drain(..take));
            }
            *lock(&shared.committing_since) = Some(Instant::now());
            let writes: Vec<&Write> = batch.iter().map(|job| &job.write).collect();
            let outcome = shared.with_database(|db| shared.commit_blocking(db, &writes));
            drop(writes);
            *lock(&shared.committing_since) = None;
            let answers: Vec<Result<Option<Version>, StoreError>> = match outcome {
                Ok(answers) => answers,
                Err(failed) => {
                    let why = crate::error::error_chain(&failed);
                    let mut failed = Some(failed);
                    batch
                        .iter()
                        .map(|_| Err(failed.take().unwrap_or_else(|| shared.copy_error(&why))))
                        .collect()
                }
            };
            let more = {
                let mut queue = lock(&shared.queue);
                let more = !queue.jobs.is_empty();
                queue.writing = more;
                more
            };
            if !more {
                // From here another writer may start for writes queued meanwhile.
                writer.done = true;
                drop(writer);
                drop(shared);
                answer(batch, answers);
                return;
            }
            answer(std::mem::take(&mut batch), answers);
        }
    }

    /// The error of a failed batch for a write other than the first, which got the
    /// database's own error: the same cause, in words (`why`).
    fn copy_error(&self, why: &str) -> StoreError {
        self.unavailable(format!(
            "the transaction this write was committed in failed ({why}); whether it landed is \
             unknown"
        ))
    }

    /// One transaction with every write of the batch; each answer in the batch's order. A
    /// stale compare-and-swap is its own answer; a failure of the database fails the batch.
    fn commit_blocking(
        &self,
        db: &Database,
        writes: &[&Write],
    ) -> Result<Vec<Result<Option<Version>, StoreError>>, StoreError> {
        let txn = db
            .begin_write()
            .map_err(|e| self.err("begin a write")(e.into()))?;
        let mut answers: Vec<Result<Option<Version>, StoreError>> =
            Vec::with_capacity(writes.len());
        {
            let mut volumes = txn
                .open_table(VOLUMES)
                .map_err(|e| self.err("open the table")(e.into()))?;
            for write in writes {
                let answer = match write {
                    Write::Swap {
                        volume,
                        expected,
                        encoded,
                    } => self.swap_in(&mut volumes, volume, *expected, encoded.as_deref())?,
                    Write::Put { .. } => Ok(None),
                };
                answers.push(answer);
            }
        }
        // Records of other tables, each table opened once, in the batch's order within it.
        let mut tables: Vec<&str> = Vec::new();
        for write in writes {
            if let Write::Put { table, .. } = write
                && !tables.contains(&&**table)
            {
                tables.push(table);
            }
        }
        for name in tables {
            let definition: TableDefinition<&str, &[u8]> = TableDefinition::new(name);
            let mut table = txn
                .open_table(definition)
                .map_err(|e| self.err("open a table of records")(e.into()))?;
            for write in writes {
                if let Write::Put {
                    table: of,
                    key,
                    value,
                } = write
                    && &**of == name
                {
                    match value {
                        Some(value) => {
                            table
                                .insert(key.as_str(), value.as_slice())
                                .map_err(|e| self.err("write a record")(e.into()))?;
                        }
                        None => {
                            table
                                .remove(key.as_str())
                                .map_err(|e| self.err("remove a record")(e.into()))?;
                        }
                    }
                }
            }
        }
        txn.commit().map_err(|e| self.err("commit")(e.into()))?;
        Ok(answers)
    }

    /// One compare-and-swap inside the batch's transaction: `Ok(Err(Conflict))` when stale.
    fn swap_in(
        &self,
        table: &mut redb::Table<'_, &'static str, &'static [u8]>,
        volume: &VolumeId,
        expected: Option<Version>,
        encoded: Option<&[u8]>,
    ) -> Result<Result<Option<Version>, StoreError>, StoreError> {
        let found = table
            .get(volume.as_str())
            .map_err(|e| self.err("read an entry")(e.into()))?
            .and_then(|v| stored_version(v.value()));
        if found != expected {
            return Ok(Err(StoreError::Conflict {
                volume: volume.clone(),
                expected,
                found,
            }));
        }
        match encoded {
            Some(body) => {
                let version = Version::after(found);
                let mut value = Vec::with_capacity(8 + body.len());
                value.extend_from_slice(&version.get().to_be_bytes());
                value.extend_from_slice(body);
                table
                    .insert(volume.as_str(), value.as_slice())
                    .map_err(|e| self.err("write an entry")(e.into()))?;
                Ok(Ok(Some(version)))
            }
            None => {
                table
                    .remove(volume.as_str())
                    .map_err(|e| self.err("remove an entry")(e.into()))?;
                Ok(Ok(None))
            }
        }
    }

    fn err(&self, operation: &'static str) -> impl FnOnce(redb::Error) -> StoreError + '_ {
        move |e| StoreError::Redb {
            store: self.name.clone(),
            operation,
            source: Box::new(e),
        }
    }

    fn unavailable(&self, reason: String) -> StoreError {
        StoreError::Unavailable {
            store: self.name.clone(),
            reason,
        }
    }

    /// The open database; opens it again when it was closed and its wait is over.
    fn database_now(&self) -> Result<Arc<Database>, StoreError> {
        let reason = {
            let mut health = self.health();
            let now = Instant::now();
            match &*health {
                Health::Open(db) => return Ok(Arc::clone(db)),
                Health::Reopening { reason } => {
                    return Err(self.unavailable(format!("{reason}; being opened again now")));
                }
                Health::Closed { reason, .. } if self.open.is_none() => {
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
        let opened = match &self.open {
            Some(open) => match guarded(open) {
                Ok(db) => create_table(&self.name, &db)
                    .map(|()| db)
                    .map_err(|e| crate::error::error_chain(&e)),
                Err(e) => Err(e.to_string()),
            },
            None => Err("it cannot be opened again".to_owned()),
        };
        let mut health = self.health();
        match opened {
            Ok(db) => {
                tracing::info!(store = %self.name, after = %reason,
                    "claim store opened again; it works again");
                let db = Arc::new(db);
                *health = Health::Open(Arc::clone(&db));
                Ok(db)
            }
            Err(e) => {
                let attempts = attempts.saturating_add(1);
                let wait = reopen_delay(attempts);
                tracing::debug!(store = %self.name, error = %e, ?wait,
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
                    store: self.name.clone(),
                    operation: "read or write the file",
                    source: Box::new(redb::Error::Corrupted(PANICKED.to_owned())),
                })
            });
        if let Err(StoreError::Redb { source, .. }) = &result
            && (is_io_failure(source) || is_panic(source))
        {
            let mut health = self.health();
            if let Health::Open(current) = &*health
                && Arc::ptr_eq(current, &db)
            {
                let what = if is_panic(source) {
                    "a damaged file"
                } else {
                    "an I/O error"
                };
                let reason = format!("closed after {what}: {source}");
                tracing::warn!(store = %self.name, error = %source,
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
        close(&self.name, db);
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

impl Drop for Shared {
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
            this.with_database(|db| this.inner.load_all_blocking(db))
        })
        .await
    }

    async fn load(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError> {
        let (this, key) = (self.clone(), volume.clone());
        let lost = StoreError::Interrupted {
            volume: volume.clone(),
        };
        blocking(lost, move || {
            this.with_database(|db| this.inner.load_blocking(db, &key))
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
        let lost = StoreError::Interrupted {
            volume: volume.clone(),
        };
        self.submit(
            Write::Swap {
                volume: volume.clone(),
                expected,
                encoded,
            },
            lost,
        )
        .await
    }
}

impl Shared {
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
            out.push(split(&self.name, k.value(), v.value())?);
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
            .map(|v| split(&self.name, volume.as_str(), v.value()))
            .transpose()
    }

    /// Every record of the table named `table` (none when it was never written).
    fn read_records(
        &self,
        db: &Database,
        table: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let txn = db
            .begin_read()
            .map_err(|e| self.err("begin a read")(e.into()))?;
        let definition: TableDefinition<&str, &[u8]> = TableDefinition::new(table);
        let table = match txn.open_table(definition) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.err("open a table of records")(e.into())),
        };
        let mut out = Vec::new();
        for item in table
            .iter()
            .map_err(|e| self.err("iterate a table of records")(e.into()))?
        {
            let (k, v) = item.map_err(|e| self.err("read a record")(e.into()))?;
            out.push((k.value().to_owned(), v.value().to_vec()));
        }
        Ok(out)
    }
}

/// A table of records of its own in a [`RedbStore`]'s file, for a caller's records other
/// than claims (csi-node keeps a node's usage records in one): keys and values are the
/// caller's bytes. Writes go through the store's writer, so they share its group commits,
/// its `fsync`s and its recovery after an I/O error: a put returns once it is durable, and a
/// node's claims and usage records written at the same moment are committed together.
///
/// Made by [`RedbStore::records`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RedbRecords {
    store: RedbStore,
    table: Arc<str>,
}

impl RedbRecords {
    /// The store's name and the table, as errors name them: `redb <file> table <table>`.
    pub fn name(&self) -> String {
        format!("{} table {}", self.store.name(), self.table)
    }

    /// The store the table is in.
    pub fn store(&self) -> &RedbStore {
        &self.store
    }

    /// Every record, by key. Blocks on the disk: call it at startup, or off the runtime.
    ///
    /// # Errors
    ///
    /// [`StoreError::Redb`] or [`StoreError::Unavailable`] naming the store's file.
    pub fn read_all(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let shared = &self.store.inner;
        shared.with_database(|db| shared.read_records(db, &self.table))
    }

    /// Puts `value` under `key` (`None` removes it), durably once it returns. Writes of one
    /// key land in the order they were made.
    ///
    /// # Errors
    ///
    /// [`StoreError::Redb`] or [`StoreError::Unavailable`] naming the store's file: the
    /// write may or may not have landed.
    pub async fn put(&self, key: &str, value: Option<Vec<u8>>) -> Result<(), StoreError> {
        let lost = self.store.inner.unavailable(format!(
            "the writer ended before answering the write of {key:?} in table {}; whether it \
             landed is unknown",
            self.table
        ));
        self.store
            .submit(
                Write::Put {
                    table: Arc::clone(&self.table),
                    key: key.to_owned(),
                    value,
                },
                lost,
            )
            .await
            .map(drop)
    }

    /// Puts every record of `records` in one transaction, from the calling thread (for an
    /// import at startup: blocks on the disk).
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put); nothing was written when it fails before the commit.
    pub fn put_all_blocking(&self, records: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        let shared = &self.store.inner;
        let writes: Vec<Write> = records
            .iter()
            .map(|(key, value)| Write::Put {
                table: Arc::clone(&self.table),
                key: key.clone(),
                value: Some(value.clone()),
            })
            .collect();
        let writes: Vec<&Write> = writes.iter().collect();
        shared
            .with_database(|db| shared.commit_blocking(db, &writes))
            .map(drop)
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

    /// Found by `csi-bench --agent-claims` (3 failed claims in 60,000): a writer that had just
    /// handed the queue back (a write queued after that started a new writer) failed the
    /// writes queued for the new one, "its writer stopped before this write", as it ended.
    #[tokio::test]
    async fn a_writer_that_handed_the_queue_back_leaves_the_next_writer_s_writes_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = RedbStore::open(dir.path().join("claims.redb")).expect("opens");
        // A write queued for a new writer, as a caller queues it once the old one let go.
        let (answer, mut answered) = tokio::sync::oneshot::channel();
        {
            let mut queue = lock(&store.inner.queue);
            queue.writing = true;
            queue.jobs.push(Job {
                write: Write::Put {
                    table: Arc::from("t"),
                    key: "k".to_owned(),
                    value: None,
                },
                answer,
            });
        }
        // The old writer ends after handing the queue back: the write stays for the new one.
        drop(Writer {
            shared: Arc::clone(&store.inner),
            done: true,
        });
        assert!(
            answered.try_recv().is_err(),
            "the queued write was answered"
        );
        assert_eq!(store.writes_waiting(), 1);
        assert!(lock(&store.inner.queue).writing);
        // A writer that ends without handing it back (its task dropped before it ran) fails
        // what is queued rather than leave it waiting.
        drop(Writer {
            shared: Arc::clone(&store.inner),
            done: false,
        });
        let failed = answered.try_recv().expect("answered").expect_err("failed");
        assert!(failed.is_unavailable(), "{failed}");
        assert_eq!(store.writes_waiting(), 0);
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
