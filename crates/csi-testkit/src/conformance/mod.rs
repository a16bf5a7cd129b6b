//! A conformance suite that checks any CSI plugin on a unix socket against the spec.
//!
//! The suite reads the plugin's capabilities first and runs only the checks they call for;
//! every other check is reported as skipped, naming the capability that is absent. It
//! checks, per RPC, that missing required fields are rejected with INVALID_ARGUMENT,
//! that unknown volumes, snapshots and nodes are answered NOT_FOUND, that mutating calls
//! are idempotent, that ListVolumes/ListSnapshots page correctly, that advertised RPCs work
//! and unadvertised ones answer UNIMPLEMENTED, and it walks a volume through the node
//! lifecycle on real staging and target directories. See [`Check`] for the full list.
//!
//! Everything the suite creates (volumes, snapshots, publications, directories) is
//! removed after each check, whatever its outcome; what could not be removed is listed in
//! [`Report::cleanup_problems`].
//!
//! The suite is for test environments: it creates and deletes volumes on the plugin's
//! backend. The scratch directory must be visible to the plugin at the same path.
//!
//! ```no_run
//! use csi_testkit::conformance::{self, Options};
//!
//! # async fn example() -> Result<(), conformance::Error> {
//! let report = conformance::run(Options::new("/run/csi/csi.sock", "/tmp/csi-conformance")).await?;
//! println!("{report}");
//! assert!(!report.failed());
//! # Ok(())
//! # }
//! ```

mod calls;
mod caps;
mod check;
mod checks;
mod ctx;
mod discover;
mod error;
mod options;
mod report;

use std::time::{SystemTime, UNIX_EPOCH};

pub use check::{Check, IDEMPOTENT_RPCS, NOT_FOUND_RPCS, PAGINATION_RPCS, REQUIRED_FIELDS_RPCS};
pub use error::Error;
pub use options::{DEFAULT_TIMEOUT, DEFAULT_VOLUME_SIZE, Options};
pub use report::{CheckOutcome, CheckResult, PluginIdentity, Report};

use ctx::{Ctx, Stop};

/// A connected conformance run, ready to check the plugin.
///
/// [`Suite::connect`] fails only when the plugin cannot be reached or the scratch directory
/// cannot be created; everything after that is a check outcome in the [`Report`].
#[derive(Debug)]
pub struct Suite {
    options: Options,
    channel: tonic::transport::Channel,
    checks: Vec<Check>,
}

impl Suite {
    /// Connects to the plugin's socket and prepares the scratch directory.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOption`] for a volume size below 1 byte, a zero timeout or a secret key
    /// the spec does not allow, [`Error::Connect`] when nothing accepts connections on the socket,
    /// [`Error::ScratchDir`] when the scratch directory cannot be created.
    pub async fn connect(options: Options) -> Result<Self, Error> {
        options.validate()?;
        std::fs::create_dir_all(&options.scratch_dir).map_err(|source| Error::ScratchDir {
            path: options.scratch_dir.clone(),
            source,
        })?;
        let channel = crate::transport::connect_unix(&options.socket)
            .await
            .map_err(|source| Error::Connect {
                socket: options.socket.clone(),
                source: Box::new(source),
            })?;
        Ok(Self {
            options,
            channel,
            checks: Check::all(),
        })
    }

    /// Runs only the checks for which `keep` answers true (the others are left out of the
    /// report, not skipped).
    #[must_use]
    pub fn only(mut self, keep: impl Fn(Check) -> bool) -> Self {
        self.checks.retain(|&check| keep(check));
        self
    }

    /// Runs every check in order and reports each outcome.
    pub async fn run(self) -> Report {
        let mut ctx = Ctx::new(self.options, self.channel, run_id());
        let mut report = Report::default();
        if let Err(err) = std::fs::create_dir_all(&ctx.run_dir) {
            report.cleanup_problems.push(format!(
                "cannot create {}: {err}; node checks will fail",
                ctx.run_dir.display()
            ));
        }
        ctx.discover().await;
        for check in self.checks {
            let outcome = match checks::run(&mut ctx, check).await {
                Ok(()) => CheckOutcome::Pass,
                Err(Stop::Fail(reason)) => CheckOutcome::Fail { reason },
                Err(Stop::Skip(reason)) => CheckOutcome::Skip { reason },
            };
            report.cleanup_problems.extend(ctx.clean_up().await);
            report.results.push(CheckResult { check, outcome });
        }
        if let Err(err) = std::fs::remove_dir_all(&ctx.run_dir) {
            report
                .cleanup_problems
                .push(format!("directory {}: {err}", ctx.run_dir.display()));
        }
        report.plugin = ctx.plugin.take();
        report
    }
}

/// Connects and runs every check: [`Suite::connect`] then [`Suite::run`].
///
/// # Errors
///
/// See [`Suite::connect`]; a misbehaving plugin is reported in the [`Report`], not here.
pub async fn run(options: Options) -> Result<Report, Error> {
    Ok(Suite::connect(options).await?.run().await)
}

/// A short id that keeps names and directories of concurrent runs apart.
fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos() ^ (elapsed.as_secs() as u32))
        .unwrap_or_default();
    format!("{:x}{:x}", std::process::id(), nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// Compile-only: a run can be spawned on a multi-threaded runtime.
    #[allow(dead_code, reason = "type-checked, never called")]
    fn futures_are_send(suite: Suite, options: Options) {
        assert_send(&suite.run());
        assert_send(&run(options));
        assert_send(&Suite::connect(Options::new("/a.sock", "/tmp")));
    }
}
