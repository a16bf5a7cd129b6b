//! The agent's log format: tracing-subscriber's plain `name=value` fields, with every value
//! [escaped](csi_structs::untrusted).
//!
//! Log fields carry what plugins and peers said (volume ids, versions, error texts). Written
//! raw, a newline in one forges a log line and an escape sequence drives the terminal of
//! whoever reads the log; escaped, each event stays one line.

use std::fmt::Write as _;

use csi_structs::untrusted::escaped;
use tracing_subscriber::field::MakeExt as _;
use tracing_subscriber::fmt::FormatFields;

/// The field formatter of the agent's log (for
/// [`SubscriberBuilder::fmt_fields`](tracing_subscriber::fmt::SubscriberBuilder::fmt_fields)).
pub fn escaped_fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = write!(text, "{value:?}");
        if field.name() == "message" {
            write!(writer, "{}", escaped(&text))
        } else {
            write!(writer, "{field}={}", escaped(&text))
        }
    })
    .delimited(" ")
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex, PoisonError};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn plugin_text_cannot_forge_a_log_line() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(escaped_fields())
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let volume = "vol-1\n2026-01-01T00:00:00Z  INFO forged: volume deleted";
        let version = "1.0\r\u{1b}[2J";
        let error = "boom\0\nERROR forged";
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(volume = %volume, version = %version, "created {}", error);
            tracing::warn!(error = %error, "plugin failed");
        });
        let log = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(log.lines().count(), 2, "{log}");
        assert!(
            !log.chars()
                .any(|c| c != '\n' && csi_structs::untrusted::needs_escape(c)),
            "{log:?}"
        );
        assert!(
            log.contains(r"created boom\0\nERROR forged")
                && log.contains(r"volume=vol-1\n2026-01-01T00:00:00Z  INFO forged")
                && log.contains(r"version=1.0\r\u{1b}[2J"),
            "{log}"
        );
    }
}
