//! Where a peer's registrations lie ([`Spans`]), so that neighbouring
//! ranges of a transfer go to NIXL as one descriptor only where one
//! registration holds them all.

use std::collections::BTreeMap;

use descriptor_core::{DeviceKind, Segment};

use crate::agent_metadata::RegionKey;

/// Where a peer's registrations lie, by NIXL memory type and device: tells
/// whether two ranges of a transfer lie in one registration, so that they
/// may go to NIXL as one descriptor (a descriptor across two is refused).
#[derive(Debug, Default, Clone)]
pub(crate) struct Spans {
    kinds: BTreeMap<MemKind, Frontier>,
}

/// NIXL's memory type and device id.
type MemKind = (u32, u64);

/// The registrations of one kind that no other contains, by start: their
/// starts and their ends both strictly increase, so the last one starting at
/// or before an address reaches furthest of all starting there or before. A
/// registration another contains answers no question the other does not.
#[derive(Debug, Default, Clone)]
struct Frontier(BTreeMap<u64, u64>);

impl Frontier {
    /// Adds `[start, end)`: dropped if one held contains it, else held, and
    /// the ones it contains (which follow it, by start) dropped.
    fn insert(&mut self, start: u64, end: u64) {
        if self.reach(start).is_some_and(|e| e >= end) {
            return;
        }
        let contained: Vec<u64> = self
            .0
            .range(start..)
            .take_while(|&(_, &e)| e <= end)
            .map(|(&s, _)| s)
            .collect();
        for s in contained {
            self.0.remove(&s);
        }
        self.0.insert(start, end);
    }

    /// The furthest end of the registrations starting at or before `at`.
    fn reach(&self, at: u64) -> Option<u64> {
        self.0.range(..=at).next_back().map(|(_, &e)| e)
    }
}

impl Spans {
    pub(crate) fn new<'a>(regions: impl Iterator<Item = &'a RegionKey>) -> Spans {
        let mut spans = Spans::default();
        for key in regions {
            spans.insert(key);
        }
        spans
    }

    pub(crate) fn insert(&mut self, key: &RegionKey) {
        self.kinds
            .entry((key.mem, key.dev))
            .or_default()
            .insert(key.addr, key.addr.saturating_add(key.len));
    }

    /// Whether one registration holds every byte from `a`'s start through
    /// `b`'s end (`a` before `b`, on one device): one that starts at or
    /// before `a` and ends at or past `b`'s end. [`TransferRequest::runs`]
    /// asks it with `a` the run merged so far, so that a run is merged only
    /// while all of it lies in one registration: where registrations overlap
    /// (X = [0, 8 KiB) and Y = [4 KiB, 12 KiB), a Dynamo peer's overlapping
    /// descriptors), neighbours each in one may together lie in none.
    ///
    /// [`TransferRequest::runs`]: descriptor_core::TransferRequest::runs
    pub(crate) fn hold_together(&self, a: &Segment, b: &Segment) -> bool {
        let kind = match a.device.kind() {
            DeviceKind::Host => (0, 0),
            DeviceKind::Cuda | DeviceKind::Xpu => (1, u64::from(a.device.ordinal())),
            _ => return false,
        };
        let (Ok(start), Some(end)) = (
            u64::try_from(a.addr),
            b.end().and_then(|e| u64::try_from(e).ok()),
        ) else {
            return false;
        };
        self.kinds
            .get(&kind)
            .and_then(|f| f.reach(start))
            .is_some_and(|reach| reach >= end)
    }
}

#[cfg(test)]
impl Spans {
    /// How many registrations the index holds (those no other contains).
    pub(crate) fn indexed(&self) -> usize {
        self.kinds.values().map(|f| f.0.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_tell_whether_two_ranges_lie_in_one_registration() {
        use descriptor_core::Device;
        let key = |mem: u32, addr: u64, len: u64, dev: u64| RegionKey {
            backend: "UCX".into(),
            mem,
            addr,
            len,
            dev,
        };
        let keys = [
            key(0, 0x1000, 0x1000, 0),
            key(0, 0x2000, 0x1000, 0),
            key(0, 0x8000, 0x4000, 0),
            key(1, 0x1000, 0x4000, 1),
        ];
        let spans = Spans::new(keys.iter());
        let seg = |addr: usize, len: usize, device: Device| Segment { addr, len, device };
        let host = |addr, len| seg(addr, len, Device::HOST);
        // In one registration.
        assert!(spans.hold_together(&host(0x1000, 0x800), &host(0x1800, 0x800)));
        assert!(spans.hold_together(&host(0x8000, 0x100), &host(0xbf00, 0x100)));
        // Adjacent registrations, past the end, outside every one.
        assert!(!spans.hold_together(&host(0x1800, 0x800), &host(0x2000, 0x800)));
        assert!(!spans.hold_together(&host(0xb000, 0x1000), &host(0xc000, 0x10)));
        assert!(!spans.hold_together(&host(0x4000, 0x10), &host(0x4010, 0x10)));
        // Another device's registration does not hold host ranges, nor the
        // other way round; its own device's ranges it does.
        let cuda = |ordinal, addr, len| seg(addr, len, Device::cuda(ordinal));
        assert!(spans.hold_together(&cuda(1, 0x1000, 0x800), &cuda(1, 0x1800, 0x3800)));
        assert!(!spans.hold_together(&cuda(0, 0x1000, 0x800), &cuda(0, 0x1800, 0x800)));
        assert!(!spans.hold_together(&host(0x3000, 0x800), &host(0x3800, 0x800)));
        assert!(!Spans::default().hold_together(&host(0x1000, 1), &host(0x1001, 1)));
    }

    /// X = [0, 8 KiB) and Y = [4 KiB, 12 KiB) of one peer, three 4 KiB remote
    /// ranges end to end: each neighbouring pair lies in X or in Y, the
    /// three together in neither; the runs NIXL is given lie each in one.
    #[test]
    fn runs_over_overlapping_registrations_lie_each_in_one() {
        use descriptor_core::{
            Device, OperationKind, PeerTarget, RegionId, Target, TransferRequest,
        };
        const B: u64 = 4096;
        let key = |addr: u64, len: u64| RegionKey {
            backend: "UCX".into(),
            mem: 0,
            addr,
            len,
            dev: 0,
        };
        let base = 0x10_0000;
        let spans = Spans::new([key(base, 2 * B), key(base + B, 2 * B)].iter());
        let host = |addr: u64, len: u64| Segment {
            addr: usize::try_from(addr).unwrap(),
            len: usize::try_from(len).unwrap(),
            device: Device::HOST,
        };
        let remote: Vec<Segment> = (0..3).map(|i| host(base + i * B, B)).collect();
        assert!(spans.hold_together(&remote[0], &remote[1]));
        assert!(spans.hold_together(&remote[1], &remote[2]));
        assert!(!spans.hold_together(&host(base, 2 * B), &remote[2]));
        let local: Vec<Segment> = (0..3).map(|i| host(0x90_0000 + i * B, B)).collect();
        let request = TransferRequest {
            op: OperationKind::Read,
            local: &local,
            local_regions: &[RegionId(1); 3],
            target: Target::Peer(PeerTarget {
                peer: "p",
                remote: &remote,
                notification: b"k",
                notify: true,
            }),
        };
        let runs: Vec<(Segment, usize)> = request
            .runs(|a, b| spans.hold_together(a, b))
            .map(|run| (run.remote, run.count))
            .collect();
        assert_eq!(runs, [(host(base, 2 * B), 2), (host(base + 2 * B, B), 1)]);
    }

    fn brute_hold(keys: &[RegionKey], a: &Segment, b: &Segment) -> bool {
        let (Some(end), Ok(start)) = (b.end(), u64::try_from(a.addr)) else {
            return false;
        };
        let Ok(end) = u64::try_from(end) else {
            return false;
        };
        keys.iter().any(|k| {
            k.mem == 0 && k.dev == 0 && k.addr <= start && k.addr.saturating_add(k.len) >= end
        })
    }

    proptest::proptest! {
        /// The index, built up one registration at a time or at once,
        /// answers as a scan of every registration does.
        #[test]
        fn spans_answer_as_a_scan_of_every_registration(
            regs in proptest::collection::vec((0u64..64, 0u64..24, 0u32..2), 0..40),
            asks in proptest::collection::vec((0usize..80, 1usize..16, 0usize..24), 1..40),
        ) {
            use descriptor_core::Device;
            let keys: Vec<RegionKey> = regs
                .iter()
                .map(|&(addr, len, mem)| RegionKey {
                    backend: "UCX".into(),
                    mem,
                    addr,
                    len,
                    dev: 0,
                })
                .collect();
            let host = |addr: usize, len: usize| Segment { addr, len, device: Device::HOST };
            let mut grown = Spans::default();
            for (n, key) in keys.iter().enumerate() {
                grown.insert(key);
                for &(addr, len, gap) in &asks {
                    let (a, b) = (host(addr, len), host(addr + len + gap % 3, gap + 1));
                    let want = brute_hold(&keys[..=n], &a, &b);
                    proptest::prop_assert_eq!(grown.hold_together(&a, &b), want);
                }
            }
            let whole = Spans::new(keys.iter());
            for &(addr, len, gap) in &asks {
                let (a, b) = (host(addr, len), host(addr + len, gap + 1));
                proptest::prop_assert_eq!(whole.hold_together(&a, &b), brute_hold(&keys, &a, &b));
            }
        }
    }
}
