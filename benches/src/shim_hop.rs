//! What one agent-to-agent hop adds: `ControllerUnpublishVolume` against the mock plugin
//! called directly through csi-client, through the shim of the node that runs the controller
//! (no network), and through another node's shim forwarding over loopback TCP (one hop).
//!
//! Two shims run in this process (agents `a` and `b`, cluster scope, each knowing the other's
//! token); the registry says the plugin's controller runs on `b` only. Agent `b`'s
//! [`LocalPlugins`] calls the in-process mock through csi-client, as the reference agent's
//! does. Calls are sequential, so the difference of the p50s is the cost of the hop.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use csi_client::CsiClient;
use csi_rpc_shim::{
    ControllerAttached, ControllerDetach, ControllerExpand, ControllerExpanded, ControllerQuery,
    ControllerValidate, CreateSnapshot, CreateVolume, CreatedVolume, Credentials, DeleteSnapshot,
    DeleteVolume, GrpcCode, Health, Instance, ListSnapshots, ListVolumes, LocalPlugins,
    LocalStatus, NodeDetach, NodeExpand, NodeExpanded, PluginError, PluginFailure, Registry,
    Routes, Scope, ServiceKind, Shim, ShimConfig, ShimContext, SnapshotInfo, SnapshotPage, Token,
    TokenBook, Validated, VolumePage,
};
use csi_structs::{ErrorClass, ExternalVolumeId, NodeId, PluginId, PluginNodeId, Secrets};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

use crate::error::BenchError;
use crate::report::Line;
use crate::target::{MOCK_CALL_LOG_LIMIT, mock_socket, socket_dir};

/// The issue 6 target for the added cost of one hop, p50, microseconds.
pub const TARGET_ADDED_P50_US: f64 = 150.0;

/// How long each measured call may take (a hang guard, not a measurement).
const CALL_LIMIT: Duration = Duration::from_secs(10);

/// The three lines of a hop run and the added cost.
#[derive(Clone, Debug, PartialEq)]
pub struct HopCost {
    /// csi-client straight to the mock.
    pub direct: Line,
    /// Through the shim of the node that runs the controller (no network).
    pub local: Line,
    /// Through another node's shim, one hop over loopback TCP.
    pub hop: Line,
}

impl HopCost {
    /// p50 of the hop minus p50 of the direct call, microseconds.
    pub fn added_p50_us(&self) -> f64 {
        self.hop.p50_us - self.direct.p50_us
    }
}

impl fmt::Display for HopCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let added = self.added_p50_us();
        writeln!(f, "{}", self.direct)?;
        writeln!(f, "{}", self.local)?;
        writeln!(f, "{}", self.hop)?;
        write!(
            f,
            "shim_hop added_p50_us={added:.1} over_local_shim_p50_us={:.1} target_max_us={TARGET_ADDED_P50_US:.0} met={}",
            self.hop.p50_us - self.local.p50_us,
            if added <= TARGET_ADDED_P50_US {
                "yes"
            } else {
                "no"
            }
        )
    }
}

/// The controller backend of agent `b`: `ControllerUnpublishVolume` through csi-client; every
/// other call is refused (the bench makes none).
#[derive(Debug)]
struct ClientBackend {
    client: Option<CsiClient>,
}

fn unused() -> PluginError {
    PluginError::failed(
        ErrorClass::Fatal,
        PluginFailure::Agent,
        "not served by the hop benchmark",
    )
}

#[async_trait]
impl LocalPlugins for ClientBackend {
    fn status(&self, _plugin: &PluginId, service: ServiceKind) -> LocalStatus {
        match (&self.client, service) {
            (Some(_), ServiceKind::Controller) => LocalStatus::Healthy,
            _ => LocalStatus::Missing,
        }
    }

    async fn controller_attach(
        &self,
        _: &ShimContext,
        _: csi_rpc_shim::ControllerAttach,
    ) -> Result<ControllerAttached, PluginError> {
        Err(unused())
    }

    async fn controller_detach(
        &self,
        _ctx: &ShimContext,
        req: ControllerDetach,
    ) -> Result<(), PluginError> {
        let Some(client) = &self.client else {
            return Err(unused());
        };
        client
            .controller()
            .unpublish(&req.external_volume, Some(&req.plugin_node), &req.secrets)
            .await
            .map_err(|e| {
                // The plugin's status when it answered one; anything else reads as
                // unreachable here (the agent's backend tells the other failures apart).
                let failure = e.code().map_or(PluginFailure::Unreachable, |code| {
                    PluginFailure::Status(GrpcCode::from(code))
                });
                PluginError::failed(e.class(), failure, e.to_string())
            })
    }

    async fn controller_validate(
        &self,
        _: &ShimContext,
        _: ControllerValidate,
    ) -> Result<Validated, PluginError> {
        Err(unused())
    }

    async fn create_volume(
        &self,
        _: &ShimContext,
        _: CreateVolume,
    ) -> Result<CreatedVolume, PluginError> {
        Err(unused())
    }

    async fn delete_volume(&self, _: &ShimContext, _: DeleteVolume) -> Result<(), PluginError> {
        Err(unused())
    }

    async fn controller_expand(
        &self,
        _: &ShimContext,
        _: ControllerExpand,
    ) -> Result<ControllerExpanded, PluginError> {
        Err(unused())
    }

    async fn list_volumes(
        &self,
        _: &ShimContext,
        _: ListVolumes,
    ) -> Result<VolumePage, PluginError> {
        Err(unused())
    }

    async fn create_snapshot(
        &self,
        _: &ShimContext,
        _: CreateSnapshot,
    ) -> Result<SnapshotInfo, PluginError> {
        Err(unused())
    }

    async fn delete_snapshot(&self, _: &ShimContext, _: DeleteSnapshot) -> Result<(), PluginError> {
        Err(unused())
    }

    async fn list_snapshots(
        &self,
        _: &ShimContext,
        _: ListSnapshots,
    ) -> Result<SnapshotPage, PluginError> {
        Err(unused())
    }

    async fn node_detach(&self, _: &ShimContext, _: NodeDetach) -> Result<(), PluginError> {
        Err(unused())
    }

    async fn node_expand(
        &self,
        _: &ShimContext,
        _: NodeExpand,
    ) -> Result<NodeExpanded, PluginError> {
        Err(unused())
    }
}

fn id<T>(what: &'static str, value: &str) -> Result<T, BenchError>
where
    T: TryFrom<String, Error = csi_structs::ValidationErrors>,
{
    T::try_from(value.to_owned()).map_err(|source| BenchError::InvalidId {
        what,
        value: value.to_owned(),
        source,
    })
}

fn token(node: &str) -> Result<Token, BenchError> {
    Token::new(format!("{node}-bench-token-0123456789")).map_err(BenchError::ShimToken)
}

/// Times `n` sequential calls of `call` after `warmup` unmeasured ones.
async fn sequential<F, Fut, E>(
    path: &'static str,
    n: u64,
    warmup: u64,
    wrap: fn(&'static str, E) -> BenchError,
    mut call: F,
) -> Result<Vec<Duration>, BenchError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let mut latencies = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    for i in 0..warmup + n {
        let start = Instant::now();
        match tokio::time::timeout(CALL_LIMIT, call()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(wrap(path, e)),
            Err(_) => {
                return Err(BenchError::ShimCallHung {
                    path,
                    limit: CALL_LIMIT,
                });
            }
        }
        if i >= warmup {
            latencies.push(start.elapsed());
        }
    }
    Ok(latencies)
}

fn direct_failed(path: &'static str, e: csi_client::Error) -> BenchError {
    BenchError::DirectCall {
        path,
        source: Box::new(e),
    }
}

fn shim_failed(path: &'static str, e: csi_rpc_shim::ShimError) -> BenchError {
    BenchError::ShimCall {
        path,
        source: Box::new(e),
    }
}

/// Runs the three paths `n` times each (after `warmup` calls each) and returns their lines.
///
/// # Errors
///
/// Start-up errors of the mock and the shims, [`BenchError::ShimCall`] for a failed call.
pub fn run_shim_hop(rt: &Runtime, n: u64, warmup: u64) -> Result<HopCost, BenchError> {
    rt.block_on(async {
        let dir = socket_dir("the mock plugin's socket")?;
        let path = mock_socket(dir.path());
        let plugin = csi_testkit::MockPlugin::builder()
            .call_log_limit(MOCK_CALL_LOG_LIMIT)
            .volume("ext-0", 1 << 30)
            .build()
            .map_err(BenchError::MockConfig)?;
        let server = plugin
            .serve_unix(&path)
            .await
            .map_err(BenchError::MockServe)?;
        let endpoint =
            csi_client::Endpoint::unix(&path).map_err(|source| BenchError::Endpoint {
                endpoint: path.display().to_string(),
                source,
            })?;
        let client = CsiClient::new(endpoint);

        let a: NodeId = id("node id", "a")?;
        let b: NodeId = id("node id", "b")?;
        let ebs: PluginId = id("plugin id", "bench.csi.example")?;
        let registry = Arc::new(Registry::new());
        registry.update(&b, &ebs, Instance::Controller(Health::Healthy));
        let tokens = TokenBook::new()
            .with(a.clone(), token("a")?, Scope::Cluster)
            .with(b.clone(), token("b")?, Scope::Cluster);
        let shim_setup = |step| move |source| BenchError::ShimListener { step, source };
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(shim_setup("binding agent b on loopback"))?;
        let b_addr = listener
            .local_addr()
            .map_err(shim_setup("reading agent b's address"))?;
        let config = |node: &NodeId, t| {
            ShimConfig::new(
                Credentials {
                    node: node.clone(),
                    token: t,
                },
                Scope::Cluster,
            )
        };
        let shim_b = Shim::new(
            config(&b, token("b")?),
            Arc::clone(&registry),
            Arc::new(ClientBackend {
                client: Some(client.clone()),
            }),
            tokens.clone(),
            Routes::new(),
        );
        let shim_a = Shim::new(
            config(&a, token("a")?),
            Arc::clone(&registry),
            Arc::new(ClientBackend { client: None }),
            tokens,
            Routes::new().with_direct(b.clone(), b_addr),
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = shim_b.clone();
        let serve = tokio::spawn(async move {
            serving
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await
        });

        let external: ExternalVolumeId = id("external volume id", "ext-0")?;
        let plugin_node: PluginNodeId = id("plugin node id", &plugin.config().node_id)?;
        let secrets = Secrets::default();
        let detach = ControllerDetach {
            query: ControllerQuery::new(ebs),
            volume: id("volume id", "vol-0")?,
            external_volume: external.clone(),
            node: a.clone(),
            plugin_node: plugin_node.clone(),
            secrets: secrets.clone(),
        };

        let result = async {
            let mut direct = sequential("csi-client direct", n, warmup, direct_failed, || {
                let client = client.clone();
                let (external, plugin_node, secrets) =
                    (external.clone(), plugin_node.clone(), secrets.clone());
                async move {
                    client
                        .controller()
                        .unpublish(&external, Some(&plugin_node), &secrets)
                        .await
                }
            })
            .await?;
            let mut local = sequential(
                "shim on the controller's node",
                n,
                warmup,
                shim_failed,
                || shim_b.controller_detach(detach.clone(), CALL_LIMIT),
            )
            .await?;
            let sent_before = shim_a.stats().sent;
            let mut hop = sequential(
                "shim one hop over loopback tcp",
                n,
                warmup,
                shim_failed,
                || shim_a.controller_detach(detach.clone(), CALL_LIMIT),
            )
            .await?;
            let sent = shim_a.stats().sent.saturating_sub(sent_before);
            if sent < n + warmup {
                return Err(BenchError::NotForwarded {
                    sent,
                    expected: n + warmup,
                });
            }
            let line = |client: &str, latencies: &mut Vec<Duration>| {
                let wall = latencies.iter().sum();
                Line::from_run(client, "controller_unpublish", 1, latencies, wall)
            };
            Ok(HopCost {
                direct: line("csi-client", &mut direct),
                local: line("shim-local", &mut local),
                hop: line("shim-hop", &mut hop),
            })
        }
        .await;
        let _ = stop.send(());
        let _ = serve.await;
        drop(client);
        server.shutdown().await.map_err(BenchError::MockServe)?;
        result
    })
}
