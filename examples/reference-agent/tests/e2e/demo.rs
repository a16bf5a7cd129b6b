//! `csi-agent demo` on csi-control's front door: the built-in mock, external plugins with
//! fewer capabilities, failures and what the service did about them.

use std::path::Path;

use csi_agent::demo::Step;
use csi_client::{Code, Rpc};
use csi_testkit::{ControllerCapability, MockPlugin, MockServer, NodeCapability, Quirk, Role};

use crate::support::{Run, csi_agent};

/// One numbered row of the table: a CSI call (or `-`), its volume and its outcome.
#[derive(Debug)]
struct Row {
    rpc: String,
    outcome: String,
}

/// The fields of a table line: columns are separated by two spaces or more.
fn fields(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .collect()
}

/// The rows of `step`, in order.
fn rows(run: &Run, step: Step) -> Vec<Row> {
    run.stdout
        .lines()
        .map(fields)
        .filter(|f| f.len() >= 6 && f[0].parse::<u32>().is_ok() && f[1] == step.name())
        .map(|f| Row {
            rpc: f[2].to_owned(),
            outcome: f[5..].join("  "),
        })
        .collect()
}

/// The RPCs of `step`'s rows.
fn rpcs(run: &Run, step: Step) -> Vec<String> {
    rows(run, step).into_iter().map(|r| r.rpc).collect()
}

/// The one row of `step` for `rpc`.
fn row(run: &Run, step: Step, rpc: &str) -> Row {
    let mut found = rows(run, step).into_iter().filter(|r| r.rpc == rpc);
    let row = found.next();
    assert!(found.next().is_none(), "two {rpc} rows\n{}", run.dump());
    row.unwrap_or_else(|| panic!("no {rpc} row for {step:?}\n{}", run.dump()))
}

/// The unnumbered notes under `step`'s rows (the service's events, the failure).
fn notes(run: &Run, step: Step) -> Vec<String> {
    let prefix = format!("    {}  ", step.name());
    run.stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|n| n.trim().to_owned())
        .collect()
}

/// What the demo lists after "left behind".
fn left_behind(run: &Run) -> Vec<&str> {
    run.stdout
        .lines()
        .skip_while(|l| !l.starts_with("left behind"))
        .filter_map(|l| l.strip_prefix("  - "))
        .collect()
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

/// `csi-agent demo` against `server`'s plugin, keeping its state in `data`.
async fn demo_against(server: &MockServer, data: &Path) -> Run {
    csi_agent(&[
        "demo",
        "--plugin-endpoint",
        &endpoint(server),
        "--data-dir",
        data.to_str().unwrap(),
    ])
    .await
}

/// Entries left in a directory.
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
    for step in [
        Step::RegisterPlugin,
        Step::CreateVolume,
        Step::Claim,
        Step::Expand,
        Step::WriteFile,
        Step::Snapshot,
        Step::Release,
        Step::DeleteSnapshot,
        Step::DeleteVolume,
    ] {
        let rows = rows(&run, step);
        assert!(
            !rows.is_empty() && rows.iter().all(|r| r.outcome.starts_with("ok")),
            "step {step:?}: {rows:?}\n{}",
            run.dump()
        );
    }
    // One row per CSI call, as the library reported it, in the order of the lifecycle.
    let claim = [
        "ControllerPublishVolume",
        "NodeStageVolume",
        "NodePublishVolume",
    ];
    assert_eq!(rpcs(&run, Step::Claim), claim, "{}", run.dump());
    assert_eq!(
        rpcs(&run, Step::Expand),
        ["ControllerExpandVolume", "NodeExpandVolume"]
    );
    let release = [
        "NodeUnpublishVolume",
        "NodeUnstageVolume",
        "ControllerUnpublishVolume",
    ];
    assert_eq!(rpcs(&run, Step::Release), release, "{}", run.dump());
    assert_eq!(rpcs(&run, Step::WriteFile), ["-"]);
    // Under the rows, what the service reported.
    let released = notes(&run, Step::Release);
    assert!(
        released
            .iter()
            .any(|n| n.starts_with("service: volume demo-")
                && n.ends_with("claim of demo-workload on node local freed")),
        "{}",
        run.dump()
    );
    let summary = run.stdout.lines().last().unwrap_or_default();
    assert!(
        summary.starts_with("demo ok: volume vol-"),
        "{}",
        run.dump()
    );
    assert!(summary.contains("in 19 CSI calls (0 skipped)"), "{summary}");
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
    let run = demo_against(&server, &data).await;
    assert_eq!(run.code, Some(0), "{}", run.dump());
    server
        .calls()
        .snapshot()
        .without_discovery()
        .assert_runs(&[
            (Rpc::CreateVolume, 1),
            (Rpc::NodePublishVolume, 1),
            (Rpc::NodeUnpublishVolume, 1),
            (Rpc::DeleteVolume, 1),
        ])
        .unwrap();
    for (step, rpc, why) in [
        (
            Step::Claim,
            "ControllerPublishVolume",
            "PUBLISH_UNPUBLISH_VOLUME",
        ),
        (Step::Claim, "NodeStageVolume", "STAGE_UNSTAGE_VOLUME"),
        (Step::Release, "NodeUnstageVolume", "STAGE_UNSTAGE_VOLUME"),
        (
            Step::Release,
            "ControllerUnpublishVolume",
            "PUBLISH_UNPUBLISH_VOLUME",
        ),
        (Step::Expand, "-", "no EXPAND_VOLUME"),
        (Step::Snapshot, "-", "CREATE_DELETE_SNAPSHOT"),
        (Step::DeleteSnapshot, "-", "CREATE_DELETE_SNAPSHOT"),
    ] {
        let outcome = row(&run, step, rpc).outcome;
        assert!(
            outcome.starts_with("skipped: ") && outcome.contains(why),
            "{step:?} {rpc}: {outcome}"
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
async fn demo_registers_an_existing_volume_on_a_node_only_plugin_and_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let plugin = MockPlugin::builder().role(Role::Node).build().unwrap();
    let server = serve(plugin, tmp.path()).await;
    let run = csi_agent(&[
        "demo",
        "--plugin-endpoint",
        &endpoint(&server),
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
    assert!(
        calls
            .records()
            .iter()
            .all(|c| c.volume_id.as_deref() == Some("pre-existing-7")),
        "{calls:#?}"
    );
    // No controller: registered without validation, grown on the node alone, no snapshot.
    let registered = row(&run, Step::RegisterVolume, "-").outcome;
    assert!(
        registered.contains("registered pre-existing-7"),
        "{}",
        run.dump()
    );
    assert_eq!(rpcs(&run, Step::Expand), ["NodeExpandVolume"]);
    assert!(
        row(&run, Step::Snapshot, "-")
            .outcome
            .starts_with("skipped")
    );
    let kept = row(&run, Step::DeregisterVolume, "-").outcome;
    assert!(kept.contains("pre-existing-7 is kept"), "{}", run.dump());
    assert!(rows(&run, Step::DeleteVolume).is_empty());
    assert_eq!(server.calls().count(Rpc::DeleteVolume), 0);
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
    let run = csi_agent(&["demo", "--plugin-endpoint", &endpoint(&server)]).await;
    assert_eq!(run.code, Some(0), "{}", run.dump());
    let expand = row(&run, Step::Expand, "-").outcome;
    assert!(
        expand.starts_with("skipped") && expand.contains("offline only"),
        "{expand}"
    );
    assert_eq!(rpcs(&run, Step::Snapshot), ["CreateSnapshot"]);
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
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(
        run.stderr.contains("step 'delete snapshot' failed"),
        "{}",
        run.dump()
    );
    let deleted = row(&run, Step::DeleteSnapshot, "DeleteSnapshot").outcome;
    assert_eq!(
        deleted,
        "failed: FailedPrecondition (retry)",
        "{}",
        run.dump()
    );
    let left = left_behind(&run);
    assert_eq!(left.len(), 2, "{}", run.dump());
    assert!(
        left[0].starts_with("snapshot ") && left[0].ends_with("DeleteSnapshot removes it"),
        "{}",
        run.dump()
    );
    assert!(
        left[1].ends_with("DeleteVolume removes it"),
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
    let data = tmp.path().join("data");
    let run = demo_against(&server, &data).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(
        run.stderr.contains("step 'register plugin' failed") && run.stderr.contains("--volume-id"),
        "{}",
        run.dump()
    );
    assert!(
        run.stdout.contains("left behind: nothing"),
        "{}",
        run.dump()
    );
    assert!(!data.exists(), "{:?}", entries(&data));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_missing_socket_or_a_used_data_dir_is_reported_at_once() {
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
    // A data dir with something in it (an earlier run's state, say) is not taken over.
    std::fs::write(tmp.path().join("volumes.json"), "{}").unwrap();
    let run = csi_agent(&["demo", "--data-dir", tmp.path().to_str().unwrap()]).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(run.stderr.contains("is not empty"), "{}", run.dump());
}

#[tokio::test]
async fn a_bad_flag_is_refused_naming_it() {
    let run = csi_agent(&["demo", "--plugin-endpoint", "http://example"]).await;
    assert_eq!(run.code, Some(2), "clap's usage error: {}", run.dump());
    assert!(run.stderr.contains("--plugin-endpoint"), "{}", run.dump());
}

#[tokio::test]
async fn a_failing_publish_is_released_by_the_service_and_the_error_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server
        .faults()
        .on(Rpc::NodePublishVolume)
        .fail(Code::InvalidArgument, "scripted: target refused");
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    // The row shows the failed call; the release pipeline's calls follow it in the step.
    let published = row(&run, Step::Claim, "NodePublishVolume").outcome;
    assert_eq!(
        published,
        "failed: InvalidArgument (fatal)",
        "{}",
        run.dump()
    );
    let released = &rpcs(&run, Step::Claim)[3..];
    assert_eq!(
        released,
        [
            "NodeUnpublishVolume",
            "NodeUnstageVolume",
            "ControllerUnpublishVolume"
        ],
        "{}",
        run.dump()
    );
    let said = "the claim is released and whatever the publish may have done is undone";
    assert!(
        notes(&run, Step::Claim)
            .iter()
            .any(|n| n
                .ends_with("publish for demo-workload failed; the claim is released and undone")),
        "{}",
        run.dump()
    );
    assert!(
        run.stderr.contains("step 'claim' failed")
            && run.stderr.contains("scripted: target refused")
            && run.stderr.contains(said),
        "{}",
        run.dump()
    );
    // The plugin holds the volume alone, as the list says.
    let plugin = server.plugin();
    assert!(plugin.staged().is_empty() && plugin.published().is_empty());
    let volumes = plugin.volumes();
    assert_eq!(volumes.len(), 1);
    assert!(plugin.published_nodes(&volumes[0].volume_id).is_empty());
    let left = left_behind(&run);
    assert_eq!(left.len(), 1, "{}", run.dump());
    assert!(
        left[0].starts_with(&format!(
            "volume {} in plugin demo-plugin",
            volumes[0].volume_id
        )) && left[0].ends_with("DeleteVolume removes it"),
        "{}",
        run.dump()
    );
    assert_eq!(rows(&run, Step::Expand).len(), 0, "nothing after the claim");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn unstage_failing_twice_with_unavailable_is_retried_to_success() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .fail_times(2, Code::Unavailable, "scripted: busy");
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(0), "{}", run.dump());
    assert_eq!(server.calls().count(Rpc::NodeUnstageVolume), 3);
    let unstages: Vec<String> = rows(&run, Step::Release)
        .into_iter()
        .filter(|r| r.rpc == "NodeUnstageVolume")
        .map(|r| r.outcome)
        .collect();
    assert_eq!(
        unstages,
        [
            "failed: Unavailable (retry)",
            "failed: Unavailable (retry)",
            "ok"
        ],
        "{}",
        run.dump()
    );
    let retried = notes(&run, Step::Release);
    assert!(
        retried.iter().any(
            |n| n.contains("(NodeUnstageVolume) failed, attempt 2 (retry): ")
                && n.contains("scripted: busy")
        ),
        "{}",
        run.dump()
    );
    assert!(server.plugin().volumes().is_empty());
    assert!(server.plugin().staged().is_empty());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_release_call_that_fails_fatally_stops_the_demo_and_lists_what_the_release_left() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server.faults().on(Rpc::NodeUnpublishVolume).fail_times(
        10,
        Code::InvalidArgument,
        "scripted: refused",
    );
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(
        run.stderr.contains("step 'release' failed")
            && run
                .stderr
                .contains("(NodeUnpublishVolume) failed, attempt 1 (fatal)"),
        "{}",
        run.dump()
    );
    // The demo stops at the first fatal answer: one call shown.
    let release = rows(&run, Step::Release);
    assert_eq!(release.len(), 1, "{}", run.dump());
    assert_eq!(release[0].outcome, "failed: InvalidArgument (fatal)");
    let left = left_behind(&run).join("\n");
    for expected in [
        "the claim of demo-workload on node local (releasing",
        "publication for workload demo-workload on node local at ",
        "ControllerUnpublishVolume not done",
        "DeleteVolume removes it",
        "usage record",
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
async fn an_uncertain_create_is_undone_by_the_service() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    // INTERNAL on CreateVolume: the volume may or may not exist.
    server
        .faults()
        .on(Rpc::CreateVolume)
        .fail(Code::Internal, "scripted: backend timed out");
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert_eq!(
        rpcs(&run, Step::CreateVolume),
        ["CreateVolume", "CreateVolume", "DeleteVolume"],
        "the call, then the service's undo by name\n{}",
        run.dump()
    );
    assert!(
        run.stderr.contains("step 'create volume' failed")
            && run
                .stderr
                .contains("undone: CreateVolume again by name gave volume"),
        "{}",
        run.dump()
    );
    assert!(
        run.stdout.contains("left behind: nothing"),
        "{}",
        run.dump()
    );
    assert!(server.plugin().volumes().is_empty(), "{}", run.dump());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_uncertain_create_that_cannot_be_undone_is_named_by_the_service() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server
        .faults()
        .on(Rpc::CreateVolume)
        .forever(csi_testkit::FaultStep::Fail {
            code: Code::Internal,
            message: "scripted: backend timed out".into(),
        });
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    assert!(
        notes(&run, Step::CreateVolume)
            .iter()
            .any(|n| n.starts_with("service: volume demo-") && n.contains("may exist in plugin")),
        "{}",
        run.dump()
    );
    let left = left_behind(&run);
    assert!(
        left.len() == 1
            && left[0]
                .starts_with("a volume that may exist in plugin demo-plugin under name demo-")
            && left[0].contains("CreateVolume by that name, then DeleteVolume"),
        "{}",
        run.dump()
    );
    assert!(server.plugin().calls().count(Rpc::CreateVolume) > 1);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_uncertain_controller_publish_is_undone_by_the_release() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    // INTERNAL on a mutation: the volume may have been attached.
    server
        .faults()
        .on(Rpc::ControllerPublishVolume)
        .fail(Code::Internal, "scripted: lost track");
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    let publish = row(&run, Step::Claim, "ControllerPublishVolume").outcome;
    assert_eq!(publish, "failed: Internal (uncertain)", "{}", run.dump());
    assert_eq!(server.calls().count(Rpc::ControllerUnpublishVolume), 1);
    assert!(
        run.stderr.contains("the claim is released"),
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
    let left = left_behind(&run);
    assert!(
        left.len() == 1 && left[0].ends_with("DeleteVolume removes it"),
        "{}",
        run.dump()
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_uncertain_stage_is_undone_by_the_release_through_a_busy_unstage() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(MockPlugin::builder().build().unwrap(), tmp.path()).await;
    server
        .faults()
        .on(Rpc::NodeStageVolume)
        .fail(Code::Internal, "scripted: lost track");
    server
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .fail_times(2, Code::Unavailable, "scripted: busy");
    let run = demo_against(&server, &tmp.path().join("data")).await;
    assert_eq!(run.code, Some(1), "{}", run.dump());
    let stage = row(&run, Step::Claim, "NodeStageVolume").outcome;
    assert_eq!(stage, "failed: Internal (uncertain)", "{}", run.dump());
    assert!(
        rows(&run, Step::Claim)
            .iter()
            .any(|r| r.rpc == "NodeUnstageVolume" && r.outcome == "ok"),
        "the unstage was retried until it was done\n{}",
        run.dump()
    );
    assert!(
        run.stderr.contains("step 'claim' failed") && run.stderr.contains("the claim is released"),
        "{}",
        run.dump()
    );
    assert!(server.plugin().staged().is_empty(), "{}", run.dump());
    assert!(server.plugin().published().is_empty());
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
    let claim = row(&run, Step::Claim, "-").outcome;
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
    let stage = row(&run, Step::Claim, "NodeStageVolume");
    assert!(stage.outcome == "ok", "{}", run.dump());
    server.shutdown().await.unwrap();
}
