//! The reference CSI agent (`csi-agent`), composing every crate of csi-sdk.
//!
//! - [`demo`]: walk one volume through its whole life (create, claim, expand, write, snapshot,
//!   release, delete) on csi-control's `ControlPlane`, against the built-in csi-testkit mock
//!   or any external plugin, one row per CSI call the library reports.
//! - The plugin manager, the volume manager, node paths, csi-claims' detachers and state files
//!   come from the `csi-node` crate, which an orchestrator embeds without this agent.
//! - [`serve`], [`ops`]: the long-running agent and the operator commands; [`config`]: its
//!   configuration; [`metrics`]: its Prometheus metrics.

pub mod config;
pub mod demo;
pub mod metrics;
pub mod ops;
pub mod serve;

/// The workspace README's Rust examples, compiled (and, unless marked `no_run`, run) as doctests
/// so the README cannot drift from the code.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// How an error of a subcommand maps to the process exit code.
pub trait ExitStatus {
    /// The exit code to use; never 0.
    fn exit_code(&self) -> u8;
}
