//! Generated control-API requests: a route, its path ids and its JSON body, each field valid,
//! hostile but valid, or broken in one way that the agent must refuse naming the field.
//!
//! Which values are refused follows the agent's documented rules, decided here from the value
//! itself with csi-structs' constructors (ids: non-empty, at most 128 bytes, no control
//! characters where the type forbids them; volume and workload ids also name directories, so
//! not `.`, `..` or with `/` or NUL), the access modes and attachments the API lists,
//! `read`/`write` claim modes, capacities that are not negative and expansions above 0. A
//! wrong JSON type, a missing required field and an unknown field are always refused. Some
//! valid fields are refused together by a rule (`Case::refusable`).

use serde_json::{Map, Value, json};

use crate::rng::Rng;

/// Put in every secret value sent; it must never come back in an answer or reach a log line.
pub(crate) const MARKER: &str = "S3CR3T-API";

/// The volume every run keeps (created at the start, made again when a case removes it).
pub(crate) const KEPT_VOLUME: &str = "vol-a";

/// Path ids and body strings the agent accepts although they look hostile.
const ODD_VALID: &[&str] = &[
    "../../../../tmp/evil",
    "a b",
    "ünïcødé",
    "💥",
    "x;rm -rf /",
    "%2e%2e%2f",
    ".",
    "..",
];

/// One generated request.
#[derive(Debug)]
pub(crate) struct Case {
    pub(crate) method: &'static str,
    /// The path, already percent-encoded (or deliberately broken).
    pub(crate) path: String,
    pub(crate) body: Option<Vec<u8>>,
    /// The one field that was broken, which a refusal must name.
    pub(crate) broken: Option<String>,
    /// Valid fields whose combination a rule refuses, which the refusal may name instead of
    /// the broken one (a forced deregistration without confirmation, say).
    pub(crate) refusable: Option<&'static str>,
    /// Every field of a body-carrying request is valid (the body cannot be refused as such).
    pub(crate) valid_body: bool,
    /// A volume this request would create, for the check that a refusal created nothing.
    pub(crate) creates: Option<String>,
    /// A claim (volume, workload) this request would make.
    pub(crate) claims: Option<(String, String)>,
}

/// How one field's value was made.
enum Made {
    Valid(Value),
    /// Invalid: must be refused naming the field.
    Broken(Value),
}

struct Body {
    fields: Map<String, Value>,
    broken: Option<String>,
    /// Whether one field may still be broken (one per case, so the refusal has one name).
    may_break: bool,
}

impl Body {
    fn new(rng: &mut Rng) -> Self {
        Body {
            fields: Map::new(),
            broken: None,
            may_break: rng.percent(45),
        }
    }

    /// Adds `name` with a value from `make` (told whether it may break it). When this field
    /// is the one broken, a required field is sometimes left out, and any field sometimes
    /// given a value of the wrong JSON type; an optional field is often left out anyway.
    fn field(
        &mut self,
        rng: &mut Rng,
        name: &str,
        required: bool,
        kind: Kind,
        make: impl FnOnce(&mut Rng, bool) -> Made,
    ) {
        let breaking = self.may_break && self.broken.is_none() && rng.percent(25);
        if breaking && required && rng.percent(20) {
            self.broken = Some(name.to_owned());
            return;
        }
        if breaking && rng.percent(35) {
            self.fields.insert(name.to_owned(), wrong_type(rng, kind));
            self.broken = Some(name.to_owned());
            return;
        }
        if !required && rng.percent(30) {
            return;
        }
        match make(rng, breaking) {
            Made::Valid(v) => {
                self.fields.insert(name.to_owned(), v);
            }
            Made::Broken(v) => {
                self.fields.insert(name.to_owned(), v);
                self.broken = Some(name.to_owned());
            }
        }
    }

    fn finish(mut self, rng: &mut Rng) -> (Vec<u8>, Option<String>) {
        if self.may_break && self.broken.is_none() && rng.percent(30) {
            let name = rng.pick(&["volume_idd", "worklaod", "force_", "zz"]);
            self.fields.insert(name.to_owned(), json!(true));
            self.broken = Some(name.to_owned());
        }
        let bytes = serde_json::to_vec(&Value::Object(self.fields)).unwrap_or_default();
        (bytes, self.broken)
    }
}

/// The JSON type a field takes.
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Int,
    Bool,
    Map,
    List,
}

/// A JSON value of another type than `kind`.
fn wrong_type(rng: &mut Rng, kind: Kind) -> Value {
    let choices = match kind {
        Kind::Str => [json!(12345), json!(true), json!([1, 2]), json!({"a": 1})],
        Kind::Int => [json!("12"), json!(1.5), json!([1]), json!({"a": 1})],
        Kind::Bool => [json!("yes"), json!(1), json!([true]), json!({"a": true})],
        Kind::Map => [json!("k=v"), json!(1), json!(["a"]), json!(true)],
        Kind::List => [json!("zone=a"), json!(1), json!({"zone": "a"}), json!(true)],
    };
    let i = rng.index(choices.len());
    choices[i].clone()
}

/// A string value of about `limit` bytes: mostly from `usual`, sometimes hostile but valid,
/// sometimes empty or over the limit (broken when `breaking`).
fn text(rng: &mut Rng, usual: &[&str], breaking: bool) -> String {
    if breaking {
        return match rng.index(3) {
            0 => String::new(),
            1 => "x".repeat(129 + rng.index(300)),
            _ => format!("bad\u{1}id{}", rng.index(10)),
        };
    }
    match rng.weighted(&[70, 20, 10]) {
        0 => rng.pick(usual).to_owned(),
        1 => rng.pick(ODD_VALID).to_owned(),
        _ => format!("{}-{}", rng.pick(usual), rng.index(1000)),
    }
}

/// A string field judged by `valid` (a csi-structs constructor).
fn id_field(
    usual: &'static [&'static str],
    valid: fn(&str) -> bool,
) -> impl FnOnce(&mut Rng, bool) -> Made {
    move |rng, breaking| {
        let v = text(rng, usual, breaking);
        if valid(&v) {
            Made::Valid(json!(v))
        } else {
            Made::Broken(json!(v))
        }
    }
}

fn choice(
    valid: &'static [&'static str],
    invalid: &'static [&'static str],
) -> impl FnOnce(&mut Rng, bool) -> Made {
    move |rng, breaking| {
        if breaking {
            Made::Broken(json!(rng.pick(invalid)))
        } else {
            Made::Valid(json!(rng.pick(valid)))
        }
    }
}

fn capacity(rng: &mut Rng, breaking: bool) -> Made {
    if breaking {
        Made::Broken(json!(-1 - i64::try_from(rng.index(1 << 20)).unwrap_or(0)))
    } else {
        Made::Valid(json!(rng.pick(&[0, 1 << 20, 1 << 30])))
    }
}

/// An expansion's capacity: more than 0 (the kept volume is never grown past 1 GiB, so a
/// valid value is never below its capacity).
fn growth(rng: &mut Rng, breaking: bool) -> Made {
    if breaking {
        Made::Broken(json!(rng.pick(&[0, -1, i64::MIN])))
    } else {
        Made::Valid(json!(1 << 30))
    }
}

fn boolean(rng: &mut Rng, _breaking: bool) -> Made {
    Made::Valid(json!(rng.percent(50)))
}

fn string_map(rng: &mut Rng, _breaking: bool) -> Made {
    let mut map = Map::new();
    for _ in 0..rng.index(3) {
        map.insert(
            rng.pick(&["type", "zone", "iops"]).to_owned(),
            json!(rng.pick(&["gp3", "eu-1a", "3000"])),
        );
    }
    Made::Valid(Value::Object(map))
}

fn secrets(rng: &mut Rng, _breaking: bool) -> Made {
    let mut map = Map::new();
    map.insert(
        "password".into(),
        json!(format!("{MARKER}-{}", rng.index(100))),
    );
    if rng.percent(50) {
        map.insert(
            rng.pick(&["node-stage", "create", "controller-publish"])
                .into(),
            json!({ "token": format!("{MARKER}-section") }),
        );
    }
    Made::Valid(Value::Object(map))
}

fn topologies(rng: &mut Rng, _breaking: bool) -> Made {
    if rng.percent(70) {
        return Made::Valid(json!([]));
    }
    Made::Valid(json!([{ "zone": rng.pick(&["eu-1a", "eu-1b"]) }]))
}

const ACCESS_MODES: &[&str] = &[
    "single-node-writer",
    "SINGLE_NODE_WRITER",
    "multi-node-reader-only",
    "multi-node-multi-writer",
];
const BAD_ACCESS_MODES: &[&str] = &["sideways", "", "SINGLE-NODE", "writer"];
const VOLUMES: &[&str] = &[KEPT_VOLUME, "vol-b", "vol-c"];
const WORKLOADS: &[&str] = &["web-1", "web-2", "job"];

/// Whether the agent can use `v` as a directory name (volume and workload ids name the
/// staging and publish directories): not empty, `.` or `..`, without `/` or NUL.
pub(crate) fn segment_ok(v: &str) -> bool {
    !v.is_empty() && v != "." && v != ".." && !v.contains(['/', '\0'])
}
fn volume_ok(v: &str) -> bool {
    csi_structs::VolumeId::new(v).is_ok() && segment_ok(v)
}
fn name_ok(v: &str) -> bool {
    csi_structs::VolumeId::new(v).is_ok() && !v.chars().any(csi_structs::limits::is_banned_in_name)
}
fn external_ok(v: &str) -> bool {
    csi_structs::ExternalVolumeId::new(v).is_ok()
}
fn plugin_ok(v: &str) -> bool {
    csi_structs::PluginId::new(v).is_ok()
}
fn workload_ok(v: &str) -> bool {
    csi_structs::WorkloadId::new(v).is_ok() && segment_ok(v)
}
fn node_ok(v: &str) -> bool {
    csi_structs::NodeId::new(v).is_ok()
}

/// A path id: the kept volume, another valid id, a hostile valid one, or one that cannot be
/// an id (empty, too long, a broken or non-UTF-8 escape).
fn path_id(rng: &mut Rng) -> String {
    match rng.weighted(&[45, 15, 15, 25]) {
        0 => KEPT_VOLUME.to_owned(),
        1 => format!("vol-{}", rng.index(50)),
        2 => csi_agent::ops::api::encode_segment(rng.pick(ODD_VALID)),
        _ => match rng.index(5) {
            0 => String::new(),
            1 => "v".repeat(129 + rng.index(2000)),
            2 => "%zz".to_owned(),
            3 => "%ff%fe".to_owned(),
            _ => "a%2Fb".to_owned(),
        },
    }
}

/// A whole body that is not the JSON object any route takes.
fn hostile_body(rng: &mut Rng) -> Vec<u8> {
    match rng.index(7) {
        0 => Vec::new(),
        1 => b"not json".to_vec(),
        2 => b"[1,2,3]".to_vec(),
        3 => {
            let depth = 64 + rng.index(20_000);
            let mut v = "[".repeat(depth).into_bytes();
            v.extend("]".repeat(depth).into_bytes());
            v
        }
        4 => vec![0xff, 0xfe, b'{', b'}'],
        5 => {
            // Over the 1 MiB limit.
            let mut v = br#"{"workload":""#.to_vec();
            v.extend(std::iter::repeat_n(b'a', (1 << 20) + 10));
            v.extend(br#""}"#);
            v
        }
        _ => format!(r#"{{"workload": "{MARKER}-unterminated"#).into_bytes(),
    }
}

/// Generates one case.
pub(crate) fn case(rng: &mut Rng) -> Case {
    let mut c = Case {
        method: "GET",
        path: String::new(),
        body: None,
        broken: None,
        refusable: None,
        valid_body: false,
        creates: None,
        claims: None,
    };
    let id = path_id(rng);
    // Which route, and the body it takes.
    let route = rng.weighted(&[
        3, 3, 4, 3, 5, // status, plugins, plugin, volumes, volume
        10, 12, 12, 8, 5, 5,
        4, // register, create, claim, release, expand, detach, deregister
        4, 3, 4, 3, 3, 3, 3, // delete, plugin volumes, snapshot create, 4 snapshot routes
        4, // junk
    ]);
    let mut body = Body::new(rng);
    let (method, path, takes_body) = match route {
        0 => ("GET", "/v1/status".to_owned(), false),
        1 => ("GET", "/v1/plugins".to_owned(), false),
        2 => ("GET", format!("/v1/plugins/{}", plugin_path(rng)), false),
        3 => ("GET", "/v1/volumes".to_owned(), false),
        4 => ("GET", format!("/v1/volumes/{id}"), false),
        5 => {
            body.field(rng, "id", true, Kind::Str, id_field(VOLUMES, volume_ok));
            body.field(
                rng,
                "external_id",
                true,
                Kind::Str,
                id_field(&["ext-1", "ext-2"], external_ok),
            );
            volume_fields(&mut body, rng);
            body.field(rng, "controller_publish", false, Kind::Bool, boolean);
            body.field(rng, "context", false, Kind::Map, string_map);
            body.field(rng, "secrets", false, Kind::Map, secrets);
            body.field(rng, "accessible_topology", false, Kind::List, topologies);
            // Only the mock is fingerprinted: for another plugin the agent cannot tell whether
            // releases need a controller step, and asks for `controller_publish`.
            if body.fields.get("plugin").and_then(Value::as_str) != Some("mock")
                && !body.fields.contains_key("controller_publish")
            {
                c.refusable = Some("controller_publish");
            }
            c.creates = body
                .fields
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_owned);
            ("POST", "/v1/volumes".to_owned(), true)
        }
        6 => {
            body.field(rng, "id", true, Kind::Str, id_field(VOLUMES, volume_ok));
            volume_fields(&mut body, rng);
            body.field(rng, "capacity_bytes", true, Kind::Int, capacity);
            body.field(rng, "parameters", false, Kind::Map, string_map);
            body.field(rng, "secrets", false, Kind::Map, secrets);
            // Only the mock is known: a create for another plugin is refused naming the known
            // plugins (an operator's typo), not answered as an outage.
            if body
                .fields
                .get("plugin")
                .and_then(Value::as_str)
                .is_some_and(|p| p != "mock")
            {
                c.refusable = Some("known plugins");
            }
            c.creates = body
                .fields
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_owned);
            ("POST", "/v1/volumes/create".to_owned(), true)
        }
        7 => {
            body.field(
                rng,
                "workload",
                true,
                Kind::Str,
                id_field(WORKLOADS, workload_ok),
            );
            body.field(
                rng,
                "mode",
                true,
                Kind::Str,
                choice(&["read", "write"], &["exclusive", "", "WRITE"]),
            );
            if let Some(w) = body.fields.get("workload").and_then(Value::as_str) {
                c.claims = Some((id.clone(), w.to_owned()));
            }
            ("POST", format!("/v1/volumes/{id}/claim"), true)
        }
        8 => {
            body.field(
                rng,
                "workload",
                true,
                Kind::Str,
                id_field(WORKLOADS, workload_ok),
            );
            ("POST", format!("/v1/volumes/{id}/release"), true)
        }
        9 => {
            body.field(rng, "capacity_bytes", true, Kind::Int, growth);
            ("POST", format!("/v1/volumes/{id}/expand"), true)
        }
        10 => {
            body.field(
                rng,
                "node",
                true,
                Kind::Str,
                id_field(&["n1", "n2"], node_ok),
            );
            body.field(rng, "node_gone", false, Kind::Bool, boolean);
            // The agent's own node is never gone.
            if body.fields.get("node_gone") == Some(&json!(true))
                && body.fields.get("node") == Some(&json!("n1"))
            {
                c.refusable = Some("node_gone");
            }
            ("POST", format!("/v1/volumes/{id}/detach"), true)
        }
        11 => {
            body.field(rng, "force", false, Kind::Bool, boolean);
            body.field(rng, "confirmed", false, Kind::Bool, boolean);
            // Forgetting claims takes a confirmation.
            if body.fields.get("force") == Some(&json!(true))
                && body.fields.get("confirmed") != Some(&json!(true))
            {
                c.refusable = Some("confirmed");
            }
            ("POST", format!("/v1/volumes/{id}/deregister"), true)
        }
        12 => ("DELETE", format!("/v1/volumes/{id}"), false),
        13 => (
            "GET",
            format!("/v1/plugins/{}/volumes", plugin_path(rng)),
            false,
        ),
        14 => {
            body.field(
                rng,
                "name",
                true,
                Kind::Str,
                id_field(&["snap-1", "nightly"], name_ok),
            );
            body.field(rng, "parameters", false, Kind::Map, string_map);
            ("POST", format!("/v1/volumes/{id}/snapshots"), true)
        }
        15 => ("GET", format!("/v1/volumes/{id}/snapshots"), false),
        16 => (
            "GET",
            format!("/v1/plugins/{}/snapshots", plugin_path(rng)),
            false,
        ),
        17 => (
            "DELETE",
            format!("/v1/volumes/{id}/snapshots/{}", path_id(rng)),
            false,
        ),
        18 => (
            "DELETE",
            format!(
                "/v1/plugins/{}/snapshots/{}",
                plugin_path(rng),
                path_id(rng)
            ),
            false,
        ),
        _ => {
            let method = rng.pick(&["GET", "PUT", "PATCH", "POST", "DELETE"]);
            let path = rng.pick(&[
                "/v2/status",
                "/v1",
                "/",
                "/v1/volumes/a/b/c/d",
                "/v1//volumes",
            ]);
            (method, path.to_owned(), false)
        }
    };
    c.method = method;
    c.path = path;
    if takes_body {
        if rng.percent(8) {
            c.body = Some(hostile_body(rng));
            c.broken = Some(String::new());
            c.claims = None;
            c.creates = None;
        } else {
            let (bytes, broken) = body.finish(rng);
            c.valid_body = broken.is_none();
            c.body = Some(bytes);
            c.broken = broken;
        }
    }
    c
}

/// The fields a register and a create both take: the plugin, the access mode and the
/// attachment.
fn volume_fields(body: &mut Body, rng: &mut Rng) {
    body.field(
        rng,
        "plugin",
        true,
        Kind::Str,
        id_field(&["mock"], plugin_ok),
    );
    body.field(
        rng,
        "access_mode",
        true,
        Kind::Str,
        choice(ACCESS_MODES, BAD_ACCESS_MODES),
    );
    body.field(
        rng,
        "attachment",
        true,
        Kind::Str,
        choice(&["mount", "block"], &["floppy", ""]),
    );
}

fn plugin_path(rng: &mut Rng) -> String {
    if rng.percent(70) {
        "mock".to_owned()
    } else {
        path_id(rng)
    }
}
