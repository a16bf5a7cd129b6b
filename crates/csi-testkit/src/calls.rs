//! The call log: every call the mock received, in arrival order, and short assertions over it.
//!
//! Each record holds the rpc, the volume and node it was about, the request as its redacting
//! `Debug` prints it (csi-proto never prints a secret value), the outcome and the time.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use csi_proto::Rpc;
//! use csi_testkit::MockPlugin;
//!
//! let plugin = MockPlugin::builder().build()?;
//! // ... drive an orchestrator against `plugin` ...
//! let calls = plugin.calls();
//! assert_eq!(calls.count(Rpc::NodeUnstageVolume), 0);
//! calls.assert_runs(&[])?; // nothing was called yet
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use csi_proto::Rpc;
use tonic::Code;

use crate::plugin::Shared;

/// How a recorded call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordedOutcome {
    /// The call is still being served.
    InFlight,
    /// The mock answered OK (for a stream: the stream was set up).
    Ok,
    /// The mock answered with this status.
    Failed {
        /// The gRPC code.
        code: Code,
        /// The status message.
        message: String,
    },
    /// The caller gave up (deadline, cancel, lost connection) before the mock answered.
    Abandoned,
    /// A fault script dropped the connection this call arrived on.
    ConnectionDropped,
}

impl RecordedOutcome {
    /// The gRPC code of a failed call, `None` otherwise.
    pub fn code(&self) -> Option<Code> {
        match self {
            RecordedOutcome::Failed { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// One call the mock received.
#[derive(Clone, Debug)]
pub struct CallRecord {
    /// Arrival order, starting at 0 for the first call the plugin ever received.
    pub seq: u64,
    /// Which rpc was called.
    pub rpc: Rpc,
    /// The volume the call was about, if any (for `CreateVolume`, the id it created).
    pub volume_id: Option<String>,
    /// The node the call was about, if any (`ControllerPublishVolume`'s `node_id`; for node
    /// rpcs the node id of the handle that served it, see
    /// [`MockPlugin::as_node`](crate::MockPlugin::as_node)).
    pub node_id: Option<String>,
    /// The request as printed by its `Debug`, which redacts every secret value.
    pub request: String,
    /// How the call ended.
    pub outcome: RecordedOutcome,
    /// When the call arrived.
    pub at: SystemTime,
}

/// The log itself: plain data, kept inside the plugin's one lock.
#[derive(Debug)]
pub(crate) struct CallLog {
    records: VecDeque<CallRecord>,
    next_seq: u64,
    limit: Option<usize>,
    evicted: u64,
}

impl CallLog {
    pub(crate) fn new(limit: Option<usize>) -> Self {
        CallLog {
            records: VecDeque::new(),
            next_seq: 0,
            limit,
            evicted: 0,
        }
    }

    pub(crate) fn push(
        &mut self,
        rpc: Rpc,
        volume_id: Option<String>,
        node_id: Option<String>,
        request: String,
    ) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.limit == Some(0) {
            // A log of size 0 keeps nothing; the call only counts.
            self.evicted += 1;
            return seq;
        }
        if let Some(limit) = self.limit {
            while self.records.len() >= limit {
                self.records.pop_front();
                self.evicted += 1;
            }
        }
        self.records.push_back(CallRecord {
            seq,
            rpc,
            volume_id,
            node_id,
            request,
            outcome: RecordedOutcome::InFlight,
            at: SystemTime::now(),
        });
        seq
    }

    fn find(&mut self, seq: u64) -> Option<&mut CallRecord> {
        // Records are numbered one after the other (evictions take the oldest, a clear or a
        // drain takes them all), so a call's record sits `seq - first` places in: one look
        // instead of a binary search, whose steps over a 10,000-record log each missed the
        // cache (6 % of the mock's time under load, twice per call).
        let first = self.records.front()?.seq;
        let index = usize::try_from(seq.checked_sub(first)?).ok()?;
        let index = match self.records.get(index) {
            Some(record) if record.seq == seq => index,
            // Not expected; stay correct if the numbering ever has a gap.
            _ => self.records.binary_search_by_key(&seq, |r| r.seq).ok()?,
        };
        self.records.get_mut(index)
    }

    pub(crate) fn finish(&mut self, seq: u64, outcome: RecordedOutcome) {
        if let Some(record) = self.find(seq) {
            record.outcome = outcome;
        }
    }

    pub(crate) fn set_volume(&mut self, seq: u64, volume_id: String) {
        if let Some(record) = self.find(seq) {
            record.volume_id = Some(volume_id);
        }
    }

    pub(crate) fn snapshot(&self) -> CallList {
        CallList(self.records.iter().cloned().collect())
    }

    pub(crate) fn clear(&mut self) {
        self.records.clear();
    }

    /// Every record, oldest first, and an empty log after (sequence numbers keep counting).
    pub(crate) fn drain(&mut self) -> CallList {
        CallList(std::mem::take(&mut self.records).into())
    }

    pub(crate) fn evicted(&self) -> u64 {
        self.evicted
    }

    pub(crate) fn stats(&self) -> LogStats {
        LogStats {
            limit: self.limit,
            kept: self.records.len(),
            evicted: self.evicted,
            received: self.next_seq,
        }
    }
}

/// How full a call log is and how many calls it has seen ([`Calls::stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogStats {
    /// The most records kept at once (`None`: no limit; `Some(0)`: none are kept).
    pub limit: Option<usize>,
    /// How many records the log holds now.
    pub kept: usize,
    /// How many records were dropped, oldest first, because the log was full (with a limit
    /// of 0: every call).
    pub evicted: u64,
    /// How many calls the mock received in all, kept or not.
    pub received: u64,
}

/// A copy of (part of) the call log, with assertion helpers.
#[derive(Clone, Debug, Default)]
pub struct CallList(Vec<CallRecord>);

impl CallList {
    /// The records, oldest first.
    pub fn records(&self) -> &[CallRecord] {
        &self.0
    }

    /// The records, oldest first, by value.
    pub fn into_records(self) -> Vec<CallRecord> {
        self.0
    }

    /// How many calls are in this list.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The rpcs, oldest first.
    pub fn rpcs(&self) -> Vec<Rpc> {
        self.0.iter().map(|r| r.rpc).collect()
    }

    /// How many calls of `rpc` there are.
    pub fn count(&self, rpc: Rpc) -> usize {
        self.0.iter().filter(|r| r.rpc == rpc).count()
    }

    /// The calls of one rpc.
    pub fn of(&self, rpc: Rpc) -> CallList {
        self.filter(|r| r.rpc == rpc)
    }

    /// The calls about one volume.
    pub fn for_volume(&self, volume_id: &str) -> CallList {
        self.filter(|r| r.volume_id.as_deref() == Some(volume_id))
    }

    /// The calls without the Identity rpcs (`GetPluginInfo`, `GetPluginCapabilities`, `Probe`)
    /// and without the `*GetCapabilities`/`NodeGetInfo` discovery calls, which orchestrators
    /// make at times a test should not depend on.
    pub fn without_discovery(&self) -> CallList {
        self.filter(|r| !is_discovery(r.rpc))
    }

    /// The calls for which `keep` is true.
    pub fn filter(&self, mut keep: impl FnMut(&CallRecord) -> bool) -> CallList {
        CallList(self.0.iter().filter(|r| keep(r)).cloned().collect())
    }

    /// Consecutive calls of the same rpc folded into `(rpc, how many)`, oldest first.
    pub fn runs(&self) -> Vec<(Rpc, usize)> {
        let mut runs: Vec<(Rpc, usize)> = Vec::new();
        for record in &self.0 {
            match runs.last_mut() {
                Some((rpc, n)) if *rpc == record.rpc => *n += 1,
                _ => runs.push((record.rpc, 1)),
            }
        }
        runs
    }

    /// Checks that the calls were exactly these runs: `&[(NodeUnstageVolume, 3),
    /// (ControllerUnpublishVolume, 1)]` means "NodeUnstageVolume three times in a row, then
    /// ControllerUnpublishVolume once, and nothing else".
    ///
    /// # Errors
    ///
    /// [`RunsMismatch`], whose `Display` shows both sequences.
    pub fn assert_runs(&self, expected: &[(Rpc, usize)]) -> Result<(), RunsMismatch> {
        let actual = self.runs();
        if actual == expected {
            Ok(())
        } else {
            Err(RunsMismatch {
                expected: expected.to_vec(),
                actual,
            })
        }
    }
}

fn is_discovery(rpc: Rpc) -> bool {
    matches!(
        rpc,
        Rpc::GetPluginInfo
            | Rpc::GetPluginCapabilities
            | Rpc::Probe
            | Rpc::ControllerGetCapabilities
            | Rpc::NodeGetCapabilities
            | Rpc::GroupControllerGetCapabilities
            | Rpc::NodeGetInfo
    )
}

/// The calls were not the expected runs; `Display` shows both, one run a line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("calls did not match.\nexpected:\n{}\nactual:\n{}", show_runs(.expected), show_runs(.actual))]
pub struct RunsMismatch {
    /// The runs the test expected.
    pub expected: Vec<(Rpc, usize)>,
    /// The runs the mock saw.
    pub actual: Vec<(Rpc, usize)>,
}

fn show_runs(runs: &[(Rpc, usize)]) -> String {
    if runs.is_empty() {
        return "  (no calls)".to_string();
    }
    runs.iter()
        .map(|(rpc, n)| format!("  {} x{n}", rpc.name()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A handle on a plugin's call log. Cheap to clone; every clone sees the same log.
#[derive(Clone)]
pub struct Calls {
    shared: Arc<Shared>,
}

impl fmt::Debug for Calls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calls").field("len", &self.len()).finish()
    }
}

/// [`Calls::wait_for`] gave up: the condition did not hold before the time limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the call log did not reach the expected state within {waited:?}; it holds {len} calls")]
pub struct WaitTimeout {
    /// How long it waited.
    pub waited: Duration,
    /// How many calls the log held when it gave up.
    pub len: usize,
}

impl Calls {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Calls { shared }
    }

    /// A copy of the whole log, oldest first.
    pub fn snapshot(&self) -> CallList {
        self.shared.lock().calls.snapshot()
    }

    /// Every record, oldest first.
    pub fn all(&self) -> Vec<CallRecord> {
        self.snapshot().into_records()
    }

    /// How many calls are in the log.
    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rpcs, oldest first.
    pub fn rpcs(&self) -> Vec<Rpc> {
        self.snapshot().rpcs()
    }

    /// How many calls of `rpc` the mock received.
    pub fn count(&self, rpc: Rpc) -> usize {
        self.snapshot().count(rpc)
    }

    /// The calls about one volume.
    pub fn for_volume(&self, volume_id: &str) -> CallList {
        self.snapshot().for_volume(volume_id)
    }

    /// The calls of one rpc.
    pub fn of(&self, rpc: Rpc) -> CallList {
        self.snapshot().of(rpc)
    }

    /// The most recent call of `rpc`, if any.
    pub fn last(&self, rpc: Rpc) -> Option<CallRecord> {
        self.of(rpc).into_records().pop()
    }

    /// See [`CallList::assert_runs`]; checks the whole log.
    ///
    /// # Errors
    ///
    /// [`RunsMismatch`] showing the expected and the actual runs.
    pub fn assert_runs(&self, expected: &[(Rpc, usize)]) -> Result<(), RunsMismatch> {
        self.snapshot().assert_runs(expected)
    }

    /// Forgets every record (sequence numbers keep counting).
    pub fn clear(&self) {
        self.shared.lock().calls.clear();
    }

    /// Every record, oldest first, forgetting them in the same step: a reader that drains the
    /// log now and then sees each call once, and the log never holds more than what came in
    /// since the last drain (up to its limit). Sequence numbers keep counting.
    pub fn drain(&self) -> CallList {
        self.shared.lock().calls.drain()
    }

    /// How many old records were dropped because the log hit its configured limit
    /// ([`MockPluginBuilder::call_log_limit`](crate::MockPluginBuilder::call_log_limit)).
    pub fn evicted(&self) -> u64 {
        self.shared.lock().calls.evicted()
    }

    /// The log's limit, how many records it holds, how many it dropped and how many calls
    /// came in, read together.
    pub fn stats(&self) -> LogStats {
        self.shared.lock().calls.stats()
    }

    /// Waits until `done` holds for the log, re-checking whenever a call arrives or ends.
    /// `limit` only guards against a hang.
    ///
    /// # Errors
    ///
    /// [`WaitTimeout`] when `limit` passes first.
    pub async fn wait_for(
        &self,
        limit: Duration,
        mut done: impl FnMut(&CallList) -> bool,
    ) -> Result<(), WaitTimeout> {
        let wait = async {
            loop {
                let changed = self.shared.log_changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if done(&self.snapshot()) {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(limit, wait)
            .await
            .map_err(|_| WaitTimeout {
                waited: limit,
                len: self.len(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_of(rpcs: &[Rpc]) -> CallLog {
        let mut log = CallLog::new(None);
        for rpc in rpcs {
            log.push(*rpc, Some("vol-1".into()), None, String::new());
        }
        log
    }

    #[test]
    fn runs_fold_consecutive_calls() {
        let log = log_of(&[
            Rpc::NodeUnstageVolume,
            Rpc::NodeUnstageVolume,
            Rpc::NodeUnstageVolume,
            Rpc::ControllerUnpublishVolume,
            Rpc::NodeUnstageVolume,
        ]);
        assert_eq!(
            log.snapshot().runs(),
            vec![
                (Rpc::NodeUnstageVolume, 3),
                (Rpc::ControllerUnpublishVolume, 1),
                (Rpc::NodeUnstageVolume, 1)
            ]
        );
    }

    #[test]
    fn mismatch_message_shows_both_sides() {
        let log = log_of(&[Rpc::NodeUnstageVolume, Rpc::ControllerUnpublishVolume]);
        let err = log
            .snapshot()
            .assert_runs(&[(Rpc::NodeUnstageVolume, 3)])
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("NodeUnstageVolume x3"), "{text}");
        assert!(text.contains("NodeUnstageVolume x1"), "{text}");
        assert!(text.contains("ControllerUnpublishVolume x1"), "{text}");
    }

    #[test]
    fn limit_evicts_oldest() {
        let mut log = CallLog::new(Some(2));
        for rpc in [Rpc::Probe, Rpc::GetPluginInfo, Rpc::NodeGetInfo] {
            log.push(rpc, None, None, String::new());
        }
        assert_eq!(
            log.snapshot().rpcs(),
            vec![Rpc::GetPluginInfo, Rpc::NodeGetInfo]
        );
        assert_eq!(log.evicted(), 1);
        log.finish(2, RecordedOutcome::Ok);
        assert_eq!(log.snapshot().records()[1].outcome, RecordedOutcome::Ok);
        // A finished call that was evicted is ignored rather than misattributed.
        log.finish(0, RecordedOutcome::Abandoned);
        assert_eq!(
            log.snapshot().records()[0].outcome,
            RecordedOutcome::InFlight
        );
        assert_eq!(
            log.stats(),
            LogStats {
                limit: Some(2),
                kept: 2,
                evicted: 1,
                received: 3
            }
        );
    }

    #[test]
    fn outcomes_reach_their_own_record_after_evictions_and_drains() {
        let mut log = CallLog::new(Some(3));
        for _ in 0..5 {
            log.push(Rpc::Probe, None, None, String::new());
        }
        // Seqs 2, 3 and 4 are kept; 0 is gone and 7 never was.
        log.finish(3, RecordedOutcome::Ok);
        log.finish(0, RecordedOutcome::Abandoned);
        log.finish(7, RecordedOutcome::Abandoned);
        let outcomes: Vec<_> = log
            .snapshot()
            .records()
            .iter()
            .map(|r| (r.seq, r.outcome.clone()))
            .collect();
        assert_eq!(
            outcomes,
            [
                (2, RecordedOutcome::InFlight),
                (3, RecordedOutcome::Ok),
                (4, RecordedOutcome::InFlight)
            ]
        );
        log.drain();
        let seq = log.push(Rpc::Probe, None, None, String::new());
        log.set_volume(seq, "vol-1".to_owned());
        log.finish(seq, RecordedOutcome::Ok);
        let list = log.snapshot();
        let record = &list.records()[0];
        assert_eq!(
            (record.seq, record.volume_id.as_deref()),
            (5, Some("vol-1"))
        );
        assert_eq!(record.outcome, RecordedOutcome::Ok);
    }

    #[test]
    fn a_limit_of_zero_keeps_nothing_but_counts() {
        let mut log = CallLog::new(Some(0));
        for rpc in [Rpc::Probe, Rpc::NodeGetInfo] {
            log.push(rpc, None, None, String::new());
        }
        log.finish(1, RecordedOutcome::Ok);
        assert!(log.snapshot().is_empty());
        assert_eq!(
            log.stats(),
            LogStats {
                limit: Some(0),
                kept: 0,
                evicted: 2,
                received: 2
            }
        );
    }

    #[test]
    fn drain_hands_over_every_record_once() {
        let mut log = log_of(&[Rpc::Probe, Rpc::NodeStageVolume]);
        assert_eq!(log.drain().rpcs(), vec![Rpc::Probe, Rpc::NodeStageVolume]);
        assert!(log.drain().is_empty());
        let seq = log.push(Rpc::NodeUnstageVolume, None, None, String::new());
        assert_eq!(seq, 2, "sequence numbers keep counting after a drain");
        assert_eq!(log.drain().rpcs(), vec![Rpc::NodeUnstageVolume]);
    }

    #[test]
    fn discovery_filter_drops_identity_calls() {
        let log = log_of(&[Rpc::Probe, Rpc::NodeStageVolume, Rpc::NodeGetCapabilities]);
        assert_eq!(
            log.snapshot().without_discovery().rpcs(),
            vec![Rpc::NodeStageVolume]
        );
    }

    #[tokio::test]
    async fn wait_for_gives_up_with_the_log_size() {
        let plugin = crate::MockPlugin::builder().build().unwrap();
        let calls = plugin.calls();
        let err = calls
            .wait_for(Duration::from_millis(10), |c| c.len() == 1)
            .await
            .unwrap_err();
        assert_eq!(err.len, 0);
        calls
            .wait_for(Duration::from_secs(5), CallList::is_empty)
            .await
            .expect("an already-true condition returns at once");
    }
}
