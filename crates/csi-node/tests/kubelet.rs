//! Kubelet's plugin registration protocol: a registrar written here (what a
//! node-driver-registrar sidecar serves) announces the mock plugin in a registration
//! directory; the watcher registers it with the plugin manager, says so, and deregisters it
//! when the registrar's socket goes.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_node::kubelet::{Registration, RegistrationWatcher};
use csi_node::plugins::{PluginManager, PluginManagerConfig};
use csi_proto::pluginregistration::PluginInfo;
use csi_structs::PluginId;
use csi_testkit::registrar::{Registrar, Serving};
use csi_testkit::{MockPlugin, MockServer};
use support::GUARD;

/// A registrar announcing a plugin of type `kind`.
fn registrar(kind: &str, name: &str, endpoint: &Path, versions: &[&str]) -> Registrar {
    Registrar::new(PluginInfo {
        r#type: kind.to_owned(),
        name: name.to_owned(),
        endpoint: endpoint.display().to_string(),
        supported_versions: versions.iter().map(|v| (*v).to_owned()).collect(),
    })
}

fn serve(r: &Registrar, socket: &Path) -> Serving {
    r.serve(socket).expect("registrar serves")
}

struct Node {
    dir: tempfile::TempDir,
    registry: PathBuf,
    csi_socket: PathBuf,
    _server: MockServer,
    manager: PluginManager,
    watcher: RegistrationWatcher,
}

async fn node() -> Node {
    let dir = tempfile::tempdir().expect("dir");
    let registry = dir.path().join("plugins_registry");
    std::fs::create_dir(&registry).expect("registry dir");
    let csi_socket = dir.path().join("csi.sock");
    let mock = MockPlugin::builder().build().expect("mock");
    let server = mock.serve_unix(&csi_socket).await.expect("serves");
    let manager = PluginManager::builder(PluginManagerConfig::default())
        .start()
        .expect("starts");
    let watcher =
        RegistrationWatcher::new(manager.clone(), &registry).call_timeout(Duration::from_secs(10));
    Node {
        dir,
        registry,
        csi_socket,
        _server: server,
        manager,
        watcher,
    }
}

fn mock_id() -> PluginId {
    PluginId::new("mock.csi.example.com").expect("id")
}

#[tokio::test]
async fn a_driver_announced_at_start_is_registered_told_and_deregistered_when_its_socket_goes() {
    let n = node().await;
    let registrar = Registrar::csi(mock_id().as_str(), &n.csi_socket, &["1.0.0"]);
    let socket = n.registry.join("mock.csi.example.com-reg.sock");
    let stop = serve(&registrar, &socket);
    // A socket whose name starts with a dot is never dialled.
    let hidden = Registrar::csi("hidden", &n.csi_socket, &["1.0.0"]);
    let _hidden = serve(&hidden, &n.registry.join(".hidden-reg.sock"));

    let found = n.watcher.scan().await;
    assert_eq!(
        found,
        vec![Registration::Registered {
            socket: socket.clone(),
            plugin: mock_id(),
            endpoint: n.csi_socket.clone(),
        }]
    );
    let told = registrar.told();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].plugin_registered && told[0].error.is_empty(),
        "{told:?}"
    );
    assert_eq!(hidden.asked(), 0);
    // Registered at the endpoint it gave: fingerprinted and health-checked like any plugin.
    let ready = n
        .manager
        .wait_for(&mock_id(), tokio::time::Instant::now() + GUARD)
        .await
        .expect("fingerprinted and healthy (hang guard)");
    assert_eq!(ready.plugin, mock_id());

    // Nothing new: nothing dialled again.
    assert!(n.watcher.scan().await.is_empty());
    assert_eq!(registrar.asked(), 1);

    // The registrar stops and its socket goes: the plugin goes with it.
    drop(stop);
    std::fs::remove_file(&socket).expect("socket removed");
    let found = n.watcher.scan().await;
    assert_eq!(
        found,
        vec![Registration::Gone {
            socket,
            plugin: Some(mock_id()),
        }]
    );
    assert!(n.manager.get(&mock_id()).is_none());
    assert!(n.manager.list().is_empty());
}

#[tokio::test]
async fn a_refused_announcement_is_told_why_naming_the_field_and_not_tried_again() {
    let n = node().await;
    let plain_file = n.dir.path().join("not-a-socket");
    std::fs::write(&plain_file, "").expect("file");
    let cases = [
        (
            "device",
            registrar("DevicePlugin", "gpu", &n.csi_socket, &["1.0.0"]),
            "type",
        ),
        (
            "old",
            Registrar::csi("old", &n.csi_socket, &["0.3.0"]),
            "supported_versions",
        ),
        (
            "nowhere",
            Registrar::csi("nowhere", &plain_file, &["1.0.0"]),
            "endpoint",
        ),
    ];
    let mut stops = Vec::new();
    for (name, registrar, _) in &cases {
        stops.push(serve(
            registrar,
            &n.registry.join(format!("{name}-reg.sock")),
        ));
    }
    let found = n.watcher.scan().await;
    assert_eq!(found.len(), 3, "{found:?}");
    for (name, registrar, field) in &cases {
        let refused = found.iter().find(|r| {
            matches!(r, Registration::Refused { socket, .. }
                if socket.file_name().is_some_and(|f| f.to_string_lossy().starts_with(name)))
        });
        assert!(
            matches!(refused, Some(Registration::Refused { field: f, .. }) if f == field),
            "{name}: {found:?}"
        );
        let told = registrar.told();
        assert_eq!(told.len(), 1, "{name}: {told:?}");
        assert!(!told[0].plugin_registered, "{name}: {told:?}");
        assert!(told[0].error.contains(field), "{name}: {told:?}");
    }
    assert!(n.manager.list().is_empty(), "nothing registered");
    // Not dialled again until the socket is made anew.
    assert!(n.watcher.scan().await.is_empty());
    assert!(cases.iter().all(|(_, r, _)| r.asked() == 1));
}

#[tokio::test]
async fn the_watcher_picks_up_a_driver_announced_while_it_runs() {
    let n = node().await;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = Arc::new(n.watcher);
    let running = {
        let watcher = Arc::clone(&watcher);
        tokio::spawn(async move {
            watcher
                .run(Duration::from_millis(50), async {
                    let _ = stop_rx.await;
                })
                .await;
        })
    };
    let registrar = Registrar::csi(mock_id().as_str(), &n.csi_socket, &["v1.0.0"]);
    let _serving = serve(&registrar, &n.registry.join("late-reg.sock"));
    n.manager
        .wait_for(&mock_id(), tokio::time::Instant::now() + GUARD)
        .await
        .expect("registered while running (hang guard)");
    assert!(registrar.told().iter().any(|s| s.plugin_registered));
    drop(stop_tx);
    tokio::time::timeout(GUARD, running)
        .await
        .expect("stops (hang guard)")
        .expect("no panic");
}
