//! The serving and the initiating agent, what they hold (memory, peers, the
//! serving agent's notifier state per peer), and loading peers into them.
//!
//! With NIXL's progress thread on, two agents: the one called by the
//! builder's name runs that thread, holds the memory peers reach, receives
//! their notifications and sends this connector's; this connector's own
//! READs and WRITEs go out through `<name>.initiator`, without it, which
//! only the waiting thread and the watcher call into. Why:
//! docs/decisions/0003-two-agents.md. Without the thread there is one agent,
//! and it is both.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use descriptor_core::{Device, DeviceKind, Error, Result, Segment, Side, TransferRequest};
use nixl_sys::{
    Agent, MemType, MemoryRegion, NixlDescriptor, NixlError, RegistrationHandle, XferDescList,
    XferOp, XferStatus,
};

use crate::agent_metadata::{self, AgentMetadata};
use crate::backend::NixlBackend;
use crate::peers::{Peers, Plan, Spans};
use crate::route::{self, LoadOutcome, Notifier, NotifierLoad, Poster};
use crate::tuning::Notifications;

pub(crate) const NAME: &str = "nixl";

/// How long [`NixlBackend::warm_up`] waits for its one-byte READ.
const WARM_UP_WAIT: Duration = Duration::from_secs(10);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cold]
pub(crate) fn nixl_error(context: impl Into<String>, error: NixlError) -> Error {
    Error::backend(NAME, context, error)
}

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
        Agents {
            serving,
            initiator,
            notifications,
            notifiers: Notifiers::default(),
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

    fn set(&self, nixl_name: &str, notifier: Notifier) {
        lock(&self.0).insert(nixl_name.to_owned(), notifier);
    }

    /// A transfer through the proving route succeeded. A peer unloaded (or
    /// failed) meanwhile stays as it is.
    pub(crate) fn proved(&self, nixl_name: &str) {
        if let Some(n @ Notifier::Proving) = lock(&self.0).get_mut(nixl_name) {
            *n = Notifier::Proven;
        }
    }

    fn remove(&self, nixl_name: &str) -> Notifier {
        lock(&self.0)
            .remove(nixl_name)
            .unwrap_or(Notifier::NotLoaded)
    }
}

/// A registered region, with the handles that keep it registered.
pub(crate) struct Region {
    pub(crate) segment: Segment,
    pub(crate) writable: bool,
    // Dropping the handles deregisters the memory (from each agent).
    pub(crate) _handles: Vec<RegistrationHandle>,
}

/// A registered range as nixl-sys wants to see it.
#[derive(Debug)]
pub(crate) struct Range {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) mem: MemType,
    pub(crate) device: u64,
}

impl MemoryRegion for Range {
    unsafe fn as_ptr(&self) -> *const u8 {
        std::ptr::with_exposed_provenance(self.addr)
    }
    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for Range {
    fn mem_type(&self) -> MemType {
        self.mem
    }
    fn device_id(&self) -> u64 {
        self.device
    }
}

/// NIXL's memory type and device id for a device.
pub(crate) fn mem_of(device: Device) -> Result<(MemType, u64)> {
    match device.kind() {
        DeviceKind::Host => Ok((MemType::Dram, 0)),
        // Dynamo registers Intel XPU memory as VRAM too.
        DeviceKind::Cuda | DeviceKind::Xpu => Ok((MemType::Vram, u64::from(device.ordinal()))),
        _ => Err(Error::Unsupported {
            backend: NAME,
            what: format!("{device} memory (NIXL moves host, CUDA and XPU memory)"),
        }),
    }
}

/// The local and remote transfer lists of `request`, one descriptor per run
/// of neighbouring pairs ([`TransferRequest::runs`]): local runs within one
/// registration (the request names it), remote runs within one of the
/// peer's registrations as `spans` records them (none merge without).
pub(crate) fn run_lists(
    request: &TransferRequest<'_>,
    spans: Option<&Spans>,
) -> Result<(XferDescList<'static>, XferDescList<'static>)> {
    let first = |segments: &[Segment], side| {
        segments
            .first()
            .ok_or(Error::EmptyDescriptorList { side })
            .and_then(|s| mem_of(s.device))
            .and_then(|(mem, _)| {
                XferDescList::new(mem).map_err(|e| nixl_error("create a transfer list", e))
            })
    };
    let mut local = first(request.local, Side::Local)?;
    let mut remote = first(request.remote, Side::Remote)?;
    for run in request.runs(|a, b| spans.is_some_and(|s| s.hold_together(a, b))) {
        local.add_desc(run.local.addr, run.local.len, mem_of(run.local.device)?.1);
        remote.add_desc(
            run.remote.addr,
            run.remote.len,
            mem_of(run.remote.device)?.1,
        );
    }
    Ok((local, remote))
}

pub(crate) fn malformed(error: agent_metadata::Malformed) -> Error {
    Error::InvalidMetadata {
        field: "nixl_metadata".into(),
        reason: error.to_string(),
    }
}

// Loading and unloading peers (`crate::peers` has the plan, `crate::route`
// the serving agent's part), and warming their connections up.
impl NixlBackend {
    /// Loads a peer's checked metadata into the agents.
    pub(crate) fn load_peer(&self, md: &AgentMetadata) -> Result<()> {
        let _loads = lock(&self.loading);
        if let Some(ago) = lock(&self.unreachable).since(&md.conns) {
            // Asking UCX again would leave one more socket behind.
            return Err(Error::backend(
                NAME,
                format!("load peer {:?}", md.name),
                format!(
                    "peer unreachable (exited?): UCX could not connect to peer {:?} with this \
                     connection info {:.1} s ago; not tried again for {:?} after that \
                     (Tuning::unreachable_for)",
                    md.name,
                    ago.as_secs_f64(),
                    self.live.tuning.unreachable_for,
                ),
            ));
        }
        let own = self.own_names();
        let own: Vec<&str> = own.iter().map(String::as_str).collect();
        let plan = lock(&self.peers)
            .plan(md, &own)
            .map_err(|reason| Error::backend(NAME, format!("load peer {:?}", md.name), reason))?;
        match plan {
            Plan::Loaded => lock(&self.peers).found(md),
            Plan::Merge { nixl_name } => self.merge(md, &nixl_name, &own)?,
            Plan::Rename {
                nixl_name,
                md: all,
                compacting,
            } => {
                if compacting {
                    tracing::debug!(peer = %md.name, %nixl_name, regions = all.regions().count(), "the peer's record holds mostly regions it no longer publishes: loading its recent ones under a new name");
                } else {
                    tracing::info!(peer = %md.name, %nixl_name, "the peer changed the key of a region NIXL holds: loading it under a new name");
                }
                let blob = all.to_blob(&nixl_name);
                if let Err(error) = self.load(&blob, &md.name, &nixl_name) {
                    // The peer's old name is untouched; the new one is not
                    // used again if NIXL may have kept a connection for it.
                    if !self
                        .live
                        .agents
                        .initiating()
                        .check_remote_metadata(&nixl_name, None)
                    {
                        lock(&self.peers).poison(&nixl_name);
                    }
                    if !compacting {
                        return Err(error);
                    }
                    // Compacting is an economy: the blob is merged instead.
                    tracing::debug!(peer = %md.name, %error, "compacting the peer's record failed");
                    let current = {
                        let mut peers = lock(&self.peers);
                        peers.compaction_refused(&md.name);
                        peers.nixl_name(&md.name).unwrap_or(&md.name).to_owned()
                    };
                    self.merge(md, &current, &own)?;
                } else {
                    lock(&self.peers).renamed(&all, &nixl_name);
                    // Seen now: the regions of this blob are the latest.
                    lock(&self.peers).found(md);
                    self.load_notifier(&md.name, &nixl_name, &blob);
                }
            }
        }
        self.retire(&md.name);
        Ok(())
    }

    /// Gives `md` to NIXL under `nixl_name` ([`Plan::Merge`]).
    fn merge(&self, md: &AgentMetadata, nixl_name: &str, own: &[&str]) -> Result<()> {
        let blob = md.to_blob(nixl_name);
        if let Err(error) = self.load(&blob, &md.name, nixl_name) {
            self.refused(&md.name, nixl_name, own);
            return Err(error);
        }
        lock(&self.peers).merged(md, nixl_name);
        self.load_notifier(&md.name, nixl_name, &blob);
        Ok(())
    }

    /// Unloads `peer`'s earlier names that no posted transfer uses any more
    /// ([`Peers::retire`](crate::peers::Peers::retire)); a name whose
    /// unload failed is never loaded again.
    fn retire(&self, peer: &str) {
        let retired = lock(&self.peers).retire(peer);
        for name in retired {
            if let Err(error) = self.unload_name(&name) {
                tracing::debug!(%peer, %name, %error, "an earlier name of the peer was not unloaded");
                lock(&self.peers).poison(&name);
            }
        }
    }

    /// Unloads every name NIXL knows the peer by (its earlier ones too).
    pub(crate) fn unload_peer(&self, peer: &str) -> Result<()> {
        let _loads = lock(&self.loading);
        let context = || format!("unload peer {peer:?}");
        let Some(names) = lock(&self.peers).remove(peer) else {
            // Never loaded here: as NIXL sees it.
            return self.unload_name(peer).map_err(|e| nixl_error(context(), e));
        };
        for stale in &names.stale {
            // Names NIXL dropped, or never took, are unknown to nixl-sys.
            if let Err(error) = self.unload_name(stale) {
                tracing::debug!(%peer, %stale, %error, "an earlier name of the peer was not loaded");
            }
        }
        match names.current {
            Some(current) => self
                .unload_name(&current)
                .map_err(|e| nixl_error(context(), e)),
            None => Ok(()),
        }
    }

    /// Loads `peer` (as `nixl_name`, in `blob`) into the serving agent too,
    /// so that it sends the notifications of transfers to the peer apart
    /// from them: once, and again while it still proves its endpoint to the
    /// peer (it then posts transfers, and needs the peer's regions). What
    /// to do is [`route::notifier_load`]'s, what follows
    /// [`route::after_load`]'s.
    pub(crate) fn load_notifier(&self, peer: &str, nixl_name: &str, blob: &[u8]) {
        let agents = &self.live.agents;
        let before = agents.notifiers.get(nixl_name);
        let own = !agents.two() || peer == self.name;
        if route::notifier_load(agents.notifications, own, before) == NotifierLoad::Skip {
            return;
        }
        let outcome = match agents.serving.load_remote_md(blob) {
            Ok(_) => LoadOutcome::Loaded,
            Err(error) => {
                let held = agents.serving.check_remote_metadata(nixl_name, None);
                tracing::debug!(%peer, %nixl_name, %error, held, "the serving agent cannot load the peer");
                if !held {
                    // Not loaded, or erased by NIXL (which may keep its
                    // connection): the name is not used again.
                    lock(&self.peers).poison(nixl_name);
                }
                LoadOutcome::Refused { held }
            }
        };
        agents
            .notifiers
            .set(nixl_name, route::after_load(before, outcome));
    }

    /// The names of this backend's agents, which no peer is loaded under.
    fn own_names(&self) -> Vec<String> {
        let mut own = vec![self.name.clone()];
        if self.live.agents.two() {
            own.push(initiator_name(&self.name));
        }
        own
    }

    /// Loads `blob`, the metadata of `peer` written under `nixl_name`, into
    /// the initiating agent.
    fn load(&self, blob: &[u8], peer: &str, nixl_name: &str) -> Result<()> {
        let context = || {
            let alias = if nixl_name == peer {
                String::new()
            } else {
                format!(", as {nixl_name:?}")
            };
            format!(
                "load remote agent metadata of peer {peer:?} ({} bytes{alias}; refused if another agent of that name is loaded and in use)",
                blob.len()
            )
        };
        let loaded = self
            .live
            .agents
            .initiating()
            .load_remote_md(blob)
            .map_err(|e| match e {
                NixlError::BackendError if self.is_unreachable(blob) => {
                    self.remember_unreachable(blob);
                    Error::backend(
                        NAME,
                        format!(
                            "peer unreachable (exited?): UCX cannot connect to peer {peer:?} \
                         with the connection info in its metadata; {}",
                            context()
                        ),
                        e,
                    )
                }
                e => nixl_error(context(), e),
            })?;
        if loaded == nixl_name {
            Ok(())
        } else {
            Err(Error::backend(
                NAME,
                context(),
                format!("NIXL loaded it as {loaded:?}"),
            ))
        }
    }

    /// Whether the peer of `blob`, a blob the initiating agent just refused
    /// with a backend error, cannot be reached at all: NIXL 1.5.1 reports a
    /// peer that exited (UCX: connection refused) only on stderr, as the
    /// same BACKEND error as a region it refuses. So the peer's connection
    /// info alone is loaded under a name of its own: refused too, the
    /// connection is what failed. Taken only on that error path.
    fn is_unreachable(&self, blob: &[u8]) -> bool {
        let Ok(md) = AgentMetadata::parse(blob) else {
            return false;
        };
        let probe = format!("{}#reach", md.name);
        let conns_only = AgentMetadata {
            name: probe.clone(),
            conns: md.conns,
            sections: Vec::new(),
        };
        let initiating = self.live.agents.initiating();
        match initiating.load_remote_md(&conns_only.to_blob(&probe)) {
            Ok(_) => {
                if let Err(error) = initiating.invalidate_remote_md(&probe) {
                    tracing::debug!(%probe, %error, "unloading the reachability probe failed");
                }
                false
            }
            Err(error) => {
                tracing::debug!(peer = %md.name, %error, "the peer's connection info alone is refused: unreachable");
                matches!(error, NixlError::BackendError)
            }
        }
    }

    /// Remembers the connection info of `blob` as unreachable (see
    /// [`crate::unreachable`]).
    fn remember_unreachable(&self, blob: &[u8]) {
        if let Ok(md) = AgentMetadata::parse(blob) {
            lock(&self.unreachable).remember(&md.conns);
        }
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
        // Counted in flight (see `Peers::posting`) until it returns.
        let (posting, _) = Peers::posting(&self.peers, peer, false);
        let nixl_peer = posting.name().to_owned();
        let Some(md) = lock(&self.peers).recorded(peer) else {
            return Ok(());
        };
        // NIXL's memory-type number of host memory (DRAM_SEG).
        let host = md
            .sections
            .iter()
            .filter(|s| s.mem == 0)
            .flat_map(|s| &s.regions)
            .find(|r| r.len > 0);
        let Some(region) = host else {
            tracing::debug!(%peer, "no host region to warm up with");
            return Ok(());
        };
        let agents = &self.live.agents;
        self.warm_read(
            agents.initiating(),
            peer,
            &nixl_peer,
            region.addr,
            region.dev,
        )?;
        if agents.two() && agents.notifiers.get(&nixl_peer) == Notifier::Proving {
            // The first transfers go through the serving agent (the proving
            // route): warm its endpoint too.
            self.warm_read(&agents.serving, peer, &nixl_peer, region.addr, region.dev)?;
        }
        Ok(())
    }

    /// A one-byte READ from `addr` of the peer through `agent`, into a
    /// buffer registered for it alone, waited for (bounded).
    fn warm_read(
        &self,
        agent: &Agent,
        peer: &str,
        nixl_peer: &str,
        addr: u64,
        dev: u64,
    ) -> Result<()> {
        let context = || format!("warm up the connection to peer {peer:?}");
        let fail = |e: NixlError| nixl_error(context(), e);
        let buffer = vec![0u8; 1].into_boxed_slice();
        let range = Range {
            addr: buffer.as_ptr().expose_provenance(),
            len: buffer.len(),
            mem: MemType::Dram,
            device: 0,
        };
        // Registered with the posting agent alone, and deregistered below
        // (the handle dropped) before the buffer is freed.
        let handle = agent.register_memory(&range, None).map_err(fail)?;
        let mut local = XferDescList::new(MemType::Dram).map_err(fail)?;
        local.add_desc(range.addr, 1, 0);
        let mut remote = XferDescList::new(MemType::Dram).map_err(fail)?;
        let remote_addr = usize::try_from(addr).map_err(|_| {
            Error::backend(
                NAME,
                context(),
                format!("remote address {addr:#x} does not fit"),
            )
        })?;
        remote.add_desc(remote_addr, 1, dev);
        let xfer = agent
            .create_xfer_req(XferOp::Read, &local, &remote, nixl_peer, None)
            .map_err(fail)?;
        let posted = agent.post_xfer_req(&xfer, None);
        let deadline = Instant::now() + WARM_UP_WAIT;
        let status = loop {
            match agent.get_xfer_status(&xfer) {
                Ok(XferStatus::InProgress) if Instant::now() < deadline => std::thread::yield_now(),
                status => break status,
            }
        };
        if let Ok(XferStatus::InProgress) = status {
            // NIXL may still write the buffer: it, its registration and the
            // request are leaked, not freed (one byte).
            std::mem::forget((xfer, handle, buffer));
            return Err(Error::backend(
                NAME,
                context(),
                format!("the one-byte READ did not end within {WARM_UP_WAIT:?}"),
            ));
        }
        drop(xfer);
        drop(handle);
        drop(buffer);
        posted.map_err(fail)?;
        status.map(|_| ()).map_err(fail)
    }

    /// After the initiating agent refused a blob of `peer` under
    /// `nixl_name`: if NIXL erased what it held for the peer (and may keep
    /// its connection, so that the name can never be loaded again), what it
    /// held is loaded again under a new name, so that the refused blob
    /// changes nothing.
    fn refused(&self, peer: &str, nixl_name: &str, own: &[&str]) {
        let initiating = self.live.agents.initiating();
        if own.contains(&nixl_name) || initiating.check_remote_metadata(nixl_name, None) {
            return;
        }
        let (recorded, fresh) = {
            let mut peers = lock(&self.peers);
            peers.poison(nixl_name);
            (peers.recorded(peer), peers.fresh_name(peer, own))
        };
        let Some(had) = recorded else {
            lock(&self.peers).forgotten(peer, None, own);
            return;
        };
        let blob = had.to_blob(&fresh);
        match self.load(&blob, peer, &fresh) {
            Ok(()) => {
                tracing::warn!(%peer, old = %nixl_name, new = %fresh, "NIXL dropped the peer when it refused a blob: loaded what it had again under a new name");
                lock(&self.peers).renamed(&had, &fresh);
                self.load_notifier(peer, &fresh, &blob);
            }
            Err(error) => {
                tracing::warn!(%peer, %error, "NIXL dropped the peer when it refused a blob, and refused what it had: the peer is loaded afresh next time");
                if !initiating.check_remote_metadata(&fresh, None) {
                    lock(&self.peers).poison(&fresh);
                }
                lock(&self.peers).forgotten(peer, Some(fresh), own);
            }
        }
    }

    /// Unloads the name `nixl_name` from both agents.
    fn unload_name(&self, nixl_name: &str) -> std::result::Result<(), NixlError> {
        let agents = &self.live.agents;
        let notifier = agents.notifiers.remove(nixl_name);
        if matches!(notifier, Notifier::Proving | Notifier::Proven)
            && let Err(error) = agents.serving.invalidate_remote_md(nixl_name)
        {
            // The initiating agent's unload below is what the connector
            // relies on; the serving one only sent notifications.
            tracing::warn!(%nixl_name, %error, "unloading a peer from the serving agent failed");
        }
        agents.initiating().invalidate_remote_md(nixl_name)
    }
}

#[cfg(test)]
mod tests {
    use super::mem_of;
    use descriptor_core::{Device, Error};

    #[test]
    fn rocm_memory_is_unsupported() {
        assert!(matches!(
            mem_of(Device::rocm(0)),
            Err(Error::Unsupported { .. })
        ));
        assert_eq!(mem_of(Device::cuda(3)).ok().map(|(_, d)| d), Some(3));
    }
}
