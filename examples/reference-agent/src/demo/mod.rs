//! `csi-agent demo`: one volume through its whole life, every step printed.
//!
//! Without `--plugin-endpoint` the demo starts the csi-testkit mock plugin in this process,
//! on a unix socket in a temporary directory, and removes both when done. With it, the demo
//! drives any CSI plugin and adapts to its capabilities: no controller publish without
//! `PUBLISH_UNPUBLISH_VOLUME`, no staging without `STAGE_UNSTAGE_VOLUME`, and an existing
//! volume (`--volume-id`) when it cannot create one.
//!
//! The steps ([`Step::ALL`]): fingerprint, create, validate, claim for writing (csi-claims),
//! controller publish, node stage, node publish, expand the published volume, write a file
//! through the published path, stop the workload, snapshot, then the release through
//! csi-claims' release pipeline and the [adapters](csi_node::detach) (node unpublish, node
//! unstage, controller unpublish, free), delete the snapshot and delete the volume. Expansion
//! and snapshots run when the plugin advertises them (`EXPAND_VOLUME` with `VolumeExpansion`
//! `ONLINE`, or node `EXPAND_VOLUME`; `CREATE_DELETE_SNAPSHOT`) and print `skipped: <why>`
//! otherwise. Node paths follow the agent's [`Layout`].
//!
//! On success nothing is left behind. On failure the demo names the step and lists what it
//! left with the call or command that removes each: the volume, the claim, every
//! publication and staging, done or maybe done (a call whose outcome was uncertain is undone
//! with its counterpart call first, and listed only when that fails too), and every
//! directory by its path. The list is the record the demo keeps of each call that changes
//! the plugin's state, written before the call is sent ([`Leftovers`]).

mod error;
mod expand;
mod leftovers;
mod observe;
mod plan;
mod release;
mod step;
mod table;
mod waits;
mod walk;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_claims::MemoryStore;
use csi_claims::backoff::BackoffPolicy;
use csi_claims::driver::{ClaimsDriver, DriverConfig};
use csi_client::{CallsInFlight, CsiClient, Endpoint};
use csi_structs::ExternalVolumeId;
use tokio::sync::mpsc;

pub use error::{DemoError, StepError};
pub use leftovers::{Leftovers, Made, Outcome};
pub use observe::{DetachRecord, Observed};
pub use plan::{Expansion, Plan, PlanError, VolumeSource};
pub use step::Step;
pub use table::Table;

use csi_node::detach::{ClientControllerDetacher, ClientNodeDetacher, NoSecrets, NodeDetachPolicy};
use csi_node::layout::Layout;
use waits::WaitLine;
use walk::Walk;

/// Arguments of `csi-agent demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Drive this plugin instead of the built-in mock, e.g. `unix:///run/csi/csi.sock`.
    #[arg(long, value_name = "ENDPOINT")]
    pub plugin_endpoint: Option<Endpoint>,
    /// Where staging and publish directories go (default: a temporary directory). The plugin
    /// must see the same paths.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Use this existing volume (the plugin's volume id) instead of creating one; it is kept.
    #[arg(long, value_name = "ID", value_parser = parse_volume_id)]
    pub volume_id: Option<ExternalVolumeId>,
}

fn parse_volume_id(value: &str) -> Result<ExternalVolumeId, csi_structs::ValidationErrors> {
    ExternalVolumeId::new(value)
}

/// What a successful demo did.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The plugin's volume id.
    pub volume: ExternalVolumeId,
    /// Steps printed.
    pub steps: usize,
    /// Of which skipped because the plugin does not need them.
    pub skipped: usize,
    /// Wall time of the whole walk.
    pub took: Duration,
    /// What is left, one line each with the command that removes it (directories that could
    /// not be removed, by path; empty when nothing is left).
    pub left: Vec<String>,
}

impl Summary {
    /// The one-line summary, starting with `demo ok:`, naming whatever is left behind.
    pub fn line(&self) -> String {
        let left = if self.left.is_empty() {
            "nothing left behind".to_owned()
        } else {
            format!("left behind: {}", self.left.join("; "))
        };
        format!(
            "demo ok: volume {} went through its whole life in {} steps ({} skipped) in {:.1} ms; {left}",
            self.volume,
            self.steps,
            self.skipped,
            self.took.as_secs_f64() * 1000.0
        )
    }
}

/// Runs `csi-agent demo` on its own tokio runtime, printing to stdout.
///
/// # Errors
///
/// [`DemoError::Step`] names the failed step (what was left behind is printed before);
/// other variants say what could not start.
pub fn run(args: DemoArgs) -> Result<(), DemoError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(DemoError::Runtime)?;
    let stdout = std::io::stdout();
    runtime.block_on(run_with(args, stdout.lock()))
}

/// Runs the demo on the current runtime, writing the table and summary to `out`.
///
/// # Errors
///
/// As [`run`].
pub async fn run_with<W: Write>(args: DemoArgs, out: W) -> Result<(), DemoError> {
    let mut table = Table::new(out);
    let tmp = tempfile::Builder::new()
        .prefix("csi-agent-demo-")
        .tempdir()
        .map_err(DemoError::TempDir)?;
    let (endpoint, mock) = match args.plugin_endpoint.clone() {
        Some(endpoint) => {
            // csi-client waits for a socket that is not there yet (a plugin starting up); a
            // demo pointed at a path with nothing on it should say so at once instead.
            if let Some(path) = endpoint.unix_path()
                && !path.exists()
            {
                return Err(DemoError::NoSocket(path.to_path_buf()));
            }
            (endpoint, None)
        }
        None => {
            let socket = tmp.path().join("csi.sock");
            let plugin = csi_testkit::MockPlugin::builder().build()?;
            let server = plugin.serve_unix(&socket).await?;
            let endpoint = Endpoint::unix(&socket).map_err(|_| {
                DemoError::TempDir(std::io::Error::other("temporary socket path is not usable"))
            })?;
            (endpoint, Some(server))
        }
    };
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| tmp.path().join("data"));
    let out = table_intro(&mut table, &endpoint, mock.is_some(), &data_dir);
    out.map_err(DemoError::Output)?;

    let result = lifecycle(&mut table, endpoint, data_dir, args.volume_id.clone()).await;
    if let Some(server) = mock {
        // The mock goes away with the temporary directory; a shutdown error changes nothing.
        let _ = server.shutdown().await;
    }
    match result {
        Ok(summary) => table.line(&summary.line()).map_err(DemoError::Output),
        Err((error, left)) => {
            // The error itself goes to stderr (by the caller); stdout gets what was left.
            let mut lines = vec![String::new()];
            let report = left.report();
            if report.is_empty() {
                lines.push("left behind: nothing".to_owned());
            } else {
                lines.push("left behind (remove in this order):".to_owned());
                lines.extend(report.into_iter().map(|l| format!("  - {l}")));
                if args.plugin_endpoint.is_none() {
                    lines.push(
                        "  (the built-in mock plugin and its temporary directory are gone with this process)"
                            .to_owned(),
                    );
                }
            }
            for line in lines {
                let _ = table.line(&line);
            }
            Err(error)
        }
    }
}

fn table_intro<W: Write>(
    table: &mut Table<W>,
    endpoint: &Endpoint,
    mock: bool,
    data_dir: &std::path::Path,
) -> std::io::Result<()> {
    let plugin = if mock {
        format!("built-in csi-testkit mock plugin at {endpoint}")
    } else {
        format!("plugin at {endpoint}")
    };
    table.line(&format!(
        "csi-agent demo: {plugin}, data dir {}",
        data_dir.display()
    ))?;
    table.line("")?;
    table.header()
}

/// The whole walk; on failure, the error and what is left.
async fn lifecycle<W: Write>(
    table: &mut Table<W>,
    endpoint: Endpoint,
    data_dir: PathBuf,
    existing: Option<ExternalVolumeId>,
) -> Result<Summary, (DemoError, Leftovers)> {
    let started = Instant::now();
    // Every call of both clients is listed, so a long one can be shown while it waits.
    let calls = Arc::new(CallsInFlight::new());
    let wait_line = Arc::new(WaitLine::stderr());
    table.clear_before_writing(Arc::clone(&wait_line));
    let watcher = waits::watch(Arc::clone(&calls), wait_line);
    // The release pipeline's node calls get their own client with the agent's short socket
    // wait, so a node plugin that vanished mid-demo is reported in about a second.
    let detach_client = NodeDetachPolicy::DEFAULT
        .apply(CsiClient::builder(endpoint.clone()))
        .calls_in_flight(Arc::clone(&calls))
        .build();
    let client = CsiClient::builder(endpoint).calls_in_flight(calls).build();
    let layout = Layout::new(&data_dir);
    let mut walk = Walk::new(client.clone(), layout.clone(), table);
    let result = async {
        if !data_dir.exists() {
            std::fs::create_dir_all(&data_dir).map_err(|source| DemoError::DataDir {
                path: data_dir.clone(),
                source,
            })?;
            walk.left.dirs.push(data_dir.clone());
        }
        let (plan, plugin) = walk.fingerprint(existing).await?;
        let volume = walk.create(&plan).await?;
        walk.validate(&plan, &volume).await?;

        let (records_tx, mut records) = mpsc::unbounded_channel();
        let node = ClientNodeDetacher::new(detach_client, layout.clone(), plan.stage);
        let controller = ClientControllerDetacher::new(client.clone(), Arc::new(NoSecrets));
        let (claims, driver) = ClaimsDriver::start(
            Arc::new(MemoryStore::new()),
            Arc::new(Observed::new(Arc::new(node), records_tx.clone())),
            Arc::new(Observed::new(Arc::new(controller), records_tx)),
            driver_config(),
        )
        .await?;
        let released = async {
            let info = walk.claim(&claims, &plan, &plugin, &volume).await?;
            let publish_context = walk.controller_publish(&plan, &volume).await?;
            let staging = walk.stage(&plan, &volume, &publish_context).await?;
            let target = walk
                .publish(&volume, staging.as_deref(), &publish_context)
                .await?;
            walk.expand(&plan, &volume, staging.as_deref(), &target)
                .await?;
            walk.workload(&target).await?;
            let snapshot = walk.snapshot(&plan, &volume).await?;
            walk.release(&claims, &mut records, &plan, &info).await?;
            Ok::<_, DemoError>(snapshot)
        }
        .await;
        // Stop the pipeline either way: after a failure it must not keep calling the plugin.
        driver.shutdown().await;
        let snapshot = released?;
        walk.delete_snapshot(&plan, snapshot).await?;
        walk.delete(&volume).await?;
        walk.remove_dirs();
        Ok(volume)
    }
    .await;
    watcher.abort();
    // The table clears a status line still shown before its next write.
    match result {
        Ok(volume) => Ok(Summary {
            volume: volume.external,
            steps: walk.table.rows(),
            skipped: walk.skipped,
            took: started.elapsed(),
            left: walk.left.report(),
        }),
        Err(e) => {
            walk.remove_dirs();
            Err((e, walk.left))
        }
    }
}

/// Short backoff so a retried release call shows up quickly in the demo.
fn driver_config() -> DriverConfig {
    let backoff = BackoffPolicy::new(Duration::from_millis(200), Duration::from_secs(2))
        .expect("constant backoff: 200 ms is above zero and below the 2 s cap");
    let mut config = DriverConfig {
        call_timeout: Duration::from_secs(120),
        ..DriverConfig::default()
    };
    config.machine.backoff = backoff;
    config.machine.jitter_seed = u64::from(std::process::id());
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_each_directory_left_behind_by_its_path() {
        let summary = |left: Vec<String>| Summary {
            volume: ExternalVolumeId::new("v-1").expect("id"),
            steps: 14,
            skipped: 0,
            took: Duration::from_millis(5),
            left,
        };
        assert!(
            summary(Vec::new())
                .line()
                .ends_with("; nothing left behind")
        );
        let line = summary(vec![
            "directory /d/a: rmdir /d/a".into(),
            "directory /d: rmdir /d".into(),
        ])
        .line();
        assert!(
            line.ends_with("; left behind: directory /d/a: rmdir /d/a; directory /d: rmdir /d"),
            "{line}"
        );
    }
}
