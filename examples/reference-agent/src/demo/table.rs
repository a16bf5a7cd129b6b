//! The demo's aligned output: one numbered row per CSI call (or per step that made none), and
//! unnumbered notes under them (what the service reported, what was planned).
//!
//! Rows and notes quote the plugin (ids, versions, error texts): every line is
//! [escaped](csi_structs::untrusted), so a plugin cannot forge a row or drive the terminal.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::Duration;

use csi_client::{CallEvent, CallOutcome};
use csi_structs::ErrorClass;
use csi_structs::untrusted::escaped;

use super::Step;
use super::waits::WaitLine;

const STEP_WIDTH: usize = 17;
const RPC_WIDTH: usize = 30;
const VOLUME_WIDTH: usize = 22;
const TIME_WIDTH: usize = 9;

/// Writes the table to a writer (stdout for the command), flushing each line.
#[derive(Debug)]
pub struct Table<W: Write> {
    out: W,
    rows: usize,
    calls: usize,
    /// The status line of a long call, cleared before each write.
    waits: Option<Arc<WaitLine>>,
}

impl<W: Write> Table<W> {
    /// A table writing to `out`; call [`header`](Self::header) first.
    pub fn new(out: W) -> Self {
        Self {
            out,
            rows: 0,
            calls: 0,
            waits: None,
        }
    }

    /// Clears `line`'s status line before each write, so a row never lands after it.
    pub(crate) fn clear_before_writing(&mut self, line: Arc<WaitLine>) {
        self.waits = Some(line);
    }

    fn write(&mut self, text: &str) -> io::Result<()> {
        let _quiet = self.waits.as_ref().map(|w| w.quiet());
        writeln!(self.out, "{}", escaped(text))?;
        self.out.flush()
    }

    /// Prints the header.
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn header(&mut self) -> io::Result<()> {
        let header = format!(
            "{:>2}  {:<STEP_WIDTH$}  {:<RPC_WIDTH$}  {:<VOLUME_WIDTH$}  {:>TIME_WIDTH$}  outcome",
            "#", "step", "rpc", "volume", "duration"
        );
        self.write(&header)?;
        let rule = format!(
            "--  {:-<STEP_WIDTH$}  {:-<RPC_WIDTH$}  {:-<VOLUME_WIDTH$}  {:->TIME_WIDTH$}  -------",
            "", "", "", ""
        );
        self.write(&rule)
    }

    /// Prints one row: the step, the CSI call (`-` for none), the volume it names, how long it
    /// took (`None`: not run) and its outcome.
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn row(
        &mut self,
        step: Step,
        rpc: &str,
        volume: Option<&str>,
        took: Option<Duration>,
        outcome: &str,
    ) -> io::Result<()> {
        self.rows += 1;
        let took = match took {
            Some(d) if d < Duration::from_secs(10) => format!("{:.1} ms", d.as_secs_f64() * 1000.0),
            Some(d) => format!("{:.1} s", d.as_secs_f64()),
            None => "-".to_owned(),
        };
        let row = format!(
            "{:>2}  {:<STEP_WIDTH$}  {rpc:<RPC_WIDTH$}  {:<VOLUME_WIDTH$}  {took:>TIME_WIDTH$}  {outcome}",
            self.rows,
            step.name(),
            // Escaped before it is padded, so the columns after it stay aligned.
            escaped(volume.unwrap_or("-")),
        );
        self.write(&row)
    }

    /// Prints the row of a CSI call the library reported.
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn call(&mut self, step: Step, call: &CallEvent) -> io::Result<()> {
        self.calls += 1;
        let outcome = match call.outcome {
            CallOutcome::Ok => "ok".to_owned(),
            CallOutcome::Failed {
                class: ErrorClass::AlreadyDone,
                ..
            } => format!("ok: already done ({})", call.outcome.label()),
            CallOutcome::Failed { class, .. } => {
                format!("failed: {} ({})", call.outcome.label(), class.as_str())
            }
        };
        let volume = call.volume.as_ref().map(|v| v.as_str());
        self.row(step, call.rpc.name(), volume, Some(call.duration), &outcome)
    }

    /// Prints a note under the rows of `step`.
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn note(&mut self, step: Step, text: &str) -> io::Result<()> {
        self.write(&format!("{:>2}  {:<STEP_WIDTH$}  {text}", "", step.name()))
    }

    /// Prints a free-form line (a heading, the summary).
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn line(&mut self, text: &str) -> io::Result<()> {
        self.write(text)
    }

    /// How many CSI calls were printed.
    pub fn calls(&self) -> usize {
        self.calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_aligned_and_plugin_text_cannot_forge_one() {
        let mut table = Table::new(Vec::new());
        table.header().unwrap();
        let event = CallEvent {
            rpc: csi_client::Rpc::NodeStageVolume,
            volume: Some(csi_structs::ExternalVolumeId::new("vol\n99  forged").unwrap()),
            attempts: 1,
            duration: Duration::from_micros(1500),
            outcome: CallOutcome::Ok,
        };
        table.call(Step::Claim, &event).unwrap();
        table
            .row(Step::Expand, "-", None, Some(Duration::from_secs(30)), "ok")
            .unwrap();
        table.note(Step::Claim, "service: \u{1b}[2J").unwrap();
        let text = String::from_utf8(table.out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        let column = lines[0].find("outcome").unwrap();
        assert_eq!(&lines[2][column..], "ok", "{text}");
        assert_eq!(&lines[3][column..], "ok", "{text}");
        assert!(lines[2].contains(r"vol\n99  forged") && lines[2].contains("1.5 ms"));
        assert!(lines[3].contains("30.0 s"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert_eq!(table.calls, 1);
    }
}
