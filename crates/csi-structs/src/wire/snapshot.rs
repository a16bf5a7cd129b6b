//! `Snapshot`, `VolumeGroupSnapshot` and their response wrappers on the wire.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use csi_proto::v1;

use super::{by_ref_and_value, collect, finish, optional_size, size_to_wire};
use crate::ids::{ExternalVolumeId, GroupSnapshotId, SnapshotId};
use crate::snapshot::{Snapshot, VolumeGroupSnapshot};
use crate::validation::{FieldPath, Problem, ValidationErrors};

const NANOS_PER_SEC: u32 = 1_000_000_000;

/// `SystemTime` as protobuf `Timestamp` seconds and nanos (nanos always in `0..1e9`).
pub(crate) fn time_to_wire(t: SystemTime) -> (i64, i32) {
    let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if d.subsec_nanos() == 0 {
                (-secs, 0)
            } else {
                (-secs - 1, NANOS_PER_SEC - d.subsec_nanos())
            }
        }
    };
    (secs, i32::try_from(nanos).unwrap_or(0))
}

/// Protobuf `Timestamp` seconds and nanos as `SystemTime`, or `None` when out of range.
pub(crate) fn time_from_wire(seconds: i64, nanos: i32) -> Option<SystemTime> {
    let nanos = u32::try_from(nanos).ok().filter(|n| *n < NANOS_PER_SEC)?;
    let base = if seconds >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(seconds.unsigned_abs()))?
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(seconds.unsigned_abs()))?
    };
    base.checked_add(Duration::from_nanos(u64::from(nanos)))
}

fn creation_time(
    errs: &mut ValidationErrors,
    at: FieldPath,
    seconds_nanos: Option<(i64, i32)>,
) -> Option<SystemTime> {
    match seconds_nanos {
        None => {
            errs.push(at, Problem::Missing);
            None
        }
        Some((seconds, nanos)) => {
            let t = time_from_wire(seconds, nanos);
            if t.is_none() {
                errs.push(at, Problem::InvalidTimestamp { seconds, nanos });
            }
            t
        }
    }
}

impl From<&Snapshot> for v1::Snapshot {
    fn from(s: &Snapshot) -> Self {
        let (seconds, nanos) = time_to_wire(s.creation_time);
        let mut w = v1::Snapshot {
            size_bytes: size_to_wire(s.size_bytes),
            snapshot_id: s.snapshot_id.as_str().to_string(),
            source_volume_id: s.source_volume_id.as_str().to_string(),
            creation_time: Some(Default::default()),
            ready_to_use: s.ready_to_use,
            group_snapshot_id: s
                .group_snapshot_id
                .as_ref()
                .map(|g| g.as_str().to_string())
                .unwrap_or_default(),
            accessible_topology: s.accessible_topology.iter().map(Into::into).collect(),
        };
        if let Some(ts) = w.creation_time.as_mut() {
            ts.seconds = seconds;
            ts.nanos = nanos;
        }
        w
    }
}

impl From<Snapshot> for v1::Snapshot {
    fn from(s: Snapshot) -> Self {
        (&s).into()
    }
}

pub(crate) fn snapshot_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    w: &v1::Snapshot,
) -> Option<Snapshot> {
    let snapshot_id = collect(
        errs,
        SnapshotId::new_at(w.snapshot_id.clone(), &at.clone().field("snapshot_id")),
    );
    let source_volume_id = collect(
        errs,
        ExternalVolumeId::new_at(
            w.source_volume_id.clone(),
            &at.clone().field("source_volume_id"),
        ),
    );
    let size_bytes = optional_size(errs, at.clone().field("size_bytes"), w.size_bytes);
    let created = creation_time(
        errs,
        at.clone().field("creation_time"),
        w.creation_time.as_ref().map(|t| (t.seconds, t.nanos)),
    );
    let group_snapshot_id = if w.group_snapshot_id.is_empty() {
        Some(None)
    } else {
        collect(
            errs,
            GroupSnapshotId::new_at(
                w.group_snapshot_id.clone(),
                &at.clone().field("group_snapshot_id"),
            ),
        )
        .map(Some)
    };
    let accessible_topology = super::topology::topologies_from_wire(
        errs,
        &at.clone().field("accessible_topology"),
        &w.accessible_topology,
    );
    Some(Snapshot {
        snapshot_id: snapshot_id?,
        source_volume_id: source_volume_id?,
        size_bytes: size_bytes?,
        creation_time: created?,
        ready_to_use: w.ready_to_use,
        group_snapshot_id: group_snapshot_id?,
        accessible_topology: accessible_topology?,
    })
}

impl TryFrom<&v1::Snapshot> for Snapshot {
    type Error = super::WireError;
    fn try_from(w: &v1::Snapshot) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let value = snapshot_from_wire(&mut errs, &FieldPath::root(), w);
        finish("Snapshot", errs, value)
    }
}
by_ref_and_value!(v1::Snapshot => Snapshot);

macro_rules! snapshot_response {
    ($resp:ident) => {
        impl TryFrom<&v1::$resp> for Snapshot {
            type Error = super::WireError;
            fn try_from(w: &v1::$resp) -> Result<Self, Self::Error> {
                let mut errs = ValidationErrors::new();
                let at = FieldPath::named("snapshot");
                let value = match &w.snapshot {
                    None => {
                        errs.push(at, Problem::Missing);
                        None
                    }
                    Some(s) => snapshot_from_wire(&mut errs, &at, s),
                };
                finish(stringify!($resp), errs, value)
            }
        }
        by_ref_and_value!(v1::$resp => Snapshot);
    };
}
snapshot_response!(CreateSnapshotResponse);
snapshot_response!(GetSnapshotResponse);

impl From<&VolumeGroupSnapshot> for v1::VolumeGroupSnapshot {
    fn from(g: &VolumeGroupSnapshot) -> Self {
        let (seconds, nanos) = time_to_wire(g.creation_time);
        let mut w = v1::VolumeGroupSnapshot {
            group_snapshot_id: g.group_snapshot_id.as_str().to_string(),
            snapshots: g.snapshots.iter().map(Into::into).collect(),
            creation_time: Some(Default::default()),
            ready_to_use: g.ready_to_use,
        };
        if let Some(ts) = w.creation_time.as_mut() {
            ts.seconds = seconds;
            ts.nanos = nanos;
        }
        w
    }
}

pub(crate) fn group_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    w: &v1::VolumeGroupSnapshot,
) -> Option<VolumeGroupSnapshot> {
    let id = collect(
        errs,
        GroupSnapshotId::new_at(
            w.group_snapshot_id.clone(),
            &at.clone().field("group_snapshot_id"),
        ),
    );
    if w.snapshots.is_empty() {
        errs.push(at.clone().field("snapshots"), Problem::Missing);
    }
    let snapshots: Vec<Option<Snapshot>> = w
        .snapshots
        .iter()
        .enumerate()
        .map(|(i, s)| snapshot_from_wire(errs, &at.clone().field("snapshots").index(i), s))
        .collect();
    let created = creation_time(
        errs,
        at.clone().field("creation_time"),
        w.creation_time.as_ref().map(|t| (t.seconds, t.nanos)),
    );
    let snapshots: Option<Vec<Snapshot>> = snapshots.into_iter().collect();
    Some(VolumeGroupSnapshot {
        group_snapshot_id: id?,
        snapshots: snapshots.filter(|s| !s.is_empty())?,
        creation_time: created?,
        ready_to_use: w.ready_to_use,
    })
}

impl TryFrom<&v1::VolumeGroupSnapshot> for VolumeGroupSnapshot {
    type Error = super::WireError;
    fn try_from(w: &v1::VolumeGroupSnapshot) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let value = group_from_wire(&mut errs, &FieldPath::root(), w);
        finish("VolumeGroupSnapshot", errs, value)
    }
}
by_ref_and_value!(v1::VolumeGroupSnapshot => VolumeGroupSnapshot);

macro_rules! group_snapshot_response {
    ($resp:ident) => {
        impl TryFrom<&v1::$resp> for VolumeGroupSnapshot {
            type Error = super::WireError;
            fn try_from(w: &v1::$resp) -> Result<Self, Self::Error> {
                let mut errs = ValidationErrors::new();
                let at = FieldPath::named("group_snapshot");
                let value = match &w.group_snapshot {
                    None => {
                        errs.push(at, Problem::Missing);
                        None
                    }
                    Some(g) => group_from_wire(&mut errs, &at, g),
                };
                finish(stringify!($resp), errs, value)
            }
        }
        by_ref_and_value!(v1::$resp => VolumeGroupSnapshot);
    };
}
group_snapshot_response!(CreateVolumeGroupSnapshotResponse);
group_snapshot_response!(GetVolumeGroupSnapshotResponse);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_table() {
        for (s, n) in [
            (0, 0),
            (1, 5),
            (-1, 0),
            (-1, 999_999_999),
            (1_700_000_000, 123),
        ] {
            let t = time_from_wire(s, n).unwrap();
            assert_eq!(time_to_wire(t), (s, n), "{s} {n}");
        }
        assert_eq!(time_from_wire(0, -1), None);
        assert_eq!(time_from_wire(0, 1_000_000_000), None);
    }

    #[test]
    fn snapshot_rules() {
        let err = Snapshot::try_from(v1::CreateSnapshotResponse { snapshot: None }).unwrap_err();
        assert_eq!(err.message, "CreateSnapshotResponse");
        let w = v1::Snapshot {
            size_bytes: -1,
            snapshot_id: "s".into(),
            source_volume_id: String::new(),
            ..Default::default()
        };
        let err = Snapshot::try_from(&w).unwrap_err();
        let got: Vec<(String, Problem)> = err
            .errors
            .into_iter()
            .map(|v| (v.field.to_string(), v.problem))
            .collect();
        assert_eq!(
            got,
            vec![
                ("source_volume_id".into(), Problem::Missing),
                ("size_bytes".into(), Problem::Negative { value: -1 }),
                ("creation_time".into(), Problem::Missing),
            ]
        );
    }

    #[test]
    fn snapshot_round_trip() {
        let s = Snapshot {
            snapshot_id: SnapshotId::new("snap").unwrap(),
            source_volume_id: ExternalVolumeId::new("vol").unwrap(),
            size_bytes: Some(10),
            creation_time: time_from_wire(1_700_000_000, 5).unwrap(),
            ready_to_use: true,
            group_snapshot_id: Some(GroupSnapshotId::new("g").unwrap()),
            accessible_topology: vec![],
        };
        let w = v1::Snapshot::from(&s);
        assert_eq!(Snapshot::try_from(&w).unwrap(), s);
        let group = VolumeGroupSnapshot {
            group_snapshot_id: GroupSnapshotId::new("g").unwrap(),
            snapshots: vec![s.clone()],
            creation_time: s.creation_time,
            ready_to_use: true,
        };
        assert_eq!(
            VolumeGroupSnapshot::try_from(v1::VolumeGroupSnapshot::from(&group)).unwrap(),
            group
        );
        let empty = v1::VolumeGroupSnapshot {
            group_snapshot_id: "g".into(),
            ..Default::default()
        };
        assert!(VolumeGroupSnapshot::try_from(empty).is_err());
        let answer = v1::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(v1::VolumeGroupSnapshot::from(&group)),
        };
        assert_eq!(VolumeGroupSnapshot::try_from(&answer).unwrap(), group);
    }

    #[test]
    fn group_snapshot_responses_need_their_group() {
        let err = VolumeGroupSnapshot::try_from(v1::CreateVolumeGroupSnapshotResponse::default())
            .unwrap_err();
        assert_eq!(err.message, "CreateVolumeGroupSnapshotResponse");
        let got: Vec<(String, Problem)> = err
            .errors
            .into_iter()
            .map(|v| (v.field.to_string(), v.problem))
            .collect();
        assert_eq!(got, vec![("group_snapshot".into(), Problem::Missing)]);

        let err = VolumeGroupSnapshot::try_from(&v1::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(v1::VolumeGroupSnapshot {
                group_snapshot_id: "g".into(),
                ..Default::default()
            }),
        })
        .unwrap_err();
        assert_eq!(err.message, "GetVolumeGroupSnapshotResponse");
        let fields: Vec<String> = err
            .errors
            .violations()
            .iter()
            .map(|v| v.field.to_string())
            .collect();
        assert_eq!(
            fields,
            ["group_snapshot.snapshots", "group_snapshot.creation_time"]
        );
    }
}
