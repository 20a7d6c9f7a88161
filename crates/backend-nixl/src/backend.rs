//! [`NixlBackend`] and its [`RegistrationBackend`] implementation: its
//! calls, each delegating its policy (the route, the watcher, the peers'
//! plan) to the module named for it. Its fields are its own: the builder
//! hands it the agents ([`NixlBackend::from_agents`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use std::os::fd::BorrowedFd;

use descriptor_core::{
    Error, EventHook, Exposed, Exposure, ExposureId, FileSpan, Notification, OperationKind, Posted,
    RegionId, RegistrationBackend, Release, Result, Segment, SharedCause, Target, TransferId,
    TransferRequest, TransferState,
};
use nixl_sys::{Agent, NixlError, OptArgs, XferOp};

use crate::agent_metadata::AgentMetadata;
use crate::agents::Agents;
use crate::error::{NAME, malformed, nixl_error};
use crate::memory::{Range, Region, mem_of, run_lists};
use crate::peers::PeerLoader;
use crate::route::{self, Route};
use crate::scope::{ExposureMetadata, MetadataScope};
use crate::storage::{Files, POSIX_IOS_AT_POST, Storage, StorageState};
use crate::sync::lock;
use crate::transfer::{ApartNotification, Asker, Transfer};
use crate::tuning::Tuning;
use crate::watcher::{self, Kick, Live};

/// A real NIXL agent (UCX by default) implementing [`RegistrationBackend`].
///
/// With NIXL's progress thread on (the default), a second agent without it,
/// `<name>.initiator`, posts this connector's READs and WRITEs: see
/// [`NixlBackendBuilder::progress_thread`](crate::NixlBackendBuilder::progress_thread).
///
/// Registers DRAM and CUDA VRAM, exposes regions through NIXL agent metadata,
/// loads peers (Rust or Python Dynamo workers), posts READ/WRITE with the passive
/// side's notification key, and reads notifications as raw bytes. The runtime is
/// loaded at run time ([`crate::runtime`]), so this crate builds without NIXL.
///
/// NIXL cannot revoke a peer's access on shared-memory and TCP transports, so
/// [`revocation_enforced`](RegistrationBackend::revocation_enforced) is false: the
/// connector leaks, rather than frees, memory a peer may still touch.
pub struct NixlBackend {
    /// The agents, the transfers and what the watcher thread shares.
    live: Arc<Live>,
    /// The watcher thread, once the connector installed its event hook.
    watcher: Mutex<Option<JoinHandle<()>>>,
    name: String,
    /// What exposures publish, in the builder's [`MetadataScope`].
    metadata: ExposureMetadata,
    next_id: AtomicU64,
    regions: Mutex<HashMap<u64, Region>>,
    /// The peers loaded into the agents, and loading them (see
    /// [`crate::peers`]).
    peers: PeerLoader,
    /// The storage plugin on the initiating agent, and the files
    /// registered with it ([`crate::storage`]).
    storage: StorageState,
    files: Files,
    /// READs served from the page cache when all cached
    /// ([`NixlBackendBuilder::cached_reads`](crate::NixlBackendBuilder::cached_reads)).
    pub(crate) cached_reads: bool,
    /// Storage WRITEs into the page cache made at post
    /// ([`NixlBackendBuilder::buffered_writes`](crate::NixlBackendBuilder::buffered_writes)).
    pub(crate) buffered_writes: bool,
}

impl std::fmt::Debug for NixlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NixlBackend")
            .field("agent", &self.name)
            .field("scope", &self.metadata.scope())
            .finish()
    }
}

impl NixlBackend {
    /// A backend called `name` over `agents`, as the builder made them.
    pub(crate) fn from_agents(
        name: String,
        agents: Agents,
        scope: MetadataScope,
        tuning: Tuning,
        storage: StorageState,
    ) -> NixlBackend {
        NixlBackend {
            peers: PeerLoader::new(&name, &agents, &tuning),
            live: Arc::new(Live::new(agents, tuning)),
            watcher: Mutex::new(None),
            name,
            metadata: ExposureMetadata::new(scope),
            next_id: AtomicU64::new(1),
            regions: Mutex::new(HashMap::new()),
            storage,
            files: Files::default(),
            cached_reads: true,
            buffered_writes: true,
        }
    }

    /// The storage plugin in use, if any: [`Storage::PosixAio`] when
    /// [`Storage::PosixUring`] was asked for and io_uring could not be set
    /// up; `None` when storage is off or its plugin could not be created.
    pub fn storage(&self) -> Option<Storage> {
        match self.storage {
            StorageState::On(storage) => Some(storage),
            StorageState::Unavailable(_) => None,
        }
    }

    /// Posts a storage transfer through the initiating agent, to itself.
    ///
    /// # Safety
    ///
    /// [`RegistrationBackend::post`]'s.
    unsafe fn post_file(
        &self,
        request: &TransferRequest<'_>,
        spans: &[FileSpan],
    ) -> Result<Posted> {
        let (op, verb) = match request.op {
            OperationKind::Read => (XferOp::Read, "READ"),
            OperationKind::Write => (XferOp::Write, "WRITE"),
        };
        let context = || {
            format!(
                "{verb} of {} bytes with {} file segments",
                request.bytes(),
                spans.len()
            )
        };
        // Served at post from (or into) the page cache where it can be.
        let done_at_post = match request.op {
            OperationKind::Read => {
                self.cached_reads
                    // SAFETY: our caller's contract is `post`'s, which
                    // `read_cached` needs.
                    && unsafe { self.files.read_cached(&self.storage, request, spans) }?
            }
            OperationKind::Write => {
                self.buffered_writes
                    // SAFETY: our caller's contract is `post`'s, which
                    // `write_buffered` needs.
                    && unsafe { self.files.write_buffered(&self.storage, request, spans) }?
            }
        };
        if done_at_post {
            // Nothing of NIXL's holds the memory: released at once
            // (`release` lets an unknown transfer go).
            return Ok(Posted {
                id: TransferId(self.id()),
                state: TransferState::Done,
            });
        }
        let (local, files) = self.files.lists(&self.storage, request, spans)?;
        let ios = files.len().unwrap_or(usize::MAX);
        let agent = self.live.agents.initiating();
        let own = agent.name();
        let xfer = agent
            .create_xfer_req(op, &local, &files, &own, None)
            .map_err(|e| nixl_error(context(), e))?;
        // As for a peer: a failed post is kept like a running request, and
        // released only once NIXL says it is idle (releasing a POSIX request
        // with I/O in flight is a use-after-free in NIXL).
        let (done, post_error) = match agent.post_xfer_req(&xfer, None) {
            Ok(pending) => (!pending, None),
            Err(e) => (
                false,
                Some(Arc::new(nixl_error(format!("post {}", context()), e)) as SharedCause),
            ),
        };
        let id = self.id();
        lock(&self.live.transfers).insert(id, Transfer::file(xfer, own, post_error));
        let state = done
            .then(|| self.live.state(id, Asker::Internal))
            .flatten()
            .unwrap_or(TransferState::InProgress);
        // NIXL's POSIX plugin submits what its queue holds at post, the rest
        // only when polled: a transfer of more I/Os than that needs the
        // watcher from now on; a smaller one runs in the kernel by itself
        // and is handed over, as a small transfer to a peer, only once
        // somebody awaits its end (waking the watcher cost a 1 MiB READ
        // from the page cache 4 µs of its 21).
        if matches!(state, TransferState::InProgress) && ios > POSIX_IOS_AT_POST {
            self.live.kick(Kick::Transfer);
        }
        Ok(Posted {
            id: TransferId(id),
            state,
        })
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The parameters the agent's `plugin` backend runs with (the plugin's
    /// defaults with the builder's settings applied), as NIXL reports them;
    /// `None` if the agent did not load `plugin`.
    pub fn plugin_params(&self, plugin: &str) -> Result<Option<Vec<(String, String)>>> {
        let agent = &self.live.agents.serving;
        let Some(backend) = agent.get_backend(plugin) else {
            return Ok(None);
        };
        let context = || format!("read {plugin} parameters (agent {:?})", self.name);
        let (_, params) = agent
            .get_backend_params(&backend)
            .map_err(|e| nixl_error(context(), e))?;
        let pairs = params
            .iter()
            .map_err(|e| nixl_error(context(), e))?
            .map(|pair| pair.map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| nixl_error(context(), e))?;
        Ok(Some(pairs))
    }

    /// This agent's full metadata as NIXL serializes it (`getLocalMD`: its
    /// connection info and every region registered with it), whatever the
    /// [`MetadataScope`] (an exposure publishes only its regions): what
    /// Dynamo's `Connection.metadata` returns (`nixl_agent.get_agent_metadata()`).
    /// With NIXL's progress thread on, the serving agent's (the one peers
    /// reach).
    pub fn agent_metadata(&self) -> Result<Vec<u8>> {
        self.live
            .agents
            .serving
            .get_local_md()
            .map_err(|e| nixl_error("get agent metadata", e))
    }

    /// Makes the first transfers to `peer`, loaded already, as fast as the
    /// steady ones: a one-byte READ of the peer's first host region (nothing
    /// written there, nobody notified) through each agent that may post to
    /// it, which sets up what UCX makes only on a first transfer. NIXL's
    /// `make_connection` is not enough: it returns before the peer answered,
    /// and the first transfer after it was as slow as without it
    /// (docs/decisions/0008-no-proactive-make-connection.md). A peer with no
    /// host region (only GPU memory) is only loaded.
    pub fn warm_up(&self, peer: &str) -> Result<()> {
        self.peers.warm_up(&self.live.agents, peer)
    }

    /// How many peers the connector unloaded that NIXL still holds, parked
    /// so that loading them again costs no new UCX endpoint (at most
    /// [`Tuning::parked_peers`]; why: that field's docs).
    pub fn parked_peers(&self) -> usize {
        self.peers.parked()
    }
}

impl RegistrationBackend for NixlBackend {
    fn backend_name(&self) -> &'static str {
        NAME
    }

    fn agent_name(&self) -> &str {
        &self.name
    }

    unsafe fn register(&self, region: &Segment, writable: bool) -> Result<RegionId> {
        let (mem, device) = mem_of(region.device)?;
        let range = Range {
            addr: region.addr,
            len: region.len,
            mem,
            device,
        };
        // With each agent: peers reach it through the serving one, this
        // connector's transfers use it through the initiating one.
        let handles = self
            .live
            .agents
            .all()
            .map(|agent| {
                agent.register_memory(&range, None).map_err(|e| {
                    nixl_error(
                        format!("register {} bytes of {}", region.len, region.device),
                        e,
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let id = self.id();
        lock(&self.regions).insert(
            id,
            Region {
                segment: *region,
                writable,
                _handles: handles,
            },
        );
        Ok(RegionId(id))
    }

    fn deregister(&self, region: RegionId) -> Result<()> {
        if self.files.remove(region.0) {
            return Ok(());
        }
        // Dropping the handle deregisters.
        match lock(&self.regions).remove(&region.0) {
            Some(_) => Ok(()),
            None => Err(Error::backend(
                NAME,
                "deregister",
                format!("region {} is not registered", region.0),
            )),
        }
    }

    /// Registered with the initiating agent's storage plugin
    /// ([`NixlBackendBuilder::storage`](crate::NixlBackendBuilder::storage)).
    unsafe fn register_file(&self, fd: BorrowedFd<'_>, writable: bool) -> Result<RegionId> {
        let id = self.id();
        self.files.register(
            &self.storage,
            self.live.agents.initiating(),
            id,
            fd,
            writable,
        )?;
        Ok(RegionId(id))
    }

    /// NIXL cannot bind an exposure to a notification key (`_key` is
    /// unused), nor to part of a registration: a peer that loads the blob
    /// may reach the whole of each region holding an exposed range
    /// (either [`MetadataScope`]: those regions only).
    unsafe fn expose(
        &self,
        ranges: &[Exposed],
        access: OperationKind,
        _key: &[u8],
    ) -> Result<Exposure> {
        let segments = {
            let registered = lock(&self.regions);
            let mut regions: Vec<(RegionId, Segment)> = Vec::with_capacity(ranges.len());
            for (index, range) in ranges.iter().enumerate() {
                let region = registered.get(&range.region.0).ok_or_else(|| {
                    Error::backend(
                        NAME,
                        "expose",
                        format!("region {} is not registered", range.region.0),
                    )
                })?;
                range.check_within(&region.segment, index, NAME)?;
                if access == OperationKind::Write && !region.writable {
                    return Err(Error::ReadOnlyBuffer { index });
                }
                regions.push((range.region, region.segment));
            }
            // Pool views share a region: it is described once.
            regions.sort_unstable_by_key(|&(id, _)| id);
            regions.dedup_by_key(|&mut (id, _)| id);
            regions
                .into_iter()
                .map(|(_, segment)| segment)
                .collect::<Vec<_>>()
        };
        let agent_metadata = self
            .metadata
            .exposure_md(&self.live.agents.serving, &segments)?;
        // A peer may notify from now on: the watcher looks for notifications.
        self.live.kick(Kick::Exposed);
        Ok(Exposure {
            id: ExposureId(self.id()),
            agent_metadata,
        })
    }

    fn revoke(&self, _exposure: ExposureId) -> Result<()> {
        // NIXL has no per-peer revocation (see `revocation_enforced`); the
        // watcher stops expecting this exposure's notification.
        self.live.kick(Kick::Revoked);
        Ok(())
    }

    fn revocation_enforced(&self) -> bool {
        false
    }

    /// The blob is checked whole first (see the crate's docs, "Peer
    /// metadata"): a malformed one is an [`Error::InvalidMetadata`] and NIXL
    /// never sees it. A well-formed one whose region keys changed, or that
    /// NIXL refused and dropped the peer for, leaves the peer reachable
    /// under a new NIXL name.
    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        let md = AgentMetadata::parse(agent_metadata).map_err(malformed)?;
        self.peers.load(&self.live, &md)?;
        Ok(md.name)
    }

    /// The name a well-formed blob gives; `None` for a malformed one, which
    /// names nobody.
    fn peer_name(&self, agent_metadata: &[u8]) -> Option<String> {
        AgentMetadata::parse(agent_metadata).ok().map(|md| md.name)
    }

    /// Unloads every name NIXL knows the peer by (its earlier ones too).
    fn unload_remote(&self, peer: &str) -> Result<()> {
        self.peers.unload(&self.live, peer)
    }

    unsafe fn post(&self, request: &TransferRequest<'_>) -> Result<Posted> {
        let to = match &request.target {
            Target::Peer(to) => to,
            // SAFETY: our caller's contract.
            Target::File(spans) => return unsafe { self.post_file(request, spans) },
        };
        let (op, verb) = match request.op {
            OperationKind::Read => (XferOp::Read, "READ"),
            OperationKind::Write => (XferOp::Write, "WRITE"),
        };
        let context = || format!("{verb} of {} bytes with {:?}", request.bytes(), to.peer);
        // Counted in flight against its NIXL name until released, so that
        // an earlier name of the peer is unloaded only once unused.
        let (posting, spans) = self.peers.posting(to.peer, to.remote.len() > 1);
        let nixl_peer = posting.name().to_owned();
        // Neighbouring pairs go as one descriptor: NIXL's `create_xfer_req`
        // does not merge them, and a request's cost grows with its
        // descriptors (docs/decisions/0011-registered-memory-and-views.md).
        let (local, remote) = run_lists(request, to.remote, spans.as_deref())?;
        let mut args = OptArgs::new().map_err(|e| nixl_error(context(), e))?;
        // Which agent posts, and how the notification travels: `route::plan`.
        let agents = &self.live.agents;
        let notifier = agents.notifiers.get(&nixl_peer);
        let mut route = route::plan(to.notify, agents.notifications, notifier);
        if route.attaches() {
            args.set_notification_message(to.notification)
                .and_then(|()| args.set_has_notification(true))
                .map_err(|e| nixl_error(context(), e))?;
        }
        let create =
            |agent: &Agent| agent.create_xfer_req(op, &local, &remote, &nixl_peer, Some(&args));
        let mut created = create(agents.posting(route.poster()));
        if route == Route::Proving
            && let Err(error) = &created
        {
            // The serving agent lacks some of the peer's regions (a load
            // failed there): through the initiating one, notification
            // attached, then.
            tracing::debug!(peer = %to.peer, %error, "the serving agent cannot post the transfer");
            route = Route::Attached;
            created = create(agents.initiating());
        }
        let xfer = created.map_err(|e| match e {
            NixlError::FailedToCreateXferRequest | NixlError::NotFound => Error::AccessDenied {
                backend: NAME,
                peer: to.peer.to_owned(),
                reason: format!(
                    "NIXL refused the {verb}: remote ranges are not inside regions the peer's metadata describes, or the peer is not loaded ({e})"
                ),
            },
            e => nixl_error(context(), e),
        })?;
        // A failed post may have started some of its work (a peer dying mid-copy
        // fails it halfway), so the request is kept like a running one: it is
        // reported failed, and released only once NIXL says it is not running.
        let (done, post_error) = match agents.posting(route.poster()).post_xfer_req(&xfer, None) {
            Ok(pending) => (!pending, None),
            Err(e) => (
                false,
                Some(Arc::new(nixl_error(format!("post {}", context()), e)) as SharedCause),
            ),
        };
        let id = self.id();
        let apart = (route == Route::Apart).then(|| ApartNotification {
            peer: nixl_peer.clone(),
            payload: to.notification.into(),
        });
        lock(&self.live.transfers)
            .insert(id, Transfer::new(xfer, route, nixl_peer, post_error, apart));
        posting.keep();
        // Done at once: recorded, and a notification to send goes out now. A
        // failed post is reported once NIXL says the request is idle.
        let state = done
            .then(|| self.live.state(id, Asker::Internal))
            .flatten()
            .unwrap_or(TransferState::InProgress);
        // The initiating agent runs no NIXL thread: the watcher moves a
        // transfer on (and sends its notification) when nobody waits on it,
        // and leaves alone one that a waiting thread polls. A small one is
        // handed over only in `awaiting_end` (`Tuning::follow_at_post`).
        if matches!(state, TransferState::InProgress)
            && request.bytes() > self.live.tuning.follow_at_post
        {
            self.live.kick(Kick::Transfer);
        }
        Ok(Posted {
            id: TransferId(id),
            state,
        })
    }

    fn poll(&self, transfer: TransferId) -> TransferState {
        // A waiting thread polls (`wait_assist`): the watcher then leaves the
        // transfer to it. The connector's hook polls too, on the watcher.
        self.live
            .state(transfer.0, watcher::asker())
            .unwrap_or_else(|| TransferState::failed(format!("unknown transfer {}", transfer.0)))
    }

    fn wait_assist(&self) -> Duration {
        self.live.tuning.wait_assist
    }

    fn awaiting_end(&self, transfer: TransferId) {
        let unfinished = lock(&self.live.transfers)
            .get(&transfer.0)
            .is_some_and(|t| t.finished.is_none());
        if unfinished {
            self.live.kick(Kick::Transfer);
        }
    }

    fn release(&self, transfer: TransferId) -> Result<Release> {
        // nixl-sys can abort only by dropping the request, and then NIXL does
        // not say whether the abort took. So a cancelled transfer is left to
        // finish (or fail) and released then: bounded, and sound. The watcher
        // (handed the transfer here, if nobody waited on it) signals when it
        // ends, and the connector asks again.
        match self.live.state(transfer.0, Asker::Internal) {
            None => return Ok(Release::LetGo),
            Some(TransferState::InProgress) => {
                self.live.kick(Kick::Transfer);
                return Ok(Release::StillRunning);
            }
            Some(_) => {}
        }
        let removed = lock(&self.live.transfers).remove(&transfer.0);
        if let Some(t) = removed.as_ref().filter(|t| !t.storage) {
            self.peers.posted(&t.peer);
        }
        drop(removed);
        Ok(Release::LetGo)
    }

    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()> {
        // With a watcher, it collects them (and signals); without one, ask now.
        if !self.live.has_hook() {
            self.live
                .collect_notifications()
                .map_err(|e| nixl_error("get notifications", e))?;
        }
        self.live.take_inbox().into_iter().for_each(sink);
        Ok(())
    }

    /// A one-byte READ through each agent that posts to the peer: see
    /// [`NixlBackend::warm_up`].
    fn warm_up(&self, peer: &str) -> Result<()> {
        NixlBackend::warm_up(self, peer)
    }

    fn set_event_hook(&self, hook: EventHook) -> bool {
        if !self.live.set_hook(hook) {
            return false;
        }
        let live = Arc::clone(&self.live);
        let spawned = std::thread::Builder::new()
            .name(format!("nixl-watch-{}", self.name))
            .spawn(move || live.run_watcher());
        match spawned {
            Ok(handle) => {
                *lock(&self.watcher) = Some(handle);
                true
            }
            Err(error) => {
                // The connector then polls on its own, more slowly.
                tracing::error!(%error, agent = %self.name, "cannot start the NIXL watcher thread");
                false
            }
        }
    }
}

impl Drop for NixlBackend {
    fn drop(&mut self) {
        // The watcher first (it calls into the agent), then requests before
        // registrations, all before the agent (nixl-sys keeps the native agent
        // alive until its last handle is gone).
        self.live.stop();
        let watcher = lock(&self.watcher).take();
        // The last reference to the backend may go in the watcher itself (its
        // hook ran the connector's last operation to its end): then it stops
        // on its own, once this returns, and drops the agent last.
        if let Some(watcher) = watcher
            && watcher.thread().id() != std::thread::current().id()
            && watcher.join().is_err()
        {
            tracing::error!(agent = %self.name, "the NIXL watcher thread panicked");
        }
        lock(&self.live.transfers).clear();
        lock(&self.regions).clear();
        self.files.clear();
    }
}
