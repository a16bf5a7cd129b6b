//! `csi-agent demo`: the built-in mock, external plugins with fewer capabilities, failures.

use std::path::Path;

use csi_agent::demo::Step;
use csi_client::{Code, Rpc};
use csi_testkit::{ControllerCapability, MockPlugin, MockServer, NodeCapability, Quirk, Role};

use crate::support::{Run, csi_agent};

/// The table row of `step` (rows start with the step number, then the name).
fn row(run: &Run, step: Step) -> &str {
    run.stdout
        .lines()
        .find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|n| n.parse::<u32>().is_ok())
                && l.contains(&format!("  {}  ", step.name()))
        })
        .unwrap_or_else(|| panic!("no row for step {step:?}\n{}", run.dump()))
}

fn result_of(run: &Run, step: Step) -> String {
    let row = row(run, step);
    let after_call = row
        .split_once(step.call())
        .map(|(_, rest)| rest.trim_start())
        .unwrap_or_default();
    // Skip the duration column ("1.2 ms" or "-").
    let rest = after_call
        .strip_prefix('-')
        .map(str::trim_start)
        .or_else(|| after_call.split_once(" ms").map(|(_, r)| r.trim_start()))
        .unwrap_or(after_call);
    rest.to_owned()
}

async fn serve(plugin: MockPlugin, dir: &Path) -> MockServer {
    plugin
        .serve_unix(dir.join("csi.sock"))
        .await
        .expect("the mock serves on a fresh socket path")
}

fn endpoint(server: &MockServer) -> String {
    let path = server.socket_path().expect("served on a unix socket");
    format!("unix://{}", path.display())
}

/// `csi-agent demo` against the plugin at `endpoint`, keeping its state in `data`.
async fn run_demo(endpoint: &str, data: &Path) -> Run {
    csi_agent(&[
        "demo",
        "--plugin-endpoint",
        endpoint,
        "--data-dir",
        data.to_str().unwrap(),
    ])
    .await
}

/// Entries left in a directory (recursively counted at the top level).
fn entries(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(list) => list
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[tokio::test]
async fn demo_walks_every_step_against_the_built_in_mock() {
    let run = csi_agent(&["demo"]).await;
    assert_eq!(run.code, Some(0), "{}", run.dump());
    for step in Step::ALL {
        let result = result_of(&run, step);
        assert!(
            result.starts_with("ok"),
            "step {step:?}: {result:?}\n{}",
            run.dump()
        );
    }
    let summary = run.stdout.lines().last().unwrap_or_default();
    assert!(summary.starts_with("demo ok: volume "), "{}", run.dump());
    assert!(summary.contains("in 17 steps (0 skipped)"), "{summary}");
    assert!(
        result_of(&run, Step::Expand).contains("by the controller; grown on the node"),
        "{}",
        run.dump()
    );
    assert!(summary.ends_with("nothing left behind"), "{summary}");
}

#[tokio::test]
async fn demo_adapts_to_a_plugin_without_staging_or_controller_publish() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let plugin = MockPlugin::builder()
        .controller_capabilities([ControllerCapability::CreateDeleteVolume])
        .node_capabilities(Vec::<NodeCapability>::new())
        .build()
        .unwrap();
    let server = serve(plugin, tmp.path()).await;
    let endpoint = endpoint(&server);
    let run = run_demo(&endpoint, &data).await;
    assert_eq!(run.code, Some(0), "{}", run.dump());
    server
        .calls()
        .snapshot()
        .without_discovery()
        .assert_runs(&[
            (Rpc::CreateVolume, 1),
            (Rpc::ValidateVolumeCapabilities, 1),
            (Rpc::NodePublishVolume, 1),
            (Rpc::NodeUnpublishVolume, 1),
            (Rpc::DeleteVolume, 1),
        ])
        .unwrap();
    for (step, why) in [
        (Step::ControllerPublish, "PUBLISH_UNPUBLISH_VOLUME"),
        (Step::NodeStage, "STAGE_UNSTAGE_VOLUME"),
        (Step::NodeUnstage, "STAGE_UNSTAGE_VOLUME"),
        (Step::ControllerUnpublish, "PUBLISH_UNPUBLISH_VOLUME"),
        (Step::Expand, "no EXPAND_VOLUME"),
        (Step::Snapshot, "CREATE_DELETE_SNAPSHOT"),
        (Step::DeleteSnapshot, "CREATE_DELETE_SNAPSHOT"),
    ] {
        let result = result_of(&run, step);
        assert!(
            result.starts_with("skipped") && result.contains(why),
            "{step:?}: {result}"
        );
    }
    assert!(run.stdout.contains("(7 skipped)"), "{}", run.dump());
    assert!(
        server.plugin().volumes().is_empty(),
        "the volume was deleted"
    );
    assert!(
        !data.exists(),
        "the data dir the demo made is gone: {:?}",
        entries(&data)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn demo_uses_an_existing_volume_on_a_node_only_plugin_and_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let plugin = MockPlugin::builder().role(Role::Node).build().unwrap();
    let server = serve(plugin, tmp.path()).await;
    let endpoint = endpoint(&server);
    let run = csi_agent(&[
        "demo",
        "--plugin-endpoint",
        &endpoint,
        "--data-dir",
        data.to_str().unwrap(),
        "--volume-id",
        "pre-existing-7",
    ])
    .await;
    assert_eq!(run.code, Some(0), "{}", run.dump());
    let calls = server.calls().snapshot().without_discovery();
    calls
        .assert_runs(&[
            (Rpc::NodeStageVolume, 1),
            (Rpc::NodePublishVolume, 1),
            (Rpc::NodeExpandVolume, 1),
            (Rpc::NodeUnpublishVolume, 1),
            (Rpc::NodeUnstageVolume, 1),
        ])
        .unwrap();
    // No controller to grow it: the node grows it alone; no controller, no snapshot.
    assert!(result_of(&run, Step::Expand).contains("grown on the node"));
    assert!(result_of(&run, Step::Snapshot).contains("skipped"));
    assert!(
        calls
            .records()
            .iter()
            .all(|c| c.volume_id.as_deref() == Some("pre-existing-7")),
        "{calls:#?}"
    );
    assert!(result_of(&run, Step::CreateVolume).contains("using existing volume pre-existing-7"));
    assert!(result_of(&run, Step::DeleteVolume).contains("is kept"));
    assert!(result_of(&run, Step::ValidateCapabilities).contains("no Controller service"));
    assert!(data.exists(), "a data dir the user gave is kept");
    assert!(
        entries(&data).is_empty(),
        "nothing left in it: {:?}",
        entries(&data)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_offline_only_plugin_s_published_volume_is_not_expanded() {
    let tmp = tempfile::tempdir().unwrap();
    let plugin = MockPlugin::builder()
        .volume_expansion(Some(csi_testkit::VolumeExpansion::Offline))
        .build()
        .unwrap();
    let server = serve(plugin, tmp.path()).await;
    let endpoint = endpoint(&server);
    let run = csi_agent(&["demo", "--plugin-endpoint", &endpoint]).await;
    assert_eq!(run.code, Some(0), "{}", run.dump());
    let expand = result_of(&run, Step::Expand);
    assert!(
        expand.starts_with("skipped") && expand.contains("offline only"),
        "{expand}"
    );
    assert!(result_of(&run, Step::Snapshot).starts_with("ok"));
    assert!(run.stdout.contains("(1 skipped)"), "{}", run.dump());
    let calls = server.calls();
    assert_eq!(calls.count(Rpc::ControllerExpandVolume), 0);
    assert_eq!(calls.count(Rpc::NodeExpandVolume), 0);
    assert_eq!(calls.count(Rpc::CreateSnapshot), 1);
    assert_eq!(calls.count(Rpc::DeleteSnapshot), 1);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_snapshot_that_cannot_be_deleted_is_left_before_the_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let plugin = MockPlugin::builder().build().unwrap();
    plugin
        .faults()
        .on(Rpc::DeleteSnapshot)
        .fail(Code::FailedPrecondition, "snapshot in use")
        .install();
    let server = serve(plugin, tmp.path()).await;
    let endpoint = endpoint(&server);
    let run = csi_agent(&["demo", "--plugin-endpoint", &endpoint]).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(result_of(&run, Step::DeleteSnapshot).starts_with("FAILED"));
    let left: Vec<&str> = run
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("left behind"))
        .skip(1)
        .collect();
    assert!(
        left.first()
            .is_some_and(|l| l.contains("exists: call DeleteSnapshot snapshot_id=")),
        "{}",
        run.dump()
    );
    assert!(
        left.get(1)
            .is_some_and(|l| l.contains("exists: call DeleteVolume")),
        "{}",
        run.dump()
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn demo_cannot_create_on_a_node_only_plugin_without_a_volume_id() {
    let tmp = tempfile::tempdir().unwrap();
    let plugin = MockPlugin::builder().role(Role::Node).build().unwrap();
    let server = serve(plugin, tmp.path()).await;
    let endpoint = endpoint(&server);
    let data = tmp.path().join("data");
    let run = run_demo(&endpoint, &data).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(run.stderr.contains("--volume-id"), "{}", run.dump());
    assert!(
        run.stdout.contains("left behind: nothing"),
        "{}",
        run.dump()
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_missing_socket_is_reported_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("nothing-here.sock");
    let endpoint = format!("unix://{}", socket.display());
    let run = csi_agent(&["demo", "--plugin-endpoint", &endpoint]).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(
        run.stderr.contains("no plugin socket at") && run.stderr.contains("nothing-here.sock"),
        "{}",
        run.dump()
    );
}

#[tokio::test]
async fn a_bad_flag_is_refused_naming_it() {
    let run = csi_agent(&["demo", "--plugin-endpoint", "http://example"]).await;
    assert_eq!(run.code, Some(2), "clap's usage error: {}", run.dump());
    assert!(run.stderr.contains("--plugin-endpoint"), "{}", run.dump());
}

#[tokio::test]
async fn a_failing_publish_names_the_step_and_what_was_left_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server
        .faults()
        .on(Rpc::NodePublishVolume)
        .fail(Code::InvalidArgument, "scripted: target refused");
    let endpoint = endpoint(&server);
    let run = run_demo(&endpoint, &data).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(
        run.stderr
            .contains("step 'node publish' (NodePublishVolume) failed"),
        "{}",
        run.dump()
    );
    assert!(
        result_of(&run, Step::NodePublish).starts_with("FAILED"),
        "{}",
        run.dump()
    );

    // What the report lists is what the plugin still has.
    let volumes = server.plugin().volumes();
    assert_eq!(volumes.len(), 1, "the volume is still there");
    let staged = server.plugin().staged();
    assert_eq!(staged.len(), 1, "the volume is still staged");
    let left = run
        .stdout
        .split_once("left behind")
        .map(|(_, r)| r)
        .unwrap_or_default();
    for expected in [
        "NodeUnstageVolume volume_id=",
        "ControllerUnpublishVolume volume_id=",
        "DeleteVolume volume_id=",
        "claim of the demo workload (taken)",
    ] {
        assert!(
            left.contains(expected),
            "missing {expected:?}\n{}",
            run.dump()
        );
    }
    assert!(
        !left.contains("NodeUnpublishVolume"),
        "it was never published\n{}",
        run.dump()
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn unstage_failing_twice_with_unavailable_is_retried_to_success() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .fail_times(2, Code::Unavailable, "scripted: busy");
    let endpoint = endpoint(&server);
    let run = run_demo(&endpoint, &data).await;
    assert_eq!(run.code, Some(0), "{}", run.dump());
    let unstages = server.calls().of(Rpc::NodeUnstageVolume);
    assert_eq!(unstages.len(), 3, "{unstages:#?}");
    assert!(server.plugin().volumes().is_empty());
    assert!(server.plugin().staged().is_empty());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_release_call_that_keeps_failing_stops_the_demo_and_lists_the_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server.faults().on(Rpc::NodeUnpublishVolume).fail_times(
        10,
        Code::InvalidArgument,
        "scripted: refused",
    );
    let endpoint = endpoint(&server);
    let run = run_demo(&endpoint, &data).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(
        run.stderr
            .contains("step 'release: node unpublish' (NodeUnpublishVolume) failed"),
        "{}",
        run.dump()
    );
    assert!(
        run.stderr.contains("fatal"),
        "the class is shown: {}",
        run.dump()
    );
    // A fatal answer is not retried by the demo: exactly one call.
    assert_eq!(server.calls().count(Rpc::NodeUnpublishVolume), 1);
    let left = run
        .stdout
        .split_once("left behind")
        .map(|(_, r)| r)
        .unwrap_or_default();
    for expected in [
        "claim of the demo workload (releasing)",
        "NodeUnpublishVolume volume_id=",
        "NodeUnstageVolume volume_id=",
        "ControllerUnpublishVolume volume_id=",
        "DeleteVolume volume_id=",
    ] {
        assert!(
            left.contains(expected),
            "missing {expected:?}\n{}",
            run.dump()
        );
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_uncertain_create_is_undone_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    // INTERNAL on CreateVolume: the volume may or may not exist.
    server
        .faults()
        .on(Rpc::CreateVolume)
        .fail(Code::Internal, "scripted: backend timed out");
    let endpoint = endpoint(&server);
    let run = csi_agent(&["demo", "--plugin-endpoint", &endpoint]).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    let result = result_of(&run, Step::CreateVolume);
    assert!(
        result.starts_with("FAILED") && result.contains("undone: CreateVolume again by name"),
        "{}",
        run.dump()
    );
    assert!(
        run.stdout.contains("left behind: nothing"),
        "{}",
        run.dump()
    );
    assert!(server.plugin().volumes().is_empty(), "{}", run.dump());
    assert_eq!(server.plugin().calls().count(Rpc::DeleteVolume), 1);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_uncertain_create_that_cannot_be_undone_is_named_among_the_leftovers() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server
        .faults()
        .on(Rpc::CreateVolume)
        .forever(csi_testkit::FaultStep::Fail {
            code: Code::Internal,
            message: "scripted: backend timed out".into(),
        });
    let endpoint = endpoint(&server);
    let run = csi_agent(&["demo", "--plugin-endpoint", &endpoint]).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(
        result_of(&run, Step::CreateVolume)
            .contains("the undo failed, a volume named csi-agent-demo-"),
        "{}",
        run.dump()
    );
    let left = run
        .stdout
        .split_once("left behind")
        .map(|(_, r)| r)
        .unwrap_or_default();
    assert!(
        left.contains("a volume named csi-agent-demo-")
            && left.contains("then DeleteVolume the volume_id it returns"),
        "{}",
        run.dump()
    );
    // The first call and every round of the undo.
    assert_eq!(
        server.plugin().calls().count(Rpc::CreateVolume),
        1 + csi_client::UNDO_CREATE_ROUNDS as usize
    );
    server.shutdown().await.unwrap();
}

/// Runs the demo against `server`'s plugin with its data under `data`.
async fn demo_against(server: &MockServer, data: &Path) -> Run {
    let endpoint = endpoint(server);
    run_demo(&endpoint, data).await
}

/// What the demo lists after "left behind".
fn left_behind(run: &Run) -> &str {
    run.stdout
        .split_once("left behind")
        .map(|(_, r)| r)
        .unwrap_or_default()
}

#[tokio::test]
async fn an_uncertain_controller_publish_is_undone_and_not_left_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    // INTERNAL on a mutation: the volume may have been attached.
    server
        .faults()
        .on(Rpc::ControllerPublishVolume)
        .fail(Code::Internal, "scripted: lost track");
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    let result = result_of(&run, Step::ControllerPublish);
    assert!(
        result.starts_with("FAILED")
            && result.contains("undone: ControllerUnpublishVolume succeeded"),
        "{}",
        run.dump()
    );
    assert_eq!(server.calls().count(Rpc::ControllerUnpublishVolume), 1);
    let left = left_behind(&run);
    assert!(
        left.contains("claim of the demo workload") && left.contains("DeleteVolume volume_id="),
        "{}",
        run.dump()
    );
    assert!(
        !left.contains("ControllerUnpublishVolume"),
        "{}",
        run.dump()
    );
    let volume = &server.plugin().volumes()[0];
    assert!(
        server
            .plugin()
            .published_nodes(&volume.volume_id)
            .is_empty()
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_uncertain_stage_that_cannot_be_undone_is_named_with_its_call() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server
        .faults()
        .on(Rpc::NodeStageVolume)
        .fail(Code::Internal, "scripted: lost track");
    server
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .fail(Code::InvalidArgument, "scripted: not now");
    let run = demo_against(&server, &data).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(
        result_of(&run, Step::NodeStage).contains(
            "undoing it with NodeUnstageVolume failed too, so it is listed as left behind"
        ),
        "{}",
        run.dump()
    );
    let left = left_behind(&run);
    let staging = data.join("staging").join("demo-volume");
    let staging = staging.display();
    for expected in [
        format!(
            "may be staged at {staging} (NodeStageVolume's outcome is uncertain): call \
             NodeUnstageVolume volume_id="
        ),
        format!("staging_target_path={staging}"),
        "published to node ".to_owned(),
        "ControllerUnpublishVolume volume_id=".to_owned(),
        "DeleteVolume volume_id=".to_owned(),
    ] {
        assert!(
            left.contains(&expected),
            "missing {expected:?}\n{}",
            run.dump()
        );
    }
    assert!(!left.contains("NodeUnpublishVolume"), "{}", run.dump());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_uncertain_publish_is_undone_and_what_was_done_before_is_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server
        .faults()
        .on(Rpc::NodePublishVolume)
        .fail(Code::Internal, "scripted: lost track");
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(
        result_of(&run, Step::NodePublish).contains("undone: NodeUnpublishVolume succeeded"),
        "{}",
        run.dump()
    );
    assert_eq!(server.calls().count(Rpc::NodeUnpublishVolume), 1);
    assert!(server.plugin().published().is_empty());
    let left = left_behind(&run);
    assert!(
        left.contains("staged at ") && !left.contains("may be staged"),
        "{}",
        run.dump()
    );
    assert!(!left.contains("NodeUnpublishVolume"), "{}", run.dump());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_volume_whose_topology_excludes_the_node_is_refused_before_any_publish() {
    let tmp = tempfile::tempdir().unwrap();
    let plugin = MockPlugin::builder()
        .topology("zone", "earth")
        .quirk(Quirk::VolumesElsewhere)
        .build()
        .unwrap();
    let server = serve(plugin, tmp.path()).await;
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    let claim = result_of(&run, Step::Claim);
    assert!(
        claim.starts_with("FAILED")
            && claim.contains("reachable from {zone=elsewhere} only; the node is at {zone=earth}"),
        "{}",
        run.dump()
    );
    let calls = server.plugin().calls();
    for rpc in [
        Rpc::ControllerPublishVolume,
        Rpc::NodeStageVolume,
        Rpc::NodePublishVolume,
    ] {
        assert_eq!(calls.count(rpc), 0, "{rpc:?} was called\n{}", run.dump());
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_long_call_is_shown_as_plain_lines_naming_the_rpc_and_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    // Long enough to be shown (3 s), short enough for a quick test.
    server
        .faults()
        .on(Rpc::NodeStageVolume)
        .then_delay(std::time::Duration::from_secs(5))
        .install();
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(0), "{}", run.dump());
    // Stderr is a pipe here: plain lines, no terminal control.
    let waits: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("still in flight: "))
        .collect();
    assert!(!waits.is_empty(), "{}", run.dump());
    for line in &waits {
        assert!(
            line.starts_with("still in flight: NodeStageVolume volume vol-")
                && line.contains(": waiting for the plugin's answer, attempt 1 of ")
                && line.contains("(deadline ")
                && line.ends_with(" so far"),
            "{line}"
        );
    }
    assert!(!run.stderr.contains('\u{1b}'), "{}", run.dump());
    server.shutdown().await.unwrap();
}
