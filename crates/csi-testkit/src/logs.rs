//! The `tracing` lines a piece of code writes, for tests of what is logged: [`capture`].

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

/// Runs `f` on this thread with a subscriber of its own (every level, no time, no colour)
/// and answers the lines it wrote, one string each, in order, as `LEVEL target: message
/// field=value …`.
///
/// The subscriber is this thread's only while `f` runs: lines of other threads (other tests
/// running alongside) are not captured, and `f` should not hand its logging to another
/// thread.
///
/// ```
/// let lines = csi_testkit::logs::capture(|| tracing::warn!(volume = "v1", "release failed"));
/// assert_eq!(lines.len(), 1);
/// assert!(lines[0].contains("WARN") && lines[0].contains("release failed volume=\"v1\""));
/// ```
pub fn capture(f: impl FnOnce()) -> Vec<String> {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .without_time()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = buffer.0.lock().unwrap_or_else(PoisonError::into_inner);
    String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Where the captured lines go.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
