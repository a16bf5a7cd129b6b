//! `csi-bench` output format and clean-up. These check fields and behaviour, never speed: the
//! numbers are only checked to be present, parseable and consistent (p50 <= p99).

use std::process::Command;

use clap::Parser;
use csi_benches::load::run_load;
use csi_benches::rpc::{BenchRpc, Given, Plan};
use csi_benches::{BenchError, Cli, Line, run};
use csi_client::{CsiClient, Endpoint};
use csi_testkit::MockPlugin;

const EXE: &str = env!("CARGO_BIN_EXE_csi-bench");

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("csi-bench").chain(args.iter().copied()))
        .expect("test flags parse")
}

fn check(line: &Line, client: &str, rpc: &str, n: u64, c: u32) {
    assert_eq!(line.client, client);
    assert_eq!(line.rpc, rpc);
    assert_eq!(line.n, n);
    assert_eq!(line.c, c);
    assert!(line.ops_per_s > 0.0, "{line}");
    assert!(line.p50_us > 0.0 && line.p50_us <= line.p99_us, "{line}");
}

#[test]
fn mock_probe_prints_one_parseable_line() {
    let lines = run(
        &cli(&["--mock", "--rpc", "probe", "-n", "200", "-c", "4"]),
        EXE.as_ref(),
    )
    .expect("a mock run succeeds");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let text = &lines[0];
    assert!(
        text.starts_with("client=csi-client rpc=probe n=200 c=4 ops_per_s="),
        "{text}"
    );
    let line: Line = text.parse().expect("the line parses back");
    check(&line, "csi-client", "probe", 200, 4);
}

#[test]
fn every_rpc_runs_against_the_mock() {
    for rpc in ["nodecaps", "validate", "publish"] {
        let lines = run(
            &cli(&[
                "--mock", "--rpc", rpc, "-n", "40", "-c", "2", "--warmup", "4",
            ]),
            EXE.as_ref(),
        )
        .unwrap_or_else(|e| panic!("rpc {rpc}: {e}"));
        let line: Line = lines[0].parse().expect("the line parses back");
        check(&line, "csi-client", rpc, 40, 2);
    }
}

#[test]
fn publish_cleans_up_what_it_made() {
    let rt = csi_benches::runtime().expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.sock");
        let plugin = MockPlugin::builder().build().expect("mock builds");
        let server = plugin.serve_unix(&path).await.expect("mock serves");
        let client = CsiClient::new(Endpoint::unix(&path).expect("endpoint"));
        let mut plan = Plan::prepare(&client, BenchRpc::Publish, 3, &Given::default())
            .await
            .expect("set-up creates one volume per caller");
        assert_eq!(plugin.volumes().len(), 3);
        let line = run_load(&client, &mut plan, 30, 3, 3).await.expect("load");
        assert_eq!(line.n, 30);
        // Callers draw call numbers from one counter, so on a busy machine one caller can
        // find them all taken before it runs: its volume is then never published.
        let published: Vec<usize> = plugin
            .volumes()
            .iter()
            .map(|v| plugin.published_nodes(&v.volume_id).len())
            .collect();
        assert!(
            published.iter().all(|&nodes| nodes <= 1),
            "a caller's volume is published on the one node at most: {published:?}"
        );
        assert!(
            published.iter().sum::<usize>() >= 1,
            "the calls published: {published:?}"
        );
        plan.clean_up(&client).await.expect("clean-up");
        assert!(plugin.volumes().is_empty(), "{:?}", plugin.volumes());
        server.shutdown().await.expect("mock stops");
    });
}

#[test]
fn a_given_volume_is_used_and_not_deleted() {
    let rt = csi_benches::runtime().expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.sock");
        let plugin = MockPlugin::builder()
            .volume("pre-1", 1 << 30)
            .build()
            .expect("mock builds");
        let server = plugin.serve_unix(&path).await.expect("mock serves");
        let client = CsiClient::new(Endpoint::unix(&path).expect("endpoint"));
        let given = Given {
            volume: Some("pre-1".into()),
            node: None,
        };
        let mut plan = Plan::prepare(&client, BenchRpc::Validate, 2, &given)
            .await
            .expect("a given volume needs no set-up");
        run_load(&client, &mut plan, 10, 2, 0).await.expect("load");
        plan.clean_up(&client).await.expect("clean-up");
        assert_eq!(plugin.volumes().len(), 1, "the given volume stays");
        let refused = Plan::prepare(&client, BenchRpc::Publish, 2, &given).await;
        assert!(
            matches!(
                refused,
                Err(BenchError::BadFlag {
                    flag: "volume-id",
                    ..
                })
            ),
            "{refused:?}"
        );
        server.shutdown().await.expect("mock stops");
    });
}

#[test]
fn binary_prints_baseline_and_memory_lines() {
    let out = Command::new(EXE)
        .args(["--baseline", "-n", "50", "--warmup", "5"])
        .output()
        .expect("csi-bench runs");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let line: Line = lines[0].parse().expect("baseline line parses");
    check(&line, "baseline", "pingpong", 50, 1);

    let out = Command::new(EXE)
        .args(["--mock", "--conn-memory", "5"])
        .output()
        .expect("csi-bench runs");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    for field in [
        "conn_memory connections=5 ",
        " server_bytes_per_conn=",
        " client_bytes_per_conn=",
    ] {
        assert!(text.contains(field), "{field} missing in {text}");
    }
}

#[test]
fn binary_fails_with_a_message_naming_the_flag() {
    let out = Command::new(EXE)
        .args(["--mock", "-n", "0"])
        .output()
        .expect("csi-bench runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--calls 0"), "{err}");
}

#[cfg(not(feature = "etcd"))]
#[test]
fn claims_etcd_without_the_feature_says_how_to_build() {
    let out = Command::new(EXE)
        .args(["--claims-etcd", "10", "--agents", "3"])
        .output()
        .expect("csi-bench runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--claims-etcd 10"), "{err}");
    assert!(err.contains("--features etcd"), "{err}");
}

#[test]
fn shim_hop_prints_three_lines_and_the_added_cost() {
    let lines = run(
        &cli(&["--shim-hop", "-n", "20", "--warmup", "2"]),
        EXE.as_ref(),
    )
    .expect("the hop run succeeds");
    let lines: Vec<&str> = lines.iter().flat_map(|l| l.lines()).collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    for (text, client) in lines.iter().zip(["csi-client", "shim-local", "shim-hop"]) {
        let line: Line = text.parse().expect("a hop line parses");
        check(&line, client, "controller_unpublish", 20, 1);
    }
    assert!(
        lines[3].starts_with("shim_hop added_p50_us=") && lines[3].contains(" target_max_us=150 "),
        "{}",
        lines[3]
    );
}

#[test]
fn compare_prints_the_floor_both_probes_and_the_ratio() {
    let lines = run(
        &cli(&["--mock", "--compare", "-n", "50", "--warmup", "5"]),
        EXE.as_ref(),
    )
    .expect("the compare run succeeds");
    assert_eq!(lines.len(), 5, "{lines:?}");
    for (text, (client, rpc)) in lines.iter().zip([
        ("baseline", "pingpong"),
        ("tonic", "probe"),
        ("hyper-h2", "probe"),
        ("csi-client", "probe"),
    ]) {
        let line: Line = text.parse().expect("a compare line parses");
        check(&line, client, rpc, 50, 1);
    }
    let summary = &lines[4];
    let ratio = summary
        .strip_prefix("compare probe_p50_over_baseline_p50=")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|r| r.parse::<f64>().ok());
    assert!(ratio.is_some_and(|r| r > 0.0), "{summary}");
    assert!(
        summary.contains(" hyper_h2_p50_over_baseline_p50="),
        "{summary}"
    );
    assert!(summary.contains(" target_max=4 met="), "{summary}");
    assert!(
        summary.contains(" runtime=multi-thread rounds=10 "),
        "{summary}"
    );

    // The same on one thread; 53 calls do not split evenly into the rounds.
    let lines = run(
        &cli(&[
            "--mock",
            "--compare",
            "-n",
            "53",
            "--warmup",
            "3",
            "--runtime",
            "current-thread",
        ]),
        EXE.as_ref(),
    )
    .expect("the compare run succeeds on a current-thread runtime");
    assert_eq!(lines.len(), 5, "{lines:?}");
    for text in &lines[..4] {
        let line: Line = text.parse().expect("a compare line parses");
        assert_eq!(line.n, 53, "{text}");
    }
    assert!(
        lines[4].contains(" runtime=current-thread "),
        "{}",
        lines[4]
    );
}

fn field(line: &str, name: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

#[test]
fn claims_lines_report_every_claim() {
    let lines = run(
        &cli(&["--claims-memory", "300", "--volumes", "10"]),
        EXE.as_ref(),
    )
    .expect("claims memory run");
    let line = &lines[0];
    assert!(line.starts_with("claims_memory "), "{line}");
    // Every claim made is held by the machine when memory is read.
    assert_eq!(field(line, "claims"), Some(300), "{line}");
    assert_eq!(field(line, "volumes"), Some(10), "{line}");
    assert!(field(line, "kib_per_10000_claims").is_some(), "{line}");

    let lines = run(
        &cli(&["--mock", "--claims-release", "100", "--volumes", "10"]),
        EXE.as_ref(),
    )
    .expect("claims release run");
    let line = &lines[0];
    assert!(line.starts_with("claims_release "), "{line}");
    assert_eq!(field(line, "claims"), Some(100), "{line}");
    // 10 claims per volume on 10 nodes: one node unpublish per claim, one unstage and one
    // controller unpublish per (volume, node) pair.
    assert_eq!(field(line, "plugin_calls"), Some(300), "{line}");
    assert!(field(line, "released_per_s").is_some(), "{line}");
}
