//! Secrets the mock demands: a plugin that refuses a call without the volume's secrets.
//!
//! Spec §3.6 has the plugin document the secrets it needs and the CO pass them through on
//! every call that takes them. [`MockPluginBuilder::require_secret`] and, while the mock
//! runs, [`MockPlugin::require_secret`] make the mock such a plugin: a call of the rpc whose
//! `secrets` map lacks the key, or holds another value under it, is refused with
//! INVALID_ARGUMENT, so a test can show that every call that takes secrets gets them.
//!
//! Only the rpcs whose request has a `secrets` field ([`takes_secrets`]) accept a
//! requirement. Nothing here prints a secret value: the refusal's message names the rpc and
//! the keys, the requirements' `Debug` shows keys only, and the call log holds the request as
//! its redacting `Debug` prints it.
//!
//! [`MockPluginBuilder::require_secret`]: crate::MockPluginBuilder::require_secret
//! [`MockPlugin::require_secret`]: crate::MockPlugin::require_secret

use std::collections::{BTreeMap, HashMap};

use csi_proto::{Rpc, v1};
use csi_structs::{Secrets, ValidationErrors};
use tonic::Status;

/// A secret requirement that cannot be met or was written wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretRequirementError {
    /// The rpc's request has no `secrets` field, so no call of it could ever carry the secret
    /// (see [`takes_secrets`]).
    #[error("{} takes no secrets (its request has no secrets field); a plugin cannot require one", rpc.name())]
    NoSecretsField {
        /// The rpc.
        rpc: Rpc,
    },
    /// The key breaks the spec's rule for secret names (§3.6: alphanumerics, `-`, `_`, `.`),
    /// or the rpc's required secrets together exceed the spec's 4 KiB for a map.
    #[error("a secret {} requires is invalid: {reason}", rpc.name())]
    Invalid {
        /// The rpc.
        rpc: Rpc,
        /// What is wrong, as csi-structs' [`Secrets`] checks it (keys and sizes, never a
        /// value).
        reason: ValidationErrors,
    },
    /// A text requirement (`csi-mock-plugin --require-secret`) is not `RPC:KEY=VALUE`. The
    /// text is not quoted: it may hold the value.
    #[error(
        "a secret requirement must be RPC:KEY=VALUE (the text is not shown: it holds a secret)"
    )]
    Malformed,
    /// A text requirement names no rpc this crate knows. The name is not quoted: in a
    /// mistyped requirement it may be the value.
    #[error(
        "a secret requirement names an unknown rpc (RPC:KEY=VALUE, RPC as in NodeStageVolume; \
         the text is not shown: it holds a secret)"
    )]
    UnknownRpc,
}

/// Reads a requirement written `RPC:KEY=VALUE` (the rpc name in any case), as
/// `csi-mock-plugin --require-secret` takes it: the rpc, the key and the value.
///
/// ```
/// use csi_proto::Rpc;
///
/// let (rpc, key, value) = csi_testkit::secrets::parse_requirement("NodeStageVolume:token=t0k3n")?;
/// assert_eq!((rpc, key.as_str(), value.as_str()), (Rpc::NodeStageVolume, "token", "t0k3n"));
/// # Ok::<(), csi_testkit::secrets::SecretRequirementError>(())
/// ```
///
/// # Errors
///
/// [`SecretRequirementError::Malformed`] without the `:` or the `=`,
/// [`SecretRequirementError::UnknownRpc`] for an rpc name this crate does not know; neither
/// quotes the text. Whether the rpc takes secrets and the key is valid is checked where the
/// requirement is added.
pub fn parse_requirement(text: &str) -> Result<(Rpc, String, String), SecretRequirementError> {
    let (rpc, pair) = text
        .split_once(':')
        .ok_or(SecretRequirementError::Malformed)?;
    let (key, value) = pair
        .split_once('=')
        .ok_or(SecretRequirementError::Malformed)?;
    let rpc = crate::fault_spec::rpc_by_name(rpc).ok_or(SecretRequirementError::UnknownRpc)?;
    Ok((rpc, key.to_string(), value.to_string()))
}

/// The secrets each rpc demands, as [`MockPluginBuilder::require_secret`] and
/// [`MockPlugin::require_secret`] set them. `Debug` shows rpcs and keys only ([`Secrets`]
/// redacts the values).
///
/// [`MockPluginBuilder::require_secret`]: crate::MockPluginBuilder::require_secret
/// [`MockPlugin::require_secret`]: crate::MockPlugin::require_secret
#[derive(Clone, Debug, Default)]
pub(crate) struct SecretRequirements(BTreeMap<Rpc, Secrets>);

impl SecretRequirements {
    /// From now on calls of `rpc` need `key` with exactly `value` (replacing a value required
    /// for the same key before; other keys stay required).
    pub(crate) fn require(
        &mut self,
        rpc: Rpc,
        key: String,
        value: String,
    ) -> Result<(), SecretRequirementError> {
        if !takes_secrets(rpc) {
            return Err(SecretRequirementError::NoSecretsField { rpc });
        }
        let mut wanted = self.0.get(&rpc).cloned().unwrap_or_default().into_exposed();
        wanted.insert(key, value);
        let wanted = Secrets::try_new(wanted)
            .map_err(|reason| SecretRequirementError::Invalid { rpc, reason })?;
        self.0.insert(rpc, wanted);
        Ok(())
    }

    /// Checks a call of `rpc` carrying `given` (its request's `secrets`; `None` for a request
    /// without the field): INVALID_ARGUMENT naming the rpc and every key that is missing or
    /// holds another value, never a value.
    pub(crate) fn check(
        &self,
        rpc: Rpc,
        given: Option<&HashMap<String, String>>,
    ) -> Result<(), Status> {
        let Some(wanted) = self.0.get(&rpc) else {
            return Ok(());
        };
        let problems: Vec<String> = wanted
            .iter_exposed()
            .filter_map(
                |(key, value)| match given.and_then(|given| given.get(key)) {
                    None => Some(format!("missing secret {key:?}")),
                    Some(sent) if sent != value => Some(format!(
                        "secret {key:?} has another value than the one required"
                    )),
                    Some(_) => None,
                },
            )
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Status::invalid_argument(format!(
                "{}: {}",
                rpc.name(),
                problems.join(", ")
            )))
        }
    }
}

/// The `secrets` of a request, for the check in `MockPlugin::begin`.
pub(crate) trait CallSecrets {
    /// The request's `secrets` map; `None` for a request type without the field.
    fn secrets(&self) -> Option<&HashMap<String, String>>;
}

/// One row per rpc: `Rpc => request type`, with `{ secrets }` where the request has the
/// field. Implements [`CallSecrets`] for every request type and writes [`takes_secrets`] as
/// an exhaustive match, so an rpc added to csi-proto does not compile until it has its row;
/// a test compares the rows with the descriptor's `(csi_secret)` fields.
macro_rules! call_secrets {
    (@field $this:ident) => { None };
    (@field $this:ident $field:ident) => { Some(&$this.$field) };
    (@takes) => { false };
    (@takes $field:ident) => { true };
    ($($rpc:ident => $request:ident $({ $field:ident })?,)*) => {
        $(
            impl CallSecrets for v1::$request {
                fn secrets(&self) -> Option<&HashMap<String, String>> {
                    call_secrets!(@field self $($field)?)
                }
            }
        )*

        /// Whether `rpc`'s request has a `secrets` field (spec §3.6; the fields marked
        /// `(csi_secret)`): only such rpcs accept a
        /// [`require_secret`](crate::MockPluginBuilder::require_secret).
        ///
        /// ```
        /// use csi_proto::Rpc;
        /// use csi_testkit::secrets::takes_secrets;
        ///
        /// assert!(takes_secrets(Rpc::NodeStageVolume));
        /// assert!(!takes_secrets(Rpc::NodeUnpublishVolume));
        /// ```
        pub const fn takes_secrets(rpc: Rpc) -> bool {
            match rpc {
                $(Rpc::$rpc => call_secrets!(@takes $($field)?),)*
            }
        }

        /// Every rpc, its request type's name and whether it implements a `secrets` field.
        #[cfg(test)]
        const ROWS: &[(Rpc, &str, bool)] = &[
            $((Rpc::$rpc, stringify!($request), call_secrets!(@takes $($field)?)),)*
        ];
    };
}

call_secrets! {
    GetPluginInfo => GetPluginInfoRequest,
    GetPluginCapabilities => GetPluginCapabilitiesRequest,
    Probe => ProbeRequest,
    CreateVolume => CreateVolumeRequest { secrets },
    DeleteVolume => DeleteVolumeRequest { secrets },
    ControllerPublishVolume => ControllerPublishVolumeRequest { secrets },
    ControllerUnpublishVolume => ControllerUnpublishVolumeRequest { secrets },
    ValidateVolumeCapabilities => ValidateVolumeCapabilitiesRequest { secrets },
    ListVolumes => ListVolumesRequest,
    ControllerListVolumeHealth => ControllerListVolumeHealthRequest { secrets },
    ControllerGetVolumeHealth => ControllerGetVolumeHealthRequest { secrets },
    GetCapacity => GetCapacityRequest,
    ControllerGetCapabilities => ControllerGetCapabilitiesRequest,
    CreateSnapshot => CreateSnapshotRequest { secrets },
    DeleteSnapshot => DeleteSnapshotRequest { secrets },
    ListSnapshots => ListSnapshotsRequest { secrets },
    GetSnapshot => GetSnapshotRequest { secrets },
    ControllerExpandVolume => ControllerExpandVolumeRequest { secrets },
    ControllerGetVolume => ControllerGetVolumeRequest,
    ControllerModifyVolume => ControllerModifyVolumeRequest { secrets },
    GroupControllerGetCapabilities => GroupControllerGetCapabilitiesRequest,
    CreateVolumeGroupSnapshot => CreateVolumeGroupSnapshotRequest { secrets },
    DeleteVolumeGroupSnapshot => DeleteVolumeGroupSnapshotRequest { secrets },
    GetVolumeGroupSnapshot => GetVolumeGroupSnapshotRequest { secrets },
    GetMetadataAllocated => GetMetadataAllocatedRequest { secrets },
    GetMetadataDelta => GetMetadataDeltaRequest { secrets },
    NodeStageVolume => NodeStageVolumeRequest { secrets },
    NodeUnstageVolume => NodeUnstageVolumeRequest,
    NodePublishVolume => NodePublishVolumeRequest { secrets },
    NodeUnpublishVolume => NodeUnpublishVolumeRequest,
    NodeGetVolumeStats => NodeGetVolumeStatsRequest,
    NodeGetVolumeHealth => NodeGetVolumeHealthRequest,
    NodeGetStorageHealth => NodeGetStorageHealthRequest { secrets },
    NodeExpandVolume => NodeExpandVolumeRequest { secrets },
    NodeGetCapabilities => NodeGetCapabilitiesRequest,
    NodeGetInfo => NodeGetInfoRequest,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use prost::Message;
    use prost_types::FileDescriptorSet;
    use tonic::Code;

    use super::*;

    const VALUE: &str = "S3CR3T-VALUE";

    /// The rows agree with the schema: for every method of every csi.v1 service, its rpc,
    /// its request type, and whether that message has a `(csi_secret)` field.
    #[test]
    fn rows_match_the_descriptor() {
        let set = FileDescriptorSet::decode(csi_proto::FILE_DESCRIPTOR_SET)
            .expect("the embedded descriptor set decodes");
        let secret_messages: BTreeSet<&str> = csi_proto::SECRET_FIELDS
            .iter()
            .map(|(message, _)| *message)
            .collect();
        let mut from_descriptor = Vec::new();
        for file in set
            .file
            .iter()
            .filter(|f| f.package() == csi_proto::PACKAGE)
        {
            for service in &file.service {
                for method in &service.method {
                    let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                    let rpc = Rpc::from_path(&path).expect("every method is an Rpc");
                    let input = method.input_type().trim_start_matches('.');
                    let name = input.rsplit('.').next().unwrap_or_default().to_string();
                    from_descriptor.push((rpc, name, secret_messages.contains(input)));
                }
            }
        }
        from_descriptor.sort();
        let mut rows: Vec<(Rpc, String, bool)> = ROWS
            .iter()
            .map(|&(rpc, name, secrets)| (rpc, name.to_string(), secrets))
            .collect();
        rows.sort();
        assert_eq!(rows, from_descriptor);
        assert_eq!(rows.iter().filter(|row| row.2).count(), 22);
        for &(rpc, _, secrets) in ROWS {
            assert_eq!(takes_secrets(rpc), secrets, "{rpc:?}");
        }
    }

    #[test]
    fn the_request_types_hand_out_their_secrets() {
        let mut stage = v1::NodeStageVolumeRequest::default();
        stage.secrets.insert("token".into(), VALUE.into());
        assert_eq!(stage.secrets(), Some(&stage.secrets));
        assert_eq!(v1::NodeUnstageVolumeRequest::default().secrets(), None);
        let modify = v1::ControllerModifyVolumeRequest::default();
        assert!(modify.secrets().is_some_and(HashMap::is_empty));
    }

    fn given(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn every_requirement_must_hold_and_the_message_names_keys_only() {
        let mut reqs = SecretRequirements::default();
        reqs.require(Rpc::CreateVolume, "user".into(), "admin".into())
            .unwrap();
        reqs.require(Rpc::CreateVolume, "token".into(), VALUE.into())
            .unwrap();
        let ok = given(&[("user", "admin"), ("token", VALUE), ("extra", "x")]);
        assert!(reqs.check(Rpc::CreateVolume, Some(&ok)).is_ok());
        // Another rpc is not affected, with or without secrets.
        assert!(reqs.check(Rpc::DeleteVolume, Some(&given(&[]))).is_ok());
        assert!(reqs.check(Rpc::NodeUnpublishVolume, None).is_ok());

        let status = reqs
            .check(
                Rpc::CreateVolume,
                Some(&given(&[("user", "admin"), ("token", "guess")])),
            )
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        let message = status.message();
        assert!(message.starts_with("CreateVolume: "), "{message}");
        assert!(
            message.contains("\"token\"") && !message.contains("\"user\""),
            "{message}"
        );
        assert!(
            !message.contains(VALUE) && !message.contains("guess"),
            "{message}"
        );

        let status = reqs
            .check(Rpc::CreateVolume, Some(&given(&[])))
            .unwrap_err();
        let message = status.message();
        assert!(
            message.contains("missing secret \"token\"")
                && message.contains("missing secret \"user\""),
            "{message}"
        );
        assert!(
            !message.contains(VALUE) && !message.contains("admin"),
            "{message}"
        );
        assert!(!format!("{reqs:?}").contains(VALUE));
    }

    #[test]
    fn a_later_value_for_the_same_key_replaces_the_earlier_one() {
        let mut reqs = SecretRequirements::default();
        reqs.require(Rpc::NodeStageVolume, "token".into(), "old".into())
            .unwrap();
        reqs.require(Rpc::NodeStageVolume, "token".into(), "new".into())
            .unwrap();
        let new = given(&[("token", "new")]);
        assert!(reqs.check(Rpc::NodeStageVolume, Some(&new)).is_ok());
        let old = given(&[("token", "old")]);
        assert!(reqs.check(Rpc::NodeStageVolume, Some(&old)).is_err());
    }

    #[test]
    fn requirements_that_cannot_be_met_are_refused() {
        let mut reqs = SecretRequirements::default();
        assert_eq!(
            reqs.require(Rpc::NodeUnpublishVolume, "token".into(), VALUE.into()),
            Err(SecretRequirementError::NoSecretsField {
                rpc: Rpc::NodeUnpublishVolume
            })
        );
        let err = reqs
            .require(Rpc::NodeStageVolume, "bad key".into(), VALUE.into())
            .unwrap_err();
        assert!(matches!(
            err,
            SecretRequirementError::Invalid {
                rpc: Rpc::NodeStageVolume,
                ..
            }
        ));
        let text = err.to_string();
        assert!(
            text.contains("NodeStageVolume") && !text.contains(VALUE),
            "{text}"
        );
        // Nothing was kept from the refused requirements.
        assert!(reqs.check(Rpc::NodeStageVolume, Some(&given(&[]))).is_ok());
        assert!(reqs.check(Rpc::NodeUnpublishVolume, None).is_ok());
    }

    #[test]
    fn text_requirements_never_quote_the_text() {
        assert_eq!(
            parse_requirement("createvolume:token=a:b=c"),
            Ok((Rpc::CreateVolume, "token".into(), "a:b=c".into()))
        );
        for bad in [
            VALUE.to_string(),
            format!("CreateVolume:{VALUE}"),
            format!("{VALUE}:token=x"),
        ] {
            let err = parse_requirement(&bad).unwrap_err();
            assert!(!err.to_string().contains(VALUE), "{err}");
        }
        assert_eq!(
            parse_requirement(&format!("{VALUE}:token=x")),
            Err(SecretRequirementError::UnknownRpc)
        );
    }
}
