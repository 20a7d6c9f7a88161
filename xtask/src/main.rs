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

mod bundle;
mod features;
mod flags;
mod fuzz;
mod hosts;
mod nixl;
mod perf;
mod python;
mod soak;
mod wheel;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cargo_metadata::{MetadataCommand, Package};
use xshell::{Cmd, Shell, cmd};

/// Backends the demo knows, with the demo crate's feature that builds each.
const BACKENDS: &[(&str, &str)] = &[("loopback", "loopback"), ("nixl", "nixl")];

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

/// `cargo package` verifies each crate against its siblings' packages through
/// a local registry, whose sources cargo extracts under
/// `$CARGO_HOME/registry/src/-<hash>/` and reuses by name and version: an
/// earlier run's packages of the same version would be built instead of
/// today's. Removes those extracted copies of the published crates.
fn forget_packaged_sources(ws: &Workspace) {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(sources) = home.map(|h| h.join("registry/src")) else {
        return;
    };
    let Ok(registries) = std::fs::read_dir(&sources) else {
        return;
    };
    for registry in registries.flatten() {
        // Local registries only: crates.io's folder is named after its host.
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        for krate in ws.published() {
            let stale = registry
                .path()
                .join(format!("{}-{}", krate.name, krate.version));
            if stale.exists()
                && let Err(e) = std::fs::remove_dir_all(&stale)
            {
                eprintln!("xtask: cannot remove {}: {e}", stale.display());
            }
        }
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
        flags::XtaskCmd::Test(args) if args.quick => quick(sh, root),
        flags::XtaskCmd::Test(args) => test(sh, &ws, args.long, &args.step),
        flags::XtaskCmd::Demo(args) => demo(sh, root, &args),
        flags::XtaskCmd::Bench(args) => match args.validate() {
            Ok(()) => bench(sh, &ws, &args),
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
        backend_names(),
        nixl::requirement()
    )
}

fn backend_names() -> String {
    BACKENDS
        .iter()
        .map(|(b, _)| *b)
        .collect::<Vec<_>>()
        .join(", ")
}

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
fn ensure_component(sh: &Shell, subcommand: &str, component: &str) -> Result<(), String> {
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

struct Step {
    name: &'static str,
    ok: bool,
    took: Duration,
    /// For a failed step run through [`Steps::run`], what the summary repeats
    /// of its output (CI often keeps only the end of a long log).
    digest: Vec<String>,
}

/// The steps of `cargo xtask test`, each timed; all run, failed or not.
struct Steps<'a> {
    sh: &'a Shell,
    /// Run only the steps whose name starts with one of these (all if none).
    chosen: &'a [String],
    done: Vec<Step>,
}

impl<'a> Steps<'a> {
    fn new(sh: &'a Shell, chosen: &'a [String]) -> Steps<'a> {
        Steps {
            sh,
            chosen,
            done: Vec::new(),
        }
    }

    fn time(&mut self, name: &'static str, step: impl FnOnce(&Shell) -> bool) {
        self.timed(name, |sh| (step(sh), Vec::new()));
    }

    fn timed(&mut self, name: &'static str, step: impl FnOnce(&Shell) -> (bool, Vec<String>)) {
        if !self.chosen.is_empty() && !self.chosen.iter().any(|c| name.starts_with(c.as_str())) {
            return;
        }
        let started = Instant::now();
        eprintln!("\n== {name} ==");
        let (ok, digest) = step(self.sh);
        self.done.push(Step {
            name,
            ok,
            took: started.elapsed(),
            digest: if ok { Vec::new() } else { digest },
        });
    }

    /// Runs `cmd` as a step, its output shown as it comes and digested for
    /// the summary.
    fn run(&mut self, name: &'static str, cmd: Cmd<'_>) {
        self.timed(name, |_| run_digested(cmd));
    }

    /// `cargo fmt --check` and `clippy -D warnings` (both steps of every run);
    /// Err if rustfmt or clippy is missing and cannot be installed.
    fn lint(&mut self) -> Result<(), u8> {
        let sh = self.sh;
        for (sub, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
            if let Err(e) = ensure_component(sh, sub, component) {
                eprintln!("xtask test: {e}");
                return Err(1);
            }
        }
        let cargo = cargo();
        self.run("rustfmt --check", cmd!(sh, "{cargo} fmt --all -- --check"));
        self.run(
            "clippy -D warnings",
            cmd!(
                sh,
                "{cargo} clippy --workspace --all-targets --all-features -- -D warnings"
            ),
        );
        Ok(())
    }
}

/// Lines of a failed step's output worth repeating in the summary: which tests
/// failed and why, wherever they appear.
fn is_telling(line: &str) -> bool {
    line.starts_with("---- ")
        || line.starts_with("error")
        || line.contains("panicked at")
        || line.contains("AddressSanitizer")
        || line.contains("test result: FAILED")
}

/// Runs `cmd` like [`run`], echoing its output as it comes while keeping its
/// telling lines and its last lines for [`Step::digest`].
///
/// xshell's `output()` would hand the lines back only once a step of many
/// minutes ended; so the command, built with xshell, is spawned here with
/// its two streams piped and read line by line.
fn run_digested(cmd: Cmd<'_>) -> (bool, Vec<String>) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::Mutex;
    const TAIL: usize = 30;
    const TELLING: usize = 40;

    let line = cmd.to_string();
    eprintln!("$ {line}");
    let mut child = match Command::from(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            let line = format!("xtask: cannot run {line}: {e}");
            eprintln!("{line}");
            return (false, vec![line]);
        }
    };
    let kept = Mutex::new((Vec::new(), std::collections::VecDeque::new()));
    let keep = |line: String| {
        let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
        let (telling, tail) = &mut *kept;
        if is_telling(&line) && telling.len() < TELLING {
            telling.push(line.clone());
        }
        if tail.len() == TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    };
    let (out, err) = (child.stdout.take(), child.stderr.take());
    std::thread::scope(|s| {
        if let Some(out) = out {
            s.spawn(|| {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    println!("{line}");
                    keep(line);
                }
            });
        }
        if let Some(err) = err {
            s.spawn(|| {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    eprintln!("{line}");
                    keep(line);
                }
            });
        }
    });
    let ok = child.wait().is_ok_and(|status| status.success());
    let (telling, tail) = kept.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut digest = telling;
    if !digest.is_empty() {
        digest.push("...".to_owned());
    }
    digest.extend(tail);
    (ok, digest)
}

/// `cargo xtask test --quick`: what a change is checked with before the full
/// run, a few minutes warm. No NIXL runtime is needed.
fn quick(sh: &Shell, root: &Path) -> Result<(), u8> {
    let mut steps = Steps::new(sh, &[]);
    steps.lint()?;
    let cargo = cargo();
    steps.run(
        "unit tests",
        cmd!(sh, "{cargo} test --workspace --all-features --lib"),
    );
    steps.run(
        "loopback conformance and tests",
        cmd!(
            sh,
            "{cargo} test -p backend-loopback --all-features --tests"
        ),
    );
    steps.time("python: wheel, pytest on loopback (3.11)", |sh| {
        python::quick(sh, root)
    });
    summary(steps.done)
}

fn test(sh: &Shell, ws: &Workspace, long: bool, chosen: &[String]) -> Result<(), u8> {
    let root = ws.root.as_path();
    let runtime = nixl::provision(sh, root, "test")?;
    let venv = nixl::ensure_test_venv(sh, root).map_err(|e| {
        eprintln!("xtask test: {e}");
        1
    })?;
    // NIXL tests run for real: with this set, a missing runtime fails them
    // instead of skipping them.
    let nixl_env = [
        ("NIXL_RUNTIME_DIR", runtime.root.display().to_string()),
        ("NIXL_PYTHONPATH", runtime.pythonpath.clone()),
        ("NIXL_TEST_VENV", venv.display().to_string()),
        ("NIXL_TESTS_REQUIRED", "1".to_owned()),
    ];
    let cargo = cargo();
    let mut steps = Steps::new(sh, chosen);

    steps.lint()?;

    // Every member with no default features and with each feature alone
    // (crossbeam's check-features.sh, as a loop over cargo metadata).
    steps.time("features: none, each alone", |sh| {
        features::check_each(sh, &ws.members)
    });

    let mut tests = cmd!(sh, "{cargo} test --workspace --all-features").envs(nixl_env.clone());
    if long {
        tests = tests.env("RELIABILITY_LONG", "1");
    }
    steps.run("tests + doc tests", tests);

    // The operation state machine and registered regions, model-checked:
    // loom explores every interleaving (up to a preemption bound) of small
    // models of them.
    steps.run(
        "loom models: operations, regions",
        cmd!(sh, "{cargo} test --release -p descriptor-core --lib loom")
            .env("RUSTFLAGS", "--cfg loom")
            .env("CARGO_TARGET_DIR", root.join("target/loom")),
    );

    // The suites of the memory-owning crates under AddressSanitizer, so that a
    // use-after-free fails here (stable rustc, unstable flag: see fuzz.rs).
    // Leak detection is off: leaking memory a peer may still touch is the
    // library's documented answer on its error paths.
    let Some(target) = host_target(sh) else {
        eprintln!("xtask test: cannot tell the host target from `rustc -vV`");
        return Err(1);
    };
    steps.run(
        "ASan: core, loopback tests",
        cmd!(
            sh,
            "{cargo} test -p descriptor-core -p backend-loopback --all-features --lib --tests --target {target}"
        )
        .env("RUSTFLAGS", "-Zsanitizer=address")
        .env("RUSTC_BOOTSTRAP", "1")
        .env("ASAN_OPTIONS", "detect_leaks=0")
        .env("CARGO_TARGET_DIR", root.join("target/asan")),
    );

    // A short coverage-guided fuzz pass over the parsers of untrusted input.
    steps.run(
        "fuzz, 10 s per parser",
        cmd!(sh, "{cargo} run --quiet -p xtask -- fuzz --seconds 10"),
    );

    steps.run(
        "rustdoc -D warnings",
        cmd!(sh, "{cargo} doc --workspace --no-deps --all-features")
            .env("RUSTDOCFLAGS", "-D warnings"),
    );

    // The crates a downstream project depends on package and build from their
    // packaged sources, as from crates.io (workspace path dependencies resolve
    // to each other's packages).
    forget_packaged_sources(ws);
    let published: Vec<String> = ws
        .published()
        .flat_map(|krate| ["-p".to_owned(), krate.name.to_string()])
        .collect();
    steps.run(
        "cargo package (published crates)",
        cmd!(sh, "{cargo} package --allow-dirty {published...}"),
    );

    // The demo crate is a downstream crate that picks backends and device
    // probes with features of its own: build and run it with none, each alone,
    // and all together.
    for (label, features) in [
        ("demo crate, no features", ""),
        ("demo crate, loopback", "loopback"),
        ("demo crate, nixl", "nixl"),
        ("demo crate, cuda", "cuda"),
        ("demo crate, rocm", "rocm"),
        ("demo crate, all features", "loopback,nixl,cuda,rocm"),
    ] {
        steps.run(
            label,
            cmd!(
                sh,
                "{cargo} run --quiet -p kv-cache-demo --no-default-features --features {features} -- --iterations 1 --blocks 8"
            )
            .envs(nixl_env.clone()),
        );
    }

    steps.run(
        "gpu-check (skips without GPU)",
        cmd!(sh, "{cargo} run --quiet -p gpu-check").envs(nixl_env.clone()),
    );

    for (backend, feature) in BACKENDS {
        steps.run(
            if *backend == "nixl" {
                "demo (nixl)"
            } else {
                "demo (loopback)"
            },
            cmd!(
                sh,
                "{cargo} run --release -p kv-cache-demo --features {feature} -- --backend {backend} --iterations 3"
            )
            .envs(nixl_env.clone()),
        );
    }

    // examples/two-process: two OS processes, the metadata through a file.
    steps.time("two-process example (nixl)", |sh| {
        two_process(sh, ws, &nixl_env)
    });

    // The Python package `nixl_connect`: a virtualenv under target/ (made
    // once), the package installed with pip as a user installs it, then its
    // pytest suite (both backends, interop with the real Dynamo module).
    steps.time("python: wheel, pytest on 3.10-3.13", |sh| {
        python::test(sh, root, long)
    });

    // The soak of issue 48 (an hour): only in the long suite.
    if long {
        steps.time("soak: 60 minutes, nixl_connect on NIXL", |sh| {
            soak::long(sh, root)
        });
    }

    let steps = steps.done;
    if steps.is_empty() {
        eprintln!("xtask test: no step's name starts with {chosen:?}");
        return Err(2);
    }
    summary(steps)
}

/// examples/two-process as a user runs it, in two terminals: `prefill`
/// started first in the background, then `decode`; both must succeed.
fn two_process(sh: &Shell, ws: &Workspace, env: &[(&str, String)]) -> bool {
    let cargo = cargo();
    if !run(cmd!(sh, "{cargo} build --quiet -p two-process")) {
        return false;
    }
    let exe = ws.target.join("debug/two-process");
    let dir = ws.target.join("two-process");
    // A fresh folder: a metadata file of an earlier run must not be read.
    if sh.remove_path(&dir).is_err() || sh.create_dir(&dir).is_err() {
        eprintln!("xtask: cannot make a fresh {}", dir.display());
        return false;
    }
    let prefill = cmd!(sh, "{exe} prefill {dir}").envs(env.iter().cloned());
    eprintln!("$ {prefill} &");
    // xshell runs a command to its end; the prefill side must run alongside.
    let mut prefill = match std::process::Command::from(prefill).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("xtask: cannot start {}: {e}", exe.display());
            return false;
        }
    };
    let decoded = run(cmd!(sh, "{exe} decode {dir}").envs(env.iter().cloned()));
    if !decoded {
        // It would wait for a decode that is gone until its own deadline.
        let _ = prefill.kill();
    }
    let prefilled = prefill.wait().is_ok_and(|status| status.success());
    decoded && prefilled
}

/// Prints each step's outcome and time, and what failed steps said.
fn summary(steps: Vec<Step>) -> Result<(), u8> {
    println!("\n== cargo xtask test: summary ==");
    for s in &steps {
        println!(
            "  {:<30} {:<4} {:>7.1} s",
            s.name,
            if s.ok { "ok" } else { "FAIL" },
            s.took.as_secs_f64()
        );
    }
    for s in steps.iter().filter(|s| !s.digest.is_empty()) {
        println!("\n  {} failed; from its output:", s.name);
        for line in &s.digest {
            println!("    | {line}");
        }
    }
    let failed = steps.iter().filter(|s| !s.ok).count();
    if failed == 0 {
        println!("  all {} steps passed", steps.len());
        Ok(())
    } else {
        println!("  {failed} of {} steps failed", steps.len());
        Err(1)
    }
}

/// The host's target triple (`--target` keeps sanitizer flags off build
/// scripts and proc macros).
fn host_target(sh: &Shell) -> Option<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let version = cmd!(sh, "{rustc} -vV").quiet().read().ok()?;
    version
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
}

fn demo(sh: &Shell, root: &Path, args: &flags::Demo) -> Result<(), u8> {
    let backend = args.backend.as_deref().unwrap_or("loopback");
    let Some((_, feature)) = BACKENDS.iter().find(|(name, _)| *name == backend) else {
        eprintln!(
            "xtask demo: unknown backend {backend:?}; available: {}",
            backend_names()
        );
        return Err(2);
    };
    let cargo = cargo();
    let mut options = Vec::new();
    for (flag, value) in [
        ("--blocks", args.blocks),
        ("--block-size", args.block_size),
        ("--iterations", args.iterations),
    ] {
        if let Some(value) = value {
            options.extend([flag.to_owned(), value.to_string()]);
        }
    }
    let mut cmd = cmd!(
        sh,
        "{cargo} run --quiet --release -p kv-cache-demo --features {feature} -- --backend {backend} {options...}"
    );
    if backend == "nixl" {
        cmd = cmd.env("NIXL_RUNTIME_DIR", nixl::provision(sh, root, "demo")?.root);
    }
    if run(cmd) { Ok(()) } else { Err(1) }
}

fn bench(sh: &Shell, ws: &Workspace, args: &flags::Bench) -> Result<(), u8> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_keeps_its_telling_lines_and_its_end() {
        let sh = Shell::new().unwrap();
        let script = "echo '---- t stdout ----'; for i in $(seq 1 50); do echo line $i; done; \
                      echo 'thread x panicked at a.rs:1' >&2; exit 3";
        let (ok, digest) = run_digested(cmd!(sh, "sh -c {script}"));
        assert!(!ok);
        assert_eq!(digest[0], "---- t stdout ----");
        assert_eq!(digest[1], "thread x panicked at a.rs:1");
        assert_eq!(digest[2], "...");
        assert_eq!(digest.len(), 3 + 30);
        assert!(digest[3..].contains(&"line 50".to_owned()), "{digest:?}");
        assert!(!digest[3..].contains(&"line 10".to_owned()), "{digest:?}");
    }

    #[test]
    fn a_step_that_succeeds_keeps_no_digest_and_one_that_cannot_start_says_why() {
        let sh = Shell::new().unwrap();
        let mut steps = Steps::new(&sh, &[]);
        steps.run("passes", cmd!(sh, "true"));
        steps.run(
            "cannot start",
            cmd!(sh, "/nonexistent/xtask-no-such-program"),
        );
        assert_eq!(steps.done.len(), 2);
        assert!(steps.done[0].ok && steps.done[0].digest.is_empty());
        assert!(!steps.done[1].ok);
        assert!(
            steps.done[1].digest[0].starts_with("xtask: cannot run /nonexistent/"),
            "{:?}",
            steps.done[1].digest
        );
    }

    #[test]
    fn chosen_steps_run_by_prefix_and_the_others_not_at_all() {
        let sh = Shell::new().unwrap();
        let chosen = ["two".to_owned()];
        let mut steps = Steps::new(&sh, &chosen);
        steps.time("two-process example (nixl)", |_| true);
        steps.time("tests + doc tests", |_| panic!("not chosen, must not run"));
        let names: Vec<&str> = steps.done.iter().map(|s| s.name).collect();
        assert_eq!(names, ["two-process example (nixl)"]);
    }
}
