//! [`NixlBackend`]: NIXL agents behind the core trait (one that serves peers,
//! and one that posts this connector's transfers when NIXL's thread is on).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use descriptor_core::{
    Device, DeviceKind, Error, EventHook, Exposure, ExposureId, Notification, OperationKind,
    Posted, RegionId, RegistrationBackend, Release, Result, Segment, SharedCause, Side, TransferId,
    TransferRequest, TransferState,
};
use nixl_sys::{
    Agent, AgentConfig, MemType, MemoryRegion, NixlDescriptor, NixlError, OptArgs, RegDescList,
    RegistrationHandle, ThreadSync, XferDescList, XferOp,
};

use crate::agent_metadata::{self, AgentMetadata};
use crate::peers::{Peers, Plan};
use crate::progress::{Live, Notify, Transfer, Via, WATCH_AT_POST, lock};
use crate::runtime;

const NAME: &str = "nixl";

/// What the agent-metadata blob of an exposure describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetadataScope {
    /// The agent's full metadata (`get_local_md`): every registered region plus
    /// connection info, exactly what Dynamo's Python workers publish and load.
    /// The default, because a Python peer can load only this.
    #[default]
    Agent,
    /// Only the exposed regions (`get_local_partial_md`) plus connection info, in
    /// a two-part blob this crate reads: a peer learns nothing of the agent's
    /// other registrations and the blob stays small however many regions the
    /// agent holds. Rust peers only (NIXL 1.5's C API cannot put connection info
    /// and chosen regions into one blob).
    Exposed,
}

/// Builds a [`NixlBackend`]: transport plugins and their parameters, progress
/// thread, thread-sync mode and metadata scope.
#[derive(Debug, Clone)]
pub struct NixlBackendBuilder {
    name: String,
    /// `None` until a plugin is named: then the default, UCX.
    plugins: Option<Vec<String>>,
    params: Vec<(String, String, String)>,
    progress_thread: bool,
    progress_delay: Duration,
    thread_sync: ThreadSync,
    scope: MetadataScope,
    log_level: Option<runtime::LogLevel>,
}

impl NixlBackendBuilder {
    /// Adds a transport plugin (`"UCX"`, `"LIBFABRIC"`, `"POSIX"`, ...). The first
    /// call replaces the default, `["UCX"]`.
    pub fn plugin(mut self, plugin: &str) -> Self {
        let plugins = self.plugins.get_or_insert_with(Vec::new);
        if !plugins.iter().any(|p| p == plugin) {
            plugins.push(plugin.to_owned());
        }
        self
    }

    /// Sets a plugin parameter, e.g. `("UCX", "num_workers", "2")`, on top of the
    /// plugin's defaults; of two settings of one key, the later wins.
    /// [`build`](Self::build) refuses a parameter for a plugin the agent does
    /// not load.
    ///
    /// UCX's own variables are set per agent, without the environment,
    /// through the UCX plugin's `engine_config`: comma-separated `KEY=VALUE`
    /// pairs without the `UCX_` prefix, e.g. `("UCX", "engine_config",
    /// "USE_MT_MUTEX=y,RNDV_THRESH=8k")`. Give every pair in one call (a
    /// second call replaces the first); a variable set as `UCX_KEY` in the
    /// environment wins over its pair. NIXL 1.5 does not report an unknown
    /// key or an invalid value: UCX only logs an error, and the agent is
    /// built without it.
    pub fn plugin_param(mut self, plugin: &str, key: &str, value: &str) -> Self {
        self.params
            .push((plugin.to_owned(), key.to_owned(), value.to_owned()));
        self
    }

    /// Whether UCX must detect a peer that dies (default: yes, NIXL's own
    /// default). Sets UCX's `ucx_error_handling_mode`: `peer`, or `none` when
    /// `false`.
    ///
    /// With detection, UCX uses only transports that report a dead peer. On a
    /// host without RDMA devices that sends a transfer's notification (which
    /// the passive side waits for) over TCP loopback instead of shared memory,
    /// and the receiving threads are woken through sockets. Measured on the
    /// 2-core test machine (`bench --no-peer-failure-detection`, two runs
    /// each way, docs/performance.md), between two processes: 4 KiB in
    /// 18-26 µs instead of 28-39 µs, 64 KiB in 27-34 µs instead of 40-45 µs,
    /// 4 KiB × 16 in 62-76 µs instead of 80-90 µs; 1 MiB and up, no
    /// difference beyond the noise. (Before this backend sent notifications
    /// apart from their transfers, detection cost more: 60 µs instead of
    /// 16-18 at 4 KiB.) Only the *initiator's* setting counted: without
    /// detection it ran as fast against a peer that keeps the default (a
    /// Dynamo Python worker, say), and with it as slow against a peer
    /// without. On hosts with RDMA devices UCX may find transports that detect
    /// a dead peer and are fast: not measured here.
    ///
    /// The cost: without detection, UCX does not promise that a transfer to a
    /// peer that dies ends at all. On one host, killing the peer mid-transfer
    /// still failed the transfer within milliseconds here (the copy into a
    /// dead process fails), but over other transports a transfer to a dead
    /// peer may never end: bound every wait (`wait_timeout`), and keep the
    /// default where peers can die without the job noticing.
    pub fn peer_failure_detection(self, detect: bool) -> Self {
        let mode = if detect { "peer" } else { "none" };
        self.plugin_param("UCX", "ucx_error_handling_mode", mode)
    }

    /// Whether NIXL runs its own progress thread (default: yes, with a
    /// [delay](Self::progress_thread_delay)). With a delay it is event-driven:
    /// it sleeps on UCX's event fd and wakes on traffic, so the agent serves
    /// peers (a transfer over TCP, or one whose endpoint sent a message,
    /// completes only once its target progressed) even
    /// when it has nothing in flight itself, at a fraction of a percent of a
    /// core. Without it, the agent progresses only while this backend's
    /// watcher polls, that is while it has a transfer in flight or a passive
    /// operation waiting: a peer that reaches it at any other time (stale
    /// metadata) waits until it has.
    ///
    /// With the thread on, the backend runs two NIXL agents: the one called
    /// by the builder's name, with the thread, holds the memory peers reach,
    /// receives their notifications and sends this connector's; the
    /// connector's own READs and WRITEs go out through a second one,
    /// `<name>.initiator`, without it. Memory is registered with both, and a
    /// peer is loaded into both (the serving agent needs its connection info,
    /// and its regions only for the first transfers, below). A transfer's notification goes out from the serving agent once
    /// NIXL reports the transfer done, so the passive side still sees it
    /// only after the bytes are in place, and the initiating agent's
    /// endpoint carries no message: NIXL flushes that endpoint before it
    /// reports a transfer done, and over TCP, UCX's flush of an endpoint that
    /// sent a message waits for the peer to acknowledge a zero-length put,
    /// that is for the peer's progress. Measured on the 2-core test machine
    /// between processes (docs/performance.md): 4 KiB in 35-43 µs instead of
    /// 68-87 with the notification attached to the transfer. Until one
    /// transfer to a peer succeeded that way, transfers to it go through the
    /// serving agent with their notification attached, so that the first
    /// message on its new endpoint to the peer (which can wait for the
    /// endpoint's handshake) is tracked with a transfer: NIXL does not say
    /// when a notification sent apart leaves. A transfer to the connector's
    /// own memory carries its notification (from `<name>.initiator`): an
    /// agent cannot load itself as a peer.
    ///
    /// On the thread's worker, UCX's lock is a spinlock: with the
    /// thread beside the thread that posts and waits, one was preempted
    /// holding it while the other spun until the scheduler's tick, and on the
    /// 2-core test machine 1-17% of the transfers between processes took
    /// 1-5 ms; through the second agent, 0-2% (docs/performance.md).
    ///
    /// Measured on that machine (`bench --movers
    /// nixl-no-thread,nixl-xproc-no-thread,...`): without the thread at all,
    /// a target answers only when its watcher polls, which naps up to 1 ms
    /// while a passive operation waits: a 4 KiB transfer that followed a
    /// 2 ms pause (`bench --gap-us 2000`) took 1.16 ms instead of
    /// 0.19-0.21 ms. Keep it for peers that do not transfer back to back.
    pub fn progress_thread(mut self, enabled: bool) -> Self {
        self.progress_thread = enabled;
        self
    }

    /// The longest NIXL's progress thread, if enabled, sleeps waiting for
    /// traffic (default 100 ms; it wakes at once on traffic, so the delay
    /// sets the idle cost, not the latency: two idle agents used 0.3% of a
    /// core at 100 ms, 1% at 10 ms). NIXL's own default, 0, spins and keeps a
    /// core busy per agent.
    pub fn progress_thread_delay(mut self, delay: Duration) -> Self {
        self.progress_delay = delay;
        self
    }

    /// Sets NIXL's log level for the whole process when the agent is built (see
    /// [`runtime::set_log_level`]); `LogLevel::Off` silences the `E...` lines
    /// NIXL prints for refused requests, whose reasons this crate's errors
    /// already carry. Default: NIXL's own (`NIXL_LOG_LEVEL`, or INFO).
    pub fn log_level(mut self, level: runtime::LogLevel) -> Self {
        self.log_level = Some(level);
        self
    }

    /// NIXL's internal locking (default [`ThreadSync::Strict`]: the connector calls
    /// the agent from user threads and its progress engine at once).
    pub fn thread_sync(mut self, mode: ThreadSync) -> Self {
        self.thread_sync = mode;
        self
    }

    /// What exposures describe (default [`MetadataScope::Agent`]).
    pub fn metadata_scope(mut self, scope: MetadataScope) -> Self {
        self.scope = scope;
        self
    }

    /// Loads the runtime (see [`runtime::load`]), creates the agent and its backends.
    pub fn build(self) -> Result<NixlBackend> {
        let plugins = self
            .plugins
            .clone()
            .unwrap_or_else(|| vec!["UCX".to_owned()]);
        if let Some((plugin, key, _)) = self.params.iter().find(|(p, _, _)| !plugins.contains(p)) {
            return Err(Error::Unsupported {
                backend: NAME,
                what: format!(
                    "parameter {key:?} for the {plugin} plugin, which this agent does not load (plugins: {})",
                    plugins.join(", ")
                ),
            });
        }
        runtime::load()?;
        if let Some(level) = self.log_level {
            runtime::set_log_level(level)?;
        }
        let serving = self.agent(&self.name, self.progress_thread, &plugins)?;
        // With NIXL's thread serving peers, this connector's own transfers go
        // through a second agent without one (see `Live`).
        let initiator = if self.progress_thread {
            Some(self.agent(&initiator_name(&self.name), false, &plugins)?)
        } else {
            None
        };
        tracing::debug!(agent = %self.name, initiator = initiator.is_some(), ?plugins, scope = ?self.scope, "created NIXL agents");
        Ok(NixlBackend {
            live: Arc::new(Live::new(serving, initiator)),
            watcher: Mutex::new(None),
            name: self.name,
            scope: self.scope,
            next_id: AtomicU64::new(1),
            regions: Mutex::new(HashMap::new()),
            peers: Mutex::new(Peers::default()),
            loading: Mutex::new(()),
            connection_md: Mutex::new(None),
            notifiers: Mutex::new(HashMap::new()),
        })
    }

    /// One NIXL agent called `name`, with the builder's plugins and settings.
    fn agent(&self, name: &str, progress_thread: bool, plugins: &[String]) -> Result<Agent> {
        let config = AgentConfig {
            enable_prog_thread: progress_thread,
            pthr_delay_us: u64::try_from(self.progress_delay.as_micros()).unwrap_or(u64::MAX),
            thread_sync: self.thread_sync,
            ..AgentConfig::default()
        };
        let context = |what: &str| format!("{what} (agent {name:?})");
        let agent = Agent::new_configured(name, &config)
            .map_err(|e| nixl_error(context("create agent"), e))?;
        for plugin in plugins {
            let (_mems, mut params) = agent
                .get_plugin_params(plugin)
                .map_err(|e| nixl_error(context(&format!("load plugin {plugin}")), e))?;
            for (_, key, value) in self.params.iter().filter(|(p, _, _)| p == plugin) {
                params.set(key, value).map_err(|e| {
                    nixl_error(context(&format!("set {plugin} parameter {key}")), e)
                })?;
            }
            agent
                .create_backend(plugin, &params)
                .map_err(|e| nixl_error(context(&format!("create {plugin} backend")), e))?;
        }
        Ok(agent)
    }
}

/// The name of the agent that initiates a connector's transfers, beside the
/// one called `name` that serves peers.
fn initiator_name(name: &str) -> String {
    format!("{name}.initiator")
}

/// A real NIXL agent (UCX by default) implementing [`RegistrationBackend`].
///
/// With NIXL's progress thread on (the default), a second agent without it,
/// `<name>.initiator`, posts this connector's READs and WRITEs: see
/// [`NixlBackendBuilder::progress_thread`].
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
    watcher: Mutex<Option<std::thread::JoinHandle<()>>>,
    name: String,
    scope: MetadataScope,
    next_id: AtomicU64,
    regions: Mutex<HashMap<u64, Region>>,
    /// The peers loaded, what NIXL holds for each and the name it knows each
    /// by (see [`crate::peers`]).
    peers: Mutex<Peers>,
    /// Held across a peer's load or unload, NIXL's calls included: each is
    /// planned against what NIXL holds, which another would change midway.
    /// Transfers do not take it.
    loading: Mutex<()>,
    /// This agent's connection-only metadata, made once.
    connection_md: Mutex<Option<Vec<u8>>>,
    /// Peers the serving agent was asked to load, by the name NIXL knows them
    /// by, so that it sends the
    /// notifications of transfers to them (see [`Live::notifies`]): `Some`
    /// if it did, with whether it has proven its endpoint to the peer
    /// ([`Route`]); `None` if it could not (their transfers then carry their
    /// notification through the initiating agent).
    notifiers: Mutex<HashMap<String, Option<Arc<AtomicBool>>>>,
}

/// How a transfer that notifies its peer goes out.
enum Route {
    /// Through the initiating agent, carrying its notification: the serving
    /// agent has not loaded the peer (it is this connector, say).
    Attached,
    /// Through the serving agent, carrying its notification, until one such
    /// transfer succeeded (then the flag is set). NIXL's `genNotif` does not
    /// say when its message leaves, and the first message on a new UCX
    /// endpoint can wait for the endpoint's handshake, which needs the
    /// peer's progress: the operation would end (and this process could
    /// exit, losing the message) before the peer was told. A notification
    /// carried by a transfer is tracked with it: once one arrived that way,
    /// the serving agent's endpoint to the peer is connected.
    Proving(Arc<AtomicBool>),
    /// Through the initiating agent, and the serving agent sends the
    /// notification once NIXL reports the transfer done.
    Apart,
}

impl std::fmt::Debug for NixlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NixlBackend")
            .field("agent", &self.name)
            .field("scope", &self.scope)
            .finish()
    }
}

struct Region {
    segment: Segment,
    writable: bool,
    // Dropping the handles deregisters the memory (from each agent).
    _handles: Vec<RegistrationHandle>,
}

/// A registered range as nixl-sys wants to see it.
#[derive(Debug)]
struct Range {
    addr: usize,
    len: usize,
    mem: MemType,
    device: u64,
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

#[cold]
fn nixl_error(context: impl Into<String>, error: NixlError) -> Error {
    Error::backend(NAME, context, error)
}

/// NIXL's memory type and device id for a device.
fn mem_of(device: Device) -> Result<(MemType, u64)> {
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

fn xfer_list(segments: &[Segment], side: Side) -> Result<XferDescList<'static>> {
    let first = segments
        .first()
        .ok_or(Error::EmptyDescriptorList { side })?;
    let (mem, _) = mem_of(first.device)?;
    let mut list = XferDescList::new(mem).map_err(|e| nixl_error("create a transfer list", e))?;
    for s in segments {
        let (_, device) = mem_of(s.device)?;
        list.add_desc(s.addr, s.len, device);
    }
    Ok(list)
}

impl NixlBackend {
    /// An agent named `name` with the defaults: UCX, NIXL's progress thread
    /// with a 100 ms delay (event-driven), strict thread sync, full agent
    /// metadata.
    pub fn new(name: &str) -> Result<NixlBackend> {
        NixlBackend::builder(name).build()
    }

    /// A builder for an agent named `name`.
    pub fn builder(name: &str) -> NixlBackendBuilder {
        NixlBackendBuilder {
            name: name.to_owned(),
            plugins: None,
            params: Vec::new(),
            progress_thread: true,
            progress_delay: Duration::from_millis(100),
            thread_sync: ThreadSync::Strict,
            scope: MetadataScope::Agent,
            log_level: None,
        }
    }

    /// The parameters the agent's `plugin` backend runs with (the plugin's
    /// defaults with the builder's settings applied), as NIXL reports them;
    /// `None` if the agent did not load `plugin`.
    pub fn plugin_params(&self, plugin: &str) -> Result<Option<Vec<(String, String)>>> {
        let agent = &self.live.agent;
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

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn connection_md(&self) -> Result<Vec<u8>> {
        let mut cached = lock(&self.connection_md);
        if let Some(md) = &*cached {
            return Ok(md.clone());
        }
        let empty =
            RegDescList::new(MemType::Dram).map_err(|e| nixl_error("create a region list", e))?;
        let md = self
            .live
            .agent
            .get_local_partial_md(&empty, None)
            .map_err(|e| nixl_error("get connection metadata", e))?;
        *cached = Some(md.clone());
        Ok(md)
    }

    fn scoped_md(&self, segments: &[Segment]) -> Result<Vec<u8>> {
        let (mem, _) = mem_of(segments[0].device)?;
        let mut list = RegDescList::new(mem).map_err(|e| nixl_error("create a region list", e))?;
        for s in segments {
            list.add_desc(s.addr, s.len, mem_of(s.device)?.1);
        }
        let regions = self
            .live
            .agent
            .get_local_partial_md(&list, None)
            .map_err(|e| nixl_error("get partial metadata", e))?;
        let connection = self.connection_md()?;
        Ok(agent_metadata::scoped_blob(&connection, &regions))
    }

    /// Loads `peer` (as `nixl_name`, in `blob`) into the serving agent too,
    /// so that the serving agent sends the
    /// notifications of transfers to it: once, and again while the serving
    /// agent still proves its endpoint to the peer ([`Route::Proving`]: it
    /// then posts transfers, and needs the peer's regions).
    ///
    /// Why: the initiating agent's endpoint to the peer then carries only
    /// the transfers. NIXL flushes that endpoint before it reports a
    /// transfer done, and with UCX over TCP a flush after a message (the
    /// previous transfer's notification) is a round trip through the peer's
    /// progress (`uct_tcp_ep_flush` sends a zero-length put and waits for its
    /// acknowledgement); with no message on it, the flush is local. Measured
    /// (docs/performance.md): cross-process 4 KiB p50 35-43 µs instead of
    /// 68-87, whatever vCPU the peer's threads run on.
    ///
    /// If the serving agent cannot load the peer (the peer is this agent
    /// itself, say), the peer's transfers carry their notification, as with
    /// one agent.
    fn load_notifier(&self, peer: &str, nixl_name: &str, blob: &[u8]) {
        if !self.live.notifies() || peer == self.name {
            return;
        }
        let first = match lock(&self.notifiers).get(nixl_name) {
            None => true,
            Some(None) => return,
            Some(Some(proven)) if proven.load(Ordering::Acquire) => return,
            Some(Some(_)) => false,
        };
        let loaded = match self.live.agent.load_remote_md(blob) {
            Ok(_) => true,
            Err(error) if !self.live.agent.check_remote_metadata(nixl_name, None) => {
                // Not loaded, or erased by NIXL (which may keep its
                // connection): the name is not used again, and the peer's
                // transfers carry their notification.
                tracing::debug!(%peer, %nixl_name, %error, "the serving agent cannot load the peer: its transfers carry their notification");
                lock(&self.peers).poison(nixl_name);
                lock(&self.notifiers).insert(nixl_name.to_owned(), None);
                return;
            }
            Err(error) if first => {
                tracing::debug!(%peer, %error, "the serving agent cannot load the peer: its transfers carry their notification");
                false
            }
            Err(error) => {
                // A transfer the serving agent cannot post goes through the
                // initiating agent instead (`post`).
                tracing::debug!(%peer, %error, "the serving agent cannot load more of the peer");
                return;
            }
        };
        // Loads of one peer may race: the agent has it if any load took.
        let mut notifiers = lock(&self.notifiers);
        let notifier = notifiers.entry(nixl_name.to_owned()).or_insert(None);
        if loaded && notifier.is_none() {
            *notifier = Some(Arc::new(AtomicBool::new(false)));
        }
    }

    /// How a transfer to the peer NIXL knows as `nixl_name` that notifies it
    /// goes out.
    fn route(&self, nixl_name: &str) -> Route {
        match lock(&self.notifiers).get(nixl_name) {
            Some(Some(proven)) if proven.load(Ordering::Acquire) => Route::Apart,
            Some(Some(proven)) => Route::Proving(Arc::clone(proven)),
            _ => Route::Attached,
        }
    }

    /// The names of this backend's agents, which no peer is loaded under.
    fn own_names(&self) -> Vec<String> {
        let mut own = vec![self.name.clone()];
        if self.live.notifies() {
            own.push(initiator_name(&self.name));
        }
        own
    }

    /// The name NIXL knows `peer` by.
    fn nixl_name(&self, peer: &str) -> String {
        lock(&self.peers).nixl_name(peer).unwrap_or(peer).to_owned()
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
            .initiating()
            .load_remote_md(blob)
            .map_err(|e| nixl_error(context(), e))?;
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

    /// After the initiating agent refused a blob of `peer` under
    /// `nixl_name`: if NIXL erased what it held for the peer (and may keep
    /// its connection, so that the name can never be loaded again), what it
    /// held is loaded again under a new name, so that the refused blob
    /// changes nothing.
    fn refused(&self, peer: &str, nixl_name: &str, own: &[&str]) {
        if own.contains(&nixl_name)
            || self
                .live
                .initiating()
                .check_remote_metadata(nixl_name, None)
        {
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
                if !self.live.initiating().check_remote_metadata(&fresh, None) {
                    lock(&self.peers).poison(&fresh);
                }
                lock(&self.peers).forgotten(peer, Some(fresh), own);
            }
        }
    }

    /// Unloads the name `nixl_name` from both agents.
    fn unload_name(&self, nixl_name: &str) -> std::result::Result<(), NixlError> {
        let notifier = lock(&self.notifiers).remove(nixl_name);
        if let Some(Some(_)) = notifier
            && let Err(error) = self.live.agent.invalidate_remote_md(nixl_name)
        {
            // The initiating agent's unload below is what the connector
            // relies on; the serving one only sent notifications.
            tracing::warn!(%nixl_name, %error, "unloading a peer from the serving agent failed");
        }
        self.live.initiating().invalidate_remote_md(nixl_name)
    }
}

fn malformed(error: agent_metadata::Malformed) -> Error {
    Error::InvalidMetadata {
        field: "nixl_metadata".into(),
        reason: error.to_string(),
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
            .agents()
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

    /// NIXL cannot bind an exposure to a notification key: `_key` is unused.
    unsafe fn expose(
        &self,
        regions: &[RegionId],
        access: OperationKind,
        _key: &[u8],
    ) -> Result<Exposure> {
        let segments = {
            let registered = lock(&self.regions);
            let mut segments = Vec::with_capacity(regions.len());
            for (index, id) in regions.iter().enumerate() {
                let region = registered.get(&id.0).ok_or_else(|| {
                    Error::backend(NAME, "expose", format!("region {} is not registered", id.0))
                })?;
                if access == OperationKind::Write && !region.writable {
                    return Err(Error::ReadOnlyBuffer { index });
                }
                segments.push(region.segment);
            }
            segments
        };
        let agent_metadata = match self.scope {
            MetadataScope::Agent => self
                .live
                .agent
                .get_local_md()
                .map_err(|e| nixl_error("get agent metadata", e))?,
            MetadataScope::Exposed if segments.is_empty() => self.connection_md()?,
            MetadataScope::Exposed => self.scoped_md(&segments)?,
        };
        // A peer may notify from now on: the watcher looks for notifications.
        self.live.kick(1);
        Ok(Exposure {
            id: ExposureId(self.id()),
            agent_metadata,
        })
    }

    fn revoke(&self, _exposure: ExposureId) -> Result<()> {
        // NIXL has no per-peer revocation (see `revocation_enforced`); the
        // watcher stops expecting this exposure's notification.
        self.live.kick(-1);
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
        let _loads = lock(&self.loading);
        let own = self.own_names();
        let own: Vec<&str> = own.iter().map(String::as_str).collect();
        let plan = lock(&self.peers)
            .plan(&md, &own)
            .map_err(|reason| Error::backend(NAME, format!("load peer {:?}", md.name), reason))?;
        match plan {
            Plan::Loaded => {}
            Plan::Merge { nixl_name } => {
                let blob = md.to_blob(&nixl_name);
                if let Err(error) = self.load(&blob, &md.name, &nixl_name) {
                    self.refused(&md.name, &nixl_name, &own);
                    return Err(error);
                }
                lock(&self.peers).merged(&md, &nixl_name);
                self.load_notifier(&md.name, &nixl_name, &blob);
            }
            Plan::Rename { nixl_name, md: all } => {
                tracing::info!(peer = %md.name, %nixl_name, "the peer changed the key of a region NIXL holds: loading it under a new name");
                let blob = all.to_blob(&nixl_name);
                if let Err(error) = self.load(&blob, &md.name, &nixl_name) {
                    // The peer's old name is untouched; the new one is not
                    // used again if NIXL may have kept a connection for it.
                    if !self
                        .live
                        .initiating()
                        .check_remote_metadata(&nixl_name, None)
                    {
                        lock(&self.peers).poison(&nixl_name);
                    }
                    return Err(error);
                }
                lock(&self.peers).renamed(&all, &nixl_name);
                self.load_notifier(&md.name, &nixl_name, &blob);
            }
        }
        Ok(md.name)
    }

    /// The name a well-formed blob gives; `None` for a malformed one, which
    /// names nobody.
    fn peer_name(&self, agent_metadata: &[u8]) -> Option<String> {
        AgentMetadata::parse(agent_metadata).ok().map(|md| md.name)
    }

    /// Unloads every name NIXL knows the peer by (its earlier ones too).
    fn unload_remote(&self, peer: &str) -> Result<()> {
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

    unsafe fn post(&self, request: &TransferRequest<'_>) -> Result<Posted> {
        let (op, verb) = match request.op {
            OperationKind::Read => (XferOp::Read, "READ"),
            OperationKind::Write => (XferOp::Write, "WRITE"),
        };
        let context = || {
            format!(
                "{verb} of {} bytes with {:?}",
                request.bytes(),
                request.peer
            )
        };
        let local = xfer_list(request.local, Side::Local)?;
        let remote = xfer_list(request.remote, Side::Remote)?;
        let mut args = OptArgs::new().map_err(|e| nixl_error(context(), e))?;
        let nixl_peer = self.nixl_name(request.peer);
        // Which agent posts, whether NIXL carries the notification, and the
        // notification the serving agent sends apart.
        let (mut via, attached, notify) = match request.notify.then(|| self.route(&nixl_peer)) {
            None => (Via::Initiating, false, None),
            Some(Route::Attached) => (Via::Initiating, true, None),
            Some(Route::Proving(proves)) => (Via::Serving { proves }, true, None),
            Some(Route::Apart) => (
                Via::Initiating,
                false,
                Some(Notify {
                    peer: nixl_peer.clone(),
                    payload: request.notification.into(),
                }),
            ),
        };
        if attached {
            args.set_notification_message(request.notification)
                .and_then(|()| args.set_has_notification(true))
                .map_err(|e| nixl_error(context(), e))?;
        }
        let create =
            |agent: &Agent| agent.create_xfer_req(op, &local, &remote, &nixl_peer, Some(&args));
        let mut created = create(self.live.posting(&via));
        if let (Via::Serving { .. }, Err(error)) = (&via, &created) {
            // The serving agent lacks some of the peer's regions (a load
            // failed there): through the initiating one, then.
            tracing::debug!(peer = %request.peer, %error, "the serving agent cannot post the transfer");
            via = Via::Initiating;
            created = create(self.live.initiating());
        }
        let xfer = created.map_err(|e| match e {
            NixlError::FailedToCreateXferRequest | NixlError::NotFound => Error::AccessDenied {
                backend: NAME,
                peer: request.peer.to_owned(),
                reason: format!(
                    "NIXL refused the {verb}: remote ranges are not inside regions the peer's metadata describes, or the peer is not loaded ({e})"
                ),
            },
            e => nixl_error(context(), e),
        })?;
        // A failed post may have started some of its work (a peer dying mid-copy
        // fails it halfway), so the request is kept like a running one: it is
        // reported failed, and released only once NIXL says it is not running.
        let (done, post_error) = match self.live.posting(&via).post_xfer_req(&xfer, None) {
            Ok(pending) => (!pending, None),
            Err(e) => (
                false,
                Some(Arc::new(nixl_error(format!("post {}", context()), e)) as SharedCause),
            ),
        };
        let id = self.id();
        lock(&self.live.transfers).insert(id, Transfer::new(xfer, via, post_error, notify));
        // Done at once: recorded, and a notification to send goes out now. A
        // failed post is reported once NIXL says the request is idle.
        let state = done
            .then(|| self.live.state(id, |_| {}))
            .flatten()
            .unwrap_or(TransferState::InProgress);
        // The initiating agent runs no NIXL thread: the watcher moves a
        // transfer on (and sends its notification) when nobody waits on it,
        // and leaves alone one that a waiting thread polls. A small one is
        // handed over only in `awaiting_end` (`WATCH_AT_POST`).
        if matches!(state, TransferState::InProgress) && request.bytes() > WATCH_AT_POST {
            self.live.kick(0);
        }
        Ok(Posted {
            id: TransferId(id),
            state,
        })
    }

    fn poll(&self, transfer: TransferId) -> TransferState {
        // A waiting thread polls (`wait_assist`): the watcher leaves the
        // transfer to it. (The connector's hook polls too, on the watcher.)
        let assisting = !crate::progress::on_watcher();
        self.live
            .state(transfer.0, |t| {
                if assisting {
                    t.assisted = Some(std::time::Instant::now());
                }
            })
            .unwrap_or_else(|| TransferState::failed(format!("unknown transfer {}", transfer.0)))
    }

    fn wait_assist(&self) -> Duration {
        crate::progress::WAIT_ASSIST
    }

    fn awaiting_end(&self, transfer: TransferId) {
        let unfinished = lock(&self.live.transfers)
            .get(&transfer.0)
            .is_some_and(|t| t.finished.is_none());
        if unfinished {
            self.live.kick(0);
        }
    }

    fn release(&self, transfer: TransferId) -> Result<Release> {
        // nixl-sys can abort only by dropping the request, and then NIXL does
        // not say whether the abort took. So a cancelled transfer is left to
        // finish (or fail) and released then: bounded, and sound. The watcher
        // (handed the transfer here, if nobody waited on it) signals when it
        // ends, and the connector asks again.
        match self.live.state(transfer.0, |_| {}) {
            None => return Ok(Release::LetGo),
            Some(TransferState::InProgress) => {
                self.live.kick(0);
                return Ok(Release::StillRunning);
            }
            Some(_) => {}
        }
        lock(&self.live.transfers).remove(&transfer.0);
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

    fn set_event_hook(&self, hook: EventHook) -> bool {
        if !self.live.set_hook(hook) {
            return false;
        }
        let live = Arc::clone(&self.live);
        let spawned = std::thread::Builder::new()
            .name(format!("nixl-watch-{}", self.name))
            .spawn(move || live.watch());
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parameter_for_a_plugin_not_loaded_is_refused() {
        // Refused before the runtime is loaded: no NIXL needed.
        let refused = |builder: NixlBackendBuilder| match builder.build() {
            Err(Error::Unsupported { what, .. }) => what,
            Err(other) => panic!("unexpected error: {other}"),
            Ok(_) => panic!("built an agent with a stray parameter"),
        };
        let what = refused(NixlBackend::builder("stray").plugin_param("LIBFABRIC", "k", "v"));
        assert!(
            what.contains("LIBFABRIC plugin") && what.ends_with("(plugins: UCX)"),
            "{what}"
        );
        // UCX's setting, with UCX replaced by another plugin.
        let what = refused(
            NixlBackend::builder("stray")
                .plugin("POSIX")
                .peer_failure_detection(false),
        );
        assert!(
            what.contains("\"ucx_error_handling_mode\" for the UCX plugin")
                && what.ends_with("(plugins: POSIX)"),
            "{what}"
        );
    }

    #[test]
    fn peer_failure_detection_sets_ucx_error_handling_mode() {
        if !test_support::runtime_available() {
            return;
        }
        let mode_of = |builder: NixlBackendBuilder| {
            let backend = builder.build().unwrap();
            assert_eq!(backend.plugin_params("POSIX").unwrap(), None);
            let params = backend.plugin_params("UCX").unwrap().unwrap();
            params
                .into_iter()
                .find(|(key, _)| key == "ucx_error_handling_mode")
                .map(|(_, value)| value)
        };
        let name = |tag: &str| format!("errmode-{tag}-{}", std::process::id());
        let builder = |tag: &str| NixlBackend::builder(&name(tag));
        assert_eq!(mode_of(builder("default")).as_deref(), Some("peer"));
        let off = builder("off").peer_failure_detection(false);
        assert_eq!(mode_of(off).as_deref(), Some("none"));
        let on = builder("on").peer_failure_detection(true);
        assert_eq!(mode_of(on).as_deref(), Some("peer"));
        // The later setting wins.
        let raw = builder("raw").peer_failure_detection(false).plugin_param(
            "UCX",
            "ucx_error_handling_mode",
            "peer",
        );
        assert_eq!(mode_of(raw).as_deref(), Some("peer"));
    }

    #[test]
    fn rocm_memory_is_unsupported() {
        assert!(matches!(
            mem_of(Device::rocm(0)),
            Err(Error::Unsupported { .. })
        ));
        assert_eq!(mem_of(Device::cuda(3)).ok().map(|(_, d)| d), Some(3));
    }
}
