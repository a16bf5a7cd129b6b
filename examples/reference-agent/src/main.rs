//! `csi-agent`: the reference CSI orchestrator agent.
//!
//! This file only parses the command line, calls into the library and maps errors to exit
//! codes. Everything else lives in `csi_agent`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The reference CSI agent built from the csi-sdk crates.
#[derive(Debug, Parser)]
#[command(name = "csi-agent", version, about)]
struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Walk one volume through its whole life against the built-in mock plugin or a real one.
    Demo(csi_agent::demo::DemoArgs),
    /// Run the agent: discover plugins, track claims, release volumes.
    Serve(Box<csi_agent::serve::ServeArgs>),
    /// Inspect the plugins a running agent knows.
    Plugin(csi_agent::ops::PluginArgs),
    /// Manage volumes through a running agent.
    Volume(Box<csi_agent::ops::VolumeArgs>),
    /// Show a running agent's state, explaining every stuck release.
    Status(csi_agent::ops::StatusArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => exit(csi_agent::demo::run(args)),
        Command::Serve(args) => exit(csi_agent::serve::run(*args)),
        Command::Plugin(args) => exit(csi_agent::ops::plugin(args)),
        Command::Volume(args) => exit(csi_agent::ops::volume(*args)),
        Command::Status(args) => exit(csi_agent::ops::status(args)),
    }
}

/// Prints an error (if any) and turns it into the process exit code.
fn exit<E: std::fmt::Display + csi_agent::ExitStatus>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Errors quote plugins and peers: escaped, they cannot forge a line.
            eprintln!(
                "csi-agent: {}",
                csi_structs::untrusted::escaped(&error.to_string())
            );
            ExitCode::from(error.exit_code())
        }
    }
}
