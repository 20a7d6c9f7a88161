//! Acting inside a backend call: the [`Hooked`] wrapper, whose methods first
//! call a test's hook (to panic, to probe the connector from inside the
//! call, or to answer `release` as another backend would).

use std::sync::Arc;
use std::time::Duration;

use crate::faults::{Faults, Faulty};
use crate::{
    Connector, EventHook, Exposure, ExposureId, Notification, OperationKind, Posted, RegionId,
    RegistrationBackend, Release, Result, TransferId, TransferRequest, TransferState,
};

use super::Harness;

/// A backend method, as a [`Hooked`] backend's hook sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// [`RegistrationBackend::register`].
    Register,
    /// [`RegistrationBackend::deregister`].
    Deregister,
    /// [`RegistrationBackend::expose`].
    Expose,
    /// [`RegistrationBackend::revoke`].
    Revoke,
    /// [`RegistrationBackend::load_remote`].
    LoadRemote,
    /// [`RegistrationBackend::unload_remote`].
    UnloadRemote,
    /// [`RegistrationBackend::post`].
    Post,
    /// [`RegistrationBackend::poll`] of this transfer.
    Poll(TransferId),
    /// [`RegistrationBackend::release`] of this transfer.
    Release(TransferId),
    /// [`RegistrationBackend::drain_notifications`].
    DrainNotifications,
}

impl Call {
    /// The method's name, as in the trait.
    pub fn name(self) -> &'static str {
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

/// What a [`Hooked`] backend runs before each of its methods; for `release`
/// it may answer instead of the backend (`Some`).
pub type Hook<B> = Arc<dyn Fn(&Faulty<B>, Call) -> Option<Result<Release>> + Send + Sync>;

/// A backend (under [`Faulty`], so that faults can be armed) whose methods
/// first call a test's [`Hook`]: to panic, to probe the connector from inside
/// a backend call, or to answer `release` as another backend would.
pub struct Hooked<B: RegistrationBackend> {
    inner: Faulty<B>,
    hook: Hook<B>,
    /// False: refuses the event hook, so the engine must poll.
    event_driven: bool,
}

impl<B: RegistrationBackend> Hooked<B> {
    fn call(&self, call: Call) -> Option<Result<Release>> {
        (self.hook)(&self.inner, call)
    }
}

/// A connector over `backend` whose methods call `hook` first, and the handle
/// that arms faults on it. With `event_driven` false the backend refuses the
/// connector's event hook, as a polled transport (NIXL) does.
pub fn hooked<B: RegistrationBackend>(
    backend: B,
    event_driven: bool,
    hook: impl Fn(&Faulty<B>, Call) -> Option<Result<Release>> + Send + Sync + 'static,
) -> (Connector, Faults) {
    let inner = Faulty::new(backend);
    let faults = inner.faults();
    let connector = Connector::new(Hooked {
        inner,
        hook: Arc::new(hook),
        event_driven,
    });
    (connector, faults)
}

impl<B: RegistrationBackend> RegistrationBackend for Hooked<B> {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn agent_name(&self) -> &str {
        self.inner.agent_name()
    }
    unsafe fn register(&self, region: &crate::Segment, writable: bool) -> Result<RegionId> {
        self.call(Call::Register);
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.register(region, writable) }
    }
    fn deregister(&self, region: RegionId) -> Result<()> {
        self.call(Call::Deregister);
        self.inner.deregister(region)
    }
    unsafe fn register_file(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        writable: bool,
    ) -> Result<RegionId> {
        self.call(Call::Register);
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.register_file(fd, writable) }
    }
    unsafe fn expose(
        &self,
        ranges: &[crate::Exposed],
        access: OperationKind,
        key: &[u8],
    ) -> Result<Exposure> {
        self.call(Call::Expose);
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.expose(ranges, access, key) }
    }
    fn revoke(&self, exposure: ExposureId) -> Result<()> {
        self.call(Call::Revoke);
        self.inner.revoke(exposure)
    }
    fn revocation_enforced(&self) -> bool {
        self.inner.revocation_enforced()
    }
    fn access_enforced(&self) -> bool {
        self.inner.access_enforced()
    }
    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        self.call(Call::LoadRemote);
        self.inner.load_remote(agent_metadata)
    }
    fn unload_remote(&self, peer: &str) -> Result<()> {
        self.call(Call::UnloadRemote);
        self.inner.unload_remote(peer)
    }
    fn peer_name(&self, agent_metadata: &[u8]) -> Option<String> {
        self.inner.peer_name(agent_metadata)
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
    fn wait_assist(&self) -> Duration {
        self.inner.wait_assist()
    }
    fn awaiting_end(&self, transfer: TransferId) {
        self.inner.awaiting_end(transfer);
    }
    fn warm_up(&self, peer: &str) -> Result<()> {
        self.inner.warm_up(peer)
    }
    fn set_event_hook(&self, hook: EventHook) -> bool {
        self.event_driven && self.inner.set_event_hook(hook)
    }
}

/// A connector over the harness's agent `name`, [`Hooked`].
pub(super) fn hooked_agent(
    h: &dyn Harness,
    name: &str,
    event_driven: bool,
    hook: impl Fn(&Faulty<Box<dyn RegistrationBackend>>, Call) -> Option<Result<Release>>
    + Send
    + Sync
    + 'static,
) -> (Connector, Faults) {
    hooked(h.backend(name), event_driven, hook)
}
