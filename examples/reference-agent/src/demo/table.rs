//! The demo's aligned output table, one row per step as it ends.
//!
//! Results quote the plugin (ids, versions, error texts): every result and line is
//! [escaped](csi_structs::untrusted), so a plugin cannot forge a row or drive the terminal.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::Duration;

use csi_structs::untrusted::escaped;

use super::step::Step;
use super::waits::WaitLine;

const STEP_WIDTH: usize = 30;
const CALL_WIDTH: usize = 27;
const TIME_WIDTH: usize = 10;

/// Writes the table to a writer (stdout for the command), flushing each row.
#[derive(Debug)]
pub struct Table<W: Write> {
    out: W,
    rows: usize,
    /// The status line of a long call, cleared before each write.
    waits: Option<Arc<WaitLine>>,
}

impl<W: Write> Table<W> {
    /// A table writing to `out`; call [`header`](Self::header) first.
    pub fn new(out: W) -> Self {
        Self {
            out,
            rows: 0,
            waits: None,
        }
    }

    /// Clears `line`'s status line before each write, so a row never lands after it.
    pub(crate) fn clear_before_writing(&mut self, line: Arc<WaitLine>) {
        self.waits = Some(line);
    }

    /// Prints the header.
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn header(&mut self) -> io::Result<()> {
        let _quiet = self.waits.as_ref().map(|w| w.quiet());
        writeln!(
            self.out,
            "{:>2}  {:<STEP_WIDTH$}  {:<CALL_WIDTH$}  {:>TIME_WIDTH$}  result",
            "#", "step", "rpc", "duration"
        )?;
        writeln!(
            self.out,
            "{:>2}  {:-<STEP_WIDTH$}  {:-<CALL_WIDTH$}  {:->TIME_WIDTH$}  {:-<6}",
            "--", "", "", "", ""
        )?;
        self.out.flush()
    }

    /// Prints one row: the step, what it called, how long it took (`None`: not run) and the
    /// result text.
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn row(&mut self, step: Step, took: Option<Duration>, result: &str) -> io::Result<()> {
        let _quiet = self.waits.as_ref().map(|w| w.quiet());
        self.rows += 1;
        let took = match took {
            Some(d) if d < Duration::from_secs(10) => format!("{:.1} ms", d.as_secs_f64() * 1000.0),
            Some(d) => format!("{:.1} s", d.as_secs_f64()),
            None => "-".to_owned(),
        };
        writeln!(
            self.out,
            "{:>2}  {:<STEP_WIDTH$}  {:<CALL_WIDTH$}  {:>TIME_WIDTH$}  {}",
            self.rows,
            step.name(),
            step.call(),
            took,
            escaped(result)
        )?;
        self.out.flush()
    }

    /// Prints a free-form line (a note, the summary).
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn line(&mut self, text: &str) -> io::Result<()> {
        let _quiet = self.waits.as_ref().map(|w| w.quiet());
        writeln!(self.out, "{}", escaped(text))?;
        self.out.flush()
    }

    /// How many rows were printed.
    pub fn rows(&self) -> usize {
        self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_aligned_whatever_the_step() {
        let mut table = Table::new(Vec::new());
        table.header().unwrap();
        for step in Step::ALL {
            table
                .row(step, Some(Duration::from_micros(1500)), "ok")
                .unwrap();
        }
        table.row(Step::NodeStage, None, "skipped").unwrap();
        let text = String::from_utf8(table.out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2 + Step::ALL.len() + 1);
        let column = lines[0].find("result").unwrap();
        for line in &lines[2..] {
            let result = &line[column..];
            assert!(
                result == "ok" || result == "skipped",
                "result column misaligned in {line:?}"
            );
        }
        assert!(lines[2].contains("1.5 ms"));
        let mut table = Table::new(Vec::new());
        table
            .row(Step::Fingerprint, Some(Duration::from_secs(30)), "x")
            .unwrap();
        let text = String::from_utf8(table.out).unwrap();
        assert!(text.contains("  30.0 s  x"), "{text}");
    }

    #[test]
    fn plugin_text_cannot_forge_a_row() {
        let mut table = Table::new(Vec::new());
        table.header().unwrap();
        table
            .row(
                Step::CreateVolume,
                None,
                "ok: vol\n99  forged-step  CreateVolume  0.1 ms  ok\r\u{1b}[2J\0",
            )
            .unwrap();
        table.line("left behind: vol\nforged").unwrap();
        let text = String::from_utf8(table.out).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(
            !text
                .chars()
                .any(|c| c != '\n' && csi_structs::untrusted::needs_escape(c)),
            "{text:?}"
        );
        assert!(text.contains(r"ok: vol\n99  forged-step"), "{text}");
    }
}
