//! How the demo fails.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use csi_claims::DetachError;
use csi_claims::driver::DriverError;

use super::plan::PlanError;
use super::step::Step;
use csi_node::layout::LayoutError;

/// Why one step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The plugin call failed (the error names the RPC, volume, node and class).
    #[error(transparent)]
    Rpc(#[from] csi_client::Error),
    /// `CreateVolume`'s outcome was uncertain, and the demo undid it: `CreateVolume` again
    /// with the same name found the volume (or made it), and `DeleteVolume` removed it.
    #[error("{error}; undone: CreateVolume again by name gave volume {deleted}, now deleted")]
    CreateUndone {
        /// The uncertain failure.
        #[source]
        error: csi_client::Error,
        /// The volume the undo deleted.
        deleted: csi_structs::ExternalVolumeId,
    },
    /// `CreateVolume`'s outcome was uncertain and the undo failed too: a volume named `name`
    /// may be left behind.
    #[error("{error}; the undo failed, a volume named {name} may be left behind: {undo}")]
    CreateNotUndone {
        /// The uncertain failure.
        #[source]
        error: csi_client::Error,
        /// The name the volume was created with.
        name: String,
        /// Why the undo failed.
        undo: csi_client::Error,
    },
    /// The step's outcome was uncertain (it may have happened), and the demo undid it with
    /// the counterpart call.
    #[error("{error}; undone: {undo} succeeded")]
    Undone {
        /// The uncertain failure.
        #[source]
        error: csi_client::Error,
        /// The call that undid it, e.g. `NodeUnstageVolume`.
        undo: &'static str,
    },
    /// The step's outcome was uncertain and undoing it failed too: it may have happened, and
    /// the "left behind" list names it.
    #[error(
        "{error}; undoing it with {undo} failed too, so it is listed as left behind: {undo_error}"
    )]
    NotUndone {
        /// The uncertain failure.
        #[source]
        error: csi_client::Error,
        /// The counterpart call that failed.
        undo: &'static str,
        /// Why it failed.
        undo_error: csi_client::Error,
    },
    /// The plugin did not confirm the capabilities asked for; the verdict names each field
    /// that differs.
    #[error("the plugin did not confirm the capabilities: {0}")]
    NotConfirmed(csi_structs::Confirmation),
    /// The plugin's answer is unusable for the next steps.
    #[error("the plugin's answer is unusable: {0}")]
    BadAnswer(#[source] csi_structs::ValidationErrors),
    /// The volume is not reachable from this node (its accessible topology excludes the
    /// node's): refused before the claim, as `serve` refuses it.
    #[error("volume {volume} is {refused} (plugin node {node})")]
    NotAccessible {
        /// The plugin's volume id.
        volume: csi_structs::ExternalVolumeId,
        /// The plugin's id of this node.
        node: csi_structs::PluginNodeId,
        /// Both topologies.
        refused: csi_structs::topology::NotAccessible,
    },
    /// The claim store refused or lost the claim, or the claims driver stopped.
    #[error(transparent)]
    Claim(#[from] DriverError),
    /// A release call failed in a way the release pipeline will not fix by itself soon
    /// (fatal, needs another instance, or failed repeatedly).
    #[error("{error} (attempt {attempts})")]
    Detach {
        /// The last failure.
        #[source]
        error: DetachError,
        /// How many times the release calls failed so far.
        attempts: u32,
    },
    /// The release did not finish within the hang guard.
    #[error("the release did not finish within {0:?}")]
    ReleaseTimedOut(Duration),
    /// A path could not be derived.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A path is not valid UTF-8, which CSI requires.
    #[error("path {} is not valid UTF-8", .0.display())]
    PathNotUtf8(PathBuf),
    /// A filesystem operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done (`creating directory`, `writing`, ...).
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file read back differs from what was written.
    #[error("{} read back different content than written", .0.display())]
    ReadBack(PathBuf),
}

/// Why `csi-agent demo` failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] io::Error),
    /// The temporary directory could not be created.
    #[error("cannot create a temporary directory: {0}")]
    TempDir(#[source] io::Error),
    /// The data directory could not be created.
    #[error("cannot create the data directory {}: {source}", path.display())]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Nothing exists at the plugin's socket path.
    #[error("no plugin socket at {}: start the plugin first or fix --plugin-endpoint", .0.display())]
    NoSocket(PathBuf),
    /// The built-in mock plugin could not be configured.
    #[error("cannot configure the built-in mock plugin: {0}")]
    MockConfig(#[from] csi_testkit::ConfigError),
    /// The built-in mock plugin could not start.
    #[error("cannot start the built-in mock plugin: {0}")]
    Mock(#[from] csi_testkit::Error),
    /// The claims driver could not start.
    #[error("cannot start the claims driver: {0}")]
    Claims(#[from] csi_claims::StoreError),
    /// The plugin cannot run the demo as asked.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Writing the output failed.
    #[error("cannot write the output: {0}")]
    Output(#[source] io::Error),
    /// A step failed.
    #[error("step '{step}' ({}) failed: {cause}", step.call())]
    Step {
        /// The step.
        step: Step,
        /// Why.
        #[source]
        cause: StepError,
    },
}

impl crate::ExitStatus for DemoError {
    fn exit_code(&self) -> u8 {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_structs::{AccessMode, Confirmation, Mismatch};

    #[test]
    fn a_capability_mismatch_names_each_field_that_differs() {
        let cause = StepError::NotConfirmed(Confirmation::NotConfirmed {
            mismatches: vec![
                Mismatch::FsType {
                    requested: 0,
                    confirmed: 0,
                    asked: Some("ext4".into()),
                    got: Some("xfs".into()),
                },
                Mismatch::AccessMode {
                    requested: 0,
                    confirmed: 0,
                    asked: AccessMode::SingleNodeWriter,
                    got: csi_structs::confirm::ConfirmedAccessMode::NotValidated,
                },
            ],
            message: Some("only xfs".into()),
        });
        let text = cause.to_string();
        for part in [
            "volume_capabilities[0].mount.fs_type: asked ext4, confirmed[0] has xfs",
            "volume_capabilities[0].access_mode",
            "the plugin says: only xfs",
        ] {
            assert!(text.contains(part), "{text:?} lacks {part:?}");
        }
    }
}
