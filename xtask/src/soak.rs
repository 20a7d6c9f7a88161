//! `cargo xtask soak [--minutes M] [--impl ours|dyn|both] [--installed]
//! [--rss-bound-mib N]`: the mixed workload of issue 48 on NIXL for minutes
//! to hours (`crates/nixl-connect-py/soak/soak.py` says what it does), then
//! its report and verdicts. `cargo xtask test --long` runs it for 60 minutes
//! with ours.
//!
//! The driver writes samples (every 10 s per process) into
//! `target/soak/<impl>/`; this module turns them into `report.json` and
//! `report.md` there: per process (server, client, the peer incarnations
//! together) and per minute, fds, threads, RSS, completed operations per
//! second, and errors by kind; and the verdicts:
//!
//! - throughput: the server's and the client's verified transfers per second
//!   over the last 10 minutes at least [`MIN_RATIO`] of the first 10 (runs
//!   shorter than 20 minutes: the last third against the first third, and
//!   the report says so);
//! - memory: every process's peak RSS within the bound (`--rss-bound-mib`,
//!   [`RSS_BOUND_MIB`] by default);
//! - data: 0 wrong bytes in every process;
//! - the long-lived processes ran to the end and exited cleanly.
//!
//! The command fails when a verdict of the gated module fails: with
//! `--impl both`, Dynamo's module runs as the reference and only ours gates.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use xshell::{Shell, cmd};

use crate::shell::run;
use crate::{flags, perf, python};

mod page;

pub(crate) use page::section;

/// The least ratio of the last window's throughput to the first's.
pub(crate) const MIN_RATIO: f64 = 0.9;
/// The default bound on any soak process's RSS, MiB: what the workload holds
/// at most at once (a 64 MiB pool, up to 6 batches of 32 MiB in flight on
/// the server, 9 MiB of pattern) plus the runtimes (Python, NumPy, NIXL,
/// UCX), with room; memory that grows with the operations done crosses it
/// within an hour.
pub(crate) const RSS_BOUND_MIB: f64 = 1024.0;
/// The comparison windows of runs at least twice this long, seconds.
const WINDOW_S: f64 = 600.0;
const SCRIPT: &str = "crates/nixl-connect-py/soak/soak.py";
/// The processes of a report, as the driver names their samples files.
const ROLES: &[&str] = &["server", "client", "peer"];
/// The processes whose throughput is a verdict (peers live 30 s each).
const LONG_LIVED: &[&str] = &["server", "client"];

/// `cargo xtask soak`.
pub(crate) fn soak(sh: &Shell, root: &Path, args: &flags::Soak) -> Result<(), u8> {
    let impls: &[&str] = match args.module.as_deref().unwrap_or("ours") {
        "ours" => &["ours"],
        "dyn" => &["dyn"],
        "both" => &["ours", "dyn"],
        other => {
            eprintln!("xtask soak: --impl (--module) is ours, dyn or both; got {other:?}");
            return Err(2);
        }
    };
    let minutes = args.minutes.unwrap_or(10.0);
    if !(minutes.is_finite() && minutes > 0.0) {
        eprintln!("xtask soak: --minutes must be a positive number; got {minutes}");
        return Err(2);
    }
    let bound = args.rss_bound_mib.map_or(RSS_BOUND_MIB, |b| b as f64);
    let venv = match python::soak_venv(sh, root, args.installed) {
        Ok(venv) => venv,
        Err(e) => {
            eprintln!("xtask soak: {e}");
            return Err(1);
        }
    };
    let gated = impls[0];
    let mut failed = false;
    let mut reports = Vec::new();
    for &which in impls {
        let (ok, report) = run_one(sh, root, &venv, which, minutes, bound);
        if !ok && which == gated {
            failed = true;
        }
        reports.extend(report);
    }
    // The page's soak section and picture, from this run's reports.
    let command = format!(
        "cargo xtask soak --impl {} --minutes {minutes}",
        args.module.as_deref().unwrap_or("ours")
    );
    if let Err(e) = page::publish(sh, root, reports, command) {
        eprintln!("xtask soak: {e}");
        return Err(1);
    }
    let bench = root.join(perf::REPORT_COPY);
    if bench.is_file() {
        perf::publish(root, &bench)?;
    }
    if failed { Err(1) } else { Ok(()) }
}

/// The long suite's step: 60 minutes with ours, the package as the Python
/// step installed it (built here when there is no virtualenv yet).
pub(crate) fn long(sh: &Shell, root: &Path) -> bool {
    match python::soak_venv(sh, root, python::venv_exists(root)) {
        Ok(venv) => run_one(sh, root, &venv, "ours", 60.0, RSS_BOUND_MIB).0,
        Err(e) => {
            eprintln!("xtask soak: {e}");
            false
        }
    }
}

/// Runs the soak of one module and writes its report; whether every verdict
/// passed, and the report if there is one.
fn run_one(
    sh: &Shell,
    root: &Path,
    venv: &python::Venv,
    which: &str,
    minutes: f64,
    bound: f64,
) -> (bool, Option<Report>) {
    let out = root.join("target/soak").join(which);
    // A fresh folder: the samples files are appended to.
    if sh.remove_path(&out).is_err() || sh.create_dir(&out).is_err() {
        eprintln!("xtask soak: cannot make a fresh {}", out.display());
        return (false, None);
    }
    let python = &venv.python;
    let script = root.join(SCRIPT);
    let minutes_arg = minutes.to_string();
    let mut supervise = cmd!(
        sh,
        "{python} {script} supervise --impl {which} --minutes {minutes_arg} --out {out}"
    )
    .envs(python::test_env(venv))
    .env_remove("VIRTUAL_ENV")
    .env_remove("NIXL_RUNTIME_DIR")
    .env_remove("NIXL_CAPI_LIB");
    supervise = if which == "dyn" {
        let path = std::env::join_paths([&venv.dynamo_src, &venv.torch_stub])
            .unwrap_or_else(|_| venv.dynamo_src.clone().into_os_string());
        supervise.env("PYTHONPATH", path)
    } else {
        supervise.env_remove("PYTHONPATH")
    };
    eprintln!(
        "xtask soak: {which}, {minutes} minutes, into {}",
        out.display()
    );
    let driven = run(supervise);
    let report = match analyze_dir(&out, bound) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("xtask soak ({which}): {e}");
            return (false, None);
        }
    };
    let markdown = render(&report);
    let written = serde_json::to_string_pretty(&report)
        .map_err(|e| e.to_string())
        .and_then(|json| {
            std::fs::write(out.join("report.json"), json + "\n").map_err(|e| e.to_string())
        })
        .and_then(|()| std::fs::write(out.join("report.md"), &markdown).map_err(|e| e.to_string()));
    if let Err(e) = written {
        eprintln!("xtask soak: write the report into {}: {e}", out.display());
        return (false, Some(report));
    }
    println!("{markdown}");
    eprintln!(
        "xtask soak ({which}): {} (report: {})",
        if report.passed && driven {
            "passed"
        } else {
            "FAILED"
        },
        out.join("report.md").display()
    );
    (report.passed && driven, Some(report))
}

/// The driver's `run.json`.
#[derive(Debug, Deserialize)]
struct RunInfo {
    #[serde(rename = "impl")]
    module: String,
    minutes: f64,
    t0: f64,
    deadline: f64,
}

/// One line of a `<role>.samples.jsonl`: a process's counters at a time.
#[derive(Debug, Clone, Deserialize)]
struct Sample {
    ts: f64,
    #[serde(default)]
    inc: u32,
    ops: u64,
    ok: u64,
    #[serde(default)]
    bytes_ok: u64,
    wrong_bytes: u64,
    #[serde(default)]
    hangs: u64,
    fds: u64,
    threads: u64,
    rss_mib: f64,
    #[serde(default)]
    begin_s: f64,
    #[serde(default)]
    md_last: Option<u64>,
    #[serde(default)]
    registrations: Option<u64>,
    #[serde(default)]
    remote_agents: Option<u64>,
    #[serde(default)]
    intended: BTreeMap<String, u64>,
    #[serde(default)]
    errors: BTreeMap<String, u64>,
}

/// One line of `supervisor.events.jsonl`.
#[derive(Debug, Deserialize)]
struct Event {
    ev: String,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    rc: Option<i64>,
}

/// The report of one soak run (`report.json`).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Report {
    /// `ours` or `dyn`.
    module: String,
    minutes: f64,
    /// What the throughput verdict compares.
    windows: String,
    processes: Vec<Process>,
    verdicts: Vec<Verdict>,
    /// Whether every verdict passed.
    pub(crate) passed: bool,
}

/// One process of the report; the peers' incarnations together.
#[derive(Debug, Serialize, Deserialize)]
struct Process {
    role: String,
    incarnations: usize,
    minutes: Vec<Minute>,
    /// Transfers completed and verified per second, first and last window.
    ok_per_s_first: f64,
    ok_per_s_last: f64,
    peak_rss_mib: f64,
    /// RSS growth from the end of the first window to the end (MiB per hour).
    rss_mib_per_hour: Option<f64>,
    ops: u64,
    ok: u64,
    bytes_ok: u64,
    wrong_bytes: u64,
    hangs: u64,
    errors: BTreeMap<String, u64>,
    intended: BTreeMap<String, u64>,
}

/// One minute of one process: the highest fds, threads and RSS seen, the
/// operations ended in it, and the last native counts.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Minute {
    minute: usize,
    fds: u64,
    threads: u64,
    rss_mib: f64,
    ops_per_s: f64,
    ok_per_s: f64,
    /// Seconds spent starting operations (begin_* / create_*), per operation, ms.
    begin_ms_per_op: Option<f64>,
    registrations: Option<u64>,
    remote_agents: Option<u64>,
    /// The server's latest one-descriptor metadata, bytes.
    metadata_bytes: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Verdict {
    what: String,
    measured: String,
    passed: bool,
}

fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("read {}: {e}", path.display())),
    };
    parse_lines(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Newline-delimited JSON; a last line cut short (a process killed while
/// writing) is left out.
fn parse_lines<T: for<'de> Deserialize<'de>>(text: &str) -> Result<Vec<T>, String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut parsed = Vec::with_capacity(lines.len());
    for (n, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(value) => parsed.push(value),
            Err(_) if n + 1 == lines.len() && !line.ends_with('}') => {}
            Err(e) => return Err(format!("line {}: {e}", n + 1)),
        }
    }
    Ok(parsed)
}

/// The report of the run whose files are in `dir`.
pub(crate) fn analyze_dir(dir: &Path, bound: f64) -> Result<Report, String> {
    let run_json = dir.join("run.json");
    let text = std::fs::read_to_string(&run_json).map_err(|e| {
        format!(
            "read {}: {e} (the server never came up? see server.log there)",
            run_json.display()
        )
    })?;
    let info: RunInfo =
        serde_json::from_str(&text).map_err(|e| format!("parse {}: {e}", run_json.display()))?;
    let mut samples = BTreeMap::new();
    for role in ROLES {
        samples.insert(
            *role,
            read_lines::<Sample>(&dir.join(format!("{role}.samples.jsonl")))?,
        );
    }
    let events: Vec<Event> = read_lines(&dir.join("supervisor.events.jsonl"))?;
    Ok(analyze(&info, &samples, &events, bound))
}

/// A process's samples split by incarnation, each sorted by time.
fn incarnations(samples: &[Sample]) -> Vec<Vec<&Sample>> {
    let mut by: BTreeMap<u32, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by.entry(s.inc).or_default().push(s);
    }
    let mut series: Vec<Vec<&Sample>> = by.into_values().collect();
    for s in &mut series {
        s.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    }
    series
}

/// `field` of a series at time `t` (seconds from the origin), linear between
/// samples, the first value before the first and the last after the last.
fn at(series: &[&Sample], t0: f64, t: f64, field: fn(&Sample) -> f64) -> f64 {
    let Some(first) = series.first() else {
        return 0.0;
    };
    if t <= first.ts - t0 {
        return field(first);
    }
    for pair in series.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let (ta, tb) = (a.ts - t0, b.ts - t0);
        if t <= tb {
            let f = if tb > ta { (t - ta) / (tb - ta) } else { 1.0 };
            return field(a) + f * (field(b) - field(a));
        }
    }
    series.last().map_or(0.0, |s| field(s))
}

fn analyze(
    info: &RunInfo,
    samples: &BTreeMap<&str, Vec<Sample>>,
    events: &[Event],
    bound: f64,
) -> Report {
    let span = (info.deadline - info.t0).max(1.0);
    let (window, windows) = if span >= 2.0 * WINDOW_S {
        (
            WINDOW_S,
            "the last 10 minutes against the first 10".to_owned(),
        )
    } else {
        (
            span / 3.0,
            format!(
                "the last third against the first third ({:.0} s each: the run is shorter than 20 minutes)",
                span / 3.0
            ),
        )
    };
    let buckets = (span / 60.0).ceil().max(1.0) as usize;
    let mut processes = Vec::new();
    for role in ROLES {
        let Some(all) = samples.get(role) else {
            continue;
        };
        if all.is_empty() {
            continue;
        }
        processes.push(process(role, all, info.t0, span, window, buckets));
    }

    let mut verdicts = Vec::new();
    for role in LONG_LIVED {
        match processes.iter().find(|p| p.role == *role) {
            Some(p) => {
                let ratio = if p.ok_per_s_first > 0.0 {
                    p.ok_per_s_last / p.ok_per_s_first
                } else {
                    0.0
                };
                verdicts.push(Verdict {
                    what: format!(
                        "{role}: verified transfers/s, last window >= {MIN_RATIO}x first"
                    ),
                    measured: format!(
                        "{:.1} -> {:.1} /s ({ratio:.2}x)",
                        p.ok_per_s_first, p.ok_per_s_last
                    ),
                    passed: ratio >= MIN_RATIO,
                });
            }
            None => verdicts.push(Verdict {
                what: format!("{role}: verified transfers/s, last window >= {MIN_RATIO}x first"),
                measured: "no samples".to_owned(),
                passed: false,
            }),
        }
    }
    let peak = processes
        .iter()
        .map(|p| (p.peak_rss_mib, p.role.as_str()))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    verdicts.push(Verdict {
        what: format!("peak RSS of every process <= {bound:.0} MiB"),
        measured: peak.map_or("no samples".to_owned(), |(rss, role)| {
            format!("{rss:.0} MiB ({role})")
        }),
        passed: peak.is_some_and(|(rss, _)| rss <= bound),
    });
    let wrong: u64 = processes.iter().map(|p| p.wrong_bytes).sum();
    verdicts.push(Verdict {
        what: "0 wrong bytes".to_owned(),
        measured: format!(
            "{wrong} wrong of {:.1} GB verified",
            processes.iter().map(|p| p.bytes_ok).sum::<u64>() as f64 / 1e9
        ),
        passed: wrong == 0 && processes.iter().any(|p| p.ok > 0),
    });
    let died = events.iter().any(|e| e.ev == "long_lived_died");
    let exits: Vec<String> = LONG_LIVED
        .iter()
        .map(|role| {
            let rc = events
                .iter()
                .rev()
                .find(|e| e.ev == "exit" && e.role.as_deref() == Some(role))
                .and_then(|e| e.rc);
            format!(
                "{role} {}",
                rc.map_or("did not exit".to_owned(), |rc| format!("rc {rc}"))
            )
        })
        .collect();
    let hangs = events.iter().filter(|e| e.ev.contains("hang")).count();
    verdicts.push(Verdict {
        what: "server and client ran to the end and exited cleanly".to_owned(),
        measured: format!(
            "{}{}{}",
            exits.join(", "),
            if died {
                "; one died before the end"
            } else {
                ""
            },
            if hangs > 0 {
                format!("; {hangs} process(es) killed after hanging")
            } else {
                String::new()
            }
        ),
        passed: !died && exits.iter().all(|e| e.ends_with(" rc 0")),
    });
    let passed = verdicts.iter().all(|v| v.passed);
    Report {
        module: info.module.clone(),
        minutes: info.minutes,
        windows,
        processes,
        verdicts,
        passed,
    }
}

fn process(role: &str, all: &[Sample], t0: f64, span: f64, window: f64, buckets: usize) -> Process {
    let series = incarnations(all);
    let mut minutes: Vec<Minute> = (0..buckets)
        .map(|minute| Minute {
            minute,
            ..Minute::default()
        })
        .collect();
    let mut ops = vec![0u64; buckets];
    let mut ok = vec![0u64; buckets];
    let mut begin = vec![0f64; buckets];
    let bucket_of = |ts: f64| (((ts - t0).max(0.0) / 60.0) as usize).min(buckets - 1);
    for s in &series {
        let mut prev: Option<&Sample> = None;
        for cur in s {
            let b = bucket_of(cur.ts);
            let (p_ops, p_ok, p_begin) = prev.map_or((0, 0, 0.0), |p| (p.ops, p.ok, p.begin_s));
            ops[b] += cur.ops.saturating_sub(p_ops);
            ok[b] += cur.ok.saturating_sub(p_ok);
            begin[b] += (cur.begin_s - p_begin).max(0.0);
            let m = &mut minutes[b];
            m.fds = m.fds.max(cur.fds);
            m.threads = m.threads.max(cur.threads);
            m.rss_mib = m.rss_mib.max(cur.rss_mib);
            m.registrations = max_opt(m.registrations, cur.registrations);
            m.remote_agents = max_opt(m.remote_agents, cur.remote_agents);
            if cur.md_last.is_some() {
                m.metadata_bytes = cur.md_last;
            }
            prev = Some(cur);
        }
    }
    for (b, m) in minutes.iter_mut().enumerate() {
        let length = (span - 60.0 * b as f64).clamp(1.0, 60.0);
        m.ops_per_s = ops[b] as f64 / length;
        m.ok_per_s = ok[b] as f64 / length;
        m.begin_ms_per_op = (ops[b] > 0).then(|| 1e3 * begin[b] / ops[b] as f64);
    }
    let ok_of = |s: &Sample| s.ok as f64;
    let in_window = |from: f64, to: f64| -> f64 {
        series
            .iter()
            .map(|s| at(s, t0, to, ok_of) - at(s, t0, from, ok_of))
            .sum::<f64>()
            / window
    };
    let rss_of = |s: &Sample| s.rss_mib;
    // RSS growth once warm, of the long-lived processes: from the end of
    // the first window to the end of the run.
    let rss_mib_per_hour = series
        .iter()
        .filter(|_| LONG_LIVED.contains(&role))
        .max_by_key(|s| s.len())
        .filter(|s| s.last().is_some_and(|l| l.ts - t0 > window + 60.0))
        .map(|s| {
            let end = s.last().map_or(span, |l| (l.ts - t0).min(span));
            (at(s, t0, end, rss_of) - at(s, t0, window, rss_of)) / (end - window) * 3600.0
        });
    let lasts: Vec<&Sample> = series.iter().filter_map(|s| s.last().copied()).collect();
    let mut errors = BTreeMap::new();
    let mut intended = BTreeMap::new();
    for l in &lasts {
        for (k, v) in &l.errors {
            *errors.entry(k.clone()).or_insert(0) += v;
        }
        for (k, v) in &l.intended {
            *intended.entry(k.clone()).or_insert(0) += v;
        }
    }
    Process {
        role: if role == "peer" { "peers" } else { role }.to_owned(),
        incarnations: series.len(),
        minutes,
        ok_per_s_first: in_window(0.0, window),
        ok_per_s_last: in_window(span - window, span),
        peak_rss_mib: all.iter().map(|s| s.rss_mib).fold(0.0, f64::max),
        rss_mib_per_hour,
        ops: lasts.iter().map(|l| l.ops).sum(),
        ok: lasts.iter().map(|l| l.ok).sum(),
        bytes_ok: lasts.iter().map(|l| l.bytes_ok).sum(),
        wrong_bytes: lasts.iter().map(|l| l.wrong_bytes).sum(),
        hangs: lasts.iter().map(|l| l.hangs).sum(),
        errors,
        intended,
    }
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".to_owned(), |v| v.to_string())
}

/// `report.md`: the verdicts, a table per process, the errors by kind.
fn render(r: &Report) -> String {
    let mut w = String::new();
    let module = if r.module == "dyn" {
        "Dynamo 1.6.1's dynamo.nixl_connect"
    } else {
        "nixl_connect (ours)"
    };
    let _ = writeln!(
        w,
        "# Soak: {module} on NIXL, {} minutes\n\nThroughput compares {}.\n",
        r.minutes, r.windows
    );
    let _ = writeln!(w, "| verdict | measured | |\n|---|---|---|");
    for v in &r.verdicts {
        let _ = writeln!(
            w,
            "| {} | {} | {} |",
            v.what,
            v.measured,
            if v.passed { "pass" } else { "**FAIL**" }
        );
    }
    for p in &r.processes {
        let growth = p.rss_mib_per_hour.map_or(String::new(), |g| {
            format!(", RSS {g:+.0} MiB/hour once warm")
        });
        let _ = writeln!(
            w,
            "\n## {} ({} incarnation{})\n\n{} operations, {} verified ({:.1} GB), {} wrong bytes, {} hangs; \
             verified/s {:.1} first window, {:.1} last{growth}.\n",
            p.role,
            p.incarnations,
            if p.incarnations == 1 { "" } else { "s" },
            p.ops,
            p.ok,
            p.bytes_ok as f64 / 1e9,
            p.wrong_bytes,
            p.hangs,
            p.ok_per_s_first,
            p.ok_per_s_last
        );
        let _ = writeln!(
            w,
            "| minute | fds | threads | RSS MiB | ops/s | verified/s | begin ms/op | registrations | remote agents | 1-desc metadata B |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for m in &p.minutes {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {} | {} | {} | {} |",
                m.minute,
                m.fds,
                m.threads,
                m.rss_mib,
                m.ops_per_s,
                m.ok_per_s,
                opt(m.begin_ms_per_op.map(|b| format!("{b:.2}"))),
                opt(m.registrations),
                opt(m.remote_agents),
                opt(m.metadata_bytes)
            );
        }
        if !p.errors.is_empty() || !p.intended.is_empty() {
            let _ = writeln!(w, "\n| {} | kind | count |\n|---|---|---:|", p.role);
            for (k, v) in &p.errors {
                let _ = writeln!(w, "| error | {} | {v} |", k.replace('|', "/"));
            }
            for (k, v) in &p.intended {
                let _ = writeln!(
                    w,
                    "| abandoned on purpose | {} | {v} |",
                    k.replace('|', "/")
                );
            }
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: f64 = 1_000_000.0;

    /// Samples of a process every 10 s for `span` seconds whose verified
    /// operations come at `rate(t)` per second, and whose RSS is `rss(t)`.
    fn series(
        role: &str,
        inc: u32,
        from: f64,
        span: f64,
        rate: fn(f64) -> f64,
        rss: fn(f64) -> f64,
    ) -> String {
        let (mut ok, mut t, mut lines) = (0.0, from, String::new());
        while t <= from + span {
            let _ = writeln!(
                lines,
                r#"{{"ts": {}, "role": "{role}", "inc": {inc}, "final": false, "ops": {}, "ok": {}, "bytes_ok": {}, "wrong_bytes": 0, "fds": 40, "threads": 7, "rss_mib": {}, "begin_s": {}, "errors": {{"e:X": 1}}, "intended": {{}}}}"#,
                T0 + t,
                ok as u64 + 1,
                ok as u64,
                ok as u64 * 4096,
                rss(t),
                ok * 0.001
            );
            ok += rate(t) * 10.0;
            t += 10.0;
        }
        lines
    }

    pub(super) fn report(
        minutes: f64,
        client_rate: fn(f64) -> f64,
        client_rss: fn(f64) -> f64,
        wrong_peer: bool,
    ) -> Report {
        let span = minutes * 60.0;
        let info = RunInfo {
            module: "ours".to_owned(),
            minutes,
            t0: T0,
            deadline: T0 + span,
        };
        let mut peers = series("peer", 1, 0.0, 28.0, |_| 5.0, |_| 150.0);
        let mut second = series("peer", 2, 30.0, 28.0, |_| 5.0, |_| 150.0);
        if wrong_peer {
            second = second.replace(r#""wrong_bytes": 0"#, r#""wrong_bytes": 3"#);
        }
        peers += &second;
        // A peer killed mid-line: its cut last line is left out.
        peers += r#"{"ts": 1000061.0, "role": "peer", "inc": 3, "ops""#;
        let text = [
            (
                "server",
                series("server", 0, 0.0, span, |_| 50.0, |_| 300.0),
            ),
            (
                "client",
                series("client", 0, 0.0, span, client_rate, client_rss),
            ),
            ("peer", peers),
        ];
        let samples = text
            .iter()
            .map(|(role, text)| (*role, parse_lines::<Sample>(text).unwrap()))
            .collect();
        let events = parse_lines::<Event>(
            "{\"ev\": \"exit\", \"role\": \"client\", \"rc\": 0}\n{\"ev\": \"exit\", \"role\": \"server\", \"rc\": 0}\n",
        )
        .unwrap();
        analyze(&info, &samples, &events, RSS_BOUND_MIB)
    }

    fn verdict<'a>(r: &'a Report, what: &str) -> &'a Verdict {
        r.verdicts
            .iter()
            .find(|v| v.what.starts_with(what))
            .unwrap()
    }

    #[test]
    fn a_flat_run_passes_with_its_rates_per_minute_and_peers_aggregated() {
        let r = report(3.0, |_| 20.0, |_| 200.0, false);
        assert!(r.passed, "{:#?}", r.verdicts);
        assert!(r.windows.contains("third"), "{}", r.windows);
        let client = r.processes.iter().find(|p| p.role == "client").unwrap();
        assert_eq!(client.minutes.len(), 3);
        // 20 verified per second in every full minute (the first bucket
        // holds the samples at 0..50 s plus the one at 60 s is the next's).
        assert!(
            (client.minutes[1].ok_per_s - 20.0).abs() < 0.5,
            "{:?}",
            client.minutes
        );
        assert!(
            (client.ok_per_s_first - 20.0).abs() < 0.5 && (client.ok_per_s_last - 20.0).abs() < 0.5
        );
        let peers = r.processes.iter().find(|p| p.role == "peers").unwrap();
        assert_eq!(peers.incarnations, 2);
        assert_eq!(peers.errors["e:X"], 2, "errors summed over incarnations");
        // Samples at 0, 10 and 20 s of each: 100 verified by the last.
        assert_eq!(peers.ok, 2 * 100);
    }

    #[test]
    fn a_client_that_slows_by_half_fails_the_throughput_verdict_and_the_command() {
        let r = report(
            30.0,
            |t| if t < 900.0 { 40.0 } else { 20.0 },
            |_| 200.0,
            false,
        );
        assert!(!r.passed);
        assert!(r.windows.contains("10 minutes"), "{}", r.windows);
        let v = verdict(&r, "client: verified");
        assert!(!v.passed && v.measured.contains("0.50x"), "{v:?}");
        assert!(verdict(&r, "server: verified").passed);
    }

    #[test]
    fn growing_rss_past_the_bound_and_wrong_bytes_fail_their_verdicts() {
        let r = report(30.0, |_| 20.0, |t| 200.0 + t, true);
        let rss = verdict(&r, "peak RSS");
        assert!(!rss.passed && rss.measured.contains("(client)"), "{rss:?}");
        let client = r.processes.iter().find(|p| p.role == "client").unwrap();
        let growth = client.rss_mib_per_hour.unwrap();
        assert!((growth - 3600.0).abs() < 1.0, "{growth}");
        let wrong = verdict(&r, "0 wrong bytes");
        assert!(
            !wrong.passed && wrong.measured.starts_with("3 wrong"),
            "{wrong:?}"
        );
        let md = render(&r);
        assert!(
            md.contains("**FAIL**") && md.contains("## client (1 incarnation)"),
            "{md}"
        );
    }
}
