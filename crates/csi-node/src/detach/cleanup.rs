//! Removing the directories the orchestrator created, once the plugin is done with them.

use std::io;
use std::path::Path;

/// Removes `path` if it is an empty directory, then each parent up to (not including)
/// `stop_at`, stopping at the first one that is not empty. A directory already gone is fine.
///
/// # Errors
///
/// The I/O error of a removal that failed for another reason than "gone" or "not empty"
/// (for example a target that is still a mount point).
pub fn remove_empty_dirs(path: &Path, stop_at: &Path) -> io::Result<()> {
    let mut current = Some(path);
    while let Some(dir) = current {
        if dir == stop_at || !dir.starts_with(stop_at) {
            break;
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => break,
            Err(e) => return Err(e),
        }
        current = dir.parent();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_empty_parents_up_to_the_root_and_keeps_busy_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("per-workload");
        let a = root.join("w1/vol/usage");
        let b = root.join("w1/other");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        remove_empty_dirs(&a, &root).unwrap();
        assert!(!root.join("w1/vol").exists());
        assert!(
            b.exists(),
            "a sibling in use is kept, and so is their parent"
        );
        remove_empty_dirs(&b, &root).unwrap();
        assert!(!root.join("w1").exists());
        assert!(root.exists(), "the root itself is kept");
        // Gone already: fine.
        remove_empty_dirs(&a, &root).unwrap();
    }

    #[test]
    fn a_directory_with_content_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let dir = root.join("v/u");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("data"), b"x").unwrap();
        remove_empty_dirs(&dir, &root).unwrap();
        assert!(dir.join("data").exists());
    }
}
