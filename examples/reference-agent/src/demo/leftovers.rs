//! What the demo has set up so far, so a failure can say what it left and how to remove it.

use std::path::PathBuf;

use csi_structs::{ExternalVolumeId, PluginNodeId, SnapshotId};

/// Whether something the demo asked a plugin for is known to have happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The plugin answered that it did it.
    Done,
    /// It may have happened: the call is under way, or ended without a usable answer (a
    /// deadline, a lost connection, an answer that could not be used) and its undo failed.
    Maybe,
}

/// One thing the demo asked a plugin for: what, and whether it is known to have happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Made<T> {
    /// What was asked for.
    pub what: T,
    /// Whether it happened.
    pub outcome: Outcome,
}

impl<T> Made<T> {
    /// Recorded before the call: it may happen.
    pub fn maybe(what: T) -> Self {
        Self {
            what,
            outcome: Outcome::Maybe,
        }
    }

    /// Why it is listed: `{done}`, or that it may be so because `call`'s outcome was
    /// uncertain.
    fn describe(&self, done: &str, call: &str) -> String {
        match self.outcome {
            Outcome::Done => done.to_owned(),
            Outcome::Maybe => format!("may be {done} ({call}'s outcome is uncertain)"),
        }
    }
}

/// Everything the demo made, or may have made, that still exists: each call that changes
/// the plugin's state is recorded here before it is sent, updated when it answers, and
/// undone or listed when it fails. The "left behind" list is this record.
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
    /// Published, or maybe published, by the controller to this plugin node.
    pub controller_published: Option<Made<(ExternalVolumeId, PluginNodeId)>>,
    /// Staged, or maybe staged, at this path.
    pub staged: Option<Made<(ExternalVolumeId, PathBuf)>>,
    /// Published, or maybe published, at this target path.
    pub published: Option<Made<(ExternalVolumeId, PathBuf)>>,
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
        if let Some(made) = &self.published {
            let (volume, target) = &made.what;
            let target = target.display();
            lines.push(format!(
                "{}: call NodeUnpublishVolume volume_id={volume} target_path={target}",
                made.describe(&format!("published at {target}"), "NodePublishVolume")
            ));
        }
        if let Some(made) = &self.staged {
            let (volume, staging) = &made.what;
            let staging = staging.display();
            lines.push(format!(
                "{}: call NodeUnstageVolume volume_id={volume} staging_target_path={staging}",
                made.describe(&format!("staged at {staging}"), "NodeStageVolume")
            ));
        }
        if let Some(made) = &self.controller_published {
            let (volume, node) = &made.what;
            lines.push(format!(
                "{}: call ControllerUnpublishVolume volume_id={volume} node_id={node}",
                made.describe(
                    &format!("published to node {node} by the controller"),
                    "ControllerPublishVolume"
                )
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
            controller_published: Some(Made {
                what: (vol.clone(), PluginNodeId::new("n-1").unwrap()),
                outcome: Outcome::Done,
            }),
            staged: Some(Made::maybe((vol.clone(), dir.clone()))),
            dirs: vec![dir.clone(), gone],
            ..Leftovers::default()
        };
        assert!(!left.is_empty());
        let lines = left.report();
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert_eq!(
            lines[0],
            format!(
                "may be staged at {d} (NodeStageVolume's outcome is uncertain): call \
                 NodeUnstageVolume volume_id=v-1 staging_target_path={d}",
                d = dir.display()
            )
        );
        assert_eq!(
            lines[1],
            "published to node n-1 by the controller: call ControllerUnpublishVolume \
             volume_id=v-1 node_id=n-1"
        );
        assert!(lines[2].contains("DeleteVolume volume_id=v-1"));
        assert_eq!(
            lines[3],
            format!("directory {d}: rmdir {d}", d = dir.display()),
            "each directory by its path, with the command that removes it"
        );
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
