//! [`PluginMetrics`]: the metrics of every plugin's client, kept per plugin for a node's
//! lifetime and rendered as one exposition.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use super::prometheus::push_label_value;
use super::{InMemoryMetrics, MetricsLayer, write_prometheus};
use crate::{AttemptEvent, CallEvent, CallObserver, CallOutcome, CsiClientBuilder, Failure};

/// The default name of the counter of calls that never reached a plugin ([`Unsent`]).
pub const UNSENT_TOTAL: &str = "csi_rpc_unsent_total";

/// The metrics of many plugins' clients, labelled `plugin`: [`instrument`](Self::instrument)
/// each client as it is built, [`render`](Self::render) them all at scrape time.
///
/// - `csi_rpc_duration_seconds{plugin,rpc}` and `csi_rpc_total{plugin,rpc,code}`: every
///   request sent, per attempt, as [`MetricsLayer`] measures it on the wire;
/// - `csi_rpc_unsent_total{plugin,rpc,reason}` (the name is settable): what the layer cannot
///   see because nothing reached the plugin's channel ([`Unsent`]).
///
/// A plugin's sinks live as long as this value, so a plugin whose client is built again (its
/// socket recreated) keeps counting into the same monotonic series. Cheap to clone; clones
/// share the counters.
///
/// ```
/// use csi_client::CsiClient;
/// use csi_client::metrics::PluginMetrics;
///
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let metrics = PluginMetrics::new();
/// let client = metrics
///     .instrument("ebs", CsiClient::builder("unix:///run/csi/ebs.sock".parse()?))
///     .build();
/// # drop(client);
/// let page = metrics.render();
/// assert!(page.contains("# TYPE csi_rpc_unsent_total counter"));
/// # Ok(()) }
/// # run().unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct PluginMetrics {
    /// Plugin → its sinks.
    plugins: Arc<Mutex<BTreeMap<String, Sinks>>>,
    unsent_name: &'static str,
}

/// One plugin's sinks.
#[derive(Debug, Default)]
struct Sinks {
    rpc: Arc<InMemoryMetrics>,
    unsent: Arc<Unsent>,
}

impl Default for PluginMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl PluginMetrics {
    /// No plugin yet.
    pub fn new() -> Self {
        Self {
            plugins: Arc::default(),
            unsent_name: UNSENT_TOTAL,
        }
    }

    /// Names the unsent-calls counter `name` instead of [`UNSENT_TOTAL`] (an orchestrator
    /// keeping the name its dashboards know).
    pub fn unsent_name(mut self, name: &'static str) -> Self {
        self.unsent_name = name;
        self
    }

    /// Instruments the client of `plugin` being built: [`MetricsLayer`] over the plugin's
    /// [`InMemoryMetrics`], and its [`Unsent`] observer.
    pub fn instrument(&self, plugin: &str, builder: CsiClientBuilder) -> CsiClientBuilder {
        let (rpc, unsent) = self.sinks(plugin);
        builder
            .layer(MetricsLayer::new(rpc))
            .observer(unsent as Arc<dyn CallObserver>)
    }

    /// `plugin`'s sinks, made on first use.
    pub fn sinks(&self, plugin: &str) -> (Arc<InMemoryMetrics>, Arc<Unsent>) {
        let mut plugins = self.plugins.lock().unwrap_or_else(PoisonError::into_inner);
        let sinks = plugins.entry(plugin.to_owned()).or_default();
        (Arc::clone(&sinks.rpc), Arc::clone(&sinks.unsent))
    }

    /// The Prometheus text exposition of every plugin's metrics, one header pair per family.
    pub fn render(&self) -> String {
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
        // `plugin` is a valid, unreserved label name used once per source, so there is
        // nothing to refuse.
        let rendered = write_prometheus(
            &mut out,
            labels
                .iter()
                .zip(&plugins)
                .map(|(l, (_, rpc, _))| (&l[..], rpc.as_ref())),
        );
        debug_assert!(rendered.is_ok(), "{rendered:?}");
        let name = self.unsent_name;
        let _ = writeln!(
            out,
            "# HELP {name} CSI calls or attempts that never reached the plugin, by reason."
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for (plugin, _, unsent) in &plugins {
            for ((rpc, reason), n) in unsent.counts() {
                let _ = write!(out, "{name}{{plugin=\"");
                push_label_value(&mut out, plugin);
                let _ = writeln!(out, "\",rpc=\"{rpc}\",reason=\"{reason}\"}} {n}");
            }
        }
        out
    }
}

/// Counts, per RPC and reason, what [`MetricsLayer`] never sees because nothing reached the
/// plugin's channel; the layer covers everything that was sent.
///
/// - a call refused before sending (`attempts == 0`, e.g. `invalid_request`): the client
///   stops it before the channel;
/// - an attempt that ended `not_connected` (the plugin could not be dialled yet) or
///   `bad_endpoint` (the endpoint can never be dialled as it is: not a socket, permission
///   denied). Dial failures before the client's first connection never reach the layer; a
///   failed redial on an established client passes through the layer, which counts it as
///   `transport_error`.
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
        if let CallOutcome::Failed {
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

    use super::*;
    use crate::metrics::{RpcMetrics, RpcOutcome};
    use crate::{CsiClient, ErrorClass};
    use csi_proto::Rpc;
    use tonic::Code;

    #[test]
    fn every_plugin_s_calls_and_unsent_calls_render_under_one_header_per_family() {
        let m = PluginMetrics::new().unsent_name("csi_agent_rpc_unsent_total");
        let endpoint = "unix:///run/none.sock".parse().expect("valid endpoint");
        let _client = m.instrument("mock", CsiClient::builder(endpoint)).build();
        let (rpc, unsent) = m.sinks("mock");
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
            volume: None,
            attempts: 0,
            duration: Duration::ZERO,
            outcome: CallOutcome::Failed {
                failure: Failure::InvalidRequest,
                class: ErrorClass::Fatal,
            },
        });
        // A call that was sent is the layer's business, not counted again here.
        unsent.on_call(&CallEvent {
            rpc: Rpc::Probe,
            volume: None,
            attempts: 1,
            duration: Duration::from_millis(3),
            outcome: CallOutcome::Ok,
        });
        unsent.on_attempt(&AttemptEvent {
            rpc: Rpc::Probe,
            attempt: 1,
            duration: Duration::from_millis(1),
            outcome: CallOutcome::Failed {
                failure: Failure::NotConnected,
                class: ErrorClass::RetryElsewhere,
            },
        });
        unsent.on_attempt(&AttemptEvent {
            rpc: Rpc::NodeUnpublishVolume,
            attempt: 1,
            duration: Duration::ZERO,
            outcome: CallOutcome::Failed {
                failure: Failure::BadEndpoint,
                class: ErrorClass::Fatal,
            },
        });
        let text = m.render();
        for want in [
            r#"csi_rpc_total{plugin="mock",rpc="Probe",code="Ok"} 1"#,
            r#"csi_rpc_total{plugin="mock",rpc="Probe",code="Unavailable"} 1"#,
            r#"csi_rpc_duration_seconds_bucket{plugin="mock",rpc="Probe",le="0.0025"} 0"#,
            r#"csi_rpc_duration_seconds_bucket{plugin="mock",rpc="Probe",le="0.005"} 2"#,
            r#"csi_rpc_duration_seconds_count{plugin="mock",rpc="Probe"} 2"#,
            r#"csi_agent_rpc_unsent_total{plugin="mock",rpc="NodeStageVolume",reason="invalid_request"} 1"#,
            r#"csi_agent_rpc_unsent_total{plugin="mock",rpc="Probe",reason="not_connected"} 1"#,
            r#"csi_agent_rpc_unsent_total{plugin="mock",rpc="NodeUnpublishVolume",reason="bad_endpoint"} 1"#,
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
        assert_eq!(
            text.matches("csi_agent_rpc_unsent_total{").count(),
            3,
            "{text}"
        );
        let _other = m
            .instrument(
                "ot\"her",
                CsiClient::builder("unix:///run/other.sock".parse().expect("valid endpoint")),
            )
            .build();
        let (other, other_unsent) = m.sinks("ot\"her");
        other.record(Rpc::Probe, RpcOutcome::Transport, Duration::ZERO);
        other_unsent.on_call(&CallEvent {
            rpc: Rpc::Probe,
            volume: None,
            attempts: 0,
            duration: Duration::ZERO,
            outcome: CallOutcome::Failed {
                failure: Failure::InvalidRequest,
                class: ErrorClass::Fatal,
            },
        });
        let text = m.render();
        assert_eq!(text.matches("# TYPE csi_rpc_total").count(), 1, "{text}");
        assert!(
            text.contains(
                r#"csi_rpc_total{plugin="ot\"her",rpc="Probe",code="transport_error"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"csi_agent_rpc_unsent_total{plugin="ot\"her",rpc="Probe",reason="invalid_request"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn a_new_client_for_the_same_plugin_keeps_its_counters() {
        let m = PluginMetrics::new();
        let endpoint: crate::Endpoint = "unix:///run/none.sock".parse().expect("valid");
        let _first = m
            .instrument("mock", CsiClient::builder(endpoint.clone()))
            .build();
        let (before, _) = m.sinks("mock");
        before.record(Rpc::Probe, RpcOutcome::Status(Code::Ok), Duration::ZERO);
        let _second = m.instrument("mock", CsiClient::builder(endpoint)).build();
        let (after, _) = m.sinks("mock");
        assert!(Arc::ptr_eq(&before, &after));
        assert!(
            m.render()
                .contains(r#"csi_rpc_total{plugin="mock",rpc="Probe",code="Ok"} 1"#)
        );
    }
}
