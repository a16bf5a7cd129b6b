//! The steps of the demo lifecycle, in order.

use std::fmt;

/// One step of a volume's life as the demo walks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Ask the plugin what it is and can do.
    Fingerprint,
    /// `CreateVolume` (or use the volume given with `--volume-id`).
    CreateVolume,
    /// `ValidateVolumeCapabilities`.
    ValidateCapabilities,
    /// Claim the volume for writing in the claim store.
    Claim,
    /// `ControllerPublishVolume`.
    ControllerPublish,
    /// `NodeStageVolume`.
    NodeStage,
    /// `NodePublishVolume`.
    NodePublish,
    /// `ControllerExpandVolume`, then `NodeExpandVolume` when asked (or alone for a plugin
    /// that expands on the node only), while the volume is published.
    Expand,
    /// Write a file through the published path and read it back.
    WriteFile,
    /// The workload removes its file and stops using the volume.
    StopWorkload,
    /// `CreateSnapshot` of the volume, the workload stopped.
    Snapshot,
    /// `NodeUnpublishVolume`, run by the release pipeline.
    NodeUnpublish,
    /// `NodeUnstageVolume`, run by the release pipeline.
    NodeUnstage,
    /// `ControllerUnpublishVolume`, run by the release pipeline.
    ControllerUnpublish,
    /// The claim is freed in the claim store.
    Free,
    /// `DeleteSnapshot` of the snapshot cut before.
    DeleteSnapshot,
    /// `DeleteVolume`.
    DeleteVolume,
}

impl Step {
    /// Every step, in the order the demo walks them.
    pub const ALL: [Step; 17] = [
        Step::Fingerprint,
        Step::CreateVolume,
        Step::ValidateCapabilities,
        Step::Claim,
        Step::ControllerPublish,
        Step::NodeStage,
        Step::NodePublish,
        Step::Expand,
        Step::WriteFile,
        Step::StopWorkload,
        Step::Snapshot,
        Step::NodeUnpublish,
        Step::NodeUnstage,
        Step::ControllerUnpublish,
        Step::Free,
        Step::DeleteSnapshot,
        Step::DeleteVolume,
    ];

    /// The step's name as printed, e.g. `node stage`.
    pub const fn name(self) -> &'static str {
        match self {
            Step::Fingerprint => "fingerprint",
            Step::CreateVolume => "create volume",
            Step::ValidateCapabilities => "validate capabilities",
            Step::Claim => "claim for writing",
            Step::ControllerPublish => "controller publish",
            Step::NodeStage => "node stage",
            Step::NodePublish => "node publish",
            Step::Expand => "expand volume",
            Step::WriteFile => "write a file",
            Step::StopWorkload => "stop the workload",
            Step::Snapshot => "snapshot",
            Step::NodeUnpublish => "release: node unpublish",
            Step::NodeUnstage => "release: node unstage",
            Step::ControllerUnpublish => "release: controller unpublish",
            Step::Free => "release: free the claim",
            Step::DeleteSnapshot => "delete snapshot",
            Step::DeleteVolume => "delete volume",
        }
    }

    /// What the step calls: a CSI RPC, or the layer doing the work in parentheses.
    pub const fn call(self) -> &'static str {
        match self {
            Step::Fingerprint => "GetPluginInfo etc.",
            Step::CreateVolume => "CreateVolume",
            Step::ValidateCapabilities => "ValidateVolumeCapabilities",
            Step::Claim => "(csi-claims)",
            Step::ControllerPublish => "ControllerPublishVolume",
            Step::NodeStage => "NodeStageVolume",
            Step::NodePublish => "NodePublishVolume",
            Step::Expand => "ControllerExpandVolume etc.",
            Step::WriteFile | Step::StopWorkload => "(filesystem)",
            Step::NodeUnpublish => "NodeUnpublishVolume",
            Step::NodeUnstage => "NodeUnstageVolume",
            Step::ControllerUnpublish => "ControllerUnpublishVolume",
            Step::Free => "(csi-claims)",
            Step::Snapshot => "CreateSnapshot",
            Step::DeleteSnapshot => "DeleteSnapshot",
            Step::DeleteVolume => "DeleteVolume",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
