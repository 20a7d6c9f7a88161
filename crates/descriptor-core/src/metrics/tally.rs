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
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{MetricEncoder, NoLabelSet};
use prometheus_client::metrics::exemplar::Exemplar;

/// Threads that count into lines of their own at once: one bit each of
/// [`TAKEN`].
pub(super) const OWNED: usize = 64;

/// The slots held now, one bit each.
static TAKEN: AtomicU64 = AtomicU64::new(0);

/// Takes a free slot; `None` when all are held.
fn take_free() -> Option<usize> {
    let mut taken = TAKEN.load(Ordering::Relaxed);
    loop {
        let free = (!taken).trailing_zeros() as usize;
        if free >= OWNED {
            return None;
        }
        // Acquire: pairs with the release of the slot's last holder, whose
        // stores to its lines then happen before our loads.
        match TAKEN.compare_exchange_weak(
            taken,
            taken | 1 << free,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => return Some(free),
            Err(now) => taken = now,
        }
    }
}

/// [`SLOT`] before the thread first counts.
const UNTAKEN: usize = usize::MAX;

/// Gives the thread's slot back when the thread exits.
struct Hold;

impl Drop for Hold {
    fn drop(&mut self) {
        // From here on the thread counts into the shared lines.
        let slot = SLOT.replace(OWNED);
        if slot < OWNED {
            TAKEN.fetch_and(!(1 << slot), Ordering::Release);
        }
    }
}

thread_local! {
    /// The thread's slot: [`UNTAKEN`], or [`OWNED`] for the shared lines.
    /// Constant-initialised and without a destructor, so that reading it
    /// is one thread-local load, with no state to check.
    static SLOT: std::cell::Cell<usize> = const { std::cell::Cell::new(UNTAKEN) };
    /// Registered, when the thread takes a slot, to give it back.
    static HOLD: Hold = const { Hold };
}

/// The current thread's slot, taken now: [`OWNED`] when all were held, or
/// when the thread is exiting (its [`HOLD`] is gone, and so could not give
/// a slot back).
#[cold]
fn take() -> usize {
    let slot = match HOLD.try_with(|_| ()) {
        Ok(()) => take_free().unwrap_or(OWNED),
        Err(_) => OWNED,
    };
    SLOT.set(slot);
    slot
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
        let slot = match SLOT.get() {
            UNTAKEN => take(),
            slot => slot,
        };
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
    shared: Box<[Block]>,
    owned: [OnceLock<Box<[Block]>>; OWNED],
}

impl Cells {
    pub(super) fn new(len: usize) -> Cells {
        Cells {
            len,
            owned: std::array::from_fn(|_| OnceLock::new()),
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

/// Where a histogram of integer observations (nanoseconds, descriptors)
/// lies in a line of [`Cells`], from some first count: a count per bucket
/// (not cumulative), the last one `+Inf`'s, then the sum of the
/// observations. Observing is two additions to the line, where
/// prometheus-client's
/// [`Histogram`](prometheus_client::metrics::histogram::Histogram) takes a
/// lock.
#[derive(Debug)]
pub(super) struct Buckets {
    /// Upper bounds as encoded (in the metric's unit).
    bounds: &'static [f64],
    /// The same in observed units, rounded.
    upper: Box<[u64]>,
    /// The first of them (the common case).
    first: u64,
    /// The metric's unit per observed unit.
    scale: f64,
    /// The index of the first bucket's count, from the first count.
    at: usize,
    /// The index of the sum, from the first count.
    sum: usize,
}

impl Buckets {
    /// Buckets `bounds` (in the metric's unit, `scale` per observed unit),
    /// `at` counts from some first count of a line.
    pub(super) fn new(bounds: &'static [f64], scale: f64, at: usize) -> Buckets {
        let upper: Box<[u64]> = bounds.iter().map(|b| (b / scale).round() as u64).collect();
        Buckets {
            bounds,
            first: upper.first().copied().unwrap_or(u64::MAX),
            upper,
            scale,
            at,
            sum: at + bounds.len() + 1,
        }
    }

    /// The counts it takes in a line: each bound's, `+Inf`'s, the sum.
    pub(super) fn len(&self) -> usize {
        self.bounds.len() + 2
    }

    /// Observes `value` into the histogram that starts at `from` of `line`.
    #[inline]
    pub(super) fn observe(&self, line: &Line<'_>, from: usize, value: u64) {
        // The first bucket whose bound is at least `value`, or `+Inf`; the
        // first is the common case (one descriptor, a copy under 5 us).
        let bucket = if value <= self.first {
            0
        } else {
            self.upper.partition_point(|&upper| upper < value)
        };
        line.add(from + self.at + bucket, 1);
        line.add(from + self.sum, value);
    }

    /// The observations of the histogram that starts at `from` of `cells`'
    /// lines: its buckets' total.
    pub(super) fn count(&self, cells: &Cells, from: usize) -> u64 {
        (0..=self.bounds.len())
            .map(|i| cells.sum(from + self.at + i))
            .fold(0, u64::wrapping_add)
    }

    /// Encodes the histogram that starts at `from` of `cells`' lines.
    pub(super) fn encode(
        &self,
        cells: &Cells,
        from: usize,
        mut encoder: MetricEncoder<'_>,
    ) -> std::result::Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .enumerate()
            .map(|(i, bound)| (bound, cells.sum(from + self.at + i)))
            .collect();
        // The count is the buckets' total, so that a scrape in the middle
        // of an observation is consistent in itself.
        let count = buckets
            .iter()
            .fold(0u64, |total, (_, n)| total.wrapping_add(*n));
        let sum = cells.sum(from + self.sum) as f64 * self.scale;
        encoder.encode_histogram(
            sum,
            count,
            &buckets,
            None::<&std::collections::HashMap<usize, Exemplar<NoLabelSet, f64>>>,
        )
    }
}

#[cfg(test)]
mod tests;
