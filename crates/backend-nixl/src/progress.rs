//! How NIXL is progressed, and how the connector learns that something
//! happened: the agent's live state ([`Live`]) and its watcher thread.
//!
//! NIXL's C API has no completion callback: a transfer's end and a peer's
//! notification are found by asking (`get_xfer_status`, `get_notifs`). So
//! each agent has one *watcher* thread that asks, only while there is
//! something to wait for (a posted transfer, or an exposure a peer may
//! notify), and signals the connector's [`EventHook`] when it finds something.
//! The connector's core then stays event-driven, with no transport policy.
//!
//! The watcher spins (yielding) for a short window after each exposure, event
//! or transfer handed to it, when completions are most likely, then backs off
//! to sleeps that grow to a cap; a new exposure wakes it at once, and so
//! does a transfer handed to it (at its post if larger than
//! [`WATCH_AT_POST`], otherwise once the connector waits on it or cancels
//! it). With nothing to wait for it sleeps until there is. A thread blocked
//! waiting for its own transfer first polls it itself for a while
//! ([`WAIT_ASSIST`]), and the watcher leaves such a transfer alone.
//!
//! Two agents, when NIXL's progress thread is on (the default, see [`Live`]):
//! the serving one runs that thread (event-driven, with a delay), which moves
//! data for peers and serves them even when the connector has nothing in
//! flight; the connector's own transfers go through a second agent without
//! one, progressed only by the waiting thread and the watcher. A transfer's
//! notification goes out apart from it, from the serving agent, once NIXL
//! reports the transfer done ([`Transfer::look`]): the initiating agent's
//! endpoint then carries no message, and NIXL's flush of it before reporting
//! a transfer done needs no answer from the peer (over TCP, UCX flushes an
//! endpoint that sent a message with a zero-length put and waits for its
//! acknowledgement, which the peer sends only when it progresses). NIXL
//! does not say when a notification sent apart leaves, and the first
//! message on the serving agent's new endpoint to a peer can wait for the
//! endpoint's handshake: so the first transfers to a peer go through the
//! serving agent with their notification attached ([`Via::Serving`]), until
//! one succeeded.
//!
//! Measured on the 2-core test machine (docs/performance.md):
//! - the notification apart from the transfer: cross-process 4 KiB p50
//!   35-43 µs instead of 68-87 (raw nixl-sys, notification attached: 72-89),
//!   4 KiB × 16 1.25-1.40 × raw nixl-sys's GB/s instead of 0.77-0.98, and the
//!   small rows no longer depend on where the scheduler runs the peer's
//!   threads (before, the flush waited for the peer's NIXL thread to wake);
//! - spinning on the *target* side after an exposure: without it, the
//!   initiator's cross-process 4 KiB READ p50 was 68-74 µs instead of 33-37
//!   (by ~10 µs before notifications went apart). Not by progressing the
//!   target: with NIXL's thread on, asking for notifications does not
//!   progress the agent; the target's threads are woken sooner while its
//!   vCPU is awake;
//! - a longer spin window (300 µs, 1 ms) or a waiter that only watched the
//!   status gained nothing and cost CPU;
//! - NIXL's progress thread's delay (1, 10, 100 ms) did not change latency
//!   (it wakes on traffic) but set the idle cost, lowest at 100 ms;
//! - without NIXL's thread, transfers back to back ran faster (4 KiB between
//!   processes in 33-40 µs instead of 68-87), but a target then answers only
//!   at its watcher's next poll: a 4 KiB transfer after a 2 ms pause took
//!   1.16 ms instead of 0.19-0.21 ms. So the thread stays on;
//! - `ThreadSync::Strict` did better than `Rw`;
//! - NIXL's thread beside the posting (or waiting) thread on the worker that
//!   posts: UCX's worker lock is a spinlock, and on two cores one thread was
//!   preempted holding it while the other spun until the scheduler's tick.
//!   Back to back, 1-17% of the transfers between processes took 1-5 ms.
//!   Posting through an agent without that thread removed them (0-2% of a
//!   row's) and put ours at 0.76-1.45 × raw nixl-sys in GB/s (median row
//!   0.99-1.07); the serving agent keeps its thread, so a transfer after a
//!   pause is answered as before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use descriptor_core::{EventHook, Notification, SharedCause, TransferState};
use nixl_sys::{Agent, NotificationMap, XferRequest, XferStatus};

/// How long the watcher polls without sleeping after it is handed something
/// or sees an event.
pub(crate) const SPIN: Duration = Duration::from_micros(100);
/// First sleep after the spin window; each idle round doubles it.
const FIRST_SLEEP: Duration = Duration::from_micros(10);
/// Longest sleep while a transfer of this agent is in flight.
pub(crate) const TRANSFER_CAP: Duration = Duration::from_micros(200);
/// Longest sleep while only a peer's notification is awaited.
pub(crate) const NOTIFY_CAP: Duration = Duration::from_millis(1);
/// How long a waiting thread polls its own transfer before it sleeps
/// (`RegistrationBackend::wait_assist`): it then learns of the end without a
/// wake-up. Measured: 4 KiB p50 5-10 µs lower than with the watcher alone.
pub(crate) const WAIT_ASSIST: Duration = Duration::from_micros(200);
/// The watcher leaves alone a transfer that a waiting thread polled this
/// recently: two threads asking NIXL about one transfer only contend.
const ASSISTED: Duration = Duration::from_micros(20);
/// A transfer of more bytes than this is handed to the watcher when it is
/// posted; a smaller one only once the connector waits on it
/// (`RegistrationBackend::awaiting_end`), or is cancelled. Waking the sleeping
/// watcher at the post cost a 4 KiB transfer that followed a 2 ms pause
/// 15-30 µs between processes (three runs each way). The price: a small
/// transfer that nobody waits on, polls or cancels is moved on (its
/// notification sent) only at the next look at the operation, or at the
/// connector's 100 ms safety poll; a larger one needs the watcher to move it
/// on, and the wake-up costs it relatively less (`tests/initiator.rs` checks
/// that a 1 MiB WRITE nobody follows still completes below the connector;
/// the conformance suite's `an_operation_nobody_follows_still_completes`,
/// that a 4 KiB and a 1 MiB one do through it).
pub(crate) const WATCH_AT_POST: usize = 64 << 10;

thread_local! {
    /// Whether this thread is a watcher (its hook polls transfers too).
    static WATCHER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is a watcher thread.
pub(crate) fn on_watcher() -> bool {
    WATCHER.with(std::cell::Cell::get)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The agent that posted a transfer.
pub(crate) enum Via {
    /// The initiating agent (the serving one itself when NIXL's thread is
    /// off: see [`Live`]).
    Initiating,
    /// The serving agent, with the transfer's notification attached: its
    /// success `proves` the serving agent's endpoint to the peer (see
    /// `Route::Proving` in the backend).
    Serving { proves: Arc<AtomicBool> },
}

/// A posted transfer.
pub(crate) struct Transfer {
    pub(crate) request: XferRequest,
    via: Via,
    /// When a waiting thread (not the watcher) last asked about it.
    pub(crate) assisted: Option<Instant>,
    /// Set once NIXL reported the end (or the post failed), and the
    /// notification, if it goes apart, was sent.
    pub(crate) finished: Option<TransferState>,
    /// Why the post itself failed, reported once NIXL says the request is idle.
    pub(crate) post_error: Option<SharedCause>,
    /// The notification the serving agent sends once NIXL reports the
    /// transfer done (see [`Live::notifies`]); `None` if NIXL sends it with
    /// the transfer, if there is none, or once it was handed out to be sent.
    pub(crate) notify: Option<Notify>,
    /// A thread is sending the notification: the transfer counts as running
    /// until that thread records the end.
    notifying: bool,
}

/// A transfer's notification, sent apart from it.
pub(crate) struct Notify {
    pub(crate) peer: String,
    pub(crate) payload: Box<[u8]>,
}

/// What a look at a transfer found.
enum Look {
    /// Still running, or another thread is sending its notification.
    Running,
    /// Ended, recorded.
    Ended(TransferState),
    /// NIXL reports it done, and its notification is the caller's to send,
    /// after it released the transfer map's lock ([`Live::notify`]).
    Notify(Notify),
}

impl Transfer {
    pub(crate) fn new(
        request: XferRequest,
        via: Via,
        post_error: Option<SharedCause>,
        notify: Option<Notify>,
    ) -> Transfer {
        Transfer {
            request,
            via,
            assisted: None,
            finished: None,
            post_error,
            notify,
            notifying: false,
        }
    }

    /// Asks NIXL (through `agent`, the one that posted it: [`Live::posting`])
    /// whether the transfer ended, and records the end.
    ///
    /// A transfer whose notification goes apart ends only once the serving
    /// agent sent it: the passive side then learns of the transfer only
    /// after the bytes are in place (NIXL reports a transfer done once it
    /// flushed its endpoint), and the initiator's operation does not end
    /// before its peer was told.
    fn look(&mut self, agent: &Agent) -> Look {
        if let Some(state) = &self.finished {
            return Look::Ended(state.clone());
        }
        if self.notifying {
            return Look::Running;
        }
        let state = match (agent.get_xfer_status(&self.request), &self.post_error) {
            (Ok(XferStatus::InProgress), _) => return Look::Running,
            (_, Some(post_error)) => TransferState::Failed(Arc::clone(post_error)),
            (Ok(XferStatus::Success), None) => match self.notify.take() {
                Some(notify) => {
                    self.notifying = true;
                    return Look::Notify(notify);
                }
                None => {
                    if let Via::Serving { proves } = &self.via {
                        proves.store(true, Ordering::Release);
                    }
                    TransferState::Done
                }
            },
            (Err(e), None) => TransferState::failed(e),
        };
        self.finished = Some(state.clone());
        Look::Ended(state)
    }
}

/// What the watcher waits for.
#[derive(Default)]
struct Watch {
    /// Exposures a peer may notify.
    exposures: usize,
    /// Something new to watch since the watcher last looked.
    kicked: bool,
    /// The watcher is blocked on `wake` (set and cleared under the lock).
    asleep: bool,
    shutdown: bool,
}

/// The agents and the state the watcher shares with the backend.
///
/// `agent` serves peers: it holds the memory they reach, its metadata is what
/// they load, and notifications arrive on it. With NIXL's progress thread on,
/// that thread runs there, and the connector's own transfers go through a
/// second agent, `initiator`, without one: only the thread that waits on a
/// transfer and the watcher then call into its UCX worker (why: the module
/// docs).
pub(crate) struct Live {
    pub(crate) agent: Agent,
    initiator: Option<Agent>,
    pub(crate) transfers: Mutex<HashMap<u64, Transfer>>,
    /// Notifications the watcher collected, for `drain_notifications`.
    inbox: Mutex<Vec<Notification>>,
    watch: Mutex<Watch>,
    wake: Condvar,
    hook: OnceLock<EventHook>,
}

impl Live {
    pub(crate) fn new(agent: Agent, initiator: Option<Agent>) -> Live {
        Live {
            agent,
            initiator,
            transfers: Mutex::new(HashMap::new()),
            inbox: Mutex::new(Vec::new()),
            watch: Mutex::new(Watch::default()),
            wake: Condvar::new(),
            hook: OnceLock::new(),
        }
    }

    /// The agent that posts this connector's transfers (and loads the peers
    /// they go to).
    pub(crate) fn initiating(&self) -> &Agent {
        self.initiator.as_ref().unwrap_or(&self.agent)
    }

    /// The agent a transfer posted `via` goes through.
    pub(crate) fn posting(&self, via: &Via) -> &Agent {
        match via {
            Via::Initiating => self.initiating(),
            Via::Serving { .. } => &self.agent,
        }
    }

    /// Whether the serving agent can send the notifications of this
    /// connector's transfers (when a second agent posts them, see
    /// [`Transfer::notify`]).
    pub(crate) fn notifies(&self) -> bool {
        self.initiator.is_some()
    }

    /// Sends, from the serving agent, the notification that a look at
    /// transfer `id` handed out ([`Look::Notify`]), and records the
    /// transfer's end: Done once NIXL took the notification, else why not
    /// (the bytes moved, but the peer was not told). A system call: called
    /// without the transfer map's lock, which it takes only to record.
    fn notify(&self, id: u64, notify: &Notify) -> TransferState {
        let state = match self
            .agent
            .send_notification(&notify.peer, &notify.payload, None)
        {
            Ok(()) => TransferState::Done,
            Err(e) => TransferState::failed(format!(
                "the transfer completed, but sending its notification to peer {:?} failed: {e}",
                notify.peer
            )),
        };
        if let Some(t) = lock(&self.transfers).get_mut(&id) {
            t.notifying = false;
            t.finished = Some(state.clone());
        }
        state
    }

    /// The state of transfer `id` (`InProgress` while it runs), `None` if
    /// there is no such transfer. Looks through the agent that posted it
    /// and, if the transfer's notification is due, sends it once the map's
    /// lock is released. `mark` runs on the transfer under the lock first.
    pub(crate) fn state(&self, id: u64, mark: impl FnOnce(&mut Transfer)) -> Option<TransferState> {
        let look = {
            let mut transfers = lock(&self.transfers);
            let t = transfers.get_mut(&id)?;
            mark(t);
            t.look(self.posting(&t.via))
        };
        Some(match look {
            Look::Running => TransferState::InProgress,
            Look::Ended(state) => state,
            Look::Notify(notify) => self.notify(id, &notify),
        })
    }

    /// Every agent, the serving one first.
    pub(crate) fn agents(&self) -> impl Iterator<Item = &Agent> {
        std::iter::once(&self.agent).chain(&self.initiator)
    }

    /// Installs the hook; false if one was installed already.
    pub(crate) fn set_hook(&self, hook: EventHook) -> bool {
        self.hook.set(hook).is_ok()
    }

    pub(crate) fn has_hook(&self) -> bool {
        self.hook.get().is_some()
    }

    /// Something to watch was added: a transfer handed over, an exposure made.
    pub(crate) fn kick(&self, exposures: isize) {
        let mut watch = lock(&self.watch);
        watch.exposures = watch.exposures.saturating_add_signed(exposures);
        watch.kicked = true;
        let asleep = watch.asleep;
        drop(watch);
        // An awake watcher takes `kicked` before it next sleeps: only a
        // sleeping one needs the wake-up (a system call).
        if asleep {
            self.wake.notify_one();
        }
    }

    /// Tells the watcher to stop.
    pub(crate) fn stop(&self) {
        lock(&self.watch).shutdown = true;
        self.wake.notify_one();
    }

    /// Hands out the notifications collected so far.
    pub(crate) fn take_inbox(&self) -> Vec<Notification> {
        std::mem::take(&mut *lock(&self.inbox))
    }

    /// Asks NIXL for notifications and keeps them; true if any arrived.
    pub(crate) fn collect_notifications(&self) -> Result<bool, nixl_sys::NixlError> {
        let mut map = NotificationMap::new()?;
        self.agent.get_notifications(&mut map, None)?;
        let senders: Vec<String> = map
            .agents()
            .filter_map(|a| a.ok().map(str::to_owned))
            .collect();
        let mut arrived = Vec::new();
        for from in senders {
            let name: Arc<str> = from.as_str().into();
            for i in 0..map.get_notifications_size(&from)? {
                arrived.push(Notification {
                    from: Arc::clone(&name),
                    payload: map.get_notification_bytes(&from, i)?.into(),
                    // NIXL does not say which memory the transfer reached.
                    exposure: None,
                });
            }
        }
        if arrived.is_empty() {
            return Ok(false);
        }
        lock(&self.inbox).extend(arrived);
        Ok(true)
    }

    /// Checks every unfinished transfer: (any ended, any still in flight).
    ///
    /// The watcher never queues for the map: a thread that holds it (a
    /// waiter polling its own transfer, a post) would then have to wake the
    /// watcher when it unlocks, a system call on that thread's path, measured
    /// at 2-3 µs here. It counts the map's transfers as in flight instead and
    /// looks again on its next pass.
    fn check_transfers(&self) -> (bool, bool) {
        let mut transfers = match self.transfers.try_lock() {
            Ok(transfers) => transfers,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return (false, true),
        };
        let mut ended = false;
        let mut in_flight = false;
        let mut due = Vec::new();
        for (&id, t) in transfers.iter_mut() {
            if t.finished.is_some() {
                continue;
            }
            if t.assisted.is_some_and(|at| at.elapsed() < ASSISTED) {
                in_flight = true;
                continue;
            }
            match t.look(self.posting(&t.via)) {
                Look::Running => in_flight = true,
                Look::Ended(_) => ended = true,
                Look::Notify(notify) => due.push((id, notify)),
            }
        }
        drop(transfers);
        // Sent after the lock, which `notify` takes again to record each end.
        for (id, notify) in &due {
            self.notify(*id, notify);
            ended = true;
        }
        (ended, in_flight)
    }

    /// The watcher thread's loop; returns when [`stop`](Self::stop) is called.
    pub(crate) fn watch(&self) {
        WATCHER.with(|w| w.set(true));
        let mut spin_until = Instant::now() + SPIN;
        let mut sleep = FIRST_SLEEP;
        loop {
            let exposures = {
                let mut watch = lock(&self.watch);
                if watch.shutdown {
                    return;
                }
                if std::mem::take(&mut watch.kicked) {
                    spin_until = Instant::now() + SPIN;
                    sleep = FIRST_SLEEP;
                }
                watch.exposures
            };
            let (ended, in_flight) = self.check_transfers();
            let notified = exposures > 0
                && self.collect_notifications().unwrap_or_else(|error| {
                    tracing::warn!(%error, "getting NIXL notifications failed");
                    false
                });
            if ended || notified {
                // No lock of ours is held: the hook may call straight back in.
                if let Some(hook) = self.hook.get() {
                    hook();
                }
                spin_until = Instant::now() + SPIN;
                sleep = FIRST_SLEEP;
                continue;
            }
            if Instant::now() < spin_until {
                std::thread::yield_now();
                continue;
            }
            let mut watch = lock(&self.watch);
            if watch.shutdown || watch.kicked {
                continue;
            }
            watch.asleep = true;
            let mut watch = if !in_flight && watch.exposures == 0 {
                // Nothing to wait for: sleep until something is handed over.
                self.wake
                    .wait(watch)
                    .unwrap_or_else(PoisonError::into_inner)
            } else {
                let cap = if in_flight { TRANSFER_CAP } else { NOTIFY_CAP };
                let nap = sleep.min(cap);
                sleep = (sleep * 2).min(cap);
                self.wake
                    .wait_timeout(watch, nap)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            };
            watch.asleep = false;
        }
    }
}
