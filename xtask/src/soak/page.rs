//! The soak's part of docs/performance.md: `cargo xtask soak` writes
//! [`REPORTS`] (the reports of the modules it ran, with the machine's date and
//! commit, and the latest earlier report of each module it did not run, with
//! theirs) and [`PLOT`] (RSS and verified operations per second against time,
//! server and client, one line per module); [`section`] renders them on the
//! page, which `publish` regenerates from docs/bench-report.json.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use xshell::{Shell, cmd};

use super::{LONG_LIVED, Report};

/// The soak reports the page shows, from the workspace root.
pub(crate) const REPORTS: &str = "docs/soak-report.json";
/// The soak's picture, from the workspace root (linked from the page).
pub(crate) const PLOT: &str = "docs/soak.svg";

/// What [`REPORTS`] holds: one run, and the earlier runs of the modules it
/// did not run (a 60-minute run of ours beside Dynamo's reference, say).
#[derive(Debug, Serialize, Deserialize)]
struct Published {
    command: String,
    date: String,
    commit: String,
    reports: Vec<Report>,
    /// Earlier runs, each holding only the modules no later run holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    earlier: Vec<Published>,
}

impl Published {
    /// Every report shown, whichever run it is from: ours first, then
    /// Dynamo's.
    fn all_reports(&self) -> Vec<&Report> {
        let mut all: Vec<&Report> = self
            .reports
            .iter()
            .chain(self.earlier.iter().flat_map(|e| e.reports.iter()))
            .collect();
        all.sort_by_key(|r| r.module == "dyn");
        all
    }

    /// The runs before `self` with only the modules `self` did not run; the
    /// rest of `self.earlier` is dropped.
    fn keep_earlier(mut self, ran: &[&str]) -> Vec<Published> {
        let mut earlier = std::mem::take(&mut self.earlier);
        earlier.insert(0, self);
        earlier
            .into_iter()
            .filter_map(|mut run| {
                run.reports.retain(|r| !ran.contains(&r.module.as_str()));
                (!run.reports.is_empty()).then_some(run)
            })
            .collect()
    }
}

/// Writes [`REPORTS`] and [`PLOT`] for `reports` (one run of each module),
/// keeping from the last [`REPORTS`] the modules this run did not run.
pub(crate) fn publish(
    sh: &Shell,
    root: &Path,
    reports: Vec<Report>,
    command: String,
) -> Result<(), String> {
    let read = |c: xshell::Cmd<'_>| c.quiet().read().unwrap_or_else(|_| "not recorded".into());
    let ran: Vec<&str> = reports.iter().map(|r| r.module.as_str()).collect();
    let earlier = std::fs::read_to_string(root.join(REPORTS))
        .ok()
        .and_then(|text| serde_json::from_str::<Published>(&text).ok())
        .map_or_else(Vec::new, |last| last.keep_earlier(&ran));
    let published = Published {
        command,
        date: read(cmd!(sh, "date -u +%Y-%m-%dT%H:%MZ")),
        commit: read(cmd!(sh, "git rev-parse --short=12 HEAD")),
        reports,
        earlier,
    };
    let json = serde_json::to_string_pretty(&published).map_err(|e| e.to_string())?;
    let write = |path: &str, text: String| {
        std::fs::write(root.join(path), text).map_err(|e| format!("write {path}: {e}"))
    };
    write(REPORTS, json + "\n")?;
    write(PLOT, svg(&published.all_reports()))
}

/// The page's soak section, from [`REPORTS`]; `None` when there is none (or
/// it cannot be read, which is said on stderr).
pub(crate) fn section(root: &Path) -> Option<String> {
    let text = std::fs::read_to_string(root.join(REPORTS)).ok()?;
    let published: Published = match serde_json::from_str(&text) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xtask: {REPORTS} is not a soak report ({e}); the page has no soak section");
            return None;
        }
    };
    Some(render(&published))
}

fn render(p: &Published) -> String {
    let mut w = String::new();
    let runs: Vec<String> = std::iter::once(p)
        .chain(&p.earlier)
        .map(|run| {
            let modules: Vec<&str> = run.reports.iter().map(|r| module_name(&r.module)).collect();
            format!(
                "{}: `{}`, {}, commit {}",
                modules.join(" and "),
                run.command,
                run.date,
                run.commit
            )
        })
        .collect();
    let _ = writeln!(
        w,
        "## Soak\n\n\
         The mixed workload of issue 48 (`crates/nixl-connect-py/soak/soak.py`: a \
         long-lived server and client, a peer restarted every 30 s and every third \
         one killed mid-transfer, about 5% of operations abandoned, every byte \
         checked) on NIXL, one run per module: {}. Full tables: \
         `target/soak/<module>/report.md` of that run; the numbers here are from \
         [soak-report.json](soak-report.json).\n\n\
         ![RSS and verified operations per second against time](soak.svg)\n\n\
         | module | process | minutes | verified/s first | last | last / first | peak RSS MiB | RSS MiB/hour once warm | wrong bytes |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|",
        runs.join("; ")
    );
    for r in p.all_reports() {
        for proc in r
            .processes
            .iter()
            .filter(|p| LONG_LIVED.contains(&p.role.as_str()))
        {
            let ratio = if proc.ok_per_s_first > 0.0 {
                format!("{:.2}", proc.ok_per_s_last / proc.ok_per_s_first)
            } else {
                "-".into()
            };
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.1} | {:.1} | {ratio} | {:.0} | {} | {} |",
                module_name(&r.module),
                proc.role,
                r.minutes,
                proc.ok_per_s_first,
                proc.ok_per_s_last,
                proc.peak_rss_mib,
                proc.rss_mib_per_hour
                    .map_or("-".into(), |g| format!("{g:+.0}")),
                proc.wrong_bytes
            );
        }
    }
    for r in p.all_reports() {
        let _ = writeln!(
            w,
            "\n{} ({} minutes; throughput compares {}): {}.",
            module_name(&r.module),
            r.minutes,
            r.windows,
            r.verdicts
                .iter()
                .map(|v| format!(
                    "{} {} ({})",
                    v.what,
                    if v.passed { "passed" } else { "**failed**" },
                    v.measured
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    w.push('\n');
    w
}

fn module_name(module: &str) -> &'static str {
    if module == "dyn" {
        "Dynamo 1.6.1"
    } else {
        "nixl_connect"
    }
}

/// One process's line: its label, whether dashed (Dynamo's), its colour, and
/// per minute (minute, RSS MiB, verified/s).
type Line<'a> = (String, bool, &'a str, Vec<(f64, f64, f64)>);

/// Two panels against minutes: RSS (MiB) above, verified operations per
/// second below; a colour per process, solid for ours, dashed for Dynamo's.
fn svg(reports: &[&Report]) -> String {
    let (w, panel, left, right, top, gap) = (760.0, 220.0, 70.0, 190.0, 40.0, 60.0);
    let h = top + 2.0 * panel + gap + 50.0;
    let lines: Vec<Line> = reports
        .iter()
        .flat_map(|r| {
            r.processes
                .iter()
                .filter(|p| LONG_LIVED.contains(&p.role.as_str()))
                .map(move |p| {
                    let points = p
                        .minutes
                        .iter()
                        .map(|m| (m.minute as f64, m.rss_mib, m.ok_per_s))
                        .collect();
                    (
                        format!("{} {} ({} min)", module_name(&r.module), p.role, r.minutes),
                        r.module == "dyn",
                        if p.role == "server" {
                            "#1f77b4"
                        } else {
                            "#d62728"
                        },
                        points,
                    )
                })
        })
        .collect();
    let all = || lines.iter().flat_map(|l| l.3.iter());
    let xmax = all().map(|p| p.0).fold(1.0, f64::max);
    let rss_max = all().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let ops_max = all().map(|p| p.2).fold(1.0, f64::max) * 1.1;
    let px = |x: f64| left + x / xmax * (w - left - right);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">Soak on NIXL: RSS and verified operations per second, per minute</text>"##,
        (w - right + left) / 2.0
    );
    for (i, (label, max)) in [("RSS, MiB", rss_max), ("verified / s", ops_max)]
        .into_iter()
        .enumerate()
    {
        let y0 = top + i as f64 * (panel + gap);
        let py = move |v: f64| y0 + panel - v / max * panel;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{left}" y1="{y0}" x2="{left}" y2="{}" stroke="black"/><text x="18" y="{}" transform="rotate(-90 18 {})" text-anchor="middle">{label}</text>"##,
            y0 + panel,
            w - right,
            y0 + panel,
            y0 + panel,
            y0 + panel / 2.0,
            y0 + panel / 2.0
        );
        for t in 0..=4 {
            let v = max / 4.0 * f64::from(t);
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
                left - 6.0,
                py(v) + 4.0
            );
        }
        for (_, dashed, color, points) in &lines {
            let path: Vec<String> = points
                .iter()
                .map(|&(x, rss, ops)| {
                    format!("{:.1},{:.1}", px(x), py(if i == 0 { rss } else { ops }))
                })
                .collect();
            let dash = if *dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let _ = writeln!(
                s,
                r##"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"##,
                path.join(" ")
            );
        }
    }
    let bottom = top + 2.0 * panel + gap;
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{}" text-anchor="middle">minute</text>"##,
        (left + w - right) / 2.0,
        bottom + 35.0
    );
    for m in 0..=4 {
        let x = xmax / 4.0 * f64::from(m);
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{}" text-anchor="middle">{x:.0}</text>"##,
            px(x),
            bottom + 16.0
        );
    }
    for (k, (label, dashed, color, _)) in lines.iter().enumerate() {
        let ly = top + 20.0 + 20.0 * k as f64;
        let dash = if *dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r##"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"##,
            w - right + 10.0,
            w - right + 35.0,
            w - right + 40.0,
            ly + 4.0,
            label
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::super::tests::report;
    use super::*;

    #[test]
    fn the_section_has_a_row_per_long_lived_process_and_the_plot_a_line_each() {
        let run = |module: &str| {
            let mut r = report(3.0, |_| 20.0, |_| 400.0, false);
            r.module = module.to_owned();
            r
        };
        let (ours, dynamo) = (run("ours"), run("dyn"));
        let page = render(&Published {
            command: "cargo xtask soak --impl both".into(),
            date: "2026-12-07T00:00Z".into(),
            commit: "0123456789ab".into(),
            reports: vec![ours, dynamo],
            earlier: Vec::new(),
        });
        assert!(page.starts_with("## Soak\n"), "{page}");
        assert!(page.contains("](soak.svg)"), "{page}");
        for row in [
            "| nixl_connect | server |",
            "| nixl_connect | client |",
            "| Dynamo 1.6.1 | server |",
            "| Dynamo 1.6.1 | client |",
        ] {
            assert!(page.contains(row), "{row} missing:\n{page}");
        }
        assert!(!page.contains("| peer |"), "{page}");
        let plot = svg(&[&run("ours"), &run("dyn")]);
        assert!(plot.starts_with("<svg ") && plot.ends_with("</svg>\n"));
        // Two panels, four lines each; Dynamo's dashed.
        assert_eq!(plot.matches("<polyline").count(), 8, "{plot}");
        assert_eq!(plot.matches("stroke-dasharray").count(), 4 + 2, "{plot}");
    }

    #[test]
    fn a_run_keeps_the_latest_earlier_report_of_each_module_it_did_not_run() {
        let run = |command: &str, modules: &[&str]| Published {
            command: command.into(),
            date: "2026-12-07T00:00Z".into(),
            commit: "0123456789ab".into(),
            reports: modules
                .iter()
                .map(|&m| {
                    let mut r = report(3.0, |_| 20.0, |_| 400.0, false);
                    r.module = m.to_owned();
                    r
                })
                .collect(),
            earlier: Vec::new(),
        };
        let modules = |p: &[Published]| -> Vec<(String, Vec<String>)> {
            p.iter()
                .map(|r| {
                    (
                        r.command.clone(),
                        r.reports.iter().map(|r| r.module.clone()).collect(),
                    )
                })
                .collect()
        };
        let both = run("both", &["ours", "dyn"]);
        let earlier = both.keep_earlier(&["ours"]);
        assert_eq!(modules(&earlier), [("both".into(), vec!["dyn".into()])]);
        // Ours again: Dynamo's report stays the one of the first run.
        let mut ours = run("ours", &["ours"]);
        ours.earlier = earlier;
        let page = render(&ours);
        assert!(
            page.contains("nixl_connect: `ours`") && page.contains("Dynamo 1.6.1: `both`"),
            "{page}"
        );
        assert_eq!(page.matches("| Dynamo 1.6.1 |").count(), 2, "{page}");
        let earlier = ours.keep_earlier(&["ours"]);
        assert_eq!(modules(&earlier), [("both".into(), vec!["dyn".into()])]);
        // Both again: nothing earlier is kept.
        let mut again = run("both", &["ours", "dyn"]);
        again.earlier = earlier;
        assert!(again.keep_earlier(&["ours", "dyn"]).is_empty());
    }
}
