//! Human-readable tables for the operator commands.
//!
//! Most of what they show came from a plugin or a peer (ids, versions, error texts), so every
//! cell and every value in a text line is [escaped](csi_structs::untrusted): a newline or an
//! escape sequence cannot forge a row or drive the terminal. `--json` prints values exactly.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use csi_structs::untrusted::{escape, escaped};

use super::api::{
    ClaimView, DeregisterView, DetachView, DutyView, ExpandView, ExternalVolumeView, PluginView,
    ReleaseView, SnapshotView, StatusView, VolumeHealthView, VolumeView,
};

/// A left-aligned text table.
#[derive(Debug)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; each cell is escaped.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows
            .push(cells.iter().map(|c| escape(c).into_owned()).collect());
    }

    /// The table as text: the header line, then a line per row, columns two spaces apart.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(c.chars().count());
                }
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            let mut text = String::new();
            for (i, c) in line.iter().enumerate() {
                if i + 1 == line.len() {
                    text.push_str(c);
                } else {
                    let w = widths.get(i).copied().unwrap_or(0);
                    let _ = write!(text, "{c:<w$}  ");
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

fn opt(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "-".into())
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

/// `plugin list`: a row per plugin.
pub fn plugins(list: &[PluginView]) -> String {
    if list.is_empty() {
        return "no plugins\n".into();
    }
    let mut t = Table::new(&[
        "PLUGIN",
        "NODE",
        "HEALTH",
        "CONTROLLER",
        "NODE-SERVICE",
        "PLUGIN-NODE",
        "FINGERPRINTS",
        "IN-USE",
        "VERSION",
    ]);
    for p in list {
        t.row(vec![
            p.id.clone(),
            p.node.clone(),
            p.health.clone(),
            yes(p.controller),
            yes(p.node_service),
            opt(&p.plugin_node),
            p.fingerprints.to_string(),
            p.in_use.to_string(),
            opt(&p.version),
        ]);
    }
    t.render()
}

/// `plugin info`: one plugin, a row per field.
pub fn plugin_detail(p: &PluginView) -> String {
    let mut t = Table::new(&["FIELD", "VALUE"]);
    for (k, v) in [
        ("id", p.id.clone()),
        ("node", p.node.clone()),
        ("socket", opt(&p.socket)),
        ("name", opt(&p.name)),
        ("version", opt(&p.version)),
        ("health", p.health.clone()),
        ("health reason", opt(&p.health_reason)),
        ("controller", yes(p.controller)),
        ("controller publish", yes(p.controller_publish)),
        ("node service", yes(p.node_service)),
        ("staging", yes(p.staging)),
        ("plugin node id", opt(&p.plugin_node)),
        ("fingerprints", p.fingerprints.to_string()),
        ("publications in use here", p.in_use.to_string()),
        ("last error", opt(&p.last_error)),
        ("advertises", p.capabilities.join(" ")),
        (
            "attach limit",
            p.max_volumes.map_or("-".into(), |n| n.to_string()),
        ),
        (
            "node topology",
            p.topology.as_ref().map_or("-".into(), topology),
        ),
    ] {
        t.row(vec![k.into(), v]);
    }
    t.render()
}

/// A row per claim.
pub fn claims(list: &[ClaimView]) -> String {
    if list.is_empty() {
        return "no claims\n".into();
    }
    let mut t = Table::new(&["VOLUME", "WORKLOAD", "NODE", "MODE", "STATE", "TARGET"]);
    for c in list {
        t.row(vec![
            c.volume.clone(),
            c.workload.clone(),
            c.node.clone(),
            c.mode.clone(),
            c.state.clone(),
            opt(&c.target_path),
        ]);
    }
    t.render()
}

fn retry_in(ms: Option<u64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 1000 => format!("{ms}ms"),
        Some(ms) => format!("{}s", ms / 1000),
    }
}

/// `node_detach (w1)`; a backoff names its step: `backoff: node_detach (w1)`.
fn pending(r: &ReleaseView) -> String {
    let what = match &r.backoff_step {
        Some(step) => format!("{}: {step}", r.pending),
        None => r.pending.clone(),
    };
    match &r.pending_workload {
        Some(w) => format!("{what} ({w})"),
        None => what,
    }
}

/// A row per release in progress, with its pending step, attempts and last error.
pub fn releases(list: &[ReleaseView]) -> String {
    let mut t = Table::new(&[
        "VOLUME",
        "STATES",
        "PENDING",
        "ATTEMPTS",
        "CLASS",
        "NEXT-RETRY",
        "LAST-ERROR",
    ]);
    for r in list {
        let states: Vec<String> = r
            .claims
            .iter()
            .map(|c| format!("{}:{}", c.workload, c.state))
            .collect();
        t.row(vec![
            r.volume.clone(),
            states.join(","),
            pending(r),
            r.attempts.to_string(),
            opt(&r.last_error_class),
            retry_in(r.next_retry_ms),
            opt(&r.last_error),
        ]);
    }
    t.render()
}

/// The plugin's id of a volume; `-` for one that only may exist (the agent cannot know it).
fn external_id(v: &VolumeView) -> &str {
    if v.may_exist.is_some() {
        "-"
    } else {
        &v.external_id
    }
}

/// Releases that wait for something that is not there: one row each, what it waits for
/// under it.
fn waiting(list: &[crate::ops::api::WaitingView]) -> String {
    let mut t = Table::new(&["VOLUME", "WORKLOAD", "NODE", "WAITED"]);
    for w in list {
        t.row(vec![
            w.volume.clone(),
            w.workload.clone(),
            w.node.clone().unwrap_or_else(|| "-".into()),
            format!("{}s", w.waited_s),
        ]);
    }
    let mut out = t.render();
    for w in list {
        out.push_str(&format!(
            "{} of {}: {}\n",
            escaped(&w.workload),
            escaped(&w.volume),
            escaped(&w.waiting_for)
        ));
    }
    out
}

/// `volume list`: a row per volume.
pub fn volumes(list: &[VolumeView]) -> String {
    if list.is_empty() {
        return "no volumes\n".into();
    }
    let mut t = Table::new(&[
        "VOLUME",
        "PLUGIN",
        "EXTERNAL-ID",
        "ACCESS-MODE",
        "CLAIMS",
        "RELEASE",
    ]);
    for v in list {
        t.row(vec![
            v.id.clone(),
            v.plugin.clone(),
            external_id(v).to_owned(),
            v.access_mode.clone(),
            v.claims.len().to_string(),
            v.release
                .as_ref()
                .map(|r| match &r.last_error_class {
                    Some(c) => format!("stuck ({c})"),
                    None => "in progress".into(),
                })
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    let mut out = t.render();
    for v in list {
        if let Some(may) = &v.may_exist {
            out.push_str(&format!(
                "volume {} is not created: {}\n",
                escaped(&v.id),
                escaped(&may.line())
            ));
        }
    }
    out
}

/// `volume status`: one volume with its claims, release, calls in flight and health.
pub fn volume_detail(v: &VolumeView) -> String {
    let mut out = format!(
        "volume {}  plugin {}  external id {}  {} {}  controller publish {}\n",
        escaped(&v.id),
        escaped(&v.plugin),
        escaped(external_id(v)),
        escaped(&v.access_mode),
        escaped(&v.attachment),
        yes(v.controller_publish)
    );
    if let Some(may) = &v.may_exist {
        out.push_str(&format!(
            "not created: {}; `volume create` of the id again resolves it (deleting what it \
             finds), `volume deregister` clears it\nthe failure: {}\n",
            escaped(&may.line()),
            escaped(&may.error)
        ));
    }
    if let Some(bytes) = v.capacity_bytes {
        out.push_str(&format!(
            "capacity: {bytes} bytes{}\n",
            if v.node_expansion_pending {
                " (NodeExpandVolume pending: at the next claim)"
            } else {
                ""
            }
        ));
    }
    if !v.accessible_topology.is_empty() {
        let list: Vec<String> = v.accessible_topology.iter().map(topology).collect();
        out.push_str(&format!(
            "reachable from: {}\n",
            escaped(&list.join(" or "))
        ));
    }
    if !v.secret_names.is_empty() {
        out.push_str(&format!(
            "secrets (names only): {}\n",
            escaped(&v.secret_names.join(", "))
        ));
    }
    if let Some(h) = &v.health {
        out.push_str(&health(h));
    }
    for call in &v.calls_in_flight {
        out.push_str(&format!("in flight: {}\n", escaped(&call.summary)));
    }
    out.push_str(&claims(&v.claims));
    if let Some(r) = &v.release {
        out.push_str("release:\n");
        out.push_str(&releases(std::slice::from_ref(r)));
    }
    for w in &v.waiting {
        out.push_str(&format!(
            "release of {} waits ({}s): {}\n",
            escaped(&w.workload),
            w.waited_s,
            escaped(&w.waiting_for)
        ));
    }
    out
}

/// What `volume expand` did.
pub fn expanded(e: &ExpandView) -> String {
    let mut out = volume_detail(&e.volume);
    out.push_str(&format!(
        "ControllerExpandVolume: {}\nNodeExpandVolume: {}\n",
        if e.controller_expanded {
            "done"
        } else {
            "not offered by the plugin"
        },
        match (e.nodes_expanded.is_empty(), e.node_expansion_pending) {
            (false, _) => format!("done on {}", escaped(&e.nodes_expanded.join(", "))),
            (true, true) => "at the next claim (published nowhere now)".to_owned(),
            (true, false) => "not needed".to_owned(),
        }
    ));
    out
}

/// A plugin's own list of volumes.
pub fn external_volumes(list: &[ExternalVolumeView]) -> String {
    if list.is_empty() {
        return "no volumes in the plugin\n".into();
    }
    let mut t = Table::new(&["EXTERNAL-ID", "CAPACITY", "PUBLISHED-TO", "AGENT-VOLUME"]);
    for v in list {
        t.row(vec![
            v.external_id.clone(),
            v.capacity_bytes.to_string(),
            if v.published_nodes.is_empty() {
                "-".into()
            } else {
                v.published_nodes.join(",")
            },
            opt(&v.known_as),
        ]);
    }
    t.render()
}

/// A row per snapshot.
pub fn snapshots(list: &[SnapshotView]) -> String {
    if list.is_empty() {
        return "no snapshots\n".into();
    }
    let mut t = Table::new(&["SNAPSHOT", "PLUGIN", "SOURCE", "VOLUME", "SIZE", "READY"]);
    for s in list {
        t.row(vec![
            s.snapshot_id.clone(),
            s.plugin.clone(),
            s.source_external_id.clone(),
            opt(&s.source_volume),
            s.size_bytes.to_string(),
            yes(s.ready_to_use),
        ]);
    }
    t.render()
}

/// What `volume detach` did.
pub fn detached(d: &DetachView) -> String {
    let mut out = volume_detail(&d.volume);
    out.push_str(&format!(
        "releasing: {}{}\n",
        escaped(&d.releasing.join(", ")),
        if d.node_gone {
            " (node reported gone for good: node steps skipped)"
        } else {
            ""
        }
    ));
    if let Some(note) = &d.note {
        out.push_str(&format!("note: {}\n", escaped(note)));
    }
    out
}

/// What `volume deregister` did, and what it left behind.
pub fn deregistered(d: &DeregisterView) -> String {
    let mut out = format!(
        "deregistered volume {} ({} claim(s) forgotten); left behind:\n",
        escaped(&d.volume.id),
        d.dropped_claims
    );
    for item in &d.left_in_plugin {
        out.push_str(&format!("  - {}\n", escaped(item)));
    }
    out
}

/// Topology segments as `{zone=a, region=r}`.
fn topology(segments: &BTreeMap<String, String>) -> String {
    let segments: Vec<String> = segments.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", segments.join(", "))
}

/// This agent's hold on the controller duty, after its holder's name.
pub fn held_duty(d: &DutyView) -> String {
    if d.holds {
        format!(
            " (held here, revision {}: confirmed for {:.1}s)",
            d.revision,
            Duration::from_millis(d.confirmed_for_ms).as_secs_f64()
        )
    } else {
        format!(
            " (held here, revision {}: NOT confirmed, its deadline passed; no controller step \
             starts until a keep-alive is confirmed)",
            d.revision
        )
    }
}

/// A volume's health lines: each condition reported, and the usage.
fn health(h: &VolumeHealthView) -> String {
    let mut out = String::new();
    for (source, c) in [("controller", &h.controller), ("node", &h.node)] {
        if let Some(c) = c {
            out.push_str(&format!(
                "health ({source}): {}{}\n",
                if c.abnormal { "ABNORMAL" } else { "normal" },
                if c.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", escaped(&c.message))
                }
            ));
        }
    }
    for (kind, u) in [("bytes", &h.bytes), ("inodes", &h.inodes)] {
        if let Some(u) = u {
            out.push_str(&format!(
                "usage ({kind}): {} used, {} available, {} in all\n",
                u.used, u.available, u.total
            ));
        }
    }
    out
}

/// `status`: the node, its plugins and peers, and every release that is stuck or waiting.
pub fn status(s: &StatusView) -> String {
    let counts: Vec<String> = s.claims.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut out = format!(
        "node {}  volumes {}  claims {}\n\nPLUGINS\n",
        escaped(&s.node),
        s.volumes,
        if counts.is_empty() {
            "none".into()
        } else {
            escape(&counts.join(" ")).into_owned()
        }
    );
    out.push_str(&plugins(&s.plugins));
    if let Some(c) = &s.cluster {
        out.push_str(&format!(
            "\nCLUSTER  store {} prefix {}  controller duty: {}{}\n",
            escaped(&c.store),
            escaped(&c.prefix),
            escaped(c.controller_duty.as_deref().unwrap_or("nobody now")),
            c.held_duty.as_ref().map(held_duty).unwrap_or_default()
        ));
        if let Some(outage) = &c.outage {
            out.push_str(&format!(
                "etcd unreachable, the view may be behind: {}\n",
                escaped(outage)
            ));
        }
        let mut t = Table::new(&["MEMBER", "SHIM", "HTTP", "PLUGINS"]);
        for m in &c.members {
            let node = if m.me {
                format!("{} (this agent)", m.node)
            } else {
                m.node.clone()
            };
            t.row(vec![
                node,
                m.shim.clone(),
                m.http.clone(),
                m.plugins.join(","),
            ]);
        }
        out.push_str(&t.render());
    }
    if !s.peers.is_empty() {
        out.push_str("\nPEERS\n");
        let mut t = Table::new(&["NODE", "REACHABLE", "PLUGINS", "LAST-ERROR"]);
        for p in &s.peers {
            t.row(vec![
                p.node.clone(),
                yes(p.reachable),
                p.plugins.to_string(),
                opt(&p.last_error),
            ]);
        }
        out.push_str(&t.render());
    }
    if !s.abnormal.is_empty() {
        out.push_str("\nABNORMAL VOLUMES\n");
        let mut t = Table::new(&["VOLUME", "SOURCE", "MESSAGE"]);
        for a in &s.abnormal {
            t.row(vec![a.volume.clone(), a.source.clone(), a.message.clone()]);
        }
        out.push_str(&t.render());
    }
    if let Some(failure) = &s.store_failure {
        out.push_str(&format!(
            "\nCLAIM STORE FAILING (claims and releases fail at once): {failure}\n"
        ));
    }
    if !s.ignored_plugin_files.is_empty() {
        out.push_str("\nIGNORED IN THE PLUGIN DIRECTORY\n");
        for line in &s.ignored_plugin_files {
            let _ = writeln!(out, "{}", escaped(line));
        }
    }
    if !s.failing_files.is_empty() {
        out.push_str("\nSTATE FILES FAILING\n");
        for failure in &s.failing_files {
            out.push_str(failure);
            out.push('\n');
        }
    }
    out.push_str("\nSTUCK RELEASES\n");
    if s.stuck.is_empty() {
        out.push_str("none\n");
    } else {
        out.push_str(&releases(&s.stuck));
    }
    if !s.waiting.is_empty() {
        out.push_str("\nWAITING RELEASES (what they wait for is not there)\n");
        out.push_str(&waiting(&s.waiting));
    }
    if !s.uncertain.is_empty() {
        out.push_str("\nUNCERTAIN NODE OPERATIONS (cleaned up by their release)\n");
        let mut t = Table::new(&["VOLUME", "WORKLOAD", "STEP", "PATH"]);
        for u in &s.uncertain {
            t.row(vec![
                u.volume.clone(),
                u.workload.clone(),
                u.step.clone(),
                u.path.clone(),
            ]);
        }
        out.push_str(&t.render());
    }
    match &s.reconcile {
        None => out.push_str(
            "\nRESTORED NODE RECORDS\nbeing confirmed with their plugins (restaged and republished)\n",
        ),
        Some(r) if r.records.is_empty() && r.plugins_not_ready.is_empty() => {}
        Some(r) => {
            out.push_str("\nRESTORED NODE RECORDS (confirmed with their plugins at start)\n");
            if !r.plugins_not_ready.is_empty() {
                out.push_str(&format!(
                    "plugins not ready when the wait ended: {}\n",
                    escape(&r.plugins_not_ready.join(", "))
                ));
            }
            let mut t = Table::new(&["VOLUME", "WORKLOAD", "PLUGIN", "FOUND", "DONE", "ERROR"]);
            for v in &r.records {
                t.row(vec![
                    v.volume.clone(),
                    v.workload.clone(),
                    v.plugin.clone(),
                    v.found.clone(),
                    v.action.clone(),
                    match (&v.error, &v.class) {
                        (Some(e), Some(c)) => format!("{e} (class {c})"),
                        (Some(e), None) => e.clone(),
                        _ => "-".into(),
                    },
                ]);
            }
            out.push_str(&t.render());
            if !r.released_while_gone.is_empty() {
                out.push_str(
                    "\nRELEASED WHILE THIS NODE WAS REPORTED GONE (claims let go meanwhile: \
                     their mounts here were removed at start)\n",
                );
                let mut t = Table::new(&["VOLUME", "WORKLOAD", "PLUGIN", "DONE", "CLAIM"]);
                for v in &r.released_while_gone {
                    t.row(vec![
                        v.volume.clone(),
                        v.workload.clone(),
                        v.plugin.clone(),
                        v.done.clone(),
                        v.claim.clone(),
                    ]);
                }
                out.push_str(&t.render());
            }
        }
    }
    out
}
