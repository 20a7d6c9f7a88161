//! Regression tests from the review (issue "Hardening", defects 1, 6 and 7):
//! panics in the middle of dropping an operation must not free its buffers
//! while the transfer is still in flight (it did: a use-after-free), a
//! panicking waker must not stop the progress engine, and a pending operation
//! keeps one waker per future. `cargo xtask test` also runs this file under
//! AddressSanitizer, which reports a use-after-free directly.
#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use backend_loopback::{Fabric, LoopbackBackend};
use common::{Call, hooked};
use descriptor_core::conformance::filled;
use descriptor_core::faults::{Faults, Stall};
use descriptor_core::{
    Connector, Descriptor, OperationStatus, ReadableOperation, RegistrationBackend, Release,
};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// `release` panics once (a backend bug, e.g. an unwrap on an FFI error).
    PanicOnRelease,
    /// NIXL's documented behaviour: `release` of a transfer still in progress
    /// returns `Release::StillRunning` ("cannot abort, will finish"); conforming to the trait.
    NixlLikeRelease,
    /// Like NIXL: no event hook, the engine must poll.
    Polled,
}

/// A loopback agent that behaves as `mode` says.
fn wrapped(fabric: &Fabric, name: &str, mode: Mode) -> (Connector, Faults) {
    let armed = AtomicBool::new(true);
    hooked(fabric, name, mode != Mode::Polled, move |inner, call| {
        let Call::Release(transfer) = call else {
            return None;
        };
        match mode {
            Mode::PanicOnRelease if armed.swap(false, Ordering::SeqCst) => {
                panic!("backend bug: release panicked")
            }
            Mode::NixlLikeRelease if inner.poll(transfer).is_in_progress() => {
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

const N: usize = 512; // a tcache-sized block: the next malloc(512) reuses it

/// Runs `end_op` (which drops or cancels a read whose stalled transfer is
/// still to run; `panics` says whether a panic is expected to come out of
/// it), then allocates a same-sized victim, lets the transfer run, and checks
/// that it did not write into the victim.
fn check_no_write_after_free(
    end_op: impl FnOnce(),
    panics: bool,
    stall: Stall,
    readable: &ReadableOperation,
) {
    let r = catch_unwind(AssertUnwindSafe(end_op));
    assert_eq!(r.is_err(), panics, "did the operation's end panic?");
    // Often at the very address of the read's buffer, had it been freed.
    let victim = vec![0xAAu8; N];
    stall.release();
    // The readable completes once the transfer has copied and notified.
    readable.wait_timeout(Duration::from_secs(10)).unwrap();
    let changed = victim.iter().filter(|&&b| b != 0xAA).count();
    assert_eq!(
        changed, 0,
        "{changed} bytes of an unrelated live Vec were overwritten by the cancelled transfer"
    );
}

/// Defect 1 (unsound): `OperationCore::drop` called `finish` first and
/// `adopt`ed the descriptors after; when the backend's `release` panicked in
/// between, the unwinding drop glue freed the descriptors of a transfer that
/// was never released. The panic still comes out of `drop`; the memory leaks.
#[test]
fn panic_in_release_does_not_free_in_flight_memory() {
    let fabric = Fabric::new();
    let server = Connector::new(LoopbackBackend::new(&fabric, "server").unwrap());
    let (client, faults) = wrapped(&fabric, "client", Mode::PanicOnRelease);
    let readable = server.create_readable(filled(7, N)).unwrap();
    let stall = faults.stall_next_transfer();
    let local = Descriptor::new(vec![0u8; N]).unwrap();
    let read = client.begin_read(readable.metadata(), vec![local]).unwrap();
    assert_eq!(read.status(), OperationStatus::InProgress);
    check_no_write_after_free(move || drop(read), true, stall, &readable);
}

/// Defect 1 (unsound, safe user code + a trait-conforming NIXL-like backend):
/// a stale waker (from a `completion()` future dropped by a timeout) panicked
/// when the dropped operation was cancelled; `release` had returned `Release::StillRunning`
/// (Draining), yet the descriptors were freed during unwinding. A dropped
/// future now takes its waker with it, so nothing panics, and the memory
/// stays held until the transfer drains.
#[test]
fn panicking_waker_does_not_free_draining_memory() {
    let fabric = Fabric::new();
    let server = Connector::new(LoopbackBackend::new(&fabric, "server").unwrap());
    let (client, faults) = wrapped(&fabric, "client", Mode::NixlLikeRelease);
    let readable = server.create_readable(filled(8, N)).unwrap();
    let stall = faults.stall_next_transfer();
    let local = Descriptor::new(vec![0u8; N]).unwrap();
    let read = client.begin_read(readable.metadata(), vec![local]).unwrap();
    {
        let mut completion = read.completion();
        let waker = Waker::from(Arc::new(PanicWake));
        assert!(matches!(
            Pin::new(&mut completion).poll(&mut Context::from_waker(&waker)),
            Poll::Pending
        ));
    } // the Completion is gone, and its waker with it
    check_no_write_after_free(move || drop(read), false, stall, &readable);
}

/// Defect 1, with the waker still registered: a live future's waker panics
/// when another thread cancels the operation while the backend cannot let go
/// yet (Draining). The panic is contained (logged) and the buffers stay held
/// until the transfer has drained.
#[test]
fn panicking_waker_of_a_live_future_does_not_free_draining_memory() {
    let fabric = Fabric::new();
    let server = Connector::new(LoopbackBackend::new(&fabric, "server").unwrap());
    let (client, faults) = wrapped(&fabric, "client", Mode::NixlLikeRelease);
    let readable = server.create_readable(filled(9, N)).unwrap();
    let stall = faults.stall_next_transfer();
    let local = Descriptor::new(vec![0u8; N]).unwrap();
    let read = client.begin_read(readable.metadata(), vec![local]).unwrap();
    check_no_write_after_free(
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

/// Defect 6 (hang): a waker that panicked on the engine thread killed it;
/// `thread` stayed `Some`, so it was never restarted and later passive
/// operations on a polled backend (NIXL) never completed unless someone was
/// blocked in `wait` at the moment the notification arrived.
#[test]
fn panicking_waker_does_not_stop_the_engine() {
    let fabric = Fabric::new();
    let (server, _) = wrapped(&fabric, "server", Mode::Polled);
    let client = Connector::new(LoopbackBackend::new(&fabric, "client").unwrap());

    let r1 = server.create_readable(filled(1, 64)).unwrap();
    let waker = Waker::from(Arc::new(PanicWake));
    // Kept alive, so the engine thread (nobody waits) wakes it when r1 completes.
    let mut pending = r1.completion();
    assert!(
        Pin::new(&mut pending)
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    let read1 = client
        .begin_read(r1.metadata(), vec![Descriptor::new(vec![0u8; 64]).unwrap()])
        .unwrap();
    read1.wait().unwrap();
    eventually(|| r1.status() == OperationStatus::Complete);
    drop(pending);

    let r2 = server.create_readable(filled(2, 64)).unwrap();
    let read2 = client
        .begin_read(r2.metadata(), vec![Descriptor::new(vec![0u8; 64]).unwrap()])
        .unwrap();
    read2.wait().unwrap();
    // Nobody waits on r2: only the engine can drain its notification.
    eventually(|| r2.status() == OperationStatus::Complete);
    assert_eq!(
        r2.into_descriptors().unwrap()[0].as_slice().unwrap(),
        filled(2, 64)[0].as_slice().unwrap()
    );
}

/// Polls `condition` for up to 10 s (a bound, not a timing assertion).
fn eventually(condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "condition never held");
        std::thread::sleep(Duration::from_millis(1));
    }
}

static LIVE_WAKERS: AtomicUsize = AtomicUsize::new(0);
struct Counted;
impl Counted {
    fn new() -> Arc<Counted> {
        LIVE_WAKERS.fetch_add(1, Ordering::SeqCst);
        Arc::new(Counted)
    }
}
impl Drop for Counted {
    fn drop(&mut self) {
        LIVE_WAKERS.fetch_sub(1, Ordering::SeqCst);
    }
}
impl Wake for Counted {
    fn wake(self: Arc<Self>) {}
}

/// Defect 7 (leak): `poll_done` kept every distinct waker it was ever polled
/// with, not just the latest one, until the operation ended.
#[test]
fn repolling_with_new_wakers_keeps_a_bounded_number() {
    let fabric = Fabric::new();
    let server = Connector::new(LoopbackBackend::new(&fabric, "server").unwrap());
    let readable = server.create_readable(filled(3, 64)).unwrap();
    for _ in 0..100_000 {
        let waker = Waker::from(Counted::new());
        let mut c = readable.completion();
        assert!(
            Pin::new(&mut c)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
    }
    let live = LIVE_WAKERS.load(Ordering::SeqCst);
    assert!(live <= 1, "{live} wakers retained by one pending operation");
}

/// Defect 7, one future: re-polled with a new waker each time, it keeps only
/// the latest, and dropping it releases that one too.
#[test]
fn one_future_repolled_with_new_wakers_keeps_only_the_latest() {
    static LIVE: AtomicUsize = AtomicUsize::new(0);
    struct Tracked;
    impl Wake for Tracked {
        fn wake(self: Arc<Self>) {}
    }
    impl Drop for Tracked {
        fn drop(&mut self) {
            LIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let fabric = Fabric::new();
    let server = Connector::new(LoopbackBackend::new(&fabric, "server").unwrap());
    let readable = server.create_readable(filled(4, 64)).unwrap();
    let mut completion = readable.completion();
    for _ in 0..10_000 {
        LIVE.fetch_add(1, Ordering::SeqCst);
        let waker = Waker::from(Arc::new(Tracked));
        assert!(
            Pin::new(&mut completion)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
    }
    assert_eq!(LIVE.load(Ordering::SeqCst), 1, "the latest waker only");
    drop(completion);
    assert_eq!(
        LIVE.load(Ordering::SeqCst),
        0,
        "a dropped future keeps no waker"
    );
}
