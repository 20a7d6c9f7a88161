//! Project automation, run as `cargo xtask <command>`:
//!
//! - `test`: formatting, clippy, every test and doc test, the loom model, the
//!   core and loopback suites under AddressSanitizer, fuzzing, rustdoc and the
//!   demo, with a one-screen summary at the end.
//! - `demo [--backend NAME] [demo options]`: the main job, in a release build.
//! - `nixl-runtime`: fetch and unpack the NIXL runtime (idempotent).
//! - `fuzz [--seconds N]`: coverage-guided fuzzing of the untrusted-input parsers.
//! - `gpu-bundle`: GPU checks and their NIXL runtime files in one folder.
//! - `bench [--quick] [--python]`: the interleaved benchmark (release build),
//!   then the criterion micro-benchmarks of the hot paths, then (or, with
//!   `--python`, only) the Python package against Dynamo's module.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod bundle;
mod fuzz;
mod hosts;
mod nixl;
mod python;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// The crates meant for crates.io; the rest of the workspace is `publish = false`.
const PUBLISHED: &[&str] = &[
    "descriptor-core",
    "backend-loopback",
    "backend-nixl",
    "device-cuda",
    "device-rocm",
];

/// Backends the demo knows, with the demo crate's feature that builds each.
const BACKENDS: &[(&str, &str)] = &[("loopback", "loopback"), ("nixl", "nixl")];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&root, &args[1..]),
        Some("demo") => demo(&root, &args[1..]),
        Some("bench") => bench(&root, &args[1..]),
        Some("gpu-bundle") => bundle::gpu_bundle(&root),
        Some("fuzz") => fuzz::fuzz(&root, &args[1..]),
        Some("nixl-runtime") => match nixl::ensure_runtime(&root) {
            Ok(runtime) => {
                println!("{}", runtime.root.display());
                Ok(())
            }
            Err(e) => {
                eprintln!("xtask nixl-runtime: {e}");
                Err(1)
            }
        },
        _ => {
            eprintln!(
                "usage: cargo xtask <command>\n\n\
                 commands:\n  \
                 test [--long]         fmt check, clippy -D warnings, all tests and doc tests, loom, ASan, fuzz, rustdoc -D warnings, demos\n  \
                 bench [--quick] [--python | --two-hosts]  memcpy / loopback / nixl / raw nixl-sys, in and across processes (--python: nixl_connect vs Dynamo; --two-hosts: across two network namespaces over TCP); writes target/bench/\n  \
                 fuzz [--seconds N]    libFuzzer on the metadata, agent-blob and device parsers (default 60 s each)\n  \
                 gpu-bundle            release GPU checks + the NIXL runtime they need in target/gpu-bundle (run.sh)\n  \
                 nixl-runtime          fetch the NIXL runtime ({}) into target/nixl-runtime (idempotent)\n  \
                 demo [--backend NAME] [--blocks N] [--block-size BYTES] [--iterations N]\n                        \
                 move KV-cache-like blocks both ways and report bandwidth (backends: {})",
                nixl::WHEEL,
                BACKENDS
                    .iter()
                    .map(|(b, _)| *b)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Err(2)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => ExitCode::from(code),
    }
}

fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
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
}

fn test(root: &Path, args: &[String]) -> Result<(), u8> {
    let long = match args {
        [] => false,
        [l] if l == "--long" => true,
        _ => {
            eprintln!(
                "usage: cargo xtask test [--long]   (--long: 16 x 10,000 loopback operations, 1 GiB kill tests)"
            );
            return Err(2);
        }
    };
    for (sub, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
        if let Err(e) = ensure_component(sub, component) {
            eprintln!("xtask test: {e}");
            return Err(1);
        }
    }
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
    let mut steps = Vec::new();
    let mut step = |name: &'static str, cmd: Command| {
        let started = Instant::now();
        eprintln!("\n== {name} ==");
        let ok = run(root, cmd);
        steps.push(Step {
            name,
            ok,
            took: started.elapsed(),
        });
    };

    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    step("rustfmt --check", fmt);

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
    step("clippy -D warnings", clippy);

    let mut tests = cargo();
    tests
        .args(["test", "--workspace", "--all-features"])
        .envs(nixl_env.clone());
    if long {
        tests.env("RELIABILITY_LONG", "1");
    }
    step("tests + doc tests", tests);

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
    step("loom model of operations", loom);

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
            step("ASan: core, loopback tests", asan);
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
    step("fuzz, 10 s per parser", fuzz);

    let mut doc = cargo();
    doc.args(["doc", "--workspace", "--no-deps", "--all-features"])
        .env("RUSTDOCFLAGS", "-D warnings");
    step("rustdoc -D warnings", doc);

    // The crates a downstream project depends on package and build from their
    // packaged sources, as from crates.io (workspace path dependencies resolve
    // to each other's packages).
    let mut package = cargo();
    package.args(["package", "--allow-dirty"]);
    for krate in PUBLISHED {
        package.args(["-p", krate]);
    }
    step("cargo package (published crates)", package);

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
        step(label, demo);
    }

    let mut gpu = cargo();
    gpu.args(["run", "--quiet", "-p", "gpu-check"])
        .envs(nixl_env.clone());
    step("gpu-check (skips without GPU)", gpu);

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
        step(
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
    let started = Instant::now();
    eprintln!("\n== python package: pip install + pytest ==");
    let ok = python::test(root);
    steps.push(Step {
        name: "python: pip install, pytest",
        ok,
        took: started.elapsed(),
    });

    println!("\n== cargo xtask test: summary ==");
    for s in &steps {
        println!(
            "  {:<30} {:<4} {:>7.1} s",
            s.name,
            if s.ok { "ok" } else { "FAIL" },
            s.took.as_secs_f64()
        );
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

fn demo(root: &Path, args: &[String]) -> Result<(), u8> {
    let mut backend = "loopback".to_owned();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--backend" {
            match it.next() {
                Some(b) => backend = b.clone(),
                None => {
                    eprintln!("xtask demo: --backend needs a value");
                    return Err(2);
                }
            }
        } else {
            rest.push(arg.clone());
        }
    }
    let Some((_, feature)) = BACKENDS.iter().find(|(name, _)| *name == backend) else {
        eprintln!(
            "xtask demo: unknown backend {backend:?}; available: {}",
            BACKENDS
                .iter()
                .map(|(b, _)| *b)
                .collect::<Vec<_>>()
                .join(", ")
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
        &backend,
    ]);
    cmd.args(&rest);
    if backend == "nixl" {
        cmd.env("NIXL_RUNTIME_DIR", nixl::provision(root, "demo")?.root);
    }
    if run(root, cmd) { Ok(()) } else { Err(1) }
}

fn bench(root: &Path, args: &[String]) -> Result<(), u8> {
    let (mut quick, mut python_only, mut two_hosts) = (false, false, false);
    for arg in args {
        match arg.as_str() {
            "--quick" => quick = true,
            "--python" => python_only = true,
            "--two-hosts" => two_hosts = true,
            _ => {
                eprintln!("usage: cargo xtask bench [--quick] [--python | --two-hosts]");
                return Err(2);
            }
        }
    }
    if python_only {
        return python::bench(root, quick);
    }
    if two_hosts {
        let runtime = nixl::provision(root, "bench")?;
        return hosts::bench(root, &runtime.root, quick);
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
        "descriptor-core",
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
        python::bench(root, quick)?;
    }
    Ok(())
}
