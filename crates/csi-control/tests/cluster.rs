//! csi-control's cluster membership against a real etcd (Debian's `etcd-server`), started by the
//! tests on loopback with a temporary data directory and free ports (csi-testkit's
//! `LocalEtcd`). Each member has its own `EtcdStore` connection and a claims driver over it, as
//! an orchestrator does. Run with `cargo test -p csi-control --features etcd` (needs `etcd` on
//! the PATH). Waits are bounded hang guards, never timing assertions.
#![cfg(feature = "etcd")]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use csi_claims::driver::{
    ClaimsDriver, ClaimsHandle, ControllerDetacher, DriverConfig, NodeDetacher,
};
use csi_claims::duty::DutyTiming;
use csi_claims::store::{ClaimStore, EtcdStore, EtcdStoreConfig};
use csi_claims::{
    ClaimMode, ClaimRequest, ControllerDetachRequest, ControllerRequirement, DetachError, Duties,
    MachineConfig, NodeDetachRequest, VolumeInfo,
};
use csi_control::cluster::{FORMAT, JoinError, MemberRecord, Membership};
use csi_structs::{
    AccessMode, AccessTypeKind, ExternalVolumeId, NodeId, PluginId, PluginNodeId, VolumeId,
    WorkloadId,
};
use csi_testkit::etcd::LocalEtcd;
use serde::{Deserialize, Serialize};

/// The lease of the records and of the controller duty: long enough that nothing in a test
/// depends on a lease running out (members that stop leave, which revokes it).
const TTL: Duration = Duration::from_secs(10);
/// The hang guard of every wait.
const LIMIT: Duration = Duration::from_secs(30);

/// What the test orchestrator says of each member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct About {
    api: String,
    zones: Vec<String>,
}

fn about(node: &str) -> About {
    About {
        api: format!("{node}.example:8080"),
        zones: vec![format!("zone-{node}")],
    }
}

fn node(id: &str) -> NodeId {
    NodeId::new(id).expect("node id")
}

/// A local etcd (csi-testkit's) and stores on it.
struct Etcd(LocalEtcd);

impl Etcd {
    fn start() -> Etcd {
        Etcd(LocalEtcd::start(1).expect("etcd on the PATH (Debian: apt-get install etcd-server)"))
    }

    /// A store of its own once the cluster answers (bounded).
    async fn store(&self, prefix: &str) -> EtcdStore {
        let mut config = EtcdStoreConfig::new(self.0.endpoints()).with_prefix(prefix);
        config.request_timeout = Duration::from_secs(2);
        let store = EtcdStore::connect(config).await.expect("connect");
        for _ in 0..300 {
            if store.load_all().await.is_ok() {
                return store;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("etcd did not answer within 30 s");
    }
}

/// Release steps that succeed (no test here releases anything).
struct Plugin;

#[async_trait]
impl NodeDetacher for Plugin {
    async fn node_unpublish(&self, _: &NodeDetachRequest) -> Result<(), DetachError> {
        Ok(())
    }
    async fn node_unstage(&self, _: &NodeDetachRequest) -> Result<(), DetachError> {
        Ok(())
    }
}

#[async_trait]
impl ControllerDetacher for Plugin {
    async fn controller_unpublish(&self, _: &ControllerDetachRequest) -> Result<(), DetachError> {
        Ok(())
    }
}

/// One orchestrator: its store, its claims driver and its membership.
struct Member {
    membership: Membership<About>,
    claims: ClaimsHandle,
    _driver: ClaimsDriver,
}

/// Starts a claims driver over a store of its own and joins as `node` with `instance`.
async fn join(
    etcd: &Etcd,
    prefix: &str,
    node: &str,
    instance: &str,
) -> Result<Member, JoinError<About>> {
    let store = etcd.store(prefix).await;
    let config = DriverConfig {
        machine: MachineConfig {
            // Its own node steps; the controller duty only when elected.
            duties: Duties::node(NodeId::new(node).unwrap_or_else(|_| self::node("x")), false),
            ..MachineConfig::with_seed(7)
        },
        ..DriverConfig::default()
    };
    let (claims, driver) = ClaimsDriver::start(
        Arc::new(store.clone()) as Arc<dyn ClaimStore>,
        Arc::new(Plugin),
        Arc::new(Plugin),
        config,
    )
    .await
    .expect("driver starts");
    let record = MemberRecord::new(node, instance, about(node));
    let timing = DutyTiming::new(TTL).expect("timing");
    let membership = Membership::join(&store, TTL, timing, &record, claims.clone()).await?;
    Ok(Member {
        membership,
        claims,
        _driver: driver,
    })
}

/// Waits (bounded) until `check` holds.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while start.elapsed() < LIMIT {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within {LIMIT:?}: {what}");
}

/// The node ids of the members `m` sees.
fn nodes(m: &Membership<About>) -> Vec<String> {
    m.members().into_iter().map(|r| r.node).collect()
}

/// The value under `key` now (a linearizable read), as text.
async fn read(store: &EtcdStore, key: &str) -> Option<String> {
    store
        .read_key(key)
        .await
        .expect("read")
        .map(|kv| String::from_utf8(kv.value().to_vec()).expect("utf-8"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_see_each_other_with_what_each_says_of_itself() {
    let etcd = Etcd::start();
    let a = join(&etcd, "/two", "a", "ia").await.expect("a joins");
    // Taken before b joins, so b's record is a change it has not seen.
    let mut changes = a.membership.subscribe();
    let b = join(&etcd, "/two", "b", "ib").await.expect("b joins");

    for m in [&a, &b] {
        eventually("both members are seen", || {
            nodes(&m.membership) == ["a", "b"]
        })
        .await;
        assert_eq!(
            m.membership.members(),
            [
                MemberRecord::new("a", "ia", about("a")),
                MemberRecord::new("b", "ib", about("b")),
            ]
        );
        assert_eq!(m.membership.outage(), None);
    }
    assert_eq!(a.membership.me(), &node("a"));
    // The subscription woke for what came after it was taken.
    tokio::time::timeout(LIMIT, changes.changed())
        .await
        .expect("the members changed")
        .expect("the mirror is alive");

    // The record under members/<node>: the library's fields, then the orchestrator's.
    let store = etcd.store("/two").await;
    assert_eq!(
        read(&store, "/two/members/b").await.as_deref(),
        Some(
            r#"{"format":1,"node":"b","instance":"ib","api":"b.example:8080","zones":["zone-b"]}"#
        )
    );

    // A new record replaces the old one, for the others too.
    let mut moved = MemberRecord::new("b", "ib", about("b"));
    moved.about.api = "b.example:9090".into();
    b.membership.update(&moved).expect("encodes");
    eventually("a sees b's new record", || {
        a.membership.members().iter().any(|r| r == &moved)
    })
    .await;
    assert_eq!(nodes(&a.membership), ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_node_id_is_refused_to_another_instance_and_accepted_from_the_same_one() {
    let etcd = Etcd::start();
    let b = join(&etcd, "/dup", "b", "ib").await.expect("b joins");
    let store = etcd.store("/dup").await;
    eventually("b's record is written", || nodes(&b.membership) == ["b"]).await;

    let Err(refused) = join(&etcd, "/dup", "b", "another-data-dir").await else {
        panic!("a second b with another instance joined");
    };
    assert!(
        refused
            .to_string()
            .contains("node id b is already a member"),
        "{refused}"
    );
    match refused {
        JoinError::DuplicateNode { node, other } => {
            assert_eq!(node, "b");
            assert_eq!(*other, MemberRecord::new("b", "ib", about("b")));
        }
        other => panic!("expected DuplicateNode, got {other:?}"),
    }
    // The refused member wrote nothing: b's record is b's.
    let held = read(&store, "/dup/members/b").await.expect("b is a member");
    assert!(held.contains(r#""instance":"ib""#), "{held}");

    // The same instance (b restarted while its old lease is still alive) is b.
    let again = join(&etcd, "/dup", "b", "ib")
        .await
        .expect("the same instance joins again");
    assert_eq!(again.membership.me(), &node("b"));
    eventually("b is one member", || nodes(&again.membership) == ["b"]).await;

    // Not a node id at all.
    let Err(invalid) = join(&etcd, "/dup", "", "i").await else {
        panic!("an empty node id joined");
    };
    assert!(
        matches!(invalid, JoinError::InvalidNode { .. }),
        "{invalid:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reported_gone_is_seen_by_the_others_until_it_joins_again() {
    let etcd = Etcd::start();
    let a = join(&etcd, "/gone", "a", "ia").await.expect("a joins");
    let b = join(&etcd, "/gone", "b", "ib").await.expect("b joins");
    let store = etcd.store("/gone").await;
    assert!(a.membership.gone_nodes().is_empty());
    let mut b_gone = b.membership.subscribe_gone();

    a.membership
        .report_node_gone(&node("c"))
        .await
        .expect("reported");
    tokio::time::timeout(LIMIT, b_gone.changed())
        .await
        .expect("b is told")
        .expect("the mirror is alive");
    eventually("b sees c gone", || {
        b.membership.gone_nodes().into_iter().collect::<Vec<_>>() == [node("c")]
    })
    .await;
    eventually("a sees c gone", || {
        a.membership.gone_nodes().contains(&node("c"))
    })
    .await;
    assert_eq!(
        read(&store, "/gone/gone/c").await.as_deref(),
        Some(r#"{"format":1,"reported_by":"a"}"#)
    );

    // c comes back: its join removes the mark, for everyone.
    let c = join(&etcd, "/gone", "c", "ic").await.expect("c joins");
    // At once: c never takes itself for gone (its mirror was read before the mark went).
    assert!(c.membership.gone_nodes().is_empty());
    assert_eq!(read(&store, "/gone/gone/c").await, None, "the mark is gone");
    eventually("b no longer sees c gone", || {
        b.membership.gone_nodes().is_empty()
    })
    .await;
    eventually("c sees all three", || {
        nodes(&c.membership) == ["a", "b", "c"]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_node_reported_gone_is_released_without_its_node_step() {
    let etcd = Etcd::start();
    let a = join(&etcd, "/freed", "a", "ia").await.expect("a joins");
    let b = join(&etcd, "/freed", "b", "ib").await.expect("b joins");
    eventually("a controller duty holder", || {
        a.membership.held_duty().is_some() || b.membership.held_duty().is_some()
    })
    .await;
    // A claim of node c, which is no member: nobody performs its node steps.
    let volume = VolumeId::new("v1").expect("id");
    let workload = WorkloadId::new("w1").expect("id");
    let info = VolumeInfo {
        id: volume.clone(),
        external_id: ExternalVolumeId::new("vol-1").expect("id"),
        plugin: PluginId::new("plug").expect("id"),
        controller: ControllerRequirement::Required,
    };
    let request = ClaimRequest {
        volume: volume.clone(),
        workload: workload.clone(),
        node: node("c"),
        plugin_node: PluginNodeId::new("i-c").expect("id"),
        mode: ClaimMode::Write,
        access_mode: AccessMode::SingleNodeWriter,
        attachment: AccessTypeKind::Mount,
    };
    a.claims.claim(&info, request).await.expect("claimed");
    let release = a.claims.release_and_wait_until(
        &volume,
        &workload,
        tokio::time::Instant::now() + Duration::from_millis(500),
    );
    assert!(release.await.is_err(), "waits for c's node step");

    // b reports c gone: each member's driver is told, and the duty holder frees the claim.
    b.membership
        .report_node_gone(&node("c"))
        .await
        .expect("reported");
    let freed = a
        .claims
        .release_and_wait_until(&volume, &workload, tokio::time::Instant::now() + LIMIT)
        .await
        .expect("freed without c's node step");
    assert_eq!(freed.node(), &node("c"));
    // b learns of the free through the store's watch, a moment later.
    eventually("b sees the claim freed", || {
        b.claims.status(&volume).is_none_or(|s| s.claims.is_empty())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_leaves_is_no_longer_seen_and_another_takes_the_controller_duty() {
    let etcd = Etcd::start();
    let a = join(&etcd, "/leave", "a", "ia").await.expect("a joins");
    let b = join(&etcd, "/leave", "b", "ib").await.expect("b joins");
    let store = etcd.store("/leave").await;
    for m in [&a, &b] {
        eventually("both see both", || nodes(&m.membership) == ["a", "b"]).await;
    }
    // One of them holds the duty, and both agree on which.
    eventually("a duty holder is known to both", || {
        let holder = a.membership.duty_holder();
        holder.is_some() && holder == b.membership.duty_holder()
    })
    .await;
    let holder_name = a.membership.duty_holder().expect("a holder");
    let (holder, other) = if holder_name == "a" {
        (&a, &b)
    } else {
        (&b, &a)
    };
    eventually("the holder's driver holds the duty", || {
        holder.membership.held_duty().is_some()
    })
    .await;
    assert!(other.membership.held_duty().is_none());
    assert_eq!(
        read(&store, "/leave/leader/controller-duty")
            .await
            .as_deref(),
        Some(holder_name.as_str())
    );

    holder.membership.leave().await;
    let key = format!("/leave/members/{holder_name}");
    assert_eq!(read(&store, &key).await, None, "its record is deleted");
    assert_eq!(
        holder.membership.duty_holder(),
        None,
        "it left the election"
    );
    assert!(!holder.claims.controller_duty());
    let left = other.membership.me().to_string();
    eventually("the other no longer sees it", || {
        nodes(&other.membership) == [left.clone()]
    })
    .await;
    eventually("the other takes the duty", || {
        other.membership.duty_holder().as_deref() == Some(left.as_str())
            && other.membership.held_duty().is_some()
    })
    .await;
    // Leaving again does nothing.
    holder.membership.leave().await;
    assert_eq!(nodes(&other.membership), [left]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_that_do_not_decode_are_of_another_format_or_name_another_node_are_skipped() {
    let etcd = Etcd::start();
    let store = etcd.store("/odd").await;
    let mut kv = store.client().kv_client();
    let other_format = format!(
        r#"{{"format":{},"node":"f","instance":"i","api":"x","zones":[]}}"#,
        FORMAT + 1
    );
    for (key, value) in [
        ("/odd/members/x", "not json".to_owned()),
        (
            "/odd/members/y",
            r#"{"format":1,"node":"z","instance":"i","api":"x","zones":[]}"#.to_owned(),
        ),
        ("/odd/members/f", other_format),
        (
            "/odd/members/w",
            r#"{"format":1,"node":"w","instance":"i"}"#.to_owned(),
        ),
    ] {
        kv.put(key, value, None).await.expect("put");
    }
    let a = join(&etcd, "/odd", "a", "ia").await.expect("a joins");
    eventually("a sees itself", || !a.membership.members().is_empty()).await;
    assert_eq!(
        a.membership.members(),
        [MemberRecord::new("a", "ia", about("a"))]
    );
}

/// `Stores` opens the shared catalog and claims from an `EtcdConfig`: two nodes see one
/// catalog, neither performs controller steps until elected, and neither may forget claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_open_one_catalog_shared_by_every_node() {
    use csi_control::CatalogEntry;
    use csi_control::stores::{EtcdConfig, StoreConfig, Stores};
    use csi_structs::{AccessMode, AccessTypeKind, ExternalVolumeId, PluginId, VolumeId};

    let etcd = Etcd::start();
    // Once etcd answers, through a store of the test's own.
    drop(etcd.store("/stores").await);
    let config = StoreConfig::Etcd(Box::new(EtcdConfig {
        endpoints: etcd.0.endpoints(),
        prefix: "/stores".into(),
        ca_file: None,
        identity: None,
        user: None,
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Stores::open(&config, dir.path(), &node("a"))
        .await
        .expect("a");
    let b = Stores::open(&config, dir.path(), &node("b"))
        .await
        .expect("b");
    for (stores, me) in [(&a, "a"), (&b, "b")] {
        assert!(stores.shared);
        assert!(stores.forgetting.is_none() && stores.database.is_none());
        assert_eq!(stores.duties, Duties::node(node(me), false));
        assert!(stores.etcd.is_some());
        assert!(
            stores.description.ends_with("prefix /stores"),
            "{}",
            stores.description
        );
    }
    assert!(
        !dir.path().join("volumes.json").exists(),
        "nothing is written to the directory"
    );

    let id = VolumeId::new("shared-vol").expect("id");
    let entry = CatalogEntry {
        id: id.clone(),
        external_id: ExternalVolumeId::new("ext-1").expect("id"),
        plugin: PluginId::new("p").expect("id"),
        access_mode: AccessMode::SingleNodeWriter,
        attachment: AccessTypeKind::Mount,
        controller_publish: false,
        created: false,
        capacity_bytes: None,
        context: Default::default(),
        deleting: false,
        secrets: Default::default(),
        accessible_topology: Vec::new(),
        node_expansion: None,
        may_exist: None,
    };
    assert!(a.catalog.insert(entry.clone()).await.expect("insert"));
    assert!(
        !b.catalog.insert(entry).await.expect("insert"),
        "b sees a's volume"
    );
    eventually("b's mirror sees a's volume", || {
        b.catalog.get(&id).is_some()
    })
    .await;
}
