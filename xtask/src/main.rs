//! Project automation, run as `cargo xtask <command>` (`cargo xtask --help`):
//!
//! - `test [--long] [STEP...]`: formatting, clippy, every feature
//!   combination, every test and doc test, the loom model, the core and
//!   loopback suites under AddressSanitizer, fuzzing, rustdoc, the demo and
//!   the two-process example, with a one-screen summary at the end; only the
//!   steps whose names start with a STEP given. `test --quick`: the
//!   development loop (fmt, clippy, unit tests, loopback, Python on loopback).
//! - `demo [--backend NAME] [demo options]`: the main job, in a release build.
//! - `nixl-runtime`: fetch and unpack the NIXL runtime (idempotent).
//! - `fuzz [--seconds N]`: coverage-guided fuzzing of the untrusted-input parsers.
//! - `soak [--minutes M] [--impl ours|dyn|both]`: the mixed workload of issue
//!   48 on NIXL, its report and verdicts (`soak.rs`); `test --long` runs it.
//! - `gpu-bundle`: GPU checks and their NIXL runtime files in one folder.
//! - `bench [--quick] [--python | --two-hosts]`: the interleaved benchmark
//!   (release build), then the criterion micro-benchmarks of the hot paths,
//!   then (or, with `--python`, only) the Python package against Dynamo's
//!   module; then docs/performance.md is rendered from the report (`perf.rs`).
//!   `bench --render-only [--report FILE]` only renders it.
//!
//! Commands are written with xshell's `cmd!`, run from the workspace root.
#![allow(clippy::print_stdout, clippy::print_stderr)]

//!
//! One module per command (`test.rs`, `demo.rs`, `bench.rs`, `soak.rs`, ...);
//! this file only parses the command line and dispatches; `shell.rs` holds
//! how commands are run.

mod bench;
mod bundle;
mod demo;
mod features;
mod flags;
mod fuzz;
mod hosts;
mod nixl;
mod perf;
mod python;
mod shell;
mod soak;
mod test;
mod wheel;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cargo_metadata::{MetadataCommand, Package};
use xshell::Shell;

/// What xtask needs to know about the workspace, from `cargo metadata`.
pub(crate) struct Workspace {
    pub(crate) root: PathBuf,
    /// Cargo's build folder (`CARGO_TARGET_DIR` or the configured one).
    pub(crate) target: PathBuf,
    /// The members, with their features and whether they are published.
    pub(crate) members: Vec<Package>,
}

impl Workspace {
    fn load() -> Result<Workspace, String> {
        let metadata = MetadataCommand::new()
            .manifest_path(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .no_deps()
            .exec()
            .map_err(|e| format!("cargo metadata: {e}"))?;
        Ok(Workspace {
            root: metadata.workspace_root.clone().into(),
            target: metadata.target_directory.clone().into(),
            members: metadata.workspace_packages().into_iter().cloned().collect(),
        })
    }

    /// The crates meant for crates.io (the others say `publish = false`).
    pub(crate) fn published(&self) -> impl Iterator<Item = &Package> {
        self.members
            .iter()
            .filter(|p| p.publish.as_ref().is_none_or(|r| !r.is_empty()))
    }
}

fn main() -> ExitCode {
    let command = match flags::Xtask::from_env_with_aliases() {
        Ok(flags) => flags.subcommand,
        Err(e) if e.is_help() => {
            println!("{}", help());
            return ExitCode::SUCCESS;
        }
        Err(e) => return usage_error(&e),
    };
    let ws = match Workspace::load() {
        Ok(ws) => ws,
        Err(e) => {
            eprintln!("xtask: {e}");
            return ExitCode::FAILURE;
        }
    };
    let root = ws.root.as_path();
    // Every command runs from the workspace root unless it says otherwise.
    let sh = match Shell::new() {
        Ok(sh) => sh,
        Err(e) => {
            eprintln!("xtask: {e}");
            return ExitCode::FAILURE;
        }
    };
    sh.change_dir(root);
    let sh = &sh;
    let result = match command {
        flags::XtaskCmd::Test(args) if args.quick => test::quick(sh, root),
        flags::XtaskCmd::Test(args) => test::test(
            sh,
            &ws,
            &test::Run {
                long: args.long,
                lean: args.lean,
                chosen: &args.step,
            },
        ),
        flags::XtaskCmd::Demo(args) => demo::demo(sh, root, &args),
        flags::XtaskCmd::Bench(args) => match args.validate() {
            Ok(()) => bench::bench(sh, &ws, &args),
            Err(e) => return usage_error(&e),
        },
        flags::XtaskCmd::GpuBundle(_) => bundle::gpu_bundle(sh, root),
        flags::XtaskCmd::Wheel(_) => python::wheel(sh, root),
        flags::XtaskCmd::Soak(args) => soak::soak(sh, root, &args),
        flags::XtaskCmd::Fuzz(args) => fuzz::run_targets(sh, root, args.seconds.unwrap_or(60)),
        flags::XtaskCmd::NixlRuntime(_) => match nixl::ensure_runtime(sh, root) {
            Ok(runtime) => {
                println!("{}", runtime.root.display());
                Ok(())
            }
            Err(e) => {
                eprintln!("xtask nixl-runtime: {e}");
                Err(1)
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => ExitCode::from(code),
    }
}

/// A bad command line: what is wrong, or the usage of every command when
/// none was given.
fn usage_error(e: &xflags::Error) -> ExitCode {
    if std::env::args_os().len() > 1 {
        eprintln!("xtask: {e} (`cargo xtask --help` lists the commands and their options)");
    } else {
        eprintln!("{}", help());
    }
    ExitCode::from(2)
}

/// xflags' help for every command, and what it cannot know.
fn help() -> String {
    let commands = flags::Xtask::from_vec(vec!["--help".into()])
        .err()
        .map(|help| help.to_string())
        .unwrap_or_default();
    format!(
        "{commands}\ndemo backends: {}; NIXL runtime: {}",
        demo::backend_names(),
        nixl::requirement()
    )
}
