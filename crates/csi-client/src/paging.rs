//! Every page of a paginated listing: `ListVolumes`, `ListSnapshots` and
//! `ControllerListVolumeHealth` ([`ControllerClient::list_all_volumes`] and its siblings).
//!
//! The listing follows `next_token` until the plugin answers with an empty one. Each page is
//! one call under the RPC's policy (deadline, retries), so a transient failure on page 40 is
//! retried as page 40, not from the start. Two plugin bugs would otherwise make a listing run
//! forever, and both become invalid responses: a `next_token` that repeats one the listing
//! already followed, and more than [`MAX_PAGES`] pages. A listing is also refused once its
//! pages hold more than [`MAX_LISTED_ENTRIES`] entries or [`MAX_LISTED_BYTES`] bytes in all,
//! so that what one listing keeps in memory is bounded whatever the plugin sends: at most
//! 256 MiB of pages as encoded, and a million entries.
//!
//! ABORTED on a later page means the plugin no longer accepts the token it handed out (the
//! list changed under it); the spec's answer is to list again from an empty `starting_token`.
//! A listing that started from the beginning does that itself, discarding what it gathered,
//! at most [`MAX_RESTARTS`] times; a listing the caller started mid-way returns the error.
//!
//! [`ControllerClient::list_all_volumes`]: crate::ControllerClient::list_all_volumes

use std::collections::HashSet;
use std::future::Future;

use csi_proto::v1 as pb;

use crate::error::{Error, ErrorKind, ResponseError};
use crate::policy::{Failure, classify_failure};
use crate::validate::CsiRequest;

/// Most pages one listing follows before it is refused as a plugin that never ends
/// (100,000 pages of the default page size is far beyond any real plugin's listing).
pub const MAX_PAGES: u32 = 100_000;

/// Most entries one listing gathers (far beyond any real cluster's volumes or snapshots).
pub const MAX_LISTED_ENTRIES: usize = 1_000_000;

/// Most bytes, as encoded on the wire, of all the pages of one listing.
pub const MAX_LISTED_BYTES: usize = 256 << 20;

/// Most times a listing starts over after ABORTED on a later page.
pub const MAX_RESTARTS: u32 = 3;

/// A list request and its answer: where the token goes and what a page holds.
pub(crate) trait Paged: CsiRequest {
    /// What the answer is.
    type Response: prost::Message;
    /// One entry of a page.
    type Entry;

    /// The request's `starting_token`.
    fn starting_token(&mut self) -> &mut String;

    /// A page's entries and its `next_token`.
    fn split(response: Self::Response) -> (Vec<Self::Entry>, String);
}

/// A list request whose token field is `starting_token` and whose answer holds `entries` and
/// `next_token` (all three paginated RPCs).
macro_rules! paged {
    ($($request:ty => $response:ty, $entry:ty;)*) => {$(
        impl Paged for $request {
            type Response = $response;
            type Entry = $entry;

            fn starting_token(&mut self) -> &mut String {
                &mut self.starting_token
            }

            fn split(response: $response) -> (Vec<$entry>, String) {
                (response.entries, response.next_token)
            }
        }
    )*};
}

paged! {
    pb::ListVolumesRequest => pb::ListVolumesResponse, pb::list_volumes_response::Entry;
    pb::ListSnapshotsRequest => pb::ListSnapshotsResponse, pb::list_snapshots_response::Entry;
    pb::ControllerListVolumeHealthRequest => pb::ControllerListVolumeHealthResponse, pb::VolumeHealth;
}

/// Calls `page` from `request`'s starting token until a page ends the listing, and returns
/// every entry in order. At most `max_pages` pages per pass.
pub(crate) async fn every_page<Req, F, Fut>(
    request: Req,
    max_pages: u32,
    page: F,
) -> Result<Vec<Req::Entry>, Error>
where
    Req: Paged,
    F: FnMut(Req) -> Fut,
    Fut: Future<Output = Result<Req::Response, Error>>,
{
    every_page_within(
        request,
        max_pages,
        (MAX_LISTED_ENTRIES, MAX_LISTED_BYTES),
        page,
    )
    .await
}

/// [`every_page`] with the entry and byte limits given.
async fn every_page_within<Req, F, Fut>(
    mut request: Req,
    max_pages: u32,
    (max_entries, max_bytes): (usize, usize),
    mut page: F,
) -> Result<Vec<Req::Entry>, Error>
where
    Req: Paged,
    F: FnMut(Req) -> Fut,
    Fut: Future<Output = Result<Req::Response, Error>>,
{
    let from_start = request.starting_token().is_empty();
    let mut restarts = 0;
    let mut entries = Vec::new();
    let mut followed = HashSet::new();
    let mut pages = 0;
    let mut bytes = 0usize;
    loop {
        pages += 1;
        let response = match page(request.clone()).await {
            Ok(response) => response,
            Err(e)
                if e.code() == Some(tonic::Code::Aborted)
                    && from_start
                    && pages > 1
                    && restarts < MAX_RESTARTS =>
            {
                tracing::debug!(
                    rpc = Req::RPC.name(),
                    pages,
                    "listing token refused, listing again"
                );
                restarts += 1;
                entries.clear();
                followed.clear();
                pages = 0;
                bytes = 0;
                request.starting_token().clear();
                continue;
            }
            Err(e) => return Err(e),
        };
        bytes = bytes.saturating_add(prost::Message::encoded_len(&response));
        let (mut more, next) = Req::split(response);
        entries.append(&mut more);
        let broken = if entries.len() > max_entries || bytes > max_bytes {
            Some(ResponseError::ListingTooLarge {
                entries: entries.len(),
                bytes,
                max_entries,
                max_bytes,
            })
        } else if next.is_empty() {
            return Ok(entries);
        } else if !followed.insert(next.clone()) {
            Some(ResponseError::RepeatedToken { page: pages })
        } else if pages >= max_pages {
            Some(ResponseError::TooManyPages { limit: max_pages })
        } else {
            None
        };
        if let Some(broken) = broken {
            let context = request.context();
            let class = classify_failure(context.rpc(), Failure::InvalidResponse);
            return Err(Error::new(
                context,
                ErrorKind::InvalidResponse(broken),
                class,
                1,
            ));
        }
        *request.starting_token() = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_structs::ErrorClass;

    fn volume(id: &str) -> pb::list_volumes_response::Entry {
        pb::list_volumes_response::Entry {
            volume: Some(pb::Volume {
                volume_id: id.into(),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// A fake plugin: the answer to each starting token.
    fn answer(token: &str, script: &[(&str, &str, &str)]) -> pb::ListVolumesResponse {
        let (_, id, next) = script
            .iter()
            .find(|(from, _, _)| *from == token)
            .expect("test invariant: the script covers every token followed");
        pb::ListVolumesResponse {
            entries: vec![volume(id)],
            next_token: (*next).into(),
        }
    }

    async fn list(
        script: &[(&str, &str, &str)],
        max_pages: u32,
    ) -> (Result<Vec<String>, Error>, Vec<String>) {
        let mut asked = Vec::new();
        let result = every_page(pb::ListVolumesRequest::default(), max_pages, |req| {
            asked.push(req.starting_token.clone());
            let page = answer(&req.starting_token, script);
            async move { Ok(page) }
        })
        .await
        .map(|entries| {
            entries
                .into_iter()
                .map(|e| e.volume.unwrap_or_default().volume_id)
                .collect()
        });
        (result, asked)
    }

    /// Lists `pages` pages of `per_page` entries each under the given entry and byte limits.
    async fn list_within(
        pages: usize,
        per_page: usize,
        limits: (usize, usize),
    ) -> Result<Vec<pb::list_volumes_response::Entry>, Error> {
        every_page_within(
            pb::ListVolumesRequest::default(),
            MAX_PAGES,
            limits,
            |req| {
                let at: usize = req.starting_token.parse().unwrap_or(0);
                let page = pb::ListVolumesResponse {
                    entries: (0..per_page)
                        .map(|i| volume(&format!("v{at}-{i}")))
                        .collect(),
                    next_token: if at + 1 < pages {
                        (at + 1).to_string()
                    } else {
                        String::new()
                    },
                };
                async move { Ok(page) }
            },
        )
        .await
    }

    #[tokio::test]
    async fn a_listing_is_refused_past_its_entries_or_bytes() {
        // Within both limits: every entry.
        let all = list_within(3, 10, (30, 1 << 20)).await.expect("within");
        assert_eq!(all.len(), 30);
        // One entry too many, on the last page.
        let err = list_within(3, 10, (29, 1 << 20))
            .await
            .expect_err("entries");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidResponse(ResponseError::ListingTooLarge {
                    entries: 30,
                    max_entries: 29,
                    ..
                })
            ),
            "{err:?}"
        );
        assert_eq!(err.class(), ErrorClass::Retry, "a read: retry");
        // Past the bytes, whatever the count: an entry of `v0-0` is 8 bytes encoded.
        let err = list_within(100, 1, (usize::MAX, 100))
            .await
            .expect_err("bytes");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidResponse(ResponseError::ListingTooLarge { max_bytes: 100, bytes, .. })
                    if *bytes > 100 && *bytes < 120
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn follows_tokens_until_an_empty_one() {
        let script = [("", "v1", "t1"), ("t1", "v2", "t2"), ("t2", "v3", "")];
        let (listed, asked) = list(&script, MAX_PAGES).await;
        assert_eq!(listed.unwrap(), ["v1", "v2", "v3"]);
        assert_eq!(asked, ["", "t1", "t2"]);
    }

    #[tokio::test]
    async fn a_token_that_comes_back_is_an_invalid_response_not_a_loop() {
        let script = [("", "v1", "t1"), ("t1", "v2", "t2"), ("t2", "v3", "t1")];
        let (listed, asked) = list(&script, MAX_PAGES).await;
        let err = listed.unwrap_err();
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidResponse(ResponseError::RepeatedToken { page: 3 })
            ),
            "{err:?}"
        );
        assert_eq!(err.rpc(), csi_proto::Rpc::ListVolumes);
        // An unusable answer to a read: the listing may be asked for again later.
        assert_eq!(err.class(), ErrorClass::Retry);
        assert_eq!(asked.len(), 3, "stopped at the repeat");
    }

    #[tokio::test]
    async fn aborted_on_a_later_page_lists_again_from_the_start() {
        let mut asked = Vec::new();
        let mut refusals = 2;
        let listed = every_page(pb::ListVolumesRequest::default(), MAX_PAGES, |req| {
            asked.push(req.starting_token.clone());
            let refuse = req.starting_token == "t1" && refusals > 0;
            if refuse {
                refusals -= 1;
            }
            let page = answer(&req.starting_token, &[("", "v1", "t1"), ("t1", "v2", "")]);
            async move { if refuse { Err(aborted()) } else { Ok(page) } }
        })
        .await
        .unwrap();
        let ids: Vec<_> = listed
            .into_iter()
            .map(|e| e.volume.unwrap_or_default().volume_id)
            .collect();
        assert_eq!(ids, ["v1", "v2"], "nothing from an abandoned pass is kept");
        assert_eq!(asked, ["", "t1", "", "t1", "", "t1"]);
    }

    #[tokio::test]
    async fn restarts_are_bounded_and_a_listing_started_mid_way_is_not_restarted() {
        let mut calls = 0;
        let err = every_page(pb::ListVolumesRequest::default(), MAX_PAGES, |req| {
            calls += 1;
            let page = (req.starting_token != "t1")
                .then(|| answer(&req.starting_token, &[("", "v1", "t1")]));
            async move { page.ok_or_else(aborted) }
        })
        .await
        .unwrap_err();
        assert_eq!(err.code(), Some(tonic::Code::Aborted));
        assert_eq!(calls, 2 * (MAX_RESTARTS + 1));

        let mut calls = 0;
        let mid_way = pb::ListVolumesRequest {
            starting_token: "t1".into(),
            ..Default::default()
        };
        let err = every_page(mid_way, MAX_PAGES, |_req| {
            calls += 1;
            async move { Err::<pb::ListVolumesResponse, _>(aborted()) }
        })
        .await
        .unwrap_err();
        assert_eq!(err.code(), Some(tonic::Code::Aborted));
        assert_eq!(calls, 1);
    }

    fn aborted() -> Error {
        Error::new(
            crate::error::CallContext::new(csi_proto::Rpc::ListVolumes),
            ErrorKind::Status {
                code: tonic::Code::Aborted,
                message: "bad starting_token".into(),
            },
            ErrorClass::Retry,
            1,
        )
    }

    #[tokio::test]
    async fn a_listing_that_never_ends_stops_at_the_page_limit() {
        let script = [
            ("", "v1", "t1"),
            ("t1", "v2", "t2"),
            ("t2", "v3", "t3"),
            ("t3", "v4", "t4"),
        ];
        let (listed, asked) = list(&script, 3).await;
        let err = listed.unwrap_err();
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidResponse(ResponseError::TooManyPages { limit: 3 })
            ),
            "{err:?}"
        );
        assert_eq!(asked.len(), 3);
    }
}
