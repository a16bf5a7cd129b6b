//! A disk that stops answering, for testing code that writes files.
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
