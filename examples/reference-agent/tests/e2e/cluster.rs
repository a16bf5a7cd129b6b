//! Cluster mode end to end (feature `etcd`): several `csi-agent serve` processes on one real
//! etcd (csi-testkit's `LocalEtcd`, needs `etcd` on the PATH), one mock plugin instance served
//! to every agent (one cloud: its controller state is shared; each agent stages and publishes
//! under its own data directory).
//!
//! Run with `cargo test -p csi-agent --features etcd --test e2e cluster`.

use std::path::{Path, PathBuf};

use csi_agent::ops::api::{ClaimView, ClusterView, PluginView, StatusView, VolumeView};
use csi_client::Rpc;
use csi_testkit::etcd::LocalEtcd;
use csi_testkit::{MockPlugin, MockServer, Role};

use super::serve::{GUARD, Serve, cli, eventually, fast_backoff, json, ok_count};
use super::support::file_with_mode;

/// One agent of the test cluster.
pub(crate) struct Node {
    pub(crate) agent: Serve,
    pub(crate) data: PathBuf,
    _server: MockServer,
}

/// Starts agent `name` on `etcd`, serving `mock` to it as plugin `mock`.
pub(crate) async fn node(dir: &Path, name: &str, etcd: &LocalEtcd, mock: &MockPlugin) -> Node {
    let plugins = dir.join(format!("{name}-plugins"));
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let server = mock
        .serve_unix(plugins.join("mock.sock"))
        .await
        .expect("mock serves");
    let data = dir.join(name);
    let mut agent = Serve::start(dir, name, &data, &args(dir, name, etcd, &plugins));
    agent.ready().await;
    Node {
        agent,
        data,
        _server: server,
    }
}

pub(crate) fn args(dir: &Path, name: &str, etcd: &LocalEtcd, plugins: &Path) -> Vec<String> {
    let token = dir.join("cluster.token");
    if !token.exists() {
        std::fs::write(&token, "cluster-test-token-0123456789abcdef").expect("token file");
    }
    let mut args: Vec<String> = [
        "--node-id",
        name,
        "--shim-listen",
        "127.0.0.1:0",
        "--cluster-token-file",
        &token.display().to_string(),
        "--store",
        &format!("etcd://{}", etcd.host_ports()),
        "--store-prefix",
        "/e2e",
        "--lease-ttl",
        "2s",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(fast_backoff(plugins));
    args
}

pub(crate) async fn cluster_view(data: &Path) -> ClusterView {
    let status: StatusView = json(data, &["status"]).await;
    status
        .cluster
        .expect("an agent in cluster mode shows its cluster")
}

/// Waits until every agent sees all `n` members and the mock on every node, healthy
/// (nothing is published through a plugin before its first probe answers ready).
pub(crate) async fn converged(nodes: &[&Node], n: usize) {
    for node in nodes {
        eventually("every member sees every member and plugin", async || {
            let c = cluster_view(&node.data).await;
            (c.members.len() == n && c.members.iter().all(|m| m.plugins == ["mock"])).then_some(())
        })
        .await;
        eventually(
            "every member sees the mock healthy on every node",
            async || {
                let list: Vec<PluginView> = json(&node.data, &["plugin", "list"]).await;
                let healthy = list
                    .iter()
                    .filter(|p| p.id == "mock" && p.health == "healthy")
                    .count();
                (healthy == n).then_some(())
            },
        )
        .await;
    }
}

/// One plugin on three nodes: a hosts its controller and a node service (`a-node`), b and c
/// node services with their own plugin node ids (the controller on a attaches to all three).
fn three_node_plugin() -> [MockPlugin; 3] {
    let node_only = |id: &str| {
        MockPlugin::builder()
            .role(Role::Node)
            .node_id(id)
            .build()
            .expect("node mock")
    };
    [
        MockPlugin::builder()
            .node_id("a-node")
            .other_node("b-node")
            .other_node("c-node")
            .build()
            .expect("mock"),
        node_only("b-node"),
        node_only("c-node"),
    ]
}

pub(crate) fn start_etcd() -> LocalEtcd {
    let etcd = LocalEtcd::start(1).expect("etcd on the PATH (Debian: apt-get install etcd-server)");
    etcd.wait_healthy(GUARD).expect("etcd healthy");
    etcd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_share_volumes_and_claims_and_one_writer_wins_every_race() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd();
    let [mock, mock_b, mock_c] = three_node_plugin();
    let a = node(dir.path(), "a", &etcd, &mock).await;
    let b = node(dir.path(), "b", &etcd, &mock_b).await;
    let c = node(dir.path(), "c", &etcd, &mock_c).await;
    converged(&[&a, &b, &c], 3).await;
    let mocks = [&mock, &mock_b, &mock_c];
    let view = cluster_view(&a.data).await;
    assert_eq!(view.prefix, "/e2e");
    assert!(view.store.starts_with("etcd://127.0.0.1:"), "{view:?}");
    assert_eq!(view.members.iter().filter(|m| m.me).count(), 1);
    let duty = eventually("someone holds the controller duty", async || {
        cluster_view(&c.data).await.controller_duty
    })
    .await;
    assert!(["a", "b", "c"].contains(&duty.as_str()), "{duty}");

    // A volume created through a is in every agent's book, once, with its secrets (kept
    // under the prefix: whichever agent attaches or holds the controller duty sends them).
    let secrets = file_with_mode(
        dir.path(),
        "v1.secrets",
        "[controller-publish]\nattach-key=cluster-secret\n",
        0o600,
    );
    let created: VolumeView = json(
        &a.data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "mock",
            "--capacity",
            "1Mi",
            "--secrets-file",
            &secrets,
        ],
    )
    .await;
    for n in [&b, &c] {
        let list: Vec<VolumeView> = json(&n.data, &["volume", "status"]).await;
        let ids: Vec<&str> = list.iter().map(|v| v.id.as_str()).collect();
        assert_eq!(ids, ["v1"], "{list:?}");
        assert_eq!(list[0].external_id, created.external_id);
    }
    let again = cli(&b.data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    assert!(again.is_err_and(|e| e.contains("already registered")));
    assert_eq!(mock.calls().count(Rpc::CreateVolume), 1);

    // Write claims on a single-node-writer volume, raced from all three agents: the claim
    // accounting admits one, and the others are refused before any plugin call.
    let nodes = [&a, &b, &c];
    let mut winners = std::collections::BTreeMap::<String, usize>::new();
    const ROUNDS: usize = 10;
    for round in 0..ROUNDS {
        let workloads: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|n| format!("w{round}-{n}"))
            .collect();
        let claim = |i: usize| {
            let data = nodes[i].data.clone();
            let workload = workloads[i].clone();
            async move {
                cli(
                    &data,
                    &["volume", "claim", "v1", "--workload", &workload, "--json"],
                )
                .await
            }
        };
        let publishes = mock.calls().count(Rpc::ControllerPublishVolume);
        let (ra, rb, rc) = tokio::join!(claim(0), claim(1), claim(2));
        let results = [ra, rb, rc];
        let won: Vec<usize> = (0..3).filter(|i| results[*i].is_ok()).collect();
        assert_eq!(won.len(), 1, "round {round}: {results:?}");
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(
                e.contains("v1") && e.contains("SINGLE_NODE_WRITER") && e.contains("denied"),
                "refused by the claim accounting, naming the volume and its mode: {e}"
            );
        }
        assert_eq!(
            mock.calls().count(Rpc::ControllerPublishVolume),
            publishes + 1,
            "only the winner reached the plugin"
        );
        let w = won[0];
        let view: ClaimView =
            serde_json::from_str(results[w].as_ref().expect("won")).expect("claim view");
        assert_eq!(view.node, ["a", "b", "c"][w]);
        *winners.entry(view.node.clone()).or_default() += 1;
        let released: VolumeView =
            json(&nodes[(w + 1) % 3].data, &["volume", "status", "v1"]).await;
        assert_eq!(released.claims.len(), 1, "every agent sees the claim");
        let done: VolumeView = json(
            &nodes[w].data,
            &[
                "volume",
                "release",
                "v1",
                "--workload",
                &workloads[w],
                "--wait",
            ],
        )
        .await;
        assert!(done.claims.is_empty(), "{done:?}");
    }
    assert_eq!(winners.values().sum::<usize>(), ROUNDS);
    // An expansion through c (the controller is on a) is recorded in etcd: b sees it.
    let expanded: csi_agent::ops::api::ExpandView =
        json(&c.data, &["volume", "expand", "v1", "--capacity", "2Mi"]).await;
    assert!(expanded.controller_expanded && expanded.node_expansion_pending);
    eventually("b sees the new capacity", async || {
        let v: VolumeView = json(&b.data, &["volume", "status", "v1"]).await;
        (v.capacity_bytes == Some(2 << 20) && v.node_expansion_pending).then_some(())
    })
    .await;
    for rpc in [Rpc::ControllerPublishVolume, Rpc::ControllerUnpublishVolume] {
        let calls = mock.calls().of(rpc);
        assert!(calls.records().len() >= ROUNDS, "{rpc:?}");
        for r in calls.records() {
            assert!(
                r.request.contains("\"attach-key\""),
                "{rpc:?}: {}",
                r.request
            );
        }
    }
    for m in mocks {
        assert!(m.published().is_empty() && m.staged().is_empty());
    }

    // A reader-only volume: read claims from every agent succeed.
    let _: VolumeView = json(
        &b.data,
        &[
            "volume",
            "create",
            "ro",
            "--plugin",
            "mock",
            "--access-mode",
            "multi-node-reader-only",
        ],
    )
    .await;
    for (n, name) in nodes.iter().zip(["a", "b", "c"]) {
        let claim: ClaimView = json(
            &n.data,
            &[
                "volume",
                "claim",
                "ro",
                "--workload",
                &format!("r-{name}"),
                "--mode",
                "read",
            ],
        )
        .await;
        assert_eq!(claim.state, "taken");
    }
    let ro: VolumeView = json(&a.data, &["volume", "status", "ro"]).await;
    assert_eq!(ro.claims.len(), 3, "{ro:?}");
    // Claimed from b and c: a refuses to delete it.
    let refused = cli(&a.data, &["volume", "delete", "ro"]).await;
    assert!(refused.is_err_and(|e| e.contains("claim")));
    for (n, name) in nodes.iter().zip(["a", "b", "c"]) {
        let _: VolumeView = json(
            &n.data,
            &[
                "volume",
                "release",
                "ro",
                "--workload",
                &format!("r-{name}"),
                "--wait",
            ],
        )
        .await;
    }
    let _: VolumeView = json(&c.data, &["volume", "delete", "ro"]).await;
    let _: VolumeView = json(&c.data, &["volume", "delete", "v1"]).await;
    eventually("a sees both volumes gone", async || {
        let list: Vec<VolumeView> = json(&a.data, &["volume", "status"]).await;
        list.is_empty().then_some(())
    })
    .await;
    assert!(mock.volumes().is_empty());

    // A fourth agent with b's node id (another data directory) is refused.
    let plugins = dir.path().join("dup-plugins");
    std::fs::create_dir_all(&plugins).expect("dir");
    let mut dup = Serve::start(
        dir.path(),
        "dup",
        &dir.path().join("dup"),
        &args(dir.path(), "b", &etcd, &plugins),
    );
    let log = dup
        .try_ready()
        .await
        .expect_err("a duplicate node id stops the agent");
    assert!(log.contains("node id b is already a member"), "{log}");
    drop((a, b, c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_agent_driving_a_release_another_finishes_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd();
    let mock = MockPlugin::builder().build().expect("mock");
    let mut nodes = [
        node(dir.path(), "a", &etcd, &mock).await,
        node(dir.path(), "b", &etcd, &mock).await,
        node(dir.path(), "c", &etcd, &mock).await,
    ];
    converged(&nodes.iter().collect::<Vec<_>>(), 3).await;
    let duty = eventually("someone holds the controller duty", async || {
        cluster_view(&nodes[0].data).await.controller_duty
    })
    .await;
    let holder = ["a", "b", "c"]
        .iter()
        .position(|n| *n == duty)
        .expect("a member holds the duty");
    // The claim lives on another node: node steps stay with that node's agent.
    let claimer = (holder + 1) % 3;
    let data = nodes[claimer].data.clone();
    let _: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    let claim: ClaimView = json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    assert_eq!(claim.state, "taken");

    // The first ControllerUnpublishVolume never answers: the duty holder dies mid-release.
    mock.faults()
        .on(Rpc::ControllerUnpublishVolume)
        .hang()
        .install();
    let _: VolumeView = json(&data, &["volume", "release", "v1", "--workload", "w1"]).await;
    mock.calls()
        .wait_for(GUARD, |c| c.count(Rpc::ControllerUnpublishVolume) >= 1)
        .await
        .expect("the release reaches ControllerUnpublishVolume");
    nodes[holder].agent.kill();

    // Another agent takes the duty when the dead one's lease runs out, and finishes.
    let freed = eventually("another agent frees the claim", async || {
        let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
        v.claims.is_empty().then_some(v)
    })
    .await;
    assert!(freed.release.is_none(), "{freed:?}");
    let now = cluster_view(&data).await;
    assert_ne!(
        now.controller_duty.as_deref(),
        Some(duty.as_str()),
        "{now:?}"
    );
    assert_eq!(now.members.len(), 2, "the dead agent left: {now:?}");
    let calls = mock.calls();
    assert_eq!(ok_count(&mock, Rpc::NodeUnpublishVolume), 1);
    assert_eq!(ok_count(&mock, Rpc::NodeUnstageVolume), 1);
    assert_eq!(
        calls.count(Rpc::NodeUnpublishVolume),
        1,
        "{:?}",
        calls.rpcs()
    );
    // The call cut off by the kill is repeated once, by the new holder, and succeeds.
    assert_eq!(calls.count(Rpc::ControllerUnpublishVolume), 2);
    assert_eq!(ok_count(&mock, Rpc::ControllerUnpublishVolume), 1);
    assert!(mock.published_nodes(&freed.external_id).is_empty());

    // The killed agent restarts on its data directory and rejoins under its node id.
    let name = ["a", "b", "c"][holder];
    let plugins = dir.path().join(format!("{name}-plugins"));
    let restarted = Serve::start(
        dir.path(),
        &format!("{name}-again"),
        &nodes[holder].data,
        &args(dir.path(), name, &etcd, &plugins),
    );
    nodes[holder].agent = restarted;
    nodes[holder].agent.ready().await;
    converged(&nodes.iter().collect::<Vec<_>>(), 3).await;

    // A clean stop leaves the cluster: its membership is revoked, not left to expire.
    let other = (holder + 2) % 3;
    assert_eq!(nodes[other].agent.terminate(), Some(0));
    let log = nodes[other].agent.log();
    assert!(!log.contains("ERROR"), "{log}");
    eventually("the stopped agent left", async || {
        let c = cluster_view(&nodes[holder].data).await;
        (c.members.len() == 2).then_some(())
    })
    .await;
}

/// A release that waits for a node that is down is not silent: once it has waited the
/// agent's `call_timeout`, `status`, `volume status`, the metrics and the log say what it waits
/// for and since when; when the node comes back the release finishes and the wait is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waiting_for_a_node_that_is_down_says_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd();
    let [mock, mock_b, _] = three_node_plugin();
    let a_plugins = dir.path().join("a-plugins");
    std::fs::create_dir_all(&a_plugins).expect("plugin dir");
    let _a_server = mock
        .serve_unix(a_plugins.join("mock.sock"))
        .await
        .expect("mock serves");
    let a_data = dir.path().join("a");
    let mut a_args = args(dir.path(), "a", &etcd, &a_plugins);
    a_args.extend(["--call-timeout".to_owned(), "2s".to_owned()]);
    let mut a_agent = Serve::start(dir.path(), "a", &a_data, &a_args);
    a_agent.ready().await;
    let mut b = node(dir.path(), "b", &etcd, &mock_b).await;
    eventually("a and b see each other", async || {
        (cluster_view(&a_data).await.members.len() == 2
            && cluster_view(&b.data).await.members.len() == 2)
            .then_some(())
    })
    .await;
    let _: VolumeView = json(&a_data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    let _: ClaimView = json(&b.data, &["volume", "claim", "v1", "--workload", "w-b"]).await;

    // b goes down; its claim's release, asked through a, waits for b's node step.
    b.agent.kill();
    eventually("b's membership ends", async || {
        (cluster_view(&a_data).await.members.len() == 1).then_some(())
    })
    .await;
    let _: VolumeView = json(&a_data, &["volume", "release", "v1", "--workload", "w-b"]).await;
    let status = eventually("a's status shows the waiting release", async || {
        let s: StatusView = json(&a_data, &["status"]).await;
        (!s.waiting.is_empty()).then_some(s)
    })
    .await;
    let w = &status.waiting[0];
    assert_eq!(
        (w.volume.as_str(), w.workload.as_str(), w.node.as_deref()),
        ("v1", "w-b", Some("b"))
    );
    assert!(w.waiting_for.contains("node b is not there"), "{w:?}");
    assert!(w.waited_s >= 2, "past the threshold: {w:?}");
    assert!(
        status.stuck.is_empty(),
        "nothing failed: {:?}",
        status.stuck
    );
    let v: VolumeView = json(&a_data, &["volume", "status", "v1"]).await;
    assert_eq!(v.waiting.len(), 1, "{v:?}");
    let text = cli(&a_data, &["status"]).await.expect("status");
    assert!(text.contains("WAITING RELEASES"), "{text}");
    let page = super::serve::metrics(&a_data);
    assert!(
        page.contains("csi_agent_waiting_releases 1"),
        "the gauge counts it"
    );
    assert!(page.contains("csi_agent_cluster_members "), "{page}");
    assert_eq!(
        a_agent
            .log()
            .matches("release waits: node b is not there")
            .count(),
        1,
        "logged once: {}",
        a_agent.log()
    );

    // b comes back: its node step runs, the release finishes, nothing waits.
    let b_plugins = dir.path().join("b-plugins");
    let mut b_again = Serve::start(
        dir.path(),
        "b-again",
        &b.data,
        &args(dir.path(), "b", &etcd, &b_plugins),
    );
    b_again.ready().await;
    eventually("the release finishes once b is back", async || {
        let v: VolumeView = json(&a_data, &["volume", "status", "v1"]).await;
        v.claims.is_empty().then_some(())
    })
    .await;
    eventually("nothing waits any more", async || {
        let s: StatusView = json(&a_data, &["status"]).await;
        s.waiting.is_empty().then_some(())
    })
    .await;
    assert_eq!(ok_count(&mock_b, Rpc::NodeUnpublishVolume), 1);
    assert_eq!(b_again.terminate(), Some(0));
    assert_eq!(a_agent.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_gone_for_good_is_detached_and_a_stuck_volume_deregistered_by_force() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd();
    let [mock, mock_b, mock_c] = three_node_plugin();
    let a = node(dir.path(), "a", &etcd, &mock).await;
    let mut b = node(dir.path(), "b", &etcd, &mock_b).await;
    let c = node(dir.path(), "c", &etcd, &mock_c).await;
    converged(&[&a, &b, &c], 3).await;
    for v in ["v1", "v2", "v3"] {
        let _: VolumeView = json(&a.data, &["volume", "create", v, "--plugin", "mock"]).await;
    }
    for v in ["v1", "v2"] {
        let _: ClaimView = json(
            &b.data,
            &["volume", "claim", v, "--workload", &format!("{v}-b")],
        )
        .await;
    }
    let _: ClaimView = json(&c.data, &["volume", "claim", "v3", "--workload", "v3-c"]).await;

    // b dies for good, with its two claims.
    b.agent.kill();
    eventually("b's membership ends", async || {
        (cluster_view(&a.data).await.members.len() == 2).then_some(())
    })
    .await;
    let waiting: csi_agent::ops::api::DetachView =
        json(&a.data, &["volume", "detach", "v1", "--node", "b"]).await;
    assert_eq!(waiting.releasing, ["v1-b"]);
    assert!(
        waiting
            .note
            .as_deref()
            .is_some_and(|n| n.contains("--node-gone")),
        "{waiting:?}"
    );

    // Reported gone: the controller step runs without b, for both of b's volumes.
    let out = cli(
        &c.data,
        &[
            "volume",
            "detach",
            "v1",
            "--node",
            "b",
            "--node-gone",
            "--wait",
            "--json",
        ],
    )
    .await
    .expect("detached");
    let gone: csi_agent::ops::api::DetachView = serde_json::from_str(&out).expect("a view");
    assert!(gone.node_gone && gone.volume.claims.is_empty(), "{gone:?}");
    eventually("b's other claim is released too", async || {
        let v: VolumeView = json(&a.data, &["volume", "status", "v2"]).await;
        v.claims.is_empty().then_some(())
    })
    .await;
    let unpublished: Vec<String> = mock
        .calls()
        .of(Rpc::ControllerUnpublishVolume)
        .records()
        .iter()
        .filter(|r| r.outcome == csi_testkit::RecordedOutcome::Ok)
        .filter_map(|r| r.node_id.clone())
        .collect();
    assert_eq!(
        unpublished,
        ["b-node", "b-node"],
        "both attachments to b undone"
    );
    assert_eq!(mock_b.calls().count(Rpc::NodeUnpublishVolume), 0);

    // c's claim is stuck: its node plugin never unpublishes again. Deregistered by force
    // through a, the volume and its claims leave every agent, and nothing is released.
    mock_c
        .faults()
        .on(Rpc::NodeUnpublishVolume)
        .fail_times(100_000, csi_client::Code::Unavailable, "node plugin gone")
        .install();
    let _: VolumeView = json(&c.data, &["volume", "release", "v3", "--workload", "v3-c"]).await;
    eventually("the release is stuck", async || {
        let s: StatusView = json(&c.data, &["status"]).await;
        s.stuck.iter().any(|r| r.volume == "v3").then_some(())
    })
    .await;
    let dropped: csi_agent::ops::api::DeregisterView =
        json(&a.data, &["volume", "deregister", "v3", "--force", "--yes"]).await;
    assert_eq!(dropped.dropped_claims, 1);
    for n in [&a, &c] {
        eventually("v3 and its stuck release are gone", async || {
            let s: StatusView = json(&n.data, &["status"]).await;
            let listed = cli(&n.data, &["volume", "status", "v3"]).await.is_ok();
            (s.stuck.is_empty() && !listed).then_some(())
        })
        .await;
    }
    let unpublishes = mock.calls().count(Rpc::ControllerUnpublishVolume);

    // b comes back on its data directory: no longer gone, it may claim again.
    let plugins = dir.path().join("b-plugins");
    b.agent = Serve::start(
        dir.path(),
        "b-again",
        &b.data,
        &args(dir.path(), "b", &etcd, &plugins),
    );
    b.agent.ready().await;
    converged(&[&a, &b, &c], 3).await;
    // Its claims were freed meanwhile: the mounts it held are released at its start.
    let reconciled = eventually("b confirmed its restored records", async || {
        let s: StatusView = json(&b.data, &["status"]).await;
        s.reconcile
    })
    .await;
    let released: Vec<(&str, &str, &str)> = reconciled
        .released_while_gone
        .iter()
        .map(|r| (r.volume.as_str(), r.workload.as_str(), r.claim.as_str()))
        .collect();
    assert_eq!(
        released,
        [("v1", "v1-b", "freed"), ("v2", "v2-b", "freed")],
        "{reconciled:?}"
    );
    assert!(mock_b.staged().is_empty() && mock_b.published().is_empty());
    let _: VolumeView = json(&a.data, &["volume", "create", "v4", "--plugin", "mock"]).await;
    let again: ClaimView = json(&b.data, &["volume", "claim", "v4", "--workload", "v4-b"]).await;
    assert_eq!(again.state, "taken");
    assert_eq!(
        mock.calls().count(Rpc::ControllerUnpublishVolume),
        unpublishes
    );
}

/// An agent killed holding a claim, reported gone for good while its node still has the
/// volume staged and published: the plugin refuses the controller step (`FAILED_PRECONDITION`,
/// retried at the backoff's cap) until the agent comes back. At its start it releases what it
/// held (its claim was released while it was reported gone), the release completes, and its
/// `status` says what it released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reported_gone_that_comes_back_releases_its_mounts_and_the_release_completes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd();
    // One storage model on two nodes: its controller refuses to unpublish a volume from a
    // node that still has it staged or published.
    let mock = MockPlugin::builder()
        .node_id("a-node")
        .build()
        .expect("mock");
    let mock_b = mock.as_node("b-node").expect("the mock as b-node");
    let mut a = node(dir.path(), "a", &etcd, &mock).await;
    let b = node(dir.path(), "b", &etcd, &mock_b).await;
    converged(&[&a, &b], 2).await;
    let created: VolumeView = json(&b.data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    let claim: ClaimView = json(&a.data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    assert_eq!(claim.state, "taken");
    assert_eq!(
        (mock.staged().len(), mock.published().len()),
        (1, 1),
        "staged and published on a-node"
    );

    // a dies; b reports it gone for good and detaches its claim.
    a.agent.kill();
    eventually("a's membership ends", async || {
        (cluster_view(&b.data).await.members.len() == 1).then_some(())
    })
    .await;
    let gone: csi_agent::ops::api::DetachView = json(
        &b.data,
        &["volume", "detach", "v1", "--node", "a", "--node-gone"],
    )
    .await;
    assert!(gone.node_gone && gone.releasing == ["w1"], "{gone:?}");
    mock.calls()
        .wait_for(GUARD, |c| c.count(Rpc::ControllerUnpublishVolume) >= 1)
        .await
        .expect("the duty holder tries the controller step");
    assert_eq!(
        ok_count(&mock, Rpc::ControllerUnpublishVolume),
        0,
        "refused while a-node has the volume"
    );
    let stuck: VolumeView = json(&b.data, &["volume", "status", "v1"]).await;
    assert_eq!(stuck.claims.len(), 1, "{stuck:?}");

    // a comes back on its data directory.
    let plugins = dir.path().join("a-plugins");
    a.agent = Serve::start(
        dir.path(),
        "a-again",
        &a.data,
        &args(dir.path(), "a", &etcd, &plugins),
    );
    a.agent.ready().await;
    eventually("the release completes", async || {
        let v: VolumeView = json(&b.data, &["volume", "status", "v1"]).await;
        (v.claims.is_empty() && v.release.is_none()).then_some(())
    })
    .await;
    assert!(mock.staged().is_empty() && mock.published().is_empty());
    assert!(mock.published_nodes(&created.external_id).is_empty());
    assert_eq!(ok_count(&mock, Rpc::ControllerUnpublishVolume), 1);

    // a's status says what it released, and why.
    let reconciled = eventually("a confirmed its restored records", async || {
        let s: StatusView = json(&a.data, &["status"]).await;
        s.reconcile
    })
    .await;
    let [released] = reconciled.released_while_gone.as_slice() else {
        panic!("one publication released: {reconciled:?}");
    };
    assert_eq!(
        (released.volume.as_str(), released.workload.as_str()),
        ("v1", "w1")
    );
    assert_eq!(released.done, "unpublished and unstaged");
    // Resumed by a's record, or already done by b's own retry a moment before it.
    assert!(
        ["controller_step_resumed", "controller_step_done"].contains(&released.claim.as_str()),
        "{released:?}"
    );
    let text = cli(&a.data, &["status"]).await.expect("status");
    assert!(
        text.contains("RELEASED WHILE THIS NODE WAS REPORTED GONE"),
        "{text}"
    );
}
