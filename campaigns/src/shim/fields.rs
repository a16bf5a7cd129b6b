//! Field values for generated agent-protocol requests: ordinary ones, hostile ones that the
//! protocol accepts (path-like, unicode, at the size limit), and ones it must refuse, each
//! recorded with the field name the refusal has to name.
//!
//! Which values are refused follows the protocol's documented rules (ids non-empty and at most
//! 128 bytes, plugin node ids 256, maps 4 KiB, secret keys `[A-Za-z0-9._-]`, sizes never
//! negative, a limit not below the requirement, access modes 1 to 7, access types block or
//! mount, mount fields within their limits), decided here from the generated value itself.

use std::collections::{BTreeMap, BTreeSet};

use csi_rpc_shim::wire::pb;
use csi_structs::limits::{
    MAX_MAP_BYTES, MAX_MOUNT_FLAGS_BYTES, MAX_PLUGIN_NODE_ID_BYTES, MAX_STRING_BYTES,
    is_banned_in_name,
};

use crate::rng::Rng;

/// Put in every secret value and token the campaign sends: it must never come back in an
/// answer or reach a log line.
pub(crate) const MARKER: &str = "S3CR3T-MARK";

/// Ids the protocol accepts although they look hostile.
const ODD_VALID: &[&str] = &[
    "../../../../tmp/evil",
    "/etc/passwd",
    "a/b",
    " ",
    "vol\nid",
    "vol\u{0}id",
    "%2e%2e%2f",
    "ünïcødé",
    "💥",
    "x;rm -rf /",
    "\u{202e}gnp.exe",
];

/// Generates the fields of one request and records which must be refused.
pub(crate) struct Fields<'r> {
    rng: &'r mut Rng,
    /// The fields whose values the protocol must refuse, by the name its error must start with.
    pub(crate) invalid: BTreeSet<&'static str>,
    /// The secret values sent (to look for in answers and logs).
    pub(crate) secrets_sent: bool,
}

impl<'r> Fields<'r> {
    pub(crate) fn new(rng: &'r mut Rng) -> Self {
        Self {
            rng,
            invalid: BTreeSet::new(),
            secrets_sent: false,
        }
    }

    pub(crate) fn rng(&mut self) -> &mut Rng {
        self.rng
    }

    /// A string of exactly `bytes` bytes made of `unit` repeated, padded with `a`.
    fn sized(unit: &str, bytes: usize) -> String {
        let mut s = String::with_capacity(bytes);
        while s.len() + unit.len() <= bytes {
            s.push_str(unit);
        }
        while s.len() < bytes {
            s.push('a');
        }
        s
    }

    /// Any string value, of a length around `limit`: mostly `usual`, sometimes hostile but
    /// within the limit, sometimes empty or over it.
    fn text(&mut self, usual: &[&str], limit: usize) -> String {
        let unit = self.rng.pick(&["a", "é", "💥", "/", "\u{0}"]);
        match self.rng.weighted(&[60, 14, 8, 6, 4, 4, 4]) {
            0 => (self.rng.pick(usual)).to_owned(),
            1 => (self.rng.pick(ODD_VALID)).to_owned(),
            2 => Self::sized(unit, limit),
            3 => String::new(),
            4 => Self::sized(unit, limit + 1),
            5 => Self::sized(unit, limit + 1 + self.rng.index(4 * limit)),
            _ => format!("{}{}", self.rng.pick(usual), self.rng.index(1000)),
        }
    }

    fn check(&mut self, field: &'static str, ok: bool) {
        if !ok {
            self.invalid.insert(field);
        }
    }

    /// A required id of at most 128 bytes.
    pub(crate) fn id(&mut self, field: &'static str, usual: &[&str]) -> String {
        let v = self.text(usual, MAX_STRING_BYTES);
        self.check(field, !v.is_empty() && v.len() <= MAX_STRING_BYTES);
        v
    }

    /// A plugin node id: required, at most 256 bytes.
    pub(crate) fn plugin_node_id(&mut self, field: &'static str, usual: &[&str]) -> String {
        let v = self.text(usual, MAX_PLUGIN_NODE_ID_BYTES);
        self.check(field, !v.is_empty() && v.len() <= MAX_PLUGIN_NODE_ID_BYTES);
        v
    }

    /// An optional id: empty means absent, otherwise at most 128 bytes.
    pub(crate) fn opt_id(&mut self, field: &'static str, usual: &[&str]) -> String {
        if self.rng.percent(50) {
            return String::new();
        }
        let v = self.text(usual, MAX_STRING_BYTES);
        self.check(field, v.len() <= MAX_STRING_BYTES);
        v
    }

    /// An optional string of at most 128 bytes (a listing token).
    pub(crate) fn short_string(&mut self, field: &'static str) -> String {
        if self.rng.percent(60) {
            return String::new();
        }
        let v = self.text(&["page-2", "0", "token"], MAX_STRING_BYTES);
        self.check(field, v.len() <= MAX_STRING_BYTES);
        v
    }

    /// A request name: required, at most 128 bytes, none of the banned control characters.
    pub(crate) fn name(&mut self, field: &'static str) -> String {
        let mut v = self.text(&["snap-1", "nightly"], MAX_STRING_BYTES);
        if self.rng.percent(10) {
            v.push(self.rng.pick(&['\u{1}', '\u{7f}', '\u{9f}', '\t', '\n']));
        }
        let ok = !v.is_empty() && v.len() <= MAX_STRING_BYTES && !v.chars().any(is_banned_in_name);
        self.check(field, ok);
        v
    }

    /// A byte count (or entry count) that must not be negative.
    fn count(&mut self) -> i64 {
        match self.rng.weighted(&[30, 40, 10, 10, 10]) {
            0 => 0,
            1 => i64::try_from(self.rng.range(1, 1 << 40)).unwrap_or(1),
            2 => i64::MAX,
            3 => -1,
            _ => i64::MIN + i64::try_from(self.rng.below(1000)).unwrap_or(0),
        }
    }

    /// `required_bytes` and `limit_bytes` (0: unset).
    pub(crate) fn capacity(&mut self) -> (i64, i64) {
        let required = self.count();
        let limit = if self.rng.percent(30) {
            required
        } else {
            self.count()
        };
        self.check("required_bytes", required >= 0);
        self.check("limit_bytes", limit >= 0);
        if required > 0 && limit > 0 && limit < required {
            self.invalid.insert("limit_bytes");
        }
        (required, limit)
    }

    /// `max_entries`: never negative.
    pub(crate) fn max_entries(&mut self, field: &'static str) -> i32 {
        let v = match self.rng.weighted(&[50, 30, 10, 10]) {
            0 => 0,
            1 => i32::try_from(self.rng.range(1, 1000)).unwrap_or(1),
            2 => -1,
            _ => i32::MIN,
        };
        self.check(field, v >= 0);
        v
    }

    /// A capability (`None` sometimes, which a required field must refuse).
    pub(crate) fn capability(
        &mut self,
        field: &'static str,
        required: bool,
    ) -> Option<pb::Capability> {
        if self.rng.percent(5) {
            if required {
                self.invalid.insert(field);
            }
            return None;
        }
        Some(self.one_capability(field))
    }

    /// A list of capabilities (empty sometimes, which is refused).
    pub(crate) fn capabilities(&mut self, field: &'static str) -> Vec<pb::Capability> {
        let n = self.rng.weighted(&[5, 70, 20, 5]);
        if n == 0 {
            self.invalid.insert(field);
        }
        (0..n).map(|_| self.one_capability(field)).collect()
    }

    fn one_capability(&mut self, field: &'static str) -> pb::Capability {
        let access_mode = if self.rng.percent(85) {
            i32::try_from(self.rng.range(1, 7)).unwrap_or(1)
        } else {
            self.rng.pick(&[0, 8, 99, -1, i32::MAX, i32::MIN])
        };
        let access_type = if self.rng.percent(90) {
            self.rng.pick(&[1, 2])
        } else {
            self.rng.pick(&[0, 3, -7, i32::MAX])
        };
        let mut cap = pb::Capability {
            access_mode,
            access_type,
            ..Default::default()
        };
        let mut mount_ok = true;
        if self.rng.percent(50) {
            cap.fs_type = self.text(&["ext4", "xfs", ""], MAX_STRING_BYTES);
            mount_ok &= cap.fs_type.len() <= MAX_STRING_BYTES;
        }
        if self.rng.percent(30) {
            let n = self.rng.index(8);
            cap.mount_flags = (0..n)
                .map(|_| self.text(&["ro", "noatime", "discard"], 600))
                .collect();
            mount_ok &=
                cap.mount_flags.iter().map(String::len).sum::<usize>() <= MAX_MOUNT_FLAGS_BYTES;
        }
        if self.rng.percent(10) {
            cap.volume_mount_group = self.text(&["1000", "wheel"], MAX_STRING_BYTES);
            mount_ok &= cap.volume_mount_group.len() <= MAX_STRING_BYTES;
        }
        let mode_ok = (1..=7).contains(&access_mode);
        // Mount fields only count for a mount capability, and are only checked once the mode
        // and type are readable; any of the three makes the capability refused, under `field`.
        let ok = mode_ok
            && match access_type {
                1 => true,
                2 => mount_ok,
                _ => false,
            };
        self.check(field, ok);
        cap
    }

    /// A secrets map: every value holds [`MARKER`]; keys must be `[A-Za-z0-9._-]+` and the
    /// whole map at most 4 KiB.
    pub(crate) fn secrets(&mut self, field: &'static str) -> BTreeMap<String, String> {
        let n = self.rng.weighted(&[25, 50, 20, 5]);
        let mut map = BTreeMap::new();
        for i in 0..n {
            let key = match self.rng.weighted(&[80, 5, 5, 5, 5]) {
                0 => (self.rng.pick(&["password", "user.name", "api-key_2", "X"])).to_owned(),
                1 => String::new(),
                2 => "bad key".to_owned(),
                3 => "clé".to_owned(),
                _ => "a/b".to_owned(),
            };
            let padding = if self.rng.percent(5) {
                Self::sized("z", MAX_MAP_BYTES)
            } else {
                String::new()
            };
            map.insert(key, format!("{MARKER}-{i}-{padding}"));
        }
        let keys_ok = map.keys().all(|k| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        });
        let size: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.check(field, keys_ok && size <= MAX_MAP_BYTES);
        self.secrets_sent |= !map.is_empty();
        map
    }

    /// An optional topology requirement for a new volume: mostly absent or well formed, at
    /// times with an empty topology, a bad segment key, or a preferred topology that is not
    /// among the requisite ones. Judged by csi-structs' rules for topologies.
    pub(crate) fn requirement(&mut self, field: &'static str) -> Option<pb::TopologyRequirement> {
        if self.rng.percent(60) {
            return None;
        }
        let zones = ["eu-1a", "eu-1b", "us-2c"];
        let topology = |rng: &mut Rng| {
            let segments: BTreeMap<String, String> = match rng.weighted(&[85, 5, 5, 5]) {
                0 => [("zone".to_owned(), rng.pick(&zones).to_owned())].into(),
                1 => BTreeMap::new(),
                2 => [("bad key".to_owned(), "x".to_owned())].into(),
                _ => [("zone".to_owned(), String::new())].into(),
            };
            pb::Topology { segments }
        };
        let requisite: Vec<_> = (0..self.rng.weighted(&[20, 50, 30]))
            .map(|_| topology(self.rng))
            .collect();
        let preferred: Vec<_> = (0..self.rng.weighted(&[40, 50, 10]))
            .map(|_| topology(self.rng))
            .collect();
        let typed = |list: &[pb::Topology]| {
            list.iter()
                .map(|t| csi_structs::Topology::new(t.segments.clone()))
                .collect::<Result<Vec<_>, _>>()
        };
        let ok = match (typed(&requisite), typed(&preferred)) {
            (Ok(r), Ok(p)) => csi_structs::TopologyRequirement::new(r, p).is_ok(),
            _ => false,
        };
        self.check(field, ok);
        Some(pb::TopologyRequirement {
            requisite,
            preferred,
        })
    }

    /// A create's content source: absent most of the time; a snapshot or a volume id (as
    /// [`id`](Self::id)), or one without a type, which is missing.
    pub(crate) fn content_source(
        &mut self,
        field: &'static str,
    ) -> Option<pb::VolumeContentSource> {
        use pb::volume_content_source::Type;
        if self.rng.percent(70) {
            return None;
        }
        let r#type = match self.rng.weighted(&[45, 45, 10]) {
            0 => Some(Type::SnapshotId(self.id(field, &["snap-1", "snap-2"]))),
            1 => Some(Type::VolumeId(self.id(field, &["ext-vol-1", "vol-9"]))),
            _ => {
                self.check(field, false);
                None
            }
        };
        Some(pb::VolumeContentSource { r#type })
    }

    /// A plain string map (parameters, context): at most 4 KiB; any keys.
    pub(crate) fn map(&mut self, field: &'static str) -> BTreeMap<String, String> {
        let n = self.rng.weighted(&[40, 40, 15, 5]);
        let mut map = BTreeMap::new();
        for _ in 0..n {
            let key = self.text(&["type", "zone", "iops"], 16);
            let value = if self.rng.percent(5) {
                Self::sized("v", MAX_MAP_BYTES)
            } else {
                self.text(&["gp3", "eu-1a", "3000"], 64)
            };
            map.insert(key, value);
        }
        let size: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.check(field, size <= MAX_MAP_BYTES);
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sized_strings_have_the_asked_length() {
        for unit in ["a", "é", "💥"] {
            for len in [0, 1, 127, 128, 129, 4096] {
                assert_eq!(Fields::sized(unit, len).len(), len, "{unit} {len}");
            }
        }
    }

    #[test]
    fn ids_are_judged_by_their_length() {
        let mut rng = Rng::new(5);
        for _ in 0..500 {
            let mut f = Fields::new(&mut rng);
            let v = f.id("volume_id", &["vol-1"]);
            let refused = f.invalid.contains("volume_id");
            assert_eq!(refused, v.is_empty() || v.len() > 128, "{} bytes", v.len());
        }
    }
}
