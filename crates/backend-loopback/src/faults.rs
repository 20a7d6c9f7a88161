//! Fault injection, so users can test their error paths on a laptop.

use std::sync::Arc;
use std::time::Duration;

use crate::fabric::{Agent, lock};

/// Faults armed for an agent's next transfers; each fires once.
#[derive(Default)]
pub(crate) struct FaultPlan {
    pub(crate) fail: Option<String>,
    pub(crate) delay: Option<Duration>,
    pub(crate) drop_notification: bool,
}

/// Arms faults on one loopback agent. Get it from
/// [`LoopbackBackend::faults`](crate::LoopbackBackend::faults) before handing the
/// backend to a connector; clones arm the same agent.
#[derive(Clone)]
pub struct FaultInjector {
    pub(crate) agent: Arc<Agent>,
}

impl std::fmt::Debug for FaultInjector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultInjector")
            .field("agent", &self.agent.name)
            .finish()
    }
}

impl FaultInjector {
    /// The next transfer this agent posts fails with `reason`, touching no memory.
    pub fn fail_next_transfer(&self, reason: impl Into<String>) {
        lock(&self.agent.faults).fail = Some(reason.into());
    }

    /// The next transfer this agent posts stays in progress for `delay` before it
    /// moves any byte (it can be cancelled meanwhile).
    pub fn delay_next_transfer(&self, delay: Duration) {
        lock(&self.agent.faults).delay = Some(delay);
    }

    /// The notification of the next transfer this agent completes is lost.
    pub fn drop_next_notification(&self) {
        lock(&self.agent.faults).drop_notification = true;
    }
}
