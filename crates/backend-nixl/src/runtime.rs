//! Finding and loading the NIXL runtime (`libnixl_capi.so`) before nixl-sys
//! touches it.
//!
//! nixl-sys's `stub-api` resolves every function on first use with
//! `dlopen("libnixl_capi.so")` and *aborts the process* if that fails, caching
//! the failure for the life of the process. So the runtime is located and loaded
//! here first, by absolute path and with `RTLD_GLOBAL`, after which the stub's
//! bare-name `dlopen` finds the already-loaded library (by its SONAME) and no
//! `LD_LIBRARY_PATH` is needed. nixl-sys is only called once this succeeded.

use std::ffi::{CStr, c_char};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use descriptor_core::{Error, Result};

/// Environment variable naming the `libnixl_capi.so` file to load.
pub const ENV_LIBRARY: &str = "NIXL_CAPI_LIB";
/// Environment variable naming a folder holding `libnixl_capi.so`, or the
/// folder a NIXL wheel was unpacked or installed into (its site-packages).
pub const ENV_DIR: &str = "NIXL_RUNTIME_DIR";
/// The wheel a Dynamo user installs, and what the error tells others to run.
pub const PIP_PACKAGE: &str = "nixl-cu12==1.5.1";
/// UCX's variable naming where its log lines go (`stdout`, UCX's default;
/// `stderr`; or a file, `%p` and `%h` replaced by the process id and host).
/// Unless it is set, [`load`] sets it to `stderr`: see [`LogLevel`].
pub const ENV_UCX_LOG_FILE: &str = "UCX_LOG_FILE";
/// UCX's variable naming its log level (`fatal`, `error`, `warn`, ...).
/// Unless it is set, [`set_log_level`] sets UCX's level too: see [`LogLevel`].
pub const ENV_UCX_LOG_LEVEL: &str = "UCX_LOG_LEVEL";

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
///
/// Before the first search, this sets UCX's log defaults in the process's
/// environment, unless they are set already (see [`LogLevel`]):
/// [`ENV_UCX_LOG_FILE`] to `stderr` (UCX prints on stdout otherwise), and,
/// if [`set_log_level`] was called before, [`ENV_UCX_LOG_LEVEL`] to that
/// level. This happens once per process, before any NIXL or UCX thread
/// exists; a program that reads the environment from other threads without
/// std's lock at that moment sets both variables itself, and then nothing is
/// written.
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
        ucx_log_defaults();
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

/// The least severe of the native layer's log lines that are still printed:
/// NIXL's own, and UCX's (NIXL's transport).
///
/// NIXL logs through Abseil, on stderr; a refused request prints `E...`
/// lines (`createXferReq: ...`, `Deserialization failed`) although this
/// crate's errors already carry the reason. UCX prints its own lines
/// (`UCX  ERROR connect(...) failed: Connection refused` for a peer that
/// cannot be reached), on *stdout* by default, which corrupts a program
/// whose stdout carries data. So:
///
/// - **Where.** Unless [`ENV_UCX_LOG_FILE`] is set, [`load`] sets it to
///   `stderr` before the first agent exists: every native line goes to
///   stderr.
/// - **How many.** [`set_log_level`] (or `NixlBackendBuilder::log_level`)
///   sets NIXL's level for the whole process and, unless
///   [`ENV_UCX_LOG_LEVEL`] is set, UCX's: `Info` and `Warning` as UCX's
///   default, `warn` (UCX's `info` is debugging detail); `Error` as `error`;
///   `Fatal` and `Off` as `fatal`, UCX's quietest: its fatal lines, printed
///   just before UCX aborts the process, still reach stderr. A level set
///   before the first agent is created applies to UCX from its start; one
///   set later applies to the UCX already loaded, from then on.
/// - NIXL also reads `NIXL_LOG_LEVEL` (`TRACE` to `FATAL`) once, when its
///   library is loaded; UCX reads its variables once, when the first agent
///   loads it. A variable set before the process starts always wins.
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
    /// Nothing (UCX: fatal messages only).
    Off,
}

impl LogLevel {
    /// UCX's name of the nearest level (see [`LogLevel`]).
    fn ucx(self) -> &'static CStr {
        match self {
            LogLevel::Info | LogLevel::Warning => c"warn",
            LogLevel::Error => c"error",
            LogLevel::Fatal | LogLevel::Off => c"fatal",
        }
    }

    fn code(self) -> u8 {
        match self {
            LogLevel::Info => 1,
            LogLevel::Warning => 2,
            LogLevel::Error => 3,
            LogLevel::Fatal => 4,
            LogLevel::Off => 5,
        }
    }

    fn from_code(code: u8) -> Option<LogLevel> {
        Some(match code {
            1 => LogLevel::Info,
            2 => LogLevel::Warning,
            3 => LogLevel::Error,
            4 => LogLevel::Fatal,
            5 => LogLevel::Off,
            _ => return None,
        })
    }
}

/// The level last given to [`set_log_level`] (a [`LogLevel::code`]; 0: none).
static WANTED_LEVEL: AtomicU8 = AtomicU8::new(0);

/// Whether UCX's log level is the user's (its variable was set before this
/// crate set any), read once with the defaults.
static UCX_LEVEL_IS_USERS: OnceLock<bool> = OnceLock::new();

/// Sets UCX's log defaults in the environment (once; see [`load`]) and
/// returns whether the user set UCX's level.
fn ucx_log_defaults() -> bool {
    *UCX_LEVEL_IS_USERS.get_or_init(|| {
        let level_is_users = std::env::var_os(ENV_UCX_LOG_LEVEL).is_some();
        let mut set: Vec<(&str, &str)> = Vec::new();
        if std::env::var_os(ENV_UCX_LOG_FILE).is_none() {
            set.push((ENV_UCX_LOG_FILE, "stderr"));
        }
        let wanted = LogLevel::from_code(WANTED_LEVEL.load(Ordering::Acquire));
        if let (false, Some(level)) = (level_is_users, wanted) {
            set.push((ENV_UCX_LOG_LEVEL, level.ucx().to_str().unwrap_or("warn")));
        }
        for (key, value) in set {
            // SAFETY: `set_var` is sound while no other thread reads or
            // writes the environment outside std's lock. This runs once per
            // process, before NIXL's library is loaded (the runtime's
            // `OnceLock`), so no NIXL or UCX thread exists yet; what remains
            // is a thread of the host program calling libc's `getenv` at this
            // moment, which the documentation of `load` tells such a program
            // to avoid by setting the variables itself (nothing is written then).
            unsafe { std::env::set_var(key, value) };
            tracing::debug!(key, value, "set UCX's log default");
        }
        level_is_users
    })
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

/// Sets the native layer's log level for this process (loading the runtime
/// first): NIXL's, and UCX's unless [`ENV_UCX_LOG_LEVEL`] is set (see
/// [`LogLevel`]).
///
/// NIXL's works with runtimes that ship Abseil as a shared library, as the
/// PyPI wheels do; otherwise this returns [`Error::Unsupported`] (after
/// setting UCX's): set `NIXL_LOG_LEVEL` in the environment before the
/// process starts instead.
pub fn set_log_level(level: LogLevel) -> Result<()> {
    use libloading::os::unix::{Library, Symbol};
    WANTED_LEVEL.store(level.code(), Ordering::Release);
    load()?;
    apply_ucx_log_level();
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

/// Gives the UCX this process loaded (by a NIXL agent) the level last set
/// with [`set_log_level`], unless the user set [`ENV_UCX_LOG_LEVEL`];
/// nothing if none was set or UCX is not loaded yet. The builder calls it
/// once its agents exist (a level set between [`load`] and the first agent
/// reaches UCX then).
pub(crate) fn apply_ucx_log_level() {
    let Some(level) = LogLevel::from_code(WANTED_LEVEL.load(Ordering::Acquire)) else {
        return;
    };
    if ucx_log_defaults() || RUNTIME.get().is_none_or(|r| r.is_err()) {
        return;
    }
    let Some(ucs) = loaded_ucs() else {
        return;
    };
    // SAFETY: `ucs_status_t ucs_global_opts_set_value(const char *name,
    // const char *value)`, exported by every UCX since 1.4; `ucs_status_t`
    // is a C enum whose values (0 and small negatives) are read correctly
    // as the low byte of the return register. The library stays loaded: the
    // handle is leaked below and NIXL's plugin holds it too.
    let set: std::result::Result<
        libloading::os::unix::Symbol<unsafe extern "C" fn(*const c_char, *const c_char) -> i8>,
        _,
    > = unsafe { ucs.get(b"ucs_global_opts_set_value") };
    let Ok(set) = set else {
        tracing::debug!("this UCX does not export ucs_global_opts_set_value");
        std::mem::forget(ucs);
        return;
    };
    // SAFETY: two NUL-terminated strings that outlive the call; UCX copies
    // what it keeps. The level is one integer UCX's threads read when they
    // decide to print: the worst a concurrent reader sees is the old level.
    let status = unsafe { set(c"LOG_LEVEL".as_ptr(), level.ucx().as_ptr()) };
    std::mem::forget(ucs);
    if status == 0 {
        tracing::debug!(?level, "set UCX's log level");
    } else {
        tracing::debug!(status, "UCX refused its log level");
    }
}

/// The `libucs` this process has loaded (NIXL's UCX plugin loads it with
/// the first agent), found without loading anything: the UCX libraries of
/// the NIXL wheel beside the loaded runtime (their names carry a hash),
/// then a system UCX by its soname.
fn loaded_ucs() -> Option<libloading::os::unix::Library> {
    use libloading::os::unix::{Library, RTLD_NOW};
    /// glibc's `RTLD_NOLOAD`: open only a library already loaded.
    const RTLD_NOLOAD: std::ffi::c_int = 0x4;
    let runtime = RUNTIME.get()?.as_ref().ok()?;
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(libs) = runtime.parent() {
        let mut folders = vec![libs.to_path_buf()];
        if let Some(site) = libs.parent() {
            folders.extend(UCX_WHEEL_LIBS.iter().map(|f| site.join(f)));
        }
        for folder in folders {
            let Ok(entries) = std::fs::read_dir(&folder) else {
                continue;
            };
            let mut found: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name().is_some_and(|n| {
                        let n = n.to_string_lossy();
                        n.starts_with("libucs-") || n.starts_with("libucs.so")
                    })
                })
                .collect();
            found.sort();
            candidates.extend(found);
        }
    }
    candidates.push(PathBuf::from("libucs.so.0"));
    candidates.into_iter().find_map(|path| {
        // SAFETY: with RTLD_NOLOAD, dlopen only returns a handle on a library
        // already loaded (matched by file or soname), running no initialiser.
        unsafe { Library::open(Some(path.as_os_str()), RTLD_NOW | RTLD_NOLOAD) }.ok()
    })
}

/// Where auditwheel put the UCX libraries of NIXL's wheels, in site-packages.
const UCX_WHEEL_LIBS: &[&str] = &["nixl_cu12.libs", "nixl_cu13.libs", "nixl.libs"];

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
