//! What a long call waits on, shown while it waits.
//!
//! The demo's clients list their calls in one [`CallsInFlight`]; a task reads it every
//! second. A call that has run for [`LONG`] is shown on stderr: on a terminal as one status
//! line, rewritten every second and cleared before the table prints its next row; to a pipe
//! or a file as plain lines, one when the call becomes long and one every [`PLAIN_EVERY`]
//! after, so a log stays readable.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use csi_client::{CallInFlight, CallsInFlight, LongCalls};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a call runs before it is shown.
pub(crate) const LONG: Duration = Duration::from_secs(3);
/// How often a plain line is repeated for the same long call.
pub(crate) const PLAIN_EVERY: Duration = Duration::from_secs(15);
/// The widest status line: one that wraps could not be cleared in place.
const STATUS_WIDTH: usize = 79;

/// `text` cut to `width` characters, ending with `…` when cut.
fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

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
        let text = fit(text, STATUS_WIDTH);
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

/// The status line for one long call, the time first so that a cut keeps it: `4.0s
/// NodeStageVolume volume vol-1: waiting for the plugin's answer, attempt 1 of 3 (deadline
/// 2m), …` (ids escaped by [`CallInFlight`]'s `Display`).
fn status_text(call: &CallInFlight, now: Instant) -> String {
    format!("{:.1}s {call}", call.elapsed_at(now).as_secs_f64())
}

/// Starts reading `calls` every second, showing long calls on `line` until the task is
/// aborted.
pub(crate) fn watch(calls: Arc<CallsInFlight>, line: Arc<WaitLine>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut reminders = LongCalls::new(LONG, PLAIN_EVERY);
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
                    Some((oldest, [])) => line.status(&status_text(oldest, now)),
                    Some((oldest, rest)) => line.status(&format!(
                        "{} (and {} more)",
                        status_text(oldest, now),
                        rest.len()
                    )),
                    None => drop(line.quiet()),
                }
            } else {
                for call in reminders.due(&long, now) {
                    line.plain(&format!("still in flight: {call}"));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_line_fits_one_terminal_row() {
        assert_eq!(fit("short", 79), "short");
        let long = "x".repeat(200);
        let cut = fit(&long, STATUS_WIDTH);
        assert_eq!(cut.chars().count(), STATUS_WIDTH);
        assert!(cut.ends_with('…'));
    }
}
