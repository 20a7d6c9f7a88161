//! `cargo xtask fuzz`: libFuzzer (through cargo-fuzz) on the parsers of
//! untrusted input, on the stable toolchain, and on the NIXL backend's load
//! path with live agents (`nixl_load`: the NIXL runtime is provisioned for it,
//! as for the tests).
//!
//! cargo-fuzz needs unstable compiler flags (`-Zsanitizer`); the machine has only
//! stable Rust, so the build runs with `RUSTC_BOOTSTRAP=1`, which lets stable
//! rustc accept them. Only the fuzz targets are built that way.

use std::path::Path;

use xshell::{Shell, cmd};

use crate::shell::{cargo, run, succeeds};

const TARGETS: &[&str] = &[
    "metadata",
    "agent_metadata",
    "device",
    "authenticated_load",
    "nixl_load",
];
/// Targets that run NIXL: built with the fuzz crate's `nixl` feature, run
/// with `NIXL_RUNTIME_DIR` set.
const NIXL_TARGETS: &[&str] = &["nixl_load"];

fn ensure_cargo_fuzz(sh: &Shell) -> Result<(), String> {
    let cargo = cargo();
    if succeeds(cmd!(sh, "{cargo} fuzz --version")) {
        return Ok(());
    }
    eprintln!(
        "xtask: cargo-fuzz is missing; installing it with `cargo install cargo-fuzz --locked` (once)"
    );
    if run(cmd!(sh, "{cargo} install cargo-fuzz --locked")) {
        Ok(())
    } else {
        Err("cargo-fuzz is missing; run: cargo install cargo-fuzz --locked".into())
    }
}

/// Where `cargo fuzz` builds: the fuzz crate is a workspace of its own.
pub(crate) fn target_dir(root: &Path) -> std::path::PathBuf {
    root.join("fuzz/target")
}

/// Runs every target for `seconds`; Err if any found a crash or could not run.
pub(crate) fn run_targets(sh: &Shell, root: &Path, seconds: u64) -> Result<(), u8> {
    if let Err(e) = ensure_cargo_fuzz(sh) {
        eprintln!("xtask fuzz: {e}");
        return Err(1);
    }
    let cargo = cargo();
    let max_time = format!("-max_total_time={seconds}");
    let mut ok = true;
    for target in TARGETS {
        let nixl = NIXL_TARGETS.contains(target);
        // The runtime before the folder changes: it lives under the root.
        let runtime = if nixl {
            Some(crate::nixl::provision(sh, root, "fuzz")?)
        } else {
            None
        };
        let _fuzz = sh.push_dir(root.join("fuzz"));
        let features: &[&str] = if nixl { &["--features", "nixl"] } else { &[] };
        // The connector leaks, by design, the buffers of a transfer it
        // dropped unfinished, and NIXL and UCX keep what their agents need
        // (the target's agents live until the process exits): not leaks to
        // report, neither per run nor at exit.
        let no_leaks: &[&str] = if nixl { &["-detect_leaks=0"] } else { &[] };
        let mut cmd = cmd!(
            sh,
            "{cargo} fuzz run {features...} {target} -- {max_time} {no_leaks...}"
        )
        .env("RUSTC_BOOTSTRAP", "1");
        if let Some(runtime) = runtime {
            cmd = cmd
                .env("NIXL_RUNTIME_DIR", runtime.root)
                // UCX logs every blob it refuses; the crashes are what counts.
                .env("UCX_LOG_LEVEL", "fatal")
                .env("ASAN_OPTIONS", "detect_leaks=0");
        }
        ok &= run(cmd);
    }
    if ok { Ok(()) } else { Err(1) }
}
