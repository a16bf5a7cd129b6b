//! `csi-agent serve`: the long-running agent.
//!
//! It composes every crate:
//! - [`plugins`]: a plugin directory watched for `<plugin-id>.sock` sockets, each
//!   fingerprinted and health-checked with csi-client, transitions logged;
//! - csi-node's volume manager, with its paths under `<data_dir>/node` and its usage records
//!   in the node's redb database, one record per volume: `<data_dir>/claims.redb` beside the
//!   claims with the embedded store, `<data_dir>/node/node.redb` in cluster mode
//!   ([`open_volumes`]);
//! - the volume book and the claim store, opened together by csi-control's `Stores` (with the
//!   embedded store: `<data_dir>/volumes.json` and csi-claims' redb store,
//!   `<data_dir>/claims.redb`; in cluster mode: etcd), and the release driver, whose
//!   detachers (csi-node's `ShimDetacher`) go through csi-rpc-shim so a release reaches the
//!   node and the controller wherever they run; csi-node's `NodeBackend` serves the shim's
//!   calls with this node's plugins; [`peers`] learns which plugins peers host;
//! - [`agent`] and [`http`]: the control API of the operator commands, and `/metrics`;
//! - [`log`]: the log format, every field value escaped.
//!
//! Stopping: SIGTERM (or SIGINT) stops accepting requests, lets control requests in flight
//! finish (bounded by `call_timeout`), then stops the release driver (every release step is
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
use std::io::Read as _;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_claims::driver::{ClaimsDriver, DriverConfig};
use csi_claims::{MachineConfig, RedbStore, StoreError};
use csi_control::catalog::CatalogSecrets;
use csi_control::stores::{Stores, StoresError};
use csi_node::detach::ShimDetacher;
use csi_node::layout::Layout;
use csi_node::volumes::{UsageDb, VolumeManager};
use csi_rpc_shim::NodeStatus;
use csi_rpc_shim::{Credentials, Registry, Routes, Scope, Shim, ShimConfig, Token, TokenBook};

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
    /// The claim store cannot be opened or read.
    #[error("claim store: {0}")]
    Store(#[from] StoreError),
    /// The volume book or the claim store cannot be opened.
    #[error(transparent)]
    Stores(StoresError),
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

/// Random hex from the system's generator.
fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// A random value kept in `<data_dir>/<name>` (mode 0600), created when missing: the operator
/// token (`control.token`), this data directory's identity in a cluster (`instance.id`).
fn random_file(data_dir: &Path, name: &str) -> Result<String, ServeError> {
    let path = data_dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(t) if t.trim().len() >= 16 => return Ok(t.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(data_err(&path)(e)),
    }
    let token = random_hex(32).map_err(data_err(&path))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(data_err(&path))?;
    std::io::Write::write_all(&mut f, token.as_bytes()).map_err(data_err(&path))?;
    Ok(token)
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
    let registry = Arc::new(Registry::new());
    registry.set_node_status(&me, NodeStatus::Ready);
    let plugins = plugins::Plugins::new(
        me.clone(),
        config.plugin_dir.clone(),
        Arc::clone(&registry),
        metrics.clone(),
        plugins::Timings {
            health_interval: config.health_interval,
            retry_interval: config.scan_interval,
            call_timeout: config.call_timeout,
            fingerprint_interval: config.fingerprint_interval,
            node_detach: config.node_detach,
        },
    )?;
    // The volume book, the claim store, and the node's database (the usage records).
    let stores = open_stores(&config).await?;
    let (node_db, node_db_file) = match &stores.database {
        Some(db) => db.clone(),
        None => {
            let path = data.join("node").join("node.redb");
            std::fs::create_dir_all(data.join("node")).map_err(data_err(&data))?;
            let opened = path.clone();
            let db = tokio::task::spawn_blocking(move || RedbStore::open(opened))
                .await
                .map_err(|e| ServeError::Runtime(std::io::Error::other(e)))??;
            (db, path)
        }
    };
    let volumes = {
        let (data, plugins) = (data.clone(), plugins.clone());
        tokio::task::spawn_blocking(move || open_volumes(&data, &plugins, &node_db, &node_db_file))
            .await
            .map_err(|e| ServeError::Runtime(std::io::Error::other(e)))??
    };
    // Bound first, so a taken port stops the agent before it joins anything.
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

    // The shim: this node serves its own plugins; peers are trusted with cluster scope.
    let own_token = match &config.cluster_token {
        Some(t) => t.token.clone(),
        None => {
            let local = random_hex(24).map_err(data_err(&data))?;
            Token::new(local).map_err(|e| ServeError::Runtime(std::io::Error::other(e)))?
        }
    };
    let mut tokens = TokenBook::new();
    let mut routes = Routes::new();
    for peer in &config.peers {
        tokens.insert(peer.node.clone(), own_token.clone(), Scope::Cluster);
        routes.set_direct(peer.node.clone(), peer.shim);
        registry.set_node_status(&peer.node, NodeStatus::Down);
    }
    let mut shim_config = ShimConfig::new(
        Credentials {
            node: me.clone(),
            token: own_token.clone(),
        },
        Scope::Cluster,
    );
    shim_config.connect_timeout = config.call_timeout.min(Duration::from_secs(10));
    let backend = Arc::new(csi_node::shim::NodeBackend::new(
        plugins.manager().clone(),
        volumes.clone(),
    ));
    let shim = Shim::new(shim_config, Arc::clone(&registry), backend, tokens, routes);

    // The release driver.
    let book = stores.catalog;
    // The controller release step sends the volume's secrets, read from the book.
    let detacher = Arc::new(ShimDetacher::new(
        shim.clone(),
        config.call_timeout,
        Arc::new(CatalogSecrets::new(Arc::clone(&book))),
    ));
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    me.hash(&mut hasher);
    let driver_config = DriverConfig {
        machine: MachineConfig {
            backoff: config.release_backoff,
            duties: stores.duties.clone(),
            controller_calls_per_plugin: config.controller_calls,
            ..MachineConfig::with_seed(hasher.finish())
        },
        call_timeout: config.call_timeout.saturating_mul(2),
        // This node's steps call its own plugins, found by the first scan. With shared claims
        // a controller may be another member's, which this agent never fingerprints, so
        // controller steps do not wait.
        first_plugin_wait: FIRST_FINGERPRINT_WAIT,
        first_plugin_wait_controllers: !stores.shared,
        ..DriverConfig::default()
    };
    let (claims, driver) = ClaimsDriver::start(
        stores.claims,
        Arc::clone(&detacher),
        detacher,
        driver_config,
    )
    .await?;
    plugins.set_claims(claims.clone());
    // Subscribed now, so that no event of the releases resumed below goes unlogged.
    let log_events = claims.log_events();
    // Releases the store says are unfinished: the driver resumes each at its checkpointed step.
    let store_description = stores.description;
    #[cfg(feature = "etcd")]
    let membership = match (&stores.etcd, &config.store) {
        (Some(store), crate::config::StoreChoice::Etcd(settings)) => {
            let record = cluster::AgentRecord::new(
                me.to_string(),
                random_file(&data, "instance.id")?,
                cluster::MemberInfo {
                    http: http_addr.to_string(),
                    shim: shim_addr.map(|a| a.to_string()).unwrap_or_default(),
                    plugins: Vec::new(),
                },
            );
            let joined = cluster::Cluster::join(store, settings, &record, claims.clone())
                .await
                .map_err(ServeError::Cluster)?;
            Some((Arc::new(joined), record))
        }
        _ => None,
    };
    #[cfg(feature = "etcd")]
    let cluster_status = membership
        .as_ref()
        .map(|(m, _)| Arc::clone(m) as Arc<dyn agent::ClusterStatus>);
    #[cfg(not(feature = "etcd"))]
    let cluster_status = None;
    let resumed = book
        .list()
        .iter()
        .filter_map(|v| claims.record(&v.id))
        .flat_map(|r| r.claims().to_vec())
        .filter(|c| c.state().is_releasing())
        .count();
    let peers = Arc::new(agent::AgentPeers::new(cluster_status.clone()));
    let mut service = csi_control::VolumeService::builder(
        me.clone(),
        book,
        claims,
        shim.clone(),
        plugins.manager().clone(),
        volumes,
    )
    .peers(Arc::clone(&peers) as Arc<dyn csi_control::Peers>)
    .call_timeout(config.call_timeout);
    if let Some(store) = stores.forgetting {
        service = service.forgetting(store);
    }
    let service = service.build();
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
        peers,
        cluster: cluster_status,
        reconciled: Mutex::new(None),
    });

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(plugins.clone().run(config.scan_interval, stop_rx.clone()));
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
        let (shim, shutdown) = (shim.clone(), stopped(stop_rx.clone()));
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
    // (staged and published again) once those are healthy, or after a bounded wait.
    {
        let agent = Arc::clone(&agent);
        let mut stop = stop_rx.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = agent.reconcile_node(FIRST_FINGERPRINT_WAIT) => {}
                _ = stop.changed() => {}
            }
        });
    }
    tasks.spawn(log_long_calls(
        Arc::clone(plugins.calls_in_flight()),
        stop_rx.clone(),
    ));
    #[cfg(feature = "etcd")]
    if let Some((membership, record)) = &membership {
        tasks.spawn(cluster::run(
            Arc::clone(&agent),
            Arc::clone(membership),
            record.clone(),
            own_token.clone(),
            config.scan_interval,
            stop_rx.clone(),
        ));
    }
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
        store = %store_description,
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
    // Every release step was checkpointed before its call; stopping drops calls in flight,
    // and the next start repeats the step from the store.
    driver.shutdown().await;
    // Hand the controller duty and the membership over now rather than at lease expiry.
    #[cfg(feature = "etcd")]
    if let Some((cluster, _)) = &membership {
        cluster.membership.leave().await;
    }
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("some tasks did not stop within 10s; exiting anyway");
    }
    let _ = std::fs::remove_file(&info_path);
    tracing::info!("csi-agent stopped");
    stopped
}

/// csi-node's volume manager as the agent keeps it: paths under `<data_dir>/node`
/// (`staging/<volume>`, `per-workload/<workload>/<volume>/<usage>`), usage records in `db`
/// (its file `db_file`; one record per volume, group-committed with the claims when `db` is
/// the claim store), plugins from the agent's plugin manager. The records of an older version's
/// `<data_dir>/node/usage.json` move into `db` once, and the file is renamed
/// `usage.json.migrated`. Blocks on the disk.
///
/// # Errors
///
/// A [`StateFileError`](csi_node::state::StateFileError) when the records cannot be read or
/// moved.
pub fn open_volumes(
    data_dir: &Path,
    plugins: &plugins::Plugins,
    db: &RedbStore,
    db_file: &Path,
) -> Result<VolumeManager, csi_node::state::StateFileError> {
    let root = data_dir.join("node");
    let usage = UsageDb::open(db, db_file, Some(&root.join("usage.json")))?;
    VolumeManager::open_with(
        Layout::new(&root),
        Arc::new(usage),
        Arc::new(plugins.manager().clone()),
    )
}

/// How long, after a start with the embedded store, releases loaded from the store wait for
/// their plugin's first fingerprint before their first attempt (a plugin whose socket is
/// there is fingerprinted within one scan; a plugin that never comes is tried after this).
const FIRST_FINGERPRINT_WAIT: Duration = Duration::from_secs(10);

/// csi-control's stores of the configured kind. A file of the etcd settings that cannot be
/// used, or etcd in a build without it, is a configuration error naming the agent's key.
async fn open_stores(config: &AgentConfig) -> Result<Stores, ServeError> {
    let opened = Stores::open(&config.store.stores(), &config.data_dir, &config.node_id).await;
    opened.map_err(|e| match e {
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
        e => ServeError::Stores(e),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster configuration (`store = etcd://...`), its other keys as `set` leaves them.
    fn cluster_config(dir: &Path, set: impl FnOnce(&mut ConfigArgs)) -> AgentConfig {
        let token = dir.join("token");
        std::fs::write(&token, "a-cluster-token-of-enough-length").expect("token");
        let mut args = ConfigArgs {
            data_dir: Some(dir.join("data")),
            store: Some("etcd://127.0.0.1:1".into()),
            shim_listen: Some("127.0.0.1:0".into()),
            cluster_token_file: Some(token),
            ..ConfigArgs::default()
        };
        set(&mut args);
        AgentConfig::load(&args).expect("a valid cluster configuration")
    }

    /// The stores' errors are the agent's configuration errors, naming its keys.
    #[tokio::test]
    async fn a_store_that_cannot_be_opened_names_the_agent_s_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        #[cfg(not(feature = "etcd"))]
        let (config, key) = (cluster_config(dir.path(), |_| {}), "store");
        #[cfg(feature = "etcd")]
        let (config, key) = (
            cluster_config(dir.path(), |a| {
                a.etcd_ca_file = Some(dir.path().join("no-such-ca.pem"));
            }),
            "etcd_ca_file",
        );
        match open_stores(&config).await {
            Err(ServeError::Config(ConfigError::Invalid { key: named, .. })) => {
                assert_eq!(named, key);
            }
            other => panic!("expected a configuration error naming {key}: {other:?}"),
        }
    }
}
