//! `csi-bench --claims-etcd` against a real etcd (Debian's `etcd-server`; `etcd` on the PATH).
//! Run with `cargo test -p csi-benches --features etcd --test claims_etcd`. These check that
//! the three lines are present, well formed and consistent with each other, never speed.
#![cfg(feature = "etcd")]

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use clap::Parser;
use csi_benches::etcd_process::EtcdProcess;
use csi_benches::{Cli, run};

const EXE: &str = env!("CARGO_BIN_EXE_csi-bench");

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("csi-bench").chain(args.iter().copied()))
        .expect("test flags parse")
}

/// The fields of a line `<name> key=value ...`: every field a number but `duty` (`fenced` or
/// `unfenced`, which must be `duty`), none twice.
fn fields(line: &str, name: &str, duty: &str) -> HashMap<String, f64> {
    let mut parts = line.split(' ');
    assert_eq!(parts.next(), Some(name), "{line}");
    let mut fields = HashMap::new();
    for part in parts {
        let (key, value) = part
            .split_once('=')
            .unwrap_or_else(|| panic!("{part:?} is not key=value in {line}"));
        if key == "duty" {
            assert_eq!(value, duty, "{line}");
            assert!(
                fields.insert(key.to_owned(), 0.0).is_none(),
                "duty twice in {line}"
            );
            continue;
        }
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("{key}={value} is not a number in {line}"));
        assert!(value >= 0.0, "{key}={value} in {line}");
        assert!(
            fields.insert(key.to_owned(), value).is_none(),
            "{key} twice in {line}"
        );
    }
    fields
}

fn get(fields: &HashMap<String, f64>, key: &str) -> f64 {
    *fields
        .get(key)
        .unwrap_or_else(|| panic!("no {key}= in {fields:?}"))
}

/// Checks the three lines of a run of `claims` claims over `volumes` volumes from `agents`
/// agents with `callers` callers each, agent 0 holding the controller duty `duty`
/// (`--etcd-duty`), which the claim and release lines name.
fn check_lines(lines: &[String], claims: f64, volumes: f64, agents: f64, callers: f64, duty: &str) {
    assert_eq!(lines.len(), 3, "{lines:?}");
    let claim = fields(&lines[0], "claims_etcd_claim", duty);
    let memory = fields(&lines[1], "claims_etcd_memory", duty);
    let release = fields(&lines[2], "claims_etcd_release", duty);
    assert!(lines[0].contains(&format!(" duty={duty} ")), "{lines:?}");
    assert!(lines[2].contains(&format!(" duty={duty} ")), "{lines:?}");
    assert!(!lines[1].contains("duty="), "{lines:?}");
    for (line, wanted) in [
        (
            &claim,
            vec![
                "agents",
                "duty",
                "claims",
                "volumes",
                "callers_per_agent",
                "claim_ms",
                "claims_per_s",
                "retries",
                "etcd_writes",
            ],
        ),
        (
            &memory,
            vec![
                "claims",
                "volumes",
                "rss_before_kib",
                "rss_after_kib",
                "bytes_per_claim",
                "kib_per_10000_claims",
            ],
        ),
        (
            &release,
            vec![
                "agents",
                "duty",
                "claims",
                "released",
                "volumes",
                "volume_nodes",
                "release_ms",
                "released_per_s",
                "retries",
                "freed_in_other_state",
                "node_unpublish",
                "node_unstage",
                "controller_unpublish",
                "etcd_writes",
            ],
        ),
    ] {
        let mut keys: Vec<&str> = line.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut wanted = wanted;
        wanted.sort_unstable();
        assert_eq!(keys, wanted, "{lines:?}");
    }

    // The run is the one asked for.
    assert_eq!(get(&claim, "agents"), agents);
    assert_eq!(get(&claim, "claims"), claims);
    assert_eq!(get(&claim, "volumes"), volumes);
    assert_eq!(get(&claim, "callers_per_agent"), callers);
    assert!(get(&claim, "claims_per_s") > 0.0, "{lines:?}");
    // Every volume's record was written at least once.
    assert!(get(&claim, "etcd_writes") >= volumes, "{lines:?}");

    // The agent that loaded the records holds every claim.
    assert_eq!(get(&memory, "claims"), claims, "{lines:?}");
    assert_eq!(get(&memory, "volumes"), volumes);
    assert!(get(&memory, "rss_before_kib") > 0.0, "{lines:?}");

    // Every claim was freed; every step ran at least once (a step repeated after a lost
    // compare-and-swap is allowed: the calls are idempotent).
    assert_eq!(get(&release, "agents"), agents);
    assert_eq!(get(&release, "claims"), claims);
    assert_eq!(get(&release, "released"), claims, "{lines:?}");
    assert_eq!(get(&release, "volumes"), volumes);
    assert!(get(&release, "released_per_s") > 0.0, "{lines:?}");
    assert!(get(&release, "freed_in_other_state") <= claims, "{lines:?}");
    let pairs = get(&release, "volume_nodes");
    assert_eq!(pairs, volumes * agents.min(claims / volumes), "{lines:?}");
    assert!(get(&release, "node_unpublish") >= claims, "{lines:?}");
    assert!(get(&release, "node_unstage") >= pairs, "{lines:?}");
    assert!(get(&release, "controller_unpublish") >= pairs, "{lines:?}");
    // At least the release of every claim and the deletion of every record.
    assert!(get(&release, "etcd_writes") >= volumes, "{lines:?}");
}

/// The default `--etcd-duty fenced`: agent 0 wins the election before the claims and every
/// controller step goes through the fence; the run completes and says so.
#[test]
fn three_agents_through_an_etcd_the_bench_starts() {
    let lines = run(
        &cli(&[
            "--claims-etcd",
            "200",
            "--volumes",
            "10",
            "--agents",
            "3",
            "-c",
            "4",
        ]),
        EXE.as_ref(),
    )
    .expect("the etcd run succeeds (needs etcd on the PATH: apt-get install etcd-server)");
    check_lines(&lines, 200.0, 10.0, 3.0, 4.0, "fenced");
}

/// `--etcd-duty unfenced`: agent 0 holds the duty from the start, as the bench did before
/// issue 30.
#[test]
fn three_agents_with_an_unfenced_controller_duty() {
    let lines = run(
        &cli(&[
            "--claims-etcd",
            "200",
            "--volumes",
            "10",
            "--agents",
            "3",
            "-c",
            "4",
            "--etcd-duty",
            "unfenced",
        ]),
        EXE.as_ref(),
    )
    .expect("the etcd run succeeds (needs etcd on the PATH: apt-get install etcd-server)");
    check_lines(&lines, 200.0, 10.0, 3.0, 4.0, "unfenced");
}

#[test]
fn one_agent_through_a_given_etcd_leaves_no_key_behind() {
    let etcd = EtcdProcess::start().expect("etcd starts");
    let endpoint = etcd.endpoint().to_owned();
    let rt = csi_benches::runtime().expect("runtime");
    let client = rt.block_on(async {
        for _ in 0..300 {
            if let Ok(mut client) = etcd_client::Client::connect([&endpoint], None).await
                && client.get("/", None).await.is_ok()
            {
                return client;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("etcd did not answer within 30 s");
    });

    let out = Command::new(EXE)
        .args(["--claims-etcd", "50", "--volumes", "5", "-c", "2"])
        .args(["--etcd-endpoints", &endpoint])
        .output()
        .expect("csi-bench runs");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    // Fenced by default: the election's key goes with the rest.
    check_lines(&lines, 50.0, 5.0, 1.0, 2.0, "fenced");

    let left = rt.block_on(async {
        let mut client = client;
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_keys_only();
        client
            .get("/csi-bench/", Some(options))
            .await
            .expect("etcd answers")
            .kvs()
            .len()
    });
    assert_eq!(left, 0, "the bench's keys are gone");
    etcd.stop();
}
