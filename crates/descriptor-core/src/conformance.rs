//! The backend conformance suite (feature `conformance`): the behaviours every
//! [`RegistrationBackend`] must show, checked on each one.
//!
//! Each `pub fn` takes a [`Harness`] that makes backend agents able to reach
//! each other, and panics (like a test) when the backend misbehaves. The suite
//! builds the connectors itself, over [`Faulty`] so that it can delay
//! transfers on any backend. Where backends may legitimately differ, the suite
//! asks the backend's declared capabilities (today:
//! [`RegistrationBackend::revocation_enforced`]), never its name. A backend
//! crate runs every check from its tests, e.g. with `rstest`:
//!
//! ```ignore
//! #[rstest]
//! #[case::one_block(&[4096])]
//! fn readable_then_read(#[case] sizes: &[usize]) {
//!     conformance::readable_then_read_moves_bytes(&MyHarness::new(), sizes);
//! }
//! ```
//!
//! Every check compares bytes, not only statuses.
//!
//! This module is for testing backends: it is not a stable API, and its checks
//! and helpers change as the specification grows, in any release.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::faults::{Faults, Faulty};
use crate::{
    Connector, Descriptor, Device, Error, OperationKind, OperationStatus, RdmaMetadata,
    RegistrationBackend, SerializedDescriptor, Side,
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

/// Polls `condition` until it holds, failing after [`WAIT`].
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
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
