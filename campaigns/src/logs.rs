//! Capturing the workspace crates' logs in memory, so a campaign can check that no secret it
//! sent ever reaches a log line.

use std::io;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

static BUFFER: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

/// The most log bytes kept between two [`take`]s; older lines are dropped first.
const MAX_KEPT: usize = 4 << 20;

struct Capture(Arc<Mutex<Vec<u8>>>);

impl io::Write for Capture {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut buf = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if buf.len() + data.len() > MAX_KEPT {
            let drop = (buf.len() + data.len() - MAX_KEPT).min(buf.len());
            buf.drain(..drop);
        }
        buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sends every event of the workspace crates (all levels) to the in-memory buffer. Once per
/// process; a later call does nothing. When another global subscriber was set first, nothing
/// is captured and [`take`] stays empty.
pub fn capture() {
    BUFFER.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = buffer.clone();
        let _already_set = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "csi_rpc_shim=trace,csi_structs=trace,csi_agent=trace,csi_client=trace,csi_campaigns=trace",
            ))
            .with_ansi(false)
            .with_writer(move || Capture(writer.clone()))
            .try_init();
        buffer
    });
}

/// The log text captured since the last call, and empties the buffer.
pub fn take() -> String {
    match BUFFER.get() {
        Some(buffer) => {
            let bytes = std::mem::take(&mut *buffer.lock().unwrap_or_else(PoisonError::into_inner));
            String::from_utf8_lossy(&bytes).into_owned()
        }
        None => String::new(),
    }
}
