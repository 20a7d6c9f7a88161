//! [`LoopbackBackend`]: one agent on a [`Fabric`], implementing the core trait.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use std::os::fd::{AsRawFd, BorrowedFd};

use descriptor_core::{
    Error, EventHook, Exposed, Exposure, ExposureId, Notification, OperationKind, PeerTarget,
    Posted, RegionId, RegistrationBackend, Release, Result, Segment, Target, TransferId,
    TransferRequest, TransferState,
};

use crate::blob;
use crate::fabric::{Agent, Fabric, Grant, IdMap, lock, next_id};
use crate::files::Files;

const NAME: &str = "loopback";
const MAX_AGENT_NAME: usize = 255;

/// An in-process agent that moves host memory with bounds-checked `memcpy`.
///
/// Not a mock: it keeps the regions each agent registered and the exposures
/// (grants) each passive operation made, and checks every remote range of every
/// transfer against them, so a forged pointer or size is an error, never a memory
/// access. A readable's regions can only be read and a writable's only written,
/// only by a transfer that carries that operation's notification key (a random
/// UUID that only its metadata tells), and only until the operation ends. The
/// agent metadata names the agent alone, so a peer loads it once and the
/// connector's remote cache recognises it on every later operation. As with
/// NIXL, the connector learns of completion by polling and of a peer's
/// notification through the event hook.
pub struct LoopbackBackend {
    fabric: Fabric,
    agent: Arc<Agent>,
    local: Mutex<LocalRegions>,
    /// The files registered with this agent.
    files: Files,
    /// Posted transfers that failed (each copied in `post`), until released.
    /// One that succeeded is not stored: its id says so ([`DONE`]).
    failed: Mutex<IdMap<u64, TransferState>>,
}

/// Set in the id of a transfer that completed in `post`: `poll` and `release`
/// need no lookup for it (ids from `next_id` never reach this bit).
const DONE: u64 = 1 << 63;

/// The regions registered with this agent, and whether each is writable.
#[derive(Default)]
pub(crate) struct LocalRegions {
    by_id: IdMap<RegionId, (Segment, bool)>,
}

impl std::fmt::Debug for LoopbackBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackBackend")
            .field("agent", &self.agent.name)
            .field("fabric", &self.fabric.inner.id)
            .finish()
    }
}

impl LoopbackBackend {
    /// Joins `fabric` as agent `name`; the name must be unique on the fabric.
    pub fn new(fabric: &Fabric, name: &str) -> Result<LoopbackBackend> {
        if name.is_empty() || name.len() > MAX_AGENT_NAME {
            return Err(Error::backend(
                NAME,
                format!("create agent {name:?}"),
                format!("agent names are 1 to {MAX_AGENT_NAME} bytes"),
            ));
        }
        let agent = Arc::new(Agent::new(name));
        if !fabric.join(Arc::clone(&agent)) {
            return Err(Error::backend(
                NAME,
                format!("create agent {name:?}"),
                "an agent with that name is already on the fabric",
            ));
        }
        Ok(LoopbackBackend {
            fabric: fabric.clone(),
            agent,
            local: Mutex::new(LocalRegions::default()),
            files: Files::default(),
            failed: Mutex::new(IdMap::default()),
        })
    }

    /// Joins the process-wide default fabric ([`Fabric::global`]).
    pub fn on_global_fabric(name: &str) -> Result<LoopbackBackend> {
        LoopbackBackend::new(&Fabric::global(), name)
    }

    /// The fabric this agent is on.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// The blob a peer loads to reach this agent (what every exposure
    /// publishes): it names the fabric and the agent, never an address.
    pub fn agent_metadata(&self) -> Vec<u8> {
        blob::encode(self.fabric.inner.id, self.agent.id, &self.agent.name)
    }

    // Errors are cold: their code is kept out of the way of the checks that pass.
    #[cold]
    fn gone(&self, context: impl Into<String>) -> Error {
        Error::backend(
            NAME,
            context.into(),
            format!("agent {:?} has vanished from the fabric", self.agent.name),
        )
    }

    #[cold]
    fn denied(peer: &str, reason: String) -> Error {
        Error::AccessDenied {
            backend: NAME,
            peer: peer.to_owned(),
            reason,
        }
    }

    /// Checks a request against what both sides really registered and exposed.
    fn plan<'r>(
        &self,
        request: &'r TransferRequest<'r>,
        to: &'r PeerTarget<'r>,
    ) -> Result<Job<'r>> {
        let peer_name = to.peer;
        let access = request.op;
        let peer = lock(&self.agent.loaded)
            .get(peer_name)
            .ok_or_else(|| Self::denied(peer_name, "its metadata was never loaded".into()))?
            .upgrade()
            .filter(|p| !p.is_gone())
            .ok_or_else(|| Self::denied(peer_name, "the peer has vanished".into()))?;
        // The exposure the transfer's key names: the only memory it may reach.
        let grant = peer.grant_for(to.notification).ok_or_else(|| {
            Self::denied(
                peer_name,
                "no live operation of the peer has the transfer's notification key (it ended, or the metadata is stale or forged)".into(),
            )
        })?;
        if grant.access != access {
            let (verb, wrong, right) = match access {
                OperationKind::Read => ("read", "writable", "readable"),
                OperationKind::Write => ("written", "readable", "writable"),
            };
            return Err(Self::denied(
                peer_name,
                format!(
                    "the notification key belongs to a {wrong} operation of the peer, which cannot be {verb} (its metadata was for the other kind of operation, or forged to look like a {right})"
                ),
            ));
        }
        check_counts(request, to.remote.len(), || {
            format!("post {:?} to {peer_name}", request.op)
        })?;
        let regions = lock(&self.local);
        let mut last = None;
        for (index, ((local, remote), region)) in request
            .local
            .iter()
            .zip(to.remote)
            .zip(request.local_regions)
            .enumerate()
        {
            if !local.device.is_host() || !remote.device.is_host() {
                return Err(Error::Unsupported {
                    backend: NAME,
                    what: format!(
                        "descriptor {index}: {} to {} (host memory only)",
                        local.device, remote.device
                    ),
                });
            }
            if local.len != remote.len {
                return Err(Error::SizeMismatch {
                    index,
                    local: local.len,
                    remote: remote.len,
                });
            }
            regions.check(
                &mut last,
                index,
                local,
                *region,
                request.op,
                || format!("post {:?} to {peer_name}", request.op),
                &self.agent.name,
            )?;
            if !grant.covers(index, remote) {
                return Err(Self::denied(
                    peer_name,
                    format!(
                        "remote descriptor {index} ({:#x}+{}) is not inside memory the peer exposed for the operation its notification key names",
                        remote.addr, remote.len,
                    ),
                ));
            }
        }
        Ok(Job {
            request,
            notify: to.notify,
            from: Arc::clone(&self.agent.name),
            peer,
            grant,
        })
    }
}

/// The request's counts agree: as many far segments (`far`) and local
/// regions as local segments.
pub(crate) fn check_counts(
    request: &TransferRequest<'_>,
    far: usize,
    context: impl Fn() -> String,
) -> Result<()> {
    let local = request.local.len();
    let wrong = if far != local {
        Some(format!("{local} local segments for {far} far segments"))
    } else if request.local_regions.len() != local {
        Some(format!(
            "{local} local segments for {} local regions",
            request.local_regions.len()
        ))
    } else {
        None
    };
    match wrong {
        Some(reason) => Err(Error::backend(NAME, context(), reason)),
        None => Ok(()),
    }
}

impl LocalRegions {
    /// Checks local pair `index`: host memory inside `region`, registered
    /// writable if `op` READs into it. `last` caches the region looked up
    /// last (views of one pool share a region: usually the next pair's too).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check(
        &self,
        last: &mut Option<(RegionId, Segment, bool)>,
        index: usize,
        local: &Segment,
        region: RegionId,
        op: OperationKind,
        context: impl Fn() -> String,
        agent: &str,
    ) -> Result<()> {
        if !local.device.is_host() {
            return Err(Error::Unsupported {
                backend: NAME,
                what: format!(
                    "descriptor {index}: {} memory (host memory only)",
                    local.device
                ),
            });
        }
        let held = match *last {
            Some((id, segment, writable)) if id == region => {
                segment.contains(local).then_some(writable)
            }
            _ => self.by_id.get(&region).and_then(|&(segment, writable)| {
                *last = Some((region, segment, writable));
                segment.contains(local).then_some(writable)
            }),
        };
        match held {
            Some(writable) if writable || op == OperationKind::Write => Ok(()),
            Some(_) => Err(Error::ReadOnlyBuffer { index }),
            None => Err(Error::backend(
                NAME,
                context(),
                format!(
                    "local descriptor {index} ({:#x}+{}) is not inside region {} of agent {agent:?}",
                    local.addr, local.len, region.0
                ),
            )),
        }
    }

    fn insert(&mut self, id: RegionId, region: Segment, writable: bool) {
        self.by_id.insert(id, (region, writable));
    }

    fn remove(&mut self, id: RegionId) -> Option<(Segment, bool)> {
        self.by_id.remove(&id)
    }
}

impl Drop for LoopbackBackend {
    fn drop(&mut self) {
        self.agent.vanished.store(true, Ordering::Release);
        self.fabric.leave(&self.agent);
    }
}

/// A validated transfer, ready to copy.
struct Job<'r> {
    /// Every pair checked: the remote range inside `grant`, the local one
    /// inside a region registered with this agent.
    request: &'r TransferRequest<'r>,
    notify: bool,
    from: Arc<str>,
    peer: Arc<Agent>,
    /// The exposure every remote range lies in.
    grant: Arc<Grant>,
}

impl Job<'_> {
    /// Copies every pair under the grant's read lock, then notifies the peer.
    fn run(self) -> TransferState {
        if self.peer.is_gone() {
            return TransferState::failed(format!("peer {:?} vanished", self.peer.name));
        }
        let Some(live) = self.grant.hold() else {
            return TransferState::failed(format!(
                "peer {:?} revoked access before the transfer ran",
                self.peer.name
            ));
        };
        // Neighbouring pairs go as one copy: every pair was checked on its
        // own (`plan`), so a run of them covers exactly their bytes, which
        // lie in checked ranges whatever registrations they are in.
        for run in self.request.runs(|_, _| true) {
            let (src, dst) = match self.request.op {
                OperationKind::Read => (run.remote.addr, run.local.addr),
                OperationKind::Write => (run.local.addr, run.remote.addr),
            };
            // SAFETY: the run's remote bytes are those of its pairs, each
            // inside a region the peer registered (valid, and writable if
            // exposed for WRITE: `expose` refuses read-only regions) and
            // exposed for the operation whose key this transfer carries; the
            // grant's read lock (`live`) keeps the exposure live, and the
            // peer frees that memory only after revoking it. Its local bytes
            // are its pairs', each inside the region registered with this
            // agent that the request names, valid (and writable when READ
            // into) until `release` returns `LetGo` for the transfer
            // (`post`'s contract), which cannot happen before `post`, which
            // runs this copy, has returned. `copy` tolerates overlap.
            unsafe {
                std::ptr::copy(
                    std::ptr::with_exposed_provenance::<u8>(src),
                    std::ptr::with_exposed_provenance_mut::<u8>(dst),
                    run.local.len,
                );
            }
        }
        // Released before the peer is told: its hook may revoke the exposure.
        drop(live);
        if self.notify {
            // The payload is the key, which the grant holds already.
            self.peer.notify(Notification {
                from: self.from,
                payload: Arc::clone(&self.grant.key),
                exposure: Some(ExposureId(self.grant.id)),
            });
        }
        TransferState::Done
    }
}

impl RegistrationBackend for LoopbackBackend {
    fn backend_name(&self) -> &'static str {
        NAME
    }

    fn agent_name(&self) -> &str {
        &self.agent.name
    }

    unsafe fn register(&self, region: &Segment, writable: bool) -> Result<RegionId> {
        if !region.device.is_host() {
            return Err(Error::Unsupported {
                backend: NAME,
                what: format!("{} memory (loopback moves host memory only)", region.device),
            });
        }
        // An empty descriptor's region (len 0) is registered like any other:
        // a peer's zero-length range must lie in one.
        if region.end().is_none() || region.addr == 0 {
            return Err(Error::InvalidDescriptor(format!(
                "{:#x}+{} is not a valid region",
                region.addr, region.len
            )));
        }
        if self.agent.is_gone() {
            return Err(self.gone("register"));
        }
        let id = RegionId(next_id());
        lock(&self.local).insert(id, *region, writable);
        self.agent.regions.fetch_add(1, Ordering::Relaxed);
        Ok(id)
    }

    fn deregister(&self, region: RegionId) -> Result<()> {
        if self.files.remove(region) {
            return Ok(());
        }
        let removed = lock(&self.local).remove(region);
        if removed.is_some() {
            self.agent.regions.fetch_sub(1, Ordering::Relaxed);
        } else {
            return Err(Error::backend(
                NAME,
                "deregister",
                format!("region {} is not registered", region.0),
            ));
        }
        // An exposure never outlives the memory it names.
        self.agent
            .grants
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .revoke_region(region);
        Ok(())
    }

    /// Files are read and written with `pread`/`pwrite` in `post`.
    unsafe fn register_file(&self, fd: BorrowedFd<'_>, writable: bool) -> Result<RegionId> {
        if self.agent.is_gone() {
            return Err(self.gone("register a file"));
        }
        Ok(self.files.insert(fd.as_raw_fd(), writable))
    }

    unsafe fn expose(
        &self,
        ranges: &[Exposed],
        access: OperationKind,
        key: &[u8],
    ) -> Result<Exposure> {
        if self.agent.is_gone() {
            return Err(self.gone("expose"));
        }
        if key.is_empty() {
            return Err(Error::backend(
                NAME,
                "expose",
                "an exposure needs a notification key (none given)",
            ));
        }
        let local = lock(&self.local);
        let mut exposed = Vec::with_capacity(ranges.len());
        for (index, range) in ranges.iter().enumerate() {
            let &(region, writable) = local.by_id.get(&range.region).ok_or_else(|| {
                Error::backend(
                    NAME,
                    "expose",
                    format!("region {} is not registered", range.region.0),
                )
            })?;
            // The grant is the range, never its whole region: the region's
            // other views may be in safe code's hands.
            range.check_within(&region, index, NAME)?;
            if access == OperationKind::Write && !writable {
                return Err(Error::ReadOnlyBuffer { index });
            }
            exposed.push((range.region, range.segment));
        }
        drop(local);
        let id = next_id();
        let added = self
            .agent
            .grants
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(Grant::new(id, access, key, exposed));
        if !added {
            return Err(Error::backend(
                NAME,
                "expose",
                "a live exposure already has that notification key",
            ));
        }
        Ok(Exposure {
            id: ExposureId(id),
            agent_metadata: self.agent_metadata(),
        })
    }

    fn revoke(&self, exposure: ExposureId) -> Result<()> {
        let grant = self
            .agent
            .grants
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(exposure.0);
        if let Some(grant) = grant {
            grant.revoke();
        }
        Ok(())
    }

    fn revocation_enforced(&self) -> bool {
        true
    }

    /// A transfer reaches only the ranges its key's exposure holds, with
    /// the exposure's access.
    fn access_enforced(&self) -> bool {
        true
    }

    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        let blob = blob::decode(agent_metadata)?;
        if blob.fabric != self.fabric.inner.id {
            return Err(Self::denied(
                blob.agent_name,
                "the metadata comes from another fabric (or another process: loopback \
                 reaches connectors in this process only; use NIXL across processes)"
                    .into(),
            ));
        }
        let peer = self
            .fabric
            .find(blob.agent_name)
            .filter(|p| p.id == blob.agent_id && !p.is_gone())
            .ok_or_else(|| {
                Self::denied(
                    blob.agent_name,
                    "no such agent on this process's loopback fabric: it vanished, or the \
                     metadata came from another process (loopback reaches connectors in this \
                     process only; use NIXL across processes)"
                        .into(),
                )
            })?;
        let mut loaded = lock(&self.agent.loaded);
        // Looked up first: the name is copied only for a new peer. A new agent
        // that took a vanished one's name replaces it.
        match loaded.get_mut(blob.agent_name) {
            Some(entry) => *entry = Arc::downgrade(&peer),
            None => {
                loaded.insert(blob.agent_name.to_owned(), Arc::downgrade(&peer));
            }
        }
        Ok(blob.agent_name.to_owned())
    }

    fn peer_name(&self, agent_metadata: &[u8]) -> Option<String> {
        blob::decode(agent_metadata)
            .ok()
            .map(|b| b.agent_name.to_owned())
    }

    fn unload_remote(&self, peer: &str) -> Result<()> {
        lock(&self.agent.loaded).remove(peer);
        Ok(())
    }

    unsafe fn post(&self, request: &TransferRequest<'_>) -> Result<Posted> {
        if self.agent.is_gone() {
            return Err(self.gone(format!("post {:?}", request.op)));
        }
        // The copy runs here, with no lock of this backend held: it notifies
        // the peer, whose event hook may call straight back into this backend.
        let state = match &request.target {
            Target::Peer(to) => self.plan(request, to)?.run(),
            Target::File(spans) => {
                // Checked under the regions' lock, moved after it: no file
                // I/O with a lock held.
                let job = {
                    let regions = lock(&self.local);
                    self.files
                        .plan(request, spans, &regions, &self.agent.name)?
                };
                job.run()
            }
        };
        let id = next_id();
        if matches!(state, TransferState::Done) {
            return Ok(Posted {
                id: TransferId(id | DONE),
                state,
            });
        }
        lock(&self.failed).insert(id, state.clone());
        Ok(Posted {
            id: TransferId(id),
            state,
        })
    }

    fn poll(&self, transfer: TransferId) -> TransferState {
        if transfer.0 & DONE != 0 {
            return TransferState::Done;
        }
        lock(&self.failed)
            .get(&transfer.0)
            .cloned()
            .unwrap_or_else(|| TransferState::failed(format!("unknown transfer {}", transfer.0)))
    }

    fn release(&self, transfer: TransferId) -> Result<Release> {
        // Every copy ended in `post`: nothing is left to stop.
        if transfer.0 & DONE == 0 {
            lock(&self.failed).remove(&transfer.0);
        }
        Ok(Release::LetGo)
    }

    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()> {
        // Handed to the sink with no lock held; the emptied buffer goes back
        // to the inbox (if it is still empty) so that the next notification
        // needs no allocation.
        let mut drained = std::mem::take(&mut *lock(&self.agent.inbox));
        drained.drain(..).for_each(sink);
        let mut inbox = lock(&self.agent.inbox);
        if inbox.is_empty() {
            *inbox = drained;
        }
        Ok(())
    }

    fn set_event_hook(&self, hook: EventHook) -> bool {
        self.agent.hook.set(hook).is_ok()
    }
}
