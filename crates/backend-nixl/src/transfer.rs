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

use crate::agents::lock;
use crate::route::Route;
use crate::watcher::Live;

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
    /// after it released the transfer map's lock ([`Live::send_apart`]).
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
}

impl Live {
    /// The state of transfer `id` (`InProgress` while it runs), `None` if
    /// there is no such transfer. Looks through the agent that posted it
    /// and, if the transfer's notification is due, sends it once the map's
    /// lock is released.
    pub(crate) fn state(&self, id: u64, asker: Asker) -> Option<TransferState> {
        let look = {
            let mut transfers = lock(&self.transfers);
            let t = transfers.get_mut(&id)?;
            if asker == Asker::Waiter {
                t.assisted = Some(Instant::now());
            }
            t.look(self.agents.posting(t.route.poster()))
        };
        Some(self.settle(id, look))
    }

    /// Acts on a look taken under the transfer map's lock, after it: sends
    /// a notification that is due, records a proven endpoint.
    pub(crate) fn settle(&self, id: u64, look: Look) -> TransferState {
        match look {
            Look::Running => TransferState::InProgress,
            Look::Ended(state) => state,
            Look::Proved { peer } => {
                self.agents.notifiers.proved(&peer);
                TransferState::Done
            }
            Look::SendApart(apart) => self.send_apart(id, &apart),
        }
    }

    /// Sends, from the serving agent, the notification that a look at
    /// transfer `id` handed out ([`Look::SendApart`]), and records the
    /// transfer's end: Done once NIXL took the notification, else why not
    /// (the bytes moved, but the peer was not told). A system call: called
    /// without the transfer map's lock, which it takes only to record.
    fn send_apart(&self, id: u64, apart: &ApartNotification) -> TransferState {
        let state = match self
            .agents
            .serving
            .send_notification(&apart.peer, &apart.payload, None)
        {
            Ok(()) => TransferState::Done,
            Err(e) => TransferState::failed(format!(
                "the transfer completed, but sending its notification to peer {:?} failed: {e}",
                apart.peer
            )),
        };
        if let Some(t) = lock(&self.transfers).get_mut(&id) {
            t.notifying = false;
            t.finished = Some(state.clone());
        }
        state
    }
}
