//! The calls in flight: which RPC each call is, the volume and node it names, its attempt and
//! that attempt's deadline, what it waits on, and since when. Every call a client makes is
//! listed here from its start to its end (an answer, a failure, or the caller dropping it),
//! so that an embedder can show what a long wait is waiting on.
//!
//! Clients share one list when built with the same
//! [`CsiClientBuilder::calls_in_flight`](crate::CsiClientBuilder::calls_in_flight);
//! otherwise each client (and its clones) has its own, read with
//! [`CsiClient::calls_in_flight`](crate::CsiClient::calls_in_flight).
//!
//! ```
//! use std::sync::Arc;
//! use csi_client::{CallsInFlight, CsiClient, Endpoint};
//!
//! let calls = Arc::new(CallsInFlight::new());
//! let client = CsiClient::builder(Endpoint::unix("/run/csi/plugin.sock").unwrap())
//!     .calls_in_flight(Arc::clone(&calls))
//!     .build();
//! assert!(Arc::ptr_eq(client.calls_in_flight(), &calls));
//! for call in calls.list() {
//!     println!("waiting on {call}");
//! }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use csi_proto::Rpc;
use csi_structs::untrusted::escaped;
use csi_structs::{ExternalVolumeId, PluginNodeId};

use crate::error::CallContext;

/// What a call in flight is waiting on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Waiting {
    /// Its volume's turn: another call about the same volume is in flight.
    Turn,
    /// The plugin's answer to the current attempt.
    Answer,
    /// The pause before the next attempt.
    Backoff,
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Waiting::Turn => "its volume's turn",
            Waiting::Answer => "the plugin's answer",
            Waiting::Backoff => "the pause before the next attempt",
        })
    }
}

/// One call in flight, as [`CallsInFlight::list`] shows it.
///
/// Its `Display` reads, with the ids escaped ([`csi_structs::untrusted`]):
/// `NodeStageVolume volume vol-1: waiting for the plugin's answer, attempt 1 of 3 (deadline
/// 2m), 7s so far`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallInFlight {
    /// Tells this call from every other in the same list, for as long as the list lives.
    pub id: u64,
    /// The RPC.
    pub rpc: Rpc,
    /// The plugin's volume id, where the request has one.
    pub volume: Option<ExternalVolumeId>,
    /// The plugin's node id, where the request has one.
    pub node: Option<PluginNodeId>,
    /// The attempt under way or coming (from 1); 0 before the first one.
    pub attempt: u32,
    /// The most attempts the call's policy allows.
    pub max_attempts: u32,
    /// The current attempt's deadline (what is left of the call's budget when that is
    /// shorter); zero before the first attempt.
    pub attempt_deadline: Duration,
    /// What the call waits on.
    pub waiting: Waiting,
    /// When the call started.
    pub started: Instant,
    /// When the current attempt (or the wait before it) started.
    pub since: Instant,
}

impl CallInFlight {
    /// How long the call has been going, as of `now`.
    pub fn elapsed_at(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// The RPC and the objects it names: `NodeStageVolume volume vol-1 node n-1`, with the
    /// ids escaped.
    pub fn subject(&self) -> String {
        let mut text = self.rpc.name().to_owned();
        if let Some(volume) = &self.volume {
            text.push_str(&format!(" volume {}", escaped(volume.as_str())));
        }
        if let Some(node) = &self.node {
            text.push_str(&format!(" node {}", escaped(node.as_str())));
        }
        text
    }
}

/// Whole seconds, or tenths under ten seconds: `7.5s`, `42s`, `2m`, `2m30s`.
pub(crate) fn seconds(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 10 {
        format!("{:.1}s", d.as_secs_f64())
    } else if secs < 60 {
        format!("{secs}s")
    } else if secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{}m{}s", secs / 60, secs % 60)
    }
}

impl fmt::Display for CallInFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: waiting for {}", self.subject(), self.waiting)?;
        if self.attempt > 0 {
            write!(f, ", attempt {} of {}", self.attempt, self.max_attempts)?;
            if self.waiting != Waiting::Backoff && !self.attempt_deadline.is_zero() {
                write!(f, " (deadline {})", seconds(self.attempt_deadline))?;
            }
        }
        write!(f, ", {} so far", seconds(self.elapsed_at(Instant::now())))
    }
}

/// Which calls in flight are due a reminder that they are still going: each once when it
/// has run for `first`, then every `every` while it lasts. A call seen late (a busy machine)
/// gets one reminder, not one per interval it missed; a call no longer listed is forgotten.
///
/// [`CallsInFlight::log_long_calls`] logs with it; a caller that shows long calls its own way
/// (a status line, say) asks [`due`](Self::due) itself.
///
/// ```
/// use std::time::Duration;
/// use csi_client::{CallsInFlight, LongCalls};
/// use tokio::time::Instant;
///
/// let calls = CallsInFlight::new();
/// let mut long = LongCalls::new(Duration::from_secs(5), Duration::from_secs(30));
/// let listed = calls.list();
/// for call in long.due(&listed, Instant::now()) {
///     eprintln!("still waiting: {call}");
/// }
/// ```
#[derive(Clone, Debug)]
pub struct LongCalls {
    first: Duration,
    every: Duration,
    /// Per call id, the age at which its next reminder is due.
    next: std::collections::HashMap<u64, Duration>,
}

impl LongCalls {
    /// A reminder at `first`, then every `every` (at least a second).
    pub fn new(first: Duration, every: Duration) -> Self {
        Self {
            first,
            every: every.max(Duration::from_secs(1)),
            next: std::collections::HashMap::new(),
        }
    }

    /// The calls of `calls` (every call in flight, as [`CallsInFlight::list`] gives them) due
    /// a reminder at `now`.
    pub fn due<'a>(&mut self, calls: &'a [CallInFlight], now: Instant) -> Vec<&'a CallInFlight> {
        self.next.retain(|id, _| calls.iter().any(|c| c.id == *id));
        let mut due = Vec::new();
        for call in calls {
            let age = call.elapsed_at(now);
            let next = self.next.entry(call.id).or_insert(self.first);
            if age >= *next {
                due.push(call);
                while *next <= age {
                    *next += self.every;
                }
            }
        }
        due
    }
}

/// The calls in flight of one or more clients (see the [module docs](self)). Cheap to read:
/// a listing copies the entries under a lock held only for the copy.
#[derive(Debug, Default)]
pub struct CallsInFlight {
    next: AtomicU64,
    calls: Mutex<BTreeMap<u64, CallInFlight>>,
}

impl CallsInFlight {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, CallInFlight>> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every call in flight, oldest first.
    pub fn list(&self) -> Vec<CallInFlight> {
        let mut calls: Vec<CallInFlight> = self.lock().values().cloned().collect();
        calls.sort_by_key(|c| (c.started, c.id));
        calls
    }

    /// The calls in flight that name `volume`, oldest first.
    pub fn for_volume(&self, volume: &ExternalVolumeId) -> Vec<CallInFlight> {
        let mut calls: Vec<CallInFlight> = self
            .lock()
            .values()
            .filter(|c| c.volume.as_ref() == Some(volume))
            .cloned()
            .collect();
        calls.sort_by_key(|c| (c.started, c.id));
        calls
    }

    /// How many calls are in flight.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no call is in flight.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Logs (`warn`, "plugin call still in flight", the call in a `call` field) each call
    /// that has run for `first`, and again every `every` while it lasts ([`LongCalls`]),
    /// looking once a second. Never ends: drop it, or select it against a stop signal.
    pub async fn log_long_calls(&self, first: Duration, every: Duration) {
        let mut long = LongCalls::new(first, every);
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let calls = self.list();
            for call in long.due(&calls, Instant::now()) {
                tracing::warn!(call = %call, "plugin call still in flight");
            }
        }
    }

    /// Lists a call starting now; it stays listed until the returned entry is dropped.
    pub(crate) fn enter(&self, context: &CallContext, max_attempts: u32) -> Entry<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        self.lock().insert(
            id,
            CallInFlight {
                id,
                rpc: context.rpc(),
                volume: context.volume_id().cloned(),
                node: context.node_id().cloned(),
                attempt: 0,
                max_attempts,
                attempt_deadline: Duration::ZERO,
                waiting: Waiting::Turn,
                started: now,
                since: now,
            },
        );
        Entry { list: self, id }
    }
}

/// A call's place in a [`CallsInFlight`]; dropping it (the call ended or was dropped) takes
/// the call off the list.
pub(crate) struct Entry<'a> {
    list: &'a CallsInFlight,
    id: u64,
}

impl Entry<'_> {
    fn update(&self, change: impl FnOnce(&mut CallInFlight)) {
        if let Some(call) = self.list.lock().get_mut(&self.id) {
            change(call);
        }
    }

    /// Attempt `attempt` waits for its volume's turn.
    pub(crate) fn turn(&self, attempt: u32) {
        self.update(|c| {
            c.attempt = attempt;
            c.waiting = Waiting::Turn;
            c.since = Instant::now();
        });
    }

    /// Attempt `attempt` was sent (or waits for a connection) under `deadline`.
    pub(crate) fn sent(&self, attempt: u32, deadline: Duration) {
        self.update(|c| {
            c.attempt = attempt;
            c.attempt_deadline = deadline;
            c.waiting = Waiting::Answer;
            c.since = Instant::now();
        });
    }

    /// The call pauses before its next attempt.
    pub(crate) fn backoff(&self) {
        self.update(|c| {
            c.waiting = Waiting::Backoff;
            c.since = Instant::now();
        });
    }
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        self.list.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_listed_until_its_entry_goes() {
        let calls = CallsInFlight::new();
        let context = CallContext::new(Rpc::NodeStageVolume)
            .volume("vol\n1")
            .node("n-1");
        let entry = calls.enter(&context, 3);
        entry.sent(1, Duration::from_secs(120));
        let listed = calls.list();
        assert_eq!(listed.len(), 1);
        let call = &listed[0];
        assert_eq!(
            (call.rpc, call.attempt, call.max_attempts),
            (Rpc::NodeStageVolume, 1, 3)
        );
        assert_eq!(call.waiting, Waiting::Answer);
        let text = call.to_string();
        assert!(
            text.starts_with(
                r"NodeStageVolume volume vol\n1 node n-1: waiting for the plugin's answer, attempt 1 of 3 (deadline 2m), "
            ),
            "{text}"
        );
        assert!(text.ends_with(" so far"), "{text}");
        let volume = ExternalVolumeId::new("vol\n1").unwrap();
        assert_eq!(calls.for_volume(&volume).len(), 1);
        assert!(
            calls
                .for_volume(&ExternalVolumeId::new("other").unwrap())
                .is_empty()
        );
        drop(entry);
        assert!(calls.is_empty());
    }

    #[test]
    fn seconds_read_as_people_write_them() {
        assert_eq!(seconds(Duration::from_millis(7_500)), "7.5s");
        assert_eq!(seconds(Duration::from_secs(42)), "42s");
        assert_eq!(seconds(Duration::from_secs(120)), "2m");
        assert_eq!(seconds(Duration::from_secs(150)), "2m30s");
    }

    #[test]
    fn a_long_call_is_reminded_once_and_then_at_intervals() {
        let secs = Duration::from_secs;
        let calls = CallsInFlight::new();
        let first = calls.enter(&CallContext::new(Rpc::NodeStageVolume), 1);
        let listed = calls.list();
        let t0 = listed[0].started;
        let mut long = LongCalls::new(secs(3), secs(15));
        let due = |long: &mut LongCalls, listed: &[CallInFlight], at: u64| {
            long.due(listed, t0 + secs(at))
                .into_iter()
                .map(|c| c.id)
                .collect::<Vec<_>>()
        };
        let id = listed[0].id;
        assert!(due(&mut long, &listed, 2).is_empty());
        assert_eq!(due(&mut long, &listed, 3), [id]);
        assert!(due(&mut long, &listed, 4).is_empty());
        assert!(due(&mut long, &listed, 17).is_empty());
        assert_eq!(due(&mut long, &listed, 18), [id]);

        // A second call has its own turn; the first, ended, is forgotten.
        drop(first);
        let second = calls.enter(&CallContext::new(Rpc::NodePublishVolume), 1);
        let mut listed = calls.list();
        listed[0].started = t0;
        let other = listed[0].id;
        assert_eq!(due(&mut long, &listed, 40), [other]);
        assert!(!long.next.contains_key(&id));
        // A long pause gives one reminder, not one per missed interval.
        assert_eq!(due(&mut long, &listed, 100), [other]);
        assert!(due(&mut long, &listed, 101).is_empty());
        drop(second);
    }
}
