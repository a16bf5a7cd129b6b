//! Controller choice: in which order to try the controller instances of a plugin.
//!
//! [`Strategy::Sticky`] (the default) ranks instances by rendezvous hashing of the volume's key
//! and the node id: every agent computes the same order for the same volume, so one
//! controller sees a volume's calls in order; when an instance leaves, only its volumes move.
//! The hash is FNV-1a with a fixed finaliser, written here so it is the same in every build
//! and every Rust release (std's `DefaultHasher` promises neither).
//! [`Strategy::RoundRobin`] rotates through the instances, sorted by node id, call by call.
//!
//! A preferred node named in the call's [`ControllerQuery`](crate::ControllerQuery) goes first
//! when it is among the ready instances. The failover loop then walks the rest in order.

use std::sync::atomic::{AtomicUsize, Ordering};

use csi_structs::NodeId;

/// How the shim orders the controller instances of a plugin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Same volume, same first instance, from every agent (rendezvous hashing).
    #[default]
    Sticky,
    /// A different first instance for each call, in turn.
    RoundRobin,
}

/// Orders candidates for one call.
#[derive(Debug, Default)]
pub(crate) struct Chooser {
    strategy: Strategy,
    next: AtomicUsize,
}

impl Chooser {
    pub(crate) fn new(strategy: Strategy) -> Self {
        Self {
            strategy,
            next: AtomicUsize::new(0),
        }
    }

    /// `ready` in the order to try them for a call keyed by `key`.
    pub(crate) fn order(
        &self,
        key: &str,
        mut ready: Vec<NodeId>,
        preferred: Option<&NodeId>,
    ) -> Vec<NodeId> {
        match self.strategy {
            Strategy::Sticky => sticky_order(key, &mut ready),
            Strategy::RoundRobin => {
                ready.sort();
                if !ready.is_empty() {
                    let turn = self.next.fetch_add(1, Ordering::Relaxed) % ready.len();
                    ready.rotate_left(turn);
                }
            }
        }
        if let Some(p) = preferred
            && let Some(i) = ready.iter().position(|n| n == p)
        {
            let first = ready.remove(i);
            ready.insert(0, first);
        }
        ready
    }
}

/// Sorts by descending rendezvous score, ties by node id.
pub(crate) fn sticky_order(key: &str, nodes: &mut [NodeId]) {
    nodes.sort_by(|a, b| score(key, b).cmp(&score(key, a)).then_with(|| a.cmp(b)));
}

fn score(key: &str, node: &NodeId) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    // The separator byte cannot occur in UTF-8, so ("ab", "c") and ("a", "bc") differ.
    for b in key.bytes().chain([0xff]).chain(node.as_str().bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    // splitmix64's finaliser spreads FNV's weak low bits.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(names: &[&str]) -> Vec<NodeId> {
        names.iter().map(|n| NodeId::new(*n).unwrap()).collect()
    }

    #[test]
    fn sticky_is_stable_and_independent_of_input_order() {
        let c = Chooser::new(Strategy::Sticky);
        let one = c.order("vol-1", nodes(&["a", "b", "c", "d"]), None);
        let two = c.order("vol-1", nodes(&["d", "c", "b", "a"]), None);
        assert_eq!(one, two);
        assert_eq!(c.order("vol-1", nodes(&["a", "b", "c", "d"]), None), one);
    }

    #[test]
    fn sticky_moves_only_the_volumes_of_a_departed_node() {
        let c = Chooser::new(Strategy::Sticky);
        let all = nodes(&["a", "b", "c", "d", "e"]);
        let mut moved = 0;
        let mut spread = std::collections::BTreeSet::new();
        for i in 0..200 {
            let key = format!("vol-{i}");
            let first = c.order(&key, all.clone(), None)[0].clone();
            spread.insert(first.clone());
            let without_c: Vec<NodeId> =
                all.iter().filter(|n| n.as_str() != "c").cloned().collect();
            let after = c.order(&key, without_c, None)[0].clone();
            if first.as_str() != "c" {
                assert_eq!(after, first, "{key} moved although its node stayed");
            } else {
                moved += 1;
            }
        }
        // Volumes spread over every node, and some were on the one that left.
        assert_eq!(spread.len(), 5);
        assert!(moved > 0);
    }

    #[test]
    fn round_robin_rotates_and_preferred_goes_first() {
        let c = Chooser::new(Strategy::RoundRobin);
        let firsts: Vec<String> = (0..4)
            .map(|_| c.order("k", nodes(&["b", "a", "c"]), None)[0].to_string())
            .collect();
        assert_eq!(firsts, ["a", "b", "c", "a"]);
        let pref = NodeId::new("c").unwrap();
        let s = Chooser::new(Strategy::Sticky);
        let order = s.order("k", nodes(&["a", "b", "c"]), Some(&pref));
        assert_eq!(order[0], pref);
        assert_eq!(order.len(), 3);
        // A preferred node that is not ready is ignored.
        let ghost = NodeId::new("z").unwrap();
        assert_eq!(s.order("k", nodes(&["a"]), Some(&ghost)), nodes(&["a"]));
    }
}
