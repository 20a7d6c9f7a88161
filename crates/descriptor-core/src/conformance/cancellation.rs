//! Conformance checks of operations cut short: cancelled before or after
//! they complete, dropped in flight, stalled, failed by an injected fault, or
//! cancelled while their transfer completes. Each moves all its bytes or
//! none, agrees with its status, and hands its memory back only once the
//! backend let go of it.

use std::time::Duration;

use crate::testing::eventually;
use crate::{Error, OperationStatus};

use super::{
    Harness, StalledRead, WAIT, assert_pattern, assert_zeroed, connector, descriptors, faulty,
    pattern, returned, stalled_read, zeroed,
};

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

/// A stalled transfer is `InProgress`, holds its peer, then completes with
/// every byte.
pub fn stalled_transfer_is_in_progress_then_complete(h: &dyn Harness) {
    let StalledRead {
        client,
        readable,
        read,
        stall,
    } = stalled_read(h, "slow-server", faulty(h, "slow-client"), 10, 65536);
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
