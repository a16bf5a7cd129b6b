//! `csi-bench`: the load generator. See `benches/README.md` and the `csi_benches` crate docs.

use std::process::ExitCode;

use clap::Parser;
use csi_benches::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
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
