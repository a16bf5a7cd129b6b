//! The crate's error type: what can go wrong serving the mock or connecting to it.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::ConfigError;
use crate::endpoint::EndpointError;

/// Serving or connecting to the mock failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The endpoint is not a unix socket path.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The directory that should hold the socket does not exist.
    #[error("socket {path:?}: its directory does not exist")]
    SocketDirMissing {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket path is longer than a unix socket address allows.
    #[error("socket path {path:?} is {len} bytes; a unix socket path may have at most {limit}")]
    SocketPathTooLong {
        /// The socket path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The limit (107 bytes on Linux).
        limit: usize,
    },
    /// Something other than a socket sits at the socket path; the mock will not delete it.
    #[error("refusing to delete {path:?}: it is a {kind}, not a socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
        /// What it is (`regular file`, `directory`, `symlink`, …).
        kind: &'static str,
    },
    /// A live server answers on the socket path.
    #[error("socket {path:?} is in use: another server answers on it")]
    SocketInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket path could not be inspected.
    #[error("cannot inspect socket path {path:?}")]
    Inspect {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A stale socket could not be removed.
    #[error("cannot remove the stale socket {path:?}")]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Binding the socket failed.
    #[error("cannot bind socket {path:?}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Setting the socket's permissions to 0600 failed.
    #[error("cannot set permissions 0600 on socket {path:?}")]
    Permissions {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Connecting a channel to the mock failed.
    #[error("cannot connect to {endpoint}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// The gRPC server failed.
    #[error("the mock server failed")]
    Serve(#[source] tonic::transport::Error),
    /// Graceful shutdown did not finish in time, so the server task was aborted.
    #[error("the mock server did not stop within {0:?}; it was aborted")]
    ShutdownTimedOut(Duration),
    /// The server task panicked.
    #[error("the mock server task panicked")]
    ServerTask(#[source] tokio::task::JoinError),
}
