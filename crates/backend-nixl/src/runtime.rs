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
use std::sync::OnceLock;

use descriptor_core::{Error, Result};

/// Environment variable naming the `libnixl_capi.so` file to load.
pub const ENV_LIBRARY: &str = "NIXL_CAPI_LIB";
/// Environment variable naming a folder holding `libnixl_capi.so` (or a wheel
/// unpacked by `cargo xtask nixl-runtime`).
pub const ENV_DIR: &str = "NIXL_RUNTIME_DIR";

const LIBRARY: &str = "libnixl_capi.so";
/// Where the `nixl-cu12` wheel keeps its libraries, relative to the unpacked wheel.
const WHEEL_LIBS: &str = ".nixl_cu12.mesonpy.libs";
/// The folder `cargo xtask nixl-runtime` fills, in this workspace.
const WORKSPACE_RUNTIME: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../target/nixl-runtime/nixl-cu12-1.5.1"
);
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

/// The loaded runtime, or why none could be loaded (with every place tried).
static RUNTIME: OnceLock<Result<PathBuf, (String, Vec<String>)>> = OnceLock::new();

/// Loads the NIXL runtime once per process and returns the path it came from.
///
/// Searched in order: `$NIXL_CAPI_LIB`; `$NIXL_RUNTIME_DIR` (and its
/// `.nixl_cu12.mesonpy.libs`); this workspace's `target/nixl-runtime`; the usual
/// system folders; finally the dynamic linker's own search (`LD_LIBRARY_PATH`,
/// `ld.so.cache`). A missing runtime is [`Error::BackendUnavailable`], never an abort.
pub fn load() -> Result<&'static Path> {
    let loaded = RUNTIME.get_or_init(|| {
        let mut tried = Vec::new();
        for candidate in candidates() {
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
                        return Err(("nixl-sys could not bind the runtime".into(), tried));
                    }
                    let path = candidate.unwrap_or_else(|| PathBuf::from(LIBRARY));
                    tracing::info!(runtime = %path.display(), "loaded the NIXL runtime");
                    return Ok(path);
                }
                Err(reason) => tried.push(format!("{label}: {reason}")),
            }
        }
        Err((
            format!("{LIBRARY} was not found or could not be loaded"),
            tried,
        ))
    });
    match loaded {
        Ok(path) => Ok(path),
        Err((reason, tried)) => Err(Error::BackendUnavailable {
            backend: "nixl",
            reason: format!(
                "{reason} (set {ENV_LIBRARY} or {ENV_DIR}, or run `cargo xtask nixl-runtime`)"
            ),
            tried: tried.clone(),
        }),
    }
}

/// Candidate files in search order; `None` is the dynamic linker's own search.
fn candidates() -> Vec<Option<PathBuf>> {
    let mut out = Vec::new();
    if let Some(file) = std::env::var_os(ENV_LIBRARY) {
        out.push(Some(PathBuf::from(file)));
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os(ENV_DIR) {
        let dir = PathBuf::from(dir);
        dirs.push(dir.join(WHEEL_LIBS));
        dirs.push(dir);
    }
    dirs.push(Path::new(WORKSPACE_RUNTIME).join(WHEEL_LIBS));
    dirs.extend(SYSTEM_DIRS.iter().map(PathBuf::from));
    out.extend(dirs.into_iter().map(|d| Some(d.join(LIBRARY))));
    out.push(None);
    out
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
