//! The storage rows: blocks between memory and a file, four ways, in the
//! same interleaved sweeps as the memory rows ([`crate::bandwidth`]).
//!
//! - `file-plain`: `pread`/`pwrite` on the thread, one call per run of
//!   neighbouring blocks (the best a plain loop does);
//! - `file-uring`: the same runs through io_uring, up to 64 in flight (the
//!   queued plain baseline, where io_uring can be set up);
//! - `nixl-sys-posix-raw`: nixl-sys's POSIX plugin without our layer: memory
//!   and file registered once, a request per transfer with one descriptor
//!   per block, polled with a yield, as a user of nixl-sys writes it;
//! - `nixl-sys-posix-raw-twin`: a second `nixl-sys-posix-raw` (an agent of
//!   its own): its ratio to the first is the row's resolution;
//! - `loopback-file` and `nixl-file`: `Connector::begin_file_write` /
//!   `begin_file_read` and `wait`, over one `BlockPool` and one file.
//!
//! Each in two placements, the blocks next to each other in the file
//! (`*`) or every other block (`*-scattered`, so no two are neighbours;
//! memory stays one arena), and two caches: the page cache (the file
//! written once before the timed transfers, so a READ copies from cached
//! pages and a WRITE into them) and `O_DIRECT` (`*-direct`: every transfer
//! reaches the disk, page-aligned memory and offsets). The movers of a
//! placement and cache take turns on one file under
//! `target/bench/storage-files` (each prepares it anew for a size, with the
//! same bytes, and checks what it moved before the next one runs), so that
//! where its blocks lie on the disk is the same for all; it is removed at
//! the end.

use std::alloc::{Layout as AllocLayout, alloc_zeroed, dealloc};
use std::fs::{File, OpenOptions};
use std::num::NonZeroUsize;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use backend_loopback::{Fabric, LoopbackBackend};
use backend_nixl::{NixlBackend, Storage};
use descriptor_core::{BlockPool, Connector, Descriptor, FileSegment, MemoryBuffer};
use nixl_sys::{
    Agent, AgentConfig, MemType, MemoryRegion, NixlDescriptor, RegistrationHandle, XferDescList,
    XferOp, XferStatus,
};

use crate::movers::{Mover, Op, Res, fill, nixl};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// O_DIRECT's alignment of memory, offsets and lengths on Linux file
/// systems with 4 KiB blocks.
const PAGE: usize = 4096;
/// Seed of the bytes the blocks' source holds.
const SEED: u64 = 0x5702;

/// Where the blocks sit in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Block `i` at `i * block`: one run of the whole transfer.
    Contiguous,
    /// Block `i` at `2 * i * block`: no two blocks neighbours.
    Scattered,
}

/// Whether the file goes through the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cache {
    Page,
    Direct,
}

/// Who moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Uring,
    Raw,
    RawTwin,
    Loopback,
    Nixl,
}

/// Every storage mover's name: `[kind][placement][cache]`.
const NAMES: [[[&str; 2]; 2]; 6] = [
    [
        ["file-plain", "file-plain-direct"],
        ["file-plain-scattered", "file-plain-scattered-direct"],
    ],
    [
        ["file-uring", "file-uring-direct"],
        ["file-uring-scattered", "file-uring-scattered-direct"],
    ],
    [
        ["nixl-sys-posix-raw", "nixl-sys-posix-raw-direct"],
        [
            "nixl-sys-posix-raw-scattered",
            "nixl-sys-posix-raw-scattered-direct",
        ],
    ],
    [
        ["nixl-sys-posix-raw-twin", "nixl-sys-posix-raw-twin-direct"],
        [
            "nixl-sys-posix-raw-twin-scattered",
            "nixl-sys-posix-raw-twin-scattered-direct",
        ],
    ],
    [
        ["loopback-file", "loopback-file-direct"],
        ["loopback-file-scattered", "loopback-file-scattered-direct"],
    ],
    [
        ["nixl-file", "nixl-file-direct"],
        ["nixl-file-scattered", "nixl-file-scattered-direct"],
    ],
];

fn name(kind: Kind, placement: Placement, cache: Cache) -> &'static str {
    NAMES[kind as usize][placement as usize][cache as usize]
}

/// The cache setting of a storage mover's rows ("page cache" or
/// "O_DIRECT", as the report names it), `None` for other movers.
pub(crate) fn cache_of(backend: &str) -> Option<&'static str> {
    NAMES.iter().flatten().find_map(|caches| {
        let at = caches.iter().position(|n| *n == backend)?;
        Some(if at == Cache::Direct as usize {
            "O_DIRECT"
        } else {
            "page cache"
        })
    })
}

/// (block bytes, blocks) of the storage rows: 4 KiB to 1 MiB blocks, one to
/// 1024 of them, up to 64 MiB a transfer.
pub(crate) fn sizes(quick: bool) -> Vec<(usize, usize)> {
    let mut out = vec![(4 * KIB, 1), (4 * KIB, 64), (4 * KIB, 1024)];
    out.extend([(64 * KIB, 1), (64 * KIB, 64)]);
    if !quick {
        out.push((64 * KIB, 1024));
    }
    out.extend([(MIB, 1), (MIB, 64)]);
    out
}

/// Whether this file system takes `O_DIRECT` in `dir` (tmpfs does not).
pub(crate) fn direct_works(dir: &Path) -> Res<bool> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let probe = dir.join("direct-probe");
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe);
    let _ = std::fs::remove_file(&probe);
    Ok(opened.is_ok())
}

/// The six movers of one placement and cache, files under `dir`.
pub(crate) fn movers(dir: &Path, placement: Placement, cache: Cache) -> Res<Vec<Box<dyn Mover>>> {
    // One file for all, so that where its blocks lie on the disk is the
    // same for every mover.
    let file = dir.join(format!("blocks-{placement:?}-{cache:?}"));
    let shape = |kind| Shape {
        name: name(kind, placement, cache),
        path: file.clone(),
        placement,
        cache,
    };
    let loopback = {
        let fabric = Fabric::new();
        LoopbackBackend::new(&fabric, "bench-storage")
            .map(Connector::new)
            .map_err(|e| e.to_string())?
    };
    let nixl = NixlBackend::builder(&format!(
        "bench-storage-{}",
        name(Kind::Nixl, placement, cache)
    ))
    .storage(Storage::PosixAio)
    .build()
    .map(Connector::new)
    .map_err(|e| e.to_string())?;
    let mut movers: Vec<Box<dyn Mover>> = vec![Box::new(Plain::new(shape(Kind::Plain)))];
    // Where io_uring can be set up (a seccomp profile may forbid it).
    match Uring::new(shape(Kind::Uring)) {
        Ok(uring) => movers.push(Box::new(uring)),
        Err(e) => eprintln!("bench: no file-uring rows: {e}"),
    }
    movers.extend([
        Box::new(RawPosix::new(shape(Kind::Raw))?) as Box<dyn Mover>,
        Box::new(RawPosix::new(shape(Kind::RawTwin))?),
        Box::new(Ours::new(shape(Kind::Loopback), loopback)),
        Box::new(Ours::new(shape(Kind::Nixl), nixl)),
    ]);
    Ok(movers)
}

/// A mover's name, file and layout.
struct Shape {
    name: &'static str,
    path: PathBuf,
    placement: Placement,
    cache: Cache,
}

/// One size's file and its blocks' offsets.
struct Blocks {
    file: File,
    block: usize,
    offsets: Vec<u64>,
}

impl Shape {
    /// Creates the file for `n` blocks of `block` bytes, filled with the
    /// source bytes when the transfer READs it (written and synced through
    /// the page cache, then opened as the cache setting says).
    fn prepare(&self, op: Op, block: usize, n: usize) -> Res<Blocks> {
        let io = |e: std::io::Error| format!("{}: {e}", self.path.display());
        let stride = match self.placement {
            Placement::Contiguous => 1,
            Placement::Scattered => 2,
        };
        let offsets: Vec<u64> = (0..n).map(|i| (i * stride * block) as u64).collect();
        {
            let file = File::create(&self.path).map_err(io)?;
            file.set_len((n * stride * block) as u64).map_err(io)?;
            if op == Op::Read {
                for (i, &offset) in offsets.iter().enumerate() {
                    file.write_all_at(&fill(SEED + i as u64, block), offset)
                        .map_err(io)?;
                }
            }
            file.sync_all().map_err(io)?;
        }
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if self.cache == Cache::Direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let file = options.open(&self.path).map_err(io)?;
        Ok(Blocks {
            file,
            block,
            offsets,
        })
    }

    /// Whether the bytes moved: the file's blocks (read back through the
    /// page cache) equal memory's after a WRITE, and memory holds the file's
    /// source bytes after a READ.
    fn verify(&self, op: Op, blocks: &Blocks, memory: &[u8]) -> bool {
        let Ok(file) = File::open(&self.path) else {
            return false;
        };
        let mut on_disk = vec![0u8; blocks.block];
        blocks.offsets.iter().enumerate().all(|(i, &offset)| {
            let in_memory = &memory[i * blocks.block..][..blocks.block];
            match op {
                Op::Write => {
                    file.read_exact_at(&mut on_disk, offset).is_ok() && on_disk == in_memory
                }
                Op::Read => in_memory == fill(SEED + i as u64, blocks.block).as_slice(),
            }
        })
    }

    fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Zeroed host memory aligned to [`PAGE`], as `O_DIRECT` needs it.
#[derive(Debug)]
pub(crate) struct PageBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its allocation outright; nothing aliases it but
// through `&`/`&mut` of the value (or a descriptor owning it).
unsafe impl Send for PageBuf {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for PageBuf {}

impl PageBuf {
    fn layout(len: usize) -> Res<AllocLayout> {
        AllocLayout::from_size_align(len.max(1), PAGE).map_err(|e| format!("{len} B: {e}"))
    }

    /// `len` bytes; block `i` holds the source bytes when `filled`.
    fn new(len: usize, block: usize, filled: bool) -> Res<PageBuf> {
        let layout = PageBuf::layout(len)?;
        // SAFETY: the layout's size is not zero.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })
            .ok_or_else(|| format!("out of memory for {len} B"))?;
        let mut buf = PageBuf { ptr, len };
        if filled {
            for (i, chunk) in buf.as_mut_slice().chunks_exact_mut(block).enumerate() {
                chunk.copy_from_slice(&fill(SEED + i as u64, block));
            }
        }
        Ok(buf)
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialized bytes (zeroed at allocation), owned.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // `new` made this layout from this length.
        if let Ok(layout) = PageBuf::layout(self.len) {
            // SAFETY: allocated by `alloc_zeroed` with this layout, once.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

// SAFETY: the allocation is on the heap, outside the value, fixed in size,
// writable, and freed only when the value drops.
unsafe impl MemoryBuffer for PageBuf {
    fn base_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
    fn is_writable(&self) -> bool {
        true
    }
}

impl MemoryRegion for PageBuf {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for PageBuf {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }
    fn device_id(&self) -> u64 {
        0
    }
}

/// A whole file as NIXL's POSIX plugin registers it.
#[derive(Debug)]
struct WholeFile(u64);

impl MemoryRegion for WholeFile {
    unsafe fn as_ptr(&self) -> *const u8 {
        std::ptr::null()
    }
    fn size(&self) -> usize {
        i64::MAX as usize
    }
}

impl NixlDescriptor for WholeFile {
    fn mem_type(&self) -> MemType {
        MemType::File
    }
    fn device_id(&self) -> u64 {
        self.0
    }
}

/// A size's file, its runs of neighbouring blocks and page-aligned memory:
/// what the plain-syscall movers work on.
struct Staged {
    blocks: Blocks,
    runs: Vec<(usize, u64, usize)>,
    memory: PageBuf,
}

impl Staged {
    fn new(shape: &Shape, op: Op, block: usize, n: usize) -> Res<Staged> {
        let blocks = shape.prepare(op, block, n)?;
        Ok(Staged {
            runs: runs(&blocks),
            blocks,
            memory: PageBuf::new(block * n, block, op == Op::Write)?,
        })
    }
}

/// `file-plain*`: `pread`/`pwrite`, one call per run of neighbouring blocks.
struct Plain {
    shape: Shape,
    staged: Option<Staged>,
}

impl Plain {
    fn new(shape: Shape) -> Plain {
        Plain {
            shape,
            staged: None,
        }
    }
}

impl Mover for Plain {
    fn name(&self) -> &'static str {
        self.shape.name
    }
    fn prepare(&mut self, op: Op, block: usize, n: usize) -> Res<()> {
        self.staged = Some(Staged::new(&self.shape, op, block, n)?);
        Ok(())
    }
    fn run(&mut self, op: Op) -> Res<Duration> {
        let Some(Staged {
            blocks,
            runs,
            memory,
        }) = &mut self.staged
        else {
            return Err("not prepared".into());
        };
        let started = Instant::now();
        let memory = memory.as_mut_slice();
        for &(at, offset, len) in &*runs {
            let range = at..at + len;
            let done = match op {
                Op::Write => blocks.file.write_all_at(&memory[range], offset),
                Op::Read => blocks.file.read_exact_at(&mut memory[range], offset),
            };
            done.map_err(|e| format!("{}: {e}", self.shape.name))?;
        }
        Ok(started.elapsed())
    }
    fn verify(&self, op: Op) -> bool {
        self.staged
            .as_ref()
            .is_some_and(|s| self.shape.verify(op, &s.blocks, s.memory.as_slice()))
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        self.shape.remove();
    }
}

/// The runs of neighbouring blocks (neighbours in memory and in the file):
/// (memory offset, file offset, length).
fn runs(blocks: &Blocks) -> Vec<(usize, u64, usize)> {
    let mut out: Vec<(usize, u64, usize)> = Vec::new();
    for (i, &offset) in blocks.offsets.iter().enumerate() {
        match out.last_mut() {
            Some((_, at, len)) if *at + *len as u64 == offset => *len += blocks.block,
            _ => out.push((i * blocks.block, offset, blocks.block)),
        }
    }
    out
}

/// Submission queue entries of [`Uring`]: as many I/Os in flight at once
/// as NIXL's POSIX plugin keeps.
const URING_DEPTH: u32 = 64;

/// `file-uring*`: one io_uring read or write per run of neighbouring
/// blocks, up to [`URING_DEPTH`] in flight, reaped until all are done: the
/// queued plain-syscall baseline.
struct Uring {
    shape: Shape,
    ring: io_uring::IoUring,
    staged: Option<Staged>,
}

impl Uring {
    fn new(shape: Shape) -> Res<Uring> {
        let ring = io_uring::IoUring::new(URING_DEPTH).map_err(|e| format!("io_uring: {e}"))?;
        Ok(Uring {
            shape,
            ring,
            staged: None,
        })
    }
}

impl Mover for Uring {
    fn name(&self) -> &'static str {
        self.shape.name
    }
    fn prepare(&mut self, op: Op, block: usize, n: usize) -> Res<()> {
        self.staged = Some(Staged::new(&self.shape, op, block, n)?);
        Ok(())
    }
    fn run(&mut self, op: Op) -> Res<Duration> {
        use io_uring::{opcode, types};
        let Some(Staged {
            blocks,
            runs,
            memory,
        }) = &mut self.staged
        else {
            return Err("not prepared".into());
        };
        let started = Instant::now();
        let fd = types::Fd(blocks.file.as_raw_fd());
        let base = memory.as_mut_slice().as_mut_ptr();
        let (mut next, mut in_flight, mut failed) = (0, 0u32, None::<String>);
        loop {
            while failed.is_none() && next < runs.len() && in_flight < URING_DEPTH {
                let (at, offset, len) = runs[next];
                let Ok(len32) = u32::try_from(len) else {
                    failed = Some(format!("a run of {len} bytes"));
                    break;
                };
                // Inside `memory`: `runs` of this size's blocks.
                let buf = base.wrapping_add(at);
                let entry = match op {
                    Op::Read => opcode::Read::new(fd, buf, len32).offset(offset).build(),
                    Op::Write => opcode::Write::new(fd, buf, len32).offset(offset).build(),
                }
                .user_data(len as u64);
                // SAFETY: the buffer and the file outlive the I/O: this loop
                // reaps every entry it pushed before it returns, and `memory`
                // stays borrowed (not moved or freed) until then.
                if unsafe { self.ring.submission().push(&entry) }.is_err() {
                    break;
                }
                next += 1;
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                // Entries may be in flight still: keep reaping them.
                failed.get_or_insert(format!("io_uring submit: {e}"));
                std::thread::yield_now();
            }
            for done in self.ring.completion() {
                in_flight -= 1;
                if u64::try_from(done.result()).ok() != Some(done.user_data()) {
                    failed.get_or_insert(format!(
                        "an I/O moved {} of {} bytes",
                        done.result(),
                        done.user_data()
                    ));
                }
            }
        }
        match failed {
            Some(e) => Err(format!("{}: {e}", self.shape.name)),
            None => Ok(started.elapsed()),
        }
    }
    fn verify(&self, op: Op) -> bool {
        self.staged
            .as_ref()
            .is_some_and(|s| self.shape.verify(op, &s.blocks, s.memory.as_slice()))
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        self.shape.remove();
    }
}

/// `nixl-sys-posix-raw*`: an agent with the POSIX plugin only (AIO, as
/// ours by default), memory and file registered once per size, and per
/// transfer a request of one descriptor per block, posted to the agent
/// itself and polled with a yield until done.
struct RawPosix {
    shape: Shape,
    // Fields drop in order: the registrations before what they register,
    // the agent last.
    handles: Vec<RegistrationHandle>,
    blocks: Option<Blocks>,
    memory: Option<PageBuf>,
    registered: u64,
    own: String,
    agent: Agent,
}

impl RawPosix {
    fn new(shape: Shape) -> Res<RawPosix> {
        backend_nixl::runtime::load().map_err(|e| e.to_string())?;
        let config = AgentConfig {
            enable_prog_thread: false,
            thread_sync: nixl_sys::ThreadSync::Strict,
            ..AgentConfig::default()
        };
        let agent = Agent::new_configured(shape.name, &config).map_err(nixl("agent"))?;
        let (_, mut params) = agent.get_plugin_params("POSIX").map_err(nixl("params"))?;
        params.set("use_uring", "false").map_err(nixl("params"))?;
        agent
            .create_backend("POSIX", &params)
            .map_err(nixl("POSIX backend"))?;
        Ok(RawPosix {
            own: agent.name(),
            shape,
            handles: Vec::new(),
            blocks: None,
            memory: None,
            registered: 0,
            agent,
        })
    }
}

impl Mover for RawPosix {
    fn name(&self) -> &'static str {
        self.shape.name
    }
    fn prepare(&mut self, op: Op, block: usize, n: usize) -> Res<()> {
        self.handles.clear();
        let blocks = self.shape.prepare(op, block, n)?;
        let memory = PageBuf::new(block * n, block, op == Op::Write)?;
        let fd = u64::try_from(blocks.file.as_raw_fd()).map_err(|e| e.to_string())?;
        self.handles.push(
            self.agent
                .register_memory(&memory, None)
                .map_err(nixl("register memory"))?,
        );
        self.handles.push(
            self.agent
                .register_memory(&WholeFile(fd), None)
                .map_err(nixl("register the file"))?,
        );
        self.registered += 2;
        self.blocks = Some(blocks);
        self.memory = Some(memory);
        Ok(())
    }
    fn run(&mut self, op: Op) -> Res<Duration> {
        let (Some(blocks), Some(memory)) = (&self.blocks, &self.memory) else {
            return Err("not prepared".into());
        };
        let started = Instant::now();
        let fd = blocks.file.as_raw_fd() as u64;
        let mut local = XferDescList::new(MemType::Dram).map_err(nixl("list"))?;
        let mut file = XferDescList::new(MemType::File).map_err(nixl("list"))?;
        for (i, &offset) in blocks.offsets.iter().enumerate() {
            local.add_desc(memory.addr() + i * blocks.block, blocks.block, 0);
            file.add_desc(offset as usize, blocks.block, fd);
        }
        let xfer_op = match op {
            Op::Read => XferOp::Read,
            Op::Write => XferOp::Write,
        };
        let req = self
            .agent
            .create_xfer_req(xfer_op, &local, &file, &self.own, None)
            .map_err(nixl("create"))?;
        if self.agent.post_xfer_req(&req, None).map_err(nixl("post"))? {
            while self.agent.get_xfer_status(&req).map_err(nixl("status"))?
                == XferStatus::InProgress
            {
                std::thread::yield_now();
            }
        }
        Ok(started.elapsed())
    }
    fn verify(&self, op: Op) -> bool {
        match (&self.blocks, &self.memory) {
            (Some(blocks), Some(memory)) => self.shape.verify(op, blocks, memory.as_slice()),
            _ => false,
        }
    }
    fn registrations(&self) -> Option<u64> {
        Some(self.registered)
    }
}

impl Drop for RawPosix {
    fn drop(&mut self) {
        self.handles.clear();
        self.shape.remove();
    }
}

/// `loopback-file*` and `nixl-file*`: the public API over one `BlockPool`
/// and one file, `begin_file_*` then `wait`.
struct Ours {
    shape: Shape,
    connector: Connector,
    views: Vec<Descriptor>,
    segments: Vec<FileSegment>,
    blocks: Option<Blocks>,
}

impl Ours {
    fn new(shape: Shape, connector: Connector) -> Ours {
        Ours {
            shape,
            connector,
            views: Vec::new(),
            segments: Vec::new(),
            blocks: None,
        }
    }

    /// Memory, block after block, as the views see it.
    fn memory(&self) -> Vec<u8> {
        self.views
            .iter()
            .flat_map(|v| v.as_slice().unwrap_or_default().iter().copied())
            .collect()
    }
}

impl Mover for Ours {
    fn name(&self) -> &'static str {
        self.shape.name
    }
    fn prepare(&mut self, op: Op, block: usize, n: usize) -> Res<()> {
        let e = |e: descriptor_core::Error| e.to_string();
        // The previous size's views (and its pool), segments and file go first.
        self.views.clear();
        self.segments.clear();
        self.blocks = None;
        let blocks = self.shape.prepare(op, block, n)?;
        let memory = PageBuf::new(block * n, block, op == Op::Write)?;
        let pool = BlockPool::new(
            &self.connector,
            memory,
            NonZeroUsize::new(block).ok_or("empty blocks")?,
        )
        .map_err(e)?;
        self.views = pool
            .checkout_blocks(&(0..n).collect::<Vec<_>>())
            .map_err(e)?;
        let whole = FileSegment::from_file(
            blocks.file.try_clone().map_err(|e| e.to_string())?,
            0,
            block,
        )
        .map_err(e)?;
        self.segments = blocks
            .offsets
            .iter()
            .map(|&offset| whole.at(offset, block))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        self.blocks = Some(blocks);
        Ok(())
    }
    fn run(&mut self, op: Op) -> Res<Duration> {
        let e = |e: descriptor_core::Error| e.to_string();
        let views = std::mem::take(&mut self.views);
        let segments = self.segments.clone();
        let started = Instant::now();
        let returned = match op {
            Op::Write => {
                let write = self
                    .connector
                    .begin_file_write(views, segments)
                    .map_err(e)?;
                write.wait().map_err(e)?;
                (started.elapsed(), write.into_descriptors().ok())
            }
            Op::Read => {
                let read = self.connector.begin_file_read(segments, views).map_err(e)?;
                read.wait().map_err(e)?;
                (started.elapsed(), read.into_descriptors().ok())
            }
        };
        self.views = returned.1.ok_or("the blocks were not returned")?;
        Ok(returned.0)
    }
    fn verify(&self, op: Op) -> bool {
        self.blocks
            .as_ref()
            .is_some_and(|blocks| self.shape.verify(op, blocks, &self.memory()))
    }
    fn registrations(&self) -> Option<u64> {
        Some(self.connector.registrations())
    }
}

impl Drop for Ours {
    fn drop(&mut self) {
        self.views.clear();
        self.segments.clear();
        self.shape.remove();
    }
}
