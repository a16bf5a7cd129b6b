//! `csi-bench --agent-claims` against the debug `csi-agent` and `csi-mock-plugin` binaries
//! that `cargo test --workspace` builds next to csi-bench. These check the line's fields and
//! the clean-up, never speed.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_csi-bench");

/// Every field of the line, in order, after `agent-claims`.
const FIELDS: [&str; 22] = [
    "clients",
    "secs",
    "volumes_per_client",
    "fs",
    "ops",
    "ops_per_s",
    "claim_p50_ms",
    "claim_p99_ms",
    "release_p50_ms",
    "release_p99_ms",
    "busy",
    "errors",
    "agent_cpu_ms_per_op",
    "mock_cpu_ms_per_op",
    "bench_cpu_ms_per_op",
    "agent_rss_mb_start",
    "agent_rss_mb_mid",
    "agent_rss_mb_end",
    "load1_start",
    "load1_end",
    "agent",
    "agent_args",
];

/// The fields that are not numbers (the load averages are, on Linux).
const TEXT_FIELDS: [&str; 3] = ["fs", "agent", "agent_args"];

/// The binaries the run starts must be next to csi-bench: `cargo test --workspace` builds
/// them there (csi-agent's and csi-testkit's tests need them), `cargo test -p csi-benches`
/// alone does not.
fn require_the_started_binaries() {
    for name in ["csi-agent", "csi-mock-plugin"] {
        let path = Path::new(EXE).with_file_name(name);
        assert!(
            path.is_file(),
            "{} is missing: run `cargo test --workspace`, which builds csi-agent and \
             csi-mock-plugin next to csi-bench (or `cargo build -p csi-agent -p csi-testkit \
             --bins` before `cargo test -p csi-benches`)",
            path.display()
        );
    }
}

/// The `key=value` fields of a line `agent-claims ...`, each once.
fn fields(line: &str) -> HashMap<&str, &str> {
    let mut parts = line.split(' ');
    assert_eq!(parts.next(), Some("agent-claims"), "{line}");
    let mut fields = HashMap::new();
    let mut keys = Vec::new();
    for part in parts {
        let (key, value) = part
            .split_once('=')
            .unwrap_or_else(|| panic!("{part:?} is not key=value in {line}"));
        assert!(fields.insert(key, value).is_none(), "{key} twice in {line}");
        keys.push(key);
    }
    assert_eq!(keys, FIELDS, "{line}");
    fields
}

fn number(fields: &HashMap<&str, &str>, key: &str) -> f64 {
    let value = fields[key];
    value
        .parse()
        .unwrap_or_else(|_| panic!("{key}={value} is not a number"))
}

/// The process id after `name` in csi-bench's progress line on stderr.
fn pid_after(stderr: &str, name: &str) -> u32 {
    stderr
        .split(name)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no {name:?} followed by a pid in stderr:\n{stderr}"))
}

#[test]
fn agent_claims_prints_one_line_with_every_field_and_cleans_up() {
    require_the_started_binaries();
    let base = tempfile::tempdir().expect("temp dir");
    let out = Command::new(EXE)
        .args([
            "--agent-claims",
            "--clients",
            "2",
            "--secs",
            "2",
            "--warmup-secs",
            "0",
            "--volumes-per-client",
            "2",
            // Passed on to the agent, and shown in the line.
            "--agent-arg=--controller-calls=2",
            "--dir",
        ])
        .arg(base.path())
        .output()
        .expect("csi-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line on stdout: {stdout}");
    let line = lines[0];
    let fields = fields(line);

    for key in FIELDS.iter().filter(|k| !TEXT_FIELDS.contains(k)) {
        let value = number(&fields, key);
        assert!(value >= 0.0, "{key}={value} in {line}");
    }
    assert_eq!(number(&fields, "clients"), 2.0, "{line}");
    assert_eq!(number(&fields, "secs"), 2.0, "{line}");
    assert_eq!(number(&fields, "volumes_per_client"), 2.0, "{line}");
    assert!(number(&fields, "ops") > 0.0, "{line}");
    assert_eq!(fields["agent_args"], "--controller-calls=2", "{line}");
    assert_eq!(number(&fields, "errors"), 0.0, "{line}");
    assert!(
        !fields["fs"].is_empty() && fields["fs"] != "unknown",
        "{line}"
    );
    assert!(
        number(&fields, "claim_p50_ms") <= number(&fields, "claim_p99_ms"),
        "{line}"
    );
    assert!(
        number(&fields, "release_p50_ms") <= number(&fields, "release_p99_ms"),
        "{line}"
    );
    assert!(number(&fields, "agent_rss_mb_start") > 0.0, "{line}");
    assert!(fields["agent"].ends_with("csi-agent"), "{line}");

    // Everything it started is gone: the processes reaped, their directory removed.
    for name in ["mock plugin pid ", "agent pid "] {
        let pid = pid_after(&stderr, name);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{name}{pid} still exists after the run"
        );
    }
    let left: Vec<_> = std::fs::read_dir(base.path())
        .expect("the base dir is readable")
        .collect();
    assert!(left.is_empty(), "left in --dir: {left:?}");
}

#[test]
fn a_missing_agent_binary_is_named_with_how_to_build_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("no-csi-agent");
    let out = Command::new(EXE)
        .args(["--agent-claims", "--agent-bin"])
        .arg(&missing)
        .output()
        .expect("csi-bench runs");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--agent-bin"), "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert!(
        err.contains("cargo build --release -p csi-agent -p csi-testkit"),
        "{err}"
    );
}

#[test]
fn bad_agent_claims_numbers_name_their_flag_and_limit() {
    for (args, wanted) in [
        (&["--clients", "0"][..], "--clients 0: must be 1..=10000"),
        (
            &["--clients", "10001"][..],
            "--clients 10001: must be 1..=10000",
        ),
        (&["--secs", "0"][..], "--secs 0: must be 1..=86400"),
        (
            &["--warmup-secs", "3601"][..],
            "--warmup-secs 3601: must be 0..=3600",
        ),
        (&["--volumes-per-client", "0"][..], "--volumes-per-client 0"),
    ] {
        let out = Command::new(EXE)
            .arg("--agent-claims")
            .args(args)
            .output()
            .expect("csi-bench runs");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(wanted), "{args:?}: {err}");
    }
}
