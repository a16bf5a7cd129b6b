//! Memory per open connection: resident memory before and after opening `K` connections, each
//! a separate `csi-client` that made one Probe and stays open.
//!
//! With `--mock` the mock runs in a child process (this executable re-run with a hidden flag),
//! so the plugin's side is measured apart from the client's. With `--endpoint` only the
//! client's side is known.

use std::fmt;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use csi_client::{CsiClient, Endpoint};
use tokio::runtime::Runtime;

use crate::child::{self, HIDDEN_SERVE_MOCK};
use crate::cli::RuntimeFlavor;
use crate::error::BenchError;
use crate::memory::rss_bytes;
use crate::target::{TargetSpec, bench_mock, mock_socket, socket_dir};

/// Resident memory before and after, on one side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Side {
    /// Bytes resident before the connections were opened.
    pub before: u64,
    /// Bytes resident with every connection open.
    pub after: u64,
}

impl Side {
    /// Growth per connection, in bytes (0 if memory shrank).
    pub fn per_connection(&self, connections: u32) -> u64 {
        self.after.saturating_sub(self.before) / u64::from(connections.max(1))
    }
}

/// The result of a connection-memory run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnMemory {
    /// How many connections were open at the second measurement.
    pub connections: u32,
    /// The plugin's process, when it is the child mock.
    pub server: Option<Side>,
    /// This process (the clients).
    pub client: Side,
}

impl fmt::Display for ConnMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kib = |b: u64| b / 1024;
        write!(f, "conn_memory connections={}", self.connections)?;
        match self.server {
            Some(s) => write!(
                f,
                " server_rss_before_kib={} server_rss_after_kib={} server_bytes_per_conn={}",
                kib(s.before),
                kib(s.after),
                s.per_connection(self.connections)
            )?,
            None => write!(f, " server_bytes_per_conn=unknown")?,
        }
        write!(
            f,
            " client_rss_before_kib={} client_rss_after_kib={} client_bytes_per_conn={}",
            kib(self.client.before),
            kib(self.client.after),
            self.client.per_connection(self.connections)
        )
    }
}

/// Opens `connections` connections to the plugin and measures memory on both sides.
///
/// # Errors
///
/// Start-up errors of the child mock, [`BenchError::Endpoint`], [`BenchError::Setup`] for a
/// failed Probe on a new connection, [`BenchError::Statm`].
pub fn run_conn_memory(
    rt: &Runtime,
    spec: &TargetSpec,
    connections: u32,
    exe: &Path,
) -> Result<ConnMemory, BenchError> {
    match spec {
        TargetSpec::Endpoint(text) => {
            let endpoint: Endpoint = text.parse().map_err(|source| BenchError::Endpoint {
                endpoint: text.clone(),
                source,
            })?;
            rt.block_on(measure(endpoint, connections, None))
        }
        TargetSpec::Mock => {
            let dir = socket_dir("the child mock's socket")?;
            let path = mock_socket(dir.path());
            let role = "mock plugin";
            let mut child = Command::new(exe)
                .arg(HIDDEN_SERVE_MOCK)
                .arg(&path)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .map_err(|source| BenchError::Spawn {
                    exe: exe.to_path_buf(),
                    role,
                    source,
                })?;
            let measured = child::wait_for_socket(&path, &mut child, exe, role).and_then(|()| {
                let endpoint = Endpoint::unix(&path).map_err(|source| BenchError::Endpoint {
                    endpoint: path.display().to_string(),
                    source,
                })?;
                rt.block_on(measure(endpoint, connections, Some(child.id())))
            });
            // Closing its stdin tells the child to stop.
            drop(child.stdin.take());
            child::reap(child, exe, role, measured.is_ok())?;
            measured
        }
    }
}

pub(crate) async fn measure(
    endpoint: Endpoint,
    connections: u32,
    server: Option<u32>,
) -> Result<ConnMemory, BenchError> {
    let probe = |step| {
        move |source| BenchError::Setup {
            step,
            source: Box::new(source),
        }
    };
    // One connection first, so one-time set-up on both sides is not counted.
    let first = CsiClient::new(endpoint.clone());
    first
        .identity()
        .probe()
        .await
        .map_err(probe("Probe on the first connection"))?;
    let server_before = server.map(|pid| rss_bytes(Some(pid))).transpose()?;
    let client_before = rss_bytes(None)?;
    let mut open = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        let client = CsiClient::new(endpoint.clone());
        client
            .identity()
            .probe()
            .await
            .map_err(probe("Probe on a new connection"))?;
        open.push(client);
    }
    let server_after = server.map(|pid| rss_bytes(Some(pid))).transpose()?;
    let client_after = rss_bytes(None)?;
    drop(open);
    drop(first);
    Ok(ConnMemory {
        connections,
        server: server_before
            .zip(server_after)
            .map(|(before, after)| Side { before, after }),
        client: Side {
            before: client_before,
            after: client_after,
        },
    })
}

/// The child's side of `--serve-mock PATH`: serves the benchmark mock at `path`, on a runtime
/// of the given flavour, until stdin closes.
///
/// # Errors
///
/// [`BenchError::Runtime`], and the mock's start-up errors.
pub fn serve_mock_until_stdin_closes(
    path: &Path,
    runtime: RuntimeFlavor,
) -> Result<(), BenchError> {
    let rt = crate::runtime_of(runtime)?;
    rt.block_on(async {
        let server = bench_mock()?
            .serve_unix(path)
            .await
            .map_err(BenchError::MockServe)?;
        // Blocks until the parent closes our stdin (or dies): read to the end, ignoring data.
        let _ = tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            std::io::stdin().read_to_end(&mut sink)
        })
        .await;
        server.shutdown().await.map_err(BenchError::MockServe)
    })
}
