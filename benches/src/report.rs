//! The one-line result of a load run: its fields, how it prints, and how it parses back.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// One result line:
/// `client=<client> rpc=<rpc> n=<n> c=<c> ops_per_s=<x> p50_us=<x> p99_us=<x>`.
///
/// ```
/// use csi_benches::Line;
///
/// let line: Line = "client=csi-client rpc=probe n=10 c=2 ops_per_s=5000 p50_us=80.5 p99_us=120.0"
///     .parse()
///     .unwrap();
/// assert_eq!(line.rpc, "probe");
/// assert_eq!(line.to_string().parse::<Line>().unwrap(), line);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// What made the calls: `csi-client`, or `baseline` for the raw socket floor.
    pub client: String,
    /// The rpc measured (`probe`, `nodecaps`, `validate`, `publish`, or `pingpong`).
    pub rpc: String,
    /// How many calls were measured.
    pub n: u64,
    /// How many callers ran at once.
    pub c: u32,
    /// Calls finished per second of wall time.
    pub ops_per_s: f64,
    /// Median call latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile call latency, microseconds.
    pub p99_us: f64,
}

/// The field names of a [`Line`], in order.
pub const FIELDS: [&str; 7] = ["client", "rpc", "n", "c", "ops_per_s", "p50_us", "p99_us"];

impl Line {
    /// A line from raw latencies and the wall time of the whole run. `latencies` is sorted in
    /// place. With no latencies the rates and percentiles are 0.
    pub fn from_run(
        client: &str,
        rpc: &str,
        c: u32,
        latencies: &mut [Duration],
        wall: Duration,
    ) -> Line {
        latencies.sort_unstable();
        let n = latencies.len() as u64;
        let secs = wall.as_secs_f64();
        let ops_per_s = if secs > 0.0 { n as f64 / secs } else { 0.0 };
        Line {
            client: client.to_owned(),
            rpc: rpc.to_owned(),
            n,
            c,
            ops_per_s,
            p50_us: micros(percentile(latencies, 50)),
            p99_us: micros(percentile(latencies, 99)),
        }
    }
}

/// The `pct`th percentile (nearest rank) of sorted `latencies`; zero when empty.
pub fn percentile(sorted: &[Duration], pct: u32) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let len = sorted.len();
    // Nearest rank: ceil(pct/100 * len), 1-based.
    let rank = (len * pct.min(100) as usize).div_ceil(100).max(1);
    sorted[rank.min(len) - 1]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "client={} rpc={} n={} c={} ops_per_s={:.0} p50_us={:.1} p99_us={:.1}",
            self.client, self.rpc, self.n, self.c, self.ops_per_s, self.p50_us, self.p99_us
        )
    }
}

/// Why text is not a [`Line`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// A field is missing or out of order.
    #[error("field {expected} missing or out of order (found {found:?})")]
    Field {
        /// The field expected at this position.
        expected: &'static str,
        /// What was found there.
        found: String,
    },
    /// A field's value does not parse.
    #[error("field {field}: value {value:?} is not a {kind}")]
    Value {
        /// The field.
        field: &'static str,
        /// The value.
        value: String,
        /// What it should be.
        kind: &'static str,
    },
    /// Text after the last field.
    #[error("unexpected text after p99_us: {extra:?}")]
    Trailing {
        /// The extra text.
        extra: String,
    },
}

impl FromStr for Line {
    type Err = LineError;

    fn from_str(s: &str) -> Result<Line, LineError> {
        let mut parts = s.split_whitespace();
        let mut values = [""; 7];
        for (slot, field) in values.iter_mut().zip(FIELDS) {
            let part = parts.next().unwrap_or("");
            match part.split_once('=') {
                Some((key, value)) if key == field && !value.is_empty() => *slot = value,
                _ => {
                    return Err(LineError::Field {
                        expected: field,
                        found: part.to_owned(),
                    });
                }
            }
        }
        let rest: Vec<&str> = parts.collect();
        if !rest.is_empty() {
            return Err(LineError::Trailing {
                extra: rest.join(" "),
            });
        }
        let [client, rpc, n, c, ops, p50, p99] = values;
        Ok(Line {
            client: client.to_owned(),
            rpc: rpc.to_owned(),
            n: number(FIELDS[2], n, "whole number")?,
            c: number(FIELDS[3], c, "whole number")?,
            ops_per_s: finite(FIELDS[4], ops)?,
            p50_us: finite(FIELDS[5], p50)?,
            p99_us: finite(FIELDS[6], p99)?,
        })
    }
}

fn number<T: FromStr>(
    field: &'static str,
    value: &str,
    kind: &'static str,
) -> Result<T, LineError> {
    value.parse().map_err(|_| LineError::Value {
        field,
        value: value.to_owned(),
        kind,
    })
}

fn finite(field: &'static str, value: &str) -> Result<f64, LineError> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(LineError::Value {
            field,
            value: value.to_owned(),
            kind: "non-negative number",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let mut v: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let line = Line::from_run("x", "probe", 1, &mut v, Duration::from_secs(1));
        assert_eq!(line.p50_us.round(), 50.0);
        assert_eq!(line.p99_us.round(), 99.0);
        assert_eq!(line.n, 100);
        assert_eq!(line.ops_per_s.round(), 100.0);
        assert_eq!(percentile(&[], 50), Duration::ZERO);
        assert_eq!(percentile(&[Duration::from_micros(7)], 99).as_micros(), 7);
    }

    #[test]
    fn bad_lines_name_the_field() {
        let ok = "client=a rpc=b n=1 c=1 ops_per_s=1 p50_us=1 p99_us=1";
        assert!(ok.parse::<Line>().is_ok());
        let missing = "client=a rpc=b n=1 c=1 ops_per_s=1 p50_us=1";
        assert!(matches!(
            missing.parse::<Line>(),
            Err(LineError::Field {
                expected: "p99_us",
                ..
            })
        ));
        let swapped = "client=a rpc=b c=1 n=1 ops_per_s=1 p50_us=1 p99_us=1";
        assert!(matches!(
            swapped.parse::<Line>(),
            Err(LineError::Field { expected: "n", .. })
        ));
        let nan = "client=a rpc=b n=1 c=1 ops_per_s=NaN p50_us=1 p99_us=1";
        assert!(matches!(
            nan.parse::<Line>(),
            Err(LineError::Value {
                field: "ops_per_s",
                ..
            })
        ));
        let extra = format!("{ok} more=1");
        assert!(matches!(
            extra.parse::<Line>(),
            Err(LineError::Trailing { .. })
        ));
    }
}
