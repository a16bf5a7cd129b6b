//! Text a plugin chose, with newlines, carriage returns, escape sequences and NULs in it: its
//! `vendor_version`, a volume id and an error message. The operator tables, the error an
//! operator command prints and the agent's log show it escaped, each row and line a line of
//! its own; `--json` keeps it exact.

use csi_agent::ops::api::{PluginView, VolumeView};
use csi_client::{Code, Rpc};
use csi_structs::untrusted::needs_escape;
use csi_testkit::MockPlugin;

use crate::serve::{cli, eventually, json, one_agent};

/// A version that would forge a second row of `plugin list` and clear the screen.
const VERSION: &str = "1.0\nmock2  node-9  healthy  yes  yes\u{1b}[2J\r";
/// A volume id that would forge a row of `volume status` (a command line holds no NUL).
const EXTERNAL: &str = "pre-1\nghost  mock  forged-1\u{1b}[31m";
/// An error message that would forge a log line.
const MESSAGE: &str = "disk on fire\r\n2026-01-01T00:00:00.000000Z  INFO forged: all is well\0";

/// `text` has `lines` lines and no character that could forge another or drive a terminal.
fn clean(text: &str, lines: usize) {
    assert_eq!(text.lines().count(), lines, "{text}");
    assert!(
        !text.chars().any(|c| c != '\n' && needs_escape(c)),
        "{text:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_text_is_escaped_for_people_and_exact_in_json() {
    let mock = MockPlugin::builder()
        .name("mock.csi.example", VERSION)
        .volume(EXTERNAL, 1 << 20)
        .build()
        .expect("mock with an odd version and volume id");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let fingerprinted = eventually("fingerprinted", async || {
        let list: Vec<PluginView> = json(&data, &["plugin", "list"]).await;
        list.into_iter()
            .find(|p| p.id == "mock" && p.fingerprints >= 1)
    })
    .await;
    assert_eq!(
        fingerprinted.version.as_deref(),
        Some(VERSION),
        "JSON is exact"
    );

    let list = cli(&data, &["plugin", "list"]).await.expect("plugin list");
    clean(&list, 2);
    assert!(list.contains(r"1.0\nmock2  node-9"), "{list}");

    let registered = cli(
        &data,
        &[
            "volume",
            "register",
            "pre",
            "--external-id",
            EXTERNAL,
            "--plugin",
            "mock",
        ],
    )
    .await
    .expect("register");
    // The volume's line and "no claims".
    clean(&registered, 2);
    let view: VolumeView = json(&data, &["volume", "status", "pre"]).await;
    assert_eq!(view.external_id, EXTERNAL, "JSON is exact");
    let all = cli(&data, &["volume", "status"])
        .await
        .expect("volume status");
    clean(&all, 2);
    assert!(
        all.contains(r"pre-1\nghost  mock  forged-1\u{1b}[31m"),
        "{all}"
    );

    mock.faults()
        .on(Rpc::NodeStageVolume)
        .fail(Code::FailedPrecondition, MESSAGE)
        .install();
    let refused = cli(&data, &["volume", "claim", "pre", "--workload", "w1"])
        .await
        .expect_err("the plugin refuses to stage");
    clean(&refused, 1);
    assert!(refused.contains(r"disk on fire\r\n2026"), "{refused}");

    let log = eventually("the failure is logged", async || {
        let log = one.agent.log();
        log.contains("disk on fire").then_some(log)
    })
    .await;
    assert!(
        !log.chars().any(|c| c != '\n' && needs_escape(c)),
        "{log:?}"
    );
    assert!(
        !log.lines()
            .any(|l| l.starts_with("2026-01-01T00:00:00.000000Z")),
        "a forged log line: {log}"
    );
}
