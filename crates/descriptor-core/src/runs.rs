//! Merging a transfer's pairs into [`Run`]s: consecutive pairs contiguous on
//! both sides, which a backend moves as one descriptor.
//!
//! Views of one registration that sit next to each other (a pool's
//! neighbouring blocks, the halves of a split) are separate descriptors in
//! the operation and in Dynamo's metadata, which pairs index by index; below
//! that, one descriptor per run is what transports are fast with (NIXL
//! merges contiguous descriptors only in prepared lists, not in
//! `create_xfer_req`). Only the backend can tell whether two remote ranges
//! lie in one of the peer's registrations (a run across two is refused), so
//! it passes that test in; the local side's is [`TransferRequest::local_regions`].

use crate::backend::{RegionId, Segment, TransferRequest};

/// Consecutive pairs of a transfer, contiguous on both sides: moved as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The local bytes of the run's pairs, in one local region.
    pub local: Segment,
    /// The remote bytes of the run's pairs, as one range.
    pub remote: Segment,
    /// Index of the run's first pair in the request.
    pub first: usize,
    /// How many pairs the run covers.
    pub count: usize,
}

/// The runs of a transfer's pairs, in order: see [`TransferRequest::runs`].
#[derive(Debug)]
pub struct Runs<'a, F> {
    local: &'a [Segment],
    local_regions: &'a [RegionId],
    remote: &'a [Segment],
    same_remote_region: F,
    next: usize,
}

impl<F: FnMut(&Segment, &Segment) -> bool> Runs<'_, F> {
    /// Whether pair `i` continues the run `run`, whose last pair is `i - 1`.
    /// Contiguity is tested first: it is why most pairs that do not merge
    /// do not (scattered blocks), and the cheapest test.
    fn continues(&mut self, run: &Run, i: usize) -> bool {
        let (local, remote) = (&self.local[i], &self.remote[i]);
        run.local.end() == Some(local.addr)
            && run.remote.end() == Some(remote.addr)
            && local.len == remote.len
            && matches!(
                (self.local_regions.get(i - 1), self.local_regions.get(i)),
                (Some(a), Some(b)) if a == b
            )
            && local.device == run.local.device
            && remote.device == run.remote.device
            && (self.same_remote_region)(&self.remote[i - 1], remote)
    }
}

impl<F: FnMut(&Segment, &Segment) -> bool> Iterator for Runs<'_, F> {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        let first = self.next;
        let (local, remote) = (*self.local.get(first)?, *self.remote.get(first)?);
        let mut run = Run {
            local,
            remote,
            first,
            count: 1,
        };
        // A pair whose sides differ in length stays alone: the backend
        // refuses it, index and all.
        if local.len == remote.len {
            let end = self.local.len().min(self.remote.len());
            while first + run.count < end && self.continues(&run, first + run.count) {
                let i = first + run.count;
                run.local.len += self.local[i].len;
                run.remote.len += self.remote[i].len;
                run.count += 1;
            }
        }
        self.next = first + run.count;
        Some(run)
    }
}

impl<'a> TransferRequest<'a> {
    /// The request's pairs merged into runs: consecutive pairs whose local
    /// segments lie in one region (`local_regions`) and end where the next
    /// begins, whose remote segments end where the next begins and lie in
    /// one of the peer's registrations (`same_remote_region` of the two
    /// remote segments, the backend's knowledge), with equal lengths on both
    /// sides and one device per side. Nothing is reordered; a run covers
    /// exactly the bytes of its pairs.
    pub fn runs<F: FnMut(&Segment, &Segment) -> bool>(&self, same_remote_region: F) -> Runs<'a, F> {
        Runs {
            local: self.local,
            local_regions: self.local_regions,
            remote: self.remote,
            same_remote_region,
            next: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::{Device, OperationKind};

    fn seg(addr: usize, len: usize) -> Segment {
        Segment {
            addr,
            len,
            device: Device::HOST,
        }
    }

    /// (first, count) of each run of pairs `(local, remote)` of `len` bytes
    /// at the given block numbers, local blocks all in region 1 unless
    /// `regions` says otherwise.
    fn runs(
        pairs: &[(usize, usize)],
        regions: Option<&[u64]>,
        same: fn(&Segment, &Segment) -> bool,
    ) -> Vec<(usize, usize)> {
        const LEN: usize = 0x100;
        let local: Vec<Segment> = pairs
            .iter()
            .map(|&(l, _)| seg(0x10_000 + l * LEN, LEN))
            .collect();
        let remote: Vec<Segment> = pairs
            .iter()
            .map(|&(_, r)| seg(0x90_000 + r * LEN, LEN))
            .collect();
        let ids: Vec<RegionId> = match regions {
            Some(r) => r.iter().map(|&id| RegionId(id)).collect(),
            None => vec![RegionId(1); pairs.len()],
        };
        let request = TransferRequest {
            op: OperationKind::Read,
            peer: "p",
            local: &local,
            local_regions: &ids,
            remote: &remote,
            notification: b"k",
            notify: true,
        };
        let found: Vec<Run> = request.runs(same).collect();
        // A run's segments are exactly its pairs', end to end.
        for run in &found {
            let pairs = run.first..run.first + run.count;
            assert_eq!(run.local.addr, local[run.first].addr);
            assert_eq!(
                run.local.len,
                local[pairs.clone()].iter().map(|s| s.len).sum::<usize>()
            );
            assert_eq!(run.remote.addr, remote[run.first].addr);
            assert_eq!(
                run.remote.len,
                remote[pairs].iter().map(|s| s.len).sum::<usize>()
            );
        }
        found.iter().map(|r| (r.first, r.count)).collect()
    }

    fn any(_: &Segment, _: &Segment) -> bool {
        true
    }

    /// The peer registered blocks 0..4 and 4..8 separately.
    fn halves(a: &Segment, b: &Segment) -> bool {
        let block = |s: &Segment| (s.addr - 0x90_000) / 0x100;
        block(a) / 4 == block(b) / 4
    }

    #[rstest]
    #[case::contiguous_on_both_sides(&[(0, 0), (1, 1), (2, 2)], vec![(0, 3)])]
    #[case::scattered_locally(&[(0, 0), (2, 1), (3, 2)], vec![(0, 1), (1, 2)])]
    #[case::scattered_remotely(&[(0, 0), (1, 2), (2, 3)], vec![(0, 1), (1, 2)])]
    #[case::reversed(&[(2, 2), (1, 1), (0, 0)], vec![(0, 1), (1, 1), (2, 1)])]
    #[case::one_pair(&[(5, 9)], vec![(0, 1)])]
    #[case::none(&[], vec![])]
    fn contiguous_pairs_merge_in_order(
        #[case] pairs: &[(usize, usize)],
        #[case] expected: Vec<(usize, usize)>,
    ) {
        assert_eq!(runs(pairs, None, any), expected);
    }

    #[test]
    fn a_run_never_crosses_a_local_region() {
        let pairs = [(0, 0), (1, 1), (2, 2), (3, 3)];
        assert_eq!(runs(&pairs, Some(&[1, 1, 2, 2]), any), [(0, 2), (2, 2)]);
        // Fewer region ids than pairs: the pairs past them stay alone.
        assert_eq!(runs(&pairs, Some(&[1, 1]), any), [(0, 2), (2, 1), (3, 1)]);
    }

    #[test]
    fn a_run_never_crosses_a_remote_registration() {
        let pairs: Vec<(usize, usize)> = (0..8).map(|i| (i, i)).collect();
        assert_eq!(runs(&pairs, None, halves), [(0, 4), (4, 4)]);
    }

    #[test]
    fn pairs_of_unequal_lengths_or_devices_stay_alone() {
        let local = [
            seg(0x1000, 16),
            seg(0x1010, 16),
            seg(0x1020, 8),
            seg(0x1028, 8),
        ];
        let mut remote = [
            seg(0x9000, 16),
            seg(0x9010, 16),
            seg(0x9020, 16),
            seg(0x9030, 8),
        ];
        remote[1].device = Device::cuda(0);
        let ids = [RegionId(1); 4];
        let request = TransferRequest {
            op: OperationKind::Write,
            peer: "p",
            local: &local,
            local_regions: &ids,
            remote: &remote,
            notification: b"k",
            notify: true,
        };
        let found: Vec<(usize, usize)> = request.runs(any).map(|r| (r.first, r.count)).collect();
        assert_eq!(found, [(0, 1), (1, 1), (2, 1), (3, 1)]);
    }

    #[test]
    fn a_range_that_would_wrap_the_address_space_ends_its_run() {
        let local = [seg(usize::MAX - 15, 16), seg(0, 16)];
        let remote = [seg(0x9000, 16), seg(0x9010, 16)];
        let ids = [RegionId(1); 2];
        let request = TransferRequest {
            op: OperationKind::Read,
            peer: "p",
            local: &local,
            local_regions: &ids,
            remote: &remote,
            notification: b"k",
            notify: true,
        };
        assert_eq!(request.runs(any).count(), 2);
    }
}
