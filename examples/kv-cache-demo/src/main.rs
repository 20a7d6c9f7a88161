//! The KV-cache pattern, end to end, through the public API: a "prefill" and
//! a "decode" connector each register ONE arena once (a [`BlockPool`] of
//! fixed-size blocks), then serve many requests that move blocks by index,
//! with no registration per request.
//!
//! Each request takes a random set of blocks (a seeded xorshift, so runs
//! repeat). Even requests are a contiguous run: prefill checks out
//! consecutive indices and joins them into one view
//! ([`Descriptor::unsplit`]), decode allocates a run
//! ([`BlockPool::checkout_run`]), and the run moves as ONE descriptor. Odd
//! requests are scattered: random indices on both sides
//! ([`BlockPool::checkout_blocks`]), one descriptor per block. Every request
//! goes both ways:
//!
//! 1. READ: prefill fills its blocks and exposes them
//!    ([`Connector::create_readable`]); the metadata travels as JSON; decode
//!    reads them into its blocks ([`Connector::begin_read`]).
//! 2. WRITE: decode updates those blocks and writes them back into the same
//!    prefill blocks ([`Connector::create_writable`], [`Connector::begin_write`]).
//!
//! Every block moved is checksummed (CRC-32) on the sender and on the
//! receiver; any difference fails the run with a non-zero exit. Decode keeps
//! the blocks of its last few requests checked out (live sequences), so its
//! arena fragments as a serving worker's does.
//!
//! It prints the registrations per side (one each, or it fails), then per
//! direction and per shape (runs, scattered): requests per second, GB/s, p50
//! and p99 latency per request, and the metadata bytes per request. A
//! request's latency is its transfer path: expose, metadata to JSON and back,
//! post, and both sides complete (filling and checksumming are outside it).
//!
//! With `--offload`, the storage tier instead: see `offload.rs`.
//!
//! With `--metrics-port PORT` (feature `metrics`, on by default), both
//! connectors' backends are wrapped in `descriptor_core::metrics::Metered`
//! and their transfer metrics are served as Prometheus text at
//! `http://127.0.0.1:PORT/metrics` while the demo runs (`0`: any free port,
//! printed); at the end the demo scrapes itself once and checks the counts
//! against what it did. See `endpoint.rs`.
//!
//! `cargo xtask demo [--backend NAME] [--blocks N] [--block-size BYTES] [--iterations N] [--offload] [--metrics-port PORT]`,
//! or `cargo run --release -p kv-cache-demo --features nixl -- --backend nixl`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use descriptor_core::{BlockPool, Connector, Descriptor, RdmaMetadata};

#[cfg(feature = "metrics")]
mod endpoint;
mod offload;

mod flags {
    use crate::Positive;

    xflags::xflags! {
        /// Serves KV-cache requests between a prefill and a decode
        /// connector, each with one arena of blocks registered once: decode
        /// READs each request's blocks from prefill, then WRITEs them back;
        /// every block is checked with CRC-32 on both sides.
        cmd kv-cache-demo {
            /// The backend (default: the first built, loopback before nixl).
            optional --backend name: String
            /// Blocks in each side's arena, registered once (default 256).
            optional --blocks n: Positive
            /// Bytes per block (default 65536).
            optional --block-size bytes: Positive
            /// Requests to serve, each moving its blocks both ways (default 400).
            optional --iterations n: Positive
            /// Most blocks one request moves (default 32; at most half the arena).
            optional --request-blocks n: Positive
            /// Seed of the request generator (default 1).
            optional --seed n: u64
            /// The storage tier instead: decode's arena holds a quarter of
            /// the blocks its requests use; least recently used blocks are
            /// evicted to a file (in KV_OFFLOAD_DIR, default the temporary
            /// directory) and read back on hits, CRC-checked.
            optional --offload
            /// Serve both connectors' transfer metrics as Prometheus text at
            /// http://127.0.0.1:PORT/metrics while the demo runs (0: any free
            /// port), and check them at the end (feature `metrics`).
            optional --metrics-port port: u16
        }
    }
}

/// A count or size on the command line: an integer above zero.
#[derive(Debug)]
struct Positive(usize);

impl std::str::FromStr for Positive {
    type Err = String;

    fn from_str(s: &str) -> Result<Positive, String> {
        match s.parse() {
            Ok(n) if n > 0 => Ok(Positive(n)),
            _ => Err(format!("takes a positive integer, not {s:?}")),
        }
    }
}

struct Args {
    backend: String,
    /// Blocks per arena.
    blocks: usize,
    block_size: usize,
    /// Requests to serve.
    requests: usize,
    /// Most blocks per request (1 ..= blocks / 2, or 1).
    request_blocks: usize,
    seed: u64,
    offload: bool,
    metrics_port: Option<u16>,
}

impl From<flags::KvCacheDemo> for Args {
    fn from(flags: flags::KvCacheDemo) -> Args {
        let first = BACKENDS.first().copied().unwrap_or("loopback");
        let blocks = flags.blocks.map_or(256, |n| n.0);
        Args {
            backend: flags.backend.unwrap_or_else(|| first.into()),
            blocks,
            block_size: flags.block_size.map_or(64 << 10, |n| n.0),
            requests: flags.iterations.map_or(400, |n| n.0),
            request_blocks: flags
                .request_blocks
                .map_or(32, |n| n.0)
                .min(blocks / 2)
                .max(1),
            seed: flags.seed.unwrap_or(1),
            offload: flags.offload,
            metrics_port: flags.metrics_port,
        }
    }
}

/// Backends compiled into this build, by the crate's features.
const BACKENDS: &[&str] = &[
    #[cfg(feature = "loopback")]
    "loopback",
    #[cfg(feature = "nixl")]
    "nixl",
];

/// Requests whose blocks decode keeps checked out (live sequences); older
/// ones go back to its arena, and so do more when a request needs room.
const LIVE_REQUESTS: usize = 4;

/// Device probes compiled into this build, by the crate's features.
fn probes() -> Vec<Box<dyn descriptor_core::DeviceProbe>> {
    vec![
        #[cfg(feature = "cuda")]
        Box::new(device_cuda::CudaProbe),
        #[cfg(feature = "rocm")]
        Box::new(device_rocm::RocmProbe),
    ]
}

fn list_devices() -> Result<(), String> {
    for probe in probes() {
        let devices = probe.devices().map_err(|e| e.to_string())?;
        println!(
            "{} probe: driver {}, {} device(s)",
            probe.platform(),
            if probe.available() {
                "present"
            } else {
                "absent"
            },
            devices.len()
        );
        for d in devices {
            println!(
                "  {} {} ({} MiB, pci {})",
                d.device,
                d.name,
                d.total_memory >> 20,
                d.pci_bus_id
            );
        }
    }
    Ok(())
}

/// The metrics both connectors count into, and where they are served.
#[cfg(feature = "metrics")]
type Meter = Option<(descriptor_core::metrics::Metrics, std::net::SocketAddr)>;
#[cfg(not(feature = "metrics"))]
type Meter = Option<std::convert::Infallible>;

/// Starts the metrics endpoint if `--metrics-port` asks for it.
fn meter(args: &Args) -> Result<Meter, String> {
    let Some(port) = args.metrics_port else {
        return Ok(None);
    };
    #[cfg(feature = "metrics")]
    {
        let metrics = descriptor_core::metrics::Metrics::new();
        let address = endpoint::serve(metrics.clone(), port)?;
        println!("kv-cache-demo: transfer metrics at http://{address}/metrics");
        Ok(Some((metrics, address)))
    }
    #[cfg(not(feature = "metrics"))]
    Err(format!(
        "--metrics-port {port}: this build has no metrics (build with `--features metrics`)"
    ))
}

/// A connector over `backend`, metered when `meter` says so.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
#[cfg_attr(not(any(feature = "loopback", feature = "nixl")), allow(dead_code))]
fn connector(backend: impl descriptor_core::RegistrationBackend, meter: &Meter) -> Connector {
    #[cfg(feature = "metrics")]
    if let Some((metrics, _)) = meter {
        return Connector::new(descriptor_core::metrics::Metered::new(backend, metrics));
    }
    Connector::new(backend)
}

/// Scrapes the endpoint once at the end of a clean run: `expected`
/// transfers of each direction completed, none failed.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn check_metrics(meter: &Meter, expected: &[(&str, usize)]) -> Result<(), String> {
    #[cfg(feature = "metrics")]
    if let Some((_, address)) = meter {
        return endpoint::check(*address, expected);
    }
    Ok(())
}

#[cfg_attr(
    not(any(feature = "loopback", feature = "nixl")),
    allow(unused_variables)
)]
fn connectors(backend: &str, meter: &Meter) -> Result<(Connector, Connector), String> {
    match backend {
        #[cfg(feature = "loopback")]
        "loopback" => {
            use backend_loopback::{Fabric, LoopbackBackend};
            let fabric = Fabric::new();
            let make = |name| {
                LoopbackBackend::new(&fabric, name)
                    .map(|b| connector(b, meter))
                    .map_err(|e| format!("loopback backend: {e}"))
            };
            Ok((make("prefill-worker")?, make("decode-worker")?))
        }
        #[cfg(feature = "nixl")]
        "nixl" => {
            use backend_nixl::NixlBackend;
            let make = |name| {
                NixlBackend::new(name)
                    .map(|b| connector(b, meter))
                    .map_err(|e| {
                        format!(
                            "{e} (`cargo xtask demo --backend nixl` fetches the runtime itself)"
                        )
                    })
            };
            Ok((make("prefill-worker")?, make("decode-worker")?))
        }
        other => Err(format!(
            "unknown backend {other:?}; this build has: {}",
            BACKENDS.join(", ")
        )),
    }
}

/// Why a descriptor-core call failed, with what was being done.
fn err(doing: &'static str) -> impl Fn(descriptor_core::Error) -> String {
    move |e| format!("{doing}: {e}")
}

/// xorshift64*: the request generator and the block contents.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed: never zero for the seeds used here, and
        // neighbouring seeds give unrelated streams.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`, for `n > 0`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A number in `lo..=hi`.
    fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
}

/// How a request's blocks lie in the arenas.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Consecutive blocks on both sides: one descriptor.
    Run,
    /// Blocks at random indices: one descriptor per block.
    Scattered,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Run => "runs",
            Shape::Scattered => "scattered",
        }
    }
}

/// `n` distinct free blocks of `pool` at random, in random order; `None` if
/// fewer are free.
fn scattered(pool: &BlockPool, n: usize, rng: &mut Rng) -> Option<Vec<Descriptor>> {
    let mut free: Vec<usize> = (0..pool.blocks()).filter(|&i| pool.is_free(i)).collect();
    if free.len() < n {
        return None;
    }
    for i in 0..n {
        let j = i + rng.below(free.len() - i);
        free.swap(i, j);
    }
    pool.checkout_blocks(&free[..n]).ok()
}

/// Joins views of consecutive blocks into one view of them all.
fn join(views: Vec<Descriptor>) -> Result<Descriptor, String> {
    let mut views = views.into_iter();
    let mut run = views.next().ok_or("a run of no blocks")?;
    for next in views {
        run.unsplit(next)
            .map_err(|_| "checked-out blocks that should be neighbours are not")?;
    }
    Ok(run)
}

/// Prefill's blocks for a request: its KV cache, found by index.
fn prefill_blocks(
    pool: &BlockPool,
    shape: Shape,
    n: usize,
    rng: &mut Rng,
) -> Result<Vec<Descriptor>, String> {
    match shape {
        Shape::Run => {
            let start = rng.below(pool.blocks() - n + 1);
            let indices: Vec<usize> = (start..start + n).collect();
            let views = pool
                .checkout_blocks(&indices)
                .map_err(err("prefill: checking out a run"))?;
            Ok(vec![join(views)?])
        }
        Shape::Scattered => {
            scattered(pool, n, rng).ok_or_else(|| format!("prefill: fewer than {n} free blocks"))
        }
    }
}

/// Decode's arena: one pool, and the blocks of its live requests.
struct Decode {
    pool: BlockPool,
    live: VecDeque<Vec<Descriptor>>,
    /// Live requests let go early to make room.
    evicted: usize,
}

impl Decode {
    /// Blocks for a new request, letting live requests go, oldest first,
    /// until they fit.
    fn allocate(
        &mut self,
        shape: Shape,
        n: usize,
        rng: &mut Rng,
    ) -> Result<Vec<Descriptor>, String> {
        loop {
            let views = match shape {
                Shape::Run => self.pool.checkout_run(n).map(|run| vec![run]),
                Shape::Scattered => scattered(&self.pool, n, rng),
            };
            if let Some(views) = views {
                return Ok(views);
            }
            if self.live.pop_front().is_none() {
                return Err(format!(
                    "decode: no room for {n} blocks in an arena of {} with nothing live",
                    self.pool.blocks()
                ));
            }
            self.evicted += 1;
        }
    }

    fn keep(&mut self, views: Vec<Descriptor>) {
        self.live.push_back(views);
        while self.live.len() > LIVE_REQUESTS {
            self.live.pop_front();
        }
    }
}

/// Fills every block of `views` with fresh bytes and returns their CRC-32s.
fn fill(views: &mut [Descriptor], block: usize, rng: &mut Rng) -> Result<Vec<u32>, String> {
    let mut crcs = Vec::new();
    for view in views {
        let bytes = view
            .as_mut_slice()
            .ok_or("a block that is not writable host memory")?;
        for b in bytes.chunks_mut(block) {
            for word in b.chunks_mut(8) {
                let x = rng.next().to_le_bytes();
                word.copy_from_slice(&x[..word.len()]);
            }
            crcs.push(crc32fast::hash(b));
        }
    }
    Ok(crcs)
}

/// The CRC-32 of every block of `views`, in order.
fn crcs(views: &[Descriptor], block: usize) -> Result<Vec<u32>, String> {
    let mut crcs = Vec::new();
    for view in views {
        let bytes = view.as_slice().ok_or("a block that is not host memory")?;
        crcs.extend(bytes.chunks(block).map(crc32fast::hash));
    }
    Ok(crcs)
}

/// The pool indices of every block of `views`, in order.
fn indices(views: &[Descriptor], block: usize) -> Vec<usize> {
    views
        .iter()
        .flat_map(|v| {
            let first = v.block_index().unwrap_or(usize::MAX);
            (0..v.size() / block).map(move |i| first.saturating_add(i))
        })
        .collect()
}

/// Compares the sender's checksums with the receiver's, block by block.
fn verify(
    what: &str,
    sent: &[u32],
    (from, from_blocks): (&str, &[usize]),
    (to, received): (&str, &[Descriptor]),
    block: usize,
) -> Result<usize, String> {
    let got = crcs(received, block)?;
    let to_blocks = indices(received, block);
    if got.len() != sent.len() {
        return Err(format!(
            "{what}: {} blocks sent, {} received",
            sent.len(),
            got.len()
        ));
    }
    for (i, (s, g)) in sent.iter().zip(&got).enumerate() {
        if s != g {
            return Err(format!(
                "{what}: block {i} of the request ({from} block {}, {to} block {}): CRC-32 {s:08x} sent, {g:08x} received",
                from_blocks[i], to_blocks[i]
            ));
        }
    }
    Ok(got.len())
}

/// One direction of one request.
struct Sample {
    shape: Shape,
    bytes: usize,
    time: Duration,
    /// The metadata as sent: JSON bytes.
    json: usize,
    /// Of which the agent blob (before encoding).
    agent: usize,
}

struct Served {
    read: Vec<Sample>,
    write: Vec<Sample>,
    blocks_checked: usize,
    warm_up: Duration,
    evicted: usize,
    registrations: (u64, u64),
    wall: Duration,
}

/// Sets up both arenas and serves `args.requests` requests.
fn serve(args: &Args, prefill: &Connector, decode: &Connector) -> Result<Served, String> {
    let block = NonZeroUsize::new(args.block_size).ok_or("a block size of 0")?;
    let bytes = args
        .blocks
        .checked_mul(args.block_size)
        .ok_or("the arena's size overflows")?;
    let arena = |side| {
        let mut memory = Vec::new();
        memory
            .try_reserve_exact(bytes)
            .map_err(|e| format!("{side}: cannot allocate an arena of {bytes} bytes: {e}"))?;
        memory.resize(bytes, 0u8);
        Ok::<_, String>(memory)
    };
    // The one registration per side.
    let prefill_pool =
        BlockPool::new(prefill, arena("prefill")?, block).map_err(err("prefill: the arena"))?;
    let mut decode_arena = Decode {
        pool: BlockPool::new(decode, arena("decode")?, block).map_err(err("decode: the arena"))?,
        live: VecDeque::new(),
        evicted: 0,
    };
    let registered = (prefill.registrations(), decode.registrations());
    if registered != (1, 1) {
        return Err(format!(
            "registrations after making the arenas: prefill {}, decode {} (expected 1 each)",
            registered.0, registered.1
        ));
    }

    let mut rng = Rng::new(args.seed);
    let warm_up = connect(prefill, decode, &prefill_pool, &mut decode_arena, &mut rng)?;

    let mut served = Served {
        read: Vec::with_capacity(args.requests),
        write: Vec::with_capacity(args.requests),
        blocks_checked: 0,
        warm_up,
        evicted: 0,
        registrations: (0, 0),
        wall: Duration::ZERO,
    };
    let started = Instant::now();
    for request in 0..args.requests {
        let shape = if request % 2 == 0 {
            Shape::Run
        } else {
            Shape::Scattered
        };
        // A run of one block is not a run; a pool of two blocks has no other.
        let n = match shape {
            Shape::Run if args.request_blocks > 1 => rng.between(2, args.request_blocks),
            _ => rng.between(1, args.request_blocks),
        };
        let what = |direction| {
            format!(
                "request {request} ({}, {n} blocks) {direction}",
                shape.name()
            )
        };

        // READ: prefill exposes the request's blocks; decode pulls them.
        let mut held = prefill_blocks(&prefill_pool, shape, n, &mut rng)?;
        let sent = fill(&mut held, args.block_size, &mut rng)?;
        let prefill_indices = indices(&held, args.block_size);
        let into = decode_arena.allocate(shape, n, &mut rng)?;
        let t = Instant::now();
        let readable = prefill
            .create_readable(held)
            .map_err(err("prefill: create_readable"))?;
        let json = readable.metadata().to_json();
        let metadata: RdmaMetadata = json.parse().map_err(err("decode: parsing metadata"))?;
        let read = decode
            .begin_read(&metadata, into)
            .map_err(err("decode: begin_read"))?;
        read.wait().map_err(err("decode: the READ"))?;
        readable.wait().map_err(err("prefill: the readable"))?;
        let time = t.elapsed();
        let held = readable
            .into_descriptors()
            .map_err(|_| "prefill: a completed readable kept its blocks")?;
        let mut pulled = read
            .into_descriptors()
            .map_err(|_| "decode: a completed READ kept its blocks")?;
        served.blocks_checked += verify(
            &what("READ"),
            &sent,
            ("prefill", &prefill_indices),
            ("decode", &pulled),
            args.block_size,
        )?;
        served.read.push(Sample {
            shape,
            bytes: n * args.block_size,
            time,
            json: json.len(),
            agent: metadata.agent_metadata().len(),
        });

        // WRITE: decode updates the blocks and pushes them back into the
        // same prefill blocks.
        let sent = fill(&mut pulled, args.block_size, &mut rng)?;
        let decode_indices = indices(&pulled, args.block_size);
        let t = Instant::now();
        let writable = prefill
            .create_writable(held)
            .map_err(err("prefill: create_writable"))?;
        let json = writable.metadata().to_json();
        let metadata: RdmaMetadata = json.parse().map_err(err("decode: parsing metadata"))?;
        let write = decode
            .begin_write(pulled, &metadata)
            .map_err(err("decode: begin_write"))?;
        write.wait().map_err(err("decode: the WRITE"))?;
        writable.wait().map_err(err("prefill: the writable"))?;
        let time = t.elapsed();
        let held = writable
            .into_descriptors()
            .map_err(|_| "prefill: a completed writable kept its blocks")?;
        let pushed = write
            .into_descriptors()
            .map_err(|_| "decode: a completed WRITE kept its blocks")?;
        served.blocks_checked += verify(
            &what("WRITE"),
            &sent,
            ("decode", &decode_indices),
            ("prefill", &held),
            args.block_size,
        )?;
        served.write.push(Sample {
            shape,
            bytes: n * args.block_size,
            time,
            json: json.len(),
            agent: metadata.agent_metadata().len(),
        });
        drop(held);
        decode_arena.keep(pushed);
    }
    served.wall = started.elapsed();
    served.evicted = decode_arena.evicted;
    served.registrations = (prefill.registrations(), decode.registrations());

    // Everything goes back: each arena is whole again.
    decode_arena.live.clear();
    for (side, pool) in [("prefill", &prefill_pool), ("decode", &decode_arena.pool)] {
        if pool.free() != pool.blocks() {
            return Err(format!(
                "{side}: {} of {} blocks still checked out after the last request",
                pool.blocks() - pool.free(),
                pool.blocks()
            ));
        }
    }
    Ok(served)
}

/// Connects decode to prefill once, as a worker does when it starts, so
/// that no request pays for it: [`Connector::warm_up`] on the metadata of
/// one block, then that block read (and checked).
fn connect(
    prefill: &Connector,
    decode: &Connector,
    prefill_pool: &BlockPool,
    decode_arena: &mut Decode,
    rng: &mut Rng,
) -> Result<Duration, String> {
    let block = prefill_pool.block_size();
    let mut held = prefill_blocks(prefill_pool, Shape::Scattered, 1, rng)?;
    let sent = fill(&mut held, block, rng)?;
    let from = indices(&held, block);
    let into = decode_arena.allocate(Shape::Scattered, 1, rng)?;
    let readable = prefill
        .create_readable(held)
        .map_err(err("prefill: create_readable"))?;
    let t = Instant::now();
    decode
        .warm_up(readable.metadata())
        .map_err(err("decode: warm_up"))?;
    let time = t.elapsed();
    let read = decode
        .begin_read(readable.metadata(), into)
        .map_err(err("decode: begin_read"))?;
    read.wait().map_err(err("decode: the READ"))?;
    readable.wait().map_err(err("prefill: the readable"))?;
    let pulled = read
        .into_descriptors()
        .map_err(|_| "decode: a completed READ kept its blocks")?;
    verify(
        "warm-up READ",
        &sent,
        ("prefill", &from),
        ("decode", &pulled),
        block,
    )?;
    Ok(time)
}

/// The `p`-th percentile (nearest rank) of sorted `times`.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, sorted.len().max(1)) - 1)
        .copied()
        .unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One row of the table: requests of one direction (and shape).
fn row(label: &str, samples: &[&Sample]) {
    if samples.is_empty() {
        return;
    }
    let total: Duration = samples.iter().map(|s| s.time).sum();
    let bytes: usize = samples.iter().map(|s| s.bytes).sum();
    let json: usize = samples.iter().map(|s| s.json).sum();
    let mut times: Vec<Duration> = samples.iter().map(|s| s.time).collect();
    times.sort_unstable();
    let secs = total.as_secs_f64().max(1e-9);
    println!(
        "  {label:<17} {:>8} {:>11.0} {:>8.2} {:>9.3} {:>9.3} {:>12.0}",
        samples.len(),
        samples.len() as f64 / secs,
        bytes as f64 / secs / 1e9,
        ms(percentile(&times, 50.0)),
        ms(percentile(&times, 99.0)),
        json as f64 / samples.len() as f64,
    );
}

fn report(args: &Args, served: &Served) {
    let (prefill, decode) = served.registrations;
    println!(
        "  registrations: prefill {prefill}, decode {decode} (one arena each, none per request)"
    );
    println!(
        "  warm-up: decode connected to prefill in {:.3} ms, before the first request",
        ms(served.warm_up)
    );
    for shape in [Shape::Run, Shape::Scattered] {
        let of: Vec<&Sample> = served.read.iter().filter(|s| s.shape == shape).collect();
        if of.is_empty() {
            continue;
        }
        let blocks: usize = of.iter().map(|s| s.bytes / args.block_size).sum();
        let descriptors = match shape {
            Shape::Run => format!("{} descriptors, one per run", of.len()),
            Shape::Scattered => format!("{blocks} descriptors, one per block"),
        };
        println!(
            "  {:<10} {:>5} requests, {:>6} blocks each way, {descriptors}",
            shape.name(),
            of.len(),
            blocks,
        );
    }
    println!(
        "  decode keeps its last {LIVE_REQUESTS} requests' blocks; {} let go early for room",
        served.evicted
    );
    println!(
        "  {:<17} {:>8} {:>11} {:>8} {:>9} {:>9} {:>12}",
        "", "requests", "requests/s", "GB/s", "p50 ms", "p99 ms", "metadata B"
    );
    for (direction, samples) in [("READ", &served.read), ("WRITE", &served.write)] {
        for shape in [Shape::Run, Shape::Scattered] {
            let of: Vec<&Sample> = samples.iter().filter(|s| s.shape == shape).collect();
            row(&format!("{direction} {}", shape.name()), &of);
        }
        row(
            &format!("{direction} all"),
            &samples.iter().collect::<Vec<_>>(),
        );
    }
    let both: Duration = served
        .read
        .iter()
        .chain(&served.write)
        .map(|s| s.time)
        .sum();
    let bytes: usize = served
        .read
        .iter()
        .chain(&served.write)
        .map(|s| s.bytes)
        .sum();
    let secs = both.as_secs_f64().max(1e-9);
    println!(
        "  both ways: {:.0} requests/s, {:.2} GB/s over {:.3} s of transfers ({:.3} s with filling and checksums)",
        served.read.len() as f64 / secs,
        bytes as f64 / secs / 1e9,
        secs,
        served.wall.as_secs_f64()
    );
    let agent = served.read.first().map_or(0, |s| s.agent);
    println!(
        "  metadata B: JSON per request, as sent (of which the agent blob: {agent} B, before encoding)"
    );
    println!(
        "  checksums: {} blocks, CRC-32 by sender and receiver, all equal",
        served.blocks_checked
    );
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = match flags::KvCacheDemo::from_env() {
        Ok(flags) => Args::from(flags),
        Err(e) if e.is_help() => {
            println!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kv-cache-demo: {e} (--help lists the options)");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = list_devices() {
        eprintln!("kv-cache-demo: {e}");
        return ExitCode::FAILURE;
    }
    if BACKENDS.is_empty() {
        println!(
            "kv-cache-demo: built without a backend feature (loopback, nixl): nothing to move"
        );
        return ExitCode::SUCCESS;
    }
    let result = meter(&args).and_then(|meter| {
        let (prefill, decode) = connectors(&args.backend, &meter)?;
        if args.offload {
            drop(prefill);
            println!(
                "kv-cache-demo --offload: backend {}; decode's arena {} blocks x {} KiB, registered once; {} requests of 1..={} blocks; seed {}",
                args.backend,
                args.blocks,
                args.block_size / 1024,
                args.requests,
                args.request_blocks,
                args.seed,
            );
            offload::run(&args, &decode)?;
            return check_metrics(&meter, &[("read", 0), ("write", 0)]);
        }
        println!(
            "kv-cache-demo: backend {}; one arena per side, {} blocks x {} KiB ({:.1} MiB), registered once; \
             {} requests of 1..={} blocks, both ways; seed {}",
            args.backend,
            args.blocks,
            args.block_size as f64 / 1024.0,
            (args.blocks * args.block_size) as f64 / (1 << 20) as f64,
            args.requests,
            args.request_blocks,
            args.seed,
        );
        let served = serve(&args, &prefill, &decode)?;
        report(&args, &served);
        if served.registrations != (1, 1) {
            return Err(format!(
                "registrations after serving: prefill {}, decode {} (expected 1 each)",
                served.registrations.0, served.registrations.1
            ));
        }
        if prefill.remote_agent_count() + decode.remote_agent_count() != 0 {
            return Err("remote agents left in use after all operations ended".into());
        }
        check_metrics(
            &meter,
            &[("read", served.read.len()), ("write", served.write.len())],
        )
    });
    match result {
        Ok(()) if args.offload => {
            println!("  OK: every block read back from the file verified");
            ExitCode::SUCCESS
        }
        Ok(()) => {
            println!("  OK: every block verified in both directions, one registration per side");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kv-cache-demo: {e}");
            ExitCode::FAILURE
        }
    }
}
