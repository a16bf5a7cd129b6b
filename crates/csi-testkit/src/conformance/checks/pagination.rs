//! ListVolumes and ListSnapshots: paging with `max_entries` and `next_token`.

use std::collections::BTreeSet;

use csi_proto::Rpc;
use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use tonic::Code;

use crate::conformance::calls::{CallError, expect_code};
use crate::conformance::caps::gate_of;
use crate::conformance::ctx::{Ctx, Step, Stop, verdict};

/// Page size used for the walk: small enough that the objects the check creates span pages.
const PAGE: i32 = 2;
/// Extra pages allowed beyond what the listing size implies, before the walk is called endless.
const SLACK_PAGES: usize = 10;

pub(crate) async fn check(ctx: &mut Ctx, rpc: Rpc) -> Step {
    if let Some(gate) = gate_of(rpc) {
        ctx.require(gate)?;
    }
    match rpc {
        Rpc::ListVolumes => list_volumes(ctx).await,
        Rpc::ListSnapshots => list_snapshots(ctx).await,
        other => Err(Stop::skip(format!(
            "no pagination case for {}",
            other.name()
        ))),
    }
}

/// One page: the ids it listed and the token for the next.
struct Page {
    ids: Vec<String>,
    next_token: String,
}

/// What a walk through all pages saw.
struct Walk {
    ids: Vec<String>,
    problems: Vec<String>,
}

/// Follows `next_token` from the start until it is empty, checking each page's size.
///
/// `fetch(token, max_entries)` lists one page. The walk stops with a problem after
/// `max_pages` pages or when a token repeats.
async fn walk<F, Fut>(
    rpc: Rpc,
    max_entries: i32,
    max_pages: usize,
    mut fetch: F,
) -> Result<Walk, Stop>
where
    F: FnMut(String, i32) -> Fut,
    Fut: Future<Output = Result<Page, CallError>>,
{
    let mut walk = Walk {
        ids: Vec::new(),
        problems: Vec::new(),
    };
    let mut token = String::new();
    let mut seen_tokens = BTreeSet::new();
    for _ in 0..max_pages {
        let page = fetch(token.clone(), max_entries).await?;
        if max_entries > 0 && page.ids.len() > max_entries as usize {
            walk.problems.push(format!(
                "{} with max_entries {max_entries} returned {} entries",
                rpc.name(),
                page.ids.len()
            ));
        }
        walk.ids.extend(page.ids);
        if page.next_token.is_empty() {
            return Ok(walk);
        }
        if !seen_tokens.insert(page.next_token.clone()) {
            walk.problems.push(format!(
                "{} returned next_token {:?} twice",
                rpc.name(),
                page.next_token
            ));
            return Ok(walk);
        }
        token = page.next_token;
    }
    walk.problems.push(format!(
        "{} still returned a next_token after {max_pages} pages",
        rpc.name()
    ));
    Ok(walk)
}

async fn volume_page(
    ctx: &Ctx,
    starting_token: String,
    max_entries: i32,
) -> Result<Page, CallError> {
    let response = ctx
        .list_volumes(v1::ListVolumesRequest {
            max_entries,
            starting_token,
        })
        .await?;
    Ok(Page {
        ids: response
            .entries
            .into_iter()
            .map(|entry| entry.volume.map(|v| v.volume_id).unwrap_or_default())
            .collect(),
        next_token: response.next_token,
    })
}

fn snapshot_request(
    ctx: &Ctx,
    starting_token: String,
    max_entries: i32,
) -> v1::ListSnapshotsRequest {
    v1::ListSnapshotsRequest {
        max_entries,
        starting_token,
        secrets: ctx.secrets(),
        ..Default::default()
    }
}

async fn snapshot_page(ctx: &Ctx, request: v1::ListSnapshotsRequest) -> Result<Page, CallError> {
    let response = ctx.list_snapshots(request).await?;
    Ok(Page {
        ids: response
            .entries
            .into_iter()
            .map(|entry| entry.snapshot.map(|s| s.snapshot_id).unwrap_or_default())
            .collect(),
        next_token: response.next_token,
    })
}

/// Compares a paged walk with an unpaged one and with what the check created.
fn compare(rpc: Rpc, what: &str, full: &Walk, paged: &Walk, created: &[String]) -> Vec<String> {
    let mut problems = full.problems.clone();
    problems.extend(paged.problems.iter().cloned());
    if full.ids.iter().chain(&paged.ids).any(String::is_empty) {
        problems.push(format!(
            "{} returned an entry without a {what} id",
            rpc.name()
        ));
    }
    let paged_set: BTreeSet<&String> = paged.ids.iter().collect();
    let full_set: BTreeSet<&String> = full.ids.iter().collect();
    for id in created {
        if !full_set.contains(id) {
            problems.push(format!(
                "{} without max_entries does not list created {what} {id}",
                rpc.name()
            ));
        }
        if !paged_set.contains(id) {
            problems.push(format!(
                "{} walked with max_entries {PAGE} missed created {what} {id}",
                rpc.name()
            ));
        }
    }
    if created.is_empty() {
        let missed: Vec<&&String> = full_set.difference(&paged_set).collect();
        if !missed.is_empty() {
            problems.push(format!(
                "{} walked with max_entries {PAGE} missed {missed:?}",
                rpc.name()
            ));
        }
    }
    problems
}

async fn list_volumes(ctx: &mut Ctx) -> Step {
    let mut created = Vec::new();
    if ctx.caps.has_controller(CtrlCap::CreateDeleteVolume) {
        for _ in 0..ctx.options.page_volumes {
            created.push(ctx.new_volume().await?.volume_id);
        }
    }
    let ctx_ref: &Ctx = ctx;
    let full = walk(Rpc::ListVolumes, 0, SLACK_PAGES, |token, max| {
        volume_page(ctx_ref, token, max)
    })
    .await?;
    let max_pages = full.ids.len() / PAGE as usize + SLACK_PAGES;
    let paged = walk(Rpc::ListVolumes, PAGE, max_pages, |token, max| {
        volume_page(ctx_ref, token, max)
    })
    .await?;
    let mut problems = compare(Rpc::ListVolumes, "volume", &full, &paged, &created);

    if ctx.caps.has_controller(CtrlCap::ListVolumesPublishedNodes) {
        let listing = ctx.list_volumes(v1::ListVolumesRequest::default()).await?;
        if let Some(entry) = listing.entries.iter().find(|entry| entry.status.is_none()) {
            let id = entry
                .volume
                .as_ref()
                .map(|v| v.volume_id.as_str())
                .unwrap_or_default();
            problems.push(format!(
                "ListVolumes entry {id:?} has no status although LIST_VOLUMES_PUBLISHED_NODES is advertised"
            ));
        }
    }

    let bad_token = ctx.absent_id("token");
    let result = ctx
        .list_volumes(v1::ListVolumesRequest {
            max_entries: PAGE,
            starting_token: bad_token.clone(),
        })
        .await;
    if let Err(problem) = expect_code(
        result,
        Rpc::ListVolumes,
        Code::Aborted,
        &format!("starting_token {bad_token:?}"),
    ) {
        problems.push(problem);
    }

    if let Some(gone) = created.first() {
        ctx.delete_volume(v1::DeleteVolumeRequest {
            volume_id: gone.clone(),
            secrets: ctx.secrets(),
        })
        .await?;
        let ctx_ref: &Ctx = ctx;
        let after = walk(Rpc::ListVolumes, 0, max_pages, |token, max| {
            volume_page(ctx_ref, token, max)
        })
        .await?;
        if after.ids.contains(gone) {
            problems.push(format!(
                "ListVolumes still lists volume {gone} after DeleteVolume answered OK"
            ));
        }
    }
    verdict(problems)
}

async fn list_snapshots(ctx: &mut Ctx) -> Step {
    let mut created = Vec::new();
    let mut source = None;
    if ctx.caps.has_controller(CtrlCap::CreateDeleteSnapshot)
        && ctx.caps.has_controller(CtrlCap::CreateDeleteVolume)
    {
        let volume = ctx.new_volume().await?.volume_id;
        for _ in 0..ctx.options.page_volumes {
            created.push(ctx.new_snapshot(&volume).await?.snapshot_id);
        }
        source = Some(volume);
    }
    let ctx_ref: &Ctx = ctx;
    let fetch = |token, max| snapshot_page(ctx_ref, snapshot_request(ctx_ref, token, max));
    let full = walk(Rpc::ListSnapshots, 0, SLACK_PAGES, fetch).await?;
    let max_pages = full.ids.len() / PAGE as usize + SLACK_PAGES;
    let paged = walk(Rpc::ListSnapshots, PAGE, max_pages, fetch).await?;
    let mut problems = compare(Rpc::ListSnapshots, "snapshot", &full, &paged, &created);

    let bad_token = ctx.absent_id("token");
    let result = ctx
        .list_snapshots(snapshot_request(ctx, bad_token.clone(), PAGE))
        .await;
    if let Err(problem) = expect_code(
        result,
        Rpc::ListSnapshots,
        Code::Aborted,
        &format!("starting_token {bad_token:?}"),
    ) {
        problems.push(problem);
    }

    if let Some(first) = created.first() {
        let by_id = snapshot_page(
            ctx,
            v1::ListSnapshotsRequest {
                snapshot_id: first.clone(),
                ..snapshot_request(ctx, String::new(), 0)
            },
        )
        .await?;
        if by_id.ids != [first.clone()] {
            problems.push(format!(
                "ListSnapshots filtered by snapshot_id {first} returned {:?}",
                by_id.ids
            ));
        }
    }
    let absent = ctx.absent_id("snapshot");
    let none = snapshot_page(
        ctx,
        v1::ListSnapshotsRequest {
            snapshot_id: absent.clone(),
            ..snapshot_request(ctx, String::new(), 0)
        },
    )
    .await
    .map_err(|err| {
        Stop::fail(format!(
            "ListSnapshots filtered by unknown snapshot_id {absent}: {err}"
        ))
    })?;
    if !none.ids.is_empty() {
        problems.push(format!(
            "ListSnapshots filtered by unknown snapshot_id {absent} returned {:?}",
            none.ids
        ));
    }
    if let Some(volume) = source {
        let by_source = snapshot_page(
            ctx,
            v1::ListSnapshotsRequest {
                source_volume_id: volume.clone(),
                ..snapshot_request(ctx, String::new(), 0)
            },
        )
        .await?;
        let listed: BTreeSet<&String> = by_source.ids.iter().collect();
        let wanted: BTreeSet<&String> = created.iter().collect();
        if listed != wanted {
            problems.push(format!(
                "ListSnapshots filtered by source_volume_id {volume} returned {:?}, expected {:?}",
                by_source.ids, created
            ));
        }
    }
    verdict(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves `pages` in order: each call returns the next page, whatever token it got.
    fn scripted(
        pages: Vec<(Vec<&'static str>, &'static str)>,
    ) -> impl FnMut(String, i32) -> std::future::Ready<Result<Page, CallError>> {
        let mut pages = pages.into_iter();
        move |_token, _max| {
            let (ids, next) = pages.next().unwrap_or((vec![], ""));
            std::future::ready(Ok(Page {
                ids: ids.into_iter().map(String::from).collect(),
                next_token: next.to_owned(),
            }))
        }
    }

    fn run<T>(future: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime builds")
            .block_on(future)
    }

    #[test]
    fn a_correct_walk_sees_every_entry() {
        let fetch = scripted(vec![(vec!["a", "b"], "t1"), (vec!["c"], "")]);
        let seen =
            run(walk(Rpc::ListVolumes, 2, 10, fetch)).unwrap_or_else(|_| panic!("walk failed"));
        assert_eq!(seen.ids, ["a", "b", "c"]);
        assert!(seen.problems.is_empty());
    }

    #[test]
    fn oversized_pages_repeated_tokens_and_endless_walks_are_problems() {
        let fetch = scripted(vec![(vec!["a", "b", "c"], "")]);
        let seen =
            run(walk(Rpc::ListVolumes, 2, 10, fetch)).unwrap_or_else(|_| panic!("walk failed"));
        assert!(
            seen.problems[0].contains("max_entries 2 returned 3 entries"),
            "{:?}",
            seen.problems
        );

        let fetch = scripted(vec![(vec!["a"], "t1"), (vec!["b"], "t1")]);
        let seen =
            run(walk(Rpc::ListSnapshots, 1, 10, fetch)).unwrap_or_else(|_| panic!("walk failed"));
        assert!(
            seen.problems[0].contains("next_token \"t1\" twice"),
            "{:?}",
            seen.problems
        );

        let endless = |_token: String, _max: i32| {
            std::future::ready(Ok(Page {
                ids: vec!["x".into()],
                next_token: format!("t{}", _token.len()),
            }))
        };
        let seen =
            run(walk(Rpc::ListVolumes, 1, 3, endless)).unwrap_or_else(|_| panic!("walk failed"));
        assert!(!seen.problems.is_empty());
    }

    #[test]
    fn comparison_names_missed_entries() {
        let full = Walk {
            ids: vec!["a".into(), "b".into()],
            problems: vec![],
        };
        let paged = Walk {
            ids: vec!["a".into()],
            problems: vec![],
        };
        let problems = compare(Rpc::ListVolumes, "volume", &full, &paged, &["b".to_owned()]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("missed created volume b"));
        let problems = compare(Rpc::ListVolumes, "volume", &full, &paged, &[]);
        assert!(problems[0].contains("missed"), "{problems:?}");
        assert!(compare(Rpc::ListVolumes, "volume", &full, &full, &["a".to_owned()]).is_empty());
    }
}
