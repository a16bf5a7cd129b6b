//! The stored form of a [`VolumeRecord`]: versioned JSON, with the older format still read.
//!
//! - **Format 2** (current, written by [`encode`]): `{"format": 2, "volume": {...},
//!   "claims": [...]}`; every claim carries its workload, node, plugin node id, mode, access
//!   mode, attachment mode and whole state.
//! - **Format 1** (older, read only): no `format` field; claims have no access or attachment
//!   mode, and the volume lists its capabilities. Such a record is read by taking both modes
//!   from the volume's single capability; a format-1 record with zero or several capabilities
//!   is refused ([`DecodeError::LegacyCapabilities`]) rather than guessed. The next checkpoint
//!   of the volume writes format 2.
//!
//! ```
//! use csi_claims::store::{decode, Format};
//!
//! let older = br#"{
//!   "volume": {"id": "db", "external_id": "vol-0a", "plugin": "ebs", "controller": "required",
//!              "capabilities": [{"access_mode": "single_node_writer", "access_type": "block"}]},
//!   "claims": [{"workload": "w1", "node": "n1", "plugin_node": "i-1", "mode": "write",
//!               "state": {"state": "taken"}}]
//! }"#;
//! let (record, format) = decode(older).unwrap();
//! assert_eq!(format, Format::V1);
//! assert_eq!(record.claims()[0].attachment(), csi_structs::AccessTypeKind::Block);
//! let current = csi_claims::store::encode(&record).unwrap();
//! assert_eq!(decode(&current).unwrap().1, Format::V2);
//! ```

use std::collections::HashSet;

use csi_structs::{
    AccessMode, AccessTypeKind, ExternalVolumeId, NodeId, PluginId, PluginNodeId, VolumeCapability,
    VolumeId, WorkloadId,
};
use serde::{Deserialize, Serialize};

use crate::model::{Claim, ClaimMode, ControllerRequirement, VolumeInfo, VolumeRecord};
use crate::state::ClaimState;

/// The format a record was stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The older format, without access and attachment modes on claims.
    V1,
    /// The current format.
    V2,
}

/// Why stored bytes are not a record.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or not the shape of its format.
    #[error("record is not a valid format-{format} claim record")]
    Json {
        /// The format it was read as (1 or 2).
        format: u8,
        /// The parser's error (names the field).
        #[source]
        source: serde_json::Error,
    },
    /// The `format` field names a format this version does not know.
    #[error("record format {found} is not supported (known: 1, 2)")]
    UnsupportedFormat {
        /// The value of the `format` field.
        found: String,
    },
    /// A format-1 record needs exactly one volume capability to recover its claims' modes.
    #[error(
        "older record of volume {volume} has {count} capabilities; exactly 1 is needed to recover the claims' access and attachment modes"
    )]
    LegacyCapabilities {
        /// The volume.
        volume: VolumeId,
        /// How many capabilities it lists.
        count: usize,
    },
    /// A stored claim is in state `freed`, which is never stored.
    #[error("stored claim of workload {workload} on volume {volume} is in state freed")]
    FreedClaimStored {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
    },
    /// Two stored claims on one volume belong to the same workload.
    #[error("volume {volume} has two stored claims of workload {workload}")]
    DuplicateWorkload {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeV2 {
    id: VolumeId,
    external_id: ExternalVolumeId,
    plugin: PluginId,
    controller: ControllerRequirement,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimV2 {
    workload: WorkloadId,
    node: NodeId,
    plugin_node: PluginNodeId,
    mode: ClaimMode,
    access_mode: AccessMode,
    attachment: AccessTypeKind,
    state: ClaimState,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordV2 {
    format: u8,
    volume: VolumeV2,
    claims: Vec<ClaimV2>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeV1 {
    id: VolumeId,
    external_id: ExternalVolumeId,
    plugin: PluginId,
    controller: ControllerRequirement,
    capabilities: Vec<VolumeCapability>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimV1 {
    workload: WorkloadId,
    node: NodeId,
    plugin_node: PluginNodeId,
    mode: ClaimMode,
    state: ClaimState,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordV1 {
    volume: VolumeV1,
    claims: Vec<ClaimV1>,
}

/// Encodes `record` in the current format (2).
///
/// # Errors
///
/// Only if serialization itself fails (it does not for well-formed records).
pub fn encode(record: &VolumeRecord) -> Result<Vec<u8>, serde_json::Error> {
    let info = &record.info;
    let stored = RecordV2 {
        format: 2,
        volume: VolumeV2 {
            id: info.id.clone(),
            external_id: info.external_id.clone(),
            plugin: info.plugin.clone(),
            controller: info.controller,
        },
        claims: record
            .claims
            .iter()
            .map(|c| ClaimV2 {
                workload: c.workload.clone(),
                node: c.node.clone(),
                plugin_node: c.plugin_node.clone(),
                mode: c.mode,
                access_mode: c.access_mode,
                attachment: c.attachment,
                state: c.state.clone(),
            })
            .collect(),
    };
    serde_json::to_vec(&stored)
}

/// Decodes a stored record of either format, and says which one it was.
///
/// # Errors
///
/// See [`DecodeError`].
pub fn decode(bytes: &[u8]) -> Result<(VolumeRecord, Format), DecodeError> {
    #[derive(Deserialize)]
    struct Probe {
        format: Option<serde_json::Value>,
    }
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|source| DecodeError::Json { format: 2, source })?;
    match probe.format {
        None => decode_v1(bytes).map(|r| (r, Format::V1)),
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(2) => {
            decode_v2(bytes).map(|r| (r, Format::V2))
        }
        Some(other) => Err(DecodeError::UnsupportedFormat {
            found: other.to_string(),
        }),
    }
}

fn decode_v2(bytes: &[u8]) -> Result<VolumeRecord, DecodeError> {
    let stored: RecordV2 =
        serde_json::from_slice(bytes).map_err(|source| DecodeError::Json { format: 2, source })?;
    let volume = stored.volume.id;
    let claims = stored
        .claims
        .into_iter()
        .map(|c| Claim {
            volume: volume.clone(),
            workload: c.workload,
            node: c.node,
            plugin_node: c.plugin_node,
            mode: c.mode,
            access_mode: c.access_mode,
            attachment: c.attachment,
            state: c.state,
        })
        .collect();
    let info = VolumeInfo {
        id: volume,
        external_id: stored.volume.external_id,
        plugin: stored.volume.plugin,
        controller: stored.volume.controller,
    };
    checked(VolumeRecord { info, claims })
}

fn decode_v1(bytes: &[u8]) -> Result<VolumeRecord, DecodeError> {
    let stored: RecordV1 =
        serde_json::from_slice(bytes).map_err(|source| DecodeError::Json { format: 1, source })?;
    let volume = stored.volume.id;
    let [capability] = stored.volume.capabilities.as_slice() else {
        return Err(DecodeError::LegacyCapabilities {
            volume,
            count: stored.volume.capabilities.len(),
        });
    };
    let (access_mode, attachment) = (capability.access_mode, capability.access_type.kind());
    let claims = stored
        .claims
        .into_iter()
        .map(|c| Claim {
            volume: volume.clone(),
            workload: c.workload,
            node: c.node,
            plugin_node: c.plugin_node,
            mode: c.mode,
            access_mode,
            attachment,
            state: c.state,
        })
        .collect();
    let info = VolumeInfo {
        id: volume,
        external_id: stored.volume.external_id,
        plugin: stored.volume.plugin,
        controller: stored.volume.controller,
    };
    checked(VolumeRecord { info, claims })
}

fn checked(record: VolumeRecord) -> Result<VolumeRecord, DecodeError> {
    let mut seen = HashSet::new();
    for claim in &record.claims {
        if matches!(claim.state, ClaimState::Freed(_)) {
            return Err(DecodeError::FreedClaimStored {
                volume: record.info.id.clone(),
                workload: claim.workload.clone(),
            });
        }
        if !seen.insert(&claim.workload) {
            return Err(DecodeError::DuplicateWorkload {
                volume: record.info.id.clone(),
                workload: claim.workload.clone(),
            });
        }
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ControllerStep, DetachSteps, NodeDetached, NodeStep};

    fn sample() -> VolumeRecord {
        let volume = VolumeId::new("vol").unwrap();
        let claim = |w: &str, state: ClaimState| Claim {
            volume: volume.clone(),
            workload: WorkloadId::new(w).unwrap(),
            node: NodeId::new("n1").unwrap(),
            plugin_node: PluginNodeId::new("i-1").unwrap(),
            mode: ClaimMode::Read,
            access_mode: AccessMode::MultiNodeReaderOnly,
            attachment: AccessTypeKind::Mount,
            state,
        };
        VolumeRecord {
            info: VolumeInfo {
                id: volume.clone(),
                external_id: ExternalVolumeId::new("ext").unwrap(),
                plugin: PluginId::new("p").unwrap(),
                controller: ControllerRequirement::Required,
            },
            claims: vec![
                claim("a", ClaimState::Taken),
                claim("b", ClaimState::Releasing),
                claim(
                    "c",
                    ClaimState::NodeDetached(NodeDetached {
                        node: NodeStep::SkippedNodeGone,
                    }),
                ),
                claim(
                    "d",
                    ClaimState::ReadyToFree(DetachSteps {
                        node: NodeStep::Detached { unstaged: true },
                        controller: ControllerStep::SkippedStillUsedOnNode {
                            by: WorkloadId::new("a").unwrap(),
                        },
                    }),
                ),
            ],
        }
    }

    fn arb_state() -> impl proptest::strategy::Strategy<Value = ClaimState> {
        use proptest::prelude::*;
        let node = prop_oneof![
            any::<bool>().prop_map(|unstaged| NodeStep::Detached { unstaged }),
            Just(NodeStep::SkippedNodeGone),
        ];
        let controller = prop_oneof![
            Just(ControllerStep::Detached),
            Just(ControllerStep::SkippedNotRequired),
            "[a-z]{1,8}".prop_map(|w| ControllerStep::SkippedStillUsedOnNode {
                by: WorkloadId::new(w).unwrap()
            }),
        ];
        (0..5u8, node, controller).prop_map(|(k, node, controller)| match k {
            0 => ClaimState::Taken,
            1 => ClaimState::Releasing,
            2 => ClaimState::NodeDetached(NodeDetached { node }),
            3 => ClaimState::ControllerDetached(DetachSteps { node, controller }),
            _ => ClaimState::ReadyToFree(DetachSteps { node, controller }),
        })
    }

    proptest::proptest! {
        #[test]
        fn any_record_round_trips(
            claims in proptest::collection::vec(
                (
                    "[a-z0-9.-]{1,12}",
                    proptest::sample::select(AccessMode::ALL.to_vec()),
                    proptest::bool::ANY,
                    proptest::bool::ANY,
                    arb_state(),
                ),
                0..6,
            ),
            controller in proptest::bool::ANY,
        ) {
            let mut record = sample();
            record.info.controller = if controller {
                ControllerRequirement::Required
            } else {
                ControllerRequirement::NotRequired
            };
            record.claims = claims
                .into_iter()
                .enumerate()
                .map(|(i, (node, access_mode, write, block, state))| Claim {
                    volume: record.info.id.clone(),
                    workload: WorkloadId::new(format!("w{i}")).unwrap(),
                    node: NodeId::new(node.clone()).unwrap(),
                    plugin_node: PluginNodeId::new(format!("sp-{node}")).unwrap(),
                    mode: if write { ClaimMode::Write } else { ClaimMode::Read },
                    access_mode,
                    attachment: if block { AccessTypeKind::Block } else { AccessTypeKind::Mount },
                    state,
                })
                .collect();
            let (back, format) = decode(&encode(&record).unwrap()).unwrap();
            proptest::prop_assert_eq!(format, Format::V2);
            proptest::prop_assert_eq!(back, record);
        }
    }

    #[test]
    fn current_format_round_trips_every_field() {
        let record = sample();
        let bytes = encode(&record).unwrap();
        let (back, format) = decode(&bytes).unwrap();
        assert_eq!(format, Format::V2);
        assert_eq!(back, record);
    }

    #[test]
    fn older_record_needs_exactly_one_capability() {
        let two = br#"{"volume": {"id": "v", "external_id": "e", "plugin": "p",
            "controller": "not_required", "capabilities": [
              {"access_mode": "single_node_writer", "access_type": "block"},
              {"access_mode": "multi_node_reader_only", "access_type": "block"}]},
            "claims": []}"#;
        assert!(matches!(
            decode(two),
            Err(DecodeError::LegacyCapabilities { count: 2, .. })
        ));
    }

    #[test]
    fn unknown_formats_and_bad_fields_are_named() {
        assert!(matches!(
            decode(br#"{"format": 3}"#),
            Err(DecodeError::UnsupportedFormat { found }) if found == "3"
        ));
        let mut bytes = encode(&sample()).unwrap();
        let text = String::from_utf8(bytes.clone())
            .unwrap()
            .replace("\"read\"", "\"sometimes\"");
        bytes = text.into_bytes();
        let err = decode(&bytes).unwrap_err();
        assert!(matches!(err, DecodeError::Json { format: 2, .. }));
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(source.contains("sometimes"), "{source}");
    }

    #[test]
    fn freed_and_duplicate_claims_are_refused() {
        let mut record = sample();
        record.claims[0].state = ClaimState::Freed(DetachSteps {
            node: NodeStep::SkippedNodeGone,
            controller: ControllerStep::SkippedNotRequired,
        });
        assert!(matches!(
            decode(&encode(&record).unwrap()),
            Err(DecodeError::FreedClaimStored { .. })
        ));
        let mut record = sample();
        record.claims[1].workload = record.claims[0].workload.clone();
        assert!(matches!(
            decode(&encode(&record).unwrap()),
            Err(DecodeError::DuplicateWorkload { .. })
        ));
    }
}
