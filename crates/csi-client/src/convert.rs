//! Wire answers to `csi-structs` values. The rules live in `csi-structs`; this module only
//! turns its conversion errors into this crate's [`ErrorKind`].

use csi_structs::WireError;

use crate::error::{ErrorKind, ResponseError};

/// A conversion failure is an invalid response; the violations name the fields.
pub(crate) fn invalid(err: WireError) -> ErrorKind {
    ErrorKind::InvalidResponse(ResponseError::Fields(err.errors))
}

/// Converts a checked wire answer into a domain value.
pub(crate) fn wire<W, D>(resp: W) -> Result<D, ErrorKind>
where
    D: TryFrom<W, Error = WireError>,
{
    D::try_from(resp).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::v1 as pb;
    use csi_structs::{NodeCapabilities, NodeInfo};

    #[test]
    fn unknown_capability_numbers_are_ignored_not_rejected() {
        use pb::node_service_capability::{Rpc, Type};
        let resp = pb::NodeGetCapabilitiesResponse {
            capabilities: vec![
                pb::NodeServiceCapability {
                    r#type: Some(Type::Rpc(Rpc { r#type: 1 })),
                },
                pb::NodeServiceCapability {
                    r#type: Some(Type::Rpc(Rpc { r#type: 999 })),
                },
            ],
        };
        let caps = NodeCapabilities::from(&resp);
        assert!(caps.requires_staging());
        assert_eq!(caps.unknown().collect::<Vec<_>>(), [999]);
    }

    #[test]
    fn conversion_failures_name_the_field() {
        let err = wire::<_, NodeInfo>(pb::NodeGetInfoResponse::default()).unwrap_err();
        let ErrorKind::InvalidResponse(ResponseError::Fields(errs)) = err else {
            panic!("expected an invalid response, got {err:?}");
        };
        assert_eq!(errs.violations()[0].field.to_string(), "node_id");
    }
}
