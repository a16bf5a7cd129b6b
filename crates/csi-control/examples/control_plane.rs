//! An orchestrator's node and control plane through the front door, csi-control's
//! `ControlPlane`: one call opens the node, its catalog, its claims and the volume service,
//! with secrets, restart confirmation and routing wired in. The whole flow of a volume runs
//! against the mock plugin: create, claim by a writer and a reader, a restart, a release
//! through a failing step (its progress printed from the service's one event stream),
//! expansion, a snapshot and a volume made from it, delete and deregister.
//!
//! `cargo run -p csi-control --example control_plane` (the mock plugin runs in-process on a
//! unix socket in a temporary directory; it exits 1 naming the step that failed).

use std::time::Duration;

use csi_claims::ClaimMode;
use csi_client::{Code, Endpoint, Rpc};
use csi_control::service::{ClaimVolume, NewSnapshot, NewVolume, NewVolumeSource, SnapshotsOf};
use csi_control::{ControlPlane, ServiceEvent};
use csi_structs::{AccessMode, NodeId, PluginId, VolumeId, WorkloadId};
use csi_testkit::MockPlugin;
use tokio::sync::broadcast::Receiver;
use tokio::time::{Instant, timeout};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long any one step may take before the example gives up.
const STEP: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("control_plane failed: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("mock.sock");
    let mock = MockPlugin::builder().build()?;
    let _server = mock.serve_unix(&socket).await?;
    let (me, plugin) = (NodeId::new("node-1")?, PluginId::new("mock")?);
    let state = dir.path().join("state");

    // 1. Open the node and its control plane; register the plugin once (it is restored at
    //    every later open).
    let plane = ControlPlane::open(&state, me.clone()).await?;
    plane
        .register_plugin(plugin.clone(), Endpoint::unix(&socket)?)
        .await?;
    plane.wait_for_plugin(&plugin, STEP).await?;

    // 2. Create a volume; a writer and a reader claim it here (one controller publish).
    let volume = VolumeId::new("db")?;
    let mode = AccessMode::MultiNodeMultiWriter;
    let created = plane
        .service()
        .create(NewVolume {
            capacity_bytes: 1 << 30,
            ..NewVolume::new(volume.clone(), plugin.clone(), mode)
        })
        .await?;
    println!("created {} as {}", created.id, created.external_id);
    let writer = WorkloadId::new("web-1")?;
    let reader = WorkloadId::new("report-1")?;
    for (workload, mode) in [(&writer, ClaimMode::Write), (&reader, ClaimMode::Read)] {
        let request = ClaimVolume::new(volume.clone(), workload.clone(), mode);
        let claimed = plane.service().claim(request).await?;
        println!("{workload}: published at {}", claimed.target_path.display());
    }

    // 3. A restart: what the node's records say is confirmed with the plugin first.
    plane.close().await?;
    let plane = ControlPlane::open(&state, me.clone()).await?;
    let confirmed = plane.reconciled().await;
    println!(
        "restarted: {} publication(s) confirmed",
        confirmed.report.records.len()
    );
    let service = plane.service();
    let mut events = service.subscribe();

    // 4. The reader is released while NodeUnpublishVolume fails once: the pipeline retries
    //    it, and the service's events say so.
    mock.faults()
        .on(Rpc::NodeUnpublishVolume)
        .fail(Code::Unavailable, "device busy")
        .install();
    service.release(&volume, &reader).await?;
    follow_release(&mut events, &reader).await?;

    // 5. Grown while the writer has it published; a snapshot, and a volume made from it.
    let grown = service.expand(&volume, 2 << 30).await?;
    println!("expanded to {} bytes", grown.capacity_bytes);
    let cut = NewSnapshot::new("db-nightly");
    let snapshot = service.create_snapshot(&volume, cut).await?;
    let copy = VolumeId::new("db-copy")?;
    service
        .create(NewVolume {
            source: Some(NewVolumeSource::Snapshot(snapshot.id.clone())),
            ..NewVolume::new(copy.clone(), plugin.clone(), mode)
        })
        .await?;
    println!("snapshot {} restored as {copy}", snapshot.id);

    // 6. The writer released and waited for; the snapshot and the volume deleted; the copy
    //    deregistered (forgotten here, left in the plugin).
    let deadline = Instant::now() + STEP;
    service.release_and_wait(&volume, &writer, deadline).await?;
    let of_volume = SnapshotsOf::Volume(volume.clone());
    service.delete_snapshot(&of_volume, &snapshot.id).await?;
    service.delete(&volume).await?;
    let deregistered = service.deregister_volume(&copy, false, false).await?;
    println!("deleted {volume}; deregistered {copy}, which leaves:");
    for left in &deregistered.left_behind {
        println!("  {left}");
    }
    if mock.volumes().len() != 1 || !mock.published().is_empty() {
        return Err("the plugin should hold the copy alone, published nowhere".into());
    }
    plane.close().await?;
    Ok(())
}

/// Prints the release's progress until `workload`'s claim is freed.
async fn follow_release(
    events: &mut Receiver<ServiceEvent>,
    workload: &WorkloadId,
) -> Result<(), Error> {
    let mut failed = 0;
    loop {
        let event = timeout(STEP, events.recv()).await??;
        match &event {
            ServiceEvent::ReleaseStepFailed(_) => failed += 1,
            ServiceEvent::Freed { workload: w, .. } if w == workload => {
                println!("  {event}");
                return match failed {
                    0 => Err("the failed NodeUnpublishVolume was not reported".into()),
                    _ => Ok(()),
                };
            }
            _ => {}
        }
        println!("  {event}");
    }
}
