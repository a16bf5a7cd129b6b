//! `csi-agent demo`: one volume through its whole life on csi-control's front door,
//! [`ControlPlane`], every CSI call printed as the library reports it.
//!
//! Without `--plugin-endpoint` the demo starts the csi-testkit mock plugin in this process,
//! on a unix socket in a temporary directory, and removes both when done. It opens one node's
//! control plane with its state in the data directory, registers the plugin, and runs the
//! volume service's operations ([`Step`]): create the volume (or register `--volume-id`),
//! claim it (controller publish, stage and publish), expand it, write a file through the
//! published path, snapshot it, release it through the release pipeline, delete the snapshot
//! and delete the volume (or deregister `--volume-id`, which the plugin keeps).
//!
//! The table has one row per CSI call, from the control plane's call observer
//! ([`ControlPlaneBuilder::call_observer`](csi_control::ControlPlaneBuilder::call_observer)):
//! the RPC, the volume, the duration and the outcome; under the rows, each
//! [`ServiceEvent`](csi_control::ServiceEvent) the service sent. What the plugin does not
//! advertise, decided from its fingerprint before anything is called, is printed as
//! `skipped: <why>`. A call that runs long is shown on stderr while it waits, from the control
//! plane's list of calls in flight.
//!
//! On success nothing is left behind. On failure the demo names the step, and the service's
//! error says what it did about it (a failed publish is released, an uncertain create undone);
//! what is left is what the service reports: its claim still releasing, and what a
//! deregistration of the volume leaves in the plugin and on the node.

mod plan;
mod table;
mod waits;
mod walk;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_claims::ClaimMode;
use csi_claims::backoff::BackoffPolicy;
use csi_claims::driver::DriverConfig;
use csi_client::{CallsInFlight, Endpoint};
use csi_control::service::{ClaimVolume, NewSnapshot, NewVolume, RegisterVolume, SnapshotsOf};
use csi_control::{ControlPlane, PlaneError};
use csi_node::plugins::PluginManagerConfig;
use csi_structs::{AccessMode, ExternalVolumeId, NodeId, PluginId, SnapshotId, VolumeId};
use csi_structs::{WorkloadId, untrusted::escaped};
use tokio::sync::mpsc;

pub use table::Table;

use plan::Plan;
use waits::WaitLine;
use walk::{Calls, Walk};

/// A step's failure, whatever failed: the service, the file system, the plugin's fingerprint.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

const NODE: &str = "local";
const PLUGIN: &str = "demo-plugin";
const WORKLOAD: &str = "demo-workload";
const FILE_NAME: &str = "hello-from-csi-agent.txt";
const FILE_CONTENT: &[u8] = b"written by csi-agent demo through the published path\n";
const GIB: u64 = 1 << 30;
/// How long the plugin has to be fingerprinted and healthy.
const PLUGIN_WAIT: Duration = Duration::from_secs(60);
/// The deadline of each call the service makes, and of the release of a failed claim.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// One step of the demo: one operation of the volume service (or of the workload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Register the plugin with the node; it is fingerprinted and probed.
    RegisterPlugin,
    /// Create the volume.
    CreateVolume,
    /// Register the volume given with `--volume-id` (validated when there is a controller).
    RegisterVolume,
    /// Claim it for writing: controller publish, stage and publish.
    Claim,
    /// Grow it while it is published.
    Expand,
    /// Write a file through the published path, read it back and remove it.
    WriteFile,
    /// Cut a snapshot of it.
    Snapshot,
    /// Release the claim through the release pipeline and wait until it is freed.
    Release,
    /// Delete the snapshot.
    DeleteSnapshot,
    /// Delete the volume.
    DeleteVolume,
    /// Deregister the volume given with `--volume-id`; the plugin keeps it.
    DeregisterVolume,
}

impl Step {
    /// The step's name as printed, e.g. `claim`.
    pub const fn name(self) -> &'static str {
        match self {
            Step::RegisterPlugin => "register plugin",
            Step::CreateVolume => "create volume",
            Step::RegisterVolume => "register volume",
            Step::Claim => "claim",
            Step::Expand => "expand",
            Step::WriteFile => "write a file",
            Step::Snapshot => "snapshot",
            Step::Release => "release",
            Step::DeleteSnapshot => "delete snapshot",
            Step::DeleteVolume => "delete volume",
            Step::DeregisterVolume => "deregister volume",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Arguments of `csi-agent demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Drive this plugin instead of the built-in mock, e.g. `unix:///run/csi/csi.sock`.
    #[arg(long, value_name = "ENDPOINT")]
    pub plugin_endpoint: Option<Endpoint>,
    /// Where the node's state, staging and publish directories go (default: a temporary
    /// directory): absent or empty, made owner-only. The plugin must see the same paths.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Use this existing volume (the plugin's volume id) instead of creating one; it is kept.
    #[arg(long, value_name = "ID", value_parser = |v: &str| ExternalVolumeId::new(v))]
    pub volume_id: Option<ExternalVolumeId>,
}

/// Why `csi-agent demo` failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The temporary directory could not be created.
    #[error("cannot create a temporary directory: {0}")]
    TempDir(#[source] std::io::Error),
    /// The data directory holds something already: the demo starts from an empty one.
    #[error("the data directory {} is not empty: give an empty or absent --data-dir", .0.display())]
    DataDirNotEmpty(PathBuf),
    /// Nothing exists at the plugin's socket path.
    #[error("no plugin socket at {}: start the plugin first or fix --plugin-endpoint", .0.display())]
    NoSocket(PathBuf),
    /// The built-in mock plugin could not be configured.
    #[error("cannot configure the built-in mock plugin: {0}")]
    MockConfig(#[from] csi_testkit::ConfigError),
    /// The built-in mock plugin could not start.
    #[error("cannot start the built-in mock plugin: {0}")]
    Mock(#[from] csi_testkit::Error),
    /// The control plane could not be opened or closed.
    #[error(transparent)]
    Plane(#[from] PlaneError),
    /// Writing the output failed.
    #[error("cannot write the output: {0}")]
    Output(#[source] std::io::Error),
    /// A step failed.
    #[error("step '{step}' failed: {cause}")]
    Step {
        /// The step.
        step: Step,
        /// Why, with what the service did about it.
        #[source]
        cause: BoxError,
    },
}

impl crate::ExitStatus for DemoError {
    fn exit_code(&self) -> u8 {
        1
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

/// What the walk made that a failure may leave: the volume (with whether the demo created
/// it) and the snapshot.
#[derive(Debug, Default)]
struct Made {
    volume: Option<(VolumeId, bool)>,
    snapshot: Option<SnapshotId>,
}

/// Runs the demo on the current runtime, writing the table and summary to `out`.
///
/// # Errors
///
/// As [`run`].
pub async fn run_with<W: Write>(args: DemoArgs, out: W) -> Result<(), DemoError> {
    let tmp = tempfile::Builder::new()
        .prefix("csi-agent-demo-")
        .tempdir()
        .map_err(DemoError::TempDir)?;
    let (data_dir, made_dir) = match &args.data_dir {
        Some(dir) if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) => {
            return Err(DemoError::DataDirNotEmpty(dir.clone()));
        }
        Some(dir) => (dir.clone(), !dir.exists()),
        None => (tmp.path().join("data"), true),
    };
    let (endpoint, mock) = match args.plugin_endpoint.clone() {
        Some(endpoint) => {
            // csi-client waits for a socket that is not there yet (a plugin starting up); a
            // demo pointed at a path with nothing on it should say so at once instead.
            if let Some(path) = endpoint.unix_path().filter(|p| !p.exists()) {
                return Err(DemoError::NoSocket(path.to_path_buf()));
            }
            (endpoint, None)
        }
        None => {
            let socket = tmp.path().join("csi.sock");
            let server = csi_testkit::MockPlugin::builder()
                .build()?
                .serve_unix(&socket)
                .await?;
            let endpoint = Endpoint::unix(&socket).map_err(|_| {
                DemoError::TempDir(std::io::Error::other("temporary socket path is not usable"))
            })?;
            (endpoint, Some(server))
        }
    };
    let mut table = Table::new(out);
    let plugin = match mock {
        Some(_) => format!("built-in csi-testkit mock plugin at {endpoint}"),
        None => format!("plugin at {endpoint}"),
    };
    let intro = format!("csi-agent demo: {plugin}, data dir {}", data_dir.display());
    for line in [intro.as_str(), ""] {
        table.line(line).map_err(DemoError::Output)?;
    }
    table.header().map_err(DemoError::Output)?;

    // Every call of the control plane's clients is listed while it runs (the long-call
    // line) and reported as it ends (the table's rows).
    let calls = Arc::new(CallsInFlight::new());
    let wait_line = Arc::new(WaitLine::stderr());
    table.clear_before_writing(Arc::clone(&wait_line));
    let watcher = waits::watch(Arc::clone(&calls), wait_line);
    let (calls_tx, calls_rx) = mpsc::unbounded_channel();
    let plane = ControlPlane::builder(&data_dir, NodeId::new(NODE).expect("a valid node id"))
        .call_timeout(CALL_TIMEOUT)
        .plugins(plugin_config())
        .driver(driver_config())
        .call_observer(Arc::new(Calls(calls_tx)))
        .calls_in_flight(calls)
        .open()
        .await;
    let plane = match plane {
        Ok(plane) => plane,
        Err(e) => {
            watcher.abort();
            return Err(e.into());
        }
    };
    let started = Instant::now();
    let mut walk = Walk::new(&mut table, calls_rx, plane.service().subscribe());
    let mut made = Made::default();
    let result = lifecycle(&mut walk, &plane, endpoint, args.volume_id, &mut made).await;
    let left = match &result {
        Ok(_) => Vec::new(),
        Err(_) => left_behind(&plane, &made).await,
    };
    let (steps_calls, skipped) = (walk.table.calls(), walk.skipped);
    watcher.abort();
    // The node's usage records say whether a mount may remain under the data directory.
    let mounts_may_remain = !plane.node().volumes().records().is_empty();
    let closed = plane.close().await;
    // Nothing of a built-in mock's is mounted; a real plugin's mounts are not removed under it.
    let kept = mounts_may_remain && mock.is_none();
    let with_mock = mock.is_some();
    if let Some(server) = mock {
        // The mock goes away with the temporary directory; a shutdown error changes nothing.
        let _ = server.shutdown().await;
    }
    let removed = match kept {
        true => Ok(()),
        false => remove_state(&data_dir, made_dir),
    };
    let mut lines = Vec::new();
    match &result {
        Ok(volume) => {
            let state = match (&closed, &removed) {
                (Ok(()), Ok(())) => "nothing left behind".to_owned(),
                (Err(e), _) => format!("the control plane did not close: {e}"),
                (_, Err(e)) => format!("left behind: {} ({e})", data_dir.display()),
            };
            lines.push(format!(
                "demo ok: volume {volume} went through its whole life in {steps_calls} CSI calls \
                 ({skipped} skipped) in {:.1} ms; {state}",
                started.elapsed().as_secs_f64() * 1000.0
            ));
        }
        Err(_) => {
            lines.push(String::new());
            if left.is_empty() {
                lines.push("left behind: nothing".to_owned());
            } else {
                lines.push("left behind, as the service reports it:".to_owned());
                lines.extend(left.iter().map(|l| format!("  - {l}")));
            }
            if kept {
                if args.data_dir.is_none() {
                    let _ = tmp.keep();
                }
                lines.push(format!(
                    "the node's state stays in {}: its usage records say a mount may remain",
                    data_dir.display()
                ));
            } else if with_mock && !left.is_empty() {
                lines.push(
                    "(the built-in mock plugin and its temporary directory are gone with this process)"
                        .to_owned(),
                );
            }
        }
    }
    for line in lines {
        table.line(&line).map_err(DemoError::Output)?;
    }
    result.map(drop)
}

/// The whole walk; returns the plugin's id of the volume.
async fn lifecycle<W: Write>(
    walk: &mut Walk<'_, W>,
    plane: &ControlPlane,
    endpoint: Endpoint,
    existing: Option<ExternalVolumeId>,
    made: &mut Made,
) -> Result<ExternalVolumeId, DemoError> {
    let service = plane.service();
    let plugin = PluginId::new(PLUGIN).expect("a valid plugin id");
    let workload = WorkloadId::new(WORKLOAD).expect("a valid workload id");
    let mode = AccessMode::SingleNodeWriter;
    let ready = walk
        .step(Step::RegisterPlugin, async {
            plane.register_plugin(plugin.clone(), endpoint).await?;
            Ok::<_, BoxError>(plane.wait_for_plugin(&plugin, PLUGIN_WAIT).await?)
        })
        .await?;
    let plan = Plan::for_plugin(&ready.fingerprint, existing.is_some())
        .map_err(|e| walk.fail(Step::RegisterPlugin, e.into()))?;
    walk.note(Step::RegisterPlugin, &plan.describe)?;

    // Named after the process and the time, so a plugin's volume of an earlier run is never
    // taken for this one's (the service sends the id as the CreateVolume name).
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let id = format!("demo-{}-{secs}", std::process::id());
    let id = VolumeId::new(id).expect("a short id of letters, digits and dashes");
    made.volume = Some((id.clone(), existing.is_none()));
    let entry = match existing {
        None => {
            let new = NewVolume::new(id.clone(), plugin.clone(), mode);
            walk.step(Step::CreateVolume, service.create(new)).await?
        }
        Some(external) => {
            let volume = RegisterVolume {
                controller_publish: Some(plan.controller_publish),
                ..RegisterVolume::new(id.clone(), external, plugin.clone(), mode)
            };
            let entry = walk
                .step(Step::RegisterVolume, service.register_volume(volume))
                .await?;
            let text = format!(
                "ok: registered {} (no controller to validate it)",
                entry.external_id
            );
            walk.result(Step::RegisterVolume, &text)?;
            entry
        }
    };

    for (rpc, why) in plan.skipped_calls(false) {
        walk.skip(Step::Claim, rpc, why)?;
    }
    let claim = ClaimVolume::new(id.clone(), workload.clone(), ClaimMode::Write);
    let claimed = walk.step(Step::Claim, service.claim(claim)).await?;

    match plan.expand {
        Err(why) => walk.skip(Step::Expand, "-", why)?,
        Ok(()) => {
            let wanted = entry.capacity_bytes.unwrap_or(GIB).saturating_add(GIB);
            walk.step(Step::Expand, service.expand(&id, wanted)).await?;
        }
    }

    let file = claimed.target_path.join(FILE_NAME);
    walk.step(Step::WriteFile, write_file(&file)).await?;
    let text = format!(
        "ok: wrote, read back and removed {} bytes in {}",
        FILE_CONTENT.len(),
        file.display()
    );
    walk.result(Step::WriteFile, &text)?;

    if let Err(why) = plan.snapshot {
        walk.skip(Step::Snapshot, "-", why)?;
    } else {
        let cut = NewSnapshot::new(format!("{id}-snapshot"));
        let snapshot = walk.step(Step::Snapshot, service.create_snapshot(&id, cut));
        made.snapshot = Some(snapshot.await?.id);
    }

    for (rpc, why) in plan.skipped_calls(true) {
        walk.skip(Step::Release, rpc, why)?;
    }
    walk.step(Step::Release, walk::release(service, &id, &workload))
        .await?;

    match made.snapshot.clone() {
        None => {
            let why = plan.snapshot.err().unwrap_or("no snapshot was cut");
            walk.skip(Step::DeleteSnapshot, "-", why)?;
        }
        Some(snapshot) => {
            let of = SnapshotsOf::Volume(id.clone());
            let deleted = service.delete_snapshot(&of, &snapshot);
            walk.step(Step::DeleteSnapshot, deleted).await?;
            made.snapshot = None;
        }
    }

    if entry.created {
        walk.step(Step::DeleteVolume, service.delete(&id)).await?;
    } else {
        let step = Step::DeregisterVolume;
        let gone = walk
            .step(step, service.deregister_volume(&id, false, false))
            .await?;
        walk.result(
            step,
            &format!("ok: {} is kept in the plugin", entry.external_id),
        )?;
        // The first is the volume itself, kept on purpose.
        for left in gone.left_behind.iter().skip(1) {
            walk.note(step, &format!("left: {left}"))?;
        }
    }
    made.volume = None;
    Ok(entry.external_id)
}

/// The workload: writes a file through the published path, reads it back, removes it.
async fn write_file(file: &Path) -> Result<(), String> {
    let failed =
        |what: &'static str| move |e: std::io::Error| format!("{what} {}: {e}", file.display());
    tokio::fs::write(file, FILE_CONTENT)
        .await
        .map_err(failed("writing"))?;
    let back = tokio::fs::read(file)
        .await
        .map_err(failed("reading back"))?;
    if back != FILE_CONTENT {
        return Err(format!(
            "{} read back different content than written",
            file.display()
        ));
    }
    tokio::fs::remove_file(file)
        .await
        .map_err(failed("removing"))
}

/// What a failed walk leaves, as the service reports it: the volume's claims still
/// releasing, and what a deregistration of the volume (forgetting those claims) leaves in
/// the plugin and on the node. The snapshot the demo cut and could not delete comes first.
async fn left_behind(plane: &ControlPlane, made: &Made) -> Vec<String> {
    let mut left = Vec::new();
    if let Some(snapshot) = &made.snapshot {
        let snapshot = escaped(snapshot.as_str());
        left.push(format!("snapshot {snapshot}: DeleteSnapshot removes it"));
    }
    let service = plane.service();
    let Some((id, created)) = &made.volume else {
        return left;
    };
    let Ok(state) = service.volume(id) else {
        return left;
    };
    for (claim, _) in &state.claims {
        left.push(format!(
            "the claim of {} on node {} ({}): its release is not finished; the demo forgets it \
             (a forced deregistration), leaving what follows",
            claim.workload(),
            claim.node(),
            claim.state().name()
        ));
    }
    match service
        .deregister_volume(id, !state.claims.is_empty(), true)
        .await
    {
        // A volume given with --volume-id is not left behind: it is kept.
        Ok(gone) => left.extend(
            gone.left_behind
                .iter()
                .skip(usize::from(!created))
                .map(ToString::to_string),
        ),
        Err(e) => left.push(format!("volume {id}: it could not be deregistered: {e}")),
    }
    left
}

/// Removes what the demo's control plane wrote: the data directory when the demo made it,
/// otherwise everything in it (it was empty).
fn remove_state(dir: &Path, made: bool) -> std::io::Result<()> {
    if made {
        return std::fs::remove_dir_all(dir);
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        match path.is_dir() {
            true => std::fs::remove_dir_all(&path)?,
            false => std::fs::remove_file(&path)?,
        }
    }
    Ok(())
}

/// Probes and fingerprints again only after an hour: the table shows the lifecycle's calls.
fn plugin_config() -> PluginManagerConfig {
    PluginManagerConfig {
        health_interval: Duration::from_secs(3600),
        fingerprint_interval: Duration::from_secs(3600),
        ..PluginManagerConfig::default()
    }
}

/// Short backoff so a retried release call shows up quickly in the demo.
fn driver_config() -> DriverConfig {
    let backoff = BackoffPolicy::new(Duration::from_millis(200), Duration::from_secs(2))
        .expect("constant backoff: 200 ms is above zero and below the 2 s cap");
    let mut config = DriverConfig {
        call_timeout: CALL_TIMEOUT,
        ..DriverConfig::default()
    };
    config.machine.backoff = backoff;
    config.machine.jitter_seed = u64::from(std::process::id());
    config
}
