//! `--agent-claims`: the node's claim throughput through the real agent.
//!
//! The run starts the real binaries, `csi-mock-plugin` on `<dir>/plugins/mock.sock` and
//! `csi-agent serve` on `<dir>/data` (fast release backoff, log at `warn`), waits until the
//! agent has fingerprinted plugin `mock` and found it healthy, and creates
//! `--volumes-per-client` single-node-writer mount volumes per client through the control
//! API. Then `--clients` clients each loop over their own volumes:
//! `POST /v1/volumes/{id}/claim` for a fresh workload (mode `write`), then
//! `POST /v1/volumes/{id}/release` of that workload, then the next volume. A claim that finds
//! the volume still being released from the previous round waits for that release in the
//! agent (up to its `call_timeout`); one answered 409 all the same (an agent from before that
//! wait, or a release that outlasted it) is asked again 1 ms later,
//! the wait doubling up to 16 ms while it stays busy, and counted as `busy`; any other error
//! answer is counted in `errors` (the first one printed on stderr) and the client goes on.
//! `--agent-arg` adds arguments to `csi-agent serve` (`--controller-calls=8`, say).
//!
//! Over the measured period only (after `--warmup-secs`), the run counts ops (acknowledged
//! claims and releases), their latencies, the CPU time of the agent, the mock and the bench
//! process (`/proc/<pid>/stat`), the agent's resident memory at both ends and halfway, and
//! the 1-minute load average at both ends, and prints one [`AgentClaimsLine`].
//!
//! Everything the run starts is killed (SIGKILL) and its directory removed when it ends,
//! whether it succeeded, failed or was interrupted with Ctrl-C.

use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use csi_agent::ops::api::{
    AgentInfo, ClaimVolume, CreateVolume, ReleaseVolume, StatusView, encode_segment,
};
use csi_agent::ops::client::{self, ClientError};
use hyper::Method;
use serde::Serialize;
use serde::de::{DeserializeOwned, IgnoredAny};
use tokio::runtime::Runtime;
use tokio::time::Instant;

use crate::cpu;
use crate::error::BenchError;
use crate::memory;
use crate::report::percentile;

/// The plugin id the mock serves as (its socket is `<plugin-dir>/mock.sock`).
pub const PLUGIN_ID: &str = "mock";

/// How long the mock's socket, the agent's address and the first fingerprint may take.
pub const START_LIMIT: Duration = Duration::from_secs(30);

/// The limit of one control API request.
pub const CALL_LIMIT: Duration = Duration::from_secs(30);

/// The wait before a claim answered 409 is asked again the first time; it doubles with each
/// 409 in a row, up to [`BUSY_RETRY_MAX`], so clients waiting for releases do not spend the
/// machine's CPU (and the agent's) asking.
pub const BUSY_RETRY: Duration = Duration::from_millis(1);

/// The longest wait between two claims of a busy volume.
pub const BUSY_RETRY_MAX: Duration = Duration::from_millis(16);

/// Volumes created at once before the run.
const CREATE_CONCURRENCY: usize = 8;

/// How often start-up conditions are polled.
const POLL: Duration = Duration::from_millis(10);

/// The longest unix socket path Linux takes (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// How much of a child's log an error quotes.
const LOG_TAIL_BYTES: usize = 4000;

/// What `--agent-claims` runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentClaimsSpec {
    /// Concurrent clients (`--clients`).
    pub clients: u32,
    /// The measured period, seconds (`--secs`).
    pub secs: u64,
    /// The unmeasured load before it, seconds (`--warmup-secs`).
    pub warmup_secs: u64,
    /// Volumes per client (`--volumes-per-client`).
    pub volumes_per_client: u32,
    /// Where the run's temporary directory goes (`--dir`); `None`: the system's temporary
    /// directory.
    pub dir: Option<PathBuf>,
    /// The agent binary (`--agent-bin`); `None`: `csi-agent` next to csi-bench.
    pub agent_bin: Option<PathBuf>,
    /// Arguments added to `csi-agent serve` (`--agent-arg`), e.g. `--controller-calls=8`.
    pub agent_args: Vec<String>,
    /// The mock plugin binary (`--mock-bin`); `None`: `csi-mock-plugin` next to csi-bench.
    pub mock_bin: Option<PathBuf>,
}

impl AgentClaimsSpec {
    /// `--clients` when not given.
    pub const DEFAULT_CLIENTS: u32 = 32;
    /// `--secs` when not given.
    pub const DEFAULT_SECS: u64 = 20;
    /// `--warmup-secs` when not given.
    pub const DEFAULT_WARMUP_SECS: u64 = 2;
    /// `--volumes-per-client` when not given.
    pub const DEFAULT_VOLUMES_PER_CLIENT: u32 = 4;
}

/// The result of a `--agent-claims` run, printed as one line:
///
/// ```text
/// agent-claims clients=32 secs=20 volumes_per_client=4 fs=tmpfs ops=… ops_per_s=… claim_p50_ms=…
///   claim_p99_ms=… release_p50_ms=… release_p99_ms=… busy=… errors=0 agent_cpu_ms_per_op=…
///   mock_cpu_ms_per_op=… bench_cpu_ms_per_op=… agent_rss_mb_start=… agent_rss_mb_mid=…
///   agent_rss_mb_end=… load1_start=… load1_end=… agent=/path/to/csi-agent agent_args=-
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct AgentClaimsLine {
    /// Concurrent clients.
    pub clients: u32,
    /// The measured period, seconds.
    pub secs: u64,
    /// Volumes per client.
    pub volumes_per_client: u32,
    /// The type of the filesystem of the agent's data directory (`tmpfs`, `ext4`, …).
    pub fs: String,
    /// Acknowledged claims plus acknowledged releases in the measured period.
    pub ops: u64,
    /// Median latency of the acknowledged claims.
    pub claim_p50: Duration,
    /// 99th percentile latency of the acknowledged claims.
    pub claim_p99: Duration,
    /// Median latency of the acknowledged releases.
    pub release_p50: Duration,
    /// 99th percentile latency of the acknowledged releases.
    pub release_p99: Duration,
    /// Claims answered 409 in the measured period (asked again).
    pub busy: u64,
    /// Other error answers and failed requests, over the whole run (warm-up included).
    pub errors: u64,
    /// The agent's CPU time (user + system) over the measured period, clock ticks.
    pub agent_cpu_ticks: u64,
    /// The mock plugin's CPU time over the measured period, clock ticks.
    pub mock_cpu_ticks: u64,
    /// This process's CPU time (the clients) over the measured period, clock ticks.
    pub bench_cpu_ticks: u64,
    /// The agent's resident memory when the measured period began, bytes.
    pub agent_rss_start: u64,
    /// The agent's resident memory halfway through it, bytes: with the two others, whether
    /// memory grows over the run or levelled off early.
    pub agent_rss_mid: u64,
    /// The agent's resident memory when it ended, bytes.
    pub agent_rss_end: u64,
    /// The 1-minute load average when the measured period began (`None`: unreadable).
    pub load1_start: Option<f64>,
    /// The 1-minute load average when it ended.
    pub load1_end: Option<f64>,
    /// The agent binary run.
    pub agent: PathBuf,
    /// The arguments added to `csi-agent serve` (`--agent-arg`), in order.
    pub agent_args: Vec<String>,
}

impl AgentClaimsLine {
    /// Ops per second of the measured period.
    pub fn ops_per_s(&self) -> f64 {
        per(self.ops as f64, self.secs as f64)
    }

    /// Milliseconds of CPU time per op, of `ticks` clock ticks.
    pub fn cpu_ms_per_op(&self, ticks: u64) -> f64 {
        per(
            ticks as f64 * 1000.0 / cpu::TICKS_PER_SECOND as f64,
            self.ops as f64,
        )
    }

    /// Whether the run failed: an error counted, or no op measured.
    pub fn failed(&self) -> bool {
        self.errors > 0 || self.ops == 0
    }
}

fn per(amount: f64, of: f64) -> f64 {
    if of > 0.0 { amount / of } else { 0.0 }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// A load average as printed: two decimals, `na` when unknown.
fn load(value: Option<f64>) -> String {
    value.map_or_else(|| "na".to_owned(), |v| format!("{v:.2}"))
}

impl fmt::Display for AgentClaimsLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "agent-claims clients={} secs={} volumes_per_client={} fs={} ops={} ops_per_s={:.1} \
             claim_p50_ms={:.3} claim_p99_ms={:.3} release_p50_ms={:.3} release_p99_ms={:.3} \
             busy={} errors={} agent_cpu_ms_per_op={:.3} mock_cpu_ms_per_op={:.3} \
             bench_cpu_ms_per_op={:.3} agent_rss_mb_start={:.1} agent_rss_mb_mid={:.1} agent_rss_mb_end={:.1} \
             load1_start={} load1_end={} agent={} agent_args={}",
            self.clients,
            self.secs,
            self.volumes_per_client,
            self.fs,
            self.ops,
            self.ops_per_s(),
            ms(self.claim_p50),
            ms(self.claim_p99),
            ms(self.release_p50),
            ms(self.release_p99),
            self.busy,
            self.errors,
            self.cpu_ms_per_op(self.agent_cpu_ticks),
            self.cpu_ms_per_op(self.mock_cpu_ticks),
            self.cpu_ms_per_op(self.bench_cpu_ticks),
            mib(self.agent_rss_start),
            mib(self.agent_rss_mid),
            mib(self.agent_rss_end),
            load(self.load1_start),
            load(self.load1_end),
            self.agent.display(),
            if self.agent_args.is_empty() {
                "-".to_owned()
            } else {
                self.agent_args.join(",")
            }
        )
    }
}

/// A program the run starts: the given path, or `name` next to `exe` (csi-bench itself).
///
/// # Errors
///
/// [`BenchError::BadFlag`] naming `flag` and the path when there is no such file, saying how
/// to build it.
pub fn program_path(
    given: Option<&Path>,
    exe: &Path,
    name: &str,
    flag: &'static str,
) -> Result<PathBuf, BenchError> {
    let path = match given {
        Some(path) => path.to_path_buf(),
        None => exe.with_file_name(name),
    };
    if path.is_file() {
        Ok(std::fs::canonicalize(&path).unwrap_or(path))
    } else {
        Err(BenchError::BadFlag {
            flag,
            value: path.display().to_string(),
            limit: "no such file: build it with `cargo build --release -p csi-agent -p \
                    csi-testkit` (csi-bench looks for csi-agent and csi-mock-plugin next to \
                    itself) or give its path",
        })
    }
}

/// Runs `--agent-claims` on `rt` and returns its line (also when it counted errors: see
/// [`AgentClaimsLine::failed`]).
///
/// # Errors
///
/// A missing binary (naming its flag), a directory that cannot be made, a child that does
/// not start or dies, an agent that does not fingerprint the mock in time, a volume that
/// cannot be created, an unreadable `/proc` file, Ctrl-C.
pub fn run_agent_claims(
    rt: &Runtime,
    spec: &AgentClaimsSpec,
    exe: &Path,
) -> Result<AgentClaimsLine, BenchError> {
    let agent_bin = program_path(spec.agent_bin.as_deref(), exe, "csi-agent", "agent-bin")?;
    let mock_bin = program_path(spec.mock_bin.as_deref(), exe, "csi-mock-plugin", "mock-bin")?;
    let base = match &spec.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| BenchError::AgentClaims {
                step: "creating --dir",
                detail: format!("{}: {e}", dir.display()),
            })?;
            dir.clone()
        }
        None => std::env::temp_dir(),
    };
    // Removed when dropped, after everything started in it was killed (in `measure`).
    let dir = tempfile::Builder::new()
        .prefix("csi-bench-agent-claims-")
        .tempdir_in(&base)
        .map_err(|source| BenchError::TempDir {
            purpose: "--agent-claims (give a writable --dir)",
            source,
        })?;
    // Set by the first error of any client, which prints it; set on Ctrl-C too, since the
    // clients then see the agent killed under them.
    let first_error = Arc::new(AtomicBool::new(false));
    let interrupted = async {
        if tokio::signal::ctrl_c().await.is_err() {
            // No signal handler: run without one.
            std::future::pending::<()>().await;
        }
        first_error.store(true, Ordering::Relaxed);
    };
    rt.block_on(async {
        tokio::select! {
            result = measure(spec, dir.path(), &agent_bin, &mock_bin, &first_error) => result,
            () = interrupted => Err(BenchError::AgentClaims {
                step: "interrupted",
                detail: "Ctrl-C: the agent and the mock are killed and the directory removed"
                    .to_owned(),
            }),
        }
    })
}

/// A child process of the run, killed (SIGKILL) and waited for when dropped, however the run
/// ends.
#[derive(Debug)]
struct Process {
    child: Child,
    role: &'static str,
    program: PathBuf,
    log: PathBuf,
}

impl Process {
    /// Starts `program` with `args`, stdout and stderr to `log`, stdin closed, without the
    /// caller's `CSI_AGENT_*` and `CSI_ENDPOINT` variables (each would change its settings).
    fn start(
        program: &Path,
        args: &[OsString],
        log: PathBuf,
        role: &'static str,
    ) -> Result<Process, BenchError> {
        let log_error = |e: std::io::Error| BenchError::AgentClaims {
            step: "creating a child's log file",
            detail: format!("{}: {e}", log.display()),
        };
        let out = File::create(&log).map_err(log_error)?;
        let err = out.try_clone().map_err(log_error)?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (key, _) in std::env::vars_os() {
            let name = key.to_string_lossy();
            if name.starts_with("CSI_AGENT_") || name == "CSI_ENDPOINT" {
                command.env_remove(&key);
            }
        }
        let child = command.spawn().map_err(|source| BenchError::Spawn {
            exe: program.to_path_buf(),
            role,
            source,
        })?;
        Ok(Process {
            child,
            role,
            program: program.to_path_buf(),
            log,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Ok` while the process runs; its exit, with the end of its log, once it stopped.
    fn check_running(&mut self, step: &'static str) -> Result<(), BenchError> {
        let how = match self.child.try_wait() {
            Ok(None) => return Ok(()),
            Ok(Some(status)) => status.to_string(),
            Err(e) => format!("cannot be waited for: {e}"),
        };
        Err(BenchError::AgentClaims {
            step,
            detail: format!(
                "the {} ({}) exited: {how}; the end of its log ({}):\n{}",
                self.role,
                self.program.display(),
                self.log.display(),
                self.log_tail()
            ),
        })
    }

    /// The last [`LOG_TAIL_BYTES`] of its log.
    fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let from = text.len().saturating_sub(LOG_TAIL_BYTES);
        String::from_utf8_lossy(&text[from..]).into_owned()
    }

    /// The lines of its log so far.
    fn log_lines(&self) -> Vec<String> {
        std::fs::read(&self.log)
            .map(|text| {
                String::from_utf8_lossy(&text)
                    .lines()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Already exited: nothing to kill, and `wait` reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `probe` until it answers, while `process` runs, at most [`START_LIMIT`].
async fn wait_for<T>(
    process: &mut Process,
    step: &'static str,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> Result<T, BenchError> {
    let deadline = Instant::now() + START_LIMIT;
    loop {
        let last = match probe().await {
            Ok(value) => return Ok(value),
            Err(why) => why,
        };
        process.check_running(step)?;
        if Instant::now() >= deadline {
            return Err(BenchError::AgentClaims {
                step,
                detail: format!("not done within {START_LIMIT:?}; last: {last}"),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The agent's control API: its address and bearer token. Cheap to clone.
#[derive(Clone, Debug)]
struct Control {
    addr: SocketAddr,
    token: Arc<str>,
}

impl Control {
    /// The address and token the agent with process id `pid` wrote into `data`, once it has.
    fn read(data: &Path, pid: u32) -> Result<Control, String> {
        let info =
            std::fs::read(data.join("agent.json")).map_err(|e| format!("agent.json: {e}"))?;
        let info: AgentInfo =
            serde_json::from_slice(&info).map_err(|e| format!("agent.json: {e}"))?;
        if info.pid != pid {
            return Err(format!(
                "agent.json names process {}, not the agent started ({pid})",
                info.pid
            ));
        }
        let addr = info
            .http
            .parse()
            .map_err(|e| format!("agent.json's address {:?}: {e}", info.http))?;
        let token = std::fs::read_to_string(data.join("control.token"))
            .map_err(|e| format!("control.token: {e}"))?;
        let token = token.trim();
        if token.is_empty() {
            return Err("control.token is empty".to_owned());
        }
        Ok(Control {
            addr,
            token: token.into(),
        })
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        client::call(self.addr, Some(&self.token), method, path, body, CALL_LIMIT).await
    }

    /// `Ok` once the agent reports plugin `mock` fingerprinted at least once and healthy
    /// (the agent publishes nothing through a plugin whose health is not known to be good).
    async fn fingerprinted(&self) -> Result<(), String> {
        let status: StatusView = self
            .call::<(), _>(Method::GET, "/v1/status", None)
            .await
            .map_err(|e| e.to_string())?;
        match status.plugins.iter().find(|p| p.id == PLUGIN_ID) {
            Some(p) if p.fingerprints >= 1 && p.health == "healthy" => Ok(()),
            Some(p) => Err(format!(
                "plugin {PLUGIN_ID} fingerprinted {} time(s), health {} (reason {:?}, last \
                 error {:?})",
                p.fingerprints, p.health, p.health_reason, p.last_error
            )),
            None => Err(format!("no plugin {PLUGIN_ID} yet")),
        }
    }
}

/// An error answer or a failed request, for people: the HTTP status and kind when the agent
/// answered.
fn describe(e: &ClientError) -> String {
    match e {
        ClientError::Api { status, error } => format!("HTTP {status} {}: {e}", error.kind),
        other => other.to_string(),
    }
}

/// The volume ids of each client.
fn volume_ids(clients: u32, per_client: u32) -> Vec<Vec<String>> {
    (0..clients)
        .map(|c| {
            (0..per_client)
                .map(|v| format!("bench-c{c}-v{v}"))
                .collect()
        })
        .collect()
}

/// Creates every volume, [`CREATE_CONCURRENCY`] at a time.
async fn create_volumes(control: &Control, ids: &[Vec<String>]) -> Result<(), BenchError> {
    let permits = Arc::new(tokio::sync::Semaphore::new(CREATE_CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids.iter().flatten() {
        let control = control.clone();
        let permits = Arc::clone(&permits);
        let body = CreateVolume {
            id: id.clone(),
            plugin: PLUGIN_ID.to_owned(),
            capacity_bytes: 1 << 20,
            access_mode: "single-node-writer".to_owned(),
            attachment: "mount".to_owned(),
            parameters: Default::default(),
            secrets: Default::default(),
            requisite_topology: Vec::new(),
            preferred_topology: Vec::new(),
            snapshot: None,
            clone: None,
        };
        tasks.spawn(async move {
            let _permit = permits.acquire().await;
            control
                .call::<_, IgnoredAny>(Method::POST, "/v1/volumes/create", Some(&body))
                .await
                .map(|_| ())
                .map_err(|e| format!("volume {}: {}", body.id, describe(&e)))
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let created = joined.map_err(|e| format!("a create task failed: {e}"));
        if let Err(detail) = created.and_then(|r| r) {
            return Err(BenchError::AgentClaims {
                step: "creating the volumes",
                detail,
            });
        }
    }
    Ok(())
}

/// The measured period.
#[derive(Clone, Copy, Debug)]
struct Window {
    start: Instant,
    end: Instant,
}

impl Window {
    fn holds(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }
}

/// What one client counted.
#[derive(Debug, Default)]
struct Tally {
    claims: Vec<Duration>,
    releases: Vec<Duration>,
    busy: u64,
    errors: u64,
}

/// How a client's claim ended.
enum Claimed {
    /// Acknowledged.
    Yes,
    /// Refused by the agent: nothing to release.
    No,
    /// Unknown (the request was cut, the answer unreadable): released before the volume's
    /// next claim, in case it was made.
    Maybe,
    /// The measured period ended while the volume was busy.
    Stopped,
}

/// One client: its own volumes, claimed and released in turn.
#[derive(Debug)]
struct Client {
    id: usize,
    volumes: Vec<String>,
    control: Control,
    window: Window,
    /// Set by the first error of any client (printed on stderr).
    first_error: Arc<AtomicBool>,
}

impl Client {
    async fn run(self) -> Tally {
        let mut tally = Tally::default();
        // A workload whose release failed (or whose claim may have been made), per volume:
        // released before the volume is claimed again.
        let mut held: Vec<Option<String>> = vec![None; self.volumes.len()];
        let mut seq: u64 = 0;
        'run: loop {
            for (i, volume) in self.volumes.iter().enumerate() {
                if Instant::now() >= self.window.end {
                    break 'run;
                }
                let encoded = encode_segment(volume);
                let claim_path = format!("/v1/volumes/{encoded}/claim");
                let release_path = format!("/v1/volumes/{encoded}/release");
                if let Some(workload) = held[i].take()
                    && !self
                        .release(&release_path, volume, &workload, &mut tally)
                        .await
                {
                    held[i] = Some(workload);
                    continue;
                }
                seq += 1;
                let workload = format!("c{}-w{seq}", self.id);
                match self.claim(&claim_path, volume, &workload, &mut tally).await {
                    Claimed::Yes => {}
                    Claimed::No => continue,
                    Claimed::Maybe => {
                        held[i] = Some(workload);
                        continue;
                    }
                    Claimed::Stopped => break 'run,
                }
                if !self
                    .release(&release_path, volume, &workload, &mut tally)
                    .await
                {
                    held[i] = Some(workload);
                }
            }
        }
        tally
    }

    async fn claim(&self, path: &str, volume: &str, workload: &str, tally: &mut Tally) -> Claimed {
        let body = ClaimVolume {
            workload: workload.to_owned(),
            mode: "write".to_owned(),
        };
        let mut wait = BUSY_RETRY;
        loop {
            let sent = Instant::now();
            let answer = self
                .control
                .call::<_, IgnoredAny>(Method::POST, path, Some(&body))
                .await;
            let done = Instant::now();
            match answer {
                Ok(_) => {
                    if self.window.holds(done) {
                        tally.claims.push(done - sent);
                    }
                    return Claimed::Yes;
                }
                Err(ClientError::Api { status: 409, .. }) => {
                    if self.window.holds(done) {
                        tally.busy += 1;
                    }
                    if done >= self.window.end {
                        return Claimed::Stopped;
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(BUSY_RETRY_MAX);
                }
                Err(e) => {
                    self.error(tally, "claim", volume, workload, &e);
                    return match e {
                        ClientError::Api { .. } | ClientError::Connect { .. } => Claimed::No,
                        _ => Claimed::Maybe,
                    };
                }
            }
        }
    }

    /// Whether the release was acknowledged.
    async fn release(&self, path: &str, volume: &str, workload: &str, tally: &mut Tally) -> bool {
        let body = ReleaseVolume {
            workload: workload.to_owned(),
        };
        let sent = Instant::now();
        let answer = self
            .control
            .call::<_, IgnoredAny>(Method::POST, path, Some(&body))
            .await;
        let done = Instant::now();
        match answer {
            Ok(_) => {
                if self.window.holds(done) {
                    tally.releases.push(done - sent);
                }
                true
            }
            Err(e) => {
                self.error(tally, "release", volume, workload, &e);
                false
            }
        }
    }

    fn error(&self, tally: &mut Tally, what: &str, volume: &str, workload: &str, e: &ClientError) {
        tally.errors += 1;
        if !self.first_error.swap(true, Ordering::Relaxed) {
            eprintln!(
                "agent-claims: first error: the {what} of workload {workload} on volume \
                 {volume}: {}",
                describe(e)
            );
        }
    }
}

/// CPU times, memory and load at one end of the measured period.
#[derive(Clone, Copy, Debug)]
struct Sample {
    agent_cpu: u64,
    mock_cpu: u64,
    bench_cpu: u64,
    agent_rss: u64,
    load1: Option<f64>,
}

impl Sample {
    fn take(agent: &mut Process, mock: &mut Process) -> Result<Sample, BenchError> {
        let read = || -> Result<Sample, BenchError> {
            Ok(Sample {
                agent_cpu: cpu::cpu_ticks(Some(agent.pid()))?.own,
                mock_cpu: cpu::cpu_ticks(Some(mock.pid()))?.own,
                bench_cpu: cpu::cpu_ticks(None)?.own,
                agent_rss: memory::rss_bytes(Some(agent.pid()))?,
                load1: cpu::load_average(),
            })
        };
        let sample = read();
        // A child that died is the better explanation of an unreadable /proc file.
        agent.check_running("the measured period")?;
        mock.check_running("the measured period")?;
        sample
    }
}

/// Starts the mock and the agent in `dir`, creates the volumes, runs the clients and
/// measures. The children are killed when this returns (or is dropped).
async fn measure(
    spec: &AgentClaimsSpec,
    dir: &Path,
    agent_bin: &Path,
    mock_bin: &Path,
    first_error: &Arc<AtomicBool>,
) -> Result<AgentClaimsLine, BenchError> {
    let plugins = dir.join("plugins");
    let data = dir.join("data");
    let socket = plugins.join(format!("{PLUGIN_ID}.sock"));
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(BenchError::AgentClaims {
            step: "choosing the plugin socket",
            detail: format!(
                "{} is longer than a unix socket path may be ({MAX_SOCKET_PATH} bytes): give a \
                 shorter --dir",
                socket.display()
            ),
        });
    }
    std::fs::create_dir_all(&plugins).map_err(|e| BenchError::AgentClaims {
        step: "creating the plugin directory",
        detail: format!("{}: {e}", plugins.display()),
    })?;
    let fs = fs_type(dir);
    eprintln!(
        "agent-claims: running {} and {} in {} ({fs})",
        agent_bin.display(),
        mock_bin.display(),
        dir.display()
    );

    let mut endpoint = OsString::from("unix://");
    endpoint.push(&socket);
    let mut mock = Process::start(
        mock_bin,
        &[
            "--endpoint".into(),
            endpoint,
            "--call-log-limit".into(),
            "1024".into(),
        ],
        dir.join("mock.log"),
        "mock plugin",
    )?;
    wait_for(
        &mut mock,
        "waiting for the mock plugin's socket",
        async || {
            tokio::net::UnixStream::connect(&socket)
                .await
                .map(drop)
                .map_err(|e| format!("{}: {e}", socket.display()))
        },
    )
    .await?;

    let mut agent = Process::start(
        agent_bin,
        &[
            "serve".into(),
            "--data-dir".into(),
            data.clone().into(),
            "--plugin-dir".into(),
            plugins.clone().into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--scan-interval".into(),
            "100ms".into(),
            // Fast release backoff, as the agent's own end-to-end tests run it.
            "--release-backoff-initial".into(),
            "50ms".into(),
            "--release-backoff-max".into(),
            "200ms".into(),
            "--log".into(),
            "warn".into(),
        ]
        .into_iter()
        .chain(spec.agent_args.iter().map(Into::into))
        .collect::<Vec<_>>(),
        dir.join("agent.log"),
        "agent",
    )?;
    let pid = agent.pid();
    let control = wait_for(
        &mut agent,
        "waiting for the agent's agent.json and control.token",
        async || Control::read(&data, pid),
    )
    .await?;
    wait_for(
        &mut agent,
        "waiting for the agent to fingerprint plugin mock and find it healthy",
        async || control.fingerprinted().await,
    )
    .await?;

    let ids = volume_ids(spec.clients, spec.volumes_per_client);
    eprintln!(
        "agent-claims: mock plugin pid {} serving; agent pid {pid} ready on {}; creating {} \
         volumes",
        mock.pid(),
        control.addr,
        u64::from(spec.clients) * u64::from(spec.volumes_per_client)
    );
    create_volumes(&control, &ids).await?;

    let begin = Instant::now();
    let start = begin + Duration::from_secs(spec.warmup_secs);
    let window = Window {
        start,
        end: start + Duration::from_secs(spec.secs),
    };
    let clients: Vec<_> = ids
        .into_iter()
        .enumerate()
        .map(|(id, volumes)| {
            tokio::spawn(
                Client {
                    id,
                    volumes,
                    control: control.clone(),
                    window,
                    first_error: Arc::clone(first_error),
                }
                .run(),
            )
        })
        .collect();
    eprintln!(
        "agent-claims: {} clients; warm-up {} s, then {} s measured",
        spec.clients, spec.warmup_secs, spec.secs
    );
    tokio::time::sleep_until(window.start).await;
    let first = Sample::take(&mut agent, &mut mock)?;
    tokio::time::sleep_until(window.start + (window.end - window.start) / 2).await;
    let mid = Sample::take(&mut agent, &mut mock)?;
    tokio::time::sleep_until(window.end).await;
    let last = Sample::take(&mut agent, &mut mock)?;

    // Each client ends after its request in flight (at most CALL_LIMIT).
    let mut tally = Tally::default();
    for client in clients {
        let mine = tokio::time::timeout(CALL_LIMIT + Duration::from_secs(5), client)
            .await
            .map_err(|_| BenchError::AgentClaims {
                step: "waiting for the clients",
                detail: format!("a client did not stop within {CALL_LIMIT:?} of the end"),
            })?
            .map_err(|e| BenchError::AgentClaims {
                step: "waiting for the clients",
                detail: format!("a client task failed: {e}"),
            })?;
        tally.claims.extend(mine.claims);
        tally.releases.extend(mine.releases);
        tally.busy += mine.busy;
        tally.errors += mine.errors;
    }
    agent.check_running("the end of the run")?;
    mock.check_running("the end of the run")?;
    let logged = agent.log_lines();
    if let Some(line) = logged.first() {
        eprintln!(
            "agent-claims: the agent logged {} line(s) at warn or above; the first: {line}",
            logged.len()
        );
    }

    tally.claims.sort_unstable();
    tally.releases.sort_unstable();
    Ok(AgentClaimsLine {
        clients: spec.clients,
        secs: spec.secs,
        volumes_per_client: spec.volumes_per_client,
        fs,
        ops: (tally.claims.len() + tally.releases.len()) as u64,
        claim_p50: percentile(&tally.claims, 50),
        claim_p99: percentile(&tally.claims, 99),
        release_p50: percentile(&tally.releases, 50),
        release_p99: percentile(&tally.releases, 99),
        busy: tally.busy,
        errors: tally.errors,
        agent_cpu_ticks: last.agent_cpu.saturating_sub(first.agent_cpu),
        mock_cpu_ticks: last.mock_cpu.saturating_sub(first.mock_cpu),
        bench_cpu_ticks: last.bench_cpu.saturating_sub(first.bench_cpu),
        agent_rss_start: first.agent_rss,
        agent_rss_mid: mid.agent_rss,
        agent_rss_end: last.agent_rss,
        load1_start: first.load1,
        load1_end: last.load1,
        agent: agent_bin.to_path_buf(),
        agent_args: spec.agent_args.clone(),
    })
}

/// The type of the filesystem holding `path` (`tmpfs`, `ext4`, …), from the longest mount
/// point of `/proc/mounts` above it; `unknown` when that cannot be told.
pub fn fs_type(path: &Path) -> String {
    let found = std::fs::canonicalize(path).ok().and_then(|path| {
        let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
        fs_type_in(&mounts, &path)
    });
    found.unwrap_or_else(|| "unknown".to_owned())
}

/// The type of the filesystem holding the absolute, canonical `path` in a `/proc/mounts`
/// text: the longest mount point above it (the last one listed of that length, which is
/// mounted over the others).
pub fn fs_type_in(mounts: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_device), Some(point), Some(kind)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let point = unescape_mount_field(point);
        let point = Path::new(&point);
        if !point.is_absolute() || !path.starts_with(point) {
            continue;
        }
        let depth = point.components().count();
        if best.is_none_or(|(deepest, _)| depth >= deepest) {
            best = Some((depth, kind));
        }
    }
    best.map(|(_, kind)| kind.to_owned())
}

/// A `/proc/mounts` field with its octal escapes (`\040` for a space, …) decoded.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| b == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| {
                let text = std::str::from_utf8(d).ok()?;
                u8::from_str_radix(text, 8).ok()
            });
        match octal {
            Some(decoded) => {
                out.push(decoded);
                i += 4;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
/dev/vda / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
/dev/vdb /data xfs rw 0 0
tmpfs /data/my\\040dir tmpfs rw 0 0
overlay /data overlay rw 0 0
";

    #[test]
    fn the_longest_mount_point_above_a_path_gives_its_filesystem() {
        let kind = |p: &str| fs_type_in(MOUNTS, Path::new(p));
        assert_eq!(kind("/dev/shm/x/data").as_deref(), Some("tmpfs"));
        assert_eq!(kind("/dev/shmx").as_deref(), Some("ext4"));
        assert_eq!(kind("/tmp/a").as_deref(), Some("ext4"));
        assert_eq!(kind("/").as_deref(), Some("ext4"));
        // The later of two mounts on one point is the one on top.
        assert_eq!(kind("/data/b").as_deref(), Some("overlay"));
        assert_eq!(kind("/data/my dir/c").as_deref(), Some("tmpfs"));
        assert_eq!(fs_type_in("garbage\n\n", Path::new("/x")), None);
        assert_eq!(unescape_mount_field("a\\040b\\134c\\9"), "a b\\c\\9");
    }

    #[test]
    fn the_filesystem_of_the_temporary_directory_is_known_on_linux() {
        if cfg!(target_os = "linux") {
            assert_ne!(fs_type(&std::env::temp_dir()), "unknown");
        }
    }

    #[test]
    fn a_missing_binary_names_its_flag_its_path_and_the_build() {
        let dir = tempfile::tempdir().expect("test invariant: temp dirs can be made");
        let exe = dir.path().join("csi-bench");
        match program_path(None, &exe, "csi-agent", "agent-bin") {
            Err(e @ BenchError::BadFlag { flag, .. }) => {
                assert_eq!(flag, "agent-bin");
                let text = e.to_string();
                assert!(text.contains(&dir.path().join("csi-agent").display().to_string()));
                assert!(
                    text.contains("cargo build --release -p csi-agent -p csi-testkit"),
                    "{text}"
                );
            }
            other => panic!("expected a bad --agent-bin, got {other:?}"),
        }
        let here = dir.path().join("csi-mock-plugin");
        std::fs::write(&here, b"").expect("test invariant: temp files can be written");
        let found = program_path(None, &exe, "csi-mock-plugin", "mock-bin").ok();
        assert_eq!(found.map(|p| p.ends_with("csi-mock-plugin")), Some(true));
        assert!(program_path(Some(&dir.path().join("nope")), &exe, "x", "mock-bin").is_err());
    }

    #[test]
    fn the_line_has_every_field_and_fails_on_errors_or_no_op() {
        let line = AgentClaimsLine {
            clients: 32,
            secs: 20,
            volumes_per_client: 4,
            fs: "tmpfs".to_owned(),
            ops: 40_000,
            claim_p50: Duration::from_micros(1500),
            claim_p99: Duration::from_millis(12),
            release_p50: Duration::from_micros(800),
            release_p99: Duration::from_millis(5),
            busy: 7,
            errors: 0,
            agent_cpu_ticks: 2_000,
            mock_cpu_ticks: 400,
            bench_cpu_ticks: 600,
            agent_rss_start: 20 << 20,
            agent_rss_mid: 21 << 20,
            agent_rss_end: 21 << 20,
            load1_start: Some(1.5),
            load1_end: None,
            agent: PathBuf::from("/x/csi-agent"),
            agent_args: vec!["--controller-calls=8".into()],
        };
        assert_eq!(
            line.to_string(),
            "agent-claims clients=32 secs=20 volumes_per_client=4 fs=tmpfs ops=40000 \
             ops_per_s=2000.0 claim_p50_ms=1.500 claim_p99_ms=12.000 release_p50_ms=0.800 \
             release_p99_ms=5.000 busy=7 errors=0 agent_cpu_ms_per_op=0.500 \
             mock_cpu_ms_per_op=0.100 bench_cpu_ms_per_op=0.150 agent_rss_mb_start=20.0 \
             agent_rss_mb_mid=21.0 agent_rss_mb_end=21.0 load1_start=1.50 load1_end=na agent=/x/csi-agent \
             agent_args=--controller-calls=8"
        );
        assert!(!line.failed());
        assert!(
            AgentClaimsLine {
                errors: 1,
                ..line.clone()
            }
            .failed()
        );
        let idle = AgentClaimsLine { ops: 0, ..line };
        assert!(idle.failed());
        assert_eq!(idle.ops_per_s(), 0.0);
        assert_eq!(idle.cpu_ms_per_op(100), 0.0);
    }

    #[test]
    fn the_window_holds_its_start_not_its_end() {
        let start = Instant::now();
        let window = Window {
            start,
            end: start + Duration::from_secs(1),
        };
        assert!(window.holds(start));
        assert!(!window.holds(window.end));
        assert_eq!(
            volume_ids(2, 3)[1],
            ["bench-c1-v0", "bench-c1-v1", "bench-c1-v2"]
        );
    }
}
