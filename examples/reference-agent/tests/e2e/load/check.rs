//! The checks after the run: what the clients were told against what the agent holds, and
//! what the agent holds against what the mock holds. Each returns its violations, one line
//! each, naming the claim, volume or path.

use std::collections::{BTreeMap, BTreeSet};

use csi_agent::ops::api::{ClaimView, StatusView, VolumeView};
use csi_testkit::{MockPlugin, NodePath};

use super::client::{Expect, Key};
use super::control::Control;
use super::{RELEASE_POLL, Volume};
use crate::serve::GUARD;

/// Waits until no release is in progress and none is stuck; returns every claim then, and a
/// violation if that does not happen within the hang guard.
pub(crate) async fn quiet(control: &Control) -> (Vec<ClaimView>, Vec<String>) {
    let guard = tokio::time::Instant::now() + GUARD;
    let mut last = String::new();
    while tokio::time::Instant::now() < guard {
        if let Ok(status) = control.get::<StatusView>("/v1/status").await {
            let busy = status
                .claims
                .iter()
                .any(|(state, n)| state != "taken" && *n > 0);
            if !busy
                && status.stuck.is_empty()
                && let Ok(all) = control.get::<Vec<VolumeView>>("/v1/volumes").await
            {
                return (all.into_iter().flat_map(|v| v.claims).collect(), Vec::new());
            }
            last = format!("claims {:?}, stuck {:?}", status.claims, status.stuck);
        }
        tokio::time::sleep(RELEASE_POLL * 5).await;
    }
    let all: Vec<VolumeView> = control.get("/v1/volumes").await.unwrap_or_default();
    (
        all.into_iter().flat_map(|v| v.claims).collect(),
        vec![format!(
            "releases still in progress after {GUARD:?}: {last}"
        )],
    )
}

/// The agent's claims after the run against what the clients were told: every held claim is
/// there and `taken`, nothing else is.
pub(crate) fn against_ledger(ledger: &[(Key, Expect)], claims: &[ClaimView]) -> Vec<String> {
    let mut out = Vec::new();
    let present: BTreeMap<Key, &ClaimView> = claims
        .iter()
        .map(|c| (Key::new(&c.volume, &c.workload), c))
        .collect();
    let expected: BTreeMap<&Key, Expect> = ledger.iter().map(|(k, e)| (k, *e)).collect();
    for (key, expect) in &expected {
        match (expect.is_held(), present.get(*key)) {
            (true, Some(c)) if c.state == "taken" => {}
            (true, Some(c)) => out.push(format!(
                "{expect:?} claim {key} is in state {} after the run, not taken",
                c.state
            )),
            (true, None) => out.push(format!("{expect:?} claim {key} is lost after the run")),
            (false, Some(c)) => out.push(format!(
                "claim {key} ({expect:?}) is still there after the run, state {}",
                c.state
            )),
            (false, None) => {}
        }
    }
    for (key, c) in &present {
        if !expected.contains_key(key) {
            out.push(format!(
                "claim {key} (state {}) was never asked for",
                c.state
            ));
        }
    }
    out
}

/// What the mock holds, read at once.
#[derive(Debug, Default)]
pub(crate) struct MockView {
    pub(crate) published: Vec<NodePath>,
    pub(crate) staged: Vec<NodePath>,
    /// The nodes each volume (by external id) is controller-published to, if any.
    pub(crate) attached: BTreeMap<String, Vec<String>>,
}

impl MockView {
    pub(crate) fn of(mock: &MockPlugin, volumes: &[Volume]) -> MockView {
        MockView {
            published: mock.published(),
            staged: mock.staged(),
            attached: volumes
                .iter()
                .map(|v| (v.external_id.clone(), mock.published_nodes(&v.external_id)))
                .filter(|(_, nodes)| !nodes.is_empty())
                .collect(),
        }
    }
}

/// The agent's claims after the run against the mock: every acknowledged claim held is
/// published at its target path, staged and attached; nothing is published but at a claim's
/// target path, and nothing is staged or attached without a claim on the volume. (A claim
/// found after an unknown outcome may or may not have been published before the kill.)
pub(crate) fn against_mock(
    ledger: &[(Key, Expect)],
    claims: &[ClaimView],
    mock: &MockView,
    volumes: &[Volume],
) -> Vec<String> {
    let mut out = Vec::new();
    let external = |id: &str| {
        volumes
            .iter()
            .find(|v| v.id == id)
            .map(|v| v.external_id.clone())
            .unwrap_or_default()
    };
    let published: BTreeSet<String> = mock
        .published
        .iter()
        .map(|p| p.path.display().to_string())
        .collect();
    let staged: BTreeSet<&str> = mock.staged.iter().map(|s| s.volume_id.as_str()).collect();
    let targets: BTreeSet<&str> = claims
        .iter()
        .filter_map(|c| c.target_path.as_deref())
        .collect();
    let claimed: BTreeSet<String> = claims.iter().map(|c| external(&c.volume)).collect();
    let acknowledged: BTreeSet<&Key> = ledger
        .iter()
        .filter(|(_, e)| *e == Expect::HeldAcknowledged)
        .map(|(k, _)| k)
        .collect();
    for c in claims {
        let key = Key::new(&c.volume, &c.workload);
        if !acknowledged.contains(&key) {
            continue;
        }
        let ext = external(&c.volume);
        match c.target_path.as_deref() {
            Some(target) if published.contains(target) => {}
            Some(target) => out.push(format!(
                "acknowledged claim {key} is not published by the mock at {target}"
            )),
            None => out.push(format!("acknowledged claim {key} has no target path")),
        }
        if !staged.contains(ext.as_str()) {
            out.push(format!(
                "acknowledged claim {key}: the mock does not stage {ext}"
            ));
        }
        if !mock.attached.contains_key(&ext) {
            out.push(format!(
                "acknowledged claim {key}: the mock does not attach {ext}"
            ));
        }
    }
    for p in &mock.published {
        let path = p.path.display().to_string();
        if !targets.contains(path.as_str()) {
            out.push(format!(
                "the mock publishes {} at {path}, the target of no claim",
                p.volume_id
            ));
        }
    }
    for s in &mock.staged {
        if !claimed.contains(&s.volume_id) {
            out.push(format!(
                "the mock stages {} at {} with no claim on it",
                s.volume_id,
                s.path.display()
            ));
        }
    }
    for (ext, nodes) in &mock.attached {
        if !claimed.contains(ext) {
            out.push(format!(
                "the mock attaches {ext} to {nodes:?} with no claim on it"
            ));
        }
    }
    out
}

/// What the agent still shows once every claim is freed.
pub(crate) fn agent_leftovers(status: &StatusView) -> Vec<String> {
    let mut out = Vec::new();
    if !status.claims.is_empty() {
        out.push(format!(
            "claims left after releasing every held one: {:?}",
            status.claims
        ));
    }
    if !status.stuck.is_empty() {
        out.push(format!("stuck releases at the end: {:?}", status.stuck));
    }
    if !status.uncertain.is_empty() {
        out.push(format!(
            "uncertain publications at the end: {:?}",
            status.uncertain
        ));
    }
    out
}

/// A claim as the agent shows it, for the checks' own tests.
pub(crate) fn claim_view(volume: &str, workload: &str, mode: &str, state: &str) -> ClaimView {
    ClaimView {
        volume: volume.into(),
        workload: workload.into(),
        node: "n1".into(),
        plugin_node: "n1".into(),
        mode: mode.into(),
        access_mode: "SINGLE_NODE_WRITER".into(),
        state: state.into(),
        target_path: Some(format!("/t/{volume}/{workload}")),
    }
}

#[test]
fn the_ledger_check_finds_lost_and_leftover_claims() {
    let k = |w: &str| Key::new("sw-0", w);
    let ledger = [
        (k("held"), Expect::HeldAcknowledged),
        (k("found"), Expect::HeldFound),
        (k("released"), Expect::Released),
        (k("refused"), Expect::Refused),
        (k("gone"), Expect::NotFound),
    ];
    let claims = [
        claim_view("sw-0", "held", "write", "taken"),
        claim_view("sw-0", "released", "write", "releasing"),
        claim_view("sw-0", "stranger", "write", "taken"),
    ];
    let found = against_ledger(&ledger, &claims);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(found[0].contains("sw-0/found") && found[0].contains("lost"));
    assert!(found[1].contains("sw-0/released") && found[1].contains("releasing"));
    assert!(found[2].contains("sw-0/stranger") && found[2].contains("never asked"));
    assert!(against_ledger(&ledger[..1], &claims[..1]).is_empty());
}

#[test]
fn the_mock_check_finds_missing_and_stray_publications() {
    use super::Access;
    let volumes = [
        Volume {
            id: "sw-0".into(),
            external_id: "vol-1".into(),
            access: Access::SingleWriter,
        },
        Volume {
            id: "mw-1".into(),
            external_id: "vol-2".into(),
            access: Access::MultiWriter,
        },
    ];
    let ledger = [
        (Key::new("sw-0", "a"), Expect::HeldAcknowledged),
        (Key::new("mw-1", "b"), Expect::HeldFound),
    ];
    let claims = [
        claim_view("sw-0", "a", "write", "taken"),
        claim_view("mw-1", "b", "write", "taken"),
    ];
    let path = |p: &str, v: &str| NodePath {
        volume_id: v.into(),
        path: p.into(),
    };
    let fine = MockView {
        published: vec![path("/t/sw-0/a", "vol-1")],
        staged: vec![path("/s/sw-0", "vol-1")],
        attached: [("vol-1".to_owned(), vec!["n1".to_owned()])].into(),
    };
    // The claim found after an unknown outcome need not be published.
    assert!(against_mock(&ledger, &claims, &fine, &volumes).is_empty());

    let wrong = MockView {
        published: vec![path("/t/sw-0/old", "vol-1")],
        staged: vec![path("/s/elsewhere", "vol-3")],
        attached: [("vol-3".to_owned(), vec!["n1".to_owned()])].into(),
    };
    let found = against_mock(&ledger, &claims, &wrong, &volumes);
    assert_eq!(found.len(), 6, "{found:#?}");
    for needle in [
        "not published by the mock at /t/sw-0/a",
        "does not stage vol-1",
        "does not attach vol-1",
        "publishes vol-1 at /t/sw-0/old",
        "stages vol-3",
        "attaches vol-3",
    ] {
        assert!(
            found.iter().any(|f| f.contains(needle)),
            "{needle}: {found:#?}"
        );
    }
}
