//! `csi-agent demo`: one volume through its whole life.

/// Arguments of `csi-agent demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

/// Error of `csi-agent demo`.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The demo is not built yet.
    #[error("`demo` is not built yet")]
    NotBuilt,
}

impl crate::ExitStatus for DemoError {
    fn exit_code(&self) -> u8 {
        2
    }
}

/// Runs `csi-agent demo`.
///
/// # Errors
///
/// Always [`DemoError::NotBuilt`] for now.
pub fn run(_args: DemoArgs) -> Result<(), DemoError> {
    Err(DemoError::NotBuilt)
}
