//! What the integration tests share: the mock plugin on a unix socket, registered with a
//! plugin manager and fingerprinted.

// Each test binary uses its own part of it.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use csi_client::Endpoint;
use csi_node::layout::Layout;
use csi_node::plugins::{PluginManager, PluginManagerConfig};
use csi_node::volumes::VolumeManager;
use csi_structs::PluginId;
use csi_testkit::{MockPlugin, MockServer};

/// Only a guard against a hang: a healthy run needs a fraction of it.
pub const GUARD: Duration = Duration::from_secs(60);

/// The mock plugin `mock`, serving, registered and fingerprinted.
pub struct Plugin {
    /// Holds the socket and every data directory of the test.
    pub dir: tempfile::TempDir,
    pub mock: MockPlugin,
    /// `None` once a test stopped it.
    pub server: Option<MockServer>,
    pub plugins: PluginManager,
    pub id: PluginId,
}

pub async fn mock_plugin() -> Plugin {
    let dir = tempfile::tempdir().expect("temp dir");
    let mock = MockPlugin::builder().build().expect("mock");
    let socket = dir.path().join("mock.sock");
    let server = mock.serve_unix(&socket).await.expect("serves");
    let plugins = PluginManager::builder(PluginManagerConfig::default())
        .start()
        .expect("starts");
    let id = PluginId::new("mock").expect("id");
    plugins
        .register(id.clone(), Endpoint::unix(&socket).expect("endpoint"))
        .expect("registered");
    plugins
        .wait_for(&id, tokio::time::Instant::now() + GUARD)
        .await
        .expect("fingerprinted (hang guard)");
    Plugin {
        dir,
        mock,
        server: Some(server),
        plugins,
        id,
    }
}

impl Plugin {
    /// A volume manager with its paths and usage file under `<dir>/<name>` (opening it
    /// again later restores its records).
    pub fn volumes(&self, name: &str) -> VolumeManager {
        let root = self.dir.path().join(name);
        VolumeManager::open(
            Layout::new(&root),
            root.join("usage.json"),
            Arc::new(self.plugins.clone()),
        )
        .expect("opens")
    }
}
