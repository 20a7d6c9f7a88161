//! `cargo xtask bench [--quick]`: memcpy, the loopback and NIXL backends through
//! the public API, and the same transfer written directly against nixl-sys,
//! measured interleaved in one process so machine noise hits all alike.
//! Writes a table to stdout, `report.json` and `bandwidth.svg` to `--out`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod extras;
mod movers;
mod report;
mod xproc;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use movers::{Api, Memcpy, Mover, Op, RawNixl, Res};
use report::Row;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

struct Config {
    quick: bool,
    out: PathBuf,
    /// Run as the passive side of the cross-process rows (`api` or `raw`).
    peer: Option<String>,
    /// Only these (block bytes, blocks), and no extras (`--sizes 4096x1,65536x16`).
    only: Option<Vec<(usize, usize)>>,
    /// Only the cross-process rows, the peer run through this command prefix
    /// (`--xproc-only 'ip netns exec host-b'`; an empty prefix runs it plainly).
    xproc_only: Option<Vec<String>>,
}

fn parse() -> Res<Config> {
    let mut config = Config {
        quick: false,
        out: PathBuf::from("target/bench"),
        peer: None,
        only: None,
        xproc_only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => config.quick = true,
            "--out" => config.out = args.next().ok_or("--out needs a folder")?.into(),
            "--peer" => config.peer = Some(args.next().ok_or("--peer needs api or raw")?),
            "--xproc-only" => {
                let wrap = args
                    .next()
                    .ok_or("--xproc-only needs a command prefix ('' for none)")?;
                config.xproc_only = Some(wrap.split_whitespace().map(str::to_owned).collect());
            }
            "--sizes" => {
                let list = args.next().ok_or("--sizes needs BYTESxCOUNT[,...]")?;
                let parsed = list
                    .split(',')
                    .map(|s| {
                        let (b, n) = s.split_once('x')?;
                        Some((b.parse().ok()?, n.parse().ok()?))
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| format!("--sizes: not BYTESxCOUNT[,...]: {list:?}"))?;
                config.only = Some(parsed);
            }
            other => {
                return Err(format!(
                    "unknown option {other:?}; usage: bench [--quick] [--out DIR] [--sizes BYTESxCOUNT,...]"
                ));
            }
        }
    }
    Ok(config)
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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
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
            let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(iters); movers.len()];
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
                    s.push(m.run(op)?);
                }
            }
            for (m, mut s) in movers.iter().zip(samples) {
                s.sort();
                let p50 = percentile(&s, 0.5);
                rows.push(Row {
                    backend: m.name(),
                    op: op.name(),
                    block_bytes: block,
                    blocks,
                    gbps: (block * blocks) as f64 / p50.as_secs_f64() / 1e9,
                    p50_us: p50.as_secs_f64() * 1e6,
                    p99_us: percentile(&s, 0.99).as_secs_f64() * 1e6,
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

fn run(config: &Config) -> Res<()> {
    if let Some(kind) = &config.peer {
        return xproc::serve(kind);
    }
    let mut movers: Vec<Box<dyn Mover>> = match &config.xproc_only {
        Some(wrap) => vec![
            Box::new(xproc::XprocApi::new(wrap)?),
            Box::new(xproc::XprocRaw::new(wrap)?),
        ],
        None => vec![
            Box::new(Memcpy::default()),
            Box::new(Api::loopback()?),
            Box::new(Api::nixl()?),
            Box::new(RawNixl::new()?),
            Box::new(xproc::XprocApi::new(&[])?),
            Box::new(xproc::XprocRaw::new(&[])?),
        ],
    };
    let rows = bandwidth(&mut movers, config.quick, config.only.as_deref())?;
    drop(movers);
    let extras = if config.only.is_some() || config.xproc_only.is_some() {
        extras::Extras::default()
    } else {
        extras::measure(config.quick)?
    };
    report::print(&rows, &extras);
    std::fs::create_dir_all(&config.out).map_err(|e| format!("{}: {e}", config.out.display()))?;
    let json = config.out.join("report.json");
    std::fs::write(&json, report::json(&rows, &extras)).map_err(|e| e.to_string())?;
    let svg = config.out.join("bandwidth.svg");
    std::fs::write(&svg, report::svg(&rows)).map_err(|e| e.to_string())?;
    println!("\nwrote {} and {}", json.display(), svg.display());
    Ok(())
}

fn main() -> ExitCode {
    let result = parse().and_then(|c| run(&c));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}
