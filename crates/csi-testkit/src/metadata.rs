//! A deterministic model of which blocks of a snapshot are allocated and which changed between
//! two snapshots, for the SnapshotMetadata service.
//!
//! A volume is cut into at most [`MAX_BLOCKS`] fixed-size blocks of at least 1 MiB. Which
//! blocks are allocated depends on the block index and the snapshot's creation order, so
//! answers are stable across calls and a resumed stream continues exactly where the first
//! one stopped.

use csi_proto::v1::BlockMetadata;

/// The smallest block, 1 MiB.
pub(crate) const MIN_BLOCK_BYTES: i64 = 1 << 20;
/// At most this many blocks per volume.
pub(crate) const MAX_BLOCKS: i64 = 1024;

/// `a / b` rounded up, for `a >= 0` and `b > 0`.
fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

fn block_size(capacity: i64) -> i64 {
    let per_block = ceil_div(capacity.max(0), MAX_BLOCKS).max(MIN_BLOCK_BYTES);
    ceil_div(per_block, MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
}

fn allocated_at(seq: u64, index: u64) -> bool {
    index.is_multiple_of(4) || (index + seq).is_multiple_of(3)
}

fn blocks(capacity: i64, mut keep: impl FnMut(u64) -> bool) -> Vec<BlockMetadata> {
    let size = block_size(capacity);
    let count = capacity / size;
    (0..count)
        .filter(|i| keep(u64::try_from(*i).unwrap_or(0)))
        .map(|i| BlockMetadata {
            byte_offset: i * size,
            size_bytes: size,
        })
        .collect()
}

/// The allocated blocks of snapshot number `seq` of a volume of `capacity` bytes.
pub(crate) fn allocated(seq: u64, capacity: i64) -> Vec<BlockMetadata> {
    blocks(capacity, |i| allocated_at(seq, i))
}

/// The blocks that differ between snapshot `base` and the later snapshot `target`.
pub(crate) fn delta(base: u64, target: u64, capacity: i64) -> Vec<BlockMetadata> {
    blocks(capacity, |i| {
        allocated_at(base, i) != allocated_at(target, i)
            || (allocated_at(target, i) && (i + target).is_multiple_of(5))
    })
}

/// The blocks that end after `offset`: what a stream resumed at `offset` must send.
pub(crate) fn after(blocks: Vec<BlockMetadata>, offset: i64) -> Vec<BlockMetadata> {
    blocks
        .into_iter()
        .filter(|b| b.byte_offset + b.size_bytes > offset)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_ascending_fixed_and_inside_the_volume() {
        let capacity = 3 * (1 << 30);
        let all = allocated(2, capacity);
        assert!(!all.is_empty());
        for pair in all.windows(2) {
            assert!(pair[0].byte_offset + pair[0].size_bytes <= pair[1].byte_offset);
            assert_eq!(pair[0].size_bytes, pair[1].size_bytes);
        }
        let last = all.last().unwrap();
        assert!(last.byte_offset + last.size_bytes <= capacity);
        assert!(i64::try_from(all.len()).unwrap() <= MAX_BLOCKS);
    }

    #[test]
    fn resuming_inside_a_block_keeps_that_block() {
        let all = allocated(1, 64 << 20);
        let first = all[0];
        let resumed = after(all.clone(), first.byte_offset + 1);
        assert_eq!(resumed[0], first);
        let resumed = after(all.clone(), first.byte_offset + first.size_bytes);
        assert_eq!(resumed[0], all[1]);
    }

    #[test]
    fn delta_differs_between_pairs() {
        assert_ne!(delta(1, 2, 64 << 20), delta(1, 3, 64 << 20));
    }
}
