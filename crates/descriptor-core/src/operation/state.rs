//! The state an operation shares with the progress engine, its waiters and the
//! backend's event hook: [`OpShared`].
//!
//! # How it stays sound and deadlock-free
//!
//! - **Decide under the lock, act after it.** The state lock is held only to
//!   read and change this struct. The backend (`poll`, `release`, `revoke`),
//!   wakers, and descriptor drops (which deregister through the backend) are
//!   called with no lock held, so none of them can deadlock against it, and
//!   [`status`](OpShared::status) never waits (it is an atomic load).
//! - **Decided once, then settled.** An operation's outcome is *decided* once,
//!   by whichever thread gets there first (completion, failure, cancel, drop);
//!   its status then turns terminal and never changes. That same thread then
//!   *settles* it: asks the backend to let go of the memory, records the answer
//!   in [`Pending`], and only then wakes waiters, so a waiter that returns
//!   finds the memory back (unless the backend still holds it).
//! - **Memory goes back only on [`Pending::Nothing`].** While the backend is
//!   being asked, the state is [`Pending::Releasing`]; if the backend panics,
//!   it becomes [`Pending::Leaked`], waiters are woken, and the panic goes on.
//!   An exposure revoked before its peer's word, on a backend that cannot cut
//!   the peer off, is [`Pending::Quarantined`]: its memory goes to the
//!   connector's [`Quarantine`], which frees it once its window is over.
//!   Descriptors travel in a [`Held`], which leaks them if dropped, so no panic
//!   anywhere can free memory a transfer may still touch.
//! - **One waker per future.** Each future polling an operation owns one slot
//!   and replaces its waker there; a dropped future takes its slot with it.
//!   Wakers are woken outside the lock, and one that panics is logged and
//!   ignored, so it cannot stop the thread that completed the operation (the
//!   engine, or a peer's thread in which a backend delivered the event).

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::held::Held;
use crate::backend::{ExposureId, Posted, RegistrationBackend, Release, TransferId, TransferState};
use crate::error::{Cause, Error, Result, SharedCause};
use crate::file::FileSegment;
use crate::metadata::OperationKind;
use crate::quarantine::Quarantine;
use crate::reach::Ticket;
use crate::remote::RemoteLease;
use crate::sync::{AtomicU8, Condvar, Mutex, MutexGuard, Ordering};

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

    fn from_u8(value: u8) -> OperationStatus {
        match value {
            1 => OperationStatus::Initialized,
            2 => OperationStatus::InProgress,
            3 => OperationStatus::Complete,
            4 => OperationStatus::Cancelled,
            5 => OperationStatus::Errored,
            _ => OperationStatus::Uninitialized,
        }
    }
}

/// Which of the four operations this is, for logs: the direction and the side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Role {
    /// What the peer does (passive) or what this side does (active).
    pub(crate) kind: OperationKind,
    /// A readable or writable (exposes memory) rather than a read or write.
    pub(crate) passive: bool,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match (self.kind, self.passive) {
            (OperationKind::Read, true) => "readable",
            (OperationKind::Write, true) => "writable",
            (OperationKind::Read, false) => "read",
            (OperationKind::Write, false) => "write",
        })
    }
}

/// How an operation ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    Complete,
    Cancelled,
    Failed(SharedCause),
}

/// What the backend still holds of an operation's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pending {
    /// Nothing: the memory may be freed or handed back.
    Nothing,
    /// A posted transfer.
    Transfer(TransferId),
    /// A passive operation's exposure.
    Exposure(ExposureId),
    /// One thread is asking the backend to let go (release or revoke) right now.
    Releasing,
    /// A transfer that ended for us (cancelled) but that the backend has not
    /// let go of yet: the engine keeps releasing it until it has.
    Draining(TransferId),
    /// The backend might touch the memory at any time from now on: never free it.
    Leaked,
    /// An exposure was revoked before its peer's word, and the backend cannot
    /// cut the peer off: the memory goes to the connector's [`Quarantine`],
    /// never back to the caller.
    Quarantined,
}

impl Pending {
    /// Whether the engine still has something to do for an active operation.
    fn needs_driving(self) -> bool {
        matches!(
            self,
            Pending::Transfer(_) | Pending::Releasing | Pending::Draining(_)
        )
    }
}

/// What the thread that decided an operation's outcome asks of the backend.
enum LetGo {
    Nothing,
    Release(TransferId),
    Revoke(ExposureId),
}

/// What a transfer's far side needs kept while the backend may touch it,
/// let go of with the memory: the peer entry (so the peer stays loaded), or
/// the file segments (so their descriptors stay open and registered). A
/// file whose transfer the backend never let go of is never closed, so its
/// descriptor's number is never reused under the backend.
pub(crate) enum FarSide {
    /// The peer's lease and the claim on what the transfer may reach: held
    /// for their `Drop`s (which let the peer entry go, and free memory of
    /// this process kept for the transfer: `crate::reach`).
    Peer(RemoteLease, Option<Ticket>),
    Files(Vec<FileSegment>),
}

impl From<RemoteLease> for FarSide {
    fn from(lease: RemoteLease) -> FarSide {
        FarSide::Peer(lease, None)
    }
}

impl FarSide {
    /// The backend may touch the far side for good: a file stays open, a
    /// claim on reached memory is never given up.
    fn keep_for_good(self) -> Option<FarSide> {
        match self {
            FarSide::Files(files) => {
                std::mem::forget(files);
                None
            }
            FarSide::Peer(lease, ticket) => {
                if let Some(ticket) = ticket {
                    ticket.keep_for_good();
                }
                Some(FarSide::Peer(lease, None))
            }
        }
    }
}

struct OpState {
    /// The decided status (mirrored in `OpShared::status` for lock-free reads).
    status: OperationStatus,
    error: Option<SharedCause>,
    /// The outcome is decided and the backend was asked to let go: waiters
    /// may return.
    settled: bool,
    pending: Pending,
    lease: Option<FarSide>,
    /// Descriptors of a dropped operation that the backend has not let go of
    /// yet: freed when it does, leaked if it never does.
    orphans: Option<Held>,
    /// One waker per future polling the operation, by slot.
    wakers: Vec<(u64, Waker)>,
    next_slot: u64,
    /// Threads blocked on `OpShared::settled`: settling skips the wake-up
    /// call (a system call, even with nobody to wake) when there are none.
    sleepers: usize,
}

impl Drop for OpState {
    fn drop(&mut self) {
        // Dropped with the backend still holding the transfer (a panic
        // unwound past it): its files stay open, as its memory stays leaked.
        if !matches!(self.pending, Pending::Nothing)
            && let Some(far) = self.lease.take()
        {
            drop(far.keep_for_good());
        }
    }
}

impl OpState {
    fn new(status: OperationStatus, pending: Pending, lease: Option<FarSide>) -> OpState {
        OpState {
            status,
            error: None,
            settled: false,
            pending,
            lease,
            orphans: None,
            wakers: Vec::new(),
            next_slot: 0,
            sleepers: 0,
        }
    }

    fn result(&self) -> Result<()> {
        match self.status {
            OperationStatus::Complete => Ok(()),
            OperationStatus::Errored => Err(match &self.error {
                Some(source) => Error::TransferFailed {
                    source: Arc::clone(source),
                },
                None => Error::TransferFailed {
                    source: Arc::from(Cause::from("no reason given")),
                },
            }),
            _ => Err(Error::Cancelled),
        }
    }

    /// What to let go of once `pending` says the backend no longer holds the
    /// memory (or never will let go of it); `quarantine` takes the orphans of
    /// a quarantined exposure.
    fn take_freed(&mut self, quarantine: Option<(&Arc<Quarantine>, OperationKind)>) -> Freed {
        let fate = match self.pending {
            Pending::Nothing => Fate::Free,
            Pending::Leaked => Fate::Leak,
            Pending::Quarantined => match quarantine {
                Some((quarantine, kind)) => Fate::Quarantine(Arc::clone(quarantine), kind),
                None => Fate::Leak,
            },
            // The peer entry stays loaded while a draining transfer may use it.
            _ => return Freed::default(),
        };
        let lease = self.lease.take();
        // A file the backend may still touch stays open (see `FarSide`).
        let lease = match (&fate, lease) {
            (Fate::Leak, Some(far)) => far.keep_for_good(),
            (_, lease) => lease,
        };
        Freed {
            orphans: self.orphans.take(),
            fate,
            _lease: lease,
        }
    }
}

/// What becomes of the descriptors of a dropped operation once its
/// outcome is settled.
#[derive(Default)]
enum Fate {
    /// The backend let go: freed.
    Free,
    /// The backend may touch them forever: leaked.
    #[default]
    Leak,
    /// A peer may touch them for a while: quarantined.
    Quarantine(Arc<Quarantine>, OperationKind),
}

impl Fate {
    fn dispose(self, descriptors: Held) {
        match self {
            Fate::Free => drop(descriptors.release()),
            Fate::Leak => drop(descriptors), // leaks, with an error in the log
            Fate::Quarantine(quarantine, kind) => quarantine.admit(descriptors, kind),
        }
    }
}

/// Taken out of the state under the lock, dropped after it: dropping
/// descriptors deregisters them and dropping a lease may unload a peer, both
/// calls into the backend.
#[derive(Default)]
struct Freed {
    orphans: Option<Held>,
    /// Whether `orphans` are freed, leaked or quarantined.
    fate: Fate,
    /// Dropped after the lock, like the descriptors: the last lease on a peer
    /// may unload it, the last segment of a file deregisters it.
    _lease: Option<FarSide>,
}

impl Drop for Freed {
    fn drop(&mut self) {
        if let Some(orphans) = self.orphans.take() {
            std::mem::take(&mut self.fate).dispose(orphans);
        }
    }
}

/// Asks the backend to release transfer `id`, which it reported ended; what it
/// still holds of the memory afterwards.
fn released(backend: &dyn RegistrationBackend, id: TransferId) -> Pending {
    match backend.release(id) {
        Ok(Release::LetGo) => Pending::Nothing,
        Ok(Release::StillRunning) => Pending::Draining(id),
        Err(error) => {
            tracing::error!(%error, transfer = id.0, "the backend lost a transfer; its memory will be leaked, not freed");
            Pending::Leaked
        }
    }
}

/// Shared between an operation, its waiters, its futures and the progress engine.
pub(crate) struct OpShared {
    backend: Arc<dyn RegistrationBackend>,
    /// The decided status, readable without the lock.
    status: AtomicU8,
    state: Mutex<OpState>,
    settled: Condvar,
    role: Role,
    bytes: usize,
    /// When the operation began, for the debug log's `elapsed_us`; read from
    /// the clock only while that log is on.
    started: Option<Instant>,
    /// Where a passive operation's memory goes if its exposure ends without
    /// its peer's word on a backend that cannot cut the peer off; `None`:
    /// leaked.
    quarantine: Option<Arc<Quarantine>>,
}

impl OpShared {
    pub(crate) fn new(
        backend: Arc<dyn RegistrationBackend>,
        role: Role,
        bytes: usize,
        status: OperationStatus,
        pending: Pending,
        lease: Option<FarSide>,
        quarantine: Option<Arc<Quarantine>>,
    ) -> Arc<OpShared> {
        let state = OpState::new(status, pending, lease);
        Self::with_state(backend, role, bytes, state, quarantine)
    }

    fn with_state(
        backend: Arc<dyn RegistrationBackend>,
        role: Role,
        bytes: usize,
        state: OpState,
        quarantine: Option<Arc<Quarantine>>,
    ) -> Arc<OpShared> {
        Arc::new(OpShared {
            backend,
            status: AtomicU8::new(state.status as u8),
            state: Mutex::new(state),
            settled: Condvar::new(),
            role,
            bytes,
            started: tracing::enabled!(tracing::Level::DEBUG).then(Instant::now),
            quarantine,
        })
    }

    /// An active operation whose transfer was just posted, in the state
    /// `post` reported; true if the engine must still drive it.
    ///
    /// Small transfers often end inside `post` (the loopback's always do):
    /// such an operation starts decided and settled, as `drive` would leave
    /// it, without a poll or the lock round trips and wake-ups of deciding
    /// it later. Nobody else can see the operation yet, so there is nothing
    /// to race. If the backend panics here, the caller's [`Held`] leaks the
    /// memory.
    pub(crate) fn posted(
        backend: Arc<dyn RegistrationBackend>,
        role: Role,
        bytes: usize,
        Posted { id, state }: Posted,
        lease: FarSide,
    ) -> (Arc<OpShared>, bool) {
        let reason = match state {
            TransferState::InProgress => {
                let pending = Pending::Transfer(id);
                let state = OpState::new(OperationStatus::InProgress, pending, Some(lease));
                return (Self::with_state(backend, role, bytes, state, None), true);
            }
            TransferState::Failed(reason) => reason,
            TransferState::Done => {
                let pending = released(&*backend, id);
                let mut state = OpState::new(OperationStatus::Complete, pending, Some(lease));
                // As `publish` does: what the backend let go of goes before
                // the operation can be seen settled.
                drop(state.take_freed(None));
                state.settled = true;
                let shared = Self::with_state(backend, role, bytes, state, None);
                if tracing::enabled!(tracing::Level::DEBUG) {
                    shared.log_finished(OperationStatus::Complete, None, pending);
                }
                return (shared, pending.needs_driving());
            }
        };
        let pending = Pending::Transfer(id);
        let state = OpState::new(OperationStatus::InProgress, pending, Some(lease));
        let shared = Self::with_state(backend, role, bytes, state, None);
        shared.finish(Outcome::Failed(reason));
        let driven = shared.lock().pending.needs_driving();
        (shared, driven)
    }

    fn lock(&self) -> MutexGuard<'_, OpState> {
        // No user code or backend call runs under this lock, and every change
        // to the state is a single assignment, so a poisoned lock (a panic
        // while it was held) still guards consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks on `settled` (at most `timeout`), counted in `sleepers` so that
    /// `publish` knows to wake it.
    fn sleep<'a>(
        &self,
        mut st: MutexGuard<'a, OpState>,
        timeout: Option<Duration>,
    ) -> MutexGuard<'a, OpState> {
        st.sleepers += 1;
        let mut st = match timeout {
            None => self
                .settled
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner),
            Some(timeout) => {
                self.settled
                    .wait_timeout(st, timeout)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        };
        st.sleepers -= 1;
        st
    }

    /// The backend's transport name, for errors.
    pub(crate) fn backend_name(&self) -> &'static str {
        self.backend.backend_name()
    }

    /// The current status; a lock-free read that never waits.
    pub(crate) fn status(&self) -> OperationStatus {
        OperationStatus::from_u8(self.status.load(Ordering::Acquire))
    }

    /// Whether the operation ended and the backend let go of its memory.
    ///
    /// An outcome that another thread has decided and is settling right now
    /// is waited for (the settle is one backend call, which must not block,
    /// and the drops after it), so that an operation whose `status()` reads
    /// terminal hands its memory back as after `wait()`.
    pub(crate) fn memory_released(&self) -> bool {
        let mut st = self.lock();
        while st.status.is_terminal() && !st.settled {
            st = self.sleep(st, None);
        }
        st.settled && st.pending == Pending::Nothing
    }

    /// Blocks until the operation ended and the backend let go of its
    /// memory (true), the memory is leaked for good, or `timeout` passed
    /// (false). Each attempt to let go publishes and wakes sleepers.
    pub(crate) fn wait_released(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut st = self.lock();
        loop {
            if st.status.is_terminal() && st.settled {
                match st.pending {
                    Pending::Nothing => return true,
                    Pending::Leaked | Pending::Quarantined | Pending::Exposure(_) => return false,
                    _ => {}
                }
            }
            let left = match deadline {
                None => None,
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return false,
                },
            };
            st = self.sleep(st, left);
        }
    }

    /// Decides the outcome unless one was decided already; returns what the
    /// deciding thread must then ask of the backend.
    fn decide(&self, st: &mut OpState, outcome: Outcome) -> Option<LetGo> {
        if st.status.is_terminal() {
            return None;
        }
        let (status, error) = match outcome {
            Outcome::Complete => (OperationStatus::Complete, None),
            Outcome::Cancelled => (OperationStatus::Cancelled, None),
            Outcome::Failed(reason) => (OperationStatus::Errored, Some(reason)),
        };
        st.status = status;
        st.error = error;
        self.status.store(status as u8, Ordering::Release);
        let let_go = match st.pending {
            Pending::Transfer(id) => LetGo::Release(id),
            Pending::Exposure(id) => LetGo::Revoke(id),
            _ => return Some(LetGo::Nothing),
        };
        st.pending = Pending::Releasing;
        Some(let_go)
    }

    /// Ends the operation with `outcome` unless it already ended, and settles
    /// it. Returns whether this call decided the outcome.
    pub(crate) fn finish(&self, outcome: Outcome) -> bool {
        let let_go = self.decide(&mut self.lock(), outcome);
        match let_go {
            Some(let_go) => {
                self.settle(let_go);
                true
            }
            None => false,
        }
    }

    /// Asks the backend to let go (no lock held), records its answer, frees
    /// what may be freed and wakes waiters. If the backend panics, the memory
    /// is leaked, waiters are woken, and the panic goes on.
    fn settle(&self, let_go: LetGo) {
        match catch_unwind(AssertUnwindSafe(|| self.let_go(let_go))) {
            Ok(pending) => self.publish(pending),
            Err(panic) => {
                tracing::error!(
                    op = %self.role,
                    "the backend panicked while letting go of the operation's memory; leaking it"
                );
                self.publish(Some(Pending::Leaked));
                resume_unwind(panic);
            }
        }
    }

    fn let_go(&self, let_go: LetGo) -> Option<Pending> {
        match let_go {
            LetGo::Nothing => None,
            LetGo::Release(id) => Some(released(&*self.backend, id)),
            LetGo::Revoke(id) => {
                let (revoked, revocation_failed) = match self.backend.revoke(id) {
                    Ok(()) => (self.backend.revocation_enforced(), false),
                    Err(error) => {
                        tracing::error!(%error, exposure = id.0, "revocation failed");
                        (false, true)
                    }
                };
                // A peer that notified completion is done with the memory; one
                // that was never told to stop might still write, for a while
                // (quarantined) or, if the revocation failed, at any time.
                let complete = self.status() == OperationStatus::Complete;
                Some(if revoked || complete {
                    Pending::Nothing
                } else if revocation_failed || self.quarantine.is_none() {
                    Pending::Leaked
                } else {
                    Pending::Quarantined
                })
            }
        }
    }

    /// Records what the backend still holds, marks the operation settled and
    /// wakes everyone waiting for it.
    fn publish(&self, pending: Option<Pending>) {
        // First let go of what the backend no longer holds (the lease may
        // unload a peer, orphans deregister), so that a waiter that returns
        // finds them gone; then mark the operation settled and wake.
        let freed = {
            let mut st = self.lock();
            if let Some(pending) = pending {
                st.pending = pending;
            }
            st.take_freed(self.quarantine.as_ref().map(|q| (q, self.role.kind)))
        };
        let dropped = catch_unwind(AssertUnwindSafe(|| drop(freed)));
        let (wakers, sleepers, finished) = {
            let mut st = self.lock();
            let first = !st.settled;
            st.settled = true;
            // Logged after the lock is released: a subscriber is user code.
            let finished = (first && tracing::enabled!(tracing::Level::DEBUG))
                .then(|| (st.status, st.error.clone(), st.pending));
            (std::mem::take(&mut st.wakers), st.sleepers > 0, finished)
        };
        if let Some((status, error, pending)) = finished {
            self.log_finished(status, error, pending);
        }
        if sleepers {
            self.settled.notify_all();
        }
        for (_, waker) in wakers {
            if catch_unwind(AssertUnwindSafe(|| waker.wake())).is_err() {
                tracing::error!(
                    op = %self.role,
                    "a waker panicked; the operation ended regardless"
                );
            }
        }
        // A backend that panicked while the lease or the descriptors were let
        // go: waiters are woken all the same, then the panic goes on.
        if let Err(panic) = dropped {
            resume_unwind(panic);
        }
    }

    /// The debug log's line for an operation that just settled.
    fn log_finished(&self, status: OperationStatus, error: Option<SharedCause>, pending: Pending) {
        tracing::debug!(
            op = %self.role,
            ?status,
            bytes = self.bytes,
            elapsed_us = self.started.map(|t| t.elapsed().as_micros() as u64),
            reason = error.as_ref().map(ToString::to_string).unwrap_or_default(),
            ?pending,
            "operation finished"
        );
    }

    /// Ends a dropped operation: cancels it unless it already ended, then
    /// takes its descriptors (see [`adopt`](Self::adopt)). If the cancel
    /// panics (a backend bug), `descriptors` is dropped while unwinding, which
    /// leaks them.
    pub(crate) fn abandon(&self, descriptors: Held) {
        self.finish(Outcome::Cancelled);
        self.adopt(descriptors);
    }

    /// Takes the descriptors of a dropped operation: frees them now if the
    /// backend let go of the memory, keeps them until a transfer being released
    /// or drained lets go, quarantines them if a peer may touch them for a
    /// while, or leaks them if the backend may touch them forever.
    fn adopt(&self, descriptors: Held) {
        let fate = {
            let mut st = self.lock();
            match st.pending {
                Pending::Nothing => Fate::Free,
                Pending::Transfer(_) | Pending::Releasing | Pending::Draining(_) => {
                    st.orphans = Some(descriptors);
                    return;
                }
                Pending::Quarantined => match &self.quarantine {
                    Some(quarantine) => Fate::Quarantine(Arc::clone(quarantine), self.role.kind),
                    None => Fate::Leak,
                },
                Pending::Exposure(_) | Pending::Leaked => Fate::Leak,
            }
        };
        fate.dispose(descriptors);
    }

    /// Moves an active operation on: polls its transfer (deciding and settling
    /// it when the backend reports an end), or asks again to release a draining
    /// one. True once the engine can forget the operation.
    pub(crate) fn drive(&self) -> bool {
        let (id, draining) = {
            let mut st = self.lock();
            match st.pending {
                Pending::Transfer(id) => (id, false),
                Pending::Draining(id) => {
                    st.pending = Pending::Releasing;
                    (id, true)
                }
                Pending::Releasing => return false,
                Pending::Nothing
                | Pending::Exposure(_)
                | Pending::Leaked
                | Pending::Quarantined => {
                    return true;
                }
            }
        };
        if draining {
            self.settle(LetGo::Release(id));
        } else {
            let outcome = match self.backend.poll(id) {
                TransferState::InProgress => return false,
                TransferState::Done => Outcome::Complete,
                TransferState::Failed(reason) => Outcome::Failed(reason),
            };
            let let_go = {
                let mut st = self.lock();
                // Someone else may have decided meanwhile (a cancel): theirs stands.
                if st.pending == Pending::Transfer(id) {
                    self.decide(&mut st, outcome)
                } else {
                    None
                }
            };
            if let Some(let_go) = let_go {
                self.settle(let_go);
            }
        }
        !self.lock().pending.needs_driving()
    }

    /// Blocks until the operation is settled or `timeout` passes.
    ///
    /// An active operation's waiter first polls the transfer itself for the
    /// backend's [`wait_assist`](RegistrationBackend::wait_assist) (yielding
    /// between polls), then sleeps until it is woken.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        // A timeout too large to represent is no timeout.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let assist = self.backend.wait_assist();
        if !assist.is_zero() && matches!(self.lock().pending, Pending::Transfer(_)) {
            let until = Instant::now() + assist;
            let until = deadline.map_or(until, |d| d.min(until));
            while !self.drive() && Instant::now() < until {
                std::thread::yield_now();
            }
        }
        let mut watched = false;
        let mut st = self.lock();
        loop {
            if st.settled {
                return st.result();
            }
            let left = match deadline {
                None => None,
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Err(Error::TimedOut(timeout.unwrap_or_default())),
                },
            };
            // About to sleep until the backend's event: it must be watching.
            if let (false, Pending::Transfer(id)) = (watched, st.pending) {
                watched = true;
                drop(st);
                // A backend call: not under the lock.
                self.backend.awaiting_end(id);
                st = self.lock();
                continue;
            }
            st = self.sleep(st, left);
        }
    }

    /// Future-style readiness for the future owning waker slot `slot`
    /// (`None` until its first poll): keeps that future's latest waker only.
    pub(crate) fn poll_settled(
        &self,
        slot: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        {
            let st = self.lock();
            if st.settled {
                return Poll::Ready(st.result());
            }
            let current = slot.and_then(|s| st.wakers.iter().find(|(id, _)| *id == s));
            if current.is_some_and(|(_, w)| w.will_wake(cx.waker())) {
                return Poll::Pending;
            }
        }
        // Cloning a waker runs the executor's code: not under the lock.
        let waker = cx.waker().clone();
        let (replaced, watch) = {
            let mut st = self.lock();
            if st.settled {
                let result = st.result();
                drop(st);
                drop(waker);
                return Poll::Ready(result);
            }
            let existing = slot.and_then(|s| st.wakers.iter_mut().find(|(id, _)| *id == s));
            match existing {
                Some((_, w)) => (Some(std::mem::replace(w, waker)), None),
                None => {
                    let id = st.next_slot;
                    st.next_slot += 1;
                    st.wakers.push((id, waker));
                    *slot = Some(id);
                    // A new future now depends on the backend's event.
                    let transfer = match st.pending {
                        Pending::Transfer(transfer) => Some(transfer),
                        _ => None,
                    };
                    (None, transfer)
                }
            }
        };
        drop(replaced);
        if let Some(transfer) = watch {
            // A backend call: not under the lock.
            self.backend.awaiting_end(transfer);
        }
        Poll::Pending
    }

    /// Forgets the waker of a future that is going away.
    pub(crate) fn forget_waker(&self, slot: u64) {
        let removed = {
            let mut st = self.lock();
            st.wakers
                .iter()
                .position(|(id, _)| *id == slot)
                .map(|i| st.wakers.swap_remove(i))
        };
        drop(removed);
    }

    /// Wakers currently registered (one per pending future).
    #[cfg(test)]
    pub(crate) fn waker_count(&self) -> usize {
        self.lock().wakers.len()
    }

    /// What the backend holds right now.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> Pending {
        self.lock().pending
    }
}
