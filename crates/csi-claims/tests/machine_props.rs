//! Property test: random sequences of claims, releases, call failures, crashes and node
//! losses against the pure machine, checked against a simple model of the rules.
//!
//! Invariants, checked after every step:
//! - no volume ever has more writers or readers (or more nodes) than its access mode allows;
//! - a node detach is only asked for a claim whose durable state is `releasing`, and a
//!   controller detach only for one whose durable state is `node_detached`;
//! - a freed claim's node and controller steps succeeded or were skipped by rule;
//! - nothing is freed twice;
//! - at most one detach call per volume and one controller call per plugin are in flight;
//! - a failed volume is not retried until time moves or an event may have fixed the cause
//!   (no tight loop);
//!
//! and at the end, once failures stop, every claim is released and freed (the store is
//! empty).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use csi_claims::backoff::BackoffPolicy;
use csi_claims::store::MemoryStore;
use csi_claims::{
    Action, Claim, ClaimMode, ClaimRequest, ClaimState, ControllerRequirement, ControllerStep,
    DetachError, DetachRpc, Event, MachineConfig, NodeStep, ReleaseMachine, VolumeInfo,
};
use csi_structs::{
    AccessMode, AccessTypeKind, ErrorClass, ExternalVolumeId, NodeId, PluginId, PluginNodeId,
    VolumeId, WorkloadId,
};
use proptest::prelude::*;

const VOLUMES: usize = 3;
const WORKLOADS: usize = 6;
const NODES: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Claim {
        v: usize,
        w: usize,
        n: usize,
        write: bool,
    },
    Release {
        v: usize,
        w: usize,
    },
    /// Answer one outstanding action (index modulo their number) with an outcome.
    Answer {
        pick: usize,
        outcome: Outcome,
    },
    /// Perform a store write, then crash before the machine hears of it.
    WriteThenCrash {
        pick: usize,
    },
    Advance {
        secs: u64,
    },
    Restart,
    NodeGone {
        n: usize,
    },
    PluginBack,
}

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Ok,
    AlreadyDone,
    Fail(ErrorClass),
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        4 => Just(Outcome::Ok),
        1 => Just(Outcome::AlreadyDone),
        1 => Just(Outcome::Fail(ErrorClass::Retry)),
        1 => Just(Outcome::Fail(ErrorClass::RetryElsewhere)),
        1 => Just(Outcome::Fail(ErrorClass::Uncertain)),
        1 => Just(Outcome::Fail(ErrorClass::Fatal)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..VOLUMES, 0..WORKLOADS, 0..NODES, any::<bool>())
            .prop_map(|(v, w, n, write)| Op::Claim { v, w, n, write }),
        3 => (0..VOLUMES, 0..WORKLOADS).prop_map(|(v, w)| Op::Release { v, w }),
        8 => (any::<usize>(), outcome()).prop_map(|(pick, outcome)| Op::Answer { pick, outcome }),
        1 => any::<usize>().prop_map(|pick| Op::WriteThenCrash { pick }),
        2 => (0u64..40).prop_map(|secs| Op::Advance { secs }),
        1 => Just(Op::Restart),
        1 => (0..NODES).prop_map(|n| Op::NodeGone { n }),
        1 => Just(Op::PluginBack),
    ]
}

fn vid(i: usize) -> VolumeId {
    VolumeId::new(format!("v{i}")).unwrap()
}
fn nid(i: usize) -> NodeId {
    NodeId::new(format!("n{i}")).unwrap()
}

/// The model of the access-mode rules, written independently of the crate's accounting.
fn allowed(access: AccessMode, claims: &[Claim]) -> bool {
    let writers = claims
        .iter()
        .filter(|c| c.mode() == ClaimMode::Write)
        .count();
    let nodes: HashSet<_> = claims.iter().map(|c| c.node()).collect();
    match access {
        AccessMode::SingleNodeReaderOnly => writers == 0 && claims.len() <= 1,
        AccessMode::SingleNodeWriter => claims.len() <= 1,
        AccessMode::SingleNodeSingleWriter => claims.len() <= 1,
        AccessMode::SingleNodeMultiWriter => nodes.len() <= 1,
        AccessMode::MultiNodeReaderOnly => writers == 0,
        AccessMode::MultiNodeSingleWriter => writers <= 1,
        AccessMode::MultiNodeMultiWriter => true,
    }
}

struct World {
    machine: ReleaseMachine,
    store: MemoryStore,
    now: Instant,
    infos: Vec<VolumeInfo>,
    access: Vec<AccessMode>,
    outstanding: Vec<Action>,
    gone: HashSet<NodeId>,
    /// What has succeeded for each claim, by (volume, workload).
    progress: HashMap<(VolumeId, WorkloadId), Progress>,
    freed: HashSet<(VolumeId, WorkloadId)>,
    /// Workload slot → name suffix, per volume. A name is never claimed again once its claim
    /// left the machine, so every claim has a name of its own and "freed twice" is well
    /// defined.
    names: HashMap<(usize, usize), u32>,
    used: HashSet<(VolumeId, WorkloadId)>,
    /// Volumes whose last detach call failed, until time moves or an event may wake them.
    failed: HashSet<VolumeId>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    node_ok: bool,
    controller_ok: bool,
}

fn detach_volume(action: &Action) -> Option<&VolumeId> {
    match action {
        Action::NodeDetach(n) => Some(&n.volume),
        Action::ControllerDetach(c) => Some(&c.volume),
        Action::Persist(_) | Action::Reload(_) => None,
    }
}

fn config() -> MachineConfig {
    MachineConfig {
        backoff: BackoffPolicy::new(Duration::from_secs(1), Duration::from_secs(20)).unwrap(),
        ..MachineConfig::with_seed(11)
    }
}

impl World {
    fn new(access: Vec<AccessMode>, controller: Vec<bool>) -> Self {
        let infos = (0..VOLUMES)
            .map(|i| VolumeInfo {
                id: vid(i),
                external_id: ExternalVolumeId::new(format!("ext{i}")).unwrap(),
                plugin: PluginId::new(if i == 0 { "p0" } else { "p1" }).unwrap(),
                controller: if controller[i] {
                    ControllerRequirement::Required
                } else {
                    ControllerRequirement::NotRequired
                },
            })
            .collect();
        Self {
            machine: ReleaseMachine::new(config()),
            store: MemoryStore::new(),
            now: Instant::now(),
            infos,
            access,
            outstanding: Vec::new(),
            gone: HashSet::new(),
            progress: HashMap::new(),
            freed: HashSet::new(),
            names: HashMap::new(),
            used: HashSet::new(),
            failed: HashSet::new(),
        }
    }

    fn workload(&self, v: usize, slot: usize) -> WorkloadId {
        let suffix = self.names.get(&(v, slot)).copied().unwrap_or(0);
        WorkloadId::new(format!("w{slot}-{suffix}")).unwrap()
    }

    fn durable_state(&self, v: &VolumeId, w: &WorkloadId) -> Option<ClaimState> {
        let stored = self.store.load_now(v)?;
        stored.record.claim(w).map(|c| c.state().clone())
    }

    /// Collects new actions (checking the call-ordering invariants) and events.
    fn pump(&mut self) -> Result<(), TestCaseError> {
        while let Some(action) = self.machine.poll_action() {
            match &action {
                Action::NodeDetach(n) => {
                    let state = self.durable_state(&n.volume, &n.workload);
                    prop_assert_eq!(state, Some(ClaimState::Releasing), "node call for {:?}", n);
                }
                Action::ControllerDetach(c) => {
                    let state = self.durable_state(&c.volume, &c.workload);
                    prop_assert!(
                        matches!(state, Some(ClaimState::NodeDetached(_))),
                        "controller call for {:?} in durable state {:?}",
                        c,
                        state
                    );
                    let p = self
                        .progress
                        .get(&(c.volume.clone(), c.workload.clone()))
                        .copied();
                    let skipped = matches!(
                        state,
                        Some(ClaimState::NodeDetached(d)) if d.node == NodeStep::SkippedNodeGone
                    );
                    prop_assert!(
                        skipped || p.is_some_and(|p| p.node_ok),
                        "controller call before a node detach succeeded: {:?}",
                        c
                    );
                }
                Action::Persist(_) | Action::Reload(_) => {}
            }
            if let Some(volume) = detach_volume(&action) {
                prop_assert!(
                    !self
                        .outstanding
                        .iter()
                        .any(|a| detach_volume(a) == Some(volume)),
                    "two detach calls in flight for volume {}",
                    volume
                );
                prop_assert!(
                    !self.failed.contains(volume),
                    "volume {} retried at once after a failure, with nothing new to wake it",
                    volume
                );
            }
            if let Action::ControllerDetach(c) = &action {
                let busy = self
                    .outstanding
                    .iter()
                    .filter(|a| matches!(a, Action::ControllerDetach(o) if o.plugin == c.plugin))
                    .count();
                prop_assert!(
                    busy == 0,
                    "more than one controller call for plugin {}",
                    c.plugin
                );
            }
            self.outstanding.push(action);
        }
        while let Some(event) = self.machine.poll_event() {
            if let Event::Freed(claim) = event {
                self.check_freed(&claim)?;
            }
        }
        self.check_accounting()
    }

    fn check_freed(&mut self, claim: &Claim) -> Result<(), TestCaseError> {
        let key = (claim.volume().clone(), claim.workload().clone());
        prop_assert!(self.freed.insert(key.clone()), "freed twice: {:?}", key);
        let ClaimState::Freed(done) = claim.state() else {
            return Err(TestCaseError::fail(format!(
                "freed claim not in Freed: {claim:?}"
            )));
        };
        let p = self.progress.get(&key).copied().unwrap_or_default();
        match done.node {
            NodeStep::Detached { .. } => {
                prop_assert!(p.node_ok, "freed without node detach: {:?}", key)
            }
            NodeStep::SkippedNodeGone => prop_assert!(self.gone.contains(claim.node())),
            NodeStep::DoneElsewhere => prop_assert!(false, "one machine alone freed {:?}", key),
        }
        let info = self.infos.iter().find(|i| &i.id == claim.volume()).unwrap();
        match &done.controller {
            ControllerStep::Detached => prop_assert!(p.controller_ok),
            ControllerStep::SkippedNotRequired => {
                prop_assert_eq!(info.controller, ControllerRequirement::NotRequired)
            }
            ControllerStep::SkippedStillUsedOnNode { .. } => {
                prop_assert_eq!(info.controller, ControllerRequirement::Required)
            }
            ControllerStep::DoneElsewhere => {
                prop_assert!(false, "one machine alone freed {:?}", key)
            }
        }
        Ok(())
    }

    fn check_accounting(&self) -> Result<(), TestCaseError> {
        for (i, info) in self.infos.iter().enumerate() {
            if let Some(record) = self.machine.record(&info.id) {
                prop_assert!(
                    allowed(self.access[i], record.claims()),
                    "{:?} over its limits: {:?}",
                    self.access[i],
                    record.claims()
                );
            }
            if let Some(stored) = self.store.load_now(&info.id) {
                prop_assert!(allowed(self.access[i], stored.record.claims()));
            }
        }
        Ok(())
    }

    fn restart(&mut self) -> Result<(), TestCaseError> {
        self.outstanding.clear();
        self.failed.clear();
        self.machine = ReleaseMachine::new(config());
        for stored in self.store.load_all_now() {
            self.machine.load(stored).unwrap();
        }
        for node in self.gone.clone() {
            self.machine.node_gone(&node, self.now);
        }
        self.pump()
    }

    fn perform(&mut self, action: Action, outcome: Outcome) {
        let now = self.now;
        let result = |rpc| match outcome {
            Outcome::Ok => Ok(()),
            Outcome::AlreadyDone => Err(DetachError::new(rpc, ErrorClass::AlreadyDone, "gone")),
            Outcome::Fail(class) => Err(DetachError::new(rpc, class, "scripted")),
        };
        match action {
            Action::Persist(p) => {
                let r = self
                    .store
                    .compare_and_swap_now(&p.volume, p.expected, p.record.as_deref());
                self.machine.persisted(p.ticket, r, now);
            }
            Action::Reload(r) => {
                let stored = Ok(self.store.load_now(&r.volume));
                self.machine.reloaded(r.ticket, stored, now);
            }
            Action::NodeDetach(n) => {
                let r = result(DetachRpc::NodeUnpublish);
                if r.is_ok() || matches!(outcome, Outcome::AlreadyDone) {
                    self.progress
                        .entry((n.volume.clone(), n.workload.clone()))
                        .or_default()
                        .node_ok = true;
                }
                if matches!(outcome, Outcome::Fail(_)) {
                    self.failed.insert(n.volume.clone());
                }
                self.machine.node_detached(n.ticket, r, now);
            }
            Action::ControllerDetach(c) => {
                let r = result(DetachRpc::ControllerUnpublish);
                if r.is_ok() || matches!(outcome, Outcome::AlreadyDone) {
                    // One call detaches the volume from the node: it counts for every claim
                    // on that node whose node step was done when it was asked for (the
                    // machine takes no other step of the volume meanwhile).
                    let covered: Vec<WorkloadId> = self
                        .machine
                        .record(&c.volume)
                        .map(|rec| {
                            rec.claims()
                                .iter()
                                .filter(|x| {
                                    x.node() == &c.node
                                        && matches!(x.state(), ClaimState::NodeDetached(_))
                                })
                                .map(|x| x.workload().clone())
                                .collect()
                        })
                        .unwrap_or_default();
                    for w in covered.into_iter().chain([c.workload.clone()]) {
                        self.progress
                            .entry((c.volume.clone(), w))
                            .or_default()
                            .controller_ok = true;
                    }
                }
                if matches!(outcome, Outcome::Fail(_)) {
                    self.failed.insert(c.volume.clone());
                }
                self.machine.controller_detached(c.ticket, r, now);
            }
        }
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Claim { v, w, n, write } => {
                let info = self.infos[v].clone();
                let (volume, mut workload) = (vid(v), self.workload(v, w));
                let held = |m: &ReleaseMachine, w: &WorkloadId| {
                    m.record(&volume).is_some_and(|r| r.claim(w).is_some())
                };
                if self.used.contains(&(volume.clone(), workload.clone()))
                    && !held(&self.machine, &workload)
                {
                    *self.names.entry((v, w)).or_default() += 1;
                    workload = self.workload(v, w);
                }
                let request = ClaimRequest {
                    volume: volume.clone(),
                    workload: workload.clone(),
                    node: nid(n),
                    plugin_node: PluginNodeId::new(format!("sp{n}")).unwrap(),
                    mode: if write {
                        ClaimMode::Write
                    } else {
                        ClaimMode::Read
                    },
                    access_mode: self.access[v],
                    attachment: AccessTypeKind::Mount,
                };
                if self.machine.claim(&info, request, self.now).is_ok() {
                    self.used.insert((vid(v), workload));
                }
            }
            Op::Release { v, w } => {
                let workload = self.workload(v, w);
                let _ = self.machine.release(&vid(v), &workload, self.now);
            }
            Op::Answer { pick, outcome } => {
                if !self.outstanding.is_empty() {
                    let action = self.outstanding.remove(pick % self.outstanding.len());
                    self.perform(action, outcome);
                }
            }
            Op::WriteThenCrash { pick } => {
                let writes: Vec<usize> = (0..self.outstanding.len())
                    .filter(|i| matches!(self.outstanding[*i], Action::Persist(_)))
                    .collect();
                if !writes.is_empty() {
                    let Action::Persist(p) = self.outstanding.remove(writes[pick % writes.len()])
                    else {
                        unreachable!("filtered on Persist above");
                    };
                    let _ =
                        self.store
                            .compare_and_swap_now(&p.volume, p.expected, p.record.as_deref());
                    return self.restart();
                }
            }
            Op::Advance { secs } => {
                if secs > 0 {
                    self.failed.clear();
                }
                self.now += Duration::from_secs(secs);
                self.machine.handle_timeout(self.now);
            }
            Op::Restart => return self.restart(),
            Op::NodeGone { n } => {
                self.gone.insert(nid(n));
                self.failed.clear();
                self.machine.node_gone(&nid(n), self.now);
            }
            Op::PluginBack => {
                self.failed.clear();
                for plugin in ["p0", "p1"] {
                    let plugin = PluginId::new(plugin).unwrap();
                    self.machine.plugin_available(&plugin, None, self.now);
                }
            }
        }
        self.pump()
    }

    /// Failures stop: release everything and answer every call with success until the store
    /// is empty.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for round in 0..500 {
            for i in 0..VOLUMES {
                let holders: Vec<WorkloadId> = self
                    .machine
                    .record(&vid(i))
                    .map(|r| r.claims().iter().map(|c| c.workload().clone()).collect())
                    .unwrap_or_default();
                for w in holders {
                    let _ = self.machine.release(&vid(i), &w, self.now);
                }
            }
            self.pump()?;
            while let Some(action) = self.outstanding.pop() {
                self.perform(action, Outcome::Ok);
                self.pump()?;
            }
            if self.store.load_all_now().is_empty() && self.machine.volumes().next().is_none() {
                return Ok(());
            }
            self.now += Duration::from_secs(25);
            self.failed.clear();
            self.machine.handle_timeout(self.now);
            self.pump()?;
            prop_assert!(
                round < 499,
                "releases did not finish: {:?}",
                self.store.load_all_now()
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn releases_respect_access_modes_order_and_finish(
        access in proptest::collection::vec(proptest::sample::select(AccessMode::ALL.to_vec()), VOLUMES),
        controller in proptest::collection::vec(any::<bool>(), VOLUMES),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let mut world = World::new(access, controller);
        for op in ops {
            world.apply(op)?;
        }
        world.drain()?;
    }
}
