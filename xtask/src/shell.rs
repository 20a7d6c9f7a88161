//! How xtask runs the commands it builds with xshell's `cmd!`: cargo, pip,
//! echoed or quiet, probes.

use std::ffi::OsString;
use std::path::Path;

use xshell::{Cmd, Shell, cmd};

/// The cargo that runs xtask (`$CARGO`), so rustup's choice of toolchain
/// holds for every cargo command xtask runs.
pub(crate) fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Runs `cmd` (xshell echoes it), its output inherited; true on success,
/// and what went wrong said otherwise.
pub(crate) fn run(cmd: Cmd<'_>) -> bool {
    match cmd.run() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("xtask: {e}");
            false
        }
    }
}

/// `PYTHON -m pip VERB --quiet --disable-pip-version-check`: how every pip
/// call starts.
pub(crate) fn pip<'a>(sh: &'a Shell, python: impl AsRef<Path>, verb: &str) -> Cmd<'a> {
    let python = python.as_ref();
    cmd!(
        sh,
        "{python} -m pip {verb} --quiet --disable-pip-version-check"
    )
}

/// Runs `cmd` showing only the command line; its output is shown if it fails.
pub(crate) fn run_quiet(cmd: Cmd<'_>) -> Result<(), String> {
    let line = cmd.to_string();
    eprintln!("$ {line}");
    let out = cmd.ignore_status().output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{line} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether `cmd` runs and succeeds, its output discarded and not echoed
/// (probes: is a tool there?).
pub(crate) fn succeeds(cmd: Cmd<'_>) -> bool {
    cmd.quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

/// Makes sure a rustup component's cargo subcommand exists, installing it if it can.
pub(crate) fn ensure_component(
    sh: &Shell,
    subcommand: &str,
    component: &str,
) -> Result<(), String> {
    let cargo = cargo();
    if succeeds(cmd!(sh, "{cargo} {subcommand} --version")) {
        return Ok(());
    }
    eprintln!(
        "xtask: `cargo {subcommand}` is missing; installing it with `rustup component add {component}`"
    );
    if run(cmd!(sh, "rustup component add {component}")) {
        Ok(())
    } else {
        Err(format!(
            "`cargo {subcommand}` is missing; run: rustup component add {component}"
        ))
    }
}
