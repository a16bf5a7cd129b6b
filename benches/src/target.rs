//! The plugin a run drives: a given endpoint, or the `csi-testkit` mock served in this
//! process on a temporary unix socket.

use std::path::{Path, PathBuf};

use csi_client::{CsiClient, Endpoint};
use csi_testkit::{MockPlugin, MockServer};
use tempfile::TempDir;

use crate::error::BenchError;

/// How many call records the benchmark mock keeps (the mock records every call; an unbounded
/// log would grow with `-n` and distort memory and speed).
pub const MOCK_CALL_LOG_LIMIT: usize = 1024;

/// Which plugin to drive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// A plugin already serving at this endpoint (`unix:///path.sock`).
    Endpoint(String),
    /// The `csi-testkit` mock, started in this process on a temporary socket.
    Mock,
}

/// A plugin being driven: its endpoint, and what keeps the mock alive when it is ours.
#[derive(Debug)]
pub struct Target {
    endpoint: Endpoint,
    mock: Option<(MockServer, TempDir)>,
}

/// The benchmark mock: every default (controller and node), a bounded call log.
///
/// # Errors
///
/// [`BenchError::MockConfig`] (cannot happen with these settings, but is not assumed).
pub fn bench_mock() -> Result<MockPlugin, BenchError> {
    MockPlugin::builder()
        .call_log_limit(MOCK_CALL_LOG_LIMIT)
        .build()
        .map_err(BenchError::MockConfig)
}

/// A fresh temporary directory for a socket (short path: sockets are limited to 107 bytes).
///
/// # Errors
///
/// [`BenchError::TempDir`].
pub fn socket_dir(purpose: &'static str) -> Result<TempDir, BenchError> {
    tempfile::Builder::new()
        .prefix("csi-bench-")
        .tempdir()
        .map_err(|source| BenchError::TempDir { purpose, source })
}

/// The socket path of the mock inside `dir`.
pub fn mock_socket(dir: &Path) -> PathBuf {
    dir.join("mock.sock")
}

impl Target {
    /// Resolves `spec`: parses the endpoint, or starts the mock (must run inside a tokio
    /// runtime).
    ///
    /// # Errors
    ///
    /// [`BenchError::Endpoint`] for a bad endpoint; [`BenchError::TempDir`],
    /// [`BenchError::MockConfig`], [`BenchError::MockServe`] when the mock cannot start.
    pub async fn start(spec: &TargetSpec) -> Result<Target, BenchError> {
        match spec {
            TargetSpec::Endpoint(text) => {
                let endpoint = text.parse().map_err(|source| BenchError::Endpoint {
                    endpoint: text.clone(),
                    source,
                })?;
                Ok(Target {
                    endpoint,
                    mock: None,
                })
            }
            TargetSpec::Mock => {
                let dir = socket_dir("the mock plugin's socket")?;
                let path = mock_socket(dir.path());
                let server = bench_mock()?
                    .serve_unix(&path)
                    .await
                    .map_err(BenchError::MockServe)?;
                let endpoint = Endpoint::unix(&path).map_err(|source| BenchError::Endpoint {
                    endpoint: path.display().to_string(),
                    source,
                })?;
                Ok(Target {
                    endpoint,
                    mock: Some((server, dir)),
                })
            }
        }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// A new client of the plugin, with its own connection (dialled on first call).
    pub fn client(&self) -> CsiClient {
        CsiClient::new(self.endpoint.clone())
    }

    /// Stops the mock, if it is ours.
    ///
    /// # Errors
    ///
    /// [`BenchError::MockServe`] when the mock did not stop cleanly.
    pub async fn stop(self) -> Result<(), BenchError> {
        if let Some((server, _dir)) = self.mock {
            server.shutdown().await.map_err(BenchError::MockServe)?;
        }
        Ok(())
    }
}
