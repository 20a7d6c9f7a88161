//! [`PeerLoader`]: loading and unloading peers into a backend's agents
//! (the plan is [`super::record`]'s, the serving agent's part
//! [`crate::route`]'s), warming their connections up, and counting the
//! transfers posted to them.
//!
//! A load or unload runs as one [`Loading`], which holds the loader's lock
//! across it, NIXL's calls included: each is planned against what NIXL
//! holds, which another would change midway. Transfers do not take it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use descriptor_core::{Error, Result};
use nixl_sys::{Agent, MemType, NixlError, XferDescList, XferOp, XferStatus};

use super::record::{Peers, Plan, Posting};
use crate::agent_metadata::AgentMetadata;
use crate::agents::{Agents, initiator_name};
use crate::error::{NAME, nixl_error};
use crate::memory::Range;
use crate::route::{self, LoadOutcome, Notifier, NotifierLoad};
use crate::spans::Spans;
use crate::sync::lock;
use crate::tuning::Tuning;
use crate::unreachable::Unreachable;
use crate::watcher::Live;

/// How long [`NixlBackend::warm_up`] waits for its one-byte READ.
///
/// [`NixlBackend::warm_up`]: crate::NixlBackend::warm_up
const WARM_UP_WAIT: Duration = Duration::from_secs(10);

/// Loads and unloads a backend's peers, warms their connections up and
/// counts the transfers posted to them. It owns what that takes (the record
/// of what NIXL holds for each peer, the connection infos UCX could not
/// reach lately, the lock a load or unload holds) and borrows the agents
/// for each call: they live in [`Live`](crate::watcher::Live), shared with
/// the watcher thread.
pub(crate) struct PeerLoader {
    /// The serving agent's name: a peer of this name is this backend.
    name: String,
    /// The names of this backend's agents, which no peer is loaded under.
    own: Vec<String>,
    /// The peers loaded, what NIXL holds for each and the name it knows each
    /// by (see [`crate::peers`]).
    record: Mutex<Peers>,
    /// Held across a peer's load or unload ([`Loading`]).
    loading: Mutex<()>,
    /// Peers' connection infos UCX could not connect to, lately.
    unreachable: Mutex<Unreachable>,
    /// Peers the connector unloaded that NIXL still holds, the longest
    /// unloaded first, at most [`Tuning::parked_peers`] (see
    /// [`PeerLoader::unload`]).
    parked: Mutex<VecDeque<String>>,
    /// [`Tuning::parked_peers`].
    park: usize,
}

impl PeerLoader {
    /// No peers yet, for the agents of the backend called `name`.
    pub(crate) fn new(name: &str, agents: &Agents, tuning: &Tuning) -> PeerLoader {
        let mut own = vec![name.to_owned()];
        if agents.two() {
            own.push(initiator_name(name));
        }
        PeerLoader {
            name: name.to_owned(),
            own,
            record: Mutex::new(Peers::new(tuning.compact_peers_above)),
            loading: Mutex::new(()),
            unreachable: Mutex::new(Unreachable::new(tuning.unreachable_for)),
            parked: Mutex::new(VecDeque::new()),
            park: tuning.parked_peers,
        }
    }

    /// Loads a peer's checked metadata into `live`'s agents. A parked peer
    /// of that name ([`PeerLoader::unload`]) is taken back: as it was if
    /// the blob is of the same incarnation (the same connection info), else
    /// unloaded first, once UCX had a look at its connection.
    pub(crate) fn load(&self, live: &Live, md: &AgentMetadata) -> Result<()> {
        let loading = Loading::begin(self, &live.agents);
        let was_parked = {
            let mut parked = lock(&self.parked);
            let at = parked.iter().position(|p| *p == md.name);
            at.and_then(|at| parked.remove(at)).is_some()
        };
        if was_parked && !loading.record().same_incarnation(md) {
            live.progress();
            if let Err(error) = loading.unload_peer(&md.name) {
                tracing::debug!(peer = %md.name, %error, "unloading the parked earlier incarnation of the peer failed");
            }
        }
        loading.load_peer(md)
    }

    /// Unloads the peer: every name NIXL knows it by (its earlier ones too)
    /// is unloaded from `live`'s agents, or, with [`Tuning::parked_peers`]
    /// above 0, the peer is parked: NIXL keeps it (its regions and its
    /// endpoints) while it is one of the last this many peers unloaded, so
    /// that loading it again costs no new endpoint. Why: NIXL 1.5.1 closes
    /// the endpoints of an unloaded peer without force, and UCX destroys
    /// them only once the connection breaks: unloading a peer that is
    /// alive leaves two sockets open until it exits, per unload (NIXL
    /// issue 2025). UCX looks at the connections first ([`Live::progress`]),
    /// so that those of peers that exited are closed with force.
    pub(crate) fn unload(&self, live: &Live, peer: &str) -> Result<()> {
        live.progress();
        let loading = Loading::begin(self, &live.agents);
        if self.park == 0 || !loading.record().loaded(peer) {
            return loading.unload_peer(peer);
        }
        let evicted = {
            let mut parked = lock(&self.parked);
            parked.retain(|p| p != peer);
            parked.push_back(peer.to_owned());
            if parked.len() > self.park {
                parked.pop_front()
            } else {
                None
            }
        };
        if let Some(oldest) = evicted
            && let Err(error) = loading.unload_peer(&oldest)
        {
            tracing::debug!(peer = %oldest, %error, "unloading the longest parked peer failed");
        }
        Ok(())
    }

    /// How many peers are parked ([`PeerLoader::unload`]).
    pub(crate) fn parked(&self) -> usize {
        lock(&self.parked).len()
    }

    /// A transfer to `peer` is about to be created: the NIXL name to post it
    /// against, counted in flight, and where the peer's registrations lie
    /// if `spans` ([`Peers::posting`]).
    pub(crate) fn posting(&self, peer: &str, spans: bool) -> (Posting<'_>, Option<Arc<Spans>>) {
        Peers::posting(&self.record, peer, spans)
    }

    /// A transfer whose [`Posting`] was kept, posted against `nixl_name`,
    /// was released ([`Peers::posted`]).
    pub(crate) fn posted(&self, nixl_name: &str) {
        lock(&self.record).posted(nixl_name);
    }

    /// A one-byte READ of `peer`'s first host region through each agent
    /// that may post to it: see [`NixlBackend::warm_up`].
    ///
    /// [`NixlBackend::warm_up`]: crate::NixlBackend::warm_up
    pub(crate) fn warm_up(&self, agents: &Agents, peer: &str) -> Result<()> {
        // Counted in flight (see `Peers::posting`) until it returns.
        let (posting, _) = self.posting(peer, false);
        let nixl_peer = posting.name().to_owned();
        let Some(md) = lock(&self.record).recorded(peer) else {
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
        warm_read(
            agents.initiating(),
            peer,
            &nixl_peer,
            region.addr,
            region.dev,
        )?;
        if agents.two() && agents.notifiers.get(&nixl_peer) == Notifier::Proving {
            // The first transfers go through the serving agent (the proving
            // route): warm its endpoint too.
            warm_read(&agents.serving, peer, &nixl_peer, region.addr, region.dev)?;
        }
        Ok(())
    }
}

/// One load or unload of a peer: the agents it calls, and the loader's lock,
/// held until it is dropped.
struct Loading<'a> {
    agents: &'a Agents,
    loader: &'a PeerLoader,
    _loads: MutexGuard<'a, ()>,
}

impl<'a> Loading<'a> {
    /// Waits for the load or unload in progress, if any.
    fn begin(loader: &'a PeerLoader, agents: &'a Agents) -> Loading<'a> {
        Loading {
            _loads: lock(&loader.loading),
            agents,
            loader,
        }
    }

    /// The record, locked.
    fn record(&self) -> MutexGuard<'a, Peers> {
        lock(&self.loader.record)
    }

    /// Loads a peer's checked metadata into the agents.
    fn load_peer(&self, md: &AgentMetadata) -> Result<()> {
        let mut unreachable = lock(&self.loader.unreachable);
        if let Some(ago) = unreachable.since(&md.conns) {
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
                    unreachable.window(),
                ),
            ));
        }
        drop(unreachable);
        let own: Vec<&str> = self.loader.own.iter().map(String::as_str).collect();
        let plan = self
            .record()
            .plan(md, &own)
            .map_err(|reason| Error::backend(NAME, format!("load peer {:?}", md.name), reason))?;
        match plan {
            Plan::Loaded => self.record().found(md),
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
                        .agents
                        .initiating()
                        .check_remote_metadata(&nixl_name, None)
                    {
                        self.record().poison(&nixl_name);
                    }
                    if !compacting {
                        return Err(error);
                    }
                    // Compacting is an economy: the blob is merged instead.
                    tracing::debug!(peer = %md.name, %error, "compacting the peer's record failed");
                    let current = {
                        let mut peers = self.record();
                        peers.compaction_refused(&md.name);
                        peers.nixl_name(&md.name).unwrap_or(&md.name).to_owned()
                    };
                    self.merge(md, &current, &own)?;
                } else {
                    self.record().renamed(&all, &nixl_name);
                    // Seen now: the regions of this blob are the latest.
                    self.record().found(md);
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
        self.record().merged(md, nixl_name);
        self.load_notifier(&md.name, nixl_name, &blob);
        Ok(())
    }

    /// Unloads `peer`'s earlier names that no posted transfer uses any more
    /// ([`Peers::retire`]); a name whose
    /// unload failed is never loaded again.
    fn retire(&self, peer: &str) {
        let retired = self.record().retire(peer);
        for name in retired {
            if let Err(error) = self.unload_name(&name) {
                tracing::debug!(%peer, %name, %error, "an earlier name of the peer was not unloaded");
                self.record().poison(&name);
            }
        }
    }

    /// Unloads every name NIXL knows the peer by (its earlier ones too).
    fn unload_peer(&self, peer: &str) -> Result<()> {
        let context = || format!("unload peer {peer:?}");
        let Some(names) = self.record().remove(peer) else {
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
    fn load_notifier(&self, peer: &str, nixl_name: &str, blob: &[u8]) {
        let agents = self.agents;
        let before = agents.notifiers.get(nixl_name);
        let own = !agents.two() || peer == self.loader.name;
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
                    self.record().poison(nixl_name);
                }
                LoadOutcome::Refused { held }
            }
        };
        agents
            .notifiers
            .set(nixl_name, route::after_load(before, outcome));
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
        let initiating = self.agents.initiating();
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
            lock(&self.loader.unreachable).remember(&md.conns);
        }
    }

    /// After the initiating agent refused a blob of `peer` under
    /// `nixl_name`: if NIXL erased what it held for the peer (and may keep
    /// its connection, so that the name can never be loaded again), what it
    /// held is loaded again under a new name, so that the refused blob
    /// changes nothing.
    fn refused(&self, peer: &str, nixl_name: &str, own: &[&str]) {
        let initiating = self.agents.initiating();
        if own.contains(&nixl_name) || initiating.check_remote_metadata(nixl_name, None) {
            return;
        }
        let (recorded, fresh) = {
            let mut peers = self.record();
            peers.poison(nixl_name);
            (peers.recorded(peer), peers.fresh_name(peer, own))
        };
        let Some(had) = recorded else {
            self.record().forgotten(peer, None, own);
            return;
        };
        let blob = had.to_blob(&fresh);
        match self.load(&blob, peer, &fresh) {
            Ok(()) => {
                tracing::warn!(%peer, old = %nixl_name, new = %fresh, "NIXL dropped the peer when it refused a blob: loaded what it had again under a new name");
                self.record().renamed(&had, &fresh);
                self.load_notifier(peer, &fresh, &blob);
            }
            Err(error) => {
                tracing::warn!(%peer, %error, "NIXL dropped the peer when it refused a blob, and refused what it had: the peer is loaded afresh next time");
                if !initiating.check_remote_metadata(&fresh, None) {
                    self.record().poison(&fresh);
                }
                self.record().forgotten(peer, Some(fresh), own);
            }
        }
    }

    /// Unloads the name `nixl_name` from both agents.
    fn unload_name(&self, nixl_name: &str) -> std::result::Result<(), NixlError> {
        let agents = self.agents;
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

/// A one-byte READ from `addr` of the peer through `agent`, into a
/// buffer registered for it alone, waited for (bounded).
fn warm_read(agent: &Agent, peer: &str, nixl_peer: &str, addr: u64, dev: u64) -> Result<()> {
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
