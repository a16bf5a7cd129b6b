//! Long waits and doubtful outcomes under `serve`, read as what they are: a call in flight is
//! shown by `volume status` and logged while it lasts; a volume a failed `CreateVolume` may
//! have made is kept in the volume book, shown, across a restart, until a later create of the
//! id resolves it or `volume deregister` clears it.

use csi_agent::ops::api::VolumeView;
use csi_client::{Code, Rpc};
use csi_testkit::MockPlugin;

use crate::serve::{Serve, cli, eventually, fast_backoff, json, ok_count, one_agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_status_shows_the_call_in_flight_and_the_log_names_it() {
    let mock = MockPlugin::builder().build().expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let _: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    mock.faults().on(Rpc::NodeStageVolume).hang().install();
    let claim_data = data.clone();
    let claim = tokio::spawn(async move {
        cli(&claim_data, &["volume", "claim", "v1", "--workload", "w1"]).await
    });

    let view = eventually("the stage is shown in flight", async || {
        let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
        v.calls_in_flight
            .iter()
            .any(|c| c.rpc == "NodeStageVolume")
            .then_some(v)
    })
    .await;
    let call = &view.calls_in_flight[0];
    assert_eq!(
        (call.rpc.as_str(), call.waiting.as_str(), call.attempt),
        ("NodeStageVolume", "answer", 1),
        "{view:?}"
    );
    assert!(call.attempt_deadline_ms > 0, "{view:?}");
    assert!(
        call.summary.starts_with(&format!(
            "NodeStageVolume volume {}: waiting for the plugin's answer, attempt 1 of ",
            view.external_id
        )),
        "{view:?}"
    );
    let shown = cli(&data, &["volume", "status", "v1"])
        .await
        .expect("status");
    assert!(
        shown.contains(&format!(
            "in flight: NodeStageVolume volume {}",
            view.external_id
        )),
        "{shown}"
    );
    // Logged once it has run a while (5 s), naming the RPC and the volume.
    eventually("the long call is logged", async || {
        let log = one.agent.log();
        log.lines()
            .any(|l| {
                l.contains("plugin call still in flight")
                    && l.contains(&format!("NodeStageVolume volume {}", view.external_id))
            })
            .then_some(())
    })
    .await;

    mock.faults().release_hung();
    let _ = claim.await;
    eventually("no call in flight once it ended", async || {
        let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
        v.calls_in_flight.is_empty().then_some(())
    })
    .await;
}

/// Scripts a `CreateVolume` whose outcome is uncertain (INTERNAL) and whose undo fails
/// (INVALID_ARGUMENT to the `CreateVolume` again by name), then creates `id`.
async fn create_that_may_exist(mock: &MockPlugin, data: &std::path::Path, id: &str) -> String {
    mock.faults()
        .on(Rpc::CreateVolume)
        .fail(Code::Internal, "scripted: backend lost track")
        .fail(Code::InvalidArgument, "scripted: not now")
        .install();
    cli(data, &["volume", "create", id, "--plugin", "mock"])
        .await
        .expect_err("the create was uncertain and not undone")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_that_may_exist_is_kept_across_a_restart_until_resolved_or_cleared() {
    let mock = MockPlugin::builder().build().expect("mock");
    let mut one = one_agent(&mock).await;
    let data = one.data.clone();

    let failed = create_that_may_exist(&mock, &data, "v1").await;
    assert!(
        failed.contains("may be left behind") && failed.contains("kept in the volume book"),
        "{failed}"
    );
    let line = "may exist in plugin mock under name v1 (CreateVolume's outcome is uncertain)";
    let listed = cli(&data, &["volume", "list"]).await.expect("list");
    assert!(listed.contains(line), "{listed}");
    let shown = cli(&data, &["volume", "status", "v1"])
        .await
        .expect("status");
    assert!(shown.contains(line), "{shown}");
    let refused = cli(&data, &["volume", "claim", "v1", "--workload", "w1"])
        .await
        .expect_err("not a volume yet");
    assert!(refused.contains("is not created"), "{refused}");

    // Durable: a restarted agent still shows it.
    one.agent.kill();
    let dir = data.parent().expect("the data dir has a parent").to_owned();
    one.agent = Serve::start(&dir, "agent-2", &data, &fast_backoff(&dir.join("plugins")));
    one.agent.ready().await;
    let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
    let may = v.may_exist.expect("kept across the restart");
    assert_eq!(may.line(), line);
    assert!(may.error.contains("scripted: not now"), "{may:?}");

    // A later create by that name resolves it (CreateVolume by name, DeleteVolume of what
    // it gives), then creates the volume.
    let deletes = ok_count(&mock, Rpc::DeleteVolume);
    let v: VolumeView = eventually("the plugin is back and the create resolves", async || {
        cli(
            &data,
            &["volume", "create", "v1", "--plugin", "mock", "--json"],
        )
        .await
        .ok()
        .and_then(|out| serde_json::from_str::<VolumeView>(&out).ok())
    })
    .await;
    assert!(v.may_exist.is_none(), "{v:?}");
    assert_eq!(ok_count(&mock, Rpc::DeleteVolume), deletes + 1);
    assert_eq!(mock.volumes().len(), 1, "only the new volume");

    // An operator clears one with `volume deregister`.
    create_that_may_exist(&mock, &data, "v2").await;
    let cleared = cli(&data, &["volume", "deregister", "v2"])
        .await
        .expect("deregistered");
    assert!(
        cleared.contains("may exist in plugin mock under name v2"),
        "{cleared}"
    );
    cli(&data, &["volume", "status", "v2"])
        .await
        .expect_err("gone from the book");
}
