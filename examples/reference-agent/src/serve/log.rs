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
