//! Transition tests with a fake clock: the machine is driven by hand, store writes are
//! performed at once against a [`MemoryStore`], and detach calls are answered by the test.

use std::num::NonZeroUsize;
use std::time::Duration;

use tokio::time::Instant;

use csi_structs::{
    AccessMode, AccessTypeKind, ErrorClass, ExternalVolumeId, NodeId, PluginId, PluginNodeId,
    VolumeId, WorkloadId,
};

use super::*;
use crate::accounting::DenyReason;
use crate::detach::DetachRpc;
use crate::model::ControllerRequirement;
use crate::store::MemoryStore;

fn vid(s: &str) -> VolumeId {
    VolumeId::new(s).unwrap()
}
fn wid(s: &str) -> WorkloadId {
    WorkloadId::new(s).unwrap()
}
fn nid(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

fn info(volume: &str, controller: ControllerRequirement) -> VolumeInfo {
    VolumeInfo {
        id: vid(volume),
        external_id: ExternalVolumeId::new(format!("ext-{volume}")).unwrap(),
        plugin: PluginId::new("plug").unwrap(),
        controller,
    }
}

fn request(
    volume: &str,
    workload: &str,
    node: &str,
    mode: ClaimMode,
    access: AccessMode,
) -> ClaimRequest {
    ClaimRequest {
        volume: vid(volume),
        workload: wid(workload),
        node: nid(node),
        plugin_node: PluginNodeId::new(format!("sp-{node}")).unwrap(),
        mode,
        access_mode: access,
        attachment: AccessTypeKind::Mount,
    }
}

/// A single-node writer's claim of `volume` for `workload` on `node`.
fn write_claim(volume: &str, workload: &str, node: &str) -> ClaimRequest {
    request(
        volume,
        workload,
        node,
        ClaimMode::Write,
        AccessMode::SingleNodeWriter,
    )
}

/// A multi-node reader's claim of `volume` for `workload` on `node`.
fn read_claim(volume: &str, workload: &str, node: &str) -> ClaimRequest {
    request(
        volume,
        workload,
        node,
        ClaimMode::Read,
        AccessMode::MultiNodeReaderOnly,
    )
}

/// A hand-driven machine: persists and reloads are applied at once, detach calls are
/// collected for the test to answer.
struct Harness {
    m: ReleaseMachine,
    store: MemoryStore,
    now: Instant,
    node_calls: Vec<NodeDetachRequest>,
    controller_calls: Vec<ControllerDetachRequest>,
    /// Every event but the progress reports of failed steps.
    events: Vec<Event>,
    /// [`Event::StepFailed`] and [`Event::StepRecovered`], in order.
    progress: Vec<Event>,
    /// Every persisted record's claim states, in order, for the volume under test.
    writes: Vec<Vec<(String, &'static str)>>,
    fail_next_persist: bool,
    /// Reads fail while set (a store that is down).
    reads_fail: bool,
}

impl Harness {
    fn new() -> Self {
        let config = MachineConfig {
            backoff: BackoffPolicy::new(Duration::from_secs(1), Duration::from_secs(30))
                .unwrap()
                .with_jitter_percent(0)
                .unwrap(),
            ..MachineConfig::with_seed(5)
        };
        Self::with_config(config)
    }

    fn with_config(config: MachineConfig) -> Self {
        Self {
            m: ReleaseMachine::new(config),
            store: MemoryStore::new(),
            now: Instant::now(),
            node_calls: Vec::new(),
            controller_calls: Vec::new(),
            events: Vec::new(),
            progress: Vec::new(),
            writes: Vec::new(),
            fail_next_persist: false,
            reads_fail: false,
        }
    }

    fn pump(&mut self) {
        while let Some(action) = self.m.poll_action() {
            match action {
                Action::Persist(p) => {
                    if std::mem::take(&mut self.fail_next_persist) {
                        let err = StoreError::LoadInterrupted;
                        self.m.persisted(p.ticket, Err(err), self.now);
                        continue;
                    }
                    self.writes.push(
                        p.record
                            .as_ref()
                            .map(|r| {
                                r.claims()
                                    .iter()
                                    .map(|c| (c.workload().to_string(), c.state().name()))
                                    .collect()
                            })
                            .unwrap_or_default(),
                    );
                    let result =
                        self.store
                            .compare_and_swap_now(&p.volume, p.expected, p.record.as_deref());
                    self.m.persisted(p.ticket, result, self.now);
                }
                Action::Reload(r) => {
                    let result = if self.reads_fail {
                        Err(StoreError::Interrupted {
                            volume: r.volume.clone(),
                        })
                    } else {
                        Ok(self.store.load_now(&r.volume))
                    };
                    self.m.reloaded(r.ticket, result, self.now);
                }
                Action::NodeDetach(n) => self.node_calls.push(n),
                Action::ControllerDetach(c) => self.controller_calls.push(c),
            }
        }
        while let Some(e) = self.m.poll_event() {
            match e {
                Event::StepFailed(_) | Event::StepRecovered { .. } => self.progress.push(e),
                _ => self.events.push(e),
            }
        }
    }

    fn claim(&mut self, info: &VolumeInfo, req: ClaimRequest) -> Result<Admitted, ClaimError> {
        let r = self.m.claim(info, req, self.now);
        self.pump();
        r
    }

    fn release(&mut self, volume: &str, workload: &str) {
        self.m
            .release(&vid(volume), &wid(workload), self.now)
            .unwrap();
        self.pump();
    }

    fn answer_node(&mut self, result: Result<(), DetachError>) -> NodeDetachRequest {
        let call = self.node_calls.remove(0);
        self.m.node_detached(call.ticket, result, self.now);
        self.pump();
        call
    }

    fn answer_controller(&mut self, result: Result<(), DetachError>) -> ControllerDetachRequest {
        let call = self.controller_calls.remove(0);
        self.m.controller_detached(call.ticket, result, self.now);
        self.pump();
        call
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        self.m.handle_timeout(self.now);
        self.pump();
    }

    fn stored_states(&self, volume: &str) -> Vec<&'static str> {
        self.store
            .load_now(&vid(volume))
            .map(|s| s.record.claims().iter().map(|c| c.state().name()).collect())
            .unwrap_or_default()
    }

    fn freed(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Freed(c) => Some(c.workload().to_string()),
                _ => None,
            })
            .collect()
    }
}

fn err(rpc: DetachRpc, class: ErrorClass) -> Result<(), DetachError> {
    Err(DetachError::new(rpc, class, "scripted"))
}

#[test]
fn a_claim_is_durable_only_after_its_write() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    let a = h.m.claim(&v, write_claim("v", "a", "n1"), h.now).unwrap();
    assert!(!a.durable);
    assert!(h.events.is_empty());
    h.pump();
    assert_eq!(
        h.events,
        [Event::ClaimDurable {
            volume: vid("v"),
            workload: wid("a")
        }]
    );
    assert_eq!(h.stored_states("v"), ["taken"]);
    // Claiming again with the same terms is idempotent and already durable.
    let again = h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    assert!(again.durable);
    assert_eq!(h.store.load_now(&vid("v")).unwrap().version, Version::FIRST);
}

#[test]
fn release_runs_node_then_controller_then_free_with_a_checkpoint_between_each() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    // Releasing is written before any call.
    assert_eq!(h.stored_states("v"), ["releasing"]);
    assert_eq!(h.node_calls.len(), 1);
    assert!(h.controller_calls.is_empty());
    let call = &h.node_calls[0];
    assert!(call.unstage, "last user on the node unstages");
    assert!(!call.read_only);
    assert_eq!(call.external_volume.as_str(), "ext-v");

    h.answer_node(Ok(()));
    assert_eq!(h.controller_calls.len(), 1);
    let ctrl = h.answer_controller(Ok(()));
    assert_eq!(ctrl.plugin_node.as_str(), "sp-n1");
    assert_eq!(ctrl.external_volume.as_str(), "ext-v");

    let states: Vec<Vec<&str>> = h
        .writes
        .iter()
        .map(|w| w.iter().map(|(_, s)| *s).collect())
        .collect();
    assert_eq!(
        states,
        [
            vec!["taken"],
            vec!["releasing"],
            vec!["node_detached"],
            vec!["controller_detached"],
            vec!["ready_to_free"],
            vec![],
        ]
    );
    assert!(h.store.load_now(&vid("v")).is_none(), "record deleted");
    assert_eq!(h.freed(), ["a"]);
    let Some(Event::Freed(claim)) = h.events.last() else {
        panic!("last event should be Freed");
    };
    assert_eq!(
        claim.state(),
        &ClaimState::Freed(DetachSteps {
            node: NodeStep::Detached { unstaged: true },
            controller: ControllerStep::Detached,
        })
    );
    assert!(
        h.m.record(&vid("v")).is_none(),
        "finished volumes are forgotten"
    );
}

#[test]
fn no_call_is_made_while_a_change_is_not_durable() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.m.release(&vid("v"), &wid("a"), h.now).unwrap();
    let Some(Action::Persist(p)) = h.m.poll_action() else {
        panic!("the release must be written first");
    };
    assert!(
        h.m.poll_action().is_none(),
        "no node call before the write is durable"
    );
    let result = h
        .store
        .compare_and_swap_now(&p.volume, p.expected, p.record.as_deref());
    h.m.persisted(p.ticket, result, h.now);
    let Some(Action::NodeDetach(n)) = h.m.poll_action() else {
        panic!("node call after the write");
    };
    h.m.node_detached(n.ticket, Ok(()), h.now);
    assert!(matches!(h.m.poll_action(), Some(Action::Persist(_))));
    assert!(
        h.m.poll_action().is_none(),
        "no controller call before node-detached is durable"
    );
}

#[test]
fn capacity_comes_back_only_when_freed() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::NotRequired);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    let denied = h.claim(&v, write_claim("v", "b", "n1")).unwrap_err();
    let ClaimError::Denied(d) = denied else {
        panic!("expected a denial, got {denied:?}");
    };
    assert_eq!(d.reason, DenyReason::SingleWorkload);
    assert_eq!(d.holders.0[0].workload, wid("a"));
    assert_eq!(d.holders.0[0].state, "releasing");
    h.answer_node(Ok(()));
    assert_eq!(h.freed(), ["a"]);
    h.claim(&v, write_claim("v", "b", "n1")).unwrap();
}

#[test]
fn missing_node_plugin_fails_the_step_and_requeues_with_backoff() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    h.answer_node(err(DetachRpc::NodeUnpublish, ErrorClass::RetryElsewhere));
    assert_eq!(h.stored_states("v"), ["releasing"], "never skipped");
    assert!(h.controller_calls.is_empty());
    assert!(h.node_calls.is_empty(), "no immediate retry");
    assert_eq!(h.m.poll_timeout(), Some(h.now + Duration::from_secs(1)));

    let status = h.m.status(&vid("v")).unwrap();
    assert_eq!(status.attempts, 1);
    assert_eq!(
        status.last_error.as_ref().and_then(LastError::class),
        Some(ErrorClass::RetryElsewhere)
    );
    assert_eq!(status.next_retry, Some(h.now + Duration::from_secs(1)));
    assert_eq!(h.m.stuck().len(), 1);

    // Not yet due: nothing happens.
    h.advance(Duration::from_millis(999));
    assert!(h.node_calls.is_empty());
    h.advance(Duration::from_millis(1));
    assert_eq!(h.node_calls.len(), 1);
    h.answer_node(err(DetachRpc::NodeUnpublish, ErrorClass::RetryElsewhere));
    assert_eq!(
        h.m.poll_timeout(),
        Some(h.now + Duration::from_secs(2)),
        "backoff doubles"
    );

    // The plugin comes back: retried at once, without waiting out the backoff.
    h.m.plugin_available(&PluginId::new("plug").unwrap(), Some(&nid("n1")), h.now);
    h.pump();
    assert_eq!(h.node_calls.len(), 1);
    h.answer_node(Ok(()));
    h.answer_controller(Ok(()));
    assert_eq!(h.freed(), ["a"]);
}

#[test]
fn a_failed_step_and_a_freed_claim_are_logged_one_line_each() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    h.answer_node(err(DetachRpc::NodeUnpublish, ErrorClass::RetryElsewhere));
    h.advance(Duration::from_secs(1));
    h.answer_node(Ok(()));
    h.answer_controller(Ok(()));
    let events: Vec<Event> = h.progress.iter().chain(&h.events).cloned().collect();
    let lines = csi_testkit::logs::capture(|| events.iter().for_each(Event::log));
    let line = |message: &str| {
        let found: Vec<&String> = lines.iter().filter(|l| l.contains(message)).collect();
        assert_eq!(found.len(), 1, "{message:?} in {lines:#?}");
        found[0].clone()
    };
    let failed = line("release step failed; retry scheduled");
    assert!(failed.starts_with(" WARN"), "{failed}");
    for field in [
        "volume=v",
        "workload=a",
        "class=retry_elsewhere",
        "attempt=1",
    ] {
        assert!(failed.contains(field), "{field} in {failed}");
    }
    assert!(line("release step succeeded after failing").contains("failed_attempts=1"));
    let freed = line("claim freed");
    assert!(
        freed.starts_with(" INFO") && freed.contains("node=n1"),
        "{freed}"
    );
}

#[test]
fn already_done_counts_as_success() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, read_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    assert!(h.node_calls[0].read_only);
    h.answer_node(err(DetachRpc::NodeUnpublish, ErrorClass::AlreadyDone));
    h.answer_controller(err(DetachRpc::ControllerUnpublish, ErrorClass::AlreadyDone));
    assert_eq!(h.freed(), ["a"]);
    assert!(h.m.stuck().is_empty());
}

#[test]
fn fatal_errors_retry_at_the_cap() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    h.answer_node(Ok(()));
    h.answer_controller(err(DetachRpc::ControllerUnpublish, ErrorClass::Fatal));
    assert_eq!(h.m.poll_timeout(), Some(h.now + Duration::from_secs(30)));
    assert_eq!(h.stored_states("v"), ["node_detached"]);
    h.advance(Duration::from_secs(30));
    h.answer_controller(Ok(()));
    assert_eq!(h.freed(), ["a"]);
}

#[test]
fn a_gone_node_is_recorded_before_its_node_step_is_skipped() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.m.node_gone(&nid("n1"), h.now);
    h.pump();
    assert!(h.node_calls.is_empty(), "no call to a gone node");
    let states: Vec<&str> = h
        .writes
        .iter()
        .filter_map(|w| w.first().map(|(_, s)| *s))
        .collect();
    assert_eq!(states, ["taken", "releasing", "node_detached"]);
    // The controller detach still happens, with the plugin's node id kept in the claim.
    let ctrl = h.answer_controller(Ok(()));
    assert_eq!(ctrl.plugin_node.as_str(), "sp-n1");
    let Some(Event::Freed(claim)) = h.events.last() else {
        panic!("freed expected");
    };
    assert_eq!(claim.state().node_step(), Some(NodeStep::SkippedNodeGone));
    // Nothing can be claimed on a gone node.
    let e = h.claim(&v, write_claim("v", "b", "n1")).unwrap_err();
    assert!(matches!(e, ClaimError::NodeGone { .. }));
}

/// A claim released as gone, its controller step refused at the cap (the volume still staged
/// on the node): the node comes back and unpublishes it itself.
fn released_as_gone_and_refused(h: &mut Harness) {
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.m.node_gone(&nid("n1"), h.now);
    h.pump();
    h.answer_controller(err(DetachRpc::ControllerUnpublish, ErrorClass::Fatal));
    assert_eq!(h.m.poll_timeout(), Some(h.now + Duration::from_secs(30)));
    assert!(h.controller_calls.is_empty());
}

#[test]
fn a_returned_node_s_own_unpublish_is_recorded_and_the_controller_step_retried_at_once() {
    let mut h = Harness::new();
    released_as_gone_and_refused(&mut h);
    h.m.node_returned(&nid("n1"), h.now);
    h.pump();
    // The return alone wakes the step, which is refused again: the volume is still there.
    h.answer_controller(err(DetachRpc::ControllerUnpublish, ErrorClass::Fatal));
    let writes = h.writes.len();

    assert!(
        h.m.node_detached_after_return(&vid("v"), &wid("a"), &nid("n1"), true, h.now),
        "the claim's node step was skipped and its controller step not run"
    );
    h.pump();
    assert_eq!(h.writes.len(), writes + 1, "recorded before the retry");
    assert_eq!(h.stored_states("v"), ["node_detached"]);
    assert_eq!(
        h.controller_calls.len(),
        1,
        "retried now, not after the backoff"
    );
    h.answer_controller(Ok(()));
    let Some(Event::Freed(claim)) = h.events.last() else {
        panic!("freed expected: {:?}", h.events);
    };
    assert_eq!(
        claim.state().node_step(),
        Some(NodeStep::Detached { unstaged: true })
    );
    // Once freed there is nothing to record.
    assert!(!h.m.node_detached_after_return(&vid("v"), &wid("a"), &nid("n1"), true, h.now));
}

#[test]
fn only_a_skipped_node_step_of_that_node_waiting_for_its_controller_step_is_recorded() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    h.answer_node(Ok(()));
    let writes = h.writes.len();
    h.answer_controller(err(DetachRpc::ControllerUnpublish, ErrorClass::Fatal));
    // Its node step ran: not skipped.
    assert!(!h.m.node_detached_after_return(&vid("v"), &wid("a"), &nid("n1"), false, h.now));
    h.pump();
    assert_eq!(h.writes.len(), writes, "nothing recorded");
    assert!(h.controller_calls.is_empty(), "still backing off");

    let mut gone = Harness::new();
    released_as_gone_and_refused(&mut gone);
    // Another node, another workload, another volume: nothing.
    assert!(
        !gone
            .m
            .node_detached_after_return(&vid("v"), &wid("a"), &nid("n2"), true, gone.now)
    );
    assert!(
        !gone
            .m
            .node_detached_after_return(&vid("v"), &wid("b"), &nid("n1"), true, gone.now)
    );
    assert!(
        !gone
            .m
            .node_detached_after_return(&vid("w"), &wid("a"), &nid("n1"), true, gone.now)
    );
    gone.pump();
    assert!(gone.controller_calls.is_empty(), "still backing off");
}

#[test]
fn the_agent_with_the_controller_duty_sees_the_returned_node_s_record_and_retries_at_once() {
    // `duty` performs every step, as the holder of the controller duty does for a gone node.
    let mut duty = Harness::new();
    released_as_gone_and_refused(&mut duty);
    let stored = duty.store.load_now(&vid("v")).unwrap();

    // The returned node's machine: its own node steps only, no controller duty.
    let config = MachineConfig {
        duties: Duties::node(nid("n1"), false),
        ..MachineConfig::with_seed(9)
    };
    let mut node = ReleaseMachine::new(config);
    node.observed(&vid("v"), stored.version, Some(stored.record), duty.now);
    assert!(node.poll_action().is_none(), "nothing of its own to do");
    assert!(node.node_detached_after_return(&vid("v"), &wid("a"), &nid("n1"), false, duty.now));
    let Some(Action::Persist(p)) = node.poll_action() else {
        panic!("the record is written");
    };
    assert!(!p.fenced, "a node-side record: no controller duty needed");
    let written = duty
        .store
        .compare_and_swap_now(&p.volume, p.expected, p.record.as_deref())
        .unwrap()
        .expect("a record");
    node.persisted(p.ticket, Ok(Some(written)), duty.now);
    assert!(
        node.poll_action().is_none(),
        "the controller step is not its own"
    );

    // The store's watch brings the change to the duty holder, which retries at once.
    duty.m
        .observed(&vid("v"), written, p.record.as_deref().cloned(), duty.now);
    duty.pump();
    assert_eq!(duty.controller_calls.len(), 1, "no wait for the backoff");
    duty.answer_controller(Ok(()));
    assert_eq!(duty.freed(), ["a"]);
}

#[test]
fn unreachable_is_not_gone_a_failing_node_step_never_skips() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    for _ in 0..6 {
        h.answer_node(err(DetachRpc::NodeUnstage, ErrorClass::Retry));
        assert!(h.controller_calls.is_empty());
        let due = h.m.poll_timeout().unwrap();
        h.advance(due - h.now);
    }
    assert_eq!(h.stored_states("v"), ["releasing"]);
    assert_eq!(h.m.status(&vid("v")).unwrap().attempts, 6);
}

#[test]
fn controller_step_is_skipped_while_another_claim_uses_the_node() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    let req =
        |w: &str, n: &str| request("v", w, n, ClaimMode::Read, AccessMode::MultiNodeReaderOnly);
    h.claim(&v, req("a", "n1")).unwrap();
    h.claim(&v, req("b", "n1")).unwrap();
    h.claim(&v, req("c", "n2")).unwrap();
    h.release("v", "a");
    let call = h.answer_node(Ok(()));
    assert!(!call.unstage, "b still uses n1: no unstage");
    assert!(
        h.controller_calls.is_empty(),
        "b still uses n1: no controller detach"
    );
    let Some(Event::Freed(a)) = h.events.last() else {
        panic!("a freed");
    };
    assert_eq!(
        a.state().controller_step(),
        Some(&ControllerStep::SkippedStillUsedOnNode { by: wid("b") })
    );
    h.release("v", "b");
    let call = h.answer_node(Ok(()));
    assert!(call.unstage, "b was the last user on n1");
    let ctrl = h.answer_controller(Ok(()));
    assert_eq!(ctrl.node, nid("n1"));
    assert_eq!(h.freed(), ["a", "b"]);
    assert_eq!(h.stored_states("v"), ["taken"], "c untouched");
}

#[test]
fn controller_step_is_skipped_when_the_plugin_needs_none() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::NotRequired);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    h.answer_node(Ok(()));
    assert!(h.controller_calls.is_empty());
    let Some(Event::Freed(a)) = h.events.last() else {
        panic!("a freed");
    };
    assert_eq!(
        a.state().controller_step(),
        Some(&ControllerStep::SkippedNotRequired)
    );
}

#[test]
fn controller_calls_per_plugin_are_bounded() {
    for (limit, expect) in [(1, 1), (2, 2)] {
        let mut config = MachineConfig::with_seed(1);
        config.controller_calls_per_plugin = NonZeroUsize::new(limit).unwrap();
        let mut h = Harness::with_config(config);
        for name in ["v1", "v2", "v3"] {
            let v = info(name, ControllerRequirement::Required);
            h.claim(
                &v,
                request(
                    name,
                    "w",
                    "n1",
                    ClaimMode::Write,
                    AccessMode::SingleNodeWriter,
                ),
            )
            .unwrap();
            h.release(name, "w");
        }
        while !h.node_calls.is_empty() {
            h.answer_node(Ok(()));
        }
        assert_eq!(h.controller_calls.len(), expect, "limit {limit}");
        let waiting =
            h.m.volumes()
                .filter_map(|v| h.m.status(v))
                .filter(|s| matches!(s.pending, ReleaseWait::ControllerSlot(_)))
                .count();
        assert_eq!(waiting, 3 - expect);
        // Each answer frees a slot for the next one; all finish.
        while !h.controller_calls.is_empty() {
            h.answer_controller(Ok(()));
            assert!(h.controller_calls.len() <= expect);
        }
        assert_eq!(h.freed().len(), 3);
    }
}

/// The name of the `i`th volume of [`lined_up`].
fn lined(i: usize) -> String {
    format!("v{i:02}")
}

/// `n` volumes of one plugin, each released on n1 with its node step answered in turn: the
/// first `limit` are at their controller calls, the others wait for a slot in that order.
fn lined_up(limit: usize, n: usize) -> Harness {
    let mut config = MachineConfig::with_seed(1);
    config.controller_calls_per_plugin = NonZeroUsize::new(limit).unwrap();
    let mut h = Harness::with_config(config);
    for i in 0..n {
        let name = lined(i);
        h.claim(
            &info(&name, ControllerRequirement::Required),
            write_claim(&name, "w", "n1"),
        )
        .unwrap();
        h.release(&name, "w");
        h.answer_node(Ok(()));
    }
    assert_eq!(h.controller_calls.len(), limit.min(n));
    assert_eq!(waiting_for_slot(&h), lined_volumes(limit..n));
    h
}

fn lined_volumes(range: std::ops::Range<usize>) -> Vec<VolumeId> {
    range.map(|i| vid(&lined(i))).collect()
}

/// The volumes in line for a controller slot of the plugin, oldest first.
fn waiting_for_slot(h: &Harness) -> Vec<VolumeId> {
    let line: Vec<VolumeId> =
        h.m.slots
            .get(&PluginId::new("plug").unwrap())
            .map(|s| s.waiters.iter().cloned().collect())
            .unwrap_or_default();
    // The line is exactly the volumes that show as waiting for a slot.
    let mut shown: Vec<&VolumeId> =
        h.m.volumes()
            .filter(|v| {
                matches!(
                    h.m.status(v).unwrap().pending,
                    ReleaseWait::ControllerSlot(_)
                )
            })
            .collect();
    shown.sort();
    let mut sorted: Vec<&VolumeId> = line.iter().collect();
    sorted.sort();
    assert_eq!(shown, sorted, "the line holds each waiting volume once");
    line
}

/// Volumes woken from the line and not yet looked at.
fn woken(h: &Harness) -> usize {
    h.m.volumes
        .values()
        .filter(|e| e.slot_grant.is_some())
        .count()
}

#[test]
fn a_freed_controller_slot_wakes_only_the_oldest_waiter() {
    let n = 50;
    let mut h = lined_up(1, n);
    let mut issued = vec![h.controller_calls[0].volume.clone()];
    for i in 0..n {
        let call = h.controller_calls.remove(0);
        assert_eq!(call.volume, vid(&lined(i)));
        h.m.controller_detached(call.ticket, Ok(()), h.now);
        // One slot freed: one waiter woken (the oldest), the others left waiting.
        let more = usize::from(i + 1 < n);
        assert_eq!(woken(&h), more, "after answer {i}");
        assert_eq!(
            h.m.ready.len(),
            1 + more,
            "the answered volume and the woken one"
        );
        assert_eq!(waiting_for_slot(&h), lined_volumes((i + 2).min(n)..n));
        h.pump();
        // Exactly one new controller call, for the volume that waited longest.
        assert_eq!(h.controller_calls.len(), more, "after answer {i}");
        issued.extend(h.controller_calls.iter().map(|c| c.volume.clone()));
        assert_eq!(woken(&h), 0);
    }
    assert_eq!(
        issued,
        lined_volumes(0..n),
        "calls made in the order the volumes waited"
    );
    assert_eq!(h.freed().len(), n);
    assert!(h.m.slots.values().all(|s| s.busy == 0 && s.granted == 0));
}

#[test]
fn a_woken_waiter_that_no_longer_needs_the_slot_passes_it_on() {
    let mut h = lined_up(1, 4);
    // Another writer finished v01's release and deleted its record while v01 waited.
    let stored = h.store.load_now(&vid(&lined(1))).unwrap();
    h.store
        .compare_and_swap_now(&vid(&lined(1)), Some(stored.version), None)
        .unwrap();
    let deleted = Version::after(Some(stored.version));
    h.m.observed(&vid(&lined(1)), deleted, None, h.now);
    h.pump();
    assert_eq!(waiting_for_slot(&h), lined_volumes(1..4), "still in line");

    // v00's slot is woken for v01, which has nothing left to do: v02 gets it.
    h.answer_controller(Ok(()));
    let next: Vec<&VolumeId> = h.controller_calls.iter().map(|c| &c.volume).collect();
    assert_eq!(next, [&vid(&lined(2))]);
    assert!(h.m.record(&vid(&lined(1))).is_none(), "v01 dropped");
    assert_eq!(waiting_for_slot(&h), lined_volumes(3..4));
    h.answer_controller(Ok(()));
    assert_eq!(h.controller_calls[0].volume, vid(&lined(3)));
    h.answer_controller(Ok(()));
    // v00, v02 and v03 freed here, v01's claim announced as freed elsewhere.
    assert_eq!(h.freed().len(), 4);
    assert!(h.m.slots.values().all(|s| s.busy == 0 && s.granted == 0));
}

#[test]
fn waiters_woken_after_the_controller_duty_is_lost_are_not_stranded() {
    let mut h = lined_up(1, 5);
    let call = h.controller_calls.remove(0);
    h.m.controller_not_started(call.ticket, NotStarted::NotHolder, h.now);
    h.pump();
    // Without the duty nobody takes the slot: each woken waiter passes it on, once.
    assert!(h.controller_calls.is_empty());
    assert!(waiting_for_slot(&h).is_empty(), "nobody left waiting");
    assert_eq!(woken(&h), 0);
    // With the duty back the volumes go again, one call at a time, and all finish.
    h.m.set_controller_duty(true, h.now);
    h.pump();
    assert_eq!(h.controller_calls.len(), 1);
    assert_eq!(waiting_for_slot(&h).len(), 4);
    let mut done = 0;
    while !h.controller_calls.is_empty() {
        h.answer_controller(Ok(()));
        done += 1;
        assert!(h.controller_calls.len() <= 1);
    }
    assert_eq!(done, 5);
    assert_eq!(h.freed().len(), 5);
}

#[test]
fn with_two_slots_each_freed_slot_wakes_one_waiter_in_order() {
    let n = 10;
    let mut h = lined_up(2, n);
    let mut issued: Vec<VolumeId> = h
        .controller_calls
        .iter()
        .map(|c| c.volume.clone())
        .collect();
    assert_eq!(issued, lined_volumes(0..2));

    // One answer: one new call, for the oldest waiter.
    h.answer_controller(Ok(()));
    assert_eq!(h.controller_calls.len(), 2);
    issued.push(h.controller_calls[1].volume.clone());
    assert_eq!(waiting_for_slot(&h), lined_volumes(3..n));

    // Both slots freed before the machine is polled: the two oldest waiters are woken.
    let calls = std::mem::take(&mut h.controller_calls);
    for call in &calls {
        h.m.controller_detached(call.ticket, Ok(()), h.now);
    }
    assert_eq!(woken(&h), 2);
    assert_eq!(waiting_for_slot(&h), lined_volumes(5..n));
    h.pump();
    assert_eq!(h.controller_calls.len(), 2);
    issued.extend(h.controller_calls.iter().map(|c| c.volume.clone()));

    while !h.controller_calls.is_empty() {
        let before = h.controller_calls.len();
        h.answer_controller(Ok(()));
        assert!(h.controller_calls.len() <= 2);
        if h.controller_calls.len() == before {
            issued.push(h.controller_calls.last().unwrap().volume.clone());
        }
    }
    assert_eq!(
        issued,
        lined_volumes(0..n),
        "calls made in the order the volumes waited"
    );
    assert_eq!(h.freed().len(), n);
}

#[test]
fn a_woken_waiter_with_a_write_to_make_first_keeps_its_place_in_line() {
    let mut config = MachineConfig::with_seed(1);
    config.controller_calls_per_plugin = NonZeroUsize::new(1).unwrap();
    let mut h = Harness::with_config(config);
    // v01 has two readers: r1 on n1 and r2 on n2. The others have one writer on n1.
    for i in 0..4 {
        let name = lined(i);
        let info = info(&name, ControllerRequirement::Required);
        if i == 1 {
            h.claim(&info, read_claim(&name, "r1", "n1")).unwrap();
            h.claim(&info, read_claim(&name, "r2", "n2")).unwrap();
        } else {
            h.claim(&info, write_claim(&name, "w", "n1")).unwrap();
        }
    }
    for i in 0..4 {
        let workload = if i == 1 { "r1" } else { "w" };
        h.release(&lined(i), workload);
        h.answer_node(Ok(()));
    }
    assert_eq!(waiting_for_slot(&h), lined_volumes(1..4));

    // v00's answer wakes v01; before v01 is looked at, its r2 is released too, so a store
    // write of v01 comes before its controller call, and the slot goes to v02 meanwhile.
    let call = h.controller_calls.remove(0);
    h.m.controller_detached(call.ticket, Ok(()), h.now);
    h.m.release(&vid(&lined(1)), &wid("r2"), h.now).unwrap();
    h.pump();
    let next: Vec<&VolumeId> = h.controller_calls.iter().map(|c| &c.volume).collect();
    assert_eq!(next, [&vid(&lined(2))]);
    // v01 kept its place: it waits ahead of v03, which joined the line after it.
    assert_eq!(waiting_for_slot(&h), [vid(&lined(1)), vid(&lined(3))]);

    let mut issued = vec![vid(&lined(0)), vid(&lined(2))];
    while !h.controller_calls.is_empty() || !h.node_calls.is_empty() {
        if h.node_calls.is_empty() {
            h.answer_controller(Ok(()));
        } else {
            h.answer_node(Ok(()));
        }
        issued.extend(h.controller_calls.iter().map(|c| c.volume.clone()));
        issued.dedup();
    }
    let order = [0, 2, 1, 3].map(|i| vid(&lined(i)));
    assert_eq!(
        &issued[..4],
        order.as_slice(),
        "v01's call comes before v03's"
    );
    assert_eq!(h.freed().len(), 5);
    assert!(h.m.slots.values().all(|s| s.busy == 0 && s.granted == 0));
}

#[test]
fn a_claim_cannot_race_a_controller_detach_on_the_same_node() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    let req =
        |w: &str, n: &str| request("v", w, n, ClaimMode::Read, AccessMode::MultiNodeReaderOnly);
    h.claim(&v, req("a", "n1")).unwrap();
    h.release("v", "a");
    h.answer_node(Ok(()));
    assert_eq!(h.controller_calls.len(), 1);
    assert!(matches!(
        h.claim(&v, req("b", "n1")),
        Err(ClaimError::DetachInFlight { .. })
    ));
    h.claim(&v, req("c", "n2")).unwrap();
    h.answer_controller(Ok(()));
    h.claim(&v, req("b", "n1")).unwrap();
}

#[test]
fn a_claim_cannot_race_an_unstage_on_the_same_node() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::NotRequired);
    let req =
        |w: &str, n: &str| request("v", w, n, ClaimMode::Read, AccessMode::MultiNodeReaderOnly);
    h.claim(&v, req("a", "n1")).unwrap();
    h.release("v", "a");
    assert!(h.node_calls[0].unstage);
    assert!(matches!(
        h.claim(&v, req("b", "n1")),
        Err(ClaimError::DetachInFlight { .. })
    ));
    h.answer_node(Ok(()));
    h.claim(&v, req("b", "n1")).unwrap();
}

#[test]
fn a_stale_writer_reloads_and_loses_its_unwritten_claim() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, read_claim("v", "a", "n1")).unwrap();
    // Another writer replaces the record behind the machine's back.
    let mut other = h.store.load_now(&vid("v")).unwrap();
    other.record.claims[0].workload = wid("z");
    h.store
        .compare_and_swap_now(&vid("v"), Some(other.version), Some(&other.record))
        .unwrap();
    h.events.clear();
    h.claim(&v, read_claim("v", "b", "n1")).unwrap();
    assert_eq!(
        h.events,
        [Event::ClaimLost {
            volume: vid("v"),
            workload: wid("b")
        }]
    );
    let record = h.m.record(&vid("v")).unwrap();
    let holders: Vec<_> = record
        .claims()
        .iter()
        .map(|c| c.workload().as_str())
        .collect();
    assert_eq!(holders, ["z"], "the stored record wins");
}

#[test]
fn a_write_whose_outcome_is_unknown_is_settled_by_reading_the_volume_at_once() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    // The store fails the write but reads fine: the claim is not there, so it is lost.
    h.fail_next_persist = true;
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    assert!(
        matches!(&h.events[..], [Event::ClaimLost { .. }]),
        "{:?}",
        h.events
    );
    assert!(h.m.stuck().is_empty(), "the read settled it");
    // The store wrote it, then failed (say, while syncing): the read finds it durable.
    h.events.clear();
    h.m.claim(&v, write_claim("v", "b", "n1"), h.now).unwrap();
    let Some(Action::Persist(write)) = h.m.poll_action() else {
        panic!("a write is asked for");
    };
    h.store
        .compare_and_swap_now(&write.volume, write.expected, write.record.as_deref())
        .unwrap();
    h.m.persisted(write.ticket, Err(StoreError::LoadInterrupted), h.now);
    h.pump();
    assert!(
        matches!(&h.events[..], [Event::ClaimDurable { .. }]),
        "{:?}",
        h.events
    );
    assert_eq!(h.stored_states("v"), ["taken"]);
}

#[test]
fn a_store_that_is_down_answers_at_once_and_the_volume_is_read_again_later() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.fail_next_persist = true;
    h.reads_fail = true;
    let a = h.claim(&v, read_claim("v", "a", "n1")).unwrap();
    assert!(!a.durable);
    // The waiter hears at once, with the store's error; the claim is not shown as held.
    assert!(
        matches!(&h.events[..], [Event::ClaimNotStored { workload, reason, .. }]
            if workload.as_str() == "a" && reason.contains("did not finish")),
        "{:?}",
        h.events
    );
    assert!(h.m.record(&vid("v")).unwrap().claims().is_empty());
    assert!(h.m.stored_record(&vid("v")).unwrap().claims().is_empty());
    let status = h.m.status(&vid("v")).unwrap();
    assert!(matches!(status.last_error, Some(LastError::Store { .. })));
    assert_eq!(
        h.m.stuck().len(),
        1,
        "the volume shows as stuck on the store"
    );
    // Meanwhile the volume refuses claims and releases at once, naming the store's error.
    let refused =
        h.m.claim(&v, read_claim("v", "b", "n1"), h.now)
            .unwrap_err();
    assert!(
        matches!(&refused, ClaimError::StoreUnavailable { reason, .. }
            if reason.contains("did not finish")),
        "{refused}"
    );
    assert_eq!(refused.class(), ErrorClass::Retry);
    let refused = h.m.release(&vid("v"), &wid("a"), h.now).unwrap_err();
    assert!(matches!(refused, ReleaseError::StoreUnavailable { .. }));
    // The refused calls make the volume be read again at once: still down, still refused.
    h.pump();
    assert!(h.m.is_reloading(&vid("v")));
    // The store works again: the next attempt reads the volume, and claims are accepted.
    h.reads_fail = false;
    assert!(h.m.claim(&v, read_claim("v", "b", "n1"), h.now).is_err());
    h.pump();
    assert!(!h.m.is_reloading(&vid("v")));
    assert!(h.m.stuck().is_empty(), "{:?}", h.m.stuck());
    assert!(
        h.stored_states("v").is_empty(),
        "nothing was stored meanwhile"
    );
    h.events.clear();
    h.claim(&v, read_claim("v", "b", "n1")).unwrap();
    assert!(matches!(&h.events[..], [Event::ClaimDurable { .. }]));
    assert_eq!(h.stored_states("v"), ["taken"]);
}

#[test]
fn without_new_calls_a_failed_volume_is_read_again_after_its_backoff() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.fail_next_persist = true;
    h.reads_fail = true;
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    assert!(h.m.is_reloading(&vid("v")));
    h.reads_fail = false;
    h.advance(Duration::from_millis(999));
    assert!(h.m.is_reloading(&vid("v")), "still backing off");
    h.advance(Duration::from_millis(1));
    assert!(!h.m.is_reloading(&vid("v")), "read again after 1 s");
    assert!(h.m.stuck().is_empty());
}

#[test]
fn the_store_answering_for_one_volume_ends_the_wait_of_the_others() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    let w = info("w", ControllerRequirement::Required);
    h.fail_next_persist = true;
    h.reads_fail = true;
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    assert!(h.m.is_reloading(&vid("v")));
    h.reads_fail = false;
    h.claim(&w, write_claim("w", "a", "n1")).unwrap();
    assert!(
        !h.m.is_reloading(&vid("v")),
        "read again as soon as the store answered for w"
    );
}

#[test]
fn a_claim_that_did_reach_a_failing_store_comes_back_when_read_again() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    let a = write_claim("v", "a", "n1");
    h.m.claim(&v, a.clone(), h.now).unwrap();
    let Some(Action::Persist(write)) = h.m.poll_action() else {
        panic!("a write is asked for");
    };
    h.store
        .compare_and_swap_now(&write.volume, write.expected, write.record.as_deref())
        .unwrap();
    h.reads_fail = true;
    h.m.persisted(write.ticket, Err(StoreError::LoadInterrupted), h.now);
    h.pump();
    assert!(matches!(&h.events[..], [Event::ClaimNotStored { .. }]));
    assert!(h.m.record(&vid("v")).unwrap().claims().is_empty());
    h.reads_fail = false;
    h.advance(Duration::from_secs(1));
    let record = h.m.stored_record(&vid("v")).unwrap();
    assert_eq!(record.claims().len(), 1, "read back from the store");
    h.events.clear();
    let again = h.claim(&v, a).unwrap();
    assert!(
        again.durable,
        "claiming again with the same terms finds it durable"
    );
}

#[test]
fn a_release_whose_write_fails_while_the_store_is_down_is_answered_at_once() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.events.clear();
    h.fail_next_persist = true;
    h.reads_fail = true;
    h.release("v", "a");
    assert!(
        matches!(&h.events[..], [Event::ReleaseNotStored { workload, .. }] if workload.as_str() == "a"),
        "{:?}",
        h.events
    );
    assert!(
        h.node_calls.is_empty(),
        "no step before the release is durable"
    );
    h.reads_fail = false;
    h.advance(Duration::from_secs(1));
    assert_eq!(
        h.stored_states("v"),
        ["taken"],
        "the store never had the release; the claim is held as stored"
    );
    assert_eq!(
        h.m.record(&vid("v")).unwrap().claims()[0].state().name(),
        "taken"
    );
    assert!(h.node_calls.is_empty());
}

#[test]
fn a_claim_is_not_shown_before_its_write_returns() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.m.claim(&v, write_claim("v", "a", "n1"), h.now).unwrap();
    assert_eq!(h.m.record(&vid("v")).unwrap().claims().len(), 1);
    assert!(h.m.stored_record(&vid("v")).unwrap().claims().is_empty());
    h.pump();
    assert_eq!(h.m.stored_record(&vid("v")).unwrap().claims().len(), 1);
}

#[test]
fn an_older_record_is_rewritten_in_the_current_format_at_once() {
    let bytes = br#"{"volume": {"id": "v", "external_id": "e", "plugin": "plug",
        "controller": "required",
        "capabilities": [{"access_mode": "multi_node_single_writer", "access_type": "block"}]},
        "claims": [{"workload": "a", "node": "n1", "plugin_node": "sp-n1", "mode": "write",
                    "state": {"state": "releasing"}}]}"#;
    let (record, format) = crate::store::decode(bytes).unwrap();
    assert_eq!(format, Format::V1);
    let claim = &record.claims()[0];
    assert_eq!(claim.access_mode(), AccessMode::MultiNodeSingleWriter);
    assert_eq!(claim.attachment(), AccessTypeKind::Block);
    let mut h = Harness::new();
    h.store
        .compare_and_swap_now(&vid("v"), None, Some(&record))
        .unwrap();
    h.m.load(Stored {
        version: Version::FIRST,
        record,
        format,
    })
    .unwrap();
    h.pump();
    // The full form is written before the release resumes.
    assert_eq!(h.writes.len(), 1);
    assert_eq!(h.node_calls.len(), 1);
    assert_eq!(h.node_calls[0].attachment, AccessTypeKind::Block);
}

#[test]
fn attachment_mode_of_a_claimed_volume_cannot_change() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, read_claim("v", "a", "n1")).unwrap();
    let mut req = read_claim("v", "b", "n2");
    req.attachment = AccessTypeKind::Block;
    let ClaimError::Denied(d) = h.claim(&v, req).unwrap_err() else {
        panic!("denial expected");
    };
    assert_eq!(
        d.reason,
        DenyReason::AttachmentModeChange {
            held: AccessTypeKind::Mount
        }
    );
    let text = d.to_string();
    assert!(
        text.contains("volume v") && text.contains("a (read on n1, taken)"),
        "{text}"
    );
}

#[test]
fn volume_identity_is_checked() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, read_claim("v", "a", "n1")).unwrap();
    let mut other = v.clone();
    other.plugin = PluginId::new("other").unwrap();
    assert!(matches!(
        h.claim(&other, read_claim("v", "b", "n1")),
        Err(ClaimError::VolumeInfoMismatch {
            field: "plugin",
            ..
        })
    ));
    assert!(matches!(
        h.claim(&v, read_claim("w", "b", "n1")),
        Err(ClaimError::VolumeMismatch { .. })
    ));
    assert!(matches!(
        h.m.release(&vid("v"), &wid("nobody"), h.now),
        Err(ReleaseError::NoSuchClaim { .. })
    ));
}

#[test]
fn node_returned_wakes_a_backing_off_volume() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    h.answer_node(err(DetachRpc::NodeUnpublish, ErrorClass::Retry));
    assert!(h.node_calls.is_empty());
    h.m.node_returned(&nid("n2"), h.now);
    h.pump();
    assert!(
        h.node_calls.is_empty(),
        "another node's return is irrelevant"
    );
    h.m.node_returned(&nid("n1"), h.now);
    h.pump();
    assert_eq!(h.node_calls.len(), 1);
}

#[test]
fn a_claim_stuck_on_one_node_does_not_hold_up_the_others() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    let req = |w: &str, n: &str| {
        request(
            "v",
            w,
            n,
            ClaimMode::Write,
            AccessMode::MultiNodeMultiWriter,
        )
    };
    h.claim(&v, req("a", "n1")).unwrap();
    h.claim(&v, req("b", "n2")).unwrap();
    h.release("v", "a");
    h.release("v", "b");
    assert_eq!(h.node_calls.len(), 1, "one call in flight per volume");
    let first = h.answer_node(err(DetachRpc::NodeUnpublish, ErrorClass::RetryElsewhere));
    assert_eq!(first.workload, wid("a"));
    h.advance(Duration::from_secs(1));
    // After the backoff, b goes first and is released completely.
    assert_eq!(h.node_calls[0].workload, wid("b"));
    h.answer_node(Ok(()));
    h.answer_controller(Ok(()));
    assert_eq!(h.freed(), ["b"]);
    // a is tried again; its backoff was not reset by b's progress.
    assert_eq!(h.node_calls[0].workload, wid("a"));
    h.answer_node(err(DetachRpc::NodeUnpublish, ErrorClass::RetryElsewhere));
    assert_eq!(h.m.status(&vid("v")).unwrap().attempts, 2);
    assert_eq!(h.m.poll_timeout(), Some(h.now + Duration::from_secs(2)));
}

fn node_only(node: &str, controller: bool) -> Harness {
    Harness::with_config(MachineConfig {
        duties: Duties::node(nid(node), controller),
        ..MachineConfig::with_seed(5)
    })
}

#[test]
fn duties_split_node_steps_by_node_and_controller_steps_by_duty() {
    let v = info("v", ControllerRequirement::Required);
    // The agent of n2 does not perform n1's node step.
    let mut other = node_only("n2", true);
    other.claim(&v, write_claim("v", "a", "n1")).unwrap();
    other.release("v", "a");
    assert!(
        other.node_calls.is_empty(),
        "n1's node step is n1's agent's"
    );

    // The agent of n1 performs its node step, then waits for the controller duty.
    let mut h = node_only("n1", false);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    let node = h.node_calls.pop().expect("own node step");
    h.m.node_detached(node.ticket, Ok(()), h.now);
    h.pump();
    assert_eq!(h.stored_states("v"), ["node_detached"]);
    assert!(
        h.controller_calls.is_empty(),
        "no controller step without the duty"
    );
    h.m.set_controller_duty(true, h.now);
    h.pump();
    assert_eq!(h.controller_calls.len(), 1, "the duty wakes the volume");
}

#[test]
fn another_writers_claim_seen_by_the_watch_is_counted_before_any_write() {
    let v = info("v", ControllerRequirement::Required);
    let mut writer = Harness::new();
    writer.claim(&v, write_claim("v", "a", "n1")).unwrap();
    let stored = writer.store.load_now(&vid("v")).unwrap();

    let mut h = Harness::new();
    h.m.observed(
        &vid("v"),
        stored.version,
        Some(stored.record.clone()),
        h.now,
    );
    h.pump();
    let denied = h.claim(&v, write_claim("v", "b", "n2")).unwrap_err();
    assert!(matches!(denied, ClaimError::Denied(_)), "{denied:?}");
    assert!(h.writes.is_empty(), "refused before any write");
    // The writer's release, seen by the watch, frees the capacity: and waiters hear of it.
    writer.release("v", "a");
    let releasing = writer.store.load_now(&vid("v")).unwrap();
    h.m.observed(&vid("v"), releasing.version, Some(releasing.record), h.now);
    let gone = Version::from_u64(releasing.version.get() + 10).unwrap();
    h.m.observed(&vid("v"), gone, None, h.now);
    h.pump();
    assert_eq!(h.freed(), ["a"], "a claim freed elsewhere is announced");
    h.claim(&v, write_claim("v", "b", "n2"))
        .expect("free again");
}

#[test]
fn a_change_seen_during_a_write_is_read_again_after_it_and_an_echo_is_not() {
    let v = info("v", ControllerRequirement::Required);
    let mut h = Harness::new();
    h.m.claim(&v, read_claim("v", "a", "n1"), h.now).unwrap();
    let Some(Action::Persist(p)) = h.m.poll_action() else {
        panic!("a write");
    };
    let written = h
        .store
        .compare_and_swap_now(&p.volume, p.expected, p.record.as_deref())
        .unwrap();
    // The watch brings the machine's own write back before its answer: nothing to read.
    h.m.observed(
        &vid("v"),
        written.unwrap(),
        p.record.as_deref().cloned(),
        h.now,
    );
    h.m.persisted(p.ticket, Ok(written), h.now);
    assert!(h.m.poll_action().is_none(), "no reload for an echo");

    // Another writer adds a claim while this machine's next write is out.
    h.m.release(&vid("v"), &wid("a"), h.now).unwrap();
    let Some(Action::Persist(p)) = h.m.poll_action() else {
        panic!("a write");
    };
    let written = h
        .store
        .compare_and_swap_now(&p.volume, p.expected, p.record.as_deref())
        .unwrap();
    let mut theirs = h.store.load_now(&vid("v")).unwrap();
    let newer = Version::from_u64(written.unwrap().get() + 1).unwrap();
    theirs.version = newer;
    h.m.observed(&vid("v"), newer, Some(theirs.record), h.now);
    h.m.persisted(p.ticket, Ok(written), h.now);
    assert!(
        matches!(h.m.poll_action(), Some(Action::Reload(_))),
        "a change newer than the write is read again"
    );
}

#[test]
fn a_claim_the_store_can_never_hold_is_refused_and_dropped() {
    let v = info("v", ControllerRequirement::Required);
    let mut h = Harness::new();
    h.m.claim(&v, write_claim("v", "a", "n1"), h.now).unwrap();
    let Some(Action::Persist(p)) = h.m.poll_action() else {
        panic!("a write");
    };
    let too_large = StoreError::TooLarge {
        volume: vid("v"),
        size: 2_000_000,
        limit: 1_000_000,
    };
    h.m.persisted(p.ticket, Err(too_large), h.now);
    match h.m.poll_event() {
        Some(Event::ClaimRefused {
            workload, reason, ..
        }) => {
            assert_eq!(workload, wid("a"));
            assert!(reason.contains("2000000 bytes"), "{reason}");
        }
        other => panic!("expected ClaimRefused, got {other:?}"),
    }
    // The volume is read again after a backoff, not at once (no spin), and the claim is gone.
    assert!(h.m.poll_action().is_none(), "waits out the backoff");
    h.now += Duration::from_secs(60);
    h.m.handle_timeout(h.now);
    h.pump();
    assert!(h.m.record(&vid("v")).is_none_or(|r| r.claims().is_empty()));
    h.claim(&v, write_claim("v", "b", "n1"))
        .expect("the refused claim holds no capacity");
}

#[test]
fn late_echoes_of_a_volume_the_machine_deleted_do_not_bring_it_back() {
    let v = info("v", ControllerRequirement::NotRequired);
    let mut h = Harness::new();
    h.m.follow_store_changes();
    // Every write, as a watch would bring it back later: (version, record).
    let mut echoes = Vec::new();
    h.m.claim(&v, write_claim("v", "a", "n1"), h.now).unwrap();
    h.m.release(&vid("v"), &wid("a"), h.now).unwrap();
    loop {
        match h.m.poll_action() {
            Some(Action::Persist(p)) => {
                let result =
                    h.store
                        .compare_and_swap_now(&p.volume, p.expected, p.record.as_deref());
                if let (Ok(Some(version)), Some(record)) = (&result, &p.record) {
                    echoes.push((*version, (**record).clone()));
                }
                h.m.persisted(p.ticket, result, h.now);
            }
            Some(Action::NodeDetach(n)) => h.m.node_detached(n.ticket, Ok(()), h.now),
            Some(other) => panic!("unexpected {other:?}"),
            None => break,
        }
    }
    assert!(h.m.record(&vid("v")).is_none(), "freed and dropped");
    assert!(echoes.len() >= 3, "{echoes:?}");
    for (version, record) in echoes {
        h.m.observed(&vid("v"), version, Some(record), h.now);
        assert!(h.m.poll_action().is_none(), "an old change starts nothing");
    }
    assert!(h.m.record(&vid("v")).is_none(), "not brought back");
    // The deletion's own echo ends the memory of it; a later write by another agent counts.
    let delete = Version::from_u64(100).unwrap();
    h.m.observed(&vid("v"), delete, None, h.now);
    let mut theirs = Harness::new();
    theirs.claim(&v, write_claim("v", "b", "n2")).unwrap();
    let record = theirs.store.load_now(&vid("v")).unwrap().record;
    h.m.observed(
        &vid("v"),
        Version::from_u64(101).unwrap(),
        Some(record),
        h.now,
    );
    assert_eq!(h.m.record(&vid("v")).map(|r| r.claims().len()), Some(1));
}

/// A machine restarted on a store that holds one release (node step to do) of plugin `plug`.
fn restarted_with_a_release() -> Harness {
    restarted_during_a_release(false)
}

/// A machine started again on a store with a release under way: at its node step, or past it
/// (`node_done`: the controller step comes next).
fn restarted_during_a_release(node_done: bool) -> Harness {
    let mut first = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    first.claim(&v, write_claim("v", "a", "n1")).unwrap();
    first.release("v", "a");
    assert_eq!(
        first.node_calls.len(),
        1,
        "the first machine starts the step"
    );
    if node_done {
        first.answer_node(Ok(()));
        assert_eq!(first.controller_calls.len(), 1, "at the controller step");
    }
    let mut h = Harness::new();
    h.store = first.store;
    let stored = h.store.load_now(&vid("v")).unwrap();
    h.m.load(stored).unwrap();
    h
}

#[test]
fn after_a_start_release_steps_wait_for_their_plugin() {
    let mut h = restarted_with_a_release();
    h.m.await_plugins(h.now + Duration::from_secs(5));
    h.pump();
    assert!(
        h.node_calls.is_empty(),
        "the plugin is not known to be there yet"
    );
    // Claims and writes go on meanwhile.
    let w = info("w", ControllerRequirement::Required);
    h.claim(&w, write_claim("w", "b", "n1")).unwrap();
    assert!(matches!(h.events.last(), Some(Event::ClaimDurable { .. })));
    h.m.plugin_available(&PluginId::new("other").unwrap(), None, h.now);
    h.pump();
    assert!(h.node_calls.is_empty(), "another plugin does not count");
    h.m.plugin_available(&PluginId::new("plug").unwrap(), Some(&nid("n1")), h.now);
    h.pump();
    assert_eq!(
        h.node_calls.len(),
        1,
        "the step starts once its plugin is back"
    );
}

#[test]
fn the_wait_for_a_plugin_after_a_start_is_bounded() {
    let mut h = restarted_with_a_release();
    let until = h.now + Duration::from_secs(5);
    h.m.await_plugins(until);
    h.pump();
    assert_eq!(
        h.m.poll_timeout(),
        Some(until),
        "the machine asks to be woken then"
    );
    h.advance(Duration::from_millis(4999));
    assert!(h.node_calls.is_empty());
    h.advance(Duration::from_millis(1));
    assert_eq!(
        h.node_calls.len(),
        1,
        "tried without its plugin after the wait"
    );
}

#[test]
fn a_reread_takes_over_what_the_watch_never_brought_and_counts_it() {
    let v = info("v", ControllerRequirement::Required);
    let mut writer = Harness::new();
    writer.claim(&v, write_claim("v", "a", "n1")).unwrap();
    writer.release("v", "a");
    let node_step = writer.answer_node(Ok(()));
    assert_eq!(node_step.workload, wid("a"));
    let stored = writer.store.load_now(&vid("v")).unwrap();

    // The controller-duty holder never heard of v from its watch; a re-read brings it.
    let mut h = Harness::new();
    h.m.follow_store_changes();
    let news = h.m.resync(stored.version, vec![stored.clone()], h.now);
    assert_eq!(news, 1, "v was news");
    h.pump();
    assert_eq!(
        h.controller_calls.len(),
        1,
        "the controller step is taken up"
    );
    // The same read again tells nothing new.
    assert_eq!(h.m.resync(stored.version, vec![stored], h.now), 0);
}

#[test]
fn a_cluster_member_waits_for_its_node_plugins_only() {
    // Waiting for node plugins only: the controller step goes at once.
    let mut h = restarted_during_a_release(true);
    h.m.await_node_plugins(h.now + Duration::from_secs(5));
    h.pump();
    assert_eq!(h.controller_calls.len(), 1, "not held back");

    // Waiting for every plugin: it is held until its plugin is back.
    let mut h = restarted_during_a_release(true);
    h.m.await_plugins(h.now + Duration::from_secs(5));
    h.pump();
    assert!(h.controller_calls.is_empty(), "held back");

    // A node step waits either way.
    let mut h = restarted_with_a_release();
    h.m.await_node_plugins(h.now + Duration::from_secs(5));
    h.pump();
    assert!(h.node_calls.is_empty(), "the node plugin is not back yet");
    h.m.plugin_available(&PluginId::new("plug").unwrap(), Some(&nid("n1")), h.now);
    h.pump();
    assert_eq!(h.node_calls.len(), 1);
}

/// The one [`Event::StepFailed`] among `events`, by position.
fn failure(events: &[Event], index: usize) -> &StepFailure {
    match events.get(index) {
        Some(Event::StepFailed(f)) => f,
        other => panic!("expected StepFailed at {index}, got {other:?} in {events:?}"),
    }
}

#[test]
fn a_failing_node_step_is_reported_with_its_attempt_and_when_it_is_retried() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    assert!(h.progress.is_empty());
    let step = RetriedStep::NodeDetach(wid("a"));

    // First failure: attempt 1, retried after the first delay (1 s); the status names it.
    h.answer_node(err(DetachRpc::NodeUnpublish, ErrorClass::Retry));
    assert_eq!(
        h.progress,
        [Event::StepFailed(StepFailure {
            volume: vid("v"),
            step: step.clone(),
            class: ErrorClass::Retry,
            rpc: Some(DetachRpc::NodeUnpublish),
            detail: "scripted".into(),
            attempt: 1,
            next_retry: h.now + Duration::from_secs(1),
        })]
    );
    assert_eq!(failure(&h.progress, 0).workload(), Some(&wid("a")));
    assert_eq!(
        h.progress[0].to_string(),
        "volume v: node detach of workload a (NodeUnpublishVolume) failed, attempt 1 (retry): \
         scripted"
    );
    let status = h.m.status(&vid("v")).unwrap();
    assert_eq!(
        status.to_string(),
        "volume v: 1 claim(s); the backoff before retrying the node detach of workload a (1 \
         failed attempts, last: NodeUnpublishVolume failed (retry): scripted)"
    );
    assert_eq!(
        status.claims[0].to_string(),
        "volume v: a (write on n1, releasing)"
    );
    assert_eq!(
        status.pending,
        ReleaseWait::Backoff {
            step: step.clone(),
            until: h.now + Duration::from_secs(1),
        }
    );
    assert_eq!(status.next_retry, Some(h.now + Duration::from_secs(1)));

    // Retried: the status shows the call again, not the backoff.
    h.advance(Duration::from_secs(1));
    assert_eq!(h.node_calls.len(), 1);
    assert_eq!(
        h.m.status(&vid("v")).unwrap().pending,
        ReleaseWait::NodeDetach(wid("a"))
    );

    // Second failure: attempt 2, and the delay doubled (2 s).
    h.answer_node(err(DetachRpc::NodeUnstage, ErrorClass::RetryElsewhere));
    assert_eq!(h.progress.len(), 2, "{:?}", h.progress);
    let second = failure(&h.progress, 1);
    assert_eq!(
        (second.attempt, second.class, &second.step),
        (2, ErrorClass::RetryElsewhere, &step)
    );
    assert_eq!(second.next_retry, h.now + Duration::from_secs(2));
    assert!(matches!(
        h.m.status(&vid("v")).unwrap().pending,
        ReleaseWait::Backoff { until, .. } if until == h.now + Duration::from_secs(2)
    ));

    // It succeeds: reported once, and the controller step that follows is not a recovery.
    h.advance(Duration::from_secs(2));
    h.answer_node(Ok(()));
    assert_eq!(
        h.progress[2..],
        [Event::StepRecovered {
            volume: vid("v"),
            step,
            failed_attempts: 2,
        }]
    );
    assert_eq!(
        h.m.status(&vid("v")).unwrap().pending,
        ReleaseWait::ControllerDetach(wid("a"))
    );
    h.answer_controller(Ok(()));
    assert_eq!(h.freed(), ["a"]);
    assert_eq!(h.progress.len(), 3, "{:?}", h.progress);
}

#[test]
fn a_fatal_failure_is_reported_as_fatal_with_its_retry_at_the_cap() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.release("v", "a");
    h.answer_node(Ok(()));
    assert!(h.progress.is_empty(), "a first success recovers nothing");
    h.answer_controller(err(DetachRpc::ControllerUnpublish, ErrorClass::Fatal));
    let step = RetriedStep::ControllerDetach(wid("a"));
    let cap = h.now + Duration::from_secs(30);
    assert_eq!(
        h.progress,
        [Event::StepFailed(StepFailure {
            volume: vid("v"),
            step: step.clone(),
            class: ErrorClass::Fatal,
            rpc: Some(DetachRpc::ControllerUnpublish),
            detail: "scripted".into(),
            attempt: 1,
            next_retry: cap,
        })],
        "a first fatal failure waits the cap, not the first delay"
    );
    assert_eq!(step.side(), Some(Side::Controller));
    assert_eq!(
        h.m.status(&vid("v")).unwrap().pending,
        ReleaseWait::Backoff { step, until: cap }
    );
}

#[test]
fn a_volume_back_from_its_backoff_shows_nothing_pending() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::NotRequired);
    h.claim(&v, read_claim("v", "a", "n1")).unwrap();
    h.claim(&v, read_claim("v", "b", "n2")).unwrap();
    assert_eq!(h.m.status(&vid("v")).unwrap().pending, ReleaseWait::Nothing);
    h.release("v", "b");
    h.answer_node(err(DetachRpc::NodeUnpublish, ErrorClass::RetryElsewhere));
    assert!(matches!(
        h.m.status(&vid("v")).unwrap().pending,
        ReleaseWait::Backoff { step: RetriedStep::NodeDetach(w), .. } if w == wid("b")
    ));
    // The plugin is back: retried at once, before the backoff ends.
    h.m.plugin_available(&PluginId::new("plug").unwrap(), None, h.now);
    h.pump();
    assert_eq!(
        h.m.status(&vid("v")).unwrap().pending,
        ReleaseWait::NodeDetach(wid("b"))
    );
    h.answer_node(Ok(()));
    assert_eq!(h.freed(), ["b"]);
    let status = h.m.status(&vid("v")).unwrap();
    assert_eq!(
        status.pending,
        ReleaseWait::Nothing,
        "a is held, nothing to do"
    );
    assert_eq!(status.next_retry, None);
    assert!(matches!(
        &h.progress[..],
        [
            Event::StepFailed(_),
            Event::StepRecovered {
                step: RetriedStep::NodeDetach(w),
                failed_attempts: 1,
                ..
            }
        ] if w == &wid("b")
    ));
}

#[test]
fn a_failed_store_read_is_reported_and_shown_as_its_backoff() {
    let mut h = Harness::new();
    let v = info("v", ControllerRequirement::Required);
    h.claim(&v, write_claim("v", "a", "n1")).unwrap();
    h.fail_next_persist = true;
    h.reads_fail = true;
    h.release("v", "a");
    // The write's outcome is unknown and the read that follows fails: read again after 1 s.
    let first = failure(&h.progress, 0);
    assert_eq!(h.progress.len(), 1, "{:?}", h.progress);
    assert_eq!(
        (&first.step, first.class, first.attempt),
        (&RetriedStep::StoreRead, ErrorClass::Retry, 1)
    );
    assert_eq!(first.workload(), None);
    assert_eq!(first.next_retry, h.now + Duration::from_secs(1));
    assert_eq!(
        h.m.status(&vid("v")).unwrap().pending,
        ReleaseWait::Backoff {
            step: RetriedStep::StoreRead,
            until: h.now + Duration::from_secs(1),
        }
    );
    // Fails again: attempt 2, after 2 s.
    h.advance(Duration::from_secs(1));
    let second = failure(&h.progress, 1);
    assert_eq!(second.attempt, 2);
    assert_eq!(second.next_retry, h.now + Duration::from_secs(2));
    // The store is back: the read succeeds, and says so.
    h.reads_fail = false;
    h.advance(Duration::from_secs(2));
    assert_eq!(
        h.progress[2..],
        [Event::StepRecovered {
            volume: vid("v"),
            step: RetriedStep::StoreRead,
            failed_attempts: 2,
        }]
    );
    assert_eq!(h.m.status(&vid("v")).unwrap().pending, ReleaseWait::Nothing);
}

#[test]
fn a_node_at_its_plugin_s_attach_limit_takes_no_new_volume_until_one_is_detached() {
    let mut h = Harness::new();
    let limit = std::num::NonZeroU64::new(2);
    let claim = |h: &mut Harness, volume: &str, workload: &str, node: &str| {
        let v = info(volume, ControllerRequirement::Required);
        let r =
            h.m.claim_within(&v, write_claim(volume, workload, node), limit, h.now);
        h.pump();
        r
    };
    claim(&mut h, "v1", "a", "n1").expect("first");
    claim(&mut h, "v2", "b", "n1").expect("second");
    let refused = claim(&mut h, "v3", "c", "n1").expect_err("a third on n1");
    assert_eq!(
        refused,
        ClaimError::AttachLimit {
            volume: vid("v3"),
            node: nid("n1"),
            plugin: PluginId::new("plug").unwrap(),
            limit: 2,
            count: 2,
        }
    );
    assert_eq!(refused.class(), ErrorClass::RetryElsewhere);
    let text = refused.to_string();
    for part in [
        "v3",
        "node n1",
        "plugin plug",
        "allows 2",
        "2 of its volumes",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    assert!(h.m.record(&vid("v3")).is_none(), "nothing recorded");
    // Another node, and a volume already attached on n1, are no new attachment there.
    claim(&mut h, "v3", "c", "n2").expect("on n2");
    let shared = info("v1", ControllerRequirement::Required);
    let reader = request(
        "v1",
        "a2",
        "n1",
        ClaimMode::Write,
        AccessMode::SingleNodeMultiWriter,
    );
    assert!(
        matches!(
            h.m.claim_within(&shared, reader, limit, h.now),
            Err(ClaimError::Denied(_))
        ),
        "refused for its access mode, not for the limit"
    );
    // A volume of another plugin does not count against this one's limit.
    let mut other = info("w1", ControllerRequirement::Required);
    other.plugin = PluginId::new("other").unwrap();
    h.m.claim_within(&other, write_claim("w1", "d", "n1"), limit, h.now)
        .expect("another plugin's");
    h.pump();

    // Releasing keeps the attachment until the controller step is done and the claim freed.
    h.release("v1", "a");
    let refused = claim(&mut h, "v4", "e", "n1").expect_err("v1 still attached");
    assert!(
        matches!(refused, ClaimError::AttachLimit { count: 2, .. }),
        "{refused:?}"
    );
    h.answer_node(Ok(()));
    h.answer_controller(Ok(()));
    assert_eq!(h.freed(), ["a"]);
    claim(&mut h, "v4", "e", "n1").expect("a slot is free");
}
