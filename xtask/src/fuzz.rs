//! `cargo xtask fuzz`: libFuzzer (through cargo-fuzz) on the parsers of
//! untrusted input, on the stable toolchain.
//!
//! cargo-fuzz needs unstable compiler flags (`-Zsanitizer`); the machine has only
//! stable Rust, so the build runs with `RUSTC_BOOTSTRAP=1`, which lets stable
//! rustc accept them. Only the fuzz targets are built that way.

use std::path::Path;
use std::process::Command;

use crate::{cargo, run};

const TARGETS: &[&str] = &["metadata", "agent_metadata", "device"];

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
        let mut cmd: Command = cargo();
        cmd.args([
            "fuzz",
            "run",
            target,
            "--",
            &format!("-max_total_time={seconds}"),
        ])
        .env("RUSTC_BOOTSTRAP", "1");
        ok &= run(&root.join("fuzz"), cmd);
    }
    if ok { Ok(()) } else { Err(1) }
}
