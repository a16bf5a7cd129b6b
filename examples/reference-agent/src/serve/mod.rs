//! `csi-agent serve`: the long-running agent.
//!
//! It opens csi-control's front door, [`ControlPlane`], in the data directory: csi-node's
//! `Node` (plugins, volumes, claims and their release pipeline, under `<data_dir>/node`), the
//! volume catalog (`<data_dir>/volumes.json`, or etcd in cluster mode), the routing of plugin
//! calls (csi-rpc-shim, served to peers when `shim_listen` is set) and the volume service.
//! Around it the agent keeps what is its own:
//! - [`plugins`]: the plugin directory watched for `<plugin-id>.sock` sockets, fed to the
//!   control plane's plugin manager, with the agent's client settings and metrics;
//! - [`peers`] (static `--peer` list) and `cluster` (etcd membership, feature `etcd`): what
//!   peers host;
//! - [`agent`] and [`http`]: the control API of the operator commands, and `/metrics`;
//! - [`log`]: the log format, every field value escaped.
//!
//! Stopping: SIGTERM (or SIGINT) stops accepting requests, lets control requests in flight
//! finish (bounded by `call_timeout`), then closes the control plane (every release step is
//! checkpointed before its call, so a detach call cut off is repeated by the next start) and
//! exits 0. Starting resumes every unfinished release from the store. See `SERVE.md` in the
//! package for an operator's walk-through.

pub mod agent;
#[cfg(feature = "etcd")]
pub mod cluster;
pub mod http;
pub mod log;
pub mod peers;
pub mod plugins;

use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_claims::MachineConfig;
use csi_claims::driver::DriverConfig;
use csi_client::CallsInFlight;
use csi_control::stores::StoresError;
use csi_control::{ControlPlane, PlaneError};
use csi_node::plugins::LogEvents;
use csi_rpc_shim::{NodeStatus, Scope};

use crate::config::{AgentConfig, ConfigArgs, ConfigError};
use crate::metrics::Metrics;
use crate::ops::api::AgentInfo;

/// Arguments of `csi-agent serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Configuration (flags, `CSI_AGENT_*` variables, `--config` file).
    #[command(flatten)]
    pub config: ConfigArgs,
}

/// Why `csi-agent serve` could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The data directory or one of its files cannot be used.
    #[error("data dir {path}: {source}")]
    DataDir {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A state file is damaged or unwritable.
    #[error(transparent)]
    State(#[from] csi_node::state::StateFileError),
    /// The control plane (the node, the catalog, the claims) cannot be opened or closed.
    #[error(transparent)]
    Plane(PlaneError),
    /// An address cannot be bound.
    #[error("cannot listen on {addr} (config key `{key}`): {source}")]
    Bind {
        /// The config key.
        key: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Cluster mode could not start (another agent has this node id, say).
    #[error("cluster: {0}")]
    Cluster(String),
    /// The async runtime or signal handling could not start.
    #[error("runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl crate::ExitStatus for ServeError {
    fn exit_code(&self) -> u8 {
        match self {
            ServeError::Config(_) => 2,
            _ => 1,
        }
    }
}

/// Runs `csi-agent serve` until SIGTERM or SIGINT.
///
/// # Errors
///
/// A [`ServeError`]; configuration errors come before anything starts.
pub fn run(args: ServeArgs) -> Result<(), ServeError> {
    let config = AgentConfig::load(&args.config)?;
    let filter =
        tracing_subscriber::EnvFilter::try_new(&config.log).map_err(|_| ConfigError::Invalid {
            key: "log",
            value: config.log.clone(),
            reason: "not a log filter".into(),
        })?;
    let _ = tracing_subscriber::fmt()
        .fmt_fields(log::escaped_fields())
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    runtime.block_on(serve_until(config, wait_for_signal()))
}

fn data_err(path: &Path) -> impl FnOnce(std::io::Error) -> ServeError + '_ {
    move |source| ServeError::DataDir {
        path: path.to_owned(),
        source,
    }
}

/// A random value kept in `<data_dir>/<name>` (mode 0600), created when missing: the operator
/// token (`control.token`).
fn random_file(data_dir: &Path, name: &str) -> Result<String, ServeError> {
    let path = data_dir.join(name);
    csi_node::state::random_value_file(&path).map_err(data_err(&path))
}

async fn bind(key: &'static str, addr: SocketAddr) -> Result<tokio::net::TcpListener, ServeError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { key, addr, source })
}

/// Serves `config` on the current tokio runtime until `stop` completes (`run` passes SIGTERM
/// or SIGINT), then stops as on a signal: requests in flight finish, the release driver
/// checkpoints and stops. An error from `stop` ends the agent the same way and is returned.
/// Logs go to whatever `tracing` subscriber is set; `run` sets one on stderr.
///
/// # Errors
///
/// A [`ServeError`] before the agent is up (configuration, data directory, ports, stores),
/// or `stop`'s.
pub async fn serve_until(
    config: AgentConfig,
    stop: impl Future<Output = Result<(), ServeError>>,
) -> Result<(), ServeError> {
    let data = config.data_dir.clone();
    std::fs::create_dir_all(&data).map_err(data_err(&data))?;
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700))
        .map_err(data_err(&data))?;
    let me = config.node_id.clone();
    let control = random_file(&data, "control.token")?;
    let metrics = Metrics::new();
    // Bound first, so a taken port stops the agent before it opens or joins anything.
    let http_listener = bind("listen", config.listen).await?;
    let http_addr = http_listener.local_addr().map_err(ServeError::Runtime)?;
    let shim_listener = match config.shim_listen {
        Some(addr) => Some(bind("shim_listen", addr).await?),
        None => None,
    };
    let shim_addr = shim_listener
        .as_ref()
        .map(|l| l.local_addr())
        .transpose()
        .map_err(ServeError::Runtime)?;

    let calls = Arc::new(CallsInFlight::new());
    let addresses = Addresses {
        http: http_addr,
        shim: shim_addr,
    };
    let plane = open_plane(&config, &metrics, &calls, addresses).await?;
    let service = Arc::clone(plane.service());
    // Static peers: reached directly, trusted with cluster scope, down until they answer.
    let shim = service.shim();
    if let Some(token) = &config.cluster_token {
        for peer in &config.peers {
            shim.update_tokens(|t| {
                t.insert(peer.node.clone(), token.token.clone(), Scope::Cluster)
            });
            shim.update_routes(|r| r.set_direct(peer.node.clone(), peer.shim));
            shim.registry()
                .set_node_status(&peer.node, NodeStatus::Down);
        }
    }
    let plugins = plugins::Plugins::new(
        me.clone(),
        plane.node().plugins().clone(),
        config.plugin_dir.clone(),
        calls,
    );
    // The node keeps its registrations; the watchers register again what is still there, so
    // a driver removed while the agent was down is not kept registered.
    {
        let plugins = plugins.clone();
        let _ = tokio::task::spawn_blocking(move || plugins.forget_unwatched()).await;
    }
    let claims = service.claims().clone();
    let log_events = claims.log_events();
    #[cfg(feature = "etcd")]
    let cluster_status = match (plane.membership(), &config.store) {
        (Some(membership), crate::config::StoreChoice::Etcd(settings)) => Some(Arc::new(
            cluster::Cluster::new(Arc::clone(membership), settings),
        )
            as Arc<dyn agent::ClusterStatus>),
        _ => None,
    };
    #[cfg(not(feature = "etcd"))]
    let cluster_status = None;
    // Releases the store says are unfinished: the driver resumed each at its checkpointed step.
    let resumed = service
        .catalog()
        .list()
        .iter()
        .filter_map(|v| claims.record(&v.id))
        .flat_map(|r| r.claims().to_vec())
        .filter(|c| c.state().is_releasing())
        .count();
    let health = Arc::new(csi_node::health::HealthMonitor::new(
        plugins.manager().clone(),
        service.volumes().clone(),
    ));
    let agent = Arc::new(agent::Agent {
        health: Arc::clone(&health),
        me: me.clone(),
        plugins: plugins.clone(),
        service,
        metrics,
        peers: Arc::clone(plane.peers()),
        cluster: cluster_status,
        waits: Mutex::new(csi_control::service::ReleaseWaits::new(config.call_timeout)),
        reconciled: Mutex::new(None),
    });

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(plugins.clone().run(config.scan_interval, stop_rx.clone()));
    {
        // Releases that wait for something that is not there, looked at as often as the
        // plugins' health; each is logged once it waited `call_timeout`.
        let (agent, interval, mut stop) =
            (Arc::clone(&agent), config.health_interval, stop_rx.clone());
        tasks.spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            loop {
                tokio::select! {
                    _ = ticker.tick() => agent.check_waits(),
                    _ = stop.changed() => return,
                }
            }
        });
    }
    {
        // The health of the volumes published here, polled as often as the plugins' health.
        let (stop, interval) = (stopped(stop_rx.clone()), config.health_interval);
        tasks.spawn(async move { health.run(interval, stop).await });
    }
    if let Some(dir) = &config.kubelet_registration_dir {
        // CSI drivers deployed for Kubernetes: their node-driver-registrar sidecars announce
        // them in kubelet's registration directory.
        let watcher =
            csi_node::kubelet::RegistrationWatcher::new(plugins.manager().clone(), dir.clone())
                .call_timeout(config.call_timeout);
        tracing::info!(dir = %dir.display(), "watching kubelet's plugin registration directory");
        let (stop, interval) = (stopped(stop_rx.clone()), config.scan_interval);
        tasks.spawn(async move { watcher.run(interval, stop).await });
    }
    let http_task = tokio::spawn(http::serve(
        http_listener,
        Arc::clone(&agent),
        Arc::new(http::Access {
            control_token: control,
            cluster_token: config.cluster_token.as_ref().map(|t| t.expose().to_owned()),
        }),
        stop_rx.clone(),
    ));
    if let Some(listener) = shim_listener {
        let (shim, shutdown) = (agent.service.shim().clone(), stopped(stop_rx.clone()));
        tasks.spawn(async move {
            if let Err(e) = shim.serve(listener, shutdown).await {
                tracing::error!(error = %e, "agent-to-agent server stopped");
            }
        });
    }
    {
        let stop = stopped(stop_rx.clone());
        tasks.spawn(async move {
            tokio::select! {
                () = log_events => {}
                () = stop => {}
            }
        });
    }
    // The usage records restored from the data directory are confirmed with their plugins
    // (staged and published again) by the control plane; `status` shows how.
    {
        let (agent, done, stop) = (
            Arc::clone(&agent),
            plane.reconciled(),
            stopped(stop_rx.clone()),
        );
        tasks.spawn(async move {
            tokio::select! {
                done = done => {
                    agent.reconciled(&done);
                }
                () = stop => {}
            }
        });
    }
    tasks.spawn(log_long_calls(
        Arc::clone(plugins.calls_in_flight()),
        stop_rx.clone(),
    ));
    if let (false, Some(token)) = (config.peers.is_empty(), &config.cluster_token) {
        tasks.spawn(peers::run(
            Arc::clone(&agent),
            config.peers.clone(),
            token.expose().to_owned(),
            config.peer_interval,
            stop_rx.clone(),
        ));
    }

    let info = AgentInfo {
        node: me.to_string(),
        http: http_addr.to_string(),
        shim: shim_addr.map(|a| a.to_string()),
        pid: std::process::id(),
    };
    let info_path = data.join("agent.json");
    csi_node::state::save_json(&info_path, &info)?;
    tracing::info!(
        node = %me,
        http = %http_addr,
        shim = %shim_addr.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
        plugin_dir = %config.plugin_dir.display(),
        store = %plane.store_description(),
        resumed_releases = resumed,
        "csi-agent serving"
    );

    let stopped = stop.await;
    tracing::info!("stop signal received; finishing requests, checkpointing and stopping");
    let _ = stop_tx.send(true);
    // Control requests in flight (a claim being published, say) finish first, and so do the
    // operations whose callers hung up (they run to their end), with the release driver
    // still running so their claims and releases become durable.
    let grace = config.call_timeout.saturating_add(Duration::from_secs(5));
    let requests = async {
        let _ = http_task.await;
        agent.service.wait_idle().await;
    };
    if tokio::time::timeout(grace, requests).await.is_err() {
        tracing::warn!(
            ?grace,
            "control requests still running after the grace period; stopping anyway"
        );
    }
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("some tasks did not stop within 10s; exiting anyway");
    }
    drop((agent, claims));
    // Every release step was checkpointed before its call; closing stops the release
    // pipeline, dropping calls in flight, and the next start repeats the step from the store.
    // In cluster mode it then hands the controller duty and the membership over now rather
    // than at lease expiry.
    if let Err(e) = plane.close().await {
        tracing::warn!(error = %e, "the control plane did not close cleanly");
    }
    let _ = std::fs::remove_file(&info_path);
    tracing::info!("csi-agent stopped");
    stopped
}

/// Where this agent listens: its control API, and its routing (shim) when served; written in
/// its member record in cluster mode.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
struct Addresses {
    http: SocketAddr,
    shim: Option<SocketAddr>,
}

/// The control plane of `config`: csi-control's front door in the data directory, with the
/// agent's store, timings, plugin clients (`metrics`, `calls`) and cluster token; in cluster
/// mode joined to the cluster with a record naming `addresses`.
async fn open_plane(
    config: &AgentConfig,
    metrics: &Metrics,
    calls: &Arc<CallsInFlight>,
    addresses: Addresses,
) -> Result<ControlPlane, ServeError> {
    let timings = plugins::Timings {
        health_interval: config.health_interval,
        retry_interval: config.scan_interval,
        call_timeout: config.call_timeout,
        fingerprint_interval: config.fingerprint_interval,
        node_detach: config.node_detach,
    };
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    config.node_id.hash(&mut hasher);
    let driver = DriverConfig {
        machine: MachineConfig {
            backoff: config.release_backoff,
            controller_calls_per_plugin: config.controller_calls,
            ..MachineConfig::with_seed(hasher.finish())
        },
        call_timeout: config.call_timeout.saturating_mul(2),
        ..DriverConfig::default()
    };
    #[cfg(not(feature = "etcd"))]
    let _ = addresses;
    #[cfg(not(feature = "etcd"))]
    if let crate::config::StoreChoice::Etcd(settings) = &config.store {
        return Err(stores_error(StoresError::NoEtcd {
            store: settings.display(),
        }));
    }
    let mut plane = ControlPlane::builder(&config.data_dir, config.node_id.clone())
        .call_timeout(config.call_timeout)
        .restart_wait(FIRST_FINGERPRINT_WAIT)
        .plugins(timings.manager_config())
        .driver(driver)
        .calls_in_flight(Arc::clone(calls))
        .client_builder(plugins::client_customizer(
            config.call_timeout,
            metrics.clone(),
        ))
        .plugin_observer(Arc::new(LogEvents::default()));
    if let Some(token) = &config.cluster_token {
        plane = plane.shim_token(token.token.clone());
    }
    #[cfg(feature = "etcd")]
    if let (crate::config::StoreChoice::Etcd(settings), Some(token)) =
        (&config.store, &config.cluster_token)
    {
        let advertise = addresses.shim.map(|a| a.to_string()).unwrap_or_default();
        let mut cluster = csi_control::ClusterSettings::new(
            settings.store.clone(),
            token.token.clone(),
            advertise,
        );
        cluster.lease_ttl = settings.lease_ttl;
        cluster.duty = Some(settings.duty);
        cluster.follow_interval = config.scan_interval;
        cluster.extra.insert(
            cluster::HTTP_FIELD.into(),
            addresses.http.to_string().into(),
        );
        plane = plane.cluster(cluster);
    }
    plane.open().await.map_err(|e| match e {
        PlaneError::Stores(e) => stores_error(e),
        #[cfg(feature = "etcd")]
        PlaneError::Join(e) => match *e {
            csi_control::JoinError::DuplicateNode { node, other } => ServeError::Cluster(format!(
                "node id {node} is already a member of the cluster (agent at {}, another data \
                 directory); every agent needs its own node id",
                other.about.shim
            )),
            e => ServeError::Cluster(e.to_string()),
        },
        e => ServeError::Plane(e),
    })
}

/// How long, after a start, releases loaded from the store and the usage records restored
/// wait for their plugin's first fingerprint before going on without it (a plugin whose
/// socket is there is fingerprinted within one scan).
const FIRST_FINGERPRINT_WAIT: Duration = Duration::from_secs(10);

/// csi-control's stores' errors, with a file of the etcd settings that cannot be used, or
/// etcd in a build without it, as a configuration error naming the agent's key.
fn stores_error(e: StoresError) -> ServeError {
    match e {
        StoresError::File {
            setting,
            path,
            reason,
        } => ConfigError::Invalid {
            key: match setting {
                "ca_file" => "etcd_ca_file",
                "cert_file" => "etcd_cert_file",
                "key_file" => "etcd_key_file",
                _ => "etcd_password_file",
            },
            value: path.display().to_string(),
            reason,
        }
        .into(),
        StoresError::NoEtcd { store } => ConfigError::Invalid {
            key: "store",
            value: store,
            reason: "this csi-agent was built without cluster mode; build it with \
                     `cargo build --release -p csi-agent --features etcd`"
                .into(),
        }
        .into(),
        e => ServeError::Plane(PlaneError::Stores(e)),
    }
}

/// Resolves once `serve` is told to stop (or its stop sender is gone).
async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.changed().await;
}

async fn wait_for_signal() -> Result<(), ServeError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(ServeError::Runtime)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Runtime)?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// A plugin call running this long is logged, with what it waits on.
pub const LONG_CALL: Duration = Duration::from_secs(5);
/// A long call is logged again this often while it lasts.
pub const LONG_CALL_EVERY: Duration = Duration::from_secs(30);

/// Logs each plugin call that has run for [`LONG_CALL`], and again every
/// [`LONG_CALL_EVERY`] while it lasts ([`csi_client::CallsInFlight::log_long_calls`]), until
/// `stop`.
async fn log_long_calls(
    calls: Arc<csi_client::CallsInFlight>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    tokio::select! {
        () = calls.log_long_calls(LONG_CALL, LONG_CALL_EVERY) => {}
        _ = stop.changed() => {}
    }
}
