//! Prometheus text-format metrics of `csi-agent serve`.
//!
//! - `csi_rpc_duration_seconds{plugin,rpc}` (histogram) and `csi_rpc_total{plugin,rpc,code}`:
//!   every request the agent sent to a plugin, per attempt, as csi-client's
//!   [`MetricsLayer`] measures it on the wire. Each plugin has one [`InMemoryMetrics`],
//!   rendered by [`write_prometheus`] with a `plugin` label; this module only keeps them.
//! - `csi_agent_rpc_unsent_total{plugin,rpc,reason}`: what the layer cannot see because
//!   nothing reached the plugin's channel (see [`Unsent`]).
//! - `csi_agent_claims{state}`: claims per state, and `csi_agent_stuck_releases`: volumes
//!   whose last release step failed. Both are gauges computed at scrape time
//!   ([`Gauges`]), so they cannot drift from the claim store.
//! - `csi_agent_plugins{health}`: known plugins by health.
//! - `csi_agent_store_failing` (0 or 1) and `csi_agent_state_files_failing`: the agent's own
//!   storage failing (the claim store; state files under the data directory). Never counted
//!   against a plugin.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use csi_client::metrics::{InMemoryMetrics, MetricsLayer, write_prometheus};
use csi_client::{AttemptEvent, CallEvent, CallObserver, CsiClientBuilder, Failure, Outcome};
use csi_structs::PluginId;

/// The per-plugin sinks: the wire-level RPC metrics and the unsent-call counter.
#[derive(Debug, Default)]
struct PluginSinks {
    rpc: Arc<InMemoryMetrics>,
    unsent: Arc<Unsent>,
}

/// The agent's call metrics. Cheap to clone; clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Plugin id → its sinks. Kept for the agent's lifetime, so a plugin whose socket is
    /// recreated (a new client) keeps counting into the same, monotonic series.
    plugins: Arc<Mutex<BTreeMap<String, PluginSinks>>>,
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
    /// Whether the claim store fails now.
    pub store_failing: bool,
    /// State files whose last write failed.
    pub failing_files: u64,
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Instruments the client of `plugin` being built: csi-client's [`MetricsLayer`] over
    /// this plugin's [`InMemoryMetrics`], and the [`Unsent`] observer.
    pub fn instrument(&self, plugin: &PluginId, builder: CsiClientBuilder) -> CsiClientBuilder {
        let mut plugins = self.plugins.lock().unwrap_or_else(PoisonError::into_inner);
        let sinks = plugins.entry(plugin.as_str().to_owned()).or_default();
        let rpc = Arc::clone(&sinks.rpc);
        let unsent: Arc<dyn CallObserver> = sinks.unsent.clone();
        drop(plugins);
        builder.layer(MetricsLayer::new(rpc)).observer(unsent)
    }

    /// The Prometheus text exposition of everything, with `gauges` read at scrape time.
    pub fn render(&self, gauges: &Gauges) -> String {
        // Snapshot the handles so no lock is held while rendering.
        let plugins: Vec<(String, Arc<InMemoryMetrics>, Arc<Unsent>)> = self
            .plugins
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(id, s)| (id.clone(), Arc::clone(&s.rpc), Arc::clone(&s.unsent)))
            .collect();
        let labels: Vec<[(&str, &str); 1]> = plugins
            .iter()
            .map(|(id, _, _)| [("plugin", id.as_str())])
            .collect();
        let mut out = String::new();
        // The only extra label is the constant `plugin`, a valid, unreserved name used once
        // per set, so `write_prometheus` has nothing to refuse; an error would mean a bug here.
        if let Err(e) = write_prometheus(
            &mut out,
            labels
                .iter()
                .zip(&plugins)
                .map(|(l, (_, rpc, _))| (&l[..], rpc.as_ref())),
        ) {
            tracing::error!(error = %e, "RPC metrics not rendered");
        }
        out.push_str(
            "# HELP csi_agent_rpc_unsent_total CSI calls or attempts that never reached the plugin, by reason.\n",
        );
        out.push_str("# TYPE csi_agent_rpc_unsent_total counter\n");
        for (plugin, _, unsent) in &plugins {
            for ((rpc, reason), n) in unsent.counts() {
                let _ = writeln!(
                    out,
                    "csi_agent_rpc_unsent_total{{plugin=\"{}\",rpc=\"{rpc}\",reason=\"{reason}\"}} {n}",
                    escape(plugin)
                );
            }
        }
        out.push_str("# HELP csi_agent_claims Claims per state.\n");
        out.push_str("# TYPE csi_agent_claims gauge\n");
        for (state, n) in &gauges.claims {
            let _ = writeln!(out, "csi_agent_claims{{state=\"{}\"}} {n}", escape(state));
        }
        out.push_str("# HELP csi_agent_stuck_releases Volumes whose last release step failed.\n");
        out.push_str("# TYPE csi_agent_stuck_releases gauge\n");
        let _ = writeln!(out, "csi_agent_stuck_releases {}", gauges.stuck_releases);
        out.push_str(
            "# HELP csi_agent_store_failing 1 while the claim store fails (claims and releases fail at once), else 0.\n",
        );
        out.push_str("# TYPE csi_agent_store_failing gauge\n");
        let _ = writeln!(
            out,
            "csi_agent_store_failing {}",
            u8::from(gauges.store_failing)
        );
        out.push_str(
            "# HELP csi_agent_state_files_failing State files under the data directory whose last write failed.\n",
        );
        out.push_str("# TYPE csi_agent_state_files_failing gauge\n");
        let _ = writeln!(
            out,
            "csi_agent_state_files_failing {}",
            gauges.failing_files
        );
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

/// Counts, per RPC and reason, what csi-client's [`MetricsLayer`] never sees because
/// nothing reached the plugin's channel; the layer covers everything that was sent.
///
/// - a call refused before sending (`attempts == 0`, e.g. `invalid_request`): the client
///   stops it before the channel;
/// - an attempt that ended `not_connected` (the plugin could not be dialled yet) or
///   `bad_endpoint` (the endpoint can never be dialled as it is: not a socket, permission
///   denied). Dial failures before the client's first connection never reach the layer; a
///   failed *redial* on an established client also passes through the layer, which counts it
///   as `transport_error`.
///
/// Everything else the old per-call observer counted (codes and latency) comes from the layer.
#[derive(Debug, Default)]
pub struct Unsent {
    /// (rpc, reason) → count.
    counts: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl Unsent {
    fn add(&self, rpc: &'static str, reason: &'static str) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.entry((rpc, reason)).or_default() += 1;
    }

    /// The counts so far, by (RPC name, reason).
    pub fn counts(&self) -> BTreeMap<(&'static str, &'static str), u64> {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl CallObserver for Unsent {
    fn on_attempt(&self, event: &AttemptEvent) {
        if let Outcome::Failed {
            failure: Failure::NotConnected | Failure::BadEndpoint,
            ..
        } = event.outcome
        {
            self.add(event.rpc.name(), event.outcome.label());
        }
    }

    fn on_call(&self, event: &CallEvent) {
        // No attempt was made, so `on_attempt` never ran for this call: no double count.
        if event.attempts == 0 {
            self.add(event.rpc.name(), event.outcome.label());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use csi_client::metrics::{RpcMetrics, RpcOutcome};
    use csi_client::{Code, CsiClient, ErrorClass, Rpc};

    use super::*;

    fn sinks(m: &Metrics, plugin: &str) -> (Arc<InMemoryMetrics>, Arc<Unsent>) {
        let plugins = m.plugins.lock().expect("not poisoned in a test");
        let s = &plugins[plugin];
        (Arc::clone(&s.rpc), Arc::clone(&s.unsent))
    }

    #[test]
    fn rpc_metrics_unsent_calls_and_gauges_render() {
        let m = Metrics::new();
        let plugin = PluginId::new("mock").expect("valid id");
        let endpoint = "unix:///run/none.sock".parse().expect("valid endpoint");
        let _client = m.instrument(&plugin, CsiClient::builder(endpoint)).build();
        let (rpc, unsent) = sinks(&m, "mock");
        rpc.record(
            Rpc::Probe,
            RpcOutcome::Status(Code::Ok),
            Duration::from_millis(3),
        );
        rpc.record(
            Rpc::Probe,
            RpcOutcome::Status(Code::Unavailable),
            Duration::from_millis(3),
        );
        unsent.on_call(&CallEvent {
            rpc: Rpc::NodeStageVolume,
            attempts: 0,
            duration: Duration::ZERO,
            outcome: Outcome::Failed {
                failure: Failure::InvalidRequest,
                class: ErrorClass::Fatal,
            },
        });
        // A call that was sent is the layer's business, not counted again here.
        unsent.on_call(&CallEvent {
            rpc: Rpc::Probe,
            attempts: 1,
            duration: Duration::from_millis(3),
            outcome: Outcome::Ok,
        });
        unsent.on_attempt(&AttemptEvent {
            rpc: Rpc::Probe,
            attempt: 1,
            duration: Duration::from_millis(1),
            outcome: Outcome::Failed {
                failure: Failure::NotConnected,
                class: ErrorClass::RetryElsewhere,
            },
        });
        unsent.on_attempt(&AttemptEvent {
            rpc: Rpc::NodeUnpublishVolume,
            attempt: 1,
            duration: Duration::ZERO,
            outcome: Outcome::Failed {
                failure: Failure::BadEndpoint,
                class: ErrorClass::Fatal,
            },
        });
        let mut g = Gauges::default();
        g.claims.insert("taken".into(), 2);
        g.stuck_releases = 1;
        let text = m.render(&g);
        for want in [
            r#"csi_rpc_total{plugin="mock",rpc="Probe",code="Ok"} 1"#,
            r#"csi_rpc_total{plugin="mock",rpc="Probe",code="Unavailable"} 1"#,
            r#"csi_rpc_duration_seconds_bucket{plugin="mock",rpc="Probe",le="0.0025"} 0"#,
            r#"csi_rpc_duration_seconds_bucket{plugin="mock",rpc="Probe",le="0.005"} 2"#,
            r#"csi_rpc_duration_seconds_count{plugin="mock",rpc="Probe"} 2"#,
            r#"csi_agent_rpc_unsent_total{plugin="mock",rpc="NodeStageVolume",reason="invalid_request"} 1"#,
            r#"csi_agent_rpc_unsent_total{plugin="mock",rpc="Probe",reason="not_connected"} 1"#,
            r#"csi_agent_rpc_unsent_total{plugin="mock",rpc="NodeUnpublishVolume",reason="bad_endpoint"} 1"#,
            r#"csi_agent_claims{state="taken"} 2"#,
            "csi_agent_stuck_releases 1",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
        assert_eq!(
            text.matches("csi_agent_rpc_unsent_total{").count(),
            3,
            "{text}"
        );
        // One header pair per family, even with several plugins.
        let _other = m
            .instrument(
                &PluginId::new("other").expect("valid id"),
                CsiClient::builder("unix:///run/other.sock".parse().expect("valid endpoint")),
            )
            .build();
        let (other, _) = sinks(&m, "other");
        other.record(Rpc::Probe, RpcOutcome::Transport, Duration::ZERO);
        let text = m.render(&g);
        assert_eq!(text.matches("# TYPE csi_rpc_total").count(), 1, "{text}");
        assert!(
            text.contains(r#"csi_rpc_total{plugin="other",rpc="Probe",code="transport_error"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn a_new_client_for_the_same_plugin_keeps_its_counters() {
        let m = Metrics::new();
        let plugin = PluginId::new("mock").expect("valid id");
        let endpoint: csi_client::Endpoint = "unix:///run/none.sock".parse().expect("valid");
        let _first = m
            .instrument(&plugin, CsiClient::builder(endpoint.clone()))
            .build();
        let (before, _) = sinks(&m, "mock");
        before.record(Rpc::Probe, RpcOutcome::Status(Code::Ok), Duration::ZERO);
        let _second = m.instrument(&plugin, CsiClient::builder(endpoint)).build();
        let (after, _) = sinks(&m, "mock");
        assert!(Arc::ptr_eq(&before, &after));
        assert!(
            m.render(&Gauges::default())
                .contains(r#"csi_rpc_total{plugin="mock",rpc="Probe",code="Ok"} 1"#)
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
