//! `csi-agent serve` (placeholder until the serve work lands).

/// Arguments of `csi-agent serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {}

/// Error of `csi-agent serve`.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The subcommand is not built yet.
    #[error("`serve` is not built yet")]
    NotBuilt,
}

impl crate::ExitStatus for ServeError {
    fn exit_code(&self) -> u8 {
        2
    }
}

/// Runs `csi-agent serve`.
///
/// # Errors
///
/// Always [`ServeError::NotBuilt`] for now.
pub fn run(_args: ServeArgs) -> Result<(), ServeError> {
    Err(ServeError::NotBuilt)
}
