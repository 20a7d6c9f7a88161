//! Conformance checks of panics and wakers: a backend or a waker that panics
//! never gets memory freed under a transfer, and stops nothing; an operation
//! keeps only the waker it needs. (`cargo xtask test` runs the loopback
//! suite under AddressSanitizer too, which reports a use-after-free
//! directly.)

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use crate::faults::{Faults, Stall};
use crate::testing::eventually;
use crate::{Connector, Error, OperationStatus, ReadableOperation, RegistrationBackend, Release};

use super::{
    Call, Harness, WAIT, assert_pattern, connector, descriptors, hooked_agent, stalled_read, zeroed,
};

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

/// A connector over the harness's agent `name`, [`Hooked`](super::Hooked) to
/// misbehave as `how` says.
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

/// A waker that panics when woken, as a buggy user waker does.
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
    let stalled = stalled_read(
        h,
        "release-panic-server",
        misbehaving(h, "release-panic-client", Misbehaves::PanicOnRelease),
        140,
        SMALL,
    );
    let read = stalled.read;
    assert_eq!(read.status(), OperationStatus::InProgress);
    no_write_after_free(move || drop(read), true, stalled.stall, &stalled.readable);
}

/// A stale waker that would panic (its `completion()` future dropped, as by
/// a timeout) and a backend that cannot abort: dropping the read panics
/// nowhere, and its memory stays held until the transfer drains.
pub fn a_dropped_future_takes_its_panicking_waker_with_it(h: &dyn Harness) {
    let stalled = stalled_read(
        h,
        "stale-waker-server",
        misbehaving(
            h,
            "stale-waker-client",
            Misbehaves::StillRunningWhileInProgress,
        ),
        141,
        SMALL,
    );
    let read = stalled.read;
    {
        let mut completion = read.completion();
        let waker = Waker::from(Arc::new(PanicWake));
        assert!(
            Pin::new(&mut completion)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
    } // the Completion is gone, and its waker with it
    no_write_after_free(move || drop(read), false, stalled.stall, &stalled.readable);
}

/// A live future's waker panics when another thread cancels the operation
/// while the backend cannot let go yet: the panic is contained (logged), the
/// status is `Cancelled`, and the buffers stay held until the transfer drains.
pub fn a_panicking_waker_of_a_live_future_frees_no_draining_memory(h: &dyn Harness) {
    let stalled = stalled_read(
        h,
        "live-waker-server",
        misbehaving(
            h,
            "live-waker-client",
            Misbehaves::StillRunningWhileInProgress,
        ),
        142,
        SMALL,
    );
    let read = stalled.read;
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
        stalled.stall,
        &stalled.readable,
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
