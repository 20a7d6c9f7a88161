//! The state an operation shares with the progress engine.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::backend::{ExposureId, RegistrationBackend, TransferId, TransferState};
use crate::connector::RemoteLease;
use crate::error::{Error, Result};

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

/// How an operation ended.
pub(crate) enum Outcome {
    Complete,
    Cancelled,
    Failed(String),
}

/// What the backend still holds for an operation.
pub(crate) enum Pending {
    Nothing,
    Transfer(TransferId),
    Exposure(ExposureId),
}

pub(crate) struct OpState {
    status: OperationStatus,
    error: Option<String>,
    pending: Pending,
    lease: Option<RemoteLease>,
    /// Whether the backend is known to have let go of the operation's memory,
    /// so the buffers may go back to safe code or be freed.
    memory_released: bool,
    wakers: Vec<Waker>,
}

/// Shared between an operation, its waiters and the progress engine.
pub(crate) struct OpShared {
    backend: Arc<dyn RegistrationBackend>,
    state: Mutex<OpState>,
    done: Condvar,
    kind: &'static str,
    bytes: usize,
    started: Instant,
}

impl OpShared {
    pub(crate) fn new(
        backend: Arc<dyn RegistrationBackend>,
        kind: &'static str,
        bytes: usize,
        status: OperationStatus,
        pending: Pending,
        lease: Option<RemoteLease>,
    ) -> Arc<OpShared> {
        Arc::new(OpShared {
            backend,
            state: Mutex::new(OpState {
                status,
                error: None,
                memory_released: matches!(pending, Pending::Nothing),
                pending,
                lease,
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

    pub(crate) fn memory_released(&self) -> bool {
        let st = self.lock();
        st.status.is_terminal() && st.memory_released
    }

    /// Ends the operation unless it already ended; releases what the backend holds.
    pub(crate) fn finish(&self, outcome: Outcome) {
        let mut st = self.lock();
        let lease = self.finish_locked(&mut st, outcome);
        drop(st);
        // Unloading the peer may call into the backend: do it unlocked.
        drop(lease);
    }

    fn finish_locked(&self, st: &mut OpState, outcome: Outcome) -> Option<RemoteLease> {
        if st.status.is_terminal() {
            return None;
        }
        let (status, error) = match outcome {
            Outcome::Complete => (OperationStatus::Complete, None),
            Outcome::Cancelled => (OperationStatus::Cancelled, None),
            Outcome::Failed(reason) => (OperationStatus::Errored, Some(reason)),
        };
        match std::mem::replace(&mut st.pending, Pending::Nothing) {
            Pending::Nothing => {}
            Pending::Transfer(id) => match self.backend.release(id) {
                Ok(()) => st.memory_released = true,
                Err(error) => {
                    tracing::error!(%error, transfer = id.0, "backend kept the transfer; its buffers will be leaked, not freed");
                }
            },
            Pending::Exposure(id) => {
                let revoked = match self.backend.revoke(id) {
                    Ok(()) => self.backend.revocation_enforced(),
                    Err(error) => {
                        tracing::error!(%error, exposure = id.0, "revocation failed");
                        false
                    }
                };
                // A peer that notified completion is done with the memory.
                st.memory_released = revoked || status == OperationStatus::Complete;
            }
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
        st.lease.take()
    }

    /// Polls the backend for an active operation's transfer; true once terminal.
    pub(crate) fn poll_transfer(&self) -> bool {
        let mut st = self.lock();
        let Pending::Transfer(id) = st.pending else {
            return st.status.is_terminal();
        };
        let outcome = match self.backend.poll(id) {
            TransferState::InProgress => return false,
            TransferState::Done => Outcome::Complete,
            TransferState::Failed(reason) => Outcome::Failed(reason),
        };
        let lease = self.finish_locked(&mut st, outcome);
        drop(st);
        drop(lease);
        true
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
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        // A timeout too large to represent is no timeout.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
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
