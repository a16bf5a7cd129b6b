//! `csi-bench`: the load generator. See `benches/README.md` and the `csi_benches` crate docs.

use std::process::ExitCode;

use clap::Parser;
use csi_benches::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The crates' own log lines (a claim store's watch falling behind, say), to stderr, only
    // when asked for with RUST_LOG: the measured output stays one line per measurement.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("csi-bench: cannot find its own executable to re-run as a child: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&cli, &exe) {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            if let Some(line) = e.result_line() {
                println!("{line}");
            }
            eprint!("csi-bench: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                eprint!(": {cause}");
                source = cause.source();
            }
            eprintln!();
            ExitCode::FAILURE
        }
    }
}
