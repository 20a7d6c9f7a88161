//! Fault injection over any backend (feature `faults`), so error paths can be
//! tested on a laptop and the same fault tests run over every transport.
//!
//! [`Faulty`] wraps a [`RegistrationBackend`] the way a throttled or limited
//! store wraps any object store: it forwards every call, and a [`Faults`]
//! handle arms one-shot faults on it.
//!
//! ```
//! use descriptor_core::faults::Faulty;
//! use descriptor_core::{Connector, Descriptor, Error, RegistrationBackend};
//!
//! /// A WRITE from `client` (any backend) that the link refuses.
//! fn refused_write(server: &Connector, client: impl RegistrationBackend) -> descriptor_core::Result<()> {
//!     let client = Faulty::new(client);
//!     let faults = client.faults();
//!     let client = Connector::new(client);
//!
//!     let writable = server.create_writable(vec![Descriptor::new(vec![0u8; 64])?])?;
//!     faults.fail_next_transfer("link down");
//!     let write = client.begin_write(vec![Descriptor::new(vec![7u8; 64])?], writable.metadata())?;
//!     assert!(matches!(write.wait(), Err(Error::TransferFailed { .. })));
//!     Ok(())
//! }
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use crate::backend::{
    EventHook, Exposure, ExposureId, FileSpan, Notification, PeerTarget, Posted, RegionId,
    RegistrationBackend, Release, Segment, Target, TransferId, TransferRequest, TransferState,
};
use crate::error::{Cause, Error, Result, SharedCause};
use crate::metadata::OperationKind;

const NAME: &str = "faults";

/// A backend whose transfers can be made to fail, stall, lose their
/// notification, or whose agent can vanish, on command of its [`Faults`].
///
/// Without armed faults it only forwards: one lock and one map lookup more
/// per transfer call than the backend it wraps.
pub struct Faulty<B: RegistrationBackend> {
    shared: Arc<Shared<B>>,
}

/// Arms faults on one [`Faulty`] backend; clones arm the same backend. Each
/// armed fault fires once, on the next transfer the backend posts. Once the
/// backend is dropped, arming does nothing.
#[derive(Clone)]
pub struct Faults {
    target: Weak<dyn Arm>,
}

struct Shared<B> {
    inner: B,
    state: Mutex<State>,
    /// The connector's event hook, when the inner backend accepted it.
    hook: OnceLock<EventHook>,
}

#[derive(Default)]
struct State {
    armed: Armed,
    vanished: bool,
    /// Exposures made and not yet revoked, revoked for the peers if the agent vanishes.
    exposures: HashSet<ExposureId>,
    transfers: HashMap<u64, Entry>,
    next_id: u64,
    /// Transfers handed to the inner backend so far.
    posted: u64,
}

#[derive(Default)]
struct Armed {
    fail: Option<SharedCause>,
    hold: Option<Hold>,
    drop_notification: bool,
    /// The held transfer is posted even if released meanwhile.
    unabortable: bool,
}

/// How long an armed transfer waits before it is handed to the backend.
enum Hold {
    For(Duration),
    Until(Arc<Gate>),
}

impl Hold {
    fn wait(&self) {
        match self {
            Hold::For(delay) => std::thread::sleep(*delay),
            Hold::Until(gate) => gate.wait(),
        }
    }
}

/// Opened once, by [`Stall`]; waited on by the transfer it holds.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn open(&self) {
        *lock(&self.open) = true;
        self.opened.notify_all();
    }

    fn wait(&self) {
        let mut open = lock(&self.open);
        while !*open {
            open = self
                .opened
                .wait(open)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Holds the transfer armed by [`Faults::stall_next_transfer`] until it is
/// released or dropped.
#[must_use = "dropping a Stall releases the transfer at once"]
pub struct Stall {
    gate: Arc<Gate>,
}

impl Stall {
    /// Lets the held transfer go on to the backend (unless the connector
    /// released it meanwhile). A stall released before its transfer was
    /// posted lets that transfer through at once.
    pub fn release(self) {}
}

impl Drop for Stall {
    fn drop(&mut self) {
        self.gate.open();
    }
}

impl std::fmt::Debug for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stall").finish_non_exhaustive()
    }
}

enum Entry {
    /// An injected delay or stall is running; a timer thread holds the
    /// request. Not `abortable`: released meanwhile, it is still posted
    /// when the hold ends, and its release says `StillRunning` until then.
    Waiting { abortable: bool },
    /// The timer thread is inside the inner backend's `post`.
    Posting,
    /// Handed to the inner backend.
    Posted(TransferId),
    /// Failed before reaching the inner backend: nothing moved.
    Failed(SharedCause),
    /// Released while waiting: it will never be posted.
    Cancelled,
}

/// A transfer request owned by a timer thread.
struct HeldRequest {
    op: OperationKind,
    local: Vec<Segment>,
    local_regions: Vec<RegionId>,
    target: HeldTarget,
}

/// A held request's far side.
enum HeldTarget {
    Peer {
        peer: String,
        remote: Vec<Segment>,
        notification: Vec<u8>,
        notify: bool,
    },
    File(Vec<FileSpan>),
}

impl HeldTarget {
    fn of(target: &Target<'_>) -> HeldTarget {
        match target {
            Target::Peer(p) => HeldTarget::Peer {
                peer: p.peer.to_owned(),
                remote: p.remote.to_vec(),
                notification: p.notification.to_vec(),
                notify: p.notify,
            },
            Target::File(files) => HeldTarget::File(files.to_vec()),
        }
    }

    fn target(&self) -> Target<'_> {
        match self {
            HeldTarget::Peer {
                peer,
                remote,
                notification,
                notify,
            } => Target::Peer(PeerTarget {
                peer,
                remote,
                notification,
                notify: *notify,
            }),
            HeldTarget::File(files) => Target::File(files),
        }
    }
}

/// What [`Faults`] reaches, whatever the backend type.
trait Arm: Send + Sync {
    fn arm(&self, arm: &mut dyn FnMut(&mut Armed));
    fn vanish(&self) -> bool;
    /// (transfers posted to the inner backend, transfers not yet released)
    fn counts(&self) -> (u64, usize);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn vanished() -> Error {
    Error::backend(NAME, "use the agent", "the agent has vanished (injected)")
}

impl<B: RegistrationBackend> Faulty<B> {
    /// Wraps `inner`; no fault is armed.
    pub fn new(inner: B) -> Faulty<B> {
        Faulty {
            shared: Arc::new(Shared {
                inner,
                state: Mutex::new(State::default()),
                hook: OnceLock::new(),
            }),
        }
    }

    /// The handle that arms faults on this backend. Take it before moving the
    /// backend into a connector.
    pub fn faults(&self) -> Faults {
        let shared: Arc<dyn Arm> = self.shared.clone();
        Faults {
            target: Arc::downgrade(&shared),
        }
    }
}

impl<B: RegistrationBackend> std::fmt::Debug for Faulty<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faulty")
            .field("backend", &self.shared.inner.backend_name())
            .field("agent", &self.shared.inner.agent_name())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("backend_alive", &(self.target.strong_count() > 0))
            .finish()
    }
}

impl Faults {
    fn arm(&self, mut arm: impl FnMut(&mut Armed)) {
        match self.target.upgrade() {
            Some(target) => target.arm(&mut arm),
            None => tracing::debug!("fault not armed: the backend was dropped"),
        }
    }

    /// The next transfer fails with `reason` before it reaches the backend:
    /// no byte moves and the peer is not notified.
    pub fn fail_next_transfer(&self, reason: impl Into<Cause>) {
        let reason: SharedCause = Arc::from(reason.into());
        self.arm(|armed| armed.fail = Some(Arc::clone(&reason)));
    }

    /// The next transfer stays in progress for `delay` before it is handed to
    /// the backend; released meanwhile (cancelled, dropped), it never is.
    pub fn delay_next_transfer(&self, delay: Duration) {
        self.arm(|armed| armed.hold = Some(Hold::For(delay)));
    }

    /// The next transfer stays in progress for `delay`, then is handed to
    /// the backend *even if it was cancelled meanwhile*, and its memory is
    /// let go only after that: a transfer the transport cannot abort (NIXL),
    /// whose bytes land after the cancel, for tests of what may use that
    /// memory while it drains.
    pub fn drain_next_transfer(&self, delay: Duration) {
        self.arm(|armed| {
            armed.hold = Some(Hold::For(delay));
            armed.unabortable = true;
        });
    }

    /// The next transfer stays in progress until the returned [`Stall`] is
    /// released (or dropped); released meanwhile by its connector (cancelled,
    /// dropped), it is never handed to the backend. Unlike a delay, what a
    /// test checks while the transfer waits cannot be overtaken by a slow or
    /// busy machine.
    pub fn stall_next_transfer(&self) -> Stall {
        let gate = Arc::new(Gate::default());
        self.arm(|armed| armed.hold = Some(Hold::Until(Arc::clone(&gate))));
        Stall { gate }
    }

    /// The next transfer moves its bytes but its notification is lost (posted
    /// with [`notify`](crate::PeerTarget::notify) false): the peer's
    /// operation stays unfinished.
    pub fn drop_next_notification(&self) {
        self.arm(|armed| armed.drop_notification = true);
    }

    /// The agent behaves as if its process died: every exposure it made is
    /// revoked (peers' new transfers are refused where the backend enforces
    /// revocation), its transfers in flight fail, new calls fail, and
    /// notifications sent to it are lost. Returns false if it already had
    /// vanished or the backend was dropped.
    pub fn vanish(&self) -> bool {
        self.target.upgrade().is_some_and(|target| target.vanish())
    }

    /// How many transfers reached the wrapped backend so far (an injected
    /// failure does not; a delayed transfer does once its delay ran out).
    pub fn posted(&self) -> u64 {
        self.target.upgrade().map_or(0, |target| target.counts().0)
    }

    /// How many transfers the connector has not released yet: zero once
    /// every operation has ended and the backend let go of its memory.
    pub fn in_flight(&self) -> usize {
        self.target.upgrade().map_or(0, |target| target.counts().1)
    }
}

impl<B: RegistrationBackend> Arm for Shared<B> {
    fn arm(&self, arm: &mut dyn FnMut(&mut Armed)) {
        arm(&mut lock(&self.state).armed);
    }

    fn vanish(&self) -> bool {
        let exposures = {
            let mut state = lock(&self.state);
            if state.vanished {
                return false;
            }
            state.vanished = true;
            std::mem::take(&mut state.exposures)
        };
        for exposure in exposures {
            if let Err(error) = self.inner.revoke(exposure) {
                tracing::warn!(%error, "vanish: revoking an exposure failed");
            }
        }
        tracing::info!(agent = self.inner.agent_name(), "agent vanished (injected)");
        self.signal();
        true
    }

    fn counts(&self) -> (u64, usize) {
        let state = lock(&self.state);
        let in_flight = state
            .transfers
            .values()
            .filter(|e| !matches!(e, Entry::Cancelled))
            .count();
        (state.posted, in_flight)
    }
}

impl<B: RegistrationBackend> Shared<B> {
    fn signal(&self) {
        if let Some(hook) = self.hook.get() {
            hook();
        }
    }

    fn is_vanished(&self) -> bool {
        lock(&self.state).vanished
    }

    /// Adds a transfer entry and returns its id.
    fn insert(state: &mut State, entry: Entry) -> TransferId {
        state.next_id += 1;
        state.transfers.insert(state.next_id, entry);
        TransferId(state.next_id)
    }

    /// The timer thread's end of a delayed or stalled transfer: posts it unless it was
    /// released meanwhile.
    fn post_held(&self, id: TransferId, held: &HeldRequest) {
        {
            let mut state = lock(&self.state);
            let gone = state.vanished;
            match state.transfers.get_mut(&id.0) {
                Some(entry @ Entry::Waiting { .. }) if !gone => {
                    *entry = Entry::Posting;
                    state.posted += 1;
                }
                Some(entry @ Entry::Waiting { .. }) => {
                    *entry = Entry::Failed(Arc::new(vanished()));
                    drop(state);
                    self.signal();
                    return;
                }
                Some(Entry::Cancelled) => {
                    state.transfers.remove(&id.0);
                    return;
                }
                _ => return,
            }
        }
        let request = TransferRequest {
            op: held.op,
            local: &held.local,
            local_regions: &held.local_regions,
            target: held.target.target(),
        };
        // SAFETY: whoever posted to us keeps `post`'s contract: the local
        // segments stay valid and untouched until our `release` returns
        // `LetGo` for `id`, which it does not while the entry is `Posting`
        // (or an unabortable `Waiting`), and afterwards only once the inner
        // backend let go.
        let posted = unsafe { self.inner.post(&request) };
        let entry = match posted {
            Ok(inner) => Entry::Posted(inner.id),
            Err(error) => Entry::Failed(Arc::new(error)),
        };
        lock(&self.state).transfers.insert(id.0, entry);
        // The connector may be waiting for the end, or to release.
        self.signal();
    }
}

impl<B: RegistrationBackend> RegistrationBackend for Faulty<B> {
    fn backend_name(&self) -> &'static str {
        self.shared.inner.backend_name()
    }

    fn agent_name(&self) -> &str {
        self.shared.inner.agent_name()
    }

    unsafe fn register(&self, region: &Segment, writable: bool) -> Result<RegionId> {
        if self.shared.is_vanished() {
            return Err(vanished());
        }
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.shared.inner.register(region, writable) }
    }

    fn deregister(&self, region: RegionId) -> Result<()> {
        self.shared.inner.deregister(region)
    }

    unsafe fn register_file(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        writable: bool,
    ) -> Result<RegionId> {
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.shared.inner.register_file(fd, writable) }
    }

    unsafe fn expose(
        &self,
        ranges: &[crate::Exposed],
        access: OperationKind,
        key: &[u8],
    ) -> Result<Exposure> {
        if self.shared.is_vanished() {
            return Err(vanished());
        }
        // SAFETY: our caller's contract is the inner backend's.
        let exposure = unsafe { self.shared.inner.expose(ranges, access, key) }?;
        lock(&self.shared.state).exposures.insert(exposure.id);
        Ok(exposure)
    }

    fn revoke(&self, exposure: ExposureId) -> Result<()> {
        // An agent that vanished has revoked everything already.
        if lock(&self.shared.state).exposures.remove(&exposure) {
            self.shared.inner.revoke(exposure)
        } else {
            Ok(())
        }
    }

    fn revocation_enforced(&self) -> bool {
        self.shared.inner.revocation_enforced()
    }

    fn access_enforced(&self) -> bool {
        self.shared.inner.access_enforced()
    }

    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        if self.shared.is_vanished() {
            return Err(vanished());
        }
        self.shared.inner.load_remote(agent_metadata)
    }

    fn unload_remote(&self, peer: &str) -> Result<()> {
        self.shared.inner.unload_remote(peer)
    }

    fn peer_name(&self, agent_metadata: &[u8]) -> Option<String> {
        self.shared.inner.peer_name(agent_metadata)
    }

    unsafe fn post(&self, request: &TransferRequest<'_>) -> Result<Posted> {
        let armed = {
            let mut state = lock(&self.shared.state);
            if state.vanished {
                return Err(vanished());
            }
            std::mem::take(&mut state.armed)
        };
        // Only a peer is notified: a file transfer has nothing to drop.
        let dropped = match (armed.drop_notification, request.target) {
            (true, Target::Peer(peer)) => Some(TransferRequest {
                target: Target::Peer(PeerTarget {
                    notify: false,
                    ..peer
                }),
                ..*request
            }),
            _ => None,
        };
        let request = dropped.as_ref().unwrap_or(request);
        if let Some(reason) = armed.fail {
            tracing::debug!(agent = self.agent_name(), "injected transfer failure");
            let mut state = lock(&self.shared.state);
            let id = Shared::<B>::insert(&mut state, Entry::Failed(Arc::clone(&reason)));
            return Ok(Posted {
                id,
                state: TransferState::Failed(reason),
            });
        }
        let Some(hold) = armed.hold else {
            // SAFETY: our caller's contract is the inner backend's, and `release`
            // forwards to the inner backend for this transfer.
            let inner = unsafe { self.shared.inner.post(request) }?;
            let mut state = lock(&self.shared.state);
            state.posted += 1;
            let id = Shared::<B>::insert(&mut state, Entry::Posted(inner.id));
            // What the inner backend knew at post holds for ours.
            return Ok(Posted {
                id,
                state: inner.state,
            });
        };
        let held = HeldRequest {
            op: request.op,
            local: request.local.to_vec(),
            local_regions: request.local_regions.to_vec(),
            target: HeldTarget::of(&request.target),
        };
        let waiting = Entry::Waiting {
            abortable: !armed.unabortable,
        };
        let id = Shared::<B>::insert(&mut lock(&self.shared.state), waiting);
        let shared = Arc::downgrade(&self.shared);
        let spawned = std::thread::Builder::new()
            .name("fault-delay".into())
            .spawn(move || {
                hold.wait();
                if let Some(shared) = shared.upgrade() {
                    shared.post_held(id, &held);
                }
            });
        if let Err(error) = spawned {
            lock(&self.shared.state).transfers.remove(&id.0);
            return Err(Error::backend(NAME, "delay a transfer", error));
        }
        Ok(Posted::running(id))
    }

    fn poll(&self, transfer: TransferId) -> TransferState {
        let inner = {
            let state = lock(&self.shared.state);
            match state.transfers.get(&transfer.0) {
                None => return TransferState::failed(format!("unknown transfer {}", transfer.0)),
                Some(Entry::Failed(cause)) => return TransferState::Failed(Arc::clone(cause)),
                Some(_) if state.vanished => return TransferState::failed(vanished()),
                Some(Entry::Waiting { .. } | Entry::Posting) => return TransferState::InProgress,
                Some(Entry::Cancelled) => return TransferState::failed("released"),
                Some(Entry::Posted(inner)) => *inner,
            }
        };
        self.shared.inner.poll(inner)
    }

    fn release(&self, transfer: TransferId) -> Result<Release> {
        let inner = {
            let mut state = lock(&self.shared.state);
            let Some(entry) = state.transfers.get_mut(&transfer.0) else {
                return Ok(Release::LetGo);
            };
            match entry {
                Entry::Posting => return Ok(Release::StillRunning),
                Entry::Posted(inner) => *inner,
                Entry::Waiting { abortable: false } => return Ok(Release::StillRunning),
                Entry::Waiting { abortable: true } => {
                    // The timer thread finds it cancelled and never posts.
                    *entry = Entry::Cancelled;
                    return Ok(Release::LetGo);
                }
                Entry::Failed(_) | Entry::Cancelled => {
                    state.transfers.remove(&transfer.0);
                    return Ok(Release::LetGo);
                }
            }
        };
        let released = self.shared.inner.release(inner)?;
        if released == Release::LetGo {
            lock(&self.shared.state).transfers.remove(&transfer.0);
        }
        Ok(released)
    }

    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()> {
        if self.shared.is_vanished() {
            return self.shared.inner.drain_notifications(&mut |_| {});
        }
        self.shared.inner.drain_notifications(sink)
    }

    fn wait_assist(&self) -> Duration {
        self.shared.inner.wait_assist()
    }

    fn awaiting_end(&self, transfer: TransferId) {
        self.shared.inner.awaiting_end(transfer);
    }

    fn warm_up(&self, peer: &str) -> Result<()> {
        self.shared.inner.warm_up(peer)
    }

    fn set_event_hook(&self, hook: EventHook) -> bool {
        let accepted = self.shared.inner.set_event_hook(Arc::clone(&hook));
        if accepted {
            // Set once: the connector installs its hook once.
            let _ = self.shared.hook.set(hook);
        }
        accepted
    }
}
