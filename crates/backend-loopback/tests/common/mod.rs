//! Shared by the loopback integration tests: [`Hooked`], a loopback agent
//! (under [`Faulty`], so faults can be armed) whose trait methods first call a
//! test's hook (to panic, probe, or answer `release` as NIXL would).
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::faults::{Faults, Faulty};
use descriptor_core::{
    Connector, EventHook, Exposure, ExposureId, Notification, OperationKind, Posted, RegionId,
    RegistrationBackend, Release, Result, Segment, TransferId, TransferRequest, TransferState,
};

/// A backend method, as the hook sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Register,
    Deregister,
    Expose,
    Revoke,
    LoadRemote,
    UnloadRemote,
    Post,
    Poll(TransferId),
    Release(TransferId),
    DrainNotifications,
}

impl Call {
    /// The method's name, as in the trait.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Call::Register => "register",
            Call::Deregister => "deregister",
            Call::Expose => "expose",
            Call::Revoke => "revoke",
            Call::LoadRemote => "load_remote",
            Call::UnloadRemote => "unload_remote",
            Call::Post => "post",
            Call::Poll(_) => "poll",
            Call::Release(_) => "release",
            Call::DrainNotifications => "drain_notifications",
        }
    }
}

/// Runs before every call; for `release` it may answer instead of the backend.
pub(crate) type Hook =
    Arc<dyn Fn(&Faulty<LoopbackBackend>, Call) -> Option<Result<Release>> + Send + Sync>;

/// A loopback agent whose methods call `hook` first.
pub(crate) struct Hooked {
    pub(crate) inner: Faulty<LoopbackBackend>,
    pub(crate) hook: Hook,
    /// False: refuses the event hook, so the engine must poll (as with NIXL).
    pub(crate) event_driven: bool,
}

impl Hooked {
    fn call(&self, call: Call) -> Option<Result<Release>> {
        (self.hook)(&self.inner, call)
    }
}

/// A connector over a hooked loopback agent, and the handle arming its faults.
pub(crate) fn hooked(
    fabric: &Fabric,
    name: &str,
    event_driven: bool,
    hook: impl Fn(&Faulty<LoopbackBackend>, Call) -> Option<Result<Release>> + Send + Sync + 'static,
) -> (Connector, Faults) {
    let inner = Faulty::new(LoopbackBackend::new(fabric, name).unwrap());
    let faults = inner.faults();
    let connector = Connector::new(Hooked {
        inner,
        hook: Arc::new(hook),
        event_driven,
    });
    (connector, faults)
}

impl RegistrationBackend for Hooked {
    fn backend_name(&self) -> &'static str {
        "hooked-loopback"
    }
    fn agent_name(&self) -> &str {
        self.inner.agent_name()
    }
    unsafe fn register(&self, region: &Segment, writable: bool) -> Result<RegionId> {
        self.call(Call::Register);
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.register(region, writable) }
    }
    fn deregister(&self, region: RegionId) -> Result<()> {
        self.call(Call::Deregister);
        self.inner.deregister(region)
    }
    unsafe fn expose(
        &self,
        regions: &[RegionId],
        access: OperationKind,
        key: &[u8],
    ) -> Result<Exposure> {
        self.call(Call::Expose);
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.expose(regions, access, key) }
    }
    fn revoke(&self, exposure: ExposureId) -> Result<()> {
        self.call(Call::Revoke);
        self.inner.revoke(exposure)
    }
    fn revocation_enforced(&self) -> bool {
        self.inner.revocation_enforced()
    }
    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        self.call(Call::LoadRemote);
        self.inner.load_remote(agent_metadata)
    }
    fn unload_remote(&self, peer: &str) -> Result<()> {
        self.call(Call::UnloadRemote);
        self.inner.unload_remote(peer)
    }
    unsafe fn post(&self, request: &TransferRequest<'_>) -> Result<Posted> {
        self.call(Call::Post);
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.post(request) }
    }
    fn poll(&self, transfer: TransferId) -> TransferState {
        self.call(Call::Poll(transfer));
        self.inner.poll(transfer)
    }
    fn release(&self, transfer: TransferId) -> Result<Release> {
        match self.call(Call::Release(transfer)) {
            Some(answer) => answer,
            None => self.inner.release(transfer),
        }
    }
    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()> {
        self.call(Call::DrainNotifications);
        self.inner.drain_notifications(sink)
    }
    fn set_event_hook(&self, hook: EventHook) -> bool {
        self.event_driven && self.inner.set_event_hook(hook)
    }
}
