//! The backend conformance suite (feature `conformance`): the behaviours every
//! [`RegistrationBackend`] must show, checked on each one.
//!
//! Each check is a `pub fn` that takes a [`Harness`] (which makes backend
//! agents able to reach each other) and panics, like a test, when the backend
//! misbehaves. The suite builds the connectors itself, over [`Faulty`] so that
//! it can delay transfers on any backend, and over [`Hooked`] where it must
//! act inside a backend call. Where backends may legitimately differ, the
//! suite asks the backend's declared capabilities (today:
//! [`RegistrationBackend::revocation_enforced`]), never its name.
//!
//! A backend crate runs every check, with its standard cases, from one
//! invocation of [`conformance_suite!`](crate::conformance_suite) in its
//! tests; the checks are listed once, in this file, and [`CHECKS`] names
//! them:
//!
//! ```ignore
//! descriptor_core::conformance_suite! {
//!     harnesses: { agent => MyHarness::new() },
//!     skip_unless: my_runtime_available(),
//!     params: descriptor_core::conformance::Params::default(),
//! }
//! ```
//!
//! Every check compares bytes, not only statuses.
//!
//! The checks live in rooms, one concern each, under `conformance/`:
//! `transfers` (bytes move exactly), `pairing` (what the two sides of a
//! transfer must agree on, and what forged metadata cannot change),
//! `completion` (how each side learns that an operation ended),
//! `cancellation` (operations cancelled, dropped, stalled or failed in
//! flight), `concurrency` (many operations on one peer), `peers` (peers that
//! vanish, and the peer cache), `deadlocks` (no lock held across a backend,
//! hook or waker call), `panics` (panicking backends and wakers, and the
//! wakers an operation keeps), `views` (registered memory moved in parts) and
//! `empty` (zero-byte descriptors). [`Hooked`], the wrapper that lets a check
//! act inside a backend call, is in `hooked`. This file holds what they
//! share: the [`Harness`], the test bytes and their assertions, the one list
//! of checks and the macros made from it.
//!
//! This module is for testing backends: it is not a stable API, and its checks
//! and helpers change as the specification grows, in any release.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

mod cancellation;
mod completion;
mod concurrency;
mod deadlocks;
mod empty;
mod files;
mod hooked;
mod pairing;
mod panics;
mod peers;
mod transfers;
mod views;
pub use cancellation::*;
pub use completion::*;
pub use concurrency::*;
pub use deadlocks::*;
pub use empty::*;
pub use files::*;
pub use hooked::*;
pub use pairing::*;
pub use panics::*;
pub use peers::*;
pub use transfers::*;
pub use views::*;

use crate::faults::{Faults, Faulty, Stall};
use crate::{
    Connector, Descriptor, OperationKind, RdmaMetadata, ReadOperation, ReadableOperation,
    RegistrationBackend, SerializedDescriptor,
};

/// Makes backend agents for the suite.
pub trait Harness: Sync {
    /// A new agent named `name` that can reach every other agent this harness
    /// made. Names are unique within one harness.
    fn backend(&self, name: &str) -> Box<dyn RegistrationBackend>;
}

/// A connector over the harness's agent `name`.
fn connector(h: &dyn Harness, name: &str) -> Connector {
    faulty(h, name).0
}

/// A connector over the harness's agent `name`, and the handle that arms
/// faults on it.
fn faulty(h: &dyn Harness, name: &str) -> (Connector, Faults) {
    let backend = Faulty::new(h.backend(name));
    let faults = backend.faults();
    (Connector::new(backend), faults)
}

/// Deterministic test bytes: a xorshift64 stream seeded by `seed`, eight bytes
/// a step (little-endian).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes()[..(len - out.len()).min(8)]);
    }
    out
}

/// One descriptor of `len` pattern bytes (seed `seed`).
pub fn filled(seed: u64, len: usize) -> Vec<Descriptor> {
    descriptors(seed, &[len])
}

/// One descriptor of `len` zero bytes.
pub fn zeroed_one(len: usize) -> Vec<Descriptor> {
    zeroed(&[len])
}

/// Metadata like `meta` but with other descriptors or kind: what a hostile peer sends.
pub fn forge(
    meta: &RdmaMetadata,
    kind: OperationKind,
    descriptors: Vec<SerializedDescriptor>,
) -> RdmaMetadata {
    RdmaMetadata::new(
        kind,
        descriptors,
        meta.agent_metadata().to_vec(),
        meta.notification_key().to_owned(),
    )
    .unwrap()
}

/// `meta` (its regions and agent) carrying `victim`'s notification key: what a
/// hostile peer sends to complete an operation it never touched.
pub fn rekeyed(meta: &RdmaMetadata, victim: &RdmaMetadata) -> RdmaMetadata {
    RdmaMetadata::new(
        meta.operation_kind(),
        meta.descriptors().to_vec(),
        meta.agent_metadata().to_vec(),
        victim.notification_key().to_owned(),
    )
    .unwrap()
}

/// `meta` carrying the agent blob `blob` instead of its own: what a peer
/// that forged or changed a blob sends.
pub fn reblobbed(meta: &RdmaMetadata, blob: Vec<u8>) -> RdmaMetadata {
    RdmaMetadata::new(
        meta.operation_kind(),
        meta.descriptors().to_vec(),
        blob,
        meta.notification_key().to_owned(),
    )
    .unwrap()
}

/// `meta`'s first descriptor moved by `by` bytes and resized to `size`.
pub fn shifted(meta: &RdmaMetadata, by: u64, size: u64) -> Vec<SerializedDescriptor> {
    let d = meta.descriptors()[0];
    vec![SerializedDescriptor {
        ptr: d.ptr + by,
        size,
        ..d
    }]
}

fn descriptors(seed: u64, sizes: &[usize]) -> Vec<Descriptor> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| Descriptor::new(pattern(seed + i as u64, len)).unwrap())
        .collect()
}

fn zeroed(sizes: &[usize]) -> Vec<Descriptor> {
    sizes
        .iter()
        .map(|&len| Descriptor::new(vec![0u8; len]).unwrap())
        .collect()
}

fn assert_pattern(descs: &[Descriptor], seed: u64, what: &str) {
    for (i, d) in descs.iter().enumerate() {
        let expected = pattern(seed + i as u64, d.size());
        let actual = d.as_slice().unwrap();
        if actual != expected.as_slice() {
            let first = actual.iter().zip(&expected).position(|(a, b)| a != b);
            panic!(
                "{what}: descriptor {i} differs from the expected bytes, first at byte {first:?}"
            );
        }
    }
}

fn assert_zeroed(descs: &[Descriptor], what: &str) {
    for (i, d) in descs.iter().enumerate() {
        assert!(
            d.as_slice().unwrap().iter().all(|&b| b == 0),
            "{what}: descriptor {i} was written"
        );
    }
}

const WAIT: Duration = Duration::from_secs(30);

/// The descriptors of an ended operation, once the backend lets go of them (a
/// backend that cannot abort lets a cancelled transfer finish first); fails the
/// test after [`WAIT`].
macro_rules! returned {
    ($op:expr, $what:expr) => {{
        let mut op = $op;
        let deadline = std::time::Instant::now() + $crate::conformance::WAIT;
        loop {
            match op.into_descriptors() {
                Ok(descriptors) => break descriptors,
                Err(again) if std::time::Instant::now() < deadline => {
                    op = again;
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
                Err(again) => panic!("{} never released its buffers: {again:?}", $what),
            }
        }
    }};
}

pub(crate) use returned;

/// A READ whose transfer is held before it reaches the backend, as
/// [`stalled_read`] begins it. (Fields drop in order: the readable before
/// the client, as the checks' locals did.)
struct StalledRead {
    /// The peer's readable that the READ targets.
    readable: ReadableOperation,
    /// The READ, into zeroed memory: `InProgress` while `stall` holds it.
    read: ReadOperation,
    /// Holds the READ's transfer; releasing or dropping it lets it go on.
    stall: Stall,
    /// The connector that began the READ: kept, so that its engine runs
    /// until the check ends, after the READ is dropped.
    client: Connector,
}

/// `client` (with `faults`, the handle that arms faults on it, as [`faulty`]
/// and the hooked agents give them) begins a READ of `len` pattern bytes
/// (seed `seed`) that a new agent `server` exposes, the READ's transfer
/// stalled before it reaches the backend.
fn stalled_read(
    h: &dyn Harness,
    server: &str,
    (client, faults): (Connector, Faults),
    seed: u64,
    len: usize,
) -> StalledRead {
    let server = connector(h, server);
    let readable = server.create_readable(descriptors(seed, &[len])).unwrap();
    let stall = faults.stall_next_transfer();
    let read = client
        .begin_read(readable.metadata(), zeroed(&[len]))
        .unwrap();
    StalledRead {
        readable,
        read,
        stall,
        client,
    }
}

// ---------------------------------------------------------------------------
// The suite: every check of the rooms, listed once.

/// The scale of the checks whose size a backend chooses (how hard its tests
/// may push the machine). [`Params::default`] is the loopback backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Threads of [`concurrent_operations_share_one_peer`].
    pub concurrent_threads: usize,
    /// Operations in flight per thread there.
    pub concurrent_per_thread: usize,
    /// Threads of [`load`].
    pub load_threads: usize,
    /// Operations per thread there.
    pub load_per_thread: usize,
    /// Rounds of [`cancel_and_drop_race_completion`].
    pub race_rounds: usize,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            concurrent_threads: 16,
            concurrent_per_thread: 200,
            load_threads: 16,
            load_per_thread: 1000,
            race_rounds: 2000,
        }
    }
}

/// The one list of conformance checks, handed to `$callback!` after `$args`
/// as `checks: { CHECK { CASE: |h, p| CALL; ... } ... }`: each check (a
/// `pub fn` of [`conformance`](crate::conformance) taking the harness first),
/// then its standard cases, each a name and the call, given the harness `h`
/// and the backend's [`Params`] `p`. [`CHECKS`] and
/// [`conformance_suite!`](crate::conformance_suite) are made from it, and a
/// unit test checks that it names every check of the module.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_checks {
    ($callback:path { $($args:tt)* }) => {
        $callback! {
            $($args)*
            checks: {
                registration_is_idempotent_per_connector {
                    holds: |h, p| $crate::conformance::registration_is_idempotent_per_connector(h);
                }
                readable_then_read_moves_bytes {
                    one_small_block: |h, p| $crate::conformance::readable_then_read_moves_bytes(h, &[64]);
                    one_large_block: |h, p| $crate::conformance::readable_then_read_moves_bytes(h, &[8 << 20]);
                    many_blocks: |h, p| $crate::conformance::readable_then_read_moves_bytes(h, &[65536; 64]);
                    uneven_blocks: |h, p| $crate::conformance::readable_then_read_moves_bytes(h, &[1, 4095, 65536, 3]);
                }
                writable_then_write_moves_bytes {
                    one_small_block: |h, p| $crate::conformance::writable_then_write_moves_bytes(h, &[64]);
                    one_large_block: |h, p| $crate::conformance::writable_then_write_moves_bytes(h, &[8 << 20]);
                    many_blocks: |h, p| $crate::conformance::writable_then_write_moves_bytes(h, &[65536; 64]);
                    uneven_blocks: |h, p| $crate::conformance::writable_then_write_moves_bytes(h, &[1, 4095, 65536, 3]);
                }
                read_only_memory_never_changes_whatever_a_peer_writes {
                    holds: |h, p| $crate::conformance::read_only_memory_never_changes_whatever_a_peer_writes(h);
                }
                pairing_errors_name_the_problem {
                    holds: |h, p| $crate::conformance::pairing_errors_name_the_problem(h);
                }
                cancel_before_completion {
                    holds: |h, p| $crate::conformance::cancel_before_completion(h);
                }
                a_cancelled_transfer_keeps_its_memory_until_it_drained {
                    holds: |h, p| $crate::conformance::a_cancelled_transfer_keeps_its_memory_until_it_drained(h);
                }
                injected_failure_errors_the_operation_and_moves_nothing {
                    holds: |h, p| $crate::conformance::injected_failure_errors_the_operation_and_moves_nothing(h);
                }
                stalled_transfer_is_in_progress_then_complete {
                    holds: |h, p| $crate::conformance::stalled_transfer_is_in_progress_then_complete(h);
                }
                dropped_notification_leaves_the_passive_side_waiting {
                    holds: |h, p| $crate::conformance::dropped_notification_leaves_the_passive_side_waiting(h);
                }
                vanished_peer_completes_nothing {
                    holds: |h, p| $crate::conformance::vanished_peer_completes_nothing(h);
                }
                cancel_after_completion_is_a_no_op {
                    holds: |h, p| $crate::conformance::cancel_after_completion_is_a_no_op(h);
                }
                wait_timeout_expires_when_the_peer_never_acts {
                    holds: |h, p| $crate::conformance::wait_timeout_expires_when_the_peer_never_acts(h);
                }
                dropping_an_in_flight_operation {
                    holds: |h, p| $crate::conformance::dropping_an_in_flight_operation(h);
                }
                concurrent_operations_share_one_peer {
                    holds: |h, p| $crate::conformance::concurrent_operations_share_one_peer(h, p.concurrent_threads, p.concurrent_per_thread);
                }
                metadata_round_trips_through_json {
                    holds: |h, p| $crate::conformance::metadata_round_trips_through_json(h);
                }
                operations_are_futures {
                    holds: |h, p| $crate::conformance::operations_are_futures(h);
                }
                passive_side_learns_of_completion_however_it_waits {
                    holds: |h, p| $crate::conformance::passive_side_learns_of_completion_however_it_waits(h);
                }
                an_operation_nobody_follows_still_completes {
                    holds: |h, p| $crate::conformance::an_operation_nobody_follows_still_completes(h);
                }
                load {
                    mixed_operations: |h, p| $crate::conformance::load(h, p.load_threads, p.load_per_thread);
                }
                cancel_and_drop_race_completion {
                    holds: |h, p| $crate::conformance::cancel_and_drop_race_completion(h, p.race_rounds);
                }
                reading_its_own_readable_with_a_delayed_transfer_completes {
                    holds: |h, p| $crate::conformance::reading_its_own_readable_with_a_delayed_transfer_completes(h);
                }
                crossed_delayed_reads_complete {
                    holds: |h, p| $crate::conformance::crossed_delayed_reads_complete(h);
                }
                a_waker_that_drops_its_operation_deadlocks_nobody {
                    holds: |h, p| $crate::conformance::a_waker_that_drops_its_operation_deadlocks_nobody(h);
                }
                status_never_blocks_behind_poll_release_or_revoke {
                    holds: |h, p| $crate::conformance::status_never_blocks_behind_poll_release_or_revoke(h);
                }
                a_panic_in_release_does_not_free_in_flight_memory {
                    holds: |h, p| $crate::conformance::a_panic_in_release_does_not_free_in_flight_memory(h);
                }
                a_dropped_future_takes_its_panicking_waker_with_it {
                    holds: |h, p| $crate::conformance::a_dropped_future_takes_its_panicking_waker_with_it(h);
                }
                a_panicking_waker_of_a_live_future_frees_no_draining_memory {
                    holds: |h, p| $crate::conformance::a_panicking_waker_of_a_live_future_frees_no_draining_memory(h);
                }
                a_panicking_waker_does_not_stop_the_engine {
                    holds: |h, p| $crate::conformance::a_panicking_waker_does_not_stop_the_engine(h);
                }
                repolling_with_new_wakers_keeps_a_bounded_number {
                    holds: |h, p| $crate::conformance::repolling_with_new_wakers_keeps_a_bounded_number(h);
                }
                one_future_repolled_keeps_only_its_latest_waker {
                    holds: |h, p| $crate::conformance::one_future_repolled_keeps_only_its_latest_waker(h);
                }
                a_refused_agent_blob_keeps_every_idle_peer {
                    holds: |h, p| $crate::conformance::a_refused_agent_blob_keeps_every_idle_peer(h);
                }
                a_transfer_into_a_view_leaves_its_neighbours_untouched {
                    holds: |h, p| $crate::conformance::a_transfer_into_a_view_leaves_its_neighbours_untouched(h);
                }
                partial_lengths_move_only_the_prefix {
                    holds: |h, p| $crate::conformance::partial_lengths_move_only_the_prefix(h);
                }
                a_fitted_read_reports_the_length_that_arrived {
                    holds: |h, p| $crate::conformance::a_fitted_read_reports_the_length_that_arrived(h);
                }
                pairing_checks_transfer_lengths {
                    holds: |h, p| $crate::conformance::pairing_checks_transfer_lengths(h);
                }
                views_come_back_and_move_again_without_registering {
                    holds: |h, p| $crate::conformance::views_come_back_and_move_again_without_registering(h);
                }
                deregistration_after_the_last_view {
                    holds: |h, p| $crate::conformance::deregistration_after_the_last_view(h);
                }
                a_dropped_pool_with_views_in_flight {
                    holds: |h, p| $crate::conformance::a_dropped_pool_with_views_in_flight(h);
                }
                merged_runs_move_the_bytes_of_their_descriptors {
                    holds: |h, p| $crate::conformance::merged_runs_move_the_bytes_of_their_descriptors(h);
                }
                pool_to_pool_after_the_peer_is_unloaded_and_reloaded {
                    holds: |h, p| $crate::conformance::pool_to_pool_after_the_peer_is_unloaded_and_reloaded(h);
                }
                empty_descriptors_move_like_any_other {
                    holds: |h, p| $crate::conformance::empty_descriptors_move_like_any_other(h);
                }
                file_write_then_read_moves_bytes {
                    one_block: |h, p| $crate::conformance::file_write_then_read_moves_bytes(h, &[4096], false);
                    contiguous_blocks: |h, p| $crate::conformance::file_write_then_read_moves_bytes(h, &[65536; 64], false);
                    scattered_blocks: |h, p| $crate::conformance::file_write_then_read_moves_bytes(h, &[4096; 256], true);
                    uneven_blocks: |h, p| $crate::conformance::file_write_then_read_moves_bytes(h, &[1, 4095, 1 << 20, 3], false);
                }
                file_pairing_errors_name_the_problem {
                    holds: |h, p| $crate::conformance::file_pairing_errors_name_the_problem(h);
                }
                a_file_is_registered_once_and_closed_after_its_last_segment {
                    holds: |h, p| $crate::conformance::a_file_is_registered_once_and_closed_after_its_last_segment(h);
                }
                a_failed_or_cancelled_file_transfer_keeps_memory_and_file_until_let_go {
                    holds: |h, p| $crate::conformance::a_failed_or_cancelled_file_transfer_keeps_memory_and_file_until_let_go(h);
                }
                a_file_truncated_under_a_read_fails_it {
                    holds: |h, p| $crate::conformance::a_file_truncated_under_a_read_fails_it(h);
                }
                direct_io_is_aligned_or_refused {
                    holds: |h, p| $crate::conformance::direct_io_is_aligned_or_refused(h);
                }
                a_full_file_system_fails_the_write {
                    holds: |h, p| $crate::conformance::a_full_file_system_fails_the_write(h);
                }
            }
        }
    };
}

/// Makes [`CHECKS`] from the list.
macro_rules! check_names {
    (checks: { $( $check:ident { $( $case:ident : |$h:ident, $p:ident| $call:expr ; )+ } )* }) => {
        /// The name of every conformance check, in the suite's order: what
        /// [`conformance_suite!`](crate::conformance_suite) runs (each with
        /// its standard cases).
        pub const CHECKS: &[&str] = &[$(stringify!($check)),*];
    };
}
crate::__conformance_checks!(check_names {});

/// Instantiates every conformance check, with its standard cases, as a
/// `#[test]` for one backend: a check added to
/// [`conformance`](crate::conformance) runs on every backend that invokes
/// this, and none can be left out.
///
/// `harnesses` names one or more [`Harness`](crate::conformance::Harness)
/// expressions (each evaluated anew in each test); each gets a module of that
/// name, holding a module per check and a test per case, e.g.
/// `agent::load::mixed_operations`. `skip_unless` (default `true`) is
/// evaluated first in each test, which returns at once when it is false (a
/// transport whose runtime is missing). `params` (default
/// [`Params::default()`](crate::conformance::Params)) scales the checks that
/// take a size.
///
/// ```ignore
/// descriptor_core::conformance_suite! {
///     harnesses: {
///         agent => Nixl::new(MetadataScope::Agent),
///         exposed => Nixl::new(MetadataScope::Exposed),
///     },
///     skip_unless: runtime_available(),
///     params: Params { load_threads: 4, ..Params::default() },
/// }
/// ```
///
/// The expressions are resolved in the invoking module (the generated modules
/// import `super::*`).
#[macro_export]
macro_rules! conformance_suite {
    (@each [$skip:expr] [$params:expr] $( $name:ident => $harness:expr ),+) => {
        $(
            #[allow(unused_imports)]
            mod $name {
                use super::*;
                $crate::__conformance_checks!($crate::__conformance_tests {
                    harness: $harness,
                    skip_unless: $skip,
                    params: $params,
                });
            }
        )+
    };
    (
        harnesses: { $( $name:ident => $harness:expr ),+ $(,)? }
        $(, skip_unless: $skip:expr )?
        $(, params: $params:expr )?
        $(,)?
    ) => {
        $crate::conformance_suite! {
            @each
            [$crate::__conformance_or!($($skip)? ; true)]
            [$crate::__conformance_or!($($params)? ; $crate::conformance::Params::default())]
            $( $name => $harness ),+
        }
    };
}

/// `$given`, or `$default` when none was given.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_or {
    ($given:expr ; $default:expr) => {
        $given
    };
    (; $default:expr) => {
        $default
    };
}

/// The tests of one harness: a module per check, a test per case.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    (
        harness: $harness:expr,
        skip_unless: $skip:expr,
        params: $params:expr,
        checks: { $( $check:ident { $( $case:ident : |$h:ident, $p:ident| $call:expr ; )+ } )* }
    ) => {
        $(
            #[allow(unused_imports)]
            mod $check {
                use super::*;
                $(
                    #[test]
                    fn $case() {
                        if !$skip {
                            return;
                        }
                        let harness = $harness;
                        let $h: &dyn $crate::conformance::Harness = &harness;
                        #[allow(unused_variables)]
                        let $p: $crate::conformance::Params = $params;
                        $call;
                    }
                )+
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    /// Every room of the suite, by name, and its source.
    const ROOMS: &[(&str, &str)] = &[
        ("cancellation", include_str!("conformance/cancellation.rs")),
        ("completion", include_str!("conformance/completion.rs")),
        ("concurrency", include_str!("conformance/concurrency.rs")),
        ("deadlocks", include_str!("conformance/deadlocks.rs")),
        ("empty", include_str!("conformance/empty.rs")),
        ("files", include_str!("conformance/files.rs")),
        ("hooked", include_str!("conformance/hooked.rs")),
        ("pairing", include_str!("conformance/pairing.rs")),
        ("panics", include_str!("conformance/panics.rs")),
        ("peers", include_str!("conformance/peers.rs")),
        ("transfers", include_str!("conformance/transfers.rs")),
        ("views", include_str!("conformance/views.rs")),
    ];

    /// The checks of this file and its rooms: their `pub fn`s whose first
    /// parameter is the harness.
    fn checks_in_source() -> Vec<&'static str> {
        std::iter::once(include_str!("conformance.rs"))
            .chain(ROOMS.iter().map(|&(_, source)| source))
            .flat_map(|source| source.split("\npub fn ").skip(1))
            .filter_map(|rest| {
                let (name, after) = rest.split_once('(')?;
                after
                    .trim_start()
                    .starts_with("h: &dyn Harness")
                    .then_some(name.trim())
            })
            .collect()
    }

    #[test]
    fn the_completeness_check_reads_every_room() {
        let mut declared: Vec<&str> = include_str!("conformance.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        let mut read: Vec<&str> = ROOMS.iter().map(|&(name, _)| name).collect();
        declared.sort_unstable();
        read.sort_unstable();
        assert_eq!(
            declared, read,
            "ROOMS must list every `mod` of conformance.rs"
        );
    }

    #[test]
    fn the_suite_runs_every_check_of_every_room_once() {
        let mut listed = super::CHECKS.to_vec();
        let mut defined = checks_in_source();
        assert!(defined.len() >= 42, "the parser found {defined:?}");
        listed.sort_unstable();
        defined.sort_unstable();
        let mut unique = listed.clone();
        unique.dedup();
        assert_eq!(listed, unique, "a check is listed twice");
        assert_eq!(
            listed, defined,
            "__conformance_checks! must list every `pub fn (h: &dyn Harness, ..)` of conformance.rs and its rooms"
        );
    }
}
