//! The result of a run: one outcome per check, plus anything cleanup could not undo.

use std::fmt;

use serde::Serialize;

use super::Check;

/// How one check ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum CheckOutcome {
    /// The plugin behaved as the spec demands.
    Pass,
    /// The plugin deviated from the spec.
    Fail {
        /// What was expected and what the plugin did.
        reason: String,
    },
    /// The check does not apply to this plugin.
    Skip {
        /// Why, naming the capability or service that is absent.
        reason: String,
    },
}

impl CheckOutcome {
    /// True for [`CheckOutcome::Fail`].
    pub fn is_fail(&self) -> bool {
        matches!(self, CheckOutcome::Fail { .. })
    }

    /// True for [`CheckOutcome::Pass`].
    pub fn is_pass(&self) -> bool {
        matches!(self, CheckOutcome::Pass)
    }

    /// True for [`CheckOutcome::Skip`].
    pub fn is_skip(&self) -> bool {
        matches!(self, CheckOutcome::Skip { .. })
    }

    /// The reason of a failure or a skip.
    pub fn reason(&self) -> Option<&str> {
        match self {
            CheckOutcome::Pass => None,
            CheckOutcome::Fail { reason } | CheckOutcome::Skip { reason } => Some(reason),
        }
    }
}

/// One check and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// Which check.
    pub check: Check,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: CheckOutcome,
}

/// Who the plugin said it was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PluginIdentity {
    /// `GetPluginInfoResponse.name`.
    pub name: String,
    /// `GetPluginInfoResponse.vendor_version`.
    pub vendor_version: String,
}

/// The result of a conformance run.
///
/// `Display` prints one line per check followed by a summary; `serde` gives JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The plugin's name and version, when GetPluginInfo answered.
    pub plugin: Option<PluginIdentity>,
    /// Every check, in run order.
    pub results: Vec<CheckResult>,
    /// Objects the suite created and could not remove (volume ids, snapshot ids, paths) with
    /// the error; these may need manual cleanup. They do not fail the run by themselves.
    pub cleanup_problems: Vec<String>,
}

impl Report {
    /// True when any check failed.
    pub fn failed(&self) -> bool {
        self.results.iter().any(|r| r.outcome.is_fail())
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.results.iter().filter(|r| r.outcome.is_fail())
    }

    /// The outcome of `check`, if it ran.
    pub fn outcome(&self, check: Check) -> Option<&CheckOutcome> {
        self.results
            .iter()
            .find(|r| r.check == check)
            .map(|r| &r.outcome)
    }

    /// Counts of (passed, failed, skipped) checks.
    pub fn counts(&self) -> (usize, usize, usize) {
        let pass = self.results.iter().filter(|r| r.outcome.is_pass()).count();
        let fail = self.results.iter().filter(|r| r.outcome.is_fail()).count();
        (pass, fail, self.results.len() - pass - fail)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(plugin) = &self.plugin {
            writeln!(f, "plugin {} {}", plugin.name, plugin.vendor_version)?;
        }
        let width = self
            .results
            .iter()
            .map(|r| r.check.id().len())
            .max()
            .unwrap_or(0);
        for result in &self.results {
            let id = result.check.id();
            match &result.outcome {
                CheckOutcome::Pass => {
                    writeln!(f, "PASS  {id:<width$}  {}", result.check.description())?
                }
                CheckOutcome::Fail { reason } => writeln!(f, "FAIL  {id:<width$}  {reason}")?,
                CheckOutcome::Skip { reason } => writeln!(f, "SKIP  {id:<width$}  {reason}")?,
            }
        }
        for problem in &self.cleanup_problems {
            writeln!(f, "LEAK  {problem}")?;
        }
        let (pass, fail, skip) = self.counts();
        write!(f, "{pass} passed, {fail} failed, {skip} skipped")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::Rpc;

    fn sample() -> Report {
        Report {
            plugin: Some(PluginIdentity {
                name: "mock.csi.example.com".into(),
                vendor_version: "1.0".into(),
            }),
            results: vec![
                CheckResult {
                    check: Check::Probe,
                    outcome: CheckOutcome::Pass,
                },
                CheckResult {
                    check: Check::RequiredFields(Rpc::CreateVolume),
                    outcome: CheckOutcome::Fail {
                        reason: "missing name: answered OK".into(),
                    },
                },
                CheckResult {
                    check: Check::Pagination(Rpc::ListSnapshots),
                    outcome: CheckOutcome::Skip {
                        reason: "controller capability LIST_SNAPSHOTS not advertised".into(),
                    },
                },
            ],
            cleanup_problems: vec![],
        }
    }

    #[test]
    fn one_line_per_check_and_a_summary() {
        let report = sample();
        let text = report.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines[1].starts_with("PASS  identity/probe"));
        assert!(
            lines[2].starts_with("FAIL  required-fields/CreateVolume")
                && lines[2].ends_with("answered OK")
        );
        assert!(lines[3].contains("LIST_SNAPSHOTS"));
        assert_eq!(lines[4], "1 passed, 1 failed, 1 skipped");
        assert!(report.failed());
        assert_eq!(report.failures().count(), 1);
    }

    #[test]
    fn json_names_checks_by_id() {
        let json = serde_json::to_value(sample()).unwrap_or_default();
        assert_eq!(json["results"][1]["check"], "required-fields/CreateVolume");
        assert_eq!(json["results"][1]["outcome"], "fail");
        assert_eq!(json["results"][0]["outcome"], "pass");
    }

    #[test]
    fn no_failure_means_not_failed() {
        let mut report = sample();
        report.results.retain(|r| !r.outcome.is_fail());
        assert!(!report.failed());
    }
}
