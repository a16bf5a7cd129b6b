//! The typed calls the campaign makes, the answers a plugin may give to each (ordinary, or
//! valid protobuf with out-of-range or contradictory values), and what the client must make
//! of each answer.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use csi_client::{CallOptions, CsiClient, NodePublish, NodeStage, proto as pb};
use csi_structs::confirm::AskedCapabilities;
use csi_structs::{
    AccessMode, ConfirmPolicy, Confirmation, ExternalVolumeId, MountOptions, PluginNodeId,
    PublishContext, Secrets, VolumeCapability, VolumeContext,
};
use prost::Message as _;

use crate::rng::Rng;

/// Every secret value the campaign sends holds this; no error or log line may.
pub(crate) const MARKER: &str = "campaign-client-secret";

/// A typed call of csi-client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rpc {
    Probe,
    PluginInfo,
    PluginCaps,
    CreateVolume,
    DeleteVolume,
    Validate(ConfirmPolicy),
    ControllerPublish,
    /// `list_all_volumes`: every page.
    ListAll,
    NodeStage,
    NodePublish,
    NodeGetInfo,
}

const RPCS: &[Rpc] = &[
    Rpc::Probe,
    Rpc::PluginInfo,
    Rpc::PluginCaps,
    Rpc::CreateVolume,
    Rpc::DeleteVolume,
    Rpc::Validate(ConfirmPolicy::Strict),
    Rpc::Validate(ConfirmPolicy::Lenient),
    Rpc::ControllerPublish,
    Rpc::ListAll,
    Rpc::ListAll,
    Rpc::NodeStage,
    Rpc::NodePublish,
    Rpc::NodeGetInfo,
];

impl fmt::Display for Rpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What the client must make of an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Success, with this summary of the result.
    Ok(String),
    /// An invalid response naming a field that starts with this path.
    Invalid(&'static str),
    /// An undecodable answer.
    Undecodable,
    /// An answer over the decode limit.
    TooLarge,
    /// Not gRPC: this HTTP status without a `grpc-status`.
    NotGrpc(u16),
    /// The plugin's status, with its message.
    Status(tonic::Code, String),
    /// A status number gRPC does not define.
    UnknownStatus(u32),
    /// A listing whose `next_token` repeats.
    RepeatedToken,
    /// The connection (or the stream) broke mid-call.
    Lost,
    /// Our deadline.
    Deadline,
    /// The plugin could not be reached, or the HTTP/2 connection not set up: nothing sent.
    Unreachable,
    /// Any of these.
    AnyOf(Vec<Expect>),
}

impl Rpc {
    pub(crate) fn generate(rng: &mut Rng) -> Rpc {
        rng.pick(RPCS)
    }

    /// Whether the RPC changes state: an answer we could not use, our deadline and a lost
    /// connection leave its outcome unknown.
    pub(crate) fn mutating(self) -> bool {
        matches!(
            self,
            Rpc::CreateVolume
                | Rpc::DeleteVolume
                | Rpc::ControllerPublish
                | Rpc::NodeStage
                | Rpc::NodePublish
        )
    }

    /// The RPC's gRPC method path.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Rpc::Probe => "/csi.v1.Identity/Probe",
            Rpc::PluginInfo => "/csi.v1.Identity/GetPluginInfo",
            Rpc::PluginCaps => "/csi.v1.Identity/GetPluginCapabilities",
            Rpc::CreateVolume => "/csi.v1.Controller/CreateVolume",
            Rpc::DeleteVolume => "/csi.v1.Controller/DeleteVolume",
            Rpc::Validate(_) => "/csi.v1.Controller/ValidateVolumeCapabilities",
            Rpc::ControllerPublish => "/csi.v1.Controller/ControllerPublishVolume",
            Rpc::ListAll => "/csi.v1.Controller/ListVolumes",
            Rpc::NodeStage => "/csi.v1.Node/NodeStageVolume",
            Rpc::NodePublish => "/csi.v1.Node/NodePublishVolume",
            Rpc::NodeGetInfo => "/csi.v1.Node/NodeGetInfo",
        }
    }

    /// The RPC as csi-client names it.
    pub(crate) fn csi(self) -> csi_client::Rpc {
        use csi_client::Rpc as R;
        match self {
            Rpc::Probe => R::Probe,
            Rpc::PluginInfo => R::GetPluginInfo,
            Rpc::PluginCaps => R::GetPluginCapabilities,
            Rpc::CreateVolume => R::CreateVolume,
            Rpc::DeleteVolume => R::DeleteVolume,
            Rpc::Validate(_) => R::ValidateVolumeCapabilities,
            Rpc::ControllerPublish => R::ControllerPublishVolume,
            Rpc::ListAll => R::ListVolumes,
            Rpc::NodeStage => R::NodeStageVolume,
            Rpc::NodePublish => R::NodePublishVolume,
            Rpc::NodeGetInfo => R::NodeGetInfo,
        }
    }
}

/// The answer messages of a case (one per page of a listing, one otherwise) and what the
/// client must make of them when every one arrives well framed with status OK.
#[derive(Clone, Debug)]
pub(crate) struct Content {
    pub(crate) pages: Vec<Vec<u8>>,
    pub(crate) expect: Expect,
    /// A listing whose plugin answers ABORTED the first time this page is asked for (it no
    /// longer takes its own token): the client lists again from the start.
    pub(crate) abort_once_at: Option<usize>,
    /// What the content is, for the failure line.
    pub(crate) what: &'static str,
}

fn one(message: impl prost::Message, expect: Expect, what: &'static str) -> Content {
    Content {
        pages: vec![message.encode_to_vec()],
        expect,
        abort_once_at: None,
        what,
    }
}

fn ok(s: impl Into<String>) -> Expect {
    Expect::Ok(s.into())
}

fn capability() -> VolumeCapability {
    VolumeCapability::mount(
        AccessMode::SingleNodeWriter,
        MountOptions::new().with_fs_type("ext4"),
    )
}

fn wire_capability(mode: i32) -> pb::VolumeCapability {
    let mut cap: pb::VolumeCapability = (&capability()).into();
    if let Some(m) = cap.access_mode.as_mut() {
        m.mode = mode;
    }
    cap
}

/// A volume id that is valid, or one `n` bytes long.
fn id(prefix: &str, rng: &mut Rng) -> String {
    format!("{prefix}-{}", rng.below(1_000_000))
}

/// A valid listed volume.
fn listed(rng: &mut Rng) -> pb::list_volumes_response::Entry {
    pb::list_volumes_response::Entry {
        volume: Some(pb::Volume {
            volume_id: id("vol", rng),
            capacity_bytes: i64::try_from(rng.below(1 << 40)).unwrap_or(0),
            ..Default::default()
        }),
        status: None,
    }
}

/// A valid protobuf field the message does not have (number 1000, varint): ignored.
fn with_unknown_field(mut bytes: Vec<u8>) -> Vec<u8> {
    // Tag (1000 << 3 | 0) as a varint, then the value 1.
    bytes.extend_from_slice(&[0xc0, 0x3e, 0x01]);
    bytes
}

/// The plugin's answer messages for `rpc`: ordinary, or (when `allow_hostile`, half the
/// time) hostile but decodable.
pub(crate) fn content(rpc: Rpc, rng: &mut Rng, allow_hostile: bool) -> Content {
    let hostile = allow_hostile && rng.percent(50);
    let mut c = match rpc {
        Rpc::Probe => {
            let (ready, s) = rng.pick(&[
                (None, "ready"),
                (Some(true), "ready"),
                (Some(false), "not_ready"),
            ]);
            one(pb::ProbeResponse { ready }, ok(s), "probe")
        }
        Rpc::PluginInfo => {
            let version = format!("v{}", rng.below(1000));
            let good = pb::GetPluginInfoResponse {
                name: "csi.example.com".into(),
                vendor_version: version.clone(),
                manifest: Default::default(),
            };
            match hostile.then(|| rng.index(5)) {
                None => one(good, ok(version), "plugin info"),
                Some(0) => one(
                    pb::GetPluginInfoResponse {
                        name: String::new(),
                        ..good
                    },
                    Expect::Invalid("name"),
                    "empty plugin name",
                ),
                Some(1) => one(
                    pb::GetPluginInfoResponse {
                        vendor_version: String::new(),
                        ..good
                    },
                    Expect::Invalid("vendor_version"),
                    "empty vendor version",
                ),
                Some(2) => one(
                    pb::GetPluginInfoResponse {
                        name: format!("{}.example.com", "n".repeat(70)),
                        ..good
                    },
                    Expect::Invalid("name"),
                    "plugin name over 63 characters",
                ),
                Some(3) => one(
                    pb::GetPluginInfoResponse {
                        name: "not a domain\n name".into(),
                        ..good
                    },
                    Expect::Invalid("name"),
                    "plugin name with spaces and a newline",
                ),
                Some(_) => one(
                    pb::GetPluginInfoResponse {
                        manifest: (0..200)
                            .map(|i| (format!("key-{i}"), "v".repeat(64)))
                            .collect(),
                        ..good
                    },
                    Expect::Invalid("manifest"),
                    "manifest over its byte limit",
                ),
            }
        }
        Rpc::PluginCaps => {
            use pb::plugin_capability::{Service, Type};
            let count = if hostile {
                rng.pick(&[3usize, 100, 100_000])
            } else {
                2
            };
            let capabilities = (0..count)
                .map(|i| pb::PluginCapability {
                    r#type: match (hostile, i % 3) {
                        (false, _) | (true, 0) => Some(Type::Service(Service {
                            r#type: i32::try_from(1 + i % 3).unwrap_or(1),
                        })),
                        // Numbers this version does not know are ignored (spec §3.15).
                        (true, 1) => Some(Type::Service(Service {
                            r#type: 900 + i32::try_from(i % 50).unwrap_or(0),
                        })),
                        _ => None,
                    },
                })
                .collect();
            one(
                pb::GetPluginCapabilitiesResponse { capabilities },
                ok("ok"),
                if hostile {
                    "unknown and empty capabilities"
                } else {
                    "capabilities"
                },
            )
        }
        Rpc::CreateVolume => {
            let volume_id = id("vol", rng);
            let good = pb::Volume {
                volume_id: volume_id.clone(),
                capacity_bytes: i64::try_from(rng.below(1 << 40)).unwrap_or(0),
                ..Default::default()
            };
            let response = |volume: Option<pb::Volume>| pb::CreateVolumeResponse { volume };
            match hostile.then(|| rng.index(5)) {
                None => one(response(Some(good)), ok(volume_id), "created volume"),
                Some(0) => one(
                    response(Some(pb::Volume {
                        volume_id: String::new(),
                        ..good
                    })),
                    Expect::Invalid("volume.volume_id"),
                    "empty volume id",
                ),
                Some(1) => one(
                    response(Some(pb::Volume {
                        capacity_bytes: -1 - i64::try_from(rng.below(1 << 40)).unwrap_or(0),
                        ..good
                    })),
                    Expect::Invalid("volume.capacity_bytes"),
                    "negative capacity",
                ),
                Some(2) => one(response(None), Expect::Invalid("volume"), "no volume"),
                Some(3) => one(
                    response(Some(pb::Volume {
                        volume_id: "v".repeat(200),
                        ..good
                    })),
                    Expect::Invalid("volume.volume_id"),
                    "volume id over 128 bytes",
                ),
                Some(_) => one(
                    response(Some(pb::Volume {
                        volume_context: (0..300)
                            .map(|i| (format!("k{i}"), "x".repeat(40)))
                            .collect(),
                        ..good
                    })),
                    Expect::Invalid("volume.volume_context"),
                    "volume context over its byte limit",
                ),
            }
        }
        Rpc::DeleteVolume | Rpc::NodeStage | Rpc::NodePublish => {
            // Empty answers: anything well formed decodes.
            let bytes = if hostile {
                with_unknown_field(Vec::new())
            } else {
                Vec::new()
            };
            Content {
                pages: vec![bytes],
                expect: ok("ok"),
                abort_once_at: None,
                what: if hostile {
                    "an empty answer with an unknown field"
                } else {
                    "an empty answer"
                },
            }
        }
        Rpc::Validate(policy) => validation(policy, hostile, rng),
        Rpc::ControllerPublish => {
            let n = rng.below(4);
            let good: std::collections::HashMap<String, String> =
                (0..n).map(|i| (format!("k{i}"), format!("v{i}"))).collect();
            match hostile.then(|| rng.index(2)) {
                None => one(
                    pb::ControllerPublishVolumeResponse {
                        publish_context: good,
                    },
                    ok(format!("{n} keys")),
                    "publish context",
                ),
                Some(0) => one(
                    pb::ControllerPublishVolumeResponse {
                        publish_context: (0..300)
                            .map(|i| (format!("k{i}"), "x".repeat(40)))
                            .collect(),
                    },
                    Expect::Invalid("publish_context"),
                    "publish context over its byte limit",
                ),
                Some(_) => one(
                    pb::ControllerPublishVolumeResponse {
                        publish_context: [("k".to_owned(), "v".repeat(5000))].into_iter().collect(),
                    },
                    Expect::Invalid("publish_context"),
                    "publish context with a value over the map's byte limit",
                ),
            }
        }
        Rpc::ListAll => listing(hostile, rng),
        Rpc::NodeGetInfo => {
            let node_id = id("node", rng);
            let good = pb::NodeGetInfoResponse {
                node_id: node_id.clone(),
                max_volumes_per_node: i64::try_from(rng.below(100)).unwrap_or(0),
                accessible_topology: None,
            };
            match hostile.then(|| rng.index(3)) {
                None => one(good, ok(node_id), "node info"),
                Some(0) => one(
                    pb::NodeGetInfoResponse {
                        node_id: String::new(),
                        ..good
                    },
                    Expect::Invalid("node_id"),
                    "empty node id",
                ),
                Some(1) => one(
                    pb::NodeGetInfoResponse {
                        max_volumes_per_node: -1 - i64::try_from(rng.below(1000)).unwrap_or(0),
                        ..good
                    },
                    Expect::Invalid("max_volumes_per_node"),
                    "negative volume limit",
                ),
                Some(_) => one(
                    pb::NodeGetInfoResponse {
                        node_id: "n".repeat(300),
                        ..good
                    },
                    Expect::Invalid("node_id"),
                    "node id over 256 bytes",
                ),
            }
        }
    };
    // Unknown fields are ignored wherever they are.
    if rng.percent(10) && c.pages.len() == 1 {
        c.pages[0] = with_unknown_field(std::mem::take(&mut c.pages[0]));
    }
    c
}

fn validation(policy: ConfirmPolicy, hostile: bool, rng: &mut Rng) -> Content {
    use pb::validate_volume_capabilities_response::Confirmed;
    let confirmed = |caps: Vec<pb::VolumeCapability>| {
        Some(Confirmed {
            volume_context: Default::default(),
            volume_capabilities: caps,
            parameters: Default::default(),
            mutable_parameters: Default::default(),
        })
    };
    let answer = |confirmed: Option<Confirmed>| pb::ValidateVolumeCapabilitiesResponse {
        confirmed,
        message: "plugin's note".into(),
    };
    use pb::volume_capability::access_mode::Mode;
    let snw = Mode::SingleNodeWriter as i32;
    let mnr = Mode::MultiNodeReaderOnly as i32;
    let no = || ok("not_confirmed");
    match hostile.then(|| rng.index(6)) {
        None => one(
            answer(confirmed(vec![wire_capability(snw)])),
            ok("confirmed"),
            "the capability asked, confirmed",
        ),
        Some(0) => one(
            answer(None),
            match policy {
                ConfirmPolicy::Strict => no(),
                ConfirmPolicy::Lenient => ok("accepted_unconfirmed"),
            },
            "nothing confirmed",
        ),
        Some(1) => one(
            answer(confirmed(vec![wire_capability(snw), wire_capability(mnr)])),
            no(),
            "confirmed with a capability not asked",
        ),
        Some(2) => one(
            answer(confirmed(vec![wire_capability(mnr)])),
            no(),
            "confirmed with another access mode",
        ),
        Some(3) => one(
            answer(confirmed(vec![wire_capability(99)])),
            Expect::Invalid("confirmed.volume_capabilities[0].access_mode"),
            "confirmed with an unknown access mode number",
        ),
        // The spec requires `confirmed.volume_capabilities` when `confirmed` is set.
        Some(4) => one(
            answer(confirmed(Vec::new())),
            Expect::Invalid("confirmed.volume_capabilities"),
            "confirmed without capabilities",
        ),
        Some(_) => {
            let mut c = confirmed(vec![wire_capability(snw)]);
            if let Some(c) = c.as_mut() {
                c.parameters.insert("not".into(), "asked".into());
            }
            one(answer(c), no(), "confirmed with parameters not asked")
        }
    }
}

/// The pages of a listing: page `i` answers `starting_token` `t<i>` (the first, the empty
/// token).
fn listing(hostile: bool, rng: &mut Rng) -> Content {
    let pages_n = rng.range(1, 4) as usize;
    let mut pages: Vec<pb::ListVolumesResponse> = (0..pages_n)
        .map(|i| pb::ListVolumesResponse {
            entries: (0..rng.below(4)).map(|_| listed(rng)).collect(),
            next_token: if i + 1 < pages_n {
                format!("t{}", i + 1)
            } else {
                String::new()
            },
        })
        .collect();
    let count =
        |pages: &[pb::ListVolumesResponse]| pages.iter().map(|p| p.entries.len()).sum::<usize>();
    let mut abort_once_at = None;
    let (expect, what) = match hostile.then(|| rng.index(7)) {
        None => (ok(format!("{} entries", count(&pages))), "pages"),
        Some(0) => {
            // The last page points back at an earlier one.
            let back = rng.index(pages_n);
            if let Some(last) = pages.last_mut() {
                last.next_token = format!("t{back}");
            }
            // `t0` names page 0 too: either way a token already followed comes back.
            (Expect::RepeatedToken, "a next_token that repeats")
        }
        Some(1) => {
            let page = rng.index(pages_n);
            pages[page].entries.push(pb::list_volumes_response::Entry {
                volume: Some(pb::Volume {
                    volume_id: String::new(),
                    capacity_bytes: -7,
                    ..Default::default()
                }),
                status: None,
            });
            (
                Expect::Invalid("entries["),
                "a listed volume with an empty id and a negative size",
            )
        }
        Some(2) => {
            // One entry without a volume, or a whole page of them (two bytes each on the
            // wire, one violation each).
            let page = rng.index(pages_n);
            let n = rng.pick(&[1usize, 1, 100_000]);
            pages[page]
                .entries
                .extend((0..n).map(|_| pb::list_volumes_response::Entry {
                    volume: None,
                    status: None,
                }));
            (
                Expect::Invalid("entries["),
                "listed entries without a volume",
            )
        }
        Some(3) => {
            if let Some(first) = pages.first_mut() {
                first.next_token = "t".repeat(200);
            }
            (Expect::Invalid("next_token"), "a next_token over 128 bytes")
        }
        Some(4) => {
            // Many entries on a page, within the decode limit; or a million over four pages.
            let many = |n: usize| {
                (0..n)
                    .map(|i| pb::list_volumes_response::Entry {
                        volume: Some(pb::Volume {
                            volume_id: format!("v{i}"),
                            ..Default::default()
                        }),
                        status: None,
                    })
                    .collect::<Vec<_>>()
            };
            let n = rng.pick(&[1_000usize, 20_000, 100_000, 1_000_000]);
            if n == 1_000_000 {
                pages = (0..4)
                    .map(|i| pb::ListVolumesResponse {
                        entries: many(n / 4),
                        next_token: if i < 3 {
                            format!("t{}", i + 1)
                        } else {
                            String::new()
                        },
                    })
                    .collect();
            } else {
                let page = rng.index(pages_n);
                pages[page].entries = many(n);
            }
            (
                ok(format!("{} entries", count(&pages))),
                "pages of many entries",
            )
        }
        Some(5) if pages_n > 1 => {
            abort_once_at = Some(rng.range(1, pages_n as u64 - 1) as usize);
            (
                ok(format!("{} entries", count(&pages))),
                "ABORTED on a later page once (the listing starts over)",
            )
        }
        Some(_) => {
            // Tokens the listing never saw before, page after page: fine while they end.
            for (i, p) in pages.iter_mut().enumerate() {
                if !p.next_token.is_empty() {
                    p.next_token = format!("t{}", i + 1);
                }
            }
            (ok(format!("{} entries", count(&pages))), "pages")
        }
    };
    Content {
        pages: pages.iter().map(prost::Message::encode_to_vec).collect(),
        expect,
        abort_once_at,
        what,
    }
}

/// The page a listing request asks for: `t<i>` is page `i`, the empty token page 0.
pub(crate) fn page_of(body: &[u8]) -> Option<usize> {
    let request = pb::ListVolumesRequest::decode(body.get(5..)?).ok()?;
    if request.starting_token.is_empty() {
        return Some(0);
    }
    request.starting_token.strip_prefix('t')?.parse().ok()
}

fn secrets(rng: &mut Rng) -> Secrets {
    let map: BTreeMap<String, String> = [(
        "password".to_owned(),
        format!("{MARKER}-{:016x}", rng.next_u64()),
    )]
    .into_iter()
    .collect();
    Secrets::try_from(map).unwrap_or_default()
}

/// Makes the call `rpc` on `client` with `options`; the result's summary on success.
pub(crate) async fn call(
    rpc: Rpc,
    client: &CsiClient,
    options: CallOptions,
    rng: &mut Rng,
) -> Result<String, csi_client::Error> {
    let secrets = secrets(rng);
    let volume = ExternalVolumeId::new("vol-under-test").ok();
    let node = PluginNodeId::new("node-under-test").ok();
    let (Some(volume), Some(node)) = (volume, node) else {
        return Ok("(cannot build ids)".into());
    };
    let cap = capability();
    match rpc {
        Rpc::Probe => client
            .identity()
            .with_options(options)
            .probe()
            .await
            .map(|r| if r.is_ready() { "ready" } else { "not_ready" }.to_owned()),
        Rpc::PluginInfo => client
            .identity()
            .with_options(options)
            .get_plugin_info()
            .await
            .map(|i| i.vendor_version),
        Rpc::PluginCaps => client
            .identity()
            .with_options(options)
            .get_plugin_capabilities()
            .await
            .map(|_| "ok".to_owned()),
        Rpc::CreateVolume => client
            .controller()
            .with_options(options)
            .create_volume(pb::CreateVolumeRequest {
                name: "pvc-campaign".into(),
                volume_capabilities: vec![(&cap).into()],
                secrets: secrets.to_wire(),
                ..Default::default()
            })
            .await
            .map(|v| v.volume_id.as_str().to_owned()),
        Rpc::DeleteVolume => client
            .controller()
            .with_options(options)
            .delete(&volume, &secrets)
            .await
            .map(|()| "ok".to_owned()),
        Rpc::Validate(policy) => client
            .controller()
            .with_options(options)
            .validate_volume_capabilities(
                &volume,
                &AskedCapabilities::new(vec![cap]),
                &secrets,
                policy,
            )
            .await
            .map(|c| {
                match c {
                    Confirmation::Confirmed => "confirmed",
                    Confirmation::AcceptedUnconfirmed { .. } => "accepted_unconfirmed",
                    Confirmation::NotConfirmed { .. } => "not_confirmed",
                }
                .to_owned()
            }),
        Rpc::ControllerPublish => client
            .controller()
            .with_options(options)
            .publish(
                &volume,
                &node,
                &cap,
                false,
                &VolumeContext::default(),
                &secrets,
            )
            .await
            .map(|c| format!("{} keys", c.len())),
        Rpc::ListAll => client
            .controller()
            .with_options(options)
            .list_all_volumes(pb::ListVolumesRequest::default())
            .await
            .map(|v| format!("{} entries", v.len())),
        Rpc::NodeStage => client
            .node()
            .with_options(options)
            .stage(&NodeStage {
                volume: &volume,
                staging_target_path: Path::new("/var/lib/campaign/staging/vol"),
                capability: &cap,
                publish_context: &PublishContext::default(),
                volume_context: &VolumeContext::default(),
                secrets: &secrets,
            })
            .await
            .map(|()| "ok".to_owned()),
        Rpc::NodePublish => client
            .node()
            .with_options(options)
            .publish(&NodePublish {
                volume: &volume,
                staging_target_path: Some(Path::new("/var/lib/campaign/staging/vol")),
                target_path: Path::new("/var/lib/campaign/pods/p/vol"),
                capability: &cap,
                readonly: rng.percent(50),
                publish_context: &PublishContext::default(),
                volume_context: &VolumeContext::default(),
                secrets: &secrets,
            })
            .await
            .map(|()| "ok".to_owned()),
        Rpc::NodeGetInfo => client
            .node()
            .with_options(options)
            .node_get_info()
            .await
            .map(|i| i.node_id.as_str().to_owned()),
    }
}
