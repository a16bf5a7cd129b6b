//! Opaque page tokens for `ListVolumes`, `ListSnapshots` and `ControllerListVolumeHealth`.
//!
//! A token names the first key of the next page. Lists are ordered by key, so a page is "every
//! key from the token on"; entries created or deleted between pages are seen or missed, which
//! the spec allows. A token the mock did not hand out answers ABORTED.

use std::collections::BTreeMap;
use std::ops::Bound;

use tonic::Status;

const PREFIX: &str = "mock-page:";

/// One page of a keyed list, and the token of the next page ("" when there is none).
///
/// # Errors
///
/// INVALID_ARGUMENT for a negative `max_entries`, ABORTED for a token this mock never issued.
pub(crate) fn page<'a, V>(
    map: &'a BTreeMap<String, V>,
    mut keep: impl FnMut(&V) -> bool,
    max_entries: i32,
    starting_token: &str,
) -> Result<(Vec<&'a V>, String), Status> {
    if max_entries < 0 {
        return Err(Status::invalid_argument(format!(
            "max_entries is {max_entries}; it must not be negative"
        )));
    }
    let start = if starting_token.is_empty() {
        Bound::Unbounded
    } else {
        let key = starting_token.strip_prefix(PREFIX).ok_or_else(|| {
            Status::aborted(format!(
                "starting_token {starting_token:?} was not issued by this plugin; list again \
                 from the start"
            ))
        })?;
        Bound::Included(key.to_string())
    };
    let limit = usize::try_from(max_entries).unwrap_or(0);
    let mut entries = Vec::new();
    let mut next = String::new();
    for (key, value) in map.range::<String, _>((start, Bound::Unbounded)) {
        if !keep(value) {
            continue;
        }
        if limit > 0 && entries.len() == limit {
            next = format!("{PREFIX}{key}");
            break;
        }
        entries.push(value);
    }
    Ok((entries, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_cover_everything_once() {
        let map: BTreeMap<String, u32> = (0..7).map(|i| (format!("k{i}"), i)).collect();
        let mut token = String::new();
        let mut seen = Vec::new();
        loop {
            let (entries, next) = page(&map, |_| true, 3, &token).unwrap();
            assert!(entries.len() <= 3);
            seen.extend(entries.into_iter().copied());
            if next.is_empty() {
                break;
            }
            token = next;
        }
        assert_eq!(seen, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn foreign_token_aborts_and_negative_max_is_invalid() {
        let map: BTreeMap<String, u32> = BTreeMap::new();
        assert_eq!(
            page(&map, |_| true, 0, "bogus").unwrap_err().code(),
            tonic::Code::Aborted
        );
        assert_eq!(
            page(&map, |_| true, -1, "").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
