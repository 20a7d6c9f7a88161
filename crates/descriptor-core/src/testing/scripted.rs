//! A scripted backend for the core's own tests and its loom model: every answer
//! that matters to the operation state machine is set by the test, so the
//! paths a real backend reaches only now and then (NIXL's `Draining` and
//! `Leaked`, a backend that panics) run on every test.
//!
//! Its memory accounting is the point: [`Scripted::tracked`] makes descriptors
//! whose memory records when it is freed, and [`Scripted::freed_early`] says
//! whether any was freed while the backend had not let go of it.
#![allow(clippy::unwrap_used, clippy::panic)]
// The loom model uses only part of it.
#![cfg_attr(loom, allow(dead_code))]

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

// Under loom, the atomics that record what the backend did are loom's, so that
// every backend call is a point where the model may switch threads.
use crate::sync::{AtomicBool, AtomicUsize, Ordering};

use crate::backend::{
    EventHook, Exposure, ExposureId, Notification, Posted, RegionId, RegistrationBackend, Release,
    Segment, TransferId, TransferRequest, TransferState,
};
use crate::descriptor::Descriptor;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::metadata::OperationKind;

/// What `release` answers next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Script {
    /// `Ok(Release::LetGo)`.
    LetGo,
    /// `Ok(Release::StillRunning)`: ask again.
    Busy,
    /// `Err`: lost track of it.
    Lost,
    /// A backend bug.
    Panic,
}

/// A backend whose answers the test scripts; see the module docs.
pub(crate) struct Scripted {
    /// What `poll` answers.
    pub(crate) poll: Mutex<TransferState>,
    /// Whether `poll` panics.
    pub(crate) poll_panics: AtomicBool,
    /// What `release` answers, in turn; [`Script::LetGo`] once empty.
    pub(crate) releases: Mutex<VecDeque<Script>>,
    /// Whether `revoke` panics.
    pub(crate) revoke_panics: AtomicBool,
    /// What `revocation_enforced` answers.
    pub(crate) enforced: bool,
    /// Notifications `drain_notifications` hands out next.
    pub(crate) inbox: Mutex<Vec<Notification>>,
    /// The hook, if the test made the backend event-driven.
    hook: Mutex<Option<EventHook>>,
    event_driven: bool,
    /// Set once the backend let go of the memory (release `Ok(true)`, or a
    /// revoke that is enforced).
    let_go: Arc<AtomicBool>,
    freed_early: Arc<AtomicBool>,
    next: AtomicU64,
    /// Transfers posted and not released.
    pub(crate) live_transfers: AtomicUsize,
    /// Calls to `poll`, `release` and `revoke`.
    calls: AtomicUsize,
    /// `poll` answers `InProgress` this many more times before the scripted
    /// answer (a transfer that takes a few polls).
    pub(crate) polls_before_done: AtomicUsize,
    /// What `wait_assist` answers.
    pub(crate) assist: Mutex<std::time::Duration>,
    /// Calls to `awaiting_end`.
    pub(crate) watched: AtomicUsize,
    /// Successful calls to `register` and `deregister`.
    pub(crate) registered: AtomicUsize,
    pub(crate) deregistered: AtomicUsize,
    /// Whether `deregister` fails.
    pub(crate) deregister_fails: AtomicBool,
    /// Run by the next `register` before it answers (then dropped); with
    /// `refuse_registration`, that call fails.
    #[cfg(not(loom))]
    pub(crate) on_register: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    #[cfg(not(loom))]
    pub(crate) refuse_registration: AtomicBool,
    /// When set, `release` blocks until this receives (or its sender is
    /// dropped): a settle caught in the middle.
    #[cfg(not(loom))]
    pub(crate) release_gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Scripted {
    pub(crate) fn new(enforced: bool, event_driven: bool) -> Scripted {
        Scripted {
            poll: Mutex::new(TransferState::InProgress),
            poll_panics: AtomicBool::new(false),
            releases: Mutex::new(VecDeque::new()),
            revoke_panics: AtomicBool::new(false),
            enforced,
            inbox: Mutex::new(Vec::new()),
            hook: Mutex::new(None),
            event_driven,
            let_go: Arc::new(AtomicBool::new(false)),
            freed_early: Arc::new(AtomicBool::new(false)),
            next: AtomicU64::new(1),
            live_transfers: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
            polls_before_done: AtomicUsize::new(0),
            assist: Mutex::new(std::time::Duration::ZERO),
            watched: AtomicUsize::new(0),
            registered: AtomicUsize::new(0),
            deregistered: AtomicUsize::new(0),
            deregister_fails: AtomicBool::new(false),
            #[cfg(not(loom))]
            on_register: Mutex::new(None),
            #[cfg(not(loom))]
            refuse_registration: AtomicBool::new(false),
            #[cfg(not(loom))]
            release_gate: Mutex::new(None),
        }
    }

    pub(crate) fn script_releases(&self, answers: &[Script]) {
        self.releases.lock().unwrap().extend(answers);
    }

    pub(crate) fn set_poll(&self, state: TransferState) {
        *self.poll.lock().unwrap() = state;
    }

    /// Records that a peer said it is done with the memory (what a
    /// notification means).
    #[cfg(loom)]
    pub(crate) fn peer_done(&self) {
        self.let_go.store(true, Ordering::SeqCst);
    }

    /// Whether the backend has let go of the memory.
    pub(crate) fn let_go(&self) -> bool {
        self.let_go.load(Ordering::SeqCst)
    }

    /// Whether tracked memory was freed before the backend let go of it.
    pub(crate) fn freed_early(&self) -> bool {
        self.freed_early.load(Ordering::SeqCst)
    }

    /// Calls the event hook, as a backend does on completion or notification.
    pub(crate) fn signal(&self) {
        let hook = self.hook.lock().unwrap().clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    /// A descriptor of `len` bytes whose memory, when freed, checks that the
    /// backend had let go of it; the counter counts frees.
    pub(crate) fn tracked(&self, len: usize) -> (Descriptor, Arc<AtomicUsize>) {
        let freed = Arc::new(AtomicUsize::new(0));
        let mut memory = vec![0u8; len].into_boxed_slice();
        let ptr = memory.as_mut_ptr();
        let owner = Tracked {
            _memory: memory,
            freed: Arc::clone(&freed),
            let_go: Arc::clone(&self.let_go),
            freed_early: Arc::clone(&self.freed_early),
        };
        // SAFETY: `owner` holds the heap block `ptr` points into, and travels
        // with the descriptor as its keep-alive, so the memory lives exactly as
        // long as the descriptor's buffer.
        let descriptor =
            unsafe { Descriptor::from_raw_parts(ptr, len, Device::HOST, Some(Box::new(owner))) }
                .unwrap();
        (descriptor, freed)
    }

    /// The scripted state of a transfer, counting down `polls_before_done`.
    fn answer(&self) -> TransferState {
        let pending = self.polls_before_done.load(Ordering::SeqCst);
        if pending > 0 {
            self.polls_before_done.store(pending - 1, Ordering::SeqCst);
            return TransferState::InProgress;
        }
        self.poll.lock().unwrap().clone()
    }

    fn id(&self) -> u64 {
        self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

/// The owner of tracked memory: checks the backend let go before it is freed.
struct Tracked {
    _memory: Box<[u8]>,
    freed: Arc<AtomicUsize>,
    let_go: Arc<AtomicBool>,
    freed_early: Arc<AtomicBool>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.let_go.load(Ordering::SeqCst) {
            self.freed_early.store(true, Ordering::SeqCst);
        }
        self.freed.fetch_add(1, Ordering::SeqCst);
    }
}

impl RegistrationBackend for Scripted {
    fn backend_name(&self) -> &'static str {
        "scripted"
    }

    fn agent_name(&self) -> &str {
        "scripted"
    }

    unsafe fn register(&self, _region: &Segment, _writable: bool) -> Result<RegionId> {
        #[cfg(not(loom))]
        {
            let hook = self.on_register.lock().unwrap().take();
            if let Some(hook) = hook {
                hook();
                if self.refuse_registration.load(Ordering::SeqCst) {
                    return Err(Error::backend("scripted", "register", "already registered"));
                }
            }
        }
        self.registered.fetch_add(1, Ordering::SeqCst);
        Ok(RegionId(self.id()))
    }

    fn deregister(&self, _region: RegionId) -> Result<()> {
        if self.deregister_fails.load(Ordering::SeqCst) {
            return Err(Error::backend("scripted", "deregister", "refused"));
        }
        self.deregistered.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    unsafe fn expose(
        &self,
        _ranges: &[crate::Exposed],
        _access: OperationKind,
        _key: &[u8],
    ) -> Result<Exposure> {
        Ok(Exposure {
            id: ExposureId(self.id()),
            agent_metadata: b"scripted agent".to_vec(),
        })
    }

    fn revoke(&self, _exposure: ExposureId) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.revoke_panics.load(Ordering::SeqCst) {
            panic!("scripted: revoke panicked");
        }
        if self.enforced {
            self.let_go.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    fn revocation_enforced(&self) -> bool {
        self.enforced
    }

    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        if agent_metadata == b"scripted agent" {
            Ok("scripted peer".into())
        } else {
            Err(Error::InvalidMetadata {
                field: "nixl_metadata".into(),
                reason: "not scripted".into(),
            })
        }
    }

    fn unload_remote(&self, _peer: &str) -> Result<()> {
        Ok(())
    }

    unsafe fn post(&self, _request: &TransferRequest<'_>) -> Result<Posted> {
        self.live_transfers.fetch_add(1, Ordering::SeqCst);
        // What a poll would answer now: a scripted end set before the post is
        // an end inside `post`.
        Ok(Posted {
            id: TransferId(self.id()),
            state: self.answer(),
        })
    }

    fn poll(&self, _transfer: TransferId) -> TransferState {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.poll_panics.load(Ordering::SeqCst) {
            panic!("scripted: poll panicked");
        }
        self.answer()
    }

    fn release(&self, _transfer: TransferId) -> Result<Release> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        #[cfg(not(loom))]
        if let Some(gate) = self.release_gate.lock().unwrap().take() {
            let _ = gate.recv();
        }
        let answer = self
            .releases
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Script::LetGo);
        match answer {
            Script::LetGo => {
                self.let_go.store(true, Ordering::SeqCst);
                self.live_transfers.fetch_sub(1, Ordering::SeqCst);
                Ok(Release::LetGo)
            }
            Script::Busy => Ok(Release::StillRunning),
            Script::Lost => Err(Error::backend(
                "scripted",
                "release",
                "lost track of the transfer",
            )),
            Script::Panic => panic!("scripted: release panicked"),
        }
    }

    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()> {
        let arrived = std::mem::take(&mut *self.inbox.lock().unwrap());
        if !arrived.is_empty() {
            // A peer that notified is done with the memory it was given.
            self.let_go.store(true, Ordering::SeqCst);
        }
        arrived.into_iter().for_each(sink);
        Ok(())
    }

    fn wait_assist(&self) -> std::time::Duration {
        *self.assist.lock().unwrap()
    }

    fn awaiting_end(&self, _transfer: TransferId) {
        self.watched.fetch_add(1, Ordering::SeqCst);
    }

    fn set_event_hook(&self, hook: EventHook) -> bool {
        if self.event_driven {
            *self.hook.lock().unwrap() = Some(hook);
        }
        self.event_driven
    }
}
