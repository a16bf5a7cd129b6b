//! Benchmarks and the `csi-bench` load generator.
//!
//! `csi-bench` drives any CSI plugin through `csi-client` and prints one line per run:
//!
//! ```text
//! client=csi-client rpc=probe n=200000 c=32 ops_per_s=… p50_us=… p99_us=…
//! ```
//!
//! It also measures the floor (a raw 100-byte unix-socket ping-pong between two processes),
//! compares sequential Probe with it, measures resident memory per open connection and per
//! claim, and releases many claims through the `csi-claims` driver against the mock plugin
//! (with the `etcd` feature, also through etcd from several agents), and measures claims and
//! releases through the real agent binary (`--agent-claims`).
//! See `benches/README.md` for every command, its target and the numbers measured.
//!
//! The binary is a thin wrapper around [`run`], which tests call directly:
//!
//! ```no_run
//! use clap::Parser;
//! use csi_benches::{Cli, Line, run};
//!
//! let cli = Cli::parse_from(["csi-bench", "--mock", "--rpc", "probe", "-n", "200", "-c", "4"]);
//! let lines = run(&cli, std::path::Path::new("/proc/self/exe")).unwrap();
//! let line: Line = lines[0].parse().unwrap();
//! assert_eq!(line.n, 200);
//! ```
//!
//! # Layout
//!
//! - [`cli`]: the flags and the [`Mode`] they select; [`error`]: [`BenchError`].
//! - [`rpc`]: the rpcs driven, their set-up and clean-up; [`load`]: the caller loop;
//!   [`report`]: the result [`Line`].
//! - [`target`]: an endpoint or the in-process mock; [`baseline`]: the ping-pong floor;
//!   [`compare`]: the floor and Probe, interleaved;
//!   [`child`]: the re-executed child processes; [`memory`]: resident memory from `/proc`;
//!   [`conn_memory`]: memory per connection; [`claims`]: the claims benchmarks;
//!   [`shim_hop`]: the cost of one agent-to-agent hop; [`peer`]: csi-client and the mock
//!   beside grpc-go (`--compare-peer`), with [`cpu`]: CPU time from `/proc`.
//! - [`agent_claims`]: claims and releases through the real `csi-agent serve` beside the real
//!   `csi-mock-plugin` (`--agent-claims`), the node's claim throughput.
//! - With the `etcd` feature: `claims_etcd`, claims, memory and releases through etcd
//!   (`--claims-etcd`), and `etcd_process`, the `etcd` it starts when given no endpoints.

pub mod agent_claims;
pub mod baseline;
pub mod child;
pub mod claims;
#[cfg(feature = "etcd")]
pub mod claims_etcd;
pub mod cli;
pub mod compare;
pub mod conn_memory;
pub mod cpu;
pub mod error;
#[cfg(feature = "etcd")]
pub mod etcd_process;
pub mod hyper_h2;
pub mod load;
pub mod memory;
pub mod peer;
pub mod raw;
pub mod report;
pub mod rpc;
pub mod shim_hop;
pub mod target;

use std::path::Path;

pub use agent_claims::{AgentClaimsLine, AgentClaimsSpec};
pub use cli::{Cli, EtcdDuty, EtcdSpec, Mode, RuntimeFlavor};
pub use error::BenchError;
pub use report::{Line, LineError};
pub use rpc::BenchRpc;

use crate::rpc::{Given, Plan};
use crate::target::{Target, TargetSpec};

/// Runs what `cli` asks for and returns the lines to print (none for the internal child
/// modes). `exe` is the executable to re-run as a child process (the ping-pong peer, the
/// out-of-process mock); the binary passes its own path.
///
/// # Errors
///
/// Whatever stopped the run; see [`BenchError`].
pub fn run(cli: &Cli, exe: &Path) -> Result<Vec<String>, BenchError> {
    match cli.mode()? {
        Mode::BaselineChild(path) => baseline::serve_pongs(&path).map(|()| Vec::new()),
        Mode::ServeMock(path) => {
            conn_memory::serve_mock_until_stdin_closes(&path, cli.runtime).map(|()| Vec::new())
        }
        Mode::Baseline => Ok(vec![
            baseline::run_baseline(exe, cli.n, cli.warmup)?.to_string(),
        ]),
        Mode::ClaimsMemory(claims) => Ok(vec![
            claims::claims_memory(claims, cli.volumes)?.to_string(),
        ]),
        Mode::Load(spec) => {
            let rt = runtime_of(cli.runtime)?;
            let line = rt.block_on(drive(&spec, cli, cli.rpc, cli.c))?;
            Ok(vec![line.to_string()])
        }
        Mode::Compare(spec) => {
            let rt = runtime_of(cli.runtime)?;
            Ok(compare::run_compare(&rt, &spec, exe, cli.n, cli.warmup)?.lines(cli.runtime))
        }
        Mode::ConnMemory(spec, k) => {
            let rt = runtime()?;
            Ok(vec![
                conn_memory::run_conn_memory(&rt, &spec, k, exe)?.to_string(),
            ])
        }
        Mode::ComparePeer(spec) => {
            let rt = runtime_of(spec.runtime)?;
            Ok(peer::run_compare_peer(&rt, &spec, exe)?.printed())
        }
        Mode::ShimHop => {
            let rt = runtime()?;
            Ok(vec![
                shim_hop::run_shim_hop(&rt, cli.n, cli.warmup)?.to_string(),
            ])
        }
        Mode::ClaimsRelease(claims) => {
            let rt = runtime()?;
            Ok(vec![
                claims::claims_release(&rt, claims, cli.volumes)?.to_string(),
            ])
        }
        Mode::AgentClaims(spec) => {
            let rt = runtime()?;
            let line = agent_claims::run_agent_claims(&rt, &spec, exe)?;
            if line.failed() {
                Err(BenchError::AgentClaimsFailed {
                    line: line.to_string(),
                    errors: line.errors,
                    ops: line.ops,
                })
            } else {
                Ok(vec![line.to_string()])
            }
        }
        Mode::ClaimsEtcd(spec) => claims_etcd(&spec, cli, exe),
        Mode::EtcdMemoryChild { endpoints, prefix } => {
            etcd_memory_child(&endpoints, &prefix, cli.volumes)
        }
    }
}

#[cfg(feature = "etcd")]
fn claims_etcd(spec: &EtcdSpec, cli: &Cli, exe: &Path) -> Result<Vec<String>, BenchError> {
    Ok(claims_etcd::run_claims_etcd(spec, cli.volumes, cli.c, exe)?.lines())
}

#[cfg(not(feature = "etcd"))]
fn claims_etcd(spec: &EtcdSpec, _: &Cli, _: &Path) -> Result<Vec<String>, BenchError> {
    Err(cli::etcd_not_built(spec.claims))
}

#[cfg(feature = "etcd")]
fn etcd_memory_child(
    endpoints: &[String],
    prefix: &str,
    volumes: u32,
) -> Result<Vec<String>, BenchError> {
    claims_etcd::memory_child(endpoints, prefix, volumes)
}

#[cfg(not(feature = "etcd"))]
fn etcd_memory_child(_: &[String], _: &str, _: u32) -> Result<Vec<String>, BenchError> {
    Err(cli::etcd_not_built(0))
}

/// The multi-threaded runtime runs use unless `--runtime` says otherwise (one worker per
/// core).
///
/// # Errors
///
/// [`BenchError::Runtime`].
pub fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    runtime_of(RuntimeFlavor::MultiThread)
}

/// A runtime of the given flavour.
///
/// # Errors
///
/// [`BenchError::Runtime`].
pub fn runtime_of(flavor: RuntimeFlavor) -> Result<tokio::runtime::Runtime, BenchError> {
    match flavor {
        RuntimeFlavor::MultiThread => tokio::runtime::Builder::new_multi_thread(),
        RuntimeFlavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
    }
    .enable_all()
    .build()
    .map_err(BenchError::Runtime)
}

async fn drive(spec: &TargetSpec, cli: &Cli, rpc: BenchRpc, c: u32) -> Result<Line, BenchError> {
    let target = Target::start(spec).await?;
    let client = target.client();
    let given = Given {
        volume: cli.volume_id.clone(),
        node: cli.node_id.clone(),
    };
    let mut plan = Plan::prepare(&client, rpc, c, &given).await?;
    let measured = load::run_load(&client, &mut plan, cli.n, c, cli.warmup).await;
    let cleaned = plan.clean_up(&client).await;
    drop(client);
    let stopped = target.stop().await;
    let line = measured?;
    cleaned?;
    stopped?;
    Ok(line)
}
