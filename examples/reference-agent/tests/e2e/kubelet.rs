//! `serve --kubelet-registration-dir`: a CSI driver announced the way a Kubernetes node
//! DaemonSet's node-driver-registrar announces it (kubelet's plugin registration protocol,
//! played here by csi-testkit's registrar) is registered, fingerprinted and used; it goes when
//! its registration socket goes.

use csi_agent::ops::api::{ClaimView, PluginView, VolumeView};
use csi_testkit::MockPlugin;
use csi_testkit::registrar::Registrar;

use crate::serve::{Serve, eventually, fast_backoff, json};

/// An agent on `data` (its plugin directory `<dir>/plugins`) watching `registry`, once the
/// driver named `driver` is fingerprinted and healthy; with that driver's view.
async fn watching_registry(
    dir: &std::path::Path,
    data: &std::path::Path,
    registry: &std::path::Path,
    driver: &str,
) -> (Serve, PluginView) {
    let mut args = fast_backoff(&dir.join("plugins"));
    args.extend([
        "--kubelet-registration-dir".to_owned(),
        registry.display().to_string(),
    ]);
    let mut agent = Serve::start(dir, "agent", data, &args);
    agent.ready().await;
    let healthy = eventually(
        &format!("{driver} is fingerprinted and healthy"),
        async || {
            let list: Vec<PluginView> = json(data, &["plugin", "list"]).await;
            list.into_iter()
                .find(|p| p.id == driver && p.health == "healthy")
        },
    )
    .await;
    (agent, healthy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_announced_in_kubelet_s_registration_directory_is_registered_and_used() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    let registry = dir.path().join("plugins_registry");
    let driver = dir.path().join("driver");
    for d in [&plugins, &registry, &driver] {
        std::fs::create_dir_all(d).expect("dir");
    }
    // The driver's CSI socket is where the registrar says, not in the agent's plugin dir.
    let mock = MockPlugin::builder().build().expect("mock");
    let csi_socket = driver.join("csi.sock");
    let _server = mock.serve_unix(&csi_socket).await.expect("serves");
    let registrar = Registrar::csi("ebs.csi.example.com", &csi_socket, &["1.0.0"]);
    let reg_socket = registry.join("ebs.csi.example.com-reg.sock");
    let serving = registrar.serve(&reg_socket).expect("registrar serves");

    let data = dir.path().join("data");
    let (agent, healthy) =
        watching_registry(dir.path(), &data, &registry, "ebs.csi.example.com").await;
    assert_eq!(
        healthy.socket.as_deref(),
        Some(csi_socket.to_str().expect("utf-8"))
    );
    assert!(
        registrar.told().iter().any(|s| s.plugin_registered),
        "{:?}",
        registrar.told()
    );
    // Used like any plugin.
    let _: VolumeView = json(
        &data,
        &["volume", "create", "v1", "--plugin", "ebs.csi.example.com"],
    )
    .await;
    let claim: ClaimView = json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    assert_eq!(claim.state, "taken");

    // The sidecar goes, and its socket with it: the plugin is deregistered.
    drop(serving);
    std::fs::remove_file(&reg_socket).expect("socket removed");
    eventually("the driver is deregistered", async || {
        let list: Vec<PluginView> = json(&data, &["plugin", "list"]).await;
        (!list.iter().any(|p| p.id == "ebs.csi.example.com")).then_some(())
    })
    .await;
    assert!(
        agent
            .log()
            .contains("plugin registered through its kubelet registration socket"),
        "{}",
        agent.log()
    );
}

/// The agent keeps its registrations across a restart, but a driver whose registration
/// socket went while the agent was down is not registered again from that record: only
/// what kubelet's registration directory still announces is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_gone_from_kubelet_s_directory_while_the_agent_was_down_is_not_kept() {
    let dir = tempfile::tempdir().expect("temp dir");
    let registry = dir.path().join("plugins_registry");
    let driver = dir.path().join("driver");
    for d in [&dir.path().join("plugins"), &registry, &driver] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let mock = MockPlugin::builder().build().expect("mock");
    let csi_socket = driver.join("csi.sock");
    let _server = mock.serve_unix(&csi_socket).await.expect("serves");
    let registrar = Registrar::csi("ebs.csi.example.com", &csi_socket, &["1.0.0"]);
    let reg_socket = registry.join("ebs.csi.example.com-reg.sock");
    let serving = registrar.serve(&reg_socket).expect("registrar serves");
    let data = dir.path().join("data");
    let (mut agent, _) =
        watching_registry(dir.path(), &data, &registry, "ebs.csi.example.com").await;
    assert_eq!(agent.terminate(), Some(0));

    // While the agent is down the sidecar goes; the driver's CSI socket still answers.
    drop(serving);
    std::fs::remove_file(&reg_socket).expect("socket removed");
    let mut args = fast_backoff(&dir.path().join("plugins"));
    args.extend([
        "--kubelet-registration-dir".to_owned(),
        registry.display().to_string(),
    ]);
    let mut agent = Serve::start(dir.path(), "again", &data, &args);
    agent.ready().await;
    let list: Vec<PluginView> = json(&data, &["plugin", "list"]).await;
    assert!(
        !list.iter().any(|p| p.id == "ebs.csi.example.com"),
        "{list:?}"
    );
    assert_eq!(agent.terminate(), Some(0));
}

/// The real kubernetes-csi node-driver-registrar, when it is there: its path in
/// `CSI_NODE_DRIVER_REGISTRAR`, or `node-driver-registrar` on the `PATH`.
fn real_registrar() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("CSI_NODE_DRIVER_REGISTRAR") {
        return Some(path.into());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("node-driver-registrar"))
            .find(|p| p.is_file())
    })
}

/// The registrar process, killed when dropped.
struct Sidecar(std::process::Child);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The same flow with the real node-driver-registrar (built from kubernetes-csi's sources as
/// the README says). Without the binary it says it skipped and passes: `.ci/run` prints whether
/// the binary was there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_node_driver_registrar_registers_its_driver() {
    let Some(binary) = real_registrar() else {
        eprintln!(
            "skipped: node-driver-registrar not found (set CSI_NODE_DRIVER_REGISTRAR or put it \
             on the PATH; the README says how to build it)"
        );
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    let registry = dir.path().join("plugins_registry");
    for d in [&plugins, &registry] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let mock = MockPlugin::builder()
        .name("hostpath.csi.example.com", "1.0.0")
        .build()
        .expect("mock");
    let csi_socket = dir.path().join("csi.sock");
    let _server = mock.serve_unix(&csi_socket).await.expect("serves");
    let log = std::fs::File::create(dir.path().join("registrar.log")).expect("log");
    let sidecar = Sidecar(
        std::process::Command::new(&binary)
            .arg(format!("--csi-address={}", csi_socket.display()))
            .arg(format!(
                "--kubelet-registration-path={}",
                csi_socket.display()
            ))
            .arg(format!("--plugin-registration-path={}", registry.display()))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("node-driver-registrar starts"),
    );

    let data = dir.path().join("data");
    let (_agent, _) =
        watching_registry(dir.path(), &data, &registry, "hostpath.csi.example.com").await;
    let _: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "hostpath.csi.example.com",
        ],
    )
    .await;

    // The sidecar stops; its socket goes (removed here if it left it): so does the plugin.
    drop(sidecar);
    for entry in std::fs::read_dir(&registry).expect("registry") {
        let _ = std::fs::remove_file(entry.expect("entry").path());
    }
    eventually("the driver is deregistered", async || {
        let list: Vec<PluginView> = json(&data, &["plugin", "list"]).await;
        (!list.iter().any(|p| p.id == "hostpath.csi.example.com")).then_some(())
    })
    .await;
}
