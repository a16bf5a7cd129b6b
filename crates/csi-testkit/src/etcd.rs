//! A real etcd for tests of cluster mode: one or more `etcd` processes on loopback, each with a
//! temporary data directory and free ports, stopped when the [`LocalEtcd`] is dropped.
//!
//! It needs the `etcd` binary on the `PATH` (Debian: `apt-get install etcd-server`).
//!
//! ```no_run
//! use csi_testkit::etcd::LocalEtcd;
//!
//! # fn example() -> Result<(), csi_testkit::etcd::EtcdError> {
//! let mut etcd = LocalEtcd::start(3)?;
//! etcd.wait_healthy(std::time::Duration::from_secs(30))?;
//! println!("clients go to {:?}", etcd.endpoints());
//! etcd.kill(0); // the other two keep a quorum
//! etcd.restart(0)?;
//! # Ok(())
//! # }
//! ```

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why a local etcd could not start.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The `etcd` binary could not be started.
    #[error("cannot start `etcd` (Debian: apt-get install etcd-server): {0}")]
    Spawn(#[source] std::io::Error),
    /// A temporary directory or a free port could not be had.
    #[error("cannot prepare a local etcd: {0}")]
    Setup(#[source] std::io::Error),
    /// No member answered `/health` in time.
    #[error("etcd did not report healthy within {0:?}")]
    NotHealthy(Duration),
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// etcd members on loopback; see the [module docs](self).
pub struct LocalEtcd {
    members: Vec<Member>,
    cluster: String,
    _root: tempfile::TempDir,
}

impl std::fmt::Debug for LocalEtcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEtcd")
            .field("endpoints", &self.endpoints())
            .finish_non_exhaustive()
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl LocalEtcd {
    /// Starts a cluster of `members` (at least one) with short election timeouts, so a lost
    /// member is replaced quickly.
    ///
    /// # Errors
    ///
    /// [`EtcdError`].
    pub fn start(members: usize) -> Result<Self, EtcdError> {
        let root = tempfile::tempdir().map_err(EtcdError::Setup)?;
        let members = (0..members.max(1))
            .map(|i| {
                Ok(Member {
                    name: format!("m{i}"),
                    client: free_port()?,
                    peer: free_port()?,
                    dir: root.path().join(format!("m{i}")),
                    child: None,
                })
            })
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(EtcdError::Setup)?;
        let cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut etcd = Self {
            members,
            cluster,
            _root: root,
        };
        for i in 0..etcd.members.len() {
            etcd.spawn(i, "new")?;
        }
        Ok(etcd)
    }

    fn spawn(&mut self, i: usize, state: &str) -> Result<(), EtcdError> {
        let m = &mut self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let child = Command::new("etcd")
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "csi-testkit"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(EtcdError::Spawn)?;
        m.child = Some(child);
        Ok(())
    }

    /// The client URLs, `http://127.0.0.1:PORT`, one per member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect()
    }

    /// `HOST:PORT,HOST:PORT`, as `csi-agent serve --store etcd://...` takes them.
    pub fn host_ports(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// SIGKILLs member `i` (a crash); its data directory stays.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members.get_mut(i).and_then(|m| m.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed member again on its data directory.
    ///
    /// # Errors
    ///
    /// [`EtcdError::Spawn`].
    pub fn restart(&mut self, i: usize) -> Result<(), EtcdError> {
        self.spawn(i, "existing")
    }

    /// Waits until a running member reports itself healthy (`GET /health`), polling; `limit`
    /// is only a hang guard.
    ///
    /// # Errors
    ///
    /// [`EtcdError::NotHealthy`].
    pub fn wait_healthy(&self, limit: Duration) -> Result<(), EtcdError> {
        let start = Instant::now();
        while start.elapsed() < limit {
            let running = self.members.iter().filter(|m| m.child.is_some());
            if running.into_iter().any(|m| healthy(m.client)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(EtcdError::NotHealthy(limit))
    }
}

/// Whether the member on `port` answers `/health` with `"health":"true"`.
fn healthy(port: u16) -> bool {
    let ask = || -> std::io::Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        Ok(answer)
    };
    ask().is_ok_and(|a| a.contains("\"health\":\"true\""))
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
