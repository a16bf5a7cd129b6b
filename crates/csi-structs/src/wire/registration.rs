//! A volume spec as the `CreateVolume` request that creates it.

use csi_proto::v1;

use crate::registration::VolumeSpec;

/// The `CreateVolume` request for a volume the orchestrator creates (see
/// [`RegisteredVolume::for_creation`](crate::RegisteredVolume::for_creation)).
///
/// `name` is the orchestrator's volume id: the same on every attempt, so a request repeated
/// after an uncertain answer finds the volume the first one made instead of making another.
/// The rest is the spec's: size range, capabilities, parameters (fixed and mutable), secrets,
/// content source and topology requirement.
impl From<&VolumeSpec> for v1::CreateVolumeRequest {
    fn from(spec: &VolumeSpec) -> Self {
        v1::CreateVolumeRequest {
            name: spec.id.as_str().to_owned(),
            capacity_range: spec.capacity.as_ref().map(Into::into),
            volume_capabilities: spec.requested_capabilities.iter().map(Into::into).collect(),
            parameters: spec.parameters.to_wire(),
            secrets: spec.secrets.to_wire(),
            volume_content_source: spec.content_source.as_ref().map(Into::into),
            accessibility_requirements: spec.requested_topology.as_ref().map(Into::into),
            mutable_parameters: spec.mutable_parameters.to_wire(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        AccessMode, CapacityRange, Parameters, PluginId, Secrets, VolumeCapability, VolumeId,
    };

    #[test]
    fn every_field_of_the_spec_reaches_the_request() {
        let mut spec = VolumeSpec::new(
            VolumeId::new("db").unwrap(),
            PluginId::new("ebs").unwrap(),
            vec![VolumeCapability::block(AccessMode::SingleNodeWriter)],
        );
        spec.capacity = Some(CapacityRange::new(Some(1 << 30), Some(2 << 30)).unwrap());
        spec.parameters = Parameters::try_from_iter([("type", "gp3")]).unwrap();
        spec.secrets = Secrets::try_from_iter([("token", "s3cret-marker")]).unwrap();
        let request = v1::CreateVolumeRequest::from(&spec);
        assert_eq!(request.name, "db", "the id: stable across retries");
        assert_eq!(
            request.capacity_range,
            Some(v1::CapacityRange {
                required_bytes: 1 << 30,
                limit_bytes: 2 << 30
            })
        );
        assert_eq!(request.volume_capabilities.len(), 1);
        assert_eq!(request.parameters["type"], "gp3");
        assert_eq!(request.secrets["token"], "s3cret-marker");
        assert!(request.volume_content_source.is_none());
        assert!(request.accessibility_requirements.is_none());
        assert!(!format!("{request:?}").contains("s3cret-marker"));
    }
}
