//! `Topology` and `TopologyRequirement` on the wire.

use csi_proto::v1;

use super::{by_ref_and_value, finish};
use crate::topology::{Topology, TopologyRequirement, check_requirement};
use crate::validation::{FieldPath, ValidationErrors};

impl From<&Topology> for v1::Topology {
    fn from(t: &Topology) -> Self {
        v1::Topology {
            segments: t.to_wire_segments(),
        }
    }
}

impl From<Topology> for v1::Topology {
    fn from(t: Topology) -> Self {
        (&t).into()
    }
}

pub(crate) fn topology_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    w: &v1::Topology,
) -> Option<Topology> {
    super::collect(errs, Topology::from_wire_at(&w.segments, at))
}

/// A list of topologies, each checked under `at[i]`. An empty list is valid.
pub(crate) fn topologies_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    list: &[v1::Topology],
) -> Option<Vec<Topology>> {
    let parsed: Vec<Option<Topology>> = list
        .iter()
        .enumerate()
        .map(|(i, t)| topology_from_wire(errs, &at.clone().index(i), t))
        .collect();
    parsed.into_iter().collect()
}

impl TryFrom<&v1::Topology> for Topology {
    type Error = super::WireError;
    fn try_from(w: &v1::Topology) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let value = topology_from_wire(&mut errs, &FieldPath::root(), w);
        finish("Topology", errs, value)
    }
}
by_ref_and_value!(v1::Topology => Topology);

impl From<&TopologyRequirement> for v1::TopologyRequirement {
    fn from(r: &TopologyRequirement) -> Self {
        v1::TopologyRequirement {
            requisite: r.requisite().iter().map(Into::into).collect(),
            preferred: r.preferred().iter().map(Into::into).collect(),
        }
    }
}

impl From<TopologyRequirement> for v1::TopologyRequirement {
    fn from(r: TopologyRequirement) -> Self {
        (&r).into()
    }
}

pub(crate) fn requirement_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    w: &v1::TopologyRequirement,
) -> Option<TopologyRequirement> {
    let requisite = topologies_from_wire(errs, &at.clone().field("requisite"), &w.requisite);
    let preferred = topologies_from_wire(errs, &at.clone().field("preferred"), &w.preferred);
    let (requisite, preferred) = (requisite?, preferred?);
    let before = errs.len();
    check_requirement(errs, at, &requisite, &preferred);
    if errs.len() != before {
        return None;
    }
    TopologyRequirement::new(requisite, preferred).ok()
}

impl TryFrom<&v1::TopologyRequirement> for TopologyRequirement {
    type Error = super::WireError;
    fn try_from(w: &v1::TopologyRequirement) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let value = requirement_from_wire(&mut errs, &FieldPath::root(), w);
        finish("TopologyRequirement", errs, value)
    }
}
by_ref_and_value!(v1::TopologyRequirement => TopologyRequirement);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::Problem;

    #[test]
    fn paths_name_the_list_entry() {
        let good = v1::Topology {
            segments: [("zone".to_string(), "a".to_string())].into(),
        };
        let bad = v1::Topology {
            segments: [("zone".to_string(), String::new())].into(),
        };
        let w = v1::TopologyRequirement {
            requisite: vec![good.clone(), bad],
            preferred: vec![],
        };
        let err = TopologyRequirement::try_from(&w).unwrap_err();
        assert_eq!(err.message, "TopologyRequirement");
        assert_eq!(
            err.errors.violations()[0].field.to_string(),
            "requisite[1].segments[\"zone\"].value"
        );
        let w = v1::TopologyRequirement {
            requisite: vec![good.clone()],
            preferred: vec![v1::Topology {
                segments: [("zone".to_string(), "b".to_string())].into(),
            }],
        };
        let err = TopologyRequirement::try_from(w).unwrap_err();
        assert_eq!(
            err.errors.violations()[0].problem,
            Problem::PreferredNotInRequisite
        );
        let ok = TopologyRequirement::try_from(v1::TopologyRequirement {
            requisite: vec![good.clone()],
            preferred: vec![good],
        })
        .unwrap();
        assert_eq!(ok.preferred().len(), 1);
    }
}
