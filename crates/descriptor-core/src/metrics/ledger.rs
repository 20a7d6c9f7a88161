//! A backend's ledger: the counts on a transfer's path (posted, completed,
//! their bytes, descriptors and durations, per direction; exposures,
//! revocations and notifications), all in one [`Cells`], so that an
//! operation finds its thread's line once and touches a cache line or two
//! of it; and the registry entries that encode them, one per family.

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use super::tally::{Buckets, Cells, Line, Shard};
use super::{DESCRIPTOR_BUCKETS, DURATION_BUCKETS, lock};

/// (op, target) of each direction, in [`direction`](super::direction)'s
/// order.
pub(super) const DIRECTIONS: [(&str, &str); 4] = [
    ("read", "peer"),
    ("read", "file"),
    ("write", "peer"),
    ("write", "file"),
];

// A line: the backend's counts, then each direction's.
const EXPOSURES: usize = 0; // Read, write.
const REVOCATIONS: usize = 2;
const NOTIFICATIONS: usize = 3;
const FIRST_DIRECTION: usize = 4;

// A direction's counts, from its first. Its transfers posted and completed
// are its two histograms' counts: each observes once per transfer.
const POSTED_BYTES: usize = 0;
const COMPLETED_BYTES: usize = 1;
/// The descriptors' histogram; the durations' follows.
const DESCRIPTORS: usize = 2;

/// One backend's counts.
pub(super) struct Ledger {
    descriptors: Buckets,
    duration: Buckets,
    /// A direction's counts.
    per_direction: usize,
    cells: Cells,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").finish_non_exhaustive()
    }
}

impl Ledger {
    fn new() -> Ledger {
        let descriptors = Buckets::new(DESCRIPTOR_BUCKETS, 1.0, DESCRIPTORS);
        // Observed in nanoseconds, encoded in seconds.
        let duration = Buckets::new(DURATION_BUCKETS, 1e-9, DESCRIPTORS + descriptors.len());
        let per_direction = DESCRIPTORS + descriptors.len() + duration.len();
        Ledger {
            cells: Cells::new(FIRST_DIRECTION + DIRECTIONS.len() * per_direction),
            descriptors,
            duration,
            per_direction,
        }
    }

    /// What `shard` counts into.
    #[inline]
    pub(super) fn counting(&self, shard: Shard) -> Counting<'_> {
        Counting {
            ledger: self,
            line: self.cells.line(shard),
        }
    }

    /// The first count of `direction`.
    fn direction(&self, direction: usize) -> usize {
        FIRST_DIRECTION + direction * self.per_direction
    }
}

/// One thread's line of a [`Ledger`].
pub(super) struct Counting<'a> {
    ledger: &'a Ledger,
    line: Line<'a>,
}

impl Counting<'_> {
    /// A transfer posted in `direction`: `bytes` in `descriptors` local
    /// descriptors.
    #[inline]
    pub(super) fn posted(&self, direction: usize, bytes: u64, descriptors: u64) {
        let first = self.ledger.direction(direction);
        self.line.add(first + POSTED_BYTES, bytes);
        self.ledger
            .descriptors
            .observe(&self.line, first, descriptors);
    }

    /// A transfer in `direction` that moved its `bytes`, `nanos` after it
    /// was posted.
    #[inline]
    pub(super) fn completed(&self, direction: usize, bytes: u64, nanos: u64) {
        let first = self.ledger.direction(direction);
        self.line.add(first + COMPLETED_BYTES, bytes);
        self.ledger.duration.observe(&self.line, first, nanos);
    }

    /// An exposure made, granting `write` access or read.
    #[inline]
    pub(super) fn exposed(&self, write: bool) {
        self.line.add(EXPOSURES + usize::from(write), 1);
    }

    #[inline]
    pub(super) fn revoked(&self) {
        self.line.add(REVOCATIONS, 1);
    }

    #[inline]
    pub(super) fn notified(&self) {
        self.line.add(NOTIFICATIONS, 1);
    }
}

/// Every backend's ledger, by backend name: what the families encode.
#[derive(Debug, Default)]
pub(super) struct Table(Mutex<Vec<(&'static str, Arc<Ledger>)>>);

impl Table {
    /// `backend`'s ledger, at zero the first time: every wrapper of a
    /// backend of that name counts into the same.
    pub(super) fn of(&self, backend: &'static str) -> Arc<Ledger> {
        let mut table = lock(&self.0);
        if let Some((_, ledger)) = table.iter().find(|(name, _)| *name == backend) {
            return Arc::clone(ledger);
        }
        let ledger = Arc::new(Ledger::new());
        table.push((backend, Arc::clone(&ledger)));
        ledger
    }
}

/// What a family shows of each ledger.
#[derive(Clone, Copy, Debug)]
pub(super) enum Shown {
    Posted,
    PostedBytes,
    Completed,
    CompletedBytes,
    Descriptors,
    Duration,
    Exposures,
    Revocations,
    Notifications,
}

/// One family of the [`Table`], as a registry entry: a series per backend
/// (and direction, or access). Clones share the table.
#[derive(Clone, Debug)]
pub(super) struct LedgerFamily {
    table: Arc<Table>,
    shown: Shown,
}

impl LedgerFamily {
    pub(super) fn new(table: &Arc<Table>, shown: Shown) -> LedgerFamily {
        LedgerFamily {
            table: Arc::clone(table),
            shown,
        }
    }
}

fn counter(mut series: MetricEncoder<'_>, value: u64) -> std::result::Result<(), std::fmt::Error> {
    series.encode_counter::<NoLabelSet, _, u64>(&value, None)
}

impl EncodeMetric for LedgerFamily {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> std::result::Result<(), std::fmt::Error> {
        // Encoded after the lock is released: the encoder writes into
        // whatever the caller of the registry's encoding gave it.
        let table = lock(&self.table.0).clone();
        for (backend, ledger) in &table {
            let b = ("backend", *backend);
            let cells = &ledger.cells;
            match self.shown {
                Shown::Exposures => {
                    for (i, op) in ["read", "write"].into_iter().enumerate() {
                        let labels = [b, ("op", op)];
                        let series = encoder.encode_family(&labels)?;
                        counter(series, cells.sum(EXPOSURES + i))?;
                    }
                }
                Shown::Revocations => {
                    counter(encoder.encode_family(&[b])?, cells.sum(REVOCATIONS))?;
                }
                Shown::Notifications => {
                    counter(encoder.encode_family(&[b])?, cells.sum(NOTIFICATIONS))?;
                }
                shown => {
                    for (d, (op, target)) in DIRECTIONS.into_iter().enumerate() {
                        let first = ledger.direction(d);
                        let labels = [b, ("op", op), ("target", target)];
                        let series = encoder.encode_family(&labels)?;
                        match shown {
                            Shown::Posted => {
                                counter(series, ledger.descriptors.count(cells, first))?;
                            }
                            Shown::PostedBytes => counter(series, cells.sum(first + POSTED_BYTES))?,
                            Shown::Completed => {
                                counter(series, ledger.duration.count(cells, first))?;
                            }
                            Shown::CompletedBytes => {
                                counter(series, cells.sum(first + COMPLETED_BYTES))?;
                            }
                            Shown::Descriptors => {
                                ledger.descriptors.encode(cells, first, series)?
                            }
                            Shown::Duration => ledger.duration.encode(cells, first, series)?,
                            Shown::Exposures | Shown::Revocations | Shown::Notifications => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        match self.shown {
            Shown::Descriptors | Shown::Duration => MetricType::Histogram,
            _ => MetricType::Counter,
        }
    }

    fn is_empty(&self) -> bool {
        // As a `Family` with no series: no backend wrapped yet.
        lock(&self.table.0).is_empty()
    }
}
