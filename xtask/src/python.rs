//! The Python package `nixl_connect` (crates/nixl-connect-py): its wheel, the
//! virtualenvs its tests run in, pytest on CPython 3.10-3.13, the type checks,
//! and the Python benchmark (`bench --python`).
//!
//! Everything is installed by these functions, once (a stamp file records
//! what each virtualenv holds; a change recreates it):
//! - `target/py-tools` (`python3`): maturin, ziglang and auditwheel, which
//!   build and check the wheel, and mypy (with prometheus_client, which the
//!   package imports where it is installed); `target/node-tools`: pyright;
//! - `target/wheels`: the wheel (`cargo xtask wheel`): abi3 for CPython 3.10+,
//!   linked by zig against glibc 2.28 (manylinux_2_28: RHEL 8, Ubuntu 20.04
//!   and later), checked with `auditwheel show`; it does not link NIXL;
//! - one test virtualenv per interpreter, `target/py-venv` (3.11, the one the
//!   benchmark uses) and `target/py3XX-venv`: the wheel pip-installed as a
//!   user installs it (its dependencies resolved by pip), pytest, NumPy and
//!   prometheus_client;
//!   for 3.11 and 3.12 also the NIXL runtime (`nixl-cu12`, without its torch
//!   dependency) and NIXL's `nixl` meta-package (Dynamo imports it). pip and
//!   pytest run there with only the virtualenv on `PATH`: no Rust, compiler
//!   or libclang;
//! - `target/py-dynamo`: the real `dynamo/nixl_connect/__init__.py` from
//!   `ai-dynamo-runtime` 1.6.1 (pure Python; the wheel's native part is not
//!   needed) and a stand-in `torch` with an empty `Tensor` class that
//!   Dynamo's module imports. Only the Dynamo peers of the interop tests and
//!   the benchmark put these on their `PYTHONPATH`.

use std::path::{Path, PathBuf};

use xshell::{Shell, cmd};

use crate::shell::{pip, run, run_quiet};
use crate::{nixl, wheel};

/// What every test virtualenv gets besides the package (pydantic pinned to
/// the versions tested; the package itself allows `>=2.10,<3`;
/// prometheus_client for `Metrics.register_prometheus`, an optional
/// dependency of the package).
const TEST_REQUIREMENTS: &[&str] = &[
    "pytest>=8",
    "pydantic>=2.10.6,<=2.13.5",
    "numpy==2.2.6",
    "prometheus_client==0.26.0",
];
/// The wheel's build and the type checks.
const TOOLS: &[&str] = &[
    "maturin>=1.9,<2",
    "ziglang==0.17.1",
    "auditwheel==6.8.2",
    "mypy==2.4.1",
    "pydantic>=2.10.6,<=2.13.5",
    "numpy==2.2.6",
    "prometheus_client==0.26.0",
];
/// pyright, from the npm registry (its PyPI wrapper downloads Node.js itself).
const PYRIGHT: &str = "pyright@1.1.414";
/// The platform tag the wheel must satisfy (glibc 2.28).
const MANYLINUX: &str = "manylinux_2_28";
const DYNAMO_VERSION: &str = "1.6.1";
/// The one file of the Dynamo wheel the tests use.
const DYNAMO_MODULE: &str = "dynamo/nixl_connect/__init__.py";
const PACKAGE_DIR: &str = "crates/nixl-connect-py";
/// Cargo's target folder for the wheel's build (kept apart from the
/// workspace's, which builds other features and profiles).
const BUILD_DIR: &str = "target/py";
const WHEELS: &str = "target/wheels";

/// The interpreters the suite runs on, and whether that virtualenv gets the
/// NIXL runtime (NIXL and Dynamo interop tests then run; elsewhere they skip).
const INTERPRETERS: &[(&str, bool)] = &[
    ("3.10", false),
    ("3.11", true),
    ("3.12", true),
    ("3.13", false),
];

/// A ready test virtualenv and the paths the tests need.
pub(crate) struct Venv {
    /// The virtualenv folder.
    pub(crate) root: PathBuf,
    /// Its interpreter.
    pub(crate) python: PathBuf,
    /// Whether the NIXL runtime is installed in it.
    nixl: bool,
    /// Holds `dynamo/nixl_connect/__init__.py`.
    pub(crate) dynamo_src: PathBuf,
    /// Holds the stand-in `torch` package.
    pub(crate) torch_stub: PathBuf,
}

/// NIXL's meta-package (`import nixl`, which Dynamo uses), at the runtime's version.
fn nixl_meta() -> String {
    format!("nixl=={}", nixl::NIXL_VERSION)
}

fn dynamo() -> String {
    format!("ai-dynamo-runtime=={DYNAMO_VERSION}")
}

/// The newest `~/.pyenv/versions/<minor>.N/bin/python3`, or `python3` if it
/// is that version.
fn interpreter(sh: &Shell, minor: &str) -> Option<PathBuf> {
    let versions = PathBuf::from(std::env::var_os("HOME")?).join(".pyenv/versions");
    let patch =
        |name: &str| -> Option<u32> { name.strip_prefix(minor)?.strip_prefix('.')?.parse().ok() };
    let newest = std::fs::read_dir(&versions).ok().and_then(|dir| {
        dir.filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter_map(|name| Some((patch(&name)?, name)))
            .max()
    });
    if let Some((_, name)) = newest {
        let python = versions.join(name).join("bin/python3");
        if python.is_file() {
            return Some(python);
        }
    }
    let probe = "import sys; print('%d.%d' % sys.version_info[:2])";
    let version = cmd!(sh, "python3 -c {probe}").quiet().read().ok()?;
    (version.trim() == minor).then(|| PathBuf::from("python3"))
}

/// A virtualenv at `dir` made by `python` and holding `packages`, made again
/// whenever the stamp (`python` and `what`) differs.
fn ensure(
    sh: &Shell,
    dir: &Path,
    python: &Path,
    what: &str,
    fill: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<PathBuf, String> {
    let stamp = dir.join(".complete");
    let wanted = format!("{}\n{what}\n", python.display());
    let venv_python = dir.join("bin/python");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(venv_python);
    }
    let _ = std::fs::remove_dir_all(dir);
    let venv = || run_quiet(cmd!(sh, "{python} -m venv {dir}"));
    if venv().is_err() {
        // Debian's own python3 makes virtualenvs only with python3-venv.
        crate::nixl::apt_install(sh, "python3-venv (virtualenvs)", &["python3-venv"])?;
        venv()?;
    }
    fill(&venv_python)?;
    std::fs::write(&stamp, wanted).map_err(|e| format!("write {}: {e}", stamp.display()))?;
    Ok(venv_python)
}

/// `target/py-tools`: what builds and checks the wheel, and mypy.
fn ensure_tools(sh: &Shell, root: &Path) -> Result<PathBuf, String> {
    let python = interpreter(sh, "3.11").unwrap_or_else(|| PathBuf::from("python3"));
    ensure(
        sh,
        &root.join("target/py-tools"),
        &python,
        &TOOLS.join("\n"),
        |py| run_quiet(pip(sh, py, "install").args(TOOLS)),
    )
}

/// Builds the wheel into `target/wheels` and checks its platform tag with
/// `auditwheel show`; returns its path. `cargo xtask wheel`.
pub(crate) fn build_wheel(sh: &Shell, root: &Path) -> Result<PathBuf, String> {
    let tools = ensure_tools(sh, root)?;
    let bin = tools.parent().map(Path::to_path_buf).unwrap_or_default();
    let out = root.join(WHEELS);
    let _ = std::fs::remove_dir_all(&out);
    let libstdcxx = libstdcxx(sh)?;
    let maturin = bin.join("maturin");
    // nixl-sys compiles its dlopen stubs with g++ (libstdc++) and asks for
    // `-lstdc++`, which zig's linker takes for its own libc++: name the
    // system's libstdc++ itself, so the module needs it (auditwheel checks
    // its symbol versions against the policy) instead of missing `std::cerr`
    // at import.
    let link = format!("link-arg={}", libstdcxx.display());
    let build = cmd!(
        sh,
        "{maturin} build --release --strip --zig --compatibility {MANYLINUX} -o {out} -- -C {link}"
    )
    .env("CARGO_TARGET_DIR", root.join(BUILD_DIR))
    .env("PATH", path_with(&bin));
    // From the package's folder: run from the workspace root, bindgen (in
    // nixl-sys's build script) under maturin's zig wrapper did not find
    // clang's own headers (`stdbool.h`).
    let built = {
        let _package = sh.push_dir(root.join(PACKAGE_DIR));
        run(build)
    };
    if !built {
        return Err("maturin build failed".into());
    }
    let wheel = wheel::find(&out, "nixl_connect-")?;
    let auditwheel = bin.join("auditwheel");
    let show = cmd!(sh, "{auditwheel} show {wheel}")
        .ignore_status()
        .output()
        .map_err(|e| format!("auditwheel: {e}"))?;
    let report = String::from_utf8_lossy(&show.stdout).replace('\n', " ");
    let satisfied = format!("consistent with the following platform tag: \"{MANYLINUX}_x86_64\"");
    if !show.status.success() || !report.contains(&satisfied) {
        return Err(format!(
            "auditwheel show does not report {MANYLINUX}_x86_64 as satisfied for {}: {report}{}",
            wheel.display(),
            String::from_utf8_lossy(&show.stderr)
        ));
    }
    let size = std::fs::metadata(&wheel).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "xtask: {} ({:.1} MiB), auditwheel: {MANYLINUX}_x86_64 satisfied",
        wheel.display(),
        size as f64 / (1024.0 * 1024.0)
    );
    Ok(wheel)
}

/// The C++ runtime g++ links against (`libstdc++.so.6`).
fn libstdcxx(sh: &Shell) -> Result<PathBuf, String> {
    let out = cmd!(sh, "g++ -print-file-name=libstdc++.so.6")
        .quiet()
        .read()
        .map_err(|e| format!("g++ (needed to build nixl-sys's stubs): {e}"))?;
    let path = PathBuf::from(out.trim());
    if path.is_absolute() && path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "g++ does not know where libstdc++.so.6 is ({})",
            path.display()
        ))
    }
}

/// `target/py-dynamo`: Dynamo's module and the torch stand-in.
fn ensure_dynamo(sh: &Shell, root: &Path) -> Result<(PathBuf, PathBuf), String> {
    let dir = root.join("target/py-dynamo");
    let (src, stub) = (dir.join("dynamo-src"), dir.join("torch-stub"));
    let stamp = dir.join(".complete");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == dynamo()) {
        return Ok((src, stub));
    }
    let downloads = root.join("target/py-downloads");
    run_quiet(
        pip(sh, "python3", "download")
            .args(["--no-deps", "-d"])
            .arg(&downloads)
            .arg(dynamo()),
    )?;
    let dynamo_wheel = wheel::find(&downloads, &format!("ai_dynamo_runtime-{DYNAMO_VERSION}-"))?;
    let _ = std::fs::remove_dir_all(&src);
    if wheel::extract(&dynamo_wheel, &src, |name| name == DYNAMO_MODULE)? != 1 {
        return Err(format!("{} has no {DYNAMO_MODULE}", dynamo_wheel.display()));
    }
    let torch = stub.join("torch");
    std::fs::create_dir_all(&torch).map_err(|e| format!("create {}: {e}", torch.display()))?;
    std::fs::write(
        torch.join("__init__.py"),
        "\"\"\"Stand-in for torch in nixl_connect's test environment only: Dynamo's\n\
         nixl_connect imports torch unconditionally; its NumPy paths need only this.\"\"\"\n\n\n\
         class Tensor:\n    pass\n",
    )
    .map_err(|e| format!("write the torch stand-in: {e}"))?;
    std::fs::write(&stamp, dynamo()).map_err(|e| format!("write {}: {e}", stamp.display()))?;
    Ok((src, stub))
}

fn venv_dir(root: &Path, minor: &str) -> PathBuf {
    match minor {
        "3.11" => root.join("target/py-venv"),
        _ => root.join(format!("target/py{}-venv", minor.replace('.', ""))),
    }
}

/// The test virtualenv of `minor` with `wheel` installed; `Ok(None)` when
/// this machine has no such interpreter.
fn ensure_venv(
    sh: &Shell,
    root: &Path,
    minor: &str,
    nixl: bool,
    wheel: &Path,
) -> Result<Option<Venv>, String> {
    let Some(python) = interpreter(sh, minor) else {
        return Ok(None);
    };
    let (dynamo_src, torch_stub) = ensure_dynamo(sh, root)?;
    let dir = venv_dir(root, minor);
    let mut what = TEST_REQUIREMENTS.join("\n");
    if nixl {
        what += &format!("\n{}\n{}", nixl::requirement(), nixl_meta());
    }
    let downloads = root.join("target/py-downloads");
    let fresh = !dir.join(".complete").is_file();
    let venv_python = ensure(sh, &dir, &python, &what, |py| {
        // As a user installs it: pip resolves the wheel's dependencies.
        run_quiet(
            pip(sh, py, "install")
                .arg(wheel)
                .args(TEST_REQUIREMENTS)
                .env("PATH", dir.join("bin")),
        )?;
        if nixl {
            // The runtime without its torch dependency (the light route).
            for package in [nixl::requirement(), nixl_meta()] {
                run_quiet(
                    pip(sh, "python3", "download")
                        .args(["--no-deps", "--only-binary=:all:", "--python-version"])
                        .arg(minor)
                        .arg("-d")
                        .arg(&downloads)
                        .arg(&package),
                )?;
                run_quiet(
                    pip(sh, py, "install")
                        .args(["--no-deps", "--no-index", "--find-links"])
                        .arg(&downloads)
                        .arg(&package),
                )?;
            }
        }
        Ok(())
    })?;
    if !fresh {
        run_quiet(
            pip(sh, &venv_python, "install")
                .args(["--no-deps", "--force-reinstall"])
                .arg(wheel)
                .env("PATH", dir.join("bin")),
        )?;
    }
    Ok(Some(Venv {
        root: dir,
        python: venv_python,
        nixl,
        dynamo_src,
        torch_stub,
    }))
}

/// `dir`, then the current `PATH`.
fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut dirs = vec![dir.to_path_buf()];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).unwrap_or_else(|_| dir.as_os_str().to_owned())
}

/// The environment the tests and the benchmark run with: the Dynamo module and
/// the torch stand-in (for Dynamo peers only), NIXL tests required where the
/// runtime is installed, and only the virtualenv on `PATH`.
pub(crate) fn test_env(venv: &Venv) -> Vec<(&'static str, String)> {
    let mut env = vec![
        (
            "NIXL_CONNECT_DYNAMO_SRC",
            venv.dynamo_src.display().to_string(),
        ),
        (
            "NIXL_CONNECT_TORCH_STUB",
            venv.torch_stub.display().to_string(),
        ),
        ("PATH", venv.root.join("bin").display().to_string()),
    ];
    if venv.nixl {
        env.push(("NIXL_TESTS_REQUIRED", "1".to_owned()));
    }
    env
}

/// The 3.11 virtualenv `cargo xtask soak` runs in: the wheel of this tree
/// built and installed (as for `bench --python`), or with `installed`, the
/// package as the virtualenv holds it now (made by an earlier `cargo xtask
/// test`), nothing built.
pub(crate) fn soak_venv(sh: &Shell, root: &Path, installed: bool) -> Result<Venv, String> {
    if !installed {
        return build_wheel(sh, root)
            .and_then(|wheel| ensure_venv(sh, root, "3.11", true, &wheel))
            .and_then(|venv| venv.ok_or_else(|| "no CPython 3.11 here".to_owned()));
    }
    let dir = venv_dir(root, "3.11");
    if !dir.join(".complete").is_file() {
        return Err(format!(
            "{} is not made yet: run `cargo xtask test python` once, or leave out --installed",
            dir.display()
        ));
    }
    let (dynamo_src, torch_stub) = ensure_dynamo(sh, root)?;
    Ok(Venv {
        python: dir.join("bin/python"),
        root: dir,
        nixl: true,
        dynamo_src,
        torch_stub,
    })
}

/// Runs the package's pytest suite (`crates/nixl-connect-py/tests`);
/// `long` (`--long`) sets `RELIABILITY_LONG=1`, as for the cargo tests.
fn pytest(sh: &Shell, root: &Path, venv: &Venv, long: bool) -> bool {
    let python = &venv.python;
    let tests = root.join(PACKAGE_DIR).join("tests");
    let mut pytest = cmd!(sh, "{python} -m pytest -q -p no:cacheprovider {tests}")
        .env_remove("NIXL_TESTS_REQUIRED")
        .envs(test_env(venv))
        .env_remove("VIRTUAL_ENV")
        .env_remove("NIXL_RUNTIME_DIR")
        .env_remove("NIXL_CAPI_LIB");
    if long {
        pytest = pytest.env("RELIABILITY_LONG", "1");
    }
    run(pytest)
}

/// The `cargo xtask test` step: the wheel, built once, then pytest in the
/// virtualenv of every interpreter (one missing here is named and skipped);
/// `long`: `cargo xtask test --long`; `lean`: `--lean` (the wheel's build
/// folder is removed once the wheel is made).
pub(crate) fn test(sh: &Shell, root: &Path, long: bool, lean: bool) -> bool {
    let wheel = match build_wheel(sh, root) {
        Ok(wheel) => wheel,
        Err(e) => {
            eprintln!("xtask test (python): {e}");
            return false;
        }
    };
    crate::test::discard(lean, &root.join(BUILD_DIR));
    let mut ok = typecheck(sh, root, &wheel);
    for &(minor, nixl) in INTERPRETERS {
        match ensure_venv(sh, root, minor, nixl, &wheel) {
            Ok(Some(venv)) => {
                eprintln!(
                    "xtask test (python {minor}): pytest, {}",
                    if nixl {
                        "NIXL and Dynamo interop included"
                    } else {
                        "no NIXL runtime: NIXL tests skip"
                    }
                );
                ok &= pytest(sh, root, &venv, long);
            }
            Ok(None) => eprintln!(
                "xtask test (python {minor}): skipped: no ~/.pyenv/versions/{minor}.*/bin/python3 and python3 is another version"
            ),
            Err(e) => {
                eprintln!("xtask test (python {minor}): {e}");
                ok = false;
            }
        }
    }
    ok
}

/// `mypy --strict` and pyright on the typed Dynamo-style worker and the
/// package (configs in `tests/typing`), and mypy's stubtest of the native
/// module's stubs against the built wheel.
fn typecheck(sh: &Shell, root: &Path, wheel: &Path) -> bool {
    let checked = (|| -> Result<(PathBuf, PathBuf), String> {
        let tools = ensure_tools(sh, root)?;
        let node = root.join("target/node-tools");
        let pyright = node.join("node_modules/.bin/pyright");
        let stamp = node.join(".complete");
        if !std::fs::read_to_string(&stamp).is_ok_and(|s| s == PYRIGHT) {
            if !crate::shell::succeeds(cmd!(sh, "npm --version")) {
                crate::nixl::apt_install(sh, "npm (pyright runs on Node.js)", &["nodejs", "npm"])?;
            }
            run_quiet(cmd!(
                sh,
                "npm install --silent --no-audit --no-fund --prefix {node} {PYRIGHT}"
            ))
            .map_err(|e| {
                format!("{e} (pyright needs Node.js and npm: apt-get install -y nodejs npm)")
            })?;
            std::fs::write(&stamp, PYRIGHT)
                .map_err(|e| format!("write {}: {e}", stamp.display()))?;
        }
        run_quiet(
            pip(sh, &tools, "install")
                .args(["--no-deps", "--force-reinstall"])
                .arg(wheel),
        )?;
        Ok((tools, pyright))
    })();
    let (tools, pyright) = match checked {
        Ok(paths) => paths,
        Err(e) => {
            eprintln!("xtask test (python types): {e}");
            return false;
        }
    };
    let typing = root.join(PACKAGE_DIR).join("tests/typing");
    let types = {
        let _typing = sh.push_dir(&typing);
        run(cmd!(sh, "{tools} -m mypy")) & run(cmd!(sh, "{pyright} --pythonpath {tools}"))
    };
    // stubtest imports the installed package: from outside the source tree.
    let _target = sh.push_dir(root.join("target"));
    types & run(cmd!(sh, "{tools} -m mypy.stubtest nixl_connect"))
}

/// `cargo xtask test --quick`'s Python step: the wheel, then the suite in
/// the 3.11 virtualenv on loopback only.
pub(crate) fn quick(sh: &Shell, root: &Path) -> bool {
    let venv = build_wheel(sh, root).and_then(|wheel| ensure_venv(sh, root, "3.11", true, &wheel));
    let venv = match venv {
        Ok(Some(venv)) => venv,
        Ok(None) => {
            eprintln!("xtask test --quick (python): no CPython 3.11 here");
            return false;
        }
        Err(e) => {
            eprintln!("xtask test --quick (python): {e}");
            return false;
        }
    };
    let python = &venv.python;
    let tests = root.join(PACKAGE_DIR).join("tests");
    run(cmd!(
        sh,
        "{python} -m pytest -q -p no:cacheprovider -k 'not nixl' {tests}"
    )
    .envs(test_env(&venv))
    .env_remove("NIXL_TESTS_REQUIRED")
    .env_remove("VIRTUAL_ENV"))
}

/// `cargo xtask wheel`.
pub(crate) fn wheel(sh: &Shell, root: &Path) -> Result<(), u8> {
    match build_wheel(sh, root) {
        Ok(wheel) => {
            println!("{}", wheel.display());
            Ok(())
        }
        Err(e) => {
            eprintln!("xtask wheel: {e}");
            Err(1)
        }
    }
}

/// Whether the benchmark's virtualenv exists (the full bench runs the Python
/// rows only then).
pub(crate) fn venv_exists(root: &Path) -> bool {
    venv_dir(root, "3.11").join(".complete").is_file()
}

/// `cargo xtask bench --python`: the Python package against Dynamo's module.
pub(crate) fn bench(sh: &Shell, ws: &crate::Workspace, quick: bool) -> Result<(), u8> {
    let root = ws.root.as_path();
    let venv = build_wheel(sh, root)
        .and_then(|wheel| ensure_venv(sh, root, "3.11", true, &wheel))
        .and_then(|venv| venv.ok_or_else(|| "no CPython 3.11 here".to_owned()))
        .map_err(|e| {
            eprintln!("xtask bench --python: {e}");
            1
        })?;
    let cargo = crate::shell::cargo();
    if !run(cmd!(sh, "{cargo} build --quiet --release -p bench")) {
        return Err(1);
    }
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).map_err(|e| {
        eprintln!("xtask bench --python: create {}: {e}", out.display());
        1
    })?;
    let python = &venv.python;
    let script = root.join(PACKAGE_DIR).join("bench/bench.py");
    let report = out.join("report.json");
    let quick_flag = quick.then_some("--quick");
    let measured = run(
        cmd!(sh, "{python} {script} --report {report} {quick_flag...}")
            .envs(test_env(&venv))
            .env(
                "NIXL_CONNECT_RUST_WORKER",
                ws.target.join("release").join("bench"),
            )
            .env_remove("VIRTUAL_ENV")
            .env_remove("NIXL_RUNTIME_DIR")
            .env_remove("NIXL_CAPI_LIB"),
    );
    if measured { Ok(()) } else { Err(1) }
}
