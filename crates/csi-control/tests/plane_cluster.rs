//! The front door in cluster mode: two `ControlPlane`s opened with
//! `ControlPlaneBuilder::cluster` on one real etcd (Debian's `etcd-server`, started by
//! csi-testkit's `LocalEtcd` on loopback), each node with its own directory, its routing served
//! on loopback, and its own view of one storage model (csi-testkit's mock, served as plugin node
//! `node-1` to `a` and, through `MockPlugin::as_node`, as `node-2` to `b`). The embedder's code
//! is the open call and serving the routing; the membership, the controller duty and the other
//! members' routes come with the front door. Run with `cargo test -p csi-control --features
//! etcd`. Waits are bounded hang guards, never timing assertions.
#![cfg(feature = "etcd")]

use std::path::Path;
use std::time::Duration;

use csi_claims::ClaimMode;
use csi_claims::DenyReason;
use csi_client::{Endpoint, Rpc};
use csi_control::service::{ClaimVolume, DetachVolume, NewVolume, WhileGone};
use csi_control::stores::EtcdConfig;
use csi_control::{ClusterSettings, ControlPlane, Peers, ServiceError};
use csi_rpc_shim::Token;
use csi_structs::{AccessMode, NodeId, PluginId, VolumeId, WorkloadId};
use csi_testkit::etcd::LocalEtcd;
use csi_testkit::{MockPlugin, MockServer};
use tokio::sync::oneshot;

/// The hang guard of every wait.
const GUARD: Duration = Duration::from_secs(30);

fn plugin() -> PluginId {
    PluginId::new("mock").expect("plugin id")
}

/// One node: its control plane, its served routing and its view of the storage.
struct Member {
    plane: ControlPlane,
    stop_routing: oneshot::Sender<()>,
    routing: tokio::task::JoinHandle<()>,
    mock: MockPlugin,
    _server: MockServer,
}

impl Member {
    /// Opens node `me` in `<root>/<me>` as a member of the cluster on `etcd`, serves its
    /// routing on loopback, serves `mock` beside it and registers it.
    async fn open(root: &Path, me: &str, etcd: &LocalEtcd, mock: MockPlugin) -> Member {
        let store = EtcdConfig {
            endpoints: etcd.endpoints(),
            prefix: "/plane-test".into(),
            ca_file: None,
            identity: None,
            user: None,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let advertise = listener.local_addr().expect("address").to_string();
        let token = Token::new("a-cluster-token-of-the-test-0123").expect("token");
        let mut settings = ClusterSettings::new(store, token, advertise);
        settings.follow_interval = Duration::from_millis(100);
        let plane = ControlPlane::builder(root.join(me), NodeId::new(me).expect("node id"))
            .cluster(settings)
            .open()
            .await
            .expect("the control plane opens as a cluster member");
        assert!(
            plane.store_description().starts_with("etcd://"),
            "{}",
            plane.store_description()
        );
        let shim = plane.service().shim().clone();
        let (stop_routing, stopped) = oneshot::channel::<()>();
        let routing = tokio::spawn(async move {
            let stopped = async {
                let _ = stopped.await;
            };
            shim.serve(listener, stopped).await.expect("routing served");
        });
        let socket = root.join(format!("{me}.sock"));
        let server = mock.serve_unix(&socket).await.expect("the mock serves");
        plane
            .register_plugin(plugin(), Endpoint::unix(&socket).expect("endpoint"))
            .await
            .expect("registered");
        plane
            .wait_for_plugin(&plugin(), GUARD)
            .await
            .expect("fingerprinted and healthy (hang guard)");
        Member {
            plane,
            stop_routing,
            routing,
            mock,
            _server: server,
        }
    }

    async fn close(self) {
        let _ = self.stop_routing.send(());
        self.routing.await.expect("routing stopped");
        self.plane.close().await.expect("closes");
    }
}

fn volume() -> VolumeId {
    VolumeId::new("shared-vol").expect("volume id")
}

fn workload(id: &str) -> WorkloadId {
    WorkloadId::new(id).expect("workload id")
}

/// The calls that would publish a volume, sent to the storage model by either node.
fn publish_calls(mock: &MockPlugin) -> usize {
    let calls = mock.calls();
    [
        Rpc::ControllerPublishVolume,
        Rpc::NodeStageVolume,
        Rpc::NodePublishVolume,
    ]
    .into_iter()
    .map(|rpc| calls.count(rpc))
    .sum()
}

/// Polls `done` every 20 ms until it holds, panicking with `what` after the hang guard.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let until = tokio::time::Instant::now() + GUARD;
    while !done() {
        assert!(tokio::time::Instant::now() < until, "hang guard: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two nodes opened as cluster members know each other (members, plugins, routes); a volume
/// created through one node's front door is in the other's catalog; its claims are shared, so
/// the other node's claim is refused before any plugin call while the first holds it, and
/// admitted once the first released it, the controller step done by whichever holds the duty
/// through its routing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cluster_members_know_each_other_and_share_the_catalog_and_the_claims() {
    let etcd = LocalEtcd::start(1).expect("etcd on the PATH (Debian: apt-get install etcd-server)");
    etcd.wait_healthy(GUARD).expect("etcd healthy (hang guard)");
    let dir = tempfile::tempdir().expect("temp dir");
    let first = MockPlugin::builder()
        .node_id("node-1")
        .build()
        .expect("mock");
    let second = first.as_node("node-2").expect("the mock as node-2");
    let a = Member::open(dir.path(), "a", &etcd, first).await;
    let b = Member::open(dir.path(), "b", &etcd, second).await;
    // Each knows the other from the member records: a live member with its plugin.
    for (member, other) in [(&a, "b"), (&b, "a")] {
        let other = NodeId::new(other).expect("node id");
        eventually("each member reports the other's plugin", || {
            member
                .plane
                .peers()
                .reports()
                .get(&other)
                .is_some_and(|r| r.reachable && r.plugins.iter().any(|p| p.id == "mock"))
        })
        .await;
        assert_eq!(member.plane.peers().reachable(&other), Some(true));
        assert!(member.plane.peers().shares_claims());
    }
    let members = a.plane.membership().expect("a member").members();
    assert_eq!(members.len(), 2, "{members:?}");

    let mut new = NewVolume::new(volume(), plugin(), AccessMode::SingleNodeWriter);
    new.capacity_bytes = 1 << 20;
    let entry = a.plane.service().create(new).await.expect("created on a");
    let external = entry.external_id.as_str();
    eventually("b's catalog shows the volume created on a", || {
        b.plane.service().catalog().get(&volume()).is_some()
    })
    .await;

    a.plane
        .service()
        .claim(ClaimVolume::new(
            volume(),
            workload("w-a"),
            ClaimMode::Write,
        ))
        .await
        .expect("a claims");
    assert_eq!(a.mock.published_nodes(external), vec!["node-1".to_owned()]);
    let calls_before = publish_calls(&b.mock);
    match b
        .plane
        .service()
        .claim(ClaimVolume::new(
            volume(),
            workload("w-b"),
            ClaimMode::Write,
        ))
        .await
    {
        Err(ServiceError::Denied(denied)) => {
            // The holder is a's claim, known to b through the shared store.
            assert!(
                matches!(
                    denied.reason,
                    DenyReason::SingleWorkload | DenyReason::OtherNode { .. }
                ),
                "{denied}"
            );
            assert!(denied.to_string().contains("w-a (write on a"), "{denied}");
        }
        other => panic!("b's claim must be refused while a holds the volume: {other:?}"),
    }
    assert_eq!(
        publish_calls(&b.mock),
        calls_before,
        "the refusal came before any plugin call"
    );

    a.plane
        .service()
        .release_and_wait(
            &volume(),
            &workload("w-a"),
            tokio::time::Instant::now() + GUARD,
        )
        .await
        .expect("a's claim freed: its node steps on a, the controller step by the duty holder");
    assert!(
        a.mock.published_nodes(external).is_empty(),
        "ControllerUnpublishVolume for node-1 was sent"
    );
    b.plane
        .service()
        .claim(ClaimVolume::new(
            volume(),
            workload("w-b"),
            ClaimMode::Write,
        ))
        .await
        .expect("b claims once a released");
    assert_eq!(b.mock.published_nodes(external), vec!["node-2".to_owned()]);
    assert_eq!(b.mock.published().len(), 1, "published on node-2");

    b.close().await;
    a.close().await;
}

/// Node a is killed holding a claim (staged and published by its plugin), an operator reports
/// it gone for good and detaches its claims from b, and the controller step is refused: the
/// plugin still has the volume staged and published on a's node. Then a comes back on the
/// same directory (it joins the cluster as it opens, before it finds its plugin again, which
/// clears its gone mark and wakes b's step too early): the usage record of the claim released
/// while it was gone is unpublished and unstaged at its plugin and removed, the release
/// completes (the controller step retried by b, which holds the duty, without waiting out its
/// backoff: a minute at the cap, longer than the hang guard), and a's report says what it
/// released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reported_gone_that_comes_back_releases_what_it_held_and_the_release_completes() {
    let etcd = LocalEtcd::start(1).expect("etcd on the PATH (Debian: apt-get install etcd-server)");
    etcd.wait_healthy(GUARD).expect("etcd healthy (hang guard)");
    let dir = tempfile::tempdir().expect("temp dir");
    let first = MockPlugin::builder()
        .node_id("node-1")
        .build()
        .expect("mock");
    let second = first.as_node("node-2").expect("the mock as node-2");
    let a = Member::open(dir.path(), "a", &etcd, first.clone()).await;
    let b = Member::open(dir.path(), "b", &etcd, second).await;
    let a_id = NodeId::new("a").expect("node id");

    let mut new = NewVolume::new(volume(), plugin(), AccessMode::SingleNodeWriter);
    new.capacity_bytes = 1 << 20;
    let entry = b.plane.service().create(new).await.expect("created on b");
    let external = entry.external_id.as_str().to_owned();
    eventually("a's catalog shows the volume created on b", || {
        a.plane.service().catalog().get(&volume()).is_some()
    })
    .await;
    a.plane
        .service()
        .claim(ClaimVolume::new(
            volume(),
            workload("w-a"),
            ClaimMode::Write,
        ))
        .await
        .expect("a claims");
    assert_eq!(first.staged().len(), 1, "staged on node-1");
    assert_eq!(first.published().len(), 1, "published on node-1");

    // a is killed (closed without releasing anything: its usage record stays).
    a.close().await;
    let detached = b
        .plane
        .service()
        .detach(DetachVolume {
            node_gone: true,
            ..DetachVolume::new(volume(), a_id.clone())
        })
        .await
        .expect("a reported gone and its claims detached");
    assert_eq!(detached.releasing, [workload("w-a")]);
    first
        .calls()
        .wait_for(GUARD, |c| c.count(Rpc::ControllerUnpublishVolume) >= 1)
        .await
        .expect("the duty holder tries the controller step (hang guard)");
    assert_eq!(
        ok_count(&first, Rpc::ControllerUnpublishVolume),
        0,
        "refused while node-1 has the volume staged and published"
    );
    // A forced deregistration from b would leave a's mounts on a: its answer says so (asked
    // without confirming it, it changes nothing).
    match b
        .plane
        .service()
        .deregister_volume(&volume(), true, false)
        .await
    {
        Err(ServiceError::Invalid { field, reason }) => {
            assert_eq!(field, "confirmed");
            assert!(
                reason.contains("publication for workload w-a on node a, reported gone for good"),
                "{reason}"
            );
        }
        other => panic!("a forced deregistration must be confirmed: {other:?}"),
    }

    // a comes back on its directory.
    let a = Member::open(dir.path(), "a", &etcd, first.clone()).await;
    let reconciled = tokio::time::timeout(GUARD, a.plane.reconciled())
        .await
        .expect("the confirmation ends (hang guard)");
    let released: Vec<(String, WhileGone)> = reconciled
        .released_while_gone
        .iter()
        .map(|r| (r.workload.to_string(), r.claim))
        .collect();
    assert_eq!(
        released,
        [("w-a".to_owned(), WhileGone::ControllerStepResumed)],
        "{reconciled}"
    );
    assert!(
        reconciled
            .to_string()
            .contains("released while this node was reported gone"),
        "{reconciled}"
    );
    let actions: Vec<&str> = reconciled
        .report
        .records
        .iter()
        .map(|r| r.action().as_str())
        .collect();
    assert_eq!(actions, ["released"], "{reconciled}");
    assert!(first.staged().is_empty() && first.published().is_empty());
    assert!(a.plane.service().volumes().records().is_empty());

    eventually("the release completes: the claim freed", || {
        b.plane
            .service()
            .volume(&volume())
            .is_ok_and(|v| v.claims.is_empty())
    })
    .await;
    assert_eq!(ok_count(&first, Rpc::ControllerUnpublishVolume), 1);
    assert!(first.published_nodes(&external).is_empty());

    b.close().await;
    a.close().await;
}

/// How many calls of `rpc` the mock answered OK.
fn ok_count(mock: &MockPlugin, rpc: Rpc) -> usize {
    mock.calls()
        .of(rpc)
        .records()
        .iter()
        .filter(|r| r.outcome == csi_testkit::RecordedOutcome::Ok)
        .count()
}

/// An orchestrator's record field may not take a name of the record's own: refused before
/// anything is opened, naming the field.
#[tokio::test]
async fn an_extra_record_field_with_a_name_of_the_record_s_own_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EtcdConfig {
        endpoints: vec!["http://127.0.0.1:1".into()],
        prefix: "/plane-test".into(),
        ca_file: None,
        identity: None,
        user: None,
    };
    let token = Token::new("a-cluster-token-of-the-test-0123").expect("token");
    let mut settings = ClusterSettings::new(store, token, "127.0.0.1:7070");
    settings.extra.insert("shim".into(), "10.0.0.9:1".into());
    let state = dir.path().join("a");
    let refused = ControlPlane::builder(&state, NodeId::new("a").expect("node id"))
        .cluster(settings)
        .open()
        .await
        .expect_err("a field of the record's own");
    assert!(refused.to_string().contains("\"shim\""), "{refused}");
    assert!(!state.exists(), "nothing opened");
}
