//! Cross-process rows: the passive side runs in a child process (this bench
//! binary again, `--peer api|api-no-thread|raw`), as in a real deployment,
//! where the initiator cannot drive the target's progress.
//!
//! - `nixl-xproc`: our API on both sides (NIXL backend, defaults).
//! - `nixl-xproc-no-thread` (only by name): the same without NIXL's progress
//!   thread on either side.
//! - `nixl-sys-raw-xproc`: nixl-sys written as a user would across processes:
//!   the target with NIXL's progress thread (10 ms delay), the metadata loaded
//!   once, one request built per transfer with the notification attached (the
//!   Dynamo protocol needs it), the initiator polling its status with a yield.
//!   Its target looks for the notification only after the transfer (`sync`),
//!   so it is idle while the transfer runs.
//! - `nixl-sys-raw-xproc-waiting` (only by name): the same, but its target
//!   already waits for the notification while the transfer runs (`arm`),
//!   polling NIXL for it with a yield, as NIXL's examples wait: the state
//!   ours' passive side is in, since it waits from the moment it exposes.
//! - `nixl-sys-raw-prepped-xproc` and `nixl-sys-raw-prepped-scattered-xproc`:
//!   `nixl-sys-raw-xproc` with one registered arena per side (the target's
//!   from `arena`) and the transfer lists prepared once on the initiator; per
//!   transfer only `make_xfer_req` from the blocks' indices. Contiguous
//!   blocks, or every other block of an arena twice the size.
//!
//! Timed, as in-process: from the initiator's first call until it knows the
//! transfer completed. The child's side of each round (publishing metadata,
//! seeing the notification) is untimed, and finishes before the next round.
//! The child speaks lines on stdin/stdout.

use std::cell::RefCell;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use descriptor_core::{Connector, Descriptor, RdmaMetadata};
use nixl_sys::{Agent, AgentConfig, NotificationMap, XferRequest, XferStatus};

use crate::movers::{
    Buf, Layout, Mover, Op, Prepared, Res, blocks, nixl, nixl_connector, peer_failure_detection,
    pool_views, prepped_measures, ranges, raw_request, raw_ucx_params, seeds,
};

/// Set by `--gap-us`: how long each cross-process mover waits before a
/// transfer, outside the timing (microseconds).
static GAP_US: AtomicU64 = AtomicU64::new(0);

/// Makes every cross-process transfer start `gap` after the one before ended.
pub(crate) fn set_gap(gap: Duration) {
    GAP_US.store(
        u64::try_from(gap.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// The pause before each cross-process transfer (`--gap-us`).
pub(crate) fn gap() -> Duration {
    Duration::from_micros(GAP_US.load(Ordering::Relaxed))
}

/// Waits out the gap, if any.
fn pause() {
    let gap = gap();
    if !gap.is_zero() {
        std::thread::sleep(gap);
    }
}

/// NIXL's progress-thread delay of the raw baseline, as the issue asks.
const RAW_PROGRESS_DELAY: Duration = Duration::from_millis(10);

/// CRC-32 of the buffers, in order.
fn crc<'a>(bufs: impl Iterator<Item = &'a [u8]>) -> u32 {
    let mut crc = flate2::Crc::new();
    for b in bufs {
        crc.update(b);
    }
    crc.sum()
}

fn op_of(word: &str) -> Res<Op> {
    match word {
        "read" => Ok(Op::Read),
        "write" => Ok(Op::Write),
        other => Err(format!("unknown op {other:?}")),
    }
}

/// The child process, from the parent's side.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    /// This binary as the `kind` peer, run through `wrap` (a command prefix,
    /// such as `ip netns exec other-host`) if given.
    fn spawn(kind: &str, wrap: &[String]) -> Res<Peer> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut command = match wrap.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        command.args(["--peer", kind]);
        if !peer_failure_detection() {
            command.arg("--no-peer-failure-detection");
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn the {kind} peer: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Peer {
            child,
            stdin,
            stdout,
        })
    }

    fn send(&mut self, line: &str) -> Res<()> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("to the peer: {e}"))
    }

    fn line(&mut self) -> Res<String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err("the peer exited".into()),
            Ok(_) => Ok(line.trim_end().to_owned()),
            Err(e) => Err(format!("from the peer: {e}")),
        }
    }

    fn ask(&mut self, line: &str) -> Res<String> {
        self.send(line)?;
        self.line()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.send("quit");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `nixl-xproc`: our API, the passive side in a child process.
pub(crate) struct XprocApi {
    name: &'static str,
    peer: RefCell<Peer>,
    active: Connector,
    descs: Vec<Descriptor>,
    /// `Some(stride)`: views of one `BlockPool` per side (see `Api`).
    pool: Option<usize>,
    /// The peer's registrations, as it last reported them.
    peer_registrations: u64,
}

/// Our agent as the bench's cross-process rows build it, on either side
/// (named after the mover, so two movers in one run have distinct agents).
fn api_connector(mover: &str, side: &str, progress_thread: bool) -> Res<Connector> {
    let agent = format!("{mover}-{side}-{}", std::process::id());
    nixl_connector(&agent, progress_thread)
}

impl XprocApi {
    pub(crate) fn new(wrap: &[String]) -> Res<XprocApi> {
        Ok(XprocApi {
            name: "nixl-xproc",
            peer: RefCell::new(Peer::spawn("api", wrap)?),
            active: api_connector("nixl-xproc", "active", true)?,
            descs: Vec::new(),
            pool: None,
            peer_registrations: 0,
        })
    }

    /// `nixl-pool-xproc` (stride 1) and `nixl-pool-scattered-xproc`
    /// (stride 2): views of one registered pool per side.
    pub(crate) fn pool(name: &'static str, stride: usize) -> Res<XprocApi> {
        Ok(XprocApi {
            name,
            peer: RefCell::new(Peer::spawn("api", &[])?),
            active: api_connector(name, "active", true)?,
            descs: Vec::new(),
            pool: Some(stride),
            peer_registrations: 0,
        })
    }

    /// `nixl-xproc-no-thread`: both sides without NIXL's progress thread,
    /// each agent progressed only by its watcher: what the default's thread
    /// is for across processes.
    pub(crate) fn without_thread() -> Res<XprocApi> {
        Ok(XprocApi {
            name: "nixl-xproc-no-thread",
            peer: RefCell::new(Peer::spawn("api-no-thread", &[])?),
            active: api_connector("nixl-xproc-no-thread", "active", false)?,
            descs: Vec::new(),
            pool: None,
            peer_registrations: 0,
        })
    }
}

impl Mover for XprocApi {
    fn name(&self) -> &'static str {
        self.name
    }

    fn prepare(&mut self, op: Op, block: usize, n: usize) -> Res<()> {
        self.descs.clear();
        let command = match self.pool {
            None => format!("prepare {} {block} {n}", op.name()),
            Some(stride) => format!("pool {} {block} {n} {stride}", op.name()),
        };
        let reply = self.peer.get_mut().ask(&command)?;
        let Some(count) = reply.strip_prefix("ready ") else {
            return Err(format!("peer: {reply}"));
        };
        self.peer_registrations = parse(count)?;
        let (_, a) = seeds(op);
        self.descs = match self.pool {
            None => blocks(a, block, n)
                .into_iter()
                .map(|b| {
                    let mut d = Descriptor::new(b).map_err(|e| e.to_string())?;
                    d.register_memory(&self.active).map_err(|e| e.to_string())?;
                    Ok(d)
                })
                .collect::<Res<_>>()?,
            Some(stride) => pool_views(&self.active, Layout::new(block, n, stride)?, a)?,
        };
        Ok(())
    }

    fn run(&mut self, op: Op) -> Res<Duration> {
        let e = |e: descriptor_core::Error| e.to_string();
        let peer = self.peer.get_mut();
        let metadata: RdmaMetadata = peer
            .ask(&format!("expose {}", op.name()))?
            .parse()
            .map_err(e)?;
        let local = std::mem::take(&mut self.descs);
        // The peer exposed its memory and said so; a real initiator hears of
        // it through some RPC, so it may start later.
        pause();
        let started = Instant::now();
        let (elapsed, back) = match op {
            Op::Read => {
                let read = self.active.begin_read(&metadata, local).map_err(e)?;
                read.wait().map_err(e)?;
                (started.elapsed(), read.into_descriptors().ok())
            }
            Op::Write => {
                let write = self.active.begin_write(local, &metadata).map_err(e)?;
                write.wait().map_err(e)?;
                (started.elapsed(), write.into_descriptors().ok())
            }
        };
        self.descs = back.ok_or("buffers not returned")?;
        let done = peer.line()?;
        if done != "done" {
            return Err(format!("peer: {done}"));
        }
        Ok(elapsed)
    }

    fn verify(&self, _op: Op) -> bool {
        let mine = crc(self.descs.iter().filter_map(Descriptor::as_slice));
        let theirs = self.peer.borrow_mut().ask("crc");
        theirs.is_ok_and(|t| t == mine.to_string())
    }

    fn registrations(&self) -> Option<u64> {
        Some(self.active.registrations() + self.peer_registrations)
    }

    fn measures(&self, block: usize, blocks: usize) -> bool {
        self.pool.is_none() || prepped_measures(block, blocks)
    }
}

fn raw_agent(name: &str) -> Res<Agent> {
    backend_nixl::runtime::load().map_err(|e| e.to_string())?;
    let config = AgentConfig {
        enable_prog_thread: true,
        pthr_delay_us: RAW_PROGRESS_DELAY.as_micros() as u64,
        thread_sync: nixl_sys::ThreadSync::Strict,
        ..AgentConfig::default()
    };
    let agent = Agent::new_configured(name, &config).map_err(|e| format!("agent: {e}"))?;
    agent
        .create_backend("UCX", &raw_ucx_params(&agent)?)
        .map_err(|e| format!("backend: {e}"))?;
    Ok(agent)
}

/// `nixl-sys-raw-xproc`: raw nixl-sys, the target in a child process.
pub(crate) struct XprocRaw {
    name: &'static str,
    /// The target waits for the notification during the transfer.
    waiting: bool,
    peer: RefCell<Peer>,
    agent: Agent,
    remote_name: String,
    remote: Vec<(usize, usize)>,
    // Registrations before buffers: dropping a handle deregisters.
    handles: Vec<nixl_sys::RegistrationHandle>,
    bufs: Vec<Buf>,
    sent: u64,
    /// `register_memory` calls so far: this side's, and the peer's as it
    /// last reported them.
    registered: u64,
    peer_registered: u64,
}

impl XprocRaw {
    pub(crate) fn new(wrap: &[String]) -> Res<XprocRaw> {
        Ok(XprocRaw {
            name: "nixl-sys-raw-xproc",
            waiting: false,
            agent: raw_agent(&format!("xproc-raw-active-{}", std::process::id()))?,
            peer: RefCell::new(Peer::spawn("raw", wrap)?),
            remote_name: String::new(),
            remote: Vec::new(),
            handles: Vec::new(),
            bufs: Vec::new(),
            sent: 0,
            registered: 0,
            peer_registered: 0,
        })
    }

    /// `nixl-sys-raw-xproc-waiting`: the target waits for the notification
    /// while the transfer runs.
    pub(crate) fn waiting() -> Res<XprocRaw> {
        Ok(XprocRaw {
            name: "nixl-sys-raw-xproc-waiting",
            waiting: true,
            ..XprocRaw::new(&[])?
        })
    }
}

impl Mover for XprocRaw {
    fn name(&self) -> &'static str {
        self.name
    }

    fn prepare(&mut self, op: Op, block: usize, n: usize) -> Res<()> {
        self.handles.clear();
        let reply = self
            .peer
            .get_mut()
            .ask(&format!("prepare {} {block} {n}", op.name()))?;
        let (md, addrs, registered) = peer_memory(&reply)?;
        self.peer_registered = registered;
        if !self.remote_name.is_empty() {
            let _ = self.agent.invalidate_remote_md(&self.remote_name);
        }
        self.remote_name = self
            .agent
            .load_remote_md(&md)
            .map_err(|e| format!("load: {e}"))?;
        self.remote = addrs
            .split(',')
            .map(|a| a.parse::<usize>().map(|a| (a, block)))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("peer addresses: {e}"))?;
        let (_, a) = seeds(op);
        self.bufs = blocks(a, block, n).into_iter().map(Buf).collect();
        for b in &self.bufs {
            self.handles.push(
                self.agent
                    .register_memory(b, None)
                    .map_err(|e| format!("register: {e}"))?,
            );
            self.registered += 1;
        }
        Ok(())
    }

    fn run(&mut self, op: Op) -> Res<Duration> {
        let peer = self.peer.get_mut();
        if self.waiting {
            // The target starts waiting for this transfer's notification.
            let reply = peer.ask(&format!("arm {}", self.sent + 1))?;
            if reply != "armed" {
                return Err(format!("peer: {reply}"));
            }
        }
        pause();
        let started = Instant::now();
        let req = raw_request(
            &self.agent,
            op,
            (ranges(&self.bufs), self.remote.iter().copied()),
            &self.remote_name,
            b"raw-xproc",
        )?;
        completed(&self.agent, req)?;
        let elapsed = started.elapsed();
        self.sent += 1;
        let reply = if self.waiting {
            peer.line()?
        } else {
            peer.ask(&format!("sync {}", self.sent))?
        };
        if reply != "synced" {
            return Err(format!("peer: {reply}"));
        }
        Ok(elapsed)
    }

    fn verify(&self, _op: Op) -> bool {
        let mine = crc(self.bufs.iter().map(|b| b.0.as_slice()));
        let theirs = self.peer.borrow_mut().ask("crc");
        theirs.is_ok_and(|t| t == mine.to_string())
    }

    fn registrations(&self) -> Option<u64> {
        Some(self.registered + self.peer_registered)
    }
}

/// Posts `req` on `agent` and polls its status, with a yield, until it is
/// no longer in progress; then drops it.
fn completed(agent: &Agent, req: XferRequest) -> Res<()> {
    if agent.post_xfer_req(&req, None).map_err(nixl("post"))? {
        while agent.get_xfer_status(&req).map_err(nixl("status"))? == XferStatus::InProgress {
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// The raw peer's answer to `prepare` or `arena`: `md METADATA ADDRS COUNT`,
/// its agent's metadata, the addresses of its buffers (comma-separated) and
/// the `register_memory` calls it has made so far.
fn peer_memory(reply: &str) -> Res<(Vec<u8>, &str, u64)> {
    let mut words = reply.split(' ');
    let (Some("md"), Some(md), Some(addrs), Some(registered), None) = (
        words.next(),
        words.next(),
        words.next(),
        words.next(),
        words.next(),
    ) else {
        return Err(format!("peer: {reply}"));
    };
    let md = descriptor_core::decode_agent_metadata(md).map_err(|e| e.to_string())?;
    Ok((md, addrs, parse(registered)?))
}

/// `nixl-sys-raw-prepped-xproc` and `nixl-sys-raw-prepped-scattered-xproc`:
/// raw nixl-sys across processes as [`XprocRaw`] (the target in a child
/// process with NIXL's progress thread, looking for the notification after
/// the transfer), but with one registered arena per side and the lists
/// prepared once on the initiator: per transfer only `make_xfer_req` from
/// the blocks' indices, post and poll.
pub(crate) struct XprocPrepped {
    name: &'static str,
    stride: usize,
    // Fields drop in declaration order: the prepared lists before the agent
    // (see `Prepared`), the registration before its arena.
    lists: Option<Prepared>,
    handle: Option<nixl_sys::RegistrationHandle>,
    arena: Buf,
    indices: Vec<i32>,
    peer: RefCell<Peer>,
    remote_name: String,
    sent: u64,
    /// `register_memory` calls so far: this side's, and the peer's as it
    /// last reported them.
    registered: u64,
    peer_registered: u64,
    agent: Agent,
}

impl XprocPrepped {
    /// `nixl-sys-raw-prepped-xproc`: the blocks contiguous.
    pub(crate) fn contiguous() -> Res<XprocPrepped> {
        XprocPrepped::with("nixl-sys-raw-prepped-xproc", 1)
    }

    /// `nixl-sys-raw-prepped-scattered-xproc`: every other block.
    pub(crate) fn scattered() -> Res<XprocPrepped> {
        XprocPrepped::with("nixl-sys-raw-prepped-scattered-xproc", 2)
    }

    fn with(name: &'static str, stride: usize) -> Res<XprocPrepped> {
        Ok(XprocPrepped {
            name,
            stride,
            lists: None,
            handle: None,
            arena: Buf(Vec::new()),
            indices: Vec::new(),
            agent: raw_agent(&format!("{name}-active-{}", std::process::id()))?,
            peer: RefCell::new(Peer::spawn("raw", &[])?),
            remote_name: String::new(),
            sent: 0,
            registered: 0,
            peer_registered: 0,
        })
    }
}

impl Mover for XprocPrepped {
    fn name(&self) -> &'static str {
        self.name
    }

    fn prepare(&mut self, op: Op, block: usize, n: usize) -> Res<()> {
        // The remote list before the peer's metadata is invalidated, both
        // before the registration the local one points into.
        self.lists = None;
        self.handle = None;
        let layout = Layout::new(block, n, self.stride)?;
        let reply =
            self.peer
                .get_mut()
                .ask(&format!("arena {} {block} {n} {}", op.name(), self.stride))?;
        let (md, base, registered) = peer_memory(&reply)?;
        self.peer_registered = registered;
        let base: usize = parse(base)?;
        if !self.remote_name.is_empty() {
            self.agent
                .invalidate_remote_md(&self.remote_name)
                .map_err(nixl("invalidate"))?;
        }
        self.remote_name = self.agent.load_remote_md(&md).map_err(nixl("load"))?;
        let (_, a) = seeds(op);
        self.arena = layout.arena(a);
        self.handle = Some(
            self.agent
                .register_memory(&self.arena, None)
                .map_err(nixl("register"))?,
        );
        self.registered += 1;
        self.lists = Some(Prepared::new(
            &self.agent,
            layout.ranges(self.arena.addr()),
            &self.remote_name,
            layout.ranges(base),
        )?);
        self.indices = layout.indices();
        Ok(())
    }

    fn run(&mut self, op: Op) -> Res<Duration> {
        let lists = self.lists.as_ref().ok_or("run before prepare")?;
        let peer = self.peer.get_mut();
        pause();
        let started = Instant::now();
        let req = lists.request(&self.agent, op, &self.indices, b"raw-prepped-xproc")?;
        completed(&self.agent, req)?;
        let elapsed = started.elapsed();
        self.sent += 1;
        let reply = peer.ask(&format!("sync {}", self.sent))?;
        if reply != "synced" {
            return Err(format!("peer: {reply}"));
        }
        Ok(elapsed)
    }

    /// The whole arenas: the blocks moved, and the gaps between untouched.
    fn verify(&self, _op: Op) -> bool {
        let mine = crc(std::iter::once(self.arena.0.as_slice()));
        let theirs = self.peer.borrow_mut().ask("crc");
        theirs.is_ok_and(|t| t == mine.to_string())
    }

    fn registrations(&self) -> Option<u64> {
        Some(self.registered + self.peer_registered)
    }

    fn measures(&self, block: usize, blocks: usize) -> bool {
        prepped_measures(block, blocks)
    }
}

/// The child side (`bench --peer api|raw`): serves the parent until `quit`.
pub(crate) fn serve(kind: &str) -> Res<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut say = |line: String| -> Res<()> {
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())
    };
    match kind {
        "api" | "api-no-thread" => {
            let connector = api_connector(kind, "peer", kind == "api")?;
            let mut descs: Vec<Descriptor> = Vec::new();
            for line in stdin.lock().lines() {
                let line = line.map_err(|e| e.to_string())?;
                let words: Vec<&str> = line.split(' ').collect();
                let e = |e: descriptor_core::Error| e.to_string();
                match words.as_slice() {
                    ["prepare", op, block, n] => {
                        descs.clear();
                        let (p, _) = seeds(op_of(op)?);
                        let (block, n) = (parse(block)?, parse(n)?);
                        descs = blocks(p, block, n)
                            .into_iter()
                            .map(|b| {
                                let mut d = Descriptor::new(b).map_err(e)?;
                                d.register_memory(&connector).map_err(e)?;
                                Ok(d)
                            })
                            .collect::<Res<_>>()?;
                        say(format!("ready {}", connector.registrations()))?;
                    }
                    // Views of one registered pool: the pooled rows.
                    ["pool", op, block, n, stride] => {
                        descs.clear();
                        let (p, _) = seeds(op_of(op)?);
                        let layout = Layout::new(parse(block)?, parse(n)?, parse(stride)?)?;
                        descs = pool_views(&connector, layout, p)?;
                        say(format!("ready {}", connector.registrations()))?;
                    }
                    ["expose", op] => {
                        let taken = std::mem::take(&mut descs);
                        let back = match op_of(op)? {
                            Op::Read => {
                                let readable = connector.create_readable(taken).map_err(e)?;
                                say(readable.metadata().to_json())?;
                                readable.wait().map_err(e)?;
                                readable.into_descriptors().ok()
                            }
                            Op::Write => {
                                let writable = connector.create_writable(taken).map_err(e)?;
                                say(writable.metadata().to_json())?;
                                writable.wait().map_err(e)?;
                                writable.into_descriptors().ok()
                            }
                        };
                        descs = back.ok_or("buffers not returned")?;
                        say("done".into())?;
                    }
                    ["crc"] => say(crc(descs.iter().filter_map(Descriptor::as_slice)).to_string())?,
                    ["quit"] => return Ok(()),
                    other => return Err(format!("unknown command {other:?}")),
                }
            }
            Ok(())
        }
        "raw" => {
            let agent = raw_agent(&format!("xproc-raw-peer-{}", std::process::id()))?;
            let mut handles: Vec<nixl_sys::RegistrationHandle> = Vec::new();
            let mut bufs: Vec<Buf> = Vec::new();
            let mut received = 0u64;
            let mut registered = 0u64;
            for line in stdin.lock().lines() {
                let line = line.map_err(|e| e.to_string())?;
                let words: Vec<&str> = line.split(' ').collect();
                match words.as_slice() {
                    ["prepare", op, block, n] => {
                        handles.clear();
                        let (p, _) = seeds(op_of(op)?);
                        bufs = blocks(p, parse(block)?, parse(n)?)
                            .into_iter()
                            .map(Buf)
                            .collect();
                        for b in &bufs {
                            handles.push(
                                agent
                                    .register_memory(b, None)
                                    .map_err(|e| format!("register: {e}"))?,
                            );
                            registered += 1;
                        }
                        say(memory_line(&agent, &bufs, registered)?)?;
                    }
                    // One arena, registered once: the prepared-list rows.
                    ["arena", op, block, n, stride] => {
                        handles.clear();
                        let (p, _) = seeds(op_of(op)?);
                        let layout = Layout::new(parse(block)?, parse(n)?, parse(stride)?)?;
                        bufs = vec![layout.arena(p)];
                        for b in &bufs {
                            handles.push(agent.register_memory(b, None).map_err(nixl("register"))?);
                            registered += 1;
                        }
                        say(memory_line(&agent, &bufs, registered)?)?;
                    }
                    ["sync", count] => {
                        let nap = Some(Duration::from_micros(20));
                        received = notified(&agent, received, parse(count)?, nap)?;
                        say("synced".into())?;
                    }
                    ["arm", count] => {
                        say("armed".into())?;
                        received = notified(&agent, received, parse(count)?, None)?;
                        say("synced".into())?;
                    }
                    ["crc"] => say(crc(bufs.iter().map(|b| b.0.as_slice())).to_string())?,
                    ["quit"] => return Ok(()),
                    other => return Err(format!("unknown command {other:?}")),
                }
            }
            Ok(())
        }
        other => Err(format!("unknown peer kind {other:?}")),
    }
}

/// The raw peer's `md METADATA ADDRS COUNT` line ([`peer_memory`]).
fn memory_line(agent: &Agent, bufs: &[Buf], registered: u64) -> Res<String> {
    let md = agent.get_local_md().map_err(|e| format!("md: {e}"))?;
    let addrs: Vec<String> = bufs.iter().map(|b| b.addr().to_string()).collect();
    Ok(format!(
        "md {} {} {registered}",
        descriptor_core::encode_agent_metadata(&md),
        addrs.join(",")
    ))
}

/// Polls `agent` for notifications until `count` have come in all told
/// (`received` so far), napping `nap` between polls or else yielding;
/// returns the new total.
fn notified(agent: &Agent, mut received: u64, count: u64, nap: Option<Duration>) -> Res<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while received < count {
        let mut map = NotificationMap::new().map_err(|e| e.to_string())?;
        agent
            .get_notifications(&mut map, None)
            .map_err(|e| e.to_string())?;
        received += map.len().map_err(|e| e.to_string())? as u64;
        if received < count {
            if Instant::now() > deadline {
                return Err("no notification".into());
            }
            match nap {
                Some(nap) => std::thread::sleep(nap),
                None => std::thread::yield_now(),
            }
        }
    }
    Ok(received)
}

fn parse<T: std::str::FromStr>(word: &str) -> Res<T> {
    word.parse().map_err(|_| format!("not a number: {word:?}"))
}
