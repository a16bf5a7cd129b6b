//! The `csi-mock-plugin` binary: exit codes, serving a real client, clean stop on SIGTERM.

use std::process::{Command, Stdio};
use std::time::Duration;

use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::{GetPluginInfoRequest, ProbeRequest};

use crate::support::GUARD;

const BIN: &str = env!("CARGO_BIN_EXE_csi-mock-plugin");

#[test]
fn a_bad_flag_exits_2() {
    let out = Command::new(BIN)
        .args(["--endpoint", "unix:///tmp/x.sock", "--no-such-flag"])
        .env_remove("CSI_ENDPOINT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
    let out = Command::new(BIN)
        .args([
            "--endpoint",
            "unix:///tmp/x.sock",
            "--controller-caps",
            "TELEPORT",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TELEPORT"));
}

#[test]
fn an_endpoint_that_is_not_a_unix_socket_exits_2() {
    for endpoint in [
        "tcp://127.0.0.1:9000",
        "unix://relative.sock",
        "/abs/no-scheme.sock",
    ] {
        let out = Command::new(BIN)
            .args(["--endpoint", endpoint])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{endpoint}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("unix"), "{endpoint}: {stderr}");
    }
    let out = Command::new(BIN)
        .env_remove("CSI_ENDPOINT")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "a missing endpoint is a usage error"
    );
}

#[tokio::test]
async fn role_both_is_also_named_controller_and_node() {
    use csi_proto::v1::controller_client::ControllerClient;
    use csi_proto::v1::node_client::NodeClient;
    use csi_proto::v1::{ControllerGetCapabilitiesRequest, NodeGetInfoRequest};
    // `both` is the library's `Role::ControllerAndNode`; the binary takes either name.
    for role in ["both", "controller-and-node"] {
        let dir = tempfile::tempdir().unwrap();
        let running = Running::start(dir.path(), &["--role", role]).await;
        let channel = running.channel().await;
        ControllerClient::new(channel.clone())
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await
            .unwrap_or_else(|e| panic!("--role {role}: no controller service: {e}"));
        NodeClient::new(channel)
            .node_get_info(NodeGetInfoRequest {})
            .await
            .unwrap_or_else(|e| panic!("--role {role}: no node service: {e}"));
    }
}

#[tokio::test]
async fn serves_from_csi_endpoint_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let mut child = Command::new(BIN)
        .env("CSI_ENDPOINT", format!("unix://{}", path.display()))
        .args(["--name", "bin.mock.example", "--role", "node"])
        .args(["--quirk", "probe-not-ready"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let info = tokio::time::timeout(GUARD, async {
        loop {
            if let Ok(channel) = csi_testkit::transport::connect_unix(&path).await {
                let mut identity = IdentityClient::new(channel);
                if let Ok(info) = identity.get_plugin_info(GetPluginInfoRequest {}).await {
                    return info.into_inner();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the binary starts serving");
    assert_eq!(info.name, "bin.mock.example");
    let channel = csi_testkit::transport::connect_unix(&path).await.unwrap();
    let probe = IdentityClient::new(channel)
        .probe(ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(false), "--quirk reaches the plugin");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(GUARD, async {
        loop {
            if let Some(exit) = child.try_wait().unwrap() {
                return exit;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the binary stops on SIGTERM");
    assert_eq!(exit.code(), Some(0));
    assert!(!path.exists(), "the socket is removed");
}

/// A `csi-mock-plugin` child serving on `<dir>/csi.sock`, killed if the test ends early.
pub(crate) struct Running {
    child: std::process::Child,
    pub(crate) socket: std::path::PathBuf,
}

impl Running {
    /// Starts the binary with `args` and waits (hang guard only) until Probe answers.
    pub(crate) async fn start(dir: &std::path::Path, args: &[&str]) -> Running {
        let socket = dir.join("csi.sock");
        let child = Command::new(BIN)
            .env_remove("CSI_ENDPOINT")
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary starts");
        let running = Running { child, socket };
        tokio::time::timeout(GUARD, async {
            loop {
                if let Ok(channel) = csi_testkit::transport::connect_unix(&running.socket).await
                    && IdentityClient::new(channel)
                        .probe(ProbeRequest {})
                        .await
                        .is_ok()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the binary starts serving");
        running
    }

    pub(crate) async fn channel(&self) -> tonic::transport::Channel {
        csi_testkit::transport::connect_unix(&self.socket)
            .await
            .expect("the binary serves its socket")
    }

    /// SIGTERM, then the exit code.
    pub(crate) async fn stop(mut self) -> Option<i32> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        tokio::time::timeout(GUARD, async {
            loop {
                if let Some(exit) = self.child.try_wait().expect("wait for the child") {
                    return exit.code();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the binary stops on SIGTERM")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn capability_lists_reach_the_plugin() {
    use csi_proto::v1::controller_client::ControllerClient;
    let dir = tempfile::tempdir().unwrap();
    let running = Running::start(
        dir.path(),
        &[
            "--controller-caps",
            "create_delete_volume,MODIFY-VOLUME",
            "--node-caps",
            "none",
            "--mutable-parameter-key",
            "iops",
        ],
    )
    .await;
    let mut controller = ControllerClient::new(running.channel().await);
    let caps = crate::support::controller_rpcs(&mut controller).await;
    assert_eq!(
        caps,
        [
            csi_testkit::ControllerCapability::CreateDeleteVolume as i32,
            csi_testkit::ControllerCapability::ModifyVolume as i32
        ]
    );
    assert_eq!(running.stop().await, Some(0));
}

async fn create_volume(running: &Running, name: &str) -> String {
    use csi_proto::v1::controller_client::ControllerClient;
    let mut request = crate::support::create_req(name);
    request.capacity_range = None;
    ControllerClient::new(running.channel().await)
        .create_volume(request)
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume")
        .volume_id
}

async fn volume_ids(running: &Running) -> Vec<String> {
    use csi_proto::v1::ListVolumesRequest;
    use csi_proto::v1::controller_client::ControllerClient;
    ControllerClient::new(running.channel().await)
        .list_volumes(ListVolumesRequest::default())
        .await
        .expect("ListVolumes")
        .into_inner()
        .entries
        .into_iter()
        .filter_map(|e| e.volume.map(|v| v.volume_id))
        .collect()
}

#[tokio::test]
async fn a_restart_with_a_state_file_keeps_the_volumes_and_without_one_never_reuses_ids() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("mock-state.json");
    let state_arg = state.to_str().unwrap();
    let first = Running::start(dir.path(), &["--state-file", state_arg]).await;
    let kept = create_volume(&first, "kept").await;
    assert_eq!(first.stop().await, Some(0));
    let second = Running::start(dir.path(), &["--state-file", state_arg]).await;
    assert_eq!(volume_ids(&second).await, std::slice::from_ref(&kept));
    let added = create_volume(&second, "added").await;
    assert_ne!(added, kept);
    assert_eq!(second.stop().await, Some(0));

    let plain = tempfile::tempdir().unwrap();
    let first = Running::start(plain.path(), &[]).await;
    let one = create_volume(&first, "data").await;
    assert_eq!(first.stop().await, Some(0));
    let second = Running::start(plain.path(), &[]).await;
    assert!(
        volume_ids(&second).await.is_empty(),
        "no state file, no memory"
    );
    let two = create_volume(&second, "data").await;
    assert_ne!(one, two, "a restarted mock hands out new ids");
    assert_eq!(second.stop().await, Some(0));
}

#[test]
fn a_damaged_state_file_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    std::fs::write(&state, "not json").unwrap();
    let out = Command::new(BIN)
        .arg("--endpoint")
        .arg(format!("unix://{}", dir.path().join("csi.sock").display()))
        .arg("--state-file")
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&*state.to_string_lossy()) && stderr.contains("damaged"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Sends one control command and reads the answer up to its final `ok` or `error:` line.
async fn control(socket: &std::path::Path, command: &str) -> Vec<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .expect("the control socket accepts");
    stream
        .write_all(format!("{command}\n").as_bytes())
        .await
        .unwrap();
    let mut lines = BufReader::new(stream).lines();
    let mut answer = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        let last = line == "ok" || line.starts_with("error:");
        answer.push(line);
        if last {
            break;
        }
    }
    answer
}

#[tokio::test]
async fn a_command_line_fault_shows_in_the_client_error_and_the_call_log() {
    use csi_proto::v1::NodeUnpublishVolumeRequest;
    use csi_proto::v1::node_client::NodeClient;
    let dir = tempfile::tempdir().unwrap();
    let control_socket = dir.path().join("control.sock");
    let control_arg = format!("unix://{}", control_socket.display());
    let running = Running::start(
        dir.path(),
        &[
            "--role",
            "node",
            "--fault",
            "NodeUnpublishVolume=UNAVAILABLE:times=3",
            "--control",
            &control_arg,
        ],
    )
    .await;
    let mut node = NodeClient::new(running.channel().await);
    let unpublish = || NodeUnpublishVolumeRequest {
        volume_id: "vol-1".into(),
        target_path: "/var/lib/csi/pods/a/mount".into(),
    };
    for _ in 0..3 {
        let status = node.node_unpublish_volume(unpublish()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status.message().contains("fault injected")
                && status
                    .message()
                    .contains("NodeUnpublishVolume=UNAVAILABLE:times=3"),
            "{}",
            status.message()
        );
    }
    node.node_unpublish_volume(unpublish())
        .await
        .expect("the fault is used up after three calls");

    let calls = control(&control_socket, "calls").await;
    let unpublishes: Vec<&String> = calls
        .iter()
        .filter(|l| l.contains(" NodeUnpublishVolume "))
        .collect();
    assert_eq!(unpublishes.len(), 4, "{calls:?}");
    for line in &unpublishes[..3] {
        assert!(line.contains("FAILED UNAVAILABLE"), "{line}");
        assert!(line.ends_with("volume=vol-1"), "{line}");
    }
    assert!(unpublishes[3].contains(" OK"), "{}", unpublishes[3]);
    assert_eq!(calls.last().map(String::as_str), Some("ok"));

    // At run time: one more failure, then a bad command is refused by name.
    assert_eq!(
        control(&control_socket, "fault NodeUnpublishVolume=ABORTED:times=1").await,
        ["ok"]
    );
    let status = node.node_unpublish_volume(unpublish()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Aborted);
    node.node_unpublish_volume(unpublish()).await.unwrap();
    let refused = control(&control_socket, "fault NodeUnpublishVolume=SOMETIMES").await;
    assert!(
        refused.len() == 1 && refused[0].contains("SOMETIMES"),
        "{refused:?}"
    );
    assert_eq!(running.stop().await, Some(0));
    assert!(!control_socket.exists(), "the control socket is removed");
}

#[test]
fn a_bad_fault_flag_exits_2_naming_the_part() {
    for (flag, spec, needle) in [
        ("--fault", "NodeUnpublishVolume=SOMETIMES", "SOMETIMES"),
        ("--fault", "Teleport=INTERNAL", "Teleport"),
        ("--delay", "CreateVolume=5", "duration"),
        ("--hang", "DeleteVolume:times=-1", "times"),
    ] {
        let out = Command::new(BIN)
            .args(["--endpoint", "unix:///tmp/never.sock", flag, spec])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{spec}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{spec}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

async fn ten_probes(running: &Running) {
    let mut identity = IdentityClient::new(running.channel().await);
    for _ in 0..10 {
        identity.probe(ProbeRequest {}).await.expect("Probe");
    }
}

/// The numbers of a control socket's `log` answer: limit, kept, evicted, received.
fn log_numbers(answer: &[String]) -> (String, u64, u64, u64) {
    assert_eq!(answer.last().map(String::as_str), Some("ok"), "{answer:?}");
    let line = answer[0].strip_prefix("log ").expect("a log line");
    let field = |name: &str| {
        line.split(' ')
            .find_map(|part| part.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .to_owned()
    };
    let number = |name: &str| field(name).parse::<u64>().expect("a number");
    (
        field("limit"),
        number("kept"),
        number("evicted"),
        number("received"),
    )
}

#[tokio::test]
async fn the_call_log_is_bounded_by_default_and_by_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let control_socket = dir.path().join("control.sock");
    let control_arg = format!("unix://{}", control_socket.display());

    // Default: 10,000 records at most.
    let running = Running::start(dir.path(), &["--control", &control_arg]).await;
    ten_probes(&running).await;
    let (limit, kept, evicted, received) = log_numbers(&control(&control_socket, "log").await);
    assert_eq!(limit, "10000");
    assert!(received >= 10 && kept == received && evicted == 0);
    assert_eq!(running.stop().await, Some(0));

    // A limit of 3: only the last three calls are kept, the rest are counted.
    let running = Running::start(
        dir.path(),
        &["--control", &control_arg, "--call-log-limit", "3"],
    )
    .await;
    ten_probes(&running).await;
    let (limit, kept, evicted, received) = log_numbers(&control(&control_socket, "log").await);
    assert_eq!((limit.as_str(), kept), ("3", 3));
    assert!(received >= 10, "{received}");
    assert_eq!(evicted, received - 3);
    let calls = control(&control_socket, "drain").await;
    let seqs: Vec<u64> = calls
        .iter()
        .filter_map(|l| l.strip_prefix("call "))
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        seqs,
        [received - 3, received - 2, received - 1],
        "{calls:?}"
    );
    assert_eq!(control(&control_socket, "calls").await, ["ok"], "drained");
    assert_eq!(running.stop().await, Some(0));

    // 0: no record at all.
    let running = Running::start(
        dir.path(),
        &["--control", &control_arg, "--call-log-limit", "0"],
    )
    .await;
    ten_probes(&running).await;
    let (limit, kept, evicted, received) = log_numbers(&control(&control_socket, "log").await);
    assert_eq!((limit.as_str(), kept), ("0", 0));
    assert!(received >= 10 && evicted == received);
    assert_eq!(control(&control_socket, "calls").await, ["ok"]);
    assert_eq!(running.stop().await, Some(0));

    for bad in ["--call-log-limit=-1", "--call-log-limit=lots"] {
        let out = Command::new(BIN)
            .args(["--endpoint", "unix:///tmp/never.sock", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--call-log-limit"), "{bad}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[tokio::test]
async fn volume_conditions_from_the_control_socket_and_the_quirk_flag() {
    use csi_proto::v1::ControllerGetVolumeRequest;
    use csi_proto::v1::controller_client::ControllerClient;
    async fn reported(running: &Running, volume_id: &str) -> Option<(bool, String)> {
        ControllerClient::new(running.channel().await)
            .controller_get_volume(ControllerGetVolumeRequest {
                volume_id: volume_id.into(),
            })
            .await
            .expect("ControllerGetVolume")
            .into_inner()
            .status
            .and_then(|s| s.volume_condition)
            .map(|c| (c.abnormal, c.message))
    }
    let caps = "CREATE_DELETE_VOLUME,GET_VOLUME,VOLUME_CONDITION";
    let dir = tempfile::tempdir().unwrap();
    let control_socket = dir.path().join("control.sock");
    let control_arg = format!("unix://{}", control_socket.display());
    let running = Running::start(
        dir.path(),
        &["--controller-caps", caps, "--control", &control_arg],
    )
    .await;
    let volume = create_volume(&running, "data").await;
    assert_eq!(
        reported(&running, &volume).await,
        Some((false, String::new()))
    );
    let set = format!("condition {volume} abnormal disk detached");
    assert_eq!(control(&control_socket, &set).await, ["ok"]);
    assert_eq!(
        reported(&running, &volume).await,
        Some((true, "disk detached".into()))
    );
    let clear = format!("condition {volume} clear");
    assert_eq!(control(&control_socket, &clear).await, ["ok"]);
    assert_eq!(
        reported(&running, &volume).await,
        Some((false, String::new()))
    );
    let refused = control(&control_socket, &format!("condition {volume} sideways")).await;
    assert!(
        refused.len() == 1 && refused[0].contains("sideways"),
        "{refused:?}"
    );
    assert_eq!(running.stop().await, Some(0));

    let dir = tempfile::tempdir().unwrap();
    let running = Running::start(
        dir.path(),
        &["--controller-caps", caps, "--quirk", "no-volume-condition"],
    )
    .await;
    let volume = create_volume(&running, "data").await;
    assert_eq!(
        reported(&running, &volume).await,
        None,
        "the quirk omits it"
    );
    assert_eq!(running.stop().await, Some(0));
}

#[tokio::test]
async fn a_required_secret_flag_refuses_calls_without_it() {
    use csi_proto::v1::controller_client::ControllerClient;
    let dir = tempfile::tempdir().unwrap();
    let running = Running::start(
        dir.path(),
        &["--require-secret", "createvolume:token=S3CR3T-FLAG-VALUE"],
    )
    .await;
    let mut controller = ControllerClient::new(running.channel().await);
    let mut request = crate::support::create_req("a");
    request.capacity_range = None;
    let refused = controller.create_volume(request.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(refused.message(), r#"CreateVolume: missing secret "token""#);
    request
        .secrets
        .insert("token".into(), "S3CR3T-FLAG-VALUE".into());
    controller
        .create_volume(request)
        .await
        .expect("the secret is there");
    assert_eq!(running.stop().await, Some(0));
}

#[test]
fn a_bad_required_secret_flag_exits_2_without_quoting_the_value() {
    const VALUE: &str = "S3CR3T-FLAG-VALUE";
    for (spec, needle) in [
        (
            format!("NodeUnpublishVolume:token={VALUE}"),
            "NodeUnpublishVolume",
        ),
        (
            format!("NodeStageVolume:bad key={VALUE}"),
            "NodeStageVolume",
        ),
        (VALUE.to_string(), "RPC:KEY=VALUE"),
        (format!("{VALUE}:token=x"), "unknown rpc"),
    ] {
        let out = Command::new(BIN)
            .args([
                "--endpoint",
                "unix:///tmp/never.sock",
                "--require-secret",
                &spec,
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{needle}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{needle}: {stderr}");
        assert!(!stderr.contains(VALUE), "the value leaked: {stderr}");
    }
}
