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
//! This module is for testing backends: it is not a stable API, and its checks
//! and helpers change as the specification grows, in any release.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::{Future, IntoFuture};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

mod empty;
mod views;
pub use empty::*;
pub use views::*;

use crate::faults::{Faults, Faulty, Stall};
use crate::testing::{eventually, within};
use crate::{
    Connector, Descriptor, Device, Error, EventHook, Exposure, ExposureId, Notification,
    OperationFuture, OperationKind, OperationStatus, Posted, RdmaMetadata, ReadableOperation,
    RegionId, RegistrationBackend, Release, Result, SerializedDescriptor, Side, TransferId,
    TransferRequest, TransferState,
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
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match op.into_descriptors() {
                Ok(descriptors) => break descriptors,
                Err(again) if std::time::Instant::now() < deadline => {
                    op = again;
                    std::thread::sleep(Duration::from_micros(100));
                }
                Err(again) => panic!("{} never released its buffers: {again:?}", $what),
            }
        }
    }};
}

/// `register_memory` twice with one connector is a no-op; with another it fails.
pub fn registration_is_idempotent_per_connector(h: &dyn Harness) {
    let a = connector(h, "reg-a");
    let b = connector(h, "reg-b");
    let mut d = Descriptor::new(pattern(1, 4096)).unwrap();
    assert!(!d.is_registered());
    d.register_memory(&a).unwrap();
    d.register_memory(&a).unwrap();
    assert!(d.is_registered());
    match d.register_memory(&b) {
        Err(Error::RegisteredElsewhere {
            registered,
            requested,
        }) => assert_eq!(
            (registered.as_str(), requested.as_str()),
            (a.name(), b.name())
        ),
        other => panic!("registering with a second connector gave {other:?}"),
    }
    // A registered descriptor works in an operation of its own connector.
    let readable = a.create_readable(vec![d]).unwrap();
    let read = b.begin_read(readable.metadata(), zeroed(&[4096])).unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_pattern(&read.into_descriptors().unwrap(), 1, "read back");
    let d = readable.into_descriptors().unwrap().remove(0);
    assert!(d.is_registered(), "descriptors come back still registered");
    assert_eq!(d.into_vec::<u8>().unwrap(), pattern(1, 4096));
}

/// A readable exposes bytes; `begin_read` copies them exactly; both sides complete.
pub fn readable_then_read_moves_bytes(h: &dyn Harness, sizes: &[usize]) {
    let server = connector(h, "read-server");
    let client = connector(h, "read-client");
    let readable = server.create_readable(descriptors(10, sizes)).unwrap();
    assert_eq!(readable.status(), OperationStatus::Initialized);
    assert_eq!(readable.metadata().operation_kind(), OperationKind::Read);
    assert_eq!(readable.metadata().descriptors().len(), sizes.len());
    let read = client
        .begin_read(readable.metadata(), zeroed(sizes))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    assert_eq!(read.status(), OperationStatus::Complete);
    readable.wait_timeout(WAIT).unwrap();
    assert_eq!(readable.status(), OperationStatus::Complete);
    assert_pattern(&read.into_descriptors().unwrap(), 10, "read data");
    assert_pattern(
        &readable.into_descriptors().unwrap(),
        10,
        "source after read",
    );
    assert_eq!(client.remote_agent_count(), 0);
}

/// A writable exposes a buffer; `begin_write` fills it exactly; both sides complete.
pub fn writable_then_write_moves_bytes(h: &dyn Harness, sizes: &[usize]) {
    let server = connector(h, "write-server");
    let client = connector(h, "write-client");
    let writable = server.create_writable(zeroed(sizes)).unwrap();
    assert_eq!(writable.metadata().operation_kind(), OperationKind::Write);
    let write = client
        .begin_write(descriptors(20, sizes), writable.metadata())
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    assert_eq!(
        (write.status(), writable.status()),
        (OperationStatus::Complete, OperationStatus::Complete)
    );
    assert_pattern(&writable.into_descriptors().unwrap(), 20, "written data");
    assert_pattern(&write.into_descriptors().unwrap(), 20, "source after write");
    assert_eq!(client.remote_agent_count(), 0);
}

/// Memory the API calls read-only (a [`bytes::Bytes`] whose clones safe
/// code keeps reading) never changes, whatever a peer sends: an honest READ
/// of it gets its bytes, then WRITEs that the peer forges against it all
/// leave it as it was. Forged: the readable's metadata re-kinded to WRITE,
/// the same with each descriptor's range moved and cut inside it, and a
/// WRITE aimed at a `Bytes` this connector registered only as the source
/// of its own WRITE. A backend that enforces access refuses them; one that
/// does not (NIXL) may let them land, in the private copy the core
/// registered instead ([`RegistrationBackend::access_enforced`]).
pub fn read_only_memory_never_changes_whatever_a_peer_writes(h: &dyn Harness) {
    let server = connector(h, "ro-server");
    let client = connector(h, "ro-client");
    let sizes = [4096usize, 1, 65536];
    let originals: Vec<bytes::Bytes> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| bytes::Bytes::from(pattern(90 + i as u64, len)))
        .collect();
    let aliases = originals.clone();
    let unchanged = |what: &str| {
        for (i, alias) in aliases.iter().enumerate() {
            let expected = pattern(90 + i as u64, alias.len());
            let first = alias.iter().zip(&expected).position(|(a, b)| a != b);
            assert!(
                first.is_none(),
                "read-only bytes {i} changed after {what}, first at byte {first:?}"
            );
        }
    };
    let readable = server
        .create_readable(
            originals
                .into_iter()
                .map(|b| Descriptor::from_bytes(b).unwrap())
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let meta = readable.metadata().clone();
    let read = client.begin_read(&meta, zeroed(&sizes)).unwrap();
    read.wait_timeout(WAIT).unwrap();
    assert_pattern(
        &read.into_descriptors().unwrap(),
        90,
        "an honest READ of read-only bytes",
    );

    // A source of our own WRITE, registered and then kept registered.
    let writable = client.create_writable(zeroed(&[4096])).unwrap();
    let source = bytes::Bytes::from(pattern(99, 4096));
    let source_alias = source.clone();
    let write = server
        .begin_write(
            vec![Descriptor::from_bytes(source).unwrap()],
            writable.metadata(),
        )
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    let source = returned!(write, "the WRITE from read-only bytes");
    assert!(source[0].is_registered());
    let aimed_at_source = vec![SerializedDescriptor {
        ptr: source[0].ptr() as u64,
        size: 4096,
        ..meta.descriptors()[0]
    }];

    let mut forgeries = vec![
        (
            "the readable re-kinded to WRITE",
            meta.descriptors().to_vec(),
        ),
        (
            "a WRITE aimed at a WRITE's read-only source",
            aimed_at_source,
        ),
    ];
    for (i, d) in meta.descriptors().iter().enumerate() {
        if d.size > 2 {
            let mut moved = meta.descriptors().to_vec();
            moved[i] = SerializedDescriptor {
                ptr: d.ptr + 1,
                size: d.size - 2,
                ..*d
            };
            forgeries.push(("a re-kinded range moved inside the readable", moved));
        }
    }
    for (what, descriptors) in forgeries {
        let forged = forge(&meta, OperationKind::Write, descriptors);
        let lens: Vec<usize> = forged
            .descriptors()
            .iter()
            .map(|d| d.size as usize)
            .collect();
        let garbage: Vec<Descriptor> = lens
            .iter()
            .map(|&len| Descriptor::new(vec![0xEEu8; len]).unwrap())
            .collect();
        if let Ok(write) = client.begin_write(garbage, &forged) {
            let _ = write.wait_timeout(WAIT);
        }
        unchanged(what);
        assert!(
            source_alias
                .iter()
                .zip(pattern(99, 4096))
                .all(|(a, b)| *a == b),
            "a WRITE's read-only source changed after {what}"
        );
    }
    readable.cancel();
    drop(source);
}

/// Every pairing rule is checked before the backend is touched, and names what is wrong.
pub fn pairing_errors_name_the_problem(h: &dyn Harness) {
    let server = connector(h, "pair-server");
    let client = connector(h, "pair-client");
    let readable = server
        .create_readable(descriptors(30, &[4096, 8192]))
        .unwrap();
    let writable = server.create_writable(zeroed(&[4096])).unwrap();
    let meta = readable.metadata();

    let kind = client.begin_write(zeroed(&[4096]), meta).unwrap_err();
    assert!(
        matches!(
            kind,
            Error::OperationKindMismatch {
                expected: OperationKind::Write,
                found: OperationKind::Read
            }
        ),
        "{kind:?}"
    );
    let kind = client
        .begin_read(writable.metadata(), zeroed(&[4096]))
        .unwrap_err();
    assert!(
        matches!(
            kind,
            Error::OperationKindMismatch {
                expected: OperationKind::Read,
                ..
            }
        ),
        "{kind:?}"
    );

    let count = client.begin_read(meta, zeroed(&[4096])).unwrap_err();
    assert!(
        matches!(
            count,
            Error::DescriptorCountMismatch {
                local: 1,
                remote: 2
            }
        ),
        "{count:?}"
    );

    let size = client.begin_read(meta, zeroed(&[4096, 4096])).unwrap_err();
    assert!(
        matches!(
            size,
            Error::SizeMismatch {
                index: 1,
                local: 4096,
                remote: 8192
            }
        ),
        "{size:?}"
    );
    assert!(size.to_string().contains("descriptor 1"));

    let empty = client.begin_read(meta, Vec::new()).unwrap_err();
    assert!(
        matches!(empty, Error::EmptyDescriptorList { side: Side::Local }),
        "{empty:?}"
    );

    let read_only = client
        .begin_read(
            meta,
            vec![
                Descriptor::new(vec![0u8; 4096]).unwrap(),
                Descriptor::from_bytes(bytes::Bytes::from(vec![0u8; 8192])).unwrap(),
            ],
        )
        .unwrap_err();
    assert!(
        matches!(read_only, Error::ReadOnlyBuffer { index: 1 }),
        "{read_only:?}"
    );
    let read_only = server
        .create_writable(vec![
            Descriptor::from_bytes(bytes::Bytes::from_static(b"ro")).unwrap(),
        ])
        .unwrap_err();
    assert!(
        matches!(read_only, Error::ReadOnlyBuffer { index: 0 }),
        "{read_only:?}"
    );

    // Mixed local devices: the check fires before any memory is registered or read.
    let mut fake = vec![0u8; 8192];
    // SAFETY: `fake` outlives the descriptor, which is never transferred: the
    // pairing check rejects it first.
    let cuda = unsafe {
        Descriptor::from_raw_parts(fake.as_mut_ptr(), 8192, Device::cuda(0), None).unwrap()
    };
    let mixed = client
        .begin_read(meta, vec![Descriptor::new(vec![0u8; 4096]).unwrap(), cuda])
        .unwrap_err();
    assert!(
        matches!(
            mixed,
            Error::MixedDevices {
                side: Side::Local,
                index: 1,
                ..
            }
        ),
        "{mixed:?}"
    );
    drop(fake);

    let mut remote = meta.descriptors().to_vec();
    remote[1].device = Device::cuda(0);
    let forged = RdmaMetadata::new(
        OperationKind::Read,
        remote,
        meta.agent_metadata().to_vec(),
        meta.notification_key().to_owned(),
    )
    .unwrap();
    let mixed = client
        .begin_read(&forged, zeroed(&[4096, 8192]))
        .unwrap_err();
    assert!(
        matches!(
            mixed,
            Error::MixedDevices {
                side: Side::Remote,
                index: 1,
                ..
            }
        ),
        "{mixed:?}"
    );

    // Nothing was loaded, and the readable still serves a correct read.
    assert_eq!(client.remote_agent_count(), 0);
    let read = client.begin_read(meta, zeroed(&[4096, 8192])).unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_pattern(&read.into_descriptors().unwrap(), 30, "read after errors");
}

/// Cancelling an in-flight transfer ends it `Cancelled`, moves no byte, and the
/// passive side never completes.
pub fn cancel_before_completion(h: &dyn Harness) {
    let server = connector(h, "cancel-server");
    let (client, faults) = faulty(h, "cancel-client");
    let writable = server.create_writable(zeroed(&[65536])).unwrap();
    let stall = faults.stall_next_transfer();
    let write = client
        .begin_write(descriptors(40, &[65536]), writable.metadata())
        .unwrap();
    write.cancel();
    let result = write.wait_timeout(WAIT);
    assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    assert_eq!(write.status(), OperationStatus::Cancelled);
    // Let go of the stall: the cancelled transfer still never runs.
    stall.release();
    let passive = writable.wait_timeout(Duration::from_millis(300));
    assert!(matches!(passive, Err(Error::TimedOut(_))), "{passive:?}");
    writable.cancel();
    // Cancelled unfinished, a writable's buffers come back only where the
    // backend enforces revocation (elsewhere they are leaked by design).
    if server.revocation_enforced() {
        assert_zeroed(
            &writable.into_descriptors().unwrap(),
            "cancelled write target",
        );
    }
    let source = returned!(write, "the cancelled write");
    assert_pattern(&source, 40, "source after cancel");
    assert_eq!(client.remote_agent_count(), 0);
}

/// A cancelled transfer that the backend cannot abort (injected: posted
/// when its hold ends although it was cancelled, as NIXL's keep running)
/// keeps its memory until it has drained: `wait_released` waits for that,
/// and then the memory comes back holding the bytes the drain wrote, with
/// nothing landing any more.
pub fn a_cancelled_transfer_keeps_its_memory_until_it_drained(h: &dyn Harness) {
    let server = connector(h, "drain-server");
    let (client, faults) = faulty(h, "drain-client");
    let readable = server.create_readable(descriptors(70, &[65536])).unwrap();
    faults.drain_next_transfer(Duration::from_millis(200));
    let read = client
        .begin_read(readable.metadata(), zeroed(&[65536]))
        .unwrap();
    assert!(
        !read.wait_released(Duration::ZERO),
        "in flight: not released"
    );
    read.cancel();
    assert!(matches!(read.wait_timeout(WAIT), Err(Error::Cancelled)));
    assert!(
        read.wait_released(WAIT),
        "the cancelled transfer never drained"
    );
    let back = read.into_descriptors().unwrap();
    assert_pattern(&back, 70, "memory a cancelled READ drained into");
    readable.cancel();
}

/// An injected transfer failure ends the operation `Errored` with the cause,
/// moves nothing, and leaves both connectors usable: a retry lands.
pub fn injected_failure_errors_the_operation_and_moves_nothing(h: &dyn Harness) {
    let server = connector(h, "fail-server");
    let (client, faults) = faulty(h, "fail-client");
    let writable = server.create_writable(zeroed(&[4096])).unwrap();
    faults.fail_next_transfer("injected: link down");
    let write = client
        .begin_write(descriptors(9, &[4096]), writable.metadata())
        .unwrap();
    match write.wait_timeout(WAIT) {
        Err(Error::TransferFailed { source }) => {
            assert_eq!(source.to_string(), "injected: link down");
        }
        other => panic!("an injected failure gave {other:?}"),
    }
    assert_eq!(write.status(), OperationStatus::Errored);
    write.cancel();
    assert_eq!(
        write.status(),
        OperationStatus::Errored,
        "terminal states are sticky"
    );
    assert_pattern(
        &returned!(write, "the failed write"),
        9,
        "failed write source",
    );
    assert_eq!(client.remote_agent_count(), 0);
    let passive = writable.wait_timeout(Duration::from_millis(150));
    assert!(matches!(passive, Err(Error::TimedOut(_))), "{passive:?}");
    let retry = client
        .begin_write(descriptors(9, &[4096]), writable.metadata())
        .unwrap();
    retry.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    assert_pattern(&writable.into_descriptors().unwrap(), 9, "retried write");
}

/// A stalled transfer is `InProgress`, holds its peer, then completes with
/// every byte.
pub fn stalled_transfer_is_in_progress_then_complete(h: &dyn Harness) {
    let server = connector(h, "slow-server");
    let (client, faults) = faulty(h, "slow-client");
    let readable = server.create_readable(descriptors(10, &[65536])).unwrap();
    let stall = faults.stall_next_transfer();
    let read = client
        .begin_read(readable.metadata(), zeroed(&[65536]))
        .unwrap();
    assert_eq!(read.status(), OperationStatus::InProgress);
    let timed_out = read.wait_timeout(Duration::from_millis(50));
    assert!(
        matches!(timed_out, Err(Error::TimedOut(_))),
        "{timed_out:?}"
    );
    assert_eq!(readable.status(), OperationStatus::Initialized);
    assert_eq!(
        client.remote_agent_count(),
        1,
        "the in-flight read holds its peer"
    );
    stall.release();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_eq!(client.remote_agent_count(), 0);
    assert_pattern(&read.into_descriptors().unwrap(), 10, "stalled read");
}

/// A transfer whose notification is lost completes on the active side only:
/// the passive side keeps waiting, though the bytes landed.
pub fn dropped_notification_leaves_the_passive_side_waiting(h: &dyn Harness) {
    let server = connector(h, "mute-server");
    let (client, faults) = faulty(h, "mute-client");
    let writable = server.create_writable(zeroed(&[4096])).unwrap();
    faults.drop_next_notification();
    let write = client
        .begin_write(descriptors(11, &[4096]), writable.metadata())
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    let passive = writable.wait_timeout(Duration::from_millis(300));
    assert!(matches!(passive, Err(Error::TimedOut(_))), "{passive:?}");
    assert_eq!(writable.status(), OperationStatus::Initialized);
    writable.cancel();
    // Cancelled unfinished, a writable's buffers come back only where the
    // backend enforces revocation (elsewhere they are leaked by design).
    if server.revocation_enforced() {
        assert_pattern(
            &writable.into_descriptors().unwrap(),
            11,
            "unnotified write",
        );
    }
}

/// An agent that vanishes (as if its process died) completes nothing more:
/// a transfer in flight to it ends, the survivor refuses nothing it should
/// not, and completes a fresh transfer with another peer.
pub fn vanished_peer_completes_nothing(h: &dyn Harness) {
    let (server, server_faults) = faulty(h, "gone-server");
    let (client, faults) = faulty(h, "gone-client");
    let writable = server.create_writable(zeroed(&[4096])).unwrap();
    let readable = server.create_readable(descriptors(12, &[4096])).unwrap();
    let stale = readable.metadata().clone();
    let stall = faults.stall_next_transfer();
    let in_flight = client
        .begin_write(descriptors(12, &[4096]), writable.metadata())
        .unwrap();
    assert!(server_faults.vanish());
    assert!(!server_faults.vanish(), "an agent vanishes once");
    stall.release();
    // Where revocation is enforced the write is refused when it runs;
    // elsewhere its bytes may land, but nobody is notified.
    match in_flight.wait_timeout(WAIT) {
        Ok(()) => assert!(
            !server.revocation_enforced(),
            "a revoked exposure was written"
        ),
        Err(Error::TransferFailed { .. }) => {}
        other => panic!("a write to a vanished peer gave {other:?}"),
    }
    match client.begin_read(&stale, zeroed(&[4096])) {
        Ok(read) if server.revocation_enforced() => panic!(
            "a vanished peer's exposure was still readable ({:?})",
            read.status()
        ),
        Ok(read) => drop(read),
        Err(_) => {}
    }
    for (what, passive) in [
        (
            "writable",
            writable.wait_timeout(Duration::from_millis(300)),
        ),
        (
            "readable",
            readable.wait_timeout(Duration::from_millis(300)),
        ),
    ] {
        assert!(
            matches!(passive, Err(Error::TimedOut(_))),
            "the vanished peer's {what} completed: {passive:?}"
        );
    }
    eventually("the survivor released the vanished peer", || {
        client.remote_agent_count() == 0
    });
    // The survivor completes a fresh transfer with a new peer.
    let fresh = connector(h, "gone-server-2");
    let readable = fresh.create_readable(descriptors(13, &[4096])).unwrap();
    let read = client
        .begin_read(readable.metadata(), zeroed(&[4096]))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_pattern(
        &read.into_descriptors().unwrap(),
        13,
        "read from a new peer",
    );
}

/// `cancel()` after completion changes nothing (Dynamo turned COMPLETE into CANCELLED).
pub fn cancel_after_completion_is_a_no_op(h: &dyn Harness) {
    let server = connector(h, "late-server");
    let client = connector(h, "late-client");
    let readable = server.create_readable(descriptors(50, &[4096])).unwrap();
    let read = client
        .begin_read(readable.metadata(), zeroed(&[4096]))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    read.cancel();
    readable.cancel();
    assert_eq!(read.status(), OperationStatus::Complete);
    assert_eq!(readable.status(), OperationStatus::Complete);
    read.wait().unwrap();
    assert_pattern(&read.into_descriptors().unwrap(), 50, "read before cancel");
}

/// A passive wait with a timeout ends in `TimedOut` when no peer acts; the
/// operation stays usable and a later peer still completes it.
pub fn wait_timeout_expires_when_the_peer_never_acts(h: &dyn Harness) {
    let server = connector(h, "idle-server");
    let readable = server.create_readable(descriptors(60, &[4096])).unwrap();
    let started = std::time::Instant::now();
    let result = readable.wait_timeout(Duration::from_millis(100));
    assert!(
        matches!(result, Err(Error::TimedOut(d)) if d == Duration::from_millis(100)),
        "{result:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(readable.status(), OperationStatus::Initialized);
    let client = connector(h, "idle-client");
    let read = client
        .begin_read(readable.metadata(), zeroed(&[4096]))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_pattern(&read.into_descriptors().unwrap(), 60, "late read");
}

/// Dropping an in-flight operation cancels it safely: its buffers are not freed
/// under the transfer, the peer sees nothing, and the connectors keep working.
pub fn dropping_an_in_flight_operation(h: &dyn Harness) {
    let server = connector(h, "drop-server");
    let (client, faults) = faulty(h, "drop-client");
    let writable = server.create_writable(zeroed(&[1 << 20])).unwrap();
    let stall = faults.stall_next_transfer();
    let write = client
        .begin_write(descriptors(70, &[1 << 20]), writable.metadata())
        .unwrap();
    drop(write);
    // Let go of the stall: the dropped transfer still never runs.
    stall.release();
    let passive = writable.wait_timeout(Duration::from_millis(300));
    assert!(matches!(passive, Err(Error::TimedOut(_))), "{passive:?}");
    assert_eq!(client.remote_agent_count(), 0);
    drop(writable);
    // Both connectors still work.
    let readable = server.create_readable(descriptors(71, &[4096])).unwrap();
    let read = client
        .begin_read(readable.metadata(), zeroed(&[4096]))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_pattern(&read.into_descriptors().unwrap(), 71, "read after drop");
    // A passive operation dropped before its peer acted.
    let abandoned = server.create_readable(descriptors(72, &[4096])).unwrap();
    let stale = abandoned.metadata().clone();
    drop(abandoned);
    match client.begin_read(&stale, zeroed(&[4096])) {
        Ok(late) if server.revocation_enforced() => panic!(
            "a revoked exposure was still readable: the read began ({:?})",
            late.status()
        ),
        Ok(late) => {
            // A backend that cannot revoke may still let the read through (the
            // memory was leaked, not freed), or leave it hanging (its agent no
            // longer makes progress for that exposure); it must not complete
            // with wrong data.
            if late.wait_timeout(Duration::from_secs(2)).is_ok() {
                assert_pattern(
                    &late.into_descriptors().unwrap(),
                    72,
                    "read of a dropped readable",
                );
            }
        }
        Err(_) => {}
    }
}

/// `threads` threads each run `per_thread` concurrent reads against one peer;
/// all bytes arrive and the remote-agent cache is empty afterwards.
pub fn concurrent_operations_share_one_peer(h: &dyn Harness, threads: usize, per_thread: usize) {
    let server = connector(h, "busy-server");
    let client = connector(h, "busy-client");
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (server, client) = (server.clone(), client.clone());
            scope.spawn(move || {
                let seed = |i: usize| 1000 + (t * per_thread + i) as u64;
                let readables: Vec<_> = (0..per_thread)
                    .map(|i| {
                        server
                            .create_readable(descriptors(seed(i), &[4096]))
                            .unwrap()
                    })
                    .collect();
                let reads: Vec<_> = readables
                    .iter()
                    .map(|r| client.begin_read(r.metadata(), zeroed(&[4096])).unwrap())
                    .collect();
                for (i, (read, readable)) in reads.into_iter().zip(readables).enumerate() {
                    read.wait_timeout(WAIT).unwrap();
                    readable.wait_timeout(WAIT).unwrap();
                    assert_pattern(
                        &read.into_descriptors().unwrap(),
                        seed(i),
                        "concurrent read",
                    );
                }
            });
        }
    });
    assert_eq!(
        client.remote_agent_count(),
        0,
        "every operation released its peer"
    );
    assert_eq!(
        client.idle_remote_agent_count(),
        1,
        "the peer stays loaded, idle"
    );
    client.unload_idle_remote_agents();
    assert_eq!(client.idle_remote_agent_count(), 0);
}

/// Metadata survives JSON both ways, and parsed metadata drives a real transfer.
pub fn metadata_round_trips_through_json(h: &dyn Harness) {
    let server = connector(h, "json-server");
    let client = connector(h, "json-client");
    let writable = server.create_writable(zeroed(&[4096, 100])).unwrap();
    let json = writable.metadata().to_json();
    assert!(json.contains(r#""nixl_metadata":"b64:"#), "{json}");
    assert!(json.contains(r#""operation_kind":2"#));
    let parsed: RdmaMetadata = json.parse().unwrap();
    assert_eq!(&parsed, writable.metadata());
    assert_eq!(parsed.to_json(), json);
    let expected: Vec<SerializedDescriptor> = parsed.descriptors().to_vec();
    assert_eq!(
        expected.iter().map(|d| d.size).collect::<Vec<_>>(),
        [4096, 100]
    );
    let write = client
        .begin_write(descriptors(80, &[4096, 100]), &parsed)
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    let received = writable.into_descriptors().unwrap();
    assert_eq!(
        received.iter().map(|d| d.ptr() as u64).collect::<Vec<_>>(),
        expected.iter().map(|d| d.ptr).collect::<Vec<_>>(),
        "the metadata named the very buffers that were written"
    );
    assert_pattern(&received, 80, "write through parsed metadata");
}

/// Operations are futures: `completion()` and `.await` on the operation, which
/// returns the descriptors, under a plain executor.
pub fn operations_are_futures(h: &dyn Harness) {
    let server = connector(h, "async-server");
    let client = connector(h, "async-client");
    futures::executor::block_on(async {
        let readable = server
            .create_readable(descriptors(90, &[4096, 4096]))
            .unwrap();
        let read = client
            .begin_read(readable.metadata(), zeroed(&[4096, 4096]))
            .unwrap();
        let local = read.await.unwrap();
        readable.completion().await.unwrap();
        assert_pattern(&local, 90, "awaited read");
        let source = readable.await.unwrap();
        assert_pattern(&source, 90, "awaited readable");

        let writable = server.create_writable(zeroed(&[512])).unwrap();
        let write = client
            .begin_write(descriptors(91, &[512]), writable.metadata())
            .unwrap();
        write.completion().await.unwrap();
        assert_pattern(&writable.await.unwrap(), 91, "awaited writable");
    });
}

/// A passive operation learns that its peer finished however its owner
/// waits: a thread blocked in `wait`, a future on another thread (both asleep
/// before the peer acts, unless the machine is slow), or a loop on
/// `status()`. Every byte is checked, and each hands its memory back.
pub fn passive_side_learns_of_completion_however_it_waits(h: &dyn Harness) {
    let server = connector(h, "watched-server");
    let client = connector(h, "watched-client");
    std::thread::scope(|scope| {
        let readable = server.create_readable(descriptors(110, &[4096])).unwrap();
        let writable = server.create_writable(zeroed(&[4096])).unwrap();
        let (to_read, to_write) = (readable.metadata().clone(), writable.metadata().clone());
        let blocked = scope.spawn(move || {
            readable.wait_timeout(WAIT).unwrap();
            readable
        });
        let awaited = scope.spawn(move || {
            futures::executor::block_on(writable.completion()).unwrap();
            writable
        });
        std::thread::sleep(Duration::from_millis(50));
        let read = client.begin_read(&to_read, zeroed(&[4096])).unwrap();
        let write = client
            .begin_write(descriptors(111, &[4096]), &to_write)
            .unwrap();
        read.wait_timeout(WAIT).unwrap();
        write.wait_timeout(WAIT).unwrap();
        assert_pattern(
            &read.into_descriptors().unwrap(),
            110,
            "read of a blocked readable",
        );
        let written = awaited.join().unwrap().into_descriptors().unwrap();
        assert_pattern(&written, 111, "write to an awaited writable");
        let source = blocked.join().unwrap().into_descriptors().unwrap();
        assert_pattern(&source, 110, "the blocked readable's own bytes");
    });

    let readable = server.create_readable(descriptors(112, &[4096])).unwrap();
    let read = client
        .begin_read(readable.metadata(), zeroed(&[4096]))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    eventually("status() saw the peer's notification", || {
        readable.status() == OperationStatus::Complete
    });
    assert_pattern(
        &read.into_descriptors().unwrap(),
        112,
        "read of a polled readable",
    );
    let source = readable.into_descriptors().unwrap();
    assert_pattern(&source, 112, "the polled readable's own bytes");
}

/// An active operation that nobody waits on, polls, awaits or cancels still
/// ends: its peer's passive side completes with the bytes, and the operation
/// hands its buffers back. The connector drives it whatever the backend
/// signals (NIXL moves a small transfer on at the engine's safety poll, a
/// large one at once), so a WRITE followed only by the peer cannot hang.
pub fn an_operation_nobody_follows_still_completes(h: &dyn Harness) {
    let server = connector(h, "unfollowed-server");
    let client = connector(h, "unfollowed-client");
    for (seed, size) in [(120, 4096), (121, 1 << 20)] {
        let writable = server.create_writable(zeroed(&[size])).unwrap();
        let write = client
            .begin_write(descriptors(seed, &[size]), writable.metadata())
            .unwrap();
        // Only the passive side waits: nothing looks at `write` until then.
        writable.wait_timeout(WAIT).unwrap();
        assert_pattern(
            &writable.into_descriptors().unwrap(),
            seed,
            "the target of a WRITE nobody followed",
        );
        let source = returned!(write, "a WRITE nobody followed");
        assert_pattern(&source, seed, "the source of a WRITE nobody followed");
    }
}

/// `threads` threads each run `per_thread` operations of mixed sizes and both
/// directions against one peer, verifying every byte; the peer cache ends empty.
pub fn load(h: &dyn Harness, threads: usize, per_thread: usize) {
    const SIZES: [usize; 5] = [64, 4096, 65536, 4097, 256 << 10];
    let before = crate::testing::rss_bytes();
    let server = connector(h, "load-server");
    let client = connector(h, "load-client");
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (server, client) = (server.clone(), client.clone());
            scope.spawn(move || {
                for i in 0..per_thread {
                    let size = SIZES[(t + i) % SIZES.len()];
                    let seed = 10_000 + (t * per_thread + i) as u64;
                    if i % 2 == 0 {
                        let readable = server.create_readable(descriptors(seed, &[size])).unwrap();
                        let read = client
                            .begin_read(readable.metadata(), zeroed(&[size]))
                            .unwrap();
                        read.wait_timeout(WAIT).unwrap();
                        readable.wait_timeout(WAIT).unwrap();
                        assert_pattern(&read.into_descriptors().unwrap(), seed, "load read");
                    } else {
                        let writable = server.create_writable(zeroed(&[size])).unwrap();
                        let write = client
                            .begin_write(descriptors(seed, &[size]), writable.metadata())
                            .unwrap();
                        write.wait_timeout(WAIT).unwrap();
                        writable.wait_timeout(WAIT).unwrap();
                        assert_pattern(&writable.into_descriptors().unwrap(), seed, "load write");
                    }
                }
            });
        }
    });
    assert_eq!(client.remote_agent_count(), 0);
    assert!(client.idle_remote_agent_count() <= 1);
    let grew = crate::testing::rss_bytes() as i64 - before as i64;
    // The figure RELIABILITY.md quotes (informational, not asserted).
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "{} load: {threads} x {per_thread} operations, resident memory grew {grew} bytes",
            server.backend_name()
        );
    }
}

/// Cancelling or dropping an operation while its transfer completes, `rounds`
/// times: the status always agrees with the bytes (all moved or none), the
/// buffers come back only once the backend let go, and nothing is left loaded.
pub fn cancel_and_drop_race_completion(h: &dyn Harness, rounds: usize) {
    let server = connector(h, "race-server");
    let (client, faults) = faulty(h, "race-client");
    let enforced = server.revocation_enforced();
    let size = 16 << 10;
    for round in 0..rounds {
        let seed = 50_000 + round as u64;
        // Delays of 0..50 us put the cancel before, during or after the post.
        faults.delay_next_transfer(Duration::from_micros((round % 6) as u64 * 10));
        let posted_before = faults.posted();
        let writable = server.create_writable(zeroed(&[size])).unwrap();
        let write = client
            .begin_write(descriptors(seed, &[size]), writable.metadata())
            .unwrap();
        if round % 3 == 1 {
            std::thread::yield_now();
        }
        if round % 2 == 0 {
            drop(write);
        } else {
            write.cancel();
            match write.wait_timeout(WAIT) {
                Ok(()) => assert_eq!(write.status(), OperationStatus::Complete),
                Err(Error::Cancelled) => assert_eq!(write.status(), OperationStatus::Cancelled),
                other => panic!("round {round}: cancel gave {other:?}"),
            }
            let source = returned!(write, format!("round {round}: the write"));
            assert_pattern(&source, seed, "source after a cancel race");
        }
        eventually("the raced write was released", || faults.in_flight() == 0);
        let posted = faults.posted() > posted_before;
        // A backend that cannot revoke cannot abort either: a transfer it was
        // given completes. One it never saw moves nothing; there the writable
        // is cancelled unfinished, so its buffers are leaked by design and
        // cannot be inspected.
        if !enforced && !posted {
            let passive = writable.wait_timeout(Duration::from_millis(5));
            assert!(
                matches!(passive, Err(Error::TimedOut(_))),
                "round {round}: a write that was never posted completed: {passive:?}"
            );
            continue;
        }
        let patience = if enforced {
            Duration::from_millis(5)
        } else {
            WAIT
        };
        let landed = match writable.wait_timeout(patience) {
            Ok(()) => true,
            Err(Error::TimedOut(_)) if enforced => false,
            other => {
                panic!("round {round}: a posted write the backend cannot abort gave {other:?}")
            }
        };
        writable.cancel();
        let target = returned!(writable, format!("round {round}: the writable"));
        let bytes = target[0].as_slice().unwrap();
        let all_new = bytes == pattern(seed, size).as_slice();
        let all_old = bytes.iter().all(|&b| b == 0);
        assert!(
            all_new || all_old,
            "round {round}: a partial transfer is visible"
        );
        assert!(
            all_new || !landed,
            "round {round}: completion notified but bytes missing"
        );
        assert!(
            all_old || posted,
            "round {round}: bytes arrived from a write never posted"
        );
    }
    eventually("every raced operation released its peer", || {
        client.remote_agent_count() == 0
    });
}

// ---------------------------------------------------------------------------
// Acting inside a backend call: the `Hooked` wrapper.

/// A backend method, as a [`Hooked`] backend's hook sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// [`RegistrationBackend::register`].
    Register,
    /// [`RegistrationBackend::deregister`].
    Deregister,
    /// [`RegistrationBackend::expose`].
    Expose,
    /// [`RegistrationBackend::revoke`].
    Revoke,
    /// [`RegistrationBackend::load_remote`].
    LoadRemote,
    /// [`RegistrationBackend::unload_remote`].
    UnloadRemote,
    /// [`RegistrationBackend::post`].
    Post,
    /// [`RegistrationBackend::poll`] of this transfer.
    Poll(TransferId),
    /// [`RegistrationBackend::release`] of this transfer.
    Release(TransferId),
    /// [`RegistrationBackend::drain_notifications`].
    DrainNotifications,
}

impl Call {
    /// The method's name, as in the trait.
    pub fn name(self) -> &'static str {
        match self {
            Call::Register => "register",
            Call::Deregister => "deregister",
            Call::Expose => "expose",
            Call::Revoke => "revoke",
            Call::LoadRemote => "load_remote",
            Call::UnloadRemote => "unload_remote",
            Call::Post => "post",
            Call::Poll(_) => "poll",
            Call::Release(_) => "release",
            Call::DrainNotifications => "drain_notifications",
        }
    }
}

/// What a [`Hooked`] backend runs before each of its methods; for `release`
/// it may answer instead of the backend (`Some`).
pub type Hook<B> = Arc<dyn Fn(&Faulty<B>, Call) -> Option<Result<Release>> + Send + Sync>;

/// A backend (under [`Faulty`], so that faults can be armed) whose methods
/// first call a test's [`Hook`]: to panic, to probe the connector from inside
/// a backend call, or to answer `release` as another backend would.
pub struct Hooked<B: RegistrationBackend> {
    inner: Faulty<B>,
    hook: Hook<B>,
    /// False: refuses the event hook, so the engine must poll.
    event_driven: bool,
}

impl<B: RegistrationBackend> Hooked<B> {
    fn call(&self, call: Call) -> Option<Result<Release>> {
        (self.hook)(&self.inner, call)
    }
}

/// A connector over `backend` whose methods call `hook` first, and the handle
/// that arms faults on it. With `event_driven` false the backend refuses the
/// connector's event hook, as a polled transport (NIXL) does.
pub fn hooked<B: RegistrationBackend>(
    backend: B,
    event_driven: bool,
    hook: impl Fn(&Faulty<B>, Call) -> Option<Result<Release>> + Send + Sync + 'static,
) -> (Connector, Faults) {
    let inner = Faulty::new(backend);
    let faults = inner.faults();
    let connector = Connector::new(Hooked {
        inner,
        hook: Arc::new(hook),
        event_driven,
    });
    (connector, faults)
}

impl<B: RegistrationBackend> RegistrationBackend for Hooked<B> {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn agent_name(&self) -> &str {
        self.inner.agent_name()
    }
    unsafe fn register(&self, region: &crate::Segment, writable: bool) -> Result<RegionId> {
        self.call(Call::Register);
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.register(region, writable) }
    }
    fn deregister(&self, region: RegionId) -> Result<()> {
        self.call(Call::Deregister);
        self.inner.deregister(region)
    }
    unsafe fn expose(
        &self,
        ranges: &[crate::Exposed],
        access: OperationKind,
        key: &[u8],
    ) -> Result<Exposure> {
        self.call(Call::Expose);
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.expose(ranges, access, key) }
    }
    fn revoke(&self, exposure: ExposureId) -> Result<()> {
        self.call(Call::Revoke);
        self.inner.revoke(exposure)
    }
    fn revocation_enforced(&self) -> bool {
        self.inner.revocation_enforced()
    }
    fn access_enforced(&self) -> bool {
        self.inner.access_enforced()
    }
    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        self.call(Call::LoadRemote);
        self.inner.load_remote(agent_metadata)
    }
    fn unload_remote(&self, peer: &str) -> Result<()> {
        self.call(Call::UnloadRemote);
        self.inner.unload_remote(peer)
    }
    fn peer_name(&self, agent_metadata: &[u8]) -> Option<String> {
        self.inner.peer_name(agent_metadata)
    }
    unsafe fn post(&self, request: &TransferRequest<'_>) -> Result<Posted> {
        self.call(Call::Post);
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.post(request) }
    }
    fn poll(&self, transfer: TransferId) -> TransferState {
        self.call(Call::Poll(transfer));
        self.inner.poll(transfer)
    }
    fn release(&self, transfer: TransferId) -> Result<Release> {
        match self.call(Call::Release(transfer)) {
            Some(answer) => answer,
            None => self.inner.release(transfer),
        }
    }
    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()> {
        self.call(Call::DrainNotifications);
        self.inner.drain_notifications(sink)
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
        self.event_driven && self.inner.set_event_hook(hook)
    }
}

/// A connector over the harness's agent `name`, [`Hooked`].
fn hooked_agent(
    h: &dyn Harness,
    name: &str,
    event_driven: bool,
    hook: impl Fn(&Faulty<Box<dyn RegistrationBackend>>, Call) -> Option<Result<Release>>
    + Send
    + Sync
    + 'static,
) -> (Connector, Faults) {
    hooked(h.backend(name), event_driven, hook)
}

// ---------------------------------------------------------------------------
// No deadlock: no backend, hook or waker is called with a lock held. Each
// scenario runs inside `within`, so a deadlock fails the check, not the run.

/// A connector READs its own readable while the transfer is delayed: both
/// complete. (The delay thread once held the transfer's lock while the event
/// hook of the same agent polled that transfer: a self-deadlock.)
pub fn reading_its_own_readable_with_a_delayed_transfer_completes(h: &dyn Harness) {
    let (solo, faults) = faulty(h, "solo");
    let read = within(
        "a delayed read of the connector's own readable",
        move || {
            let readable = solo.create_readable(descriptors(130, &[4096])).unwrap();
            faults.delay_next_transfer(Duration::from_millis(50));
            let read = solo
                .begin_read(readable.metadata(), zeroed(&[4096]))
                .unwrap();
            read.wait_timeout(WAIT).unwrap();
            readable.wait_timeout(WAIT).unwrap();
            read.into_descriptors().unwrap()
        },
    );
    assert_pattern(&read, 130, "a read of the connector's own readable");
}

/// Two connectors READ each other's readable, both transfers delayed: both
/// complete. (Each delay thread once held its transfer's lock and, through
/// the peer's event hook, waited for the other's: an ABBA deadlock.)
pub fn crossed_delayed_reads_complete(h: &dyn Harness) {
    const N: usize = 32 << 20;
    let (a, fa) = faulty(h, "crossed-a");
    let (b, fb) = faulty(h, "crossed-b");
    let (got_a, got_b) = within("two crossed delayed reads", move || {
        let ra = a.create_readable(descriptors(131, &[N])).unwrap();
        let rb = b.create_readable(descriptors(132, &[N])).unwrap();
        fa.delay_next_transfer(Duration::from_millis(200));
        fb.delay_next_transfer(Duration::from_millis(200));
        let read_a = a.begin_read(rb.metadata(), zeroed(&[N])).unwrap();
        let read_b = b.begin_read(ra.metadata(), zeroed(&[N])).unwrap();
        read_a.wait_timeout(WAIT).unwrap();
        read_b.wait_timeout(WAIT).unwrap();
        (
            read_a.into_descriptors().unwrap(),
            read_b.into_descriptors().unwrap(),
        )
    });
    assert_pattern(&got_a, 132, "a's read of b");
    assert_pattern(&got_b, 131, "b's read of a");
}

/// A waker that drops the task (here: the operation's future) when woken, as
/// an executor shut down before its tasks are woken does.
struct DropOnWake(Mutex<Option<OperationFuture>>);

impl Wake for DropOnWake {
    fn wake(self: Arc<Self>) {
        let future = self.0.lock().unwrap().take();
        drop(future);
    }
}

/// A waker that drops the very operation it wakes, woken when the peer's
/// READ completes it, deadlocks nobody: the peer's read returns and the
/// operation is gone. (Wakers were once woken under the operation's lock.)
pub fn a_waker_that_drops_its_operation_deadlocks_nobody(h: &dyn Harness) {
    let server = connector(h, "dropwake-server");
    let client = connector(h, "dropwake-client");
    let read = within("a read whose peer's waker drops its operation", move || {
        let readable = server.create_readable(descriptors(133, &[4096])).unwrap();
        let meta = readable.metadata().clone();
        let mut future = readable.into_future();
        let wake = Arc::new(DropOnWake(Mutex::new(None)));
        let waker = Waker::from(Arc::clone(&wake));
        assert!(
            Pin::new(&mut future)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        *wake.0.lock().unwrap() = Some(future);
        let read = client.begin_read(&meta, zeroed(&[4096])).unwrap();
        read.wait_timeout(WAIT).unwrap();
        eventually("the woken waker dropped the readable", || {
            wake.0.lock().unwrap().is_none()
        });
        read.into_descriptors().unwrap()
    });
    assert_pattern(&read, 133, "the read of a readable its waker dropped");
}

/// `status()` never blocks: read from another thread while the backend is
/// inside `poll`, `release` and `revoke` of that very operation, it returns
/// (were it to wait behind the call, the bounded wait would fail the check),
/// and inside `release` the outcome is already decided.
pub fn status_never_blocks_behind_poll_release_or_revoke(h: &dyn Harness) {
    type Probe = Arc<dyn Fn(&'static str) + Send + Sync>;
    /// An agent that runs the probe (once set) inside `poll`, `release` and `revoke`.
    fn probed(
        h: &dyn Harness,
        name: &str,
        probe: &Arc<Mutex<Option<Probe>>>,
    ) -> (Connector, Faults) {
        let probe = Arc::clone(probe);
        hooked_agent(h, name, true, move |_, call| {
            if matches!(call, Call::Poll(_) | Call::Release(_) | Call::Revoke) {
                let probe = probe.lock().unwrap().clone();
                if let Some(probe) = probe {
                    probe(call.name());
                }
            }
            None
        })
    }
    fn status_from_another_thread(
        status: impl Fn() -> OperationStatus + Send + 'static,
    ) -> OperationStatus {
        within("status() read while the backend is inside a call", status)
    }

    let probe: Arc<Mutex<Option<Probe>>> = Arc::default();
    let (client, faults) = probed(h, "status-client", &probe);
    let server_probe: Arc<Mutex<Option<Probe>>> = Arc::default();
    let (server, _) = probed(h, "status-server", &server_probe);

    // An active operation: probed in `poll` (the engine's and the waiter's),
    // then in `release` when it is cancelled.
    let readable = Arc::new(server.create_readable(descriptors(134, &[4096])).unwrap());
    faults.delay_next_transfer(Duration::from_secs(3600));
    let read = Arc::new(
        client
            .begin_read(readable.metadata(), zeroed(&[4096]))
            .unwrap(),
    );
    let seen: Arc<Mutex<Vec<(&'static str, OperationStatus)>>> = Arc::default();
    {
        let (read, seen) = (Arc::clone(&read), Arc::clone(&seen));
        *probe.lock().unwrap() = Some(Arc::new(move |call| {
            let read = Arc::clone(&read);
            let status = status_from_another_thread(move || read.status());
            seen.lock().unwrap().push((call, status));
        }));
    }
    let early = read.wait_timeout(Duration::from_millis(20));
    assert!(matches!(early, Err(Error::TimedOut(_))), "{early:?}");
    read.cancel();
    *probe.lock().unwrap() = None; // the probe holds the operation: let go of it
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.contains(&("release", OperationStatus::Cancelled)),
        "inside release the status was already decided: {seen:?}"
    );
    assert!(
        seen.iter().all(|(call, status)| *call != "poll"
            || matches!(
                status,
                OperationStatus::InProgress | OperationStatus::Cancelled
            )),
        "{seen:?}"
    );

    // A passive operation: probed in `revoke` when it is cancelled.
    let seen: Arc<Mutex<Vec<OperationStatus>>> = Arc::default();
    {
        let (readable, seen) = (Arc::clone(&readable), Arc::clone(&seen));
        *server_probe.lock().unwrap() = Some(Arc::new(move |_| {
            let readable = Arc::clone(&readable);
            seen.lock()
                .unwrap()
                .push(status_from_another_thread(move || readable.status()));
        }));
    }
    readable.cancel();
    *server_probe.lock().unwrap() = None;
    assert_eq!(*seen.lock().unwrap(), [OperationStatus::Cancelled]);
}

// ---------------------------------------------------------------------------
// Panics and wakers: memory is never freed under a transfer, and nothing
// stops. (`cargo xtask test` runs the loopback suite under AddressSanitizer
// too, which reports a use-after-free directly.)

/// How a hooked agent's `release` (or event hook) misbehaves.
#[derive(Clone, Copy, PartialEq)]
enum Misbehaves {
    /// `release` panics once (a backend bug, e.g. an unwrap on an FFI error).
    PanicOnRelease,
    /// `release` of a transfer still in progress answers
    /// `Release::StillRunning` ("cannot abort, will finish"), as NIXL does.
    StillRunningWhileInProgress,
    /// No event hook: the engine must poll, as with NIXL.
    Polled,
}

fn misbehaving(h: &dyn Harness, name: &str, how: Misbehaves) -> (Connector, Faults) {
    let armed = AtomicBool::new(true);
    hooked_agent(h, name, how != Misbehaves::Polled, move |inner, call| {
        let Call::Release(transfer) = call else {
            return None;
        };
        match how {
            Misbehaves::PanicOnRelease if armed.swap(false, Ordering::SeqCst) => {
                panic!("backend bug: release panicked")
            }
            Misbehaves::StillRunningWhileInProgress if inner.poll(transfer).is_in_progress() => {
                Some(Ok(Release::StillRunning))
            }
            _ => None,
        }
    })
}

struct PanicWake;

impl Wake for PanicWake {
    fn wake(self: Arc<Self>) {
        panic!("user waker panicked");
    }
}

/// A small block (tcache-sized: the next allocation of this size reuses a
/// block freed just before).
const SMALL: usize = 512;

/// Runs `end_op` (which drops or cancels a read whose stalled transfer is
/// still to run; `panics`: whether a panic comes out of it, after which the
/// transfer is leaked), then allocates a same-sized victim, lets the
/// transfer run, and checks that it did not write into the victim.
fn no_write_after_free(
    end_op: impl FnOnce(),
    panics: bool,
    stall: Stall,
    readable: &ReadableOperation,
) {
    let ended = catch_unwind(AssertUnwindSafe(end_op));
    assert_eq!(ended.is_err(), panics, "did the operation's end panic?");
    // Often at the very address of the read's buffer, had it been freed.
    let victim = vec![0xAAu8; SMALL];
    stall.release();
    // The readable completes once the transfer has copied and notified. A
    // leaked transfer has nobody to drive it: on a backend whose transfers
    // move only when polled (NIXL) it may never notify, so it gets a while
    // to run, not a promise.
    match readable.wait_timeout(if panics { Duration::from_secs(2) } else { WAIT }) {
        Ok(()) => {}
        Err(Error::TimedOut(_)) if panics => {}
        other => panic!("the readable of a drained read gave {other:?}"),
    }
    let changed = victim.iter().filter(|&&b| b != 0xAA).count();
    assert_eq!(
        changed, 0,
        "{changed} bytes of an unrelated live Vec were overwritten by the cancelled transfer"
    );
}

/// A backend whose `release` panics while a dropped read's transfer is still
/// to run: the panic comes out of `drop`, and the read's memory is leaked,
/// never freed under the transfer. (The drop glue once freed it.)
pub fn a_panic_in_release_does_not_free_in_flight_memory(h: &dyn Harness) {
    let server = connector(h, "release-panic-server");
    let (client, faults) = misbehaving(h, "release-panic-client", Misbehaves::PanicOnRelease);
    let readable = server.create_readable(descriptors(140, &[SMALL])).unwrap();
    let stall = faults.stall_next_transfer();
    let read = client
        .begin_read(readable.metadata(), zeroed(&[SMALL]))
        .unwrap();
    assert_eq!(read.status(), OperationStatus::InProgress);
    no_write_after_free(move || drop(read), true, stall, &readable);
}

/// A stale waker that would panic (its `completion()` future dropped, as by
/// a timeout) and a backend that cannot abort: dropping the read panics
/// nowhere, and its memory stays held until the transfer drains.
pub fn a_dropped_future_takes_its_panicking_waker_with_it(h: &dyn Harness) {
    let server = connector(h, "stale-waker-server");
    let (client, faults) = misbehaving(
        h,
        "stale-waker-client",
        Misbehaves::StillRunningWhileInProgress,
    );
    let readable = server.create_readable(descriptors(141, &[SMALL])).unwrap();
    let stall = faults.stall_next_transfer();
    let read = client
        .begin_read(readable.metadata(), zeroed(&[SMALL]))
        .unwrap();
    {
        let mut completion = read.completion();
        let waker = Waker::from(Arc::new(PanicWake));
        assert!(
            Pin::new(&mut completion)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
    } // the Completion is gone, and its waker with it
    no_write_after_free(move || drop(read), false, stall, &readable);
}

/// A live future's waker panics when another thread cancels the operation
/// while the backend cannot let go yet: the panic is contained (logged), the
/// status is `Cancelled`, and the buffers stay held until the transfer drains.
pub fn a_panicking_waker_of_a_live_future_frees_no_draining_memory(h: &dyn Harness) {
    let server = connector(h, "live-waker-server");
    let (client, faults) = misbehaving(
        h,
        "live-waker-client",
        Misbehaves::StillRunningWhileInProgress,
    );
    let readable = server.create_readable(descriptors(142, &[SMALL])).unwrap();
    let stall = faults.stall_next_transfer();
    let read = client
        .begin_read(readable.metadata(), zeroed(&[SMALL]))
        .unwrap();
    no_write_after_free(
        move || {
            let mut completion = read.completion();
            let waker = Waker::from(Arc::new(PanicWake));
            assert!(
                Pin::new(&mut completion)
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            std::thread::scope(|s| {
                s.spawn(|| read.cancel()).join().unwrap();
            });
            assert_eq!(read.status(), OperationStatus::Cancelled);
            drop(completion);
            drop(read);
        },
        false,
        stall,
        &readable,
    );
}

/// A waker that panics on the engine's thread does not stop the engine: on
/// a polled backend, a later passive operation nobody waits on still
/// completes. (The engine thread once died and was never restarted.)
pub fn a_panicking_waker_does_not_stop_the_engine(h: &dyn Harness) {
    let (server, _) = misbehaving(h, "engine-server", Misbehaves::Polled);
    let client = connector(h, "engine-client");

    let first = server.create_readable(descriptors(143, &[64])).unwrap();
    let waker = Waker::from(Arc::new(PanicWake));
    // Kept alive, so the engine (nobody waits) wakes it when `first` completes.
    let mut pending = first.completion();
    assert!(
        Pin::new(&mut pending)
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    let read = client.begin_read(first.metadata(), zeroed(&[64])).unwrap();
    read.wait_timeout(WAIT).unwrap();
    eventually("the first readable completed", || {
        first.status() == OperationStatus::Complete
    });
    drop(pending);

    let second = server.create_readable(descriptors(144, &[64])).unwrap();
    let read = client.begin_read(second.metadata(), zeroed(&[64])).unwrap();
    read.wait_timeout(WAIT).unwrap();
    // Nobody waits on `second`: only the engine can take its notification.
    eventually("the second readable completed", || {
        second.status() == OperationStatus::Complete
    });
    assert_pattern(
        &second.into_descriptors().unwrap(),
        144,
        "a readable after a panicking waker",
    );
    assert_pattern(&read.into_descriptors().unwrap(), 144, "its read");
}

/// A waker that counts the live wakers of one check (no statics: checks run
/// in parallel).
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn waker(live: &Arc<AtomicUsize>) -> Waker {
        live.fetch_add(1, Ordering::SeqCst);
        Waker::from(Arc::new(Counted(Arc::clone(live))))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Wake for Counted {
    fn wake(self: Arc<Self>) {}
}

/// A pending operation polled through 100,000 fresh futures, each with a new
/// waker, keeps at most one of them. (Every waker was once kept until the
/// operation ended.)
pub fn repolling_with_new_wakers_keeps_a_bounded_number(h: &dyn Harness) {
    let server = connector(h, "repoll-server");
    let readable = server.create_readable(descriptors(145, &[64])).unwrap();
    let live = Arc::new(AtomicUsize::new(0));
    for _ in 0..100_000 {
        let waker = Counted::waker(&live);
        let mut completion = readable.completion();
        assert!(
            Pin::new(&mut completion)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
    }
    let kept = live.load(Ordering::SeqCst);
    assert!(kept <= 1, "{kept} wakers retained by one pending operation");
}

/// One future re-polled with a new waker each time keeps only the latest,
/// and dropping the future releases that one too.
pub fn one_future_repolled_keeps_only_its_latest_waker(h: &dyn Harness) {
    let server = connector(h, "latest-server");
    let readable = server.create_readable(descriptors(146, &[64])).unwrap();
    let live = Arc::new(AtomicUsize::new(0));
    let mut completion = readable.completion();
    for _ in 0..10_000 {
        let waker = Counted::waker(&live);
        assert!(
            Pin::new(&mut completion)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
    }
    assert_eq!(live.load(Ordering::SeqCst), 1, "the latest waker only");
    drop(completion);
    assert_eq!(
        live.load(Ordering::SeqCst),
        0,
        "a dropped future keeps no waker"
    );
}

// ---------------------------------------------------------------------------
// The peer cache.

/// A well-formed metadata document whose agent blob the backend refuses
/// changes nothing: every idle peer stays loaded. (One refused blob once
/// unloaded every idle peer, the cache retrying after evicting them all.)
pub fn a_refused_agent_blob_keeps_every_idle_peer(h: &dyn Harness) {
    const PEERS: usize = 8;
    let client = connector(h, "idle-cache-client");
    let servers: Vec<Connector> = (0..PEERS)
        .map(|i| {
            let server = connector(h, &format!("idle-cache-server-{i}"));
            let readable = server
                .create_readable(descriptors(150 + i as u64, &[64]))
                .unwrap();
            let read = client
                .begin_read(readable.metadata(), zeroed(&[64]))
                .unwrap();
            read.wait_timeout(WAIT).unwrap();
            readable.wait_timeout(WAIT).unwrap();
            assert_pattern(
                &read.into_descriptors().unwrap(),
                150 + i as u64,
                "a read from an idle-to-be peer",
            );
            server
        })
        .collect();
    assert_eq!(client.idle_remote_agent_count(), PEERS);
    let exposed = servers[0].create_readable(descriptors(99, &[64])).unwrap();
    let junk = RdmaMetadata::new(
        OperationKind::Read,
        exposed.metadata().descriptors().to_vec(),
        b"junk".to_vec(),
        exposed.metadata().notification_key().to_owned(),
    )
    .unwrap();
    assert!(client.begin_read(&junk, zeroed(&[64])).is_err());
    assert_eq!(
        client.idle_remote_agent_count(),
        PEERS,
        "one refused blob unloaded idle peers"
    );
    // The peer is still reached with its real metadata.
    let read = client
        .begin_read(exposed.metadata(), zeroed(&[64]))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    assert_pattern(
        &read.into_descriptors().unwrap(),
        99,
        "a read after a refused blob",
    );
}

// ---------------------------------------------------------------------------
// The suite: every check above, listed once.

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
    /// The checks of this file and its submodules: their `pub fn`s whose
    /// first parameter is the harness.
    fn checks_in_source() -> Vec<&'static str> {
        [
            include_str!("conformance.rs"),
            include_str!("conformance/views.rs"),
            include_str!("conformance/empty.rs"),
        ]
        .into_iter()
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
    fn the_suite_runs_every_check_in_this_file_once() {
        let mut listed = super::CHECKS.to_vec();
        let mut defined = checks_in_source();
        assert!(defined.len() >= 30, "the parser found {defined:?}");
        listed.sort_unstable();
        defined.sort_unstable();
        let mut unique = listed.clone();
        unique.dedup();
        assert_eq!(listed, unique, "a check is listed twice");
        assert_eq!(
            listed, defined,
            "__conformance_checks! must list every `pub fn (h: &dyn Harness, ..)` of conformance.rs"
        );
    }
}
