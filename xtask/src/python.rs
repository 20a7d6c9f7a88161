//! The Python package `nixl_connect` (crates/nixl-connect-py): a virtualenv
//! with what its tests need, the package installed into it the way a user
//! installs it, pytest, and the Python benchmark (`bench --python`).
//!
//! Everything is installed by these functions, once (a stamp file records
//! what the virtualenv holds; a change recreates it), offline afterwards
//! except for the package build itself:
//! - `target/py-venv`: maturin, pytest, pydantic, numpy, `nixl-cu12` (the NIXL
//!   runtime, from the wheel `cargo xtask nixl-runtime` downloaded, without
//!   its torch dependency) and NIXL's `nixl` meta-package (for Dynamo);
//! - `target/py-venv/dynamo-src`: the real `dynamo/nixl_connect/__init__.py`
//!   from `ai-dynamo-runtime` 1.6.1 (pure Python; the wheel's 200 MB native
//!   part is not needed), and `target/py-venv/torch-stub`, a stand-in `torch`
//!   with an empty `Tensor` class that Dynamo's module imports. Only the
//!   Dynamo peers of the interop tests and the benchmark put these on their
//!   `PYTHONPATH`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{nixl, run_quiet, wheel};

/// What the virtualenv holds; written to its stamp file.
const REQUIREMENTS: &[&str] = &["maturin>=1.9,<2", "pytest>=8", "pydantic>=2.10.6,<=2.13.5"];
const NUMPY: &str = "numpy==2.2.6";
const DYNAMO_VERSION: &str = "1.6.1";
/// The one file of the Dynamo wheel the tests use.
const DYNAMO_MODULE: &str = "dynamo/nixl_connect/__init__.py";
const PACKAGE_DIR: &str = "crates/nixl-connect-py";
/// Cargo's target folder for the package build (kept apart from the
/// workspace's, which builds other features and profiles).
const BUILD_DIR: &str = "target/py";

/// A ready virtualenv and the paths the tests need.
pub(crate) struct Venv {
    /// The virtualenv folder.
    pub(crate) root: PathBuf,
    /// Its interpreter.
    pub(crate) python: PathBuf,
    /// Holds `dynamo/nixl_connect/__init__.py`.
    pub(crate) dynamo_src: PathBuf,
    /// Holds the stand-in `torch` package.
    pub(crate) torch_stub: PathBuf,
}

fn paths(root: &Path) -> Venv {
    let venv = root.join("target/py-venv");
    Venv {
        python: venv.join("bin/python"),
        dynamo_src: venv.join("dynamo-src"),
        torch_stub: venv.join("torch-stub"),
        root: venv,
    }
}

/// NIXL's meta-package (`import nixl`, which Dynamo uses), at the runtime's version.
fn nixl_meta() -> String {
    format!("nixl=={}", nixl::NIXL_VERSION)
}

fn dynamo() -> String {
    format!("ai-dynamo-runtime=={DYNAMO_VERSION}")
}

fn stamp_text() -> String {
    let mut lines: Vec<String> = REQUIREMENTS.iter().map(|r| (*r).to_owned()).collect();
    lines.extend([NUMPY.into(), nixl::requirement(), nixl_meta(), dynamo()]);
    lines.push("torch-stub 1".into());
    lines.join("\n") + "\n"
}

/// The test virtualenv, created and filled once (`target/py-venv`).
pub(crate) fn ensure_venv(root: &Path) -> Result<Venv, String> {
    let venv = paths(root);
    let stamp = venv.root.join(".complete");
    let wanted = stamp_text();
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(venv);
    }
    let runtime = nixl::ensure_runtime(root)?;
    let wheels = runtime
        .root
        .parent()
        .map(|p| p.join("wheels"))
        .ok_or("the NIXL runtime folder has no parent")?;
    let downloads = root.join("target/py-downloads");
    std::fs::create_dir_all(&downloads)
        .map_err(|e| format!("create {}: {e}", downloads.display()))?;
    let _ = std::fs::remove_dir_all(&venv.root);
    run_quiet(Command::new("python3").args(["-m", "venv"]).arg(&venv.root))?;
    let pip = |args: &[&str]| {
        let mut cmd = crate::pip(&venv.python, "install");
        cmd.args(args);
        cmd
    };
    run_quiet(&mut pip(REQUIREMENTS))?;
    // numpy and the NIXL runtime from the wheels already downloaded; the
    // runtime without its declared torch dependency (not needed for DRAM).
    let wheels_arg = wheels.display().to_string();
    run_quiet(&mut pip(&[
        "--no-index",
        "--find-links",
        &wheels_arg,
        NUMPY,
    ]))?;
    run_quiet(&mut pip(&[
        "--no-deps",
        "--no-index",
        "--find-links",
        &wheels_arg,
        &nixl::requirement(),
    ]))?;
    // NIXL's meta-package (`import nixl`, which Dynamo uses) and Dynamo's
    // wheel, downloaded once.
    let downloads_arg = downloads.display().to_string();
    for package in [nixl_meta(), dynamo()] {
        run_quiet(
            crate::pip(&venv.python, "download")
                .args(["--no-deps", "-d"])
                .arg(&downloads)
                .arg(package),
        )?;
    }
    run_quiet(&mut pip(&[
        "--no-deps",
        "--no-index",
        "--find-links",
        &downloads_arg,
        &nixl_meta(),
    ]))?;
    let dynamo_wheel = wheel::find(&downloads, &format!("ai_dynamo_runtime-{DYNAMO_VERSION}-"))?;
    if wheel::extract(&dynamo_wheel, &venv.dynamo_src, |name| {
        name == DYNAMO_MODULE
    })? != 1
    {
        return Err(format!("{} has no {DYNAMO_MODULE}", dynamo_wheel.display()));
    }
    let torch = venv.torch_stub.join("torch");
    std::fs::create_dir_all(&torch).map_err(|e| format!("create {}: {e}", torch.display()))?;
    std::fs::write(
        torch.join("__init__.py"),
        "\"\"\"Stand-in for torch in nixl_connect's test environment only: Dynamo's\n\
         nixl_connect imports torch unconditionally; its NumPy paths need only this.\"\"\"\n\n\n\
         class Tensor:\n    pass\n",
    )
    .map_err(|e| format!("write the torch stand-in: {e}"))?;
    std::fs::write(&stamp, wanted).map_err(|e| format!("write {}: {e}", stamp.display()))?;
    eprintln!(
        "xtask: Python test environment ready in {}",
        venv.root.display()
    );
    Ok(venv)
}

/// Builds and installs `nixl_connect` into the virtualenv as a user would
/// (`pip install ./crates/nixl-connect-py`, maturin as the build backend;
/// already in the virtualenv, so no download).
/// Builds the package's wheel (abi3: one for every CPython >= 3.10) with the
/// virtualenv's maturin, as pip builds it for a user, into
/// `target/py/wheels`; returns its path.
fn build_wheel(root: &Path, venv: &Venv) -> Option<PathBuf> {
    let out = root.join(BUILD_DIR).join("wheels");
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = crate::pip(&venv.python, "wheel");
    cmd.args(["--no-build-isolation", "--no-deps", "-w"])
        .arg(&out)
        .arg(root.join(PACKAGE_DIR))
        .env("CARGO_TARGET_DIR", root.join(BUILD_DIR))
        .env("PATH", path_with(&venv.root.join("bin")));
    if !crate::run(root, cmd) {
        return None;
    }
    match wheel::find(&out, "nixl_connect-") {
        Ok(wheel) => Some(wheel),
        Err(e) => {
            eprintln!("xtask (python): {e}");
            None
        }
    }
}

fn install_wheel(root: &Path, python: &Path, wheel: &Path) -> bool {
    let mut cmd = crate::pip(python, "install");
    cmd.args(["--no-deps", "--force-reinstall"]).arg(wheel);
    crate::run(root, cmd)
}

/// Builds the package and installs it into the test virtualenv.
pub(crate) fn install_package(root: &Path, venv: &Venv) -> bool {
    build_wheel(root, venv).is_some_and(|wheel| install_wheel(root, &venv.python, &wheel))
}

fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut dirs = vec![dir.to_path_buf()];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).unwrap_or_else(|_| dir.as_os_str().to_owned())
}

/// The environment the tests and the benchmark run with: the Dynamo module and
/// the torch stand-in (for Dynamo peers only), and NIXL tests required.
fn test_env(venv: &Venv) -> Vec<(&'static str, String)> {
    vec![
        (
            "NIXL_CONNECT_DYNAMO_SRC",
            venv.dynamo_src.display().to_string(),
        ),
        (
            "NIXL_CONNECT_TORCH_STUB",
            venv.torch_stub.display().to_string(),
        ),
        ("NIXL_TESTS_REQUIRED", "1".to_owned()),
    ]
}

/// Runs the package's pytest suite (`crates/nixl-connect-py/tests`).
pub(crate) fn pytest(root: &Path, venv: &Venv) -> bool {
    let mut cmd = Command::new(&venv.python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root.join(PACKAGE_DIR).join("tests"))
        .envs(test_env(venv))
        .env_remove("VIRTUAL_ENV")
        .env_remove("NIXL_RUNTIME_DIR")
        .env_remove("NIXL_CAPI_LIB");
    crate::run(root, cmd)
}

/// The `cargo xtask test` step: virtualenv, `pip install`, pytest.
pub(crate) fn test(root: &Path) -> bool {
    let venv = match ensure_venv(root) {
        Ok(venv) => venv,
        Err(e) => {
            eprintln!("xtask test (python): {e}");
            return false;
        }
    };
    let Some(wheel) = build_wheel(root, &venv) else {
        return false;
    };
    let main = install_wheel(root, &venv.python, &wheel) && pytest(root, &venv);
    main & test_on_312(root, &venv, &wheel)
}

/// The suite again on CPython 3.12, where a class can define `__buffer__`
/// (PEP 688): the same abi3 wheel in a virtualenv of its own, with no NIXL
/// runtime (NIXL tests skip; loopback and the checks of native pins run).
/// The interpreter comes from pyenv's folder, as this image has it; without
/// one the step says so and skips.
fn test_on_312(root: &Path, main: &Venv, wheel: &Path) -> bool {
    let Some(python) = pyenv_python("3.12") else {
        eprintln!(
            "xtask test (python): skipped the CPython 3.12 run: no ~/.pyenv/versions/3.12.*/bin/python3"
        );
        return true;
    };
    let venv = root.join("target/py312-venv");
    let venv_python = venv.join("bin/python");
    let stamp = venv.join(".complete");
    let wanted = format!("{}\n{}\n", python.display(), stamp_text());
    if !std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        let _ = std::fs::remove_dir_all(&venv);
        let made = run_quiet(Command::new(&python).args(["-m", "venv"]).arg(&venv))
            .and_then(|()| {
                run_quiet(
                    crate::pip(&venv_python, "install")
                        .args(&REQUIREMENTS[1..])
                        .arg(NUMPY),
                )
            })
            .and_then(|()| {
                std::fs::write(&stamp, &wanted)
                    .map_err(|e| format!("write {}: {e}", stamp.display()))
            });
        if let Err(e) = made {
            eprintln!("xtask test (python 3.12): {e}");
            return false;
        }
    }
    if !install_wheel(root, &venv_python, wheel) {
        return false;
    }
    let mut cmd = Command::new(&venv_python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root.join(PACKAGE_DIR).join("tests"))
        .envs(test_env(main))
        .env_remove("NIXL_TESTS_REQUIRED")
        .env_remove("VIRTUAL_ENV")
        .env_remove("NIXL_RUNTIME_DIR")
        .env_remove("NIXL_CAPI_LIB");
    crate::run(root, cmd)
}

/// The newest `~/.pyenv/versions/<minor>.N/bin/python3`.
fn pyenv_python(minor: &str) -> Option<PathBuf> {
    let versions = PathBuf::from(std::env::var_os("HOME")?).join(".pyenv/versions");
    let patch =
        |name: &str| -> Option<u32> { name.strip_prefix(minor)?.strip_prefix('.')?.parse().ok() };
    let newest = std::fs::read_dir(&versions)
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|name| Some((patch(&name)?, name)))
        .max()?;
    let python = versions.join(newest.1).join("bin/python3");
    python.is_file().then_some(python)
}

pub(crate) fn venv_exists(root: &Path) -> bool {
    paths(root).root.join(".complete").is_file()
}

/// `cargo xtask bench --python`: round trips through `nixl_connect` (NIXL)
/// and the real Dynamo module, interleaved; rows merged into
/// `target/bench/report.json` (`py-nixl-connect`, `py-dynamo`).
pub(crate) fn bench(ws: &crate::Workspace, quick: bool) -> Result<(), u8> {
    let root = ws.root.as_path();
    let venv = ensure_venv(root).map_err(|e| {
        eprintln!("xtask bench --python: {e}");
        1
    })?;
    if !install_package(root, &venv) {
        return Err(1);
    }
    // The Rust API's worker, the baseline measured in the same run.
    let mut build = crate::cargo();
    build.args(["build", "--quiet", "--release", "-p", "bench"]);
    if !crate::run(root, build) {
        return Err(1);
    }
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out).map_err(|e| {
        eprintln!("xtask bench --python: create {}: {e}", out.display());
        1
    })?;
    let mut cmd = Command::new(&venv.python);
    cmd.arg(root.join(PACKAGE_DIR).join("bench/bench.py"))
        .arg("--report")
        .arg(out.join("report.json"))
        .envs(test_env(&venv))
        .env(
            "NIXL_CONNECT_RUST_WORKER",
            ws.target.join("release").join("bench"),
        )
        .env_remove("VIRTUAL_ENV")
        .env_remove("NIXL_RUNTIME_DIR")
        .env_remove("NIXL_CAPI_LIB");
    if quick {
        cmd.arg("--quick");
    }
    if crate::run(root, cmd) {
        Ok(())
    } else {
        Err(1)
    }
}
