//! The table, `report.json` and `bandwidth.svg`.

use std::fmt::Write as _;

use crate::extras::Extras;

/// One backend, operation and size.
pub(crate) struct Row {
    pub(crate) backend: &'static str,
    pub(crate) op: &'static str,
    pub(crate) block_bytes: usize,
    pub(crate) blocks: usize,
    pub(crate) gbps: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    /// The mean over every timed transfer of every sweep: unlike the p50, it
    /// counts the rare slow transfer at its full cost.
    pub(crate) mean_us: f64,
    /// The share of timed transfers (0 to 1) that took more than
    /// [`SLOW`](crate::SLOW) times their sweep's p50: stalls, which the p50
    /// and often the p99 do not show.
    pub(crate) slow: f64,
    /// Each sweep's p50, in sweep order (`p50_us` is their median).
    pub(crate) p50_runs_us: Vec<f64>,
    pub(crate) iterations: u64,
    /// Backend registrations made during the timed transfers (`iterations`
    /// of them), where the mover counts them.
    pub(crate) registrations: Option<u64>,
}

impl Row {
    /// Backend registrations per timed transfer, where known.
    pub(crate) fn registrations_per_op(&self) -> Option<f64> {
        self.registrations
            .map(|n| n as f64 / self.iterations.max(1) as f64)
    }
}

const BACKENDS: [&str; 6] = [
    "memcpy",
    "loopback",
    "nixl",
    "nixl-sys-raw",
    "nixl-xproc",
    "nixl-sys-raw-xproc",
];

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn find<'a>(
    rows: &'a [Row],
    backend: &str,
    op: &str,
    block: usize,
    blocks: usize,
) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.backend == backend && r.op == op && r.block_bytes == block && r.blocks == blocks
    })
}

/// Configurations in measurement order.
fn configs(rows: &[Row]) -> Vec<(&'static str, usize, usize)> {
    let mut out: Vec<(&'static str, usize, usize)> = Vec::new();
    for r in rows {
        if !out.contains(&(r.op, r.block_bytes, r.blocks)) {
            out.push((r.op, r.block_bytes, r.blocks));
        }
    }
    out
}

pub(crate) fn print(rows: &[Row], stored: &[Row], extras: &Extras) {
    let sweeps = rows.first().map_or(0, |r| r.p50_runs_us.len());
    if !crate::movers::peer_failure_detection() {
        println!(
            "\nNIXL agents (ours and raw) without peer-failure detection: ucx_error_handling_mode=none"
        );
    }
    println!(
        "\n== bandwidth (GB/s from the p50; p50 / p99 in us; each the median of {sweeps} sweeps) =="
    );
    println!(
        "{:<6} {:>8} {:>5} | {:>16} | {:>16} {:>6} | {:>16} {:>6} | {:>16}",
        "op", "block", "count", "memcpy", "loopback", "xmemc", "nixl", "xraw", "nixl-sys-raw"
    );
    let cell = |r: Option<&Row>| {
        r.map_or_else(
            || "-".to_owned(),
            |r| format!("{:6.2} ({:>7.1})", r.gbps, r.p50_us),
        )
    };
    for (op, block, blocks) in configs(rows) {
        let get = |b| find(rows, b, op, block, blocks);
        let ratio = |a: Option<&Row>, b: Option<&Row>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}", a.gbps / b.gbps),
            _ => "-".into(),
        };
        println!(
            "{:<6} {:>8} {:>5} | {:>16} | {:>16} {:>6} | {:>16} {:>6} | {:>16}",
            op,
            human(block),
            blocks,
            cell(get("memcpy")),
            cell(get("loopback")),
            ratio(get("loopback"), get("memcpy")),
            cell(get("nixl")),
            ratio(get("nixl"), get("nixl-sys-raw")),
            cell(get("nixl-sys-raw")),
        );
    }
    let gap = crate::xproc::gap();
    if !gap.is_zero() {
        println!(
            "\nCross-process transfers each start {} us after the last one ended (--gap-us)",
            gap.as_micros()
        );
    }
    println!("\n== cross-process: the passive side in a child process (GB/s; p50 / p99 in us) ==");
    println!(
        "{:<6} {:>8} {:>5} | {:>26} {:>6} | {:>26}",
        "op", "block", "count", "nixl-xproc", "xraw", "nixl-sys-raw-xproc"
    );
    let wide = |r: Option<&Row>| {
        r.map_or_else(
            || "-".to_owned(),
            |r| format!("{:6.2} ({:>7.1} / {:>7.1})", r.gbps, r.p50_us, r.p99_us),
        )
    };
    for (op, block, blocks, ours, raw) in xproc_pairs(rows) {
        let ratio = match (ours, raw) {
            (Some(a), Some(b)) => format!("{:.2}", a.gbps / b.gbps),
            _ => "-".into(),
        };
        println!(
            "{:<6} {:>8} {:>5} | {:>26} {:>6} | {:>26}",
            op,
            human(block),
            blocks,
            wide(ours),
            ratio,
            wide(raw)
        );
    }
    print_tail(rows);
    for (title, only_with, columns) in RATIO_TABLES {
        print_pairs(rows, title, only_with, columns);
    }
    print_storage(stored);
    println!("\n== other measurements ==");
    for (name, value, unit) in &extras.items {
        println!("  {name:<72} {value:>12.2} {unit}");
    }
    println!("\n== targets ==");
    for line in targets(rows, extras)
        .into_iter()
        .chain(storage_targets(stored))
    {
        println!("  {line}");
    }
}

/// The storage rows' settings: (heading, the suffix of their movers' names).
const STORAGE_SETTINGS: [(&str, &str); 4] = [
    ("page cache, contiguous blocks", ""),
    ("page cache, scattered blocks", "-scattered"),
    ("O_DIRECT, contiguous blocks", "-direct"),
    ("O_DIRECT, scattered blocks", "-scattered-direct"),
];

/// The storage movers, in column order, without their setting's suffix.
const STORAGE_MOVERS: [&str; 5] = [
    "file-plain",
    "file-uring",
    "nixl-sys-posix-raw",
    "loopback-file",
    "nixl-file",
];

/// The second raw nixl-sys POSIX baseline, without its setting's suffix:
/// its ratio to the first is a row's resolution.
const RAW_TWIN: &str = "nixl-sys-posix-raw-twin";

/// One table per storage setting: each mover's GB/s (p50 us), and ours on
/// NIXL against raw nixl-sys POSIX and against the better plain-syscall
/// baseline (`file-plain` or `file-uring`) of the row, and the raw twin
/// against raw.
fn print_storage(stored: &[Row]) {
    for (setting, suffix) in STORAGE_SETTINGS {
        let name = |mover: &str| format!("{mover}{suffix}");
        let rows: Vec<&Row> = stored
            .iter()
            .filter(|r| STORAGE_MOVERS.iter().any(|m| r.backend == name(m)))
            .collect();
        if rows.is_empty() {
            continue;
        }
        println!("\n== storage, {setting} (GB/s from the p50; p50 in us) ==");
        println!(
            "{:<6} {:>8} {:>5} | {:>16} | {:>16} | {:>16} | {:>16} | {:>16} {:>6} {:>6} {:>6}",
            "op",
            "block",
            "count",
            "file-plain",
            "file-uring",
            "posix-raw",
            "loopback-file",
            "nixl-file",
            "xraw",
            "xplain",
            "twin"
        );
        let cell = |r: Option<&Row>| {
            r.map_or_else(
                || "-".to_owned(),
                |r| format!("{:6.2} ({:>7.1})", r.gbps, r.p50_us),
            )
        };
        for (op, block, blocks) in configs(stored) {
            let get = |mover: &str| find(stored, &name(mover), op, block, blocks);
            let ratio = |a: Option<&Row>, b: Option<&Row>| match (a, b) {
                (Some(a), Some(b)) => format!("{:.2}", a.gbps / b.gbps),
                _ => "-".into(),
            };
            let [plain, uring, raw, loopback, nixl] = STORAGE_MOVERS.map(get);
            if nixl.is_none() && plain.is_none() {
                continue;
            }
            let twin = get(RAW_TWIN);
            println!(
                "{:<6} {:>8} {:>5} | {:>16} | {:>16} | {:>16} | {:>16} | {:>16} {:>6} {:>6} {:>6}",
                op,
                human(block),
                blocks,
                cell(plain),
                cell(uring),
                cell(raw),
                cell(loopback),
                cell(nixl),
                ratio(nixl, raw),
                ratio(nixl, best_plain(plain, uring)),
                ratio(twin, raw),
            );
        }
    }
}

/// The faster of a row's two plain-syscall baselines.
fn best_plain<'a>(plain: Option<&'a Row>, uring: Option<&'a Row>) -> Option<&'a Row> {
    match (plain, uring) {
        (Some(p), Some(u)) => Some(if u.gbps > p.gbps { u } else { p }),
        (p, u) => p.or(u),
    }
}

/// The storage tier's targets (issue 42), per setting: ours on NIXL >= 0.9 x
/// raw nixl-sys POSIX at every row, >= 0.8 x the best plain-syscall
/// baseline from 64 KiB blocks, and no registration per operation after a
/// file's first.
pub(crate) fn storage_targets(stored: &[Row]) -> Vec<String> {
    let verdict = |ok: bool| if ok { "MET   " } else { "MISSED" };
    let mut out = Vec::new();
    for (setting, suffix) in STORAGE_SETTINGS {
        let ours = format!("nixl-file{suffix}");
        let (plain, uring) = (format!("file-plain{suffix}"), format!("file-uring{suffix}"));
        // The baseline of a row: `base`, or without one the best plain one.
        let worst = |base: Option<&str>, min_block: usize| {
            configs(stored)
                .into_iter()
                .filter(|&(_, block, _)| block >= min_block)
                .filter_map(|(op, block, blocks)| {
                    let a = find(stored, &ours, op, block, blocks)?;
                    let b = match base {
                        Some(base) => find(stored, base, op, block, blocks),
                        None => best_plain(
                            find(stored, &plain, op, block, blocks),
                            find(stored, &uring, op, block, blocks),
                        ),
                    }?;
                    Some((a.gbps / b.gbps, format!("{op} {blocks} x {}", human(block))))
                })
                .min_by(|a, b| a.0.total_cmp(&b.0))
        };
        // The resolution of the rows from `min_block`: how far the raw twin
        // (the same code, an agent of its own) strays from raw.
        let raw = format!("nixl-sys-posix-raw{suffix}");
        let twin = format!("{RAW_TWIN}{suffix}");
        let resolution = |min_block: usize| {
            let ratios: Vec<f64> = configs(stored)
                .into_iter()
                .filter(|&(_, block, _)| block >= min_block)
                .filter_map(|(op, block, blocks)| {
                    let t = find(stored, &twin, op, block, blocks)?;
                    Some(t.gbps / find(stored, &raw, op, block, blocks)?.gbps)
                })
                .collect();
            let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let high = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if ratios.is_empty() {
                String::new()
            } else {
                format!(" (raw twin {low:.2}-{high:.2} x raw)")
            }
        };
        if let Some((r, at)) = worst(Some(&raw), 0) {
            out.push(format!(
                "{} storage ({setting}): nixl-file >= 0.90 x nixl-sys-posix-raw at every row: worst {r:.2} ({at}){}",
                verdict(r >= 0.9),
                resolution(0)
            ));
        }
        if let Some((r, at)) = worst(None, 64 << 10) {
            out.push(format!(
                "{} storage ({setting}): nixl-file >= 0.80 x the best of file-plain and file-uring from 64 KiB blocks: worst {r:.2} ({at}){}",
                verdict(r >= 0.8),
                resolution(64 << 10)
            ));
        }
    }
    let ours: Vec<&Row> = stored
        .iter()
        .filter(|r| r.backend.starts_with("nixl-file") || r.backend.starts_with("loopback-file"))
        .collect();
    if !ours.is_empty() {
        let most = ours
            .iter()
            .filter_map(|r| r.registrations_per_op())
            .fold(0.0, f64::max);
        let counted = ours.iter().all(|r| r.registrations.is_some());
        out.push(format!(
            "{} storage rows register nothing per operation after a file's first (0 reg/op): most {most}",
            verdict(counted && most == 0.0)
        ));
    }
    out
}

/// The cross-process configurations measured, in measurement order, each
/// with ours' and raw's row.
type XprocPair<'a> = (&'static str, usize, usize, Option<&'a Row>, Option<&'a Row>);

fn xproc_pairs(rows: &[Row]) -> Vec<XprocPair<'_>> {
    configs(rows)
        .into_iter()
        .map(|(op, block, blocks)| {
            let get = |b| find(rows, b, op, block, blocks);
            (
                op,
                block,
                blocks,
                get("nixl-xproc"),
                get("nixl-sys-raw-xproc"),
            )
        })
        .filter(|(_, _, _, ours, raw)| ours.is_some() || raw.is_some())
        .collect()
}

/// The cross-process rows' tail: the mean and the share of stalled
/// transfers, which the p50 does not show.
fn print_tail(rows: &[Row]) {
    let pairs = xproc_pairs(rows);
    if pairs.is_empty() {
        return;
    }
    println!(
        "\n== cross-process tail: mean us (share of transfers over {} x their sweep's p50) ==",
        crate::SLOW
    );
    println!(
        "{:<6} {:>8} {:>5} | {:>18} | {:>18}",
        "op", "block", "count", "nixl-xproc", "nixl-sys-raw-xproc"
    );
    let cell = |r: Option<&Row>| {
        r.map_or_else(
            || "-".to_owned(),
            |r| format!("{:>8.1} ({:>5.1}%)", r.mean_us, r.slow * 100.0),
        )
    };
    for (op, block, blocks, ours, raw) in pairs {
        println!(
            "{:<6} {:>8} {:>5} | {:>18} | {:>18}",
            op,
            human(block),
            blocks,
            cell(ours),
            cell(raw)
        );
    }
}

/// A table of GB/s ratios that opt-in movers add to the report: its title,
/// the movers whose presence prints it, and its columns (header, mover, base).
type RatioTable = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str, &'static str)],
);

/// The opt-in movers' tables, and the prepared-list baselines', in the
/// order printed.
const RATIO_TABLES: [RatioTable; 5] = [
    // Raw with one registered arena per side and lists prepared once, the
    // request made per transfer from indices, against raw with a request
    // built per transfer: what merging neighbouring blocks saves (contiguous)
    // and what preparing alone saves (scattered, nothing to merge).
    (
        "raw with prepared lists against raw with a request built per transfer (GB/s ratio)",
        &[
            "nixl-sys-raw-prepped",
            "nixl-sys-raw-prepped-scattered",
            "nixl-sys-raw-prepped-xproc",
            "nixl-sys-raw-prepped-scattered-xproc",
        ],
        &[
            ("prepped", "nixl-sys-raw-prepped", "nixl-sys-raw"),
            (
                "scattered",
                "nixl-sys-raw-prepped-scattered",
                "nixl-sys-raw",
            ),
            (
                "x prepped",
                "nixl-sys-raw-prepped-xproc",
                "nixl-sys-raw-xproc",
            ),
            (
                "x scattered",
                "nixl-sys-raw-prepped-scattered-xproc",
                "nixl-sys-raw-xproc",
            ),
        ],
    ),
    // Each raw baseline against its twin, a second instance of it in the
    // same run: two runs of one program differ by this much, so a ratio of
    // ours to raw means no more than that.
    (
        "noise: each raw baseline's twin against it (GB/s ratio)",
        &["nixl-sys-raw-twin", "nixl-sys-raw-xproc-twin"],
        &[
            ("in-process", "nixl-sys-raw-twin", "nixl-sys-raw"),
            ("xproc", "nixl-sys-raw-xproc-twin", "nixl-sys-raw-xproc"),
        ],
    ),
    // In process raw runs no progress thread and ours NIXL's by default:
    // ours and raw with the same threads, and ours without against ours with.
    (
        "in process, NIXL's progress threads alike (GB/s ratio)",
        &["nixl-no-thread", "nixl-sys-raw-thread"],
        &[
            ("none", "nixl-no-thread", "nixl-sys-raw"),
            ("both", "nixl", "nixl-sys-raw-thread"),
            ("none x dflt", "nixl-no-thread", "nixl"),
        ],
    ),
    // What NIXL's thread is for across processes.
    (
        "across processes, ours without NIXL's progress threads (GB/s ratio)",
        &["nixl-xproc-no-thread"],
        &[
            ("x raw", "nixl-xproc-no-thread", "nixl-sys-raw-xproc"),
            ("x default", "nixl-xproc-no-thread", "nixl-xproc"),
        ],
    ),
    // Raw's target idles during the transfer; ours' already waits for it.
    (
        "across processes, raw whose target waits during the transfer (GB/s ratio)",
        &["nixl-sys-raw-xproc-waiting"],
        &[
            ("x waiting", "nixl-xproc", "nixl-sys-raw-xproc-waiting"),
            (
                "wait x raw",
                "nixl-sys-raw-xproc-waiting",
                "nixl-sys-raw-xproc",
            ),
        ],
    ),
];

/// One of [`RATIO_TABLES`], printed only if the run has one of the movers
/// `only_with`.
fn print_pairs(rows: &[Row], title: &str, only_with: &[&str], columns: &[(&str, &str, &str)]) {
    if !rows.iter().any(|r| only_with.contains(&r.backend)) {
        return;
    }
    println!("\n== {title} ==");
    print!("{:<6} {:>8} {:>5}", "op", "block", "count");
    for (header, _, _) in columns {
        print!(" | {header:>10}");
    }
    println!();
    for (op, block, blocks) in configs(rows) {
        let ratios: Vec<Option<f64>> = columns
            .iter()
            .map(|(_, mover, base)| {
                let m = find(rows, mover, op, block, blocks)?;
                let b = find(rows, base, op, block, blocks)?;
                Some(m.gbps / b.gbps)
            })
            .collect();
        // Sizes where none of the table's movers ran are left out.
        if ratios.iter().all(Option::is_none) {
            continue;
        }
        print!("{:<6} {:>8} {:>5}", op, human(block), blocks);
        for ratio in ratios {
            let ratio = ratio.map_or_else(|| "-".into(), |r| format!("{r:.2}"));
            print!(" | {ratio:>10}");
        }
        println!();
    }
}

fn extra(extras: &Extras, name: &str) -> Option<f64> {
    extras
        .items
        .iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, v, _)| *v)
}

/// The issue's targets, each with the measured value and a verdict.
fn targets(rows: &[Row], extras: &Extras) -> Vec<String> {
    let verdict = |ok: bool| if ok { "MET   " } else { "MISSED" };
    let mut out = Vec::new();
    let worst = |backend: &str, base: &str, min_block: usize| {
        configs(rows)
            .into_iter()
            .filter(|&(_, block, _)| block >= min_block)
            .filter_map(|(op, block, blocks)| {
                let a = find(rows, backend, op, block, blocks)?;
                let b = find(rows, base, op, block, blocks)?;
                Some((a.gbps / b.gbps, format!("{op} {blocks} x {}", human(block))))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
    };
    let single = |backend: &str, base: &str, block: usize| {
        ["read", "write"]
            .into_iter()
            .filter_map(|op| {
                let a = find(rows, backend, op, block, 1)?;
                let b = find(rows, base, op, block, 1)?;
                Some(a.gbps / b.gbps)
            })
            .min_by(f64::total_cmp)
    };
    if let Some(r) = single("loopback", "memcpy", 64 << 10) {
        out.push(format!(
            "{} loopback >= 0.70 x memcpy at 64 KiB x 1: worst {r:.2}",
            verdict(r >= 0.7)
        ));
    }
    if let Some((r, at)) = worst("loopback", "memcpy", 1 << 20) {
        out.push(format!(
            "{} loopback >= 0.90 x memcpy from 1 MiB: worst {r:.2} ({at})",
            verdict(r >= 0.9)
        ));
    }
    for (ours, raw) in [
        ("nixl", "nixl-sys-raw"),
        ("nixl-xproc", "nixl-sys-raw-xproc"),
    ] {
        if let Some((r, at)) = worst(ours, raw, 0) {
            out.push(format!(
                "{} {ours} >= 0.90 x {raw} at every row: worst {r:.2} ({at})",
                verdict(r >= 0.9)
            ));
        }
        for op in ["read", "write"] {
            if let (Some(a), Some(b)) = (
                find(rows, ours, op, 4096, 1).map(|r| r.p50_us),
                find(rows, raw, op, 4096, 1).map(|r| r.p50_us),
            ) {
                out.push(format!(
                    "{} {ours} 4 KiB {op} p50 <= {raw} p50 + 10 us: {a:.1} vs {b:.1} us",
                    verdict(a <= b + 10.0)
                ));
            }
        }
    }
    // Issue 36: registered once, moved in parts.
    let worst_from = |backend: &str, base: &str, min_bytes: usize| {
        configs(rows)
            .into_iter()
            .filter(|&(_, block, blocks)| block * blocks >= min_bytes)
            .filter_map(|(op, block, blocks)| {
                let a = find(rows, backend, op, block, blocks)?;
                let b = find(rows, base, op, block, blocks)?;
                Some((a.gbps / b.gbps, format!("{op} {blocks} x {}", human(block))))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
    };
    for (pool, raw) in [
        ("nixl-pool", "nixl-sys-raw-prepped"),
        ("nixl-pool-scattered", "nixl-sys-raw-prepped-scattered"),
        ("nixl-pool-xproc", "nixl-sys-raw-prepped-xproc"),
        (
            "nixl-pool-scattered-xproc",
            "nixl-sys-raw-prepped-scattered-xproc",
        ),
    ] {
        if let Some((r, at)) = worst(pool, raw, 0) {
            out.push(format!(
                "{} {pool} >= 0.90 x {raw} at every row: worst {r:.2} ({at})",
                verdict(r >= 0.9)
            ));
        }
    }
    for blocks in [256, 1024] {
        let ratio = ["read", "write"]
            .into_iter()
            .filter_map(|op| {
                let a = find(rows, "nixl-pool", op, 4096, blocks)?;
                let b = find(rows, "nixl", op, 4096, blocks)?;
                Some(a.gbps / b.gbps)
            })
            .min_by(f64::total_cmp);
        if let Some(r) = ratio {
            out.push(format!(
                "{} nixl-pool >= 4 x nixl at 4 KiB x {blocks} (contiguous): worst {r:.2}",
                verdict(r >= 4.0)
            ));
        }
    }
    if let Some((r, at)) = worst("nixl-pool-scattered", "nixl", 0) {
        out.push(format!(
            "{} nixl-pool-scattered no slower than nixl (>= 1.00 x) at every row: worst {r:.2} ({at})",
            verdict(r >= 1.0)
        ));
    }
    for (pool, copy) in [
        ("loopback-pool", "memcpy"),
        ("loopback-pool-scattered", "memcpy-scattered"),
    ] {
        if let Some((r, at)) = worst_from(pool, copy, 1 << 20) {
            out.push(format!(
                "{} {pool} >= 0.80 x {copy} (the same blocks) from 4 KiB x 256 (1 MiB a transfer) up: worst {r:.2} ({at})",
                verdict(r >= 0.8)
            ));
        }
    }
    let pooled: Vec<&Row> = rows
        .iter()
        .filter(|r| r.backend.contains("-pool"))
        .collect();
    if !pooled.is_empty() {
        let most = pooled
            .iter()
            .filter_map(|r| r.registrations_per_op())
            .fold(None::<f64>, |m, v| Some(m.map_or(v, |m| m.max(v))));
        let counted = pooled.iter().all(|r| r.registrations.is_some());
        let shown = most.map_or("not counted".to_owned(), |m| format!("most {m}"));
        out.push(format!(
            "{} pooled rows register nothing per operation (0 reg/op): {shown}",
            verdict(counted && most == Some(0.0))
        ));
    }
    for backend in ["loopback", "nixl"] {
        if let Some(cost) = extra(extras, &crate::metered::cost_name(backend)) {
            let twin = extra(extras, &crate::metered::twin_name(backend))
                .map_or_else(String::new, |t| format!(" (bare twin {t:+.1}%)"));
            out.push(format!(
                "{} metrics on (Metered, both sides) cost <= 2% of a {backend} 4 KiB round trip: {cost:+.1}%{twin}",
                verdict(cost <= 2.0)
            ));
        }
    }
    if let Some(rt) = extra(
        extras,
        "loopback: 4 KiB readable+read round trip, one thread",
    ) {
        out.push(format!(
            "{} loopback 4 KiB round trip <= 3 us: {rt:.2} us",
            verdict(rt <= 3.0)
        ));
    }
    if let Some(p) = extra(
        extras,
        "loopback: 4 KiB post -> passive waiter (other thread) wakes, p50",
    ) {
        out.push(format!(
            "{} loopback notification reaches a blocked passive waiter within 50 us p50: {p:.1} us",
            verdict(p <= 50.0)
        ));
    }
    for b in ["loopback", "nixl"] {
        if let Some(cpu) = extra(
            extras,
            &format!("{b}: idle pair of connectors, CPU (whole process)"),
        ) {
            out.push(format!(
                "{} {b}: idle connectors <= 1% of a core: {cpu:.2}%",
                verdict(cpu <= 1.0)
            ));
        }
        let before = extras
            .items
            .iter()
            .find(|(n, _, _)| n.starts_with(&format!("{b}: RSS before")));
        let after = extras
            .items
            .iter()
            .find(|(n, _, _)| n.starts_with(&format!("{b}: RSS after")));
        if let (Some((_, before, _)), Some((name, after, _))) = (before, after) {
            let grew = after - before;
            out.push(format!(
                "{} {b}: memory flat ({}): {grew:+.2} MiB",
                verdict(grew < 8.0),
                name.trim_start_matches(&format!("{b}: RSS "))
            ));
        }
    }
    out
}

/// Text for an SVG element or attribute (XML's five escapes).
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn json(rows: &[Row], stored: &[Row], extras: &Extras) -> String {
    let results: Vec<serde_json::Value> = rows
        .iter()
        .chain(stored)
        .map(|r| {
            serde_json::json!({
                "backend": r.backend, "op": r.op, "block_bytes": r.block_bytes, "blocks": r.blocks,
                "gbps": r.gbps, "p50_us": r.p50_us, "p99_us": r.p99_us,
                "mean_us": r.mean_us, "slow_share": r.slow,
                "p50_runs_us": r.p50_runs_us, "iterations": r.iterations,
                "registrations_per_op": r.registrations_per_op(),
                "storage": crate::storage::cache_of(r.backend),
            })
        })
        .collect();
    let other: Vec<serde_json::Value> = extras
        .items
        .iter()
        .map(|(name, value, unit)| serde_json::json!({"name": name, "value": value, "unit": unit}))
        .collect();
    let report = serde_json::json!({
        "results": results,
        "other": other,
        "targets": targets(rows, extras).into_iter().chain(storage_targets(stored)).collect::<Vec<_>>(),
        "machine": {"cpus": std::thread::available_parallelism().map_or(0, |n| n.get())},
        "nixl": {"peer_failure_detection": crate::movers::peer_failure_detection()},
        "xproc_gap_us": crate::xproc::gap().as_micros() as u64,
    });
    serde_json::to_string_pretty(&report).unwrap_or_default()
}

/// Bandwidth against block size (single-block READs), one line per backend.
pub(crate) fn svg(rows: &[Row]) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 440.0, 70.0, 150.0, 40.0, 60.0);
    let points: Vec<&Row> = rows
        .iter()
        .filter(|r| r.blocks == 1 && r.op == "read")
        .collect();
    let xs: Vec<f64> = points
        .iter()
        .map(|r| (r.block_bytes as f64).log2())
        .collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min),
        xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    );
    let ymax = points.iter().map(|r| r.gbps).fold(1.0, f64::max) * 1.1;
    let px = |x: f64| left + (x - x0) / (x1 - x0).max(1.0) * (w - left - right);
    let py = |y: f64| h - bottom - y / ymax * (h - top - bottom);
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">READ bandwidth by block size (one block; memcpy is the ceiling)</text>
<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">block size</text>
<text x="18" y="{}" transform="rotate(-90 18 {})" text-anchor="middle">GB/s</text>
"##,
        w / 2.0,
        h - bottom,
        w - right,
        h - bottom,
        h - bottom,
        (left + w - right) / 2.0,
        h - 15.0,
        h / 2.0,
        h / 2.0
    );
    let mut ticks: Vec<usize> = points.iter().map(|r| r.block_bytes).collect();
    ticks.sort_unstable();
    ticks.dedup();
    for b in ticks {
        let x = px((b as f64).log2());
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            top,
            h - bottom,
            h - bottom + 18.0,
            xml(&human(b))
        );
    }
    for i in 0..=5 {
        let v = ymax / 5.0 * f64::from(i);
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{v:.1}</text>"##,
            left - 6.0,
            py(v) + 4.0
        );
    }
    let colors = [
        "#444444", "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
    ];
    for (i, backend) in BACKENDS.iter().enumerate() {
        let mut line: Vec<(f64, f64)> = points
            .iter()
            .filter(|r| r.backend == *backend)
            .map(|r| (px((r.block_bytes as f64).log2()), py(r.gbps)))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = line.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let dash = if *backend == "memcpy" {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r##"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"##,
            path.join(" "),
            colors[i]
        );
        for (x, y) in &line {
            let _ = writeln!(
                s,
                r##"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{}"/>"##,
                colors[i]
            );
        }
        let ly = top + 20.0 + 20.0 * i as f64;
        let _ = writeln!(
            s,
            r##"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"##,
            w - right + 10.0,
            w - right + 35.0,
            colors[i],
            w - right + 40.0,
            ly + 4.0,
            xml(backend)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_text_is_escaped_as_xml() {
        assert_eq!(
            xml(r#"a<b & "c">'d'"#),
            "a&lt;b &amp; &quot;c&quot;&gt;&apos;d&apos;"
        );
        assert_eq!(xml("nixl-sys-raw 64 KiB"), "nixl-sys-raw 64 KiB");
    }

    /// A READ row of `blocks` x `block_bytes` at `gbps`.
    fn read_row(backend: &'static str, block_bytes: usize, blocks: usize, gbps: f64) -> Row {
        Row {
            backend,
            op: "read",
            block_bytes,
            blocks,
            gbps,
            p50_us: 1.0,
            p99_us: 2.0,
            mean_us: 1.5,
            slow: 0.0,
            p50_runs_us: vec![1.0],
            iterations: 9,
            registrations: None,
        }
    }

    #[test]
    fn the_plot_has_a_line_and_a_label_per_backend_measured() {
        let row = |backend, block_bytes, gbps| read_row(backend, block_bytes, 1, gbps);
        let rows = [
            row("memcpy", 4096, 10.0),
            row("memcpy", 1 << 20, 20.0),
            row("nixl", 4096, 5.0),
            row("nixl", 1 << 20, 15.0),
        ];
        let svg = svg(&rows);
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), BACKENDS.len());
        assert_eq!(svg.matches("<circle").count(), rows.len());
        for label in [
            ">memcpy</text>",
            ">nixl</text>",
            ">4 KiB</text>",
            ">1 MiB</text>",
        ] {
            assert!(svg.contains(label), "{label} missing");
        }
    }

    #[test]
    fn storage_targets_give_the_raw_twins_spread_as_their_resolution() {
        let row = |backend, block_bytes, gbps, registrations| Row {
            registrations,
            ..read_row(backend, block_bytes, 64, gbps)
        };
        let rows = [
            row("file-plain-direct", 4096, 1.0, None),
            row("nixl-sys-posix-raw-direct", 4096, 1.0, Some(0)),
            row("nixl-sys-posix-raw-twin-direct", 4096, 1.3, Some(0)),
            row("nixl-file-direct", 4096, 0.95, Some(0)),
            row("file-plain-direct", 1 << 20, 2.0, None),
            row("nixl-sys-posix-raw-direct", 1 << 20, 2.0, Some(0)),
            row("nixl-sys-posix-raw-twin-direct", 1 << 20, 1.5, Some(0)),
            row("nixl-file-direct", 1 << 20, 1.2, Some(0)),
        ];
        let targets = storage_targets(&rows);
        assert_eq!(
            targets,
            [
                "MISSED storage (O_DIRECT, contiguous blocks): nixl-file >= 0.90 x \
                 nixl-sys-posix-raw at every row: worst 0.60 (read 64 x 1 MiB) \
                 (raw twin 0.75-1.30 x raw)",
                "MISSED storage (O_DIRECT, contiguous blocks): nixl-file >= 0.80 x the best \
                 of file-plain and file-uring from 64 KiB blocks: worst 0.60 (read 64 x 1 MiB) \
                 (raw twin 0.75-0.75 x raw)",
                "MET    storage rows register nothing per operation after a file's first \
                 (0 reg/op): most 0",
            ]
        );
    }
}
