//! Where node-side paths live under a node's data directory, and how the plugin sees them.
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
//!
//! # A plugin that sees the data directory elsewhere
//!
//! A node plugin in a container usually has the data directory mounted at another path (Nomad's
//! `stage_publish_base_dir`): the host's `/var/lib/agent/csi` may be the plugin's `/csi`.
//! [`Layout::with_plugin_root`] says where; then every path a call carries is the plugin's
//! ([`Layout::for_plugin`]), while whatever the node does itself (create a directory, check
//! that a target is gone, remove the empty directories) uses the host path. The usage
//! records keep host paths.
//!
//! ```
//! use std::path::Path;
//! use csi_node::layout::{Layout, PublishUsage};
//! use csi_structs::{AccessMode, MountOptions, VolumeCapability, VolumeId};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layout = Layout::new("/var/lib/agent/csi").with_plugin_root("/csi")?;
//! let staging = layout.staging_path(&VolumeId::new("db")?)?;
//! assert_eq!(staging, Path::new("/var/lib/agent/csi/staging/db")); // the host's
//! assert_eq!(layout.for_plugin(&staging)?, "/csi/staging/db"); // what the plugin is sent
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};

use csi_structs::{AccessMode, AccessTypeKind, VolumeCapability, VolumeId, WorkloadId};

/// An id that cannot be used as one path segment, or a path that cannot be given to the
/// plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value:?} {reason}")]
pub struct LayoutError {
    /// What was refused (`volume_id`, `workload_id`, `plugin_root`, `path`).
    pub field: &'static str,
    /// The value as given.
    pub value: String,
    /// Why it was refused, e.g. `cannot be a path segment: it contains '/'`.
    pub reason: &'static str,
}

/// How a volume is used by one publication: the `<usage>` segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishUsage {
    /// Read-only publication.
    pub read_only: bool,
    /// Mount or block.
    pub attachment: AccessTypeKind,
    /// The access mode.
    pub access_mode: AccessMode,
}

impl PublishUsage {
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
    /// Where the plugin sees `root`, when not at the same path.
    plugin_root: Option<PathBuf>,
}

impl Layout {
    /// A layout rooted at `root` (the node's data directory for CSI paths), which the plugin
    /// sees at the same path.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            plugin_root: None,
        }
    }

    /// The same layout, with the plugin seeing the data directory at `plugin_root` (for
    /// example a plugin in a container with the directory mounted there).
    ///
    /// # Errors
    ///
    /// [`LayoutError`] naming `plugin_root` when it is not an absolute path in UTF-8 (CSI
    /// carries paths as strings).
    pub fn with_plugin_root(
        mut self,
        plugin_root: impl Into<PathBuf>,
    ) -> Result<Self, LayoutError> {
        let plugin_root = plugin_root.into();
        let refuse = |reason| LayoutError {
            field: "plugin_root",
            value: plugin_root.display().to_string(),
            reason,
        };
        if plugin_root.to_str().is_none() {
            return Err(refuse("cannot be the plugin's root: it is not UTF-8"));
        }
        if !plugin_root.is_absolute() {
            return Err(refuse(
                "cannot be the plugin's root: it is not an absolute path",
            ));
        }
        self.plugin_root = Some(plugin_root);
        Ok(self)
    }

    /// The data directory, as the host sees it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The data directory, as the plugin sees it.
    pub fn plugin_root(&self) -> &Path {
        self.plugin_root.as_deref().unwrap_or(&self.root)
    }

    /// The text a CSI call carries for the host path `host`: the same place under the
    /// plugin's root.
    ///
    /// # Errors
    ///
    /// [`LayoutError`] naming the `path` when it is not under the data directory (with a
    /// plugin root) or not UTF-8.
    pub fn for_plugin(&self, host: &Path) -> Result<String, LayoutError> {
        let refuse = |reason| LayoutError {
            field: "path",
            value: host.display().to_string(),
            reason,
        };
        let seen = match &self.plugin_root {
            None => host.to_path_buf(),
            Some(plugin_root) => match host.strip_prefix(&self.root) {
                Ok(rest) if rest.as_os_str().is_empty() => plugin_root.clone(),
                Ok(rest) => plugin_root.join(rest),
                Err(_) => {
                    return Err(refuse(
                        "cannot be given to the plugin: it is not under the data directory",
                    ));
                }
            },
        };
        seen.into_os_string()
            .into_string()
            .map_err(|_| refuse("cannot be given to the plugin: it is not UTF-8"))
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
        usage: &PublishUsage,
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
        Some("cannot be a path segment: it is empty")
    } else if value == "." || value == ".." {
        Some("cannot be a path segment: it names a directory itself")
    } else if value.contains('/') {
        Some("cannot be a path segment: it contains '/'")
    } else if value.contains('\0') {
        Some("cannot be a path segment: it contains a NUL byte")
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

    fn usage() -> PublishUsage {
        PublishUsage {
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
        let ro = PublishUsage {
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
    fn a_plugin_root_maps_calls_and_leaves_host_paths_alone() {
        let same = Layout::new("/data");
        let vol = VolumeId::new("db").unwrap();
        let staging = same.staging_path(&vol).unwrap();
        assert_eq!(same.for_plugin(&staging).unwrap(), "/data/staging/db");
        assert_eq!(same.plugin_root(), Path::new("/data"));

        let mapped = Layout::new("/data").with_plugin_root("/csi").unwrap();
        assert_eq!(
            mapped.staging_path(&vol).unwrap(),
            staging,
            "host paths do not change"
        );
        assert_eq!(mapped.for_plugin(&staging).unwrap(), "/csi/staging/db");
        let target = mapped
            .target_path(&vol, &WorkloadId::new("web").unwrap(), &usage())
            .unwrap();
        assert_eq!(
            mapped.for_plugin(&target).unwrap(),
            "/csi/per-workload/web/db/rw-mount-single-node-writer"
        );
        assert_eq!(mapped.for_plugin(Path::new("/data")).unwrap(), "/csi");
        let outside = mapped.for_plugin(Path::new("/elsewhere/x")).unwrap_err();
        assert_eq!(outside.field, "path");
        assert!(
            outside.to_string().contains("not under the data directory"),
            "{outside}"
        );
        // Not a path the plugin can be given: relative.
        let err = Layout::new("/data").with_plugin_root("csi").unwrap_err();
        assert_eq!(err.field, "plugin_root");
    }

    #[test]
    fn usage_segments_keep_modes_apart() {
        use csi_structs::MountOptions;
        let rw = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
        let ro = VolumeCapability::block(AccessMode::MultiNodeReaderOnly);
        assert_eq!(
            PublishUsage::of(&rw, false).segment(),
            "rw-mount-single-node-writer"
        );
        assert_eq!(
            PublishUsage::of(&ro, true).segment(),
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
