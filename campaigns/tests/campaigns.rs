//! CI's campaign run: every campaign on seed 1, 2,000 cases each, within 100 seconds.
//!
//! `.ci/run` runs it with `cargo test --workspace --locked --test campaigns -- --ignored
//! --nocapture`, on the workspace's test build (a `cargo run -p csi-campaigns` there would
//! build the whole stack again, without the tests' dependency features). It is the same run
//! as `cargo run -p csi-campaigns -- --seed 1 --cases 2000 --budget 100s`.

use std::time::Duration;

use csi_campaigns::{CAMPAIGNS, RunOptions, run_all};

#[test]
#[ignore = "CI's campaign step: cargo test --workspace --test campaigns -- --ignored --nocapture"]
fn every_campaign_on_seed_1_keeps_every_property() {
    // The crash campaign's children are the campaign binary, not this test.
    csi_campaigns::crash::set_child_program(env!("CARGO_BIN_EXE_csi-campaign"));
    let options = RunOptions {
        seed: 1,
        cases: 2000,
        only_case: None,
        budget: Duration::from_secs(100),
        verbose: false,
    };
    let all: Vec<_> = CAMPAIGNS.iter().collect();
    let mut lines = Vec::new();
    let clean = run_all(&all, &options, |report, took| {
        let line = format!("{report} elapsed={:.1}s", took.as_secs_f64());
        println!("{line}");
        lines.push(line);
    });
    assert!(
        clean,
        "a property was broken (failures above):\n{}",
        lines.join("\n")
    );
}
