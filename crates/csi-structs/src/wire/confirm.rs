//! `ValidateVolumeCapabilities` request and answer on the wire.
//!
//! Confirmed capabilities are read leniently on purpose: an `UNKNOWN` mode, an unknown mode
//! number or an unset access type is kept as such ([`ConfirmedAccessMode`],
//! `access_type: None`) for [`confirm`](crate::confirm::confirm) to judge under its policy,
//! instead of failing the whole answer. Size limits still apply.

use csi_proto::v1;
use csi_proto::v1::validate_volume_capabilities_response as vvc;
use csi_proto::v1::volume_capability as vc;

use super::capability::{capabilities_from_wire, mount_from_wire};
use super::{by_ref_and_value, collect, finish, non_empty};
use crate::capability::{AccessMode, AccessModeError, AccessType};
use crate::confirm::{
    AskedCapabilities, Confirmed, ConfirmedAccessMode, ConfirmedCapability, ValidationResponse,
};
use crate::ids::ExternalVolumeId;
use crate::maps::{MutableParameters, Parameters, VolumeContext};
use crate::secrets::Secrets;
use crate::validation::{FieldPath, ValidationErrors};

impl From<&ConfirmedCapability> for v1::VolumeCapability {
    fn from(c: &ConfirmedCapability) -> Self {
        let mode = match c.access_mode {
            ConfirmedAccessMode::NotValidated => 0,
            ConfirmedAccessMode::Mode(m) => m.to_wire(),
            ConfirmedAccessMode::Unrecognized(n) => n,
        };
        v1::VolumeCapability {
            access_mode: Some(vc::AccessMode { mode }),
            access_type: c.access_type.as_ref().map(Into::into),
        }
    }
}

fn confirmed_capability(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    w: &v1::VolumeCapability,
) -> Option<ConfirmedCapability> {
    let access_mode = match w.access_mode.map(|m| AccessMode::from_wire(m.mode)) {
        None | Some(Err(AccessModeError::Unspecified)) => ConfirmedAccessMode::NotValidated,
        Some(Ok(m)) => ConfirmedAccessMode::Mode(m),
        Some(Err(AccessModeError::Unrecognized(n))) => ConfirmedAccessMode::Unrecognized(n),
    };
    let access_type = match &w.access_type {
        None => None,
        Some(vc::AccessType::Block(_)) => Some(AccessType::Block),
        Some(vc::AccessType::Mount(m)) => {
            let opts = mount_from_wire(m);
            let before = errs.len();
            opts.check(errs, &at.clone().field("mount"));
            if errs.len() != before {
                return None;
            }
            Some(AccessType::Mount(opts))
        }
    };
    Some(ConfirmedCapability {
        access_mode,
        access_type,
    })
}

impl From<&ValidationResponse> for v1::ValidateVolumeCapabilitiesResponse {
    fn from(r: &ValidationResponse) -> Self {
        v1::ValidateVolumeCapabilitiesResponse {
            confirmed: r.confirmed.as_ref().map(|c| vvc::Confirmed {
                volume_context: c.volume_context.to_wire(),
                volume_capabilities: c.volume_capabilities.iter().map(Into::into).collect(),
                parameters: c.parameters.to_wire(),
                mutable_parameters: c.mutable_parameters.to_wire(),
            }),
            message: r.message.clone().unwrap_or_default(),
        }
    }
}

impl TryFrom<&v1::ValidateVolumeCapabilitiesResponse> for ValidationResponse {
    type Error = super::WireError;
    fn try_from(w: &v1::ValidateVolumeCapabilitiesResponse) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let confirmed = match &w.confirmed {
            None => Some(None),
            Some(c) => {
                let at = FieldPath::named("confirmed");
                let caps: Vec<Option<ConfirmedCapability>> = c
                    .volume_capabilities
                    .iter()
                    .enumerate()
                    .map(|(i, cap)| {
                        confirmed_capability(
                            &mut errs,
                            &at.clone().field("volume_capabilities").index(i),
                            cap,
                        )
                    })
                    .collect();
                let ctx = collect(
                    &mut errs,
                    VolumeContext::from_wire_at(
                        c.volume_context.clone(),
                        &at.clone().field("volume_context"),
                    ),
                );
                let params = collect(
                    &mut errs,
                    Parameters::from_wire_at(c.parameters.clone(), &at.clone().field("parameters")),
                );
                let mutable = collect(
                    &mut errs,
                    MutableParameters::from_wire_at(
                        c.mutable_parameters.clone(),
                        &at.clone().field("mutable_parameters"),
                    ),
                );
                let caps: Option<Vec<ConfirmedCapability>> = caps.into_iter().collect();
                match (caps, ctx, params, mutable) {
                    (
                        Some(volume_capabilities),
                        Some(volume_context),
                        Some(parameters),
                        Some(mutable_parameters),
                    ) => Some(Some(Confirmed {
                        volume_capabilities,
                        volume_context,
                        parameters,
                        mutable_parameters,
                    })),
                    _ => None,
                }
            }
        };
        let value = confirmed.map(|confirmed| ValidationResponse {
            confirmed,
            message: non_empty(&w.message),
        });
        finish("ValidateVolumeCapabilitiesResponse", errs, value)
    }
}
by_ref_and_value!(v1::ValidateVolumeCapabilitiesResponse => ValidationResponse);

impl AskedCapabilities {
    /// The `ValidateVolumeCapabilities` request asking this about `volume_id`.
    pub fn to_request(
        &self,
        volume_id: &ExternalVolumeId,
        secrets: &Secrets,
    ) -> v1::ValidateVolumeCapabilitiesRequest {
        v1::ValidateVolumeCapabilitiesRequest {
            volume_id: volume_id.as_str().to_string(),
            volume_context: self.volume_context.to_wire(),
            volume_capabilities: self.volume_capabilities.iter().map(Into::into).collect(),
            parameters: self.parameters.to_wire(),
            secrets: secrets.to_wire(),
            mutable_parameters: self.mutable_parameters.to_wire(),
        }
    }
}

impl TryFrom<&v1::ValidateVolumeCapabilitiesRequest> for AskedCapabilities {
    type Error = super::WireError;
    /// The question in a request (the volume id and secrets are not part of it).
    fn try_from(w: &v1::ValidateVolumeCapabilitiesRequest) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let caps = capabilities_from_wire(
            &mut errs,
            &FieldPath::named("volume_capabilities"),
            &w.volume_capabilities,
        );
        let ctx = collect(
            &mut errs,
            VolumeContext::from_wire_at(
                w.volume_context.clone(),
                &FieldPath::named("volume_context"),
            ),
        );
        let params = collect(
            &mut errs,
            Parameters::from_wire_at(w.parameters.clone(), &FieldPath::named("parameters")),
        );
        let mutable = collect(
            &mut errs,
            MutableParameters::from_wire_at(
                w.mutable_parameters.clone(),
                &FieldPath::named("mutable_parameters"),
            ),
        );
        let value = match (caps, ctx, params, mutable) {
            (
                Some(volume_capabilities),
                Some(volume_context),
                Some(parameters),
                Some(mutable_parameters),
            ) => Some(AskedCapabilities {
                volume_capabilities,
                volume_context,
                parameters,
                mutable_parameters,
            }),
            _ => None,
        };
        finish("ValidateVolumeCapabilitiesRequest", errs, value)
    }
}
by_ref_and_value!(v1::ValidateVolumeCapabilitiesRequest => AskedCapabilities);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability::{MountOptions, VolumeCapability};
    use crate::confirm::{ConfirmPolicy, Confirmation, confirm};

    #[test]
    fn incomplete_confirmations_survive_parsing() {
        let w = v1::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(vvc::Confirmed {
                volume_capabilities: vec![
                    v1::VolumeCapability {
                        access_mode: Some(vc::AccessMode { mode: 0 }),
                        access_type: None,
                    },
                    v1::VolumeCapability {
                        access_mode: Some(vc::AccessMode { mode: 55 }),
                        access_type: Some(vc::AccessType::Block(vc::BlockVolume {})),
                    },
                ],
                ..Default::default()
            }),
            message: String::new(),
        };
        let r = ValidationResponse::try_from(&w).unwrap();
        let caps = &r.confirmed.as_ref().unwrap().volume_capabilities;
        assert_eq!(caps[0].access_mode, ConfirmedAccessMode::NotValidated);
        assert_eq!(caps[0].access_type, None);
        assert_eq!(caps[1].access_mode, ConfirmedAccessMode::Unrecognized(55));
        assert_eq!(r.message, None);
        assert_eq!(v1::ValidateVolumeCapabilitiesResponse::from(&r), w);
    }

    #[test]
    fn request_round_trip_and_end_to_end() {
        let mut asked = AskedCapabilities::new(vec![VolumeCapability::mount(
            AccessMode::SingleNodeWriter,
            MountOptions::new().with_fs_type("ext4"),
        )]);
        asked.volume_context = VolumeContext::try_from_iter([("k", "v")]).unwrap();
        let id = ExternalVolumeId::new("vol-1").unwrap();
        let secrets = Secrets::try_from_iter([("token", "t")]).unwrap();
        let req = asked.to_request(&id, &secrets);
        assert_eq!(req.volume_id, "vol-1");
        assert_eq!(AskedCapabilities::try_from(&req).unwrap(), asked);
        // A plugin that echoes the request's capabilities as-is confirms.
        let resp = v1::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(vvc::Confirmed {
                volume_capabilities: req.volume_capabilities.clone(),
                volume_context: req.volume_context.clone(),
                ..Default::default()
            }),
            message: String::new(),
        };
        let parsed = ValidationResponse::try_from(resp).unwrap();
        assert_eq!(
            confirm(&asked, &parsed, ConfirmPolicy::Strict),
            Confirmation::Confirmed
        );
    }

    #[test]
    fn oversized_maps_are_errors() {
        let w = v1::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(vvc::Confirmed {
                parameters: [("k".to_string(), "v".repeat(5000))].into(),
                ..Default::default()
            }),
            message: String::new(),
        };
        let err = ValidationResponse::try_from(w).unwrap_err();
        assert_eq!(
            err.errors.violations()[0].field.to_string(),
            "confirmed.parameters"
        );
    }
}
