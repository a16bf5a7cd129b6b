//! Releases that cannot go on by themselves because what they wait for is not there.
//!
//! The release pipeline shows a step that failed (its error, its next retry), but a step that
//! is never tried fails nowhere: in a cluster, a claim's node step runs only on its own node,
//! so while that node is down its releases wait silently. [`VolumeService::blocked_releases`]
//! names them, and [`ReleaseWaits`] follows them over time: since when each has waited (as
//! this process saw it), and which have waited past a threshold, each logged once.

use std::collections::BTreeMap;
use std::time::Duration;

use csi_claims::ClaimState;
use csi_structs::{NodeId, VolumeId, WorkloadId};
use tokio::time::Instant;

use super::VolumeService;

/// What a blocked release waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockedOn {
    /// The claim's node step (unpublish, unstage) runs on its node, and that node is not there:
    /// not a live member of the cluster, or not answering. It goes on when the node comes
    /// back, or once the node is reported gone for good (its node steps are skipped then).
    NodeAway(NodeId),
}

impl std::fmt::Display for BlockedOn {
    /// `node n2 is not there to unpublish and unstage it (report the node gone for good if it
    /// will not come back)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockedOn::NodeAway(node) => write!(
                f,
                "node {node} is not there to unpublish and unstage it (report the node gone \
                 for good if it will not come back)"
            ),
        }
    }
}

/// A claim's release that waits for something that is not there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedRelease {
    /// The volume.
    pub volume: VolumeId,
    /// The claim's workload.
    pub workload: WorkloadId,
    /// What it waits for.
    pub on: BlockedOn,
    /// Since when it has waited, as the [`ReleaseWaits`] that saw it first.
    pub since: Instant,
}

impl std::fmt::Display for BlockedRelease {
    /// `the release of workload w1's claim on volume v1 waits: node n2 is not there ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the release of workload {}'s claim on volume {} waits: {}",
            self.workload, self.volume, self.on
        )
    }
}

impl VolumeService {
    /// The claims whose release waits now for something that is not there (see
    /// [`BlockedOn`]), by volume and workload; what [`ReleaseWaits`] follows over time.
    pub fn blocked_releases(&self) -> Vec<(VolumeId, WorkloadId, BlockedOn)> {
        let mut out = Vec::new();
        for entry in self.inner.catalog.list() {
            let Some(record) = self.inner.claims.stored_record(&entry.id) else {
                continue;
            };
            for claim in record.claims() {
                let node = claim.node();
                let node_step_pending = matches!(claim.state(), ClaimState::Releasing);
                if node_step_pending
                    && node != &self.inner.me
                    && self.inner.peers.reachable(node) == Some(false)
                {
                    out.push((
                        entry.id.clone(),
                        claim.workload().clone(),
                        BlockedOn::NodeAway(node.clone()),
                    ));
                }
            }
        }
        out
    }
}

/// Follows [`VolumeService::blocked_releases`] over time: since when each release has waited
/// (first seen by this follower, so a restart starts the count again), and which have waited
/// for at least a threshold; a release is logged once when it passes the threshold, and once
/// when it goes on.
///
/// ```
/// use std::time::Duration;
/// use csi_control::service::ReleaseWaits;
///
/// let mut waits = ReleaseWaits::new(Duration::from_secs(30));
/// assert!(waits.current().is_empty());
/// // Every interval: let blocked = waits.check(&service);
/// ```
#[derive(Debug)]
pub struct ReleaseWaits {
    threshold: Duration,
    /// Each blocked release: what it waits for, since when, whether it was reported.
    seen: BTreeMap<(VolumeId, WorkloadId), (BlockedOn, Instant, bool)>,
}

impl ReleaseWaits {
    /// A follower that reports releases blocked for at least `threshold`.
    pub fn new(threshold: Duration) -> Self {
        Self {
            threshold,
            seen: BTreeMap::new(),
        }
    }

    /// Looks at `service` again, and answers the releases blocked for at least the threshold,
    /// oldest first.
    pub fn check(&mut self, service: &VolumeService) -> Vec<BlockedRelease> {
        self.update(service.blocked_releases(), Instant::now())
    }

    /// The releases blocked for at least the threshold at the last [`check`](Self::check).
    pub fn current(&self) -> Vec<BlockedRelease> {
        self.over_threshold()
    }

    fn update(
        &mut self,
        blocked: Vec<(VolumeId, WorkloadId, BlockedOn)>,
        now: Instant,
    ) -> Vec<BlockedRelease> {
        let mut next = BTreeMap::new();
        for (volume, workload, on) in blocked {
            let key = (volume, workload);
            let kept = match self.seen.remove(&key) {
                Some((was, since, reported)) if was == on => (on, since, reported),
                _ => (on, now, false),
            };
            next.insert(key, kept);
        }
        for ((volume, workload), (on, _, reported)) in &self.seen {
            if *reported {
                tracing::info!(volume = %volume, workload = %workload, was = %on, "a blocked release goes on");
            }
        }
        for ((volume, workload), (on, since, reported)) in &mut next {
            let waited = now.saturating_duration_since(*since);
            if !*reported && waited >= self.threshold {
                *reported = true;
                tracing::warn!(
                    volume = %volume,
                    workload = %workload,
                    waited_s = waited.as_secs(),
                    "release waits: {on}"
                );
            }
        }
        self.seen = next;
        self.over_threshold()
    }

    fn over_threshold(&self) -> Vec<BlockedRelease> {
        let mut out: Vec<BlockedRelease> = self
            .seen
            .iter()
            .filter(|(_, (_, _, reported))| *reported)
            .map(|((volume, workload), (on, since, _))| BlockedRelease {
                volume: volume.clone(),
                workload: workload.clone(),
                on: on.clone(),
                since: *since,
            })
            .collect();
        out.sort_by_key(|b| b.since);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(v: &str, w: &str, node: &str) -> (VolumeId, WorkloadId, BlockedOn) {
        (
            VolumeId::new(v).expect("volume"),
            WorkloadId::new(w).expect("workload"),
            BlockedOn::NodeAway(NodeId::new(node).expect("node")),
        )
    }

    #[test]
    fn a_release_is_reported_once_it_has_waited_the_threshold_and_keeps_its_since() {
        let mut waits = ReleaseWaits::new(Duration::from_secs(30));
        let t0 = Instant::now();
        assert!(waits.update(vec![key("v1", "w1", "n2")], t0).is_empty());
        let later = t0 + Duration::from_secs(29);
        assert!(
            waits.update(vec![key("v1", "w1", "n2")], later).is_empty(),
            "not yet"
        );
        let past = t0 + Duration::from_secs(31);
        let reported = waits.update(vec![key("v1", "w1", "n2"), key("v2", "w2", "n2")], past);
        assert_eq!(reported.len(), 1, "{reported:?}");
        assert_eq!(reported[0].since, t0, "since the first time it was seen");
        assert_eq!(reported[0].volume.as_str(), "v1");
        assert!(reported[0].to_string().contains("node n2 is not there"));
        assert_eq!(waits.current(), reported);
        // It goes on: no longer listed; the other one waits on.
        let after = waits.update(vec![key("v2", "w2", "n2")], past + Duration::from_secs(60));
        assert_eq!(after.len(), 1);
        assert_eq!(after[0].volume.as_str(), "v2");
        assert_eq!(after[0].since, past);
    }

    #[test]
    fn a_release_blocked_by_something_else_starts_again() {
        let mut waits = ReleaseWaits::new(Duration::from_secs(1));
        let t0 = Instant::now();
        waits.update(vec![key("v1", "w1", "n2")], t0);
        let t1 = t0 + Duration::from_secs(5);
        let now_n3 = waits.update(vec![key("v1", "w1", "n3")], t1);
        assert!(now_n3.is_empty(), "a new wait: {now_n3:?}");
        let t2 = t1 + Duration::from_secs(2);
        let reported = waits.update(vec![key("v1", "w1", "n3")], t2);
        assert_eq!(reported[0].since, t1);
    }
}
