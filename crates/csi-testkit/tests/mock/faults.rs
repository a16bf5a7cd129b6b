//! Fault scripts over a real socket: consumed in order then normal service, per volume,
//! delays, hangs against a client deadline, dropped connections.

use std::time::Duration;

use csi_proto::Rpc;
use csi_proto::v1::*;
use csi_testkit::{MockPlugin, RecordedOutcome, Role};
use tonic::Code;

use crate::support::*;

fn unstage(volume: &str) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: "/staging/x".into(),
    }
}

#[tokio::test]
async fn scripted_failures_are_consumed_in_order_then_normal_service() {
    let h = start(MockPlugin::builder().role(Role::Node)).await;
    h.server
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .fail_times(2, Code::Unavailable, "busy")
        .fail(Code::Internal, "boom");
    assert_eq!(h.server.faults().pending(Rpc::NodeUnstageVolume), 3);
    let mut node = h.node();
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(
            node.node_unstage_volume(unstage("vol-1"))
                .await
                .err()
                .map(|s| s.code()),
        );
    }
    assert_eq!(
        codes,
        vec![
            Some(Code::Unavailable),
            Some(Code::Unavailable),
            Some(Code::Internal),
            None
        ]
    );
    assert!(h.server.faults().is_exhausted());
    let calls = h.server.calls();
    calls
        .assert_runs(&[(Rpc::NodeUnstageVolume, 4)])
        .unwrap_or_else(|e| panic!("{e}"));
    let outcomes: Vec<RecordedOutcome> = calls.all().into_iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes[0],
        RecordedOutcome::Failed {
            code: Code::Unavailable,
            message: "busy".into()
        }
    );
    assert_eq!(outcomes[3], RecordedOutcome::Ok);
}

#[tokio::test]
async fn volume_scripts_only_touch_their_volume_and_can_be_added_while_running() {
    let h = start(MockPlugin::builder().role(Role::Node)).await;
    let mut node = h.node();
    node.node_unstage_volume(unstage("vol-1"))
        .await
        .expect("no script yet");
    h.server
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .for_volume("vol-2")
        .fail(Code::Aborted, "vol-2 only")
        .then_delay(Duration::from_millis(1))
        .pass_times(1)
        .fail(Code::DeadlineExceeded, "late");
    node.node_unstage_volume(unstage("vol-1"))
        .await
        .expect("other volumes are untouched");
    let status = node
        .node_unstage_volume(unstage("vol-2"))
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::Aborted, "vol-2 only")
    );
    node.node_unstage_volume(unstage("vol-2"))
        .await
        .expect("delay, then normal");
    node.node_unstage_volume(unstage("vol-2"))
        .await
        .expect("pass");
    let status = node
        .node_unstage_volume(unstage("vol-2"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    node.node_unstage_volume(unstage("vol-2"))
        .await
        .expect("script used up");
    assert_eq!(h.server.calls().for_volume("vol-2").len(), 5);
    assert_eq!(h.server.calls().for_volume("vol-1").len(), 2);
}

#[tokio::test]
async fn a_hang_lasts_until_the_caller_gives_up() {
    let h = start_default().await;
    h.server.faults().on(Rpc::Probe).hang();
    let mut request = tonic::Request::new(ProbeRequest {});
    request.set_timeout(Duration::from_millis(200));
    let status = tokio::time::timeout(GUARD, h.identity().probe(request))
        .await
        .expect("the client deadline ends the call")
        .unwrap_err();
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    h.server
        .calls()
        .wait_for(GUARD, |c| {
            c.records().first().map(|r| &r.outcome) == Some(&RecordedOutcome::Abandoned)
        })
        .await
        .expect("the hung call is logged as abandoned once the caller gave up");
    h.identity()
        .probe(ProbeRequest {})
        .await
        .expect("normal service after the hang");
}

/// Whether the log shows a `rpc` call waiting (recorded, not answered yet).
fn waiting(calls: &csi_testkit::CallList, rpc: Rpc) -> bool {
    calls
        .of(rpc)
        .records()
        .iter()
        .any(|r| r.outcome == RecordedOutcome::InFlight)
}

#[tokio::test]
async fn a_held_call_waits_until_resumed_then_is_served_and_release_ends_a_hold() {
    let h = start_default().await;
    h.server.faults().on(Rpc::Probe).hold().hold();
    let mut identity = h.identity();
    let first = tokio::spawn(async move { identity.probe(ProbeRequest {}).await });
    h.server
        .calls()
        .wait_for(GUARD, |c| waiting(c, Rpc::Probe))
        .await
        .expect("the held call is recorded in flight");
    h.server.faults().resume_held();
    tokio::time::timeout(GUARD, first)
        .await
        .expect("resumed (hang guard)")
        .expect("the task does not panic")
        .expect("a resumed call is served normally");

    // The second hold: ended by release_hung with UNAVAILABLE, as a hang.
    let mut identity = h.identity();
    let second = tokio::spawn(async move { identity.probe(ProbeRequest {}).await });
    h.server
        .calls()
        .wait_for(GUARD, |c| waiting(c, Rpc::Probe))
        .await
        .expect("the second held call is recorded in flight");
    h.server.faults().release_hung();
    let status = tokio::time::timeout(GUARD, second)
        .await
        .expect("released (hang guard)")
        .expect("the task does not panic")
        .expect_err("a released hold fails");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(h.server.faults().is_exhausted());
}

#[tokio::test]
async fn the_control_socket_holds_and_resumes_a_call() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let h = start_default().await;
    let dir = tempfile::tempdir().unwrap();
    let control = h
        .plugin()
        .serve_control(dir.path().join("control.sock"))
        .await
        .unwrap();
    let stream = tokio::net::UnixStream::connect(control.path())
        .await
        .unwrap();
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    write.write_all(b"hold Probe:times=1\n").await.unwrap();
    assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("ok"));
    let mut identity = h.identity();
    let held = tokio::spawn(async move { identity.probe(ProbeRequest {}).await });
    h.server
        .calls()
        .wait_for(GUARD, |c| waiting(c, Rpc::Probe))
        .await
        .expect("the held call is recorded in flight");
    write.write_all(b"resume\n").await.unwrap();
    assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("ok"));
    tokio::time::timeout(GUARD, held)
        .await
        .expect("resumed (hang guard)")
        .expect("the task does not panic")
        .expect("a resumed call is served normally");
    control.shutdown().await;
}

#[tokio::test]
async fn a_dropped_connection_fails_the_call_then_service_resumes() {
    let h = start_default().await;
    h.server.faults().on(Rpc::GetPluginInfo).drop_connection();
    let status = tokio::time::timeout(GUARD, h.identity().get_plugin_info(GetPluginInfoRequest {}))
        .await
        .expect("the call ends when the connection drops")
        .unwrap_err();
    assert!(
        matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Internal
        ),
        "a transport error, got {status:?}"
    );
    assert_eq!(
        h.server.calls().last(Rpc::GetPluginInfo).unwrap().outcome,
        RecordedOutcome::ConnectionDropped
    );
    // The channel reconnects; the script is used up.
    let info = tokio::time::timeout(GUARD, async {
        loop {
            match h.identity().get_plugin_info(GetPluginInfoRequest {}).await {
                Ok(info) => return info.into_inner(),
                // The channel may still hold the dead connection for one more call.
                Err(status) if status.code() == Code::Unavailable => continue,
                Err(status) => panic!("unexpected {status:?}"),
            }
        }
    })
    .await
    .expect("service resumes on a new connection");
    assert_eq!(info.name, "mock.csi.example");
}

#[tokio::test]
async fn a_dropped_connection_frees_its_volume() {
    let h = start(MockPlugin::builder().role(Role::Node)).await;
    h.server
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .for_volume("vol-1")
        .drop_connection();
    let mut node = h.node();
    let status = tokio::time::timeout(GUARD, node.node_unstage_volume(unstage("vol-1")))
        .await
        .expect("the call ends when the connection drops")
        .unwrap_err();
    assert_ne!(status.code(), Code::Ok);
    let answered = tokio::time::timeout(GUARD, async {
        loop {
            match h.node().node_unstage_volume(unstage("vol-1")).await {
                Ok(_) => return,
                Err(status) if status.code() == Code::Unavailable => continue,
                Err(status) => panic!("vol-1 must not stay busy: {status:?}"),
            }
        }
    })
    .await;
    assert!(answered.is_ok(), "the volume is served again");
}

#[tokio::test]
async fn faults_work_in_memory_too() {
    let plugin = MockPlugin::builder().build().unwrap();
    plugin
        .faults()
        .on(Rpc::Probe)
        .fail(Code::FailedPrecondition, "not yet");
    let (server, channel) = plugin.serve_in_memory().await.unwrap();
    let mut identity = csi_proto::v1::identity_client::IdentityClient::new(channel);
    let status = identity.probe(ProbeRequest {}).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(
        identity
            .probe(ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true)
    );
    assert_eq!(server.calls().count(Rpc::Probe), 2);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_script_wins_over_unimplemented_then_unimplemented_again() {
    let h = start(MockPlugin::builder().role(Role::Node)).await;
    h.server
        .faults()
        .on(Rpc::CreateVolume)
        .fail(Code::Internal, "answers anyway");
    let first = code(h.controller().create_volume(create_req("x")).await);
    assert_eq!(first.code(), Code::Internal);
    let second = code(h.controller().create_volume(create_req("x")).await);
    assert_eq!(second.code(), Code::Unimplemented);
}

#[tokio::test]
async fn dropping_an_in_memory_connection_fails_the_call() {
    let plugin = MockPlugin::builder().build().unwrap();
    plugin.faults().on(Rpc::Probe).drop_connection();
    let (server, channel) = plugin.serve_in_memory().await.unwrap();
    let mut identity = csi_proto::v1::identity_client::IdentityClient::new(channel);
    let status = tokio::time::timeout(GUARD, identity.probe(ProbeRequest {}))
        .await
        .expect("the call ends when the pipe is torn down")
        .unwrap_err();
    assert_ne!(status.code(), Code::Ok);
    assert_eq!(
        server.calls().last(Rpc::Probe).unwrap().outcome,
        RecordedOutcome::ConnectionDropped
    );
    let mut fresh =
        csi_proto::v1::identity_client::IdentityClient::new(server.channel().await.unwrap());
    fresh
        .probe(ProbeRequest {})
        .await
        .expect("a new pipe is served");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_control_socket_refuses_an_overlong_line_and_keeps_serving() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let plugin = csi_testkit::MockPlugin::builder().build().unwrap();
    let control = plugin
        .serve_control(dir.path().join("control.sock"))
        .await
        .unwrap();
    let stream = tokio::net::UnixStream::connect(control.path())
        .await
        .unwrap();
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let long = format!("fault {}\n", "x".repeat(10_000));
    write.write_all(long.as_bytes()).await.unwrap();
    let answer = lines.next_line().await.unwrap().unwrap();
    assert!(
        answer.starts_with("error:") && answer.contains("4096"),
        "{answer}"
    );
    write
        .write_all(b"fault DeleteVolume=INTERNAL:times=2\n")
        .await
        .unwrap();
    assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("ok"));
    assert_eq!(plugin.faults().pending(csi_proto::Rpc::DeleteVolume), 2);
    control.shutdown().await;
    assert!(!dir.path().join("control.sock").exists());
}
