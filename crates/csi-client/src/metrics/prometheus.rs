//! The Prometheus text exposition of [`InMemoryMetrics`].

use std::fmt::Write as _;

use csi_proto::Rpc;

use super::InMemoryMetrics;
use super::memory::LATENCY_BUCKETS;

const DURATION: &str = "csi_rpc_duration_seconds";
const TOTAL: &str = "csi_rpc_total";
/// Label names the families use themselves.
const RESERVED: [&str; 3] = ["rpc", "code", "le"];

/// An extra label refused by [`write_prometheus`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// The name is not `[a-zA-Z_][a-zA-Z0-9_]*` or starts with `__` (reserved by Prometheus).
    #[error(
        "metric label name {name:?} is not valid (want [a-zA-Z_][a-zA-Z0-9_]*, not starting with __)"
    )]
    InvalidName {
        /// The refused name.
        name: String,
    },
    /// The name is one the metric families use themselves (`rpc`, `code`, `le`).
    #[error("metric label name {name:?} is reserved by the csi_rpc metrics")]
    Reserved {
        /// The refused name.
        name: String,
    },
    /// The same name appears twice in one label set.
    #[error("metric label name {name:?} is given twice")]
    Duplicate {
        /// The repeated name.
        name: String,
    },
}

fn check_labels(labels: &[(&str, &str)]) -> Result<(), LabelError> {
    for (i, (name, _)) in labels.iter().enumerate() {
        let mut chars = name.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with("__");
        if !valid {
            return Err(LabelError::InvalidName {
                name: (*name).to_owned(),
            });
        }
        if RESERVED.contains(name) {
            return Err(LabelError::Reserved {
                name: (*name).to_owned(),
            });
        }
        if labels[..i].iter().any(|(other, _)| other == name) {
            return Err(LabelError::Duplicate {
                name: (*name).to_owned(),
            });
        }
    }
    Ok(())
}

/// Writes `value` as a label value: backslash, quote and newline escaped.
pub(crate) fn push_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Writes `{extra..., rpc="X"` (without closing brace) into `out`.
fn open_labels(out: &mut String, extra: &[(&str, &str)], rpc: Rpc) {
    out.push('{');
    for (name, value) in extra {
        out.push_str(name);
        out.push_str("=\"");
        push_label_value(out, value);
        out.push_str("\",");
    }
    out.push_str("rpc=\"");
    out.push_str(rpc.name());
    out.push('"');
}

/// Appends the Prometheus text exposition (format 0.0.4) of several [`InMemoryMetrics`] to
/// `out`, each source's series carrying its extra labels (for example
/// `[("plugin", "hostpath")]`), with one `# HELP`/`# TYPE` header per family:
///
/// - `csi_rpc_duration_seconds` (histogram, label `rpc`): latency per RPC, buckets
///   [`LATENCY_BUCKETS`] in seconds, then `_sum` and `_count`;
/// - `csi_rpc_total` (counter, labels `rpc` and `code`): requests per RPC and outcome, the
///   code being a gRPC code name or `transport_error`, `no_status`, `dropped`
///   ([`RpcOutcome::label`](super::RpcOutcome::label)).
///
/// Only RPCs with at least one request appear. Label values are escaped.
///
/// # Errors
///
/// An extra label name that Prometheus would reject, a reserved one (`rpc`, `code`, `le`),
/// or the same name twice in a set; nothing is written then.
///
/// ```
/// use std::time::Duration;
/// use csi_client::{Code, Rpc};
/// use csi_client::metrics::{InMemoryMetrics, RpcMetrics, RpcOutcome, write_prometheus};
///
/// let (a, b) = (InMemoryMetrics::new(), InMemoryMetrics::new());
/// a.record(Rpc::Probe, RpcOutcome::Status(Code::Ok), Duration::from_millis(1));
/// let mut text = String::new();
/// write_prometheus(&mut text, [(&[("plugin", "a")][..], &a), (&[("plugin", "b")][..], &b)])?;
/// assert!(text.contains(r#"csi_rpc_total{plugin="a",rpc="Probe",code="Ok"} 1"#));
/// # Ok::<(), csi_client::metrics::LabelError>(())
/// ```
pub fn write_prometheus<'a>(
    out: &mut String,
    sources: impl IntoIterator<Item = (&'a [(&'a str, &'a str)], &'a InMemoryMetrics)>,
) -> Result<(), LabelError> {
    let sources: Vec<_> = sources.into_iter().collect();
    for (labels, _) in &sources {
        check_labels(labels)?;
    }
    // Writing into a `String` cannot fail; the `fmt::Result`s below are always `Ok`.
    let _ = writeln!(
        out,
        "# HELP {DURATION} Time from sending a CSI request to its final gRPC status, per attempt."
    );
    let _ = writeln!(out, "# TYPE {DURATION} histogram");
    for (labels, metrics) in &sources {
        for rpc in Rpc::ALL.iter().copied() {
            let histogram = metrics.histogram(rpc);
            let count = histogram.count();
            if count == 0 {
                continue;
            }
            for (bound, n) in LATENCY_BUCKETS.iter().zip(&histogram.cumulative) {
                out.push_str(DURATION);
                out.push_str("_bucket");
                open_labels(out, labels, rpc);
                let _ = writeln!(out, ",le=\"{}\"}} {n}", bound.as_secs_f64());
            }
            out.push_str(DURATION);
            out.push_str("_bucket");
            open_labels(out, labels, rpc);
            let _ = writeln!(out, ",le=\"+Inf\"}} {count}");
            out.push_str(DURATION);
            out.push_str("_sum");
            open_labels(out, labels, rpc);
            let _ = writeln!(out, "}} {}", histogram.sum.as_secs_f64());
            out.push_str(DURATION);
            out.push_str("_count");
            open_labels(out, labels, rpc);
            let _ = writeln!(out, "}} {count}");
        }
    }
    let _ = writeln!(
        out,
        "# HELP {TOTAL} CSI requests by final gRPC status code (or transport_error, no_status, dropped), per attempt."
    );
    let _ = writeln!(out, "# TYPE {TOTAL} counter");
    for (labels, metrics) in &sources {
        for (rpc, outcome, n) in metrics.counts() {
            out.push_str(TOTAL);
            open_labels(out, labels, rpc);
            let _ = writeln!(out, ",code=\"{}\"}} {n}", outcome.label());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{RpcMetrics, RpcOutcome};
    use std::collections::HashMap;
    use std::time::Duration;
    use tonic::Code;

    /// A strict reader of the lines we write: `name{k="v",...} value`, HELP/TYPE comments.
    pub(crate) fn parse(text: &str) -> HashMap<String, f64> {
        let mut samples = HashMap::new();
        for line in text.lines() {
            if let Some(comment) = line.strip_prefix("# ") {
                assert!(
                    comment.starts_with("HELP ") || comment.starts_with("TYPE "),
                    "{line}"
                );
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("a sample line has a value");
            let value: f64 = value.parse().expect("the value is a number");
            let (name, labels) = series.split_once('{').expect("every series has labels");
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            let labels = labels.strip_suffix('}').expect("labels close");
            assert!(!labels.is_empty());
            assert!(
                samples.insert(series.to_owned(), value).is_none(),
                "{series} twice"
            );
        }
        samples
    }

    #[test]
    fn renders_histograms_and_counters_that_parse() {
        let m = InMemoryMetrics::new();
        m.record(
            Rpc::Probe,
            RpcOutcome::Status(Code::Ok),
            Duration::from_millis(3),
        );
        m.record(Rpc::Probe, RpcOutcome::Transport, Duration::from_millis(20));
        let text = m.render_prometheus();
        let samples = parse(&text);
        assert_eq!(
            samples[r#"csi_rpc_duration_seconds_bucket{rpc="Probe",le="0.0025"}"#],
            0.0
        );
        assert_eq!(
            samples[r#"csi_rpc_duration_seconds_bucket{rpc="Probe",le="0.005"}"#],
            1.0
        );
        assert_eq!(
            samples[r#"csi_rpc_duration_seconds_bucket{rpc="Probe",le="+Inf"}"#],
            2.0
        );
        assert_eq!(
            samples[r#"csi_rpc_duration_seconds_count{rpc="Probe"}"#],
            2.0
        );
        assert_eq!(
            samples[r#"csi_rpc_duration_seconds_sum{rpc="Probe"}"#],
            0.023
        );
        assert_eq!(samples[r#"csi_rpc_total{rpc="Probe",code="Ok"}"#], 1.0);
        assert_eq!(
            samples[r#"csi_rpc_total{rpc="Probe",code="transport_error"}"#],
            1.0
        );
        // Nothing for an RPC without requests; one header pair per family.
        assert!(!text.contains("NodeGetInfo"));
        assert_eq!(text.matches("# TYPE").count(), 2);
    }

    #[test]
    fn extra_labels_are_checked_and_escaped() {
        let m = InMemoryMetrics::new();
        m.record(Rpc::Probe, RpcOutcome::Status(Code::Ok), Duration::ZERO);
        let mut out = String::new();
        write_prometheus(&mut out, [(&[("plugin", "a\"b\\c\nd")][..], &m)]).unwrap();
        assert!(out.contains(r#"csi_rpc_total{plugin="a\"b\\c\nd",rpc="Probe",code="Ok"} 1"#));

        for (labels, want) in [
            (
                &[("9x", "v")][..],
                LabelError::InvalidName { name: "9x".into() },
            ),
            (
                &[("__x", "v")][..],
                LabelError::InvalidName { name: "__x".into() },
            ),
            (
                &[("a-b", "v")][..],
                LabelError::InvalidName { name: "a-b".into() },
            ),
            (
                &[("", "v")][..],
                LabelError::InvalidName { name: "".into() },
            ),
            (
                &[("le", "v")][..],
                LabelError::Reserved { name: "le".into() },
            ),
            (
                &[("p", "1"), ("p", "2")][..],
                LabelError::Duplicate { name: "p".into() },
            ),
        ] {
            let mut out = String::new();
            assert_eq!(write_prometheus(&mut out, [(labels, &m)]), Err(want));
            assert!(out.is_empty());
        }
    }
}
