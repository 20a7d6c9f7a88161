//! Finding and loading the NIXL runtime (`libnixl_capi.so`) before nixl-sys
//! touches it.
//!
//! nixl-sys's `stub-api` resolves every function on first use with
//! `dlopen("libnixl_capi.so")` and *aborts the process* if that fails, caching
//! the failure for the life of the process. So the runtime is located and loaded
//! here first, by absolute path and with `RTLD_GLOBAL`, after which the stub's
//! bare-name `dlopen` finds the already-loaded library (by its SONAME) and no
//! `LD_LIBRARY_PATH` is needed. nixl-sys is only called once this succeeded.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use descriptor_core::{Error, Result};

/// Environment variable naming the `libnixl_capi.so` file to load.
pub const ENV_LIBRARY: &str = "NIXL_CAPI_LIB";
/// Environment variable naming a folder holding `libnixl_capi.so`, or the
/// folder a NIXL wheel was unpacked or installed into (its site-packages).
pub const ENV_DIR: &str = "NIXL_RUNTIME_DIR";
/// The wheel a Dynamo user installs, and what the error tells others to run.
pub const PIP_PACKAGE: &str = "nixl-cu12==1.5.1";

const LIBRARY: &str = "libnixl_capi.so";
/// Where NIXL's wheels keep their libraries, inside site-packages (or an
/// unpacked wheel): `nixl-cu12`, `nixl-cu13`, and the older single `nixl`.
const WHEEL_LIBS: &[&str] = &[
    ".nixl_cu12.mesonpy.libs",
    ".nixl_cu13.mesonpy.libs",
    ".nixl.mesonpy.libs",
];
const SYSTEM_DIRS: &[&str] = &[
    "/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu",
    "/opt/nvidia/nvda_nixl/lib64",
    "/opt/nvidia/nvda_nixl/lib",
    "/usr/local/nixl/lib/x86_64-linux-gnu",
    "/usr/local/nixl/lib64",
    "/usr/local/nixl/lib",
    "/usr/local/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
];
/// How long `python3` may take to name its site-packages.
const PYTHON_TIME_LIMIT: Duration = Duration::from_secs(3);

/// The loaded runtime, or why none could be loaded (with every place tried).
static RUNTIME: OnceLock<Result<PathBuf, Unavailable>> = OnceLock::new();

struct Unavailable {
    tried: Vec<String>,
    hint: String,
}

/// Loads the NIXL runtime once per process and returns the path it came from.
///
/// Searched in order, with no setup needed for a NIXL installed by pip:
/// 1. `$NIXL_CAPI_LIB` (the file), then `$NIXL_RUNTIME_DIR` (a folder with
///    `libnixl_capi.so`, or a site-packages / unpacked wheel holding one);
/// 2. the active Python environment's site-packages: `$VIRTUAL_ENV`, then
///    `$CONDA_PREFIX` (`pip install nixl-cu12`, `nixl[cu12]` or `nixl-cu13`);
/// 3. the usual system folders, then the dynamic linker's own search
///    (`LD_LIBRARY_PATH`, `ld.so.cache`);
/// 4. only if all of that failed, the system and user site-packages of
///    `python3` (asked once, with a 3 s limit).
///
/// A missing runtime is [`Error::BackendUnavailable`] listing every place
/// tried and ending with the command that fixes it; never an abort.
pub fn load() -> Result<&'static Path> {
    load_preferring(&[])
}

/// [`load`], looking first (right after `$NIXL_CAPI_LIB` and
/// `$NIXL_RUNTIME_DIR`) in the given site-packages folders: what an embedding
/// knows and the search cannot guess, such as a Python extension's own
/// interpreter's `site.getsitepackages()`. The runtime is loaded once per
/// process: once a search ran, later calls return its outcome.
pub fn load_preferring(site_packages: &[PathBuf]) -> Result<&'static Path> {
    let loaded = RUNTIME.get_or_init(|| {
        let mut tried = Vec::new();
        let cheap = candidates(site_packages);
        if let Some(path) = first_loadable(cheap, &mut tried)? {
            return Ok(path);
        }
        let from_python = python_site_packages(&mut tried)
            .into_iter()
            .flat_map(|site| wheel_libraries(&site))
            .map(Some)
            .collect();
        if let Some(path) = first_loadable(from_python, &mut tried)? {
            return Ok(path);
        }
        Err(Unavailable {
            tried,
            hint: hint(),
        })
    });
    match loaded {
        Ok(path) => Ok(path),
        Err(unavailable) => Err(Error::BackendUnavailable {
            backend: "nixl",
            reason: format!("{LIBRARY} was not found or could not be loaded"),
            tried: unavailable.tried.clone(),
            hint: Some(unavailable.hint.clone()),
        }),
    }
}

/// The one thing to do, for this user's environment.
fn hint() -> String {
    let active = std::env::var_os("VIRTUAL_ENV").or_else(|| std::env::var_os("CONDA_PREFIX"));
    match active {
        Some(env) => format!(
            "to fix: `pip install {PIP_PACKAGE}` in the active environment ({}), or set {ENV_DIR} to the folder holding {LIBRARY}",
            PathBuf::from(env).display()
        ),
        None => format!(
            "to fix: `pip install {PIP_PACKAGE}` (into a virtualenv you activate, or for python3), or set {ENV_DIR} to the folder holding {LIBRARY}"
        ),
    }
}

/// Loads the first candidate that exists and loads; `Ok(None)` if none did.
/// `Err` if a library loaded but nixl-sys still could not bind it.
fn first_loadable(
    candidates: Vec<Option<PathBuf>>,
    tried: &mut Vec<String>,
) -> std::result::Result<Option<PathBuf>, Unavailable> {
    for candidate in candidates {
        let label = candidate.as_deref().map_or_else(
            || format!("{LIBRARY} (dynamic linker search)"),
            |p| p.display().to_string(),
        );
        if let Some(path) = &candidate
            && !path.is_file()
        {
            tried.push(format!("{label}: not found"));
            continue;
        }
        match open(candidate.as_deref()) {
            Ok(()) => {
                // Only now is it safe to call into nixl-sys: the stub's own
                // dlopen will find the library we just loaded.
                if nixl_sys::is_stub() {
                    tried.push(format!(
                        "{label}: loaded, but nixl-sys still could not resolve it"
                    ));
                    return Err(Unavailable {
                        tried: std::mem::take(tried),
                        hint: "nixl-sys could not bind the runtime it loaded: is it NIXL 1.5?"
                            .into(),
                    });
                }
                let path = candidate.unwrap_or_else(|| PathBuf::from(LIBRARY));
                tracing::info!(runtime = %path.display(), "loaded the NIXL runtime");
                return Ok(Some(path));
            }
            Err(reason) => tried.push(format!("{label}: {reason}")),
        }
    }
    Ok(None)
}

/// Candidate files in search order, but for `python3`'s own site-packages;
/// `None` is the dynamic linker's own search.
fn candidates(preferred_sites: &[PathBuf]) -> Vec<Option<PathBuf>> {
    let mut out = Vec::new();
    if let Some(file) = std::env::var_os(ENV_LIBRARY) {
        out.push(Some(PathBuf::from(file)));
    }
    if let Some(dir) = std::env::var_os(ENV_DIR) {
        let dir = PathBuf::from(dir);
        out.extend(wheel_libraries(&dir).into_iter().map(Some));
        out.push(Some(dir.join(LIBRARY)));
    }
    for site in preferred_sites {
        out.extend(wheel_libraries(site).into_iter().map(Some));
    }
    for prefix in ["VIRTUAL_ENV", "CONDA_PREFIX"].map(std::env::var_os) {
        for site in prefix
            .map(PathBuf::from)
            .map_or_else(Vec::new, |p| site_packages(&p))
        {
            out.extend(wheel_libraries(&site).into_iter().map(Some));
        }
    }
    out.extend(SYSTEM_DIRS.iter().map(|d| Some(Path::new(d).join(LIBRARY))));
    out.push(None);
    out
}

/// `libnixl_capi.so` in each NIXL wheel's library folder under `site`.
fn wheel_libraries(site: &Path) -> Vec<PathBuf> {
    WHEEL_LIBS
        .iter()
        .map(|w| site.join(w).join(LIBRARY))
        .collect()
}

/// The site-packages folders of the Python environment at `prefix`
/// (`lib/python3.*/site-packages`, and `lib64`).
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path().join("site-packages"))
            .filter(|p| p.is_dir())
            .collect();
        found.sort();
        out.extend(found);
    }
    out
}

/// Asks `python3` for its system and user site-packages, within
/// [`PYTHON_TIME_LIMIT`]; records what happened in `tried`.
fn python_site_packages(tried: &mut Vec<String>) -> Vec<PathBuf> {
    const SCRIPT: &str =
        "import site\nfor p in site.getsitepackages() + [site.getusersitepackages()]: print(p)";
    let child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            tried.push(format!("python3's site-packages: cannot run python3 ({e})"));
            return Vec::new();
        }
    };
    let deadline = Instant::now() + PYTHON_TIME_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tried.push(format!(
                    "python3's site-packages: python3 did not answer within {PYTHON_TIME_LIMIT:?}"
                ));
                return Vec::new();
            }
        }
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        use std::io::Read;
        let _ = stdout.read_to_string(&mut out);
    }
    let sites: Vec<PathBuf> = out.lines().map(PathBuf::from).collect();
    if sites.is_empty() {
        tried.push("python3's site-packages: python3 named none".into());
    }
    sites
}

/// The least severe of NIXL's own log lines that still reach stderr.
///
/// NIXL logs through Abseil; a refused request prints `E...` lines
/// (`createXferReq: ...`, `Deserialization failed`) although this crate's errors
/// already carry the reason. Set the level for the whole process with
/// [`set_log_level`] (or `NixlBackendBuilder::log_level`), or with the
/// environment variable `NIXL_LOG_LEVEL` (`TRACE` to `FATAL`), which NIXL reads
/// once, when its library is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogLevel {
    /// Information and above (NIXL's default).
    Info,
    /// Warnings and above.
    Warning,
    /// Errors and above.
    Error,
    /// Fatal messages only.
    Fatal,
    /// Nothing.
    Off,
}

/// Abseil's `SetMinLogLevel`, as exported by the Abseil the NIXL wheels ship
/// as shared libraries, one name per Abseil LTS release NIXL has used.
const ABSL_SET_MIN_LOG_LEVEL: &[&str] = &[
    "_ZN4absl12lts_2025081414SetMinLogLevelENS0_18LogSeverityAtLeastE",
    "_ZN4absl12lts_2025051214SetMinLogLevelENS0_18LogSeverityAtLeastE",
    "_ZN4absl12lts_2025012714SetMinLogLevelENS0_18LogSeverityAtLeastE",
    "_ZN4absl12lts_2024072214SetMinLogLevelENS0_18LogSeverityAtLeastE",
    "_ZN4absl12lts_2024011614SetMinLogLevelENS0_18LogSeverityAtLeastE",
];

/// Sets NIXL's log level for this process (loading the runtime first).
///
/// Works with runtimes that ship Abseil as a shared library, as the PyPI
/// wheels do; otherwise returns [`Error::Unsupported`]: set `NIXL_LOG_LEVEL`
/// in the environment before the process starts instead.
pub fn set_log_level(level: LogLevel) -> Result<()> {
    use libloading::os::unix::{Library, Symbol};
    load()?;
    // `absl::LogSeverityAtLeast`: kInfo 0, kWarning 1, kError 2, kFatal 3,
    // kInfinity 1000.
    let severity: i32 = match level {
        LogLevel::Info => 0,
        LogLevel::Warning => 1,
        LogLevel::Error => 2,
        LogLevel::Fatal => 3,
        LogLevel::Off => 1000,
    };
    let global = Library::this();
    for name in ABSL_SET_MIN_LOG_LEVEL {
        // SAFETY: the symbol, if present, is Abseil's `void
        // SetMinLogLevel(LogSeverityAtLeast)`, a free function taking one
        // `int`-sized enum, which the x86-64 and AArch64 C ABIs pass exactly as
        // an `i32` argument; the library it lives in was loaded by `load` and is
        // never unloaded, so the function pointer stays valid.
        let set: std::result::Result<Symbol<unsafe extern "C" fn(i32)>, _> =
            unsafe { global.get(name.as_bytes()) };
        if let Ok(set) = set {
            // SAFETY: see above; Abseil's setter is thread-safe (an atomic store).
            unsafe { set(severity) };
            tracing::debug!(?level, "set NIXL's log level");
            return Ok(());
        }
    }
    Err(Error::Unsupported {
        backend: "nixl",
        what: "setting the log level of this NIXL runtime (it does not export Abseil's SetMinLogLevel); set NIXL_LOG_LEVEL before the process starts".into(),
    })
}

fn open(path: Option<&Path>) -> std::result::Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let target = path.map_or_else(|| LIBRARY.as_ref(), Path::as_os_str);
    // SAFETY: loading the NIXL C API runs its (and its dependencies') static
    // initialisers; that is what any program linking NIXL does at start-up, and
    // the library is never unloaded (the handle is leaked below), so nothing
    // resolved from it can dangle.
    let library = unsafe { Library::open(Some(target), RTLD_NOW | RTLD_GLOBAL) };
    match library {
        Ok(library) => {
            std::mem::forget(library);
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}
