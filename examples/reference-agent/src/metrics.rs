//! Prometheus text-format metrics of `csi-agent serve`.
//!
//! - `csi_agent_rpc_calls_total{plugin,rpc,code}` and the histogram
//!   `csi_agent_rpc_duration_seconds{plugin,rpc}`: every CSI call the agent made, fed by
//!   csi-client's [`CallObserver`] (one [`PluginObserver`] per plugin client).
//! - `csi_agent_claims{state}`: claims per state, and `csi_agent_stuck_releases`: volumes
//!   whose last release step failed. Both are gauges computed at scrape time
//!   ([`Gauges`]), so they cannot drift from the claim store.
//! - `csi_agent_plugins{health}`: known plugins by health.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use csi_client::{CallEvent, CallObserver};
use csi_structs::PluginId;

/// Upper bounds of the latency histogram, in seconds.
pub const BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0];

#[derive(Debug, Default, Clone)]
struct Latency {
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Debug, Default)]
struct Table {
    /// (plugin, rpc, code) → calls.
    calls: BTreeMap<(String, &'static str, &'static str), u64>,
    /// (plugin, rpc) → latency.
    latency: BTreeMap<(String, &'static str), Latency>,
}

/// The agent's call metrics. Cheap to clone; clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    table: Arc<Mutex<Table>>,
}

/// Values read from the rest of the agent when `/metrics` is scraped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Claims per state name (`taken`, `releasing`, …).
    pub claims: BTreeMap<String, u64>,
    /// Volumes whose release is stuck (last step or write failed).
    pub stuck_releases: u64,
    /// Plugins per health (`healthy`, `unhealthy`, `not_ready`, `unknown`).
    pub plugins: BTreeMap<String, u64>,
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// An observer that records the calls of `plugin`'s client.
    pub fn observer(&self, plugin: &PluginId) -> Arc<dyn CallObserver> {
        Arc::new(PluginObserver {
            plugin: plugin.as_str().to_owned(),
            metrics: self.clone(),
        })
    }

    /// Records one finished call.
    pub fn record(&self, plugin: &str, event: &CallEvent) {
        let rpc = event.rpc.name();
        let code = event.outcome.label();
        let seconds = event.duration.as_secs_f64();
        let mut t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        *t.calls.entry((plugin.to_owned(), rpc, code)).or_default() += 1;
        let l = t.latency.entry((plugin.to_owned(), rpc)).or_default();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                l.buckets[i] += 1;
            }
        }
        l.count += 1;
        l.sum += seconds;
    }

    /// The Prometheus text exposition of everything, with `gauges` read at scrape time.
    pub fn render(&self, gauges: &Gauges) -> String {
        let t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::new();
        out.push_str(
            "# HELP csi_agent_rpc_calls_total CSI calls made, by plugin, RPC and final code.\n",
        );
        out.push_str("# TYPE csi_agent_rpc_calls_total counter\n");
        for ((plugin, rpc, code), n) in &t.calls {
            let _ = writeln!(
                out,
                "csi_agent_rpc_calls_total{{plugin=\"{}\",rpc=\"{rpc}\",code=\"{code}\"}} {n}",
                escape(plugin)
            );
        }
        out.push_str("# HELP csi_agent_rpc_duration_seconds CSI call latency including retries.\n");
        out.push_str("# TYPE csi_agent_rpc_duration_seconds histogram\n");
        for ((plugin, rpc), l) in &t.latency {
            let labels = format!("plugin=\"{}\",rpc=\"{rpc}\"", escape(plugin));
            for (i, bound) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "csi_agent_rpc_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {}",
                    l.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "csi_agent_rpc_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                l.count
            );
            let _ = writeln!(
                out,
                "csi_agent_rpc_duration_seconds_sum{{{labels}}} {}",
                l.sum
            );
            let _ = writeln!(
                out,
                "csi_agent_rpc_duration_seconds_count{{{labels}}} {}",
                l.count
            );
        }
        out.push_str("# HELP csi_agent_claims Claims per state.\n");
        out.push_str("# TYPE csi_agent_claims gauge\n");
        for (state, n) in &gauges.claims {
            let _ = writeln!(out, "csi_agent_claims{{state=\"{}\"}} {n}", escape(state));
        }
        out.push_str("# HELP csi_agent_stuck_releases Volumes whose last release step failed.\n");
        out.push_str("# TYPE csi_agent_stuck_releases gauge\n");
        let _ = writeln!(out, "csi_agent_stuck_releases {}", gauges.stuck_releases);
        out.push_str("# HELP csi_agent_plugins Known plugins by health.\n");
        out.push_str("# TYPE csi_agent_plugins gauge\n");
        for (health, n) in &gauges.plugins {
            let _ = writeln!(
                out,
                "csi_agent_plugins{{health=\"{}\"}} {n}",
                escape(health)
            );
        }
        out
    }
}

/// Escapes a label value (backslash, quote, newline).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// csi-client's observer for one plugin's client, feeding [`Metrics`].
#[derive(Debug)]
pub struct PluginObserver {
    plugin: String,
    metrics: Metrics,
}

impl CallObserver for PluginObserver {
    fn on_call(&self, event: &CallEvent) {
        self.metrics.record(&self.plugin, event);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use csi_client::{Outcome, Rpc};

    use super::*;

    #[test]
    fn calls_latency_and_gauges_render() {
        let m = Metrics::new();
        let plugin = PluginId::new("mock").expect("valid id");
        let observer = m.observer(&plugin);
        observer.on_call(&CallEvent {
            rpc: Rpc::Probe,
            attempts: 1,
            duration: Duration::from_millis(3),
            outcome: Outcome::Ok,
        });
        observer.on_call(&CallEvent {
            rpc: Rpc::Probe,
            attempts: 1,
            duration: Duration::from_millis(3),
            outcome: Outcome::Ok,
        });
        let mut g = Gauges::default();
        g.claims.insert("taken".into(), 2);
        g.stuck_releases = 1;
        let text = m.render(&g);
        assert!(
            text.contains("csi_agent_rpc_calls_total{plugin=\"mock\",rpc=\"Probe\",code=\"Ok\"} 2")
        );
        assert!(text.contains(
            "csi_agent_rpc_duration_seconds_bucket{plugin=\"mock\",rpc=\"Probe\",le=\"0.001\"} 0"
        ));
        assert!(text.contains(
            "csi_agent_rpc_duration_seconds_bucket{plugin=\"mock\",rpc=\"Probe\",le=\"0.005\"} 2"
        ));
        assert!(
            text.contains("csi_agent_rpc_duration_seconds_count{plugin=\"mock\",rpc=\"Probe\"} 2")
        );
        assert!(text.contains("csi_agent_claims{state=\"taken\"} 2"));
        assert!(text.contains("csi_agent_stuck_releases 1"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
