//! `csi-campaign`: runs the randomized bad-input campaigns and prints one line of counts per
//! campaign; exits 1 when any property was broken.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use csi_campaigns::{CAMPAIGNS, RunOptions, run_all};

/// Randomized bad-input campaigns against csi-sdk, deterministic from a seed.
#[derive(Debug, Parser)]
#[command(name = "csi-campaign")]
struct Cli {
    /// The seed: the same seed runs the same cases.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Cases per campaign (fewer when the budget runs out first).
    #[arg(long, default_value_t = 1000)]
    cases: u64,
    /// The time budget of the whole run, e.g. `90s`, `10m`, `2h`, shared evenly by the
    /// campaigns; no new case starts once a campaign's share is spent.
    #[arg(long, default_value = "10m", value_parser = parse_budget)]
    budget: Duration,
    /// Run only this campaign (repeatable; default: all).
    #[arg(long = "campaign", value_name = "NAME")]
    campaigns: Vec<String>,
    /// Replay one case, by the index a failure line printed (with the same seed).
    #[arg(long, value_name = "INDEX")]
    only_case: Option<u64>,
    /// Print every case as it starts.
    #[arg(long)]
    verbose: bool,
    /// List the campaigns and what each covers, then exit.
    #[arg(long)]
    list: bool,
}

/// `90s`, `10m`, `2h`: a whole number and a unit.
fn parse_budget(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or("expected a number with a unit: s, m or h (e.g. 90s)")?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: expected a number with a unit: s, m or h"))?;
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        _ => None,
    }
    .ok_or_else(|| format!("{text:?}: expected a number with a unit: s, m or h"))?;
    if secs == 0 {
        return Err("the budget must be more than zero".into());
    }
    Ok(Duration::from_secs(secs))
}

fn main() -> ExitCode {
    // The crash campaign runs its stores' writers in a child: this binary, so asked.
    if let Some(code) = csi_campaigns::crash::child_main() {
        return code;
    }
    let cli = Cli::parse();
    if cli.list {
        for c in CAMPAIGNS {
            println!("{}: {}", c.name, c.covers);
        }
        return ExitCode::SUCCESS;
    }
    let selected: Vec<_> = if cli.campaigns.is_empty() {
        CAMPAIGNS.iter().collect()
    } else {
        let mut v = Vec::new();
        for name in &cli.campaigns {
            match CAMPAIGNS.iter().find(|c| c.name == name) {
                Some(c) => v.push(c),
                None => {
                    let known: Vec<&str> = CAMPAIGNS.iter().map(|c| c.name).collect();
                    eprintln!("no campaign {name:?}; known: {}", known.join(", "));
                    return ExitCode::from(2);
                }
            }
        }
        v
    };
    let options = RunOptions {
        seed: cli.seed,
        cases: cli.cases,
        only_case: cli.only_case,
        budget: cli.budget,
        verbose: cli.verbose,
    };
    let clean = run_all(&selected, &options, |report, took| {
        println!("{report} elapsed={:.1}s", took.as_secs_f64());
    });
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
