//! With NIXL's progress thread on, a connector's own transfers go out through
//! a second agent, `<name>.initiator`, that runs no NIXL thread; peers reach
//! the agent called `<name>`, which also sends the notifications of the
//! transfers (once each transfer is done; the first transfers to a peer go
//! through `<name>`, carrying their notification). Driven through the
//! backend trait, so that the sender of each notification can be read.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_nixl::NixlBackend;
use descriptor_core::{
    Device, Exposed, OperationKind, PeerTarget, RegistrationBackend, Release, Segment, Target,
    TransferRequest, TransferState,
};
use test_support::pattern;

const BOUND: Duration = Duration::from_secs(10);

fn segment(buf: &mut [u8]) -> Segment {
    Segment {
        addr: buf.as_mut_ptr().expose_provenance(),
        len: buf.len(),
        device: Device::HOST,
    }
}

/// How the test follows the initiator's transfer.
#[derive(PartialEq)]
enum Follow {
    /// Polls it, asking the target for notifications in the same loop.
    Poll,
    /// Hands it to the initiator's watcher (`awaiting_end`, as a connector does
    /// when one waits on the operation), and leaves it alone until the
    /// target has the notification: only the watcher may move it on. (Not
    /// handed over, a small transfer that is not done at its post waits
    /// for a look; the first one through the initiating agent to a peer,
    /// which here follows the serving agent's first, was not, in 27 of 30
    /// runs.)
    HandsOff,
}

/// WRITEs `len` bytes from `from` into memory `to` exposed, checks that `to`
/// received one notification, carrying the key, and that the bytes were in
/// place when it arrived (the passive side must never see the notification
/// before the data), and returns the notification's sender.
fn write_once(from: &NixlBackend, to: &NixlBackend, len: usize, follow: Follow) -> Arc<str> {
    // Should an assertion fail while the transfer may still run, the buffers
    // are leaked, not freed under it: they are dropped only at the end.
    let mut target = ManuallyDrop::new(vec![0u8; len]);
    let mut source = ManuallyDrop::new(pattern(7, len));
    let (target_seg, source_seg) = (segment(&mut target), segment(&mut source));
    // SAFETY: both buffers outlive their registrations: they are revoked and
    // deregistered below, after the transfer ended, before the buffers drop
    // (or are leaked, on a failed assertion).
    let (target_region, source_region, exposure) = unsafe {
        let target_region = to.register(&target_seg, true).unwrap();
        let exposure = to
            .expose(
                &[Exposed {
                    region: target_region,
                    segment: target_seg,
                }],
                OperationKind::Write,
                b"key",
            )
            .unwrap();
        let source_region = from.register(&source_seg, false).unwrap();
        (target_region, source_region, exposure)
    };
    let peer = from.load_remote(&exposure.agent_metadata).unwrap();
    assert_eq!(peer, to.agent_name());
    let request = TransferRequest {
        op: OperationKind::Write,
        local: &[source_seg],
        local_regions: &[source_region],
        target: Target::Peer(PeerTarget {
            peer: &peer,
            remote: &[target_seg],
            notification: b"key",
            notify: true,
        }),
    };
    // SAFETY: the local segment is registered with `from` above, and the
    // buffer lives until the transfer has ended and was released (below).
    let posted = unsafe { from.post(&request) }.unwrap();
    if follow == Follow::HandsOff {
        from.awaiting_end(posted.id);
    }
    let started = Instant::now();
    let mut got = Vec::new();
    // A target without NIXL's thread (and with no connector's watcher)
    // progresses only when asked for notifications: ask in the same loop.
    let ended = |state| !matches!(state, TransferState::InProgress);
    while follow == Follow::Poll && !ended(from.poll(posted.id)) {
        assert!(started.elapsed() < BOUND, "the WRITE never ended");
        to.drain_notifications(&mut |n| got.push(n)).unwrap();
        std::thread::yield_now();
    }
    while got.is_empty() {
        assert!(started.elapsed() < BOUND, "no notification arrived");
        to.drain_notifications(&mut |n| got.push(n)).unwrap();
        if got.is_empty() {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    // Read through the segment's address, as the peer wrote it: the
    // notification arrived, so the WRITE is over (else the test fails here).
    // SAFETY: the target buffer is alive (leaked on a failed assertion) and
    // `len` bytes long.
    let landed = unsafe {
        std::slice::from_raw_parts(
            std::ptr::with_exposed_provenance::<u8>(target_seg.addr),
            len,
        )
        .to_vec()
    };
    while !ended(from.poll(posted.id)) {
        assert!(started.elapsed() < BOUND, "the WRITE never ended");
        std::thread::yield_now();
    }
    assert!(matches!(from.poll(posted.id), TransferState::Done));
    assert_eq!(from.release(posted.id).unwrap(), Release::LetGo);
    assert_eq!(got.len(), 1);
    to.revoke(exposure.id).unwrap();
    to.deregister(target_region).unwrap();
    from.deregister(source_region).unwrap();
    drop(ManuallyDrop::into_inner(source));
    drop(ManuallyDrop::into_inner(target));
    let notification = got.remove(0);
    assert_eq!(&*notification.payload, b"key");
    assert!(landed == pattern(7, len), "the bytes in place differ");
    notification.from
}

/// Two backends, `<test>-<pid>-a` and `-b`, with NIXL's thread on (the
/// default) or off; `None`, and the test skipped, without a NIXL runtime
/// (unless `NIXL_TESTS_REQUIRED` is set: `runtime_available` then fails it).
fn pair(test: &str, progress_thread: bool) -> Option<(String, NixlBackend, NixlBackend)> {
    if !test_support::runtime_available() {
        return None;
    }
    let name = format!("{test}-{}", std::process::id());
    let build = |side: &str| {
        NixlBackend::builder(&format!("{name}-{side}"))
            .progress_thread(progress_thread)
            .build()
            .unwrap()
    };
    let (a, b) = (build("a"), build("b"));
    Some((name, a, b))
}

/// Either way the notification comes from `<name>`: the first transfer to
/// the peer goes out through `<name>` with its notification attached (which
/// proves `<name>`'s endpoint to the peer); the next one through
/// `<name>.initiator`, its notification sent by `<name>` once the transfer
/// is done (so that the initiating agent's endpoint carries no message that
/// its next flush would wait on).
#[test]
fn transfers_go_out_through_a_threadless_second_agent_and_the_first_notifies() {
    let Some((name, a, b)) = pair("initiator-test", true) else {
        return;
    };
    assert_eq!(a.agent_name(), format!("{name}-a"));
    for follow in [Follow::Poll, Follow::HandsOff] {
        if follow == Follow::HandsOff {
            // The hook starts the watcher, as a connector does.
            assert!(a.set_event_hook(Arc::new(|| {})));
        }
        let from = write_once(&a, &b, 4096, follow);
        assert_eq!(&*from, format!("{name}-a"));
    }
}

/// A transfer to memory the backend itself exposed: its serving agent cannot
/// load itself as a peer, so the transfer carries its notification, which
/// then comes from `<name>.initiator`.
#[test]
fn a_transfer_to_itself_carries_its_notification() {
    let Some((name, a, _)) = pair("self-test", true) else {
        return;
    };
    let from = write_once(&a, &a, 4096, Follow::Poll);
    assert_eq!(&*from, format!("{name}-a.initiator"));
}

#[test]
fn without_nixls_thread_one_agent_does_both() {
    let Some((name, a, b)) = pair("one-agent-test", false) else {
        return;
    };
    let from = write_once(&a, &b, 4096, Follow::Poll);
    assert_eq!(&*from, format!("{name}-a"));
}

/// A transfer of more than 64 KiB is handed to the initiator's watcher when
/// it is posted: the initiating agent runs no NIXL thread, so nothing else
/// would move it on (and send its notification) while nobody waits, polls or
/// cancels. (A smaller one is handed over only then, or at the connector's
/// safety poll, which this test, below the connector, does not have.)
#[test]
fn a_large_write_nobody_follows_is_moved_on_by_the_watcher() {
    let Some((name, a, b)) = pair("hands-off-test", true) else {
        return;
    };
    // The hook starts the watcher, as a connector does.
    assert!(a.set_event_hook(Arc::new(|| {})));
    let len = 1 << 20;
    let from = write_once(&a, &b, len, Follow::HandsOff);
    assert_eq!(&*from, format!("{name}-a"));
}

/// The first transfer to a peer, its backend dropped as soon as the
/// transfer ended: the peer still gets the notification (sent by the serving
/// agent, which is new to the peer and goes away with the backend).
#[test]
fn the_notification_outlives_an_initiator_dropped_at_once() {
    let Some((_, a, b)) = pair("drop-test", true) else {
        return;
    };
    let len = 4096;
    let mut target = ManuallyDrop::new(vec![0u8; len]);
    let mut source = ManuallyDrop::new(pattern(9, len));
    let (target_seg, source_seg) = (segment(&mut target), segment(&mut source));
    // SAFETY: both buffers outlive their registrations: `b`'s is revoked and
    // deregistered below, `a`'s goes with `a`, dropped once its transfer
    // ended (the buffers are leaked on a failed assertion).
    let (target_region, source_region, exposure) = unsafe {
        let target_region = b.register(&target_seg, true).unwrap();
        let exposure = b
            .expose(
                &[Exposed {
                    region: target_region,
                    segment: target_seg,
                }],
                OperationKind::Write,
                b"bye",
            )
            .unwrap();
        let source_region = a.register(&source_seg, false).unwrap();
        (target_region, source_region, exposure)
    };
    let peer = a.load_remote(&exposure.agent_metadata).unwrap();
    let request = TransferRequest {
        op: OperationKind::Write,
        local: &[source_seg],
        local_regions: &[source_region],
        target: Target::Peer(PeerTarget {
            peer: &peer,
            remote: &[target_seg],
            notification: b"bye",
            notify: true,
        }),
    };
    // SAFETY: the local segment is registered with `a` above, and the buffer
    // lives until the transfer has ended and `a` is gone (below).
    let posted = unsafe { a.post(&request) }.unwrap();
    let started = Instant::now();
    while matches!(a.poll(posted.id), TransferState::InProgress) {
        assert!(started.elapsed() < BOUND, "the WRITE never ended");
        std::thread::yield_now();
    }
    assert!(matches!(a.poll(posted.id), TransferState::Done));
    assert_eq!(a.release(posted.id).unwrap(), Release::LetGo);
    drop(a);
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(
            started.elapsed() < BOUND,
            "the notification never arrived once the initiator was dropped"
        );
        b.drain_notifications(&mut |n| got.push(n)).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(&*got[0].payload, b"bye");
    b.revoke(exposure.id).unwrap();
    b.deregister(target_region).unwrap();
    assert!(*target == pattern(9, len), "the bytes in place differ");
    drop(ManuallyDrop::into_inner(source));
    drop(ManuallyDrop::into_inner(target));
}
