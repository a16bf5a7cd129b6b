//! Operator commands (`plugin`, `volume`, `status`) (placeholder until the ops work lands).

/// Arguments of `csi-agent plugin`.
#[derive(Debug, clap::Args)]
pub struct PluginArgs {}

/// Arguments of `csi-agent volume`.
#[derive(Debug, clap::Args)]
pub struct VolumeArgs {}

/// Arguments of `csi-agent status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {}

/// Error of the operator commands.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The subcommand is not built yet.
    #[error("`{0}` is not built yet")]
    NotBuilt(&'static str),
}

impl crate::ExitStatus for OpsError {
    fn exit_code(&self) -> u8 {
        2
    }
}

/// Runs `csi-agent plugin`.
///
/// # Errors
///
/// Always [`OpsError::NotBuilt`] for now.
pub fn plugin(_args: PluginArgs) -> Result<(), OpsError> {
    Err(OpsError::NotBuilt("plugin"))
}

/// Runs `csi-agent volume`.
///
/// # Errors
///
/// Always [`OpsError::NotBuilt`] for now.
pub fn volume(_args: VolumeArgs) -> Result<(), OpsError> {
    Err(OpsError::NotBuilt("volume"))
}

/// Runs `csi-agent status`.
///
/// # Errors
///
/// Always [`OpsError::NotBuilt`] for now.
pub fn status(_args: StatusArgs) -> Result<(), OpsError> {
    Err(OpsError::NotBuilt("status"))
}
