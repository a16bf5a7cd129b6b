//! `csi-mock-plugin`: the csi-testkit mock plugin as a standalone CSI plugin on a unix socket,
//! for CSI clients in any language.
//!
//! ```text
//! csi-mock-plugin --endpoint unix:///run/csi/csi.sock [--role controller|node|both] [--node-id node-1] ...
//!     [--state-file PATH] [--fault NodeUnpublishVolume=UNAVAILABLE:times=3]
//!     [--delay CreateVolume=2s] [--hang DeleteVolume:after=1] [--control unix:///run/ctl.sock]
//!     [--call-log-limit 10000] [--threads 1] [--require-secret NodeStageVolume:token=t0k3n]
//! ```
//!
//! See `crates/csi-testkit/README.md` for the flags, the control socket and csi-sanity.
//!
//! Bad flags or an endpoint that is not `unix:///absolute/path.sock` exit with code 2; a
//! failure to serve exits with 1. SIGINT and SIGTERM stop it cleanly and remove the socket.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use csi_testkit::fault_spec::FaultSpec;
use csi_testkit::{
    ControllerCapability, GroupControllerCapability, MockPlugin, NodeCapability, PluginService,
    Quirk, Role, UnixEndpoint, VolumeExpansion,
};

/// Capability enums whose wire names can be parsed.
trait WireName: Sized {
    fn from_wire_name(name: &str) -> Option<Self>;
}

macro_rules! wire_name {
    ($($t:ty),*) => {$(
        impl WireName for $t {
            fn from_wire_name(name: &str) -> Option<Self> {
                <$t>::from_str_name(name)
            }
        }
    )*};
}
wire_name!(
    ControllerCapability,
    NodeCapability,
    GroupControllerCapability,
    PluginService
);

/// A comma-separated list given as one flag value. A newtype, because clap reads
/// `Option<Vec<T>>` as a repeatable flag of single values.
#[derive(Clone, Debug)]
struct List<T>(Vec<T>);

/// Parses `A,B,C` (case-insensitive, `-` for `_`) or `none`.
fn parse_list<T: WireName + Clone + Send + Sync + 'static>(text: &str) -> Result<List<T>, String> {
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(List(Vec::new()));
    }
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let name = s.to_ascii_uppercase().replace('-', "_");
            T::from_wire_name(&name).ok_or_else(|| format!("unknown capability {s:?}"))
        })
        .collect::<Result<_, _>>()
        .map(List)
}

fn parse_topology(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("topology {text:?} must be KEY=VALUE"))?;
    Ok((key.to_string(), value.to_string()))
}

/// A `--require-secret` value as given. Parsed in [`build`] rather than by clap, whose error
/// for a bad value quotes it, and printed by `Debug` without its text, which holds a secret.
#[derive(Clone)]
struct SecretFlag(String);

impl From<String> for SecretFlag {
    fn from(text: String) -> Self {
        SecretFlag(text)
    }
}

impl std::fmt::Debug for SecretFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretFlag(<redacted>)")
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RoleArg {
    /// Controller (and group controller) only.
    Controller,
    /// Node only.
    Node,
    /// Controller and node in one process (the library's `Role::ControllerAndNode`; also
    /// accepted as `controller-and-node`).
    #[value(alias = "controller-and-node")]
    Both,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum QuirkArg {
    /// ValidateVolumeCapabilities never sets `confirmed`.
    NeverConfirm,
    /// ValidateVolumeCapabilities confirms another access mode.
    ConfirmDifferentCapability,
    /// ValidateVolumeCapabilities confirms access mode UNKNOWN.
    ConfirmUnknownAccessMode,
    /// ValidateVolumeCapabilities echoes another fs_type.
    EchoDifferentFsType,
    /// Probe answers without `ready`.
    ProbeReadyAbsent,
    /// Probe answers `ready = false`.
    ProbeNotReady,
    /// A repeated unpublish or unstage answers NOT_FOUND.
    NotFoundOnRepeatedUnpublish,
    /// Argument checks before the existence check (this mock's behaviour before csi-sanity).
    ArgumentChecksFirst,
    /// CreateVolume and ControllerModifyVolume accept any mutable_parameters key.
    AnyMutableParameterKey,
    /// CreateVolume answers volumes reachable from where the node is not.
    VolumesElsewhere,
    /// ControllerGetVolume, ListVolumes and NodeGetVolumeStats leave volume_condition unset
    /// although VOLUME_CONDITION is advertised.
    NoVolumeCondition,
}

impl QuirkArg {
    fn quirk(self) -> Quirk {
        match self {
            QuirkArg::NeverConfirm => Quirk::NeverConfirm,
            QuirkArg::ConfirmDifferentCapability => Quirk::ConfirmDifferentCapability,
            QuirkArg::ConfirmUnknownAccessMode => Quirk::ConfirmUnknownAccessMode,
            QuirkArg::EchoDifferentFsType => Quirk::EchoDifferentFsType,
            QuirkArg::ProbeReadyAbsent => Quirk::ProbeReadyAbsent,
            QuirkArg::ProbeNotReady => Quirk::ProbeNotReady,
            QuirkArg::NotFoundOnRepeatedUnpublish => Quirk::NotFoundOnRepeatedUnpublish,
            QuirkArg::ArgumentChecksFirst => Quirk::ArgumentChecksFirst,
            QuirkArg::AnyMutableParameterKey => Quirk::AnyMutableParameterKey,
            QuirkArg::VolumesElsewhere => Quirk::VolumesElsewhere,
            QuirkArg::NoVolumeCondition => Quirk::NoVolumeCondition,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ExpansionArg {
    /// Volumes can be expanded while published.
    Online,
    /// Volumes must be unpublished to be expanded.
    Offline,
    /// No expansion mode reported.
    None,
}

/// A stateful mock CSI plugin (csi-testkit) serving Identity, Controller, Node,
/// GroupController and SnapshotMetadata on a unix socket.
#[derive(Debug, Parser)]
#[command(name = "csi-mock-plugin", version)]
struct Args {
    /// The endpoint to serve, unix:///absolute/path.sock.
    #[arg(long, env = "CSI_ENDPOINT")]
    endpoint: String,
    /// Which services to offer besides Identity.
    #[arg(long, value_enum, default_value = "both")]
    role: RoleArg,
    /// The node id NodeGetInfo reports.
    #[arg(long, default_value = "node-1")]
    node_id: String,
    /// The plugin name GetPluginInfo reports.
    #[arg(long, default_value = "mock.csi.example")]
    name: String,
    /// The vendor version GetPluginInfo reports (default: the crate version).
    #[arg(long)]
    vendor_version: Option<String>,
    /// Further node ids ControllerPublishVolume accepts (repeatable).
    #[arg(long = "other-node")]
    other_nodes: Vec<String>,
    /// A topology segment of the node, KEY=VALUE (repeatable).
    #[arg(long, value_parser = parse_topology)]
    topology: Vec<(String, String)>,
    /// NodeGetInfo.max_volumes_per_node, enforced by ControllerPublishVolume.
    #[arg(long)]
    max_volumes_per_node: Option<i64>,
    /// Total pool capacity in bytes.
    #[arg(long)]
    capacity: Option<i64>,
    /// Plugin service capabilities, comma-separated wire names, or `none`
    /// (default: follows the role).
    #[arg(long, value_parser = parse_list::<PluginService>)]
    plugin_caps: Option<List<PluginService>>,
    /// The volume expansion mode GetPluginCapabilities reports.
    #[arg(long, value_enum, default_value = "online")]
    expansion: ExpansionArg,
    /// Controller capabilities, comma-separated wire names (CREATE_DELETE_VOLUME,...), or
    /// `none` (default: every one the mock implements, except the v1.12 VOLUME_CONDITION,
    /// which is served only when listed here).
    #[arg(long, value_parser = parse_list::<ControllerCapability>)]
    controller_caps: Option<List<ControllerCapability>>,
    /// Node capabilities, comma-separated wire names, or `none` (default: all implemented,
    /// except VOLUME_CONDITION, served only when listed here).
    #[arg(long, value_parser = parse_list::<NodeCapability>)]
    node_caps: Option<List<NodeCapability>>,
    /// Behave like a plugin with this quirk (repeatable).
    #[arg(long = "quirk", value_enum)]
    quirks: Vec<QuirkArg>,
    /// Create the socket only this many milliseconds after start-up.
    #[arg(long)]
    late_socket_ms: Option<u64>,
    /// Group controller capabilities, comma-separated wire names, or `none`.
    #[arg(long, value_parser = parse_list::<GroupControllerCapability>)]
    group_caps: Option<List<GroupControllerCapability>>,
    /// A mutable_parameters key CreateVolume and ControllerModifyVolume accept (repeatable);
    /// other keys are refused with INVALID_ARGUMENT. Default: none.
    #[arg(long = "mutable-parameter-key")]
    mutable_parameter_keys: Vec<String>,
    /// Refuse RPC with INVALID_ARGUMENT unless its secrets hold KEY with exactly VALUE
    /// (repeatable; all of an rpc's must hold): `RPC:KEY=VALUE`, e.g.
    /// `NodeStageVolume:token=t0k3n`. Only rpcs whose request has a secrets field. For tests
    /// only: the value is on the command line, where other users of the machine can read it.
    #[arg(long = "require-secret", value_name = "RPC:KEY=VALUE")]
    require_secrets: Vec<SecretFlag>,
    /// Keep volumes, snapshots, publications and stagings in this file across restarts
    /// (written atomically, mode 0600). Without it every start is a fresh, empty storage
    /// system whose ids carry the start time, so they never repeat those of an earlier run.
    #[arg(long, value_name = "PATH")]
    state_file: Option<std::path::PathBuf>,
    /// Answer RPC with a gRPC error (repeatable): `RPC=CODE[:after=N][:times=M][:volume=ID]`,
    /// e.g. `NodeUnpublishVolume=UNAVAILABLE:times=3`. Without times, every call after the
    /// first N.
    #[arg(long = "fault", value_name = "SPEC", value_parser = FaultSpec::parse_fault)]
    faults: Vec<FaultSpec>,
    /// Delay RPC, then serve it (repeatable): `RPC=DURATION[:after=N][:times=M][:volume=ID]`,
    /// DURATION like 500ms, 2s or 1m.
    #[arg(long = "delay", value_name = "SPEC", value_parser = FaultSpec::parse_delay)]
    delays: Vec<FaultSpec>,
    /// Never answer RPC (repeatable): `RPC[:after=N][:times=M][:volume=ID]`.
    #[arg(long = "hang", value_name = "SPEC", value_parser = FaultSpec::parse_hang)]
    hangs: Vec<FaultSpec>,
    /// Hold RPC until the control socket's `resume`, then serve it (repeatable):
    /// `RPC[:after=N][:times=M][:volume=ID]`.
    #[arg(long = "hold", value_name = "SPEC", value_parser = FaultSpec::parse_hold)]
    holds: Vec<FaultSpec>,
    /// Serve a control socket, unix:///absolute/path.sock: one command per line (fault,
    /// delay, hang, hold, clear, release, resume, condition, calls, drain, log) to change faults and
    /// volume conditions and read the call log at run time.
    #[arg(long, value_name = "ENDPOINT")]
    control: Option<String>,
    /// Keep at most N call records, dropping the oldest first, so memory stays flat however
    /// long the mock runs; 0 keeps none (calls are still counted). Read them with the
    /// control socket's `calls`, `drain` and `log`.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CALL_LOG_LIMIT)]
    call_log_limit: usize,
    /// Serve on N threads (1..=64). With 1, the default, every connection and call runs on
    /// one thread, which costs least CPU per call and no wake-ups between threads.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
}

/// How many call records the binary keeps unless told otherwise: enough for a test to read
/// back what it just did, a few megabytes at most.
const DEFAULT_CALL_LOG_LIMIT: usize = 10_000;

fn build(args: &Args) -> Result<MockPlugin, csi_testkit::ConfigError> {
    let role = match args.role {
        RoleArg::Controller => Role::Controller,
        RoleArg::Node => Role::Node,
        RoleArg::Both => Role::ControllerAndNode,
    };
    let mut builder = MockPlugin::builder()
        .role(role)
        .node_id(&args.node_id)
        .name(
            &args.name,
            args.vendor_version
                .clone()
                .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string()),
        );
    for node in &args.other_nodes {
        builder = builder.other_node(node);
    }
    for (key, value) in &args.topology {
        builder = builder.topology(key, value);
    }
    if let Some(max) = args.max_volumes_per_node {
        builder = builder.max_volumes_per_node(max);
    }
    if let Some(capacity) = args.capacity {
        builder = builder.capacity(capacity);
    }
    let expansion = match args.expansion {
        ExpansionArg::Online => Some(VolumeExpansion::Online),
        ExpansionArg::Offline => Some(VolumeExpansion::Offline),
        ExpansionArg::None => None,
    };
    if let Some(List(services)) = &args.plugin_caps {
        builder = builder.plugin_capabilities(services.iter().copied(), expansion);
    }
    builder = builder.volume_expansion(expansion);
    for quirk in &args.quirks {
        builder = builder.quirk(quirk.quirk());
    }
    if let Some(ms) = args.late_socket_ms {
        builder = builder.quirk(Quirk::LateSocket(std::time::Duration::from_millis(ms)));
    }
    if let Some(List(caps)) = &args.controller_caps {
        builder = builder.controller_capabilities(caps.iter().copied());
    }
    if let Some(List(caps)) = &args.node_caps {
        builder = builder.node_capabilities(caps.iter().copied());
    }
    if let Some(List(caps)) = &args.group_caps {
        builder = builder.group_controller_capabilities(caps.iter().copied());
    }
    for key in &args.mutable_parameter_keys {
        builder = builder.mutable_parameter_key(key);
    }
    for SecretFlag(text) in &args.require_secrets {
        let (rpc, key, value) = csi_testkit::secrets::parse_requirement(text)?;
        builder = builder.require_secret(rpc, key, value);
    }
    builder = builder.call_log_limit(args.call_log_limit);
    builder = match &args.state_file {
        Some(path) => builder.state_file(path),
        None => builder.id_tag(start_tag()),
    };
    builder.build()
}

/// A tag for this start's ids: the start time in milliseconds and the process id, in hex.
fn start_tag() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis())
        .unwrap_or_default();
    format!("{millis:x}{:x}", std::process::id())
}

fn report(error: &dyn std::error::Error) {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    eprintln!("csi-mock-plugin: {text}");
}

async fn wait_for_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result,
        _ = term.recv() => Ok(()),
    }
}

async fn run(
    plugin: MockPlugin,
    endpoint: UnixEndpoint,
    control: Option<UnixEndpoint>,
) -> ExitCode {
    let control = match &control {
        None => None,
        Some(control) => match plugin.serve_control(control.path()).await {
            Ok(server) => {
                eprintln!("csi-mock-plugin: control socket {control}");
                Some(server)
            }
            Err(e) => {
                report(&e);
                return ExitCode::from(1);
            }
        },
    };
    let server = match plugin.serve_unix(endpoint.path()).await {
        Ok(server) => server,
        Err(e) => {
            report(&e);
            return ExitCode::from(1);
        }
    };
    eprintln!(
        "csi-mock-plugin: {} serving {} ({}) as node {}",
        plugin.config().name,
        server.endpoint(),
        plugin.config().role,
        plugin.config().node_id
    );
    if let Err(e) = wait_for_signal().await {
        report(&e);
    }
    eprintln!("csi-mock-plugin: stopping");
    if let Some(control) = control {
        control.shutdown().await;
    }
    match server.shutdown().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let endpoint = match UnixEndpoint::parse(&args.endpoint) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            report(&e);
            return ExitCode::from(2);
        }
    };
    let control = match args.control.as_deref().map(UnixEndpoint::parse).transpose() {
        Ok(control) => control,
        Err(e) => {
            report(&e);
            return ExitCode::from(2);
        }
    };
    let plugin = match build(&args) {
        Ok(plugin) => plugin,
        Err(e) => {
            report(&e);
            return ExitCode::from(2);
        }
    };
    for spec in args
        .faults
        .iter()
        .chain(&args.delays)
        .chain(&args.hangs)
        .chain(&args.holds)
    {
        spec.install(&plugin.faults());
    }
    let mut runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(usize::from(args.threads));
        builder
    };
    let runtime = match runtime.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            report(&e);
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(plugin, endpoint, control))
}
