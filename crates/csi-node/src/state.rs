//! Small JSON state files under the data directory, written atomically (a temporary file,
//! `fsync`, then `rename`), so a crash leaves either the old or the new content.
//!
//! A file that cannot be written (a full disk, say) is an error for whoever wanted the change,
//! at once. It is logged once when its writes start failing and once when one succeeds again,
//! not once per attempt, and [`failing`] lists the files failing now, for a status page.
//!
//! A write that *hangs* (a stalled disk, an NFS server gone away) is given up after
//! [`WRITE_TIMEOUT`]: each write runs on a thread of its own, and the caller waits for it at
//! most that long ([`StateFileError::TimedOut`]); on a worker of tokio's multi-thread runtime
//! it waits through `block_in_place`, so the worker's other tasks move on to another thread
//! meanwhile. A write given up on may still land later, so its outcome is unknown, as with any
//! store call that timed out. Until that thread ends,
//! every further write of the same file fails at once ([`StateFileError::Stalled`]) rather than
//! queue behind it: a later write finishing first and then being overwritten by the stale
//! one would lose a change. The caller's in-memory state is the truth to write next time; the
//! files are whole snapshots, so the next write that goes through repairs what a late one left.
//! [`writes_under_way`] lists the writes in progress with their age.
//!
//! The plugin manager and the volume manager keep what they last wrote in memory and hold
//! that memory's lock only to copy or replace it, so a reader (a status page, a lookup before
//! a call) never waits on the disk. The plugin manager's changes, and the volume manager's
//! when its records are a JSON file ([`UsageJson`](crate::volumes::UsageJson)), take turns on
//! a lock of their own held across the write; in a database
//! ([`UsageDb`](crate::volumes::UsageDb)) changes of different volumes do not take turns.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A state file that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// Reading, writing or renaming failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the JSON expected.
    #[error("state file {path} is damaged: {detail}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// The parser's explanation.
        detail: String,
    },
    /// The file parses, but one of its records cannot be used.
    #[error("state file {path}: record {key:?} cannot be used: {reason}")]
    Record {
        /// The file.
        path: PathBuf,
        /// The record's key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The write did not finish in time (a stalled disk): the caller stopped waiting, and
    /// whether the new content lands later is unknown.
    #[error("state file {path}: the write did not finish within {}s (stalled disk?); it may still land", after.as_secs_f64())]
    TimedOut {
        /// The file.
        path: PathBuf,
        /// How long the caller waited.
        after: Duration,
    },
    /// An earlier write of the file, given up on, has still not finished: nothing was written.
    #[error("state file {path}: an earlier write has not finished after {}s (stalled disk?); nothing was written", since.as_secs())]
    Stalled {
        /// The file.
        path: PathBuf,
        /// How long ago the unfinished write started.
        since: Duration,
    },
    /// The database the records are kept in failed (csi-claims' redb store: a full disk, a
    /// damaged file, a commit that failed): whether a write in flight landed is unknown.
    #[error("state in {path}: {detail}")]
    Store {
        /// The database's file.
        path: PathBuf,
        /// The store's error, with its causes.
        detail: String,
    },
    /// The file is in a format this version does not read (written by a newer one).
    #[error("state file {path} has format {found}; this version reads formats {supported}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The format found.
        found: u32,
        /// The formats this version reads.
        supported: &'static str,
    },
}

/// The largest state file read (bytes).
pub const MAX_STATE_FILE_BYTES: u64 = 64 << 20;

/// Reads `path`; `None` when it does not exist.
///
/// # Errors
///
/// [`StateFileError`] when it exists but cannot be read or parsed, or is too large.
pub fn load_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StateFileError> {
    let io = |source| StateFileError::Io {
        path: path.to_owned(),
        source,
    };
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
        Ok(m) if m.len() > MAX_STATE_FILE_BYTES => {
            return Err(StateFileError::Damaged {
                path: path.to_owned(),
                detail: format!("{} bytes, more than {MAX_STATE_FILE_BYTES}", m.len()),
            });
        }
        Ok(_) => {}
    }
    let bytes = std::fs::read(path).map_err(io)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StateFileError::Damaged {
            path: path.to_owned(),
            detail: e.to_string(),
        })
}

/// How long a caller waits for one state-file write before it is told the write failed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What this process knows of its state files' writes. Process-wide, as the files are.
struct Files {
    /// The files whose last write failed, with the error: one entry per file, from its first
    /// failed write to its next good one.
    failing: BTreeMap<PathBuf, String>,
    /// The files with a write under way, and when it started.
    writing: BTreeMap<PathBuf, Instant>,
}

static FILES: Mutex<Files> = Mutex::new(Files {
    failing: BTreeMap::new(),
    writing: BTreeMap::new(),
});

fn files() -> std::sync::MutexGuard<'static, Files> {
    FILES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The state files this process failed to write at their last attempt, with why, by path.
/// Empty while every write succeeds.
pub fn failing() -> Vec<(PathBuf, String)> {
    files()
        .failing
        .iter()
        .map(|(path, error)| (path.clone(), error.clone()))
        .collect()
}

/// The state files with a write under way in this process, with how long it has been going,
/// by path. A write that outlasts [`WRITE_TIMEOUT`] stays here until the disk answers: a health
/// check can tell a slow disk from a stuck one before any caller gives up.
pub fn writes_under_way() -> Vec<(PathBuf, Duration)> {
    files()
        .writing
        .iter()
        .map(|(path, started)| (path.clone(), started.elapsed()))
        .collect()
}

impl Files {
    /// Remembers how the write of `path` ended; logs when the file starts failing and when
    /// it is written again.
    fn note(&mut self, path: &Path, result: &Result<(), StateFileError>) {
        match result {
            Err(e) => {
                if self
                    .failing
                    .insert(path.to_owned(), e.to_string())
                    .is_none()
                {
                    tracing::error!(file = %path.display(), error = %e,
                        "state file cannot be written; what changes it fails at once until it can");
                }
            }
            Ok(()) => {
                if self.failing.remove(path).is_some() {
                    tracing::info!(file = %path.display(), "state file written again");
                }
            }
        }
    }
}

/// A write under way: ends it in [`Files::writing`] however its thread ends.
struct Writing {
    path: PathBuf,
    started: Instant,
}

impl Writing {
    /// Ends the write with `result` (under one lock, so a caller that gave up on it sees
    /// either the write under way or its outcome, never neither).
    fn end(self, result: &Result<(), StateFileError>) {
        let mut files = files();
        files.note(&self.path, result);
        files.writing.remove(&self.path);
    }
}

impl Drop for Writing {
    /// Frees the file for the next write if [`Writing::end`] did not (the thread panicked, or
    /// could not be started). A later write's mark is left alone.
    fn drop(&mut self) {
        let mut files = files();
        if files.writing.get(&self.path) == Some(&self.started) {
            files.writing.remove(&self.path);
        }
    }
}

/// Writes `value` to `path` atomically, waiting at most [`WRITE_TIMEOUT`] for the disk.
///
/// # Errors
///
/// [`StateFileError::Io`] naming the file; [`StateFileError::TimedOut`] when the write did
/// not finish in time (it may still land); [`StateFileError::Stalled`] when an earlier write
/// of the file has not finished (nothing was written).
pub fn save_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StateFileError> {
    save(path, value, None)
}

/// Writes `value` to `path` atomically, readable and writable by the owner only (mode 0600),
/// for a file that holds secrets. The temporary file has that mode before anything is
/// written to it.
///
/// # Errors
///
/// As [`save_json`].
pub fn save_json_private<T: Serialize>(path: &Path, value: &T) -> Result<(), StateFileError> {
    save(path, value, Some(0o600))
}

fn save<T: Serialize>(path: &Path, value: &T, mode: Option<u32>) -> Result<(), StateFileError> {
    save_within(path, value, mode, WRITE_TIMEOUT)
}

/// Runs `wait` (a blocking wait of up to [`WRITE_TIMEOUT`]) so that it holds up no other
/// task. The writers are called from async code (the agent's handlers, the volume manager):
/// on a worker of tokio's multi-thread runtime the wait goes through `block_in_place`, which
/// hands the worker's queued tasks to another thread first. Without it a stalled disk held a
/// worker for the whole timeout, and a task stuck behind it could not run (most likely a
/// plugin connection's, in one CI run: a health probe timed out and the plugin was taken for
/// unhealthy). A current-thread runtime cannot lend its thread, and a plain thread has
/// nothing to lend, so there the wait runs as it is.
pub(crate) fn wait_off_the_runtime<R>(wait: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

/// [`save`] with the caller waiting at most `timeout` for the write.
fn save_within<T: Serialize>(
    path: &Path,
    value: &T,
    mode: Option<u32>,
    timeout: Duration,
) -> Result<(), StateFileError> {
    let bytes = match serde_json::to_vec_pretty(value) {
        Ok(bytes) => bytes,
        Err(e) => {
            let result = Err(StateFileError::Damaged {
                path: path.to_owned(),
                detail: e.to_string(),
            });
            files().note(path, &result);
            return result;
        }
    };
    let writing = {
        let mut files = files();
        if let Some(started) = files.writing.get(path) {
            let result = Err(StateFileError::Stalled {
                path: path.to_owned(),
                since: started.elapsed(),
            });
            files.note(path, &result);
            return result;
        }
        let started = Instant::now();
        files.writing.insert(path.to_owned(), started);
        Writing {
            path: path.to_owned(),
            started,
        }
    };
    let (done, answer) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("csi-state-write".into())
        .spawn(move || {
            let result = write_bytes(&writing.path, &bytes, mode);
            writing.end(&result);
            // The caller may have stopped waiting.
            let _ = done.send(result);
        });
    if let Err(source) = spawned {
        // No thread for the write (the process is at its limit): the closure, and with it the
        // `Writing` mark, was dropped.
        let result = Err(StateFileError::Io {
            path: path.to_owned(),
            source,
        });
        files().note(path, &result);
        return result;
    }
    match wait_off_the_runtime(|| answer.recv_timeout(timeout)) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            // The write may have ended just now: its own answer beats a guess.
            if let Ok(result) = answer.try_recv() {
                return result;
            }
            let result = Err(StateFileError::TimedOut {
                path: path.to_owned(),
                after: timeout,
            });
            let mut files = files();
            // Unless the write ended meanwhile (and said how), the file is failing now.
            if files.writing.contains_key(path) {
                files.note(path, &result);
            }
            result
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(StateFileError::Io {
            path: path.to_owned(),
            source: std::io::Error::other("the writing thread ended without an answer"),
        }),
    }
}

/// Writes `bytes` to `path`: a temporary file beside it, `fsync`, `rename`.
fn write_bytes(path: &Path, bytes: &[u8], mode: Option<u32>) -> Result<(), StateFileError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let io = |source| StateFileError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let tmp = path.with_extension("json.tmp");
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        if let Some(mode) = mode {
            options.mode(mode);
        }
        let mut f = options.open(&tmp).map_err(io)?;
        if let Some(mode) = mode {
            // A temporary file left by a crash keeps its old mode when opened again.
            f.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(io)?;
        }
        f.write_all(bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

/// `bytes` random bytes from the system's generator (`/dev/urandom`), as lowercase hex: for
/// tokens and identities.
///
/// # Errors
///
/// When `/dev/urandom` cannot be read.
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// A random value kept in the file `path` (owner-only, mode 0600): the value read when the
/// file holds at least 16 characters, otherwise 32 random bytes as hex, written first. For an
/// operator token or a state directory's identity.
///
/// # Errors
///
/// When the file cannot be read or written, or `/dev/urandom` cannot be read.
pub fn random_value_file(path: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read_to_string(path) {
        Ok(t) if t.trim().len() >= 16 => return Ok(t.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let value = random_hex(32)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(value.as_bytes())?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_testkit::disk::StalledFile;

    #[test]
    fn round_trip_missing_and_damaged() {
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join("x.json");
        assert_eq!(load_json::<Vec<u32>>(&p).expect("missing is fine"), None);
        save_json(&p, &vec![1u32, 2]).expect("write");
        assert_eq!(load_json::<Vec<u32>>(&p).expect("read"), Some(vec![1, 2]));
        std::fs::write(&p, b"{nope").expect("write");
        assert!(matches!(
            load_json::<Vec<u32>>(&p),
            Err(StateFileError::Damaged { .. })
        ));
    }

    #[test]
    fn private_files_are_the_owner_s_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join("secret.json");
        // A leftover temporary file readable by everyone does not leak its mode.
        std::fs::write(p.with_extension("json.tmp"), b"old").expect("write");
        std::fs::set_permissions(
            p.with_extension("json.tmp"),
            std::fs::Permissions::from_mode(0o644),
        )
        .expect("chmod");
        save_json_private(&p, &vec![1u32]).expect("write");
        let mode = std::fs::metadata(&p).expect("exists").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load_json::<Vec<u32>>(&p).expect("read"), Some(vec![1]));
    }

    fn failing_here(dir: &Path) -> Vec<(PathBuf, String)> {
        failing()
            .into_iter()
            .filter(|(p, _)| p.starts_with(dir))
            .collect()
    }

    #[test]
    fn a_file_that_cannot_be_written_is_listed_until_it_is_written_again() {
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join("usage.json");
        save_json(&p, &1u32).expect("write");
        assert!(failing_here(dir.path()).is_empty());
        // A directory where the temporary file goes: the write fails, as on a full disk.
        let blocker = p.with_extension("json.tmp");
        std::fs::create_dir(&blocker).expect("dir");
        for _ in 0..2 {
            let err = save_json(&p, &2u32).expect_err("cannot write");
            assert!(err.to_string().contains("usage.json"), "{err}");
        }
        let listed = failing_here(dir.path());
        assert_eq!(listed.len(), 1, "one entry however many failures");
        assert_eq!(listed[0].0, p);
        assert_eq!(
            load_json::<u32>(&p).expect("read"),
            Some(1),
            "old content kept"
        );
        std::fs::remove_dir(&blocker).expect("rm");
        save_json(&p, &3u32).expect("written again");
        assert!(failing_here(dir.path()).is_empty());
    }

    /// Stalls the next write of `p`: a FIFO where its temporary file goes.
    fn stall(p: &Path) -> StalledFile {
        StalledFile::at(&p.with_extension("json.tmp")).expect("test invariant: a FIFO")
    }

    /// The "disk" answers: what the stuck write of `p` wrote, once that write has ended.
    fn unstall(stalled: StalledFile, p: &Path) -> Vec<u8> {
        let taken = stalled.answer().expect("the FIFO reads");
        let deadline = Instant::now() + Duration::from_secs(30);
        while files().writing.contains_key(p) {
            assert!(
                Instant::now() < deadline,
                "hang guard: the stuck write ended"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        taken
    }

    #[test]
    fn a_write_that_hangs_is_given_up_and_refuses_the_next_ones_until_it_ends() {
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join("usage.json");
        save_json(&p, &1u32).expect("write");
        let stalled = stall(&p);

        let err = save_within(&p, &2u32, None, Duration::from_millis(200)).expect_err("hangs");
        assert!(matches!(err, StateFileError::TimedOut { .. }), "{err}");
        assert!(err.to_string().contains("usage.json"), "{err}");
        assert_eq!(failing_here(dir.path()).len(), 1);
        let under_way: Vec<_> = writes_under_way()
            .into_iter()
            .filter(|(path, _)| path == &p)
            .collect();
        assert_eq!(under_way.len(), 1, "the given-up write is still under way");
        assert!(
            under_way[0].1 >= Duration::from_millis(200),
            "{under_way:?}"
        );
        // The stuck write is still under way: the next one is refused at once, not queued.
        let err = save_within(&p, &3u32, None, Duration::from_secs(3600)).expect_err("stalled");
        assert!(matches!(err, StateFileError::Stalled { .. }), "{err}");
        assert!(err.to_string().contains("usage.json"), "{err}");
        assert_eq!(
            load_json::<u32>(&p).expect("read"),
            Some(1),
            "old content kept"
        );

        // The "disk" answers: the stuck write goes on (and fails, a FIFO cannot be synced).
        assert_eq!(
            unstall(stalled, &p),
            b"2",
            "the stuck write carried the value it was given"
        );
        assert!(writes_under_way().iter().all(|(path, _)| path != &p));
        save_json(&p, &4u32).expect("written again");
        assert!(failing_here(dir.path()).is_empty());
        assert_eq!(load_json::<u32>(&p).expect("read"), Some(4));
    }

    #[test]
    fn a_hanging_write_on_a_runtime_worker_lets_the_other_tasks_run() {
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join("book.json");
        let stalled = stall(&p);

        // One worker: without handing its tasks on, the other task could run only after the
        // write is given up.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("test invariant: a runtime");
        let (err, ran_meanwhile) = runtime.block_on({
            let p = p.clone();
            async move {
                tokio::spawn(async move {
                    let other = tokio::spawn(async {});
                    let err = save_within(&p, &1u32, None, Duration::from_secs(2))
                        .expect_err("the write hangs");
                    let ran_meanwhile = other.is_finished();
                    (err, ran_meanwhile)
                })
                .await
                .expect("the writer task")
            }
        });
        assert!(matches!(err, StateFileError::TimedOut { .. }), "{err}");
        assert!(ran_meanwhile, "the other task waited for the stalled write");

        // Let the stuck write end, so no thread outlives the test's files.
        unstall(stalled, &p);
    }

    #[test]
    fn a_random_value_file_is_made_once_owner_only_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("control.token");
        let first = random_value_file(&path).expect("made");
        assert_eq!(first.len(), 64);
        assert!(first.chars().all(|c| c.is_ascii_hexdigit()));
        let mode = std::fs::metadata(&path).expect("file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(random_value_file(&path).expect("read"), first);
        // Too short to be a value of ours: replaced.
        std::fs::write(&path, "short").expect("write");
        let second = random_value_file(&path).expect("made again");
        assert_ne!(second, first);
        assert_eq!(second.len(), 64);
    }
}
