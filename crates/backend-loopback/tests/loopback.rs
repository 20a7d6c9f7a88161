//! Loopback-specific behaviour: forged metadata is refused without touching
//! memory, exposures are scoped, and faults leave nothing registered behind.
#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::conformance::{
    filled, forge, pattern, rekeyed, shifted, zeroed_one as zeroed,
};
use descriptor_core::faults::{Faults, Faulty};
use descriptor_core::{
    Connector, Descriptor, Device, Error, OperationKind, OperationStatus, RdmaMetadata,
};

const SHORT: Duration = Duration::from_millis(150);
const LONG: Duration = Duration::from_secs(10);

fn connector(fabric: &Fabric, name: &str) -> (Connector, Faults) {
    let backend = Faulty::new(LoopbackBackend::new(fabric, name).unwrap());
    let faults = backend.faults();
    (Connector::new(backend), faults)
}

fn pair() -> (Fabric, Connector, Connector, Faults) {
    let fabric = Fabric::new();
    let (server, _) = connector(&fabric, "server");
    let (client, faults) = connector(&fabric, "client");
    (fabric, server, client, faults)
}

fn assert_untouched(writable: descriptor_core::WritableOperation) {
    assert_eq!(writable.status(), OperationStatus::Initialized);
    writable.cancel();
    let back = writable.into_descriptors().unwrap();
    assert!(
        back[0].as_slice().unwrap().iter().all(|&b| b == 0),
        "target memory was written"
    );
}

fn assert_denied(result: Result<descriptor_core::WriteOperation, Error>, needle: &str) {
    match result {
        Err(Error::AccessDenied { reason, .. }) => assert!(reason.contains(needle), "{reason}"),
        other => panic!("expected AccessDenied ({needle}), got {other:?}"),
    }
}

#[test]
fn pointer_past_the_exposed_region_is_refused() {
    let (_f, server, client, _) = pair();
    let writable = server.create_writable(zeroed(4096)).unwrap();
    let forged = forge(
        writable.metadata(),
        OperationKind::Write,
        shifted(writable.metadata(), 1, 4096),
    );
    assert_denied(
        client.begin_write(filled(1, 4096), &forged),
        "not inside memory the peer exposed",
    );
    assert_eq!(client.remote_agent_count(), 0);
    assert_untouched(writable);
}

#[test]
fn size_larger_than_registered_is_refused() {
    let (_f, server, client, _) = pair();
    let writable = server.create_writable(zeroed(4096)).unwrap();
    let forged = forge(
        writable.metadata(),
        OperationKind::Write,
        shifted(writable.metadata(), 0, 4097),
    );
    assert_denied(
        client.begin_write(filled(2, 4097), &forged),
        "not inside memory",
    );
    assert_untouched(writable);
}

#[test]
fn region_exposed_by_another_operation_is_out_of_reach() {
    let (_f, server, client, _) = pair();
    let mine = server.create_writable(zeroed(4096)).unwrap();
    let other = server.create_writable(zeroed(4096)).unwrap();
    // The client holds `mine`'s metadata but aims at `other`'s buffer.
    let forged = forge(
        mine.metadata(),
        OperationKind::Write,
        other.metadata().descriptors().to_vec(),
    );
    assert_denied(
        client.begin_write(filled(3, 4096), &forged),
        "not inside memory",
    );
    assert_untouched(other);
    assert_untouched(mine);
}

#[test]
fn a_transfer_carrying_another_operations_key_is_refused() {
    let (_f, server, client, _) = pair();
    let victim = server.create_writable(zeroed(4096)).unwrap();
    let other = server.create_writable(zeroed(4096)).unwrap();
    // A peer with `other`'s metadata aims at `other`'s buffer but carries
    // `victim`'s key: the key names `victim`'s exposure, which does not hold
    // that buffer, so nothing moves and nobody is told.
    let forged = rekeyed(other.metadata(), victim.metadata());
    assert_denied(
        client.begin_write(filled(6, 4096), &forged),
        "not inside memory the peer exposed for the operation its notification key names",
    );
    assert!(matches!(
        victim.wait_timeout(SHORT),
        Err(Error::TimedOut(_))
    ));
    assert_eq!(other.status(), OperationStatus::Initialized);
    // An honest write still completes the victim.
    client
        .begin_write(filled(7, 4096), victim.metadata())
        .unwrap()
        .wait_timeout(LONG)
        .unwrap();
    victim.wait_timeout(LONG).unwrap();
    let back = victim.into_descriptors().unwrap();
    assert_eq!(back[0].as_slice().unwrap(), pattern(7, 4096).as_slice());
    assert_untouched(other);
}

#[test]
fn readable_memory_cannot_be_written_by_flipping_the_kind() {
    let (_f, server, client, _) = pair();
    let readable = server.create_readable(filled(4, 4096)).unwrap();
    let forged = forge(
        readable.metadata(),
        OperationKind::Write,
        readable.metadata().descriptors().to_vec(),
    );
    assert_denied(
        client.begin_write(zeroed(4096), &forged),
        "belongs to a readable operation of the peer, which cannot be written",
    );
    readable.cancel();
    let back = readable.into_descriptors().unwrap();
    assert_eq!(back[0].as_slice().unwrap(), pattern(4, 4096).as_slice());
}

#[test]
fn writable_memory_cannot_be_read_by_flipping_the_kind() {
    let (_f, server, client, _) = pair();
    let writable = server.create_writable(filled(5, 4096)).unwrap();
    let forged = forge(
        writable.metadata(),
        OperationKind::Read,
        writable.metadata().descriptors().to_vec(),
    );
    match client.begin_read(&forged, zeroed(4096)) {
        Err(Error::AccessDenied { reason, .. }) => {
            assert!(
                reason.contains("belongs to a writable operation of the peer"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn ended_operation_no_longer_exposes_its_memory() {
    let (_f, server, client, _) = pair();
    let readable = server.create_readable(filled(6, 4096)).unwrap();
    let read = client
        .begin_read(readable.metadata(), zeroed(4096))
        .unwrap();
    read.wait_timeout(LONG).unwrap();
    readable.wait_timeout(LONG).unwrap();
    // A second read with the same metadata after completion is refused.
    let again = client.begin_read(readable.metadata(), zeroed(4096));
    assert!(
        matches!(again, Err(Error::AccessDenied { .. })),
        "{again:?}"
    );
}

/// The initiator leaves its peer's notification for the passive side when
/// nobody there waits. Nobody ever looks here, and the passive connector
/// still completes the operation on its own (its engine's next pass) and
/// revokes the exposure; the bytes are in place.
#[test]
fn a_passive_operation_nobody_looks_at_completes_on_its_own() {
    let (fabric, server, client, _) = pair();
    let writable = server.create_writable(zeroed(4096)).unwrap();
    let write = client
        .begin_write(filled(8, 4096), writable.metadata())
        .unwrap();
    write.wait_timeout(LONG).unwrap();
    let deadline = std::time::Instant::now() + LONG;
    while fabric.usage("server").unwrap().1 != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the exposure outlived its peer's notification"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(writable.status(), OperationStatus::Complete);
    let written = writable.into_descriptors().unwrap();
    assert_eq!(written[0].as_slice().unwrap(), pattern(8, 4096).as_slice());
}

#[test]
fn metadata_from_another_fabric_is_refused() {
    let (_f, server, _, _) = pair();
    let (stranger, _) = connector(&Fabric::new(), "stranger");
    let readable = server.create_readable(filled(7, 64)).unwrap();
    match stranger.begin_read(readable.metadata(), zeroed(64)) {
        Err(Error::AccessDenied { reason, .. }) => assert_eq!(
            reason,
            "the metadata comes from another fabric (or another process: loopback reaches \
             connectors in this process only; use NIXL across processes)"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(stranger.remote_agent_count(), 0);
}

#[test]
fn metadata_of_an_agent_no_longer_here_says_loopback_is_this_process_only() {
    // What metadata from another process looks like: a blob of this fabric
    // (ids are per process) naming no live agent here.
    let (_f, server, client, _) = pair();
    let readable = server.create_readable(filled(7, 64)).unwrap();
    let metadata = readable.metadata().clone();
    drop(readable);
    drop(server);
    match client.begin_read(&metadata, zeroed(64)) {
        Err(Error::AccessDenied { peer, reason, .. }) => {
            assert_eq!(peer, "server");
            assert_eq!(
                reason,
                "no such agent on this process's loopback fabric: it vanished, or the metadata \
                 came from another process (loopback reaches connectors in this process only; \
                 use NIXL across processes)"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn garbage_agent_metadata_is_an_error() {
    let (_f, server, client, _) = pair();
    let readable = server.create_readable(filled(8, 64)).unwrap();
    let m = readable.metadata();
    let garbage = RdmaMetadata::new(
        OperationKind::Read,
        m.descriptors().to_vec(),
        b"not an agent".to_vec(),
        m.notification_key().to_owned(),
    )
    .unwrap();
    let result = client.begin_read(&garbage, zeroed(64));
    assert!(
        matches!(result, Err(Error::InvalidMetadata { .. })),
        "{result:?}"
    );
}

#[test]
fn device_memory_is_refused_with_a_clear_error() {
    let (_f, server, _, _) = pair();
    let mut fake = vec![0u8; 64];
    // SAFETY: `fake` outlives the descriptor; registration refuses it before any access.
    let cuda = unsafe { Descriptor::from_raw_parts(fake.as_mut_ptr(), 64, Device::cuda(0), None) }
        .unwrap();
    match server.create_readable(vec![cuda]) {
        Err(Error::Unsupported { backend, what }) => {
            assert_eq!(backend, "loopback");
            assert!(what.contains("cuda:0"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    drop(fake);
}

#[test]
fn agent_names_are_unique_per_fabric_and_nonempty() {
    let fabric = Fabric::new();
    let first = LoopbackBackend::new(&fabric, "w").unwrap();
    assert!(LoopbackBackend::new(&fabric, "w").is_err());
    assert!(LoopbackBackend::new(&fabric, "").is_err());
    assert!(
        LoopbackBackend::new(&Fabric::new(), "w").is_ok(),
        "other fabrics are independent"
    );
    assert_eq!(fabric.agents(), ["w"]);
    drop(first);
    assert!(
        fabric.agents().is_empty(),
        "a dropped agent leaves the fabric"
    );
    assert!(LoopbackBackend::new(&fabric, "w").is_ok());
}

#[test]
fn descriptor_of_one_connector_is_refused_by_another() {
    let (_f, server, client, _) = pair();
    let mut d = Descriptor::new(vec![1u8; 64]).unwrap();
    d.register_memory(&server).unwrap();
    let result = client.create_readable(vec![d]);
    assert!(
        matches!(result, Err(Error::RegisteredElsewhere { .. })),
        "{result:?}"
    );
}

#[test]
fn a_huge_timeout_does_not_overflow() {
    let (_f, server, client, _) = pair();
    let readable = server.create_readable(filled(14, 64)).unwrap();
    let read = client.begin_read(readable.metadata(), zeroed(64)).unwrap();
    read.wait_timeout(Duration::MAX).unwrap();
    readable.wait_timeout(Duration::MAX).unwrap();
}

#[test]
fn global_fabric_connects_agents_without_passing_a_fabric_around() {
    let a = Connector::new(LoopbackBackend::on_global_fabric("global-test-a").unwrap());
    let b = Connector::new(LoopbackBackend::on_global_fabric("global-test-b").unwrap());
    let readable = a.create_readable(filled(15, 128)).unwrap();
    let read = b.begin_read(readable.metadata(), zeroed(128)).unwrap();
    read.wait_timeout(LONG).unwrap();
    assert_eq!(
        read.into_descriptors().unwrap()[0].as_slice().unwrap(),
        pattern(15, 128).as_slice()
    );
}

#[test]
fn idle_peers_stay_loaded_up_to_the_cap_then_least_recent_go() {
    let fabric = Fabric::new();
    let client = Connector::builder(LoopbackBackend::new(&fabric, "client").unwrap())
        .max_idle_peers(3)
        .build();
    let servers: Vec<Connector> = (0..5)
        .map(|i| connector(&fabric, &format!("server-{i}")).0)
        .collect();
    for (i, server) in servers.iter().enumerate() {
        let readable = server.create_readable(filled(20 + i as u64, 64)).unwrap();
        let read = client.begin_read(readable.metadata(), zeroed(64)).unwrap();
        read.wait_timeout(LONG).unwrap();
        assert_eq!(
            read.into_descriptors().unwrap()[0].as_slice().unwrap(),
            pattern(20 + i as u64, 64).as_slice()
        );
        assert_eq!(client.remote_agent_count(), 0);
        assert_eq!(client.idle_remote_agent_count(), (i + 1).min(3));
    }
    // The evicted peers really were unloaded: a stale grant of server-0 is gone,
    // so its new readable still works (fresh load), and old metadata does not.
    let readable = servers[0].create_readable(filled(30, 64)).unwrap();
    let read = client.begin_read(readable.metadata(), zeroed(64)).unwrap();
    read.wait_timeout(LONG).unwrap();
    client.unload_idle_remote_agents();
    assert_eq!(
        (
            client.remote_agent_count(),
            client.idle_remote_agent_count()
        ),
        (0, 0)
    );
}

#[test]
fn zero_idle_peers_unloads_at_the_last_operation() {
    let fabric = Fabric::new();
    let client = Connector::builder(LoopbackBackend::new(&fabric, "client").unwrap())
        .max_idle_peers(0)
        .build();
    let (server, _) = connector(&fabric, "server");
    let readable = server.create_readable(filled(40, 64)).unwrap();
    let read = client.begin_read(readable.metadata(), zeroed(64)).unwrap();
    read.wait_timeout(LONG).unwrap();
    assert_eq!(
        (
            client.remote_agent_count(),
            client.idle_remote_agent_count()
        ),
        (0, 0)
    );
}

#[test]
fn faults_leave_no_registration_exposure_or_peer_behind() {
    let (fabric, server, client, faults) = pair();
    // A failed, a slow (cancelled), a notification-less and a dropped transfer.
    {
        let writable = server.create_writable(zeroed(4096)).unwrap();
        faults.fail_next_transfer("injected");
        let failed = client
            .begin_write(filled(30, 4096), writable.metadata())
            .unwrap();
        assert!(matches!(
            failed.wait_timeout(LONG),
            Err(Error::TransferFailed { .. })
        ));
        let stall = faults.stall_next_transfer();
        let slow = client
            .begin_write(filled(31, 4096), writable.metadata())
            .unwrap();
        slow.cancel();
        stall.release();
        faults.drop_next_notification();
        let silent = client
            .begin_write(filled(32, 4096), writable.metadata())
            .unwrap();
        silent.wait_timeout(LONG).unwrap();
        assert!(matches!(
            writable.wait_timeout(SHORT),
            Err(Error::TimedOut(_))
        ));
        let stall = faults.stall_next_transfer();
        let dropped = client
            .begin_write(filled(33, 4096), writable.metadata())
            .unwrap();
        drop(dropped);
        stall.release();
        assert!(
            fabric.usage("server").unwrap().0 > 0,
            "while alive, things are registered"
        );
    }
    assert_eq!(
        fabric.usage("server"),
        Some((0, 0)),
        "server: registrations, exposures"
    );
    assert_eq!(
        fabric.usage("client"),
        Some((0, 0)),
        "client: registrations, exposures"
    );
    assert_eq!(client.remote_agent_count(), 0);
    client.unload_idle_remote_agents();
    assert_eq!(client.idle_remote_agent_count(), 0);
    // And the connectors still work.
    let readable = server.create_readable(filled(34, 4096)).unwrap();
    let read = client
        .begin_read(readable.metadata(), zeroed(4096))
        .unwrap();
    read.wait_timeout(LONG).unwrap();
    assert_eq!(
        read.into_descriptors().unwrap()[0].as_slice().unwrap(),
        pattern(34, 4096).as_slice()
    );
}

/// Two agents, "server" and "client", on a fabric of their own, for tests
/// below the connector. Declare the buffers they touch before calling this,
/// so that the backends are dropped first.
fn agents() -> (LoopbackBackend, LoopbackBackend) {
    let fabric = Fabric::new();
    (
        LoopbackBackend::new(&fabric, "server").unwrap(),
        LoopbackBackend::new(&fabric, "client").unwrap(),
    )
}

/// The 4 KiB of host memory at `at`, as a segment (its provenance exposed).
fn page(at: *const u8) -> descriptor_core::Segment {
    descriptor_core::Segment {
        addr: at.expose_provenance(),
        len: 4096,
        device: Device::HOST,
    }
}

/// The backend's own transfer bookkeeping, below the connector: a transfer
/// that completed in `post` reads `Done` (its bytes in place) and is let go,
/// and an id this backend never handed out reads as unknown, not as done.
#[test]
fn completed_transfers_read_done_and_unknown_ids_do_not() {
    use descriptor_core::{
        Exposed, PeerTarget, RegistrationBackend, Release, Target, TransferId, TransferRequest,
        TransferState,
    };
    // Declared first, so dropped last: the backends go before the buffers.
    let src = pattern(35, 4096);
    let mut dst = vec![0u8; 4096];
    let (server, client) = agents();
    let remote = page(src.as_ptr());
    let local = page(dst.as_mut_ptr());
    // SAFETY: both buffers outlive the backends (declared before them), and
    // the transfer ends inside `post` (the loopback copies there); `src` is
    // registered read-only and only read, `dst` only written by the copy.
    let posted = unsafe {
        let source = server.register(&remote, false).unwrap();
        let exposed = Exposed {
            region: source,
            segment: remote,
        };
        let exposure = server
            .expose(&[exposed], OperationKind::Read, b"key")
            .unwrap();
        let target = client.register(&local, true).unwrap();
        let peer = client.load_remote(&exposure.agent_metadata).unwrap();
        client
            .post(&TransferRequest {
                op: OperationKind::Read,
                local: &[local],
                local_regions: &[target],
                target: Target::Peer(PeerTarget {
                    peer: &peer,
                    remote: &[remote],
                    notification: b"key",
                    notify: true,
                }),
            })
            .unwrap()
    };
    assert!(matches!(posted.state, TransferState::Done), "ended in post");
    let id = posted.id;
    assert!(matches!(client.poll(id), TransferState::Done));
    assert_eq!(dst, src, "the bytes are in place once it reads done");
    let mut notes = Vec::new();
    server
        .drain_notifications(&mut |n| notes.push(n.payload.to_vec()))
        .unwrap();
    assert_eq!(notes, [b"key".to_vec()]);
    assert!(matches!(client.release(id), Ok(Release::LetGo)));
    for never in [TransferId(0), TransferId(id.0 ^ (1 << 63))] {
        match client.poll(never) {
            TransferState::Failed(cause) => {
                assert!(cause.to_string().contains("unknown transfer"), "{cause}")
            }
            other => panic!("transfer {} was never posted, yet reads {other:?}", never.0),
        }
    }
}

/// Exposures are bound to their operation's notification key, below the
/// connector: one agent's metadata is the same for every exposure, a key
/// reaches only its own exposure (and only while it is live), a silent
/// transfer moves the bytes without telling the peer, and an exposure
/// needs a key of its own.
#[test]
fn exposures_are_reached_through_their_notification_key() {
    use descriptor_core::{
        Exposed, PeerTarget, RegionId, RegistrationBackend, Segment, Target, TransferRequest,
        TransferState,
    };
    // Declared first, so dropped last: the backends go before the buffers.
    let first = pattern(36, 4096);
    let second = pattern(37, 4096);
    let mut dst = vec![0u8; 4096];
    let (server, client) = agents();
    let (one, two) = (page(first.as_ptr()), page(second.as_ptr()));
    let local = page(dst.as_mut_ptr());
    // SAFETY: as below: `dst` outlives the backends and is only written by
    // copies that end inside `post`.
    let target = unsafe { client.register(&local, true).unwrap() };
    let read = |remote: Segment, key: &[u8], notify: bool| {
        let request = TransferRequest {
            op: OperationKind::Read,
            local: &[local],
            local_regions: &[target],
            target: Target::Peer(PeerTarget {
                peer: "server",
                remote: &[remote],
                notification: key,
                notify,
            }),
        };
        // SAFETY: every buffer outlives the backends (declared before them);
        // `dst` is registered writable and only written by the copy, which
        // ends inside `post`.
        unsafe { client.post(&request) }
    };
    let mut notes = Vec::new();
    let mut drain = || {
        notes.clear();
        server
            .drain_notifications(&mut |n| notes.push((n.payload.to_vec(), n.exposure)))
            .unwrap();
        std::mem::take(&mut notes)
    };
    // SAFETY: as above; the sources are registered read-only, only read.
    let (a, b) = unsafe {
        let whole = |region: RegionId, segment: Segment| [Exposed { region, segment }];
        let (r1, r2) = (
            whole(server.register(&one, false).unwrap(), one),
            whole(server.register(&two, false).unwrap(), two),
        );
        let a = server.expose(&r1, OperationKind::Read, b"key-a").unwrap();
        let b = server.expose(&r2, OperationKind::Read, b"key-b").unwrap();
        let taken = server.expose(&r2, OperationKind::Read, b"key-a");
        assert!(
            taken.is_err_and(|e| e.to_string().contains("already has that notification key")),
            "a second exposure under a live key"
        );
        let keyless = server.expose(&r2, OperationKind::Read, b"");
        assert!(keyless.is_err(), "an exposure without a key");
        (a, b)
    };
    assert_eq!(
        a.agent_metadata, b.agent_metadata,
        "the metadata names the agent, not the exposure"
    );
    client.load_remote(&a.agent_metadata).unwrap();
    // B's key does not reach A's memory, and nothing moves.
    match read(one, b"key-b", true) {
        Err(Error::AccessDenied { reason, .. }) => {
            assert!(reason.contains("notification key names"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(dst.iter().all(|&x| x == 0) && drain().is_empty());
    // A's key does, and the peer learns which exposure the transfer reached.
    let posted = read(one, b"key-a", true).unwrap();
    assert!(matches!(posted.state, TransferState::Done));
    assert!(matches!(client.poll(posted.id), TransferState::Done));
    assert_eq!(dst, first);
    assert_eq!(drain(), [(b"key-a".to_vec(), Some(a.id))]);
    // A silent transfer moves the bytes and tells nobody.
    let posted = read(two, b"key-b", false).unwrap();
    assert!(matches!(posted.state, TransferState::Done));
    assert!(matches!(client.poll(posted.id), TransferState::Done));
    assert_eq!(dst, second);
    assert!(drain().is_empty());
    // Revoked, a key reaches nothing.
    server.revoke(b.id).unwrap();
    assert!(matches!(
        read(two, b"key-b", true),
        Err(Error::AccessDenied { .. })
    ));
}

/// Range checks do not depend on where a range sits in the request: the
/// remote ranges may come in another order than the exposure listed them,
/// or lie inside a region rather than match it, and a local range may lie
/// in a region that overlaps another. A range that crosses a region's end is
/// refused, wherever it sits.
#[test]
fn ranges_are_checked_wherever_they_sit_in_the_request() {
    use descriptor_core::{
        Exposed, PeerTarget, RegistrationBackend, Segment, Target, TransferRequest, TransferState,
    };
    // Declared first, so dropped last: the backends go before the buffers.
    let sources: Vec<Vec<u8>> = (40..43).map(|seed| pattern(seed, 4096)).collect();
    let mut dst = vec![0u8; 3 * 4096];
    let (server, client) = agents();
    let remote: Vec<Segment> = sources.iter().map(|s| page(s.as_ptr())).collect();
    let base = dst.as_mut_ptr();
    let whole = Segment {
        len: 3 * 4096,
        ..page(base)
    };
    // SAFETY: as in the tests above: every buffer outlives the backends, the
    // sources are registered read-only and only read, `dst` is registered
    // writable (whole, and its middle page on its own: overlapping) and only
    // written by copies that end inside `post`.
    let (whole_region, middle_region) = unsafe {
        let ranges: Vec<Exposed> = remote
            .iter()
            .map(|&segment| Exposed {
                region: server.register(&segment, false).unwrap(),
                segment,
            })
            .collect();
        let whole_region = client.register(&whole, true).unwrap();
        let middle_region = client.register(&page(base.add(4096)), true).unwrap();
        let exposed = server
            .expose(&ranges, OperationKind::Read, b"ranges")
            .unwrap();
        client.load_remote(&exposed.agent_metadata).unwrap();
        (whole_region, middle_region)
    };
    let read = |local: &[Segment], remote: &[Segment]| {
        let local_regions = vec![whole_region; local.len()];
        let request = TransferRequest {
            op: OperationKind::Read,
            local,
            local_regions: &local_regions,
            target: Target::Peer(PeerTarget {
                peer: "server",
                remote,
                notification: b"ranges",
                notify: false,
            }),
        };
        // SAFETY: as above.
        unsafe { client.post(&request) }
    };
    let at = |offset: usize, len: usize| Segment {
        // SAFETY: `offset + len` stays inside `dst`.
        addr: unsafe { base.add(offset) }.expose_provenance(),
        len,
        device: Device::HOST,
    };
    // The exposure's third, first and second page, into dst's three pages.
    let locals = [at(0, 4096), at(4096, 4096), at(8192, 4096)];
    let posted = read(&locals, &[remote[2], remote[0], remote[1]]).unwrap();
    assert!(matches!(posted.state, TransferState::Done));
    assert!(matches!(client.poll(posted.id), TransferState::Done));
    for (page, seed) in dst.chunks(4096).zip([42, 40, 41]) {
        assert_eq!(page, pattern(seed, 4096).as_slice());
    }
    // Part of the second page, into a local range that starts inside the
    // middle region but ends past it: only the whole region holds it, and a
    // request naming the middle one is refused.
    let inside = Segment {
        addr: remote[1].addr + 100,
        len: 3900,
        ..remote[1]
    };
    let misnamed = TransferRequest {
        op: OperationKind::Read,
        local: &[at(5000, 3900)],
        local_regions: &[middle_region],
        target: Target::Peer(PeerTarget {
            peer: "server",
            remote: &[inside],
            notification: b"ranges",
            notify: false,
        }),
    };
    // SAFETY: as above; refused before anything is copied.
    let refused = unsafe { client.post(&misnamed) };
    assert!(
        refused.is_err_and(|e| e.to_string().contains("not inside region")),
        "a local range outside the region its request names"
    );
    let posted = read(&[at(5000, 3900)], &[inside]).unwrap();
    assert!(matches!(posted.state, TransferState::Done));
    assert!(matches!(client.poll(posted.id), TransferState::Done));
    assert_eq!(&dst[5000..8900], &pattern(41, 4096)[100..4000]);
    // Across the end of the first page, at any index: refused.
    let head = |r: &Segment| Segment { len: 200, ..*r };
    let crossing = Segment {
        addr: remote[0].addr + 4000,
        ..head(&remote[0])
    };
    for index in 0..2 {
        let mut remotes = [head(&remote[1]), head(&remote[2])];
        remotes[index] = crossing;
        match read(&[at(0, 200), at(4096, 200)], &remotes) {
            Err(Error::AccessDenied { reason, .. }) => {
                assert!(
                    reason.contains(&format!("remote descriptor {index}")),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The peer's metadata is loaded once: every later operation to it finds it
/// in the connector's remote cache, since it no longer changes per exposure.
#[test]
fn one_load_serves_every_operation_to_a_peer() {
    let fabric = Fabric::new();
    let (server, _) = connector(&fabric, "server");
    let loads = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&loads);
    let (client, _) = common::hooked(&fabric, "client", true, move |_, call| {
        if call == common::Call::LoadRemote {
            counted.fetch_add(1, Ordering::Relaxed);
        }
        None
    });
    for seed in 40..45 {
        let readable = server.create_readable(filled(seed, 4096)).unwrap();
        let read = client
            .begin_read(readable.metadata(), zeroed(4096))
            .unwrap();
        read.wait_timeout(LONG).unwrap();
        readable.wait_timeout(LONG).unwrap();
        let back = read.into_descriptors().unwrap();
        assert_eq!(back[0].as_slice().unwrap(), pattern(seed, 4096).as_slice());
    }
    assert_eq!(loads.load(Ordering::Relaxed), 1, "load_remote calls");
}
