//! Loading the NIXL runtime for Python, the same way from every entry point
//! ([`load`]), and the missing-runtime `ImportError` a Python user reads: the
//! fix first, then each place searched once.
//!
//! `backend_nixl::runtime` reports every candidate file it tried (three NIXL
//! wheel folders per site-packages, the same site often reached twice: from
//! this interpreter and from `python3`), which is what a Rust caller debugging
//! the search wants; a Python user wants the command to run.

use std::path::{Path, PathBuf};

use backend_nixl::runtime::{ENV_DIR, PIP_PACKAGE};
use pyo3::prelude::*;

use crate::error;

/// Loads the NIXL runtime (once per process) and returns its path: first in
/// `site_packages`, then where `backend_nixl::runtime::load` looks.
/// `site_packages` is what `nixl_connect._search_paths()` names (the running
/// interpreter's `sys.path`, then its site-packages); given `None`, this asks
/// that function itself, so that every entry point of the native module that
/// loads the runtime (a NIXL connector, `set_nixl_log_level`, `nixl_runtime`)
/// looks in the same places, whichever comes first. `ImportError` listing
/// every place looked in, and what to run, if there is none.
pub(crate) fn load(py: Python<'_>, site_packages: Option<Vec<PathBuf>>) -> PyResult<&'static Path> {
    let site_packages = match site_packages {
        Some(given) => given,
        None => search_paths(py)?,
    };
    crate::exit::detach(py, || {
        backend_nixl::runtime::load_preferring(&site_packages)
    })
    .map_err(error::to_py)
}

/// `nixl_connect._search_paths()`.
fn search_paths(py: Python<'_>) -> PyResult<Vec<PathBuf>> {
    py.import("nixl_connect")?
        .getattr("_search_paths")?
        .call0()?
        .extract()
}

/// The library the search looks for.
const LIBRARY: &str = "libnixl_capi.so";
/// What the dynamic linker's attempt is labelled with in `tried`.
const LINKER_LABEL: &str = "libnixl_capi.so (dynamic linker search)";

/// The `ImportError` text for `BackendUnavailable { tried, hint, .. }` of the
/// NIXL runtime search (its `reason`, "not found or could not be loaded", is
/// said more precisely from `tried`).
pub(crate) fn missing_runtime_message(tried: &[String], hint: Option<&str>) -> String {
    let mut places: Vec<String> = Vec::new();
    let mut failures: Vec<&str> = Vec::new();
    let mut notes: Vec<&str> = Vec::new();
    for entry in tried {
        if let Some(path) = entry.strip_suffix(": not found") {
            push_once(&mut places, place_of(path));
        } else if let Some(why) = entry.strip_prefix(LINKER_LABEL) {
            if why.contains("No such file or directory") {
                push_once(&mut places, "the dynamic linker's search".to_owned());
            } else {
                failures.push(entry);
            }
        } else if entry.starts_with('/') {
            // A file that exists but did not load: its reason matters.
            failures.push(entry);
        } else {
            notes.push(entry);
        }
    }
    // The search's own hint tells a Rust user to pip-install the wheel; a
    // Python user has the command that installs it without torch. Any other
    // hint (the runtime loaded but could not be bound) is the fix itself.
    let fix = match hint {
        Some(hint) if !hint.contains("pip install") => hint.to_owned(),
        _ => format!(
            "To fix: python -m nixl_connect install-runtime (pip install --no-deps {PIP_PACKAGE}), \
             or set {ENV_DIR} to the folder holding {LIBRARY}."
        ),
    };
    let what = if failures.is_empty() {
        "not found"
    } else {
        "could not be loaded"
    };
    let mut message = format!("NIXL runtime ({LIBRARY}) {what}. {fix}");
    if !places.is_empty() {
        message.push_str(&format!(
            "\nSearched (site-packages for NIXL wheels, folders for the library): {}.",
            places.join(", ")
        ));
    }
    if !failures.is_empty() {
        message.push_str(&format!("\nCould not load: {}.", failures.join("; ")));
    }
    if !notes.is_empty() {
        message.push_str(&format!("\nAlso: {}.", notes.join("; ")));
    }
    message
}

/// The folder a candidate file stands for: the site-packages (or unpacked
/// wheel) for a wheel's library folder, else the library's folder.
fn place_of(path: &str) -> String {
    let path = std::path::Path::new(path);
    if path.file_name().is_none_or(|name| name != LIBRARY) {
        return path.display().to_string();
    }
    let Some(folder) = path.parent() else {
        return path.display().to_string();
    };
    let in_wheel = folder.file_name().is_some_and(|name| {
        let name = name.to_string_lossy();
        name.starts_with(".nixl") && name.ends_with(".mesonpy.libs")
    });
    match folder.parent() {
        Some(site) if in_wheel => site.display().to_string(),
        _ => folder.display().to_string(),
    }
}

fn push_once(places: &mut Vec<String>, place: String) {
    if !places.contains(&place) {
        places.push(place);
    }
}
