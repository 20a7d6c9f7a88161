//! The state an operation shares with the progress engine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::backend::{ExposureId, RegistrationBackend, TransferId, TransferState};
use crate::descriptor::Descriptor;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::remote::RemoteLease;

/// Where an operation stands. Terminal states (`Complete`, `Cancelled`,
/// `Errored`) never change again. Numbering is Dynamo's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OperationStatus {
    /// Not set up (kept for parity with Dynamo; operations here never report it).
    Uninitialized = 0,
    /// A passive operation waiting for its peer.
    Initialized = 1,
    /// An active operation whose transfer is posted and moving.
    InProgress = 2,
    /// Finished: all bytes moved.
    Complete = 3,
    /// Cancelled explicitly or by being dropped.
    Cancelled = 4,
    /// The transfer failed.
    Errored = 5,
}

impl OperationStatus {
    /// Whether the status can no longer change.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            OperationStatus::Complete | OperationStatus::Cancelled | OperationStatus::Errored
        )
    }
}

/// How long a blocked waiter polls a polled backend before it sleeps.
const HELP_WINDOW: Duration = Duration::from_millis(2);
/// How long the engine leaves a new transfer to its poster before polling it.
const ENGINE_GRACE: Duration = Duration::from_micros(50);

/// What a thread blocked in `wait` polls itself, rather than sleeping until
/// the engine thread notices the end and wakes it.
pub(crate) enum Help {
    /// Nothing: the backend reports events itself.
    Nothing,
    /// The operation's transfer (active operations on polled backends).
    Transfer,
    /// The connector's notifications (passive operations on polled backends).
    Notifications(Weak<Engine>),
}

/// How an operation ended.
pub(crate) enum Outcome {
    Complete,
    Cancelled,
    Failed(String),
}

/// What the backend still holds of an operation's memory.
pub(crate) enum Pending {
    /// Nothing: the memory may be freed or handed back.
    Nothing,
    /// A posted transfer.
    Transfer(TransferId),
    /// A transfer that ended for us (cancelled) but that the backend has not
    /// let go of yet: the engine keeps releasing it until it has.
    Draining(TransferId),
    /// A passive operation's exposure.
    Exposure(ExposureId),
    /// The backend might touch the memory at any time from now on: never free it.
    Leaked,
}

pub(crate) struct OpState {
    status: OperationStatus,
    error: Option<String>,
    pending: Pending,
    lease: Option<RemoteLease>,
    /// Descriptors of a dropped operation whose transfer is still draining:
    /// freed when the backend lets go of them, leaked if it never does.
    orphans: Vec<Descriptor>,
    wakers: Vec<Waker>,
}

/// Shared between an operation, its waiters and the progress engine.
pub(crate) struct OpShared {
    backend: Arc<dyn RegistrationBackend>,
    /// What a blocked waiter polls itself (with polled backends).
    help: Help,
    /// Threads polling this operation from `wait`; the engine leaves it to them.
    helpers: AtomicUsize,
    state: Mutex<OpState>,
    done: Condvar,
    kind: &'static str,
    bytes: usize,
    started: Instant,
}

impl OpShared {
    pub(crate) fn new(
        backend: Arc<dyn RegistrationBackend>,
        help: Help,
        kind: &'static str,
        bytes: usize,
        status: OperationStatus,
        pending: Pending,
        lease: Option<RemoteLease>,
    ) -> Arc<OpShared> {
        Arc::new(OpShared {
            backend,
            help,
            helpers: AtomicUsize::new(0),
            state: Mutex::new(OpState {
                status,
                error: None,
                pending,
                lease,
                orphans: Vec::new(),
                wakers: Vec::new(),
            }),
            done: Condvar::new(),
            kind,
            bytes,
            started: Instant::now(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, OpState> {
        // The state stays consistent across a panic in a user's waker, so a
        // poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn status(&self) -> OperationStatus {
        self.lock().status
    }

    /// Whether the operation ended and the backend let go of its memory.
    pub(crate) fn memory_released(&self) -> bool {
        let st = self.lock();
        st.status.is_terminal() && matches!(st.pending, Pending::Nothing)
    }

    /// Takes the descriptors of a dropped operation: gives them back to be
    /// dropped now if the memory is free, keeps them until a draining transfer
    /// is released, or leaks them if the backend may touch them forever.
    pub(crate) fn adopt(&self, descriptors: Vec<Descriptor>) -> Option<Vec<Descriptor>> {
        let mut st = self.lock();
        match st.pending {
            Pending::Nothing => Some(descriptors),
            Pending::Draining(_) | Pending::Transfer(_) => {
                st.orphans.extend(descriptors);
                None
            }
            Pending::Exposure(_) | Pending::Leaked => {
                leak(descriptors, self.kind);
                None
            }
        }
    }

    /// Ends the operation unless it already ended; releases what the backend holds.
    pub(crate) fn finish(&self, outcome: Outcome) {
        let mut st = self.lock();
        let released = self.finish_locked(&mut st, outcome);
        drop(st);
        drop(released);
    }

    fn finish_locked(&self, st: &mut OpState, outcome: Outcome) -> Released {
        if st.status.is_terminal() {
            return Released::default();
        }
        let (status, error) = match outcome {
            Outcome::Complete => (OperationStatus::Complete, None),
            Outcome::Cancelled => (OperationStatus::Cancelled, None),
            Outcome::Failed(reason) => (OperationStatus::Errored, Some(reason)),
        };
        let mut released = Released::default();
        match std::mem::replace(&mut st.pending, Pending::Nothing) {
            Pending::Transfer(id) | Pending::Draining(id) => released = self.release_locked(st, id),
            Pending::Exposure(id) => {
                let revoked = match self.backend.revoke(id) {
                    Ok(()) => self.backend.revocation_enforced(),
                    Err(error) => {
                        tracing::error!(%error, exposure = id.0, "revocation failed");
                        false
                    }
                };
                // A peer that notified completion is done with the memory; one
                // that was never told to stop might still write.
                if !revoked && status != OperationStatus::Complete {
                    st.pending = Pending::Leaked;
                }
            }
            other => st.pending = other,
        }
        st.status = status;
        st.error = error;
        tracing::debug!(
            op = self.kind,
            status = ?status,
            bytes = self.bytes,
            elapsed_us = self.started.elapsed().as_micros() as u64,
            reason = st.error.as_deref().unwrap_or(""),
            "operation finished"
        );
        self.done.notify_all();
        for waker in st.wakers.drain(..) {
            waker.wake();
        }
        if !matches!(st.pending, Pending::Draining(_)) {
            // The peer stays loaded while a draining transfer may still use it.
            st.lease = None;
        }
        released
    }

    /// Asks the backend to let go of a transfer; sets `pending` accordingly.
    fn release_locked(&self, st: &mut OpState, id: TransferId) -> Released {
        let mut released = Released::default();
        match self.backend.release(id) {
            Ok(true) => {
                st.pending = Pending::Nothing;
                released.orphans = std::mem::take(&mut st.orphans);
            }
            Ok(false) => {
                st.pending = Pending::Draining(id);
                return released;
            }
            Err(error) => {
                tracing::error!(%error, transfer = id.0, "the backend lost a transfer; its memory will be leaked, not freed");
                st.pending = Pending::Leaked;
                leak(std::mem::take(&mut st.orphans), self.kind);
            }
        }
        // Released under the lock, so whoever sees the memory released also sees
        // the peer's reference dropped. (Lock order: operation, then remote cache.)
        st.lease = None;
        released
    }

    /// Whether the engine should poll this operation: nobody waiting is polling
    /// it, and it is past the grace period in which its poster usually starts
    /// waiting (polling it from two threads only makes them fight for the CPU).
    pub(crate) fn needs_engine(&self) -> bool {
        self.helpers.load(Ordering::Acquire) == 0 && self.started.elapsed() >= ENGINE_GRACE
    }

    /// Drives an active operation: polls its transfer, or keeps releasing a
    /// draining one. True once the engine can forget the operation.
    pub(crate) fn poll_transfer(&self) -> bool {
        let mut st = self.lock();
        let released = match st.pending {
            Pending::Transfer(id) => {
                let outcome = match self.backend.poll(id) {
                    TransferState::InProgress => return false,
                    TransferState::Done => Outcome::Complete,
                    TransferState::Failed(reason) => Outcome::Failed(reason),
                };
                self.finish_locked(&mut st, outcome)
            }
            Pending::Draining(id) => self.release_locked(&mut st, id),
            _ => return true,
        };
        let settled = !matches!(st.pending, Pending::Transfer(_) | Pending::Draining(_));
        drop(st);
        drop(released);
        settled
    }

    fn result(st: &OpState) -> Option<Result<()>> {
        match st.status {
            OperationStatus::Complete => Some(Ok(())),
            OperationStatus::Cancelled => Some(Err(Error::Cancelled)),
            OperationStatus::Errored => Some(Err(Error::TransferFailed(
                st.error.clone().unwrap_or_default(),
            ))),
            _ => None,
        }
    }

    /// Blocks until the operation ends or `timeout` passes.
    ///
    /// With a polled backend, the waiting thread first polls itself (the transfer,
    /// or the notifications) for up to [`HELP_WINDOW`]: it would otherwise sleep
    /// until the engine thread noticed and woke it, and with NIXL polling is what
    /// drives the transfer.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        // A timeout too large to represent is no timeout.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        if !matches!(self.help, Help::Nothing) {
            let window = Instant::now() + HELP_WINDOW;
            let until = deadline.map_or(window, |d| d.min(window));
            self.helpers.fetch_add(1, Ordering::AcqRel);
            let _helping = Helping(&self.helpers);
            loop {
                {
                    let st = self.lock();
                    if let Some(result) = Self::result(&st) {
                        return result;
                    }
                }
                let settled = match &self.help {
                    Help::Transfer => self.poll_transfer(),
                    Help::Notifications(engine) => match engine.upgrade() {
                        Some(engine) => {
                            engine.drain_notifications();
                            false
                        }
                        None => true,
                    },
                    Help::Nothing => true,
                };
                if settled && !self.status().is_terminal() {
                    break;
                }
                if Instant::now() >= until {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let mut st = self.lock();
        loop {
            if let Some(result) = Self::result(&st) {
                return result;
            }
            st = match deadline {
                None => self.done.wait(st).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::TimedOut(timeout.unwrap_or_default()));
                    }
                    self.done
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    /// Future-style readiness: registers the waker until the operation ends.
    pub(crate) fn poll_done(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut st = self.lock();
        match Self::result(&st) {
            Some(result) => Poll::Ready(result),
            None => {
                if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    st.wakers.push(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// Counts a helping waiter for as long as it lives.
struct Helping<'a>(&'a AtomicUsize);

impl Drop for Helping<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What releasing a transfer hands back, dropped after the state lock is
/// released (deregistering calls into the backend).
#[derive(Default)]
struct Released {
    orphans: Vec<Descriptor>,
}

fn leak(descriptors: Vec<Descriptor>, kind: &str) {
    if descriptors.is_empty() {
        return;
    }
    let bytes: usize = descriptors.iter().map(Descriptor::size).sum();
    tracing::error!(
        op = kind,
        bytes,
        "a peer or the backend may still touch this memory: leaking it instead of freeing it"
    );
    std::mem::forget(descriptors);
}

impl Drop for OpShared {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if !matches!(st.pending, Pending::Nothing) {
            leak(std::mem::take(&mut st.orphans), self.kind);
        }
    }
}
