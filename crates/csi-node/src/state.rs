//! Small JSON state files under the data directory, written atomically (a temporary file,
//! `fsync`, then `rename`), so a crash leaves either the old or the new content.
//!
//! A file that cannot be written (a full disk, say) is an error for whoever wanted the change,
//! at once. It is logged once when its writes start failing and once when one succeeds again,
//! not once per attempt, and [`failing`] lists the files failing now, for a status page.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

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

/// The state files whose last write failed, with the error: one entry per file, from its
/// first failed write to its next good one. Process-wide, as the files are.
static FAILING: Mutex<BTreeMap<PathBuf, String>> = Mutex::new(BTreeMap::new());

/// The state files this process failed to write at their last attempt, with why, by path.
/// Empty while every write succeeds.
pub fn failing() -> Vec<(PathBuf, String)> {
    FAILING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(path, error)| (path.clone(), error.clone()))
        .collect()
}

/// Remembers how the write of `path` ended; logs when the file starts failing and when it is
/// written again.
fn note(path: &Path, result: &Result<(), StateFileError>) {
    let mut failing = FAILING.lock().unwrap_or_else(PoisonError::into_inner);
    match result {
        Err(e) => {
            if failing.insert(path.to_owned(), e.to_string()).is_none() {
                tracing::error!(file = %path.display(), error = %e,
                    "state file cannot be written; what changes it fails at once until it can");
            }
        }
        Ok(()) => {
            if failing.remove(path).is_some() {
                tracing::info!(file = %path.display(), "state file written again");
            }
        }
    }
}

/// Writes `value` to `path` atomically.
///
/// # Errors
///
/// [`StateFileError::Io`] naming the file.
pub fn save_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StateFileError> {
    save(path, value, None)
}

/// Writes `value` to `path` atomically, readable and writable by the owner only (mode 0600),
/// for a file that holds secrets. The temporary file has that mode before anything is
/// written to it.
///
/// # Errors
///
/// [`StateFileError::Io`].
pub fn save_json_private<T: Serialize>(path: &Path, value: &T) -> Result<(), StateFileError> {
    save(path, value, Some(0o600))
}

fn save<T: Serialize>(path: &Path, value: &T, mode: Option<u32>) -> Result<(), StateFileError> {
    let result = write_json(path, value, mode);
    note(path, &result);
    result
}

fn write_json<T: Serialize>(
    path: &Path,
    value: &T,
    mode: Option<u32>,
) -> Result<(), StateFileError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let io = |source| StateFileError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| StateFileError::Damaged {
        path: path.to_owned(),
        detail: e.to_string(),
    })?;
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
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
