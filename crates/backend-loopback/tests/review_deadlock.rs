//! Regression tests from the review (issue "Hardening", defects 3, 4, 5):
//! deadlocks. Each scenario runs in a worker thread; the test thread waits
//! with a bound, so a deadlock fails the test instead of hanging the harness.
//! Fixed by calling no backend, hook or waker with a lock held (the fault
//! wrapper's delay thread posts outside its lock; the operation lock is never
//! held across `poll`/`release`/`revoke`; wakers are woken after unlocking).
#![allow(clippy::unwrap_used, clippy::panic)]

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::conformance::{filled, zeroed_one};
use descriptor_core::faults::Faulty;
use descriptor_core::{Connector, OperationFuture};

/// How long a scenario may take before the test calls it a deadlock, and how
/// long each wait inside it may last: far beyond what they need (a few
/// seconds under AddressSanitizer), so a busy machine cannot fail them.
const BOUND: Duration = Duration::from_secs(90);
const WAIT: Duration = Duration::from_secs(40);

/// Runs `f` on a thread; returns its result, or None if it did not finish in `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// Defect: a connector READing its own readable with a delayed (fault-injected)
/// transfer. The delay thread holds the transfer's lock while the job notifies
/// its own agent, whose hook polls the same transfer: self-deadlock.
#[test]
fn self_read_with_delay_completes() {
    let done = within(BOUND, || {
        let fabric = Fabric::new();
        let backend = Faulty::new(LoopbackBackend::new(&fabric, "solo").unwrap());
        let faults = backend.faults();
        let c = Connector::new(backend);
        let readable = c.create_readable(filled(1, 4096)).unwrap();
        faults.delay_next_transfer(Duration::from_millis(50));
        let read = c.begin_read(readable.metadata(), zeroed_one(4096)).unwrap();
        let r = read.wait_timeout(WAIT);
        format!("{r:?}")
    });
    assert_eq!(
        done.as_deref(),
        Some("Ok(())"),
        "None = the worker never returned (deadlock: even wait_timeout blocks)"
    );
}

/// Defect: two connectors READ each other's readable with delayed transfers.
/// Each delay thread holds its own transfer lock, then (via the peer's event
/// hook) takes the peer's operation lock and waits for the peer's transfer
/// lock: ABBA deadlock between the two delay threads.
#[test]
fn crossed_delayed_reads_complete() {
    let done = within(BOUND, || {
        let fabric = Fabric::new();
        let ba = Faulty::new(LoopbackBackend::new(&fabric, "a").unwrap());
        let bb = Faulty::new(LoopbackBackend::new(&fabric, "b").unwrap());
        let (fa, fb) = (ba.faults(), bb.faults());
        let (a, b) = (Connector::new(ba), Connector::new(bb));
        const N: usize = 32 << 20;
        let ra = a.create_readable(filled(1, N)).unwrap();
        let rb = b.create_readable(filled(2, N)).unwrap();
        fa.delay_next_transfer(Duration::from_millis(200));
        fb.delay_next_transfer(Duration::from_millis(200));
        let read_a = a.begin_read(rb.metadata(), zeroed_one(N)).unwrap();
        let read_b = b.begin_read(ra.metadata(), zeroed_one(N)).unwrap();
        let x = read_a.wait_timeout(WAIT);
        let y = read_b.wait_timeout(WAIT);
        format!("{x:?} {y:?}")
    });
    assert_eq!(
        done.as_deref(),
        Some("Ok(()) Ok(())"),
        "None = the worker never returned (deadlock)"
    );
}

/// A waker that drops the task (here: the operation future) when woken, as
/// an executor does when it is shut down and a task is woken afterwards.
struct DropOnWake(Mutex<Option<OperationFuture>>);

impl Wake for DropOnWake {
    fn wake(self: Arc<Self>) {
        let fut = self.0.lock().unwrap().take();
        drop(fut);
    }
}

/// Defect: `finish_locked` wakes wakers while holding the operation's state
/// lock. A waker that drops (or polls, or queries) the operation re-enters that
/// lock: the thread that delivered the completion deadlocks. With loopback that
/// thread is the *peer's* `begin_read`, which never returns.
#[test]
fn waker_that_drops_the_operation_does_not_deadlock_the_peer() {
    let done = within(BOUND, || {
        let fabric = Fabric::new();
        let server = Connector::new(LoopbackBackend::new(&fabric, "server").unwrap());
        let client = Connector::new(LoopbackBackend::new(&fabric, "client").unwrap());
        let readable = server.create_readable(filled(3, 4096)).unwrap();
        let meta = readable.metadata().clone();
        let mut fut = readable.into_future();
        let wake = Arc::new(DropOnWake(Mutex::new(None)));
        let waker = Waker::from(Arc::clone(&wake));
        assert!(matches!(
            Pin::new(&mut fut).poll(&mut Context::from_waker(&waker)),
            Poll::Pending
        ));
        *wake.0.lock().unwrap() = Some(fut);
        // The client's READ completes inline and notifies the server, whose
        // engine hook finishes the readable and wakes `waker` in this thread.
        let read = client.begin_read(&meta, zeroed_one(4096)).unwrap();
        format!("{:?}", read.wait_timeout(WAIT))
    });
    assert_eq!(
        done.as_deref(),
        Some("Ok(())"),
        "None = client.begin_read never returned (deadlock in the server's waker)"
    );
}
