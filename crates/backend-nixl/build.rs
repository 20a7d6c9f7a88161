//! Checks the build prerequisites of nixl-sys before its own build script
//! fails on them with a message that does not say what to install: nixl-sys
//! generates its bindings with bindgen (libclang) and compiles C++ stubs (a
//! C++ compiler). Looks where clang-sys and cc look; set
//! `BACKEND_NIXL_SKIP_PREREQUISITE_CHECK=1` to skip the check.
#![allow(clippy::print_stderr)]

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rerun-if-env-changed=BACKEND_NIXL_SKIP_PREREQUISITE_CHECK");
    println!("cargo::rerun-if-env-changed=LIBCLANG_PATH");
    println!("cargo::rerun-if-env-changed=CXX");
    if env::var_os("BACKEND_NIXL_SKIP_PREREQUISITE_CHECK").is_some()
        || env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os != "linux")
    {
        return;
    }
    let mut missing = Vec::new();
    if !libclang_found() {
        missing.push(
            "libclang (nixl-sys generates its bindings with bindgen): not found in \
             $LIBCLANG_PATH, `llvm-config --libdir`, /usr/lib*, /usr/local/lib* or $LD_LIBRARY_PATH",
        );
    }
    if !cxx_found() {
        missing.push("a C++ compiler (nixl-sys compiles its C++ stubs): no $CXX, c++, g++ or clang++ on PATH");
    }
    if missing.is_empty() {
        return;
    }
    eprintln!("backend-nixl cannot be built here; missing:");
    for m in &missing {
        eprintln!("  - {m}");
    }
    eprintln!(
        "install them:\n  Debian/Ubuntu: apt-get install libclang-dev g++\n  Fedora/RHEL:   dnf install clang-devel gcc-c++\n\
         or set LIBCLANG_PATH to the folder holding libclang.so (and CXX to your compiler).\n\
         (BACKEND_NIXL_SKIP_PREREQUISITE_CHECK=1 skips this check.)"
    );
    std::process::exit(1);
}

/// Whether a shared libclang is where clang-sys (bindgen's loader) looks.
fn libclang_found() -> bool {
    if env::var_os("LIBCLANG_PATH").is_some() || env::var_os("LIBCLANG_STATIC_PATH").is_some() {
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
    dirs.iter().any(|dir| {
        children(dir, |name| {
            let versioned = name.starts_with("libclang-") && !name.starts_with("libclang-cpp");
            (name.starts_with("libclang.so") || versioned) && name.contains(".so")
        })
        .next()
        .is_some()
    })
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
