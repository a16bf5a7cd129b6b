//! Prometheus text-format metrics of `csi-agent serve`.
//!
//! - `csi_rpc_duration_seconds{plugin,rpc}` (histogram) and `csi_rpc_total{plugin,rpc,code}`:
//!   every request the agent sent to a plugin, per attempt, as csi-client's `MetricsLayer`
//!   measures it on the wire, kept per plugin by csi-client's [`PluginMetrics`].
//! - `csi_agent_rpc_unsent_total{plugin,rpc,reason}`: what the layer cannot see because
//!   nothing reached the plugin's channel (csi-client's `Unsent`).
//! - `csi_agent_waiting_releases`: claims whose release waits for a node that is not there;
//! - `csi_agent_claims{state}`: claims per state, and `csi_agent_stuck_releases`: volumes
//!   whose last release step failed. Both are gauges computed at scrape time
//!   ([`Gauges`]), so they cannot drift from the claim store.
//! - Cluster mode: `csi_agent_cluster_members`, `csi_agent_controller_duty_holder{node}`,
//!   `csi_agent_controller_duty_held` (0 or 1), `csi_agent_controller_duty_confirmed_seconds`
//!   and `csi_agent_cluster_outage` (0 or 1).
//! - `csi_agent_plugins{health}`: known plugins by health, every health kept (at 0 when none).
//! - `csi_agent_volume_abnormal{volume,source}` (0 or 1), `csi_agent_volume_bytes{volume,kind}`
//!   and `csi_agent_volume_inodes{volume,kind}`: the health of the volumes published here, as
//!   csi-node's `HealthMonitor` last polled it (where the plugin reports conditions or usage).
//! - `csi_agent_store_failing` (0 or 1) and `csi_agent_state_files_failing`: the agent's own
//!   storage failing (the claim store; state files under the data directory). Never counted
//!   against a plugin.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use csi_client::CsiClientBuilder;
use csi_client::metrics::PluginMetrics;
use csi_node::health::VolumeHealth;
use csi_structs::PluginId;

/// The agent's call metrics. Cheap to clone; clones share the counters.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Every plugin's, kept for the agent's lifetime, so a plugin whose socket is recreated
    /// (a new client) keeps counting into the same, monotonic series.
    plugins: PluginMetrics,
}

/// Values read from the rest of the agent when `/metrics` is scraped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Claims per state name (`taken`, `releasing`, …).
    pub claims: BTreeMap<String, u64>,
    /// Volumes whose release is stuck (last step or write failed).
    pub stuck_releases: u64,
    /// Claims whose release waits for something that is not there, past the threshold.
    pub waiting_releases: u64,
    /// Plugins per health (`healthy`, `unhealthy`, `not_ready`, `unknown`).
    pub plugins: BTreeMap<String, u64>,
    /// Whether the claim store fails now.
    pub store_failing: bool,
    /// State files whose last write failed.
    pub failing_files: u64,
    /// Cluster mode: the members and the controller duty, as `status` shows them.
    pub cluster: Option<crate::ops::api::ClusterView>,
    /// The health of the volumes published here, by volume.
    pub volumes: BTreeMap<csi_structs::VolumeId, VolumeHealth>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self {
            plugins: PluginMetrics::new().unsent_name("csi_agent_rpc_unsent_total"),
        }
    }

    /// Instruments the client of `plugin` being built ([`PluginMetrics::instrument`]).
    pub fn instrument(&self, plugin: &PluginId, builder: CsiClientBuilder) -> CsiClientBuilder {
        self.plugins.instrument(plugin.as_str(), builder)
    }

    /// The Prometheus text exposition of everything, with `gauges` read at scrape time.
    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = self.plugins.render();
        family(&mut out, "csi_agent_claims", "Claims per state.");
        for (state, n) in &gauges.claims {
            let _ = writeln!(out, "csi_agent_claims{{state=\"{}\"}} {n}", escape(state));
        }
        for (name, help, value) in [
            (
                "csi_agent_stuck_releases",
                "Volumes whose last release step failed.",
                gauges.stuck_releases,
            ),
            (
                "csi_agent_waiting_releases",
                "Claims whose release waits for something that is not there (a node that is down).",
                gauges.waiting_releases,
            ),
            (
                "csi_agent_store_failing",
                "1 while the claim store fails (claims and releases fail at once), else 0.",
                u64::from(gauges.store_failing),
            ),
            (
                "csi_agent_state_files_failing",
                "State files under the data directory whose last write failed.",
                gauges.failing_files,
            ),
        ] {
            family(&mut out, name, help);
            let _ = writeln!(out, "{name} {value}");
        }
        family(
            &mut out,
            "csi_agent_volume_abnormal",
            "1 while the plugin reports the volume abnormal (by who reports it), else 0.",
        );
        for (volume, h) in &gauges.volumes {
            for (source, c) in [("controller", &h.controller), ("node", &h.node)] {
                if let Some(c) = c {
                    let _ = writeln!(
                        out,
                        "csi_agent_volume_abnormal{{volume=\"{}\",source=\"{source}\"}} {}",
                        escape(volume.as_str()),
                        u8::from(c.abnormal)
                    );
                }
            }
        }
        for (name, what, pick) in [
            (
                "csi_agent_volume_bytes",
                "Bytes of a volume published here, by kind (used, available, total).",
                (|h: &VolumeHealth| h.bytes) as fn(&VolumeHealth) -> Option<csi_structs::Usage>,
            ),
            (
                "csi_agent_volume_inodes",
                "Inodes of a volume published here, by kind (used, available, total).",
                |h| h.inodes,
            ),
        ] {
            family(&mut out, name, what);
            for (volume, u) in gauges
                .volumes
                .iter()
                .filter_map(|(v, h)| Some((v, pick(h)?)))
            {
                let volume = escape(volume.as_str());
                for (kind, n) in [
                    ("used", u.used),
                    ("available", u.available),
                    ("total", u.total),
                ] {
                    let _ = writeln!(out, "{name}{{volume=\"{volume}\",kind=\"{kind}\"}} {n}");
                }
            }
        }
        if let Some(c) = &gauges.cluster {
            cluster(&mut out, c);
        }
        family(&mut out, "csi_agent_plugins", "Known plugins by health.");
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

/// The cluster gauges: members, who holds the controller duty, this agent's hold on it and
/// whether etcd is unreachable.
fn cluster(out: &mut String, c: &crate::ops::api::ClusterView) {
    let held = c.held_duty.as_ref();
    for (name, help, value) in [
        (
            "csi_agent_cluster_members",
            "Live members of the cluster, this agent among them.",
            c.members.len() as f64,
        ),
        (
            "csi_agent_controller_duty_held",
            "1 while this agent holds the controller duty and its hold is confirmed, else 0.",
            f64::from(u8::from(held.is_some_and(|d| d.holds))),
        ),
        (
            "csi_agent_controller_duty_confirmed_seconds",
            "How long this agent's confirmed hold on the controller duty lasts without another keep-alive (0: none).",
            held.map_or(0.0, |d| d.confirmed_for_ms as f64 / 1000.0),
        ),
        (
            "csi_agent_cluster_outage",
            "1 while etcd is unreachable (this agent's view of the cluster may be behind), else 0.",
            f64::from(u8::from(c.outage.is_some())),
        ),
    ] {
        family(out, name, help);
        let _ = writeln!(out, "{name} {value}");
    }
    let name = "csi_agent_controller_duty_holder";
    family(
        out,
        name,
        "1 for the member that holds the controller duty (none while nobody holds it or it is not known).",
    );
    if let Some(holder) = &c.controller_duty {
        let _ = writeln!(out, "{name}{{node=\"{}\"}} 1", escape(holder));
    }
}

/// Writes the `# HELP` and `# TYPE` lines of a gauge family.
fn family(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
}

/// Escapes a label value (backslash, quote, newline).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
