//! `cargo xtask bench [--quick]`: memcpy, the loopback and NIXL backends through
//! the public API, and the same transfer written directly against nixl-sys,
//! taking turns in one run so machine noise hits all alike, each timed in its
//! own steady state ([`take_turn`]).
//! Writes a table to stdout, `report.json` and `bandwidth.svg` to `--out`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod extras;
mod metered;
mod movers;
mod pyworker;
mod report;
mod storage;
mod xproc;

use std::process::ExitCode;
use std::time::Duration;

use hdrhistogram::Histogram;

use movers::{Api, Memcpy, MemcpyScattered, Mover, Op, RawNixl, RawPrepped, Res, Twin};
use report::Row;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

mod flags {
    use std::path::PathBuf;

    use crate::Sizes;

    xflags::xflags! {
        /// memcpy, loopback, NIXL and raw nixl-sys, interleaved in one run.
        cmd bench {
            /// Fewer sizes and iterations.
            optional --quick
            /// Where report.json and bandwidth.svg go (default target/bench).
            optional --out dir: PathBuf
            /// Run as the passive side of the cross-process rows: api,
            /// api-no-thread or raw.
            optional --peer kind: String
            /// Only these sizes, and no extras: BYTESxCOUNT[,...] (4096x1,65536x16),
            /// each with every mover (by default the prepared-list movers are
            /// measured only at blocks up to 64 KiB, up to 16 MiB a transfer).
            optional --sizes list: Sizes
            /// Only the cross-process rows, the peer run through this command
            /// prefix ('ip netns exec host-b'; '' runs it plainly).
            optional --xproc-only prefix: String
            /// Serve `bench --python` as its Rust API worker (JSON lines on stdin).
            optional --python-worker
            /// Only these movers, and no extras: NAME[,...] (memcpy, memcpy-scattered, loopback,
            /// loopback-pool, loopback-pool-scattered, nixl, nixl-pool,
            /// nixl-pool-scattered, nixl-sys-raw, nixl-sys-raw-prepped,
            /// nixl-sys-raw-prepped-scattered, nixl-xproc, nixl-pool-xproc,
            /// nixl-pool-scattered-xproc, nixl-sys-raw-xproc,
            /// nixl-sys-raw-prepped-xproc, nixl-sys-raw-prepped-scattered-xproc;
            /// and, never by default, nixl-sys-raw-twin and nixl-sys-raw-xproc-twin: a second
            /// raw baseline, whose ratio to the first is the bench's own noise;
            /// nixl-no-thread and nixl-xproc-no-thread: ours without NIXL's
            /// progress threads, as raw runs in process; nixl-sys-raw-thread:
            /// raw in process with them, as ours runs by default;
            /// nixl-sys-raw-xproc-waiting: raw across processes, its target
            /// waiting for the notification during the transfer, as ours').
            optional --movers list: String
            /// Sweeps of every size, each interleaved on its own; a row reports
            /// the median of the sweeps (default 6 with --quick, else 3).
            optional --runs n: usize
            /// Every NIXL agent of the run, ours and raw, both sides, without
            /// peer-failure detection (UCX's error handling mode 'none', not
            /// NIXL's default 'peer'): on one host, notifications then go
            /// through shared memory instead of TCP.
            optional --no-peer-failure-detection
            /// Each cross-process transfer starts this many microseconds after
            /// the one before ended (not timed): a transfer after a pause, as
            /// after an RPC hop, instead of back to back (default 0).
            optional --gap-us micros: u64
            /// Only the storage rows (blocks between memory and files; with
            /// --sizes, at those sizes).
            optional --storage-only
            /// No storage rows.
            optional --no-storage
            /// Only what the transfer metrics cost: 4 KiB round trips, bare
            /// and metered, in interleaved batches (loopback and NIXL).
            optional --metrics-only
        }
    }
}

/// `--sizes`: (block bytes, blocks) pairs.
#[derive(Debug)]
struct Sizes(Vec<(usize, usize)>);

impl std::str::FromStr for Sizes {
    type Err = String;

    fn from_str(list: &str) -> Res<Sizes> {
        list.split(',')
            .map(|s| {
                let (b, n) = s.split_once('x')?;
                Some((b.parse().ok()?, n.parse().ok()?))
            })
            .collect::<Option<Vec<_>>>()
            .map(Sizes)
            .ok_or_else(|| format!("not BYTESxCOUNT[,...]: {list:?}"))
    }
}

/// (block bytes, blocks) to measure: single blocks, then 16, 256 and (full
/// sweep) 1024 blocks of 4 KiB, 64 KiB and 1 MiB up to a cap, then many
/// blocks of 4 KiB, where a request built per transfer costs raw nixl-sys
/// most against lists prepared once (`nixl-sys-raw-prepped`): 1024 in the
/// quick sweep too, 4096 in the full one.
fn sizes(quick: bool) -> Vec<(usize, usize)> {
    let singles: &[usize] = if quick {
        &[4 * KIB, 64 * KIB, MIB, 16 * MIB]
    } else {
        &[4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB]
    };
    let counts: &[usize] = if quick { &[16, 256] } else { &[16, 256, 1024] };
    let cap = if quick { 64 * MIB } else { 256 * MIB };
    let mut out: Vec<(usize, usize)> = singles.iter().map(|&b| (b, 1)).collect();
    for &n in counts {
        for b in [4 * KIB, 64 * KIB, MIB] {
            if b * n <= cap {
                out.push((b, n));
            }
        }
    }
    let many: &[usize] = if quick { &[1024] } else { &[4096] };
    out.extend(many.iter().map(|&n| (4 * KIB, n)));
    out
}

/// Transfers of one size timed per mover in each of `runs` sweeps: together
/// about what one sweep took before, but at least ten per sweep. (With five,
/// loopback against memcpy at 16 MiB, the same copy, measured 0.87-1.13 x in
/// single rows of six runs; with ten, 0.93-1.07 x.)
fn iterations(total: usize, quick: bool, runs: usize) -> usize {
    const LEAST: usize = 10;
    let (budget, most) = if quick {
        (48 * MIB, 300)
    } else {
        (256 * MIB, 1000)
    };
    ((budget / total).clamp(LEAST, most) / runs.max(1)).max(LEAST)
}

/// Sweeps a run makes unless told (`--runs`). The quick budget's small
/// transfers are shared between the sweeps ([`iterations`]), so more sweeps
/// cost only at the large sizes, where a row drifts from sweep to sweep more
/// than within one: raw nixl-sys against its own twin across processes (1 and
/// 16 MiB, 64 KiB x 16, 1 MiB x 16, 4 and 64 KiB x 256; eight runs of each
/// setting) measured a standard deviation of 0.078 with three sweeps and
/// 0.052 with six, and 0.073 with three sweeps of three times the transfers.
/// At 4 KiB, 64 KiB and 4 KiB x 16 it was 0.03-0.05 either way.
fn default_runs(quick: bool) -> usize {
    if quick { 6 } else { 3 }
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Latencies at nanosecond resolution, three significant digits.
pub(crate) struct Latencies(Histogram<u64>);

impl Latencies {
    pub(crate) fn new() -> Res<Latencies> {
        Histogram::new(3).map(Latencies).map_err(|e| e.to_string())
    }

    pub(crate) fn record(&mut self, sample: Duration) -> Res<()> {
        let ns = u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX);
        // `record` grows the histogram to fit (`saturating_record` would clamp).
        self.0.record(ns).map_err(|e| format!("{sample:?}: {e}"))
    }

    /// The latency at quantile `q` (0.5 for the median).
    pub(crate) fn at(&self, q: f64) -> Duration {
        Duration::from_nanos(self.0.value_at_quantile(q))
    }

    /// The same, in microseconds.
    pub(crate) fn us(&self, q: f64) -> f64 {
        self.at(q).as_secs_f64() * 1e6
    }

    /// The mean, in microseconds.
    pub(crate) fn mean_us(&self) -> f64 {
        self.0.mean() / 1e3
    }

    /// The share of samples (0 to 1) longer than `limit`.
    pub(crate) fn over(&self, limit: Duration) -> f64 {
        let limit = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
        let within = self.0.count_between(0, limit);
        self.0.len().saturating_sub(within) as f64 / self.0.len().max(1) as f64
    }

    pub(crate) fn len(&self) -> u64 {
        self.0.len()
    }
}

/// Every size, `runs` times over: within a sweep the movers take turns
/// ([`take_turn`]) round by round, in a shuffled order, so noise hits all
/// alike; each row then reports the median of its sweeps (p50, p99), with
/// each sweep's p50 kept.
fn bandwidth(
    movers: &mut [Box<dyn Mover>],
    quick: bool,
    only: Option<&[(usize, usize)]>,
    runs: usize,
) -> Res<Vec<Row>> {
    if runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let sizes = only.map_or_else(|| sizes(quick), <[_]>::to_vec);
    let mut sweeps: Vec<Vec<Row>> = Vec::new();
    for run in 1..=runs {
        // Sizes asked for by name are measured with every mover.
        sweeps.push(sweep(movers, quick, &sizes, runs, run, only.is_some())?);
        eprintln!("bench: sweep {run} of {runs} done");
    }
    // The first sweep's rows, in measurement order, take the medians.
    let mut rows = sweeps.remove(0);
    for row in &mut rows {
        let same = |r: &&Row| {
            (r.backend, r.op, r.block_bytes, r.blocks)
                == (row.backend, row.op, row.block_bytes, row.blocks)
        };
        let others: Vec<&Row> = sweeps.iter().filter_map(|s| s.iter().find(same)).collect();
        let mut p50s: Vec<f64> = others.iter().map(|r| r.p50_us).collect();
        p50s.insert(0, row.p50_us);
        let mut p99s: Vec<f64> = others.iter().map(|r| r.p99_us).collect();
        p99s.push(row.p99_us);
        // The mean and the share of stalls are over every transfer timed.
        let weighted = |value: fn(&Row) -> f64| {
            let all = std::iter::once(&*row).chain(others.iter().copied());
            let n: u64 = all.clone().map(|r| r.iterations).sum();
            all.map(|r| value(r) * r.iterations as f64).sum::<f64>() / n.max(1) as f64
        };
        let (mean_us, slow) = (weighted(|r| r.mean_us), weighted(|r| r.slow));
        (row.mean_us, row.slow) = (mean_us, slow);
        row.iterations += others.iter().map(|r| r.iterations).sum::<u64>();
        row.registrations = others.iter().fold(row.registrations, |sum, r| {
            sum.zip(r.registrations).map(|(sum, more)| sum + more)
        });
        row.p50_runs_us.clone_from(&p50s);
        row.p50_us = median(&mut p50s);
        row.p99_us = median(&mut p99s);
        row.gbps = (row.block_bytes * row.blocks) as f64 / row.p50_us / 1e3;
    }
    Ok(rows)
}

/// Sweep `run` of `runs`: every size, the movers taking turns round by
/// round, each round in a new order; at each size only the movers measured
/// there ([`Mover::measures`]), or every one (`every`).
fn sweep(
    movers: &mut [Box<dyn Mover>],
    quick: bool,
    sizes: &[(usize, usize)],
    runs: usize,
    run: usize,
    every: bool,
) -> Res<Vec<Row>> {
    let mut rows = Vec::new();
    for &(block, blocks) in sizes {
        for op in [Op::Read, Op::Write] {
            let mut movers: Vec<&mut dyn Mover> = movers
                .iter_mut()
                .filter(|m| every || m.measures(block, blocks))
                .map(|m| &mut **m)
                .collect();
            for m in movers.iter_mut() {
                m.prepare(op, block, blocks)?;
            }
            let iters = iterations(block * blocks, quick, runs);
            let mut samples = (0..movers.len())
                .map(|_| Latencies::new())
                .collect::<Res<Vec<_>>>()?;
            // Registrations during the timed transfers, where the mover counts.
            let mut registered: Vec<Option<u64>> = movers
                .iter()
                .map(|m| m.registrations().map(|_| 0))
                .collect();
            // Warm-up round (connections, page faults), verified, not timed.
            for m in movers.iter_mut() {
                m.run(op)?;
                if !m.verify(op) {
                    return Err(format!(
                        "{}: {} of {blocks} x {block} B moved wrong bytes",
                        m.name(),
                        op.name()
                    ));
                }
            }
            // Each round gives every mover a turn, in a new order (shuffled,
            // the same in every bench run, other in each sweep), so drift in
            // the machine hits all alike, and no mover keeps places in the
            // rounds that every sweep, and so their median, would repeat
            // (decision 0015, "Measured again").
            let mut order: Vec<usize> = (0..movers.len()).collect();
            let seed =
                block as u64 ^ blocks as u64 ^ (run as u64).wrapping_mul(0xA24B_AED4_963E_E407);
            let mut shuffle = Shuffle::new(seed);
            for turn in turns(iters) {
                shuffle.permute(&mut order);
                for &i in &order {
                    let made = take_turn(&mut *movers[i], op, turn, &mut samples[i])?;
                    registered[i] = registered[i].zip(made).map(|(sum, made)| sum + made);
                }
            }
            for ((m, s), registrations) in movers.iter().zip(samples).zip(registered) {
                rows.push(Row {
                    backend: m.name(),
                    op: op.name(),
                    block_bytes: block,
                    blocks,
                    gbps: (block * blocks) as f64 / s.at(0.5).as_secs_f64() / 1e9,
                    p50_us: s.us(0.5),
                    p99_us: s.us(0.99),
                    mean_us: s.mean_us(),
                    slow: s.over(s.at(0.5) * SLOW),
                    p50_runs_us: Vec::new(),
                    iterations: s.len(),
                    registrations,
                });
            }
            eprintln!(
                "bench: {} {blocks} x {block} B done ({iters} iterations)",
                op.name()
            );
        }
    }
    Ok(rows)
}

/// A transfer slower than this many times its sweep's p50 counts as stalled
/// (`slow_share` in the report).
pub(crate) const SLOW: u32 = 4;

/// Most transfers timed in one turn of a mover.
const TURN: usize = 5;
/// Fewest rounds a sweep splits a size's transfers into, so that drift in
/// the machine still hits every mover alike.
const ROUNDS: usize = 5;
/// Transfers a mover makes untimed at the start of each turn.
const WARM_UP: usize = 3;
/// Quiet time before each turn.
const SETTLE: Duration = Duration::from_millis(2);

/// How many transfers each round's turns time: `iters` in all, at most
/// [`TURN`] at a time, in at least [`ROUNDS`] rounds where there are that
/// many transfers.
fn turns(iters: usize) -> impl Iterator<Item = usize> {
    let turn = (iters / ROUNDS).clamp(1, TURN);
    (0..iters)
        .step_by(turn)
        .map(move |done| (iters - done).min(turn))
}

/// One mover's turn: the machine left quiet for [`SETTLE`], [`WARM_UP`]
/// transfers untimed, then `timed` transfers back to back, recorded. Returns
/// the backend registrations the timed transfers made, where the mover
/// counts them ([`Mover::registrations`]).
///
/// So every mover is timed in its own steady state, as a stream of transfers
/// would see it, not in the wake of another mover (each leaves threads
/// behind for a while: NIXL's, and this library's watcher). Why turns of
/// five, and what the first transfers after the quiet time cost, measured:
/// docs/decisions/0009-performance-history.md (bench method).
fn take_turn(
    mover: &mut dyn Mover,
    op: Op,
    timed: usize,
    samples: &mut Latencies,
) -> Res<Option<u64>> {
    std::thread::sleep(SETTLE);
    for _ in 0..WARM_UP {
        mover.run(op)?;
    }
    let before = mover.registrations();
    for _ in 0..timed {
        samples.record(mover.run(op)?)?;
    }
    let after = mover.registrations();
    Ok(before
        .zip(after)
        .map(|(before, after)| after.saturating_sub(before)))
}

/// A fixed-seed xorshift generator: reproducible shuffles, no dependency.
struct Shuffle(u64);

impl Shuffle {
    fn new(seed: u64) -> Shuffle {
        // Never zero: xorshift would stay at zero.
        Shuffle(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Fisher-Yates.
    fn permute(&mut self, items: &mut [usize]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// Every default mover, or only those `only` names, in the report's order.
fn all_movers(only: Option<&str>) -> Res<Vec<Box<dyn Mover>>> {
    type Make = fn() -> Res<Box<dyn Mover>>;
    // (name, in the default set, maker)
    let all: [(&str, bool, Make); 23] = [
        ("memcpy", true, || Ok(Box::new(Memcpy::default()))),
        ("memcpy-scattered", true, || {
            Ok(Box::new(MemcpyScattered::new()))
        }),
        ("loopback", true, || Ok(Box::new(Api::loopback()?))),
        ("loopback-pool", true, || {
            Ok(Box::new(Api::loopback_pool("loopback-pool", 1)?))
        }),
        ("loopback-pool-scattered", true, || {
            Ok(Box::new(Api::loopback_pool("loopback-pool-scattered", 2)?))
        }),
        ("nixl", true, || Ok(Box::new(Api::nixl()?))),
        ("nixl-pool", true, || {
            Ok(Box::new(Api::nixl_pool("nixl-pool", 1)?))
        }),
        ("nixl-pool-scattered", true, || {
            Ok(Box::new(Api::nixl_pool("nixl-pool-scattered", 2)?))
        }),
        ("nixl-no-thread", false, || {
            Ok(Box::new(Api::nixl_without_thread()?))
        }),
        ("nixl-sys-raw", true, || Ok(Box::new(RawNixl::new()?))),
        ("nixl-sys-raw-thread", false, || {
            Ok(Box::new(RawNixl::with_progress_threads()?))
        }),
        ("nixl-sys-raw-twin", false, || {
            Ok(Box::new(Twin::new(RawNixl::new()?, "nixl-sys-raw-twin")))
        }),
        ("nixl-sys-raw-prepped", true, || {
            Ok(Box::new(RawPrepped::contiguous()?))
        }),
        ("nixl-sys-raw-prepped-scattered", true, || {
            Ok(Box::new(RawPrepped::scattered()?))
        }),
        ("nixl-xproc", true, || {
            Ok(Box::new(xproc::XprocApi::new(&[])?))
        }),
        ("nixl-pool-xproc", true, || {
            Ok(Box::new(xproc::XprocApi::pool("nixl-pool-xproc", 1)?))
        }),
        ("nixl-pool-scattered-xproc", true, || {
            Ok(Box::new(xproc::XprocApi::pool(
                "nixl-pool-scattered-xproc",
                2,
            )?))
        }),
        ("nixl-xproc-no-thread", false, || {
            Ok(Box::new(xproc::XprocApi::without_thread()?))
        }),
        ("nixl-sys-raw-xproc", true, || {
            Ok(Box::new(xproc::XprocRaw::new(&[])?))
        }),
        ("nixl-sys-raw-xproc-waiting", false, || {
            Ok(Box::new(xproc::XprocRaw::waiting()?))
        }),
        ("nixl-sys-raw-xproc-twin", false, || {
            let raw = xproc::XprocRaw::new(&[])?;
            Ok(Box::new(Twin::new(raw, "nixl-sys-raw-xproc-twin")))
        }),
        ("nixl-sys-raw-prepped-xproc", true, || {
            Ok(Box::new(xproc::XprocPrepped::contiguous()?))
        }),
        ("nixl-sys-raw-prepped-scattered-xproc", true, || {
            Ok(Box::new(xproc::XprocPrepped::scattered()?))
        }),
    ];
    let wanted: Option<Vec<&str>> = only.map(|list| list.split(',').collect());
    if let Some(unknown) = wanted
        .iter()
        .flatten()
        .find(|name| all.iter().all(|(known, _, _)| known != *name))
    {
        return Err(format!("no mover is called {unknown:?}"));
    }
    all.iter()
        .filter(|(name, default, _)| wanted.as_ref().map_or(*default, |w| w.contains(name)))
        .map(|(_, _, make)| make())
        .collect()
}

fn run(config: &flags::Bench) -> Res<()> {
    if config.no_peer_failure_detection {
        movers::without_peer_failure_detection();
    }
    if let Some(micros) = config.gap_us {
        xproc::set_gap(Duration::from_micros(micros));
    }
    if let Some(kind) = &config.peer {
        return xproc::serve(kind);
    }
    if config.python_worker {
        return pyworker::serve();
    }
    let xproc_only: Option<Vec<String>> = config
        .xproc_only
        .as_ref()
        .map(|wrap| wrap.split_whitespace().map(str::to_owned).collect());
    let out = config.out.clone().unwrap_or_else(|| "target/bench".into());
    let runs = config.runs.unwrap_or(default_runs(config.quick));
    if config.storage_only {
        let only = config.sizes.as_ref().map(|s| s.0.clone());
        let stored = storage_rows(&out, config.quick, runs, only)?;
        return report_out(&[], &stored, &extras::Extras::default(), &out);
    }
    if config.metrics_only {
        let mut extras = extras::Extras::default();
        metered::measure(&mut extras, config.quick)?;
        return report_out(&[], &[], &extras, &out);
    }
    let mut movers: Vec<Box<dyn Mover>> = match &xproc_only {
        Some(wrap) => vec![
            Box::new(xproc::XprocApi::new(wrap)?),
            Box::new(xproc::XprocRaw::new(wrap)?),
        ],
        None => all_movers(config.movers.as_deref())?,
    };
    let only = config.sizes.as_ref().map(|s| s.0.as_slice());
    let rows = bandwidth(&mut movers, config.quick, only, runs)?;
    drop(movers);
    let restricted = only.is_some() || xproc_only.is_some() || config.movers.is_some();
    let extras = if restricted {
        extras::Extras::default()
    } else {
        extras::measure(config.quick)?
    };
    let stored = if restricted || config.no_storage {
        Vec::new()
    } else {
        storage_rows(&out, config.quick, runs, None)?
    };
    report_out(&rows, &stored, &extras, &out)
}

/// The storage rows ([`storage`]): each placement and cache swept on its
/// own, `O_DIRECT` only where the file system under `out` takes it; at
/// `sizes`, or the storage sizes.
fn storage_rows(
    out: &std::path::Path,
    quick: bool,
    runs: usize,
    sizes: Option<Vec<(usize, usize)>>,
) -> Res<Vec<Row>> {
    let sizes = sizes.unwrap_or_else(|| storage::sizes(quick));
    use storage::{Cache, Placement};
    let dir = out.join("storage-files");
    let direct = storage::direct_works(&dir)?;
    if !direct {
        eprintln!(
            "bench: {} does not take O_DIRECT: no -direct rows",
            dir.display()
        );
    }
    let mut rows = Vec::new();
    for cache in [Cache::Page, Cache::Direct] {
        if cache == Cache::Direct && !direct {
            continue;
        }
        for placement in [Placement::Contiguous, Placement::Scattered] {
            // The page cache rows' writes are never synced: written back
            // now, not during the next sweep, whose disk they would share.
            // SAFETY: `sync` takes no arguments and touches no memory of ours.
            unsafe { libc::sync() };
            let mut movers = storage::movers(&dir, placement, cache)?;
            rows.extend(bandwidth(&mut movers, quick, Some(&sizes), runs)?);
            eprintln!("bench: storage rows, {placement:?} blocks, {cache:?} cache, done");
        }
    }
    let _ = std::fs::remove_dir(&dir);
    Ok(rows)
}

/// Prints the tables and writes `report.json` and `bandwidth.svg` to `out`:
/// the memory rows, then the storage rows.
fn report_out(
    rows: &[Row],
    stored: &[Row],
    extras: &extras::Extras,
    out: &std::path::Path,
) -> Res<()> {
    report::print(rows, stored, extras);
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let json = out.join("report.json");
    std::fs::write(&json, report::json(rows, stored, extras)).map_err(|e| e.to_string())?;
    let svg = out.join("bandwidth.svg");
    std::fs::write(&svg, report::svg(rows)).map_err(|e| e.to_string())?;
    println!("\nwrote {} and {}", json.display(), svg.display());
    Ok(())
}

fn main() -> ExitCode {
    let config = match flags::Bench::from_env() {
        Ok(config) => config,
        Err(e) if e.is_help() => {
            println!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("bench: {e} (bench --help lists the options)");
            return ExitCode::from(2);
        }
    };
    match run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_microsecond_to_a_millisecond() {
        let mut latencies = Latencies::new().unwrap();
        for us in 1..=1000 {
            latencies.record(Duration::from_micros(us)).unwrap();
        }
        assert_eq!(latencies.len(), 1000);
        // Three significant digits: within 0.1 % of the exact order statistic.
        assert!(
            (latencies.us(0.5) - 500.0).abs() <= 0.5,
            "{}",
            latencies.us(0.5)
        );
        assert!(
            (latencies.us(0.99) - 990.0).abs() <= 1.0,
            "{}",
            latencies.us(0.99)
        );
        assert!(
            (latencies.us(0.0) - 1.0).abs() <= 0.001,
            "{}",
            latencies.us(0.0)
        );
    }

    #[test]
    fn the_mean_and_the_share_over_a_limit_count_the_slow_transfers() {
        let mut latencies = Latencies::new().unwrap();
        for _ in 0..9 {
            latencies.record(Duration::from_micros(100)).unwrap();
        }
        latencies.record(Duration::from_millis(3)).unwrap();
        // The p50 does not see the slow one; the mean and the share do.
        assert!((latencies.us(0.5) - 100.0).abs() <= 0.1);
        let mean = latencies.mean_us();
        assert!((mean - 390.0).abs() <= 1.0, "{mean}");
        assert!((latencies.over(Duration::from_millis(1)) - 0.1).abs() < 1e-9);
        assert_eq!(latencies.over(Duration::from_millis(5)), 0.0);
        assert_eq!(Latencies::new().unwrap().over(Duration::ZERO), 0.0);
    }

    #[test]
    fn a_row_reports_the_median_of_its_sweeps() {
        assert_eq!(median(&mut [5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [7.0]), 7.0);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn sweeps_share_one_sweeps_iterations_but_keep_a_few_each() {
        // Small transfers: the quick budget's 300 rounds, split over 3 sweeps.
        assert_eq!(iterations(4 * KIB, true, 3), 100);
        assert_eq!(iterations(4 * KIB, true, 1), 300);
        // Large ones keep the floor in every sweep.
        assert_eq!(iterations(16 * MIB, true, 3), 10);
        assert_eq!(iterations(64 * MIB, false, 3), 10);
    }

    #[test]
    fn turns_time_every_transfer_five_at_most_in_five_rounds_at_least() {
        assert_eq!(turns(100).collect::<Vec<_>>(), [5; 20]);
        assert_eq!(turns(30).collect::<Vec<_>>(), [5; 6]);
        assert_eq!(turns(12).collect::<Vec<_>>(), [2; 6]);
        assert_eq!(turns(16).collect::<Vec<_>>(), [3, 3, 3, 3, 3, 1]);
        assert_eq!(turns(5).collect::<Vec<_>>(), [1; 5]);
        assert_eq!(turns(3).collect::<Vec<_>>(), [1; 3]);
        assert_eq!(turns(0).count(), 0);
    }

    /// Reports its calls, counted from one, as that many microseconds.
    struct Counting(u64);

    impl Mover for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }
        fn prepare(&mut self, _op: Op, _block: usize, _blocks: usize) -> Res<()> {
            Ok(())
        }
        fn run(&mut self, _op: Op) -> Res<Duration> {
            self.0 += 1;
            Ok(Duration::from_micros(self.0))
        }
        fn verify(&self, _op: Op) -> bool {
            true
        }
    }

    #[test]
    fn a_turn_times_only_the_transfers_after_its_warm_up() {
        let mut mover = Counting(0);
        let mut samples = Latencies::new().unwrap();
        assert_eq!(take_turn(&mut mover, Op::Read, 6, &mut samples), Ok(None));
        take_turn(&mut mover, Op::Read, 4, &mut samples).unwrap();
        assert_eq!(mover.0 as usize, 2 * WARM_UP + 10);
        assert_eq!(samples.len(), 10);
        // The first turn timed calls 4-9, the second 13-16: six samples up
        // to 9 µs, the seventh at 13.
        let at = |q| samples.us(q).round() as usize;
        assert_eq!(WARM_UP, 3);
        assert_eq!([at(0.0), at(0.6), at(0.61), at(1.0)], [4, 9, 13, 16]);
    }

    /// Registers once per call, and three times more every fourth.
    struct Registering(u64, u64);

    impl Mover for Registering {
        fn name(&self) -> &'static str {
            "registering"
        }
        fn prepare(&mut self, _op: Op, _block: usize, _blocks: usize) -> Res<()> {
            Ok(())
        }
        fn run(&mut self, _op: Op) -> Res<Duration> {
            self.0 += 1;
            self.1 += if self.0.is_multiple_of(4) { 4 } else { 1 };
            Ok(Duration::from_micros(1))
        }
        fn verify(&self, _op: Op) -> bool {
            true
        }
        fn registrations(&self) -> Option<u64> {
            Some(self.1)
        }
    }

    #[test]
    fn a_turn_counts_the_registrations_of_its_timed_transfers_only() {
        let mut mover = Registering(0, 0);
        let mut samples = Latencies::new().unwrap();
        // Calls 1-3 warm up (3 registrations), 4-8 are timed: 4 + 1 + 1 + 1 + 4.
        let made = take_turn(&mut mover, Op::Read, 5, &mut samples).unwrap();
        assert_eq!(made, Some(11));
        assert_eq!(mover.1, 14);
        assert_eq!(samples.len(), 5);
    }

    #[test]
    fn every_mover_runs_once_a_round_and_follows_every_other() {
        let n = 6;
        let mut shuffle = Shuffle::new(4096);
        let mut order: Vec<usize> = (0..n).collect();
        let mut follows = vec![vec![0u32; n]; n];
        let mut first = vec![0u32; n];
        for _ in 0..3000 {
            shuffle.permute(&mut order);
            let mut seen = order.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "not a permutation");
            first[order[0]] += 1;
            for pair in order.windows(2) {
                follows[pair[1]][pair[0]] += 1;
            }
        }
        // 3000 rounds: each mover goes first ~500 times, and runs right after
        // each other mover ~500 times.
        assert!(first.iter().all(|&f| (350..650).contains(&f)), "{first:?}");
        for (mover, before) in follows.iter().enumerate() {
            for (other, &count) in before.iter().enumerate() {
                if other != mover {
                    assert!((350..650).contains(&count), "{follows:?}");
                }
            }
        }
    }

    #[test]
    fn the_full_sweep_has_every_size_the_prepared_list_rows_need() {
        let full = sizes(false);
        for size in [
            (4 * KIB, 1),
            (4 * KIB, 16),
            (4 * KIB, 256),
            (4 * KIB, 1024),
            (4 * KIB, 4096),
            (64 * KIB, 16),
            (64 * KIB, 256),
        ] {
            assert!(full.contains(&size), "{size:?} missing from {full:?}");
        }
        let quick = sizes(true);
        assert!(quick.contains(&(4 * KIB, 1024)), "{quick:?}");
        assert!(!quick.contains(&(4 * KIB, 4096)), "{quick:?}");
        assert!(quick.iter().all(|s| full.contains(s)), "{quick:?}");
        let mut distinct = full.clone();
        distinct.dedup();
        assert_eq!(distinct, full);
    }

    #[test]
    fn sizes_are_bytes_x_count_pairs() {
        let sizes: Sizes = "4096x1,65536x16".parse().unwrap();
        assert_eq!(sizes.0, [(4096, 1), (65536, 16)]);
        for bad in ["4096", "4096x", "x1", "4096x1,", "4kx1"] {
            assert!(bad.parse::<Sizes>().is_err(), "{bad:?} accepted");
        }
    }
}
