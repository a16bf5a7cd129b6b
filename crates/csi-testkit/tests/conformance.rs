//! The conformance suite against the testkit's own mock plugin, over a real unix socket:
//! the spec-abiding mock passes, and deliberately broken mocks make the right checks fail.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use csi_proto::Rpc;
use csi_testkit::conformance::{self, Check, CheckOutcome, Options, Report, Suite};
use csi_testkit::{
    ControllerCapability, MockPlugin, MockPluginBuilder, MockServer, NodeCapability, PluginService,
    Quirk, Role, VolumeExpansion,
};
use tempfile::TempDir;
use tonic::Code;

/// Upper bound for one whole run: only a guard against a hang, never a timing assertion.
const HANG_GUARD: Duration = Duration::from_secs(120);

const SECRET_KEY: &str = "conformance-token";
const SECRET_VALUE: &str = "s3cr3t-value-never-printed";

/// A mock served on a socket in a fresh temporary directory.
struct Served {
    dir: TempDir,
    plugin: MockPlugin,
    server: MockServer,
}

impl Served {
    async fn start(builder: MockPluginBuilder) -> Served {
        let dir = tempfile::tempdir().expect("a temporary directory can be created");
        let plugin = builder.build().expect("the mock configuration is valid");
        let server = plugin
            .serve_unix(dir.path().join("csi.sock"))
            .await
            .expect("the mock can serve on a fresh socket path");
        Served {
            dir,
            plugin,
            server,
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("csi.sock")
    }

    fn options(&self) -> Options {
        Options::new(self.socket(), self.dir.path().join("scratch"))
    }

    async fn run(&self, options: Options) -> Report {
        tokio::time::timeout(HANG_GUARD, conformance::run(options))
            .await
            .expect("the suite finishes")
            .expect("the suite can connect to the mock")
    }
}

fn outcome(report: &Report, check: Check) -> CheckOutcome {
    report
        .outcome(check)
        .cloned()
        .unwrap_or_else(|| panic!("{check} did not run:\n{report}"))
}

/// Skips must name why: an absent capability or service, or missing configuration.
fn assert_no_failures_and_stated_skips(report: &Report) {
    assert!(
        !report.failed(),
        "a check failed against the spec-abiding mock:\n{report}"
    );
    for result in &report.results {
        if let CheckOutcome::Skip { reason } = &result.outcome {
            let stated = ["not advertised", "not served", "configured", "unadvertised"]
                .iter()
                .any(|phrase| reason.contains(phrase));
            assert!(
                stated,
                "{} skipped without naming a capability: {reason}",
                result.check
            );
        }
    }
    assert!(
        report.cleanup_problems.is_empty(),
        "cleanup problems:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mock_passes_every_check_and_nothing_is_left_behind() {
    let served = Served::start(MockPlugin::builder().mutable_parameter_key("iops")).await;
    let options = served
        .options()
        .secret(SECRET_KEY, SECRET_VALUE)
        .mutable_parameter("iops", "300");
    let report = served.run(options).await;
    assert_no_failures_and_stated_skips(&report);

    // The mock advertises everything it implements, so the substantive checks really ran.
    for check in [
        Check::PluginInfo,
        Check::Probe,
        Check::CapabilitiesCoherent,
        Check::NodeGetInfo,
        Check::AdvertisedRpcsAnswer,
        Check::RequiredFields(Rpc::CreateVolume),
        Check::RequiredFields(Rpc::NodePublishVolume),
        Check::NotFound(Rpc::ControllerPublishVolume),
        Check::Idempotent(Rpc::CreateVolume),
        Check::Idempotent(Rpc::ControllerModifyVolume),
        Check::Idempotent(Rpc::CreateVolumeGroupSnapshot),
        Check::Idempotent(Rpc::DeleteVolumeGroupSnapshot),
        Check::NotFound(Rpc::GetVolumeGroupSnapshot),
        Check::NotFound(Rpc::ControllerModifyVolume),
        Check::NotFound(Rpc::NodeGetVolumeStats),
        Check::NotFound(Rpc::NodeExpandVolume),
        Check::MutableParameterKeys,
        Check::Pagination(Rpc::ListVolumes),
        Check::Pagination(Rpc::ListSnapshots),
        Check::ValidateConfirms,
        Check::NodeLifecycle,
        Check::SecretsPassedThrough,
        Check::SizeLimits,
    ] {
        assert_eq!(
            outcome(&report, check),
            CheckOutcome::Pass,
            "{check}:\n{report}"
        );
    }
    assert_eq!(
        report.plugin.as_ref().map(|p| p.name.as_str()),
        Some(served.plugin.config().name.as_str())
    );

    // Cleanup: nothing the suite created survives on the plugin.
    assert!(
        served.plugin.volumes().is_empty(),
        "volumes left: {:?}",
        served.plugin.volumes()
    );
    assert!(served.plugin.snapshot_ids().is_empty(), "snapshots left");
    assert!(served.plugin.staged().is_empty() && served.plugin.published().is_empty());

    // Secrets were passed through on every request that carries them, and never printed.
    let calls = served.server.calls().snapshot();
    let with_secrets: Vec<_> = calls
        .records()
        .iter()
        .filter(|r| r.request.contains("secrets"))
        .collect();
    assert!(
        with_secrets.len() > 20,
        "few secret-bearing calls: {}",
        with_secrets.len()
    );
    for record in &with_secrets {
        assert!(
            record.request.contains(SECRET_KEY),
            "{:?} lacks the secret: {}",
            record.rpc,
            record.request
        );
    }
    assert!(
        calls
            .records()
            .iter()
            .all(|r| !r.request.contains(SECRET_VALUE))
    );
    assert!(!report.to_string().contains(SECRET_VALUE));
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_capabilities_skip_their_checks_and_answer_unimplemented() {
    let builder = MockPlugin::builder()
        .plugin_capabilities([PluginService::ControllerService], None)
        .controller_capabilities([
            ControllerCapability::CreateDeleteVolume,
            ControllerCapability::PublishUnpublishVolume,
        ])
        .node_capabilities([NodeCapability::StageUnstageVolume]);
    let served = Served::start(builder).await;
    let report = served.run(served.options()).await;
    assert_no_failures_and_stated_skips(&report);

    // The mock answers UNIMPLEMENTED for what it does not advertise, and the suite checked that.
    assert_eq!(
        outcome(&report, Check::UnadvertisedRpcsUnimplemented),
        CheckOutcome::Pass,
        "{report}"
    );
    for (check, capability) in [
        (Check::Pagination(Rpc::ListVolumes), "LIST_VOLUMES"),
        (Check::Pagination(Rpc::ListSnapshots), "LIST_SNAPSHOTS"),
        (
            Check::RequiredFields(Rpc::CreateSnapshot),
            "CREATE_DELETE_SNAPSHOT",
        ),
        (Check::NotFound(Rpc::NodeGetVolumeStats), "GET_VOLUME_STATS"),
        (
            Check::Idempotent(Rpc::ControllerExpandVolume),
            "EXPAND_VOLUME",
        ),
        (
            Check::RequiredFields(Rpc::CreateVolumeGroupSnapshot),
            "GROUP_CONTROLLER_SERVICE",
        ),
    ] {
        match outcome(&report, check) {
            CheckOutcome::Skip { reason } => {
                assert!(reason.contains(capability), "{check}: {reason}")
            }
            other => panic!("{check} should be skipped for {capability}, got {other:?}"),
        }
    }
    // The lifecycle still runs: with staging, without stats.
    assert_eq!(
        outcome(&report, Check::NodeLifecycle),
        CheckOutcome::Pass,
        "{report}"
    );
    served.server.shutdown().await.expect("the mock shuts down");
}

/// One wrong answer, scripted as a fault, fails exactly the check that looks for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_codes_fail_required_field_not_found_and_idempotency_checks() {
    let cases: [(Check, Rpc, usize, Code, &str); 3] = [
        // The first CreateVolume is the one without a name.
        (
            Check::RequiredFields(Rpc::CreateVolume),
            Rpc::CreateVolume,
            0,
            Code::Internal,
            "without name",
        ),
        (
            Check::NotFound(Rpc::ValidateVolumeCapabilities),
            Rpc::ValidateVolumeCapabilities,
            0,
            Code::Internal,
            "expected NOT_FOUND",
        ),
        // The repeat of CreateVolume answers ALREADY_EXISTS instead of the same volume.
        (
            Check::Idempotent(Rpc::CreateVolume),
            Rpc::CreateVolume,
            1,
            Code::AlreadyExists,
            "ALREADY_EXISTS",
        ),
    ];
    for (check, rpc, pass_first, code, expected) in cases {
        let served = Served::start(MockPlugin::builder()).await;
        served
            .server
            .faults()
            .on(rpc)
            .pass_times(pass_first)
            .fail(code, "scripted")
            .install();
        let suite = Suite::connect(served.options())
            .await
            .expect("the suite can connect to the mock")
            .only(|c| c == check);
        let report = tokio::time::timeout(HANG_GUARD, suite.run())
            .await
            .expect("the suite finishes");
        match outcome(&report, check) {
            CheckOutcome::Fail { reason } => {
                assert!(reason.contains(expected), "{check}: {reason}")
            }
            other => panic!("{check} should fail, got {other:?}"),
        }
        assert!(
            served.plugin.volumes().is_empty(),
            "{check} left volumes behind"
        );
        served.server.shutdown().await.expect("the mock shuts down");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unadvertised_rpc_answering_anything_but_unimplemented_fails_consistency() {
    let builder = MockPlugin::builder()
        .plugin_capabilities([PluginService::ControllerService], None)
        .controller_capabilities([ControllerCapability::CreateDeleteVolume]);
    let served = Served::start(builder).await;
    // Fault scripts win over the mock's UNIMPLEMENTED: the RPC now answers INTERNAL.
    served
        .server
        .faults()
        .on(Rpc::ListSnapshots)
        .fail(Code::Internal, "backend listing failed")
        .install();
    let suite = Suite::connect(served.options())
        .await
        .expect("the suite can connect to the mock")
        .only(|check| check == Check::UnadvertisedRpcsUnimplemented);
    let report = tokio::time::timeout(HANG_GUARD, suite.run())
        .await
        .expect("the suite finishes");
    match outcome(&report, Check::UnadvertisedRpcsUnimplemented) {
        CheckOutcome::Fail { reason } => {
            assert!(
                reason.contains("ListSnapshots answered INTERNAL"),
                "{reason}"
            );
            assert!(
                reason.contains("LIST_SNAPSHOTS is not advertised"),
                "{reason}"
            );
            // Only the faulted RPC is blamed.
            assert!(!reason.contains("ListVolumes"), "{reason}");
        }
        other => panic!("UnadvertisedRpcsUnimplemented should fail, got {other:?}"),
    }
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_only_plugin_skips_node_checks() {
    let served = Served::start(MockPlugin::builder().role(Role::Controller)).await;
    let report = served.run(served.options()).await;
    assert_no_failures_and_stated_skips(&report);
    for check in [
        Check::NodeLifecycle,
        Check::NodeGetInfo,
        Check::RequiredFields(Rpc::NodePublishVolume),
    ] {
        assert!(outcome(&report, check).is_skip(), "{check}:\n{report}");
    }
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_expansion_without_an_expand_capability_fails_coherence() {
    let builder = MockPlugin::builder()
        .plugin_capabilities(
            [PluginService::ControllerService],
            Some(VolumeExpansion::Online),
        )
        .controller_capabilities([ControllerCapability::CreateDeleteVolume])
        .node_capabilities([]);
    let served = Served::start(builder).await;
    let report = served.run(served.options()).await;
    match outcome(&report, Check::CapabilitiesCoherent) {
        CheckOutcome::Fail { reason } => assert!(reason.contains("ONLINE"), "{reason}"),
        other => panic!("CapabilitiesCoherent should fail, got {other:?}\n{report}"),
    }
    let failed: Vec<Check> = report.failures().map(|r| r.check).collect();
    assert_eq!(failed, [Check::CapabilitiesCoherent], "{report}");
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_only_plugin_skips_controller_checks() {
    let served = Served::start(MockPlugin::builder().role(Role::Node)).await;
    let report = served.run(served.options()).await;
    assert_no_failures_and_stated_skips(&report);
    assert_eq!(
        outcome(&report, Check::NodeGetInfo),
        CheckOutcome::Pass,
        "{report}"
    );
    assert_eq!(
        outcome(&report, Check::RequiredFields(Rpc::NodePublishVolume)),
        CheckOutcome::Pass,
        "{report}"
    );
    match outcome(&report, Check::ValidateConfirms) {
        CheckOutcome::Skip { reason } => assert!(reason.contains("CONTROLLER_SERVICE"), "{reason}"),
        other => panic!("ValidateConfirms should be skipped, got {other:?}"),
    }
    assert!(outcome(&report, Check::NodeLifecycle).is_skip(), "{report}");

    // With a pre-provisioned volume the node lifecycle runs on a node-only plugin too.
    let report = served
        .run(served.options().existing_volume("pre-provisioned-1"))
        .await;
    assert_no_failures_and_stated_skips(&report);
    assert_eq!(
        outcome(&report, Check::NodeLifecycle),
        CheckOutcome::Pass,
        "{report}"
    );
    assert!(served.plugin.staged().is_empty() && served.plugin.published().is_empty());
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_never_confirms_fails_validation() {
    let served = Served::start(MockPlugin::builder().quirk(Quirk::NeverConfirm)).await;
    let report = served.run(served.options()).await;
    match outcome(&report, Check::ValidateConfirms) {
        CheckOutcome::Fail { reason } => assert!(reason.contains("confirmed"), "{reason}"),
        other => panic!("ValidateConfirms should fail, got {other:?}\n{report}"),
    }
    // Only the checks the quirk touches fail.
    let failed: Vec<Check> = report.failures().map(|r| r.check).collect();
    assert_eq!(failed, [Check::ValidateConfirms], "{report}");
    served.server.shutdown().await.expect("the mock shuts down");
}

/// The mock as it was before csi-sanity was run against it: argument checks before the
/// existence check. The suite fails exactly the checks csi-sanity failed it on, naming the case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argument_checks_before_not_found_fail_the_not_found_checks() {
    let served = Served::start(
        MockPlugin::builder()
            .mutable_parameter_key("iops")
            .quirk(Quirk::ArgumentChecksFirst),
    )
    .await;
    let report = served
        .run(served.options().mutable_parameter("iops", "300"))
        .await;
    let expected = [
        (
            Check::NotFound(Rpc::ControllerModifyVolume),
            "without mutable_parameters",
        ),
        (
            Check::NotFound(Rpc::GetVolumeGroupSnapshot),
            "without snapshot_ids",
        ),
        (Check::NotFound(Rpc::NodeGetVolumeStats), "relative path"),
        (Check::NotFound(Rpc::NodeExpandVolume), "relative path"),
        (
            Check::Idempotent(Rpc::DeleteVolumeGroupSnapshot),
            "without snapshot_ids",
        ),
    ];
    for (check, case) in expected {
        match outcome(&report, check) {
            CheckOutcome::Fail { reason } => assert!(
                reason.contains(case) && reason.contains("INVALID_ARGUMENT"),
                "{check}: {reason}"
            ),
            other => panic!("{check} should fail, got {other:?}\n{report}"),
        }
    }
    let failed: Vec<Check> = report.failures().map(|r| r.check).collect();
    assert_eq!(
        failed.len(),
        expected.len(),
        "only the checks the quirk touches fail:\n{report}"
    );
    served.server.shutdown().await.expect("the mock shuts down");
}

/// The mock as it was before: any mutable parameter key accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepting_any_mutable_parameter_key_fails_the_mutable_parameter_check() {
    let served = Served::start(MockPlugin::builder().quirk(Quirk::AnyMutableParameterKey)).await;
    let report = served.run(served.options()).await;
    match outcome(&report, Check::MutableParameterKeys) {
        CheckOutcome::Fail { reason } => assert!(
            reason.contains("CreateVolume") && reason.contains("ControllerModifyVolume"),
            "both calls are named: {reason}"
        ),
        other => panic!("MutableParameterKeys should fail, got {other:?}\n{report}"),
    }
    let failed: Vec<Check> = report.failures().map(|r| r.check).collect();
    assert_eq!(failed, [Check::MutableParameterKeys], "{report}");
    served.server.shutdown().await.expect("the mock shuts down");
    // A mock configured with the key passes the same check.
    let served = Served::start(MockPlugin::builder().mutable_parameter_key("iops")).await;
    let report = served
        .run(served.options().mutable_parameter("iops", "300"))
        .await;
    assert_eq!(
        outcome(&report, Check::MutableParameterKeys),
        CheckOutcome::Pass,
        "{report}"
    );
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_confirming_another_capability_fails_validation() {
    let served =
        Served::start(MockPlugin::builder().quirk(Quirk::ConfirmDifferentCapability)).await;
    let report = served.run(served.options()).await;
    assert!(
        outcome(&report, Check::ValidateConfirms).is_fail(),
        "{report}"
    );
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_on_a_repeated_unpublish_fails_idempotency() {
    let served =
        Served::start(MockPlugin::builder().quirk(Quirk::NotFoundOnRepeatedUnpublish)).await;
    let report = served.run(served.options()).await;
    for check in [
        Check::NodeLifecycle,
        Check::Idempotent(Rpc::ControllerUnpublishVolume),
    ] {
        match outcome(&report, check) {
            CheckOutcome::Fail { reason } => {
                assert!(reason.contains("NOT_FOUND"), "{check}: {reason}")
            }
            other => panic!("{check} should fail, got {other:?}\n{report}"),
        }
    }
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advertised_rpc_answering_unimplemented_fails_consistency() {
    let served = Served::start(MockPlugin::builder()).await;
    served
        .server
        .faults()
        .on(Rpc::GetCapacity)
        .fail(Code::Unimplemented, "not built in this release")
        .install();
    let suite = Suite::connect(served.options())
        .await
        .expect("the suite can connect to the mock")
        .only(|check| check == Check::AdvertisedRpcsAnswer);
    let report = tokio::time::timeout(HANG_GUARD, suite.run())
        .await
        .expect("the suite finishes");
    assert_eq!(report.results.len(), 1);
    match outcome(&report, Check::AdvertisedRpcsAnswer) {
        CheckOutcome::Fail { reason } => {
            assert!(
                reason.contains("GetCapacity answered UNIMPLEMENTED"),
                "{reason}"
            );
            assert!(reason.contains("advertised"), "{reason}");
        }
        other => panic!("AdvertisedRpcsAnswer should fail, got {other:?}"),
    }
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_not_ready_fails_probe() {
    let served = Served::start(MockPlugin::builder().quirk(Quirk::ProbeNotReady)).await;
    let suite = Suite::connect(served.options())
        .await
        .expect("the suite can connect to the mock")
        .only(|check| check == Check::Probe);
    let report = suite.run().await;
    assert!(outcome(&report, Check::Probe).is_fail(), "{report}");
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_mid_lifecycle_still_cleans_up_everything() {
    let served = Served::start(MockPlugin::builder()).await;
    served
        .server
        .faults()
        .on(Rpc::NodePublishVolume)
        .fail(Code::Internal, "mount helper crashed")
        .install();
    let suite = Suite::connect(served.options())
        .await
        .expect("the suite can connect to the mock")
        .only(|check| check == Check::NodeLifecycle);
    let report = tokio::time::timeout(HANG_GUARD, suite.run())
        .await
        .expect("the suite finishes");
    match outcome(&report, Check::NodeLifecycle) {
        CheckOutcome::Fail { reason } => assert!(reason.contains("INTERNAL"), "{reason}"),
        other => panic!("NodeLifecycle should fail, got {other:?}"),
    }
    // The volume was created, published to the node and staged before the failure; all undone.
    let calls = served.server.calls();
    assert_eq!(
        calls.count(Rpc::NodeStageVolume),
        2,
        "staged (and repeated) before the failure"
    );
    assert_eq!(
        calls.count(Rpc::NodeUnstageVolume),
        1,
        "unstaged by cleanup"
    );
    assert_eq!(
        calls.count(Rpc::ControllerUnpublishVolume),
        1,
        "unpublished by cleanup"
    );
    assert_eq!(calls.count(Rpc::DeleteVolume), 1, "deleted by cleanup");
    assert!(
        served.plugin.volumes().is_empty(),
        "volumes left: {:?}",
        served.plugin.volumes()
    );
    assert!(served.plugin.staged().is_empty() && served.plugin.published().is_empty());
    assert!(report.cleanup_problems.is_empty(), "{report}");
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_never_answers_fails_its_check_after_the_per_call_deadline() {
    let served = Served::start(MockPlugin::builder()).await;
    served.server.faults().on(Rpc::Probe).hang().install();
    // A short deadline keeps the test quick; the assertion is on the outcome, not the time.
    let options = served.options().timeout(Duration::from_secs(1));
    let suite = Suite::connect(options)
        .await
        .expect("the suite can connect to the mock")
        .only(|check| check == Check::Probe);
    let report = tokio::time::timeout(HANG_GUARD, suite.run())
        .await
        .expect("the suite finishes");
    match outcome(&report, Check::Probe) {
        // Either our own deadline or the plugin honouring grpc-timeout ends the call.
        CheckOutcome::Fail { reason } => assert!(reason.starts_with("Probe "), "{reason}"),
        other => panic!("Probe should fail, got {other:?}"),
    }
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test]
async fn an_absent_socket_is_an_error_not_a_report() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let options = Options::new(dir.path().join("nobody.sock"), dir.path().join("scratch"));
    let err = conformance::run(options)
        .await
        .expect_err("nothing listens on the socket");
    assert!(matches!(err, conformance::Error::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains("nobody.sock"), "{err}");
}

// ---- the csi-conformance binary ----

async fn conformance_binary(args: Vec<String>) -> Output {
    conformance_binary_with_env(args, None).await
}

async fn conformance_binary_with_env(args: Vec<String>, csi_endpoint: Option<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_csi-conformance"));
        command.args(args).env_remove("CSI_ENDPOINT");
        if let Some(endpoint) = csi_endpoint {
            command.env("CSI_ENDPOINT", endpoint);
        }
        command.output().expect("the csi-conformance binary runs")
    })
    .await
    .expect("the blocking task completes")
}

fn endpoint_args(served: &Served) -> Vec<String> {
    vec![
        "--endpoint".into(),
        format!("unix://{}", served.socket().display()),
        "--staging-dir".into(),
        served.dir.path().join("scratch").display().to_string(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exits_zero_when_nothing_fails_and_one_when_something_does() {
    let good = Served::start(MockPlugin::builder()).await;
    let output = conformance_binary(endpoint_args(&good)).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("PASS  node/lifecycle"), "{stdout}");
    assert!(
        stdout.lines().count() >= Check::all().len(),
        "one line per check:\n{stdout}"
    );

    let mut json_args = endpoint_args(&good);
    json_args.push("--json".into());
    let output = conformance_binary(json_args).await;
    assert_eq!(output.status.code(), Some(0));
    let json: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("--json prints JSON");
    assert_eq!(
        json["results"].as_array().map(Vec::len),
        Some(Check::all().len())
    );

    // CSI_ENDPOINT stands in for --endpoint.
    let scratch = good.dir.path().join("scratch-env").display().to_string();
    let output = conformance_binary_with_env(
        vec!["--staging-dir".into(), scratch],
        Some(format!("unix://{}", good.socket().display())),
    )
    .await;
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    good.server.shutdown().await.expect("the mock shuts down");

    let broken = Served::start(MockPlugin::builder().quirk(Quirk::NeverConfirm)).await;
    let output = conformance_binary(endpoint_args(&broken)).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  controller/validate-confirms"),
        "{stdout}"
    );
    broken.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exits_two_for_bad_flags_and_endpoints() {
    let dir = tempfile::tempdir().expect("a temporary directory can be created");
    let missing = format!("unix://{}", dir.path().join("absent.sock").display());
    let with = |flag: &str, value: &str| {
        vec![
            "--endpoint".to_owned(),
            missing.clone(),
            flag.to_owned(),
            value.to_owned(),
        ]
    };
    // Each case and a fragment its stderr must contain, so the exit code has the right cause.
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--no-such-flag".to_owned()], "--no-such-flag"),
        (vec![], "--endpoint"),
        (
            vec!["--endpoint".into(), "tcp://127.0.0.1:10000".into()],
            "not a unix socket",
        ),
        (
            vec!["--endpoint".into(), "unix://relative/csi.sock".into()],
            "absolute",
        ),
        (vec!["--endpoint".into(), missing.clone()], "cannot connect"),
        (with("--timeout", "0"), "--timeout"),
        (with("--secret", "no-equals"), "KEY=VALUE"),
        (with("--secret", "bad key=v"), "secret key"),
        (with("--volume-size", "0"), "--volume-size"),
    ];
    for (args, fragment) in cases {
        let output = conformance_binary(args.clone()).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(fragment),
            "{args:?}: stderr lacks {fragment:?}: {stderr}"
        );
    }
}

/// The mock's default capabilities plus the v1.12 `VOLUME_CONDITION` on both sides.
fn with_volume_condition() -> MockPluginBuilder {
    MockPlugin::builder().volume_condition()
}

const CONDITION_CHECKS: [Check; 2] = [Check::ControllerVolumeCondition, Check::NodeVolumeCondition];

/// Runs only the two volume condition checks.
async fn condition_checks(served: &Served) -> Report {
    let suite = Suite::connect(served.options())
        .await
        .expect("the suite can connect to the mock")
        .only(|check| CONDITION_CHECKS.contains(&check));
    tokio::time::timeout(HANG_GUARD, suite.run())
        .await
        .expect("the suite finishes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mock_with_volume_condition_passes_every_check() {
    let served = Served::start(with_volume_condition()).await;
    // Conditions the test set stay in the answers: an abnormal volume is still conformant.
    served
        .plugin
        .set_volume_condition("vol-1", true, "disk detached");
    let report = served.run(served.options()).await;
    assert_no_failures_and_stated_skips(&report);
    for check in CONDITION_CHECKS {
        assert_eq!(
            outcome(&report, check),
            CheckOutcome::Pass,
            "{check}:\n{report}"
        );
    }
    let calls = served.server.calls();
    for rpc in [
        Rpc::ControllerGetVolume,
        Rpc::ListVolumes,
        Rpc::NodeGetVolumeStats,
    ] {
        assert!(calls.count(rpc) > 0, "{} was called", rpc.name());
    }
    assert!(served.plugin.volumes().is_empty(), "volumes left");
    assert!(served.plugin.staged().is_empty() && served.plugin.published().is_empty());
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_condition_checks_are_skipped_where_it_is_not_advertised() {
    // The default mock: neither side advertises VOLUME_CONDITION.
    let served = Served::start(MockPlugin::builder()).await;
    let report = condition_checks(&served).await;
    for (check, side) in [
        (Check::ControllerVolumeCondition, "controller"),
        (Check::NodeVolumeCondition, "node"),
    ] {
        match outcome(&report, check) {
            CheckOutcome::Skip { reason } => assert!(
                reason.contains(&format!(
                    "{side} capability VOLUME_CONDITION not advertised"
                )),
                "{check}: {reason}"
            ),
            other => panic!("{check} should be skipped, got {other:?}\n{report}"),
        }
    }
    served.server.shutdown().await.expect("the mock shuts down");

    // Controller VOLUME_CONDITION with neither GET_VOLUME nor LIST_VOLUMES: nothing reports it.
    let served = Served::start(MockPlugin::builder().controller_capabilities([
        ControllerCapability::CreateDeleteVolume,
        ControllerCapability::VolumeCondition,
    ]))
    .await;
    let report = condition_checks(&served).await;
    match outcome(&report, Check::ControllerVolumeCondition) {
        CheckOutcome::Skip { reason } => assert!(
            reason.contains("GET_VOLUME and LIST_VOLUMES not advertised"),
            "{reason}"
        ),
        other => panic!("expected a skip, got {other:?}\n{report}"),
    }
    served.server.shutdown().await.expect("the mock shuts down");
}

/// Only one of the two rpcs, and only one side: each check looks at what is advertised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_check_covers_list_volumes_alone() {
    let list_only = || {
        MockPlugin::builder().controller_capabilities([
            ControllerCapability::CreateDeleteVolume,
            ControllerCapability::ListVolumes,
            ControllerCapability::VolumeCondition,
        ])
    };
    let served = Served::start(list_only()).await;
    let report = condition_checks(&served).await;
    assert_eq!(
        outcome(&report, Check::ControllerVolumeCondition),
        CheckOutcome::Pass,
        "{report}"
    );
    assert!(
        outcome(&report, Check::NodeVolumeCondition).is_skip(),
        "{report}"
    );
    assert_eq!(served.server.calls().count(Rpc::ControllerGetVolume), 0);
    served.server.shutdown().await.expect("the mock shuts down");

    let served = Served::start(list_only().quirk(Quirk::NoVolumeCondition)).await;
    let report = condition_checks(&served).await;
    match outcome(&report, Check::ControllerVolumeCondition) {
        CheckOutcome::Fail { reason } => assert!(
            reason.contains("ListVolumes listed 1 of 1 entries without status.volume_condition")
                && !reason.contains("ControllerGetVolume"),
            "{reason}"
        ),
        other => panic!("expected a failure, got {other:?}\n{report}"),
    }
    served.server.shutdown().await.expect("the mock shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_omits_the_advertised_condition_fails_the_condition_checks() {
    let served = Served::start(with_volume_condition().quirk(Quirk::NoVolumeCondition)).await;
    let report = served.run(served.options()).await;
    match outcome(&report, Check::ControllerVolumeCondition) {
        CheckOutcome::Fail { reason } => assert!(
            reason.contains("ControllerGetVolume of volume")
                && reason.contains("without status.volume_condition")
                && reason.contains("ListVolumes listed"),
            "both rpcs are named: {reason}"
        ),
        other => panic!("ControllerVolumeCondition should fail, got {other:?}\n{report}"),
    }
    match outcome(&report, Check::NodeVolumeCondition) {
        CheckOutcome::Fail { reason } => assert!(
            reason.contains("NodeGetVolumeStats of volume") && reason.contains("volume_condition"),
            "{reason}"
        ),
        other => panic!("NodeVolumeCondition should fail, got {other:?}\n{report}"),
    }
    // Only the checks the quirk touches fail, and the node check undid its publication.
    let failed: Vec<Check> = report.failures().map(|r| r.check).collect();
    assert_eq!(failed, CONDITION_CHECKS, "{report}");
    assert!(report.cleanup_problems.is_empty(), "{report}");
    assert!(served.plugin.volumes().is_empty(), "volumes left");
    assert!(served.plugin.staged().is_empty() && served.plugin.published().is_empty());
    served.server.shutdown().await.expect("the mock shuts down");
}
