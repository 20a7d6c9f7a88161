//! Provisioning for the NIXL backend: libclang (for nixl-sys's bindgen) and the
//! NIXL runtime unpacked from the `nixl-cu12` wheel on PyPI. Both idempotent.

use std::path::{Path, PathBuf};

use xshell::{Shell, cmd};

use crate::shell::{pip, run_quiet, succeeds};
use crate::wheel;

/// The NIXL release the runtime, the test virtualenvs and the Python tests
/// use; everything else here is derived from it. backend-nixl's `PIP_PACKAGE`
/// and the Python package's `cu12` extra name it too (a test below keeps
/// them equal).
pub(crate) const NIXL_VERSION: &str = "1.5.1";
const NUMPY: &str = "numpy==2.2.6";

/// The pip requirement for the runtime wheel, `nixl-cu12==NIXL_VERSION`.
pub(crate) fn requirement() -> String {
    format!("nixl-cu12=={NIXL_VERSION}")
}

/// Its folder under `target/nixl-runtime`.
fn runtime_dir() -> String {
    format!("nixl-cu12-{NIXL_VERSION}")
}
/// What is unpacked from the wheel: the C API and plugins, the vendored
/// libraries (UCX among them) and the Python bindings for the interop tests.
const KEEP: &[&str] = &[".nixl_cu12.mesonpy.libs/", "nixl_cu12.libs/", "nixl_cu12/"];

/// Paths of an unpacked runtime.
pub(crate) struct Runtime {
    /// Root of the unpacked wheel (`NIXL_RUNTIME_DIR`).
    pub(crate) root: PathBuf,
    /// `PYTHONPATH` that imports `nixl_cu12` and numpy.
    pub(crate) pythonpath: String,
}

fn runtime_paths(root: &Path) -> Runtime {
    let dir = root.join("target/nixl-runtime").join(runtime_dir());
    let pythonpath = format!("{}:{}", dir.display(), dir.join("site").display());
    Runtime {
        root: dir,
        pythonpath,
    }
}

/// Downloads and unpacks the runtime under `target/nixl-runtime` unless it is
/// already there; offline after the first success.
pub(crate) fn ensure_runtime(sh: &Shell, root: &Path) -> Result<Runtime, String> {
    let runtime = runtime_paths(root);
    let stamp = runtime.root.join(".complete");
    if stamp.is_file() {
        return Ok(runtime);
    }
    if !succeeds(cmd!(sh, "python3 -m pip --version")) {
        apt_install(
            sh,
            "python3 with pip (it fetches the NIXL runtime from PyPI)",
            &["python3", "python3-pip"],
        )?;
    }
    let base = root.join("target/nixl-runtime");
    let wheels = base.join("wheels");
    std::fs::create_dir_all(&wheels).map_err(|e| format!("create {}: {e}", wheels.display()))?;
    eprintln!(
        "xtask: fetching the NIXL runtime ({}, ~68 MB) and {NUMPY} from PyPI into {}",
        requirement(),
        base.display()
    );
    for package in [requirement().as_str(), NUMPY] {
        run_quiet(
            pip(sh, "python3", "download")
                .args(["--no-deps", "--only-binary=:all:", "-d"])
                .arg(&wheels)
                .arg(package),
        )?;
    }
    // Unpack into a fresh folder, then move it into place: an interrupted run
    // never leaves a half-unpacked runtime behind the stamp.
    let staging = base.join(format!("{}.partial", runtime_dir()));
    let _ = std::fs::remove_dir_all(&staging);
    let _ = std::fs::remove_dir_all(&runtime.root);
    let found = wheel::find(&wheels, &format!("nixl_cu12-{NIXL_VERSION}-"))?;
    eprintln!("$ unzip {} into {}", found.display(), staging.display());
    wheel::extract(&found, &staging, |name| {
        KEEP.iter().any(|k| name.starts_with(k))
    })?;
    run_quiet(
        pip(sh, "python3", "install")
            .args(["--no-deps", "--no-index", "--find-links"])
            .arg(&wheels)
            .arg("--target")
            .arg(staging.join("site"))
            .arg(NUMPY),
    )?;
    std::fs::rename(&staging, &runtime.root)
        .map_err(|e| format!("move {} into place: {e}", staging.display()))?;
    // Check that it loads: the Python bindings open the same libraries and plugins.
    let probe = "import nixl_cu12; a = nixl_cu12.nixl_agent('xtask-probe'); \
                 assert 'UCX' in a.get_plugin_list(), a.get_plugin_list()";
    run_quiet(cmd!(sh, "python3 -c {probe}").env("PYTHONPATH", &runtime.pythonpath))?;
    std::fs::write(&stamp, format!("{}\n{NUMPY}\n", requirement()))
        .map_err(|e| format!("write {}: {e}", stamp.display()))?;
    eprintln!("xtask: NIXL runtime ready in {}", runtime.root.display());
    Ok(runtime)
}

/// A virtualenv with the NIXL wheel pip-installed into it (`target/nixl-venv`),
/// for the test that finds a pip-installed runtime with nothing set. Made
/// once, offline, from the wheel `ensure_runtime` downloaded.
pub(crate) fn ensure_test_venv(sh: &Shell, root: &Path) -> Result<PathBuf, String> {
    let venv = root.join("target/nixl-venv");
    let stamp = venv.join(".complete");
    if stamp.is_file() {
        return Ok(venv);
    }
    let _ = std::fs::remove_dir_all(&venv);
    run_quiet(cmd!(sh, "python3 -m venv {venv}"))?;
    run_quiet(
        pip(sh, venv.join("bin/python"), "install")
            .args(["--no-deps", "--no-index", "--find-links"])
            .arg(root.join("target/nixl-runtime/wheels"))
            .arg(requirement()),
    )?;
    std::fs::write(&stamp, format!("{}\n", requirement()))
        .map_err(|e| format!("write {}: {e}", stamp.display()))?;
    Ok(venv)
}

/// libclang and the runtime, or the exit code after saying what is missing.
pub(crate) fn provision(sh: &Shell, root: &Path, command: &str) -> Result<Runtime, u8> {
    ensure_libclang(sh)
        .and_then(|()| ensure_runtime(sh, root))
        .map_err(|e| {
            eprintln!("xtask {command}: {e}");
            1
        })
}

/// Makes sure bindgen can find libclang and nixl-sys's stubs a C++ compiler,
/// installing them with apt where allowed.
pub(crate) fn ensure_libclang(sh: &Shell) -> Result<(), String> {
    if std::env::var_os("LIBCLANG_PATH").is_none() && find_libclang().is_none() {
        apt_install(
            sh,
            "libclang (nixl-sys runs bindgen; or set LIBCLANG_PATH)",
            &["libclang-dev"],
        )?;
        find_libclang().ok_or("libclang-dev installed, but no libclang.so found")?;
    }
    if !crate::shell::succeeds(cmd!(sh, "g++ --version")) {
        apt_install(sh, "g++ (nixl-sys compiles C++ stubs)", &["g++"])?;
    }
    Ok(())
}

/// Installs Debian `packages` (for `what`, which the error names) with
/// apt-get, as root only; runs `apt-get update` once if the first try fails.
pub(crate) fn apt_install(sh: &Shell, what: &str, packages: &[&str]) -> Result<(), String> {
    let hint = format!(
        "{what} is missing: on Debian/Ubuntu run `apt-get install -y {}` as root",
        packages.join(" ")
    );
    let root = cmd!(sh, "id -u").quiet().read().is_ok_and(|uid| uid == "0");
    if !root || !Path::new("/usr/bin/apt-get").exists() {
        return Err(hint);
    }
    eprintln!(
        "xtask: {what} is missing; installing {}",
        packages.join(" ")
    );
    let install = || {
        run_quiet(
            cmd!(
                sh,
                "apt-get install -y -q --no-install-recommends {packages...}"
            )
            .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    if install().is_err() {
        run_quiet(cmd!(sh, "apt-get update -q"))?;
        install().map_err(|e| format!("{hint}\n{e}"))?;
    }
    Ok(())
}

fn find_libclang() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = vec![
        "/usr/lib/x86_64-linux-gnu".into(),
        "/usr/lib64".into(),
        "/usr/lib".into(),
    ];
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        dirs.extend(
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
                .map(|e| e.path().join("lib")),
        );
    }
    dirs.into_iter().find_map(|dir| {
        std::fs::read_dir(&dir).ok()?.flatten().find_map(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            (name.starts_with("libclang")
                && name.contains(".so")
                && !name.starts_with("libclang-cpp"))
            .then(|| e.path())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version right after `marker` in a file of the workspace.
    fn pinned_in(path: &str, marker: &str) -> String {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
        let text = std::fs::read_to_string(&file).unwrap();
        let (_, rest) = text.split_once(marker).unwrap();
        rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
            .next()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn every_pin_of_nixl_names_the_same_version() {
        assert_eq!(requirement(), format!("nixl-cu12=={NIXL_VERSION}"));
        let rust = "pub const PIP_PACKAGE: &str = \"nixl-cu12==";
        assert_eq!(
            pinned_in("crates/backend-nixl/src/runtime.rs", rust),
            NIXL_VERSION
        );
        let extra = "cu12 = [\"nixl-cu12==";
        assert_eq!(
            pinned_in("crates/nixl-connect-py/pyproject.toml", extra),
            NIXL_VERSION
        );
    }
}
