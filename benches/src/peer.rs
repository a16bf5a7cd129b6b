//! `--compare-peer`: csi-client and the csi-testkit mock plugin beside grpc-go, Probe, in one
//! interleaved run.
//!
//! Four pairs (client → server) are measured, each sequentially (`c=1`) and with
//! `--peer-callers` concurrent callers on one connection:
//!
//! | client | server |
//! |---|---|
//! | `grpc-go` (the `gobench` program) | `goserver` (a minimal grpc-go plugin) |
//! | `grpc-go` | `csi-mock-plugin` |
//! | `csi-client` (this process) | `csi-mock-plugin` |
//! | `csi-client` | `goserver` |
//!
//! Both servers run as child processes for the whole run. As in [`crate::compare`], every
//! line's calls are split into [`ROUNDS`] batches and each round runs one batch of every line,
//! starting with a different line each round, so that every line samples the same minutes of a
//! noisy machine. A grpc-go batch is one `gobench` run (a fresh process and connection, with
//! its own 500 unmeasured warm-up calls); a csi-client batch is a slice of one long-lived
//! client's calls (warmed up once, with `--warmup` calls).
//!
//! Each line reports the total calls over the summed wall time of its batches (`ops_per_s`),
//! the median over batches of each batch's p50 and p99 (gobench prints only its percentiles,
//! so every line is summarised the same way), and CPU time per call on both sides from
//! `/proc/<pid>/stat`: the server child's own time; csi-client's as this process's own time
//! (no server runs in it); gobench's as this process's waited-children time, divided by the
//! calls it made *including* its warm-up (so it also carries gobench's process start: an upper
//! bound).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use csi_client::{CsiClient, Endpoint};
use tempfile::TempDir;
use tokio::runtime::Runtime;

use crate::child;
use crate::cli::RuntimeFlavor;
use crate::conn_memory::{self, ConnMemory};
use crate::cpu::{self, ticks_to_duration};
use crate::error::BenchError;
use crate::load;
use crate::report::{Line, percentile};
use crate::rpc::{BenchRpc, Given, Plan};
use crate::target::{MOCK_CALL_LOG_LIMIT, socket_dir};

/// How many batches each line's calls are split into.
pub const ROUNDS: u64 = 10;

/// The unmeasured calls every `gobench` run makes before its measured ones (fixed in
/// `gobench`).
pub const GOBENCH_WARMUP: u64 = 500;

/// The most csi-client's p50 (or the mock's, under grpc-go) may be, as a multiple of grpc-go's.
pub const TARGET_P50_MAX: f64 = 0.8;

/// The least csi-client's Probe/s (or the mock's) at `--peer-callers` callers may be, as a
/// multiple of grpc-go's.
pub const TARGET_OPS_MIN: f64 = 1.2;

/// The programs and sizes of a `--compare-peer` run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSpec {
    /// The grpc-go client (`--gobench`).
    pub gobench: PathBuf,
    /// The grpc-go server (`--goserver`).
    pub goserver: PathBuf,
    /// The csi-testkit mock plugin binary (`--mock-plugin`); `None`: `csi-mock-plugin` next
    /// to this executable.
    pub mock_plugin: Option<PathBuf>,
    /// Calls of every sequential line (`-n`).
    pub sequential_calls: u64,
    /// Calls of every concurrent line (`--peer-concurrent-calls`).
    pub concurrent_calls: u64,
    /// Callers of the concurrent lines (`--peer-callers`).
    pub callers: u32,
    /// Connections opened to each server for the memory lines (`--peer-conns`; 0: none).
    pub connections: u32,
    /// Threads the mock plugin serves on (`--peer-mock-threads`).
    pub mock_threads: u16,
    /// csi-client's unmeasured calls before the run (`--warmup`).
    pub warmup: u64,
    /// The runtime csi-client runs on (`--runtime`).
    pub runtime: RuntimeFlavor,
}

/// Which client a line drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerClient {
    /// grpc-go, through `gobench`.
    GrpcGo,
    /// csi-client, in this process.
    CsiClient,
}

impl PeerClient {
    /// The `client=` value.
    pub const fn name(self) -> &'static str {
        match self {
            PeerClient::GrpcGo => "grpc-go",
            PeerClient::CsiClient => load::CLIENT,
        }
    }
}

/// Which server a line drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerServer {
    /// The csi-testkit mock plugin.
    Mock,
    /// The minimal grpc-go plugin.
    GoServer,
}

impl PeerServer {
    /// The `server=` value.
    pub const fn name(self) -> &'static str {
        match self {
            PeerServer::Mock => "csi-mock-plugin",
            PeerServer::GoServer => "goserver",
        }
    }

    const fn index(self) -> usize {
        match self {
            PeerServer::Mock => 0,
            PeerServer::GoServer => 1,
        }
    }
}

/// One measured line of a `--compare-peer` run.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerLine {
    /// The client.
    pub client: PeerClient,
    /// The server.
    pub server: PeerServer,
    /// Concurrent callers.
    pub c: u32,
    /// Measured calls.
    pub n: u64,
    /// Measured calls per second of the batches' summed wall time.
    pub ops_per_s: f64,
    /// Median of the batches' p50, microseconds.
    pub p50_us: f64,
    /// Median of the batches' p99, microseconds.
    pub p99_us: f64,
    /// The client's CPU time per call, microseconds.
    pub client_cpu_us: f64,
    /// The server's CPU time per call, microseconds.
    pub server_cpu_us: f64,
}

impl std::fmt::Display for PeerLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "peer client={} server={} rpc=probe c={} n={} ops_per_s={:.0} p50_us={:.1} \
             p99_us={:.1} client_cpu_us_per_call={:.1} server_cpu_us_per_call={:.1}",
            self.client.name(),
            self.server.name(),
            self.c,
            self.n,
            self.ops_per_s,
            self.p50_us,
            self.p99_us,
            self.client_cpu_us,
            self.server_cpu_us
        )
    }
}

/// One comparison against a target: ours over theirs.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerRatio {
    /// What is compared: `client_on_mock`, `client_on_goserver`, `server_under_grpc_go`.
    pub what: &'static str,
    /// Our sequential p50 over theirs.
    pub p50_ratio: f64,
    /// Our Probe/s at the concurrent callers over theirs.
    pub ops_ratio: f64,
}

impl PeerRatio {
    fn of(
        what: &'static str,
        ours: (&PeerLine, &PeerLine),
        theirs: (&PeerLine, &PeerLine),
    ) -> Self {
        let div = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::INFINITY };
        PeerRatio {
            what,
            p50_ratio: div(ours.0.p50_us, theirs.0.p50_us),
            ops_ratio: div(ours.1.ops_per_s, theirs.1.ops_per_s),
        }
    }

    /// Whether the p50 target is met.
    pub fn p50_met(&self) -> bool {
        self.p50_ratio <= TARGET_P50_MAX
    }

    /// Whether the throughput target is met.
    pub fn ops_met(&self) -> bool {
        self.ops_ratio >= TARGET_OPS_MIN
    }
}

impl std::fmt::Display for PeerRatio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let yes = |b: bool| if b { "yes" } else { "no" };
        write!(
            f,
            "peer_ratio what={} p50_ratio={:.2} target_p50_max={TARGET_P50_MAX} p50_met={} \
             ops_ratio={:.2} target_ops_min={TARGET_OPS_MIN} ops_met={}",
            self.what,
            self.p50_ratio,
            yes(self.p50_met()),
            self.ops_ratio,
            yes(self.ops_met())
        )
    }
}

/// The result of a `--compare-peer` run.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerComparison {
    /// Every measured line: for each pair, sequential then concurrent.
    pub lines: Vec<PeerLine>,
    /// Memory per connection, per server (csi-client connections).
    pub memory: Vec<(PeerServer, ConnMemory)>,
    /// The 1-minute load average before and after.
    pub load: (Option<f64>, Option<f64>),
    /// Threads the mock plugin served on.
    pub mock_threads: u16,
    /// The runtime csi-client ran on.
    pub runtime: RuntimeFlavor,
}

impl PeerComparison {
    fn find(&self, client: PeerClient, server: PeerServer, sequential: bool) -> Option<&PeerLine> {
        self.lines
            .iter()
            .find(|l| l.client == client && l.server == server && (l.c == 1) == sequential)
    }

    fn pair(&self, client: PeerClient, server: PeerServer) -> Option<(&PeerLine, &PeerLine)> {
        Some((
            self.find(client, server, true)?,
            self.find(client, server, false)?,
        ))
    }

    /// The three comparisons with targets.
    pub fn ratios(&self) -> Vec<PeerRatio> {
        use PeerClient::{CsiClient, GrpcGo};
        use PeerServer::{GoServer, Mock};
        let mut ratios = Vec::new();
        for (what, ours, theirs) in [
            ("client_on_mock", (CsiClient, Mock), (GrpcGo, Mock)),
            (
                "client_on_goserver",
                (CsiClient, GoServer),
                (GrpcGo, GoServer),
            ),
            ("server_under_grpc_go", (GrpcGo, Mock), (GrpcGo, GoServer)),
        ] {
            if let (Some(ours), Some(theirs)) =
                (self.pair(ours.0, ours.1), self.pair(theirs.0, theirs.1))
            {
                ratios.push(PeerRatio::of(what, ours, theirs));
            }
        }
        ratios
    }

    /// The printed lines: the measured lines, the ratios, the memory lines and the load.
    pub fn printed(&self) -> Vec<String> {
        let mut out: Vec<String> = self.lines.iter().map(ToString::to_string).collect();
        out.extend(self.ratios().iter().map(ToString::to_string));
        for (server, memory) in &self.memory {
            out.push(format!(
                "peer_memory server={} client=csi-client {}",
                server.name(),
                memory.to_string().trim_start_matches("conn_memory ")
            ));
        }
        let load = |l: Option<f64>| l.map_or("unknown".to_owned(), |l| format!("{l:.2}"));
        out.push(format!(
            "peer_load loadavg_1m_before={} loadavg_1m_after={} rounds={ROUNDS} mock_threads={} \
             runtime={}",
            load(self.load.0),
            load(self.load.1),
            self.mock_threads,
            self.runtime.as_str()
        ));
        out
    }
}

/// A server child process on a socket of its own.
struct Server {
    which: PeerServer,
    program: PathBuf,
    child: Child,
    path: PathBuf,
    _dir: TempDir,
}

impl Server {
    fn start(which: PeerServer, program: &Path, threads: u16) -> Result<Server, BenchError> {
        let dir = socket_dir("a --compare-peer server's socket")?;
        let path = dir.path().join("csi.sock");
        let mut command = Command::new(program);
        match which {
            PeerServer::GoServer => command.arg("-endpoint").arg(&path),
            PeerServer::Mock => command
                .arg("--endpoint")
                .arg(format!("unix://{}", path.display()))
                .arg("--call-log-limit")
                .arg(MOCK_CALL_LOG_LIMIT.to_string())
                .arg("--threads")
                .arg(threads.to_string()),
        };
        let role = which.name();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| BenchError::Spawn {
                exe: program.to_path_buf(),
                role,
                source,
            })?;
        if let Err(e) = child::wait_for_socket(&path, &mut child, program, role) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(Server {
            which,
            program: program.to_path_buf(),
            child,
            path,
            _dir: dir,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn endpoint(&self) -> Result<Endpoint, BenchError> {
        Endpoint::unix(&self.path).map_err(|source| BenchError::Endpoint {
            endpoint: self.path.display().to_string(),
            source,
        })
    }

    fn cpu(&self) -> Result<u64, BenchError> {
        Ok(cpu::cpu_ticks(Some(self.pid()))?.own)
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // `stop` normally ran; if a run failed, do not leave the server behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One line's batches.
struct Acc {
    client: PeerClient,
    server: PeerServer,
    c: u32,
    calls: u64,
    wall: Duration,
    p50s: Vec<f64>,
    p99s: Vec<f64>,
    client_ticks: u64,
    client_calls: u64,
    server_ticks: u64,
    server_calls: u64,
}

impl Acc {
    fn new(client: PeerClient, server: PeerServer, c: u32) -> Acc {
        Acc {
            client,
            server,
            c,
            calls: 0,
            wall: Duration::ZERO,
            p50s: Vec::new(),
            p99s: Vec::new(),
            client_ticks: 0,
            client_calls: 0,
            server_ticks: 0,
            server_calls: 0,
        }
    }

    fn line(&self) -> PeerLine {
        let per_call = |ticks: u64, calls: u64| {
            if calls == 0 {
                0.0
            } else {
                ticks_to_duration(ticks).as_secs_f64() * 1e6 / calls as f64
            }
        };
        let secs = self.wall.as_secs_f64();
        PeerLine {
            client: self.client,
            server: self.server,
            c: self.c,
            n: self.calls,
            ops_per_s: if secs > 0.0 {
                self.calls as f64 / secs
            } else {
                0.0
            },
            p50_us: median(&self.p50s),
            p99_us: median(&self.p99s),
            client_cpu_us: per_call(self.client_ticks, self.client_calls),
            server_cpu_us: per_call(self.server_ticks, self.server_calls),
        }
    }
}

/// The median of `values` (the mean of the middle two for an even count); 0 when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// How many calls each round makes: `n` split into [`ROUNDS`] batches, each a multiple of
/// `c` (gobench gives every caller `n / c` calls) and at least `c`.
pub fn batch_size(n: u64, c: u32) -> u64 {
    let c = u64::from(c.max(1));
    ((n / ROUNDS) / c).max(1) * c
}

/// The mock plugin binary: the given one, or `csi-mock-plugin` next to `exe`.
///
/// # Errors
///
/// [`BenchError::BadFlag`] naming `--mock-plugin` when there is no such file.
pub fn mock_plugin_path(given: Option<&Path>, exe: &Path) -> Result<PathBuf, BenchError> {
    let path = match given {
        Some(path) => path.to_path_buf(),
        None => exe.with_file_name("csi-mock-plugin"),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(BenchError::BadFlag {
            flag: "mock-plugin",
            value: path.display().to_string(),
            limit: "no such file: build it with `cargo build --release -p csi-testkit --bin \
                    csi-mock-plugin` (csi-bench looks for it next to itself) or give its path",
        })
    }
}

/// Runs the comparison.
///
/// # Errors
///
/// A missing program (naming its flag), a server that did not start, a failed call or
/// gobench run, an unreadable `/proc` file.
pub fn run_compare_peer(
    rt: &Runtime,
    spec: &PeerSpec,
    exe: &Path,
) -> Result<PeerComparison, BenchError> {
    let mock_program = mock_plugin_path(spec.mock_plugin.as_deref(), exe)?;
    let load_before = cpu::load_average();
    let servers = [
        Server::start(PeerServer::Mock, &mock_program, spec.mock_threads)?,
        Server::start(PeerServer::GoServer, &spec.goserver, 0)?,
    ];
    let result = measure_all(rt, spec, &servers);
    let load_after = cpu::load_average();
    for server in servers {
        server.stop();
    }
    let (lines, memory) = result?;
    Ok(PeerComparison {
        lines,
        memory,
        load: (load_before, load_after),
        mock_threads: spec.mock_threads,
        runtime: spec.runtime,
    })
}

/// A warmed-up csi-client on one server.
struct Ours {
    client: CsiClient,
    plan: Plan,
}

/// The measured lines and the memory lines of a run.
type Measured = (Vec<PeerLine>, Vec<(PeerServer, ConnMemory)>);

fn measure_all(
    rt: &Runtime,
    spec: &PeerSpec,
    servers: &[Server; 2],
) -> Result<Measured, BenchError> {
    let mut ours = Vec::with_capacity(2);
    for server in servers {
        let client = CsiClient::new(server.endpoint()?);
        let mut plan = rt.block_on(Plan::prepare(
            &client,
            BenchRpc::Probe,
            spec.callers,
            &Given::default(),
        ))?;
        rt.block_on(load::measure(&client, &mut plan, spec.warmup, spec.callers))?;
        ours.push(Ours { client, plan });
    }
    let mut accs = Vec::new();
    for server in [PeerServer::GoServer, PeerServer::Mock] {
        for client in [PeerClient::GrpcGo, PeerClient::CsiClient] {
            accs.push(Acc::new(client, server, 1));
            accs.push(Acc::new(client, server, spec.callers));
        }
    }
    let count = accs.len();
    for round in 0..ROUNDS as usize {
        for offset in 0..count {
            let acc = &mut accs[(round + offset) % count];
            let n = if acc.c == 1 {
                spec.sequential_calls
            } else {
                spec.concurrent_calls
            };
            let server = &servers[acc.server.index()];
            let batch = batch_size(n, acc.c);
            match acc.client {
                PeerClient::GrpcGo => gobench_batch(acc, &spec.gobench, server, batch)?,
                PeerClient::CsiClient => {
                    let ours = &mut ours[acc.server.index()];
                    ours_batch(rt, acc, ours, server, batch)?;
                }
            }
        }
    }
    for ours in &mut ours {
        rt.block_on(ours.plan.clean_up(&ours.client))?;
    }
    drop(ours);
    let mut memory = Vec::new();
    if spec.connections > 0 {
        for server in servers {
            let measured = rt.block_on(conn_memory::measure(
                server.endpoint()?,
                spec.connections,
                Some(server.pid()),
            ))?;
            memory.push((server.which, measured));
        }
    }
    Ok((accs.iter().map(Acc::line).collect(), memory))
}

fn ours_batch(
    rt: &Runtime,
    acc: &mut Acc,
    ours: &mut Ours,
    server: &Server,
    batch: u64,
) -> Result<(), BenchError> {
    let client_before = cpu::cpu_ticks(None)?.own;
    let server_before = server.cpu()?;
    let started = Instant::now();
    let mut latencies = rt.block_on(load::measure(&ours.client, &mut ours.plan, batch, acc.c))?;
    let wall = started.elapsed();
    let server_after = server.cpu()?;
    let client_after = cpu::cpu_ticks(None)?.own;
    latencies.sort_unstable();
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    acc.p50s.push(micros(percentile(&latencies, 50)));
    acc.p99s.push(micros(percentile(&latencies, 99)));
    acc.calls += latencies.len() as u64;
    acc.wall += wall;
    acc.client_ticks += client_after.saturating_sub(client_before);
    acc.client_calls += batch;
    acc.server_ticks += server_after.saturating_sub(server_before);
    acc.server_calls += batch;
    Ok(())
}

fn gobench_batch(
    acc: &mut Acc,
    gobench: &Path,
    server: &Server,
    batch: u64,
) -> Result<(), BenchError> {
    let failed = |detail: String| BenchError::Peer {
        program: gobench.to_path_buf(),
        detail,
    };
    let children_before = cpu::cpu_ticks(None)?.children;
    let server_before = server.cpu()?;
    let output = Command::new(gobench)
        .arg("-endpoint")
        .arg(&server.path)
        .args(["-rpc", "probe", "-n"])
        .arg(batch.to_string())
        .arg("-c")
        .arg(acc.c.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| BenchError::Spawn {
            exe: gobench.to_path_buf(),
            role: "grpc-go client",
            source,
        })?;
    let server_after = server.cpu()?;
    let children_after = cpu::cpu_ticks(None)?.children;
    if !output.status.success() {
        return Err(failed(format!(
            "against {} exited with {}: {}",
            server.program.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let line: Line = text
        .lines()
        .find(|l| l.starts_with("client="))
        .ok_or_else(|| failed(format!("printed no result line: {:?}", text.trim())))?
        .parse()
        .map_err(|e| failed(format!("printed a line that does not parse: {e}")))?;
    if line.n == 0 || line.ops_per_s <= 0.0 {
        return Err(failed(format!("printed an empty run: {line}")));
    }
    acc.p50s.push(line.p50_us);
    acc.p99s.push(line.p99_us);
    acc.calls += line.n;
    acc.wall += Duration::from_secs_f64(line.n as f64 / line.ops_per_s);
    acc.client_ticks += children_after.saturating_sub(children_before);
    acc.client_calls += line.n + GOBENCH_WARMUP;
    acc.server_ticks += server_after.saturating_sub(server_before);
    acc.server_calls += line.n + GOBENCH_WARMUP;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_multiples_of_the_callers() {
        assert_eq!(batch_size(20_000, 1), 2_000);
        assert_eq!(batch_size(100_000, 32), 9_984);
        assert_eq!(batch_size(5, 32), 32);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    fn line(client: PeerClient, server: PeerServer, c: u32, p50: f64, ops: f64) -> PeerLine {
        PeerLine {
            client,
            server,
            c,
            n: 100,
            ops_per_s: ops,
            p50_us: p50,
            p99_us: p50 * 2.0,
            client_cpu_us: 10.0,
            server_cpu_us: 10.0,
        }
    }

    #[test]
    fn ratios_compare_ours_with_theirs_on_the_same_side() {
        use PeerClient::{CsiClient, GrpcGo};
        use PeerServer::{GoServer, Mock};
        let comparison = PeerComparison {
            lines: vec![
                line(GrpcGo, GoServer, 1, 100.0, 10_000.0),
                line(GrpcGo, GoServer, 32, 500.0, 40_000.0),
                line(GrpcGo, Mock, 1, 100.0, 10_000.0),
                line(GrpcGo, Mock, 32, 500.0, 60_000.0),
                line(CsiClient, Mock, 1, 70.0, 14_000.0),
                line(CsiClient, Mock, 32, 400.0, 66_000.0),
                line(CsiClient, GoServer, 1, 90.0, 11_000.0),
                line(CsiClient, GoServer, 32, 500.0, 50_000.0),
            ],
            memory: Vec::new(),
            load: (Some(1.0), None),
            mock_threads: 1,
            runtime: RuntimeFlavor::CurrentThread,
        };
        let ratios = comparison.ratios();
        let what: Vec<_> = ratios.iter().map(|r| r.what).collect();
        assert_eq!(
            what,
            [
                "client_on_mock",
                "client_on_goserver",
                "server_under_grpc_go"
            ]
        );
        // On the mock: 70/100 p50 (met), 66k/60k Probe/s = 1.1 (not met).
        assert!(ratios[0].p50_met() && !ratios[0].ops_met(), "{}", ratios[0]);
        // On goserver: 0.9 (not met), 1.25 (met).
        assert!(!ratios[1].p50_met() && ratios[1].ops_met(), "{}", ratios[1]);
        // The mock against goserver under grpc-go: 1.0, 1.5.
        assert!(!ratios[2].p50_met() && ratios[2].ops_met(), "{}", ratios[2]);
        let printed = comparison.printed();
        assert_eq!(printed.len(), 8 + 3 + 1, "{printed:?}");
        assert!(printed[0].starts_with("peer client=grpc-go server=goserver rpc=probe c=1 n=100"));
        assert!(printed[8].contains("p50_ratio=0.70") && printed[8].contains("p50_met=yes"));
        assert_eq!(
            printed[11],
            "peer_load loadavg_1m_before=1.00 loadavg_1m_after=unknown rounds=10 mock_threads=1 \
             runtime=current-thread"
        );
    }

    #[test]
    fn a_missing_mock_plugin_names_its_flag() {
        let dir = tempfile::tempdir().expect("test invariant: temp dirs can be made");
        let exe = dir.path().join("csi-bench");
        match mock_plugin_path(None, &exe) {
            Err(BenchError::BadFlag { flag, value, .. }) => {
                assert_eq!(flag, "mock-plugin");
                assert!(value.ends_with("/csi-mock-plugin"), "{value}");
            }
            other => panic!("expected a bad --mock-plugin, got {other:?}"),
        }
        let here = dir.path().join("csi-mock-plugin");
        std::fs::write(&here, b"").expect("test invariant: temp files can be written");
        assert_eq!(mock_plugin_path(None, &exe).ok(), Some(here.clone()));
        assert_eq!(
            mock_plugin_path(Some(&here), Path::new("/x")).ok(),
            Some(here)
        );
    }
}
