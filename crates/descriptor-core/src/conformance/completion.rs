//! Conformance checks of how each side learns that an operation ended: an
//! operation is a future; a passive operation completes however its owner
//! waits, times out while no peer acts, and keeps waiting when the peer's
//! notification is lost; an active operation nobody follows still ends.

use std::time::Duration;

use crate::testing::eventually;
use crate::{Error, OperationStatus};

use super::{Harness, WAIT, assert_pattern, connector, descriptors, faulty, returned, zeroed};

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
