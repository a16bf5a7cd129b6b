//! Capability confirmation: did the plugin's `ValidateVolumeCapabilities` answer really
//! confirm what was asked? (spec §3.10)
//!
//! The spec tells the orchestrator to compare the `confirmed` part of the answer with its
//! request, because an older plugin may decode fields it does not understand and still say
//! "valid". [`confirm`] does that comparison **by value, field by field**: access mode,
//! access type, fs type (`""` = unspecified), mount flags as a set, mount group, and the
//! echoed volume context, parameters and mutable parameters. Every difference becomes a
//! [`Mismatch`] carrying both values.
//!
//! # Matching rules
//!
//! - A requested capability is confirmed when some confirmed entry equals it (order of
//!   entries does not matter; mount flags compare as sets).
//! - For a requested capability that no entry equals, the entry at the same position (or the
//!   first entry not equal to any request) is compared field by field to explain why.
//! - A confirmed entry that equals no requested capability is a mismatch too
//!   ([`Mismatch::UnrequestedCapability`]): the plugin confirmed something else.
//! - The maps are optional in the answer: an **empty** confirmed map means "not echoed" and
//!   is accepted; a non-empty one must equal the request exactly.
//!
//! # Mount flags are never shown
//!
//! Mount flags can hold credentials, so [`Mismatch::MountFlags`] reports only counts (how
//! many were asked, confirmed, missing, unexpected), never a flag.
//!
//! # Incomplete answers and the policy
//!
//! Plugins exist that answer "valid" without any `confirmed`, or confirm entries with an
//! `UNKNOWN` access mode (read here as "the plugin did not validate the mode",
//! [`ConfirmedAccessMode::NotValidated`]) or without an access type. [`ConfirmPolicy`]
//! decides:
//! - [`ConfirmPolicy::Strict`] (the default) follows the spec: no `confirmed` means not
//!   confirmed (the plugin's message is kept), and a mode or type the plugin did not confirm
//!   is a mismatch.
//! - [`ConfirmPolicy::Lenient`] accepts a missing `confirmed`
//!   ([`Confirmation::AcceptedUnconfirmed`]) and treats an unvalidated mode or a missing type
//!   as "no objection". Values the plugin did state must still match.
//!
//! Strict is the default because the spec says an absent `confirmed` means "not
//! supported", and because accepting it moves the failure from registration, where an
//! operator sees it, to the first mount on a node, where a workload fails. Lenient is an
//! opt-in for known plugins that never fill the field.
//!
//! ```
//! use csi_structs::confirm::{confirm, AskedCapabilities, Confirmation, ConfirmPolicy, Confirmed, ValidationResponse};
//! use csi_structs::{AccessMode, MountOptions, VolumeCapability};
//!
//! let asked = AskedCapabilities::new(vec![VolumeCapability::mount(
//!     AccessMode::SingleNodeWriter,
//!     MountOptions::new().with_fs_type("ext4").with_flags(["noatime", "ro"]),
//! )]);
//! // The plugin echoes the capability with the flags in another order: confirmed.
//! let echoed = VolumeCapability::mount(
//!     AccessMode::SingleNodeWriter,
//!     MountOptions::new().with_fs_type("ext4").with_flags(["ro", "noatime"]),
//! );
//! let answer = ValidationResponse::confirmed(Confirmed::capabilities([&echoed]));
//! assert_eq!(confirm(&asked, &answer, ConfirmPolicy::Strict), Confirmation::Confirmed);
//!
//! // No `confirmed` at all: strict says no, lenient accepts.
//! let silent = ValidationResponse::not_confirmed(Some("unsupported fs".into()));
//! assert!(!confirm(&asked, &silent, ConfirmPolicy::Strict).is_accepted());
//! assert!(confirm(&asked, &silent, ConfirmPolicy::Lenient).is_accepted());
//! ```

use std::collections::BTreeSet;
use std::fmt;

use crate::capability::{AccessMode, AccessType, AccessTypeKind, VolumeCapability};
use crate::maps::{MutableParameters, Parameters, VolumeContext};
use crate::untrusted::{escape, escaped};

/// How to treat an answer that says less than the spec asks for. See the module docs.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ConfirmPolicy {
    /// The spec: an absent `confirmed`, an unvalidated access mode or a missing access type
    /// is not a confirmation.
    #[default]
    Strict,
    /// Accept an absent `confirmed`, an unvalidated access mode and a missing access type.
    Lenient,
}

/// The access mode of a confirmed capability, as the plugin stated it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfirmedAccessMode {
    /// `UNKNOWN` (0) or no access mode: the plugin did not validate the mode.
    NotValidated,
    /// A mode.
    Mode(AccessMode),
    /// A number the spec does not define; it never equals a requested mode.
    Unrecognized(i32),
}

impl fmt::Display for ConfirmedAccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfirmedAccessMode::NotValidated => f.write_str("UNKNOWN (not validated)"),
            ConfirmedAccessMode::Mode(m) => write!(f, "{m}"),
            ConfirmedAccessMode::Unrecognized(n) => write!(f, "unrecognized mode {n}"),
        }
    }
}

/// A capability as the plugin confirmed it: possibly incomplete, unlike a
/// [`VolumeCapability`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ConfirmedCapability {
    /// The confirmed access mode.
    pub access_mode: ConfirmedAccessMode,
    /// The confirmed access type; `None` when the plugin left the oneof unset.
    pub access_type: Option<AccessType>,
}

impl From<&VolumeCapability> for ConfirmedCapability {
    /// An exact echo of `cap`.
    fn from(cap: &VolumeCapability) -> Self {
        Self {
            access_mode: ConfirmedAccessMode::Mode(cap.access_mode),
            access_type: Some(cap.access_type.clone()),
        }
    }
}

/// The `confirmed` part of a `ValidateVolumeCapabilities` answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Confirmed {
    /// The capabilities the plugin confirmed.
    pub volume_capabilities: Vec<ConfirmedCapability>,
    /// The volume context the plugin validated (empty = not echoed).
    pub volume_context: VolumeContext,
    /// The parameters the plugin validated (empty = not echoed).
    pub parameters: Parameters,
    /// The mutable parameters the plugin validated (empty = not echoed).
    pub mutable_parameters: MutableParameters,
}

impl Confirmed {
    /// A confirmation echoing `caps` exactly, with no maps.
    pub fn capabilities<'a>(caps: impl IntoIterator<Item = &'a VolumeCapability>) -> Self {
        Self {
            volume_capabilities: caps.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// A confirmation echoing everything that was asked.
    pub fn echo(asked: &AskedCapabilities) -> Self {
        Self {
            volume_capabilities: asked.volume_capabilities.iter().map(Into::into).collect(),
            volume_context: asked.volume_context.clone(),
            parameters: asked.parameters.clone(),
            mutable_parameters: asked.mutable_parameters.clone(),
        }
    }
}

/// A `ValidateVolumeCapabilities` answer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ValidationResponse {
    /// What the plugin confirmed; `None` means it confirmed nothing.
    pub confirmed: Option<Confirmed>,
    /// The plugin's explanation (usually set when not confirmed); `None` when empty.
    pub message: Option<String>,
}

impl ValidationResponse {
    /// An answer that confirms.
    pub fn confirmed(confirmed: Confirmed) -> Self {
        Self {
            confirmed: Some(confirmed),
            message: None,
        }
    }

    /// An answer without `confirmed`.
    pub fn not_confirmed(message: Option<String>) -> Self {
        Self {
            confirmed: None,
            message: message.filter(|m| !m.is_empty()),
        }
    }
}

/// What the orchestrator asked `ValidateVolumeCapabilities` to validate.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AskedCapabilities {
    /// The capabilities (at least one).
    pub volume_capabilities: Vec<VolumeCapability>,
    /// The volume's context, as sent.
    pub volume_context: VolumeContext,
    /// The parameters, as sent.
    pub parameters: Parameters,
    /// The mutable parameters, as sent.
    pub mutable_parameters: MutableParameters,
}

impl AskedCapabilities {
    /// A question about `caps` with empty maps.
    pub fn new(caps: Vec<VolumeCapability>) -> Self {
        Self {
            volume_capabilities: caps,
            volume_context: VolumeContext::new(),
            parameters: Parameters::new(),
            mutable_parameters: MutableParameters::new(),
        }
    }
}

/// Which echoed map a [`Mismatch::Map`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfirmedMap {
    /// `volume_context`.
    VolumeContext,
    /// `parameters`.
    Parameters,
    /// `mutable_parameters`.
    MutableParameters,
}

impl ConfirmedMap {
    /// The wire field name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConfirmedMap::VolumeContext => "volume_context",
            ConfirmedMap::Parameters => "parameters",
            ConfirmedMap::MutableParameters => "mutable_parameters",
        }
    }
}

/// One way the answer differs from the request. Indices refer to
/// `volume_capabilities` of the request and of the answer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mismatch {
    /// The answer has no `confirmed` at all (strict policy).
    NothingConfirmed,
    /// No confirmed entry was left to compare the requested capability with.
    CapabilityNotConfirmed {
        /// Index in the request.
        requested: usize,
    },
    /// Different access modes.
    AccessMode {
        /// Index in the request.
        requested: usize,
        /// Index in the answer.
        confirmed: usize,
        /// The mode asked for.
        asked: AccessMode,
        /// The mode the plugin stated.
        got: ConfirmedAccessMode,
    },
    /// Different access types (block vs mount, or none stated).
    AccessType {
        /// Index in the request.
        requested: usize,
        /// Index in the answer.
        confirmed: usize,
        /// The type asked for.
        asked: AccessTypeKind,
        /// The type the plugin stated; `None` when unset.
        got: Option<AccessTypeKind>,
    },
    /// Different filesystem types (`None` = unspecified).
    FsType {
        /// Index in the request.
        requested: usize,
        /// Index in the answer.
        confirmed: usize,
        /// The fs type asked for.
        asked: Option<String>,
        /// The fs type the plugin stated.
        got: Option<String>,
    },
    /// Different sets of mount flags. Counts only: flags can hold credentials.
    MountFlags {
        /// Index in the request.
        requested: usize,
        /// Index in the answer.
        confirmed: usize,
        /// How many distinct flags were asked for.
        asked_count: usize,
        /// How many distinct flags the plugin stated.
        got_count: usize,
        /// Asked for but not confirmed.
        missing: usize,
        /// Confirmed but not asked for.
        unexpected: usize,
    },
    /// Different volume mount groups (`None` = unspecified).
    MountGroup {
        /// Index in the request.
        requested: usize,
        /// Index in the answer.
        confirmed: usize,
        /// The group asked for.
        asked: Option<String>,
        /// The group the plugin stated.
        got: Option<String>,
    },
    /// The plugin confirmed a capability that equals none of the requested ones.
    UnrequestedCapability {
        /// Index in the answer.
        confirmed: usize,
        /// Its access mode.
        access_mode: ConfirmedAccessMode,
        /// Its access type, if stated.
        access_type: Option<AccessTypeKind>,
    },
    /// A key of an echoed map differs (`None` = absent on that side). These maps are not
    /// secret (spec §3.11), so values are shown.
    Map {
        /// Which map.
        map: ConfirmedMap,
        /// The key.
        key: String,
        /// The value asked for.
        asked: Option<String>,
        /// The value the plugin echoed.
        got: Option<String>,
    },
}

/// A value the plugin may have chosen, escaped (see [`crate::untrusted`]).
fn opt(v: &Option<String>) -> std::borrow::Cow<'_, str> {
    v.as_deref()
        .map_or(std::borrow::Cow::Borrowed("<unspecified>"), escape)
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::NothingConfirmed => f.write_str("the plugin confirmed nothing"),
            Mismatch::CapabilityNotConfirmed { requested } => {
                write!(f, "volume_capabilities[{requested}] was not confirmed")
            }
            Mismatch::AccessMode {
                requested,
                confirmed,
                asked,
                got,
            } => write!(
                f,
                "volume_capabilities[{requested}].access_mode: asked {asked}, confirmed[{confirmed}] has {got}"
            ),
            Mismatch::AccessType {
                requested,
                confirmed,
                asked,
                got,
            } => write!(
                f,
                "volume_capabilities[{requested}].access_type: asked {asked}, confirmed[{confirmed}] has {}",
                got.map_or_else(|| "none".to_string(), |k| k.to_string())
            ),
            Mismatch::FsType {
                requested,
                confirmed,
                asked,
                got,
            } => write!(
                f,
                "volume_capabilities[{requested}].mount.fs_type: asked {}, confirmed[{confirmed}] has {}",
                opt(asked),
                opt(got)
            ),
            Mismatch::MountFlags {
                requested,
                confirmed,
                asked_count,
                got_count,
                missing,
                unexpected,
            } => write!(
                f,
                "volume_capabilities[{requested}].mount.mount_flags: asked {asked_count} flags, confirmed[{confirmed}] has {got_count} ({missing} missing, {unexpected} unexpected; values redacted)"
            ),
            Mismatch::MountGroup {
                requested,
                confirmed,
                asked,
                got,
            } => write!(
                f,
                "volume_capabilities[{requested}].mount.volume_mount_group: asked {}, confirmed[{confirmed}] has {}",
                opt(asked),
                opt(got)
            ),
            Mismatch::UnrequestedCapability {
                confirmed,
                access_mode,
                access_type,
            } => write!(
                f,
                "confirmed[{confirmed}] ({access_mode}, {}) was not requested",
                access_type.map_or_else(|| "no access type".to_string(), |k| k.to_string())
            ),
            Mismatch::Map {
                map,
                key,
                asked,
                got,
            } => write!(
                f,
                "{}[{key:?}]: asked {}, confirmed {}",
                map.as_str(),
                asked
                    .as_deref()
                    .map_or_else(|| "<absent>".to_string(), |v| format!("{v:?}")),
                got.as_deref()
                    .map_or_else(|| "<absent>".to_string(), |v| format!("{v:?}"))
            ),
        }
    }
}

/// The verdict of [`confirm`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confirmation {
    /// Everything asked was confirmed.
    Confirmed,
    /// The plugin confirmed nothing, and the lenient policy accepts that.
    AcceptedUnconfirmed {
        /// The plugin's message, if any.
        message: Option<String>,
    },
    /// Not confirmed.
    NotConfirmed {
        /// Every difference found (never empty).
        mismatches: Vec<Mismatch>,
        /// The plugin's message, if any.
        message: Option<String>,
    },
}

/// For people: what was confirmed, or each field that differs (`; ` between them) followed
/// by the plugin's message.
///
/// ```
/// use csi_structs::{AccessMode, Confirmation, Mismatch};
/// use csi_structs::confirm::ConfirmedAccessMode;
///
/// let no = Confirmation::NotConfirmed {
///     mismatches: vec![Mismatch::AccessMode {
///         requested: 0,
///         confirmed: 0,
///         asked: AccessMode::SingleNodeWriter,
///         got: ConfirmedAccessMode::Mode(AccessMode::MultiNodeReaderOnly),
///     }],
///     message: Some("read-only volume".into()),
/// };
/// assert_eq!(
///     no.to_string(),
///     "volume_capabilities[0].access_mode: asked SINGLE_NODE_WRITER, confirmed[0] has \
///      MULTI_NODE_READER_ONLY; the plugin says: read-only volume"
/// );
/// ```
impl fmt::Display for Confirmation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (mismatches, message) = match self {
            Confirmation::Confirmed => return f.write_str("every capability confirmed"),
            Confirmation::AcceptedUnconfirmed { message } => {
                f.write_str("accepted without a confirmation")?;
                (&[][..], message)
            }
            Confirmation::NotConfirmed {
                mismatches,
                message,
            } => (&mismatches[..], message),
        };
        for (i, m) in mismatches.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{m}")?;
        }
        if let Some(message) = message {
            write!(f, "; the plugin says: {}", escaped(message))?;
        }
        Ok(())
    }
}

impl Confirmation {
    /// Whether the volume may be used with the asked capabilities.
    pub fn is_accepted(&self) -> bool {
        !matches!(self, Confirmation::NotConfirmed { .. })
    }

    /// The mismatches (empty when accepted).
    pub fn mismatches(&self) -> &[Mismatch] {
        match self {
            Confirmation::NotConfirmed { mismatches, .. } => mismatches,
            _ => &[],
        }
    }
}

/// Field-by-field differences between a requested and a confirmed capability.
fn differences(
    policy: ConfirmPolicy,
    ri: usize,
    asked: &VolumeCapability,
    ci: usize,
    got: &ConfirmedCapability,
) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let mode_ok = match got.access_mode {
        ConfirmedAccessMode::Mode(m) => m == asked.access_mode,
        ConfirmedAccessMode::NotValidated => policy == ConfirmPolicy::Lenient,
        ConfirmedAccessMode::Unrecognized(_) => false,
    };
    if !mode_ok {
        out.push(Mismatch::AccessMode {
            requested: ri,
            confirmed: ci,
            asked: asked.access_mode,
            got: got.access_mode,
        });
    }
    match (&asked.access_type, &got.access_type) {
        (_, None) if policy == ConfirmPolicy::Lenient => {}
        (AccessType::Block, Some(AccessType::Block)) => {}
        (AccessType::Mount(a), Some(AccessType::Mount(g))) => {
            if a.fs_type() != g.fs_type() {
                out.push(Mismatch::FsType {
                    requested: ri,
                    confirmed: ci,
                    asked: a.fs_type().map(str::to_string),
                    got: g.fs_type().map(str::to_string),
                });
            }
            if a.mount_flags() != g.mount_flags() {
                let (missing, unexpected) = a.mount_flags().difference_counts(g.mount_flags());
                out.push(Mismatch::MountFlags {
                    requested: ri,
                    confirmed: ci,
                    asked_count: a.mount_flags().to_set().len(),
                    got_count: g.mount_flags().to_set().len(),
                    missing,
                    unexpected,
                });
            }
            if a.volume_mount_group() != g.volume_mount_group() {
                out.push(Mismatch::MountGroup {
                    requested: ri,
                    confirmed: ci,
                    asked: a.volume_mount_group().map(str::to_string),
                    got: g.volume_mount_group().map(str::to_string),
                });
            }
        }
        (a, g) => out.push(Mismatch::AccessType {
            requested: ri,
            confirmed: ci,
            asked: a.kind(),
            got: g.as_ref().map(AccessType::kind),
        }),
    }
    out
}

fn map_differences<'a>(
    out: &mut Vec<Mismatch>,
    map: ConfirmedMap,
    asked: impl Iterator<Item = (&'a str, &'a str)>,
    got: impl Iterator<Item = (&'a str, &'a str)>,
) {
    let asked: std::collections::BTreeMap<&str, &str> = asked.collect();
    let got: std::collections::BTreeMap<&str, &str> = got.collect();
    if got.is_empty() {
        return; // not echoed
    }
    let keys: BTreeSet<&str> = asked.keys().chain(got.keys()).copied().collect();
    for key in keys {
        let (a, g) = (asked.get(key), got.get(key));
        if a != g {
            out.push(Mismatch::Map {
                map,
                key: key.to_string(),
                asked: a.map(|v| (*v).to_string()),
                got: g.map(|v| (*v).to_string()),
            });
        }
    }
}

/// Compares a `ValidateVolumeCapabilities` answer with what was asked. See the module docs
/// for the rules.
pub fn confirm(
    asked: &AskedCapabilities,
    response: &ValidationResponse,
    policy: ConfirmPolicy,
) -> Confirmation {
    let message = response.message.clone().filter(|m| !m.is_empty());
    let Some(confirmed) = &response.confirmed else {
        return match policy {
            ConfirmPolicy::Lenient => Confirmation::AcceptedUnconfirmed { message },
            ConfirmPolicy::Strict => Confirmation::NotConfirmed {
                mismatches: vec![Mismatch::NothingConfirmed],
                message,
            },
        };
    };
    let got = &confirmed.volume_capabilities;
    let equal = |ri: usize, ci: usize| {
        differences(policy, ri, &asked.volume_capabilities[ri], ci, &got[ci]).is_empty()
    };

    // Which confirmed entries equal some requested capability.
    let mut matched_conf = vec![false; got.len()];
    let mut unmatched_req = Vec::new();
    for ri in 0..asked.volume_capabilities.len() {
        let mut found = false;
        for (ci, m) in matched_conf.iter_mut().enumerate() {
            if equal(ri, ci) {
                *m = true;
                found = true;
            }
        }
        if !found {
            unmatched_req.push(ri);
        }
    }

    let mut mismatches = Vec::new();
    let mut explained = vec![false; got.len()];
    for ri in unmatched_req {
        let candidate = if ri < got.len() && !matched_conf[ri] && !explained[ri] {
            Some(ri)
        } else {
            (0..got.len()).find(|&ci| !matched_conf[ci] && !explained[ci])
        };
        match candidate {
            Some(ci) => {
                explained[ci] = true;
                mismatches.extend(differences(
                    policy,
                    ri,
                    &asked.volume_capabilities[ri],
                    ci,
                    &got[ci],
                ));
            }
            None => mismatches.push(Mismatch::CapabilityNotConfirmed { requested: ri }),
        }
    }
    for (ci, cap) in got.iter().enumerate() {
        if !matched_conf[ci] && !explained[ci] {
            mismatches.push(Mismatch::UnrequestedCapability {
                confirmed: ci,
                access_mode: cap.access_mode,
                access_type: cap.access_type.as_ref().map(AccessType::kind),
            });
        }
    }

    map_differences(
        &mut mismatches,
        ConfirmedMap::VolumeContext,
        asked.volume_context.iter(),
        confirmed.volume_context.iter(),
    );
    map_differences(
        &mut mismatches,
        ConfirmedMap::Parameters,
        asked.parameters.iter(),
        confirmed.parameters.iter(),
    );
    map_differences(
        &mut mismatches,
        ConfirmedMap::MutableParameters,
        asked.mutable_parameters.iter(),
        confirmed.mutable_parameters.iter(),
    );

    if mismatches.is_empty() {
        Confirmation::Confirmed
    } else {
        Confirmation::NotConfirmed {
            mismatches,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability::MountOptions;

    const SECRET_FLAG: &str = "password=hunter2";

    fn mount(mode: AccessMode, fs: &str, flags: &[&str]) -> VolumeCapability {
        VolumeCapability::mount(
            mode,
            MountOptions::new()
                .with_fs_type(fs)
                .with_flags(flags.iter().copied()),
        )
    }

    fn answer(caps: Vec<ConfirmedCapability>) -> ValidationResponse {
        ValidationResponse::confirmed(Confirmed {
            volume_capabilities: caps,
            ..Confirmed::default()
        })
    }

    #[test]
    fn field_by_field_table() {
        use AccessMode::*;
        let asked_cap = mount(SingleNodeWriter, "ext4", &["ro", SECRET_FLAG]);
        let asked = AskedCapabilities::new(vec![asked_cap.clone()]);
        let cases: Vec<(&str, ConfirmedCapability, ConfirmPolicy, Vec<Mismatch>)> = vec![
            ("exact", (&asked_cap).into(), ConfirmPolicy::Strict, vec![]),
            (
                "flags reordered and repeated",
                (&mount(SingleNodeWriter, "ext4", &[SECRET_FLAG, "ro", "ro"])).into(),
                ConfirmPolicy::Strict,
                vec![],
            ),
            (
                "other mode",
                (&mount(MultiNodeMultiWriter, "ext4", &["ro", SECRET_FLAG])).into(),
                ConfirmPolicy::Strict,
                vec![Mismatch::AccessMode {
                    requested: 0,
                    confirmed: 0,
                    asked: SingleNodeWriter,
                    got: ConfirmedAccessMode::Mode(MultiNodeMultiWriter),
                }],
            ),
            (
                "fs type echoed for unspecified is different",
                (&mount(SingleNodeWriter, "xfs", &["ro", SECRET_FLAG])).into(),
                ConfirmPolicy::Lenient,
                vec![Mismatch::FsType {
                    requested: 0,
                    confirmed: 0,
                    asked: Some("ext4".into()),
                    got: Some("xfs".into()),
                }],
            ),
            (
                "subset of flags",
                (&mount(SingleNodeWriter, "ext4", &["ro"])).into(),
                ConfirmPolicy::Strict,
                vec![Mismatch::MountFlags {
                    requested: 0,
                    confirmed: 0,
                    asked_count: 2,
                    got_count: 1,
                    missing: 1,
                    unexpected: 0,
                }],
            ),
            (
                "block instead of mount",
                (&VolumeCapability::block(SingleNodeWriter)).into(),
                ConfirmPolicy::Lenient,
                vec![Mismatch::AccessType {
                    requested: 0,
                    confirmed: 0,
                    asked: AccessTypeKind::Mount,
                    got: Some(AccessTypeKind::Block),
                }],
            ),
            (
                "unvalidated mode, strict",
                ConfirmedCapability {
                    access_mode: ConfirmedAccessMode::NotValidated,
                    access_type: Some(asked_cap.access_type.clone()),
                },
                ConfirmPolicy::Strict,
                vec![Mismatch::AccessMode {
                    requested: 0,
                    confirmed: 0,
                    asked: SingleNodeWriter,
                    got: ConfirmedAccessMode::NotValidated,
                }],
            ),
            (
                "unvalidated mode and no type, lenient",
                ConfirmedCapability {
                    access_mode: ConfirmedAccessMode::NotValidated,
                    access_type: None,
                },
                ConfirmPolicy::Lenient,
                vec![],
            ),
            (
                "no type, strict",
                ConfirmedCapability {
                    access_mode: ConfirmedAccessMode::Mode(SingleNodeWriter),
                    access_type: None,
                },
                ConfirmPolicy::Strict,
                vec![Mismatch::AccessType {
                    requested: 0,
                    confirmed: 0,
                    asked: AccessTypeKind::Mount,
                    got: None,
                }],
            ),
            (
                "unrecognized mode, even lenient",
                ConfirmedCapability {
                    access_mode: ConfirmedAccessMode::Unrecognized(9),
                    access_type: None,
                },
                ConfirmPolicy::Lenient,
                vec![Mismatch::AccessMode {
                    requested: 0,
                    confirmed: 0,
                    asked: SingleNodeWriter,
                    got: ConfirmedAccessMode::Unrecognized(9),
                }],
            ),
            (
                "mount group differs",
                (&VolumeCapability::mount(
                    SingleNodeWriter,
                    MountOptions::new()
                        .with_fs_type("ext4")
                        .with_flags(["ro", SECRET_FLAG])
                        .with_volume_mount_group("1000"),
                ))
                    .into(),
                ConfirmPolicy::Strict,
                vec![Mismatch::MountGroup {
                    requested: 0,
                    confirmed: 0,
                    asked: None,
                    got: Some("1000".into()),
                }],
            ),
        ];
        for (name, conf, policy, expected) in cases {
            let got = confirm(&asked, &answer(vec![conf]), policy);
            assert_eq!(got.mismatches(), expected.as_slice(), "{name}");
            assert_eq!(got.is_accepted(), expected.is_empty(), "{name}");
            for m in got.mismatches() {
                let text = format!("{m} {m:?}");
                assert!(!text.contains("hunter2"), "{name}: {text}");
            }
        }
    }

    #[test]
    fn several_capabilities_any_order() {
        use AccessMode::*;
        let a = VolumeCapability::block(SingleNodeWriter);
        let b = mount(MultiNodeReaderOnly, "", &[]);
        let asked = AskedCapabilities::new(vec![a.clone(), b.clone()]);
        assert_eq!(
            confirm(
                &asked,
                &answer(vec![(&b).into(), (&a).into()]),
                ConfirmPolicy::Strict
            ),
            Confirmation::Confirmed
        );
        // Only one of two confirmed.
        let got = confirm(&asked, &answer(vec![(&b).into()]), ConfirmPolicy::Strict);
        assert_eq!(
            got.mismatches(),
            &[Mismatch::CapabilityNotConfirmed { requested: 0 }]
        );
        // An extra confirmed capability nobody asked for.
        let c = mount(MultiNodeMultiWriter, "nfs", &[]);
        let got = confirm(
            &asked,
            &answer(vec![(&a).into(), (&b).into(), (&c).into()]),
            ConfirmPolicy::Strict,
        );
        assert_eq!(
            got.mismatches(),
            &[Mismatch::UnrequestedCapability {
                confirmed: 2,
                access_mode: ConfirmedAccessMode::Mode(MultiNodeMultiWriter),
                access_type: Some(AccessTypeKind::Mount)
            }]
        );
    }

    #[test]
    fn absent_confirmed_follows_policy() {
        let asked =
            AskedCapabilities::new(vec![VolumeCapability::block(AccessMode::SingleNodeWriter)]);
        let resp = ValidationResponse::not_confirmed(Some("no block support".into()));
        assert_eq!(
            confirm(&asked, &resp, ConfirmPolicy::Strict),
            Confirmation::NotConfirmed {
                mismatches: vec![Mismatch::NothingConfirmed],
                message: Some("no block support".into())
            }
        );
        assert_eq!(
            confirm(&asked, &resp, ConfirmPolicy::Lenient),
            Confirmation::AcceptedUnconfirmed {
                message: Some("no block support".into())
            }
        );
        assert_eq!(ConfirmPolicy::default(), ConfirmPolicy::Strict);
    }

    #[test]
    fn echoed_maps_must_match_when_present() {
        let mut asked =
            AskedCapabilities::new(vec![VolumeCapability::block(AccessMode::SingleNodeWriter)]);
        asked.volume_context = VolumeContext::try_from_iter([("a", "1")]).unwrap();
        asked.mutable_parameters = MutableParameters::try_from_iter([("iops", "100")]).unwrap();
        let mut conf = Confirmed::echo(&asked);
        assert_eq!(
            confirm(
                &asked,
                &ValidationResponse::confirmed(conf.clone()),
                ConfirmPolicy::Strict
            ),
            Confirmation::Confirmed
        );
        // Not echoed: fine.
        conf.volume_context = VolumeContext::new();
        conf.mutable_parameters = MutableParameters::new();
        assert_eq!(
            confirm(
                &asked,
                &ValidationResponse::confirmed(conf.clone()),
                ConfirmPolicy::Strict
            ),
            Confirmation::Confirmed
        );
        // Echoed differently: mismatch with both values.
        conf.mutable_parameters =
            MutableParameters::try_from_iter([("iops", "50"), ("tier", "gold")]).unwrap();
        let got = confirm(
            &asked,
            &ValidationResponse::confirmed(conf),
            ConfirmPolicy::Lenient,
        );
        assert_eq!(
            got.mismatches(),
            &[
                Mismatch::Map {
                    map: ConfirmedMap::MutableParameters,
                    key: "iops".into(),
                    asked: Some("100".into()),
                    got: Some("50".into())
                },
                Mismatch::Map {
                    map: ConfirmedMap::MutableParameters,
                    key: "tier".into(),
                    asked: None,
                    got: Some("gold".into())
                },
            ]
        );
    }
}
