//! The watcher thread: how the connector learns that something happened.
//!
//! NIXL's C API has no completion callback: a transfer's end and a peer's
//! notification are found by asking (`get_xfer_status`, `get_notifs`). So
//! each backend has one watcher thread that asks, only while there is
//! something to wait for (a transfer handed to it, or an exposure a peer may
//! notify), and calls the connector's [`EventHook`] when it finds
//! something; the connector's core stays event-driven, with no transport
//! policy.
//!
//! Contract: it spins (yielding) for [`Tuning::spin`] after each exposure,
//! event or transfer handed to it, then backs off to sleeps that grow from
//! [`Tuning::first_sleep`] to a cap; a new exposure or a handed transfer
//! wakes it at once; with nothing to wait for it sleeps until there is;
//! while a storage transfer runs it does not sleep at all (NIXL's POSIX
//! plugin submits queued I/O only when polled). A transfer a waiting
//! thread polls ([`Asker::Waiter`]) is left to that thread. Why each number: docs/decisions/0002-watcher-thread.md.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, TryLockError};
use std::time::Instant;

use descriptor_core::{EventHook, Notification, TransferState};
use nixl_sys::NotificationMap;

use crate::agents::Agents;
use crate::sync::lock;
use crate::transfer::{ApartNotification, Asker, Look, Transfer};
use crate::tuning::Tuning;

thread_local! {
    /// Whether this thread is a watcher thread (see [`asker`]).
    static WATCHER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Who is asking, seen from `RegistrationBackend::poll`: the connector's
/// hook polls transfers from the watcher thread, a waiting user thread
/// polls its own. The trait does not say which, so the thread tells.
pub(crate) fn asker() -> Asker {
    if WATCHER.with(std::cell::Cell::get) {
        Asker::Internal
    } else {
        Asker::Waiter
    }
}

/// Why the watcher is woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kick {
    /// An exposure was made: a peer may notify from now on.
    Exposed,
    /// An exposure was revoked: one notification fewer to expect.
    Revoked,
    /// A transfer was handed over (posted large, awaited, or cancelled).
    Transfer,
}

/// What a watcher's pass left running, the most demanding first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum InFlight {
    Nothing,
    /// Transfers to peers: the back-off's naps are capped at
    /// [`Tuning::transfer_cap`].
    Transfer,
    /// A storage transfer that no waiter polls: polled without naps.
    Storage,
}

impl InFlight {
    /// What a running transfer asks of the watcher: a storage transfer
    /// only while no waiting thread polls it (`assisted`). NIXL's POSIX
    /// plugin submits queued I/O only when asked about the transfer, and a
    /// waiter that polls asks: a watcher spinning beside it only contends
    /// (decision 0015, "Measured again").
    fn of(storage: bool, assisted: bool) -> InFlight {
        if storage && !assisted {
            InFlight::Storage
        } else {
            InFlight::Transfer
        }
    }
}

/// What the watcher has to look for, shared under [`Live::agenda`].
#[derive(Default)]
struct Agenda {
    /// Exposures a peer may notify.
    exposures: usize,
    /// Something new to look at since the watcher last looked.
    kicked: bool,
    /// The watcher is blocked on `wake` (set and cleared under the lock).
    asleep: bool,
    shutdown: bool,
}

/// The agents and the state the watcher shares with the backend.
pub(crate) struct Live {
    pub(crate) agents: Agents,
    pub(crate) tuning: Tuning,
    pub(crate) transfers: Mutex<HashMap<u64, Transfer>>,
    /// Notifications the watcher collected, for `drain_notifications`.
    inbox: Mutex<Vec<Notification>>,
    /// Notifications collected outside the watcher ([`Live::progress`])
    /// that the hook was not told of yet: the watcher's next pass tells it.
    unannounced: AtomicBool,
    agenda: Mutex<Agenda>,
    wake: Condvar,
    hook: OnceLock<EventHook>,
}

impl Live {
    pub(crate) fn new(agents: Agents, tuning: Tuning) -> Live {
        Live {
            agents,
            tuning,
            transfers: Mutex::new(HashMap::new()),
            inbox: Mutex::new(Vec::new()),
            unannounced: AtomicBool::new(false),
            agenda: Mutex::new(Agenda::default()),
            wake: Condvar::new(),
            hook: OnceLock::new(),
        }
    }

    /// Installs the hook; false if one was installed already.
    pub(crate) fn set_hook(&self, hook: EventHook) -> bool {
        self.hook.set(hook).is_ok()
    }

    pub(crate) fn has_hook(&self) -> bool {
        self.hook.get().is_some()
    }

    /// Tells the watcher that something is new to look at.
    pub(crate) fn kick(&self, kick: Kick) {
        let mut agenda = lock(&self.agenda);
        match kick {
            Kick::Exposed => agenda.exposures = agenda.exposures.saturating_add(1),
            Kick::Revoked => agenda.exposures = agenda.exposures.saturating_sub(1),
            Kick::Transfer => {}
        }
        agenda.kicked = true;
        let asleep = agenda.asleep;
        drop(agenda);
        // An awake watcher takes `kicked` before it next sleeps: only a
        // sleeping one needs the wake-up (a system call).
        if asleep {
            self.wake.notify_one();
        }
    }

    /// Tells the watcher to stop.
    pub(crate) fn stop(&self) {
        lock(&self.agenda).shutdown = true;
        self.wake.notify_one();
    }

    /// Hands out the notifications collected so far.
    pub(crate) fn take_inbox(&self) -> Vec<Notification> {
        std::mem::take(&mut *lock(&self.inbox))
    }

    /// Asks NIXL for notifications and keeps them; true if any arrived.
    pub(crate) fn collect_notifications(&self) -> Result<bool, nixl_sys::NixlError> {
        let mut map = NotificationMap::new()?;
        self.agents.serving.get_notifications(&mut map, None)?;
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

    /// Makes the agent that loads peers progress once, before a peer is
    /// unloaded, so that UCX sees a connection the peer closed (it exited)
    /// and closes its endpoint with force. Unloaded while UCX still thinks
    /// it connected, the endpoint is closed without force and never
    /// destroyed: its two sockets stay open, in CLOSE-WAIT, for the life of
    /// this process (NIXL 1.5.1; NIXL issue 2025), and a peer restarted
    /// under its name would leak them per restart. With NIXL's progress
    /// thread the initiating agent runs without it, and progresses only
    /// while a transfer of its own is asked about. The cost: one
    /// `get_notifs` (a pass over UCX's worker) per unload.
    pub(crate) fn progress(&self) {
        if !self.agents.two() {
            // The one agent is the serving one: what it collects is kept,
            // and the hook told by the watcher's next pass.
            match self.collect_notifications() {
                Ok(true) => {
                    self.unannounced.store(true, Ordering::Release);
                    self.kick(Kick::Transfer);
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::debug!(%error, "progressing the agent before an unload failed")
                }
            }
            return;
        }
        let asked = NotificationMap::new().and_then(|mut map| {
            self.agents.initiating().get_notifications(&mut map, None)?;
            Ok(map.agents().count())
        });
        match asked {
            Ok(0) => {}
            // No peer is told the initiating agent's name (it is in no
            // metadata this backend publishes): nothing to deliver.
            Ok(senders) => tracing::warn!(
                senders,
                "the initiating agent received notifications: dropped"
            ),
            Err(error) => {
                tracing::debug!(%error, "progressing the initiating agent before an unload failed")
            }
        }
    }

    /// Checks every unfinished transfer: whether any ended, and what is
    /// still in flight.
    ///
    /// The watcher never queues for the map: a thread that holds it (a
    /// waiter polling its own transfer, a post) would then have to wake the
    /// watcher when it unlocks, a system call on that thread's path. It
    /// counts the map's transfers as in flight instead and looks again on
    /// its next pass.
    fn check_transfers(&self) -> (bool, InFlight) {
        let mut transfers = match self.transfers.try_lock() {
            Ok(transfers) => transfers,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return (false, InFlight::Transfer),
        };
        let mut ended = false;
        let mut in_flight = InFlight::Nothing;
        let mut after = Vec::new();
        for (&id, t) in transfers.iter_mut() {
            if t.finished.is_some() {
                continue;
            }
            let assisted = t
                .assisted
                .is_some_and(|at| at.elapsed() < self.tuning.assisted);
            let running = InFlight::of(t.storage, assisted);
            if assisted {
                in_flight = in_flight.max(running);
                continue;
            }
            match t.look(self.agents.posting(t.route.poster())) {
                Look::Running => in_flight = in_flight.max(running),
                Look::Ended(_) => ended = true,
                look @ (Look::Proved { .. } | Look::SendApart(_)) => after.push((id, look)),
            }
        }
        drop(transfers);
        // Acted on after the lock: sending takes it again to record the end.
        for (id, look) in after {
            self.settle(id, look);
            ended = true;
        }
        (ended, in_flight)
    }

    /// The watcher thread's loop; returns when [`stop`](Self::stop) is called.
    pub(crate) fn run_watcher(&self) {
        WATCHER.with(|w| w.set(true));
        let Tuning {
            spin,
            first_sleep,
            transfer_cap,
            notify_cap,
            ..
        } = self.tuning;
        let mut spin_until = Instant::now() + spin;
        let mut sleep = first_sleep;
        loop {
            let exposures = {
                let mut agenda = lock(&self.agenda);
                if agenda.shutdown {
                    return;
                }
                if std::mem::take(&mut agenda.kicked) {
                    spin_until = Instant::now() + spin;
                    sleep = first_sleep;
                }
                agenda.exposures
            };
            let (ended, in_flight) = self.check_transfers();
            let notified = (exposures > 0
                && self.collect_notifications().unwrap_or_else(|error| {
                    tracing::warn!(%error, "getting NIXL notifications failed");
                    false
                }))
                | self.unannounced.swap(false, Ordering::AcqRel);
            if ended || notified {
                // No lock of ours is held: the hook may call straight back in.
                if let Some(hook) = self.hook.get() {
                    hook();
                }
                spin_until = Instant::now() + spin;
                sleep = first_sleep;
                continue;
            }
            // NIXL's POSIX plugin submits a storage transfer's queued I/O
            // only when asked about it: no nap while one runs.
            if in_flight == InFlight::Storage || Instant::now() < spin_until {
                std::thread::yield_now();
                continue;
            }
            let mut agenda = lock(&self.agenda);
            if agenda.shutdown || agenda.kicked {
                continue;
            }
            agenda.asleep = true;
            let mut agenda = if in_flight == InFlight::Nothing && agenda.exposures == 0 {
                // Nothing to wait for: sleep until something is handed over.
                self.wake
                    .wait(agenda)
                    .unwrap_or_else(PoisonError::into_inner)
            } else {
                let cap = if in_flight == InFlight::Nothing {
                    notify_cap
                } else {
                    transfer_cap
                };
                let nap = sleep.min(cap);
                sleep = (sleep * 2).min(cap);
                self.wake
                    .wait_timeout(agenda, nap)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            };
            agenda.asleep = false;
        }
    }
}

// A transfer's state, asked by the backend and by the watcher's pass.
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
            t.notified(state.clone());
        }
        state
    }
}

#[cfg(test)]
mod tests {
    use super::InFlight;

    #[test]
    fn only_a_storage_transfer_nobody_polls_keeps_the_watcher_from_napping() {
        assert_eq!(InFlight::of(true, false), InFlight::Storage);
        assert_eq!(InFlight::of(true, true), InFlight::Transfer);
        assert_eq!(InFlight::of(false, false), InFlight::Transfer);
        assert_eq!(InFlight::of(false, true), InFlight::Transfer);
        // The most demanding transfer of a pass decides.
        assert_eq!(
            [InFlight::of(true, true), InFlight::of(true, false)]
                .into_iter()
                .max(),
            Some(InFlight::Storage)
        );
    }
}
