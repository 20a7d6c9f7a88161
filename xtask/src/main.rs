//! Project automation, run as `cargo xtask <command>` (`cargo xtask --help`):
//!
//! - `test [--long]`: formatting, clippy, every feature combination, every
//!   test and doc test, the loom model, the core and loopback suites under
//!   AddressSanitizer, fuzzing, rustdoc and the demo, with a one-screen
//!   summary at the end.
//! - `demo [--backend NAME] [demo options]`: the main job, in a release build.
//! - `nixl-runtime`: fetch and unpack the NIXL runtime (idempotent).
//! - `fuzz [--seconds N]`: coverage-guided fuzzing of the untrusted-input parsers.
//! - `gpu-bundle`: GPU checks and their NIXL runtime files in one folder.
//! - `bench [--quick] [--python | --two-hosts]`: the interleaved benchmark
//!   (release build), then the criterion micro-benchmarks of the hot paths,
//!   then (or, with `--python`, only) the Python package against Dynamo's module.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod bundle;
mod features;
mod flags;
mod fuzz;
mod hosts;
mod nixl;
mod python;
mod wheel;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use cargo_metadata::{MetadataCommand, Package};

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
    let command = match flags::Xtask::from_env() {
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
    let result = match command {
        flags::XtaskCmd::Test(args) if args.quick => quick(&ws),
        flags::XtaskCmd::Test(args) => test(&ws, args.long, &args.step),
        flags::XtaskCmd::Demo(args) => demo(root, &args),
        flags::XtaskCmd::Bench(args) => match args.validate() {
            Ok(()) => bench(&ws, &args),
            Err(e) => return usage_error(&e),
        },
        flags::XtaskCmd::GpuBundle(_) => bundle::gpu_bundle(root),
        flags::XtaskCmd::Wheel(_) => python::wheel(root),
        flags::XtaskCmd::Fuzz(args) => fuzz::run_targets(root, args.seconds.unwrap_or(60)),
        flags::XtaskCmd::NixlRuntime(_) => match nixl::ensure_runtime(root) {
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

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs a command in the workspace root, inheriting output; true on success.
pub(crate) fn run(root: &Path, mut cmd: Command) -> bool {
    cmd.current_dir(root);
    eprintln!("$ {}", describe(&cmd));
    match cmd.status() {
        Ok(status) => status.success(),
        Err(e) => {
            eprintln!("xtask: cannot run {}: {e}", describe(&cmd));
            false
        }
    }
}

/// `PYTHON -m pip VERB --quiet --disable-pip-version-check`: how every pip
/// call starts.
pub(crate) fn pip(python: impl AsRef<std::ffi::OsStr>, verb: &str) -> Command {
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pip", verb, "--quiet", "--disable-pip-version-check"]);
    cmd
}

/// Runs `cmd` showing only the command line; its output is shown if it fails.
pub(crate) fn run_quiet(cmd: &mut Command) -> Result<(), String> {
    eprintln!("$ {}", describe(cmd));
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", describe(cmd)))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} failed ({}):\n{}{}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

pub(crate) fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    let envs: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_string_lossy(), v?.to_string_lossy())))
        .collect();
    if envs.is_empty() {
        parts.join(" ")
    } else {
        format!("{} {}", envs.join(" "), parts.join(" "))
    }
}

/// Makes sure a rustup component's cargo subcommand exists, installing it if it can.
fn ensure_component(subcommand: &str, component: &str) -> Result<(), String> {
    let present = cargo()
        .args([subcommand, "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        return Ok(());
    }
    eprintln!(
        "xtask: `cargo {subcommand}` is missing; installing it with `rustup component add {component}`"
    );
    let installed = Command::new("rustup")
        .args(["component", "add", component])
        .status()
        .is_ok_and(|s| s.success());
    if installed {
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
    root: &'a Path,
    /// Run only the steps whose name starts with one of these (all if none).
    chosen: &'a [String],
    done: Vec<Step>,
}

impl Steps<'_> {
    fn time(&mut self, name: &'static str, step: impl FnOnce(&Path) -> bool) {
        self.timed(name, |root| (step(root), Vec::new()));
    }

    fn timed(&mut self, name: &'static str, step: impl FnOnce(&Path) -> (bool, Vec<String>)) {
        if !self.chosen.is_empty() && !self.chosen.iter().any(|c| name.starts_with(c.as_str())) {
            return;
        }
        let started = Instant::now();
        eprintln!("\n== {name} ==");
        let (ok, digest) = step(self.root);
        self.done.push(Step {
            name,
            ok,
            took: started.elapsed(),
            digest: if ok { Vec::new() } else { digest },
        });
    }

    /// Runs `cmd` as a step, its output shown as it comes and digested for
    /// the summary.
    fn run(&mut self, name: &'static str, cmd: Command) {
        self.timed(name, |root| run_digested(root, cmd));
    }

    /// `cargo fmt --check` and `clippy -D warnings` (both steps of every run);
    /// Err if rustfmt or clippy is missing and cannot be installed.
    fn lint(&mut self) -> Result<(), u8> {
        for (sub, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
            if let Err(e) = ensure_component(sub, component) {
                eprintln!("xtask test: {e}");
                return Err(1);
            }
        }
        let mut fmt = cargo();
        fmt.args(["fmt", "--all", "--", "--check"]);
        self.run("rustfmt --check", fmt);
        let mut clippy = cargo();
        clippy.args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]);
        self.run("clippy -D warnings", clippy);
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

/// [`run`], echoing the command's output while keeping its telling lines and
/// its last lines for [`Step::digest`].
fn run_digested(root: &Path, mut cmd: Command) -> (bool, Vec<String>) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::sync::Mutex;
    const TAIL: usize = 30;
    const TELLING: usize = 40;

    cmd.current_dir(root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    eprintln!("$ {}", describe(&cmd));
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let line = format!("xtask: cannot run {}: {e}", describe(&cmd));
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
fn quick(ws: &Workspace) -> Result<(), u8> {
    let root = ws.root.as_path();
    let mut steps = Steps {
        root,
        chosen: &[],
        done: Vec::new(),
    };
    steps.lint()?;
    let mut unit = cargo();
    unit.args(["test", "--workspace", "--all-features", "--lib"]);
    steps.run("unit tests", unit);
    let mut loopback = cargo();
    loopback.args([
        "test",
        "-p",
        "backend-loopback",
        "--all-features",
        "--tests",
    ]);
    steps.run("loopback conformance and tests", loopback);
    steps.time("python: wheel, pytest on loopback (3.11)", python::quick);
    summary(steps.done)
}

fn test(ws: &Workspace, long: bool, chosen: &[String]) -> Result<(), u8> {
    let root = ws.root.as_path();
    let runtime = nixl::provision(root, "test")?;
    let venv = nixl::ensure_test_venv(root).map_err(|e| {
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
    let mut steps = Steps {
        root,
        chosen,
        done: Vec::new(),
    };

    steps.lint()?;

    // Every member with no default features and with each feature alone
    // (crossbeam's check-features.sh, as a loop over cargo metadata).
    steps.time("features: none, each alone", |root| {
        features::check_each(root, &ws.members)
    });

    let mut tests = cargo();
    tests
        .args(["test", "--workspace", "--all-features"])
        .envs(nixl_env.clone());
    if long {
        tests.env("RELIABILITY_LONG", "1");
    }
    steps.run("tests + doc tests", tests);

    // The operation state machine, model-checked: loom explores every
    // interleaving (up to a preemption bound) of small models of it.
    let mut loom = cargo();
    loom.args([
        "test",
        "--release",
        "-p",
        "descriptor-core",
        "--lib",
        "loom",
    ])
    .env("RUSTFLAGS", "--cfg loom")
    .env("CARGO_TARGET_DIR", root.join("target/loom"));
    steps.run("loom model of operations", loom);

    // The suites of the memory-owning crates under AddressSanitizer, so that a
    // use-after-free fails here (stable rustc, unstable flag: see fuzz.rs).
    // Leak detection is off: leaking memory a peer may still touch is the
    // library's documented answer on its error paths.
    match host_target() {
        Some(target) => {
            let mut asan = cargo();
            asan.args([
                "test",
                "-p",
                "descriptor-core",
                "-p",
                "backend-loopback",
                "--all-features",
                "--lib",
                "--tests",
                "--target",
                &target,
            ])
            .env("RUSTFLAGS", "-Zsanitizer=address")
            .env("RUSTC_BOOTSTRAP", "1")
            .env("ASAN_OPTIONS", "detect_leaks=0")
            .env("CARGO_TARGET_DIR", root.join("target/asan"));
            steps.run("ASan: core, loopback tests", asan);
        }
        None => {
            eprintln!("xtask test: cannot tell the host target from `rustc -vV`");
            return Err(1);
        }
    }

    // A short coverage-guided fuzz pass over the parsers of untrusted input.
    let mut fuzz = cargo();
    fuzz.args([
        "run",
        "--quiet",
        "-p",
        "xtask",
        "--",
        "fuzz",
        "--seconds",
        "10",
    ]);
    steps.run("fuzz, 10 s per parser", fuzz);

    let mut doc = cargo();
    doc.args(["doc", "--workspace", "--no-deps", "--all-features"])
        .env("RUSTDOCFLAGS", "-D warnings");
    steps.run("rustdoc -D warnings", doc);

    // The crates a downstream project depends on package and build from their
    // packaged sources, as from crates.io (workspace path dependencies resolve
    // to each other's packages).
    forget_packaged_sources(ws);
    let mut package = cargo();
    package.args(["package", "--allow-dirty"]);
    for krate in ws.published() {
        package.args(["-p", &krate.name]);
    }
    steps.run("cargo package (published crates)", package);

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
        let mut demo = cargo();
        demo.args([
            "run",
            "--quiet",
            "-p",
            "kv-cache-demo",
            "--no-default-features",
            "--features",
            features,
        ])
        .args(["--", "--iterations", "1", "--blocks", "8"])
        .envs(nixl_env.clone());
        steps.run(label, demo);
    }

    let mut gpu = cargo();
    gpu.args(["run", "--quiet", "-p", "gpu-check"])
        .envs(nixl_env.clone());
    steps.run("gpu-check (skips without GPU)", gpu);

    for (backend, feature) in BACKENDS {
        let mut demo = cargo();
        demo.args([
            "run",
            "--release",
            "-p",
            "kv-cache-demo",
            "--features",
            feature,
            "--",
        ])
        .args(["--backend", backend, "--iterations", "3"])
        .envs(nixl_env.clone());
        steps.run(
            if *backend == "nixl" {
                "demo (nixl)"
            } else {
                "demo (loopback)"
            },
            demo,
        );
    }

    // The Python package `nixl_connect`: a virtualenv under target/ (made
    // once), the package installed with pip as a user installs it, then its
    // pytest suite (both backends, interop with the real Dynamo module).
    steps.time("python: wheel, pytest on 3.10-3.13", python::test);

    let steps = steps.done;
    if steps.is_empty() {
        eprintln!("xtask test: no step's name starts with {chosen:?}");
        return Err(2);
    }
    summary(steps)
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
fn host_target() -> Option<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(rustc).arg("-vV").output().ok()?;
    String::from_utf8(output.stdout)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
}

fn demo(root: &Path, args: &flags::Demo) -> Result<(), u8> {
    let backend = args.backend.as_deref().unwrap_or("loopback");
    let Some((_, feature)) = BACKENDS.iter().find(|(name, _)| *name == backend) else {
        eprintln!(
            "xtask demo: unknown backend {backend:?}; available: {}",
            backend_names()
        );
        return Err(2);
    };
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--quiet",
        "--release",
        "-p",
        "kv-cache-demo",
        "--features",
        feature,
        "--",
        "--backend",
        backend,
    ]);
    for (flag, value) in [
        ("--blocks", args.blocks),
        ("--block-size", args.block_size),
        ("--iterations", args.iterations),
    ] {
        if let Some(value) = value {
            cmd.arg(flag).arg(value.to_string());
        }
    }
    if backend == "nixl" {
        cmd.env("NIXL_RUNTIME_DIR", nixl::provision(root, "demo")?.root);
    }
    if run(root, cmd) { Ok(()) } else { Err(1) }
}

fn bench(ws: &Workspace, args: &flags::Bench) -> Result<(), u8> {
    let (root, quick) = (ws.root.as_path(), args.quick);
    if args.python {
        return python::bench(ws, quick);
    }
    if args.two_hosts {
        let runtime = nixl::provision(root, "bench")?;
        return hosts::bench(ws, &runtime.root, quick);
    }
    let runtime = nixl::provision(root, "bench")?;
    let out = root.join("target/bench");
    let mut cmd = cargo();
    cmd.args(["run", "--quiet", "--release", "-p", "bench", "--"])
        .arg("--out")
        .arg(&out)
        .env("NIXL_RUNTIME_DIR", &runtime.root);
    if quick {
        cmd.arg("--quick");
    }
    if !run(root, cmd) {
        return Err(1);
    }
    let mut micro = cargo();
    micro.args([
        "bench",
        "-p",
        "backend-loopback",
        "--bench",
        "hot_paths",
        "--",
    ]);
    if quick {
        micro.args(["--warm-up-time", "0.5", "--measurement-time", "1"]);
    }
    if !run(root, micro) {
        return Err(1);
    }
    // The Python rows (nixl_connect vs the real Dynamo module) when the
    // Python environment exists (`cargo xtask test` or `bench --python` made it).
    if python::venv_exists(root) {
        python::bench(ws, quick)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_keeps_its_telling_lines_and_its_end() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo '---- t stdout ----'; for i in $(seq 1 50); do echo line $i; done; \
             echo 'thread x panicked at a.rs:1' >&2; exit 3",
        ]);
        let (ok, digest) = run_digested(Path::new("."), cmd);
        assert!(!ok);
        assert_eq!(digest[0], "---- t stdout ----");
        assert_eq!(digest[1], "thread x panicked at a.rs:1");
        assert_eq!(digest[2], "...");
        assert_eq!(digest.len(), 3 + 30);
        assert!(digest[3..].contains(&"line 50".to_owned()), "{digest:?}");
        assert!(!digest[3..].contains(&"line 10".to_owned()), "{digest:?}");
    }
}
