//! Randomized bad-input campaigns against csi-sdk, with counts.
//!
//! Each campaign generates cases from a seed ([`rng::Rng`]), runs them against a crate of the
//! workspace in-process, checks properties that must hold for every input (no panic, every
//! call ends by its deadline, the error the contract prescribes, nothing reached or written
//! that should not be, no secret shown) and counts the violations ([`report::Report`]). The
//! same seed gives the same cases on every machine; a failing case prints its seed and index,
//! and `--only-case` replays it alone.
//!
//! The `csi-campaign` binary runs them:
//!
//! ```sh
//! cargo run --release -p csi-campaigns -- --seed 7 --cases 20000 --budget 10m
//! ```
//!
//! | campaign | against |
//! |---|---|
//! | [`shim`] | a hostile peer of csi-rpc-shim's agent server |
//! | [`config`] | a hostile operator of the reference agent's configuration |
//!
//! A campaign is a function from a [`Plan`] to a [`Report`]; adding one is adding a module
//! and a line to [`CAMPAIGNS`].

pub mod config;
pub mod logs;
pub mod panics;
pub mod report;
pub mod rng;
pub mod shim;

pub use report::{Plan, Report};

/// One campaign the binary can run.
#[derive(Clone, Copy, Debug)]
pub struct Campaign {
    /// Its name (`--campaign NAME`, and `campaign=NAME` in its report line).
    pub name: &'static str,
    /// What it covers, in a sentence.
    pub covers: &'static str,
    /// Runs it.
    pub run: fn(&Plan) -> Report,
}

/// Every campaign, in the order they run by default.
pub const CAMPAIGNS: &[Campaign] = &[
    Campaign {
        name: shim::NAME,
        covers: shim::COVERS,
        run: shim::run,
    },
    Campaign {
        name: config::NAME,
        covers: config::COVERS,
        run: config::run,
    },
];
