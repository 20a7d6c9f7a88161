//! Merging a transfer's pairs into [`Run`]s: consecutive pairs contiguous on
//! both sides, which a backend moves as one descriptor.
//!
//! Views of one registration that sit next to each other (a pool's
//! neighbouring blocks, the halves of a split) are separate descriptors in
//! the operation and in Dynamo's metadata, which pairs index by index; below
//! that, one descriptor per run is what transports are fast with (NIXL
//! merges contiguous descriptors only in prepared lists, not in
//! `create_xfer_req`). Only the backend can tell whether remote bytes lie in
//! one of the peer's registrations (a run across two is refused), so it
//! passes that test in; the local side's is [`TransferRequest::local_regions`].
//! The test is asked about the whole run, from its start through the next
//! pair's end, never about a pair alone: where a peer's registrations
//! overlap, each pair may lie in one while the run lies in none.

use crate::backend::{FileSpan, RegionId, Segment, Target, TransferRequest};

/// Consecutive pairs of a transfer, contiguous on both sides: moved as one.
/// `R` is the far side: a peer's [`Segment`], or a [`FileSpan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run<R = Segment> {
    /// The local bytes of the run's pairs, in one local region.
    pub local: Segment,
    /// The far bytes of the run's pairs, as one range.
    pub remote: R,
    /// Index of the run's first pair in the request.
    pub first: usize,
    /// How many pairs the run covers.
    pub count: usize,
}

/// A far side of a pair that runs are made of: a range that may continue
/// another.
pub trait RunSide: Copy {
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// Whether it starts where `run` ends, in the same place (device, file).
    fn follows(&self, run: &Self) -> bool;
    /// `run` grown by `next`, which follows it.
    fn grow(&mut self, next: &Self);
}

impl RunSide for Segment {
    fn len(&self) -> usize {
        self.len
    }
    fn follows(&self, run: &Segment) -> bool {
        run.end() == Some(self.addr) && self.device == run.device
    }
    fn grow(&mut self, next: &Segment) {
        self.len += next.len;
    }
}

impl RunSide for FileSpan {
    fn len(&self) -> usize {
        self.len
    }
    fn follows(&self, run: &FileSpan) -> bool {
        run.end() == Some(self.offset) && self.region == run.region && self.fd == run.fd
    }
    fn grow(&mut self, next: &FileSpan) {
        self.len += next.len;
    }
}

/// The runs of a transfer's pairs, in order: see [`TransferRequest::runs`]
/// and [`TransferRequest::file_runs`].
#[derive(Debug)]
pub struct Runs<'a, F, R = Segment> {
    local: &'a [Segment],
    local_regions: &'a [RegionId],
    remote: &'a [R],
    same_remote_region: F,
    next: usize,
}

impl<R: RunSide, F: FnMut(&R, &R) -> bool> Runs<'_, F, R> {
    /// Whether pair `i` continues the run `run`, whose last pair is `i - 1`.
    /// Contiguity is tested first: it is why most pairs that do not merge
    /// do not (scattered blocks), and the cheapest test. The remote test
    /// gets the run so far: the merged run must lie in one registration.
    fn continues(&mut self, run: &Run<R>, i: usize) -> bool {
        let (local, remote) = (&self.local[i], &self.remote[i]);
        run.local.end() == Some(local.addr)
            && remote.follows(&run.remote)
            && local.len == remote.len()
            && matches!(
                (self.local_regions.get(i - 1), self.local_regions.get(i)),
                (Some(a), Some(b)) if a == b
            )
            && local.device == run.local.device
            && (self.same_remote_region)(&run.remote, remote)
    }
}

impl<R: RunSide, F: FnMut(&R, &R) -> bool> Iterator for Runs<'_, F, R> {
    type Item = Run<R>;

    fn next(&mut self) -> Option<Run<R>> {
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
        if local.len == remote.len() {
            let end = self.local.len().min(self.remote.len());
            while first + run.count < end && self.continues(&run, first + run.count) {
                let i = first + run.count;
                run.local.len += self.local[i].len;
                run.remote.grow(&self.remote[i]);
                run.count += 1;
            }
        }
        self.next = first + run.count;
        Some(run)
    }
}

/// A file's registration holds every offset: file runs need no backend's word.
type AnyFileRegion = fn(&FileSpan, &FileSpan) -> bool;

impl<'a> TransferRequest<'a> {
    /// The request's pairs with a peer merged into runs (none if the far
    /// side is a file): consecutive pairs whose local
    /// segments lie in one region (`local_regions`) and end where the next
    /// begins, whose remote segments end where the next begins, with equal
    /// lengths on both sides and one device per side, and whose whole
    /// remote run lies in one of the peer's registrations (the backend's
    /// knowledge): `same_remote_region(run, next)` is asked with the remote
    /// run built so far and the next pair's remote segment, and must say
    /// whether one registration holds every byte from `run`'s start through
    /// `next`'s end. Nothing is reordered; a run covers exactly the bytes of
    /// its pairs.
    pub fn runs<F: FnMut(&Segment, &Segment) -> bool>(&self, same_remote_region: F) -> Runs<'a, F> {
        let remote = match self.target {
            Target::Peer(peer) => peer.remote,
            Target::File(_) => &[],
        };
        Runs {
            local: self.local,
            local_regions: self.local_regions,
            remote,
            same_remote_region,
            next: 0,
        }
    }

    /// The request's pairs with files merged into runs (none if the far
    /// side is a peer), as [`runs`](Self::runs) merges a peer's: the spans
    /// of a run follow each other in one file.
    pub fn file_runs(&self) -> Runs<'a, AnyFileRegion, FileSpan> {
        let files = match self.target {
            Target::File(files) => files,
            Target::Peer(_) => &[],
        };
        Runs {
            local: self.local,
            local_regions: self.local_regions,
            remote: files,
            same_remote_region: |_, _| true,
            next: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::{Device, OperationKind, PeerTarget};

    /// Blocks of one file merge where they follow each other in the file
    /// and in one local region; another file, a gap, or another region
    /// ends a run.
    #[test]
    fn file_spans_merge_where_they_follow_each_other_in_one_file() {
        const B: usize = 4096;
        let span = |region: u64, fd: i32, block: u64| FileSpan {
            region: RegionId(region),
            fd,
            offset: block * B as u64,
            len: B,
        };
        let files = [
            span(7, 3, 0),
            span(7, 3, 1),
            span(8, 4, 2),
            span(8, 4, 3),
            span(8, 4, 5),
        ];
        let local: Vec<Segment> = (0..5).map(|i| seg(0x10_000 + i * B, B)).collect();
        let regions = [
            RegionId(1),
            RegionId(1),
            RegionId(1),
            RegionId(2),
            RegionId(2),
        ];
        let request = TransferRequest {
            op: OperationKind::Write,
            local: &local,
            local_regions: &regions,
            target: Target::File(&files),
        };
        let found: Vec<(usize, usize, u64, usize)> = request
            .file_runs()
            .map(|r| (r.first, r.count, r.remote.offset, r.remote.len))
            .collect();
        assert_eq!(
            found,
            [
                (0, 2, 0, 2 * B),
                (2, 1, 2 * B as u64, B),
                (3, 1, 3 * B as u64, B),
                (4, 1, 5 * B as u64, B)
            ]
        );
        // Peer runs of a file request, and file runs of a peer request: none.
        assert_eq!(request.runs(|_, _| true).count(), 0);
    }

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
            local: &local,
            local_regions: &ids,
            target: Target::Peer(PeerTarget {
                peer: "p",
                remote: &remote,
                notification: b"k",
                notify: true,
            }),
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

    /// The peer registered X = blocks 0..2 and Y = blocks 1..3 (overlapping
    /// on block 1): each pair of neighbours lies in one, all three in none.
    fn overlapping(run: &Segment, next: &Segment) -> bool {
        let block = |addr: usize| (addr - 0x90_000) / 0x100;
        let (start, end) = (block(run.addr), block(next.addr) + 1);
        [(0, 2), (1, 3)]
            .iter()
            .any(|&(s, e)| s <= start && end <= e)
    }

    #[test]
    fn a_run_is_merged_only_while_one_registration_holds_all_of_it() {
        let pairs = [(0, 0), (1, 1), (2, 2)];
        assert_eq!(runs(&pairs, None, overlapping), [(0, 2), (2, 1)]);
        // From block 1 on, Y holds the run.
        let pairs = [(1, 1), (2, 2)];
        assert_eq!(runs(&pairs, None, overlapping), [(0, 2)]);
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
            local: &local,
            local_regions: &ids,
            target: Target::Peer(PeerTarget {
                peer: "p",
                remote: &remote,
                notification: b"k",
                notify: true,
            }),
        };
        let found: Vec<(usize, usize)> = request.runs(any).map(|r| (r.first, r.count)).collect();
        assert_eq!(found, [(0, 1), (1, 1), (2, 1), (3, 1)]);
    }

    proptest::proptest! {
        /// Random, overlapping registrations of a peer and random remote
        /// ranges (neighbours or not), paired with one contiguous local
        /// region: the runs cover exactly the pairs, in order, each run of
        /// more than one pair lies in one registration, and a run ends only
        /// where no registration could hold it with the next pair.
        #[test]
        fn merged_runs_lie_in_one_registration_and_cover_exactly_the_pairs(
            registrations in proptest::collection::vec((0usize..48, 1usize..16), 0..6),
            ranges in proptest::collection::vec((proptest::bool::weighted(0.8), 0usize..4, 1usize..4), 0..16),
        ) {
            const UNIT: usize = 0x100;
            let held = |start: usize, end: usize| {
                registrations
                    .iter()
                    .any(|&(s, len)| s * UNIT <= start && end <= (s + len) * UNIT)
            };
            let mut remote = Vec::new();
            let mut at = 0x10 * UNIT;
            for &(neighbour, gap, len) in &ranges {
                if !neighbour {
                    at += gap * UNIT;
                }
                remote.push(seg(at, len * UNIT));
                at += len * UNIT;
            }
            let mut local = Vec::new();
            let mut l = 0x100_000;
            for r in &remote {
                local.push(seg(l, r.len));
                l += r.len;
            }
            let ids = vec![RegionId(1); remote.len()];
            let request = TransferRequest {
                op: OperationKind::Read,
                local: &local,
                local_regions: &ids,
                target: Target::Peer(PeerTarget {
                    peer: "p",
                    remote: &remote,
                    notification: b"k",
                    notify: true,
                }),
            };
            let found: Vec<Run> = request
                .runs(|run: &Segment, next: &Segment| {
                    next.end().is_some_and(|end| held(run.addr, end))
                })
                .collect();
            let mut next = 0;
            for (k, run) in found.iter().enumerate() {
                proptest::prop_assert_eq!(run.first, next);
                proptest::prop_assert!(run.count >= 1);
                let pairs = run.first..run.first + run.count;
                let bytes: usize = remote[pairs.clone()].iter().map(|s| s.len).sum();
                proptest::prop_assert_eq!(run.remote, seg(remote[run.first].addr, bytes));
                proptest::prop_assert_eq!(run.local, seg(local[run.first].addr, bytes));
                for i in pairs.clone().skip(1) {
                    proptest::prop_assert_eq!(remote[i - 1].end(), Some(remote[i].addr));
                }
                if run.count > 1 {
                    proptest::prop_assert!(
                        held(run.remote.addr, run.remote.addr + bytes),
                        "run {:?} lies in no registration of {:?}", run, registrations
                    );
                }
                // Greedy: the next pair was left out for a reason.
                if let (Some(after), Some(_)) = (found.get(k + 1), remote.get(pairs.end)) {
                    let r = remote[after.first];
                    if run.remote.end() == Some(r.addr) {
                        proptest::prop_assert!(!held(run.remote.addr, r.addr + r.len));
                    }
                }
                next = pairs.end;
            }
            proptest::prop_assert_eq!(next, remote.len());
        }
    }

    #[test]
    fn a_range_that_would_wrap_the_address_space_ends_its_run() {
        let local = [seg(usize::MAX - 15, 16), seg(0, 16)];
        let remote = [seg(0x9000, 16), seg(0x9010, 16)];
        let ids = [RegionId(1); 2];
        let request = TransferRequest {
            op: OperationKind::Read,
            local: &local,
            local_regions: &ids,
            target: Target::Peer(PeerTarget {
                peer: "p",
                remote: &remote,
                notification: b"k",
                notify: true,
            }),
        };
        assert_eq!(request.runs(any).count(), 2);
    }
}
