//! What the demo has set up so far, so a failure can say what it left and how to remove it.

use std::path::PathBuf;

use csi_structs::{ExternalVolumeId, PluginNodeId, SnapshotId};

/// Everything the demo made that still exists, updated as each step ends.
///
/// Each field is an independent fact about the outside world (a volume can be created and not
/// published, staged and not published, ...), so this is a ledger, not a state.
#[derive(Debug, Default, Clone)]
pub struct Leftovers {
    /// A volume the demo created (not one given with `--volume-id`).
    pub created: Option<ExternalVolumeId>,
    /// The name of a `CreateVolume` whose outcome is uncertain and not undone: a volume of
    /// that name may exist, its id unknown.
    pub maybe_created: Option<String>,
    /// Published by the controller to this plugin node.
    pub controller_published: Option<(ExternalVolumeId, PluginNodeId)>,
    /// Staged at this path.
    pub staged: Option<(ExternalVolumeId, PathBuf)>,
    /// Published at this target path.
    pub published: Option<(ExternalVolumeId, PathBuf)>,
    /// The file the workload wrote.
    pub file: Option<PathBuf>,
    /// A claim that is not freed yet, with its state.
    pub claim: Option<String>,
    /// A snapshot the demo cut and has not deleted.
    pub snapshot: Option<SnapshotId>,
    /// The name of a `CreateSnapshot` whose outcome is uncertain: a snapshot of that name may
    /// exist, its id unknown.
    pub maybe_snapshot: Option<String>,
    /// Directories the demo created, deepest last (only those that still exist count).
    pub dirs: Vec<PathBuf>,
}

impl Leftovers {
    /// The directories that still exist, deepest first.
    fn remaining_dirs(&self) -> Vec<&PathBuf> {
        self.dirs.iter().rev().filter(|d| d.exists()).collect()
    }

    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.created.is_none()
            && self.maybe_created.is_none()
            && self.controller_published.is_none()
            && self.staged.is_none()
            && self.published.is_none()
            && self.file.as_ref().is_none_or(|f| !f.exists())
            && self.claim.is_none()
            && self.snapshot.is_none()
            && self.maybe_snapshot.is_none()
            && self.remaining_dirs().is_empty()
    }

    /// What is left and how to remove it, one line each, in the order to do it.
    pub fn report(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(state) = &self.claim {
            lines.push(format!(
                "claim of the demo workload ({state}), in this process's in-memory claim store: gone with the process"
            ));
        }
        if let Some(file) = self.file.as_ref().filter(|f| f.exists()) {
            lines.push(format!("file {}: rm {}", file.display(), file.display()));
        }
        if let Some((volume, target)) = &self.published {
            lines.push(format!(
                "published at {}: call NodeUnpublishVolume volume_id={volume} target_path={}",
                target.display(),
                target.display()
            ));
        }
        if let Some((volume, staging)) = &self.staged {
            lines.push(format!(
                "staged at {}: call NodeUnstageVolume volume_id={volume} staging_target_path={}",
                staging.display(),
                staging.display()
            ));
        }
        if let Some((volume, node)) = &self.controller_published {
            lines.push(format!(
                "published to node {node} by the controller: call ControllerUnpublishVolume volume_id={volume} node_id={node}"
            ));
        }
        if let Some(snapshot) = &self.snapshot {
            lines.push(format!(
                "snapshot {snapshot} exists: call DeleteSnapshot snapshot_id={snapshot}"
            ));
        }
        if let Some(name) = &self.maybe_snapshot {
            lines.push(format!(
                "a snapshot named {name} may exist (CreateSnapshot's outcome was uncertain): call \
                 CreateSnapshot name={name} of the same volume, then DeleteSnapshot the snapshot_id \
                 it returns"
            ));
        }
        if let Some(volume) = &self.created {
            lines.push(format!(
                "volume {volume} exists: call DeleteVolume volume_id={volume}"
            ));
        }
        if let Some(name) = &self.maybe_created {
            lines.push(format!(
                "a volume named {name} may exist (CreateVolume's outcome was uncertain): call CreateVolume name={name} with the same capability, then DeleteVolume the volume_id it returns"
            ));
        }
        for dir in self.remaining_dirs() {
            lines.push(format!(
                "directory {}: rmdir {}",
                dir.display(),
                dir.display()
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_each_leftover_with_its_removal_in_order() {
        let vol = ExternalVolumeId::new("v-1").unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("staging");
        std::fs::create_dir(&dir).unwrap();
        let gone = tmp.path().join("gone");
        let left = Leftovers {
            created: Some(vol.clone()),
            controller_published: Some((vol.clone(), PluginNodeId::new("n-1").unwrap())),
            staged: Some((vol.clone(), dir.clone())),
            dirs: vec![dir.clone(), gone],
            ..Leftovers::default()
        };
        assert!(!left.is_empty());
        let lines = left.report();
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(lines[0].contains("NodeUnstageVolume volume_id=v-1"));
        assert!(lines[1].contains("ControllerUnpublishVolume volume_id=v-1 node_id=n-1"));
        assert!(lines[2].contains("DeleteVolume volume_id=v-1"));
        assert!(lines[3].starts_with("directory "));
        assert!(Leftovers::default().is_empty());

        // An uncertain creation is named by the only thing known: its name.
        let maybe = Leftovers {
            maybe_created: Some("pvc-7".into()),
            ..Leftovers::default()
        };
        assert!(!maybe.is_empty());
        assert_eq!(
            maybe.report(),
            [
                "a volume named pvc-7 may exist (CreateVolume's outcome was uncertain): call \
              CreateVolume name=pvc-7 with the same capability, then DeleteVolume the volume_id \
              it returns"
            ]
        );
    }

    #[test]
    fn snapshots_are_deleted_before_their_volume() {
        let left = Leftovers {
            created: Some(ExternalVolumeId::new("v-1").unwrap()),
            snapshot: Some(SnapshotId::new("snap-1").unwrap()),
            maybe_snapshot: Some("nightly".into()),
            ..Leftovers::default()
        };
        assert!(!left.is_empty());
        let lines = left.report();
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert!(lines[0].contains("DeleteSnapshot snapshot_id=snap-1"));
        assert!(lines[1].contains("CreateSnapshot name=nightly"));
        assert!(lines[2].contains("DeleteVolume volume_id=v-1"));
    }
}
