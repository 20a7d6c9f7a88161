//! `cargo xtask test`: the steps of the full run (and of `--quick`), each
//! timed, with a one-screen summary that repeats what failed steps said.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xshell::{Cmd, Shell, cmd};

use crate::shell::{cargo, ensure_component, run};
use crate::{Workspace, demo, features, nixl, python, soak};

struct Step {
    name: &'static str,
    ok: bool,
    took: Duration,
    /// Bytes free on the disk of the build folder once the step ended.
    free_after: Option<u64>,
    /// For a failed step run through [`Steps::run`], what the summary repeats
    /// of its output (CI often keeps only the end of a long log).
    digest: Vec<String>,
}

/// The steps of `cargo xtask test`, each timed; all run, failed or not.
struct Steps<'a> {
    sh: &'a Shell,
    /// Where the disk's free space is read after each step.
    target: &'a Path,
    /// Run only the steps whose name starts with one of these (all if none).
    chosen: &'a [String],
    done: Vec<Step>,
}

impl<'a> Steps<'a> {
    fn new(sh: &'a Shell, target: &'a Path, chosen: &'a [String]) -> Steps<'a> {
        Steps {
            sh,
            target,
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
            free_after: free_space(self.sh, self.target),
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
pub(crate) fn quick(sh: &Shell, root: &Path) -> Result<(), u8> {
    let mut steps = Steps::new(sh, root, &[]);
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

/// How `cargo xtask test` runs: `--long`, `--lean` and the steps chosen.
pub(crate) struct Run<'a> {
    /// The long load runs too.
    pub(crate) long: bool,
    /// Each step's own build folder is removed once the step is done,
    /// nothing is built incrementally, and debug builds keep line tables
    /// only: for a run on a clean clone (CI), which has nothing to reuse,
    /// on a disk that may be small.
    pub(crate) lean: bool,
    /// Only the steps whose names start with one of these (all if none).
    pub(crate) chosen: &'a [String],
}

pub(crate) fn test(sh: &Shell, ws: &Workspace, how: &Run<'_>) -> Result<(), u8> {
    let Run { long, lean, chosen } = *how;
    let root = ws.root.as_path();
    if lean {
        // Incremental data is a third of a debug build folder, and of use
        // only to a later build of the same clone; full debug info is most
        // of the rest, where line tables are enough for a backtrace.
        sh.set_var("CARGO_INCREMENTAL", "0");
        sh.set_var("CARGO_PROFILE_DEV_DEBUG", "line-tables-only");
    }
    if let Some(free) = free_space(sh, &ws.target) {
        eprintln!(
            "xtask test: {} free on the disk of {}",
            gib(free),
            ws.target.display()
        );
    }
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
    let mut steps = Steps::new(sh, &ws.target, chosen);

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
    discard(lean, &root.join("target/loom"));

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
    discard(lean, &root.join("target/asan"));

    // A short coverage-guided fuzz pass over the parsers of untrusted input.
    steps.run(
        "fuzz, 10 s per parser",
        cmd!(sh, "{cargo} run --quiet -p xtask -- fuzz --seconds 10"),
    );
    discard(lean, &crate::fuzz::target_dir(root));

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
        ("demo crate, metrics", "metrics"),
        (
            "demo crate, all features",
            "loopback,nixl,cuda,rocm,metrics",
        ),
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

    for (backend, feature) in demo::BACKENDS {
        steps.run(
            if *backend == "nixl" {
                "demo (nixl)"
            } else {
                "demo (loopback)"
            },
            cmd!(
                sh,
                "{cargo} run --release -p kv-cache-demo --features {feature} -- --backend {backend} --iterations 3 --metrics-port 0"
            )
            .envs(nixl_env.clone()),
        );
        // The storage tier: LRU blocks offloaded to a file and read back,
        // every block's CRC checked.
        steps.run(
            if *backend == "nixl" {
                "demo --offload (nixl)"
            } else {
                "demo --offload (loopback)"
            },
            cmd!(
                sh,
                "{cargo} run --release -p kv-cache-demo --features {feature} -- --backend {backend} --offload"
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
        python::test(sh, root, long, lean)
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

/// Removes `dir`, a build folder no later step uses, when `lean`
/// (`--lean`).
pub(crate) fn discard(lean: bool, dir: &Path) {
    if !lean {
        return;
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => eprintln!("xtask test --lean: removed {}", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => eprintln!("xtask test --lean: cannot remove {}: {e}", dir.display()),
    }
}

/// Bytes free to us on the disk that holds `path` (`df`), if it tells.
fn free_space(sh: &Shell, path: &Path) -> Option<u64> {
    // The folder may not be made yet: its nearest ancestor that is.
    let path = path.ancestors().find(|p| p.exists())?;
    let out = cmd!(sh, "df -Pk {path}")
        .quiet()
        .ignore_stderr()
        .read()
        .ok()?;
    // `Filesystem 1024-blocks Used Available Capacity Mounted-on`.
    let available: u64 = out
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    available.checked_mul(1024)
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// Prints each step's outcome and time, and what failed steps said.
fn summary(steps: Vec<Step>) -> Result<(), u8> {
    println!("\n== cargo xtask test: summary ==");
    for s in &steps {
        println!(
            "  {:<30} {:<4} {:>7.1} s   {} free after",
            s.name,
            if s.ok { "ok" } else { "FAIL" },
            s.took.as_secs_f64(),
            s.free_after.map_or_else(|| "? GiB".to_owned(), gib),
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
        let mut steps = Steps::new(&sh, Path::new("."), &[]);
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
        let mut steps = Steps::new(&sh, Path::new("."), &chosen);
        steps.time("two-process example (nixl)", |_| true);
        steps.time("tests + doc tests", |_| panic!("not chosen, must not run"));
        let names: Vec<&str> = steps.done.iter().map(|s| s.name).collect();
        assert_eq!(names, ["two-process example (nixl)"]);
    }
}
