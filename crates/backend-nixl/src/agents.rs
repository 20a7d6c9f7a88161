//! The serving and the initiating agent, and what the serving agent holds
//! for each peer (its [`Notifier`] state).
//!
//! With NIXL's progress thread on, two agents: the one called by the
//! builder's name runs that thread, holds the memory peers reach, receives
//! their notifications and sends this connector's; this connector's own
//! READs and WRITEs go out through `<name>.initiator`, without it, which
//! only the waiting thread and the watcher call into. Why:
//! docs/decisions/0003-two-agents.md. Without the thread there is one agent,
//! and it is both. Peers are loaded into them by [`crate::peers`].

use std::collections::HashMap;
use std::sync::Mutex;

use nixl_sys::Agent;

use crate::exit::Guard;
use crate::route::{Notifier, Poster};
use crate::sync::lock;
use crate::tuning::Notifications;

/// The name of the agent that initiates a connector's transfers, beside the
/// one called `name` that serves peers.
pub(crate) fn initiator_name(name: &str) -> String {
    format!("{name}.initiator")
}

/// This backend's agents.
pub(crate) struct Agents {
    /// Serves peers: holds the memory they reach, its metadata is what they
    /// load, and notifications arrive on it.
    pub(crate) serving: Agent,
    /// Posts this connector's transfers when NIXL's thread is on.
    initiator: Option<Agent>,
    /// The notification route in effect: [`Notifications::Attached`] with
    /// one agent, whatever the builder said.
    pub(crate) notifications: Notifications,
    /// What the serving agent holds for each peer, by NIXL name.
    pub(crate) notifiers: Notifiers,
    /// Held while the fields above are dropped (declared last, so dropped
    /// last): the process's exit waits for it (see [`crate::exit`]).
    exit: Guard,
}

impl Drop for Agents {
    fn drop(&mut self) {
        match Guard::enter() {
            // The fields, the agents among them, are dropped after this
            // returns, and the guard after them.
            Some(guard) => self.exit = guard,
            None => {
                // The process is exiting: the native agents are never
                // destroyed (their handles' count never reaches zero).
                std::mem::forget(self.serving.clone());
                std::mem::forget(self.initiator.clone());
            }
        }
    }
}

impl Agents {
    pub(crate) fn new(
        serving: Agent,
        initiator: Option<Agent>,
        notifications: Notifications,
    ) -> Agents {
        let notifications = if initiator.is_some() {
            notifications
        } else {
            Notifications::Attached
        };
        crate::exit::watch();
        Agents {
            serving,
            initiator,
            notifications,
            notifiers: Notifiers::default(),
            exit: Guard::idle(),
        }
    }

    /// The agent that posts this connector's transfers (and loads the peers
    /// they go to).
    pub(crate) fn initiating(&self) -> &Agent {
        self.initiator.as_ref().unwrap_or(&self.serving)
    }

    /// The agent `poster` names.
    pub(crate) fn posting(&self, poster: Poster) -> &Agent {
        match poster {
            Poster::Initiating => self.initiating(),
            Poster::Serving => &self.serving,
        }
    }

    /// Whether there are two agents.
    pub(crate) fn two(&self) -> bool {
        self.initiator.is_some()
    }

    /// Every agent, the serving one first.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Agent> {
        std::iter::once(&self.serving).chain(&self.initiator)
    }
}

/// The serving agent's [`Notifier`] state per peer, by NIXL name; a name
/// absent is [`Notifier::NotLoaded`].
#[derive(Default)]
pub(crate) struct Notifiers(Mutex<HashMap<String, Notifier>>);

impl Notifiers {
    pub(crate) fn get(&self, nixl_name: &str) -> Notifier {
        lock(&self.0)
            .get(nixl_name)
            .copied()
            .unwrap_or(Notifier::NotLoaded)
    }

    pub(crate) fn set(&self, nixl_name: &str, notifier: Notifier) {
        lock(&self.0).insert(nixl_name.to_owned(), notifier);
    }

    /// A transfer through the proving route succeeded. A peer unloaded (or
    /// failed) meanwhile stays as it is.
    pub(crate) fn proved(&self, nixl_name: &str) {
        if let Some(n @ Notifier::Proving) = lock(&self.0).get_mut(nixl_name) {
            *n = Notifier::Proven;
        }
    }

    pub(crate) fn remove(&self, nixl_name: &str) -> Notifier {
        lock(&self.0)
            .remove(nixl_name)
            .unwrap_or(Notifier::NotLoaded)
    }
}
