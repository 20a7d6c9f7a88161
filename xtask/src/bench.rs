//! `cargo xtask bench`: the interleaved benchmark, the criterion hot paths
//! and the Python rows, then docs/performance.md rendered (`perf.rs`).

use xshell::{Shell, cmd};

use crate::shell::{cargo, run};
use crate::{Workspace, flags, hosts, nixl, perf, python};

pub(crate) fn bench(sh: &Shell, ws: &Workspace, args: &flags::Bench) -> Result<(), u8> {
    let (root, quick) = (ws.root.as_path(), args.quick);
    if args.render_only {
        let report = args
            .report
            .clone()
            .unwrap_or_else(|| root.join(perf::REPORT));
        return perf::publish(root, &report);
    }
    if args.python {
        python::bench(sh, ws, quick)?;
        eprintln!(
            "xtask bench --python: wrote {}; `cargo xtask bench --render-only` renders docs/performance.md from it",
            root.join(perf::REPORT).display()
        );
        return Ok(());
    }
    if args.two_hosts {
        let runtime = nixl::provision(sh, root, "bench")?;
        return hosts::bench(sh, ws, &runtime.root, quick);
    }
    let runtime = nixl::provision(sh, root, "bench")?;
    let out = root.join("target/bench");
    let cargo = cargo();
    let quick_flag = quick.then_some("--quick");
    let measured = run(cmd!(
        sh,
        "{cargo} run --quiet --release -p bench -- --out {out} {quick_flag...}"
    )
    .env("NIXL_RUNTIME_DIR", &runtime.root));
    if !measured {
        return Err(1);
    }
    let command = if quick {
        "cargo xtask bench --quick"
    } else {
        "cargo xtask bench"
    };
    perf::stamp(sh, &root.join(perf::REPORT), command).map_err(|e| {
        eprintln!("xtask bench: {e}");
        1
    })?;
    let short: &[&str] = if quick {
        &["--warm-up-time", "0.5", "--measurement-time", "1"]
    } else {
        &[]
    };
    if !run(cmd!(
        sh,
        "{cargo} bench -p backend-loopback --bench hot_paths -- {short...}"
    )) {
        return Err(1);
    }
    // The Python rows (nixl_connect vs the real Dynamo module) when the
    // Python environment exists (`cargo xtask test` or `bench --python` made it).
    if python::venv_exists(root) {
        python::bench(sh, ws, quick)?;
    }
    perf::publish(root, &root.join(perf::REPORT))
}
