//! `csi-agent serve` end to end: the built binary as a child process, csi-testkit mock plugins
//! served in this test process on unix sockets in a temporary directory, and the operator
//! commands (`--json`) to drive and observe the agent.
//!
//! No timing assertions: every wait polls a condition in a bounded loop (the bound is only a
//! hang guard), and every child process is killed when its guard drops.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use csi_agent::ops::api::{PluginView, StatusView, VolumeView};
use csi_client::Rpc;
use csi_testkit::{MockPlugin, RecordedOutcome, Role};
use serde::de::DeserializeOwned;

/// Hang guard of each wait; never a timing assertion.
pub(crate) const GUARD: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(100);

/// A running `csi-agent serve`, killed (SIGKILL) and reaped when dropped.
pub(crate) struct Serve {
    child: Option<Child>,
    data: PathBuf,
    log: PathBuf,
}

impl Serve {
    pub(crate) fn start(dir: &Path, name: &str, data: &Path, args: &[String]) -> Serve {
        // A restart must not read the address of the previous process.
        let _ = std::fs::remove_file(data.join("agent.json"));
        let log = dir.join(format!("{name}.log"));
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("the temp dir is writable");
        let child = Command::new(env!("CARGO_BIN_EXE_csi-agent"))
            .arg("serve")
            .arg("--data-dir")
            .arg(data)
            .args(if args.iter().any(|a| a == "--listen") {
                &[][..]
            } else {
                &["--listen", "127.0.0.1:0"][..]
            })
            .args(["--scan-interval", "100ms"])
            .args(["--health-interval", "500ms"])
            .args(if args.iter().any(|a| a == "--log") {
                &[][..]
            } else {
                &["--log", "info"][..]
            })
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .spawn()
            .expect("the csi-agent binary cargo built can be started");
        Serve {
            child: Some(child),
            data: data.to_owned(),
            log,
        }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id, while it runs (the cluster tests stop and continue it).
    #[cfg(feature = "etcd")]
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then the exit code.
    pub(crate) fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        let status = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()
            .expect("kill(1) runs");
        assert!(status.success());
        for _ in 0..(GUARD.as_millis() / POLL.as_millis()) {
            if let Ok(Some(s)) = c.try_wait() {
                return s.code();
            }
            std::thread::sleep(POLL);
        }
        let _ = c.kill();
        let _ = c.wait();
        panic!("csi-agent did not stop after SIGTERM");
    }

    /// Waits until the agent answers `status`; panics (with its log) if it exits.
    pub(crate) async fn ready(&mut self) {
        if let Err(log) = self.try_ready().await {
            panic!("csi-agent serve exited:\n{log}");
        }
    }

    /// Waits until the agent answers `status`; `Err(log)` if it exits first.
    pub(crate) async fn try_ready(&mut self) -> Result<(), String> {
        let data = self.data.clone();
        for _ in 0..(GUARD.as_millis() / POLL.as_millis()) {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(_)) = c.try_wait()
            {
                return Err(self.log());
            }
            if cli(&data, &["status", "--json"]).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
        panic!("csi-agent serve never answered:\n{}", self.log());
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- {}\n{}", self.log.display(), self.log());
        }
    }
}

/// Polls `f` until it yields a value; panics after [`GUARD`].
pub(crate) async fn eventually<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..(GUARD.as_millis() / POLL.as_millis()) {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("gave up waiting: {what}");
}

/// Runs an operator command; `Ok(stdout)` on exit 0, `Err(stderr)` otherwise.
pub(crate) async fn cli(data: &Path, args: &[&str]) -> Result<String, String> {
    cli_within(data, args, "30s").await
}

/// Runs an operator command that gives up after `timeout` (its `--timeout`); `Ok(stdout)` on
/// exit 0, `Err(stderr)` otherwise.
pub(crate) async fn cli_within(
    data: &Path,
    args: &[&str],
    timeout: &str,
) -> Result<String, String> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_csi-agent"));
    command
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .args(["--timeout", timeout])
        .stdin(Stdio::null());
    let out = tokio::time::timeout(GUARD, tokio::task::spawn_blocking(move || command.output()))
        .await
        .expect("an operator command finishes")
        .expect("the waiting thread does not panic")
        .expect("csi-agent runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Runs an operator command with `--json` that must fail: its exit code and the error it
/// printed on stdout.
fn failed_json(data: &Path, args: &[&str]) -> (Option<i32>, csi_agent::ops::api::ApiError) {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-agent"))
        .args(args)
        .arg("--json")
        .arg("--data-dir")
        .arg(data)
        .stdin(Stdio::null())
        .output()
        .expect("csi-agent runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let error = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    (out.status.code(), error)
}

pub(crate) async fn json<T: DeserializeOwned>(data: &Path, args: &[&str]) -> T {
    let mut all = args.to_vec();
    all.push("--json");
    let out = cli(data, &all)
        .await
        .unwrap_or_else(|e| panic!("csi-agent {args:?} failed: {e}"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("csi-agent {args:?}: {e}: {out}"))
}

pub(crate) fn ok_count(mock: &MockPlugin, rpc: Rpc) -> usize {
    mock.calls()
        .of(rpc)
        .records()
        .iter()
        .filter(|r| r.outcome == RecordedOutcome::Ok)
        .count()
}

async fn plugin(data: &Path, id: &str) -> Option<PluginView> {
    let list: Vec<PluginView> = json(data, &["plugin", "list"]).await;
    list.into_iter().find(|p| p.id == id && p.socket.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_release_then_restart_finishes_the_release_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let data = dir.path().join("data");
    let mock = MockPlugin::builder().build().expect("default mock");
    let _server = mock
        .serve_unix(plugins.join("mock.sock"))
        .await
        .expect("mock serves");
    // The first ControllerUnpublishVolume never answers: the kill lands mid-release.
    mock.faults()
        .on(Rpc::ControllerUnpublishVolume)
        .hang()
        .install();

    let args = vec![
        "--node-id".to_owned(),
        "n1".into(),
        "--plugin-dir".into(),
        plugins.display().to_string(),
    ];
    let mut agent = Serve::start(dir.path(), "first", &data, &args);
    agent.ready().await;
    eventually("the plugin is fingerprinted and healthy", async || {
        plugin(&data, "mock")
            .await
            .filter(|p| p.fingerprints >= 1 && p.health == "healthy")
    })
    .await;

    let created: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "mock",
            "--capacity",
            "1Mi",
        ],
    )
    .await;
    assert_eq!(mock.volumes().len(), 1);
    let claim: csi_agent::ops::api::ClaimView =
        json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    assert_eq!(claim.state, "taken");
    assert_eq!(mock.published().len(), 1, "published once for w1");
    assert_eq!(mock.staged().len(), 1);

    let _: VolumeView = json(&data, &["volume", "release", "v1", "--workload", "w1"]).await;
    mock.calls()
        .wait_for(GUARD, |c| c.count(Rpc::ControllerUnpublishVolume) >= 1)
        .await
        .expect("the release reaches ControllerUnpublishVolume");
    // The node step is checkpointed before the controller step starts.
    assert_eq!(ok_count(&mock, Rpc::NodeUnpublishVolume), 1);
    assert_eq!(ok_count(&mock, Rpc::NodeUnstageVolume), 1);
    let stuck: VolumeView = json(&data, &["volume", "status", "v1"]).await;
    assert_eq!(stuck.claims.len(), 1, "{stuck:?}");
    assert_ne!(stuck.claims[0].state, "taken");

    agent.kill();
    let mut agent = Serve::start(dir.path(), "second", &data, &fast_backoff(&plugins));
    agent.ready().await;
    let freed = eventually("the restarted agent frees the claim", async || {
        let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
        v.claims.is_empty().then_some(v)
    })
    .await;
    assert_eq!(freed.id, created.id, "the volume stays registered");

    let calls = mock.calls();
    assert_eq!(calls.count(Rpc::ControllerPublishVolume), 1);
    assert_eq!(calls.count(Rpc::NodeStageVolume), 1);
    assert_eq!(calls.count(Rpc::NodePublishVolume), 1);
    // Nothing doubled: the node step is not repeated after the restart...
    assert_eq!(
        calls.count(Rpc::NodeUnpublishVolume),
        1,
        "{:?}",
        calls.rpcs()
    );
    assert_eq!(calls.count(Rpc::NodeUnstageVolume), 1);
    // ...and the controller step that was cut off is repeated exactly once and succeeds.
    assert_eq!(calls.count(Rpc::ControllerUnpublishVolume), 2);
    assert_eq!(ok_count(&mock, Rpc::ControllerUnpublishVolume), 1);
    // Nothing lost: nothing left published, staged or attached.
    assert!(mock.published().is_empty());
    assert!(mock.staged().is_empty());
    let external = &freed.external_id;
    assert!(mock.published_nodes(external).is_empty());

    let status: StatusView = json(&data, &["status"]).await;
    assert!(status.stuck.is_empty(), "{status:?}");
    assert!(status.claims.is_empty(), "{status:?}");
    assert!(status.uncertain.is_empty(), "{status:?}");
    assert!(
        agent.log().contains("resumed_releases=1"),
        "{}",
        agent.log()
    );
    assert!(agent.log().contains("claim freed"), "{}", agent.log());
    // The resumed release waited for the plugin's fingerprint: its first attempt worked.
    assert!(!agent.log().contains("detach failed"), "{}", agent.log());

    let _: VolumeView = json(&data, &["volume", "delete", "v1"]).await;
    assert!(mock.volumes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_plugin_socket_is_fingerprinted_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let data = dir.path().join("data");
    let socket = plugins.join("mock.sock");
    let first = MockPlugin::builder()
        .name("mock.csi.example", "1.0.0")
        .build()
        .expect("mock");
    let server = first.serve_unix(&socket).await.expect("mock serves");
    let args = vec![
        "--plugin-dir".to_owned(),
        plugins.display().to_string(),
        "--fingerprint-interval".into(),
        "200ms".into(),
    ];
    let mut agent = Serve::start(dir.path(), "agent", &data, &args);
    agent.ready().await;
    let seen = eventually(
        "the first plugin is fingerprinted and healthy",
        async || {
            plugin(&data, "mock")
                .await
                .filter(|p| p.fingerprints == 1 && p.health == "healthy")
        },
    )
    .await;
    assert_eq!(seen.version.as_deref(), Some("1.0.0"));
    // The same socket is fingerprinted again periodically; that is not a new plugin.
    first
        .calls()
        .wait_for(GUARD, |c| c.count(Rpc::GetPluginInfo) >= 3)
        .await
        .expect("periodic fingerprints");
    assert_eq!(plugin(&data, "mock").await.map(|p| p.fingerprints), Some(1));

    server
        .shutdown()
        .await
        .expect("mock stops and removes its socket");
    eventually("the plugin is deregistered", async || {
        plugin(&data, "mock").await.is_none().then_some(())
    })
    .await;

    let second = MockPlugin::builder()
        .name("mock.csi.example", "2.0.0")
        .build()
        .expect("mock");
    let _server = second.serve_unix(&socket).await.expect("mock serves again");
    let again = eventually("the new plugin is fingerprinted", async || {
        plugin(&data, "mock").await.filter(|p| p.fingerprints == 2)
    })
    .await;
    assert_eq!(again.version.as_deref(), Some("2.0.0"));
    assert!(second.calls().count(Rpc::GetPluginInfo) >= 1);
    assert!(agent.log().contains("plugin socket removed"));

    assert_eq!(
        agent.terminate(),
        Some(0),
        "SIGTERM exits 0:\n{}",
        agent.log()
    );
    assert!(!data.join("agent.json").exists());
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_claim_and_release_across_each_other() {
    let dir = tempfile::tempdir().expect("temp dir");
    let token = dir.path().join("cluster.token");
    std::fs::write(&token, "test-cluster-token-0123456789abcdef").expect("token file");
    // Node a hosts a controller-only plugin, node b a node-only plugin of the same id.
    let controller = MockPlugin::builder()
        .role(Role::Controller)
        .other_node("b-plugin-node")
        .build()
        .expect("controller mock");
    let node = MockPlugin::builder()
        .role(Role::Node)
        .node_id("b-plugin-node")
        .build()
        .expect("node mock");
    let (pa, pb) = (dir.path().join("pa"), dir.path().join("pb"));
    std::fs::create_dir_all(&pa).expect("dir");
    std::fs::create_dir_all(&pb).expect("dir");
    let _ca = controller
        .serve_unix(pa.join("mock.sock"))
        .await
        .expect("serves");
    let _nb = node.serve_unix(pb.join("mock.sock")).await.expect("serves");

    let agent_args =
        |me: &str, plugins: &Path, shim: u16, http: u16, peer: &str, ps: u16, ph: u16| {
            vec![
                "--node-id".to_owned(),
                me.into(),
                "--plugin-dir".into(),
                plugins.display().to_string(),
                "--shim-listen".into(),
                format!("127.0.0.1:{shim}"),
                "--listen".into(),
                format!("127.0.0.1:{http}"),
                "--peer".into(),
                format!("{peer}=127.0.0.1:{ps},127.0.0.1:{ph}"),
                "--cluster-token-file".into(),
                token.display().to_string(),
                "--peer-interval".into(),
                "200ms".into(),
            ]
        };
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    // Each agent must know the other's addresses before it starts; a port taken between
    // choosing and binding it (another test) means choosing again.
    let mut attempt = 0;
    let (a, b) = loop {
        attempt += 1;
        let [a_shim, a_http, b_shim, b_http] = [free_port(), free_port(), free_port(), free_port()];
        let mut a = Serve::start(
            dir.path(),
            "a",
            &da,
            &agent_args("a", &pa, a_shim, a_http, "b", b_shim, b_http),
        );
        let mut b = Serve::start(
            dir.path(),
            "b",
            &db,
            &agent_args("b", &pb, b_shim, b_http, "a", a_shim, a_http),
        );
        match (a.try_ready().await, b.try_ready().await) {
            (Ok(()), Ok(())) => break (a, b),
            (ra, rb) => {
                let log = format!("{ra:?} {rb:?}");
                assert!(
                    attempt < 5 && log.contains("cannot listen"),
                    "agents did not start: {log}"
                );
            }
        }
    };
    eventually(
        "b sees a's controller and its own node plugin",
        async || {
            let list: Vec<PluginView> = json(&db, &["plugin", "list"]).await;
            let remote = list
                .iter()
                .any(|p| p.node == "a" && p.controller && p.health == "healthy");
            let local = list
                .iter()
                .any(|p| p.node == "b" && p.node_service && p.health == "healthy");
            (remote && local).then_some(())
        },
    )
    .await;

    // Everything is asked of b: creation and attach go to a's controller through the shim.
    let v: VolumeView = json(&db, &["volume", "create", "v1", "--plugin", "mock"]).await;
    assert!(v.controller_publish, "{v:?}");
    assert_eq!(controller.calls().count(Rpc::CreateVolume), 1);
    let claim: csi_agent::ops::api::ClaimView =
        json(&db, &["volume", "claim", "v1", "--workload", "w1"]).await;
    assert_eq!((claim.node.as_str(), claim.state.as_str()), ("b", "taken"));
    assert_eq!(claim.plugin_node, "b-plugin-node");
    let publish = controller
        .calls()
        .last(Rpc::ControllerPublishVolume)
        .expect("controller publish on a");
    assert_eq!(publish.node_id.as_deref(), Some("b-plugin-node"));
    assert_eq!(ok_count(&node, Rpc::NodeStageVolume), 1);
    assert_eq!(ok_count(&node, Rpc::NodePublishVolume), 1);

    let released: VolumeView = json(
        &db,
        &["volume", "release", "v1", "--workload", "w1", "--wait"],
    )
    .await;
    assert!(released.claims.is_empty(), "{released:?}");
    assert_eq!(ok_count(&node, Rpc::NodeUnpublishVolume), 1);
    assert_eq!(ok_count(&node, Rpc::NodeUnstageVolume), 1);
    assert_eq!(ok_count(&controller, Rpc::ControllerUnpublishVolume), 1);
    assert!(controller.published_nodes(&v.external_id).is_empty());
    assert!(node.published().is_empty() && node.staged().is_empty());

    let _: VolumeView = json(&db, &["volume", "delete", "v1"]).await;
    assert_eq!(ok_count(&controller, Rpc::DeleteVolume), 1);
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_value_names_its_key_before_starting() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let run = |args: Vec<String>| {
        Command::new(env!("CARGO_BIN_EXE_csi-agent"))
            .arg("serve")
            .arg("--data-dir")
            .arg(&data)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("csi-agent runs")
    };
    let out = run(vec!["--health-interval".into(), "soon".into()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`health_interval`"));
    assert!(!data.exists(), "nothing started");

    let file = dir.path().join("agent.toml");
    std::fs::write(&file, "scan_interval = \"1s\"\nlisten = \"10.0.0.1:80\"\n").expect("file");
    let out = run(vec!["--config".into(), file.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`listen`"));

    let out = run(vec!["--peer".into(), "b=127.0.0.1:1,127.0.0.1:2".into()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`cluster_token_file`"));

    // A cluster store that cannot be opened is a configuration error naming the agent's key:
    // `store` where cluster mode is not built in, else the CA file that is not there.
    let token = dir.path().join("token");
    std::fs::write(&token, "a-cluster-token-of-enough-length").expect("token");
    let mut cluster: Vec<String> = [
        "--store",
        "etcd://127.0.0.1:1",
        "--shim-listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.1:0",
        "--cluster-token-file",
    ]
    .map(String::from)
    .into();
    cluster.push(token.display().to_string());
    let key = match cfg!(feature = "etcd") {
        false => "`store`",
        true => {
            cluster.push("--etcd-ca-file".into());
            cluster.push(dir.path().join("no-such-ca.pem").display().to_string());
            "`etcd_ca_file`"
        }
    };
    let out = run(cluster);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(key), "{stderr}");
}

/// A `GET` of the agent's `/metrics`, over plain HTTP.
pub(crate) fn metrics(data: &Path) -> String {
    raw_get(data, "/metrics", None)
}

/// A connection to the agent's control address, and the head of a request to it (`method`,
/// `path`, the host and the bearer token if any) up to its own header lines.
fn control_request(
    data: &Path,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (std::net::TcpStream, String) {
    let info: csi_agent::ops::api::AgentInfo =
        serde_json::from_slice(&std::fs::read(data.join("agent.json")).expect("agent.json exists"))
            .expect("agent.json is valid");
    let s = std::net::TcpStream::connect(&info.http).expect("the agent listens");
    s.set_read_timeout(Some(GUARD)).expect("timeout set");
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {}\r\n{auth}connection: close\r\n",
        info.http
    );
    (s, head)
}

/// A plain HTTP `GET` of `path` on the agent's control address, with an optional bearer token.
pub(crate) fn raw_get(data: &Path, path: &str, token: Option<&str>) -> String {
    use std::io::{Read as _, Write as _};
    let (mut s, head) = control_request(data, "GET", path, token);
    write!(s, "{head}\r\n").expect("request sent");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("answer read");
    out
}

pub(crate) fn fast_backoff(plugins: &Path) -> Vec<String> {
    [
        "--plugin-dir",
        &plugins.display().to_string(),
        "--release-backoff-initial",
        "50ms",
        "--release-backoff-max",
        "200ms",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// One agent beside one mock plugin (`mock`), running, the plugin fingerprinted.
pub(crate) struct OneAgent {
    pub(crate) data: PathBuf,
    pub(crate) agent: Serve,
    _server: csi_testkit::MockServer,
    _dir: tempfile::TempDir,
}

/// Serves `mock` as plugin `mock` and starts an agent with fast release backoff beside it.
pub(crate) async fn one_agent(mock: &MockPlugin) -> OneAgent {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let data = dir.path().join("data");
    let server = mock
        .serve_unix(plugins.join("mock.sock"))
        .await
        .expect("serves");
    let mut agent = Serve::start(dir.path(), "agent", &data, &fast_backoff(&plugins));
    agent.ready().await;
    eventually("fingerprinted and healthy", async || {
        plugin(&data, "mock")
            .await
            .filter(|p| p.fingerprints >= 1 && p.health == "healthy")
    })
    .await;
    OneAgent {
        data,
        agent,
        _server: server,
        _dir: dir,
    }
}

/// One agent whose volume `v1`, claimed by `w1`, is being released while every
/// `NodeUnpublishVolume` of the mock fails (`UNAVAILABLE`).
async fn releasing_while_unpublish_fails(mock: &MockPlugin) -> OneAgent {
    let one = one_agent(mock).await;
    let data = one.data.clone();
    let _: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    let _: csi_agent::ops::api::ClaimView =
        json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    mock.faults()
        .on(Rpc::NodeUnpublishVolume)
        .fail_times(10_000, tonic_code_unavailable(), "node plugin busy")
        .install();
    let _: VolumeView = json(&data, &["volume", "release", "v1", "--workload", "w1"]).await;
    one
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_release_step_is_logged_per_attempt_and_status_names_its_backoff() {
    let mock = MockPlugin::builder().build().expect("mock");
    let mut one = releasing_while_unpublish_fails(&mock).await;
    let data = one.data.clone();

    // Between attempts the release names the step it backs off, not "nothing".
    let backing_off = eventually("the release backs off its node step", async || {
        let s: StatusView = json(&data, &["status"]).await;
        s.stuck.into_iter().find(|r| {
            r.volume == "v1" && r.attempts >= 2 && r.backoff_step.as_deref() == Some("node_detach")
        })
    })
    .await;
    assert_eq!(backing_off.pending, "backoff", "{backing_off:?}");
    assert_eq!(backing_off.pending_workload.as_deref(), Some("w1"));
    assert!(backing_off.next_retry_ms.is_some(), "{backing_off:?}");

    // One log line per failed attempt, numbered 1, 2, ... with the class and the retry.
    let failed: Vec<String> = one
        .agent
        .log()
        .lines()
        .filter(|l| l.contains("release step failed; retry scheduled"))
        .map(str::to_owned)
        .collect();
    assert!(failed.len() >= 2, "{failed:?}");
    for (i, line) in failed.iter().enumerate() {
        for field in [
            "volume=v1",
            "workload=w1",
            "step=node_detach",
            "class=retry ",
            "retry_in_ms=",
            &format!("attempt={} ", i + 1),
        ] {
            assert!(line.contains(field), "{field} missing in {line}");
        }
    }

    mock.faults().clear();
    eventually("the release completes", async || {
        let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
        v.claims.is_empty().then_some(())
    })
    .await;
    let log = one.agent.log();
    assert!(
        log.lines()
            .any(|l| l.contains("release step succeeded after failing")
                && l.contains("step=node_detach")),
        "{log}"
    );
    assert_eq!(one.agent.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_explains_a_stuck_release_and_metrics_count_it() {
    let mock = MockPlugin::builder().build().expect("mock");
    let mut one = releasing_while_unpublish_fails(&mock).await;
    let data = one.data.clone();
    let stuck = eventually("the release is reported stuck after a retry", async || {
        let s: StatusView = json(&data, &["status"]).await;
        s.stuck
            .into_iter()
            .find(|r| r.volume == "v1" && r.attempts >= 2)
    })
    .await;
    assert_eq!(
        stuck.last_error_class.as_deref(),
        Some("retry"),
        "{stuck:?}"
    );
    assert!(
        stuck
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("NodeUnpublishVolume")),
        "{stuck:?}"
    );
    assert_eq!(stuck.claims.len(), 1);
    assert_eq!(stuck.claims[0].state, "releasing");

    let table = cli(&data, &["status"]).await.expect("status runs");
    assert!(table.contains("STUCK RELEASES"), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("v1 "))
        .unwrap_or_else(|| panic!("no row for v1:\n{table}"));
    assert!(
        row.contains("w1:releasing") && row.contains("retry"),
        "{row}"
    );

    let text = metrics(&data);
    assert!(text.contains("csi_agent_stuck_releases 1"), "{text}");
    // Every plugin health has its series, at zero where no plugin has it.
    for series in [
        r#"health="healthy"} 1"#,
        r#"health="unhealthy"} 0"#,
        r#"health="unknown"} 0"#,
    ] {
        assert!(
            text.contains(&format!("csi_agent_plugins{{{series}")),
            "{text}"
        );
    }
    assert!(
        text.contains("csi_agent_claims{state=\"releasing\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "csi_rpc_total{plugin=\"mock\",rpc=\"NodeUnpublishVolume\",code=\"Unavailable\"}"
        ),
        "{text}"
    );
    assert!(
        text.contains("csi_rpc_duration_seconds_count{plugin=\"mock\",rpc=\"CreateVolume\"} 1"),
        "{text}"
    );

    mock.faults().clear();
    eventually(
        "the release completes once the plugin recovers",
        async || {
            let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
            v.claims.is_empty().then_some(())
        },
    )
    .await;
    let s: StatusView = json(&data, &["status"]).await;
    assert!(s.stuck.is_empty(), "{s:?}");
    assert!(metrics(&data).contains("csi_agent_stuck_releases 0"));
    assert_eq!(ok_count(&mock, Rpc::NodeUnpublishVolume), 1);
    assert_eq!(ok_count(&mock, Rpc::ControllerUnpublishVolume), 1);
    assert_eq!(one.agent.terminate(), Some(0));
}

fn tonic_code_unavailable() -> csi_client::Code {
    csi_client::Code::Unavailable
}

/// One `serve` agent over the mock (at `<dir>/plugins/mock.sock`), fingerprinted, with volume
/// `v1` created in `access_mode`.
struct WithVolume {
    mock: MockPlugin,
    _server: csi_testkit::MockServer,
    agent: Serve,
    plugins: PathBuf,
    data: PathBuf,
}

async fn agent_with_v1(dir: &Path, name: &str, access_mode: &str) -> WithVolume {
    let mock = MockPlugin::builder().build().expect("mock");
    agent_with_v1_on(dir, name, access_mode, mock).await
}

/// As [`agent_with_v1`], over the given mock.
async fn agent_with_v1_on(
    dir: &Path,
    name: &str,
    access_mode: &str,
    mock: MockPlugin,
) -> WithVolume {
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let data = dir.join("data");
    let server = mock
        .serve_unix(plugins.join("mock.sock"))
        .await
        .expect("serves");
    let mut agent = Serve::start(dir, name, &data, &fast_backoff(&plugins));
    agent.ready().await;
    eventually("fingerprinted and healthy", async || {
        plugin(&data, "mock")
            .await
            .filter(|p| p.fingerprints == 1 && p.health == "healthy")
    })
    .await;
    let _: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "mock",
            "--access-mode",
            access_mode,
        ],
    )
    .await;
    WithVolume {
        mock,
        _server: server,
        agent,
        plugins,
        data,
    }
}

/// Claims `v1` for `workload` in `mode` on the agent's own node; the target must exist.
async fn claim_v1_here(data: &Path, workload: &str, mode: &str) {
    let c: csi_agent::ops::api::ClaimView = json(
        data,
        &[
            "volume",
            "claim",
            "v1",
            "--workload",
            workload,
            "--mode",
            mode,
        ],
    )
    .await;
    let target = c.target_path.expect("published here");
    assert!(Path::new(&target).exists(), "{target}");
}

/// Releases `workload`'s claim of `v1` and waits for the release to finish.
async fn release_v1(data: &Path, workload: &str) {
    let _: VolumeView = json(
        data,
        &["volume", "release", "v1", "--workload", workload, "--wait"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_usage_survives_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let WithVolume {
        mock,
        _server,
        mut agent,
        plugins,
        data,
    } = agent_with_v1(dir.path(), "first", "multi-node-multi-writer").await;
    for w in ["w1", "w2"] {
        claim_v1_here(&data, w, "write").await;
    }
    // Staged once, published twice.
    assert_eq!(mock.calls().count(Rpc::NodeStageVolume), 1);
    assert_eq!(mock.calls().count(Rpc::NodePublishVolume), 2);
    let busy = plugin(&data, "mock").await.expect("listed");
    assert_eq!(busy.in_use, 2, "{busy:?}");

    agent.kill();
    let mut agent = Serve::start(dir.path(), "second", &data, &fast_backoff(&plugins));
    agent.ready().await;
    eventually("fingerprinted again and healthy", async || {
        plugin(&data, "mock")
            .await
            .filter(|p| p.fingerprints >= 1 && p.health == "healthy")
    })
    .await;

    // w2 still uses the volume on this node: releasing w1 must not unstage it.
    release_v1(&data, "w1").await;
    assert_eq!(ok_count(&mock, Rpc::NodeUnpublishVolume), 1);
    assert_eq!(mock.calls().count(Rpc::NodeUnstageVolume), 0);
    assert_eq!(mock.staged().len(), 1);
    release_v1(&data, "w2").await;
    assert_eq!(ok_count(&mock, Rpc::NodeUnpublishVolume), 2);
    assert_eq!(ok_count(&mock, Rpc::NodeUnstageVolume), 1);
    assert!(mock.staged().is_empty() && mock.published().is_empty());
    assert_eq!(plugin(&data, "mock").await.map(|p| p.in_use), Some(0));
    // Nothing the agent created for the volume is left under the node's data dir: no staging
    // or per-workload directory piles up per volume ever used.
    for root in ["staging", "per-workload"] {
        let dir = data.join("node").join(root);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .map(|entries| entries.map(|e| e.expect("dir entry").path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left under {}: {left:?}", dir.display());
    }
    assert_eq!(agent.terminate(), Some(0));
}

/// A data directory laid out as agents wrote it before `serve` opened csi-control's front
/// door (the claims and the usage records in `claims.redb` beside `volumes.json`, no
/// `node/plugins.json`) opens unchanged: the database moves to `node/node.redb` once, and the
/// claim taken before is still there, in use, and released as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_the_previous_layout_opens_with_its_claims() {
    let dir = tempfile::tempdir().expect("temp dir");
    let WithVolume {
        mock,
        _server,
        mut agent,
        plugins,
        data,
    } = agent_with_v1(dir.path(), "first", "single-node-writer").await;
    claim_v1_here(&data, "w1", "write").await;
    assert_eq!(agent.terminate(), Some(0));
    // The previous layout: one database beside the catalog, no registrations file.
    std::fs::rename(
        data.join("node").join("node.redb"),
        data.join("claims.redb"),
    )
    .expect("database moved back");
    let _ = std::fs::remove_file(data.join("node").join("plugins.json"));

    let mut agent = Serve::start(dir.path(), "second", &data, &fast_backoff(&plugins));
    agent.ready().await;
    assert!(
        !data.join("claims.redb").exists(),
        "moved at the first start"
    );
    assert!(data.join("node").join("node.redb").exists());
    let in_use = eventually("the claim of the old layout is in use again", async || {
        plugin(&data, "mock")
            .await
            .filter(|p| p.health == "healthy" && p.in_use == 1)
    })
    .await;
    assert_eq!(in_use.in_use, 1);
    release_v1(&data, "w1").await;
    assert!(mock.staged().is_empty() && mock.published().is_empty());
    assert_eq!(agent.terminate(), Some(0));
}

/// Nomad's host reboot under the agent: its usage records say staged and published, the
/// plugin comes back with nothing staged. At start the agent confirms the records: the
/// volume is staged again, then published again for the claim still taken, and `status`
/// says so; the release afterwards finds everything where it should be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_host_reboot_the_agent_stages_and_publishes_its_claims_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("mock-state.json");
    let mock = MockPlugin::builder()
        .state_file(&state)
        .build()
        .expect("mock");
    let WithVolume {
        _server: server,
        mut agent,
        plugins,
        data,
        ..
    } = agent_with_v1_on(dir.path(), "first", "single-node-writer", mock).await;
    claim_v1_here(&data, "w1", "write").await;

    // The host goes down: agent and plugin stop; the plugin comes back with its volumes and
    // attachments but nothing staged or published.
    agent.kill();
    server.shutdown().await.expect("mock stops");
    let mut saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).expect("mock state")).expect("json");
    saved["staged"] = serde_json::json!([]);
    saved["published"] = serde_json::json!([]);
    std::fs::write(&state, serde_json::to_vec(&saved).expect("json")).expect("written");
    let mock = MockPlugin::builder()
        .state_file(&state)
        .build()
        .expect("mock again");
    let _server = mock
        .serve_unix(plugins.join("mock.sock"))
        .await
        .expect("serves again");
    assert!(mock.staged().is_empty() && mock.published().is_empty());

    let mut agent = Serve::start(dir.path(), "second", &data, &fast_backoff(&plugins));
    agent.ready().await;
    let reconciled = eventually("the restored records are confirmed", async || {
        json::<StatusView>(&data, &["status"]).await.reconcile
    })
    .await;
    assert!(reconciled.plugins_not_ready.is_empty(), "{reconciled:?}");
    assert_eq!(reconciled.records.len(), 1, "{reconciled:?}");
    let record = &reconciled.records[0];
    assert_eq!(
        (record.volume.as_str(), record.workload.as_str()),
        ("v1", "w1")
    );
    assert_eq!(record.found, "stage done, publish done");
    assert_eq!(record.action, "republished", "{record:?}");
    assert_eq!(
        mock.calls().snapshot().without_discovery().rpcs(),
        [Rpc::NodeStageVolume, Rpc::NodePublishVolume],
        "staged again, then published"
    );
    assert_eq!((mock.staged().len(), mock.published().len()), (1, 1));
    let table = cli(&data, &["status"]).await.expect("status runs");
    assert!(
        table.contains("RESTORED NODE RECORDS") && table.contains("republished"),
        "{table}"
    );
    assert!(
        agent
            .log()
            .contains("usage records restored at start confirmed"),
        "{}",
        agent.log()
    );

    release_v1(&data, "w1").await;
    assert!(mock.staged().is_empty() && mock.published().is_empty());
    assert_eq!(agent.terminate(), Some(0));
}

/// One staging path per volume on a node (CSI spec, `NodeStageVolume`): a read claim and a
/// write claim of one volume stage it once, at `<data>/node/staging/<volume>`, and both
/// publications use that path; the stage outlives the first release and goes with the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_and_a_write_claim_share_one_staging() {
    let dir = tempfile::tempdir().expect("temp dir");
    let WithVolume {
        mock,
        _server,
        mut agent,
        data,
        ..
    } = agent_with_v1(dir.path(), "agent", "multi-node-single-writer").await;
    for (workload, mode) in [("reader", "read"), ("writer", "write")] {
        claim_v1_here(&data, workload, mode).await;
    }
    let staging = data.join("node").join("staging").join("v1");
    assert_eq!(mock.calls().count(Rpc::NodeStageVolume), 1, "staged once");
    assert_eq!(
        mock.calls().count(Rpc::NodePublishVolume),
        2,
        "published twice"
    );
    let staged = mock.staged();
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert_eq!(staged[0].path, staging, "the volume's one staging path");
    // Both publications name that staging path (the mock records requests by Debug).
    let wanted = format!("staging_target_path: {:?}", staging.display().to_string());
    for publish in mock.calls().of(Rpc::NodePublishVolume).records() {
        assert!(publish.request.contains(&wanted), "{}", publish.request);
    }

    // The reader's publication is read-only, the writer's is not.
    let readonly: Vec<bool> = mock
        .calls()
        .of(Rpc::NodePublishVolume)
        .records()
        .iter()
        .map(|p| p.request.contains("readonly: true"))
        .collect();
    assert_eq!(readonly, [true, false], "reader first, then writer");

    // The writer still uses the volume here: releasing the reader keeps the stage.
    release_v1(&data, "reader").await;
    assert_eq!(ok_count(&mock, Rpc::NodeUnpublishVolume), 1);
    assert_eq!(mock.calls().count(Rpc::NodeUnstageVolume), 0);
    assert_eq!(mock.staged().len(), 1);
    assert_eq!(mock.published().len(), 1);

    // The last publication goes: now it is unstaged, once, from that path.
    release_v1(&data, "writer").await;
    assert_eq!(ok_count(&mock, Rpc::NodeUnpublishVolume), 2);
    assert_eq!(ok_count(&mock, Rpc::NodeUnstageVolume), 1);
    assert!(mock.staged().is_empty() && mock.published().is_empty());
    assert!(!staging.exists(), "the staging directory is removed");
    assert_eq!(agent.terminate(), Some(0));
}

/// The CSI spec: `ControllerPublishVolume.readonly` must be false unless the plugin has
/// PUBLISH_READONLY; a read-only volume is then read-only where the node publishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_goes_to_the_controller_only_with_publish_readonly() {
    use csi_testkit::capabilities::{CONTROLLER_IMPLEMENTED, ControllerCapability};

    let dir = tempfile::tempdir().expect("temp dir");
    let without = CONTROLLER_IMPLEMENTED
        .iter()
        .copied()
        .filter(|c| *c != ControllerCapability::PublishReadonly);
    let mock = MockPlugin::builder()
        .controller_capabilities(without)
        .build()
        .expect("mock");
    let WithVolume {
        mock,
        _server,
        mut agent,
        data,
        ..
    } = agent_with_v1_on(dir.path(), "agent", "multi-node-reader-only", mock).await;
    claim_v1_here(&data, "reader", "read").await;
    let attach = mock.calls().of(Rpc::ControllerPublishVolume);
    let attach = attach.records();
    assert_eq!(attach.len(), 1);
    assert!(
        attach[0].request.contains("readonly: false"),
        "{}",
        attach[0].request
    );
    let publish = mock.calls().of(Rpc::NodePublishVolume);
    let publish = publish.records();
    assert_eq!(publish.len(), 1);
    assert!(
        publish[0].request.contains("readonly: true"),
        "{}",
        publish[0].request
    );
    release_v1(&data, "reader").await;
    assert_eq!(agent.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_publish_is_recorded_and_cleaned_up_by_its_release() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let data = dir.path().join("data");
    let mock = MockPlugin::builder().build().expect("mock");
    let _server = mock
        .serve_unix(plugins.join("mock.sock"))
        .await
        .expect("serves");
    let mut args = fast_backoff(&plugins);
    args.extend(["--call-timeout".to_owned(), "2s".to_owned()]);
    let mut agent = Serve::start(dir.path(), "agent", &data, &args);
    agent.ready().await;
    eventually("fingerprinted and healthy", async || {
        plugin(&data, "mock")
            .await
            .filter(|p| p.fingerprints == 1 && p.health == "healthy")
    })
    .await;
    let _: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    // NodePublishVolume never answers within the call deadline: the publish may have
    // happened. Unpublishing fails for a while, so the uncertain record stays visible.
    mock.faults().on(Rpc::NodePublishVolume).hang().install();
    mock.faults()
        .on(Rpc::NodeUnpublishVolume)
        .fail_times(10_000, csi_client::Code::Unavailable, "busy")
        .install();
    let err = cli(&data, &["volume", "claim", "v1", "--workload", "w1"])
        .await
        .expect_err("the claim fails");
    assert!(
        err.contains("NodePublishVolume") && err.contains("uncertain"),
        "{err}"
    );
    let recorded = eventually("the uncertain publish is listed", async || {
        let s: StatusView = json(&data, &["status"]).await;
        s.uncertain
            .into_iter()
            .find(|u| u.volume == "v1" && u.workload == "w1" && u.step == "publish")
    })
    .await;
    assert!(
        recorded.path.ends_with("rw-mount-single-node-writer"),
        "{recorded:?}"
    );
    mock.faults().clear();
    // The agent released the claim at once; the release undoes the publish, stage and attach.
    eventually("the failed claim is released", async || {
        let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
        v.claims.is_empty().then_some(())
    })
    .await;
    let s: StatusView = json(&data, &["status"]).await;
    assert!(s.uncertain.is_empty(), "{s:?}");
    assert!(mock.published().is_empty() && mock.staged().is_empty());
    assert_eq!(ok_count(&mock, Rpc::NodeUnstageVolume), 1);
    assert_eq!(ok_count(&mock, Rpc::ControllerUnpublishVolume), 1);
    assert_eq!(agent.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_claim_in_flight_finish() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let data = dir.path().join("data");
    let mock = MockPlugin::builder().build().expect("mock");
    let _server = mock
        .serve_unix(plugins.join("mock.sock"))
        .await
        .expect("serves");
    let args = fast_backoff(&plugins);
    let mut agent = Serve::start(dir.path(), "first", &data, &args);
    agent.ready().await;
    eventually("fingerprinted and healthy", async || {
        plugin(&data, "mock")
            .await
            .filter(|p| p.fingerprints == 1 && p.health == "healthy")
    })
    .await;
    let _: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    // Keep NodePublishVolume busy so the stop signal arrives while the claim is in flight.
    mock.faults()
        .on(Rpc::NodePublishVolume)
        .then_delay(Duration::from_secs(2))
        .install();
    let claim_data = data.clone();
    let claim = tokio::spawn(async move {
        cli(
            &claim_data,
            &["volume", "claim", "v1", "--workload", "w1", "--json"],
        )
        .await
    });
    mock.calls()
        .wait_for(GUARD, |c| c.count(Rpc::NodePublishVolume) == 1)
        .await
        .expect("the publish is in flight");
    assert_eq!(agent.terminate(), Some(0), "{}", agent.log());
    let out = claim
        .await
        .expect("the claim task does not panic")
        .expect("the claim in flight finished before the agent stopped");
    let view: csi_agent::ops::api::ClaimView = serde_json::from_str(&out).expect("claim JSON");
    assert_eq!(view.state, "taken");
    assert_eq!(ok_count(&mock, Rpc::NodePublishVolume), 1);

    let mut agent = Serve::start(dir.path(), "second", &data, &args);
    agent.ready().await;
    let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
    assert_eq!(v.claims.len(), 1);
    assert_eq!(v.claims[0].state, "taken");
    assert!(v.claims[0].target_path.is_some(), "{v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_an_existing_volume_and_read_the_tables() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let data = dir.path().join("data");
    let mock = MockPlugin::builder()
        .volume("pre-1", 1 << 20)
        .build()
        .expect("mock with a volume");
    let _server = mock
        .serve_unix(plugins.join("mock.sock"))
        .await
        .expect("serves");
    let mut agent = Serve::start(dir.path(), "agent", &data, &fast_backoff(&plugins));
    agent.ready().await;
    eventually("fingerprinted and healthy", async || {
        plugin(&data, "mock").await.filter(|p| p.fingerprints == 1)
    })
    .await;

    // The control API wants the token from the data dir; the peer endpoint the cluster token.
    let token = std::fs::read_to_string(data.join("control.token")).expect("token written");
    assert!(raw_get(&data, "/v1/status", None).starts_with("HTTP/1.1 401"));
    assert!(
        raw_get(&data, "/v1/status", Some("wrong-token-0123456789")).starts_with("HTTP/1.1 401")
    );
    assert!(raw_get(&data, "/v1/status", Some(token.trim())).starts_with("HTTP/1.1 200"));
    assert!(raw_get(&data, "/peer/v1/plugins", Some(token.trim())).starts_with("HTTP/1.1 401"));

    let list = cli(&data, &["plugin", "list"]).await.expect("plugin list");
    assert!(list.starts_with("PLUGIN "), "{list}");
    assert!(
        list.lines()
            .any(|l| l.starts_with("mock ") && l.contains("healthy")),
        "{list}"
    );
    let info = cli(&data, &["plugin", "info", "mock"])
        .await
        .expect("plugin info");
    assert!(
        info.lines()
            .any(|l| l.starts_with("controller publish") && l.ends_with("yes")),
        "{info}"
    );
    // What the plugin advertises, in the spec's names.
    let advertises = info.lines().find(|l| l.starts_with("advertises"));
    assert!(
        advertises.is_some_and(|l| l.contains("controller:CREATE_DELETE_VOLUME")
            && l.contains("node:STAGE_UNSTAGE_VOLUME")),
        "{info}"
    );
    let missing = cli(&data, &["plugin", "info", "nope"])
        .await
        .expect_err("unknown plugin");
    assert!(missing.contains("no plugin"), "{missing}");
    // A mistyped plugin in a create is the operator's mistake, named with the known plugins.
    let typo = cli(&data, &["volume", "create", "typo", "--plugin", "mokc"])
        .await
        .expect_err("unknown plugin");
    assert!(typo.contains("known plugins: mock"), "{typo}");
    assert!(!typo.contains("(class retry)"), "{typo}");

    let bad = cli(
        &data,
        &[
            "volume",
            "register",
            "pre",
            "--external-id",
            "pre-1",
            "--plugin",
            "mock",
            "--access-mode",
            "sometimes",
        ],
    )
    .await
    .expect_err("a bad access mode is refused");
    assert!(bad.contains("access_mode"), "{bad}");
    // An id that needs escaping in a URL travels intact (and is refused by the plugin).
    let odd = cli(
        &data,
        &[
            "volume",
            "register",
            "a b?c#d",
            "--external-id",
            "x y",
            "--plugin",
            "mock",
        ],
    )
    .await
    .expect_err("the plugin knows no such volume");
    assert!(odd.contains("ValidateVolumeCapabilities"), "{odd}");
    let missing = cli(&data, &["volume", "status", "a b?c#d"])
        .await
        .expect_err("unknown");
    assert!(missing.contains("no volume \"a b?c#d\""), "{missing}");
    // With --json, a failure is the API's error JSON on stdout, and the exit code is 1.
    let (code, error) = failed_json(&data, &["volume", "status", "a b?c#d"]);
    assert_eq!((code, error.kind.as_str()), (Some(1), "not_found"));
    assert!(error.error.contains("no volume"), "{error:?}");
    let nowhere = dir.path().join("no-agent-here");
    let (code, error) = failed_json(&nowhere, &["status"]);
    assert_eq!(
        (code, error.kind.as_str()),
        (Some(1), "no_agent"),
        "{error:?}"
    );
    let registered = cli(
        &data,
        &[
            "volume",
            "register",
            "pre",
            "--external-id",
            "pre-1",
            "--plugin",
            "mock",
        ],
    )
    .await
    .expect("register");
    assert!(registered.contains("external id pre-1"), "{registered}");
    let again = cli(
        &data,
        &[
            "volume",
            "register",
            "pre",
            "--external-id",
            "pre-1",
            "--plugin",
            "mock",
        ],
    )
    .await
    .expect_err("the id is taken");
    assert!(again.contains("already registered"), "{again}");
    assert_eq!(mock.calls().count(Rpc::ValidateVolumeCapabilities), 2);
    let ghost = cli(
        &data,
        &[
            "volume",
            "register",
            "ghost",
            "--external-id",
            "no-such-volume",
            "--plugin",
            "mock",
        ],
    )
    .await
    .expect_err("the plugin does not know the volume");
    assert!(ghost.contains("ValidateVolumeCapabilities"), "{ghost}");

    let escape = cli(&data, &["volume", "claim", "pre", "--workload", ".."])
        .await
        .expect_err("a workload id that would escape its directory is refused");
    assert!(escape.contains("`workload`"), "{escape}");
    let claimed = cli(&data, &["volume", "claim", "pre", "--workload", "web"])
        .await
        .expect("claim");
    assert!(
        claimed
            .lines()
            .any(|l| l.starts_with("pre ") && l.contains("taken")),
        "{claimed}"
    );
    let refused = cli(&data, &["volume", "delete", "pre"])
        .await
        .expect_err("a claimed volume is not deleted");
    assert!(refused.contains("claim"), "{refused}");
    let all = cli(&data, &["volume", "status"])
        .await
        .expect("volume status");
    assert!(
        all.lines()
            .any(|l| l.starts_with("pre ") && l.contains("pre-1")),
        "{all}"
    );

    let _ = cli(
        &data,
        &["volume", "release", "pre", "--workload", "web", "--wait"],
    )
    .await
    .expect("release");
    let deleted = cli(&data, &["volume", "delete", "pre"])
        .await
        .expect("delete");
    assert!(deleted.contains("deleted volume pre"), "{deleted}");
    // Registered, not created: deleting it forgets it but leaves it in the plugin.
    assert_eq!(mock.calls().count(Rpc::DeleteVolume), 0);
    assert_eq!(mock.volumes().len(), 1);
    assert_eq!(agent.terminate(), Some(0));
}

/// A socket nobody listens on is said in words, before the fingerprint's wait for it ends;
/// a plain file with a socket's name is named in `status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_socket_and_a_file_in_the_plugin_directory_are_reported() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    drop(std::os::unix::net::UnixListener::bind(plugins.join("dead.sock")).expect("binds"));
    std::fs::write(plugins.join("stale.sock"), b"").expect("a plain file");
    let data = dir.path().join("data");
    let mut agent = Serve::start(dir.path(), "agent", &data, &fast_backoff(&plugins));
    agent.ready().await;
    let said = eventually("the dead socket's error", async || {
        plugin(&data, "dead").await.and_then(|p| p.last_error)
    })
    .await;
    assert!(
        said.contains("refused") && !said.contains("after waiting"),
        "{said}"
    );
    let status: StatusView = json(&data, &["status"]).await;
    let stale = plugins.join("stale.sock").display().to_string();
    assert!(
        status
            .ignored_plugin_files
            .iter()
            .any(|l| l.starts_with(&stale) && l.contains("not a socket")),
        "{:?}",
        status.ignored_plugin_files
    );
    let table = cli(&data, &["status"]).await.expect("status");
    assert!(table.contains("IGNORED IN THE PLUGIN DIRECTORY"), "{table}");
    assert_eq!(agent.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_create_is_undone_before_the_answer() {
    let mock = MockPlugin::builder().build().expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();

    // INTERNAL on CreateVolume: the volume may or may not exist.
    mock.faults()
        .on(Rpc::CreateVolume)
        .fail(csi_client::Code::Internal, "scripted: backend timed out")
        .install();
    let failed = cli(&data, &["volume", "create", "v1", "--plugin", "mock"])
        .await
        .expect_err("the create was uncertain");
    assert!(
        failed.contains("undone: CreateVolume again by name gave volume"),
        "{failed}"
    );
    assert!(mock.volumes().is_empty(), "nothing left behind");
    assert_eq!(mock.calls().count(Rpc::CreateVolume), 2);
    assert_eq!(ok_count(&mock, Rpc::DeleteVolume), 1);
    assert!(
        one.agent
            .log()
            .contains("CreateVolume's outcome is uncertain"),
        "recorded in the log: {}",
        one.agent.log()
    );
    let volumes: Vec<VolumeView> = json(&data, &["volume", "status"]).await;
    assert!(volumes.is_empty(), "nothing registered: {volumes:?}");

    // Undone, creating again is safe.
    let v: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    assert_eq!(mock.volumes().len(), 1);
    assert_eq!(v.id, "v1");
}

/// A `POST` of `body_len` bytes to `path` on the agent's control address, the body sent in two
/// halves with a pause between: the answer as read, or why the exchange failed.
fn raw_post_in_two_parts(
    data: &Path,
    path: &str,
    token: Option<&str>,
    body_len: usize,
) -> Result<String, String> {
    use std::io::{Read as _, Write as _};
    let (mut s, head) = control_request(data, "POST", path, token);
    write!(
        s,
        "{head}content-type: application/json\r\ncontent-length: {body_len}\r\n\r\n"
    )
    .map_err(|e| format!("headers: {e}"))?;
    // More than the agent reads with the headers: unread bytes wait in its socket.
    let first = body_len / 2;
    s.write_all(&vec![b' '; first])
        .map_err(|e| format!("first part: {e}"))?;
    // Time for an agent that answers without reading the body to answer and close.
    std::thread::sleep(Duration::from_millis(200));
    s.write_all(&vec![b' '; body_len - first])
        .map_err(|e| format!("second part: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("answer: {e}"))?;
    Ok(out)
}

/// Found by campaign `api` (seeds 10 and 12): a request refused before its body was read (a
/// broken percent escape in the path) got no answer. The agent closed the connection with the
/// body unread, which resets it, and the client's write of the rest of its body failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_before_its_body_is_read_still_gets_its_answer() {
    let mock = MockPlugin::builder().build().expect("mock");
    let one = one_agent(&mock).await;
    let token = std::fs::read_to_string(one.data.join("control.token")).expect("token written");
    let token = token.trim().to_owned();
    for (path, token, status) in [
        ("/v1/volumes/%zz/claim", Some(token.clone()), "400"),
        ("/v1/volumes/v1/claim", None, "401"),
        ("/v1/nowhere", Some(token.clone()), "404"),
    ] {
        let data = one.data.clone();
        let answer = tokio::task::spawn_blocking(move || {
            raw_post_in_two_parts(
                &data,
                path,
                token.as_deref(),
                csi_agent::serve::http::MAX_BODY_BYTES,
            )
        })
        .await
        .expect("the client thread");
        let answer = answer.unwrap_or_else(|e| panic!("POST {path}: no answer: {e}"));
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "POST {path}: {answer}"
        );
    }
}
