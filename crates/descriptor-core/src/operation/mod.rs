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

pub(crate) mod state;

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::connector::Connector;
use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::metadata::RdmaMetadata;
use state::{OpShared, Outcome};

pub use state::OperationStatus;

/// What the four public operation types share.
pub(crate) struct OperationCore {
    shared: Arc<OpShared>,
    descriptors: Vec<Descriptor>,
    connector: Connector,
    passive_key: Option<Box<[u8]>>,
}

impl OperationCore {
    pub(crate) fn new(
        shared: Arc<OpShared>,
        descriptors: Vec<Descriptor>,
        connector: Connector,
        passive_key: Option<Box<[u8]>>,
    ) -> OperationCore {
        OperationCore {
            shared,
            descriptors,
            connector,
            passive_key,
        }
    }

    fn into_descriptors(mut self) -> Result<Vec<Descriptor>, OperationCore> {
        if self.shared.memory_released() {
            Ok(std::mem::take(&mut self.descriptors))
        } else {
            Err(self)
        }
    }
}

impl Drop for OperationCore {
    fn drop(&mut self) {
        self.shared.finish(Outcome::Cancelled);
        if let Some(key) = &self.passive_key {
            self.connector.engine().untrack_passive(key);
        }
        let descriptors = std::mem::take(&mut self.descriptors);
        drop(self.shared.adopt(descriptors));
    }
}

/// Resolves when an operation ends: `Ok(())` when complete, `Err` when it was
/// cancelled or failed. Returned by `completion()`.
#[must_use = "futures do nothing unless polled"]
pub struct Completion<'a> {
    shared: &'a OpShared,
}

impl Future for Completion<'_> {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.shared.poll_done(cx)
    }
}

/// The future of an operation awaited by value: resolves to its descriptors once
/// complete. Dropping it drops (and so cancels) the operation.
#[must_use = "futures do nothing unless polled"]
pub struct OperationFuture {
    core: Option<OperationCore>,
}

impl Future for OperationFuture {
    type Output = Result<Vec<Descriptor>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(core) = self.core.as_ref() else {
            return Poll::Ready(Err(Error::InvalidDescriptor(
                "the operation's descriptors were already returned".into(),
            )));
        };
        match core.shared.poll_done(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => {
                self.core = None;
                Poll::Ready(Err(e))
            }
            Poll::Ready(Ok(())) => match self.core.take().map(OperationCore::into_descriptors) {
                Some(Ok(descriptors)) => Poll::Ready(Ok(descriptors)),
                _ => Poll::Ready(Err(Error::TransferFailed(
                    "completed, but the backend did not release the memory; it is leaked, not returned".into(),
                ))),
            },
        }
    }
}

macro_rules! operation_common {
    ($ty:ident) => {
        impl $ty {
            /// Current status; never blocks.
            pub fn status(&self) -> OperationStatus {
                self.core.shared.status()
            }

            /// Blocks until the operation ends: `Ok` when complete, `Err` when
            /// cancelled ([`Error::Cancelled`]) or failed ([`Error::TransferFailed`]).
            pub fn wait(&self) -> Result<()> {
                self.core.shared.wait(None)
            }

            /// Like [`wait`](Self::wait), giving up with [`Error::TimedOut`] after
            /// `timeout`; the operation itself goes on.
            pub fn wait_timeout(&self, timeout: Duration) -> Result<()> {
                self.core.shared.wait(Some(timeout))
            }

            /// A future that resolves when the operation ends, like [`wait`](Self::wait).
            pub fn completion(&self) -> Completion<'_> {
                Completion {
                    shared: &self.core.shared,
                }
            }

            /// Cancels the operation unless it already ended (then it does nothing).
            pub fn cancel(&self) {
                self.core.shared.finish(Outcome::Cancelled);
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
                }
            }
        }

        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("status", &self.status())
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
