//! A volume's secrets through `serve`: read from a file only its owner can read, kept 0600,
//! each call given its own set, and no value in any output, answer, metric or log line.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use csi_agent::ops::api::{ClaimView, StatusView, VolumeView};
use csi_client::{Code, Rpc};
use csi_testkit::{MockPlugin, RecordedOutcome};

use crate::serve::{cli, json, metrics, one_agent, raw_get};
use crate::support::file_with_mode;

/// Planted in every secret value; must appear in no output.
const MARKER: &str = "planted-s3cr3t-7f3a";

fn secrets_file(dir: &Path, name: &str, mode: u32) -> String {
    let text = [
        format!("common-key={MARKER}-common"),
        "[create]".into(),
        format!("create-key={MARKER}-create"),
        "[delete]".into(),
        format!("delete-key={MARKER}-delete"),
        "[validate]".into(),
        format!("validate-key={MARKER}-validate"),
        "[controller-publish]".into(),
        format!("attach-key={MARKER}-attach"),
        "[node-stage]".into(),
        format!("stage-key={MARKER}-stage"),
        "[node-publish]".into(),
        format!("mount-key={MARKER}-mount"),
    ]
    .join("\n");
    file_with_mode(dir, name, &text, mode)
}

/// Every request of `rpc` the mock answered names `own` (and the common key) and no other
/// call's key.
fn sent(mock: &MockPlugin, rpc: Rpc, own: &str) {
    const KEYS: [&str; 6] = [
        "create-key",
        "delete-key",
        "validate-key",
        "attach-key",
        "stage-key",
        "mount-key",
    ];
    let calls = mock.calls().of(rpc);
    let records = calls.records();
    assert!(!records.is_empty(), "no {rpc:?} call");
    for r in records {
        assert!(
            r.request.contains("\"common-key\"") && r.request.contains(&format!("\"{own}\"")),
            "{rpc:?} without its secrets: {}",
            r.request
        );
        for other in KEYS.iter().filter(|k| **k != own) {
            assert!(
                !r.request.contains(other),
                "{rpc:?} got {other}: {}",
                r.request
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_gets_its_secrets_and_no_output_shows_one() {
    let mock = MockPlugin::builder()
        .volume("pre-1", 1 << 20)
        .build()
        .expect("mock");
    let mut one = one_agent(&mock).await;
    let data = one.data.clone();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = secrets_file(dir.path(), "db.secrets", 0o600);
    let open = secrets_file(dir.path(), "open.secrets", 0o644);
    let mut outputs: Vec<String> = Vec::new();

    // A file other users could read is refused, naming it and its mode; nothing is created.
    let refused = cli(
        &data,
        &[
            "volume",
            "create",
            "v0",
            "--plugin",
            "mock",
            "--secrets-file",
            &open,
        ],
    )
    .await
    .expect_err("an exposed secrets file is refused");
    assert!(
        refused.contains("open.secrets") && refused.contains("0644"),
        "{refused}"
    );
    outputs.push(refused);
    assert_eq!(mock.calls().count(Rpc::CreateVolume), 0);

    let created: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "mock",
            "--secrets-file",
            &file,
        ],
    )
    .await;
    assert!(
        created
            .secret_names
            .contains(&"node-stage/stage-key".to_owned()),
        "{created:?}"
    );
    outputs.push(serde_json::to_string(&created).expect("json"));
    let registered = cli(
        &data,
        &[
            "volume",
            "register",
            "v2",
            "--external-id",
            "pre-1",
            "--plugin",
            "mock",
            "--secrets-file",
            &file,
        ],
    )
    .await
    .expect("registered");
    assert!(registered.contains("secrets (names only)"), "{registered}");
    outputs.push(registered);
    let claim: ClaimView = json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    outputs.push(serde_json::to_string(&claim).expect("json"));

    // A failing call's error, through every layer to the operator, carries no value.
    mock.faults()
        .on(Rpc::NodeStageVolume)
        .fail(Code::Unauthenticated, "the secrets were not accepted")
        .install();
    let failed = cli(&data, &["volume", "claim", "v2", "--workload", "w2"])
        .await
        .expect_err("the stage fails");
    assert!(failed.contains("NodeStageVolume"), "{failed}");
    outputs.push(failed);

    for args in [
        &["volume", "status", "--json"][..],
        &["volume", "status"],
        &["volume", "status", "v1", "--json"],
        &["volume", "status", "v1"],
        &["status", "--json"],
        &["status"],
        &["plugin", "list", "--json"],
    ] {
        outputs.push(cli(&data, args).await.expect("read-only command"));
    }
    let token = std::fs::read_to_string(data.join("control.token")).expect("token");
    outputs.push(raw_get(&data, "/v1/volumes", Some(token.trim())));
    let _: VolumeView = json(
        &data,
        &["volume", "release", "v1", "--workload", "w1", "--wait"],
    )
    .await;
    let _: StatusView = json(&data, &["status"]).await;
    crate::serve::eventually("w2's failed claim is released", async || {
        let v: VolumeView = json(&data, &["volume", "status", "v2"]).await;
        v.claims.is_empty().then_some(())
    })
    .await;
    outputs.push(
        cli(&data, &["volume", "delete", "v1"])
            .await
            .expect("deleted"),
    );
    outputs.push(metrics(&data));

    // Each call got the common entries and its own set, nothing else.
    sent(&mock, Rpc::CreateVolume, "create-key");
    sent(&mock, Rpc::ValidateVolumeCapabilities, "validate-key");
    sent(&mock, Rpc::ControllerPublishVolume, "attach-key");
    sent(&mock, Rpc::ControllerUnpublishVolume, "attach-key");
    sent(&mock, Rpc::NodeStageVolume, "stage-key");
    sent(&mock, Rpc::NodePublishVolume, "mount-key");
    sent(&mock, Rpc::DeleteVolume, "delete-key");
    assert!(
        mock.calls()
            .of(Rpc::ControllerUnpublishVolume)
            .records()
            .iter()
            .any(|r| r.outcome == RecordedOutcome::Ok)
    );

    // Kept for later calls, readable by the agent's user only.
    let stored = data.join("volumes.json");
    let mode = std::fs::metadata(&stored)
        .expect("book")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    assert!(
        std::fs::read_to_string(&stored)
            .expect("book")
            .contains(&format!("{MARKER}-stage")),
        "v2's secrets are kept for its later calls"
    );

    assert_eq!(one.agent.terminate(), Some(0));
    outputs.push(one.agent.log());
    for out in &outputs {
        assert!(!out.contains(MARKER), "a secret value was shown:\n{out}");
    }
    assert!(
        outputs
            .last()
            .is_some_and(|log| log.contains("volume registered"))
    );
}
