//! Campaign `config`: a hostile operator against the reference agent's configuration
//! (`csi_agent::config`), called as library functions; no server starts.
//!
//! Each case is a generated configuration given through flags (the values clap hands over,
//! from a flag or from its `CSI_AGENT_*` variable alike; some cases go through clap's own
//! parsing of `--key=value` arguments) and a TOML file (module `model`), or a hostile file: unknown
//! or misspelt keys, wrong types, duplicate keys, broken syntax, bytes that are not UTF-8, deep
//! nesting, a missing file or a directory.
//!
//! Properties: a configuration that breaks no rule loads; one that does is refused with an
//! error naming one of the keys it broke (or, for a broken file, the file and the key or line)
//! in at most 2 KiB; no panic; nothing is written (no data or plugin directory is created);
//! the cluster token never shows in an error or in the loaded configuration's `Debug`.

mod model;

use std::path::{Path, PathBuf};

use csi_agent::config::{AgentConfig, ConfigArgs, ConfigError};

use self::model::{Fixtures, Model, Value};
use crate::panics;
use crate::report::{Plan, Report};
use crate::rng::Rng;

/// The campaign's name on the command line and in its report line.
pub const NAME: &str = "config";

/// What the campaign covers, for `--list` and RELIABILITY.md.
pub const COVERS: &str = "hostile operator -> csi-agent's configuration: generated TOML files, flag values (directly and through clap) and CSI_AGENT_* values for every key of `serve`, valid, hostile-but-valid and invalid; unknown keys, wrong types, duplicates, broken syntax, non-UTF-8, deep nesting, missing files";

const COUNTERS: &[&str] = &[
    "panics",
    "unclear_errors",
    "refused_wrongly",
    "accepted_wrongly",
    "wrote_files",
    "leaked_secrets",
];

/// Put in every cluster token file; must never show.
const MARKER: &str = "S3CR3T-TOKEN";

/// The longest error accepted as clear, in bytes.
const MAX_ERROR_BYTES: usize = 2048;

/// A relative data directory some cases name; it must not appear in the working directory.
const RELATIVE: &str = "relative-not-created";

struct Dirs {
    _tmp: tempfile::TempDir,
    fixtures: Fixtures,
    untouched: PathBuf,
    case_file: PathBuf,
    dir_file: PathBuf,
}

fn setup() -> std::io::Result<Dirs> {
    let tmp = tempfile::tempdir()?;
    let fx = tmp.path().join("fixtures");
    std::fs::create_dir(&fx)?;
    let write = |name: &str, text: &str| -> std::io::Result<String> {
        let p = fx.join(name);
        std::fs::write(&p, text)?;
        Ok(p.display().to_string())
    };
    let good_token = write("good.token", &format!("{MARKER}-0123456789abcdef\n"))?;
    let dir_file = fx.join("a-directory");
    std::fs::create_dir(&dir_file)?;
    let bad_tokens = vec![
        write("short.token", "S3CR3T")?,
        write("spaces.token", &format!("{MARKER} with spaces inside"))?,
        write("empty.token", "")?,
        write("long.token", &format!("{MARKER}{}", "x".repeat(300)))?,
        dir_file.display().to_string(),
        fx.join("missing.token").display().to_string(),
    ];
    let untouched = tmp.path().join("untouched");
    std::fs::create_dir(&untouched)?;
    let case_file = tmp.path().join("case.toml");
    Ok(Dirs {
        fixtures: Fixtures {
            good_token,
            bad_tokens,
            untouched: untouched.display().to_string(),
        },
        untouched,
        case_file,
        dir_file,
        _tmp: tmp,
    })
}

/// The flag of a key, as clap spells it.
fn flag_of(key: &str) -> String {
    if key == "peers" {
        "--peer".to_owned()
    } else {
        format!("--{}", key.replace('_', "-"))
    }
}

/// Puts a text value in the `ConfigArgs` field of `key`, as clap would from the flag or its
/// variable.
fn set_arg(args: &mut ConfigArgs, key: &str, value: &Value) {
    let text = |v: &Value| match v {
        Value::Text(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        Value::List(l) => l.join(";"),
    };
    let t = text(value);
    let p = || Some(PathBuf::from(text(value)));
    match key {
        "node_id" => args.node_id = Some(t),
        "data_dir" => args.data_dir = p(),
        "plugin_dir" => args.plugin_dir = p(),
        "listen" => args.listen = Some(t),
        "shim_listen" => args.shim_listen = Some(t),
        "peers" => {
            args.peers = match value {
                Value::List(l) => l.clone(),
                _ => vec![t],
            }
        }
        "cluster_token_file" => args.cluster_token_file = p(),
        "scan_interval" => args.scan_interval = Some(t),
        "health_interval" => args.health_interval = Some(t),
        "fingerprint_interval" => args.fingerprint_interval = Some(t),
        "peer_interval" => args.peer_interval = Some(t),
        "call_timeout" => args.call_timeout = Some(t),
        "release_backoff_initial" => args.release_backoff_initial = Some(t),
        "release_backoff_max" => args.release_backoff_max = Some(t),
        "node_detach_socket_wait" => args.node_detach_socket_wait = Some(t),
        "node_detach_attempts" => args.node_detach_attempts = Some(t),
        "controller_calls" => args.controller_calls = Some(t),
        "log" => args.log = Some(t),
        "store" => args.store = Some(t),
        "store_prefix" => args.store_prefix = Some(t),
        "etcd_ca_file" => args.etcd_ca_file = p(),
        "etcd_cert_file" => args.etcd_cert_file = p(),
        "etcd_key_file" => args.etcd_key_file = p(),
        "etcd_user" => args.etcd_user = Some(t),
        "etcd_password_file" => args.etcd_password_file = p(),
        "lease_ttl" => args.lease_ttl = Some(t),
        "lease_margin" => args.lease_margin = Some(t),
        _ => {}
    }
}

/// The file settings of `model` as TOML.
fn toml_text(model: &Model) -> Result<String, String> {
    let mut table = toml::Table::new();
    for s in model.settings.iter().filter(|s| !s.flag) {
        let v = match &s.value {
            Value::Text(t) => toml::Value::String(t.clone()),
            Value::Int(n) => toml::Value::Integer(*n),
            Value::List(l) => {
                toml::Value::Array(l.iter().cloned().map(toml::Value::String).collect())
            }
        };
        table.insert(s.key.to_owned(), v);
    }
    toml::to_string(&table).map_err(|e| e.to_string())
}

/// How a case handed its flags over.
enum Delivery {
    /// Straight into `ConfigArgs`, as clap leaves a flag's or a variable's value.
    Fields(Box<ConfigArgs>),
    /// As `--key=value` arguments through clap.
    Argv(Vec<String>),
}

/// A hostile configuration file.
#[derive(Clone, Copy, Debug)]
enum FileCase {
    /// A key `serve` does not have; the error must name it.
    UnknownKey(&'static str),
    /// A known key with a value of the wrong type; the error must name the key.
    WrongType(&'static str, &'static str),
    /// A key given twice; the error must name it.
    Duplicate(&'static str),
    /// Text that is not TOML; the error must give the line.
    Syntax(&'static str),
    /// Bytes that are not UTF-8.
    NotUtf8,
    /// An array nested this deep as a value.
    Nested(usize),
    /// A `--config` path that does not exist.
    Missing,
    /// A `--config` path that is a directory.
    Directory,
}

impl FileCase {
    fn generate(rng: &mut Rng) -> FileCase {
        match rng.index(8) {
            0 => FileCase::UnknownKey(rng.pick(&[
                "helth_interval",
                "NODE_ID",
                "node-id",
                "data_dir2",
                "token",
                "cluster_token",
            ])),
            1 => rng.pick(&[
                FileCase::WrongType("node_id", "5"),
                FileCase::WrongType("peers", "\"n2=127.0.0.1:1,127.0.0.1:2\""),
                FileCase::WrongType("health_interval", "10"),
                FileCase::WrongType("node_detach_attempts", "\"3\""),
                FileCase::WrongType("node_detach_attempts", "-1"),
                FileCase::WrongType("node_detach_attempts", "99999999999"),
                FileCase::WrongType("data_dir", "true"),
                FileCase::WrongType("listen", "1.5"),
                FileCase::WrongType("peers", "[1, 2]"),
                FileCase::WrongType("log", "{ level = \"info\" }"),
            ]),
            2 => FileCase::Duplicate(rng.pick(&["node_id", "listen", "log"])),
            3 => FileCase::Syntax(rng.pick(&[
                "node_id = \"unterminated\n",
                "node_id =\n",
                "[[[\n",
                "= \"no key\"\n",
                "node_id = \"a\" junk\n",
                "log = \"info\u{0}\"\n",
                "node_id = 'a\u{7}'\n",
                "[node_id]\nx = 1\n",
            ])),
            4 => FileCase::NotUtf8,
            5 => FileCase::Nested(rng.pick(&[10, 1000, 100_000])),
            6 => FileCase::Missing,
            _ => FileCase::Directory,
        }
    }
}

/// Writes the bytes of a hostile file; returns what its error must contain (besides the path).
fn hostile_file(case: &FileCase, base: &str, path: &Path) -> std::io::Result<Option<String>> {
    let (bytes, must): (Vec<u8>, Option<String>) = match case {
        FileCase::UnknownKey(k) => (
            format!("{base}{k} = \"1s\"\n").into_bytes(),
            Some((*k).to_owned()),
        ),
        FileCase::WrongType(k, v) => (
            format!("{base}{k} = {v}\n").into_bytes(),
            Some((*k).to_owned()),
        ),
        FileCase::Duplicate(k) => (
            format!("{base}{k} = \"info\"\n{k} = \"info\"\n").into_bytes(),
            Some((*k).to_owned()),
        ),
        FileCase::Syntax(text) => (
            format!("{base}{text}").into_bytes(),
            Some("line".to_owned()),
        ),
        FileCase::NotUtf8 => {
            let mut b = base.as_bytes().to_vec();
            b.extend_from_slice(b"node_id = \"\xff\xfe\"\n");
            (b, None)
        }
        FileCase::Nested(depth) => {
            let text = format!(
                "{base}peers = {}{}\n",
                "[".repeat(*depth),
                "]".repeat(*depth)
            );
            (text.into_bytes(), Some("peers".to_owned()))
        }
        FileCase::Missing | FileCase::Directory => return Ok(None),
    };
    std::fs::write(path, bytes)?;
    Ok(must)
}

/// What a case left in the places nothing may be written to.
fn written(dirs: &Dirs) -> Option<String> {
    match std::fs::read_dir(&dirs.untouched) {
        Ok(mut entries) => {
            if let Some(Ok(e)) = entries.next() {
                return Some(format!("created {}", e.path().display()));
            }
        }
        Err(e) => return Some(format!("cannot list {}: {e}", dirs.untouched.display())),
    }
    if Path::new(RELATIVE).exists() {
        return Some(format!("created ./{RELATIVE}"));
    }
    None
}

/// The key an error names, when it is a key error.
fn key_of(e: &ConfigError) -> Option<&'static str> {
    match e {
        ConfigError::Invalid { key, .. } | ConfigError::Missing { key, .. } => Some(key),
        _ => None,
    }
}

/// Runs `load` and counts a panic as `Err(None)`.
fn load(args: &ConfigArgs) -> Result<Result<AgentConfig, ConfigError>, ()> {
    std::panic::catch_unwind(|| AgentConfig::load(args)).map_err(|_| ())
}

/// Parses `argv` with clap, then loads.
fn load_argv(argv: &[String]) -> Result<Result<Result<AgentConfig, ConfigError>, clap::Error>, ()> {
    use clap::{Args as _, FromArgMatches as _};
    std::panic::catch_unwind(|| {
        let command = ConfigArgs::augment_args(clap::Command::new("serve").no_binary_name(true));
        let matches = command.try_get_matches_from(argv)?;
        let args = ConfigArgs::from_arg_matches(&matches)?;
        Ok(AgentConfig::load(&args))
    })
    .map_err(|_| ())
}

/// Checks one loaded configuration against the keys it should be refused for.
fn judge_load(
    report: &mut Report,
    index: u64,
    what: &str,
    broken: &std::collections::BTreeSet<&'static str>,
    result: Result<AgentConfig, ConfigError>,
) {
    let fail = |report: &mut Report, counter, why: String| {
        report.violation(counter, index, format!("{why} [{what}]"));
    };
    match result {
        Ok(config) => {
            if format!("{config:?}").contains(MARKER) {
                fail(
                    report,
                    "leaked_secrets",
                    "the loaded configuration's Debug shows the token".into(),
                );
            }
            if !broken.is_empty() {
                fail(
                    report,
                    "accepted_wrongly",
                    format!("loaded, but {broken:?} are broken"),
                );
            }
        }
        Err(e) => {
            let text = e.to_string();
            if text.contains(MARKER) {
                fail(report, "leaked_secrets", "the error shows the token".into());
            }
            if broken.is_empty() {
                fail(
                    report,
                    "refused_wrongly",
                    format!("refused a valid configuration: {}", cut(&text)),
                );
                return;
            }
            match key_of(&e) {
                Some(key) if broken.contains(key) && text.contains(key) => {}
                Some(key) => fail(
                    report,
                    "unclear_errors",
                    format!(
                        "the error names `{key}`, not one of {broken:?}: {}",
                        cut(&text)
                    ),
                ),
                None => fail(
                    report,
                    "unclear_errors",
                    format!("the error names no key: {}", cut(&text)),
                ),
            }
            if text.len() > MAX_ERROR_BYTES {
                fail(
                    report,
                    "unclear_errors",
                    format!("an error of {} bytes", text.len()),
                );
            }
        }
    }
}

/// At most 300 bytes of `text`, for a failure line; nothing of it when it holds the token.
fn cut(text: &str) -> String {
    if text.contains(MARKER) {
        return "(withheld: the text holds the token)".to_owned();
    }
    let mut end = text.len().min(300);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end < text.len() {
        format!("{}…({} bytes)", &text[..end], text.len())
    } else {
        text.to_owned()
    }
}

fn model_case(dirs: &Dirs, rng: &mut Rng, plan: &Plan, report: &mut Report, index: u64) {
    let model = model::generate(rng, &dirs.fixtures);
    let what = model.to_string();
    plan.trace(index, &what);
    let mut args = ConfigArgs::default();
    let file_used = model.settings.iter().any(|s| !s.flag);
    if file_used {
        let written = toml_text(&model)
            .and_then(|text| std::fs::write(&dirs.case_file, text).map_err(|e| e.to_string()));
        if let Err(e) = written {
            report.violation(
                "refused_wrongly",
                index,
                format!("cannot write the case's file: {e}"),
            );
            return;
        }
        args.config = Some(dirs.case_file.clone());
    }
    let flags: Vec<_> = model.settings.iter().filter(|s| s.flag).collect();
    let delivery = if rng.percent(30) {
        let mut argv = Vec::new();
        if let Some(c) = &args.config {
            argv.push(format!("--config={}", c.display()));
        }
        for s in &flags {
            match &s.value {
                Value::List(l) => argv.extend(l.iter().map(|v| format!("--peer={v}"))),
                Value::Text(t) => argv.push(format!("{}={t}", flag_of(s.key))),
                Value::Int(n) => argv.push(format!("{}={n}", flag_of(s.key))),
            }
        }
        Delivery::Argv(argv)
    } else {
        for s in &flags {
            set_arg(&mut args, s.key, &s.value);
        }
        Delivery::Fields(Box::new(args))
    };
    match delivery {
        Delivery::Fields(args) => match load(&args) {
            Err(()) => report.violation("panics", index, format!("load panicked [{what}]")),
            Ok(result) => judge_load(report, index, &what, &model.broken, result),
        },
        Delivery::Argv(argv) => match load_argv(&argv) {
            Err(()) => report.violation("panics", index, format!("load panicked [{what}]")),
            // clap refused a flag value (it names the flag): right when that key is broken.
            Ok(Err(e)) => {
                let text = e.to_string();
                let named = model.broken.iter().any(|k| text.contains(&flag_of(k)));
                if model.broken.is_empty() {
                    report.violation(
                        "refused_wrongly",
                        index,
                        format!("clap refused: {} [{what}]", cut(&text)),
                    );
                } else if !named {
                    report.violation(
                        "unclear_errors",
                        index,
                        format!(
                            "clap's error names none of {:?}: {} [{what}]",
                            model.broken,
                            cut(&text)
                        ),
                    );
                }
            }
            Ok(Ok(result)) => judge_load(report, index, &what, &model.broken, result),
        },
    }
}

fn file_case(dirs: &Dirs, rng: &mut Rng, plan: &Plan, report: &mut Report, index: u64) {
    let case = FileCase::generate(rng);
    let what = format!("file {case:?}");
    plan.trace(index, &what);
    let base = format!("data_dir = \"{}/data\"\n", dirs.fixtures.untouched);
    let path = match case {
        FileCase::Missing => dirs.untouched.join("no-such.toml"),
        FileCase::Directory => dirs.dir_file.clone(),
        _ => dirs.case_file.clone(),
    };
    let must = match hostile_file(&case, &base, &path) {
        Ok(m) => m,
        Err(e) => {
            report.violation(
                "refused_wrongly",
                index,
                format!("cannot write the case's file: {e}"),
            );
            return;
        }
    };
    let args = ConfigArgs {
        config: Some(path.clone()),
        ..ConfigArgs::default()
    };
    let result = match load(&args) {
        Err(()) => {
            report.violation("panics", index, format!("load panicked [{what}]"));
            return;
        }
        Ok(r) => r,
    };
    match result {
        Ok(_) => report.violation("accepted_wrongly", index, format!("loaded [{what}]")),
        Err(e) => {
            let text = e.to_string();
            let names_file = matches!(&e, ConfigError::ReadFile { path: p, .. } | ConfigError::ParseFile { path: p, .. } if *p == path);
            if !names_file {
                report.violation(
                    "unclear_errors",
                    index,
                    format!("the error does not name the file: {} [{what}]", cut(&text)),
                );
            }
            if let Some(m) = must
                && !text.contains(&m)
            {
                report.violation(
                    "unclear_errors",
                    index,
                    format!("the error does not mention {m:?}: {} [{what}]", cut(&text)),
                );
            }
            if text.len() > MAX_ERROR_BYTES {
                report.violation(
                    "unclear_errors",
                    index,
                    format!("an error of {} bytes [{what}]", text.len()),
                );
            }
        }
    }
}

/// Runs the campaign.
pub fn run(plan: &Plan) -> Report {
    let mut report = Report::new(NAME, plan, COUNTERS);
    panics::install_hook();
    let dirs = match setup() {
        Ok(d) => d,
        Err(e) => {
            report.violation(
                "refused_wrongly",
                0,
                format!("cannot set up the fixtures: {e}"),
            );
            return report;
        }
    };
    for index in plan.indices() {
        if plan.out_of_time() {
            report.stopped_by_budget();
            break;
        }
        let mut rng = Rng::for_case(plan.seed, index);
        if rng.percent(80) {
            model_case(&dirs, &mut rng, plan, &mut report, index);
        } else {
            file_case(&dirs, &mut rng, plan, &mut report, index);
        }
        if let Some(what) = written(&dirs) {
            report.violation("wrote_files", index, what);
            // Clean up so later cases are judged on their own.
            let _ = std::fs::remove_dir_all(&dirs.untouched);
            let _ = std::fs::create_dir(&dirs.untouched);
            let _ = std::fs::remove_dir_all(RELATIVE);
        }
        report.case_done();
    }
    report
}
