//! Provisioning for the NIXL backend: libclang (for nixl-sys's bindgen) and the
//! NIXL runtime unpacked from the `nixl-cu12` wheel on PyPI. Both idempotent.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::describe;

pub(crate) const WHEEL: &str = "nixl-cu12==1.5.1";
const NUMPY: &str = "numpy==2.2.6";
const RUNTIME_DIR: &str = "nixl-cu12-1.5.1";
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
    let dir = root.join("target/nixl-runtime").join(RUNTIME_DIR);
    let pythonpath = format!("{}:{}", dir.display(), dir.join("site").display());
    Runtime {
        root: dir,
        pythonpath,
    }
}

fn run_quiet(cmd: &mut Command) -> Result<(), String> {
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

/// Downloads and unpacks the runtime under `target/nixl-runtime` unless it is
/// already there; offline after the first success.
pub(crate) fn ensure_runtime(root: &Path) -> Result<Runtime, String> {
    let runtime = runtime_paths(root);
    let stamp = runtime.root.join(".complete");
    if stamp.is_file() {
        return Ok(runtime);
    }
    let python_ok = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !python_ok {
        return Err(
            "python3 with pip is needed to fetch the NIXL runtime from PyPI; \
                    on Debian/Ubuntu run: apt-get install -y python3 python3-pip"
                .into(),
        );
    }
    let base = root.join("target/nixl-runtime");
    let wheels = base.join("wheels");
    std::fs::create_dir_all(&wheels).map_err(|e| format!("create {}: {e}", wheels.display()))?;
    eprintln!(
        "xtask: fetching the NIXL runtime ({WHEEL}, ~68 MB) and {NUMPY} from PyPI into {}",
        base.display()
    );
    for package in [WHEEL, NUMPY] {
        run_quiet(
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--only-binary=:all:",
                    "-d",
                ])
                .arg(&wheels)
                .arg(package),
        )?;
    }
    // Unpack into a fresh folder, then move it into place: an interrupted run
    // never leaves a half-unpacked runtime behind the stamp.
    let staging = base.join(format!("{RUNTIME_DIR}.partial"));
    let _ = std::fs::remove_dir_all(&staging);
    let _ = std::fs::remove_dir_all(&runtime.root);
    let unpack = "import glob, sys, zipfile\n\
         wheel = sorted(glob.glob(sys.argv[1] + '/nixl_cu12-1.5.1-*.whl'))[-1]\n\
         keep = tuple(sys.argv[3].split(','))\n\
         with zipfile.ZipFile(wheel) as z:\n    \
             z.extractall(sys.argv[2], [m for m in z.namelist() if m.startswith(keep)])\n";
    run_quiet(
        Command::new("python3")
            .args(["-c", unpack])
            .arg(&wheels)
            .arg(&staging)
            .arg(KEEP.join(",")),
    )?;
    run_quiet(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-index",
                "--find-links",
            ])
            .arg(&wheels)
            .arg("--target")
            .arg(staging.join("site"))
            .arg(NUMPY),
    )?;
    std::fs::rename(&staging, &runtime.root)
        .map_err(|e| format!("move {} into place: {e}", staging.display()))?;
    // Check that it loads: the Python bindings open the same libraries and plugins.
    run_quiet(
        Command::new("python3")
            .args([
                "-c",
                "import nixl_cu12; a = nixl_cu12.nixl_agent('xtask-probe'); \
                 assert 'UCX' in a.get_plugin_list(), a.get_plugin_list()",
            ])
            .env("PYTHONPATH", &runtime.pythonpath),
    )?;
    std::fs::write(&stamp, format!("{WHEEL}\n{NUMPY}\n"))
        .map_err(|e| format!("write {}: {e}", stamp.display()))?;
    eprintln!("xtask: NIXL runtime ready in {}", runtime.root.display());
    Ok(runtime)
}

/// A virtualenv with the NIXL wheel pip-installed into it (`target/nixl-venv`),
/// for the test that finds a pip-installed runtime with nothing set. Made
/// once, offline, from the wheel `ensure_runtime` downloaded.
pub(crate) fn ensure_test_venv(root: &Path) -> Result<PathBuf, String> {
    let venv = root.join("target/nixl-venv");
    let stamp = venv.join(".complete");
    if stamp.is_file() {
        return Ok(venv);
    }
    let _ = std::fs::remove_dir_all(&venv);
    run_quiet(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run_quiet(
        Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-index",
                "--find-links",
            ])
            .arg(root.join("target/nixl-runtime/wheels"))
            .arg(WHEEL),
    )?;
    std::fs::write(&stamp, format!("{WHEEL}\n"))
        .map_err(|e| format!("write {}: {e}", stamp.display()))?;
    Ok(venv)
}

/// libclang and the runtime, or the exit code after saying what is missing.
pub(crate) fn provision(root: &Path, command: &str) -> Result<Runtime, u8> {
    ensure_libclang()
        .and_then(|()| ensure_runtime(root))
        .map_err(|e| {
            eprintln!("xtask {command}: {e}");
            1
        })
}

/// Makes sure bindgen can find libclang, installing it with apt where allowed.
pub(crate) fn ensure_libclang() -> Result<(), String> {
    if std::env::var_os("LIBCLANG_PATH").is_some() || find_libclang().is_some() {
        return Ok(());
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    let hint = "nixl-sys runs bindgen, which needs libclang: on Debian/Ubuntu run \
                `apt-get install -y libclang-dev` as root, or set LIBCLANG_PATH";
    if !root || !Path::new("/usr/bin/apt-get").exists() {
        return Err(hint.into());
    }
    eprintln!("xtask: libclang is missing; installing it with apt-get (libclang-dev)");
    let install = || {
        run_quiet(
            Command::new("apt-get")
                .args([
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                    "libclang-dev",
                ])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    if install().is_err() {
        run_quiet(Command::new("apt-get").args(["update", "-q"]))?;
        install()?;
    }
    find_libclang().map(|_| ()).ok_or_else(|| hint.into())
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
