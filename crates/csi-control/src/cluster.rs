//! Cluster membership in etcd (cargo feature `etcd`): which orchestrators make up a cluster,
//! who among them performs the controller-side release steps, and which nodes an operator
//! declared gone for good.
//!
//! Every member connects its own csi-claims [`EtcdStore`] to the same etcd and key prefix;
//! beside the claims (`claims/`) and the volume catalog (`volumes/`, [`EtcdCatalog`]) this
//! module keeps three things under that prefix:
//!
//! - `members/<node>`: one key per live member, its [`MemberRecord`] as JSON, written under a
//!   lease that the member keeps alive. A member that stops cleanly ([`Membership::leave`])
//!   revokes the lease, which deletes the key at once; one that crashes or loses etcd for
//!   longer than the lease's TTL drops out when the lease expires. Every member mirrors the
//!   whole of `members/` ([`Membership::members`]), which is how it learns of the others
//!   (their addresses, or whatever the orchestrator puts in its record) without a static list.
//!   The record's `instance` tells a member that restarted (same data directory, same
//!   instance) from another process given the same node id by mistake: that one is refused
//!   ([`JoinError::DuplicateNode`]).
//! - `gone/<node>`: nodes an operator reported gone for good
//!   ([`Membership::report_node_gone`]), a small JSON value saying who reported it. Each
//!   member tells its own claims driver of every mark as it appears
//!   ([`ClaimsHandle::node_gone`]), so the driver skips those nodes' node-side release steps
//!   (they will never run) and the controller-side step need not wait for them. A node that
//!   joins again deletes its own mark, and every member's driver hears that it is back
//!   ([`ClaimsHandle::node_returned`]).
//! - `leader/controller-duty`: the controller duty's election (csi-claims'
//!   [`EtcdStore::elect_controller_duty`]): one member at a time holds the key under its own
//!   lease and performs controller-side release steps, fenced by the key's revision; another
//!   is elected when it resigns or its lease expires.
//!
//! The values under `members/` and `gone/` carry `"format": 1` ([`FORMAT`]); a member skips
//! records of another format, or whose node id does not match their key.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use csi_claims::duty::DutyTiming;
//! use csi_claims::store::{EtcdStore, EtcdStoreConfig};
//! use csi_control::cluster::{MemberRecord, Membership};
//! use serde::{Deserialize, Serialize};
//!
//! /// What this orchestrator says of itself.
//! #[derive(Clone, Debug, Serialize, Deserialize)]
//! struct About {
//!     api: String,
//! }
//!
//! # use csi_claims::driver::ClaimsHandle;
//! # async fn run(claims: ClaimsHandle) -> Result<(), Box<dyn std::error::Error>> {
//! let endpoints = vec!["http://127.0.0.1:2379".to_owned()];
//! let store = EtcdStore::connect(EtcdStoreConfig::new(endpoints).with_prefix("/my-orch")).await?;
//! // The instance: random, kept in this member's data directory across restarts.
//! let about = About { api: "10.0.0.1:80".into() };
//! let me = MemberRecord::new("node-1", "7f3c0a9e", about);
//! let ttl = Duration::from_secs(10);
//! let membership =
//!     Membership::join(&store, ttl, DutyTiming::new(ttl)?, &me, claims).await?;
//! for member in membership.members() {
//!     println!("{} at {}", member.node, member.about.api);
//! }
//! membership.leave().await;
//! # Ok(())
//! # }
//! ```
//!
//! [`EtcdCatalog`]: crate::EtcdCatalog

use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use csi_claims::StoreError;
use csi_claims::driver::ClaimsHandle;
use csi_claims::duty::{Duty, DutyTiming};
use csi_claims::store::etcd_client::{Txn, TxnOp};
use csi_claims::store::{ControllerElection, EtcdStore, Held, HeldKey, Mirror};
use csi_structs::NodeId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The format of the values written under `members/` and `gone/` (the catalog writes the same
/// under `volumes/`).
pub const FORMAT: u32 = 1;

/// What a member says of itself under `members/<node>`: its node id and instance, beside what
/// the orchestrator adds (`about`, whose fields are written at the same level as the others).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord<T> {
    /// The value format: [`FORMAT`] ([`Membership::members`] skips any other).
    pub format: u32,
    /// Its node id (the key's last segment).
    pub node: String,
    /// Identifies one member's state (its data directory, say): a restarted member keeps it,
    /// another process given the same node id by mistake does not.
    pub instance: String,
    /// What the orchestrator says of the member (its addresses, its plugins), flattened into
    /// the record.
    #[serde(flatten)]
    pub about: T,
}

impl<T> MemberRecord<T> {
    /// A record of the current [`FORMAT`].
    pub fn new(node: impl Into<String>, instance: impl Into<String>, about: T) -> Self {
        Self {
            format: FORMAT,
            node: node.into(),
            instance: instance.into(),
            about,
        }
    }
}

/// Why a member could not join the cluster.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError<T> {
    /// etcd failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another live member uses this node id (another instance).
    #[error(
        "node id {node} is already a member of the cluster (instance {instance}, another data \
         directory); every member needs its own node id",
        instance = .other.instance
    )]
    DuplicateNode {
        /// The node id.
        node: String,
        /// The other member's record.
        other: Box<MemberRecord<T>>,
    },
    /// The record's node id is not a valid node id.
    #[error("cannot join the cluster as {node:?}: {reason}")]
    InvalidNode {
        /// The node id given.
        node: String,
        /// Why it is refused.
        reason: String,
    },
}

/// This member's place in the cluster: its record under a lease, the other members, the nodes
/// reported gone and the controller duty's election. See the [module docs](self).
///
/// `T` is what the orchestrator says of each member ([`MemberRecord::about`]).
#[derive(Debug)]
pub struct Membership<T> {
    me: NodeId,
    store: EtcdStore,
    members: Mirror,
    /// `gone/<node>`: nodes reported gone for good.
    gone: Mirror,
    /// This member's record, until it leaves.
    held: Mutex<Option<HeldKey>>,
    election: Mutex<Option<ControllerElection>>,
    /// The driver the election hands the duty to, asked what it holds.
    claims: ClaimsHandle,
    /// The task that tells the driver of the `gone/` marks, until this member leaves.
    follow_gone: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Records of `T`; the membership holds none itself.
    about: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> Membership<T> {
    /// Checks that no other live member has this node id (a record under `members/<node>`
    /// with another `instance`), clears the node's `gone/` mark, then writes `record` under a
    /// lease of `lease_ttl` (kept alive until [`leave`](Self::leave) or drop) and campaigns for
    /// the controller duty with `duty`, handing it to `claims` while this member holds it.
    /// Until it leaves, `claims` also hears of each node reported gone for good, and of each
    /// one back.
    ///
    /// # Errors
    ///
    /// [`JoinError`]: etcd failed, the node id is taken, or it is not a valid node id.
    pub async fn join(
        store: &EtcdStore,
        lease_ttl: Duration,
        duty: DutyTiming,
        record: &MemberRecord<T>,
        claims: ClaimsHandle,
    ) -> Result<Self, JoinError<T>> {
        let me = NodeId::new(record.node.clone()).map_err(|e| JoinError::InvalidNode {
            node: record.node.clone(),
            reason: e.to_string(),
        })?;
        let value = encode(store, &me, record)?;
        let members = store.mirror("members").await?;
        if let Some(found) = members.get(me.as_str())
            && let Ok(other) = serde_json::from_slice::<MemberRecord<T>>(&found.value)
            && other.instance != record.instance
        {
            return Err(JoinError::DuplicateNode {
                node: other.node.clone(),
                other: Box::new(other),
            });
        }
        // This node is back, if it was reported gone.
        let gone = store.mirror("gone").await?;
        let back = Txn::new().and_then([TxnOp::delete(gone.key(me.as_str()), None)]);
        store
            .txn(|| format!("clear node {me}'s gone mark"), back)
            .await?;
        let held = store.hold_key(members.key(me.as_str()), value, lease_ttl);
        let election = store.elect_controller_duty(me.as_str(), duty, claims.clone());
        let follow_gone = tokio::spawn(follow_gone(gone.clone(), claims.clone(), me.clone()));
        Ok(Self {
            me,
            store: store.clone(),
            members,
            gone,
            held: Mutex::new(Some(held)),
            election: Mutex::new(Some(election)),
            claims,
            follow_gone: Mutex::new(Some(follow_gone)),
            about: PhantomData,
        })
    }

    /// Publishes a new record of this member (under the same lease); nothing once it left.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the record does not encode or is larger than the store's value
    /// limit; the old record stays.
    pub fn update(&self, record: &MemberRecord<T>) -> Result<(), StoreError> {
        let value = encode(&self.store, &self.me, record)?;
        if let Some(held) = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            held.set(value);
        }
        Ok(())
    }

    /// The live members, this one among them once its record is written, by node id: the
    /// records that decode, of the current [`FORMAT`], whose node id matches their key.
    pub fn members(&self) -> Vec<MemberRecord<T>> {
        self.members
            .list()
            .into_iter()
            .filter_map(|(name, e)| {
                serde_json::from_slice::<MemberRecord<T>>(&e.value)
                    .ok()
                    .filter(|m| m.node == name && m.format == FORMAT)
            })
            .collect()
    }
}

impl<T> Membership<T> {
    /// This member's node id.
    pub fn me(&self) -> &NodeId {
        &self.me
    }

    /// Wakes when the members change (a join, a leave, a new record, an expired lease).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.members.subscribe()
    }

    /// The nodes reported gone for good (and not back since). Never this member's own: it is
    /// back, and its join removes its mark.
    pub fn gone_nodes(&self) -> BTreeSet<NodeId> {
        gone_nodes(&self.gone, &self.me)
    }

    fn stop_following(&self) {
        if let Some(task) = take(&self.follow_gone) {
            task.abort();
        }
    }

    /// Wakes when [`gone_nodes`](Self::gone_nodes) changes.
    pub fn subscribe_gone(&self) -> watch::Receiver<u64> {
        self.gone.subscribe()
    }

    /// Reports `node` gone for good to every member (`gone/<node>`): their drivers may skip
    /// its node-side release steps. The mark stays until that node joins again.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when etcd cannot be written.
    pub async fn report_node_gone(&self, node: &NodeId) -> Result<(), StoreError> {
        let key = self.gone.key(node.as_str());
        let value = serde_json::json!({ "format": FORMAT, "reported_by": self.me.as_str() })
            .to_string()
            .into_bytes();
        let put = Txn::new().and_then([TxnOp::put(key.as_str(), value, None)]);
        self.store
            .txn(|| format!("report node {node} gone"), put)
            .await?;
        Ok(())
    }

    /// Gives up the controller duty and the membership at once (a clean stop), so the others
    /// need not wait for the leases to expire. Later calls do nothing.
    pub async fn leave(&self) {
        self.stop_following();
        // Taken out of the lock before the awaits.
        let election = take(&self.election);
        if let Some(e) = election {
            e.resign().await;
        }
        let held = take(&self.held);
        if let Some(held) = held {
            held.release().await;
        }
    }

    /// The member that holds the controller duty, as far as this one knows (`None`: nobody
    /// now, unknown while etcd is unreachable, or this member left).
    pub fn duty_holder(&self) -> Option<String> {
        self.election
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(ControllerElection::leader)
    }

    /// This member's own hold on the controller duty: its driver's fenced [`Duty`] (`None`:
    /// it does not hold it).
    pub fn held_duty(&self) -> Option<Duty> {
        self.claims.duty()
    }

    /// Why this member's view of the cluster may be behind or its record missing: the
    /// members mirror's outage, or its own record failing to be held (`membership: ...`).
    /// `None` while all is well.
    pub fn outage(&self) -> Option<String> {
        let held = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(HeldKey::state);
        self.members.outage().or_else(|| match held {
            Some(Held::Failing(e)) => Some(format!("membership: {e}")),
            _ => None,
        })
    }
}

impl<T> Drop for Membership<T> {
    fn drop(&mut self) {
        self.stop_following();
    }
}

/// What `slot` holds, leaving it empty.
fn take<V>(slot: &Mutex<Option<V>>) -> Option<V> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// The node ids under `gone/`, but `me`'s. The mirror was read before `me`'s join removed its
/// mark, and a live member performs its own node steps whatever any mark says: were its own
/// driver told it is gone, a release of its claims could skip an unmount that must run.
fn gone_nodes(gone: &Mirror, me: &NodeId) -> BTreeSet<NodeId> {
    gone.list()
        .into_iter()
        .filter_map(|(name, _)| NodeId::new(name).ok())
        .filter(|node| node != me)
        .collect()
}

/// Tells `claims` of every node marked gone (never `me`), and of every mark removed, as the
/// mirror sees them; ends when the mirror does.
async fn follow_gone(gone: Mirror, claims: ClaimsHandle, me: NodeId) {
    let mut changes = gone.subscribe();
    let mut applied = BTreeSet::new();
    loop {
        let now = gone_nodes(&gone, &me);
        for node in now.difference(&applied) {
            tracing::warn!(node = %node, "node reported gone for good: its claims are released without their node steps");
            claims.node_gone(node);
        }
        for node in applied.difference(&now) {
            tracing::info!(node = %node, "node no longer reported gone");
            claims.node_returned(node);
        }
        applied = now;
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// `record` as JSON, within the store's value limit.
fn encode<T: Serialize>(
    store: &EtcdStore,
    me: &NodeId,
    record: &MemberRecord<T>,
) -> Result<Vec<u8>, StoreError> {
    let failed = |detail: String| StoreError::Etcd {
        endpoints: store.config().endpoints_text(),
        operation: format!("encode member {me}'s record"),
        detail,
    };
    let value = serde_json::to_vec(record).map_err(|e| failed(e.to_string()))?;
    let limit = store.config().max_value_bytes;
    if value.len() > limit {
        return Err(failed(format!(
            "the record is {} bytes; the store takes at most {limit}",
            value.len()
        )));
    }
    Ok(value)
}

#[async_trait::async_trait]
impl<T> crate::peers::ClusterMembers for Membership<T>
where
    T: Serialize + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    fn is_member(&self, node: &NodeId) -> bool {
        self.members().iter().any(|m| m.node == node.as_str())
    }

    async fn report_node_gone(&self, node: &NodeId) -> Result<(), StoreError> {
        Membership::<T>::report_node_gone(self, node).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    struct About {
        http: String,
        ports: Vec<u16>,
    }

    #[test]
    fn the_record_writes_its_own_fields_first_then_the_orchestrators_at_the_same_level() {
        let record = MemberRecord::new(
            "n1",
            "i-1",
            About {
                http: "127.0.0.1:1".into(),
                ports: vec![7, 8],
            },
        );
        let json = serde_json::to_string(&record).expect("encodes");
        assert_eq!(
            json,
            r#"{"format":1,"node":"n1","instance":"i-1","http":"127.0.0.1:1","ports":[7,8]}"#
        );
        let back: MemberRecord<About> = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, record);
    }
}
