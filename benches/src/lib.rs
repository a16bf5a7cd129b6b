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
//! claim, and releases many claims through the `csi-claims` driver against the mock plugin.
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
//!   [`child`]: the re-executed child processes; [`memory`]: resident memory from `/proc`;
//!   [`conn_memory`]: memory per connection; [`claims`]: the claims benchmarks;
//!   [`shim_hop`]: the cost of one agent-to-agent hop.

pub mod baseline;
pub mod child;
pub mod claims;
pub mod cli;
pub mod conn_memory;
pub mod error;
pub mod hyper_h2;
pub mod load;
pub mod memory;
pub mod raw;
pub mod report;
pub mod rpc;
pub mod shim_hop;
pub mod target;

use std::path::Path;

pub use cli::{Cli, Mode};
pub use error::BenchError;
pub use report::{Line, LineError};
pub use rpc::BenchRpc;

use crate::rpc::{Given, Plan};
use crate::target::{Target, TargetSpec};

/// The most the sequential Probe p50 may be, as a multiple of the baseline's p50 (issue 4).
pub const COMPARE_TARGET_RATIO: f64 = 4.0;

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
            conn_memory::serve_mock_until_stdin_closes(&path).map(|()| Vec::new())
        }
        Mode::Baseline => Ok(vec![
            baseline::run_baseline(exe, cli.n, cli.warmup)?.to_string(),
        ]),
        Mode::ClaimsMemory(claims) => Ok(vec![
            claims::claims_memory(claims, cli.volumes)?.to_string(),
        ]),
        Mode::Load(spec) => {
            let rt = runtime()?;
            let line = rt.block_on(drive(&spec, cli, cli.rpc, cli.c))?;
            Ok(vec![line.to_string()])
        }
        Mode::Compare(spec) => {
            let floor = baseline::run_baseline(exe, cli.n, cli.warmup)?;
            let rt = runtime()?;
            let (raw, h2, probe) = rt.block_on(compare(&spec, cli))?;
            let ratio = |line: &Line| {
                if floor.p50_us > 0.0 {
                    line.p50_us / floor.p50_us
                } else {
                    f64::INFINITY
                }
            };
            let met = if ratio(&probe) <= COMPARE_TARGET_RATIO {
                "yes"
            } else {
                "no"
            };
            let mut lines = vec![floor.to_string()];
            let mut summary = format!("compare probe_p50_over_baseline_p50={:.2}", ratio(&probe));
            if let Some(raw) = &raw {
                lines.push(raw.to_string());
                summary.push_str(&format!(" tonic_p50_over_baseline_p50={:.2}", ratio(raw)));
            }
            if let Some(h2) = &h2 {
                lines.push(h2.to_string());
                summary.push_str(&format!(" hyper_h2_p50_over_baseline_p50={:.2}", ratio(h2)));
            }
            lines.push(probe.to_string());
            summary.push_str(&format!(" target_max={COMPARE_TARGET_RATIO:.0} met={met}"));
            lines.push(summary);
            Ok(lines)
        }
        Mode::ConnMemory(spec, k) => {
            let rt = runtime()?;
            Ok(vec![
                conn_memory::run_conn_memory(&rt, &spec, k, exe)?.to_string(),
            ])
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
    }
}

/// The multi-threaded runtime every run uses (one worker per core).
///
/// # Errors
///
/// [`BenchError::Runtime`].
pub fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)
}

/// Sequential Probe through a bare tonic client and a bare hyper HTTP/2 connection (unix
/// endpoints only) and through csi-client, on one plugin.
async fn compare(
    spec: &TargetSpec,
    cli: &Cli,
) -> Result<(Option<Line>, Option<Line>, Line), BenchError> {
    let target = Target::start(spec).await?;
    let client = target.client();
    let mut plan = Plan::prepare(&client, BenchRpc::Probe, 1, &Given::default()).await?;
    let probe = load::run_load(&client, &mut plan, cli.n, 1, cli.warmup).await;
    drop(client);
    let raw = match (&probe, target.endpoint().unix_path()) {
        (Ok(_), Some(path)) => {
            // On a worker thread, like csi-client's callers (the thread blocking on the runtime
            // would add a cross-thread wake-up to every call).
            let (path, n, warmup) = (path.to_path_buf(), cli.n, cli.warmup);
            let task = tokio::spawn(async move { raw::raw_probe(&path, n, warmup).await });
            Some(task.await.unwrap_or(Err(BenchError::CallerTask {
                rpc: BenchRpc::Probe,
            })))
        }
        _ => None,
    };
    let h2 = match (&probe, target.endpoint().unix_path()) {
        (Ok(_), Some(path)) => {
            let (path, n, warmup) = (path.to_path_buf(), cli.n, cli.warmup);
            let task = tokio::spawn(async move { hyper_h2::h2_probe(&path, n, warmup).await });
            Some(task.await.unwrap_or(Err(BenchError::CallerTask {
                rpc: BenchRpc::Probe,
            })))
        }
        _ => None,
    };
    target.stop().await?;
    Ok((raw.transpose()?, h2.transpose()?, probe?))
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
