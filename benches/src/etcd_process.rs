//! An `etcd` process for `--claims-etcd` when no `--etcd-endpoints` are given: one member on
//! loopback, free ports, a temporary data directory, its log in that directory; killed when
//! stopped or dropped.

use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::error::BenchError;

/// The program started: `etcd` on the `PATH` (Debian: `apt-get install etcd-server`).
pub const ETCD_PROGRAM: &str = "etcd";

/// One etcd member on loopback, started by the bench.
#[derive(Debug)]
pub struct EtcdProcess {
    child: Option<Child>,
    dir: tempfile::TempDir,
    endpoint: String,
}

fn start_error(step: &'static str, detail: impl ToString) -> BenchError {
    BenchError::EtcdStart {
        step,
        detail: detail.to_string(),
    }
}

fn free_port() -> Result<u16, BenchError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| start_error("finding a free loopback port", e))
}

impl EtcdProcess {
    /// Starts `etcd` with its data directory and log in a new temporary directory (under
    /// `TMPDIR`, so that decides the disk etcd syncs to). It answers a moment later: callers
    /// wait for it (see [`exited`](Self::exited) to notice a member that gave up).
    ///
    /// # Errors
    ///
    /// [`BenchError::EtcdStart`]: no temporary directory, no free port, or no `etcd` to run.
    pub fn start() -> Result<Self, BenchError> {
        let dir = tempfile::Builder::new()
            .prefix("csi-bench-etcd")
            .tempdir()
            .map_err(|source| BenchError::TempDir {
                purpose: "etcd's data directory",
                source,
            })?;
        let (client, peer) = (free_port()?, free_port()?);
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = File::create(dir.path().join("etcd.log"))
            .map_err(|e| start_error("creating etcd's log file", e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| start_error("creating etcd's log file", e))?;
        let child = Command::new(ETCD_PROGRAM)
            .args(["--name", "bench"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("bench={peer_url}")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "csi-bench"])
            // Every write keeps the whole volume record in etcd's history: a 10,000-claim run
            // leaves a database of about 600 MB. Let longer runs reuse the space (compaction
            // as operators configure it) and fit (8 GiB, etcd's suggested maximum).
            .args(["--auto-compaction-mode", "periodic"])
            .args(["--auto-compaction-retention", "1m"])
            .args(["--quota-backend-bytes", "8589934592"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .spawn()
            .map_err(|e| start_error("running `etcd`", e))?;
        Ok(Self {
            child: Some(child),
            dir,
            endpoint,
        })
    }

    /// The member's client URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// `Some(why)` when the process has already ended (a port taken meanwhile, a bad flag),
    /// with the end of its log.
    pub fn exited(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        Some(format!(
            "etcd exited ({status}); end of its log: {}",
            self.log_tail()
        ))
    }

    /// The last lines of etcd's log, on one line.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Kills the process and waits for it; the temporary directory goes with `self`.
    pub fn stop(mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
