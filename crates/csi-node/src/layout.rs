//! Where node-side paths live under the agent's data directory.
//!
//! One volume is staged once per node and published once per workload, so:
//!
//! ```text
//! <data-dir>/staging/<volume-id>                              staging_target_path (CO creates it)
//! <data-dir>/per-workload/<workload-id>/<volume-id>/<usage>   target_path (plugin creates it,
//!                                                              CO creates its parent)
//! ```
//!
//! The staging path depends on the volume only: the CSI spec (`NodeStageVolume`) expects one
//! staging path per volume on a node, shared by every publication of it, read or write.
//! `<usage>` is `rw-` or `ro-`, the attachment (`mount` or `block`) and the access mode, for
//! example `rw-mount-single-node-writer`, so two publications with different terms never share
//! a target. Every segment is an id checked here: an id that is empty, `.`, `..` or holds a
//! `/` or a NUL byte would escape its directory and is refused.

use std::path::{Path, PathBuf};

use csi_structs::{AccessMode, AccessTypeKind, VolumeCapability, VolumeId, WorkloadId};

/// An id that cannot be used as one path segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value:?} cannot be a path segment: {reason}")]
pub struct LayoutError {
    /// Which id (`volume_id`, `workload_id`).
    pub field: &'static str,
    /// The id as given.
    pub value: String,
    /// Why it was refused.
    pub reason: &'static str,
}

/// How a volume is used by one publication: the `<usage>` segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Read-only publication.
    pub read_only: bool,
    /// Mount or block.
    pub attachment: AccessTypeKind,
    /// The access mode.
    pub access_mode: AccessMode,
}

impl Usage {
    /// The usage of a publication with `capability`, read-only or not.
    pub fn of(capability: &VolumeCapability, read_only: bool) -> Self {
        Self {
            read_only,
            attachment: capability.access_type.kind(),
            access_mode: capability.access_mode,
        }
    }

    /// The path segment, e.g. `rw-mount-single-node-writer`.
    pub fn segment(&self) -> String {
        let mode = self
            .access_mode
            .wire_name()
            .to_ascii_lowercase()
            .replace('_', "-");
        format!(
            "{}-{}-{}",
            if self.read_only { "ro" } else { "rw" },
            self.attachment,
            mode
        )
    }
}

/// The node-side directory layout under one data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// A layout rooted at `root` (the agent's data directory).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/staging`.
    pub fn staging_root(&self) -> PathBuf {
        self.root.join("staging")
    }

    /// `<root>/per-workload`.
    pub fn workload_root(&self) -> PathBuf {
        self.root.join("per-workload")
    }

    /// The staging directory of `volume` on this node: one per volume, whatever the usage of
    /// its publications.
    ///
    /// # Errors
    ///
    /// [`LayoutError`] when the volume id cannot be a path segment.
    pub fn staging_path(&self, volume: &VolumeId) -> Result<PathBuf, LayoutError> {
        Ok(self
            .staging_root()
            .join(segment("volume_id", volume.as_str())?))
    }

    /// The publish target of `volume` for `workload` with `usage`.
    ///
    /// # Errors
    ///
    /// [`LayoutError`] when an id cannot be a path segment.
    pub fn target_path(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
        usage: &Usage,
    ) -> Result<PathBuf, LayoutError> {
        Ok(self
            .workload_root()
            .join(segment("workload_id", workload.as_str())?)
            .join(segment("volume_id", volume.as_str())?)
            .join(usage.segment()))
    }
}

fn segment<'a>(field: &'static str, value: &'a str) -> Result<&'a str, LayoutError> {
    let reason = if value.is_empty() {
        Some("it is empty")
    } else if value == "." || value == ".." {
        Some("it names a directory itself")
    } else if value.contains('/') {
        Some("it contains '/'")
    } else if value.contains('\0') {
        Some("it contains a NUL byte")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(LayoutError {
            field,
            value: value.to_owned(),
            reason,
        }),
        None => Ok(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage() -> Usage {
        Usage {
            read_only: false,
            attachment: AccessTypeKind::Mount,
            access_mode: AccessMode::SingleNodeWriter,
        }
    }

    #[test]
    fn paths_are_per_volume_and_per_workload() {
        let layout = Layout::new("/data");
        let vol = VolumeId::new("db").unwrap();
        let web = WorkloadId::new("web-1").unwrap();
        assert_eq!(
            layout.staging_path(&vol).unwrap(),
            Path::new("/data/staging/db"),
            "one staging path per volume"
        );
        assert_eq!(
            layout.target_path(&vol, &web, &usage()).unwrap(),
            Path::new("/data/per-workload/web-1/db/rw-mount-single-node-writer")
        );
        let ro = Usage {
            read_only: true,
            attachment: AccessTypeKind::Block,
            access_mode: AccessMode::MultiNodeReaderOnly,
        };
        assert_eq!(ro.segment(), "ro-block-multi-node-reader-only");
        assert_ne!(
            layout.target_path(&vol, &web, &ro).unwrap(),
            layout.target_path(&vol, &web, &usage()).unwrap(),
            "publications with different terms have different targets"
        );
    }

    #[test]
    fn usage_segments_keep_modes_apart() {
        use csi_structs::MountOptions;
        let rw = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
        let ro = VolumeCapability::block(AccessMode::MultiNodeReaderOnly);
        assert_eq!(
            Usage::of(&rw, false).segment(),
            "rw-mount-single-node-writer"
        );
        assert_eq!(
            Usage::of(&ro, true).segment(),
            "ro-block-multi-node-reader-only"
        );
    }

    #[test]
    fn ids_that_escape_their_directory_are_refused() {
        let layout = Layout::new("/data");
        for bad in ["..", ".", "a/b"] {
            // The id types allow these (they only bound the size); the layout must refuse them.
            let vol = VolumeId::new(bad).expect("the id type allows it");
            let err = layout.staging_path(&vol).unwrap_err();
            assert_eq!(err.field, "volume_id");
            assert_eq!(err.value, bad);
        }
        let vol = VolumeId::new("db").unwrap();
        let wl = WorkloadId::new("../x").expect("the id type allows it");
        let err = layout.target_path(&vol, &wl, &usage()).unwrap_err();
        assert_eq!(err.field, "workload_id");
    }
}
