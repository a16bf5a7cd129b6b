//! Helpers shared by the integration tests: a tiny Identity server that records what the
//! client sends (`:authority`, `grpc-timeout`), and bounded polling.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use csi_client::proto;
use csi_client::proto::identity_server::{Identity, IdentityServer};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What the tiny server saw, per request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Seen {
    pub(crate) authorities: Arc<Mutex<Vec<String>>>,
    pub(crate) timeouts: Arc<Mutex<Vec<Option<String>>>>,
}

#[derive(Clone)]
pub(crate) struct Record<S> {
    inner: S,
    seen: Seen,
}

impl<S, B> tower::Service<http::Request<B>> for Record<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let authority = req
            .uri()
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default();
        self.seen.authorities.lock().unwrap().push(authority);
        let timeout = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.seen.timeouts.lock().unwrap().push(timeout);
        self.inner.call(req)
    }
}

#[derive(Debug)]
pub(crate) struct Tiny {
    pub(crate) name: String,
}

#[tonic::async_trait]
impl Identity for Tiny {
    async fn get_plugin_info(
        &self,
        _: tonic::Request<proto::GetPluginInfoRequest>,
    ) -> Result<tonic::Response<proto::GetPluginInfoResponse>, tonic::Status> {
        Ok(tonic::Response::new(proto::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "0.0.1".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: tonic::Request<proto::GetPluginCapabilitiesRequest>,
    ) -> Result<tonic::Response<proto::GetPluginCapabilitiesResponse>, tonic::Status> {
        Ok(tonic::Response::new(Default::default()))
    }

    async fn probe(
        &self,
        _: tonic::Request<proto::ProbeRequest>,
    ) -> Result<tonic::Response<proto::ProbeResponse>, tonic::Status> {
        Ok(tonic::Response::new(proto::ProbeResponse { ready: None }))
    }
}

/// A running tiny server; stops (and removes its socket) on drop.
pub(crate) struct TinyServer {
    pub(crate) seen: Seen,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TinyServer {
    pub(crate) fn start(path: &Path) -> TinyServer {
        Self::start_named(path, "tiny.example.com")
    }

    /// A tiny server whose GetPluginInfo answers `name` (possibly invalid).
    pub(crate) fn start_named(path: &Path, name: &str) -> TinyServer {
        let name = name.to_owned();
        let listener = UnixListener::bind(path).expect("test invariant: the socket path is fresh");
        let seen = Seen::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let layer_seen = seen.clone();
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .layer(tower::layer::layer_fn(move |inner| Record {
                    inner,
                    seen: layer_seen.clone(),
                }))
                .add_service(IdentityServer::new(Tiny { name }))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                )
                .await;
        });
        TinyServer {
            seen,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The tiny server on a TCP listener (a plugin behind a local proxy).
    pub(crate) fn start_tcp(listener: tokio::net::TcpListener) -> TinyServer {
        let seen = Seen::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let layer_seen = seen.clone();
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .layer(tower::layer::layer_fn(move |inner| Record {
                    inner,
                    seen: layer_seen.clone(),
                }))
                .add_service(IdentityServer::new(Tiny {
                    name: "tiny.example.com".into(),
                }))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                )
                .await;
        });
        TinyServer {
            seen,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub(crate) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

impl Drop for TinyServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Polls `cond` until it holds, at most `tries` times, yielding to the runtime in between.
/// A hang guard, not a timing assertion.
pub(crate) async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..2000 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

/// Fails the test if `fut` takes longer than a generous hang guard.
pub(crate) async fn guard<F: std::future::Future>(fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .expect("hang guard: the operation did not finish")
}

/// A mock plugin served on a fresh socket in a temp dir.
pub(crate) struct Mock {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) plugin: csi_testkit::MockPlugin,
    pub(crate) server: Option<csi_testkit::MockServer>,
}

impl Mock {
    pub(crate) async fn start(plugin: csi_testkit::MockPlugin) -> Mock {
        let dir = tempfile::tempdir().expect("test invariant: temp dirs can be made");
        let server = plugin
            .serve_unix(dir.path().join("csi.sock"))
            .await
            .expect("test invariant: a fresh path can be served");
        Mock {
            dir,
            plugin,
            server: Some(server),
        }
    }

    pub(crate) async fn default() -> Mock {
        Mock::start(plugin()).await
    }

    pub(crate) fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("csi.sock")
    }

    pub(crate) fn endpoint(&self) -> csi_client::Endpoint {
        csi_client::Endpoint::unix(self.path()).expect("test invariant: temp paths are short")
    }

    /// Stages `volume` at `<dir>/staging` (made first: the orchestrator creates it) and
    /// publishes it read-write at `<dir>/target` through `node`, with no context or secrets;
    /// returns the staging path and the target.
    pub(crate) async fn stage_and_publish(
        &self,
        node: &csi_client::NodeClient,
        volume: &csi_structs::ExternalVolumeId,
        capability: &csi_structs::VolumeCapability,
        publish_context: &csi_structs::PublishContext,
    ) -> (std::path::PathBuf, std::path::PathBuf) {
        let (context, secrets) = Default::default();
        let staging = self.dir.path().join("staging");
        std::fs::create_dir_all(&staging).expect("test invariant: temp dirs can be made");
        let target = self.dir.path().join("target");
        guard(node.stage(&csi_client::NodeStage {
            volume,
            staging_target_path: &staging,
            capability,
            publish_context,
            volume_context: &context,
            secrets: &secrets,
        }))
        .await
        .expect("staged");
        guard(node.publish(&csi_client::NodePublish {
            volume,
            staging_target_path: Some(&staging),
            target_path: &target,
            capability,
            readonly: false,
            publish_context,
            volume_context: &context,
            secrets: &secrets,
        }))
        .await
        .expect("published");
        (staging, target)
    }

    pub(crate) fn faults(&self) -> csi_testkit::Faults {
        self.plugin.faults()
    }

    pub(crate) fn count(&self, rpc: csi_client::Rpc) -> usize {
        self.plugin.calls().count(rpc)
    }

    pub(crate) async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            guard(server.shutdown())
                .await
                .expect("mock shuts down cleanly");
        }
    }

    pub(crate) async fn restart(&mut self) {
        self.stop().await;
        let server = self
            .plugin
            .serve_unix(self.path())
            .await
            .expect("test invariant: the old socket was removed");
        self.server = Some(server);
    }

    /// A client with short pauses between attempts and no retry budget limit, so tests
    /// count attempts exactly; `tweak` adjusts the policy table.
    pub(crate) fn client(
        &self,
        tweak: impl FnOnce(&mut csi_client::PolicyTable),
    ) -> csi_client::CsiClient {
        let mut table = fast_policies();
        tweak(&mut table);
        csi_client::CsiClient::builder(self.endpoint())
            .policies(table)
            .retry_budget(Arc::new(csi_client::RetryBudget::unlimited()))
            .build()
    }
}

/// The default policy table with millisecond backoff.
pub(crate) fn fast_policies() -> csi_client::PolicyTable {
    let mut table = csi_client::PolicyTable::default();
    table.update_all(|_, p| {
        p.backoff = csi_client::Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(5),
            factor: 2.0,
            jitter: true,
        };
    });
    table
}

/// The default mock plugin, with one pre-provisioned volume `vol-1`.
pub(crate) fn plugin() -> csi_testkit::MockPlugin {
    csi_testkit::MockPlugin::builder()
        .volume("vol-1", 1 << 30)
        .build()
        .expect("test invariant: the default mock config is valid")
}

/// A single-node-writer mount capability, as the wire carries it.
pub(crate) fn mount_capability() -> csi_client::proto::VolumeCapability {
    use csi_client::proto::volume_capability::{AccessMode, AccessType};
    csi_client::proto::VolumeCapability {
        access_mode: Some(AccessMode { mode: 1 }),
        access_type: Some(AccessType::Mount(Default::default())),
    }
}
