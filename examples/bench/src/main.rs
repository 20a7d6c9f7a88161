//! `cargo xtask bench [--quick]`: memcpy, the loopback and NIXL backends through
//! the public API, and the same transfer written directly against nixl-sys,
//! measured interleaved in one process so machine noise hits all alike.
//! Writes a table to stdout, `report.json` and `bandwidth.svg` to `--out`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod extras;
mod movers;
mod pyworker;
mod report;
mod xproc;

use std::process::ExitCode;
use std::time::Duration;

use hdrhistogram::Histogram;

use movers::{Api, Memcpy, Mover, Op, RawNixl, Res};
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
            /// Run as the passive side of the cross-process rows: api or raw.
            optional --peer kind: String
            /// Only these sizes, and no extras: BYTESxCOUNT[,...] (4096x1,65536x16).
            optional --sizes list: Sizes
            /// Only the cross-process rows, the peer run through this command
            /// prefix ('ip netns exec host-b'; '' runs it plainly).
            optional --xproc-only prefix: String
            /// Serve `bench --python` as its Rust API worker (JSON lines on stdin).
            optional --python-worker
            /// Only these movers, and no extras: NAME[,...] (memcpy, loopback,
            /// nixl, nixl-sys-raw, nixl-xproc, nixl-sys-raw-xproc).
            optional --movers list: String
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

/// (block bytes, blocks) to measure.
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
    out
}

fn iterations(total: usize, quick: bool) -> usize {
    let budget = if quick { 48 * MIB } else { 256 * MIB };
    (budget / total).clamp(if quick { 5 } else { 9 }, if quick { 300 } else { 1000 })
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

    pub(crate) fn len(&self) -> u64 {
        self.0.len()
    }
}

fn bandwidth(
    movers: &mut [Box<dyn Mover>],
    quick: bool,
    only: Option<&[(usize, usize)]>,
) -> Res<Vec<Row>> {
    let mut rows = Vec::new();
    let sizes = only.map_or_else(|| sizes(quick), <[_]>::to_vec);
    for (block, blocks) in sizes {
        for op in [Op::Read, Op::Write] {
            for m in movers.iter_mut() {
                m.prepare(op, block, blocks)?;
            }
            let iters = iterations(block * blocks, quick);
            let mut samples = (0..movers.len())
                .map(|_| Latencies::new())
                .collect::<Res<Vec<_>>>()?;
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
            for _ in 0..iters {
                for (m, s) in movers.iter_mut().zip(&mut samples) {
                    s.record(m.run(op)?)?;
                }
            }
            for (m, s) in movers.iter().zip(samples) {
                let p50 = s.at(0.5);
                rows.push(Row {
                    backend: m.name(),
                    op: op.name(),
                    block_bytes: block,
                    blocks,
                    gbps: (block * blocks) as f64 / p50.as_secs_f64() / 1e9,
                    p50_us: s.us(0.5),
                    p99_us: s.us(0.99),
                    iterations: s.len(),
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

/// Every mover, in the order they take turns, or only those `only` names.
fn all_movers(only: Option<&str>) -> Res<Vec<Box<dyn Mover>>> {
    type Make = fn() -> Res<Box<dyn Mover>>;
    let all: [(&str, Make); 6] = [
        ("memcpy", || Ok(Box::new(Memcpy::default()))),
        ("loopback", || Ok(Box::new(Api::loopback()?))),
        ("nixl", || Ok(Box::new(Api::nixl()?))),
        ("nixl-sys-raw", || Ok(Box::new(RawNixl::new()?))),
        ("nixl-xproc", || Ok(Box::new(xproc::XprocApi::new(&[])?))),
        ("nixl-sys-raw-xproc", || {
            Ok(Box::new(xproc::XprocRaw::new(&[])?))
        }),
    ];
    let wanted: Option<Vec<&str>> = only.map(|list| list.split(',').collect());
    if let Some(unknown) = wanted
        .iter()
        .flatten()
        .find(|name| all.iter().all(|(known, _)| known != *name))
    {
        return Err(format!("no mover is called {unknown:?}"));
    }
    all.iter()
        .filter(|(name, _)| wanted.as_ref().is_none_or(|w| w.contains(name)))
        .map(|(_, make)| make())
        .collect()
}

fn run(config: &flags::Bench) -> Res<()> {
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
    let mut movers: Vec<Box<dyn Mover>> = match &xproc_only {
        Some(wrap) => vec![
            Box::new(xproc::XprocApi::new(wrap)?),
            Box::new(xproc::XprocRaw::new(wrap)?),
        ],
        None => all_movers(config.movers.as_deref())?,
    };
    let only = config.sizes.as_ref().map(|s| s.0.as_slice());
    let rows = bandwidth(&mut movers, config.quick, only)?;
    drop(movers);
    let extras = if only.is_some() || xproc_only.is_some() || config.movers.is_some() {
        extras::Extras::default()
    } else {
        extras::measure(config.quick)?
    };
    report::print(&rows, &extras);
    let out = config.out.clone().unwrap_or_else(|| "target/bench".into());
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let json = out.join("report.json");
    std::fs::write(&json, report::json(&rows, &extras)).map_err(|e| e.to_string())?;
    let svg = out.join("bandwidth.svg");
    std::fs::write(&svg, report::svg(&rows)).map_err(|e| e.to_string())?;
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
    fn sizes_are_bytes_x_count_pairs() {
        let sizes: Sizes = "4096x1,65536x16".parse().unwrap();
        assert_eq!(sizes.0, [(4096, 1), (65536, 16)]);
        for bad in ["4096", "4096x", "x1", "4096x1,", "4kx1"] {
            assert!(bad.parse::<Sizes>().is_err(), "{bad:?} accepted");
        }
    }
}
