//! The seeded choices and the printed counts.

use std::collections::BTreeMap;
use std::time::Duration;

use super::client::Tally;
use super::watch::Watched;
use super::{Access, Volume};

/// SplitMix64: small, fast and good enough to spread choices; the same seed gives the same
/// sequence.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A number in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The `p`th percentile (nearest rank) of sorted durations, in milliseconds.
fn percentile_ms(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1].as_secs_f64() * 1000.0
}

/// Everything the run prints.
pub(crate) struct Report<'a> {
    pub(crate) settings_line: String,
    pub(crate) run_time: Duration,
    pub(crate) tallies: &'a [Tally],
    pub(crate) kills: &'a [Duration],
    pub(crate) final_kill: bool,
    pub(crate) held_at_end: usize,
    pub(crate) watched: &'a Watched,
    pub(crate) volumes: &'a [Volume],
}

fn sum(tallies: &[Tally], f: impl Fn(&Tally) -> u64) -> u64 {
    tallies.iter().map(f).sum()
}

fn merged(maps: impl Iterator<Item = BTreeMap<String, u64>>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for m in maps {
        for (k, n) in m {
            *out.entry(k).or_default() += n;
        }
    }
    out
}

fn pairs<K: std::fmt::Display>(map: &BTreeMap<K, u64>) -> String {
    map.iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl Report<'_> {
    pub(crate) fn print(&self) {
        let t = self.tallies;
        let taken = sum(t, |t| t.claims_taken);
        let refused = sum(t, |t| t.claims_refused);
        let failed = merged(t.iter().map(|t| t.claims_failed.clone()));
        let failed_n: u64 = failed.values().sum();
        let claims_unknown = sum(t, |t| t.claims_unknown);
        let released = sum(t, |t| t.releases_acknowledged);
        let release_failed = merged(t.iter().map(|t| t.releases_failed.clone()));
        let release_failed_n: u64 = release_failed.values().sum();
        let releases_unknown = sum(t, |t| t.releases_unknown);
        let acknowledged = taken + refused + failed_n + released + release_failed_n;
        let unknown = claims_unknown + releases_unknown;
        let secs = self.run_time.as_secs_f64();
        println!(
            "load: {} ran_s={secs:.1} acknowledged={acknowledged} unknown={unknown} \
             acknowledged_per_s={:.0}",
            self.settings_line,
            acknowledged as f64 / secs
        );
        println!(
            "load: claims taken={taken} refused={refused} failed={failed_n} [{}] unknown={claims_unknown} \
             (found_taken={} found_releasing={})",
            pairs(&failed),
            sum(t, |t| t.unknown_found_taken),
            sum(t, |t| t.unknown_found_releasing),
        );
        println!(
            "load: releases acknowledged={released} failed={release_failed_n} [{}] unknown={releases_unknown} \
             held_at_end={}",
            pairs(&release_failed),
            self.held_at_end
        );
        let at: Vec<String> = self
            .kills
            .iter()
            .map(|k| format!("{:.1}", k.as_secs_f64()))
            .collect();
        println!(
            "load: kills={} at_s=[{}] final_kill={}",
            self.kills.len(),
            at.join(","),
            if self.final_kill { "yes" } else { "no" }
        );
        let calls = &self.watched.calls;
        println!(
            "load: mock calls={} aborted={} [{}]",
            calls.total,
            calls.aborted_total(),
            pairs(&calls.aborted)
        );
        for access in Access::ALL {
            let mut all: Vec<Duration> = t
                .iter()
                .filter_map(|t| t.latency.get(&access))
                .flatten()
                .copied()
                .collect();
            all.sort();
            let count = self.volumes.iter().filter(|v| v.access == access).count();
            println!(
                "load: claim latency {} volumes={count} n={} p50_ms={:.1} p99_ms={:.1}",
                access.wire(),
                all.len(),
                percentile_ms(&all, 50),
                percentile_ms(&all, 99)
            );
        }
        println!(
            "load: samples agent={} mock={}",
            self.watched.agent_samples, self.watched.mock_samples
        );
    }
}

#[test]
fn percentiles_are_nearest_rank() {
    let ms: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
    assert_eq!(percentile_ms(&ms, 50), 50.0);
    assert_eq!(percentile_ms(&ms, 99), 99.0);
    assert_eq!(percentile_ms(&ms[..1], 99), 1.0);
    assert_eq!(percentile_ms(&[], 50), 0.0);
}

#[test]
fn the_same_seed_gives_the_same_choices() {
    let (mut a, mut b) = (Rng::new(7), Rng::new(7));
    let first: Vec<usize> = (0..32).map(|_| a.below(6)).collect();
    assert_eq!(first, (0..32).map(|_| b.below(6)).collect::<Vec<_>>());
    assert!(first.iter().any(|&x| x != first[0]), "{first:?}");
    assert!((0..1000).all(|_| (0.0..1.0).contains(&a.unit())));
}
