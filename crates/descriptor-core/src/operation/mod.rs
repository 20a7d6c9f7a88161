//! The four operations: passive [`ReadableOperation`] / [`WritableOperation`]
//! expose memory to a peer; active [`ReadOperation`] / [`WriteOperation`] move
//! bytes to or from a peer's exposed memory.
//!
//! Every operation owns its descriptors while a transfer may touch them, and can
//! be waited on three ways: [`status`](ReadOperation::status) (non-blocking),
//! [`wait`](ReadOperation::wait) / [`wait_timeout`](ReadOperation::wait_timeout)
//! (blocking), and as a `Future` ([`completion`](ReadOperation::completion), or
//! `.await` on the operation itself to get the descriptors back). The futures
//! work under any executor: the progress engine wakes them.
//!
//! Dropping an unfinished operation cancels it. Its buffers are freed only once
//! the backend has let go of them; where that cannot be known (a NIXL peer that
//! was given a passive operation's metadata may still write after cancellation,
//! or a transfer the backend failed to abort) the buffers are leaked instead,
//! with an error in the log. `mem::forget` on an operation leaks its buffers too;
//! neither can lead to a use-after-free.

mod held;
pub(crate) mod state;

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::connector::Connector;
use crate::descriptor::Descriptor;
use crate::engine::PassiveWaiter;
use crate::error::{Error, Result};
use crate::metadata::RdmaMetadata;
use state::{OpShared, Outcome};

#[cfg(all(test, loom))]
mod loom;
#[cfg(all(test, not(loom)))]
mod tests;

pub(crate) use held::Held;
pub use state::OperationStatus;

/// What following an operation to its end takes: its shared state and, for a
/// passive operation, the connector whose engine delivers its notification.
/// Owned (two reference counts), so that a [`Completion`] borrows nothing.
#[derive(Clone)]
struct Progress {
    shared: Arc<OpShared>,
    passive: Option<Connector>,
}

impl Progress {
    /// A passive operation's notification may be waiting in the engine
    /// (see `Handoff`): delivers it before the operation is looked at.
    fn catch_up(&self) {
        if let Some(connector) = &self.passive {
            connector.engine().catch_up();
        }
    }

    /// Counts a waiter for a passive operation, so that its notification is
    /// delivered as it arrives; then catches up with what arrived before.
    fn count_waiter(&self) -> Option<PassiveWaiter> {
        let waiter = self.passive.as_ref().map(|c| c.engine().count_waiter());
        self.catch_up();
        waiter
    }

    fn status(&self) -> OperationStatus {
        self.catch_up();
        self.shared.status()
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let _waiter = self.count_waiter();
        self.shared.wait(timeout)
    }

    /// Polls for the end, counted as a waiter while pending.
    fn poll(
        &self,
        slot: &mut Option<u64>,
        waiter: &mut Option<PassiveWaiter>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        if waiter.is_none() {
            *waiter = self.count_waiter();
        } else {
            self.catch_up();
        }
        let polled = self.shared.poll_settled(slot, cx);
        if polled.is_ready() {
            *waiter = None;
        }
        polled
    }
}

/// What the four public operation types share.
pub(crate) struct OperationCore {
    progress: Progress,
    /// Leaked if dropped: handed back only through `into_descriptors`, or to
    /// the shared state (which frees them once the backend let go) on drop.
    descriptors: Held,
    connector: Connector,
    passive_key: Option<Arc<[u8]>>,
}

impl OperationCore {
    pub(crate) fn new(
        shared: Arc<OpShared>,
        descriptors: Held,
        connector: Connector,
        passive_key: Option<Arc<[u8]>>,
    ) -> OperationCore {
        OperationCore {
            progress: Progress {
                shared,
                passive: passive_key.is_some().then(|| connector.clone()),
            },
            descriptors,
            connector,
            passive_key,
        }
    }

    fn shared(&self) -> &OpShared {
        &self.progress.shared
    }

    fn into_descriptors(mut self) -> Result<Vec<Descriptor>, OperationCore> {
        self.progress.catch_up();
        if self.shared().memory_released() {
            Ok(std::mem::take(&mut self.descriptors).release())
        } else {
            Err(self)
        }
    }
}

impl Drop for OperationCore {
    fn drop(&mut self) {
        // A notification that arrived for a passive operation completes it
        // first, so that it is not cancelled. It completes only when the
        // engine, taking its notification, has already stopped tracking it.
        self.progress.catch_up();
        if let Some(key) = &self.passive_key
            && self.shared().status() != OperationStatus::Complete
        {
            self.connector.engine().untrack_passive(key);
        }
        self.progress
            .shared
            .abandon(std::mem::take(&mut self.descriptors));
    }
}

/// Resolves when an operation ends: `Ok(())` when complete, `Err` when it was
/// cancelled or failed. Returned by `completion()`; several may wait on one
/// operation at once. It borrows nothing: it may outlive the operation (it
/// then resolves when the dropped operation's end is decided), and does not
/// keep the operation from handing its descriptors back.
#[must_use = "futures do nothing unless polled"]
pub struct Completion {
    progress: Progress,
    /// This future's waker slot in the operation, once polled.
    slot: Option<u64>,
    /// Counts this future as a waiter of a passive operation while pending.
    waiter: Option<PassiveWaiter>,
}

impl Future for Completion {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        this.progress.poll(&mut this.slot, &mut this.waiter, cx)
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            self.progress.shared.forget_waker(slot);
        }
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("status", &self.progress.shared.status())
            .finish()
    }
}

/// The future of an operation awaited by value: resolves to its descriptors once
/// complete. Dropping it drops (and so cancels) the operation.
#[must_use = "futures do nothing unless polled"]
pub struct OperationFuture {
    core: Option<OperationCore>,
    slot: Option<u64>,
    waiter: Option<PassiveWaiter>,
}

impl Future for OperationFuture {
    type Output = Result<Vec<Descriptor>>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(core) = this.core.as_ref() else {
            return Poll::Ready(Err(Error::PolledAfterCompletion));
        };
        match core.progress.poll(&mut this.slot, &mut this.waiter, cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => {
                // Settled: the operation took every waker out already.
                this.slot = None;
                let backend = core.shared().backend_name();
                let core = this.core.take();
                match (result, core.map(OperationCore::into_descriptors)) {
                    (Ok(()), Some(Ok(descriptors))) => Poll::Ready(Ok(descriptors)),
                    (Err(e), _) => Poll::Ready(Err(e)),
                    (Ok(()), _) => Poll::Ready(Err(Error::backend(
                        backend,
                        "hand back the operation's memory",
                        "the backend did not let go of it: it is leaked, never freed",
                    ))),
                }
            }
        }
    }
}

impl Drop for OperationFuture {
    fn drop(&mut self) {
        if let (Some(core), Some(slot)) = (&self.core, self.slot) {
            core.shared().forget_waker(slot);
        }
    }
}

impl std::fmt::Debug for OperationFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperationFuture")
            .field("status", &self.core.as_ref().map(|c| c.shared().status()))
            .finish()
    }
}

macro_rules! operation_common {
    ($ty:ident) => {
        impl $ty {
            /// Current status, without waiting for the peer. It turns
            /// terminal as soon as the outcome is decided, possibly a moment
            /// before the backend has let go of the memory; [`wait`](Self::wait)
            /// returns after that. A passive operation whose peer's
            /// notification has arrived is completed first, with calls into
            /// the backend that do not block (taking the notification,
            /// revoking the exposure); it never waits for another thread's
            /// call into the backend.
            pub fn status(&self) -> OperationStatus {
                self.core.progress.status()
            }

            /// Blocks until the operation ends: `Ok` when complete, `Err` when
            /// cancelled ([`Error::Cancelled`]) or failed ([`Error::TransferFailed`]).
            /// When it returns, the backend has been asked to let go of the
            /// memory, so [`into_descriptors`](Self::into_descriptors) succeeds
            /// unless the backend still holds it.
            pub fn wait(&self) -> Result<()> {
                self.core.progress.wait(None)
            }

            /// Like [`wait`](Self::wait), giving up with [`Error::TimedOut`] after
            /// `timeout`; the operation itself goes on.
            pub fn wait_timeout(&self, timeout: Duration) -> Result<()> {
                self.core.progress.wait(Some(timeout))
            }

            /// A future that resolves when the operation ends, like [`wait`](Self::wait).
            pub fn completion(&self) -> Completion {
                Completion {
                    progress: self.core.progress.clone(),
                    slot: None,
                    waiter: None,
                }
            }

            /// Cancels the operation unless it already ended (then it does nothing).
            ///
            /// The memory comes back only once no peer or transfer can touch
            /// it. A transfer the backend cannot abort (NIXL) drains first, and
            /// [`into_descriptors`](Self::into_descriptors) succeeds once it has.
            /// A *passive* operation cancelled on a backend that cannot revoke a
            /// peer's access (NIXL: see
            /// [`Connector::revocation_enforced`](crate::Connector::revocation_enforced))
            /// never gives its memory back: a peer holding the metadata might
            /// still write, so the buffers are leaked. To get them back there,
            /// let the peer finish (wait for completion) instead of cancelling.
            pub fn cancel(&self) {
                self.core.progress.catch_up();
                self.core.shared().finish(Outcome::Cancelled);
            }

            /// Blocks until the operation has ended and the backend has let
            /// go of its memory, at most `timeout`: true once
            /// [`into_descriptors`](Self::into_descriptors) succeeds. After a
            /// [`cancel`](Self::cancel) this waits for a transfer the backend
            /// could not abort to drain, the moment from which no byte of
            /// it lands any more. False if `timeout` passed first, or at
            /// once for memory that is never given back (a cancelled passive
            /// operation where revocation is not enforced).
            pub fn wait_released(&self, timeout: Duration) -> bool {
                self.core.progress.catch_up();
                self.core.shared().wait_released(timeout)
            }

            /// Number of descriptors the operation holds.
            pub fn len(&self) -> usize {
                self.core.descriptors.len()
            }

            /// Whether the operation holds no descriptors (never true in practice).
            pub fn is_empty(&self) -> bool {
                self.core.descriptors.is_empty()
            }

            /// Gives the descriptors back once the operation has ended and the
            /// backend has let go of them; otherwise gives the operation back.
            ///
            /// After a successful [`wait`](Self::wait) this succeeds, and so it
            /// does once [`status`](Self::status) reads `Complete` (if another
            /// thread is still letting go of the memory, this waits for it: one
            /// backend call that does not block). After a cancel it succeeds
            /// once a draining transfer has finished, and never for a cancelled
            /// passive operation on a backend that cannot revoke access (see
            /// [`cancel`](Self::cancel)).
            #[allow(clippy::needless_update, clippy::result_large_err)]
            pub fn into_descriptors(self) -> Result<Vec<Descriptor>, $ty> {
                self.core
                    .into_descriptors()
                    .map_err(|core| $ty { core, ..self })
            }
        }

        impl IntoFuture for $ty {
            type Output = Result<Vec<Descriptor>>;
            type IntoFuture = OperationFuture;
            /// Awaits completion and returns the descriptors.
            fn into_future(self) -> OperationFuture {
                OperationFuture {
                    core: Some(self.core),
                    slot: None,
                    waiter: None,
                }
            }
        }

        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                // The status as last decided: formatting delivers nothing.
                f.debug_struct(stringify!($ty))
                    .field("status", &self.core.shared().status())
                    .field("descriptors", &self.core.descriptors.len())
                    .finish()
            }
        }
    };
}

/// Exposes local memory for one peer to READ. Completes when the peer notifies.
pub struct ReadableOperation {
    core: OperationCore,
    metadata: RdmaMetadata,
}

/// Exposes local memory for one peer to WRITE. Completes when the peer notifies.
pub struct WritableOperation {
    core: OperationCore,
    metadata: RdmaMetadata,
}

/// READs a peer's readable memory into local descriptors.
pub struct ReadOperation {
    core: OperationCore,
}

/// WRITEs local descriptors into a peer's writable memory.
pub struct WriteOperation {
    core: OperationCore,
}

operation_common!(ReadableOperation);
operation_common!(WritableOperation);
operation_common!(ReadOperation);
operation_common!(WriteOperation);

impl ReadableOperation {
    pub(crate) fn new((core, metadata): (OperationCore, RdmaMetadata)) -> Self {
        ReadableOperation { core, metadata }
    }

    /// What to hand the peer (out of band) so it can READ this memory.
    pub fn metadata(&self) -> &RdmaMetadata {
        &self.metadata
    }
}

impl WritableOperation {
    pub(crate) fn new((core, metadata): (OperationCore, RdmaMetadata)) -> Self {
        WritableOperation { core, metadata }
    }

    /// What to hand the peer (out of band) so it can WRITE this memory.
    pub fn metadata(&self) -> &RdmaMetadata {
        &self.metadata
    }
}

impl ReadOperation {
    pub(crate) fn new(core: OperationCore) -> Self {
        ReadOperation { core }
    }
}

impl WriteOperation {
    pub(crate) fn new(core: OperationCore) -> Self {
        WriteOperation { core }
    }
}
