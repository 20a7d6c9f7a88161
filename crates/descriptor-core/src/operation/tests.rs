//! The operation state machine against the scripted backend: the paths a real
//! backend reaches only sometimes (draining, leaked, a backend or a waker that
//! panics or re-enters), each checked for "no memory freed before the backend
//! let go", "waiters are woken", "no hang" (bounded waits, never a timed
//! assertion).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use super::state::Pending;
use crate::backend::{Notification, RegistrationBackend, TransferState};
use crate::testing::{BOUND, Script, Scripted, eventually, within};
use crate::{
    Connector, Descriptor, Device, Error, OperationKind, OperationStatus, QuarantinePolicy,
    Quarantined, RdmaMetadata, ReadOperation, SerializedDescriptor,
};

fn connector(backend: &Arc<Scripted>) -> Connector {
    Connector::from_arc(Arc::clone(backend) as Arc<dyn RegistrationBackend>)
}

/// Metadata of a readable of `len` bytes on the scripted peer.
fn remote(len: usize) -> RdmaMetadata {
    RdmaMetadata::new(
        OperationKind::Read,
        vec![SerializedDescriptor {
            device: Device::HOST,
            ptr: 0x1000,
            size: len as u64,
        }],
        b"scripted agent".to_vec(),
        "key".into(),
    )
    .unwrap()
}

/// Asks for the buffers back until they come (within [`BOUND`]), checking
/// `meanwhile` after each refusal.
fn handed_back(mut read: ReadOperation, meanwhile: impl Fn()) -> Vec<Descriptor> {
    let deadline = Instant::now() + BOUND;
    loop {
        match read.into_descriptors() {
            Ok(back) => return back,
            Err(again) => {
                assert!(Instant::now() < deadline, "never handed back");
                meanwhile();
                read = again;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

#[test]
fn a_draining_transfer_keeps_its_memory_until_the_backend_lets_go() {
    let backend = Arc::new(Scripted::new(true, false));
    let c = connector(&backend);
    let (local, freed) = backend.tracked(512);
    backend.script_releases(&[Script::Busy, Script::Busy, Script::Busy]);
    let read = c.begin_read(&remote(512), vec![local]).unwrap();
    assert_eq!(read.status(), OperationStatus::InProgress);
    read.cancel();
    assert_eq!(read.status(), OperationStatus::Cancelled);
    assert!(matches!(read.wait(), Err(Error::Cancelled)));
    // The backend said "still running": no memory comes back yet.
    assert!(matches!(
        read.core.shared().pending(),
        Pending::Draining(_) | Pending::Releasing
    ));
    let read = read.into_descriptors().unwrap_err();
    drop(read);
    // The engine asks again until the backend lets go, then frees it.
    eventually("the drained memory is freed", || {
        freed.load(Ordering::SeqCst) == 1
    });
    assert!(backend.let_go());
    assert!(!backend.freed_early());
}

/// `wait_released` after a cancel returns once the draining transfer let
/// go (then the memory comes back), and says false while it has not.
#[test]
fn wait_released_waits_for_a_cancelled_transfer_to_drain() {
    let backend = Arc::new(Scripted::new(true, false));
    let c = connector(&backend);
    let (local, freed) = backend.tracked(64);
    backend.script_releases(&[Script::Busy, Script::Busy, Script::Busy]);
    let read = c.begin_read(&remote(64), vec![local]).unwrap();
    assert!(
        !read.wait_released(Duration::ZERO),
        "in flight: not released"
    );
    read.cancel();
    assert!(
        read.wait_released(Duration::from_secs(30)),
        "drained in time"
    );
    assert!(backend.let_go());
    let back = read.into_descriptors().unwrap();
    drop(back);
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    assert!(!backend.freed_early());
}

#[test]
fn a_draining_transfer_hands_its_memory_back_once_released() {
    let backend = Arc::new(Scripted::new(true, false));
    let c = connector(&backend);
    let (local, freed) = backend.tracked(64);
    backend.script_releases(&[Script::Busy]);
    let read = c.begin_read(&remote(64), vec![local]).unwrap();
    read.cancel();
    let back = handed_back(read, || {});
    assert!(backend.let_go());
    assert_eq!(back.len(), 1);
    drop(back);
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    assert!(!backend.freed_early());
}

/// A read of a tracked 64-byte buffer whose transfer `post` reports ended in
/// `state`, `release` then answering `releases` in turn: the backend, its
/// connector (kept alive), the read, and the count of frees of the buffer.
type EndedAtPost = (Arc<Scripted>, Connector, ReadOperation, Arc<AtomicUsize>);

fn read_ended_at_post(state: TransferState, releases: &[Script]) -> EndedAtPost {
    let backend = Arc::new(Scripted::new(true, false));
    backend.set_poll(state);
    backend.script_releases(releases);
    let c = connector(&backend);
    let (local, freed) = backend.tracked(64);
    let read = c.begin_read(&remote(64), vec![local]).unwrap();
    (backend, c, read, freed)
}

/// A transfer that ended inside `post` starts settled: released at once, its
/// memory back with no engine pass.
#[test]
fn a_transfer_done_at_post_hands_its_memory_back_at_once() {
    let (backend, _c, read, freed) = read_ended_at_post(TransferState::Done, &[]);
    assert_eq!(read.status(), OperationStatus::Complete);
    assert_eq!(read.core.shared().pending(), Pending::Nothing);
    assert_eq!(backend.live_transfers.load(Ordering::SeqCst), 0);
    read.wait().unwrap();
    let back = read.into_descriptors().unwrap();
    assert_eq!(back.len(), 1);
    drop(back);
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    assert!(!backend.freed_early());
}

/// Ended inside `post`, but the backend still holds it: complete for the
/// caller, while the engine asks again, and the memory comes back only once
/// the backend lets go.
#[test]
fn a_transfer_done_at_post_but_still_held_is_drained_before_its_memory_returns() {
    let (backend, _c, read, freed) =
        read_ended_at_post(TransferState::Done, &[Script::Busy, Script::Busy]);
    assert_eq!(read.status(), OperationStatus::Complete);
    read.wait().unwrap();
    let back = handed_back(read, || assert_eq!(freed.load(Ordering::SeqCst), 0));
    assert!(backend.let_go(), "handed back before the backend let go");
    drop(back);
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    assert!(!backend.freed_early());
}

/// Ended inside `post`, then lost by the backend: complete, and leaked.
#[test]
fn a_transfer_done_at_post_that_the_backend_lost_is_leaked() {
    let (_backend, c, read, freed) = read_ended_at_post(TransferState::Done, &[Script::Lost]);
    assert_eq!(read.status(), OperationStatus::Complete);
    assert_eq!(read.core.shared().pending(), Pending::Leaked);
    read.wait().unwrap();
    let read = read.into_descriptors().unwrap_err();
    drop(read);
    drop(c);
    assert_eq!(freed.load(Ordering::SeqCst), 0, "leaked memory was freed");
}

/// Failed inside `post`: the waiter gets the backend's reason, and the
/// memory comes back.
#[test]
fn a_transfer_failed_at_post_reports_why_and_hands_its_memory_back() {
    let (backend, _c, read, freed) =
        read_ended_at_post(TransferState::failed("scripted: the wire broke"), &[]);
    assert_eq!(read.status(), OperationStatus::Errored);
    let error = read.wait().unwrap_err();
    assert!(error.to_string().contains("the wire broke"), "{error}");
    drop(read.into_descriptors().unwrap());
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    assert!(!backend.freed_early());
}

/// `status()` turns terminal when the outcome is decided, before the deciding
/// thread has asked the backend to let go; `into_descriptors` then waits for
/// that thread instead of refusing an operation the caller saw `Complete`.
#[test]
fn an_operation_seen_complete_hands_its_memory_back_while_being_settled() {
    let backend = Arc::new(Scripted::new(true, false));
    let c = connector(&backend);
    let (local, _) = backend.tracked(64);
    let (open, gate) = mpsc::channel();
    *backend.release_gate.lock().unwrap() = Some(gate);
    let read = c.begin_read(&remote(64), vec![local]).unwrap();
    // The engine polls, decides `Complete` and blocks in `release`.
    backend.set_poll(TransferState::Done);
    eventually("the read is decided", || {
        read.status() == OperationStatus::Complete
    });
    assert_eq!(read.core.shared().pending(), Pending::Releasing);
    let handed = std::thread::spawn(move || read.into_descriptors().map(|d| d.len()));
    // Long enough for `into_descriptors` to be waiting (were it to refuse,
    // it would have returned by now; too short a pause only weakens the test).
    std::thread::sleep(Duration::from_millis(50));
    open.send(()).unwrap();
    let handed = within("into_descriptors", move || handed.join().unwrap());
    assert_eq!(handed.ok(), Some(1), "the memory did not come back");
    assert!(!backend.freed_early());
}

#[test]
fn a_transfer_the_backend_lost_is_leaked_never_freed() {
    let backend = Arc::new(Scripted::new(true, false));
    let c = connector(&backend);
    let (local, freed) = backend.tracked(64);
    backend.script_releases(&[Script::Lost]);
    let read = c.begin_read(&remote(64), vec![local]).unwrap();
    read.cancel();
    assert!(matches!(read.wait(), Err(Error::Cancelled)));
    let read = read.into_descriptors().unwrap_err();
    drop(read);
    drop(c); // joins the engine: nothing is left to free the memory later
    assert_eq!(freed.load(Ordering::SeqCst), 0, "leaked memory was freed");
}

#[test]
fn a_panic_in_release_leaks_the_memory_and_still_wakes_waiters() {
    let backend = Arc::new(Scripted::new(true, false));
    let c = connector(&backend);
    let (local, freed) = backend.tracked(64);
    backend.script_releases(&[Script::Panic]);
    let read = Arc::new(c.begin_read(&remote(64), vec![local]).unwrap());
    let waiter = {
        let read = Arc::clone(&read);
        std::thread::spawn(move || read.wait())
    };
    let cancelled = catch_unwind(AssertUnwindSafe(|| read.cancel()));
    assert!(
        cancelled.is_err(),
        "the backend's panic comes out of cancel"
    );
    assert_eq!(read.status(), OperationStatus::Cancelled);
    let waited = within("the waiter returns", move || waiter.join().unwrap());
    assert!(matches!(waited, Err(Error::Cancelled)), "{waited:?}");
    let read = Arc::into_inner(read).unwrap();
    let read = read.into_descriptors().unwrap_err();
    drop(read);
    drop(c);
    assert_eq!(
        freed.load(Ordering::SeqCst),
        0,
        "memory freed after a panic"
    );
}

#[test]
fn a_panic_in_release_while_dropping_leaks_the_memory() {
    let backend = Arc::new(Scripted::new(true, false));
    let c = connector(&backend);
    let (local, freed) = backend.tracked(64);
    backend.script_releases(&[Script::Panic]);
    let read = c.begin_read(&remote(64), vec![local]).unwrap();
    assert!(catch_unwind(AssertUnwindSafe(move || drop(read))).is_err());
    drop(c);
    assert_eq!(freed.load(Ordering::SeqCst), 0);
    assert!(!backend.freed_early());
}

#[test]
fn a_panic_in_poll_on_the_engine_thread_does_not_stop_the_engine() {
    let backend = Arc::new(Scripted::new(true, false));
    let c = connector(&backend);
    let first = c
        .begin_read(&remote(64), vec![Descriptor::new(vec![0u8; 64]).unwrap()])
        .unwrap();
    backend.poll_panics.store(true, Ordering::SeqCst);
    // Let the engine poll it (and panic) a few times.
    eventually("the engine polled", || {
        std::thread::sleep(Duration::from_millis(5));
        true
    });
    backend.poll_panics.store(false, Ordering::SeqCst);
    backend.set_poll(TransferState::Done);
    // Nobody waits: only the engine can see either transfer end.
    let second = c
        .begin_read(&remote(64), vec![Descriptor::new(vec![0u8; 64]).unwrap()])
        .unwrap();
    eventually("the engine completed both", || {
        first.status() == OperationStatus::Complete && second.status() == OperationStatus::Complete
    });
    assert!(second.into_descriptors().is_ok());
}

#[test]
fn a_passive_operation_cancelled_on_a_backend_that_cannot_revoke_leaks_without_a_quarantine() {
    let backend = Arc::new(Scripted::new(false, false));
    let c = Connector::builder_from_arc(Arc::clone(&backend) as Arc<dyn RegistrationBackend>)
        .quarantine(QuarantinePolicy::forever())
        .build();
    let (d, freed) = backend.tracked(64);
    let readable = c.create_readable(vec![d]).unwrap();
    readable.cancel();
    assert!(matches!(readable.wait(), Err(Error::Cancelled)));
    let readable = readable.into_descriptors().unwrap_err();
    drop(readable);
    drop(c);
    assert_eq!(
        freed.load(Ordering::SeqCst),
        0,
        "a peer might still write it"
    );
}

/// A connector over `backend` whose quarantine keeps abandoned memory for
/// `hold`, and at most `readable_bytes` of readables.
fn quarantining(backend: &Arc<Scripted>, hold: Duration, readable_bytes: usize) -> Connector {
    Connector::builder_from_arc(Arc::clone(backend) as Arc<dyn RegistrationBackend>)
        .quarantine(QuarantinePolicy::new(hold, readable_bytes))
        .build()
}

/// Ends a passive operation without its peer's word and drops it: cancelled,
/// timed out (then dropped), or dropped while waiting.
fn abandon<F: Fn() -> Result<(), Error>>(end: usize, cancel: impl FnOnce(), wait: F) {
    match end % 3 {
        0 => cancel(),
        1 => assert!(matches!(wait(), Err(Error::TimedOut(_)))),
        _ => {}
    }
}

#[test]
fn abandoned_readables_are_kept_until_their_bytes_exceed_the_budget_oldest_first() {
    let backend = Arc::new(Scripted::new(false, false));
    // Room for two readables of 64 bytes: the third pushes the first out.
    let c = quarantining(&backend, BOUND * 100, 128);
    let mut counters = Vec::new();
    for i in 0..4 {
        let (d, freed) = backend.tracked(64);
        counters.push(freed);
        let readable = c.create_readable(vec![d]).unwrap();
        abandon(
            i,
            || readable.cancel(),
            || readable.wait_timeout(Duration::from_millis(1)),
        );
        drop(readable);
        let frees: Vec<usize> = counters.iter().map(|f| f.load(Ordering::SeqCst)).collect();
        let kept = (i + 1).min(2);
        let expected: Vec<usize> = (0..=i).map(|j| usize::from(j + kept <= i)).collect();
        assert_eq!(frees, expected, "after {} abandoned", i + 1);
        let held = c.quarantined();
        assert_eq!(
            (held.exposures, held.bytes, held.readable_bytes),
            (kept, 64 * kept, 64 * kept)
        );
    }
    // What a connector that knows its peers are gone may free at once.
    assert_eq!(c.free_quarantined().bytes, 128);
    assert!(counters.iter().all(|f| f.load(Ordering::SeqCst) == 1));
    assert_eq!(c.quarantined(), Quarantined::default());
}

#[test]
fn abandoned_writables_are_kept_for_their_whole_window_whatever_the_readables_budget() {
    let backend = Arc::new(Scripted::new(false, false));
    let c = quarantining(&backend, Duration::from_millis(50), 0);
    let (d, freed) = backend.tracked(64);
    let writable = c.create_writable(vec![d]).unwrap();
    writable.cancel();
    drop(writable);
    let (d, freed_readable) = backend.tracked(32);
    drop(c.create_readable(vec![d]).unwrap());
    // The readable goes at once (a budget of 0 bytes); the writable stays.
    assert_eq!(freed_readable.load(Ordering::SeqCst), 1);
    assert_eq!(freed.load(Ordering::SeqCst), 0);
    let held = c.quarantined();
    assert_eq!(
        (held.exposures, held.bytes, held.readable_bytes),
        (1, 64, 0)
    );
    // Once its window is over, the next look frees it.
    eventually("the writable's window is over", || {
        c.quarantined().exposures == 0
    });
    assert_eq!(freed.load(Ordering::SeqCst), 1);
}

#[test]
fn a_quarantine_frees_what_is_due_when_a_new_exposure_is_made_and_leaks_the_rest_when_dropped() {
    let backend = Arc::new(Scripted::new(false, false));
    let c = quarantining(&backend, Duration::ZERO, usize::MAX);
    let (d, freed) = backend.tracked(64);
    drop(c.create_writable(vec![d]).unwrap());
    assert_eq!(
        freed.load(Ordering::SeqCst),
        1,
        "a window of 0 frees at once"
    );

    let c = quarantining(&backend, BOUND * 100, usize::MAX);
    let (d, kept) = backend.tracked(64);
    drop(c.create_writable(vec![d]).unwrap());
    drop(c);
    assert_eq!(
        kept.load(Ordering::SeqCst),
        0,
        "freed before its window was over"
    );
}

#[test]
fn a_passive_operation_completed_by_its_peer_hands_its_memory_back() {
    let backend = Arc::new(Scripted::new(false, false));
    let c = connector(&backend);
    let (d, freed) = backend.tracked(64);
    let readable = c.create_readable(vec![d]).unwrap();
    backend.inbox.lock().unwrap().push(Notification {
        from: "peer".into(),
        payload: readable.metadata().notification_key().as_bytes().into(),
        exposure: None,
    });
    readable.wait_timeout(BOUND).unwrap();
    let back = readable.into_descriptors().unwrap();
    drop(back);
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    assert!(!backend.freed_early());
}

#[test]
fn a_panic_in_revoke_leaks_the_memory_and_the_engine_serves_on() {
    let backend = Arc::new(Scripted::new(true, false));
    let c = connector(&backend);
    let (d, freed) = backend.tracked(64);
    let readable = c.create_readable(vec![d]).unwrap();
    backend.revoke_panics.store(true, Ordering::SeqCst);
    assert!(catch_unwind(AssertUnwindSafe(move || drop(readable))).is_err());
    backend.revoke_panics.store(false, Ordering::SeqCst);
    assert_eq!(freed.load(Ordering::SeqCst), 0);
    // The connector still completes passive operations.
    let next = c
        .create_readable(vec![Descriptor::new(vec![1u8; 8]).unwrap()])
        .unwrap();
    backend.inbox.lock().unwrap().push(Notification {
        from: "peer".into(),
        payload: next.metadata().notification_key().as_bytes().into(),
        exposure: None,
    });
    eventually("the engine completed it", || {
        next.status() == OperationStatus::Complete
    });
}

struct Counting(AtomicUsize);

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn every_future_waiting_on_one_operation_is_woken() {
    let backend = Arc::new(Scripted::new(true, false));
    let c = connector(&backend);
    let readable = c
        .create_readable(vec![Descriptor::new(vec![1u8; 8]).unwrap()])
        .unwrap();
    let wakers: Vec<Arc<Counting>> = (0..3)
        .map(|_| Arc::new(Counting(AtomicUsize::new(0))))
        .collect();
    let mut futures: Vec<_> = (0..3).map(|_| readable.completion()).collect();
    for (future, waker) in futures.iter_mut().zip(&wakers) {
        let waker = Waker::from(Arc::clone(waker));
        assert!(
            Pin::new(future)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
    }
    assert_eq!(readable.core.shared().waker_count(), 3);
    drop(futures.pop()); // a dropped future takes its waker along
    assert_eq!(readable.core.shared().waker_count(), 2);
    readable.cancel();
    assert_eq!(wakers[0].0.load(Ordering::SeqCst), 1);
    assert_eq!(wakers[1].0.load(Ordering::SeqCst), 1);
    assert_eq!(wakers[2].0.load(Ordering::SeqCst), 0);
    for future in &mut futures {
        let waker = Waker::from(Arc::clone(&wakers[0]));
        assert!(matches!(
            Pin::new(future).poll(&mut Context::from_waker(&waker)),
            Poll::Ready(Err(Error::Cancelled))
        ));
    }
}

/// A waker that runs `f` when woken: re-entrant user code on the thread that
/// completed the operation.
struct Reentrant(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl Wake for Reentrant {
    fn wake(self: Arc<Self>) {
        let f = self.0.lock().unwrap().take();
        if let Some(f) = f {
            f();
        }
    }
}

#[rstest::rstest]
#[case::reads_its_status("status")]
#[case::polls_it_again("poll")]
#[case::drops_it("drop")]
#[case::panics("panic")]
fn a_waker_that_re_enters_its_operation_does_not_deadlock(#[case] action: &'static str) {
    within(action, move || {
        let backend = Arc::new(Scripted::new(true, true));
        let c = connector(&backend);
        let read = c
            .begin_read(&remote(64), vec![Descriptor::new(vec![0u8; 64]).unwrap()])
            .unwrap();
        let slot: Arc<Mutex<Option<crate::OperationFuture>>> = Arc::default();
        let seen = Arc::new(Mutex::new(None));
        let wake = Arc::new(Reentrant(Mutex::new(None)));
        let waker = Waker::from(Arc::clone(&wake) as Arc<Reentrant>);
        let mut future = std::future::IntoFuture::into_future(read);
        assert!(
            Pin::new(&mut future)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        *slot.lock().unwrap() = Some(future);
        {
            let (slot, seen, waker) = (Arc::clone(&slot), Arc::clone(&seen), waker.clone());
            *wake.0.lock().unwrap() = Some(Box::new(move || {
                let mut future = slot.lock().unwrap().take().unwrap();
                match action {
                    "status" => {
                        let debug = format!("{future:?}");
                        *seen.lock().unwrap() = Some(debug.contains("Complete"));
                    }
                    "poll" => {
                        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
                        *seen.lock().unwrap() = Some(matches!(polled, Poll::Ready(Ok(_))));
                    }
                    "drop" => {
                        drop(future);
                        *seen.lock().unwrap() = Some(true);
                    }
                    _ => panic!("a user's waker panicked"),
                }
            }));
        }
        backend.set_poll(TransferState::Done);
        // The backend signals completion in this thread: the engine's hook
        // finishes the operation and wakes the waker right here.
        backend.signal();
        let seen = *seen.lock().unwrap();
        match action {
            "panic" => assert_eq!(seen, None),
            _ => assert_eq!(seen, Some(true), "the re-entrant waker saw the result"),
        }
        // The connector still works after the waker's antics.
        let again = c
            .begin_read(&remote(64), vec![Descriptor::new(vec![0u8; 64]).unwrap()])
            .unwrap();
        again.wait_timeout(BOUND).unwrap();
    });
}

#[test]
fn the_backend_is_asked_to_watch_a_transfer_only_once_somebody_waits_on_its_event() {
    let backend = Arc::new(Scripted::new(true, true));
    *backend.assist.lock().unwrap() = Duration::from_millis(1);
    let watched = || backend.watched.load(Ordering::SeqCst);
    let c = connector(&backend);
    let read = c
        .begin_read(&remote(64), vec![Descriptor::new(vec![0u8; 64]).unwrap()])
        .unwrap();
    // Posting, and looking (a wait that does not sleep), ask nothing.
    assert!(matches!(
        read.wait_timeout(Duration::ZERO),
        Err(Error::TimedOut(_))
    ));
    assert_eq!(read.status(), OperationStatus::InProgress);
    assert_eq!(watched(), 0);
    // A waiter whose assist window ran out asks once, then sleeps until the
    // event.
    let waiter = std::thread::spawn(move || read.wait_timeout(BOUND));
    eventually("the waiter asked the backend to watch", || watched() == 1);
    backend.set_poll(TransferState::Done);
    backend.signal();
    waiter.join().unwrap().unwrap();
    assert_eq!(watched(), 1);

    // A future asks on its first pending poll, and not again for the same waker.
    backend.set_poll(TransferState::InProgress);
    let read = c
        .begin_read(&remote(64), vec![Descriptor::new(vec![0u8; 64]).unwrap()])
        .unwrap();
    let counting = Arc::new(Counting(AtomicUsize::new(0)));
    let waker = Waker::from(Arc::clone(&counting));
    let mut future = read.completion();
    for _ in 0..3 {
        assert!(
            Pin::new(&mut future)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
    }
    assert_eq!(watched(), 2);
    backend.set_poll(TransferState::Done);
    backend.signal();
    assert_eq!(counting.0.load(Ordering::SeqCst), 1);
    assert!(matches!(
        Pin::new(&mut future).poll(&mut Context::from_waker(&waker)),
        Poll::Ready(Ok(()))
    ));
    assert_eq!(watched(), 2);
}

#[test]
fn a_waiter_with_an_assist_window_completes_its_transfer_itself() {
    // Event-driven, and the hook is never called: only the waiter's own
    // polls (the backend's `wait_assist`) can see the transfer end.
    let backend = Arc::new(Scripted::new(true, true));
    *backend.assist.lock().unwrap() = BOUND;
    let c = connector(&backend);
    let (local, freed) = backend.tracked(64);
    let read = c.begin_read(&remote(64), vec![local]).unwrap();
    backend.polls_before_done.store(50, Ordering::SeqCst);
    backend.set_poll(TransferState::Done);
    within("the assisted wait returns", move || {
        read.wait().unwrap();
        assert_eq!(read.status(), OperationStatus::Complete);
        drop(read.into_descriptors().unwrap());
    });
    assert_eq!(freed.load(Ordering::SeqCst), 1);
    assert!(!backend.freed_early());
    // It ended within the window: the backend was never asked to watch it.
    assert_eq!(backend.watched.load(Ordering::SeqCst), 0);
}
