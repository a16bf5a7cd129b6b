//! An orchestrator's node on the library crates alone, the whole flow: a plugin registered,
//! a volume created for two access modes and validated, claimed by a writer and a reader and
//! attached, the node restarted (its publications confirmed with the plugin), the volume
//! expanded and snapshotted, both claims released while `NodeUnstageVolume` fails once (the
//! failed attempt is an event, and the release retries it), the volume deleted and the plugin
//! deregistered.
//!
//! `cargo run -p csi-node --example embed_node` (the mock plugin runs in-process on a unix
//! socket in a temporary directory; it exits 1 naming the step that failed).

use std::time::Duration;

use csi_claims::{ClaimMode, ClaimRequest, ControllerRequirement, Event, VolumeInfo};
use csi_client::{Code, Endpoint, Rpc, SnapshotFilter};
use csi_node::Node;
use csi_node::volumes::{ExpandRequest, Republish, Restore, Restored};
use csi_structs::confirm::AskedCapabilities;
use csi_structs::{
    AccessMode, AccessTypeKind, CapacityRange, ConfirmPolicy, Confirmation, MountOptions, NodeId,
    Parameters, PluginId, RegisteredVolume, VolumeCapability, VolumeId, VolumeSecrets, VolumeSpec,
    WorkloadId,
};
use tokio::time::Instant;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long any one step may take before the example gives up.
const STEP: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("embed_node failed: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("mock.sock");
    let mock = csi_testkit::MockPlugin::builder().build()?;
    let (server, state) = (mock.serve_unix(&socket).await?, dir.path().join("csi"));
    let (me, plugin) = (NodeId::new("node-1")?, PluginId::new("mock")?);

    // 1. The node, from its state directory; the plugin registered and fingerprinted.
    let node = Node::open(&state, me.clone()).await?;
    node.register_plugin(plugin.clone(), Endpoint::unix(&socket)?)
        .await?;
    let ready = node.wait_for(&plugin, STEP).await?;
    let plugin_node = ready.fingerprint.node.clone().ok_or("no node service")?;
    let controller = ready.client.controller();

    // 2. A volume for two access modes, created and validated.
    let writers = VolumeCapability::mount(AccessMode::SingleNodeMultiWriter, MountOptions::new());
    let readers = VolumeCapability::mount(AccessMode::MultiNodeReaderOnly, MountOptions::new());
    let both = vec![writers.clone(), readers];
    let spec = VolumeSpec::new(VolumeId::new("db")?, plugin.clone(), both.clone());
    let mut volume = RegisteredVolume::for_creation(spec)?;
    let created = controller.create(volume.spec()).await?;
    volume.record_created(&created);
    let (external_id, secrets) = (created.volume_id.clone(), volume.spec().secrets.clone());
    let asked = AskedCapabilities::new(both);
    let confirmed = controller
        .validate_volume_capabilities(&external_id, &asked, &secrets, ConfirmPolicy::Strict)
        .await?;
    if confirmed != Confirmation::Confirmed {
        return Err(format!("not confirmed: {confirmed:?}").into());
    }
    println!("created and validated {external_id}");
    let info = VolumeInfo {
        id: volume.id().clone(),
        external_id: external_id.clone(),
        plugin: plugin.clone(),
        controller: ControllerRequirement::of(&ready.fingerprint.capabilities),
    };

    // 3. A writer and a reader claim it on this node; each claim is attached here.
    let (writer, reader) = (WorkloadId::new("web-1")?, WorkloadId::new("report-1")?);
    for (workload, mode) in [(&writer, ClaimMode::Write), (&reader, ClaimMode::Read)] {
        let request = ClaimRequest {
            volume: volume.id().clone(),
            workload: workload.clone(),
            node: me.clone(),
            plugin_node: plugin_node.node_id.clone(),
            mode,
            access_mode: AccessMode::SingleNodeMultiWriter,
            attachment: AccessTypeKind::Mount,
        };
        let claim = node.claims().claim(&info, request).await?;
        let attached = node.attacher().attach(&volume, &claim).await?;
        println!("{workload}: published at {}", attached.target.display());
    }

    // 4. A restart: every file closed, the node opened again; what its records say is
    //    confirmed with the plugin (staged and published again; the plugin answers OK).
    drop((ready, controller));
    node.close().await?;
    let node = Node::open(&state, me.clone()).await?;
    let ready = node.wait_for(&plugin, STEP).await?;
    let controller = ready.client.controller();
    let context = created.volume_context.clone();
    let lookup = |p: &Restored| {
        Restore::Republish(Republish {
            capability: writers.clone(),
            read_only: p.workload == reader,
            volume_context: context.clone(),
            secrets: VolumeSecrets::default(),
        })
    };
    let confirmed = node.volumes().reconcile(&lookup).await;
    if !confirmed.is_complete() {
        return Err(format!("restored records not confirmed: {:?}", confirmed.records).into());
    }
    println!("restarted: {} records confirmed", confirmed.records.len());

    // 5. Expanded on the controller, then on this node where it is published; snapshotted.
    let two_gib = CapacityRange::at_least(2 << 30)?;
    let expanded = controller
        .expand(&external_id, &two_gib, Some(&writers), &secrets)
        .await?;
    if expanded.node_expansion_required {
        let request = ExpandRequest {
            plugin: plugin.clone(),
            volume: volume.id().clone(),
            external_id: external_id.clone(),
            capacity: two_gib,
            capability: Some(writers.clone()),
            secrets: secrets.clone(),
        };
        node.volumes().expand(&request).await?;
    }
    println!("expanded to {} bytes", expanded.capacity_bytes);
    let snapshot = controller
        .create_snapshot(&external_id, "db-nightly", &Parameters::default(), &secrets)
        .await?;
    let listed = controller
        .list_all_snapshots_matching(&SnapshotFilter::of_volume(external_id.clone()), &secrets)
        .await?;
    controller
        .delete_snapshot(&snapshot.snapshot_id, &secrets)
        .await?;
    println!("snapshot taken, {} listed, deleted", listed.len());

    // 6. Both released; the last one's NodeUnstageVolume fails once and is retried.
    mock.faults()
        .on(Rpc::NodeUnstageVolume)
        .fail(Code::Unavailable, "device busy")
        .install();
    let mut events = node.claims().subscribe();
    for workload in [&reader, &writer] {
        node.claims()
            .release_and_wait_until(volume.id(), workload, Instant::now() + STEP)
            .await?;
    }
    let mut events = std::iter::from_fn(|| events.try_recv().ok());
    let Some(Event::StepFailed(failed)) = events.find(|e| matches!(e, Event::StepFailed(_))) else {
        return Err("the failed unstage was not reported".into());
    };
    println!(
        "released; {} failed, attempt {}, retried",
        failed.step, failed.attempt
    );
    if !mock.staged().is_empty() || !mock.published().is_empty() {
        return Err("the plugin still has the volume staged or published".into());
    }

    // 7. Deleted; the plugin deregistered; the node closed.
    controller.delete(&external_id, &secrets).await?;
    drop((ready, controller));
    if !node.deregister_plugin(&plugin).await? {
        return Err("the plugin was not registered any more".into());
    }
    node.close().await?;
    server.shutdown().await?;
    println!("deleted {}, plugin deregistered, node closed", volume.id());
    Ok(())
}
