//! The trait every transport implements: [`RegistrationBackend`].
//!
//! A backend is one *agent* (NIXL's word): it registers local memory, describes
//! chosen regions to peers as an opaque blob, loads peers' blobs, and moves bytes
//! between its regions and a peer's. The [`Connector`](crate::Connector) does the
//! rest (pairing checks, the remote-agent cache, progress, waking waiters), so a
//! backend stays small and never sees the public operation types.

use std::os::fd::{BorrowedFd, RawFd};
use std::sync::Arc;

use crate::device::Device;
use crate::error::{Cause, Result, SharedCause};
use crate::metadata::OperationKind;

/// A backend's handle for a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u64);

/// A backend's handle for a set of regions exposed to peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExposureId(pub u64);

/// A backend's handle for a posted transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferId(pub u64);

/// A contiguous byte range on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Start address. For local memory the pointer's provenance has been exposed
    /// (`pointer::expose_provenance`), so an in-process backend may turn it back
    /// into a pointer with `std::ptr::with_exposed_provenance_mut`.
    pub addr: usize,
    /// Length in bytes; zero for an empty descriptor's memory, which a
    /// backend registers, exposes and moves like any other (a zero-length
    /// transfer still notifies the peer; conformance
    /// `empty_descriptors_move_like_any_other`).
    pub len: usize,
    /// The device holding the range.
    pub device: Device,
}

impl Segment {
    /// One past the last byte, or `None` if the range wraps the address space.
    pub fn end(&self) -> Option<usize> {
        self.addr.checked_add(self.len)
    }

    /// Whether `other` lies entirely inside `self` on the same device.
    pub fn contains(&self, other: &Segment) -> bool {
        match (self.end(), other.end()) {
            (Some(end), Some(other_end)) => {
                self.device == other.device && other.addr >= self.addr && other_end <= end
            }
            _ => false,
        }
    }
}

/// A range of a registered region that an exposure lets peers reach: the
/// bytes of one descriptor (a view) a passive operation holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Exposed {
    /// The registered region holding the range.
    pub region: RegionId,
    /// The range itself: inside `region`, the bytes the peer may move (the
    /// descriptor's [`size`](crate::Descriptor::size) from its
    /// [`ptr`](crate::Descriptor::ptr)).
    pub segment: Segment,
}

impl Exposed {
    /// Checks that the range lies inside `region`, the segment this
    /// backend registered as `self.region`; otherwise the error `expose`
    /// returns, naming range `index` and the backend.
    pub fn check_within(
        &self,
        region: &Segment,
        index: usize,
        backend: &'static str,
    ) -> Result<()> {
        if region.contains(&self.segment) {
            return Ok(());
        }
        Err(crate::Error::backend(
            backend,
            "expose",
            format!(
                "range {index} ({:#x}+{}) is not inside region {}",
                self.segment.addr, self.segment.len, self.region.0
            ),
        ))
    }
}

/// What an exposure hands to peers: the agent-metadata blob for some regions.
#[derive(Debug, Clone)]
pub struct Exposure {
    /// Handle to revoke the exposure with.
    pub id: ExposureId,
    /// Opaque agent metadata a peer passes to [`RegistrationBackend::load_remote`].
    pub agent_metadata: Vec<u8>,
}

/// What [`RegistrationBackend::release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The backend no longer touches the transfer's memory.
    LetGo,
    /// The transfer is still running and cannot be stopped now: the
    /// connector asks again later, and keeps the memory alive meanwhile.
    StillRunning,
}

/// A READ or WRITE between local memory and a far side (a peer's memory, or
/// a file), paired index by index.
#[derive(Debug, Clone, Copy)]
pub struct TransferRequest<'a> {
    /// Direction, seen from the agent that posts it: [`OperationKind::Read`]
    /// copies the far side into local memory (the peer published a readable;
    /// a file is read back), [`OperationKind::Write`] local memory into the
    /// far side (a writable; blocks offloaded to a file).
    pub op: OperationKind,
    /// Local segments, inside regions registered with this backend.
    pub local: &'a [Segment],
    /// The region holding each local segment, index by index: segments of
    /// one region that end where the next begins may be moved as one.
    pub local_regions: &'a [RegionId],
    /// What the local segments are paired with.
    pub target: Target<'a>,
}

/// The far side of a transfer.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// A peer's memory, described by its metadata.
    Peer(PeerTarget<'a>),
    /// Parts of files registered with this backend
    /// ([`RegistrationBackend::register_file`]), one per local segment.
    /// A backend that has no storage refuses the request with
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    File(&'a [FileSpan]),
}

/// A transfer's peer side.
#[derive(Debug, Clone, Copy)]
pub struct PeerTarget<'a> {
    /// The peer, as returned by [`RegistrationBackend::load_remote`].
    pub peer: &'a str,
    /// Remote segments, as the peer's metadata describes them (untrusted).
    pub remote: &'a [Segment],
    /// The notification key of the peer's operation, from its metadata: the
    /// bytes the peer's backend was given in [`RegistrationBackend::expose`].
    /// A backend may let the transfer reach only the exposure made for this
    /// key (loopback does). Delivered to the peer once the transfer has
    /// completed, unless `notify` is false.
    pub notification: &'a [u8],
    /// Whether the peer is told: true for every transfer a connector posts;
    /// false moves the bytes without a notification, so the peer's operation
    /// does not complete (a lost notification, injected by
    /// `Faults::drop_next_notification` under the `faults` feature).
    pub notify: bool,
}

/// A part of a registered file, the far side of one pair of a storage
/// transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileSpan {
    /// The file's registration, from [`RegistrationBackend::register_file`].
    pub region: RegionId,
    /// The file's descriptor, as registered.
    pub fd: RawFd,
    /// Where the span starts in the file.
    pub offset: u64,
    /// Its length in bytes: the local segment's at the same index.
    pub len: usize,
}

impl FileSpan {
    /// One past the span's last byte, or `None` past `u64::MAX`.
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(self.len as u64)
    }
}

impl<'a> TransferRequest<'a> {
    /// Total bytes moved.
    pub fn bytes(&self) -> usize {
        self.local.iter().map(|s| s.len).sum()
    }

    /// The peer side, unless the far side is a file.
    pub fn peer(&self) -> Option<&PeerTarget<'a>> {
        match &self.target {
            Target::Peer(peer) => Some(peer),
            Target::File(_) => None,
        }
    }
}

/// A transfer [`RegistrationBackend::post`] started, and what `post` knew of it.
#[derive(Debug, Clone)]
pub struct Posted {
    /// The transfer, for [`poll`](RegistrationBackend::poll) and
    /// [`release`](RegistrationBackend::release).
    pub id: TransferId,
    /// Its state as `post` returns: `Done` or `Failed` if it ended inside
    /// `post`, `InProgress` otherwise (always a correct answer: the connector
    /// then polls). The connector does not poll a transfer `post` said ended;
    /// it releases it at once.
    pub state: TransferState,
}

impl Posted {
    /// A transfer still running when `post` returns.
    pub fn running(id: TransferId) -> Posted {
        Posted {
            id,
            state: TransferState::InProgress,
        }
    }
}

/// State of a posted transfer.
#[derive(Debug, Clone)]
pub enum TransferState {
    /// Still moving bytes.
    InProgress,
    /// All bytes moved; the notification is on its way to the peer.
    Done,
    /// The transfer failed; the reason is the backend's own error.
    Failed(SharedCause),
}

impl TransferState {
    /// A failed state from the backend's error (or a message).
    #[cold]
    pub fn failed(reason: impl Into<Cause>) -> TransferState {
        TransferState::Failed(Arc::from(reason.into()))
    }

    /// Whether the transfer is still moving bytes.
    pub fn is_in_progress(&self) -> bool {
        matches!(self, TransferState::InProgress)
    }
}

/// A notification received from a peer.
///
/// Its parts are shared (`Arc`), so that a backend that already holds them,
/// like the loopback (its agent name, the operation's key), hands them over
/// without copying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// Name of the sending agent.
    pub from: Arc<str>,
    /// The payload, as sent (not necessarily UTF-8).
    pub payload: Arc<[u8]>,
    /// The exposure the transfer that carried this notification reached, and
    /// nothing else, if the backend can tell (loopback can; NIXL cannot:
    /// `None`). When it can, a notification completes a passive operation
    /// only if its transfer reached that operation's exposure, so a peer
    /// cannot complete one operation with another's key.
    pub exposure: Option<ExposureId>,
}

/// Called by an event-driven backend whenever a transfer completes or a
/// notification arrives.
///
/// The hook may call back into the backend (the connector's polls transfers
/// right away; it drains notifications, revokes exposures and wakes waiters
/// right away when a thread or future waits for a passive operation, and
/// otherwise leaves that to whoever looks at one next), so a backend calls it
/// **with none of its own locks held**. It may be called
/// from any thread, including from inside another agent's call (loopback runs
/// a peer's transfer in the peer's thread and notifies this agent from there);
/// the connector's hook contains panics and never blocks on a peer.
pub type EventHook = Arc<dyn Fn() + Send + Sync>;

/// One agent of a transport: registration, exposure, peers and transfers.
///
/// Implementations are `Send + Sync` and take `&self` everywhere: the connector
/// calls them from user threads and from its progress engine at once, never
/// while holding a lock of its own. Errors are this crate's
/// [`Error`](crate::Error), never a backend's own type.
///
/// The methods that let a peer or a transfer reach memory ([`register`],
/// [`expose`], [`post`]) are `unsafe`: their callers promise that nothing else
/// touches that memory meanwhile. The safe methods only narrow access or
/// report, so calling them out of turn can fail an operation but never expose
/// memory. The [`Connector`](crate::Connector) is the one caller that keeps
/// these promises; it does not hand its backend out.
///
/// ```compile_fail,E0133
/// # use descriptor_core::{Exposed, OperationKind, RegistrationBackend};
/// // Exposing memory behind the connector's back takes `unsafe`: it may
/// // belong to a descriptor that safe code is reading or writing.
/// fn expose_held_memory(backend: &dyn RegistrationBackend, range: Exposed) {
///     let _ = backend.expose(&[range], OperationKind::Write, b"key");
/// }
/// ```
///
/// ```compile_fail,E0599
/// # use descriptor_core::Connector;
/// // And a connector has no accessor for its backend.
/// fn backend_of(connector: &Connector) {
///     let _ = connector.backend();
/// }
/// ```
///
/// [`register`]: Self::register
/// [`expose`]: Self::expose
/// [`post`]: Self::post
pub trait RegistrationBackend: Send + Sync + 'static {
    /// Short name of the transport, such as `"loopback"` or `"nixl"`.
    fn backend_name(&self) -> &'static str;

    /// This agent's name, unique among the agents that talk to each other.
    fn agent_name(&self) -> &str;

    /// Registers a region; `writable` says whether transfers may write into it.
    ///
    /// # Safety
    ///
    /// The memory must stay valid for reads (and for writes when `writable`,
    /// or when [`access_enforced`](Self::access_enforced) is false) until
    /// [`deregister`](Self::deregister) returns, and nothing else may access it
    /// while a transfer or an exposure that covers it is live. For host memory,
    /// `region.addr` must come from a pointer whose provenance was exposed.
    unsafe fn register(&self, region: &Segment, writable: bool) -> Result<RegionId>;

    /// Deregisters a region (or a file); called before its memory is
    /// released (its file closed).
    fn deregister(&self, region: RegionId) -> Result<()>;

    /// Registers an open regular file for storage transfers
    /// ([`Target::File`]); `writable` says whether transfers may write it
    /// (it was opened for writing). Default: no storage,
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    ///
    /// # Safety
    ///
    /// The descriptor stays open, and names the same file, until
    /// [`deregister`](Self::deregister) returns for the registration.
    unsafe fn register_file(&self, fd: BorrowedFd<'_>, writable: bool) -> Result<RegionId> {
        let _ = (fd, writable);
        Err(crate::Error::Unsupported {
            backend: self.backend_name(),
            what: "storage transfers (files as the far side)".into(),
        })
    }

    /// Describes `ranges` (each inside a region registered with this backend)
    /// to peers that may `access` them (READ for a readable, WRITE for a
    /// writable), ideally nothing more than those ranges: a region holds other
    /// views too, which safe code may be using. Exposing a range of a region
    /// registered read-only for WRITE is an error.
    ///
    /// `key` is the notification key of the operation the exposure is made for
    /// (unique among this agent's live exposures, never empty): the peer's
    /// transfers carry it in [`PeerTarget::notification`]. A backend may
    /// bind the exposure to it, so that only a transfer carrying the key
    /// reaches these ranges (loopback does; NIXL cannot and ignores it).
    ///
    /// # Safety
    ///
    /// From the call on, a peer that is given the returned metadata may read or
    /// write the ranges' memory at any time. So that memory must stay valid,
    /// and nothing but this backend may access it, until [`revoke`](Self::revoke)
    /// has returned for the exposure when [`revocation_enforced`](Self::revocation_enforced)
    /// is true; otherwise until the peer has notified completion, or for ever.
    /// On `Err` nothing was exposed.
    unsafe fn expose(
        &self,
        ranges: &[Exposed],
        access: OperationKind,
        key: &[u8],
    ) -> Result<Exposure>;

    /// Ends an exposure. See [`revocation_enforced`](Self::revocation_enforced).
    fn revoke(&self, exposure: ExposureId) -> Result<()>;

    /// Whether, once [`revoke`](Self::revoke) has returned, no peer can touch the
    /// exposed memory any more. When false (NIXL over shared memory or TCP), the
    /// connector never hands memory back to safe code, nor frees it, while a peer
    /// that saw the exposure might still use it.
    fn revocation_enforced(&self) -> bool;

    /// Whether peers can write only what was registered `writable` and
    /// exposed for WRITE. When false (NIXL: a UCX key grants remote write to
    /// every registered byte, whatever the exposure's kind), the core never
    /// registers memory it calls read-only (a [`bytes::Bytes`], a Python
    /// `bytes`): it registers a private copy of it instead, which a peer
    /// may write without changing the read-only memory (see
    /// [`Descriptor::ptr`](crate::Descriptor::ptr)). The default is false,
    /// the safe answer for a backend that does not say.
    fn access_enforced(&self) -> bool {
        false
    }

    /// Loads a peer's agent metadata (merging with what was loaded before from the
    /// same peer) and returns the peer's name.
    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String>;

    /// Forgets everything loaded from `peer`.
    fn unload_remote(&self, peer: &str) -> Result<()>;

    /// The peer `agent_metadata` names, if the backend can tell without loading
    /// it. When [`load_remote`](Self::load_remote) refuses a blob that names a
    /// peer the connector keeps loaded but idle (a peer that restarted under
    /// the same name: NIXL refuses new connection info for a loaded name), the
    /// connector unloads that peer and loads the blob again.
    fn peer_name(&self, agent_metadata: &[u8]) -> Option<String> {
        let _ = agent_metadata;
        None
    }

    /// Posts a transfer. Remote segments come from untrusted metadata: a backend
    /// must refuse ranges the peer did not register and expose where it can.
    /// File spans name files registered with this backend; a READ past a
    /// file's end fails the transfer (never leaves bytes unread silently).
    ///
    /// # Safety
    ///
    /// Every local segment lies inside the region registered with this
    /// backend that `local_regions` names at its index (registered writable
    /// if the transfer READs into it), and stays valid and
    /// untouched by anything else until [`release`](Self::release) returns
    /// [`Release::LetGo`] for the returned transfer. On `Err` no transfer was
    /// started.
    unsafe fn post(&self, request: &TransferRequest<'_>) -> Result<Posted>;

    /// Reports a posted transfer's state.
    fn poll(&self, transfer: TransferId) -> TransferState;

    /// Releases a transfer the connector is done with, aborting it if the
    /// backend can. It must not wait for a transfer in progress.
    ///
    /// - [`Release::LetGo`]: the backend no longer touches its memory.
    /// - [`Release::StillRunning`]: it cannot be stopped now; the connector's
    ///   engine calls `release` again until it lets go, and keeps the memory
    ///   alive meanwhile. An event-driven backend signals its hook when such a
    ///   transfer ends.
    /// - `Err`: the backend lost track of it; the connector never frees its memory.
    fn release(&self, transfer: TransferId) -> Result<Release>;

    /// Takes every notification received since the last call. Called from
    /// any thread: the connector's engine, the event hook's, or a user's that
    /// looks at a passive operation (`status`, `wait`, drop), so it must not
    /// block; `sink` only collects, and calls nothing back.
    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()>;

    /// How long a thread blocked waiting for an active operation should poll
    /// its transfer itself ([`poll`](Self::poll)) before it sleeps until the
    /// event hook wakes it (default: not at all). A backend whose completions
    /// are found by polling anyway (NIXL) saves the waiter a wake-up this way;
    /// the number is the backend's transport policy, measured on it.
    fn wait_assist(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// The connector now waits for the [event hook](Self::set_event_hook) to
    /// report the end of `transfer`: a blocked waiter stopped polling it
    /// itself and is about to sleep, or a future is waiting for it. Called
    /// from the waiting thread, with no lock of the connector held; must not
    /// block. A backend that does not follow a fresh transfer until somebody
    /// depends on it (NIXL, for small transfers: waking its watcher thread
    /// at the post costs more than the posting thread, which usually polls
    /// the transfer itself, needs) starts following it here (default: nothing
    /// to do).
    fn awaiting_end(&self, transfer: TransferId) {
        let _ = transfer;
    }

    /// Makes the connection to `peer` (loaded with
    /// [`load_remote`](Self::load_remote)) now, so that the first transfer to
    /// it does not pay for the connection's setup; returns once it is made
    /// or failed. Called from a user thread with no lock of the connector
    /// held; may block (default: nothing to make, `Ok`).
    fn warm_up(&self, peer: &str) -> Result<()> {
        let _ = peer;
        Ok(())
    }

    /// Installs the hook an event-driven backend calls on every completion and
    /// notification, and returns true; a backend that must be polled returns false.
    fn set_event_hook(&self, hook: EventHook) -> bool {
        let _ = hook;
        false
    }
}

/// A boxed backend is a backend: harnesses and programs that pick the
/// transport at run time hold a `Box<dyn RegistrationBackend>`.
impl<B: RegistrationBackend + ?Sized> RegistrationBackend for Box<B> {
    fn backend_name(&self) -> &'static str {
        (**self).backend_name()
    }
    fn agent_name(&self) -> &str {
        (**self).agent_name()
    }
    unsafe fn register(&self, region: &Segment, writable: bool) -> Result<RegionId> {
        // SAFETY: our caller's contract is the boxed backend's.
        unsafe { (**self).register(region, writable) }
    }
    fn deregister(&self, region: RegionId) -> Result<()> {
        (**self).deregister(region)
    }
    unsafe fn register_file(&self, fd: BorrowedFd<'_>, writable: bool) -> Result<RegionId> {
        // SAFETY: our caller's contract is the boxed backend's.
        unsafe { (**self).register_file(fd, writable) }
    }
    unsafe fn expose(
        &self,
        ranges: &[Exposed],
        access: OperationKind,
        key: &[u8],
    ) -> Result<Exposure> {
        // SAFETY: our caller's contract is the boxed backend's.
        unsafe { (**self).expose(ranges, access, key) }
    }
    fn revoke(&self, exposure: ExposureId) -> Result<()> {
        (**self).revoke(exposure)
    }
    fn revocation_enforced(&self) -> bool {
        (**self).revocation_enforced()
    }
    fn access_enforced(&self) -> bool {
        (**self).access_enforced()
    }
    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        (**self).load_remote(agent_metadata)
    }
    fn unload_remote(&self, peer: &str) -> Result<()> {
        (**self).unload_remote(peer)
    }
    fn peer_name(&self, agent_metadata: &[u8]) -> Option<String> {
        (**self).peer_name(agent_metadata)
    }
    unsafe fn post(&self, request: &TransferRequest<'_>) -> Result<Posted> {
        // SAFETY: our caller's contract is the boxed backend's.
        unsafe { (**self).post(request) }
    }
    fn poll(&self, transfer: TransferId) -> TransferState {
        (**self).poll(transfer)
    }
    fn release(&self, transfer: TransferId) -> Result<Release> {
        (**self).release(transfer)
    }
    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()> {
        (**self).drain_notifications(sink)
    }
    fn wait_assist(&self) -> std::time::Duration {
        (**self).wait_assist()
    }
    fn awaiting_end(&self, transfer: TransferId) {
        (**self).awaiting_end(transfer);
    }
    fn warm_up(&self, peer: &str) -> Result<()> {
        (**self).warm_up(peer)
    }
    fn set_event_hook(&self, hook: EventHook) -> bool {
        (**self).set_event_hook(hook)
    }
}
