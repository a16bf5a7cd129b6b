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
//! | [`api`] | a hostile operator of the reference agent's control API |
//! | [`client`] | a hostile plugin under csi-client |
//! | [`crash`] | a process killed mid-write, and damaged files, against the durable stores and state files |
//!
//! A campaign is a function from a [`Plan`] to a [`Report`]; adding one is adding a module
//! and a line to [`CAMPAIGNS`].

pub mod api;
pub mod client;
pub mod config;
pub mod crash;
pub mod logs;
pub mod panics;
pub mod report;
pub mod rng;
pub mod shim;

use std::time::{Duration, Instant};

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
    Campaign {
        name: api::NAME,
        covers: api::COVERS,
        run: api::run,
    },
    Campaign {
        name: client::NAME,
        covers: client::COVERS,
        run: client::run,
    },
    Campaign {
        name: crash::NAME,
        covers: crash::COVERS,
        run: crash::run,
    },
];

/// The runtime a campaign runs its cases on: two worker threads, timers and I/O.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// What a run asks of every campaign in it.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The seed: the same seed runs the same cases.
    pub seed: u64,
    /// Cases per campaign (fewer when its share of the budget runs out first).
    pub cases: u64,
    /// Replay only this case.
    pub only_case: Option<u64>,
    /// The time budget of the whole run, shared evenly by the campaigns.
    pub budget: Duration,
    /// Print every case as it starts.
    pub verbose: bool,
}

/// Runs `campaigns` one after the other, each with an even share of what is left of the
/// budget, handing each report and its running time to `each` as it ends. Returns whether
/// every property held in every campaign.
pub fn run_all(
    campaigns: &[&Campaign],
    options: &RunOptions,
    mut each: impl FnMut(&Report, Duration),
) -> bool {
    let end = Instant::now() + options.budget;
    let mut clean = true;
    for (i, campaign) in campaigns.iter().enumerate() {
        let left = end.saturating_duration_since(Instant::now());
        let sharing = u32::try_from(campaigns.len() - i).unwrap_or(1);
        let plan = Plan {
            seed: options.seed,
            cases: options.cases,
            only_case: options.only_case,
            deadline: Instant::now() + left / sharing,
            verbose: options.verbose,
        };
        let started = Instant::now();
        let report = (campaign.run)(&plan);
        each(&report, started.elapsed());
        clean &= report.is_clean();
    }
    clean
}
