//! The reference CSI agent (`csi-agent`), composing every crate of csi-sdk.
//!
//! - [`demo`]: walk one volume through its whole life (create, claim, publish, write, release,
//!   delete) against the built-in csi-testkit mock or any external plugin.
//! - [`adapters`]: csi-claims' detacher traits implemented with csi-client.
//! - [`layout`]: where staging and publish paths live under the data directory.
//! - [`serve`], [`ops`]: the long-running agent and the operator commands; [`config`]: its
//!   configuration; [`metrics`]: its Prometheus metrics.

pub mod adapters;
pub mod config;
pub mod demo;
pub mod layout;
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
