//! Per-volume claim accounting from the access mode.
//!
//! One claim is one workload, and one workload is one publication: one target path on the
//! claim's node (csi-node's layout gives each workload its own). The accounting admits exactly
//! what a plugin that follows the spec accepts, so that every refusal comes before a plugin
//! call. The spec's multiplicity rules (csi-spec §4.5, and the tables of
//! `ControllerPublishVolume` and of a second `NodePublishVolume`):
//!
//! - several nodes (`ControllerPublishVolume` to a second node) only with `MULTI_NODE_*`; a
//!   plugin answers `FAILED_PRECONDITION` otherwise;
//! - several target paths on one node only with `MULTI_NODE_*` and
//!   `SINGLE_NODE_MULTI_WRITER`; a plugin answers `FAILED_PRECONDITION` to a second target path
//!   otherwise, so in every other mode a volume has one workload at a time.
//!
//! Every claim that is not yet freed holds capacity, including claims whose release has
//! started: capacity comes back only when a claim is freed. The rules, per access mode:
//!
//! | access mode | who may hold the volume at once | a second claim is denied with |
//! |---|---|---|
//! | `SINGLE_NODE_WRITER` | one workload (a writer or a reader) | [`DenyReason::SingleWorkload`] |
//! | `SINGLE_NODE_READER_ONLY` | one workload, a reader | [`DenyReason::SingleWorkload`] |
//! | `SINGLE_NODE_SINGLE_WRITER` | one workload (a writer or a reader) | [`DenyReason::SingleWorkload`] |
//! | `SINGLE_NODE_MULTI_WRITER` | any workloads, writers and readers, all on one node | [`DenyReason::OtherNode`] |
//! | `MULTI_NODE_READER_ONLY` | any readers on any nodes, never a writer | (writers: [`DenyReason::ReadOnlyMode`]) |
//! | `MULTI_NODE_SINGLE_WRITER` | at most one writer and any readers, on any nodes | [`DenyReason::WritersExhausted`] |
//! | `MULTI_NODE_MULTI_WRITER` | any workloads on any nodes | — |
//!
//! Two denials go beyond what a plugin can refuse, because the spec gives it no means to:
//! a write claim on a `*_READER_ONLY` volume ([`DenyReason::ReadOnlyMode`]; it would be
//! published read-only, so the workload could not write) and a second writer on a
//! `MULTI_NODE_SINGLE_WRITER` volume ([`DenyReason::WritersExhausted`]; every claim there is
//! controller-published read-write, and the spec states no refusal for a second writer). They
//! keep the mode's meaning, and they too come before any plugin call.
//!
//! Across all modes: every claim on a volume uses the same access mode and the same
//! attachment mode (a claim cannot change either while the volume is claimed), and claiming
//! again with the same workload and the same terms is idempotent.
//!
//! ```
//! use csi_claims::accounting::{admit, Admission, DenyReason};
//! use csi_claims::{ClaimMode, ClaimRequest};
//! use csi_structs::{AccessMode, AccessTypeKind, NodeId, PluginNodeId, VolumeId, WorkloadId};
//!
//! let request = ClaimRequest {
//!     volume: VolumeId::new("db").unwrap(),
//!     workload: WorkloadId::new("web-1").unwrap(),
//!     node: NodeId::new("n1").unwrap(),
//!     plugin_node: PluginNodeId::new("i-1").unwrap(),
//!     mode: ClaimMode::Write,
//!     access_mode: AccessMode::MultiNodeReaderOnly,
//!     attachment: AccessTypeKind::Mount,
//! };
//! let denied = admit(&[], &request).unwrap_err();
//! assert_eq!(denied.reason, DenyReason::ReadOnlyMode);
//! assert!(denied.to_string().contains("volume db"));
//!
//! let read = ClaimRequest { mode: ClaimMode::Read, ..request };
//! assert_eq!(admit(&[], &read).unwrap(), Admission::New);
//! ```

use std::fmt;

use csi_structs::{AccessMode, AccessTypeKind, ErrorClass, NodeId, VolumeId, WorkloadId};

use crate::model::{Claim, ClaimMode, ClaimRequest};

/// What [`admit`] decided for an acceptable request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// A new claim; record it.
    New,
    /// The workload already holds exactly this claim; nothing changes.
    AlreadyHeld,
}

/// Why a claim was denied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DenyReason {
    /// A write claim on a `*_READER_ONLY` volume.
    ReadOnlyMode,
    /// Every writer slot of the access mode is held.
    WritersExhausted {
        /// How many writers the access mode allows.
        max: usize,
    },
    /// The access mode allows a single workload per volume (`SINGLE_NODE_WRITER`,
    /// `SINGLE_NODE_READER_ONLY`, `SINGLE_NODE_SINGLE_WRITER`: one target path on one node),
    /// and another workload holds the volume, on this node or another.
    SingleWorkload,
    /// A `SINGLE_NODE_MULTI_WRITER` volume is held from another node.
    OtherNode {
        /// The node the volume is held from.
        held_on: NodeId,
    },
    /// The volume is held with another access mode.
    AccessModeChange {
        /// The access mode the volume is held with.
        held: AccessMode,
    },
    /// The volume is held with another attachment mode (a claim cannot change the attachment
    /// mode of a claimed volume).
    AttachmentModeChange {
        /// The attachment mode the volume is held with.
        held: AccessTypeKind,
    },
    /// The workload already holds the volume on different terms (node, plugin node, mode,
    /// access mode or attachment mode). Release it first.
    ReclaimWithDifferentTerms,
    /// The workload's earlier claim is being released; capacity comes back once it is freed.
    ReleaseInProgress {
        /// The state the earlier claim is in.
        state: &'static str,
    },
}

impl DenyReason {
    /// What the caller should do about the denial: [`ErrorClass::Retry`] when waiting can
    /// help (the holders may release the volume), [`ErrorClass::Fatal`] when the request
    /// itself must change (a write claim on a read-only mode, a claim again on other terms).
    pub fn class(&self) -> ErrorClass {
        match self {
            DenyReason::WritersExhausted { .. }
            | DenyReason::SingleWorkload
            | DenyReason::OtherNode { .. }
            | DenyReason::AccessModeChange { .. }
            | DenyReason::AttachmentModeChange { .. }
            | DenyReason::ReleaseInProgress { .. } => ErrorClass::Retry,
            DenyReason::ReadOnlyMode | DenyReason::ReclaimWithDifferentTerms => ErrorClass::Fatal,
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::ReadOnlyMode => f.write_str("the access mode is read-only"),
            DenyReason::WritersExhausted { max } => {
                write!(f, "writer claims exhausted (at most {max})")
            }
            DenyReason::SingleWorkload => f.write_str(
                "the access mode allows a single workload per volume and another one holds it",
            ),
            DenyReason::OtherNode { held_on } => {
                write!(
                    f,
                    "single-node access mode and the volume is held on node {held_on}"
                )
            }
            DenyReason::AccessModeChange { held } => {
                write!(
                    f,
                    "the volume is held with access mode {}",
                    held.wire_name()
                )
            }
            DenyReason::AttachmentModeChange { held } => write!(
                f,
                "cannot change the attachment mode of a claimed volume (held as {held})"
            ),
            DenyReason::ReclaimWithDifferentTerms => {
                f.write_str("the workload already holds the volume on different terms")
            }
            DenyReason::ReleaseInProgress { state } => {
                write!(
                    f,
                    "the workload's earlier claim is being released (state {state})"
                )
            }
        }
    }
}

/// One current holder of a volume, as named in a denial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The holding workload.
    pub workload: WorkloadId,
    /// Its node.
    pub node: NodeId,
    /// Read or write.
    pub mode: ClaimMode,
    /// The holder's claim state (`taken`, `releasing`, …).
    pub state: &'static str,
}

/// The holders of a volume; prints as `[w1 (write on n1, taken), …]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holders(pub Vec<Holder>);

impl fmt::Display for Holders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, h) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} ({} on {}, {})", h.workload, h.mode, h.node, h.state)?;
        }
        f.write_str("]")
    }
}

/// A claim the access mode does not allow, naming the volume, the request and the holders.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "claim by workload {workload} on volume {volume} for {mode} ({access}) denied: {reason}; holders: {holders}",
    access = access_mode.wire_name()
)]
pub struct ClaimDenied {
    /// The volume.
    pub volume: VolumeId,
    /// The workload that asked.
    pub workload: WorkloadId,
    /// The mode it asked for.
    pub mode: ClaimMode,
    /// The access mode it asked for.
    pub access_mode: AccessMode,
    /// Why it was denied.
    pub reason: DenyReason,
    /// Who holds the volume now.
    pub holders: Holders,
}

/// Decides whether `request` may join `claims` (every not-yet-freed claim on the volume).
///
/// Pure: reads nothing but its arguments.
///
/// # Errors
///
/// [`ClaimDenied`] when the access mode, the attachment mode or the workload's own earlier
/// claim forbids the request.
pub fn admit(claims: &[Claim], request: &ClaimRequest) -> Result<Admission, ClaimDenied> {
    let deny = |reason: DenyReason| ClaimDenied {
        volume: request.volume.clone(),
        workload: request.workload.clone(),
        mode: request.mode,
        access_mode: request.access_mode,
        reason,
        holders: Holders(
            claims
                .iter()
                .map(|c| Holder {
                    workload: c.workload.clone(),
                    node: c.node.clone(),
                    mode: c.mode,
                    state: c.state.name(),
                })
                .collect(),
        ),
    };

    if let Some(own) = claims.iter().find(|c| c.workload == request.workload) {
        return if own.state.is_releasing() {
            Err(deny(DenyReason::ReleaseInProgress {
                state: own.state.name(),
            }))
        } else if own.same_terms(request) {
            Ok(Admission::AlreadyHeld)
        } else {
            Err(deny(DenyReason::ReclaimWithDifferentTerms))
        };
    }

    if let Some(first) = claims.first() {
        if first.access_mode != request.access_mode {
            return Err(deny(DenyReason::AccessModeChange {
                held: first.access_mode,
            }));
        }
        if first.attachment != request.attachment {
            return Err(deny(DenyReason::AttachmentModeChange {
                held: first.attachment,
            }));
        }
    }

    let writing = request.mode == ClaimMode::Write;
    if writing && request.access_mode.is_read_only() {
        return Err(deny(DenyReason::ReadOnlyMode));
    }
    let access = request.access_mode;
    // One target path per node, and (these modes being all SINGLE_NODE_*) one node: a single
    // workload, wherever it runs.
    if !access.allows_multiple_publications_per_node() && !claims.is_empty() {
        return Err(deny(DenyReason::SingleWorkload));
    }
    // One node (SINGLE_NODE_MULTI_WRITER, the single-node mode with several workloads).
    if access.is_single_node()
        && let Some(c) = claims.iter().find(|c| c.node != request.node)
    {
        return Err(deny(DenyReason::OtherNode {
            held_on: c.node.clone(),
        }));
    }
    // One writer (MULTI_NODE_SINGLE_WRITER, the mode's meaning; the spec gives the plugin no
    // refusal for it).
    if writing
        && !access.allows_multiple_writers()
        && claims.iter().any(|c| c.mode == ClaimMode::Write)
    {
        return Err(deny(DenyReason::WritersExhausted { max: 1 }));
    }
    Ok(Admission::New)
}

/// The releasing claims that are all that stands in the way of `request`: [`admit`] refuses
/// it over `claims` (every not-yet-freed claim on the volume) and would admit it once the
/// claims being released are freed. Names those of them that refuse it on their own (the
/// workload's own earlier claim, a releasing writer holding the one writer slot, the one
/// workload of a single-workload volume, ...).
///
/// `None` when `request` is admitted now, or when waiting cannot help: a claim that is not
/// releasing refuses it, or the request itself does (a write on a read-only access mode).
/// A caller may then wait for the named claims to be freed and decide again.
///
/// Pure: reads nothing but its arguments.
///
/// ```
/// use csi_claims::accounting::{admit, releases_in_the_way};
/// use csi_claims::{Claim, ClaimMode, ClaimRequest};
/// use csi_structs::{AccessMode, AccessTypeKind, NodeId, PluginNodeId, VolumeId, WorkloadId};
///
/// let write = ClaimRequest {
///     volume: VolumeId::new("db").unwrap(),
///     workload: WorkloadId::new("web-1").unwrap(),
///     node: NodeId::new("n1").unwrap(),
///     plugin_node: PluginNodeId::new("i-1").unwrap(),
///     mode: ClaimMode::Write,
///     access_mode: AccessMode::MultiNodeReaderOnly,
///     attachment: AccessTypeKind::Mount,
/// };
/// // Refused on its own terms (a write on a read-only access mode): waiting cannot help.
/// let none: [Claim; 0] = [];
/// assert!(admit(&none, &write).is_err());
/// assert_eq!(releases_in_the_way(&none, &write), None);
/// ```
pub fn releases_in_the_way<'a>(
    claims: &'a [Claim],
    request: &ClaimRequest,
) -> Option<Vec<&'a Claim>> {
    if admit(claims, request).is_ok() {
        return None;
    }
    let (releasing, staying): (Vec<&Claim>, Vec<&Claim>) =
        claims.iter().partition(|c| c.state.is_releasing());
    if releasing.is_empty() {
        return None;
    }
    let staying: Vec<Claim> = staying.into_iter().cloned().collect();
    admit(&staying, request).ok()?;
    let alone_in_the_way: Vec<&Claim> = releasing
        .iter()
        .copied()
        .filter(|r| {
            let mut with = staying.clone();
            with.push((*r).clone());
            admit(&with, request).is_err()
        })
        .collect();
    // Only several of them together refuse it: they are all in the way.
    Some(if alone_in_the_way.is_empty() {
        releasing
    } else {
        alone_in_the_way
    })
}

#[cfg(test)]
mod tests {
    use csi_structs::PluginNodeId;

    use super::*;
    use crate::state::ClaimState;

    fn req(workload: &str, node: &str, mode: ClaimMode, access: AccessMode) -> ClaimRequest {
        ClaimRequest {
            volume: VolumeId::new("v").unwrap(),
            workload: WorkloadId::new(workload).unwrap(),
            node: NodeId::new(node).unwrap(),
            plugin_node: PluginNodeId::new(format!("sp-{node}")).unwrap(),
            mode,
            access_mode: access,
            attachment: AccessTypeKind::Mount,
        }
    }

    /// Admits `steps` in order, keeping the admitted ones, and returns each verdict.
    fn run(
        access: AccessMode,
        steps: &[(&str, &str, ClaimMode)],
    ) -> Vec<Result<Admission, DenyReason>> {
        let mut held: Vec<Claim> = Vec::new();
        steps
            .iter()
            .map(|(w, n, m)| {
                let r = req(w, n, *m, access);
                match admit(&held, &r) {
                    Ok(Admission::New) => {
                        held.push(Claim::taken(r));
                        Ok(Admission::New)
                    }
                    Ok(a) => Ok(a),
                    Err(d) => Err(d.reason),
                }
            })
            .collect()
    }

    use ClaimMode::{Read as R, Write as W};
    const NEW: Result<Admission, DenyReason> = Ok(Admission::New);

    fn single() -> Result<Admission, DenyReason> {
        Err(DenyReason::SingleWorkload)
    }

    fn other_node(node: &str) -> Result<Admission, DenyReason> {
        Err(DenyReason::OtherNode {
            held_on: NodeId::new(node).unwrap(),
        })
    }

    const READ_ONLY: Result<Admission, DenyReason> = Err(DenyReason::ReadOnlyMode);
    const ONE_WRITER: Result<Admission, DenyReason> = Err(DenyReason::WritersExhausted { max: 1 });

    /// Each mode against the same sequences: a second workload on the same node (reader,
    /// writer), one on another node, and which of them the spec's plugin would take.
    #[test]
    fn every_access_mode() {
        use AccessMode::*;
        let same_node = [("a", "n1", W), ("b", "n1", R), ("c", "n1", W)];
        let reader_first = [("a", "n1", R), ("b", "n1", R), ("c", "n1", W)];
        let other_nodes = [
            ("a", "n1", R),
            ("b", "n2", R),
            ("c", "n3", W),
            ("d", "n1", W),
        ];
        type Want = [Result<Admission, DenyReason>; 3];
        let table: [(AccessMode, Want, Want); 7] = [
            (
                SingleNodeWriter,
                [NEW, single(), single()],
                [NEW, single(), single()],
            ),
            (
                SingleNodeReaderOnly,
                [READ_ONLY, NEW, READ_ONLY],
                [NEW, single(), READ_ONLY],
            ),
            (
                SingleNodeSingleWriter,
                [NEW, single(), single()],
                [NEW, single(), single()],
            ),
            (SingleNodeMultiWriter, [NEW, NEW, NEW], [NEW, NEW, NEW]),
            (
                MultiNodeReaderOnly,
                [READ_ONLY, NEW, READ_ONLY],
                [NEW, NEW, READ_ONLY],
            ),
            (
                MultiNodeSingleWriter,
                [NEW, NEW, ONE_WRITER],
                [NEW, NEW, NEW],
            ),
            (MultiNodeMultiWriter, [NEW, NEW, NEW], [NEW, NEW, NEW]),
        ];
        for (access, on_one_node, reader_then_writer) in table {
            assert_eq!(run(access, &same_node), on_one_node, "{access}: same node");
            assert_eq!(
                run(access, &reader_first),
                reader_then_writer,
                "{access}: reader first"
            );
        }
        let across: [(AccessMode, [Result<Admission, DenyReason>; 4]); 7] = [
            (SingleNodeWriter, [NEW, single(), single(), single()]),
            (SingleNodeReaderOnly, [NEW, single(), READ_ONLY, READ_ONLY]),
            (SingleNodeSingleWriter, [NEW, single(), single(), single()]),
            (
                SingleNodeMultiWriter,
                [NEW, other_node("n1"), other_node("n1"), NEW],
            ),
            (MultiNodeReaderOnly, [NEW, NEW, READ_ONLY, READ_ONLY]),
            (MultiNodeSingleWriter, [NEW, NEW, NEW, ONE_WRITER]),
            (MultiNodeMultiWriter, [NEW, NEW, NEW, NEW]),
        ];
        for (access, want) in across {
            assert_eq!(run(access, &other_nodes), want, "{access}: across nodes");
        }
    }

    #[test]
    fn single_node_single_writer_is_one_workload_per_volume() {
        let held = [Claim::taken(req(
            "a",
            "n1",
            W,
            AccessMode::SingleNodeSingleWriter,
        ))];
        let denied = admit(
            &held,
            &req("b", "n1", R, AccessMode::SingleNodeSingleWriter),
        )
        .unwrap_err();
        assert_eq!(denied.reason, DenyReason::SingleWorkload);
        let text = denied.to_string();
        assert!(text.contains("single workload per volume"), "{text}");
        assert!(text.contains("SINGLE_NODE_SINGLE_WRITER"), "{text}");
        assert!(text.contains("a (write on n1, taken)"), "{text}");
    }

    #[test]
    fn same_workload_is_idempotent_but_cannot_change_terms() {
        let got = run(
            AccessMode::MultiNodeMultiWriter,
            &[
                ("a", "n1", W),
                ("a", "n1", W),
                ("a", "n1", R),
                ("a", "n2", W),
            ],
        );
        assert_eq!(
            got,
            [
                NEW,
                Ok(Admission::AlreadyHeld),
                Err(DenyReason::ReclaimWithDifferentTerms),
                Err(DenyReason::ReclaimWithDifferentTerms)
            ]
        );
    }

    #[test]
    fn releasing_claims_still_hold_capacity_and_block_their_workload() {
        let mut a = Claim::taken(req("a", "n1", W, AccessMode::MultiNodeSingleWriter));
        a.state = ClaimState::Releasing;
        let held = [a];
        let denied =
            admit(&held, &req("b", "n2", W, AccessMode::MultiNodeSingleWriter)).unwrap_err();
        assert_eq!(denied.reason, DenyReason::WritersExhausted { max: 1 });
        assert!(
            denied.to_string().contains("a (write on n1, releasing)"),
            "{denied}"
        );
        let denied =
            admit(&held, &req("a", "n1", W, AccessMode::MultiNodeSingleWriter)).unwrap_err();
        assert_eq!(
            denied.reason,
            DenyReason::ReleaseInProgress { state: "releasing" }
        );
    }

    fn releasing(r: ClaimRequest) -> Claim {
        let mut c = Claim::taken(r);
        c.state = ClaimState::Releasing;
        c
    }

    fn names(claims: Option<Vec<&Claim>>) -> Option<Vec<&str>> {
        claims.map(|cs| cs.iter().map(|c| c.workload.as_str()).collect())
    }

    #[test]
    fn releases_in_the_way_are_named_only_when_they_alone_refuse() {
        use AccessMode::{MultiNodeSingleWriter as Mnsw, SingleNodeWriter as Snw};
        // The workload's own earlier claim.
        let held = [releasing(req("a", "n1", W, Snw))];
        assert_eq!(
            names(releases_in_the_way(&held, &req("a", "n1", W, Snw))),
            Some(vec!["a"])
        );
        // Another workload's releasing claim holding the capacity; a releasing reader
        // beside a releasing writer is not in the way of a writer.
        let held = [
            releasing(req("a", "n1", W, Mnsw)),
            releasing(req("b", "n2", R, Mnsw)),
            Claim::taken(req("c", "n3", R, Mnsw)),
        ];
        assert_eq!(
            names(releases_in_the_way(&held, &req("d", "n4", W, Mnsw))),
            Some(vec!["a"])
        );
        // Admitted now: nothing in the way.
        assert_eq!(
            names(releases_in_the_way(&held, &req("d", "n4", R, Mnsw))),
            None
        );
        // A held writer that is not releasing: waiting cannot help.
        let held = [
            Claim::taken(req("a", "n1", W, Mnsw)),
            releasing(req("b", "n2", W, Mnsw)),
        ];
        assert_eq!(
            names(releases_in_the_way(&held, &req("d", "n4", W, Mnsw))),
            None
        );
        // Nor for a request that is refused on its own terms.
        let held = [releasing(req(
            "a",
            "n1",
            R,
            AccessMode::MultiNodeReaderOnly,
        ))];
        assert_eq!(
            names(releases_in_the_way(
                &held,
                &req("d", "n4", W, AccessMode::MultiNodeReaderOnly)
            )),
            None
        );
        // Another access mode, held by releasing claims only.
        let held = [releasing(req(
            "a",
            "n1",
            R,
            AccessMode::MultiNodeReaderOnly,
        ))];
        assert_eq!(
            names(releases_in_the_way(&held, &req("d", "n1", W, Snw))),
            Some(vec!["a"])
        );
    }

    #[test]
    fn access_mode_cannot_change_while_held() {
        let held = [Claim::taken(req(
            "a",
            "n1",
            R,
            AccessMode::MultiNodeReaderOnly,
        ))];
        let denied =
            admit(&held, &req("b", "n1", R, AccessMode::MultiNodeMultiWriter)).unwrap_err();
        assert_eq!(
            denied.reason,
            DenyReason::AccessModeChange {
                held: AccessMode::MultiNodeReaderOnly
            }
        );
        assert!(denied.to_string().contains("MULTI_NODE_READER_ONLY"));
    }
}
