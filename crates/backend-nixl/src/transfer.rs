//! A posted transfer's states, and asking NIXL about them.
//!
//! NIXL's C API has no completion callback: a transfer's end is found by
//! asking (`get_xfer_status`), from a waiting thread or the watcher
//! ([`crate::watcher`]). A transfer whose notification goes apart
//! ([`Route::Apart`]) ends only once the serving agent sent it.

use std::sync::Arc;
use std::time::Instant;

use descriptor_core::{SharedCause, TransferState};
use nixl_sys::{Agent, XferRequest, XferStatus};

use crate::route::Route;

/// A posted transfer.
pub(crate) struct Transfer {
    pub(crate) request: XferRequest,
    pub(crate) route: Route,
    /// The name NIXL knows the peer by.
    pub(crate) peer: String,
    /// When a waiting thread (not the watcher) last asked about it.
    pub(crate) assisted: Option<Instant>,
    /// Set once NIXL reported the end (or the post failed), and the
    /// notification, if it goes apart, was sent.
    pub(crate) finished: Option<TransferState>,
    /// Why the post itself failed, reported once NIXL says the request is idle.
    pub(crate) post_error: Option<SharedCause>,
    /// The notification the serving agent sends once NIXL reports the
    /// transfer done; `None` unless [`Route::Apart`], or once handed out to
    /// be sent.
    pub(crate) apart: Option<ApartNotification>,
    /// A thread is sending the notification: the transfer counts as running
    /// until that thread records the end.
    notifying: bool,
    /// A storage transfer (posted to the initiating agent itself), not one
    /// with a peer.
    pub(crate) storage: bool,
}

/// A transfer's notification, sent apart from it.
pub(crate) struct ApartNotification {
    pub(crate) peer: String,
    pub(crate) payload: Box<[u8]>,
}

/// Who asks about a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asker {
    /// A thread waiting for it: the watcher leaves it to that thread for a
    /// while ([`Tuning::assisted`](crate::Tuning::assisted)).
    Waiter,
    /// The watcher, the connector's hook on it, or the backend itself (a
    /// post, a release).
    Internal,
}

/// What a look at a transfer found.
pub(crate) enum Look {
    /// Still running, or another thread is sending its notification.
    Running,
    /// Ended, recorded.
    Ended(TransferState),
    /// Ended Done through the proving route: the caller records the peer's
    /// serving endpoint as proven, after it released the transfer map's lock.
    Proved { peer: String },
    /// NIXL reports it done, and its notification is the caller's to send,
    /// after it released the transfer map's lock
    /// ([`Live::send_apart`](crate::watcher::Live::send_apart)).
    SendApart(ApartNotification),
}

impl Transfer {
    pub(crate) fn new(
        request: XferRequest,
        route: Route,
        peer: String,
        post_error: Option<SharedCause>,
        apart: Option<ApartNotification>,
    ) -> Transfer {
        Transfer {
            request,
            route,
            peer,
            assisted: None,
            finished: None,
            post_error,
            apart,
            notifying: false,
            storage: false,
        }
    }

    /// A storage transfer, posted through the initiating agent to itself.
    pub(crate) fn file(
        request: XferRequest,
        agent: String,
        post_error: Option<SharedCause>,
    ) -> Transfer {
        Transfer {
            storage: true,
            ..Transfer::new(request, Route::Silent, agent, post_error, None)
        }
    }

    /// Asks NIXL (through `agent`, the one that posted it) whether the
    /// transfer ended, and records the end.
    ///
    /// A transfer whose notification goes apart ends only once the serving
    /// agent sent it: the passive side then learns of the transfer only
    /// after the bytes are in place (NIXL reports a transfer done once it
    /// flushed its endpoint), and the initiator's operation does not end
    /// before its peer was told.
    pub(crate) fn look(&mut self, agent: &Agent) -> Look {
        if let Some(state) = &self.finished {
            return Look::Ended(state.clone());
        }
        if self.notifying {
            return Look::Running;
        }
        let state = match (agent.get_xfer_status(&self.request), &self.post_error) {
            (Ok(XferStatus::InProgress), _) => return Look::Running,
            (_, Some(post_error)) => TransferState::Failed(Arc::clone(post_error)),
            (Ok(XferStatus::Success), None) => match self.apart.take() {
                Some(apart) => {
                    self.notifying = true;
                    return Look::SendApart(apart);
                }
                None if self.route == Route::Proving => {
                    self.finished = Some(TransferState::Done);
                    return Look::Proved {
                        peer: self.peer.clone(),
                    };
                }
                None => TransferState::Done,
            },
            (Err(e), None) => TransferState::failed(e),
        };
        self.finished = Some(state.clone());
        Look::Ended(state)
    }

    /// The notification a look handed out ([`Look::SendApart`]) was sent,
    /// or failed: the transfer ended as `state`.
    pub(crate) fn notified(&mut self, state: TransferState) {
        self.notifying = false;
        self.finished = Some(state);
    }
}
