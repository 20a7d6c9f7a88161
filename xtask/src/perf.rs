//! docs/performance.md, generated from the bench's `report.json`.
//!
//! `cargo xtask bench` records the machine it ran on in the report
//! ([`stamp`]), then [`publish`] renders the page ([`render`]) and copies the
//! report (and the plot) next to it, as docs/bench-report.json and
//! docs/bandwidth.svg. The page has the same headings every run, so links
//! into it hold; the history of earlier runs lives in docs/decisions/ and in
//! git, not here.

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;
use xshell::{Shell, cmd};

/// Where the bench writes its report, from the workspace root.
pub(crate) const REPORT: &str = "target/bench/report.json";
/// The generated page, from the workspace root.
const PAGE: &str = "docs/performance.md";
/// The copy of the report the page was rendered from.
pub(crate) const REPORT_COPY: &str = "docs/bench-report.json";
/// The bench's plot, beside its report, copied beside the page.
const PLOT: &str = "bandwidth.svg";

/// What the page needs of `report.json`; anything missing renders as
/// "not recorded" (older reports carry only the CPU count).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Report {
    results: Vec<Row>,
    other: Vec<Other>,
    /// The bench's verdicts, each `MET    what: measured` or `MISSED ...`.
    targets: Vec<String>,
    /// The Python bench's verdicts.
    python_targets: Vec<PythonTarget>,
    machine: Machine,
    nixl: Nixl,
    xproc_gap_us: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Row {
    backend: String,
    op: String,
    block_bytes: u64,
    blocks: u64,
    gbps: f64,
    p50_us: f64,
    p50_runs_us: Vec<f64>,
    /// Metadata rows: the size of the document.
    json_bytes: u64,
    /// Backend registrations per timed transfer, where the mover counts them.
    registrations_per_op: Option<f64>,
    /// Storage rows: the cache setting ("page cache", "O_DIRECT").
    storage: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Other {
    name: String,
    value: f64,
    unit: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PythonTarget {
    target: String,
    value: f64,
    met: bool,
}

/// The machine: `cpus` from the bench, the rest from [`stamp`].
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Machine {
    cpus: u64,
    cpu_model: Option<String>,
    kernel: Option<String>,
    nixl_runtime: Option<String>,
    date: Option<String>,
    commit: Option<String>,
    command: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Nixl {
    peer_failure_detection: Option<bool>,
}

/// Reads and parses a report.
pub(crate) fn load(path: &Path) -> Result<Report, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("parse {}: {e}", path.display()))
}

/// Adds to the report's `machine` what the bench does not record: the CPU
/// model, the kernel, the NIXL runtime, the date, the commit and the command.
pub(crate) fn stamp(sh: &Shell, report: &Path, command: &str) -> Result<(), String> {
    let text =
        std::fs::read_to_string(report).map_err(|e| format!("read {}: {e}", report.display()))?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("parse {}: {e}", report.display()))?;
    let Some(top) = json.as_object_mut() else {
        return Err(format!("{} is not a JSON object", report.display()));
    };
    let machine = top
        .entry("machine")
        .or_insert_with(|| serde_json::json!({}));
    let Some(machine) = machine.as_object_mut() else {
        return Err(format!("{}: `machine` is not an object", report.display()));
    };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|release| format!("Linux {}", release.trim()))
        .ok();
    let date = cmd!(sh, "date -u +%Y-%m-%dT%H:%MZ").quiet().read().ok();
    let commit = cmd!(sh, "git rev-parse --short=12 HEAD")
        .quiet()
        .read()
        .ok()
        .map(|commit| {
            let dirty = cmd!(sh, "git status --porcelain --untracked-files=no")
                .quiet()
                .read()
                .is_ok_and(|changes| !changes.is_empty());
            if dirty {
                format!("{commit} (with uncommitted changes)")
            } else {
                commit
            }
        });
    let fields = [
        ("cpu_model", cpu_model(&cpuinfo)),
        ("kernel", kernel),
        ("nixl_runtime", Some(crate::nixl::requirement())),
        ("date", date),
        ("commit", commit),
        ("command", Some(command.to_owned())),
    ];
    for (key, value) in fields {
        if let Some(value) = value {
            machine.insert(key.to_owned(), value.into());
        }
    }
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(report, text).map_err(|e| format!("write {}: {e}", report.display()))
}

/// The first `model name` of /proc/cpuinfo.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "model name").then(|| value.trim().to_owned())
    })
}

/// Renders docs/performance.md from `report` and copies the report (and the
/// plot beside it, if any) into docs/.
pub(crate) fn publish(root: &Path, report: &Path) -> Result<(), u8> {
    let fail = |e: String| {
        eprintln!("xtask bench: {e}");
        1
    };
    let parsed = load(report).map_err(fail)?;
    let copy = root.join(REPORT_COPY);
    let same = |a: &Path, b: &Path| {
        a.canonicalize()
            .ok()
            .is_some_and(|a| b.canonicalize().is_ok_and(|b| a == b))
    };
    if !same(report, &copy) {
        std::fs::copy(report, &copy).map_err(|e| {
            fail(format!(
                "copy {} to {}: {e}",
                report.display(),
                copy.display()
            ))
        })?;
    }
    if let Some(plot) = report.parent().map(|dir| dir.join(PLOT))
        && plot.is_file()
    {
        let dest = root.join("docs").join(PLOT);
        if !same(&plot, &dest) {
            std::fs::copy(&plot, &dest)
                .map_err(|e| fail(format!("copy {}: {e}", plot.display())))?;
        }
    }
    let page = root.join(PAGE);
    let plotted = root.join("docs").join(PLOT).is_file();
    let mut text = render(&parsed, plotted);
    // The soak's section, from the last `cargo xtask soak` (docs/soak-report.json).
    if let Some(soak) = crate::soak::section(root) {
        text.push_str(&soak);
    }
    std::fs::write(&page, text).map_err(|e| fail(format!("write {}: {e}", page.display())))?;
    eprintln!(
        "xtask bench: wrote {} from {}",
        page.display(),
        report.display()
    );
    Ok(())
}

/// How the bench measures: true of every run, so written once, here.
const METHOD: &str = "\
`cargo xtask bench` runs the bench (`examples/bench`, release build), then
the criterion micro-benchmarks of the hot paths, then, when the Python
environment exists, the Python rows. Every size is swept several times
(`--quick`: six sweeps and fewer sizes; the full bench: three). Within a
sweep the movers take turns, round by round, in a new shuffled order every
round (the same shuffles every run): a turn is 2 ms of quiet, three untimed
transfers, then up to five timed ones back to back; a size gets at least
five rounds and ten timed transfers per sweep. Each row is the median of its
sweeps' p50s (the report keeps every sweep's p50 in `p50_runs_us`), and
GB/s is the bytes moved divided by that p50.

The movers:

- `memcpy` copies the same bytes: the ceiling.
- `loopback` and `nixl` go through the public API: the passive operation is
  prepared first, and the time runs from `begin_read`/`begin_write` until
  the waiter knows the transfer completed.
- `nixl-sys-raw` is the same transfer written directly against nixl-sys in
  the same process: metadata loaded once, one request per transfer with the
  notification attached, polled with a yield, the target agent progressed in
  the same loop (which a real deployment cannot do).
- `nixl-sys-raw-prepped` is raw nixl-sys in the same process as
  `nixl-sys-raw`, but with one registered arena per side and the transfer
  lists prepared once (`prepare_xfer_dlist`); per transfer only
  `make_xfer_req` from the blocks' indices, which merges neighbouring
  blocks. `nixl-sys-raw-prepped-scattered` uses every other block of an
  arena twice the size, so there is nothing to merge. Both are measured at
  blocks up to 64 KiB, up to 16 MiB a transfer.
- The `-xproc` movers put the passive side in a child process, as
  deployments do: `nixl-xproc` is this library on both sides with its
  defaults; `nixl-sys-raw-xproc` is raw nixl-sys as a user would write it
  across processes (target with NIXL's progress thread at 10 ms), and
  `nixl-sys-raw-prepped-xproc` and `nixl-sys-raw-prepped-scattered-xproc`
  the same with prepared lists.
- Where a mover counts its backend memory registrations, its cells add
  the registrations made per timed transfer (`reg/op`).
- The metrics cost rows (`examples/bench/src/metered.rs`, `bench
  --metrics-only` alone) time 4 KiB readable -> read round trips over
  loopback and NIXL in batches taking turns: a bare pair, the same with
  `Metered` on both sides, and a second bare pair, whose difference from
  the first is the row's resolution; the cost is metered over the mean of
  the bare pairs, the median over the batches.
- The `py-` movers are the Python package `nixl_connect` against Dynamo's
  own `nixl_connect` and the Rust API, one worker process each, measured in
  turns (crates/nixl-connect-py/bench/bench.py).
- The storage movers move blocks between memory (one page-aligned arena
  each) and a file, taking turns on the same file, so that where its
  blocks lie on the disk is the same for all (examples/bench/src/storage.rs): `file-plain`
  is `pread`/`pwrite` on the thread, one call per run of neighbouring
  blocks, `file-uring` the same runs through io_uring with up to 64 in
  flight (where io_uring can be set up); `nixl-sys-posix-raw` is nixl-sys's POSIX plugin (AIO) without
  this library, memory and file registered once, one request per transfer
  with a descriptor per block, polled with a yield, and
  `nixl-sys-posix-raw-twin` a second one, whose ratio to the first is the
  row's resolution (given with each storage target);
  `loopback-file` and
  `nixl-file` are `Connector::begin_file_write`/`begin_file_read` and
  `wait` over a `BlockPool`. `-scattered`: every other block of the file,
  so none merge. The page cache rows read from and write into cached pages
  (the file written once first, never synced while timed); the `-direct`
  rows open the file with `O_DIRECT`, so every transfer reaches the disk.
";

/// How far one run can be trusted: the noise this page's numbers carry.
const TRUST: &str = "\
On the 2-core shared test machine, single runs vary by about ±20% at small
sizes in process and much more across processes: the same raw baseline
measured against an identical copy of itself (`bench --movers ...` with the
`-twin` movers) came out 0.64-1.66 × itself in single cross-process rows and
0.92-1.03 × in process. So one run cannot tell 0.9 × raw from 1.0 × at one
cross-process row; decisions are made on medians of many interleaved runs of
chosen sizes (`bench --sizes 4096x1,65536x1`), recorded in docs/decisions/.
A target missed by a few percent in one run is noise until several runs
agree.
";

/// Whether a row belongs in a table.
type Holds = fn(&Row) -> bool;

/// Which table a row goes in, in page order.
const SECTIONS: &[(&str, Holds)] = &[
    ("In process", |r| {
        !r.backend.starts_with("py-") && !r.backend.contains("xproc") && r.storage.is_none()
    }),
    ("Across processes", |r| {
        !r.backend.starts_with("py-") && r.backend.contains("xproc")
    }),
    ("Python", |r| r.backend.starts_with("py-")),
    ("Storage, page cache", |r| {
        r.storage.as_deref() == Some("page cache")
    }),
    ("Storage, O_DIRECT", |r| {
        r.storage.as_deref() == Some("O_DIRECT")
    }),
];

/// The page, from a report; `plotted`: docs/bandwidth.svg exists.
pub(crate) fn render(report: &Report, plotted: bool) -> String {
    let mut page = String::new();
    let w = &mut page;
    let _ = writeln!(
        w,
        "# Performance\n\n\
         <!-- Generated by `cargo xtask bench` (xtask/src/perf.rs) from \
         target/bench/report.json; edit the generator, not this file. -->\n\n\
         The current results of `cargo xtask bench`, the machine they were \
         measured on, and the targets met and missed. The report they were \
         rendered from is [bench-report.json](bench-report.json); why the \
         defaults are what they are, with the measurements behind each choice, \
         is in [decisions/](decisions/); earlier runs are in git \
         (`git log -p docs/bench-report.json`).\n"
    );
    machine(w, report);
    let _ = writeln!(w, "## How the bench measures\n\n{METHOD}");
    let _ = writeln!(w, "## How far one run can be trusted\n\n{TRUST}");
    targets(w, report);
    results(w, report, plotted);
    metadata(w, report);
    other(w, report);
    page
}

fn machine(w: &mut String, report: &Report) {
    let m = &report.machine;
    let shown = |value: &Option<String>| {
        value
            .as_deref()
            .map_or_else(|| "not recorded".to_owned(), cell)
    };
    let cpus = if m.cpus == 0 {
        "not recorded".to_owned()
    } else {
        m.cpus.to_string()
    };
    let detection = match report.nixl.peer_failure_detection {
        Some(true) => "on (UCX's peer error handling)",
        Some(false) => "off (`ucx_error_handling_mode=none`)",
        None => "not recorded",
    };
    let _ = writeln!(w, "## Machine\n\n| | |\n|---|---|");
    for (name, value) in [
        ("CPUs", cpus),
        ("CPU model", shown(&m.cpu_model)),
        ("Kernel", shown(&m.kernel)),
        ("NIXL runtime", shown(&m.nixl_runtime)),
        ("Date", shown(&m.date)),
        ("Commit", shown(&m.commit)),
        ("Command", shown(&m.command)),
        ("NIXL peer-failure detection", detection.to_owned()),
    ] {
        let _ = writeln!(w, "| {name} | {value} |");
    }
    if report.xproc_gap_us > 0 {
        let _ = writeln!(
            w,
            "\nCross-process transfers each started {} µs after the last one ended (`--gap-us`).",
            report.xproc_gap_us
        );
    }
    let _ = writeln!(w);
}

/// A target's mark: plain when met, loud when missed.
fn mark(met: bool) -> &'static str {
    if met { "met" } else { "**MISSED**" }
}

fn targets(w: &mut String, report: &Report) {
    let _ = writeln!(w, "## Targets\n");
    let parsed: Vec<(Option<bool>, &str, &str)> =
        report.targets.iter().map(|t| parse_target(t)).collect();
    let count = |rows: &mut dyn Iterator<Item = Option<bool>>| {
        rows.fold((0, 0), |(met, all), m| {
            (met + usize::from(m == Some(true)), all + 1)
        })
    };
    let (met, all) = count(
        &mut parsed
            .iter()
            .map(|t| t.0)
            .chain(report.python_targets.iter().map(|t| Some(t.met))),
    );
    if all == 0 {
        let _ = writeln!(w, "The report has no targets.\n");
        return;
    }
    let _ = writeln!(w, "{met} of {all} met.\n");
    if !parsed.is_empty() {
        let _ = writeln!(w, "| | Target | Measured |\n|---|---|---|");
        for (met, target, measured) in parsed {
            let shown = met.map_or("?", mark);
            let _ = writeln!(w, "| {shown} | {} | {} |", cell(target), cell(measured));
        }
        let _ = writeln!(w);
    }
    if !report.python_targets.is_empty() {
        let _ = writeln!(w, "### Python\n\n| | Target | Measured |\n|---|---|---|");
        for t in &report.python_targets {
            let _ = writeln!(
                w,
                "| {} | {} | {} |",
                mark(t.met),
                cell(&t.target),
                number(t.value)
            );
        }
        let _ = writeln!(w);
    }
}

/// `MET    what: measured` into (met, what, measured); the verdict is
/// `None` when the line has neither word.
fn parse_target(line: &str) -> (Option<bool>, &str, &str) {
    let (met, rest) = if let Some(rest) = line.strip_prefix("MET") {
        (Some(true), rest)
    } else if let Some(rest) = line.strip_prefix("MISSED") {
        (Some(false), rest)
    } else {
        (None, line)
    };
    let rest = rest.trim();
    match rest.rsplit_once(": ") {
        Some((what, measured)) => (met, what, measured),
        None => (met, rest, ""),
    }
}

fn results(w: &mut String, report: &Report, plotted: bool) {
    let _ = writeln!(w, "## Results\n");
    let sweeps = report.results.first().map_or(0, |r| r.p50_runs_us.len());
    let _ = writeln!(
        w,
        "Each cell: the p50 of one transfer and the GB/s at that p50{}; \
         p99, mean and every sweep's p50 are in the report.\n",
        if sweeps > 0 {
            format!(", the median of {sweeps} sweeps")
        } else {
            String::new()
        }
    );
    if plotted {
        let _ = writeln!(
            w,
            "![GB/s against block size, single-block READs](bandwidth.svg)\n"
        );
    }
    if report.results.is_empty() {
        let _ = writeln!(w, "The report has no rows.\n");
    }
    for (section, holds) in SECTIONS {
        for op in ["read", "write"] {
            let rows: Vec<&Row> = report
                .results
                .iter()
                .filter(|r| r.op == op && holds(r))
                .collect();
            if rows.is_empty() {
                continue;
            }
            let movers = first_seen(rows.iter().map(|r| r.backend.as_str()));
            let sizes = first_seen(rows.iter().map(|r| (r.block_bytes, r.blocks)));
            let _ = writeln!(w, "### {section}: {op}\n");
            let _ = write!(w, "| Size |");
            for mover in &movers {
                let _ = write!(w, " {} |", cell(mover));
            }
            let _ = write!(w, "\n|---|");
            for _ in &movers {
                let _ = write!(w, "---:|");
            }
            let _ = writeln!(w);
            for (block, blocks) in sizes {
                let _ = write!(w, "| {} × {blocks} |", human(block));
                for mover in &movers {
                    let found = rows.iter().find(|r| {
                        r.backend == *mover && r.block_bytes == block && r.blocks == blocks
                    });
                    match found {
                        Some(r) => {
                            let _ = write!(w, " {} µs · {} GB/s", number(r.p50_us), number(r.gbps));
                            if let Some(n) = r.registrations_per_op {
                                let _ = write!(w, " · {} reg/op", count(n));
                            }
                            let _ = write!(w, " |");
                        }
                        None => {
                            let _ = write!(w, " - |");
                        }
                    }
                }
                let _ = writeln!(w);
            }
            let _ = writeln!(w);
        }
    }
}

/// The Python metadata rows' ops (`metadata-<op>`), in table order.
const METADATA_OPS: &[(&str, &str)] = &[
    ("metadata-parse", "parse"),
    ("metadata-dump", "dump"),
    ("metadata-round-trip", "round trip"),
];
/// Who parses and dumps in the metadata table, in column order.
const METADATA_MOVERS: &[&str] = &["py-nixl-connect", "py-nixl-connect-pydantic", "py-dynamo"];
/// The metadata budget: a round trip of this many descriptors, in µs.
const METADATA_TARGET: (u64, f64) = (4096, 5000.0);

/// The Python metadata rows (`RdmaMetadata` parsed and dumped), if any,
/// and whether the round trip at 4096 descriptors meets its budget.
fn metadata(w: &mut String, report: &Report) {
    let rows: Vec<&Row> = report
        .results
        .iter()
        .filter(|r| r.backend.starts_with("py-") && r.op.starts_with("metadata-"))
        .collect();
    if rows.is_empty() {
        return;
    }
    let find = |backend: &str, op: &str, blocks: u64| {
        rows.iter()
            .find(|r| r.backend == backend && r.op == op && r.blocks == blocks)
    };
    let _ = writeln!(
        w,
        "### Python: metadata\n\n\
         An `RdmaMetadata` of N descriptors: `model_validate_json` of its \
         JSON (parse), `model_dump_json()` of the parsed model (dump), and \
         both (round trip); p50 µs. \"via pydantic\" is the package's models \
         through pydantic alone (what it did before its fast path, and does \
         for what that path leaves to pydantic).\n\n\
         | Descriptors | JSON | Op | nixl_connect | via pydantic | Dynamo 1.6.1 | × lower than Dynamo |\n\
         |---|---|---|---:|---:|---:|---:|"
    );
    for blocks in first_seen(rows.iter().map(|r| r.blocks)) {
        for (op, name) in METADATA_OPS {
            let Some(ours) = find(METADATA_MOVERS[0], op, blocks) else {
                continue;
            };
            let _ = write!(w, "| {blocks} | {} | {name} |", kilobytes(ours.json_bytes));
            for mover in METADATA_MOVERS {
                match find(mover, op, blocks) {
                    Some(r) => {
                        let _ = write!(w, " {} |", number(r.p50_us));
                    }
                    None => {
                        let _ = write!(w, " - |");
                    }
                }
            }
            match find("py-dynamo", op, blocks) {
                Some(d) if ours.p50_us > 0.0 => {
                    let _ = writeln!(w, " {} |", number(d.p50_us / ours.p50_us));
                }
                _ => {
                    let _ = writeln!(w, " - |");
                }
            }
        }
    }
    let (blocks, budget) = METADATA_TARGET;
    let target = format!(
        "metadata round trip at {blocks} descriptors <= {} ms",
        budget / 1000.0
    );
    match find(METADATA_MOVERS[0], "metadata-round-trip", blocks) {
        Some(r) => {
            let _ = writeln!(
                w,
                "\nTarget: {target}: {} ({} ms).\n",
                mark(r.p50_us <= budget),
                number(r.p50_us / 1000.0)
            );
        }
        None => {
            let _ = writeln!(w, "\nTarget: {target}: not measured.\n");
        }
    }
}

/// A document size: `12.3 KiB`, or bytes below 1 KiB.
fn kilobytes(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else {
        format!("{} KiB", number(bytes as f64 / 1024.0))
    }
}

fn other(w: &mut String, report: &Report) {
    if report.other.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "## Other measurements\n\n| Measurement | Value |\n|---|---:|"
    );
    for o in &report.other {
        let _ = writeln!(w, "| {} | {} {} |", cell(&o.name), number(o.value), o.unit);
    }
    let _ = writeln!(w);
}

/// The distinct items in the order they first appear.
fn first_seen<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Three significant digits or so: 0.123, 1.23, 12.3, 123.
fn number(value: f64) -> String {
    match value.abs() {
        v if v >= 100.0 => format!("{value:.0}"),
        v if v >= 10.0 => format!("{value:.1}"),
        v if v >= 1.0 => format!("{value:.2}"),
        _ => format!("{value:.3}"),
    }
}

/// A count per operation: whole when it is, else as [`number`].
fn count(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        number(value)
    }
}

/// Text for a Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = r#"{
      "machine": {"cpus": 2, "cpu_model": "Test CPU @ 2.0GHz", "kernel": "Linux 6.1.0",
                  "nixl_runtime": "nixl-cu12==1.5.1", "date": "2026-01-02T03:04Z",
                  "commit": "0123456789ab", "command": "cargo xtask bench --quick"},
      "nixl": {"peer_failure_detection": true},
      "results": [
        {"backend": "memcpy", "op": "read", "block_bytes": 4096, "blocks": 1,
         "gbps": 51.2, "p50_us": 0.08, "p99_us": 0.1, "p50_runs_us": [0.08, 0.09]},
        {"backend": "loopback", "op": "read", "block_bytes": 4096, "blocks": 1,
         "gbps": 0.33, "p50_us": 12.4, "p99_us": 30.0, "p50_runs_us": [12.0, 12.8]},
        {"backend": "loopback", "op": "read", "block_bytes": 1048576, "blocks": 16,
         "gbps": 9.87, "p50_us": 1700.0, "p99_us": 1900.0, "p50_runs_us": [1700.0, 1700.0]},
        {"backend": "nixl-xproc", "op": "write", "block_bytes": 65536, "blocks": 1,
         "gbps": 1.5, "p50_us": 43.7, "p99_us": 90.0, "p50_runs_us": [43.0, 44.4]},
        {"backend": "nixl-sys-raw-prepped-xproc", "op": "write", "block_bytes": 65536,
         "blocks": 1, "gbps": 1.6, "p50_us": 41.0, "p99_us": 80.0, "p50_runs_us": [41.0, 41.0],
         "registrations_per_op": 0.0},
        {"backend": "nixl-sys-raw-xproc", "op": "write", "block_bytes": 65536, "blocks": 1,
         "gbps": 1.2, "p50_us": 54.6, "p99_us": 99.0, "p50_runs_us": [54.6, 54.6],
         "registrations_per_op": 0.25},
        {"backend": "py-nixl-connect", "op": "read", "block_bytes": 4096, "blocks": 1,
         "gbps": 0.05, "p50_us": 81.0, "p99_us": 120.0, "p50_runs_us": [81.0]},
        {"backend": "py-nixl-connect", "op": "metadata-round-trip", "block_bytes": 4096,
         "blocks": 4096, "json_bytes": 230000, "p50_us": 3210.0, "p99_us": 4000.0},
        {"backend": "py-nixl-connect-pydantic", "op": "metadata-round-trip",
         "block_bytes": 4096, "blocks": 4096, "json_bytes": 230000, "p50_us": 41000.0},
        {"backend": "py-dynamo", "op": "metadata-round-trip", "block_bytes": 4096,
         "blocks": 4096, "json_bytes": 230000, "p50_us": 32100.0},
        {"backend": "py-nixl-connect", "op": "metadata-parse", "block_bytes": 4096,
         "blocks": 1, "json_bytes": 300, "p50_us": 4.5}
      ],
      "other": [{"name": "loopback: idle CPU", "unit": "%", "value": 0.1234}],
      "targets": [
        "MET    loopback >= 0.70 x memcpy at 64 KiB x 1: worst 0.73",
        "MISSED nixl >= 0.90 x nixl-sys-raw at every row: worst 0.81 (read 16 x 4 KiB)"
      ],
      "python_targets": [
        {"target": "read 4 KiB: p50 >= 20x lower than Dynamo's", "value": 178.3, "met": true},
        {"target": "write 4 KiB: within 1.5x of the Rust API", "value": 1.62, "met": false}
      ],
      "xproc_gap_us": 0
    }"#;

    fn rendered() -> String {
        render(&serde_json::from_str(FIXTURE).unwrap(), true)
    }

    fn headings(page: &str) -> Vec<&str> {
        page.lines().filter(|l| l.starts_with("## ")).collect()
    }

    #[test]
    fn the_page_has_the_machine_the_rows_and_each_targets_mark() {
        let page = rendered();
        for expected in [
            "| CPUs | 2 |",
            "| CPU model | Test CPU @ 2.0GHz |",
            "| Commit | 0123456789ab |",
            "| Command | cargo xtask bench --quick |",
            "### In process: read",
            "| Size | memcpy | loopback |",
            "| 4 KiB × 1 | 0.080 µs · 51.2 GB/s | 12.4 µs · 0.330 GB/s |",
            "| 1 MiB × 16 | - | 1700 µs · 9.87 GB/s |",
            "### Across processes: write",
            "| Size | nixl-xproc | nixl-sys-raw-prepped-xproc | nixl-sys-raw-xproc |",
            "### Python: read",
            "the median of 2 sweeps",
            "2 of 4 met.",
            "| met | loopback >= 0.70 x memcpy at 64 KiB x 1 | worst 0.73 |",
            "| **MISSED** | nixl >= 0.90 x nixl-sys-raw at every row | worst 0.81 (read 16 x 4 KiB) |",
            "| met | read 4 KiB: p50 >= 20x lower than Dynamo's | 178 |",
            "| **MISSED** | write 4 KiB: within 1.5x of the Rust API | 1.62 |",
            "| loopback: idle CPU | 0.123 % |",
            "](bandwidth.svg)",
            "### Python: metadata",
            "| 4096 | 225 KiB | round trip | 3210 | 41000 | 32100 | 10.0 |",
            "| 1 | 300 B | parse | 4.50 | - | - | - |",
            "Target: metadata round trip at 4096 descriptors <= 5 ms: met (3.21 ms).",
        ] {
            assert!(page.contains(expected), "missing {expected:?} in:\n{page}");
        }
        // No table for what was not measured; metadata rows only in theirs.
        assert!(!page.contains("### Across processes: read"), "{page}");
        assert!(!page.contains("4 KiB × 4096"), "{page}");
    }

    #[test]
    fn a_metadata_round_trip_over_its_budget_is_missed() {
        let report: Report = serde_json::from_str(
            r#"{"results": [{"backend": "py-nixl-connect", "op": "metadata-round-trip",
                "block_bytes": 4096, "blocks": 4096, "json_bytes": 1000, "p50_us": 5001.0}]}"#,
        )
        .unwrap();
        let page = render(&report, false);
        assert!(
            page.contains(
                "Target: metadata round trip at 4096 descriptors <= 5 ms: **MISSED** (5.00 ms)."
            ),
            "{page}"
        );
        assert!(
            page.contains("| 4096 | 1000 B | round trip | 5001 | - | - | - |"),
            "{page}"
        );
        let none = render(&Report::default(), false);
        assert!(!none.contains("### Python: metadata"), "{none}");
    }

    #[test]
    fn cells_add_the_registrations_per_operation_where_the_mover_counts_them() {
        let page = rendered();
        // Ours does not count them (no `registrations_per_op`); the raw
        // baselines do, whole or not.
        let row = "| 64 KiB × 1 | 43.7 µs · 1.50 GB/s | 41.0 µs · 1.60 GB/s · 0 reg/op \
                   | 54.6 µs · 1.20 GB/s · 0.250 reg/op |";
        assert!(page.contains(row), "missing {row:?} in:\n{page}");
        assert_eq!(page.matches("reg/op |").count(), 2, "{page}");
        assert_eq!(count(3.0), "3");
        assert_eq!(count(0.5), "0.500");
        assert_eq!(count(12.34), "12.3");
    }

    #[test]
    fn the_headings_are_the_same_for_every_report() {
        let full = rendered();
        let bare = render(&Report::default(), false);
        let fixed = [
            "## Machine",
            "## How the bench measures",
            "## How far one run can be trusted",
            "## Targets",
            "## Results",
        ];
        assert_eq!(headings(&bare), fixed);
        assert_eq!(headings(&full)[..fixed.len()], fixed);
        assert_eq!(headings(&full)[fixed.len()..], ["## Other measurements"]);
    }

    #[test]
    fn a_report_with_only_the_cpu_count_says_what_was_not_recorded() {
        let report: Report = serde_json::from_str(r#"{"machine": {"cpus": 2}}"#).unwrap();
        let page = render(&report, false);
        assert!(page.contains("| CPUs | 2 |"), "{page}");
        assert!(page.contains("| Commit | not recorded |"), "{page}");
        assert!(page.contains("The report has no targets."), "{page}");
        assert!(!page.contains("bandwidth.svg)"), "{page}");
    }

    #[test]
    fn a_target_line_splits_into_verdict_what_and_measured() {
        assert_eq!(
            parse_target("MISSED a >= 0.9 x b: worst 0.8 (read 1 x 4 KiB)"),
            (Some(false), "a >= 0.9 x b", "worst 0.8 (read 1 x 4 KiB)")
        );
        assert_eq!(
            parse_target("MET    idle: 0.1%"),
            (Some(true), "idle", "0.1%")
        );
        assert_eq!(parse_target("no verdict"), (None, "no verdict", ""));
    }

    #[test]
    fn stamping_adds_the_machine_and_keeps_the_rest_of_the_report() {
        let dir = std::env::temp_dir().join(format!("xtask-perf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("report.json");
        std::fs::write(
            &path,
            r#"{"machine": {"cpus": 3}, "targets": ["MET    x: 1"], "other": []}"#,
        )
        .unwrap();
        let sh = Shell::new().unwrap();
        stamp(&sh, &path, "cargo xtask bench --quick").unwrap();
        let report = load(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(report.machine.cpus, 3);
        assert_eq!(report.targets, ["MET    x: 1"]);
        assert_eq!(
            report.machine.command.as_deref(),
            Some("cargo xtask bench --quick")
        );
        assert_eq!(
            report.machine.nixl_runtime,
            Some(crate::nixl::requirement())
        );
        assert!(
            report
                .machine
                .kernel
                .is_some_and(|k| k.starts_with("Linux "))
        );
        // The test runs inside the repository: there is a commit.
        assert!(report.machine.commit.is_some());
    }

    #[test]
    fn the_cpu_model_is_the_first_model_name() {
        let cpuinfo =
            "processor\t: 0\nmodel name\t: AMD EPYC 9454\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(cpu_model(cpuinfo).as_deref(), Some("AMD EPYC 9454"));
        assert_eq!(cpu_model("processor: 0\n"), None);
    }
}
