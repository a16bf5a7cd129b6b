//! A disk that stops answering, for testing code that writes files.
//!
//! [`FaultyDisk`] is a redb storage backend whose writes fail (`ENOSPC`), panic, stall or
//! slow down while a test says so ([`DiskFaults`]), and counts the calls and syncs that reach
//! it: for csi-claims' redb store and whatever keeps records in it.
//!
//! [`StalledFile`] puts a FIFO where a writer will open a file. Opening a FIFO for writing
//! blocks until somebody opens it for reading, just as a write to a stalled disk blocks until
//! the disk answers, so the writer hangs for as long as the test wants. The test then
//! [answers](StalledFile::answer): it reads what the writer wrote, which lets the write go on
//! (a writer that `fsync`s gets an error, since a FIFO cannot be synced), and removes the FIFO.
//!
//! ```
//! use csi_testkit::disk::StalledFile;
//!
//! # fn main() -> std::io::Result<()> {
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("state.json.tmp");
//! let stalled = StalledFile::at(&path)?;
//! let writer = std::thread::spawn({
//!     let path = path.clone();
//!     move || std::fs::write(path, b"hello") // blocks until the answer
//! });
//! assert_eq!(stalled.answer()?, b"hello");
//! writer.join().expect("the writer").expect("the write");
//! assert!(!path.exists());
//! # Ok(())
//! # }
//! ```

use std::io;
use std::path::{Path, PathBuf};

/// A FIFO in place of a file: whoever opens it for writing waits until [`StalledFile::answer`].
///
/// Dropped without an answer, the FIFO stays where it is (removing it would not free a
/// writer that is waiting on it).
#[derive(Debug)]
#[must_use = "a writer of the file waits until the stall is answered"]
pub struct StalledFile {
    path: PathBuf,
}

impl StalledFile {
    /// Puts a FIFO at `path`, which must not exist yet. Uses the `mkfifo` command.
    ///
    /// # Errors
    ///
    /// When `mkfifo` cannot be run or fails (the path exists, its directory does not), naming
    /// the path.
    pub fn at(path: &Path) -> io::Result<Self> {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .map_err(|e| io::Error::new(e.kind(), format!("mkfifo {}: {e}", path.display())))?;
        if !status.success() {
            return Err(io::Error::other(format!(
                "mkfifo {} failed: {status}",
                path.display()
            )));
        }
        Ok(Self {
            path: path.to_owned(),
        })
    }

    /// Where the FIFO is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The disk answers: waits for a writer to open the FIFO, reads all it writes until it
    /// closes the file, removes the FIFO and returns the bytes. Blocks (call it from
    /// `spawn_blocking` in async code); with no writer, it waits for one.
    ///
    /// # Errors
    ///
    /// When the FIFO cannot be read or removed, naming its path.
    pub fn answer(self) -> io::Result<Vec<u8>> {
        let named =
            |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", self.path.display()));
        let taken = std::fs::read(&self.path).map_err(named)?;
        std::fs::remove_file(&self.path).map_err(named)?;
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_returns_what_the_writer_wrote_and_removes_the_fifo() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f.tmp");
        let stalled = StalledFile::at(&path).expect("a FIFO");
        assert_eq!(stalled.path(), path);
        let writer = std::thread::spawn({
            let path = path.clone();
            move || {
                use std::io::Write as _;
                let mut f = std::fs::File::create(path)?;
                f.write_all(b"abc")?;
                f.write_all(b"def")
            }
        });
        assert_eq!(stalled.answer().expect("the answer"), b"abcdef");
        writer.join().expect("the writer").expect("the write");
        assert!(!path.exists(), "the FIFO is removed");
    }

    #[test]
    fn a_path_that_exists_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("taken");
        std::fs::write(&path, b"x").expect("a file");
        let err = StalledFile::at(&path).expect_err("the path exists");
        assert!(err.to_string().contains("taken"), "{err}");
        assert_eq!(
            std::fs::read(&path).expect("read"),
            b"x",
            "the file is kept"
        );
    }
}

/// The switches and counters of a [`FaultyDisk`], shared with the test. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct DiskFaults {
    /// While set, writes, syncs and growth fail with `ENOSPC`, as on a full disk.
    pub full: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// While set, those calls panic instead, as redb does on some damaged files.
    pub panics: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// While set, a sync waits until it is cleared, as on a stalled disk.
    pub stalls: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Milliseconds each sync takes on top of the file's own (a slow disk).
    pub sync_delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Every call that reached the backend.
    pub calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Every sync that reached the backend (a commit makes one or two).
    pub syncs: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl DiskFaults {
    /// A function that opens (or creates) a redb database at `path` on a [`FaultyDisk`]
    /// driven by these switches: what csi-claims' `RedbStore::with_opener` takes.
    pub fn opener(
        &self,
        path: &Path,
    ) -> impl Fn() -> Result<redb::Database, redb::DatabaseError> + Send + Sync + 'static + use<>
    {
        let (faults, path) = (self.clone(), path.to_path_buf());
        move || {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| redb::DatabaseError::Storage(redb::StorageError::Io(e)))?;
            let backend = FaultyDisk {
                file: redb::backends::FileBackend::new(file)?,
                faults: faults.clone(),
            };
            redb::Builder::new().create_with_backend(backend)
        }
    }
}

/// A redb storage backend on a file whose writes fail, panic, stall or slow down while the
/// test says so ([`DiskFaults`]).
#[derive(Debug)]
pub struct FaultyDisk {
    file: redb::backends::FileBackend,
    faults: DiskFaults,
}

impl FaultyDisk {
    fn check(&self) -> io::Result<()> {
        use std::sync::atomic::Ordering;
        self.faults.calls.fetch_add(1, Ordering::SeqCst);
        assert!(
            !self.faults.panics.load(Ordering::SeqCst),
            "a write to the file panics"
        );
        if self.faults.full.load(Ordering::SeqCst) {
            // ENOSPC, as the kernel answers a write to a full file system.
            Err(io::Error::from_raw_os_error(28))
        } else {
            Ok(())
        }
    }
}

impl redb::StorageBackend for FaultyDisk {
    fn len(&self) -> io::Result<u64> {
        self.faults
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.file.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.faults
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.file.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.check()?;
        self.file.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        use std::sync::atomic::Ordering;
        self.check()?;
        self.faults.syncs.fetch_add(1, Ordering::SeqCst);
        while self.faults.stalls.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let delay = self.faults.sync_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_millis(delay));
        }
        self.file.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check()?;
        self.file.write(offset, data)
    }
    fn close(&self) -> io::Result<()> {
        self.file.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.file.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.file.try_lock_shared_range(start, end)
    }
    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.file.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.file.lock_shared_range(start, end)
    }
    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.file.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.file.query_lock_range(start, end)
    }
}
