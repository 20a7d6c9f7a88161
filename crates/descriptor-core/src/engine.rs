//! The progress engine: one thread per connector that finishes operations
//! when the backend reports events, and wakes waiters.
//!
//! The core has one path: event-driven. A backend signals its
//! [`EventHook`](crate::EventHook) whenever a transfer ends or a notification
//! arrives, and how it learns that (NIXL: its own progress watcher) is the
//! backend's business. The engine sleeps on a condition variable until an event
//! or new work arrives, so an idle connector burns no CPU; while work is in
//! flight it also looks on its own now and then, in case an event was lost. A
//! backend that cannot signal is polled at a fixed, modest interval.
//!
//! A peer's notification is delivered (its passive operation completed, the
//! exposure revoked) by the thread that raised the event only if a thread or
//! future is waiting for a passive operation of this connector. Otherwise it
//! is delivered by whoever next looks at one (status, wait, cancel, drop), or
//! by the engine thread's next pass: see [`Handoff`]. So a loopback initiator,
//! whose transfer raises the event in its own thread, does not do the passive
//! side's bookkeeping while nobody there waits for it.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::Duration;

use crate::backend::{ExposureId, Notification, RegistrationBackend};
use crate::operation::state::{OpShared, Outcome};
use crate::sync::{AtomicBool, AtomicUsize, Ordering, fence};

/// How long dropping the last connector waits for its engine thread.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// While work is in flight, an event-driven backend is still polled this
/// often, in case an event was lost.
const EVENT_SAFETY_POLL: Duration = Duration::from_millis(100);
/// How often a backend that cannot signal events is polled while work is in
/// flight.
const POLL_INTERVAL: Duration = Duration::from_millis(1);

pub(crate) struct Engine {
    backend: Arc<dyn RegistrationBackend>,
    event_driven: bool,
    work: Mutex<Work>,
    wake: Condvar,
    name: String,
    handoff: Handoff,
}

/// Decides who delivers a peer's notification: the thread that raised the
/// event when somebody waits for a passive operation of this connector,
/// otherwise whoever looks next ([`Engine::catch_up`]).
///
/// The event's thread sets `notified`, then reads `waiters`; a waiter
/// increments `waiters`, then reads `notified`, a `SeqCst` fence between
/// the write and the read on both sides. So one of the two sees the other's
/// write: a waiter never sleeps through a notification that nobody delivers
/// (model-checked in `operation/loom.rs`, which also fails without the
/// fences).
#[derive(Default)]
pub(crate) struct Handoff {
    /// A notification may be waiting in the backend.
    notified: AtomicBool,
    /// Blocked `wait`s and pending futures of passive operations.
    waiters: AtomicUsize,
}

impl Handoff {
    /// Records that a notification may be waiting (the backend queued it
    /// before); true if somebody waits, so the caller must deliver it now.
    pub(crate) fn raise(&self) -> bool {
        self.notified.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        self.waiters.load(Ordering::Relaxed) > 0
    }

    /// Takes the flag: true if a notification may be waiting, which the caller
    /// must then deliver.
    pub(crate) fn claim(&self) -> bool {
        self.notified.load(Ordering::Relaxed) && self.notified.swap(false, Ordering::AcqRel)
    }

    /// Counts a waiter, which must [`claim`](Self::claim) after this, before
    /// it sleeps.
    pub(crate) fn add_waiter(&self) {
        self.waiters.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    pub(crate) fn remove_waiter(&self) {
        self.waiters.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A waiter for a passive operation, counted in its engine's [`Handoff`] while
/// it lives.
pub(crate) struct PassiveWaiter(Arc<Engine>);

impl Drop for PassiveWaiter {
    fn drop(&mut self) {
        self.0.handoff.remove_waiter();
    }
}

#[derive(Default)]
struct Work {
    active: Vec<Arc<OpShared>>,
    /// Passive operations by notification key, with the exposure each made
    /// (randomly seeded foldhash: a peer's key is hashed on every lookup).
    passive: HashMap<Arc<[u8]>, (ExposureId, Arc<OpShared>), foldhash::fast::RandomState>,
    events: bool,
    shutdown: bool,
    thread: Option<thread::JoinHandle<()>>,
}

impl Engine {
    pub(crate) fn new(backend: Arc<dyn RegistrationBackend>) -> Arc<Engine> {
        Arc::new_cyclic(|weak: &Weak<Engine>| {
            let hook_target = weak.clone();
            let event_driven = backend.set_event_hook(Arc::new(move || {
                if let Some(engine) = hook_target.upgrade() {
                    engine.signal();
                }
            }));
            Engine {
                name: backend.agent_name().to_owned(),
                backend,
                event_driven,
                work: Mutex::new(Work::default()),
                wake: Condvar::new(),
                handoff: Handoff::default(),
            }
        })
    }

    fn lock(&self) -> MutexGuard<'_, Work> {
        self.work.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Called by an event-driven backend's hook, in the thread that caused the
    /// event (possibly a peer's, inside its own call into its backend). Active
    /// operations are finished right here, which saves the two context switches
    /// of handing the event to the engine thread; a notification is delivered
    /// here only if somebody waits for it ([`Handoff`]). The backend calls the
    /// hook with none of its locks held, and no lock of ours is held while this
    /// calls the backend or a waker. A panic (a backend bug) is logged and
    /// contained: it must not unwind into the peer's call.
    fn signal(&self) {
        let active = self.lock().active.clone();
        let handled = catch_unwind(AssertUnwindSafe(|| {
            if !active.is_empty() {
                self.poll_active(&active);
            }
            if self.handoff.raise() {
                self.catch_up();
            }
        }));
        if handled.is_err() {
            tracing::error!(agent = %self.name, "a backend call panicked while handling an event; the operations it touched leak their memory");
        }
    }

    /// Counts a waiter for a passive operation until the guard drops. The
    /// waiter must [`catch_up`](Self::catch_up) after this, before it sleeps.
    pub(crate) fn count_waiter(self: &Arc<Self>) -> PassiveWaiter {
        self.handoff.add_waiter();
        PassiveWaiter(Arc::clone(self))
    }

    /// Delivers the notifications that arrived since anyone last looked, if
    /// any did: called before a passive operation is looked at, from user
    /// code (a drop among it), so a panicking backend is contained here too.
    pub(crate) fn catch_up(&self) {
        if self.handoff.claim()
            && catch_unwind(AssertUnwindSafe(|| self.drain_notifications())).is_err()
        {
            tracing::error!(agent = %self.name, "the backend panicked while handing over notifications; the engine drains them again on its next pass");
        }
    }

    /// Follows an active operation's transfer until it ends.
    pub(crate) fn track_active(self: &Arc<Self>, op: Arc<OpShared>) {
        let mut work = self.lock();
        work.active.push(op);
        self.ensure_running(&mut work);
        // An event-driven backend signals the transfer's end itself (the
        // engine looks on its own only every `EVENT_SAFETY_POLL`); a polled
        // one needs the engine awake to poll it.
        if !self.event_driven {
            work.events = true;
            drop(work);
            self.wake.notify_one();
        }
    }

    /// Completes a passive operation when a notification carrying `key`
    /// arrives (from a transfer that reached `exposure`, if the backend says).
    pub(crate) fn track_passive(
        self: &Arc<Self>,
        key: Arc<[u8]>,
        exposure: ExposureId,
        op: Arc<OpShared>,
    ) {
        let mut work = self.lock();
        work.passive.insert(key, (exposure, op));
        self.ensure_running(&mut work);
        // An event-driven backend signals the notification itself; a polled one
        // needs the engine awake to poll for it.
        if !self.event_driven {
            work.events = true;
            drop(work);
            self.wake.notify_one();
        }
    }

    pub(crate) fn untrack_passive(&self, key: &[u8]) {
        self.lock().passive.remove(key);
    }

    /// Stops the engine thread and waits (up to [`SHUTDOWN_WAIT`]) for it to
    /// finish: a thread still calling into the backend while the process exits
    /// would race the backend library's own teardown (seen with NIXL: a
    /// segfault at exit). Draining transfers are finished first; if they take
    /// longer, the thread is left to finish them on its own.
    pub(crate) fn shutdown(&self) {
        let handle = {
            let mut work = self.lock();
            work.shutdown = true;
            work.thread.take()
        };
        self.wake.notify_all();
        let Some(handle) = handle else {
            return;
        };
        if handle.thread().id() == thread::current().id() {
            return;
        }
        let deadline = std::time::Instant::now() + SHUTDOWN_WAIT;
        while !handle.is_finished() {
            if std::time::Instant::now() >= deadline {
                tracing::warn!(agent = %self.name, "progress engine still draining transfers; not waiting for it");
                return;
            }
            thread::sleep(Duration::from_micros(200));
        }
        let _ = handle.join();
    }

    fn ensure_running(self: &Arc<Self>, work: &mut Work) {
        if work.thread.is_some() || work.shutdown {
            return;
        }
        let engine = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name(format!("progress-{}", self.name))
            .spawn(move || engine.run());
        match spawned {
            Ok(handle) => work.thread = Some(handle),
            // Waiters then time out or wait on; the next operation tries again.
            Err(error) => tracing::error!(%error, "cannot start the progress engine thread"),
        }
    }

    fn run(self: Arc<Self>) {
        tracing::debug!(agent = %self.name, event_driven = self.event_driven, "progress engine started");
        // Should the thread ever die, the next operation starts a new one.
        let _restartable = Restartable(&self);
        let interval = if self.event_driven {
            EVENT_SAFETY_POLL
        } else {
            POLL_INTERVAL
        };
        let mut active = Vec::new();
        loop {
            {
                let mut work = self.lock();
                loop {
                    // Draining transfers still hold memory: finish them first.
                    if work.shutdown && work.active.is_empty() {
                        drop(work);
                        tracing::debug!(agent = %self.name, "progress engine stopped");
                        return;
                    }
                    if std::mem::take(&mut work.events) {
                        break;
                    }
                    let busy =
                        !work.active.is_empty() || (!work.passive.is_empty() && !work.shutdown);
                    if !busy && !self.event_driven {
                        work = self.wake.wait(work).unwrap_or_else(PoisonError::into_inner);
                        continue;
                    }
                    // Event-driven: work may arrive without a wake-up (see
                    // `track_active`), so idle waits time out too, rarely.
                    let (w, timeout) = self
                        .wake
                        .wait_timeout(work, interval)
                        .unwrap_or_else(PoisonError::into_inner);
                    work = w;
                    let busy =
                        !work.active.is_empty() || (!work.passive.is_empty() && !work.shutdown);
                    if timeout.timed_out() && busy {
                        break;
                    }
                }
                active.clone_from(&work.active);
            }
            // A panic here is a backend bug: the operation it hit leaks its
            // memory (see `OpShared::settle`); the engine goes on serving the rest.
            if catch_unwind(AssertUnwindSafe(|| self.pass(&active))).is_err() {
                tracing::error!(agent = %self.name, "a backend call panicked in the progress engine; it goes on");
            }
            active.clear();
        }
    }

    /// One round of polling: active transfers, then every notification,
    /// whether raised or not (a backend without events raises none).
    fn pass(&self, active: &[Arc<OpShared>]) {
        self.poll_active(active);
        // Cleared before the drain: one raised during it is looked for again.
        self.handoff.claim();
        self.drain_notifications();
    }

    /// Polls the active transfers.
    fn poll_active(&self, active: &[Arc<OpShared>]) {
        let mut finished = Vec::new();
        for op in active {
            // A panicking poll leaves the transfer tracked: polled again later.
            if contain(&self.name, || op.drive()).unwrap_or(false) {
                finished.push(Arc::as_ptr(op));
            }
        }
        if !finished.is_empty() {
            self.lock()
                .active
                .retain(|op| !finished.contains(&Arc::as_ptr(op)));
        }
    }

    /// Completes the passive operations whose notifications arrived.
    /// Notifications are collected first and handled after the backend call
    /// returned, so finishing an operation never runs inside the backend.
    fn drain_notifications(&self) {
        // Usually one arrives: it is kept inline, any more in a vector.
        let mut first: Option<Notification> = None;
        let mut more: Vec<Notification> = Vec::new();
        let mut sink = |n| match first {
            None => first = Some(n),
            Some(_) => more.push(n),
        };
        if let Err(error) = self.backend.drain_notifications(&mut sink) {
            tracing::warn!(%error, "draining notifications failed");
        }
        for notification in first.into_iter().chain(more) {
            self.deliver(&notification);
        }
    }

    /// Completes the passive operation `notification` names, if one waits for it.
    fn deliver(&self, notification: &Notification) {
        let key = &*notification.payload;
        let op = {
            let mut work = self.lock();
            let Some((exposure, op)) = work.passive.remove(key) else {
                drop(work);
                tracing::debug!(
                    from = %notification.from,
                    bytes = key.len(),
                    "dropping a notification no operation waits for"
                );
                return;
            };
            // A backend that knows what the transfer reached: it must have
            // reached this operation's exposure, and only that.
            if notification
                .exposure
                .is_some_and(|reached| reached != exposure)
            {
                work.passive
                    .insert(Arc::clone(&notification.payload), (exposure, op));
                drop(work);
                tracing::warn!(
                    from = %notification.from,
                    "ignoring a notification whose transfer reached other memory than the operation it names"
                );
                return;
            }
            op
        };
        contain(&self.name, || {
            op.finish(Outcome::Complete);
        });
    }
}

/// Runs `f`, containing a panic (a backend bug) so that the other operations
/// of the pass are still served. A panic while letting go of memory has already
/// settled its operation as leaking it (`OpShared::settle`); a panicking `poll`
/// left the operation as it was, to be polled again.
fn contain<T>(agent: &str, f: impl FnOnce() -> T) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => Some(value),
        Err(_) => {
            tracing::error!(%agent, "a backend call panicked; the operation it served leaks its memory, the others go on");
            None
        }
    }
}

/// Clears the engine's thread handle if its thread unwinds, so that the next
/// operation starts a new one instead of relying on a dead thread.
struct Restartable<'a>(&'a Engine);

impl Drop for Restartable<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            tracing::error!(agent = %self.0.name, "the progress engine thread panicked; the next operation restarts it");
            self.0.lock().thread = None;
        }
    }
}
