//! What a long call waits on, shown while it waits.
//!
//! The demo's clients list their calls in one [`CallsInFlight`]; a task reads it every
//! second. A call that has run for [`LONG`] is shown on stderr: on a terminal as one status
//! line, rewritten every second and cleared before the table prints its next row; to a pipe
//! or a file as plain lines, one when the call becomes long and one every [`PLAIN_EVERY`]
//! after, so a log stays readable.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use csi_client::{CallInFlight, CallsInFlight};
use tokio::task::JoinHandle;

use crate::long_calls::Reminders;

/// How long a call runs before it is shown.
pub(crate) const LONG: Duration = Duration::from_secs(3);
/// How often a plain line is repeated for the same long call.
pub(crate) const PLAIN_EVERY: Duration = Duration::from_secs(15);
/// How often the list is read.
const TICK: Duration = Duration::from_secs(1);

/// Where waits are shown: stderr, as a status line on a terminal, as plain lines otherwise.
#[derive(Debug)]
pub(crate) struct WaitLine {
    tty: bool,
    /// Whether a status line is on the screen now (terminal only).
    shown: Mutex<bool>,
}

impl WaitLine {
    /// Shown on stderr, as a status line when stderr is a terminal.
    pub(crate) fn stderr() -> WaitLine {
        WaitLine {
            tty: std::io::stderr().is_terminal(),
            shown: Mutex::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, bool> {
        self.shown.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Clears the status line, and keeps it clear while the guard lives (the table writes a
    /// row meanwhile).
    pub(crate) fn quiet(&self) -> MutexGuard<'_, bool> {
        let mut shown = self.lock();
        if *shown {
            let mut err = std::io::stderr().lock();
            // Nothing to do about a terminal that cannot be written.
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            *shown = false;
        }
        shown
    }

    /// Shows `text` as the status line (terminal only).
    fn status(&self, text: &str) {
        let mut shown = self.lock();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{text}");
        let _ = err.flush();
        *shown = true;
    }

    /// Writes `text` as a line of its own.
    fn plain(&self, text: &str) {
        let _shown = self.lock();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{text}");
        let _ = err.flush();
    }
}

/// The text for one long call: `still in flight: NodeStageVolume volume v: waiting for the
/// plugin's answer, attempt 1 of 3 (deadline 2m), 4.0s so far` (ids escaped by
/// [`CallInFlight`]'s `Display`).
pub(crate) fn describe(call: &CallInFlight) -> String {
    format!("still in flight: {call}")
}

/// Starts reading `calls` every second, showing long calls on `line` until the task is
/// aborted.
pub(crate) fn watch(calls: Arc<CallsInFlight>, line: Arc<WaitLine>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut reminders = Reminders::new(LONG, PLAIN_EVERY);
        let mut ticks = tokio::time::interval(TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let now = Instant::now();
            let long: Vec<CallInFlight> = calls
                .list()
                .into_iter()
                .filter(|c| c.elapsed_at(now) >= LONG)
                .collect();
            if line.tty {
                match long.split_first() {
                    Some((oldest, [])) => line.status(&describe(oldest)),
                    Some((oldest, rest)) => {
                        line.status(&format!("{} (and {} more)", describe(oldest), rest.len()))
                    }
                    None => drop(line.quiet()),
                }
            } else {
                let ages: Vec<(u64, Duration)> =
                    long.iter().map(|c| (c.id, c.elapsed_at(now))).collect();
                let shown = reminders.due(&ages);
                for call in long.iter().filter(|c| shown.contains(&c.id)) {
                    line.plain(&describe(call));
                }
            }
        }
    })
}
