//! Why a conformance run could not start at all (as opposed to a check failing).

use std::path::PathBuf;

/// A run could not start: the plugin's socket or the scratch directory is unusable.
///
/// Anything the plugin does wrong once connected is a failed check in the
/// [`Report`](super::Report), never this error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing accepted a connection on the socket.
    #[error("cannot connect to the plugin at {socket}")]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// The connection error (boxed: the crate error is large).
        #[source]
        source: Box<crate::Error>,
    },
    /// An option is outside what the suite or the spec allows.
    #[error("option {option} = {value}: {limit}")]
    InvalidOption {
        /// Which option (`volume_size`, `timeout`, `secret key`).
        option: &'static str,
        /// The offending value (for a secret, only its key).
        value: String,
        /// The rule it breaks.
        limit: &'static str,
    },
    /// The scratch directory for staging and target paths could not be created.
    #[error("cannot create the scratch directory {path}")]
    ScratchDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}
