//! The operation state machine, model-checked with loom: every interleaving of
//! small, bounded models of complete / fail / cancel / drop / wait / future
//! polls with changing wakers / engine passes, over the scripted backend.
//!
//! Run by `cargo xtask test` as
//! `RUSTFLAGS="--cfg loom" cargo test -p descriptor-core --lib --release loom`
//! (built in `target/loom`). Invariants checked in every interleaving:
//! - memory is freed at most once, and only after the backend let go of it
//!   (the scripted backend's tracked memory records an early free);
//! - a terminal status never changes (every status any thread saw after it
//!   turned terminal is the final one);
//! - every waiter is woken: a blocked `wait` returns (loom reports a deadlock
//!   otherwise), and a future whose last poll was pending has had its latest
//!   waker woken, also when a peer's notification is left for whoever looks
//!   next (the engine's `Handoff`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::{Context, Poll, Wake, Waker};

use loom::thread;

use super::held::Held;

/// Interleavings with up to this many preemptions are explored exhaustively.
const PREEMPTION_BOUND: Option<usize> = Some(6);
use super::state::{OpShared, OperationStatus, Outcome, Pending, Role};
use crate::backend::{ExposureId, RegistrationBackend, TransferId, TransferState};
use crate::engine::Handoff;
use crate::error::Error;
use crate::metadata::OperationKind;
use crate::quarantine::{Quarantine, QuarantinePolicy, Quarantined};
use crate::remote::{DEFAULT_MAX_IDLE_PEERS, RemoteCache};
use crate::testing::{Script, Scripted};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let runs = Arc::new(StdAtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = PREEMPTION_BOUND;
    builder.check(move || {
        counted.fetch_add(1, StdOrdering::SeqCst);
        f();
    });
    eprintln!(
        "loom: {} interleavings explored",
        runs.load(StdOrdering::SeqCst)
    );
}

/// A READ of 8 bytes: active (transfer 1 posted) or passive (exposure 1 made).
fn read(backend: &Arc<Scripted>, passive: bool) -> Arc<OpShared> {
    read_quarantined(backend, passive, None)
}

/// [`read`], its memory going to `quarantine` if it is quarantined.
fn read_quarantined(
    backend: &Arc<Scripted>,
    passive: bool,
    quarantine: Option<Arc<Quarantine>>,
) -> Arc<OpShared> {
    let (status, pending) = if passive {
        (
            OperationStatus::Initialized,
            Pending::Exposure(ExposureId(1)),
        )
    } else {
        (
            OperationStatus::InProgress,
            Pending::Transfer(TransferId(1)),
        )
    };
    OpShared::new(
        Arc::clone(backend) as Arc<dyn RegistrationBackend>,
        Role {
            kind: OperationKind::Read,
            passive,
        },
        8,
        status,
        pending,
        None,
        quarantine,
    )
}

fn active(backend: &Arc<Scripted>) -> Arc<OpShared> {
    read(backend, false)
}

fn passive(backend: &Arc<Scripted>) -> Arc<OpShared> {
    read(backend, true)
}

/// Status observations, to check that a terminal status never changes.
#[derive(Default, Clone)]
struct Seen(Arc<StdMutex<Vec<OperationStatus>>>);

impl Seen {
    fn record(&self, op: &OpShared) {
        // Read before taking the (std, unmodelled) lock: loom may switch
        // threads at the atomic read, and must not do so while it is held.
        let status = op.status();
        self.0.lock().unwrap().push(status);
    }

    fn check(&self, op: &OpShared) {
        let last = op.status();
        assert!(last.is_terminal(), "the operation never ended: {last:?}");
        for s in self.0.lock().unwrap().iter() {
            assert!(
                !s.is_terminal() || *s == last,
                "a terminal status changed: saw {s:?}, ended {last:?}"
            );
        }
    }
}

/// Drives `op` like the engine does until it can forget it.
fn engine(op: &OpShared) {
    while !op.drive() {
        thread::yield_now();
    }
}

/// The engine completes the transfer while the user cancels and then drops the
/// operation, and a second driver (the backend's event hook) runs too. Each
/// driver makes one pass: with the transfer done and `release` letting go at
/// once, one pass by anybody settles it.
#[test]
fn loom_complete_races_cancel_and_drop() {
    model(|| {
        let backend = Arc::new(Scripted::new(true, false));
        backend.set_poll(TransferState::Done);
        let op = active(&backend);
        let (d, freed) = backend.tracked(8);
        let held = Held::new(vec![d]);
        let seen = Seen::default();
        let drivers: Vec<_> = (0..2)
            .map(|_| {
                let (op, seen) = (Arc::clone(&op), seen.clone());
                thread::spawn(move || {
                    op.drive();
                    seen.record(&op);
                })
            })
            .collect();
        seen.record(&op);
        op.finish(Outcome::Cancelled);
        seen.record(&op);
        op.abandon(held);
        seen.record(&op);
        for d in drivers {
            d.join().unwrap();
        }
        seen.check(&op);
        assert_eq!(freed.load(StdOrdering::SeqCst), 1, "freed exactly once");
        assert!(!backend.freed_early());
        assert_eq!(op.pending(), Pending::Nothing);
    });
}

/// A cancelled transfer the backend cannot let go of yet (Draining): the
/// engine keeps releasing it, the dropped operation's memory is freed when
/// the backend lets go, never before; a blocked waiter returns.
#[test]
fn loom_draining_memory_is_freed_only_once_released() {
    model(|| {
        let backend = Arc::new(Scripted::new(true, false));
        backend.script_releases(&[Script::Busy]);
        let op = active(&backend);
        let (d, freed) = backend.tracked(8);
        let held = Held::new(vec![d]);
        let waiter = {
            let op = Arc::clone(&op);
            thread::spawn(move || op.wait(None))
        };
        let driver = {
            let op = Arc::clone(&op);
            thread::spawn(move || engine(&op))
        };
        op.finish(Outcome::Cancelled);
        op.abandon(held);
        assert!(matches!(waiter.join().unwrap(), Err(Error::Cancelled)));
        driver.join().unwrap();
        assert_eq!(freed.load(StdOrdering::SeqCst), 1);
        assert!(!backend.freed_early());
    });
}

/// A waiter that returns finds the operation's peer reference dropped (the
/// lease is let go before the operation is marked settled), whoever ends it.
#[test]
fn loom_a_returning_waiter_finds_the_peer_released() {
    model(|| {
        let backend = Arc::new(Scripted::new(true, false));
        backend.set_poll(TransferState::Done);
        let remotes = Arc::new(RemoteCache::new(
            Arc::clone(&backend) as Arc<dyn RegistrationBackend>,
            DEFAULT_MAX_IDLE_PEERS,
            crate::auth::Auth::Open,
        ));
        let lease = remotes.acquire(b"scripted agent").unwrap();
        let op = OpShared::new(
            Arc::clone(&backend) as Arc<dyn RegistrationBackend>,
            Role {
                kind: OperationKind::Read,
                passive: false,
            },
            8,
            OperationStatus::InProgress,
            Pending::Transfer(TransferId(1)),
            Some(lease.into()),
            None,
        );
        let waiter = {
            let (op, remotes) = (Arc::clone(&op), Arc::clone(&remotes));
            thread::spawn(move || {
                let result = op.wait(None);
                (result.is_ok(), remotes.active())
            })
        };
        let driver = {
            let op = Arc::clone(&op);
            thread::spawn(move || {
                op.drive();
            })
        };
        op.finish(Outcome::Cancelled);
        driver.join().unwrap();
        let (_, active) = waiter.join().unwrap();
        assert_eq!(
            active, 0,
            "the waiter returned while the peer was still held"
        );
    });
}

struct Counting(StdAtomicUsize);

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, StdOrdering::SeqCst);
    }
}

/// A blocked waiter and a future that re-polls with a new waker, while the
/// engine completes (or fails) the transfer: both learn the outcome.
#[test]
fn loom_waiters_and_futures_with_changing_wakers_are_woken() {
    for end in [TransferState::Done, TransferState::failed("boom")] {
        model(move || {
            let backend = Arc::new(Scripted::new(true, false));
            backend.set_poll(end.clone());
            let op = active(&backend);
            let waiter = {
                let op = Arc::clone(&op);
                thread::spawn(move || op.wait(None))
            };
            let wakers = [
                Arc::new(Counting(StdAtomicUsize::new(0))),
                Arc::new(Counting(StdAtomicUsize::new(0))),
            ];
            let future = {
                let (op, wakers) = (Arc::clone(&op), wakers.clone());
                thread::spawn(move || {
                    let mut slot = None;
                    let mut last = Poll::Pending;
                    for w in &wakers {
                        let waker = Waker::from(Arc::clone(w));
                        last = op.poll_settled(&mut slot, &mut Context::from_waker(&waker));
                    }
                    last.is_pending()
                })
            };
            engine(&op);
            let waited = waiter.join().unwrap();
            let pending = future.join().unwrap();
            match end {
                TransferState::Done => assert!(waited.is_ok()),
                _ => assert!(matches!(waited, Err(Error::TransferFailed { .. }))),
            }
            if pending {
                assert_eq!(
                    wakers[1].0.load(StdOrdering::SeqCst),
                    1,
                    "the future's latest waker was not woken"
                );
            }
            assert_eq!(op.waker_count(), 0, "a settled operation keeps no waker");
        });
    }
}

/// The backend panics while letting go: the memory is leaked (never freed),
/// and a blocked waiter still returns.
#[test]
fn loom_a_panic_in_release_leaks_and_wakes() {
    // The scripted panic is expected in every interleaving: don't print it.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let scripted = info
            .payload()
            .downcast_ref::<&str>()
            .is_some_and(|m| m.starts_with("scripted:"));
        if !scripted {
            default(info);
        }
    }));
    model(|| {
        let backend = Arc::new(Scripted::new(true, false));
        backend.script_releases(&[Script::Panic]);
        let op = active(&backend);
        let (d, freed) = backend.tracked(8);
        let held = Held::new(vec![d]);
        let waiter = {
            let op = Arc::clone(&op);
            thread::spawn(move || op.wait(None))
        };
        let cancelled = catch_unwind(AssertUnwindSafe(|| op.finish(Outcome::Cancelled)));
        assert!(cancelled.is_err());
        op.abandon(held);
        assert!(matches!(waiter.join().unwrap(), Err(Error::Cancelled)));
        assert_eq!(op.pending(), Pending::Leaked);
        assert_eq!(freed.load(StdOrdering::SeqCst), 0);
    });
}

/// A passive operation on a backend that cannot revoke: its peer's
/// notification races a cancel and the drop. Completed, the memory is freed
/// (the peer said it is done); cancelled first, it is leaked.
#[test]
fn loom_passive_notification_races_cancel_and_drop() {
    model(|| {
        let backend = Arc::new(Scripted::new(false, false));
        let op = passive(&backend);
        let (d, freed) = backend.tracked(8);
        let held = Held::new(vec![d]);
        let seen = Seen::default();
        let notified = {
            let (op, seen, backend) = (Arc::clone(&op), seen.clone(), Arc::clone(&backend));
            thread::spawn(move || {
                backend.peer_done();
                op.finish(Outcome::Complete);
                seen.record(&op);
            })
        };
        op.finish(Outcome::Cancelled);
        seen.record(&op);
        op.abandon(held);
        notified.join().unwrap();
        seen.check(&op);
        let expected = match op.status() {
            OperationStatus::Complete => 1,
            _ => 0,
        };
        assert_eq!(freed.load(StdOrdering::SeqCst), expected);
        assert!(!backend.freed_early());
    });
}

/// A passive operation on a backend that cannot revoke, with a quarantine
/// that frees at once: a cancel, the drop (which may find the cancel's
/// revoke under way and leave its descriptors as orphans) and the peer's
/// notification race. The memory is freed exactly once, either handed back
/// (completed) or through the quarantine (cancelled), and the quarantine
/// ends empty.
#[test]
fn loom_a_quarantined_exposure_is_freed_once_whoever_settles_it() {
    model(|| {
        let backend = Arc::new(Scripted::new(false, false));
        let quarantine = Arc::new(Quarantine::new(QuarantinePolicy::new(
            std::time::Duration::ZERO,
            0,
        )));
        let op = read_quarantined(&backend, true, Some(Arc::clone(&quarantine)));
        let (d, freed) = backend.tracked(8);
        let held = Held::new(vec![d]);
        let cancel = {
            let op = Arc::clone(&op);
            thread::spawn(move || op.finish(Outcome::Cancelled))
        };
        let notified = {
            let (op, backend) = (Arc::clone(&op), Arc::clone(&backend));
            thread::spawn(move || {
                backend.peer_done();
                op.finish(Outcome::Complete);
            })
        };
        op.abandon(held);
        cancel.join().unwrap();
        notified.join().unwrap();
        let expected = match op.status() {
            OperationStatus::Complete => Pending::Nothing,
            _ => Pending::Quarantined,
        };
        assert_eq!(op.pending(), expected);
        assert_eq!(freed.load(StdOrdering::SeqCst), 1);
        assert_eq!(quarantine.held(), Quarantined::default());
    });
}

/// What `Engine::signal` and `Engine::catch_up` do with a [`Handoff`], over a
/// stand-in for the backend's inbox: the number of notifications waiting.
struct Deferred {
    handoff: Handoff,
    inbox: loom::sync::Mutex<usize>,
    op: Arc<OpShared>,
}

impl Deferred {
    /// A passive operation, and a peer thread that notifies it once.
    fn with_peer() -> (Arc<Deferred>, thread::JoinHandle<()>) {
        let backend = Arc::new(Scripted::new(true, false));
        let deferred = Arc::new(Deferred {
            handoff: Handoff::default(),
            inbox: loom::sync::Mutex::new(0),
            op: passive(&backend),
        });
        let peer = {
            let deferred = Arc::clone(&deferred);
            thread::spawn(move || deferred.notify())
        };
        (deferred, peer)
    }

    /// `Engine::catch_up`: claims, then drains and delivers.
    fn catch_up(&self) {
        if self.handoff.claim() {
            let waiting = std::mem::take(&mut *self.inbox.lock().unwrap());
            if waiting > 0 {
                self.op.finish(Outcome::Complete);
            }
        }
    }

    /// A peer's transfer: the backend queues the notification, then calls
    /// the hook (`Engine::signal`), which delivers only if somebody watches.
    fn notify(&self) {
        *self.inbox.lock().unwrap() += 1;
        if self.handoff.raise() {
            self.catch_up();
        }
    }
}

/// A peer's notification races a blocked waiter of the passive operation and
/// a third thread that looks at it (`status`): the event's thread delivers
/// only if it sees a watcher, the waiter catches up only if it sees the
/// event, and the looker may claim it from either. A waiter sleeping through
/// a notification nobody delivers would be a deadlock, which loom reports.
#[test]
fn loom_a_deferred_notification_reaches_its_waiter() {
    model(|| {
        let (deferred, peer) = Deferred::with_peer();
        let looker = {
            let deferred = Arc::clone(&deferred);
            thread::spawn(move || deferred.catch_up())
        };
        deferred.handoff.add_waiter();
        deferred.catch_up();
        let waited = deferred.op.wait(None);
        deferred.handoff.remove_waiter();
        peer.join().unwrap();
        looker.join().unwrap();
        assert!(waited.is_ok());
        assert_eq!(deferred.op.status(), OperationStatus::Complete);
    });
}

/// The same race with a future as the waiter: if its last poll was pending,
/// its waker has been woken by the time the peer's call returned.
#[test]
fn loom_a_deferred_notification_wakes_a_pending_future() {
    model(|| {
        let (deferred, peer) = Deferred::with_peer();
        let woken = Arc::new(Counting(StdAtomicUsize::new(0)));
        deferred.handoff.add_waiter();
        deferred.catch_up();
        let waker = Waker::from(Arc::clone(&woken));
        let polled = deferred
            .op
            .poll_settled(&mut None, &mut Context::from_waker(&waker));
        peer.join().unwrap();
        if polled.is_pending() {
            assert_eq!(
                woken.0.load(StdOrdering::SeqCst),
                1,
                "the future slept through its notification"
            );
        }
        deferred.handoff.remove_waiter();
        assert_eq!(deferred.op.status(), OperationStatus::Complete);
    });
}
