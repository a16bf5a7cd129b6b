//! The command line of `csi-bench`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Parser};

use crate::agent_claims::AgentClaimsSpec;
use crate::error::BenchError;
use crate::peer::PeerSpec;
use crate::rpc::BenchRpc;
use crate::target::TargetSpec;

/// Most measured calls one run may make.
pub const MAX_CALLS: u64 = 100_000_000;
/// Most concurrent callers.
pub const MAX_CALLERS: u32 = 10_000;
/// Most connections `--conn-memory` opens.
pub const MAX_CONNECTIONS: u32 = 50_000;
/// Most claims `--claims-memory` and `--claims-release` make.
pub const MAX_CLAIMS: u32 = 10_000_000;
/// Most claims `--claims-etcd` makes.
pub const MAX_ETCD_CLAIMS: u32 = 1_000_000;
/// Most claims `--claims-etcd` puts on one volume: one volume's claims are one etcd value,
/// which `EtcdStore` keeps under 1,000,000 bytes (about 160 bytes a claim).
pub const MAX_ETCD_CLAIMS_PER_VOLUME: u32 = 4_000;
/// Most agents `--claims-etcd` runs.
pub const MAX_AGENTS: u32 = 16;
/// Longest measured period of `--agent-claims` (`--secs`), one day.
pub const MAX_AGENT_CLAIMS_SECS: u64 = 86_400;
/// Longest warm-up of `--agent-claims` (`--warmup-secs`), one hour.
pub const MAX_AGENT_CLAIMS_WARMUP_SECS: u64 = 3_600;
/// Most volumes `--agent-claims` creates in the agent (`--clients` times
/// `--volumes-per-client`).
pub const MAX_AGENT_CLAIMS_VOLUMES: u64 = 100_000;

/// Load generator for CSI plugins: drives any plugin through `csi-client` and prints one line,
/// `client=csi-client rpc=<rpc> n=<n> c=<c> ops_per_s=<x> p50_us=<x> p99_us=<x>`.
#[derive(Clone, Debug, Parser)]
#[command(name = "csi-bench", version)]
#[command(group(ArgGroup::new("target").args(["endpoint", "mock"])))]
#[command(group(ArgGroup::new("mode").args([
    "baseline", "compare", "conn_memory", "claims_memory", "claims_release", "claims_etcd",
    "shim_hop", "compare_peer", "baseline_child", "serve_mock", "etcd_memory_child",
    "agent_claims",
])))]
pub struct Cli {
    /// The plugin's endpoint, `unix:///path/to/csi.sock`.
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,

    /// Start the csi-testkit mock plugin in this process on a temporary socket and drive it.
    #[arg(long)]
    pub mock: bool,

    /// The rpc to drive.
    #[arg(long, value_enum, default_value_t = BenchRpc::Probe)]
    pub rpc: BenchRpc,

    /// Measured calls (after the warm-up).
    #[arg(short = 'n', long = "calls", default_value_t = 10_000)]
    pub n: u64,

    /// Concurrent callers, sharing one client and its connection.
    #[arg(short = 'c', long = "callers", default_value_t = 1)]
    pub c: u32,

    /// The tokio runtime the load, `--compare` and `--compare-peer` runs drive the plugin from
    /// (and the in-process mock runs on): one worker per core, or everything on one thread.
    #[arg(long, value_enum, default_value_t = RuntimeFlavor::MultiThread)]
    pub runtime: RuntimeFlavor,

    /// Unmeasured calls before the measured ones (connection set-up, caches).
    #[arg(long, default_value_t = 200)]
    pub warmup: u64,

    /// The volume `validate` and `publish` use, instead of creating one (`publish` then needs
    /// `-c 1`).
    #[arg(long, value_name = "ID")]
    pub volume_id: Option<String>,

    /// The node id `publish` publishes to, instead of asking `NodeGetInfo`.
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,

    /// Print the floor instead: a raw 100-byte unix-socket ping-pong between two processes
    /// (`client=baseline rpc=pingpong`).
    #[arg(long)]
    pub baseline: bool,

    /// Run the baseline and sequential Probe (`-c 1`) with the same `-n` in one run; print
    /// both lines and the ratio of their p50s (target: at most 4). For a unix endpoint a
    /// third line, Probe through a bare tonic client (`client=tonic`), shows how much of the
    /// gap is gRPC itself.
    #[arg(long)]
    pub compare: bool,

    /// Open this many connections (one client each, one Probe each) and print resident
    /// memory per connection; with `--mock` the mock runs in a child process and both sides
    /// are measured.
    #[arg(long, value_name = "K")]
    pub conn_memory: Option<u32>,

    /// Make this many claims in the release machine (all durable) and print resident memory
    /// per claim and per 10,000 claims.
    #[arg(long, value_name = "CLAIMS")]
    pub claims_memory: Option<u32>,

    /// Make this many claims over `--volumes` volumes and release them all through the claims
    /// driver, whose detachers call the mock plugin through csi-client (needs `--mock`).
    #[arg(long, value_name = "CLAIMS")]
    pub claims_release: Option<u32>,

    /// How many volumes `--claims-memory`, `--claims-release` and `--claims-etcd` spread
    /// their claims over.
    #[arg(long, default_value_t = 100)]
    pub volumes: u32,

    /// Make this many write claims over `--volumes` volumes through etcd (csi-claims'
    /// `EtcdStore`) from `--agents` agents, `-c` callers each; then measure the memory of one
    /// more agent that loads them, and release them all. Prints claims per second, the memory
    /// line and release throughput. Needs csi-bench built with `--features etcd`.
    #[arg(long, value_name = "CLAIMS")]
    pub claims_etcd: Option<u32>,

    /// How many agents `--claims-etcd` runs (default 1): each its own claims driver on its own
    /// etcd connection, performing the node steps of its own node; the first also performs
    /// the controller-side steps.
    #[arg(long, value_name = "A")]
    pub agents: Option<u32>,

    /// The etcd cluster `--claims-etcd` uses, as comma-separated client URLs
    /// (`http://HOST:PORT`). Without it the bench starts `etcd` itself on loopback, with a
    /// temporary data directory, and stops it at the end.
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,

    /// How often each `--claims-etcd` agent's watch reads every claim record again, as a
    /// check that it missed no change, in milliseconds (0: only after a compaction). Default
    /// 20000, under the bench's 60 s stall limit; a small value stresses the re-read path.
    #[arg(long, value_name = "MS", default_value_t = 20_000)]
    pub etcd_reread_ms: u64,

    /// How `--claims-etcd`'s agent 0 holds the controller duty: `fenced` (default, what a
    /// cluster of agents does) campaigns with `EtcdStore::elect_controller_duty` and holds a
    /// fenced duty, so every controller call is preceded by a read-only etcd transaction and
    /// every controller-side write compares the duty key too; `unfenced` gives agent 0 the
    /// duty from the start, with neither check (the bench before issue 30).
    #[arg(long, value_enum, value_name = "MODE")]
    pub etcd_duty: Option<EtcdDuty>,

    /// Measure what one agent-to-agent hop (csi-rpc-shim over loopback TCP) adds to
    /// `ControllerUnpublishVolume` against the in-process mock: prints the direct, local-shim
    /// and one-hop lines and the added p50 (target: under 150 µs). Sequential, `-n` calls each.
    #[arg(long)]
    pub shim_hop: bool,

    /// Measure Probe beside grpc-go in one interleaved run: grpc-go (`--gobench`) and
    /// csi-client, each against the csi-testkit mock plugin (`--mock-plugin`) and a minimal
    /// grpc-go plugin (`--goserver`), sequentially (`-n` calls) and with `--peer-callers`
    /// callers (`--peer-concurrent-calls` calls); prints every line, CPU time per call on both
    /// sides, memory per connection and the ratios against the targets.
    #[arg(long)]
    pub compare_peer: bool,

    /// `--compare-peer`: the grpc-go Probe client (`gobench -endpoint PATH -rpc probe -n N -c C`).
    #[arg(long, value_name = "PATH")]
    pub gobench: Option<PathBuf>,

    /// `--compare-peer`: the minimal grpc-go plugin (`goserver -endpoint PATH`).
    #[arg(long, value_name = "PATH")]
    pub goserver: Option<PathBuf>,

    /// `--compare-peer`: the csi-testkit mock plugin binary (default: `csi-mock-plugin` next
    /// to csi-bench).
    #[arg(long, value_name = "PATH")]
    pub mock_plugin: Option<PathBuf>,

    /// `--compare-peer`: callers of the concurrent lines.
    #[arg(long, value_name = "C", default_value_t = 32)]
    pub peer_callers: u32,

    /// `--compare-peer`: calls of each concurrent line.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub peer_concurrent_calls: u64,

    /// `--compare-peer`: threads the mock plugin serves on (its `--threads`; 1 is its
    /// default).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub peer_mock_threads: u16,

    /// `--compare-peer`: csi-client connections opened to each server at the end to measure
    /// memory per connection (0: skip).
    #[arg(long, value_name = "K", default_value_t = 200)]
    pub peer_conns: u32,

    /// Start the real `csi-agent serve` beside the real `csi-mock-plugin` (plugin `mock`) and
    /// measure claims and releases through the agent's control API: `--clients` clients,
    /// each looping claim then release over its own `--volumes-per-client` single-node-writer
    /// volumes for `--secs` seconds after `--warmup-secs`. Prints one `agent-claims` line.
    #[arg(long)]
    pub agent_claims: bool,

    /// `--agent-claims`: concurrent clients (default 32, at most 10000).
    #[arg(long, value_name = "C")]
    pub clients: Option<u32>,

    /// `--agent-claims`: the measured period in seconds (default 20, at most 86400).
    #[arg(long, value_name = "S")]
    pub secs: Option<u64>,

    /// `--agent-claims`: unmeasured seconds of load before the measured period (default 2,
    /// at most 3600; 0: none).
    #[arg(long, value_name = "S")]
    pub warmup_secs: Option<u64>,

    /// `--agent-claims`: single-node-writer volumes each client creates and loops over
    /// (default 4; at most 100000 volumes in all).
    #[arg(long, value_name = "K")]
    pub volumes_per_client: Option<u32>,

    /// `--agent-claims`: where to run. The bench makes a temporary directory inside DIR
    /// (created if missing) for the agent's data directory, the plugin socket and the logs,
    /// and removes it at the end; DIR's filesystem is the one measured (e.g. /dev/shm for
    /// tmpfs). Default: the system's temporary directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// `--agent-claims`: the `csi-agent` binary (default: `csi-agent` next to csi-bench).
    #[arg(long, value_name = "PATH")]
    pub agent_bin: Option<PathBuf>,

    /// `--agent-claims`: an argument added to `csi-agent serve`, e.g.
    /// `--agent-arg=--controller-calls=8` (repeatable; shown in the line as `agent_args=`).
    #[arg(long = "agent-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub agent_arg: Vec<String>,

    /// `--agent-claims`: the `csi-mock-plugin` binary (default: `csi-mock-plugin` next to
    /// csi-bench).
    #[arg(long, value_name = "PATH")]
    pub mock_bin: Option<PathBuf>,

    /// Internal: be the ping-pong peer on this socket.
    #[arg(long, hide = true, value_name = "PATH")]
    pub baseline_child: Option<PathBuf>,

    /// Internal: serve the mock plugin at this socket until stdin closes.
    #[arg(long, hide = true, value_name = "PATH")]
    pub serve_mock: Option<PathBuf>,

    /// Internal: be one agent that loads the claims under this key prefix from
    /// `--etcd-endpoints` and print its resident memory before and after.
    #[arg(long, hide = true, value_name = "PREFIX")]
    pub etcd_memory_child: Option<String>,
}

/// Which tokio runtime a run uses (`--runtime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeFlavor {
    /// `multi-thread`: one worker thread per core, tasks stolen between them (tokio's
    /// default, what an orchestrator serving many callers runs).
    MultiThread,
    /// `current-thread`: every task on the thread that drives the run, so a sequential
    /// caller pays no cross-thread wake-up (what a single-threaded tool runs).
    CurrentThread,
}

impl RuntimeFlavor {
    /// The flag's spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            RuntimeFlavor::MultiThread => "multi-thread",
            RuntimeFlavor::CurrentThread => "current-thread",
        }
    }
}

/// How `--claims-etcd`'s agent 0 holds the controller duty (`--etcd-duty`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EtcdDuty {
    /// `fenced`: agent 0 campaigns (`EtcdStore::elect_controller_duty`) and holds a fenced
    /// `Duty`: a read-only etcd transaction before each controller call, the duty key
    /// compared in each controller-side write. What a cluster of agents runs.
    #[default]
    Fenced,
    /// `unfenced`: agent 0 holds the duty from the start, unchecked
    /// (`Duties::node(n-0, true)`), as if handed out by other means.
    Unfenced,
}

impl EtcdDuty {
    /// The flag's spelling, as the result lines print it (`duty=fenced`).
    pub const fn as_str(self) -> &'static str {
        match self {
            EtcdDuty::Fenced => "fenced",
            EtcdDuty::Unfenced => "unfenced",
        }
    }
}

impl std::fmt::Display for EtcdDuty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a run does, decided from the flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Drive `rpc` and print one line.
    Load(TargetSpec),
    /// The raw ping-pong floor.
    Baseline,
    /// Baseline and sequential Probe, with their ratio.
    Compare(TargetSpec),
    /// Memory per connection.
    ConnMemory(TargetSpec, u32),
    /// Memory per claim.
    ClaimsMemory(u32),
    /// One agent-to-agent hop against a direct call.
    ShimHop,
    /// csi-client and the mock plugin beside grpc-go.
    ComparePeer(PeerSpec),
    /// Releasing claims through the driver against the mock.
    ClaimsRelease(u32),
    /// Claims and releases through the real agent and mock plugin binaries.
    AgentClaims(AgentClaimsSpec),
    /// Claims, memory and releases through etcd.
    ClaimsEtcd(EtcdSpec),
    /// Internal: load the claims under a prefix as one agent and report memory.
    EtcdMemoryChild {
        /// etcd's client URLs.
        endpoints: Vec<String>,
        /// The bench run's key prefix.
        prefix: String,
    },
    /// Internal: ping-pong peer.
    BaselineChild(PathBuf),
    /// Internal: mock server child.
    ServeMock(PathBuf),
}

/// What `--claims-etcd` runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdSpec {
    /// Claims made (and released).
    pub claims: u32,
    /// Agents making them.
    pub agents: u32,
    /// The etcd cluster given with `--etcd-endpoints`; `None`: start one.
    pub endpoints: Option<Vec<String>>,
    /// How often each agent's watch reads every record again (`--etcd-reread-ms`); `None`:
    /// only after a compaction.
    pub reread: Option<Duration>,
    /// How agent 0 holds the controller duty (`--etcd-duty`).
    pub duty: EtcdDuty,
}

/// The error of `--claims-etcd` in a csi-bench built without the `etcd` feature.
pub fn etcd_not_built(claims: u32) -> BenchError {
    bad(
        "claims-etcd",
        claims,
        "this csi-bench was built without etcd support; build it with `cargo build --release \
         -p csi-benches --features etcd` (needs protoc: Debian's protobuf-compiler)",
    )
}

fn check_endpoints(endpoints: &[String]) -> Result<(), BenchError> {
    for endpoint in endpoints {
        let rest = endpoint.strip_prefix("http://").unwrap_or(endpoint);
        let well_formed = rest
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !well_formed || rest.contains("://") || rest.contains('/') {
            return Err(bad(
                "etcd-endpoints",
                endpoint,
                "each must be http://HOST:PORT or HOST:PORT (the bench speaks plain HTTP to etcd)",
            ));
        }
    }
    Ok(())
}

fn bad<T: ToString>(flag: &'static str, value: T, limit: &'static str) -> BenchError {
    BenchError::BadFlag {
        flag,
        value: value.to_string(),
        limit,
    }
}

impl Cli {
    fn target(&self, mode: &'static str) -> Result<TargetSpec, BenchError> {
        match (&self.endpoint, self.mock) {
            (Some(endpoint), _) => Ok(TargetSpec::Endpoint(endpoint.clone())),
            (None, true) => Ok(TargetSpec::Mock),
            (None, false) => Err(BenchError::NoTarget { mode }),
        }
    }

    /// Checks the numbers and decides the mode.
    ///
    /// # Errors
    ///
    /// [`BenchError::BadFlag`] naming the flag and its limit, [`BenchError::NoTarget`].
    pub fn mode(&self) -> Result<Mode, BenchError> {
        if !(1..=MAX_CALLS).contains(&self.n) {
            return Err(bad("calls", self.n, "must be 1..=100000000"));
        }
        if !(1..=MAX_CALLERS).contains(&self.c) {
            return Err(bad("callers", self.c, "must be 1..=10000"));
        }
        if self.warmup > MAX_CALLS {
            return Err(bad("warmup", self.warmup, "must be at most 100000000"));
        }
        if self.volumes == 0 || self.volumes > MAX_CLAIMS {
            return Err(bad("volumes", self.volumes, "must be 1..=10000000"));
        }
        if let Some(prefix) = &self.etcd_memory_child {
            if self.etcd_endpoints.is_empty() {
                return Err(bad("etcd-memory-child", prefix, "needs --etcd-endpoints"));
            }
            check_endpoints(&self.etcd_endpoints)?;
            return Ok(Mode::EtcdMemoryChild {
                endpoints: self.etcd_endpoints.clone(),
                prefix: prefix.clone(),
            });
        }
        if self.agent_claims {
            return self.agent_claims_mode();
        }
        self.refuse_agent_claims_flags()?;
        if let Some(claims) = self.claims_etcd {
            return self.claims_etcd_mode(claims);
        }
        if let Some(agents) = self.agents {
            return Err(bad("agents", agents, "only with --claims-etcd"));
        }
        if !self.etcd_endpoints.is_empty() {
            return Err(bad(
                "etcd-endpoints",
                self.etcd_endpoints.join(","),
                "only with --claims-etcd",
            ));
        }
        if let Some(duty) = self.etcd_duty {
            return Err(bad("etcd-duty", duty, "only with --claims-etcd"));
        }
        if let Some(path) = &self.baseline_child {
            return Ok(Mode::BaselineChild(path.clone()));
        }
        if let Some(path) = &self.serve_mock {
            return Ok(Mode::ServeMock(path.clone()));
        }
        if self.baseline {
            return Ok(Mode::Baseline);
        }
        if self.shim_hop {
            return Ok(Mode::ShimHop);
        }
        if self.compare_peer {
            return self.compare_peer_mode();
        }
        if self.compare {
            return Ok(Mode::Compare(self.target("--compare")?));
        }
        if let Some(k) = self.conn_memory {
            if !(1..=MAX_CONNECTIONS).contains(&k) {
                return Err(bad("conn-memory", k, "must be 1..=50000"));
            }
            return Ok(Mode::ConnMemory(self.target("--conn-memory")?, k));
        }
        if let Some(claims) = self.claims_memory {
            if !(1..=MAX_CLAIMS).contains(&claims) {
                return Err(bad("claims-memory", claims, "must be 1..=10000000"));
            }
            return Ok(Mode::ClaimsMemory(claims));
        }
        if let Some(claims) = self.claims_release {
            if !(1..=MAX_CLAIMS).contains(&claims) {
                return Err(bad("claims-release", claims, "must be 1..=10000000"));
            }
            if !self.mock || self.endpoint.is_some() {
                return Err(bad(
                    "claims-release",
                    claims,
                    "needs --mock (its volumes are seeded into the mock)",
                ));
            }
            return Ok(Mode::ClaimsRelease(claims));
        }
        Ok(Mode::Load(self.target("a load run")?))
    }

    fn compare_peer_mode(&self) -> Result<Mode, BenchError> {
        if self.endpoint.is_some() || self.mock {
            return Err(bad(
                "compare-peer",
                "",
                "takes no --endpoint or --mock: it starts both servers itself",
            ));
        }
        let program = |flag: &'static str, given: &Option<PathBuf>| match given {
            None => Err(bad(
                flag,
                "(not given)",
                "--compare-peer needs it: build the grpc-go peers as benches/README.md says",
            )),
            Some(path) if !path.is_file() => Err(bad(
                flag,
                path.display(),
                "no such file: build the grpc-go peers as benches/README.md says",
            )),
            Some(path) => Ok(path.clone()),
        };
        if !(1..=MAX_CALLERS).contains(&self.peer_callers) || self.peer_callers == 1 {
            return Err(bad("peer-callers", self.peer_callers, "must be 2..=10000"));
        }
        if !(1..=MAX_CALLS).contains(&self.peer_concurrent_calls) {
            return Err(bad(
                "peer-concurrent-calls",
                self.peer_concurrent_calls,
                "must be 1..=100000000",
            ));
        }
        if !(1..=64).contains(&self.peer_mock_threads) {
            return Err(bad(
                "peer-mock-threads",
                self.peer_mock_threads,
                "must be 1..=64",
            ));
        }
        if self.peer_conns > MAX_CONNECTIONS {
            return Err(bad("peer-conns", self.peer_conns, "must be 0..=50000"));
        }
        Ok(Mode::ComparePeer(PeerSpec {
            gobench: program("gobench", &self.gobench)?,
            goserver: program("goserver", &self.goserver)?,
            mock_plugin: self.mock_plugin.clone(),
            sequential_calls: self.n,
            concurrent_calls: self.peer_concurrent_calls,
            callers: self.peer_callers,
            connections: self.peer_conns,
            mock_threads: self.peer_mock_threads,
            warmup: self.warmup,
            runtime: self.runtime,
        }))
    }

    fn agent_claims_mode(&self) -> Result<Mode, BenchError> {
        if self.endpoint.is_some() || self.mock {
            return Err(bad(
                "agent-claims",
                "",
                "takes no --endpoint or --mock: it starts csi-mock-plugin and csi-agent itself",
            ));
        }
        let clients = self.clients.unwrap_or(AgentClaimsSpec::DEFAULT_CLIENTS);
        if !(1..=MAX_CALLERS).contains(&clients) {
            return Err(bad("clients", clients, "must be 1..=10000"));
        }
        let secs = self.secs.unwrap_or(AgentClaimsSpec::DEFAULT_SECS);
        if !(1..=MAX_AGENT_CLAIMS_SECS).contains(&secs) {
            return Err(bad("secs", secs, "must be 1..=86400"));
        }
        let warmup_secs = self
            .warmup_secs
            .unwrap_or(AgentClaimsSpec::DEFAULT_WARMUP_SECS);
        if warmup_secs > MAX_AGENT_CLAIMS_WARMUP_SECS {
            return Err(bad("warmup-secs", warmup_secs, "must be 0..=3600"));
        }
        let volumes_per_client = self
            .volumes_per_client
            .unwrap_or(AgentClaimsSpec::DEFAULT_VOLUMES_PER_CLIENT);
        if volumes_per_client == 0
            || u64::from(clients) * u64::from(volumes_per_client) > MAX_AGENT_CLAIMS_VOLUMES
        {
            return Err(bad(
                "volumes-per-client",
                volumes_per_client,
                "must be at least 1, and --clients times --volumes-per-client at most 100000",
            ));
        }
        Ok(Mode::AgentClaims(AgentClaimsSpec {
            clients,
            secs,
            warmup_secs,
            volumes_per_client,
            dir: self.dir.clone(),
            agent_bin: self.agent_bin.clone(),
            mock_bin: self.mock_bin.clone(),
            agent_args: self.agent_arg.clone(),
        }))
    }

    /// Without `--agent-claims` its flags mean nothing, and say so.
    fn refuse_agent_claims_flags(&self) -> Result<(), BenchError> {
        let only = "only with --agent-claims";
        let numbers = [
            ("clients", self.clients.map(u64::from)),
            ("secs", self.secs),
            ("warmup-secs", self.warmup_secs),
            ("volumes-per-client", self.volumes_per_client.map(u64::from)),
        ];
        for (flag, value) in numbers {
            if let Some(value) = value {
                return Err(bad(flag, value, only));
            }
        }
        let paths = [
            ("dir", &self.dir),
            ("agent-bin", &self.agent_bin),
            ("mock-bin", &self.mock_bin),
        ];
        for (flag, value) in paths {
            if let Some(path) = value {
                return Err(bad(flag, path.display(), only));
            }
        }
        if let Some(arg) = self.agent_arg.first() {
            return Err(bad("agent-arg", arg, only));
        }
        Ok(())
    }

    fn claims_etcd_mode(&self, claims: u32) -> Result<Mode, BenchError> {
        if !(1..=MAX_ETCD_CLAIMS).contains(&claims) {
            return Err(bad("claims-etcd", claims, "must be 1..=1000000"));
        }
        let agents = self.agents.unwrap_or(1);
        if !(1..=MAX_AGENTS).contains(&agents) {
            return Err(bad("agents", agents, "must be 1..=16"));
        }
        if claims.div_ceil(self.volumes) > MAX_ETCD_CLAIMS_PER_VOLUME {
            return Err(bad(
                "claims-etcd",
                claims,
                "at most 4000 claims per volume (raise --volumes): one volume's claims are one \
                 etcd value, which the store keeps under 1 MB",
            ));
        }
        check_endpoints(&self.etcd_endpoints)?;
        if !cfg!(feature = "etcd") {
            return Err(etcd_not_built(claims));
        }
        Ok(Mode::ClaimsEtcd(EtcdSpec {
            claims,
            agents,
            endpoints: (!self.etcd_endpoints.is_empty()).then(|| self.etcd_endpoints.clone()),
            reread: (self.etcd_reread_ms > 0).then(|| Duration::from_millis(self.etcd_reread_ms)),
            duty: self.etcd_duty.unwrap_or_default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Mode, BenchError> {
        let cli = Cli::try_parse_from(std::iter::once("csi-bench").chain(args.iter().copied()))
            .map_err(|e| bad("parse", e, "clap refused it"))?;
        cli.mode()
    }

    #[test]
    fn modes_follow_the_flags() {
        assert_eq!(
            parse(&["--mock", "-n", "5"]).ok(),
            Some(Mode::Load(TargetSpec::Mock))
        );
        assert_eq!(
            parse(&["--endpoint", "unix:///x.sock"]).ok(),
            Some(Mode::Load(TargetSpec::Endpoint("unix:///x.sock".into())))
        );
        assert_eq!(parse(&["--baseline"]).ok(), Some(Mode::Baseline));
        let cli = Cli::try_parse_from(["csi-bench", "--mock", "--runtime", "current-thread"])
            .expect("a runtime flavour parses");
        assert_eq!(cli.runtime, RuntimeFlavor::CurrentThread);
        assert!(Cli::try_parse_from(["csi-bench", "--mock", "--runtime", "green"]).is_err());
        assert_eq!(
            parse(&["--mock", "--conn-memory", "10"]).ok(),
            Some(Mode::ConnMemory(TargetSpec::Mock, 10))
        );
        assert_eq!(
            parse(&["--claims-memory", "10"]).ok(),
            Some(Mode::ClaimsMemory(10))
        );
    }

    #[test]
    fn bad_numbers_name_their_flag() {
        for (args, flag) in [
            (&["--mock", "-n", "0"][..], "calls"),
            (&["--mock", "-c", "0"][..], "callers"),
            (&["--mock", "--conn-memory", "0"][..], "conn-memory"),
            (&["--claims-release", "10"][..], "claims-release"),
            (&["--mock", "--volumes", "0"][..], "volumes"),
        ] {
            match parse(args) {
                Err(BenchError::BadFlag { flag: f, .. }) => assert_eq!(f, flag, "{args:?}"),
                other => panic!("{args:?}: expected a bad --{flag}, got {other:?}"),
            }
        }
        assert!(matches!(
            parse(&["-n", "5"]),
            Err(BenchError::NoTarget { .. })
        ));
        assert!(parse(&["--baseline", "--compare"]).is_err());
        assert!(parse(&["--mock", "--endpoint", "unix:///x.sock"]).is_err());
    }

    #[test]
    fn compare_peer_names_the_missing_program() {
        let dir = tempfile::tempdir().expect("test invariant: temp dirs can be made");
        let present = dir.path().join("peer");
        std::fs::write(&present, b"").expect("test invariant: temp files can be written");
        let present = present.to_str().expect("test invariant: utf-8 temp path");
        let absent = dir.path().join("absent");
        let absent = absent.to_str().expect("test invariant: utf-8 temp path");
        for (args, flag) in [
            (&["--compare-peer"][..], "gobench"),
            (&["--compare-peer", "--gobench", present][..], "goserver"),
            (
                &["--compare-peer", "--gobench", absent, "--goserver", present][..],
                "gobench",
            ),
            (
                &["--compare-peer", "--gobench", present, "--goserver", absent][..],
                "goserver",
            ),
            (&["--compare-peer", "--mock"][..], "compare-peer"),
            (
                &[
                    "--compare-peer",
                    "--gobench",
                    present,
                    "--goserver",
                    present,
                    "--peer-mock-threads",
                    "0",
                ][..],
                "peer-mock-threads",
            ),
            (
                &[
                    "--compare-peer",
                    "--gobench",
                    present,
                    "--goserver",
                    present,
                    "--peer-callers",
                    "1",
                ][..],
                "peer-callers",
            ),
        ] {
            match parse(args) {
                Err(e @ BenchError::BadFlag { flag: f, .. }) => {
                    assert_eq!(f, flag, "{args:?}");
                    assert!(e.to_string().starts_with(&format!("--{flag} ")), "{e}");
                }
                other => panic!("{args:?}: expected a bad --{flag}, got {other:?}"),
            }
        }
        match parse(&[
            "--compare-peer",
            "--gobench",
            present,
            "--goserver",
            present,
            "-n",
            "30",
            "--runtime",
            "current-thread",
        ]) {
            Ok(Mode::ComparePeer(spec)) => {
                assert_eq!(spec.sequential_calls, 30);
                assert_eq!(spec.runtime, RuntimeFlavor::CurrentThread);
                assert_eq!(
                    (spec.callers, spec.concurrent_calls, spec.connections),
                    (32, 100_000, 200)
                );
                assert_eq!(spec.mock_plugin, None);
            }
            other => panic!("expected a --compare-peer run, got {other:?}"),
        }
    }

    #[test]
    fn agent_claims_takes_its_defaults_and_names_a_bad_flag_and_its_limit() {
        assert_eq!(
            parse(&["--agent-claims"]).ok(),
            Some(Mode::AgentClaims(AgentClaimsSpec {
                clients: 32,
                secs: 20,
                warmup_secs: 2,
                volumes_per_client: 4,
                dir: None,
                agent_bin: None,
                mock_bin: None,
                agent_args: Vec::new(),
            }))
        );
        match parse(&[
            "--agent-claims",
            "--clients",
            "10000",
            "--secs",
            "1",
            "--warmup-secs",
            "0",
            "--volumes-per-client",
            "10",
            "--dir",
            "/dev/shm/b",
            "--agent-bin",
            "/a/csi-agent",
            "--mock-bin",
            "/a/m",
        ]) {
            Ok(Mode::AgentClaims(spec)) => {
                assert_eq!(
                    (
                        spec.clients,
                        spec.secs,
                        spec.warmup_secs,
                        spec.volumes_per_client
                    ),
                    (10_000, 1, 0, 10)
                );
                assert_eq!(spec.dir, Some(PathBuf::from("/dev/shm/b")));
                assert_eq!(spec.agent_bin, Some(PathBuf::from("/a/csi-agent")));
                assert_eq!(spec.mock_bin, Some(PathBuf::from("/a/m")));
            }
            other => panic!("expected an --agent-claims run, got {other:?}"),
        }
        for (args, flag, text) in [
            (
                &["--clients", "0"][..],
                "clients",
                "--clients 0: must be 1..=10000",
            ),
            (
                &["--clients", "10001"][..],
                "clients",
                "--clients 10001: must be 1..=10000",
            ),
            (&["--secs", "0"][..], "secs", "--secs 0: must be 1..=86400"),
            (
                &["--secs", "86401"][..],
                "secs",
                "--secs 86401: must be 1..=86400",
            ),
            (
                &["--warmup-secs", "3601"][..],
                "warmup-secs",
                "--warmup-secs 3601: must be 0..=3600",
            ),
            (
                &["--volumes-per-client", "0"][..],
                "volumes-per-client",
                "--volumes-per-client 0: must be at least 1",
            ),
            (
                &["--clients", "10000", "--volumes-per-client", "11"][..],
                "volumes-per-client",
                "at most 100000",
            ),
            (
                &["--mock"][..],
                "agent-claims",
                "takes no --endpoint or --mock",
            ),
        ] {
            let args: Vec<&str> = std::iter::once("--agent-claims")
                .chain(args.iter().copied())
                .collect();
            match parse(&args) {
                Err(e @ BenchError::BadFlag { flag: f, .. }) => {
                    assert_eq!(f, flag, "{args:?}");
                    assert!(e.to_string().contains(text), "{args:?}: {e}");
                }
                other => panic!("{args:?}: expected a bad --{flag}, got {other:?}"),
            }
        }
        // Without --agent-claims its flags mean nothing, and say so.
        for (args, flag) in [
            (&["--mock", "--clients", "3"][..], "clients"),
            (&["--baseline", "--secs", "3"][..], "secs"),
            (&["--mock", "--warmup-secs", "0"][..], "warmup-secs"),
            (
                &["--mock", "--volumes-per-client", "2"][..],
                "volumes-per-client",
            ),
            (&["--mock", "--dir", "/tmp"][..], "dir"),
            (&["--mock", "--agent-bin", "/a"][..], "agent-bin"),
            (&["--mock", "--mock-bin", "/a"][..], "mock-bin"),
        ] {
            match parse(args) {
                Err(e @ BenchError::BadFlag { flag: f, .. }) => {
                    assert_eq!(f, flag, "{args:?}");
                    assert!(e.to_string().ends_with("only with --agent-claims"), "{e}");
                }
                other => panic!("{args:?}: expected a bad --{flag}, got {other:?}"),
            }
        }
        // It is a mode of its own.
        assert!(parse(&["--agent-claims", "--baseline"]).is_err());
    }

    #[test]
    fn claims_etcd_flags_are_checked_and_name_their_flag() {
        for (args, flag) in [
            (&["--claims-etcd", "0"][..], "claims-etcd"),
            (&["--claims-etcd", "2000000"][..], "claims-etcd"),
            (&["--claims-etcd", "10", "--agents", "0"][..], "agents"),
            (&["--claims-etcd", "10", "--agents", "17"][..], "agents"),
            // More than 4,000 claims on one volume cannot be one etcd value.
            (
                &["--claims-etcd", "8001", "--volumes", "2"][..],
                "claims-etcd",
            ),
            (
                &["--claims-etcd", "10", "--etcd-endpoints", "https://h:2379"][..],
                "etcd-endpoints",
            ),
            (
                &["--claims-etcd", "10", "--etcd-endpoints", "h:2379,nope"][..],
                "etcd-endpoints",
            ),
            (&["--baseline", "--agents", "3"][..], "agents"),
            (
                &["--mock", "--etcd-endpoints", "h:2379"][..],
                "etcd-endpoints",
            ),
            (&["--mock", "--etcd-duty", "fenced"][..], "etcd-duty"),
        ] {
            match parse(args) {
                Err(BenchError::BadFlag { flag: f, .. }) => assert_eq!(f, flag, "{args:?}"),
                other => panic!("{args:?}: expected a bad --{flag}, got {other:?}"),
            }
        }
        let given = parse(&[
            "--claims-etcd",
            "8000",
            "--volumes",
            "2",
            "--agents",
            "3",
            "--etcd-endpoints",
            "http://127.0.0.1:2379,[::1]:2379",
        ]);
        let started = parse(&["--claims-etcd", "10"]);
        if cfg!(feature = "etcd") {
            assert_eq!(
                given.ok(),
                Some(Mode::ClaimsEtcd(EtcdSpec {
                    claims: 8000,
                    agents: 3,
                    endpoints: Some(vec![
                        "http://127.0.0.1:2379".to_owned(),
                        "[::1]:2379".to_owned()
                    ]),
                    reread: Some(Duration::from_secs(20)),
                    duty: EtcdDuty::Fenced,
                }))
            );
            assert_eq!(
                started.ok(),
                Some(Mode::ClaimsEtcd(EtcdSpec {
                    claims: 10,
                    agents: 1,
                    endpoints: None,
                    reread: Some(Duration::from_secs(20)),
                    duty: EtcdDuty::Fenced,
                }))
            );
        } else {
            for refused in [given, started] {
                match refused {
                    Err(
                        e @ BenchError::BadFlag {
                            flag: "claims-etcd",
                            ..
                        },
                    ) => assert!(e.to_string().contains("--features etcd"), "{e}"),
                    other => panic!("expected the build hint, got {other:?}"),
                }
            }
        }
    }

    #[test]
    fn etcd_duty_is_fenced_unless_asked_and_a_bad_mode_names_the_flag_and_its_values() {
        let duty = |args: &[&str]| match parse(args) {
            Ok(Mode::ClaimsEtcd(spec)) => Some(spec.duty),
            _ => None,
        };
        if cfg!(feature = "etcd") {
            assert_eq!(duty(&["--claims-etcd", "10"]), Some(EtcdDuty::Fenced));
            assert_eq!(
                duty(&["--claims-etcd", "10", "--etcd-duty", "fenced"]),
                Some(EtcdDuty::Fenced)
            );
            assert_eq!(
                duty(&["--claims-etcd", "10", "--etcd-duty", "unfenced"]),
                Some(EtcdDuty::Unfenced)
            );
        }
        assert_eq!(EtcdDuty::Fenced.to_string(), "fenced");
        assert_eq!(EtcdDuty::Unfenced.to_string(), "unfenced");

        // clap refuses an unknown mode, naming the flag and the modes it accepts.
        let refused =
            Cli::try_parse_from(["csi-bench", "--claims-etcd", "10", "--etcd-duty", "off"])
                .expect_err("an unknown duty mode is refused");
        let text = refused.to_string();
        for wanted in ["--etcd-duty", "'off'", "fenced", "unfenced"] {
            assert!(text.contains(wanted), "{wanted} not in {text}");
        }

        // Without --claims-etcd the flag means nothing, and says so.
        match parse(&["--baseline", "--etcd-duty", "unfenced"]) {
            Err(
                e @ BenchError::BadFlag {
                    flag: "etcd-duty", ..
                },
            ) => {
                assert_eq!(
                    e.to_string(),
                    "--etcd-duty unfenced: only with --claims-etcd"
                );
            }
            other => panic!("expected a bad --etcd-duty, got {other:?}"),
        }
    }
}
