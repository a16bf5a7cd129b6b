//! `ControllerExpandVolumeResponse` and `NodeExpandVolumeResponse` on the wire.

use csi_proto::v1;

use super::{by_ref_and_value, finish, optional_size, size_to_wire};
use crate::expansion::{ControllerExpansion, NodeExpansion};
use crate::validation::{FieldPath, ValidationErrors};

impl TryFrom<&v1::ControllerExpandVolumeResponse> for ControllerExpansion {
    type Error = super::WireError;
    fn try_from(w: &v1::ControllerExpandVolumeResponse) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let capacity = optional_size(
            &mut errs,
            FieldPath::named("capacity_bytes"),
            w.capacity_bytes,
        );
        let value = capacity.map(|c| ControllerExpansion {
            capacity_bytes: c.unwrap_or(0),
            node_expansion_required: w.node_expansion_required,
        });
        finish("ControllerExpandVolumeResponse", errs, value)
    }
}
by_ref_and_value!(v1::ControllerExpandVolumeResponse => ControllerExpansion);

impl From<&ControllerExpansion> for v1::ControllerExpandVolumeResponse {
    fn from(e: &ControllerExpansion) -> Self {
        v1::ControllerExpandVolumeResponse {
            capacity_bytes: size_to_wire(Some(e.capacity_bytes)),
            node_expansion_required: e.node_expansion_required,
        }
    }
}

impl TryFrom<&v1::NodeExpandVolumeResponse> for NodeExpansion {
    type Error = super::WireError;
    fn try_from(w: &v1::NodeExpandVolumeResponse) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let capacity = optional_size(
            &mut errs,
            FieldPath::named("capacity_bytes"),
            w.capacity_bytes,
        );
        let value = capacity.map(|capacity_bytes| NodeExpansion { capacity_bytes });
        finish("NodeExpandVolumeResponse", errs, value)
    }
}
by_ref_and_value!(v1::NodeExpandVolumeResponse => NodeExpansion);

impl From<&NodeExpansion> for v1::NodeExpandVolumeResponse {
    fn from(e: &NodeExpansion) -> Self {
        v1::NodeExpandVolumeResponse {
            capacity_bytes: size_to_wire(e.capacity_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::Problem;

    #[test]
    fn negative_sizes_are_refused_naming_the_field() {
        let err = ControllerExpansion::try_from(v1::ControllerExpandVolumeResponse {
            capacity_bytes: -5,
            node_expansion_required: true,
        })
        .unwrap_err();
        assert_eq!(err.message, "ControllerExpandVolumeResponse");
        let got: Vec<(String, Problem)> = err
            .errors
            .into_iter()
            .map(|v| (v.field.to_string(), v.problem))
            .collect();
        assert_eq!(
            got,
            [("capacity_bytes".to_owned(), Problem::Negative { value: -5 })]
        );

        let err = NodeExpansion::try_from(v1::NodeExpandVolumeResponse {
            capacity_bytes: i64::MIN,
        })
        .unwrap_err();
        assert_eq!(err.message, "NodeExpandVolumeResponse");
        assert_eq!(
            err.errors.violations()[0].problem,
            Problem::Negative { value: i64::MIN }
        );
    }

    #[test]
    fn sizes_round_trip() {
        for (capacity, required) in [(0, false), (1, true), (i64::MAX, false)] {
            let w = v1::ControllerExpandVolumeResponse {
                capacity_bytes: capacity,
                node_expansion_required: required,
            };
            let e = ControllerExpansion::try_from(&w).unwrap();
            assert_eq!(e.capacity_bytes, capacity.unsigned_abs());
            assert_eq!(e.node_expansion_required, required);
            assert_eq!(v1::ControllerExpandVolumeResponse::from(&e), w);

            let w = v1::NodeExpandVolumeResponse {
                capacity_bytes: capacity,
            };
            let n = NodeExpansion::try_from(&w).unwrap();
            assert_eq!(
                n.capacity_bytes,
                (capacity != 0).then(|| capacity.unsigned_abs())
            );
            assert_eq!(v1::NodeExpandVolumeResponse::from(&n), w);
        }
    }
}
