//! `csi-agent serve` configuration: flags, then environment variables, then an optional TOML
//! file, then defaults (the first source that sets a key wins).
//!
//! Every key has one name, used in all three places: `health_interval` is the flag
//! `--health-interval`, the variable `CSI_AGENT_HEALTH_INTERVAL` and the file key
//! `health_interval`. Every value is checked before anything starts; a bad one is a
//! [`ConfigError`] naming the key.
//!
//! ```toml
//! node_id = "node-a"
//! data_dir = "/var/lib/csi-agent"
//! listen = "127.0.0.1:7600"
//! shim_listen = "127.0.0.1:7400"
//! peers = ["node-b=127.0.0.1:7401,127.0.0.1:7601"]
//! cluster_token_file = "/etc/csi-agent/cluster.token"
//! health_interval = "10s"
//! ```

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_claims::backoff::BackoffPolicy;
use csi_claims::duty::{DutyTiming, MIN_DUTY_MARGIN};
use csi_control::stores::{EtcdConfig, StoreConfig};

use csi_node::detach::NodeDetachPolicy;
use csi_rpc_shim::Token;
use csi_structs::NodeId;
use serde::Deserialize;

/// The configuration flags of `csi-agent serve` (each also read from `CSI_AGENT_<KEY>`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ConfigArgs {
    /// A TOML file with any of the keys below.
    #[arg(long, env = "CSI_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// This agent's node id (default `node-1`).
    #[arg(long, env = "CSI_AGENT_NODE_ID")]
    pub node_id: Option<String>,
    /// Where the agent keeps its state: claim store, volume book, usage, mount paths.
    #[arg(long, env = "CSI_AGENT_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The directory watched for plugin sockets, one `<plugin-id>.sock` per plugin
    /// (default `<data_dir>/plugins`).
    #[arg(long, env = "CSI_AGENT_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// Kubelet's plugin registration directory (e.g. `/var/lib/kubelet/plugins_registry`),
    /// watched for the sockets of node-driver-registrar sidecars: each announces a CSI
    /// driver, registered at the endpoint it gives (default: none).
    #[arg(long, env = "CSI_AGENT_KUBELET_REGISTRATION_DIR")]
    pub kubelet_registration_dir: Option<PathBuf>,
    /// Loopback address of the control API and `/metrics` (default `127.0.0.1:7600`; port 0
    /// picks one, written to `<data_dir>/agent.json`).
    #[arg(long, env = "CSI_AGENT_LISTEN")]
    pub listen: Option<String>,
    /// Address of the agent-to-agent (shim) gRPC server; none by default.
    #[arg(long, env = "CSI_AGENT_SHIM_LISTEN")]
    pub shim_listen: Option<String>,
    /// A peer agent: `NODE=SHIM_ADDR,HTTP_ADDR` (repeatable; `;` between peers in the variable).
    #[arg(long = "peer", env = "CSI_AGENT_PEERS", value_delimiter = ';')]
    pub peers: Vec<String>,
    /// File holding the token agents present to each other (required with peers).
    #[arg(long, env = "CSI_AGENT_CLUSTER_TOKEN_FILE")]
    pub cluster_token_file: Option<PathBuf>,
    /// How often the plugin directory is scanned (default `1s`).
    #[arg(long, env = "CSI_AGENT_SCAN_INTERVAL")]
    pub scan_interval: Option<String>,
    /// How often each plugin is probed (default `5s`).
    #[arg(long, env = "CSI_AGENT_HEALTH_INTERVAL")]
    pub health_interval: Option<String>,
    /// How often a fingerprinted plugin is fingerprinted again (default `30s`).
    #[arg(long, env = "CSI_AGENT_FINGERPRINT_INTERVAL")]
    pub fingerprint_interval: Option<String>,
    /// How often peers are asked for their plugins (default `2s`).
    #[arg(long, env = "CSI_AGENT_PEER_INTERVAL")]
    pub peer_interval: Option<String>,
    /// The deadline of one plugin or agent-to-agent call (default `60s`).
    #[arg(long, env = "CSI_AGENT_CALL_TIMEOUT")]
    pub call_timeout: Option<String>,
    /// First delay before a failed release step is retried (default `1s`).
    #[arg(long, env = "CSI_AGENT_RELEASE_BACKOFF_INITIAL")]
    pub release_backoff_initial: Option<String>,
    /// Longest delay between retries of a failed release step (default `60s`).
    #[arg(long, env = "CSI_AGENT_RELEASE_BACKOFF_MAX")]
    pub release_backoff_max: Option<String>,
    /// How long a node detach call (unpublish, unstage) waits for a missing node plugin
    /// socket before the release step fails and is retried by the release driver (default
    /// `1s`).
    #[arg(long, env = "CSI_AGENT_NODE_DETACH_SOCKET_WAIT")]
    pub node_detach_socket_wait: Option<String>,
    /// Attempts per node detach call; the release driver retries failed steps itself
    /// (default `1`, at most 10).
    #[arg(long, env = "CSI_AGENT_NODE_DETACH_ATTEMPTS")]
    pub node_detach_attempts: Option<String>,
    /// How many `ControllerUnpublishVolume` calls of one plugin the release driver makes at
    /// once (default `1`: one at a time, as many plugins expect; at most 64).
    #[arg(long, env = "CSI_AGENT_CONTROLLER_CALLS")]
    pub controller_calls: Option<String>,
    /// Log filter, e.g. `info` or `csi_agent=debug` (default `info`).
    #[arg(long, env = "CSI_AGENT_LOG")]
    pub log: Option<String>,
    /// Where volumes and claims live: `embedded` (this node only, the default) or
    /// `etcd://HOST:PORT[,HOST:PORT...]` (a cluster of agents sharing one etcd; needs a
    /// csi-agent built with `--features etcd`).
    #[arg(long, env = "CSI_AGENT_STORE")]
    pub store: Option<String>,
    /// The etcd key prefix of this cluster (default `/csi-agent`).
    #[arg(long, env = "CSI_AGENT_STORE_PREFIX")]
    pub store_prefix: Option<String>,
    /// The CA certificate (PEM) that signed etcd's server certificates; setting it makes the
    /// etcd endpoints `https://`.
    #[arg(long, env = "CSI_AGENT_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// This agent's client certificate for etcd (PEM), with `etcd_key_file`.
    #[arg(long, env = "CSI_AGENT_ETCD_CERT_FILE")]
    pub etcd_cert_file: Option<PathBuf>,
    /// The private key of `etcd_cert_file` (PEM).
    #[arg(long, env = "CSI_AGENT_ETCD_KEY_FILE")]
    pub etcd_key_file: Option<PathBuf>,
    /// The etcd user, when etcd's authentication is enabled (with `etcd_password_file`).
    #[arg(long, env = "CSI_AGENT_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// A file holding the etcd user's password (never given on the command line).
    #[arg(long, env = "CSI_AGENT_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// The lease of this agent's membership and of the controller duty in etcd: how long a
    /// dead agent keeps them (default `10s`, at least `2s`).
    #[arg(long, env = "CSI_AGENT_LEASE_TTL")]
    pub lease_ttl: Option<String>,
    /// How long before its lease could expire the controller duty's holder stops starting
    /// controller steps (default a fifth of `lease_ttl`; at least `100ms`, less than a third
    /// of `lease_ttl`).
    #[arg(long, env = "CSI_AGENT_LEASE_MARGIN")]
    pub lease_margin: Option<String>,
}

/// The TOML file: the same keys, all optional; unknown keys are refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    node_id: Option<String>,
    data_dir: Option<PathBuf>,
    plugin_dir: Option<PathBuf>,
    kubelet_registration_dir: Option<PathBuf>,
    listen: Option<String>,
    shim_listen: Option<String>,
    peers: Option<Vec<String>>,
    cluster_token_file: Option<PathBuf>,
    scan_interval: Option<String>,
    health_interval: Option<String>,
    fingerprint_interval: Option<String>,
    peer_interval: Option<String>,
    call_timeout: Option<String>,
    release_backoff_initial: Option<String>,
    release_backoff_max: Option<String>,
    node_detach_socket_wait: Option<String>,
    node_detach_attempts: Option<u32>,
    controller_calls: Option<u32>,
    log: Option<String>,
    store: Option<String>,
    store_prefix: Option<String>,
    etcd_ca_file: Option<PathBuf>,
    etcd_cert_file: Option<PathBuf>,
    etcd_key_file: Option<PathBuf>,
    etcd_user: Option<String>,
    etcd_password_file: Option<PathBuf>,
    lease_ttl: Option<String>,
    lease_margin: Option<String>,
}

/// Where volumes and claims live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreChoice {
    /// This node's data directory (`claims.redb`, `volumes.json`).
    Embedded,
    /// A cluster of agents sharing one etcd (boxed: the settings are large, and the
    /// configuration is made once).
    Etcd(Box<EtcdSettings>),
}

impl StoreChoice {
    /// Where csi-control's [`Stores`](csi_control::Stores) are opened.
    pub fn stores(&self) -> StoreConfig {
        match self {
            StoreChoice::Embedded => StoreConfig::Embedded,
            StoreChoice::Etcd(settings) => StoreConfig::Etcd(Box::new(settings.store.clone())),
        }
    }
}

/// Cluster mode's settings: how to reach etcd (csi-control's [`EtcdConfig`], whose files are
/// read when `serve` starts) and the lease of the membership and the controller duty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdSettings {
    /// The endpoints, the key prefix, TLS and the user.
    pub store: EtcdConfig,
    /// The lease of membership and of the controller duty.
    pub lease_ttl: Duration,
    /// The controller duty's timing: its lease (`lease_ttl`) and the margin its holder keeps
    /// under it (`lease_margin`), checked by [`DutyTiming::with_margin`].
    pub duty: DutyTiming,
}

impl EtcdSettings {
    /// The store as the operator wrote it ([`EtcdConfig::display`]).
    pub fn display(&self) -> String {
        self.store.display()
    }
}

/// The shortest `lease_ttl` (etcd does not keep shorter leases reliably).
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// Parses `lease_margin` for a lease of `lease_ttl`: a duration of at least
/// [`MIN_DUTY_MARGIN`] and less than a third of `lease_ttl` ([`DutyTiming::with_margin`]).
///
/// # Errors
///
/// [`ConfigError::Invalid`] naming `lease_margin`, the value and both limits.
pub fn parse_margin(text: &str, lease_ttl: Duration) -> Result<DutyTiming, ConfigError> {
    // The largest whole number of milliseconds under a third of the TTL.
    let ttl_ms = u64::try_from(lease_ttl.as_millis()).unwrap_or(u64::MAX);
    let limits = format!(
        "must be at least {}ms and less than a third of lease_ttl ({lease_ttl:?}): at most {}ms",
        MIN_DUTY_MARGIN.as_millis(),
        ttl_ms.saturating_sub(1) / 3
    );
    let margin = parse_duration("lease_margin", text).map_err(|e| match e {
        ConfigError::Invalid { reason, .. } => {
            invalid("lease_margin", text, format!("{reason}; {limits}"))
        }
        other => other,
    })?;
    DutyTiming::with_margin(lease_ttl, margin).map_err(|_| invalid("lease_margin", text, limits))
}

/// Parses `store`: `embedded` or `etcd://HOST:PORT[,HOST:PORT...]`; `https` picks the
/// endpoints' scheme.
///
/// # Errors
///
/// [`ConfigError::Invalid`] naming `store`.
pub fn parse_store(text: &str, https: bool) -> Result<Option<Vec<String>>, ConfigError> {
    let expected = "expected `embedded` or etcd://HOST:PORT[,HOST:PORT...]";
    let trimmed = text.trim();
    if trimmed == "embedded" {
        return Ok(None);
    }
    let list = trimmed
        .strip_prefix("etcd://")
        .ok_or_else(|| invalid("store", text, expected))?;
    let scheme = if https { "https" } else { "http" };
    let mut endpoints = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        let (host, port) = part
            .rsplit_once(':')
            .ok_or_else(|| invalid("store", text, format!("{part:?} has no port; {expected}")))?;
        let host_ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'));
        if !host_ok || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(invalid(
                "store",
                text,
                format!("{part:?} is not HOST:PORT; {expected}"),
            ));
        }
        endpoints.push(format!("{scheme}://{part}"));
    }
    if endpoints.len() > 16 {
        return Err(invalid("store", text, "at most 16 etcd endpoints"));
    }
    Ok(Some(endpoints))
}

/// A peer agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its node id.
    pub node: NodeId,
    /// Its shim (agent-to-agent gRPC) address.
    pub shim: SocketAddr,
    /// Its HTTP address (for its plugin list).
    pub http: SocketAddr,
}

/// The checked configuration of `csi-agent serve`.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// This agent's node id.
    pub node_id: NodeId,
    /// The state directory.
    pub data_dir: PathBuf,
    /// The watched plugin directory.
    pub plugin_dir: PathBuf,
    /// Kubelet's plugin registration directory, when watched.
    pub kubelet_registration_dir: Option<PathBuf>,
    /// Control API and metrics address (loopback only).
    pub listen: SocketAddr,
    /// Shim server address, if any.
    pub shim_listen: Option<SocketAddr>,
    /// Peer agents.
    pub peers: Vec<Peer>,
    /// The cluster token (never printed).
    pub cluster_token: Option<ClusterToken>,
    /// Plugin directory scan interval.
    pub scan_interval: Duration,
    /// Plugin probe interval.
    pub health_interval: Duration,
    /// Plugin re-fingerprint interval.
    pub fingerprint_interval: Duration,
    /// Peer poll interval.
    pub peer_interval: Duration,
    /// Deadline of one plugin or agent call.
    pub call_timeout: Duration,
    /// Retry delays of failed release steps.
    pub release_backoff: BackoffPolicy,
    /// Socket wait and attempts of node detach calls.
    pub node_detach: NodeDetachPolicy,
    /// `ControllerUnpublishVolume` calls per plugin at once.
    pub controller_calls: NonZeroUsize,
    /// Log filter.
    pub log: String,
    /// Where volumes and claims live.
    pub store: StoreChoice,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("config file {path}: cannot read it")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The configuration file is not valid TOML or has an unknown key or a wrong type.
    #[error("config file {path}: {message}")]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// The parser's explanation (it names the key and line), each line cut to
        /// [`MAX_SHOWN_BYTES`].
        message: String,
    },
    /// A key has a value that cannot be used.
    #[error("config key `{key}` = {value:?}: {reason}")]
    Invalid {
        /// The key (flag `--key-name`, variable `CSI_AGENT_KEY_NAME`, file key `key_name`).
        key: &'static str,
        /// The value given, cut to [`MAX_SHOWN_BYTES`] (never a secret: token values are
        /// not shown).
        value: String,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// A required key has no value.
    #[error("config key `{key}` is required: {reason}")]
    Missing {
        /// The key.
        key: &'static str,
        /// When and why it is needed.
        reason: &'static str,
    },
}

/// The most of a value (or of one line of a file's parse error) an error shows, in bytes.
pub const MAX_SHOWN_BYTES: usize = 160;

/// At most [`MAX_SHOWN_BYTES`] of `text`, cut on a character boundary and saying how long it
/// was: an error that repeats a megabyte the operator wrote is no clearer for it.
fn shown(text: &str) -> String {
    if text.len() <= MAX_SHOWN_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_SHOWN_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// A file parser's explanation with every line cut by [`shown`]: the parser quotes the
/// offending line whole, however long it is.
fn parse_message(message: &str) -> String {
    message.lines().map(shown).collect::<Vec<_>>().join("\n")
}

fn invalid(key: &'static str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: shown(value),
        reason: reason.into(),
    }
}

/// The longest interval or timeout accepted (one day).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Parses `500ms`, `10s`, `2m` or `1h` (a whole number and a unit).
///
/// # Errors
///
/// [`ConfigError::Invalid`] naming `key` when the text is not such a duration, is zero or is
/// longer than [`MAX_DURATION`].
pub fn parse_duration(key: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let expected = "expected a whole number with a unit: ms, s, m or h (e.g. 500ms, 10s)";
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| invalid(key, text, expected))?;
    let (digits, unit) = trimmed.split_at(split);
    let n: u64 = digits.parse().map_err(|_| invalid(key, text, expected))?;
    let millis = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => return Err(invalid(key, text, expected)),
    }
    .ok_or_else(|| invalid(key, text, "too large"))?;
    let d = Duration::from_millis(millis);
    if d.is_zero() {
        return Err(invalid(key, text, "must be greater than zero"));
    }
    if d > MAX_DURATION {
        return Err(invalid(key, text, "must be at most 24h"));
    }
    Ok(d)
}

/// The most `controller_calls` accepts.
pub const MAX_CONTROLLER_CALLS: u32 = 64;

/// Parses `controller_calls`: a whole number from 1 to [`MAX_CONTROLLER_CALLS`].
///
/// # Errors
///
/// [`ConfigError::Invalid`] naming `controller_calls`.
pub fn parse_controller_calls(text: &str) -> Result<NonZeroUsize, ConfigError> {
    let n: u32 = text
        .trim()
        .parse()
        .map_err(|_| invalid("controller_calls", text, "expected a whole number, e.g. 1"))?;
    check_controller_calls(n).map_err(|_| controller_calls_out_of_range(text))
}

fn check_controller_calls(n: u32) -> Result<NonZeroUsize, ()> {
    if n > MAX_CONTROLLER_CALLS {
        return Err(());
    }
    NonZeroUsize::new(n as usize).ok_or(())
}

fn controller_calls_out_of_range(text: &str) -> ConfigError {
    invalid(
        "controller_calls",
        text,
        format!("must be from 1 to {MAX_CONTROLLER_CALLS}"),
    )
}

/// The key of [`NodeDetachPolicy::max_attempts`].
const ATTEMPTS_KEY: &str = "node_detach_attempts";

/// Parses the attempt count of node detach calls: a whole number from 1 to
/// [`NodeDetachPolicy::MAX_ATTEMPTS`] ([`NodeDetachPolicy::check_attempts`]).
///
/// # Errors
///
/// [`ConfigError::Invalid`] naming `node_detach_attempts`.
pub fn parse_attempts(text: &str) -> Result<u32, ConfigError> {
    let n: u32 = text
        .trim()
        .parse()
        .map_err(|_| invalid(ATTEMPTS_KEY, text, "expected a whole number, e.g. 1"))?;
    NodeDetachPolicy::check_attempts(n).map_err(|_| attempts_out_of_range(text))
}

/// The error for an attempt count [`NodeDetachPolicy::check_attempts`] refused, given as `text`.
fn attempts_out_of_range(text: &str) -> ConfigError {
    invalid(
        ATTEMPTS_KEY,
        text,
        format!("must be from 1 to {}", NodeDetachPolicy::MAX_ATTEMPTS),
    )
}

fn parse_addr(key: &'static str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.trim()
        .parse()
        .map_err(|_| invalid(key, text, "expected IP:PORT, e.g. 127.0.0.1:7600"))
}

/// Parses one peer, `NODE=SHIM_ADDR,HTTP_ADDR`.
///
/// # Errors
///
/// [`ConfigError::Invalid`] for key `peers` naming what is wrong.
pub fn parse_peer(text: &str) -> Result<Peer, ConfigError> {
    let expected = "expected NODE=SHIM_ADDR,HTTP_ADDR, e.g. node-b=127.0.0.1:7401,127.0.0.1:7601";
    let (node, addrs) = text
        .split_once('=')
        .ok_or_else(|| invalid("peers", text, expected))?;
    let (shim, http) = addrs
        .split_once(',')
        .ok_or_else(|| invalid("peers", text, expected))?;
    let node = NodeId::new(node.trim())
        .map_err(|e| invalid("peers", text, format!("bad node id: {e}")))?;
    let shim = shim
        .trim()
        .parse()
        .map_err(|_| invalid("peers", text, "bad shim address; expected IP:PORT"))?;
    let http = http
        .trim()
        .parse()
        .map_err(|_| invalid("peers", text, "bad http address; expected IP:PORT"))?;
    Ok(Peer { node, shim, http })
}

/// The token agents present to each other: the shim's [`Token`] and the same value for the
/// peer HTTP endpoint. `Debug` prints nothing of it.
#[derive(Clone)]
pub struct ClusterToken {
    /// For the shim.
    pub token: Token,
    text: String,
}

impl ClusterToken {
    /// The value, for the peer HTTP endpoint's bearer header.
    pub fn expose(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterToken(<redacted>)")
    }
}

fn read_token(path: &Path) -> Result<ClusterToken, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        invalid(
            "cluster_token_file",
            &shown,
            format!("cannot read the file: {e}"),
        )
    })?;
    // The token's own error names only its length rule, never its value.
    let text = text.trim().to_owned();
    let token = Token::new(text.clone())
        .map_err(|e| invalid("cluster_token_file", &shown, format!("bad token: {e}")))?;
    Ok(ClusterToken { token, text })
}

impl AgentConfig {
    /// Merges flags (and their variables, which clap already read) over the file named by
    /// `--config`, over defaults, and checks every value.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first bad or missing key.
    pub fn load(args: &ConfigArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
                        path: path.clone(),
                        source,
                    })?;
                toml::from_str::<FileConfig>(&text).map_err(|e| ConfigError::ParseFile {
                    path: path.clone(),
                    message: parse_message(&e.to_string()),
                })?
            }
            None => FileConfig::default(),
        };
        Self::merge(args.clone(), file)
    }

    /// The `store` key and the etcd keys that go with it.
    fn store(a: &mut ConfigArgs, f: &mut FileConfig) -> Result<StoreChoice, ConfigError> {
        let ca_file = a.etcd_ca_file.take().or(f.etcd_ca_file.take());
        let cert = a.etcd_cert_file.take().or(f.etcd_cert_file.take());
        let key = a.etcd_key_file.take().or(f.etcd_key_file.take());
        let user = a.etcd_user.take().or(f.etcd_user.take());
        let password = a.etcd_password_file.take().or(f.etcd_password_file.take());
        let prefix = a.store_prefix.take().or(f.store_prefix.take());
        let ttl = a.lease_ttl.take().or(f.lease_ttl.take());
        let margin = a.lease_margin.take().or(f.lease_margin.take());
        let text = a
            .store
            .take()
            .or(f.store.take())
            .unwrap_or_else(|| "embedded".to_owned());
        let Some(endpoints) = parse_store(&text, ca_file.is_some())? else {
            let stray = [
                ("store_prefix", prefix.is_some()),
                ("etcd_ca_file", ca_file.is_some()),
                ("etcd_cert_file", cert.is_some()),
                ("etcd_key_file", key.is_some()),
                ("etcd_user", user.is_some()),
                ("etcd_password_file", password.is_some()),
                ("lease_ttl", ttl.is_some()),
                ("lease_margin", margin.is_some()),
            ];
            if let Some((key, _)) = stray.iter().find(|(_, set)| *set) {
                return Err(invalid(
                    key,
                    "(set)",
                    "only used with an etcd store (`store = etcd://HOST:PORT`)",
                ));
            }
            return Ok(StoreChoice::Embedded);
        };
        let prefix = prefix.unwrap_or_else(|| "/csi-agent".to_owned());
        let segments_ok = prefix
            .trim_end_matches('/')
            .strip_prefix('/')
            .is_some_and(|rest| {
                !rest.is_empty()
                    && rest.split('/').all(|seg| {
                        !seg.is_empty()
                            && seg
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                    })
            });
        if !segments_ok || prefix.len() > 128 {
            return Err(invalid(
                "store_prefix",
                &prefix,
                "expected /name[/name...] of letters, digits, `-`, `_` and `.`, at most 128 bytes",
            ));
        }
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::Missing {
                    key: "etcd_key_file",
                    reason: "a client certificate needs its private key",
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::Missing {
                    key: "etcd_cert_file",
                    reason: "a private key needs its client certificate",
                });
            }
        };
        if identity.is_some() && ca_file.is_none() {
            return Err(ConfigError::Missing {
                key: "etcd_ca_file",
                reason: "client certificates are only sent over TLS, which needs the CA",
            });
        }
        let user = match (user, password) {
            (Some(u), Some(p)) if !u.trim().is_empty() => Some((u, p)),
            (Some(u), Some(_)) => return Err(invalid("etcd_user", &u, "must not be empty")),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::Missing {
                    key: "etcd_password_file",
                    reason: "the etcd user's password is read from this file",
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::Missing {
                    key: "etcd_user",
                    reason: "a password file needs the user it belongs to",
                });
            }
        };
        let ttl_text = ttl.unwrap_or_else(|| "10s".to_owned());
        let lease_ttl = parse_duration("lease_ttl", &ttl_text)?;
        if lease_ttl < MIN_LEASE_TTL || lease_ttl.subsec_nanos() != 0 {
            return Err(invalid(
                "lease_ttl",
                &ttl_text,
                "must be whole seconds, at least 2s",
            ));
        }
        let duty = match margin {
            None => DutyTiming::new(lease_ttl)
                .map_err(|e| invalid("lease_ttl", &ttl_text, e.to_string()))?,
            Some(text) => parse_margin(&text, lease_ttl)?,
        };
        Ok(StoreChoice::Etcd(Box::new(EtcdSettings {
            store: EtcdConfig {
                endpoints,
                prefix,
                ca_file,
                identity,
                user,
            },
            lease_ttl,
            duty,
        })))
    }

    fn merge(mut a: ConfigArgs, mut f: FileConfig) -> Result<Self, ConfigError> {
        let store = Self::store(&mut a, &mut f)?;
        let node_text = a
            .node_id
            .or(f.node_id)
            .unwrap_or_else(|| "node-1".to_owned());
        let node_id = NodeId::new(node_text.clone())
            .map_err(|e| invalid("node_id", &node_text, e.to_string()))?;
        let data_dir = a
            .data_dir
            .or(f.data_dir)
            .unwrap_or_else(|| PathBuf::from("/var/lib/csi-agent"));
        if data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "", "must not be empty"));
        }
        let plugin_dir = a
            .plugin_dir
            .or(f.plugin_dir)
            .unwrap_or_else(|| data_dir.join("plugins"));
        if plugin_dir.as_os_str().is_empty() {
            return Err(invalid("plugin_dir", "", "must not be empty"));
        }
        let kubelet_registration_dir = a.kubelet_registration_dir.or(f.kubelet_registration_dir);
        if kubelet_registration_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(invalid(
                "kubelet_registration_dir",
                "",
                "must not be empty (leave it out to watch none)",
            ));
        }
        let listen_text = a
            .listen
            .or(f.listen)
            .unwrap_or_else(|| "127.0.0.1:7600".to_owned());
        let listen = parse_addr("listen", &listen_text)?;
        if !listen.ip().is_loopback() {
            return Err(invalid(
                "listen",
                &listen_text,
                "the control API only listens on a loopback address (127.0.0.1 or ::1)",
            ));
        }
        let shim_listen = a
            .shim_listen
            .or(f.shim_listen)
            .map(|t| parse_addr("shim_listen", &t))
            .transpose()?;
        let peer_texts = if a.peers.is_empty() {
            f.peers.unwrap_or_default()
        } else {
            a.peers
        };
        let peers = peer_texts
            .iter()
            .map(|p| parse_peer(p))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(dup) = peers.iter().find(|p| p.node == node_id) {
            return Err(invalid(
                "peers",
                dup.node.as_str(),
                "a peer has this agent's own node id",
            ));
        }
        let cluster_token = a
            .cluster_token_file
            .or(f.cluster_token_file)
            .map(|p| read_token(&p))
            .transpose()?;
        if cluster_token.is_none() && (!peers.is_empty() || shim_listen.is_some()) {
            return Err(ConfigError::Missing {
                key: "cluster_token_file",
                reason: "agents authenticate each other with it when peers or shim_listen are set",
            });
        }
        let duration = |key, flag: Option<String>, file: Option<String>, default: &str| {
            parse_duration(key, flag.or(file).as_deref().unwrap_or(default))
        };
        let log = a.log.or(f.log).unwrap_or_else(|| "info".to_owned());
        if tracing_subscriber::EnvFilter::try_new(&log).is_err() {
            return Err(invalid(
                "log",
                &log,
                "not a log filter (e.g. info, csi_agent=debug)",
            ));
        }
        let backoff_initial = duration(
            "release_backoff_initial",
            a.release_backoff_initial,
            f.release_backoff_initial,
            "1s",
        )?;
        let max_text = a
            .release_backoff_max
            .or(f.release_backoff_max)
            .unwrap_or_else(|| "60s".to_owned());
        let backoff_max = parse_duration("release_backoff_max", &max_text)?;
        let release_backoff = BackoffPolicy::new(backoff_initial, backoff_max)
            .map_err(|e| invalid("release_backoff_max", &max_text, e.to_string()))?;
        let node_detach = NodeDetachPolicy {
            socket_wait: duration(
                "node_detach_socket_wait",
                a.node_detach_socket_wait,
                f.node_detach_socket_wait,
                "1s",
            )?,
            max_attempts: match (a.node_detach_attempts, f.node_detach_attempts) {
                (Some(text), _) => parse_attempts(&text)?,
                (None, Some(n)) => NodeDetachPolicy::check_attempts(n)
                    .map_err(|e| attempts_out_of_range(&e.attempts.to_string()))?,
                (None, None) => NodeDetachPolicy::DEFAULT.max_attempts,
            },
            ..NodeDetachPolicy::DEFAULT
        };
        let controller_calls = match (a.controller_calls, f.controller_calls) {
            (Some(text), _) => parse_controller_calls(&text)?,
            (None, Some(n)) => check_controller_calls(n)
                .map_err(|()| controller_calls_out_of_range(&n.to_string()))?,
            (None, None) => NonZeroUsize::MIN,
        };
        if let StoreChoice::Etcd(_) = store {
            if !peers.is_empty() {
                return Err(invalid(
                    "peers",
                    &peer_texts.join(";"),
                    "with an etcd store, agents find each other through etcd; remove the peers",
                ));
            }
            if shim_listen.is_none() {
                return Err(ConfigError::Missing {
                    key: "shim_listen",
                    reason: "with an etcd store, the other agents reach this one through it",
                });
            }
        }
        Ok(Self {
            store,
            node_id,
            release_backoff,
            node_detach,
            controller_calls,
            data_dir,
            plugin_dir,
            kubelet_registration_dir,
            listen,
            shim_listen,
            peers,
            cluster_token,
            scan_interval: duration("scan_interval", a.scan_interval, f.scan_interval, "1s")?,
            health_interval: duration(
                "health_interval",
                a.health_interval,
                f.health_interval,
                "5s",
            )?,
            fingerprint_interval: duration(
                "fingerprint_interval",
                a.fingerprint_interval,
                f.fingerprint_interval,
                "30s",
            )?,
            peer_interval: duration("peer_interval", a.peer_interval, f.peer_interval, "2s")?,
            call_timeout: duration("call_timeout", a.call_timeout, f.call_timeout, "60s")?,
            log,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(e: ConfigError) -> &'static str {
        match e {
            ConfigError::Invalid { key, .. } | ConfigError::Missing { key, .. } => key,
            other => panic!("not a key error: {other}"),
        }
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("k", "500ms").ok(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            parse_duration("k", "2m").ok(),
            Some(Duration::from_secs(120))
        );
        for bad in [
            "",
            "10",
            "s",
            "10x",
            "0s",
            "25h",
            "-1s",
            "99999999999999999999h",
        ] {
            assert!(parse_duration("k", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn peers_parse_and_name_the_key() {
        let p = parse_peer("b=127.0.0.1:1,127.0.0.1:2").expect("valid peer");
        assert_eq!(p.node.as_str(), "b");
        assert_eq!(p.http.port(), 2);
        for bad in [
            "b",
            "b=127.0.0.1:1",
            "=1.1.1.1:1,1.1.1.1:2",
            "b=x,127.0.0.1:2",
        ] {
            assert_eq!(key_of(parse_peer(bad).unwrap_err()), "peers", "{bad}");
        }
    }

    #[test]
    fn flags_win_over_the_file_and_bad_values_name_their_key() {
        let file: FileConfig = toml::from_str(
            "node_id = \"from-file\"\ndata_dir = \"/d\"\nhealth_interval = \"3s\"\n",
        )
        .expect("valid toml");
        let args = ConfigArgs {
            node_id: Some("from-flag".into()),
            ..ConfigArgs::default()
        };
        let c = AgentConfig::merge(args, file).expect("valid");
        assert_eq!(c.node_id.as_str(), "from-flag");
        assert_eq!(c.health_interval, Duration::from_secs(3));
        assert_eq!(c.plugin_dir, PathBuf::from("/d/plugins"));

        let bad =
            |args: ConfigArgs| key_of(AgentConfig::merge(args, FileConfig::default()).unwrap_err());
        let with = |f: fn(&mut ConfigArgs)| {
            let mut a = ConfigArgs::default();
            f(&mut a);
            a
        };
        assert_eq!(
            bad(with(|a| a.health_interval = Some("soon".into()))),
            "health_interval"
        );
        assert_eq!(bad(with(|a| a.listen = Some("0.0.0.0:1".into()))), "listen");
        assert_eq!(bad(with(|a| a.listen = Some("nope".into()))), "listen");
        assert_eq!(bad(with(|a| a.node_id = Some(String::new()))), "node_id");
        assert_eq!(
            bad(with(|a| a.peers = vec!["b=127.0.0.1:1,127.0.0.1:2".into()])),
            "cluster_token_file"
        );
        assert_eq!(bad(with(|a| a.log = Some("[[[".into()))), "log");
        assert_eq!(
            bad(with(|a| a.release_backoff_max = Some("10ms".into()))),
            "release_backoff_max"
        );
        for attempts in ["0", "11", "two", "-1"] {
            let args = ConfigArgs {
                node_detach_attempts: Some(attempts.into()),
                ..ConfigArgs::default()
            };
            assert_eq!(bad(args), "node_detach_attempts", "{attempts}");
        }
        assert_eq!(
            bad(with(|a| a.node_detach_socket_wait = Some("0s".into()))),
            "node_detach_socket_wait"
        );
    }

    #[test]
    fn controller_calls_default_to_one_and_are_bounded() {
        let c = AgentConfig::merge(ConfigArgs::default(), FileConfig::default()).expect("valid");
        assert_eq!(c.controller_calls.get(), 1);
        let file: FileConfig = toml::from_str("controller_calls = 8\n").expect("valid toml");
        let c = AgentConfig::merge(ConfigArgs::default(), file).expect("valid");
        assert_eq!(c.controller_calls.get(), 8);
        let flag = ConfigArgs {
            controller_calls: Some("64".into()),
            ..ConfigArgs::default()
        };
        let file: FileConfig = toml::from_str("controller_calls = 8\n").expect("valid toml");
        let c = AgentConfig::merge(flag, file).expect("the maximum is allowed");
        assert_eq!(c.controller_calls.get(), 64, "the flag wins");
        for text in ["0", "65", "many", "-1", ""] {
            let args = ConfigArgs {
                controller_calls: Some(text.into()),
                ..ConfigArgs::default()
            };
            let e = AgentConfig::merge(args, FileConfig::default()).unwrap_err();
            let shown = e.to_string();
            assert_eq!(key_of(e), "controller_calls", "{text:?}");
            assert!(shown.contains("controller_calls"), "{shown}");
        }
        let file: FileConfig = toml::from_str("controller_calls = 0\n").expect("valid toml");
        let e = AgentConfig::merge(ConfigArgs::default(), file).unwrap_err();
        assert!(e.to_string().contains("from 1 to 64"), "{e}");
    }

    #[test]
    fn node_detach_policy_defaults_and_overrides() {
        let c = AgentConfig::merge(ConfigArgs::default(), FileConfig::default()).expect("valid");
        assert_eq!(c.node_detach, NodeDetachPolicy::DEFAULT);
        let file: FileConfig =
            toml::from_str("node_detach_socket_wait = \"250ms\"\nnode_detach_attempts = 3\n")
                .expect("valid toml");
        let c = AgentConfig::merge(ConfigArgs::default(), file).expect("valid");
        assert_eq!(c.node_detach.socket_wait, Duration::from_millis(250));
        assert_eq!(c.node_detach.max_attempts, 3);
        let file: FileConfig = toml::from_str("node_detach_attempts = 0\n").expect("valid toml");
        let e = AgentConfig::merge(ConfigArgs::default(), file).unwrap_err();
        assert_eq!(key_of(e), "node_detach_attempts");
        let max = NodeDetachPolicy::MAX_ATTEMPTS;
        let file: FileConfig =
            toml::from_str(&format!("node_detach_attempts = {max}\n")).expect("valid toml");
        let c = AgentConfig::merge(ConfigArgs::default(), file).expect("the maximum is allowed");
        assert_eq!(c.node_detach.max_attempts, max);
        let file: FileConfig =
            toml::from_str(&format!("node_detach_attempts = {}\n", max + 1)).expect("valid toml");
        let e = AgentConfig::merge(ConfigArgs::default(), file).unwrap_err();
        let shown = e.to_string();
        assert_eq!(key_of(e), "node_detach_attempts");
        assert!(
            shown.contains(&format!("\"{}\"", max + 1)) && shown.contains(&format!("to {max}")),
            "the value and the bound are shown: {shown}"
        );
    }

    #[test]
    fn the_attempts_flag_help_states_the_bound() {
        use clap::Args as _;
        let command = ConfigArgs::augment_args(clap::Command::new("serve"));
        let arg = command
            .get_arguments()
            .find(|a| a.get_id() == "node_detach_attempts")
            .expect("the flag exists");
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let bound = format!("at most {}", NodeDetachPolicy::MAX_ATTEMPTS);
        assert!(help.contains(&bound), "{help:?} lacks {bound:?}");
    }

    #[test]
    fn the_example_file_parses_with_every_key() {
        let file: FileConfig =
            toml::from_str(include_str!("../agent.example.toml")).expect("example parses");
        assert!(file.node_id.is_some() && file.release_backoff_max.is_some());
        assert!(file.node_detach_socket_wait.is_some() && file.node_detach_attempts.is_some());
        assert_eq!(file.peers.map(|p| p.len()), Some(1));
        assert!(file.kubelet_registration_dir.is_some());
    }

    #[test]
    fn the_store_key_and_its_etcd_keys() {
        assert_eq!(parse_store("embedded", false).expect("valid"), None);
        assert_eq!(
            parse_store("etcd://10.0.0.1:2379,etcd-b:2379", false).expect("valid"),
            Some(vec![
                "http://10.0.0.1:2379".to_owned(),
                "http://etcd-b:2379".to_owned()
            ])
        );
        assert_eq!(
            parse_store("etcd://h:2379", true).expect("valid"),
            Some(vec!["https://h:2379".to_owned()])
        );
        for bad in [
            "etcd",
            "redis://h:1",
            "etcd://",
            "etcd://h",
            "etcd://h:0",
            "etcd://h:x",
        ] {
            assert_eq!(
                key_of(parse_store(bad, false).unwrap_err()),
                "store",
                "{bad}"
            );
        }

        let etcd = |f: fn(&mut ConfigArgs)| {
            let mut a = ConfigArgs {
                store: Some("etcd://127.0.0.1:2379".into()),
                shim_listen: Some("127.0.0.1:7400".into()),
                ..ConfigArgs::default()
            };
            f(&mut a);
            AgentConfig::merge(a, FileConfig::default())
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let token = dir.path().join("token");
        std::fs::write(&token, "a-cluster-token-of-enough-length").expect("token");
        let with_token = |mut a: ConfigArgs| {
            a.cluster_token_file = Some(token.clone());
            AgentConfig::merge(a, FileConfig::default())
        };
        let base = ConfigArgs {
            store: Some("etcd://127.0.0.1:2379".into()),
            shim_listen: Some("127.0.0.1:7400".into()),
            ..ConfigArgs::default()
        };
        let c = with_token(base.clone()).expect("valid cluster config");
        let StoreChoice::Etcd(settings) = &c.store else {
            panic!("not etcd: {:?}", c.store);
        };
        assert_eq!(settings.store.prefix, "/csi-agent");
        assert_eq!(settings.lease_ttl, Duration::from_secs(10));
        assert_eq!(settings.display(), "etcd://127.0.0.1:2379");

        let key = |r: Result<AgentConfig, ConfigError>| key_of(r.unwrap_err());
        assert_eq!(key(etcd(|a| a.shim_listen = None)), "shim_listen");
        assert_eq!(
            key(with_token(ConfigArgs {
                peers: vec!["b=127.0.0.1:1,127.0.0.1:2".into()],
                ..base.clone()
            })),
            "peers"
        );
        assert_eq!(key(etcd(|a| a.lease_ttl = Some("1s".into()))), "lease_ttl");
        assert_eq!(
            key(etcd(|a| a.lease_ttl = Some("2500ms".into()))),
            "lease_ttl"
        );
        assert_eq!(
            key(etcd(|a| a.store_prefix = Some("no-slash".into()))),
            "store_prefix"
        );
        assert_eq!(
            key(etcd(|a| a.store_prefix = Some("/a//b".into()))),
            "store_prefix"
        );
        assert_eq!(
            key(etcd(|a| a.etcd_cert_file = Some("/c.pem".into()))),
            "etcd_key_file"
        );
        assert_eq!(
            key(etcd(|a| {
                a.etcd_cert_file = Some("/c.pem".into());
                a.etcd_key_file = Some("/k.pem".into());
            })),
            "etcd_ca_file"
        );
        assert_eq!(
            key(etcd(|a| a.etcd_user = Some("root".into()))),
            "etcd_password_file"
        );
        assert_eq!(
            key(etcd(|a| a.etcd_password_file = Some("/p".into()))),
            "etcd_user"
        );
        // etcd keys without an etcd store are a mistake, not silently ignored.
        let e = AgentConfig::merge(
            ConfigArgs {
                store_prefix: Some("/x".into()),
                ..ConfigArgs::default()
            },
            FileConfig::default(),
        );
        assert_eq!(key(e), "store_prefix");
    }

    #[test]
    fn the_lease_margin_defaults_to_a_fifth_of_the_ttl_and_is_bounded_by_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let token = dir.path().join("token");
        std::fs::write(&token, "a-cluster-token-of-enough-length").expect("token");
        let load = |ttl: Option<&str>, margin: Option<&str>, file: &str| {
            let args = ConfigArgs {
                store: Some("etcd://127.0.0.1:2379".into()),
                shim_listen: Some("127.0.0.1:7400".into()),
                cluster_token_file: Some(token.clone()),
                lease_ttl: ttl.map(Into::into),
                lease_margin: margin.map(Into::into),
                ..ConfigArgs::default()
            };
            let file: FileConfig = toml::from_str(file).expect("valid toml");
            AgentConfig::merge(args, file).map(|c| match c.store {
                StoreChoice::Etcd(settings) => *settings,
                StoreChoice::Embedded => panic!("not etcd"),
            })
        };
        let defaults = load(None, None, "").expect("valid");
        assert_eq!(defaults.duty.ttl(), Duration::from_secs(10));
        assert_eq!(defaults.duty.margin(), Duration::from_secs(2));
        let short = load(Some("2s"), None, "").expect("valid");
        assert_eq!(short.duty.margin(), Duration::from_millis(400));
        let given = load(Some("4s"), Some("1333ms"), "").expect("just under a third");
        assert_eq!(given.duty.margin(), Duration::from_millis(1333));
        assert_eq!(given.duty.ttl(), given.lease_ttl);
        let from_file = load(None, None, "lease_margin = \"100ms\"\n").expect("the minimum");
        assert_eq!(from_file.duty.margin(), MIN_DUTY_MARGIN);
        // The flag wins over the file.
        let both = load(None, Some("3s"), "lease_margin = \"1h\"\n").expect("valid");
        assert_eq!(both.duty.margin(), Duration::from_secs(3));

        for (ttl, margin) in [
            (None, "99ms"),
            (None, "0ms"),
            (None, "3334ms"),
            (None, "1h"),
            (Some("2s"), "667ms"),
            (Some("3s"), "1s"),
            (None, "soon"),
            (None, ""),
        ] {
            let e = load(ttl, Some(margin), "").unwrap_err();
            let text = e.to_string();
            assert_eq!(key_of(e), "lease_margin", "{ttl:?} {margin:?}");
            assert!(
                text.contains(&format!("{margin:?}"))
                    && text.contains("at least 100ms")
                    && text.contains("less than a third of lease_ttl"),
                "the value and both limits: {text}"
            );
        }
        let e = load(None, Some("3334ms"), "").unwrap_err().to_string();
        assert!(e.contains("at most 3333ms"), "{e}");
        // A bad TTL is named first, whatever the margin.
        let e = load(Some("1s"), Some("100ms"), "").unwrap_err();
        assert_eq!(key_of(e), "lease_ttl");
        // Without an etcd store the key is a mistake, as lease_ttl is.
        for margin in [
            ConfigArgs {
                lease_margin: Some("1s".into()),
                ..ConfigArgs::default()
            },
            ConfigArgs::default(),
        ] {
            let file = if margin.lease_margin.is_some() {
                FileConfig::default()
            } else {
                toml::from_str("lease_margin = \"1s\"\n").expect("valid toml")
            };
            let e = AgentConfig::merge(margin, file).unwrap_err();
            assert_eq!(key_of(e), "lease_margin");
        }
    }

    #[test]
    fn the_cluster_example_file_is_a_valid_cluster_config() {
        let file: FileConfig =
            toml::from_str(include_str!("../agent.cluster.example.toml")).expect("example parses");
        let dir = tempfile::tempdir().expect("temp dir");
        let token = dir.path().join("token");
        std::fs::write(&token, "a-cluster-token-of-enough-length").expect("token");
        let args = ConfigArgs {
            cluster_token_file: Some(token),
            ..ConfigArgs::default()
        };
        let c = AgentConfig::merge(args, file).expect("valid");
        let StoreChoice::Etcd(settings) = c.store else {
            panic!("the example is a cluster config");
        };
        assert_eq!(settings.store.endpoints.len(), 3);
        assert!(
            settings
                .store
                .endpoints
                .iter()
                .all(|e| e.starts_with("https://"))
        );
        assert!(settings.store.identity.is_some() && settings.store.user.is_some());
        assert_eq!(settings.duty.margin(), Duration::from_secs(2));
    }

    /// Found by the `config` campaign (csi-campaigns): an empty `plugin_dir` (a flag given
    /// `--plugin-dir=`, a variable set to nothing) was accepted, and the agent then watched
    /// no directory at all.
    #[test]
    fn an_empty_plugin_dir_is_refused() {
        let file: FileConfig = toml::from_str("plugin_dir = \"\"\n").expect("valid toml");
        let e = AgentConfig::merge(ConfigArgs::default(), file).unwrap_err();
        assert_eq!(key_of(e), "plugin_dir");
    }

    /// Found by the `config` campaign: an error repeated the whole value, however long.
    #[test]
    fn a_long_value_is_shown_cut_in_its_error() {
        let args = ConfigArgs {
            node_id: Some("n".repeat(5000)),
            ..ConfigArgs::default()
        };
        let e = AgentConfig::merge(args, FileConfig::default()).unwrap_err();
        let text = e.to_string();
        assert!(text.len() < 512, "{} bytes: {text}", text.len());
        assert!(
            text.contains("node_id") && text.contains("5000 bytes"),
            "{text}"
        );
        assert_eq!(key_of(e), "node_id");
    }

    /// Found by the `config` campaign: a file error quoted the offending line whole (200 KB
    /// for an array nested 100,000 deep).
    #[test]
    fn a_file_error_on_a_huge_line_stays_short_and_names_the_key() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("agent.toml");
        let nested = format!("peers = {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        std::fs::write(&path, nested).expect("write");
        let args = ConfigArgs {
            config: Some(path.clone()),
            ..ConfigArgs::default()
        };
        let e = AgentConfig::load(&args).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(&e, ConfigError::ParseFile { path: p, .. } if *p == path),
            "{e:?}"
        );
        assert!(text.len() < 2048, "{} bytes", text.len());
        assert!(text.contains("peers") && text.contains("line"), "{text}");
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        let e = toml::from_str::<FileConfig>("helth_interval = \"1s\"").unwrap_err();
        assert!(e.to_string().contains("helth_interval"));
    }
}
