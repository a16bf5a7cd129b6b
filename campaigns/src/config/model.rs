//! Generated configurations of `csi-agent serve` and which key each must be refused for.
//!
//! A case starts from a consistent configuration (an embedded store, or an etcd store with the
//! keys it needs), gives each key a value that the documented rules accept (ordinary or
//! hostile), then breaks none, one or two of them: an invalid value, a key the store does not
//! use, a required companion removed. The effective value of a key is its flag's (or
//! variable's) when set, otherwise the file's; the error must name one of the broken keys, and
//! a configuration with none must load.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use crate::rng::Rng;

/// Where a case's temporary files live, as the generator needs them.
#[derive(Clone, Debug)]
pub(crate) struct Fixtures {
    /// A file holding a good cluster token.
    pub(crate) good_token: String,
    /// Files that are not usable token files (too short, spaces, empty, too long, a directory).
    pub(crate) bad_tokens: Vec<String>,
    /// A directory no case may create anything in; data directories are named under it.
    pub(crate) untouched: String,
}

/// A key's value as generated.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    /// A string (every key, from a flag, a variable or the file).
    Text(String),
    /// A list of strings (`peers`).
    List(Vec<String>),
    /// An integer (`node_detach_attempts` in the file).
    Int(i64),
}

impl fmt::Display for Value {
    /// The value, cut to a readable length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cut = |s: &str| -> String {
            let mut out: String = s.chars().take(48).collect();
            if out.len() < s.len() {
                out.push_str(&format!("…({} bytes)", s.len()));
            }
            format!("{out:?}")
        };
        match self {
            Value::Text(s) => f.write_str(&cut(s)),
            Value::List(l) => {
                let items: Vec<String> = l.iter().take(4).map(|s| cut(s)).collect();
                write!(
                    f,
                    "[{}]{}",
                    items.join(", "),
                    if l.len() > 4 { " …" } else { "" }
                )
            }
            Value::Int(n) => write!(f, "{n}"),
        }
    }
}

/// One key of a case: its value and where it is given.
#[derive(Clone, Debug)]
pub(crate) struct Setting {
    /// The key (`health_interval`).
    pub(crate) key: &'static str,
    /// The value.
    pub(crate) value: Value,
    /// Given as a flag or variable (true) or in the file (false).
    pub(crate) flag: bool,
}

/// A generated configuration and the keys it must be refused for.
#[derive(Clone, Debug)]
pub(crate) struct Model {
    /// Every key given.
    pub(crate) settings: Vec<Setting>,
    /// The keys any of which the error may name; empty: it must load.
    pub(crate) broken: BTreeSet<&'static str>,
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.settings {
            write!(
                f,
                "{}{}={} ",
                if s.flag { "--" } else { "" },
                s.key,
                s.value
            )?;
        }
        write!(f, "broken={:?}", self.broken)
    }
}

/// A duration as text and what it means, `None` when it is not a valid duration.
fn duration(rng: &mut Rng) -> (String, Option<Duration>) {
    let ms = |n: u64| Some(Duration::from_millis(n));
    let (text, value): (&str, Option<Duration>) = rng.pick(&[
        ("500ms", ms(500)),
        ("10s", ms(10_000)),
        ("2m", ms(120_000)),
        ("1h", ms(3_600_000)),
        ("24h", ms(86_400_000)),
        ("86400000ms", ms(86_400_000)),
        ("1440m", ms(86_400_000)),
        (" 5s ", ms(5_000)),
        ("010s", ms(10_000)),
        ("1ms", ms(1)),
        ("", None),
        ("10", None),
        ("s", None),
        ("0s", None),
        ("0ms", None),
        ("25h", None),
        ("86400001ms", None),
        ("-1s", None),
        ("1.5s", None),
        ("10 s", None),
        ("10S", None),
        ("١s", None),
        ("+5s", None),
        ("99999999999999999999h", None),
        ("18446744073709551615h", None),
        ("5s\n", ms(5_000)),
        ("5s\0", None),
    ]);
    (text.to_owned(), value)
}

/// Picks an accepted (`true`) or refused (`false`) value from two pools, favouring accepted
/// ones three to one.
fn pooled(rng: &mut Rng, good: &[&str], bad: &[&str]) -> (String, bool) {
    if rng.percent(75) {
        ((rng.pick(good)).to_owned(), true)
    } else {
        ((rng.pick(bad)).to_owned(), false)
    }
}

/// A node id: any UTF-8 of 1 to 128 bytes.
fn node_id(rng: &mut Rng) -> (String, bool) {
    let long = "n".repeat(128);
    let too_long = "n".repeat(129 + rng.index(8000));
    let (s, ok) = pooled(
        rng,
        &["node-a", "../../etc", "ünï", "🚀", " spaced ", "a", &long],
        &["", &too_long],
    );
    (s, ok)
}

fn listen(rng: &mut Rng) -> (String, bool) {
    pooled(
        rng,
        &[
            "127.0.0.1:0",
            "127.0.0.1:7600",
            "[::1]:0",
            " 127.0.0.1:1 ",
            "127.0.0.2:9",
        ],
        &[
            "0.0.0.0:1",
            "10.0.0.1:7600",
            "localhost:7600",
            "127.0.0.1",
            "127.0.0.1:65536",
            "",
            ":7600",
            "[::]:1",
        ],
    )
}

fn shim_listen(rng: &mut Rng) -> (String, bool) {
    pooled(
        rng,
        &["127.0.0.1:7400", "0.0.0.0:7400", "[::]:0", "10.1.2.3:1"],
        &["x", "", "127.0.0.1:-1", "1.2.3.4", "127.0.0.1:7400:1"],
    )
}

fn peer(rng: &mut Rng, own: &str) -> (String, bool) {
    // A peer's node id is read trimmed and the agent's own is not: only an own id without
    // surrounding spaces can be repeated as a peer's.
    let own_peer = if own.trim() == own {
        format!("{own}=127.0.0.1:1,127.0.0.1:2")
    } else {
        "b=127.0.0.1:1".to_owned()
    };
    let long = format!("{}=127.0.0.1:1,127.0.0.1:2", "p".repeat(200));
    pooled(
        rng,
        &[
            "n2=127.0.0.1:7401,127.0.0.1:7601",
            " n-3 = 10.0.0.3:7401 , 10.0.0.3:7601 ",
            "🛰=[::1]:1,[::1]:2",
        ],
        &[
            "b",
            "b=127.0.0.1:1",
            "=1.1.1.1:1,1.1.1.1:2",
            "b=x,127.0.0.1:2",
            "b=127.0.0.1:1,y",
            &own_peer,
            &long,
            "",
        ],
    )
}

fn log_filter(rng: &mut Rng) -> (String, bool) {
    pooled(
        rng,
        &[
            "info",
            "warn",
            "csi_agent=debug",
            "debug,hyper=off",
            "trace",
        ],
        &["[[["],
    )
}

fn store_prefix(rng: &mut Rng) -> (String, bool) {
    let long = format!("/{}", "p".repeat(128));
    pooled(
        rng,
        &["/csi-agent", "/a/b.c_d-e", "/x/", "/0"],
        &["no-slash", "/a//b", "/", "", "/a b", &long, "/é"],
    )
}

fn store(rng: &mut Rng) -> (String, bool) {
    let many = format!(
        "etcd://{}",
        (1..=17)
            .map(|i| format!("h{i}:2379"))
            .collect::<Vec<_>>()
            .join(",")
    );
    pooled(
        rng,
        &[
            "etcd://127.0.0.1:2379",
            "etcd://h1:1,h-2.example:2379",
            " etcd://[::1]:2379 ",
        ],
        &[
            "etcd",
            "redis://h:1",
            "etcd://",
            "etcd://h",
            "etcd://h:0",
            "etcd://h:x",
            "etcd://h:1,",
            "EMBEDDED",
            "etcd://h h:1",
            &many,
        ],
    )
}

/// A lease TTL as text and what it means, `None` when it is refused (whole seconds, at least
/// 2s, at most 24h).
fn lease_ttl(rng: &mut Rng) -> (String, Option<Duration>) {
    let s = |n: u64| Some(Duration::from_secs(n));
    let (text, value) = if rng.percent(75) {
        rng.pick(&[
            ("2s", s(2)),
            ("3s", s(3)),
            ("10s", s(10)),
            ("1m", s(60)),
            ("24h", s(86_400)),
            ("2000ms", s(2)),
        ])
    } else {
        rng.pick(&[
            ("1s", None),
            ("2500ms", None),
            ("0s", None),
            ("25h", None),
            ("x", None),
            ("", None),
        ])
    };
    (text.to_owned(), value)
}

/// A duty margin as text, and whether a lease of `ttl` accepts it: at least 100 ms and less
/// than a third of the TTL (`csi_claims::duty::DutyTiming::with_margin`).
fn lease_margin(rng: &mut Rng, ttl: Duration) -> (String, bool) {
    let ms = |n: u64| Some(Duration::from_millis(n));
    let third = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX) / 3;
    let (text, value): (String, Option<Duration>) = match rng.index(3) {
        // Around the bounds for this TTL.
        0 => {
            let n = rng.pick(&[99, 100, 101, third.saturating_sub(1), third, third + 1]);
            (format!("{n}ms"), ms(n))
        }
        1 => {
            let (text, value) = rng.pick(&[
                ("400ms", ms(400)),
                ("2s", ms(2_000)),
                ("1m", ms(60_000)),
                ("0ms", None),
                ("x", None),
                ("", None),
                ("-1s", None),
            ]);
            (text.to_owned(), value)
        }
        _ => duration(rng),
    };
    let ok = value.is_some_and(|d| d >= Duration::from_millis(100) && d.saturating_mul(3) < ttl);
    (text, ok)
}

/// A path: any non-empty text.
fn path(rng: &mut Rng, untouched: &str, name: &str) -> (String, bool) {
    let inside = format!("{untouched}/{name}-{}", rng.index(1000));
    let spaced = format!("{untouched}/with space/ünï");
    let nul = format!("{untouched}/a\0b");
    pooled(
        rng,
        &[&inside, &inside, &spaced, &nul, "relative-not-created"],
        &[""],
    )
}

fn attempts_text(rng: &mut Rng) -> (String, bool) {
    pooled(
        rng,
        &["1", "10", " 3 ", "5"],
        &["0", "11", "-1", "two", "", "1e1", "4294967296", "3.0"],
    )
}

/// The state of one case's generation.
struct Gen<'r> {
    rng: &'r mut Rng,
    settings: Vec<Setting>,
    broken: BTreeSet<&'static str>,
    /// How many more keys may be broken on purpose.
    breaks_left: u32,
}

impl Gen<'_> {
    /// Whether a refused value may be used now (one of the case's breaks); accepted values
    /// always may.
    fn may_use(&mut self, ok: bool) -> bool {
        if ok {
            return true;
        }
        if self.breaks_left > 0 && self.rng.percent(60) {
            self.breaks_left -= 1;
            return true;
        }
        false
    }

    /// Spends one break, when any is left, with probability `percent`.
    fn take_break(&mut self, percent: u64) -> bool {
        if self.breaks_left > 0 && self.rng.percent(percent) {
            self.breaks_left -= 1;
            true
        } else {
            false
        }
    }

    /// Gives `key` as a flag (or variable) or in the file. A flag sometimes shadows a file
    /// value that would be refused: the flag wins and the file's value is never used.
    fn put(&mut self, key: &'static str, value: Value) {
        // The file takes the attempt count as an integer only; as text it is a flag.
        let text_attempts = key == "node_detach_attempts" && matches!(value, Value::Text(_));
        let flag = text_attempts || self.rng.percent(40);
        if flag && self.rng.percent(10) {
            let shadowed = match &value {
                Value::List(_) => Value::List(vec!["shadowed; never read".to_owned()]),
                Value::Int(_) => Value::Int(0),
                Value::Text(_) if key == "node_detach_attempts" => Value::Int(0),
                Value::Text(_) => Value::Text("shadowed; never read".to_owned()),
            };
            self.settings.push(Setting {
                key,
                value: shadowed,
                flag: false,
            });
        }
        self.settings.push(Setting { key, value, flag });
    }

    /// Gives `key` the generated text if it may be used, recording a refused one as broken.
    fn text(&mut self, key: &'static str, (value, ok): (String, bool)) -> bool {
        if !self.may_use(ok) {
            return false;
        }
        if !ok {
            self.broken.insert(key);
        }
        self.put(key, Value::Text(value));
        true
    }

    fn has(&self, key: &str) -> bool {
        self.settings.iter().any(|s| s.key == key)
    }
}

/// Builds one case's configuration.
pub(crate) fn generate(rng: &mut Rng, fx: &Fixtures) -> Model {
    let breaks_left = match rng.weighted(&[25, 60, 15]) {
        0 => 0,
        1 => 1,
        _ => 2,
    };
    let mut g = Gen {
        rng,
        settings: Vec::new(),
        broken: BTreeSet::new(),
        breaks_left,
    };
    let etcd = g.rng.percent(25);
    // node_id first: a peer must not have it.
    let mut own = "node-1".to_owned();
    if g.rng.percent(60) {
        let (v, ok) = node_id(g.rng);
        if g.text("node_id", (v.clone(), ok)) && ok {
            own = v;
        }
    }
    // The data directory is always set, under the untouched directory.
    let dir = path(g.rng, &fx.untouched, "data");
    if !g.text("data_dir", dir) {
        g.put("data_dir", Value::Text(format!("{}/data", fx.untouched)));
    }
    if g.rng.percent(30) {
        let v = path(g.rng, &fx.untouched, "plugins");
        g.text("plugin_dir", v);
    }
    if g.rng.percent(40) {
        let v = listen(g.rng);
        g.text("listen", v);
    }
    for key in [
        "scan_interval",
        "health_interval",
        "fingerprint_interval",
        "peer_interval",
        "call_timeout",
        "node_detach_socket_wait",
    ] {
        if g.rng.percent(20) {
            let (text, d) = duration(g.rng);
            g.text(key, (text, d.is_some()));
        }
    }
    // The backoff pair: the maximum must not be below the initial delay (defaults 1s, 60s).
    let mut initial = Some(Duration::from_secs(1));
    let mut max = Some(Duration::from_secs(60));
    for (key, slot) in [
        ("release_backoff_initial", &mut initial),
        ("release_backoff_max", &mut max),
    ] {
        if g.rng.percent(20) {
            let (text, d) = duration(g.rng);
            if g.text(key, (text, d.is_some())) {
                *slot = d;
            }
        }
    }
    if let (Some(i), Some(m)) = (initial, max)
        && m < i
    {
        g.broken.insert("release_backoff_max");
    }
    if g.rng.percent(20) {
        if g.rng.percent(50) {
            let v = attempts_text(g.rng);
            g.text("node_detach_attempts", v);
        } else {
            // In the file, as an integer.
            let n = g.rng.pick(&[1, 3, 10, 0, 11]);
            let ok = (1..=10).contains(&n);
            if g.may_use(ok) {
                if !ok {
                    g.broken.insert("node_detach_attempts");
                }
                g.settings.push(Setting {
                    key: "node_detach_attempts",
                    value: Value::Int(n),
                    flag: false,
                });
            }
        }
    }
    if g.rng.percent(20) {
        let v = log_filter(g.rng);
        g.text("log", v);
    }

    if etcd {
        let v = store(g.rng);
        if !g.text("store", v) {
            g.put("store", Value::Text("etcd://127.0.0.1:2379".to_owned()));
        }
        let store_ok = !g.broken.contains("store");
        // Required with etcd: leaving it out is a break.
        if g.take_break(15) {
            if store_ok {
                g.broken.insert("shim_listen");
            }
        } else {
            let v = shim_listen(g.rng);
            if !g.text("shim_listen", v) {
                g.put("shim_listen", Value::Text("127.0.0.1:7400".to_owned()));
            }
        }
        if g.rng.percent(30) {
            let v = store_prefix(g.rng);
            g.text("store_prefix", v);
        }
        // The margin is checked against the TTL in effect (10s by default); a refused TTL
        // is named first.
        let mut ttl = Some(Duration::from_secs(10));
        if g.rng.percent(30) {
            let (text, value) = lease_ttl(g.rng);
            if g.text("lease_ttl", (text, value.is_some())) {
                ttl = value;
            }
        }
        if g.rng.percent(30) {
            let v = lease_margin(g.rng, ttl.unwrap_or(Duration::from_secs(10)));
            g.text("lease_margin", v);
        }
        // etcd's TLS and user keys come in bundles; a bundle missing a part is a break that
        // names the missing part.
        let untouched = fx.untouched.clone();
        let file = |rng: &mut Rng| Value::Text(format!("{untouched}/etcd-{}.pem", rng.index(100)));
        match g.rng.weighted(&[50, 15, 15, 10, 10]) {
            1 => {
                let f = file(g.rng);
                g.put("etcd_ca_file", f);
            }
            2 => {
                for key in ["etcd_ca_file", "etcd_cert_file", "etcd_key_file"] {
                    let f = file(g.rng);
                    g.put(key, f);
                }
            }
            3 => {
                let user = (g.rng.pick(&["root", "csi", "ünï"])).to_owned();
                g.put("etcd_user", Value::Text(user));
                let f = file(g.rng);
                g.put("etcd_password_file", f);
            }
            4 if g.take_break(100) => {
                let (keys, names): (&[&'static str], &'static str) = g.rng.pick(&[
                    (&["etcd_cert_file"][..], "etcd_key_file"),
                    (&["etcd_key_file"][..], "etcd_cert_file"),
                    (&["etcd_cert_file", "etcd_key_file"][..], "etcd_ca_file"),
                    (&["etcd_user"][..], "etcd_password_file"),
                    (&["etcd_password_file"][..], "etcd_user"),
                ]);
                for key in keys {
                    let f = file(g.rng);
                    g.put(key, f);
                }
                g.broken.insert(names);
            }
            _ => {}
        }
        // Peers are found through etcd: listing them is refused.
        if g.take_break(20) {
            let v = vec!["n2=127.0.0.1:7401,127.0.0.1:7601".to_owned()];
            g.put("peers", Value::List(v));
            g.broken.insert("peers");
        }
    } else {
        if g.rng.percent(30) {
            let n = 1 + g.rng.index(3);
            let mut list = Vec::new();
            let mut list_ok = true;
            for _ in 0..n {
                let (v, ok) = peer(g.rng, &own);
                if g.may_use(ok) {
                    list_ok &= ok;
                    list.push(v);
                }
            }
            if !list.is_empty() {
                if !list_ok {
                    g.broken.insert("peers");
                }
                g.put("peers", Value::List(list));
            }
        }
        if g.rng.percent(20) {
            let v = shim_listen(g.rng);
            g.text("shim_listen", v);
        }
        // Keys only an etcd store uses.
        if g.take_break(20) {
            let key = g.rng.pick(&[
                "store_prefix",
                "etcd_ca_file",
                "etcd_cert_file",
                "etcd_key_file",
                "etcd_user",
                "etcd_password_file",
                "lease_ttl",
                "lease_margin",
            ]);
            let value = if key == "store_prefix" { "/x" } else { "10s" };
            g.put(key, Value::Text(value.to_owned()));
            g.broken.insert(key);
        }
        if g.rng.percent(10) {
            g.put("store", Value::Text("embedded".to_owned()));
        }
    }
    // The cluster token: required when agents talk to each other.
    let needs_token = g.has("peers") || g.has("shim_listen");
    if needs_token && g.take_break(30) {
        if g.rng.percent(50) {
            let bad = fx.bad_tokens[g.rng.index(fx.bad_tokens.len())].clone();
            g.put("cluster_token_file", Value::Text(bad));
        }
        g.broken.insert("cluster_token_file");
    } else if needs_token || g.rng.percent(10) {
        g.put("cluster_token_file", Value::Text(fx.good_token.clone()));
    }
    Model {
        settings: g.settings,
        broken: g.broken,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_that_are_refused_have_no_value() {
        let mut rng = Rng::new(1);
        for _ in 0..300 {
            let (text, d) = duration(&mut rng);
            if let Some(d) = d {
                assert!(!d.is_zero() && d <= Duration::from_secs(86_400), "{text:?}");
            }
        }
    }
}
