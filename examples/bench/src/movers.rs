//! The ways of moving the same bytes that the bench compares: memcpy, the
//! public API, and raw nixl-sys, with a request built per transfer
//! ([`RawNixl`]) or from lists prepared once ([`RawPrepped`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use backend_loopback::{Fabric, LoopbackBackend};
use backend_nixl::NixlBackend;
use std::num::NonZeroUsize;

use descriptor_core::{BlockPool, Connector, Descriptor};
use nixl_sys::{
    Agent, AgentConfig, MemType, MemoryRegion, NixlDescriptor, NotificationMap, OptArgs,
    RegistrationHandle, XferDescList, XferDlistHandle, XferOp, XferRequest, XferStatus,
};

pub(crate) type Res<T> = Result<T, String>;

/// Read: the passive side's bytes land in the active side's buffers.
/// Write: the active side's bytes land in the passive side's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

pub(crate) trait Mover {
    fn name(&self) -> &'static str;
    /// Allocates (and registers) `blocks` buffers of `block` bytes per side.
    fn prepare(&mut self, op: Op, block: usize, blocks: usize) -> Res<()>;
    /// One transfer; the time until the initiator knows it is complete.
    fn run(&mut self, op: Op) -> Res<Duration>;
    /// Whether the destination now equals the source.
    fn verify(&self, op: Op) -> bool;
    /// Backend memory registrations this mover has made so far, both sides
    /// counted (`register_memory` calls), or `None` where it does not count
    /// them. The bench reports the registrations made during the timed
    /// transfers, per transfer.
    fn registrations(&self) -> Option<u64> {
        None
    }
    /// Whether the bench measures this mover at `blocks` x `block` B
    /// (default: at every size of the run).
    fn measures(&self, block: usize, blocks: usize) -> bool {
        let _ = (block, blocks);
        true
    }
}

/// Whether the prepared-list baselines are measured at `blocks` x `block`
/// B: blocks up to 64 KiB, transfers up to 16 MiB. They are there for the
/// cost per block (4 KiB x 1 to x 4096, 64 KiB x 16 and x 256), which at
/// larger blocks is lost in the cost per byte, while each such row costs the
/// bench seconds (the four movers at 1 MiB x 16 and 16 MiB x 1 took about
/// half their time in the quick bench).
pub(crate) fn prepped_measures(block: usize, blocks: usize) -> bool {
    block <= 64 << 10 && block * blocks <= 16 << 20
}

pub(crate) use test_support::pattern as fill;

pub(crate) fn blocks(fill_seed: Option<u64>, block: usize, blocks: usize) -> Vec<Vec<u8>> {
    (0..blocks)
        .map(|i| match fill_seed {
            Some(seed) => fill(seed + i as u64, block),
            None => vec![0u8; block],
        })
        .collect()
}

/// (source seed for the passive side, for the active side)
pub(crate) fn seeds(op: Op) -> (Option<u64>, Option<u64>) {
    match op {
        Op::Read => (Some(1), None),
        Op::Write => (None, Some(2)),
    }
}

/// `memcpy` of the same bytes: the ceiling.
#[derive(Default)]
pub(crate) struct Memcpy {
    src: Vec<Vec<u8>>,
    dst: Vec<Vec<u8>>,
}

impl Mover for Memcpy {
    fn name(&self) -> &'static str {
        "memcpy"
    }
    fn prepare(&mut self, _op: Op, block: usize, n: usize) -> Res<()> {
        self.src = blocks(Some(3), block, n);
        self.dst = blocks(None, block, n);
        Ok(())
    }
    fn run(&mut self, _op: Op) -> Res<Duration> {
        let started = Instant::now();
        for (d, s) in self.dst.iter_mut().zip(&self.src) {
            d.copy_from_slice(s);
        }
        std::hint::black_box(&mut self.dst);
        Ok(started.elapsed())
    }
    fn verify(&self, _op: Op) -> bool {
        self.src == self.dst
    }
}

/// `memcpy-scattered`: `memcpy` of the same blocks as the scattered pooled
/// and prepared-list rows, where they lie: every other block of an arena per
/// side (the blocks of [`Memcpy`] lie wherever the allocator put them, next
/// to each other as a rule, which caches and prefetchers favour).
pub(crate) struct MemcpyScattered {
    layout: Option<Layout>,
    src: Buf,
    dst: Buf,
}

impl MemcpyScattered {
    pub(crate) fn new() -> MemcpyScattered {
        MemcpyScattered {
            layout: None,
            src: Buf(Vec::new()),
            dst: Buf(Vec::new()),
        }
    }

    fn copies(&self) -> impl Iterator<Item = std::ops::Range<usize>> + use<> {
        let layout = self.layout;
        layout
            .into_iter()
            .flat_map(|l| l.ranges(0).map(|(start, len)| start..start + len))
    }
}

impl Mover for MemcpyScattered {
    fn name(&self) -> &'static str {
        "memcpy-scattered"
    }
    fn prepare(&mut self, _op: Op, block: usize, n: usize) -> Res<()> {
        let layout = Layout::new(block, n, 2)?;
        self.src = layout.arena(Some(3));
        self.dst = layout.arena(None);
        self.layout = Some(layout);
        Ok(())
    }
    fn run(&mut self, _op: Op) -> Res<Duration> {
        let started = Instant::now();
        for range in self.copies() {
            self.dst.0[range.clone()].copy_from_slice(&self.src.0[range]);
        }
        std::hint::black_box(&mut self.dst);
        Ok(started.elapsed())
    }
    fn verify(&self, _op: Op) -> bool {
        self.copies()
            .all(|r| self.dst.0[r.clone()] == self.src.0[r])
    }
    fn measures(&self, block: usize, blocks: usize) -> bool {
        prepped_measures(block, blocks)
    }
}

/// Set by `--no-peer-failure-detection`: every NIXL agent of the run, ours
/// and raw, on both sides of the cross-process rows, is built with UCX's
/// error handling mode `none` instead of NIXL's default, `peer`.
static NO_PEER_FAILURE_DETECTION: AtomicBool = AtomicBool::new(false);

/// Builds this run's NIXL agents without peer-failure detection.
pub(crate) fn without_peer_failure_detection() {
    NO_PEER_FAILURE_DETECTION.store(true, Ordering::Relaxed);
}

/// Whether this run's NIXL agents detect a dead peer (NIXL's default).
pub(crate) fn peer_failure_detection() -> bool {
    !NO_PEER_FAILURE_DETECTION.load(Ordering::Relaxed)
}

/// NIXL's UCX parameters for a raw agent, with this run's error handling mode.
pub(crate) fn raw_ucx_params(agent: &Agent) -> Res<nixl_sys::Params> {
    let (_, mut params) = agent.get_plugin_params("UCX").map_err(nixl("params"))?;
    if !peer_failure_detection() {
        params
            .set("ucx_error_handling_mode", "none")
            .map_err(nixl("params"))?;
    }
    Ok(params)
}

/// A connector over our NIXL backend: an agent called `agent`, with or
/// without NIXL's progress thread, the other settings the defaults (but for
/// this run's peer-failure detection).
pub(crate) fn nixl_connector(agent: &str, progress_thread: bool) -> Res<Connector> {
    nixl_backend(agent, progress_thread).map(Connector::new)
}

/// The backend of [`nixl_connector`].
pub(crate) fn nixl_backend(agent: &str, progress_thread: bool) -> Res<NixlBackend> {
    NixlBackend::builder(agent)
        .progress_thread(progress_thread)
        .peer_failure_detection(peer_failure_detection())
        .build()
        .map_err(|e| e.to_string())
}

/// The public API over a backend: passive operation, active operation, waits.
pub(crate) struct Api {
    name: &'static str,
    passive: Connector,
    active: Connector,
    passive_descs: Vec<Descriptor>,
    active_descs: Vec<Descriptor>,
    /// How the active side waits: `wait()` (the default), or awaiting its
    /// completion future on a thread-parking executor.
    pub(crate) awaiting: bool,
    /// `Some(stride)`: the blocks are views of one `BlockPool` per side,
    /// block `i` at slot `i * stride` (1: contiguous runs, which the
    /// backend moves as one descriptor; 2: every other block, scattered);
    /// `None`: a buffer registered per block.
    pool: Option<usize>,
}

impl Api {
    pub(crate) fn loopback() -> Res<Api> {
        let fabric = Fabric::new();
        let make = |n| {
            LoopbackBackend::new(&fabric, n)
                .map(Connector::new)
                .map_err(|e| e.to_string())
        };
        Ok(Api::new(
            "loopback",
            make("bench-passive")?,
            make("bench-active")?,
        ))
    }

    pub(crate) fn nixl() -> Res<Api> {
        Api::nixl_with("nixl", true)
    }

    /// `nixl-pool` (stride 1) and `nixl-pool-scattered` (stride 2): our
    /// API over views of one registered pool per side.
    pub(crate) fn nixl_pool(name: &'static str, stride: usize) -> Res<Api> {
        let mut api = Api::nixl_with(name, true)?;
        api.pool = Some(stride);
        Ok(api)
    }

    /// `loopback-pool` (stride 1) and `loopback-pool-scattered` (stride 2).
    pub(crate) fn loopback_pool(name: &'static str, stride: usize) -> Res<Api> {
        let mut api = Api::loopback()?;
        api.name = name;
        api.pool = Some(stride);
        Ok(api)
    }

    /// `nixl-no-thread`: both agents without NIXL's progress thread, as the
    /// in-process raw baseline runs: what that thread costs in process.
    pub(crate) fn nixl_without_thread() -> Res<Api> {
        Api::nixl_with("nixl-no-thread", false)
    }

    fn nixl_with(name: &'static str, progress_thread: bool) -> Res<Api> {
        let make = |side: &str| nixl_connector(&format!("{name}-{side}"), progress_thread);
        Ok(Api::new(name, make("passive")?, make("active")?))
    }

    fn new(name: &'static str, passive: Connector, active: Connector) -> Api {
        Api {
            name,
            passive,
            active,
            passive_descs: Vec::new(),
            active_descs: Vec::new(),
            awaiting: false,
            pool: None,
        }
    }

    fn registered(c: &Connector, bufs: Vec<Vec<u8>>) -> Res<Vec<Descriptor>> {
        bufs.into_iter()
            .map(|b| {
                let mut d = Descriptor::new(b).map_err(|e| e.to_string())?;
                d.register_memory(c).map_err(|e| e.to_string())?;
                Ok(d)
            })
            .collect()
    }
}

impl Mover for Api {
    fn name(&self) -> &'static str {
        self.name
    }

    fn prepare(&mut self, op: Op, block: usize, n: usize) -> Res<()> {
        let (p, a) = seeds(op);
        // The previous size's views (and with them its pools) go first.
        self.passive_descs.clear();
        self.active_descs.clear();
        match self.pool {
            None => {
                self.passive_descs = Api::registered(&self.passive, blocks(p, block, n))?;
                self.active_descs = Api::registered(&self.active, blocks(a, block, n))?;
            }
            Some(stride) => {
                let layout = Layout::new(block, n, stride)?;
                self.passive_descs = pool_views(&self.passive, layout, p)?;
                self.active_descs = pool_views(&self.active, layout, a)?;
            }
        }
        Ok(())
    }

    fn run(&mut self, op: Op) -> Res<Duration> {
        let e = |e: descriptor_core::Error| e.to_string();
        let passive = std::mem::take(&mut self.passive_descs);
        let active = std::mem::take(&mut self.active_descs);
        // Timed: from the active side's begin_* until its waiter knows the
        // transfer is complete (the passive side prepares its operation first,
        // as the raw baseline loads the metadata once, untimed).
        let (elapsed, p, a) = match op {
            Op::Read => {
                let readable = self.passive.create_readable(passive).map_err(e)?;
                let started = Instant::now();
                let read = self
                    .active
                    .begin_read(readable.metadata(), active)
                    .map_err(e)?;
                if self.awaiting {
                    futures::executor::block_on(read.completion()).map_err(e)?;
                } else {
                    read.wait().map_err(e)?;
                }
                let elapsed = started.elapsed();
                readable.wait().map_err(e)?;
                (
                    elapsed,
                    readable.into_descriptors().ok(),
                    read.into_descriptors().ok(),
                )
            }
            Op::Write => {
                let writable = self.passive.create_writable(passive).map_err(e)?;
                let started = Instant::now();
                let write = self
                    .active
                    .begin_write(active, writable.metadata())
                    .map_err(e)?;
                if self.awaiting {
                    futures::executor::block_on(write.completion()).map_err(e)?;
                } else {
                    write.wait().map_err(e)?;
                }
                let elapsed = started.elapsed();
                writable.wait().map_err(e)?;
                (
                    elapsed,
                    writable.into_descriptors().ok(),
                    write.into_descriptors().ok(),
                )
            }
        };
        self.passive_descs = p.ok_or("passive buffers not returned")?;
        self.active_descs = a.ok_or("active buffers not returned")?;
        Ok(elapsed)
    }

    fn verify(&self, _op: Op) -> bool {
        self.passive_descs
            .iter()
            .zip(&self.active_descs)
            .all(|(p, a)| p.as_slice() == a.as_slice())
    }

    fn registrations(&self) -> Option<u64> {
        Some(self.passive.registrations() + self.active.registrations())
    }

    fn measures(&self, block: usize, blocks: usize) -> bool {
        self.pool.is_none() || prepped_measures(block, blocks)
    }
}

/// One `BlockPool` registered with `connector` over an arena of `layout`
/// (block `i` holding the test bytes of `seed + i`), and a view of each of
/// its blocks, in order: what the pooled movers move. The views keep the
/// pool registered.
pub(crate) fn pool_views(
    connector: &Connector,
    layout: Layout,
    seed: Option<u64>,
) -> Res<Vec<Descriptor>> {
    let e = |e: descriptor_core::Error| e.to_string();
    let block = NonZeroUsize::new(layout.block).ok_or("empty blocks")?;
    let pool = BlockPool::new(connector, layout.arena(seed).0, block).map_err(e)?;
    let indices: Vec<usize> = (0..layout.blocks).map(|i| i * layout.stride).collect();
    pool.checkout_blocks(&indices).map_err(e)
}

impl Api {
    /// CRC-32 of the buffers the last transfer wrote into.
    pub(crate) fn destination_crc(&self, op: Op) -> u32 {
        test_support::crc32_of(match op {
            Op::Read => &self.active_descs,
            Op::Write => &self.passive_descs,
        })
    }
}

/// A host buffer described to nixl-sys.
#[derive(Debug)]
pub(crate) struct Buf(pub(crate) Vec<u8>);

impl Buf {
    /// Its first byte's address.
    pub(crate) fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

impl MemoryRegion for Buf {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn size(&self) -> usize {
        self.0.len()
    }
}

impl NixlDescriptor for Buf {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }
    fn device_id(&self) -> u64 {
        0
    }
}

/// The same transfer written directly against nixl-sys, as well as we can:
/// metadata loaded once, one request per transfer, polled with a yield, the
/// passive agent progressed in the same loop, and no progress threads (ours
/// runs NIXL's in both agents by default; `nixl-sys-raw-thread` runs them).
pub(crate) struct RawNixl {
    name: &'static str,
    active: Agent,
    passive: Agent,
    peer: String,
    // Registrations before buffers: dropping a handle deregisters.
    handles: Vec<RegistrationHandle>,
    passive_bufs: Vec<Buf>,
    active_bufs: Vec<Buf>,
    /// `register_memory` calls so far, both agents.
    registered: u64,
}

pub(crate) fn nixl(context: &str) -> impl Fn(nixl_sys::NixlError) -> String + '_ {
    move |e| format!("{context}: {e}")
}

impl RawNixl {
    pub(crate) fn new() -> Res<RawNixl> {
        RawNixl::with("nixl-sys-raw", false)
    }

    /// `nixl-sys-raw-thread`: both agents with NIXL's progress thread, at
    /// ours' default delay; the loop still polls the target too.
    pub(crate) fn with_progress_threads() -> Res<RawNixl> {
        RawNixl::with("nixl-sys-raw-thread", true)
    }

    fn with(name: &'static str, progress_thread: bool) -> Res<RawNixl> {
        let agent = |side: &str| raw_in_process_agent(&format!("{name}-{side}"), progress_thread);
        Ok(RawNixl {
            name,
            active: agent("active")?,
            passive: agent("passive")?,
            peer: String::new(),
            handles: Vec::new(),
            passive_bufs: Vec::new(),
            active_bufs: Vec::new(),
            registered: 0,
        })
    }
}

/// The configuration of the in-process raw agents: no progress thread unless
/// asked (then at ours' default delay), strict thread sync.
fn raw_in_process_agent(name: &str, progress_thread: bool) -> Res<Agent> {
    backend_nixl::runtime::load().map_err(|e| e.to_string())?;
    let config = AgentConfig {
        enable_prog_thread: progress_thread,
        pthr_delay_us: 100_000,
        thread_sync: nixl_sys::ThreadSync::Strict,
        ..AgentConfig::default()
    };
    let a = Agent::new_configured(name, &config).map_err(nixl("agent"))?;
    a.create_backend("UCX", &raw_ucx_params(&a)?)
        .map_err(nixl("backend"))?;
    Ok(a)
}

/// A DRAM transfer list of (address, length) ranges, for the raw baselines.
fn dram_list(ranges: impl IntoIterator<Item = (usize, usize)>) -> Res<XferDescList<'static>> {
    let mut list = XferDescList::new(MemType::Dram).map_err(nixl("list"))?;
    for (addr, len) in ranges {
        list.add_desc(addr, len, 0);
    }
    Ok(list)
}

/// The ranges of host buffers.
pub(crate) fn ranges(bufs: &[Buf]) -> impl Iterator<Item = (usize, usize)> + '_ {
    bufs.iter().map(|b| (b.0.as_ptr() as usize, b.0.len()))
}

/// One request as the raw baselines build it: per transfer, with the
/// notification attached, as the Dynamo protocol needs.
pub(crate) fn raw_request(
    agent: &Agent,
    op: Op,
    (local, remote): (
        impl IntoIterator<Item = (usize, usize)>,
        impl IntoIterator<Item = (usize, usize)>,
    ),
    peer: &str,
    notification: &[u8],
) -> Res<XferRequest> {
    let (local, remote) = (dram_list(local)?, dram_list(remote)?);
    let args = notifying(notification)?;
    agent
        .create_xfer_req(xfer_op(op), &local, &remote, peer, Some(&args))
        .map_err(nixl("create"))
}

/// Request arguments that attach `notification` to the transfer.
fn notifying(notification: &[u8]) -> Res<OptArgs> {
    let mut args = OptArgs::new().map_err(nixl("args"))?;
    args.set_notification_message(notification)
        .map_err(nixl("notif"))?;
    args.set_has_notification(true).map_err(nixl("notif"))?;
    Ok(args)
}

fn xfer_op(op: Op) -> XferOp {
    match op {
        Op::Read => XferOp::Read,
        Op::Write => XferOp::Write,
    }
}

/// Lists prepared once (`prepare_xfer_dlist`) on the initiating agent: its
/// own blocks, and the peer's.
///
/// An [`XferDlistHandle`] keeps only a bare pointer to the agent that made
/// it (its drop releases the list through that agent), so these must be
/// dropped before that agent; and the remote list before the peer's metadata
/// is invalidated. The movers holding one declare it before their agents and
/// registrations (fields drop in declaration order) and drop it first when
/// they prepare again.
pub(crate) struct Prepared {
    local: XferDlistHandle,
    remote: XferDlistHandle,
}

impl Prepared {
    /// Prepares `local` (ranges in `agent`'s own registered memory) and
    /// `remote` (ranges in `peer`'s, whose metadata `agent` has loaded).
    pub(crate) fn new(
        agent: &Agent,
        local: impl IntoIterator<Item = (usize, usize)>,
        peer: &str,
        remote: impl IntoIterator<Item = (usize, usize)>,
    ) -> Res<Prepared> {
        let (local, remote) = (dram_list(local)?, dram_list(remote)?);
        Ok(Prepared {
            // NIXL_INIT_AGENT ("") names the initiator's own descriptors.
            local: agent
                .prepare_xfer_dlist("", &local, None)
                .map_err(nixl("prepare local list"))?,
            remote: agent
                .prepare_xfer_dlist(peer, &remote, None)
                .map_err(nixl("prepare remote list"))?,
        })
    }

    /// One request from the prepared lists, per transfer: entries `indices`
    /// of each, the notification attached, as the Dynamo protocol needs.
    pub(crate) fn request(
        &self,
        agent: &Agent,
        op: Op,
        indices: &[i32],
        notification: &[u8],
    ) -> Res<XferRequest> {
        let args = notifying(notification)?;
        agent
            .make_xfer_req(
                xfer_op(op),
                &self.local,
                indices,
                &self.remote,
                indices,
                Some(&args),
            )
            .map_err(nixl("make"))
    }
}

/// Seed of the bytes between the scattered blocks, the same on both sides,
/// so a transfer that reads or writes a gap changes what [`Layout`]'s arenas
/// compare.
const GAP_SEED: u64 = 0x6A9;

/// Where the prepared-list baselines keep their blocks: one arena per side,
/// block `i` at `i * stride * block` (stride 1: contiguous; 2: every other
/// block, so no two are neighbours).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    block: usize,
    blocks: usize,
    stride: usize,
}

impl Layout {
    pub(crate) fn new(block: usize, blocks: usize, stride: usize) -> Res<Layout> {
        if block == 0 || blocks == 0 || stride == 0 {
            return Err(format!(
                "an arena of {blocks} x {block} B at stride {stride} is empty"
            ));
        }
        i32::try_from(blocks).map_err(|_| format!("{blocks} blocks: too many to index"))?;
        Ok(Layout {
            block,
            blocks,
            stride,
        })
    }

    /// An arena: block `i` the test bytes of `seed + i` (zeros without a
    /// seed), as [`blocks`] fills them; the gaps between, the same bytes on
    /// every side.
    pub(crate) fn arena(&self, seed: Option<u64>) -> Buf {
        let mut bytes = vec![0u8; self.block * self.blocks * self.stride];
        for (slot, chunk) in bytes.chunks_exact_mut(self.block).enumerate() {
            let (i, gap) = (slot / self.stride, slot % self.stride != 0);
            match (gap, seed) {
                (true, _) => chunk.copy_from_slice(&fill(GAP_SEED + slot as u64, self.block)),
                (false, Some(seed)) => chunk.copy_from_slice(&fill(seed + i as u64, self.block)),
                (false, None) => {}
            }
        }
        Buf(bytes)
    }

    /// The blocks' (address, length) in an arena at `base`.
    pub(crate) fn ranges(&self, base: usize) -> impl Iterator<Item = (usize, usize)> + use<> {
        let Layout {
            block,
            blocks,
            stride,
        } = *self;
        (0..blocks).map(move |i| (base + i * stride * block, block))
    }

    /// Every block's index in the prepared lists, in order.
    pub(crate) fn indices(&self) -> Vec<i32> {
        // `new` checked that the count fits.
        (0..self.blocks)
            .map(|i| i32::try_from(i).unwrap_or(i32::MAX))
            .collect()
    }
}

impl Mover for RawNixl {
    fn name(&self) -> &'static str {
        self.name
    }

    fn prepare(&mut self, op: Op, block: usize, n: usize) -> Res<()> {
        self.handles.clear();
        let (p, a) = seeds(op);
        self.passive_bufs = blocks(p, block, n).into_iter().map(Buf).collect();
        self.active_bufs = blocks(a, block, n).into_iter().map(Buf).collect();
        for (agent, bufs) in [
            (&self.passive, &self.passive_bufs),
            (&self.active, &self.active_bufs),
        ] {
            for b in bufs {
                let handle = agent.register_memory(b, None).map_err(nixl("register"))?;
                self.handles.push(handle);
                self.registered += 1;
            }
        }
        let md = self.passive.get_local_md().map_err(nixl("md"))?;
        self.peer = self.active.load_remote_md(&md).map_err(nixl("load"))?;
        Ok(())
    }

    fn run(&mut self, op: Op) -> Res<Duration> {
        let started = Instant::now();
        let req = raw_request(
            &self.active,
            op,
            (ranges(&self.active_bufs), ranges(&self.passive_bufs)),
            &self.peer,
            b"raw-bench",
        )?;
        completed_in_process(&self.active, &self.passive, req, started)
    }

    fn verify(&self, _op: Op) -> bool {
        self.passive_bufs
            .iter()
            .zip(&self.active_bufs)
            .all(|(p, a)| p.0 == a.0)
    }

    fn registrations(&self) -> Option<u64> {
        Some(self.registered)
    }
}

/// Posts `req` on `active` and polls it to completion, progressing `passive`
/// (the target, in the same process) in the same loop; returns the time from
/// `started` until the initiator knew, then waits (untimed) for the target's
/// notification.
fn completed_in_process(
    active: &Agent,
    passive: &Agent,
    req: XferRequest,
    started: Instant,
) -> Res<Duration> {
    let mut notifs = NotificationMap::new().map_err(nixl("map"))?;
    let mut got = 0;
    if active.post_xfer_req(&req, None).map_err(nixl("post"))? {
        while active.get_xfer_status(&req).map_err(nixl("status"))? == XferStatus::InProgress {
            // The target must progress too (connection wire-up, notifications).
            passive
                .get_notifications(&mut notifs, None)
                .map_err(nixl("notifs"))?;
            got += notifs.len().map_err(nixl("len"))?;
            std::thread::yield_now();
        }
    }
    let elapsed = started.elapsed();
    drop(req);
    let deadline = Instant::now() + Duration::from_secs(30);
    while got == 0 {
        if Instant::now() > deadline {
            return Err("raw: no notification".into());
        }
        let mut fresh = NotificationMap::new().map_err(nixl("map"))?;
        passive
            .get_notifications(&mut fresh, None)
            .map_err(nixl("notifs"))?;
        got += fresh.len().map_err(nixl("len"))?;
    }
    Ok(elapsed)
}

/// `nixl-sys-raw-prepped` and `nixl-sys-raw-prepped-scattered`: raw nixl-sys
/// as [`RawNixl`] (both agents in this process, no progress threads, the
/// target progressed in the initiator's poll loop), but with one registered
/// arena per side and the transfer lists prepared once: at prepare time one
/// `register_memory` per side and `prepare_xfer_dlist` for the initiator's
/// blocks and the target's; per transfer only `make_xfer_req` over every
/// block's index, post and poll. Contiguous, NIXL merges neighbouring blocks
/// into one descriptor; scattered (every other block of an arena twice the
/// size), it cannot.
pub(crate) struct RawPrepped {
    name: &'static str,
    stride: usize,
    // Fields drop in declaration order: the prepared lists before the
    // agents (see `Prepared`), the registrations before their arenas.
    lists: Option<Prepared>,
    handles: Vec<RegistrationHandle>,
    passive_arena: Buf,
    active_arena: Buf,
    indices: Vec<i32>,
    peer: String,
    /// `register_memory` calls so far, both agents.
    registered: u64,
    active: Agent,
    passive: Agent,
}

impl RawPrepped {
    /// `nixl-sys-raw-prepped`: the blocks contiguous.
    pub(crate) fn contiguous() -> Res<RawPrepped> {
        RawPrepped::with("nixl-sys-raw-prepped", 1)
    }

    /// `nixl-sys-raw-prepped-scattered`: every other block of the arena.
    pub(crate) fn scattered() -> Res<RawPrepped> {
        RawPrepped::with("nixl-sys-raw-prepped-scattered", 2)
    }

    fn with(name: &'static str, stride: usize) -> Res<RawPrepped> {
        let agent = |side: &str| raw_in_process_agent(&format!("{name}-{side}"), false);
        Ok(RawPrepped {
            name,
            stride,
            lists: None,
            handles: Vec::new(),
            passive_arena: Buf(Vec::new()),
            active_arena: Buf(Vec::new()),
            indices: Vec::new(),
            peer: String::new(),
            registered: 0,
            active: agent("active")?,
            passive: agent("passive")?,
        })
    }
}

impl Mover for RawPrepped {
    fn name(&self) -> &'static str {
        self.name
    }

    fn prepare(&mut self, op: Op, block: usize, n: usize) -> Res<()> {
        // The remote list before the peer's metadata is invalidated, both
        // before the registrations they point into.
        self.lists = None;
        if !self.peer.is_empty() {
            self.active
                .invalidate_remote_md(&self.peer)
                .map_err(nixl("invalidate"))?;
            self.peer.clear();
        }
        self.handles.clear();
        let layout = Layout::new(block, n, self.stride)?;
        let (p, a) = seeds(op);
        self.passive_arena = layout.arena(p);
        self.active_arena = layout.arena(a);
        for (agent, arena) in [
            (&self.passive, &self.passive_arena),
            (&self.active, &self.active_arena),
        ] {
            let handle = agent
                .register_memory(arena, None)
                .map_err(nixl("register"))?;
            self.handles.push(handle);
            self.registered += 1;
        }
        let md = self.passive.get_local_md().map_err(nixl("md"))?;
        self.peer = self.active.load_remote_md(&md).map_err(nixl("load"))?;
        self.lists = Some(Prepared::new(
            &self.active,
            layout.ranges(self.active_arena.addr()),
            &self.peer,
            layout.ranges(self.passive_arena.addr()),
        )?);
        self.indices = layout.indices();
        Ok(())
    }

    fn run(&mut self, op: Op) -> Res<Duration> {
        let lists = self.lists.as_ref().ok_or("run before prepare")?;
        let started = Instant::now();
        let req = lists.request(&self.active, op, &self.indices, b"raw-prepped")?;
        completed_in_process(&self.active, &self.passive, req, started)
    }

    /// The whole arenas: the blocks moved, and the gaps between untouched.
    fn verify(&self, _op: Op) -> bool {
        self.passive_arena.0 == self.active_arena.0
    }

    fn registrations(&self) -> Option<u64> {
        Some(self.registered)
    }

    fn measures(&self, block: usize, blocks: usize) -> bool {
        prepped_measures(block, blocks)
    }
}

/// Another mover's twin under another name: a second, independent instance
/// of the same baseline, taking its own turn. The ratio between the two is
/// what the bench's interleaving cannot tell apart from noise.
pub(crate) struct Twin {
    inner: Box<dyn Mover>,
    name: &'static str,
}

impl Twin {
    pub(crate) fn new(inner: impl Mover + 'static, name: &'static str) -> Twin {
        Twin {
            inner: Box::new(inner),
            name,
        }
    }
}

impl Mover for Twin {
    fn name(&self) -> &'static str {
        self.name
    }
    fn prepare(&mut self, op: Op, block: usize, blocks: usize) -> Res<()> {
        self.inner.prepare(op, block, blocks)
    }
    fn run(&mut self, op: Op) -> Res<Duration> {
        self.inner.run(op)
    }
    fn verify(&self, op: Op) -> bool {
        self.inner.verify(op)
    }
    fn registrations(&self) -> Option<u64> {
        self.inner.registrations()
    }
    fn measures(&self, block: usize, blocks: usize) -> bool {
        self.inner.measures(block, blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scattered_arena_has_its_blocks_every_other_slot_and_the_same_gaps_on_every_side() {
        let layout = Layout::new(8, 3, 2).unwrap();
        let (src, dst) = (layout.arena(Some(5)), layout.arena(None));
        assert_eq!(src.0.len(), 48);
        let ranges: Vec<_> = layout.ranges(1000).collect();
        assert_eq!(ranges, [(1000, 8), (1016, 8), (1032, 8)]);
        for (i, (at, len)) in layout.ranges(0).enumerate() {
            // The blocks hold what `blocks` would give them, or zeros.
            assert_eq!(src.0[at..at + len], fill(5 + i as u64, 8)[..]);
            assert!(dst.0[at..at + len].iter().all(|&b| b == 0));
            // The gap after each block is the same on both sides, not zeros.
            let gap = at + len..at + 2 * len;
            assert_eq!(src.0[gap.clone()], dst.0[gap.clone()]);
            assert!(src.0[gap].iter().any(|&b| b != 0));
        }
        assert_eq!(layout.indices(), [0, 1, 2]);
    }

    #[test]
    fn the_prepared_list_movers_run_at_small_blocks_up_to_16_mib() {
        let kib = 1 << 10;
        for n in [1, 16, 256, 1024, 4096] {
            assert!(prepped_measures(4 * kib, n), "4 KiB x {n}");
        }
        assert!(prepped_measures(64 * kib, 16) && prepped_measures(64 * kib, 256));
        assert!(!prepped_measures(64 * kib, 1024), "64 MiB");
        assert!(!prepped_measures(1 << 20, 1) && !prepped_measures(16 << 20, 1));
    }

    #[test]
    fn a_contiguous_arena_is_the_blocks_back_to_back() {
        let layout = Layout::new(16, 4, 1).unwrap();
        let arena = layout.arena(Some(1));
        let blocks: Vec<u8> = blocks(Some(1), 16, 4).concat();
        assert_eq!(arena.0, blocks);
        assert_eq!(
            layout.ranges(0).map(|r| r.0).collect::<Vec<_>>(),
            [0, 16, 32, 48]
        );
        for empty in [(0, 1, 1), (1, 0, 1), (1, 1, 0)] {
            assert!(Layout::new(empty.0, empty.1, empty.2).is_err());
        }
    }
}
