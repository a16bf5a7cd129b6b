//! [`Plan`]: what a campaign is asked to run; [`Report`]: what it counted, printed as one line.

use std::fmt;
use std::time::Instant;

/// What one campaign is asked to run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The run's seed; case `i` draws from [`Rng::for_case(seed, i)`](crate::rng::Rng::for_case).
    pub seed: u64,
    /// How many cases to run (fewer when the deadline comes first).
    pub cases: u64,
    /// Run only this case (a replay); `cases` is then ignored.
    pub only_case: Option<u64>,
    /// No new case starts after this moment.
    pub deadline: Instant,
    /// Print every case as it starts (to stderr).
    pub verbose: bool,
}

impl Plan {
    /// The case indices to run, in order.
    pub fn indices(&self) -> std::ops::Range<u64> {
        match self.only_case {
            Some(i) => i..i.saturating_add(1),
            None => 0..self.cases,
        }
    }

    /// Prints case `index` when the plan is verbose; `what` must never hold a secret.
    pub fn trace(&self, index: u64, what: impl fmt::Display) {
        if self.verbose {
            eprintln!("case={index} {what}");
        }
    }

    /// Whether the time budget is spent.
    pub fn out_of_time(&self) -> bool {
        Instant::now() >= self.deadline
    }
}

/// The most failure lines printed per counter; the counts keep counting after that.
const MAX_PRINTED: u64 = 20;

/// The counts of one campaign run. Every counter but `cases` counts violations: any of them
/// above zero makes the run fail.
#[derive(Debug)]
pub struct Report {
    campaign: &'static str,
    seed: u64,
    cases: u64,
    counters: Vec<(&'static str, u64)>,
    stopped_early: bool,
}

impl Report {
    /// An empty report of `campaign`, with its violation counters in the order they print.
    pub fn new(campaign: &'static str, plan: &Plan, counters: &[&'static str]) -> Self {
        Self {
            campaign,
            seed: plan.seed,
            cases: 0,
            counters: counters.iter().map(|c| (*c, 0)).collect(),
            stopped_early: false,
        }
    }

    /// One more case ran.
    pub fn case_done(&mut self) {
        self.cases += 1;
    }

    /// The time budget ended the run before every case ran.
    pub fn stopped_by_budget(&mut self) {
        self.stopped_early = true;
    }

    /// Case `case` broke the property `counter` counts. Prints a line naming the seed and the
    /// case, so it can be replayed alone; `what` must never hold a secret.
    pub fn violation(&mut self, counter: &'static str, case: u64, what: impl fmt::Display) {
        let n = match self.counters.iter_mut().find(|(name, _)| *name == counter) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.counters.push((counter, 1));
                1
            }
        };
        if n <= MAX_PRINTED {
            eprintln!(
                "FAIL campaign={} seed={} case={case} {counter}: {what}\n     replay: cargo run -p csi-campaigns -- --campaign {} --seed {} --only-case {case}",
                self.campaign, self.seed, self.campaign, self.seed
            );
        } else if n == MAX_PRINTED + 1 {
            eprintln!(
                "FAIL campaign={}: more {counter} failures, not printed (see the counts)",
                self.campaign
            );
        }
    }

    /// The value of `counter` (0 when it never fired).
    pub fn count(&self, counter: &str) -> u64 {
        self.counters
            .iter()
            .find(|(name, _)| *name == counter)
            .map_or(0, |(_, n)| *n)
    }

    /// How many cases ran.
    pub fn cases(&self) -> u64 {
        self.cases
    }

    /// Whether no property was broken.
    pub fn is_clean(&self) -> bool {
        self.counters.iter().all(|(_, n)| *n == 0)
    }
}

impl fmt::Display for Report {
    /// `campaign=NAME seed=S cases=N counter=0 ...`, plus `stopped=budget` when the time
    /// budget ended the run early.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "campaign={} seed={} cases={}",
            self.campaign, self.seed, self.cases
        )?;
        for (name, n) in &self.counters {
            write!(f, " {name}={n}")?;
        }
        if self.stopped_early {
            f.write_str(" stopped=budget")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_lists_every_counter_and_violations_fail_the_run() {
        let plan = Plan {
            seed: 9,
            cases: 3,
            only_case: None,
            deadline: Instant::now(),
            verbose: false,
        };
        let mut r = Report::new("demo", &plan, &["panics", "hangs"]);
        r.case_done();
        assert!(r.is_clean());
        assert_eq!(
            r.to_string(),
            "campaign=demo seed=9 cases=1 panics=0 hangs=0"
        );
        r.violation("hangs", 0, "a call outlived its deadline");
        assert!(!r.is_clean());
        assert_eq!(r.count("hangs"), 1);
        assert_eq!(
            r.to_string(),
            "campaign=demo seed=9 cases=1 panics=0 hangs=1"
        );
    }

    #[test]
    fn a_replay_runs_one_case() {
        let plan = Plan {
            seed: 1,
            cases: 100,
            only_case: Some(17),
            deadline: Instant::now(),
            verbose: false,
        };
        assert_eq!(plan.indices().collect::<Vec<_>>(), vec![17]);
    }
}
