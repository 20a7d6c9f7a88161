//! `cargo xtask fuzz`: libFuzzer (through cargo-fuzz) on the parsers of
//! untrusted input, on the stable toolchain, and on the NIXL backend's load
//! path with live agents (`nixl_load`: the NIXL runtime is provisioned for it,
//! as for the tests).
//!
//! cargo-fuzz needs unstable compiler flags (`-Zsanitizer`); the machine has only
//! stable Rust, so the build runs with `RUSTC_BOOTSTRAP=1`, which lets stable
//! rustc accept them. Only the fuzz targets are built that way.

use std::path::Path;
use std::process::Command;

use crate::{cargo, run};

const TARGETS: &[&str] = &["metadata", "agent_metadata", "device", "nixl_load"];
/// Targets that run NIXL: built with the fuzz crate's `nixl` feature, run
/// with `NIXL_RUNTIME_DIR` set.
const NIXL_TARGETS: &[&str] = &["nixl_load"];

fn ensure_cargo_fuzz() -> Result<(), String> {
    let present = cargo()
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        return Ok(());
    }
    eprintln!(
        "xtask: cargo-fuzz is missing; installing it with `cargo install cargo-fuzz --locked` (once)"
    );
    let installed = cargo()
        .args(["install", "cargo-fuzz", "--locked"])
        .status()
        .is_ok_and(|s| s.success());
    if installed {
        Ok(())
    } else {
        Err("cargo-fuzz is missing; run: cargo install cargo-fuzz --locked".into())
    }
}

/// Runs every target for `seconds`; Err if any found a crash or could not run.
pub(crate) fn run_targets(root: &Path, seconds: u64) -> Result<(), u8> {
    if let Err(e) = ensure_cargo_fuzz() {
        eprintln!("xtask fuzz: {e}");
        return Err(1);
    }
    let mut ok = true;
    for target in TARGETS {
        let nixl = NIXL_TARGETS.contains(target);
        let mut cmd: Command = cargo();
        cmd.args(["fuzz", "run"]);
        if nixl {
            let runtime = crate::nixl::provision(root, "fuzz")?;
            cmd.args(["--features", "nixl"])
                .env("NIXL_RUNTIME_DIR", runtime.root)
                // UCX logs every blob it refuses; the crashes are what counts.
                .env("UCX_LOG_LEVEL", "fatal");
        }
        cmd.args([*target, "--"])
            .arg(format!("-max_total_time={seconds}"));
        if nixl {
            // The connector leaks, by design, the buffers of a transfer it
            // dropped unfinished, and NIXL and UCX keep what their agents
            // need (the target's agents live until the process exits): not
            // leaks to report, neither per run nor at exit.
            cmd.arg("-detect_leaks=0")
                .env("ASAN_OPTIONS", "detect_leaks=0");
        }
        cmd.env("RUSTC_BOOTSTRAP", "1");
        ok &= run(&root.join("fuzz"), cmd);
    }
    if ok { Ok(()) } else { Err(1) }
}
