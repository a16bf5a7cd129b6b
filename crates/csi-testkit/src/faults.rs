//! Fault scripts: per-rpc sequences of outcomes, consumed in order, then normal service.
//!
//! A script belongs to one rpc and, optionally, one volume. Each matching call takes the next
//! step of the first script (oldest first) that still has steps; when every matching script
//! is used up the mock serves the call normally. Scripts can be added while the server runs.
//!
//! ```
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use csi_proto::Rpc;
//! use csi_testkit::MockPlugin;
//! use tonic::Code;
//!
//! let plugin = MockPlugin::builder().build()?;
//! // Twice UNAVAILABLE, then normal service.
//! plugin.faults().on(Rpc::NodeUnstageVolume).fail_times(2, Code::Unavailable, "busy");
//! // Only for vol-1: wait a second, then answer normally; the next call hangs.
//! plugin
//!     .faults()
//!     .on(Rpc::NodeStageVolume)
//!     .for_volume("vol-1")
//!     .then_delay(Duration::from_secs(1))
//!     .hang();
//! assert_eq!(plugin.faults().pending(Rpc::NodeUnstageVolume), 2);
//! # Ok(()) }
//! ```
//!
//! The builder installs its script when it is dropped, which in the one-statement form above
//! is at the semicolon; [`ScriptBuilder::install`] does it explicitly.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use csi_proto::Rpc;
use tonic::Code;

use crate::plugin::Shared;

/// One scripted outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultStep {
    /// Answer with this status instead of serving the call.
    Fail {
        /// The gRPC code.
        code: Code,
        /// The status message.
        message: String,
    },
    /// Wait this long, then serve the call normally.
    Delay(Duration),
    /// Never answer; the call ends when the caller gives up (or the server shuts down, or
    /// [`Faults::release_hung`] is called, which answer UNAVAILABLE).
    Hang,
    /// Hold the call, as a frozen plugin would, until [`Faults::resume_held`]; then serve it
    /// normally, as the plugin coming back. A caller that gives up meanwhile abandons it;
    /// shutdown and [`Faults::release_hung`] end it with UNAVAILABLE, as a hang.
    Hold,
    /// Tear down the connection the call arrived on; the caller sees a transport error.
    DropConnection,
    /// Serve the call normally (lets a script fail only the second call, say).
    Pass,
    /// For the streaming rpcs: send this many messages normally, then end the stream with
    /// this status. A unary rpc answers the status straight away.
    FailStreamAfter {
        /// How many response messages to send first.
        messages: usize,
        /// The gRPC code that ends the stream.
        code: Code,
        /// The status message.
        message: String,
    },
}

#[derive(Clone, Debug)]
struct Script {
    rpc: Rpc,
    volume: Option<String>,
    steps: VecDeque<FaultStep>,
    /// Taken by every matching call once `steps` are used up, until the scripts are cleared.
    forever: Option<FaultStep>,
}

impl Script {
    fn is_live(&self) -> bool {
        !self.steps.is_empty() || self.forever.is_some()
    }
}

/// The installed scripts: plain data inside the plugin's one lock.
#[derive(Debug, Default)]
pub(crate) struct FaultTable {
    scripts: Vec<Script>,
}

impl FaultTable {
    /// The next step for a call of `rpc` about `volume`, removing it from its script.
    pub(crate) fn take(&mut self, rpc: Rpc, volume: Option<&str>) -> Option<FaultStep> {
        let script = self.scripts.iter_mut().find(|s| {
            s.rpc == rpc && s.is_live() && s.volume.as_deref().is_none_or(|v| Some(v) == volume)
        })?;
        let step = script.steps.pop_front().or_else(|| script.forever.clone());
        self.scripts.retain(Script::is_live);
        step
    }

    fn install(&mut self, script: Script) {
        if script.is_live() {
            self.scripts.push(script);
        }
    }

    fn has_forever(&self) -> bool {
        self.scripts.iter().any(|s| s.forever.is_some())
    }

    fn pending(&self, rpc: Rpc) -> usize {
        self.scripts
            .iter()
            .filter(|s| s.rpc == rpc)
            .map(|s| s.steps.len())
            .sum()
    }

    fn total(&self) -> usize {
        self.scripts.iter().map(|s| s.steps.len()).sum()
    }
}

/// A handle on a plugin's fault scripts. Cheap to clone; every clone edits the same table.
#[derive(Clone)]
pub struct Faults {
    shared: Arc<Shared>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faults")
            .field("pending_steps", &self.shared.lock().faults.total())
            .finish()
    }
}

impl Faults {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Faults { shared }
    }

    /// Starts a script for `rpc`. Add steps with the builder's methods; the script is
    /// installed when the builder is dropped or [`ScriptBuilder::install`]ed.
    pub fn on(&self, rpc: Rpc) -> ScriptBuilder {
        ScriptBuilder {
            faults: self.clone(),
            script: Some(Script {
                rpc,
                volume: None,
                steps: VecDeque::new(),
                forever: None,
            }),
        }
    }

    /// How many scripted steps for `rpc` are still waiting to be consumed (a step that
    /// repeats forever, [`ScriptBuilder::forever`], is not counted).
    pub fn pending(&self, rpc: Rpc) -> usize {
        self.shared.lock().faults.pending(rpc)
    }

    /// Whether every installed script has been consumed (never, while a script repeats a
    /// step forever).
    pub fn is_exhausted(&self) -> bool {
        let inner = self.shared.lock();
        inner.faults.total() == 0 && !inner.faults.has_forever()
    }

    /// Removes every script that has not been consumed yet.
    pub fn clear(&self) {
        self.shared.lock().faults = FaultTable::default();
    }

    /// Ends every call currently hanging on a [`FaultStep::Hang`] (or waiting in a
    /// [`FaultStep::Delay`] or after a dropped connection, or held by a [`FaultStep::Hold`])
    /// with UNAVAILABLE.
    pub fn release_hung(&self) {
        self.shared.release.notify_waiters();
    }

    /// Serves every call held by a [`FaultStep::Hold`] now, normally: the plugin resumes.
    /// A held call that the call log shows (recorded in flight) is resumed; a call that
    /// arrives later takes its own step.
    ///
    /// ```
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use csi_proto::Rpc;
    /// use csi_testkit::MockPlugin;
    ///
    /// let plugin = MockPlugin::builder().build()?;
    /// plugin.faults().on(Rpc::NodeStageVolume).hold();
    /// // The next NodeStageVolume waits, in flight in the call log, until:
    /// plugin.faults().resume_held();
    /// # Ok(()) }
    /// ```
    pub fn resume_held(&self) {
        self.shared.resume.send_modify(|resumes| *resumes += 1);
    }
}

/// Builds one fault script; see the [module docs](self).
///
/// The script is installed when the builder is dropped, so the usual one statement
/// `faults.on(rpc).fail(..);` installs it at the semicolon. Bind the builder to a variable only
/// to add more steps before it goes out of scope, or call [`install`](Self::install).
pub struct ScriptBuilder {
    faults: Faults,
    script: Option<Script>,
}

impl fmt::Debug for ScriptBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptBuilder")
            .field("script", &self.script)
            .finish()
    }
}

impl ScriptBuilder {
    fn push(mut self, step: FaultStep) -> Self {
        if let Some(script) = self.script.as_mut() {
            script.steps.push_back(step);
        }
        self
    }

    /// Matches only calls about this volume (`volume_id`; `CreateSnapshot`'s
    /// `source_volume_id`; `CreateVolume`'s `name`).
    pub fn for_volume(mut self, volume_id: impl Into<String>) -> Self {
        if let Some(script) = self.script.as_mut() {
            script.volume = Some(volume_id.into());
        }
        self
    }

    /// Answers the next call with `code` and `message`.
    pub fn fail(self, code: Code, message: impl Into<String>) -> Self {
        self.push(FaultStep::Fail {
            code,
            message: message.into(),
        })
    }

    /// Answers the next `times` calls with `code` and `message`.
    pub fn fail_times(mut self, times: usize, code: Code, message: impl Into<String>) -> Self {
        let message = message.into();
        for _ in 0..times {
            self = self.fail(code, message.clone());
        }
        self
    }

    /// Delays the next call by `delay`, then serves it normally.
    pub fn then_delay(self, delay: Duration) -> Self {
        self.push(FaultStep::Delay(delay))
    }

    /// The next call never answers (until the caller gives up).
    pub fn hang(self) -> Self {
        self.push(FaultStep::Hang)
    }

    /// The next call is held until [`Faults::resume_held`], then served normally.
    pub fn hold(self) -> Self {
        self.push(FaultStep::Hold)
    }

    /// The next call tears down its connection.
    pub fn drop_connection(self) -> Self {
        self.push(FaultStep::DropConnection)
    }

    /// The next `times` calls are served normally.
    pub fn pass_times(mut self, times: usize) -> Self {
        for _ in 0..times {
            self = self.push(FaultStep::Pass);
        }
        self
    }

    /// For a streaming rpc: the next call sends `messages` messages, then fails.
    pub fn fail_stream_after(
        self,
        messages: usize,
        code: Code,
        message: impl Into<String>,
    ) -> Self {
        self.push(FaultStep::FailStreamAfter {
            messages,
            code,
            message: message.into(),
        })
    }

    /// Adds any step.
    pub fn step(self, step: FaultStep) -> Self {
        self.push(step)
    }

    /// After the steps added so far, every further matching call takes `step`, until
    /// [`Faults::clear`]. Steps added after this one are never reached.
    ///
    /// ```
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use csi_proto::Rpc;
    /// use csi_testkit::{FaultStep, MockPlugin};
    /// use tonic::Code;
    ///
    /// let plugin = MockPlugin::builder().build()?;
    /// // Two calls served normally, then DeleteVolume always fails.
    /// plugin.faults().on(Rpc::DeleteVolume).pass_times(2).forever(FaultStep::Fail {
    ///     code: Code::Internal,
    ///     message: "backend gone".into(),
    /// });
    /// assert!(!plugin.faults().is_exhausted());
    /// # Ok(()) }
    /// ```
    pub fn forever(mut self, step: FaultStep) -> Self {
        if let Some(script) = self.script.as_mut() {
            script.forever = Some(step);
        }
        self
    }

    /// Installs the script now.
    pub fn install(mut self) {
        self.install_now();
    }

    fn install_now(&mut self) {
        if let Some(script) = self.script.take() {
            self.faults.shared.lock().faults.install(script);
        }
    }
}

impl Drop for ScriptBuilder {
    fn drop(&mut self) {
        self.install_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(message: &str) -> FaultStep {
        FaultStep::Fail {
            code: Code::Unavailable,
            message: message.into(),
        }
    }

    #[test]
    fn steps_are_consumed_in_order_then_none() {
        let mut table = FaultTable::default();
        table.install(Script {
            rpc: Rpc::NodeUnstageVolume,
            volume: None,
            steps: VecDeque::from([fail("a"), FaultStep::Hang]),
            forever: None,
        });
        assert_eq!(table.take(Rpc::NodeStageVolume, None), None);
        assert_eq!(
            table.take(Rpc::NodeUnstageVolume, Some("v")),
            Some(fail("a"))
        );
        assert_eq!(
            table.take(Rpc::NodeUnstageVolume, None),
            Some(FaultStep::Hang)
        );
        assert_eq!(table.take(Rpc::NodeUnstageVolume, None), None);
        assert_eq!(table.total(), 0);
    }

    #[test]
    fn volume_scripts_match_only_their_volume() {
        let mut table = FaultTable::default();
        table.install(Script {
            rpc: Rpc::DeleteVolume,
            volume: Some("vol-1".into()),
            steps: VecDeque::from([fail("one")]),
            forever: None,
        });
        table.install(Script {
            rpc: Rpc::DeleteVolume,
            volume: None,
            steps: VecDeque::from([fail("any")]),
            forever: None,
        });
        assert_eq!(
            table.take(Rpc::DeleteVolume, Some("vol-2")),
            Some(fail("any"))
        );
        assert_eq!(table.take(Rpc::DeleteVolume, Some("vol-2")), None);
        assert_eq!(
            table.take(Rpc::DeleteVolume, Some("vol-1")),
            Some(fail("one"))
        );
    }

    #[test]
    fn a_forever_step_follows_the_finite_ones_and_never_runs_out() {
        let mut table = FaultTable::default();
        table.install(Script {
            rpc: Rpc::NodeUnpublishVolume,
            volume: None,
            steps: VecDeque::from([FaultStep::Pass]),
            forever: Some(fail("always")),
        });
        assert_eq!(
            table.take(Rpc::NodeUnpublishVolume, None),
            Some(FaultStep::Pass)
        );
        for _ in 0..3 {
            assert_eq!(
                table.take(Rpc::NodeUnpublishVolume, None),
                Some(fail("always"))
            );
        }
        assert!(table.has_forever());
    }
}
