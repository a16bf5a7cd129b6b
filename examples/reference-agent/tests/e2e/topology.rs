//! Topology through `serve`: requirements sent with `CreateVolume` only to a plugin that takes
//! them, the volume's reachable topology kept, and a claim on a node outside it refused before
//! any plugin call, naming both.

use std::collections::BTreeMap;

use csi_agent::ops::api::{ClaimView, VolumeView};
use csi_client::Rpc;
use csi_testkit::MockPlugin;

use crate::serve::{cli, json, one_agent};

const ZONE: &str = "topology.example.com/zone";

fn zone(z: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(ZONE.to_owned(), z.to_owned())])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_keep_their_topology_and_claims_outside_it_are_refused() {
    // The plugin's node is in zone a (it then advertises VOLUME_ACCESSIBILITY_CONSTRAINTS).
    let mock = MockPlugin::builder()
        .topology(ZONE, "a")
        .volume("pre-1", 1 << 20)
        .build()
        .expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();

    let in_a: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "va",
            "--plugin",
            "mock",
            "--topology",
            &format!("{ZONE}=b"),
            "--topology",
            &format!("{ZONE}=a"),
            "--preferred-topology",
            &format!("{ZONE}=a"),
        ],
    )
    .await;
    assert_eq!(in_a.accessible_topology, [zone("a")]);
    let sent = mock
        .calls()
        .last(Rpc::CreateVolume)
        .expect("created")
        .request;
    assert!(
        sent.contains("accessibility_requirements: Some") && sent.contains("\"b\""),
        "{sent}"
    );
    let claim: ClaimView = json(&data, &["volume", "claim", "va", "--workload", "w1"]).await;
    assert_eq!(claim.state, "taken");

    // Registered as reachable from zone b only: a claim here is refused before any call.
    let registered: VolumeView = json(
        &data,
        &[
            "volume",
            "register",
            "vb",
            "--external-id",
            "pre-1",
            "--plugin",
            "mock",
            "--topology",
            &format!("{ZONE}=b"),
        ],
    )
    .await;
    assert_eq!(registered.accessible_topology, [zone("b")]);
    let shown = cli(&data, &["volume", "status", "vb"])
        .await
        .expect("status");
    assert!(
        shown.contains(&format!("reachable from: {{{ZONE}=b}}")),
        "{shown}"
    );
    let calls = mock.calls().snapshot().without_discovery().len();
    let refused = cli(&data, &["volume", "claim", "vb", "--workload", "w2"])
        .await
        .expect_err("outside the volume's topology");
    assert!(
        refused.contains(&format!("reachable from {{{ZONE}=b}} only"))
            && refused.contains(&format!("is at {{{ZONE}=a}}")),
        "names both topologies: {refused}"
    );
    assert_eq!(
        mock.calls().snapshot().without_discovery().len(),
        calls,
        "no plugin call but discovery"
    );
    let vb: VolumeView = json(&data, &["volume", "status", "vb"]).await;
    assert!(vb.claims.is_empty(), "nothing recorded: {vb:?}");

    // Bad topology input is refused naming the flag or field; nothing reaches the plugin.
    let creates = mock.calls().count(Rpc::CreateVolume);
    let (in_a, spaced, in_c) = (
        format!("{ZONE}=a"),
        format!("{ZONE}=a b"),
        format!("{ZONE}=c"),
    );
    for (flags, named) in [
        (vec!["--topology", "zone"], "--topology"),
        (vec!["--topology", &spaced], "requisite_topology"),
        (
            vec!["--topology", &in_a, "--preferred-topology", &in_c],
            "preferred",
        ),
    ] {
        let mut args = vec!["volume", "create", "vx", "--plugin", "mock"];
        args.extend(flags);
        let bad = cli(&data, &args).await.expect_err("refused");
        assert!(bad.contains(named), "{args:?}: {bad}");
    }
    assert_eq!(mock.calls().count(Rpc::CreateVolume), creates);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_without_topology_gets_no_requirement() {
    let mock = MockPlugin::builder()
        .build()
        .expect("mock without topology");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let refused = cli(
        &data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "mock",
            "--topology",
            &format!("{ZONE}=a"),
        ],
    )
    .await
    .expect_err("the plugin takes no topology");
    assert!(
        refused.contains("VOLUME_ACCESSIBILITY_CONSTRAINTS"),
        "{refused}"
    );
    assert_eq!(mock.calls().count(Rpc::CreateVolume), 0);
    // Without requirements the volume is reachable from everywhere, this node included.
    let v: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    assert!(v.accessible_topology.is_empty(), "{v:?}");
    let claim: ClaimView = json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    assert_eq!(claim.state, "taken");
}
