//! What nixl-sys's build needs, looked for where clang-sys and cc look. Pure
//! of output so that the crate's unit tests can call it; `build.rs` reports.

use std::env;
use std::path::{Path, PathBuf};

/// The variables whose change reruns the check.
pub(crate) const WATCHED: &[&str] = &[SKIP, "LIBCLANG_PATH", "LIBCLANG_STATIC_PATH", "CXX"];

/// Set (to anything) to skip the check.
pub(crate) const SKIP: &str = "BACKEND_NIXL_SKIP_PREREQUISITE_CHECK";

/// What to do about anything [`missing`] names.
pub(crate) const INSTALL_HINT: &str = "install them:\n  \
    Debian/Ubuntu: apt-get install libclang-dev g++\n  \
    Fedora/RHEL:   dnf install clang-devel gcc-c++\n\
    or set LIBCLANG_PATH to the folder holding libclang.so (and CXX to your compiler).\n\
    (BACKEND_NIXL_SKIP_PREREQUISITE_CHECK=1 skips this check.)";

/// The prerequisites this machine lacks, one line each (empty: none).
pub(crate) fn missing() -> Vec<String> {
    let mut missing = Vec::new();
    match env::var_os("LIBCLANG_PATH") {
        // clang-sys looks only where LIBCLANG_PATH points when it is set, so a
        // path without libclang ends in bindgen's panic: say so first.
        Some(path) if env::var_os("LIBCLANG_STATIC_PATH").is_none() => {
            missing.extend(libclang_path_problem(Path::new(&path)));
        }
        _ => {
            if !libclang_found() {
                missing.push(
                    "libclang (nixl-sys generates its bindings with bindgen): not found in \
                     `llvm-config --libdir`, /usr/lib*, /usr/local/lib* or $LD_LIBRARY_PATH \
                     (LIBCLANG_PATH is not set)"
                        .to_owned(),
                );
            }
        }
    }
    if !cxx_found() {
        missing.push(
            "a C++ compiler (nixl-sys compiles its C++ stubs): no $CXX, c++, g++ or clang++ on PATH"
                .to_owned(),
        );
    }
    missing
}

/// What is wrong with `path` as a `LIBCLANG_PATH` (clang-sys takes the folder
/// holding libclang or the library file itself), or `None` if it names one.
pub(crate) fn libclang_path_problem(path: &Path) -> Option<String> {
    let holds = if path.is_file() {
        path.file_name()
            .is_some_and(|name| is_libclang(&name.to_string_lossy()))
    } else {
        children(path, is_libclang).next().is_some()
    };
    (!holds).then(|| {
        format!(
            "libclang (nixl-sys generates its bindings with bindgen): LIBCLANG_PATH={} \
             {}",
            path.display(),
            if path.is_file() {
                "is not a libclang.so* or libclang-*.so*"
            } else if path.is_dir() {
                "holds no libclang.so* or libclang-*.so*"
            } else {
                "does not exist"
            }
        )
    })
}

/// Whether a file name is a shared libclang as clang-sys searches for it
/// (`libclang.so`, `libclang.so.18`, `libclang-18.so`, ...; not libclang-cpp).
pub(crate) fn is_libclang(name: &str) -> bool {
    let versioned = name.starts_with("libclang-") && !name.starts_with("libclang-cpp");
    (name.starts_with("libclang.so") || versioned) && name.contains(".so")
}

/// Whether a shared libclang is where clang-sys (bindgen's loader) looks
/// when `LIBCLANG_PATH` is not set.
fn libclang_found() -> bool {
    if env::var_os("LIBCLANG_STATIC_PATH").is_some() {
        return true;
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(libdir) = llvm_libdir() {
        dirs.push(libdir);
    }
    if let Some(paths) = env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(env::split_paths(&paths));
    }
    for root in ["/usr", "/usr/local"] {
        for lib in children(Path::new(root), |n| n.starts_with("lib")) {
            dirs.push(lib.clone());
            for sub in children(&lib, |_| true) {
                dirs.push(sub.join("lib"));
                dirs.push(sub.clone());
                dirs.extend(children(&sub, |_| true));
            }
        }
        dirs.extend(children(Path::new(root), |n| n.starts_with("llvm")).map(|d| d.join("lib")));
    }
    dirs.iter()
        .any(|dir| children(dir, is_libclang).next().is_some())
}

fn llvm_libdir() -> Option<PathBuf> {
    let llvm_config = env::var_os("LLVM_CONFIG_PATH").unwrap_or_else(|| "llvm-config".into());
    let out = std::process::Command::new(llvm_config)
        .arg("--libdir")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn cxx_found() -> bool {
    if env::var_os("CXX").is_some() {
        return true;
    }
    let Some(path) = env::var_os("PATH") else {
        return false;
    };
    env::split_paths(&path).any(|dir| {
        ["c++", "g++", "clang++"]
            .iter()
            .any(|cxx| dir.join(cxx).is_file())
    })
}

/// Entries of `dir` whose file name passes `keep` (none if it is unreadable).
fn children(dir: &Path, keep: impl Fn(&str) -> bool) -> impl Iterator<Item = PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(move |e| keep(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
}
