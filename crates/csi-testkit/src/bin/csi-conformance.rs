//! `csi-conformance`: check a CSI plugin on a unix socket against the spec.
//!
//! ```text
//! csi-conformance --endpoint unix:///run/csi/csi.sock [--staging-dir DIR] [--json]
//! ```
//!
//! Exit status: 0 when no check failed, 1 when any check failed, 2 for bad flags, a bad
//! endpoint, or a plugin that cannot be reached.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use csi_testkit::conformance::{self, Options};

/// Check a CSI plugin against the CSI spec. The plugin's backend must be a test backend:
/// the suite creates and deletes volumes and snapshots.
#[derive(Debug, Parser)]
#[command(name = "csi-conformance", version)]
struct Args {
    /// The plugin's socket: unix:///absolute/path/csi.sock.
    #[arg(long, env = "CSI_ENDPOINT")]
    endpoint: String,
    /// Directory for staging and target paths; must be visible to the plugin at the same path.
    /// Default: a `csi-conformance` directory in the system temp directory.
    #[arg(long, value_name = "DIR")]
    staging_dir: Option<PathBuf>,
    /// Print the report as JSON instead of one line per check.
    #[arg(long)]
    json: bool,
    /// Per-call deadline in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
    /// Size of test volumes in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = conformance::DEFAULT_VOLUME_SIZE,
          value_parser = clap::value_parser!(i64).range(1..))]
    volume_size: i64,
    /// A secret passed in every request that carries secrets (repeatable). Visible in the
    /// process list: use only test credentials.
    #[arg(long = "secret", value_name = "KEY=VALUE", value_parser = key_value)]
    secrets: Vec<(String, String)>,
    /// A CreateVolume parameter (repeatable).
    #[arg(long = "parameter", value_name = "KEY=VALUE", value_parser = key_value)]
    parameters: Vec<(String, String)>,
    /// An existing volume for the node lifecycle of a plugin that cannot create volumes.
    #[arg(long, value_name = "VOLUME_ID")]
    existing_volume: Option<String>,
    /// A ControllerModifyVolume mutable parameter (repeatable).
    #[arg(long = "mutable-parameter", value_name = "KEY=VALUE", value_parser = key_value)]
    mutable_parameters: Vec<(String, String)>,
}

fn key_value(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!(
            "expected KEY=VALUE with a non-empty KEY, got {raw:?}"
        )),
    }
}

/// Bad flags, endpoint or plugin socket.
const EXIT_USAGE: u8 = 2;
/// At least one check failed.
const EXIT_FAILED: u8 = 1;

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(err) => {
            // --help and --version are not errors.
            let code = if err.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let scratch = args
        .staging_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("csi-conformance"));
    let options = match Options::from_endpoint(&args.endpoint, scratch) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("csi-conformance: --endpoint: {err}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mut options = options
        .timeout(Duration::from_secs(args.timeout))
        .volume_size(args.volume_size);
    if let Some(volume_id) = args.existing_volume {
        options = options.existing_volume(volume_id);
    }
    for (key, value) in args.secrets {
        options = options.secret(key, value);
    }
    for (key, value) in args.parameters {
        options = options.parameter(key, value);
    }
    for (key, value) in args.mutable_parameters {
        options = options.mutable_parameter(key, value);
    }

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("csi-conformance: cannot start the async runtime: {err}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let report = match runtime.block_on(conformance::run(options)) {
        Ok(report) => report,
        Err(err) => {
            eprintln!("csi-conformance: {}", chain(&err));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(err) => {
                eprintln!("csi-conformance: cannot encode the report as JSON: {err}");
                return ExitCode::from(EXIT_FAILED);
            }
        }
    } else {
        println!("{report}");
    }
    if report.failed() {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// The error and its causes, joined with ": ".
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
