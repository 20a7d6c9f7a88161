//! Transfer metrics over any backend (feature `metrics`), encoded as
//! Prometheus / OpenMetrics text.
//!
//! [`Metered`] wraps a [`RegistrationBackend`] the way [`Faulty`] does
//! (object_store's `LimitStore<T>` pattern): it forwards every call and
//! counts what it sees, into the series of a [`Metrics`] handle. Without the
//! feature nothing of this is compiled in; with it, a connector over a
//! backend that is not wrapped pays nothing either. The library is
//! [`prometheus_client`], the official OpenMetrics client (decision 0016).
//!
//! ```
//! use descriptor_core::metrics::{Metered, Metrics};
//! use descriptor_core::{Connector, RegistrationBackend};
//!
//! /// A connector over `backend` whose transfers are counted in `metrics`.
//! fn metered(backend: impl RegistrationBackend, metrics: &Metrics) -> Connector {
//!     Connector::new(Metered::new(backend, metrics))
//! }
//!
//! # fn serve(metrics: &Metrics) {
//! // What a `GET /metrics` handler answers (content type
//! // `application/openmetrics-text; version=1.0.0; charset=utf-8`):
//! let body: String = metrics.encode_text();
//! assert!(body.ends_with("# EOF\n"));
//! # }
//! # serve(&Metrics::new());
//! ```
//!
//! One [`Metrics`] may serve many wrapped backends (a prefill and a decode
//! connector in one process): series carry the backend's
//! [name](RegistrationBackend::backend_name) as a label, and wrappers of
//! backends of one name add up. To export through a registry of your own
//! (with your other metrics, under your labels), see
//! [`Metrics::register_into`].
//!
//! # Metrics
//!
//! Base units are seconds and bytes; counters end in `_total`; every name
//! starts with `nixl_connect_`. Labels take a few fixed values, never a peer's
//! name or address, so the series stay bounded (about 150 per backend):
//!
//! - `backend`: the transport's name (`loopback`, `nixl`);
//! - `op`: `read` or `write`, seen from the agent that posts;
//! - `target`: `peer` (another agent's memory) or `file` (storage);
//! - `kind`: `memory` or `file` (what was registered);
//! - `reason`: why a transfer failed, one of [`REASONS`].
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `nixl_connect_transfers_posted_total` | counter | backend, op, target | transfers posted (every call to `post`, refused ones included) |
//! | `nixl_connect_transfers_completed_total` | counter | backend, op, target | transfers seen to end with every byte moved |
//! | `nixl_connect_transfers_failed_total` | counter | backend, op, target, reason | transfers refused at posting or seen to fail |
//! | `nixl_connect_transfers_abandoned_total` | counter | backend, op, target | transfers released before their end was seen (cancelled or dropped operations) |
//! | `nixl_connect_transfers_in_flight` | gauge | backend, op, target | transfers posted whose end was not seen yet and that were not released |
//! | `nixl_connect_transfer_posted_bytes_total` | counter | backend, op, target | bytes of the transfers posted |
//! | `nixl_connect_transfer_completed_bytes_total` | counter | backend, op, target | bytes moved by completed transfers |
//! | `nixl_connect_transfer_descriptors` | histogram | backend, op, target | local descriptors per transfer posted (buckets 1, 2, 4 .. 4096) |
//! | `nixl_connect_transfer_duration_seconds` | histogram | backend, op, target | completed transfers, from posting to the poll that saw the end (buckets 5 µs .. 5 s) |
//! | `nixl_connect_registrations_total` | counter | backend, kind | regions and files registered |
//! | `nixl_connect_registration_failures_total` | counter | backend, kind | registrations the backend refused |
//! | `nixl_connect_deregistrations_total` | counter | backend, kind | regions and files deregistered |
//! | `nixl_connect_registered_regions` | gauge | backend, kind | regions and files registered now |
//! | `nixl_connect_registered_bytes` | gauge | backend | bytes of memory registered now (files count no bytes) |
//! | `nixl_connect_exposures_total` | counter | backend, op | exposures made for peers (`op`: the access they grant) |
//! | `nixl_connect_revocations_total` | counter | backend | exposures revoked |
//! | `nixl_connect_peers_loaded` | gauge | backend | peers loaded now |
//! | `nixl_connect_peer_loads_total` | counter | backend | peer metadata loaded (a peer loaded again counts again) |
//! | `nixl_connect_peer_unloads_total` | counter | backend | peers unloaded |
//! | `nixl_connect_notifications_received_total` | counter | backend | notifications received from peers |
//!
//! Every transfer posted ends counted once in `completed`, `failed` or
//! `abandoned`, or is still `in_flight`. A transfer's end is what the
//! connector learns from `post` (a backend may finish inside it: loopback
//! does) or from a `poll`, so its duration includes the time until the
//! connector looked; a transfer released before anyone looked at its end is
//! abandoned, whether or not its bytes moved.
//!
//! # Cost
//!
//! Per transfer, two reads of the CPU's time-stamp counter (where it is
//! invariant; else of the monotonic clock) and six additions, each a
//! plain load and store: the counts on a transfer's path are kept per
//! thread, in lines only that thread writes, and added up when encoded (up
//! to 64 threads at once; more share one line, with atomic additions). No
//! lock is taken, but for a transfer that does not end inside `post`: its
//! post time goes into a sharded map until its end is seen or it is
//! released (one short lock each). `cargo xtask bench` measures the 4 KiB
//! round trip bare and with [`Metered`] on both sides, in interleaved
//! batches, on loopback and on NIXL (the `metrics cost` rows and targets;
//! `bench --metrics-only` runs just those), and criterion the loopback one
//! (`loopback/4KiB_readable_read_roundtrip` and its `_metered` row);
//! decision 0016 has the numbers.
//!
//! [`Faulty`]: crate::faults::Faulty

use std::collections::{HashMap, HashSet};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use quanta::Clock;

mod ledger;
mod tally;

use ledger::{DIRECTIONS, Ledger, LedgerFamily, Shown, Table};
use tally::Shard;

use crate::backend::{
    EventHook, Exposed, Exposure, ExposureId, Notification, Posted, RegionId, RegistrationBackend,
    Release, Segment, Target, TransferId, TransferRequest, TransferState,
};
use crate::error::{Error, Result, SharedCause};
use crate::metadata::OperationKind;

/// The prefix of every metric's name.
pub const PREFIX: &str = "nixl_connect";

/// The clock transfers are timed with: the CPU's time-stamp counter where
/// it is invariant (`quanta` checks, and calibrates it against the
/// monotonic clock, once per process: 10-200 ms, in the first
/// [`Metered::new`]), else the monotonic clock. A read of the counter costs
/// less than half a read of [`std::time::Instant`] (decision 0016).
fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(Clock::new)
}

/// The values of the `reason` label of `nixl_connect_transfers_failed_total`:
///
/// - `access_denied`: the peer is unknown or gone, or refused the range
///   ([`Error::AccessDenied`], [`Error::Unauthenticated`]);
/// - `unsupported`: the backend cannot do it ([`Error::Unsupported`]);
/// - `unavailable`: the backend's runtime is missing ([`Error::BackendUnavailable`]);
/// - `invalid_request`: the request itself is wrong (sizes, counts, a file
///   read past its end, metadata that does not decode);
/// - `io`: an I/O error of the operating system (a file transfer's `EIO`,
///   `ENOSPC`);
/// - `backend`: any other failure the backend reported as [`Error::Backend`];
/// - `transfer`: the transport reported the transfer failed, with its own
///   message;
/// - `other`: anything else (a cancelled or timed-out wait, reported as a
///   transfer's failure).
pub const REASONS: &[&str] = &[
    "access_denied",
    "unsupported",
    "unavailable",
    "invalid_request",
    "io",
    "backend",
    "transfer",
    "other",
];

/// Upper bounds of `nixl_connect_transfer_duration_seconds`' buckets: 5 µs
/// (a small in-process copy) to 5 s (vLLM's `nixl_xfer_time_seconds` ends
/// there), 1-2.5-5 a decade.
pub const DURATION_BUCKETS: &[f64] = &[
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Upper bounds of `nixl_connect_transfer_descriptors`' buckets: powers of
/// two, 1 to 4096 (a KV-cache request's scattered blocks).
pub const DESCRIPTOR_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

type Labels<const N: usize> = [(&'static str, &'static str); N];

/// The metric families, shared by every clone of a [`Metrics`].
struct Families {
    /// Holds the families below, under [`PREFIX`].
    registry: Registry,
    /// Every backend's [`Ledger`]: the families posted, completed, their
    /// bytes, descriptors, durations, exposures, revocations and
    /// notifications.
    ledgers: Arc<Table>,
    failed: Family<Labels<4>, Counter>,
    abandoned: Family<Labels<3>, Counter>,
    in_flight: Family<Labels<3>, Gauge>,
    registrations: Family<Labels<2>, Counter>,
    registration_failures: Family<Labels<2>, Counter>,
    deregistrations: Family<Labels<2>, Counter>,
    registered_regions: Family<Labels<2>, Gauge>,
    registered_bytes: Family<Labels<1>, Gauge>,
    peers_loaded: Family<Labels<1>, Gauge>,
    peer_loads: Family<Labels<1>, Counter>,
    peer_unloads: Family<Labels<1>, Counter>,
}

impl Families {
    fn new() -> Families {
        let mut families = Families {
            // Replaced below, once the families exist to register.
            registry: Registry::default(),
            ledgers: Arc::default(),
            failed: Family::default(),
            abandoned: Family::default(),
            in_flight: Family::default(),
            registrations: Family::default(),
            registration_failures: Family::default(),
            deregistrations: Family::default(),
            registered_regions: Family::default(),
            registered_bytes: Family::default(),
            peers_loaded: Family::default(),
            peer_loads: Family::default(),
            peer_unloads: Family::default(),
        };
        let mut registry = Registry::with_prefix(PREFIX);
        families.register(&mut registry);
        families.registry = registry;
        families
    }

    /// Registers (clones of) every family into `registry`: the clones share
    /// their series with these.
    fn register(&self, registry: &mut Registry) {
        let r = registry;
        let ledgers = |shown| LedgerFamily::new(&self.ledgers, shown);
        r.register(
            "transfers_posted",
            "Transfers posted (every call to post, refused ones included)",
            ledgers(Shown::Posted),
        );
        r.register(
            "transfers_completed",
            "Transfers seen to end with every byte moved",
            ledgers(Shown::Completed),
        );
        r.register(
            "transfers_failed",
            "Transfers refused at posting or seen to fail, by reason",
            self.failed.clone(),
        );
        r.register(
            "transfers_abandoned",
            "Transfers released before their end was seen (cancelled or dropped operations)",
            self.abandoned.clone(),
        );
        r.register(
            "transfers_in_flight",
            "Transfers posted whose end was not seen yet and that were not released",
            self.in_flight.clone(),
        );
        r.register_with_unit(
            "transfer_posted",
            "Bytes of the transfers posted",
            Unit::Bytes,
            ledgers(Shown::PostedBytes),
        );
        r.register_with_unit(
            "transfer_completed",
            "Bytes moved by completed transfers",
            Unit::Bytes,
            ledgers(Shown::CompletedBytes),
        );
        r.register(
            "transfer_descriptors",
            "Local descriptors per transfer posted",
            ledgers(Shown::Descriptors),
        );
        r.register_with_unit(
            "transfer_duration",
            "Completed transfers, from posting to the poll that saw the end",
            Unit::Seconds,
            ledgers(Shown::Duration),
        );
        r.register(
            "registrations",
            "Regions and files registered",
            self.registrations.clone(),
        );
        r.register(
            "registration_failures",
            "Registrations the backend refused",
            self.registration_failures.clone(),
        );
        r.register(
            "deregistrations",
            "Regions and files deregistered",
            self.deregistrations.clone(),
        );
        r.register(
            "registered_regions",
            "Regions and files registered now",
            self.registered_regions.clone(),
        );
        r.register_with_unit(
            "registered",
            "Bytes of memory registered now (files count no bytes)",
            Unit::Bytes,
            self.registered_bytes.clone(),
        );
        r.register(
            "exposures",
            "Exposures made for peers, by the access they grant",
            ledgers(Shown::Exposures),
        );
        r.register(
            "revocations",
            "Exposures revoked",
            ledgers(Shown::Revocations),
        );
        r.register(
            "peers_loaded",
            "Peers loaded now",
            self.peers_loaded.clone(),
        );
        r.register(
            "peer_loads",
            "Peer metadata loaded (a peer loaded again counts again)",
            self.peer_loads.clone(),
        );
        r.register("peer_unloads", "Peers unloaded", self.peer_unloads.clone());
        r.register(
            "notifications_received",
            "Notifications received from peers",
            ledgers(Shown::Notifications),
        );
    }
}

/// The transfer metrics of one or more [`Metered`] backends: a cheap handle
/// (clones share the series) that encodes them as OpenMetrics text.
///
/// It owns a [`prometheus_client`] [`Registry`] holding only these metrics
/// (the [module docs](self) list them); [`register_into`](Self::register_into)
/// adds them to a registry of your own as well.
#[derive(Clone)]
pub struct Metrics {
    families: Arc<Families>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Metrics with no backend yet; every series appears once a
    /// [`Metered`] backend is made over them.
    pub fn new() -> Metrics {
        Metrics {
            families: Arc::new(Families::new()),
        }
    }

    /// Registers these metrics into `registry` too, under their
    /// `nixl_connect_` prefix (and whatever prefix and labels `registry`
    /// adds), so that one encoding of your registry holds them with your
    /// other metrics. Both registries show the same series. Register one
    /// `Metrics` once per registry: twice gives duplicate families.
    pub fn register_into(&self, registry: &mut Registry) {
        self.families
            .register(registry.sub_registry_with_prefix(PREFIX));
    }

    /// The registry that holds these metrics (and nothing else).
    pub fn registry(&self) -> &Registry {
        &self.families.registry
    }

    /// Every metric as OpenMetrics text (what Prometheus scrapes; its content
    /// type is `application/openmetrics-text; version=1.0.0; charset=utf-8`),
    /// ending in `# EOF`.
    pub fn encode_text(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail; an encoder error would be a bug
        // of prometheus_client, and the text up to it is still worth serving.
        if let Err(error) = encode(&mut text, &self.families.registry) {
            tracing::warn!(%error, "encoding the metrics failed");
        }
        text
    }
}

/// The series of one direction (op, target) of one backend, resolved once:
/// the hot path only adds to them.
struct Directed {
    op: &'static str,
    target: &'static str,
    abandoned: Counter,
    in_flight: Gauge,
}

/// What a registration is of, and its series.
struct Kind {
    registrations: Counter,
    failures: Counter,
    deregistrations: Counter,
    regions: Gauge,
}

const MEMORY: usize = 0;
const FILE: usize = 1;

/// The series of one backend.
struct Series {
    backend: &'static str,
    /// The counts on a transfer's path.
    ledger: Arc<Ledger>,
    /// By [`direction`].
    directed: [Directed; 4],
    /// [`MEMORY`], [`FILE`].
    kinds: [Kind; 2],
    registered_bytes: Gauge,
    peers_loaded: Gauge,
    peer_loads: Counter,
    peer_unloads: Counter,
}

impl Series {
    fn new(f: &Families, backend: &'static str) -> Series {
        let b = ("backend", backend);
        let directed = |index: usize| {
            let (op, target) = DIRECTIONS[index];
            Directed {
                op,
                target,
                abandoned: f
                    .abandoned
                    .get_or_create_owned(&[b, ("op", op), ("target", target)]),
                in_flight: f
                    .in_flight
                    .get_or_create_owned(&[b, ("op", op), ("target", target)]),
            }
        };
        let kind = |kind| Kind {
            registrations: f.registrations.get_or_create_owned(&[b, ("kind", kind)]),
            failures: f
                .registration_failures
                .get_or_create_owned(&[b, ("kind", kind)]),
            deregistrations: f.deregistrations.get_or_create_owned(&[b, ("kind", kind)]),
            regions: f
                .registered_regions
                .get_or_create_owned(&[b, ("kind", kind)]),
        };
        Series {
            backend,
            ledger: f.ledgers.of(backend),
            directed: std::array::from_fn(directed),
            kinds: [kind("memory"), kind("file")],
            registered_bytes: f.registered_bytes.get_or_create_owned(&[b]),
            peers_loaded: f.peers_loaded.get_or_create_owned(&[b]),
            peer_loads: f.peer_loads.get_or_create_owned(&[b]),
            peer_unloads: f.peer_unloads.get_or_create_owned(&[b]),
        }
    }
}

/// The index of a request's [`Directed`] series.
fn direction(op: OperationKind, target: &Target<'_>) -> usize {
    let op = match op {
        OperationKind::Read => 0,
        OperationKind::Write => 2,
    };
    op + usize::from(matches!(target, Target::File(_)))
}

/// The `reason` label of a failure the backend returned.
fn reason(error: &Error) -> &'static str {
    match error {
        Error::AccessDenied { .. } | Error::Unauthenticated { .. } => "access_denied",
        Error::Unsupported { .. } => "unsupported",
        Error::BackendUnavailable { .. } => "unavailable",
        Error::InvalidDevice { .. }
        | Error::InvalidDescriptor(_)
        | Error::RegisteredElsewhere { .. }
        | Error::InvalidMetadata { .. }
        | Error::EmptyDescriptorList { .. }
        | Error::OperationKindMismatch { .. }
        | Error::DescriptorCountMismatch { .. }
        | Error::SizeMismatch { .. }
        | Error::CapacityTooSmall { .. }
        | Error::MixedDevices { .. }
        | Error::ReadOnlyBuffer { .. }
        | Error::InvalidFile(_)
        | Error::ReadOnlyFile { .. }
        | Error::PastEndOfFile { .. }
        | Error::UnalignedDirectIo { .. }
        | Error::InvalidSetting { .. } => "invalid_request",
        Error::Backend { source, .. } if source.downcast_ref::<std::io::Error>().is_some() => "io",
        Error::Backend { .. } => "backend",
        Error::TransferFailed { source } => cause_reason(source),
        Error::PolledAfterCompletion | Error::Cancelled | Error::TimedOut(_) => "other",
    }
}

/// The `reason` label of a transfer's [`TransferState::Failed`] cause.
fn cause_reason(cause: &SharedCause) -> &'static str {
    if let Some(error) = cause.downcast_ref::<Error>() {
        reason(error)
    } else if cause.downcast_ref::<std::io::Error>().is_some() {
        "io"
    } else {
        "transfer"
    }
}

/// A transfer posted whose end was not seen yet.
#[derive(Clone, Copy)]
struct Started {
    /// [`clock`] ticks.
    at: u64,
    direction: usize,
    bytes: u64,
}

/// Shards of the map of [`Started`] transfers, so that threads posting at
/// once rarely meet on one lock.
const SHARDS: usize = 8;

type PendingShard = Mutex<HashMap<TransferId, Started, foldhash::fast::RandomState>>;

/// The transfers posted whose end was not seen yet: an entry lives from the
/// post to the poll that sees the end, or to the release, whichever comes
/// first, so the map holds no more than the transfers the connector holds.
struct Pending {
    shards: [PendingShard; SHARDS],
    /// Entries in all shards: zero for a backend whose transfers end inside
    /// `post` (loopback), whose releases then take no lock.
    len: AtomicUsize,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::default())),
            len: AtomicUsize::new(0),
        }
    }

    fn shard(
        &self,
        id: TransferId,
    ) -> MutexGuard<'_, HashMap<TransferId, Started, foldhash::fast::RandomState>> {
        // Fibonacci hashing: the top bits of the product, whatever the
        // backend's ids look like (sequential, or aligned pointers).
        let index = (id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 61) as usize % SHARDS;
        lock(&self.shards[index])
    }

    fn insert(&self, id: TransferId, started: Started) {
        if self.shard(id).insert(id, started).is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn take(&self, id: TransferId) -> Option<Started> {
        // An entry is inserted before `post` hands its id out, so whoever
        // polls or releases that id sees the count that includes it.
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let taken = self.shard(id).remove(&id);
        if taken.is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        taken
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The entries themselves, counted shard by shard.
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A registration: what it is of, and its bytes (memory only).
#[derive(Clone, Copy)]
struct Registered {
    kind: usize,
    bytes: u64,
}

/// A backend whose calls are counted in a [`Metrics`]: see the
/// [module docs](self) for what is counted and how it is named.
///
/// It forwards every method, the defaulted ones too, so the backend behaves
/// exactly as unwrapped. It never holds a lock of its own while it calls the
/// backend, and holds none that the backend's calls or hooks could reach.
pub struct Metered<B: RegistrationBackend> {
    inner: B,
    metrics: Metrics,
    series: Series,
    pending: Pending,
    clock: &'static Clock,
    regions: Mutex<HashMap<RegionId, Registered, foldhash::fast::RandomState>>,
    /// Names of the peers loaded now (not a label: only to count each once).
    peers: Mutex<HashSet<String, foldhash::fast::RandomState>>,
}

impl<B: RegistrationBackend> std::fmt::Debug for Metered<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metered")
            .field("backend", &self.inner.backend_name())
            .field("agent", &self.inner.agent_name())
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl<B: RegistrationBackend> Metered<B> {
    /// Wraps `inner`, counting into `metrics` under `inner`'s
    /// [backend name](RegistrationBackend::backend_name). Its series
    /// appear at once, at zero.
    pub fn new(inner: B, metrics: &Metrics) -> Metered<B> {
        let series = Series::new(&metrics.families, inner.backend_name());
        Metered {
            inner,
            metrics: metrics.clone(),
            series,
            pending: Pending::new(),
            clock: clock(),
            regions: Mutex::new(HashMap::default()),
            peers: Mutex::new(HashSet::default()),
        }
    }

    /// The metrics this backend counts into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Nanoseconds since `ticks` (of [`clock`]).
    #[inline]
    fn since(&self, ticks: u64) -> u64 {
        self.clock.delta_as_nanos(ticks, self.clock.raw())
    }

    #[cold]
    fn failed(&self, directed: &Directed, reason: &'static str) {
        self.metrics
            .families
            .failed
            .get_or_create(&[
                ("backend", self.series.backend),
                ("op", directed.op),
                ("target", directed.target),
                ("reason", reason),
            ])
            .inc();
    }

    /// Records the end of a transfer whose end was not seen yet, once.
    fn ended(&self, transfer: TransferId, state: &TransferState) {
        let Some(started) = self.pending.take(transfer) else {
            return;
        };
        let directed = &self.series.directed[started.direction];
        directed.in_flight.dec();
        match state {
            TransferState::Done => {
                let took = self.since(started.at);
                let counting = self.series.ledger.counting(Shard::current());
                counting.completed(started.direction, started.bytes, took);
            }
            TransferState::Failed(cause) => self.failed(directed, cause_reason(cause)),
            TransferState::InProgress => {}
        }
    }

    fn registered(&self, region: RegionId, kind: usize, bytes: u64) {
        lock(&self.regions).insert(region, Registered { kind, bytes });
        let kind = &self.series.kinds[kind];
        kind.registrations.inc();
        kind.regions.inc();
        self.series.registered_bytes.inc_by(gauge_value(bytes));
    }
}

fn gauge_value(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl<B: RegistrationBackend> RegistrationBackend for Metered<B> {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    fn agent_name(&self) -> &str {
        self.inner.agent_name()
    }

    unsafe fn register(&self, region: &Segment, writable: bool) -> Result<RegionId> {
        // SAFETY: our caller's contract is the inner backend's.
        let registered = unsafe { self.inner.register(region, writable) };
        match &registered {
            Ok(id) => self.registered(*id, MEMORY, region.len as u64),
            Err(_) => {
                self.series.kinds[MEMORY].failures.inc();
            }
        }
        registered
    }

    fn deregister(&self, region: RegionId) -> Result<()> {
        let deregistered = self.inner.deregister(region);
        // A refused deregistration leaves the region registered.
        if deregistered.is_ok() {
            let gone = lock(&self.regions).remove(&region);
            if let Some(gone) = gone {
                let kind = &self.series.kinds[gone.kind];
                kind.deregistrations.inc();
                kind.regions.dec();
                self.series.registered_bytes.dec_by(gauge_value(gone.bytes));
            }
        }
        deregistered
    }

    unsafe fn register_file(&self, fd: BorrowedFd<'_>, writable: bool) -> Result<RegionId> {
        // SAFETY: our caller's contract is the inner backend's.
        let registered = unsafe { self.inner.register_file(fd, writable) };
        match &registered {
            Ok(id) => self.registered(*id, FILE, 0),
            Err(_) => {
                self.series.kinds[FILE].failures.inc();
            }
        }
        registered
    }

    unsafe fn expose(
        &self,
        ranges: &[Exposed],
        access: OperationKind,
        key: &[u8],
    ) -> Result<Exposure> {
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.expose(ranges, access, key) }.inspect(|_| {
            let counting = self.series.ledger.counting(Shard::current());
            counting.exposed(access == OperationKind::Write);
        })
    }

    fn revoke(&self, exposure: ExposureId) -> Result<()> {
        let revoked = self.inner.revoke(exposure);
        if revoked.is_ok() {
            self.series.ledger.counting(Shard::current()).revoked();
        }
        revoked
    }

    fn revocation_enforced(&self) -> bool {
        self.inner.revocation_enforced()
    }

    fn access_enforced(&self) -> bool {
        self.inner.access_enforced()
    }

    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        let loaded = self.inner.load_remote(agent_metadata);
        if let Ok(peer) = &loaded {
            self.series.peer_loads.inc();
            let new = lock(&self.peers).insert(peer.clone());
            if new {
                self.series.peers_loaded.inc();
            }
        }
        loaded
    }

    fn unload_remote(&self, peer: &str) -> Result<()> {
        let unloaded = self.inner.unload_remote(peer);
        if unloaded.is_ok() {
            self.series.peer_unloads.inc();
            let was = lock(&self.peers).remove(peer);
            if was {
                self.series.peers_loaded.dec();
            }
        }
        unloaded
    }

    fn peer_name(&self, agent_metadata: &[u8]) -> Option<String> {
        self.inner.peer_name(agent_metadata)
    }

    unsafe fn post(&self, request: &TransferRequest<'_>) -> Result<Posted> {
        let index = direction(request.op, &request.target);
        let directed = &self.series.directed[index];
        let bytes = request.bytes() as u64;
        let counting = self.series.ledger.counting(Shard::current());
        counting.posted(index, bytes, request.local.len() as u64);
        let at = self.clock.raw();
        // SAFETY: our caller's contract is the inner backend's; `release`
        // forwards to the inner backend for the same transfer.
        let posted = unsafe { self.inner.post(request) };
        match &posted {
            Ok(Posted {
                state: TransferState::Done,
                ..
            }) => counting.completed(index, bytes, self.since(at)),
            Ok(Posted {
                state: TransferState::Failed(cause),
                ..
            }) => self.failed(directed, cause_reason(cause)),
            Ok(Posted {
                id,
                state: TransferState::InProgress,
            }) => {
                // Before `post` returns, so no poll of `id` can come first.
                self.pending.insert(
                    *id,
                    Started {
                        at,
                        direction: index,
                        bytes,
                    },
                );
                directed.in_flight.inc();
            }
            Err(error) => self.failed(directed, reason(error)),
        }
        posted
    }

    fn poll(&self, transfer: TransferId) -> TransferState {
        let state = self.inner.poll(transfer);
        if !state.is_in_progress() {
            self.ended(transfer, &state);
        }
        state
    }

    fn release(&self, transfer: TransferId) -> Result<Release> {
        // Whatever the backend answers, the connector is done looking at
        // this transfer's end: forget it, so that abandoned transfers leave
        // nothing behind. (Before the call, so that the backend's answer
        // goes straight to our caller: a copy of it costs more than the
        // counting, on loopback.)
        if let Some(started) = self.pending.take(transfer) {
            let directed = &self.series.directed[started.direction];
            directed.in_flight.dec();
            directed.abandoned.inc();
        }
        self.inner.release(transfer)
    }

    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()> {
        let counting = self.series.ledger.counting(Shard::current());
        self.inner.drain_notifications(&mut |notification| {
            counting.notified();
            sink(notification);
        })
    }

    fn wait_assist(&self) -> Duration {
        self.inner.wait_assist()
    }

    fn awaiting_end(&self, transfer: TransferId) {
        self.inner.awaiting_end(transfer);
    }

    fn warm_up(&self, peer: &str) -> Result<()> {
        self.inner.warm_up(peer)
    }

    fn set_event_hook(&self, hook: EventHook) -> bool {
        self.inner.set_event_hook(hook)
    }
}

#[cfg(test)]
mod tests;
