//! Counts kept per thread and added up when encoded: what makes counting a
//! transfer a few plain stores instead of a dozen locked additions
//! (decision 0016).
//!
//! A thread takes one of [`OWNED`] slots the first time it counts and gives
//! it back when it exits. Every [`Cells`] keeps a line of counts per slot,
//! written only by the thread that holds the slot, so an addition is a load
//! and a store: no locked instruction, and no update lost, since no other
//! thread writes that line. The next holder of a slot takes it with an
//! acquire that pairs with the release that gave it back, so it adds to
//! the counts its predecessor left. Threads past [`OWNED`] at once share
//! one more line, with atomic additions (what every count cost before).
//!
//! An encoding adds the lines up. A scrape while a transfer is being
//! counted may see part of that transfer's counts, as with any set of
//! separate counters, but never a counter go down.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Threads that count into lines of their own at once: one bit each of
/// [`TAKEN`].
pub(super) const OWNED: usize = 64;

/// The slots held now, one bit each.
static TAKEN: AtomicU64 = AtomicU64::new(0);

/// A thread's slot (`None`: all were held when it first counted), given
/// back when the thread exits.
struct Slot(Option<usize>);

impl Slot {
    fn take() -> Slot {
        let mut taken = TAKEN.load(Ordering::Relaxed);
        loop {
            let free = (!taken).trailing_zeros() as usize;
            if free >= OWNED {
                return Slot(None);
            }
            // Acquire: pairs with the release of the slot's last holder,
            // whose stores to its lines then happen before our loads.
            match TAKEN.compare_exchange_weak(
                taken,
                taken | 1 << free,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Slot(Some(free)),
                Err(now) => taken = now,
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            TAKEN.fetch_and(!(1 << slot), Ordering::Release);
        }
    }
}

thread_local! {
    static SLOT: Slot = Slot::take();
}

/// Where the current thread counts: its own lines, or the shared ones.
///
/// Not `Send`: a line may be written only by the thread that holds its slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shard {
    /// The slot; [`OWNED`] for the shared lines.
    slot: usize,
    _this_thread: PhantomData<*const ()>,
}

impl Shard {
    /// The current thread's. A thread whose slot was already given back
    /// (a thread-local destructor that counts, at the thread's exit) counts
    /// into the shared lines.
    #[inline]
    pub(super) fn current() -> Shard {
        let slot = SLOT.try_with(|s| s.0).ok().flatten().unwrap_or(OWNED);
        Shard {
            slot,
            _this_thread: PhantomData,
        }
    }
}

/// Counts per block: a line is whole blocks.
const BLOCK: usize = 16;

/// Sixteen counts, aligned to two cache lines, so that two threads' lines
/// share no cache line (nor its prefetched neighbour).
#[repr(align(128))]
struct Block([AtomicU64; BLOCK]);

fn line(len: usize) -> Box<[Block]> {
    (0..len.div_ceil(BLOCK))
        .map(|_| Block(std::array::from_fn(|_| AtomicU64::new(0))))
        .collect()
}

#[inline]
fn cell(blocks: &[Block], index: usize) -> Option<&AtomicU64> {
    blocks.get(index / BLOCK).map(|b| &b.0[index % BLOCK])
}

/// `len` counts: a line of them per slot (made when the slot's thread first
/// counts here), and a shared line.
pub(super) struct Cells {
    len: usize,
    owned: Box<[OnceLock<Box<[Block]>>]>,
    shared: Box<[Block]>,
}

impl Cells {
    pub(super) fn new(len: usize) -> Cells {
        Cells {
            len,
            owned: (0..OWNED).map(|_| OnceLock::new()).collect(),
            shared: line(len),
        }
    }

    /// The line `shard` writes.
    #[inline]
    pub(super) fn line(&self, shard: Shard) -> Line<'_> {
        match self.owned.get(shard.slot) {
            Some(owned) => Line {
                blocks: owned.get_or_init(|| line(self.len)),
                owned: true,
                _this_thread: PhantomData,
            },
            None => Line {
                blocks: &self.shared,
                owned: false,
                _this_thread: PhantomData,
            },
        }
    }

    /// Count `index` over every line (wrapping, as the additions do).
    pub(super) fn sum(&self, index: usize) -> u64 {
        self.owned
            .iter()
            .filter_map(OnceLock::get)
            .map(|blocks| &blocks[..])
            .chain([&self.shared[..]])
            .filter_map(|blocks| cell(blocks, index))
            .fold(0, |sum, c| sum.wrapping_add(c.load(Ordering::Relaxed)))
    }
}

impl std::fmt::Debug for Cells {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries((0..self.len).map(|i| self.sum(i)))
            .finish()
    }
}

/// One thread's line of a [`Cells`]: not `Send`, like its [`Shard`].
pub(super) struct Line<'a> {
    blocks: &'a [Block],
    /// Written by this thread only (else shared).
    owned: bool,
    _this_thread: PhantomData<*const ()>,
}

impl Line<'_> {
    #[inline]
    pub(super) fn add(&self, index: usize, value: u64) {
        let Some(count) = cell(self.blocks, index) else {
            return;
        };
        if self.owned {
            // Only this thread writes this line, so nothing comes between
            // the load and the store; readers see one value or the other.
            count.store(
                count.load(Ordering::Relaxed).wrapping_add(value),
                Ordering::Relaxed,
            );
        } else {
            count.fetch_add(value, Ordering::Relaxed);
        }
    }
}

/// A counter (encoded as prometheus-client's [`Counter`] is) kept in
/// [`Cells`]. Clones share the counts.
///
/// [`Counter`]: prometheus_client::metrics::counter::Counter
#[derive(Clone, Debug)]
pub(super) struct Tally(Arc<Cells>);

impl Default for Tally {
    fn default() -> Tally {
        Tally(Arc::new(Cells::new(1)))
    }
}

impl Tally {
    #[inline]
    pub(super) fn add(&self, shard: Shard, value: u64) {
        self.0.line(shard).add(0, value);
    }

    pub(super) fn get(&self) -> u64 {
        self.0.sum(0)
    }
}

impl TypedMetric for Tally {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for Tally {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> std::result::Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// A histogram of integer observations (nanoseconds, descriptors) kept in
/// [`Cells`], where prometheus-client's
/// [`Histogram`](prometheus_client::metrics::histogram::Histogram) takes a
/// lock per observation. Clones share the counts.
#[derive(Clone, Debug)]
pub(super) struct Buckets {
    shared: Arc<BucketsInner>,
}

#[derive(Debug)]
struct BucketsInner {
    /// Upper bounds as encoded (in the metric's unit).
    bounds: &'static [f64],
    /// The same in observed units, rounded.
    upper: Box<[u64]>,
    /// Observations per bucket (not cumulative), the last one `+Inf`'s,
    /// then the sum of the observations, in observed units.
    cells: Cells,
    /// The metric's unit per observed unit.
    scale: f64,
}

impl Buckets {
    pub(super) fn new(bounds: &'static [f64], scale: f64) -> Buckets {
        Buckets {
            shared: Arc::new(BucketsInner {
                bounds,
                upper: bounds.iter().map(|b| (b / scale).round() as u64).collect(),
                // Each bound's bucket, `+Inf`'s, the sum.
                cells: Cells::new(bounds.len() + 2),
                scale,
            }),
        }
    }

    #[inline]
    pub(super) fn observe(&self, shard: Shard, value: u64) {
        let h = &*self.shared;
        // The first bucket whose bound is at least `value`, or `+Inf`; the
        // first is the common case (one descriptor, a copy under 5 us).
        let bucket = match h.upper.first() {
            Some(&first) if value <= first => 0,
            _ => h.upper.partition_point(|&upper| upper < value),
        };
        let line = h.cells.line(shard);
        line.add(bucket, 1);
        line.add(h.bounds.len() + 1, value);
    }
}

impl TypedMetric for Buckets {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Buckets {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> std::result::Result<(), std::fmt::Error> {
        let h = &*self.shared;
        let buckets: Vec<(f64, u64)> = h
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .enumerate()
            .map(|(i, bound)| (bound, h.cells.sum(i)))
            .collect();
        // The count is the buckets' total, so that a scrape in the middle
        // of an observation is consistent in itself.
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = h.cells.sum(h.bounds.len() + 1) as f64 * h.scale;
        encoder.encode_histogram(
            sum,
            count,
            &buckets,
            None::<&std::collections::HashMap<usize, Exemplar<NoLabelSet, f64>>>,
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests;
