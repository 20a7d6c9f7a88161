//! [`Connector`]: one process role's entry point; creates the four operations.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::auth::{Auth, PeerKeys};
use crate::backend::{
    Exposed, PeerTarget, RegionId, RegistrationBackend, Segment, Target, TransferRequest,
};
use crate::descriptor::Descriptor;
use crate::engine::Engine;
use crate::error::{Error, Result, Side};
use crate::file::{FileSegment, check_file_pairing};
use crate::metadata::{OperationKind, RdmaMetadata, SerializedDescriptor};
use crate::operation::state::{FarSide, OpShared, OperationStatus, Pending, Role};
use crate::operation::{
    Held, OperationCore, ReadOperation, ReadableOperation, WritableOperation, WriteOperation,
};
use crate::quarantine::{Quarantine, QuarantinePolicy, Quarantined};
use crate::reach::Ticket;
use crate::remote::{DEFAULT_MAX_IDLE_PEERS, RemoteCache};

static NEXT_CONNECTOR_ID: AtomicU64 = AtomicU64::new(1);

/// Creates operations over one [`RegistrationBackend`].
///
/// Cheap to clone (clones share everything) and `Send + Sync`. It owns the
/// backend, a reference-counted cache of loaded peers (many operations to one
/// peer share one entry; the last one out unloads it) and one progress engine
/// thread, started on first use, that sleeps whenever nothing is in flight.
#[derive(Clone)]
pub struct Connector {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    name: Arc<str>,
    backend: Arc<dyn RegistrationBackend>,
    engine: Arc<Engine>,
    remotes: Arc<RemoteCache>,
    /// The memory of exposures abandoned before their peer's word.
    quarantine: Arc<Quarantine>,
    /// How the agent blobs it publishes are sealed (the cache opens those
    /// it loads with the same).
    auth: Auth,
    /// Backend registrations made so far.
    registrations: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.engine.shutdown();
    }
}

/// Builds a [`Connector`] with settings other than the defaults.
pub struct ConnectorBuilder {
    backend: Arc<dyn RegistrationBackend>,
    max_idle_peers: usize,
    quarantine: Option<QuarantinePolicy>,
    auth: Option<Auth>,
}

impl std::fmt::Debug for ConnectorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorBuilder")
            .field("backend", &self.backend.backend_name())
            .field("max_idle_peers", &self.max_idle_peers)
            .field("quarantine", &self.quarantine)
            .field("peer_keys", &self.auth)
            .finish()
    }
}

impl ConnectorBuilder {
    /// How many peers to keep loaded after their last operation ended (default
    /// 64; least recently used unloaded first). 0 unloads a peer as soon as its
    /// last operation ends, as Dynamo's reference-counted fix does.
    pub fn max_idle_peers(mut self, peers: usize) -> Self {
        self.max_idle_peers = peers;
        self
    }

    /// How long the memory of an exposure abandoned before its peer's word
    /// is kept before it is freed, on a backend that cannot cut a peer off
    /// (see [`QuarantinePolicy`]; default: [`QuarantinePolicy::from_env`]).
    pub fn quarantine(mut self, policy: QuarantinePolicy) -> Self {
        self.quarantine = Some(policy);
        self
    }

    /// Seals every agent blob this connector publishes with `keys`' first
    /// key, and refuses every blob it is given that none of them sealed,
    /// before the backend sees it ([`PeerKeys`] says what that protects).
    /// Default: the keys of [`PeerKeys::from_env`], none when it is unset
    /// (blobs published and loaded as Dynamo's workers write them); an
    /// invalid variable makes the connector refuse every blob (logged), never
    /// run without the keys it was meant to have.
    pub fn peer_keys(mut self, keys: PeerKeys) -> Self {
        self.auth = Some(Auth::Keys(keys));
        self
    }

    /// The connector.
    pub fn build(self) -> Connector {
        let backend = self.backend;
        let quarantine = self.quarantine.unwrap_or_default();
        let auth = self.auth.unwrap_or_else(Auth::from_env);
        Connector {
            inner: Arc::new(Inner {
                id: NEXT_CONNECTOR_ID.fetch_add(1, Ordering::Relaxed),
                name: backend.agent_name().into(),
                engine: Engine::new(Arc::clone(&backend)),
                remotes: Arc::new(RemoteCache::new(
                    Arc::clone(&backend),
                    self.max_idle_peers,
                    auth.clone(),
                )),
                auth,
                backend,
                quarantine: Arc::new(Quarantine::new(quarantine)),
                registrations: AtomicU64::new(0),
            }),
        }
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("name", &self.inner.name)
            .field("backend", &self.inner.backend.backend_name())
            .finish()
    }
}

impl Connector {
    /// A connector over `backend`; its name is the backend's agent name.
    pub fn new(backend: impl RegistrationBackend) -> Connector {
        Connector::builder(backend).build()
    }

    /// A connector over a shared backend. Give each backend to one connector only:
    /// the connector's engine consumes the backend's notifications.
    pub fn from_arc(backend: Arc<dyn RegistrationBackend>) -> Connector {
        Connector::builder_from_arc(backend).build()
    }

    /// A builder over a shared backend (see [`from_arc`](Self::from_arc)).
    pub fn builder_from_arc(backend: Arc<dyn RegistrationBackend>) -> ConnectorBuilder {
        ConnectorBuilder {
            backend,
            max_idle_peers: DEFAULT_MAX_IDLE_PEERS,
            quarantine: None,
            auth: None,
        }
    }

    /// A builder, for settings other than the defaults.
    pub fn builder(backend: impl RegistrationBackend) -> ConnectorBuilder {
        Connector::builder_from_arc(Arc::new(backend))
    }

    /// The agent name peers know this connector by.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Short name of the backend's transport, such as `"loopback"` or `"nixl"`.
    ///
    /// The connector does not hand out its backend: the backend's methods keep
    /// the safety model only when the connector alone calls them (a region
    /// exposed behind its back could be written by a peer under a live `&mut`).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.backend_name()
    }

    /// Whether the backend can cut a peer off: see
    /// [`RegistrationBackend::revocation_enforced`]. When false (NIXL), a
    /// passive operation that ends before its peer notified completion leaks
    /// its memory rather than free what a peer might still write.
    pub fn revocation_enforced(&self) -> bool {
        self.inner.backend.revocation_enforced()
    }

    /// Peers that operations of this connector are using right now.
    pub fn remote_agent_count(&self) -> usize {
        self.inner.remotes.active()
    }

    /// Peers kept loaded although no operation uses them (at most
    /// [`ConnectorBuilder::max_idle_peers`]), so the next operation to them
    /// needs no reload or reconnection.
    pub fn idle_remote_agent_count(&self) -> usize {
        self.inner.remotes.idle()
    }

    /// Unloads every idle peer now.
    pub fn unload_idle_remote_agents(&self) {
        self.inner.remotes.unload_idle();
    }

    /// Loads the peer `remote` names and makes the backend's connection to
    /// it now, so that the first [`begin_read`](Self::begin_read) or
    /// [`begin_write`](Self::begin_write) to it does not pay for the
    /// connection's setup (NIXL between two fresh processes: tens of
    /// milliseconds for the first transfer, against about one steady). The
    /// peer stays loaded, idle ([`ConnectorBuilder::max_idle_peers`]), for
    /// the operations that follow. A backend without connections to make
    /// (loopback) only loads the peer.
    ///
    /// # Errors
    ///
    /// What loading the peer would give `begin_read` (malformed metadata, a
    /// peer that cannot be reached), or the backend's failure to connect.
    pub fn warm_up(&self, remote: &RdmaMetadata) -> Result<()> {
        let lease = self.inner.remotes.acquire(remote.agent_metadata())?;
        let span =
            tracing::debug_span!("warm_up", connector = %self.inner.name, peer = %lease.peer());
        let _entered = span.enter();
        self.inner.backend.warm_up(lease.peer())
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// How many regions this connector has registered with its backend so
    /// far: one per plain descriptor on its first use, one per
    /// [`BlockPool`](crate::BlockPool) or [`RegisteredMemory`](crate::RegisteredMemory)
    /// whatever its views do. Operations over pooled views add none.
    pub fn registrations(&self) -> u64 {
        self.inner.registrations.load(Ordering::Relaxed)
    }

    /// The memory of abandoned exposures this connector keeps now, for a
    /// peer that may still touch it (see [`QuarantinePolicy`]); what was due
    /// is freed first.
    pub fn quarantined(&self) -> Quarantined {
        self.inner.quarantine.sweep();
        self.inner.quarantine.held()
    }

    /// Frees the memory of every abandoned exposure now, whatever its
    /// window: for a caller that knows its peers are gone (they exited, or
    /// were unloaded and cannot reconnect under their name). Returns what was
    /// freed.
    pub fn free_quarantined(&self) -> Quarantined {
        self.inner.quarantine.free_all()
    }

    /// `blob` as this connector publishes it: sealed with its signing key
    /// when it has keys ([`ConnectorBuilder::peer_keys`]), as it is
    /// otherwise. For agent metadata handed out beside operations (the
    /// Python package's `Connection.metadata`).
    ///
    /// # Errors
    ///
    /// [`Error::Unauthenticated`] if the connector's keys' setting is invalid.
    pub fn seal_agent_metadata(&self, blob: Vec<u8>) -> Result<Vec<u8>> {
        self.inner.auth.seal(blob)
    }

    pub(crate) fn count_registration(&self) {
        self.inner.registrations.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn shared_name(&self) -> Arc<str> {
        Arc::clone(&self.inner.name)
    }

    pub(crate) fn backend_arc(&self) -> Arc<dyn RegistrationBackend> {
        Arc::clone(&self.inner.backend)
    }

    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.inner.engine
    }

    /// Exposes `descriptors` for a peer to READ. The operation completes when the
    /// peer's notification arrives; publish [`ReadableOperation::metadata`].
    pub fn create_readable(
        &self,
        descriptors: impl Into<Vec<Descriptor>>,
    ) -> Result<ReadableOperation> {
        self.create_passive(descriptors.into(), OperationKind::Read)
            .map(ReadableOperation::new)
    }

    /// Exposes `descriptors` for a peer to WRITE into. Every descriptor must be writable.
    pub fn create_writable(
        &self,
        descriptors: impl Into<Vec<Descriptor>>,
    ) -> Result<WritableOperation> {
        self.create_passive(descriptors.into(), OperationKind::Write)
            .map(WritableOperation::new)
    }

    /// READs a peer's readable memory into `local`; the transfer is posted before
    /// this returns.
    ///
    /// # Pairing rules (Dynamo's), checked before anything is loaded or posted
    ///
    /// - `remote` must be a readable's metadata (`operation_kind` 1), else
    ///   [`Error::OperationKindMismatch`];
    /// - `local` has as many descriptors as `remote` ([`Error::DescriptorCountMismatch`]),
    ///   and descriptor `i` of each moves the same number of bytes: local
    ///   [`size`](Descriptor::size) equals remote `size` ([`Error::SizeMismatch`]).
    ///   Bytes move descriptor by descriptor, never split or gathered (a
    ///   backend may merge neighbours into one transfer descriptor below
    ///   that; the pairs stay the same);
    /// - each side's descriptors are all on one kind of device ([`Error::MixedDevices`]);
    /// - local descriptors are writable ([`Error::ReadOnlyBuffer`]) and not
    ///   registered with another connector ([`Error::RegisteredElsewhere`]).
    ///
    /// A local descriptor may hold more than it receives: set its size to its
    /// partner's ([`Descriptor::set_size`]), or let
    /// [`begin_read_fit`](Self::begin_read_fit) do it. The bytes past the
    /// size are not written, and `size()` of what comes back says what
    /// arrived. A peer that publishes one large descriptor is read into one
    /// local descriptor of that size, which you may split afterwards
    /// ([`Descriptor::split_off`]); to read part of a peer's region, the peer
    /// publishes that part as a descriptor of its own (a view, with
    /// [`Descriptor::set_size`] for a prefix).
    pub fn begin_read(
        &self,
        remote: &RdmaMetadata,
        local: impl Into<Vec<Descriptor>>,
    ) -> Result<ReadOperation> {
        self.begin_active(remote, local.into(), OperationKind::Read)
            .map(ReadOperation::new)
    }

    /// READs a peer's readable memory into descriptors that may be larger
    /// than what they receive: sets each local descriptor's
    /// [`size`](Descriptor::size) to its remote partner's, then
    /// [`begin_read`](Self::begin_read)s. What comes back holds the length
    /// that arrived in `size()`, its bytes past it untouched: read a peer's
    /// 3.7 MB into a pooled 8 MB block.
    ///
    /// [`Error::CapacityTooSmall`] if a remote descriptor is larger than its
    /// local partner's [`capacity`](Descriptor::capacity); the other pairing
    /// rules are `begin_read`'s.
    pub fn begin_read_fit(
        &self,
        remote: &RdmaMetadata,
        local: impl Into<Vec<Descriptor>>,
    ) -> Result<ReadOperation> {
        let mut local = local.into();
        // A count mismatch is `begin_read`'s to report.
        if local.len() == remote.descriptors().len() {
            for (index, (l, r)) in local.iter_mut().zip(remote.descriptors()).enumerate() {
                let wanted = usize::try_from(r.size).unwrap_or(usize::MAX);
                if wanted > l.capacity() {
                    return Err(Error::CapacityTooSmall {
                        index,
                        capacity: l.capacity(),
                        remote: wanted,
                    });
                }
                l.set_size(wanted)?;
            }
        }
        self.begin_read(remote, local)
    }

    /// WRITEs `local` into a peer's writable memory; the transfer is posted before
    /// this returns.
    ///
    /// The pairing rules are [`begin_read`](Self::begin_read)'s, with `remote` a
    /// writable's metadata (`operation_kind` 2) and `local` allowed to be
    /// read-only (`bytes::Bytes`). To fill a peer's one large descriptor, write
    /// one local descriptor of that size. Sizes must be equal here too: a
    /// writable learns nothing but the notification key, so a shorter write
    /// would leave stale bytes it cannot tell from data; the writable's side
    /// sets its descriptors' sizes to what it expects.
    pub fn begin_write(
        &self,
        local: impl Into<Vec<Descriptor>>,
        remote: &RdmaMetadata,
    ) -> Result<WriteOperation> {
        self.begin_active(remote, local.into(), OperationKind::Write)
            .map(WriteOperation::new)
    }

    /// WRITEs `local` into parts of files, pair by pair (a storage tier's
    /// offload); the transfer is posted before this returns, and completes
    /// as every operation does (`wait`, `.await`, `status`, `cancel`).
    ///
    /// - as many segments as descriptors ([`Error::DescriptorCountMismatch`]),
    ///   neither list empty ([`Error::EmptyDescriptorList`]), and descriptor
    ///   `i`'s [`size`](Descriptor::size) equal to segment `i`'s
    ///   [`len`](FileSegment::len) ([`Error::SizeMismatch`]);
    /// - every file opened for writing ([`Error::ReadOnlyFile`]); a file
    ///   grows as the WRITE reaches past its end;
    /// - for a file opened with `O_DIRECT`, offsets, lengths and memory
    ///   addresses aligned as its file system needs
    ///   ([`FileSegment::direct_io_alignment`], [`Error::UnalignedDirectIo`]);
    /// - local descriptors on one kind of device, not registered with
    ///   another connector, as for [`begin_write`](Self::begin_write).
    ///
    /// Each file is registered with the backend the first time one of its
    /// segments is moved, once. Segments next to each other in one file,
    /// paired with neighbouring views of one registration, move as one.
    /// What completion guarantees: every byte is in the file (in the page
    /// cache unless the file was opened with `O_DIRECT`: not synced to the
    /// disk; call `File::sync_data` for that). A WRITE that did not
    /// complete (failed, cancelled, or its process died) may have written
    /// any part of any block, so record a block as stored only once its
    /// WRITE completed. A backend without storage answers
    /// [`Error::Unsupported`].
    pub fn begin_file_write(
        &self,
        local: impl Into<Vec<Descriptor>>,
        files: impl Into<Vec<FileSegment>>,
    ) -> Result<WriteOperation> {
        self.begin_file(files.into(), local.into(), OperationKind::Write)
            .map(WriteOperation::new)
    }

    /// READs parts of files back into `local`, pair by pair (a storage
    /// tier's hit); the rules are [`begin_file_write`](Self::begin_file_write)'s,
    /// with local descriptors writable ([`Error::ReadOnlyBuffer`]) and each
    /// segment inside its file as last seen ([`Error::PastEndOfFile`]: the
    /// size is asked again, one `fstat`, only for a segment that ends past
    /// the size seen last). A file truncated while the READ runs, or since
    /// its size was seen, fails the READ (never leaves bytes unread
    /// silently).
    pub fn begin_file_read(
        &self,
        files: impl Into<Vec<FileSegment>>,
        local: impl Into<Vec<Descriptor>>,
    ) -> Result<ReadOperation> {
        self.begin_file(files.into(), local.into(), OperationKind::Read)
            .map(ReadOperation::new)
    }

    fn create_passive(
        &self,
        mut descriptors: Vec<Descriptor>,
        access: OperationKind,
    ) -> Result<(OperationCore, RdmaMetadata)> {
        check_local(&descriptors, access == OperationKind::Write)?;
        // Abandoned exposures whose window is over are freed as new ones come.
        self.inner.quarantine.sweep();
        let mut ranges = Vec::with_capacity(descriptors.len());
        for d in &mut descriptors {
            ranges.push(Exposed {
                region: d.register_view(self)?,
                segment: d.segment(),
            });
        }
        // The key the peer's transfer will carry (and notify with); a backend
        // may let that transfer reach this exposure only.
        let key = uuid::Uuid::new_v4().to_string();
        // From here on a peer may touch the memory: should anything panic
        // before the operation owns it, the `Held` leaks it.
        let descriptors = Held::new(descriptors);
        // SAFETY: the ranges are the bytes of `descriptors`, whose regions
        // were registered above with this backend; no other live view
        // overlaps them (V1); the operation built below owns them and hands them back
        // only once the exposure is revoked (and, when revocation is not
        // enforced, only if the peer notified completion): `OpShared::let_go`.
        // If `expose` fails, nothing was exposed and they are freed normally.
        let exposed = unsafe { self.inner.backend.expose(&ranges, access, key.as_bytes()) };
        let exposure = match exposed {
            Ok(exposure) => exposure,
            Err(e) => {
                drop(descriptors.release());
                return Err(e);
            }
        };
        let serialized = descriptors.iter().map(Descriptor::serialized).collect();
        let bytes = descriptors.iter().map(Descriptor::size).sum();
        let shared = OpShared::new(
            self.backend_arc(),
            Role {
                kind: access,
                passive: true,
            },
            bytes,
            OperationStatus::Initialized,
            Pending::Exposure(exposure.id),
            None,
            Some(Arc::clone(&self.inner.quarantine)),
        );
        let count = descriptors.len();
        let published = self
            .inner
            .auth
            .seal(exposure.agent_metadata)
            .and_then(|blob| RdmaMetadata::new(access, serialized, blob, key));
        let metadata = match published {
            Ok(metadata) => metadata,
            Err(e) => {
                // Dropping the operation cancels it: the exposure is revoked, and
                // the memory freed or quarantined as the backend allows.
                drop(OperationCore::new(shared, descriptors, self.clone(), None));
                return Err(e);
            }
        };
        let key: Arc<[u8]> = metadata.notification_key().as_bytes().into();
        self.inner
            .engine
            .track_passive(Arc::clone(&key), exposure.id, Arc::clone(&shared));
        let core = OperationCore::new(shared, descriptors, self.clone(), Some(key));
        tracing::debug!(connector = %self.inner.name, kind = ?access, descriptors = count, bytes, "exposed memory");
        Ok((core, metadata))
    }

    fn begin_active(
        &self,
        remote: &RdmaMetadata,
        mut local: Vec<Descriptor>,
        op: OperationKind,
    ) -> Result<OperationCore> {
        check_pairing(remote, &local, op)?;
        let mut regions = StackVec::<RegionId, 4>::with_capacity(local.len(), RegionId(0));
        for d in &mut local {
            regions.push(d.register_view(self)?);
        }
        let lease = self.inner.remotes.acquire(remote.agent_metadata())?;
        // Local segments, then remote ones, in one buffer.
        let mut segments = Segments::with_capacity(2 * local.len(), EMPTY_SEGMENT);
        for d in &local {
            segments.push(d.segment());
        }
        push_remote_segments(&mut segments, remote.descriptors())?;
        let (local_segments, remote_segments) = segments.as_slice().split_at(local.len());
        let request = TransferRequest {
            op,
            local: local_segments,
            local_regions: regions.as_slice(),
            target: Target::Peer(PeerTarget {
                peer: lease.peer(),
                remote: remote_segments,
                notification: remote.notification_key().as_bytes(),
                notify: true,
            }),
        };
        let span = tracing::debug_span!("post", connector = %self.inner.name, peer = %lease.peer(), ?op, bytes = request.bytes());
        let _entered = span.enter();
        // Claimed before the transfer can start; given up once the backend
        // lets go of it (`reach`: a peer in this process cannot have the
        // memory freed under this transfer).
        let ticket =
            (!self.inner.backend.revocation_enforced()).then(|| Ticket::claim(remote_segments));
        let (local, posted) = self.post(local, &request)?;
        let (op, bytes) = (request.op, request.bytes());
        Ok(self.track(local, op, bytes, posted, FarSide::Peer(lease, ticket)))
    }

    fn begin_file(
        &self,
        files: Vec<FileSegment>,
        mut local: Vec<Descriptor>,
        op: OperationKind,
    ) -> Result<OperationCore> {
        check_file_pairing(&files, &local, op)?;
        let mut regions = StackVec::<RegionId, 4>::with_capacity(local.len(), RegionId(0));
        for d in &mut local {
            regions.push(d.register_view(self)?);
        }
        let spans = files
            .iter()
            .map(|f| f.register(self))
            .collect::<Result<Vec<_>>>()?;
        let mut segments = Segments::with_capacity(local.len(), EMPTY_SEGMENT);
        for d in &local {
            segments.push(d.segment());
        }
        let request = TransferRequest {
            op,
            local: segments.as_slice(),
            local_regions: regions.as_slice(),
            target: Target::File(&spans),
        };
        let span = tracing::debug_span!("post", connector = %self.inner.name, files = spans.len(), ?op, bytes = request.bytes());
        let _entered = span.enter();
        let (local, posted) = self.post(local, &request)?;
        let (op, bytes) = (request.op, request.bytes());
        Ok(self.track(local, op, bytes, posted, FarSide::Files(files)))
    }

    /// Posts `request`, whose local segments are `local`'s (registered with
    /// this connector's backend, named at their index in `local_regions`);
    /// the caller hands what it returns to [`track`](Self::track).
    fn post(
        &self,
        local: Vec<Descriptor>,
        request: &TransferRequest<'_>,
    ) -> Result<(Held, crate::backend::Posted)> {
        // A backend that panics in `post` (or in the `release` that
        // `OpShared::posted` makes) may have started the transfer: the `Held`
        // then leaks the memory instead of freeing it.
        let local = Held::new(local);
        // SAFETY: every local segment is the transferred part of a descriptor
        // whose region was registered with this backend and is named at its
        // index in `local_regions` (writable when READ into: checked by
        // `check_pairing` / `check_file_pairing`); no other live view
        // overlaps it (V1); the operation created below owns the
        // descriptors (and the files, in `far`) and hands them back only
        // after `release` answered `Release::LetGo` (`state::released`,
        // called at post time or when the transfer is settled). If `post`
        // fails, no transfer exists and they are freed normally.
        match unsafe { self.inner.backend.post(request) } {
            Ok(posted) => Ok((local, posted)),
            Err(e) => {
                drop(local.release());
                Err(e)
            }
        }
    }

    /// The operation of a transfer [`post`](Self::post) started: it owns
    /// `local` and `far` until the backend lets go.
    fn track(
        &self,
        local: Held,
        op: OperationKind,
        bytes: usize,
        posted: crate::backend::Posted,
        far: FarSide,
    ) -> OperationCore {
        let (shared, driven) = OpShared::posted(
            self.backend_arc(),
            Role {
                kind: op,
                passive: false,
            },
            bytes,
            posted,
            far,
        );
        let core = OperationCore::new(Arc::clone(&shared), local, self.clone(), None);
        if driven {
            self.inner.engine.track_active(shared);
        }
        core
    }
}

/// Checks a local list on its own: non-empty, one device kind, writable if written.
pub(crate) fn check_local(local: &[Descriptor], written: bool) -> Result<()> {
    let first = local
        .first()
        .ok_or(Error::EmptyDescriptorList { side: Side::Local })?;
    let kind = first.device().kind();
    for (index, d) in local.iter().enumerate() {
        if d.device().kind() != kind {
            return Err(Error::MixedDevices {
                side: Side::Local,
                index,
                expected: kind,
                found: d.device().kind(),
            });
        }
        if written && !d.is_writable() {
            return Err(Error::ReadOnlyBuffer { index });
        }
    }
    Ok(())
}

/// Dynamo's pairing rules, checked before the backend is touched.
fn check_pairing(
    remote: &RdmaMetadata,
    local: &[Descriptor],
    expected: OperationKind,
) -> Result<()> {
    if remote.operation_kind() != expected {
        return Err(Error::OperationKindMismatch {
            expected,
            found: remote.operation_kind(),
        });
    }
    // A READ writes into local memory.
    check_local(local, expected == OperationKind::Read)?;
    let remote_descs = remote.descriptors();
    if local.len() != remote_descs.len() {
        return Err(Error::DescriptorCountMismatch {
            local: local.len(),
            remote: remote_descs.len(),
        });
    }
    let remote_kind = remote_descs[0].device.kind();
    for (index, (l, r)) in local.iter().zip(remote_descs).enumerate() {
        if r.device.kind() != remote_kind {
            return Err(Error::MixedDevices {
                side: Side::Remote,
                index,
                expected: remote_kind,
                found: r.device.kind(),
            });
        }
        if l.size() as u64 != r.size {
            return Err(Error::SizeMismatch {
                index,
                local: l.size(),
                remote: usize::try_from(r.size).unwrap_or(usize::MAX),
            });
        }
    }
    Ok(())
}

fn push_remote_segments(
    segments: &mut Segments,
    descriptors: &[SerializedDescriptor],
) -> Result<()> {
    for (i, d) in descriptors.iter().enumerate() {
        let (Ok(addr), Ok(len)) = (usize::try_from(d.ptr), usize::try_from(d.size)) else {
            return Err(Error::invalid_metadata(
                format!("descriptors[{i}]"),
                "does not fit this platform's address space",
            ));
        };
        segments.push(Segment {
            addr,
            len,
            device: d.device,
        });
    }
    Ok(())
}

/// A segment that is never read: fills a `Segments` list's unused slots.
const EMPTY_SEGMENT: Segment = Segment {
    addr: 0,
    len: 0,
    device: crate::Device::HOST,
};

/// A request's local then remote segments: four pairs on the stack.
type Segments = StackVec<Segment, 8>;

/// A list on the stack for the few items most operations need, on the heap
/// beyond `N`: a list of segments is built for every operation, and its
/// allocation and free showed in a loopback operation's instruction count.
/// Why: "segments on the stack", §5 of docs/decisions/0009-performance-history.md.
enum StackVec<T: Copy, const N: usize> {
    Inline { items: [T; N], len: usize },
    Heap(Vec<T>),
}

impl<T: Copy, const N: usize> StackVec<T, N> {
    /// Room for `capacity` items; `fill` fills the unused slots on the stack.
    fn with_capacity(capacity: usize, fill: T) -> StackVec<T, N> {
        if capacity <= N {
            StackVec::Inline {
                items: [fill; N],
                len: 0,
            }
        } else {
            StackVec::Heap(Vec::with_capacity(capacity))
        }
    }

    fn push(&mut self, item: T) {
        match self {
            StackVec::Inline { items, len } if *len < N => {
                items[*len] = item;
                *len += 1;
            }
            StackVec::Inline { items, .. } => {
                let mut spilled = items.to_vec();
                spilled.push(item);
                *self = StackVec::Heap(spilled);
            }
            StackVec::Heap(items) => items.push(item),
        }
    }

    fn as_slice(&self) -> &[T] {
        match self {
            StackVec::Inline { items, len } => &items[..*len],
            StackVec::Heap(items) => items,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(addr: usize) -> Segment {
        Segment {
            addr,
            len: 1,
            device: crate::Device::HOST,
        }
    }

    #[test]
    fn segment_lists_keep_their_order_on_the_stack_and_past_it() {
        for (capacity, count) in [(2, 2), (8, 8), (8, 9), (2, 20), (20, 20), (0, 3)] {
            let mut segments = Segments::with_capacity(capacity, EMPTY_SEGMENT);
            for i in 0..count {
                segments.push(segment(0x1000 + i));
            }
            let addrs: Vec<usize> = segments.as_slice().iter().map(|s| s.addr).collect();
            assert_eq!(addrs, (0x1000..0x1000 + count).collect::<Vec<_>>());
            let inline = matches!(segments, StackVec::Inline { .. });
            assert_eq!(inline, count <= 8, "{capacity} {count}");
        }
    }
}
