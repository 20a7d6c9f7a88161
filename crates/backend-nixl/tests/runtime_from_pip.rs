//! A NIXL installed by pip is found with nothing set: through the active
//! virtualenv, through `python3`'s site-packages, and, when there is none, the
//! error lists every place tried and ends with the command that fixes it.
//!
//! The runtime is looked for once per process, so each case runs this test
//! binary again as a child (`child_loads_the_runtime`) in the environment of
//! the case. The virtualenv is `target/nixl-venv`, made by `cargo xtask test`
//! (`NIXL_TEST_VENV`) with `pip install nixl-cu12==1.5.1` from the wheel the
//! other tests use; this workspace's own runtime folder is never named.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use backend_nixl::NixlBackend;
use descriptor_core::Connector;
use descriptor_core::conformance::{filled, pattern, zeroed_one};

const CHILD: &str = "NIXL_RUNTIME_PROBE_CHILD";

/// The environment of one case: what the child sees of the variables the
/// search reads, everything else inherited.
fn child(venv_env: Option<&Path>, path: &str) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_loads_the_runtime",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, "1")
    .env("PATH", path);
    for var in [
        "NIXL_RUNTIME_DIR",
        "NIXL_CAPI_LIB",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "LD_LIBRARY_PATH",
        "NIXL_PLUGIN_DIR",
    ] {
        cmd.env_remove(var);
    }
    if let Some(venv) = venv_env {
        cmd.env("VIRTUAL_ENV", venv);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.split_once("RUNTIME: ").map(|(_, said)| said))
        .unwrap_or_else(|| panic!("the child said nothing: {stdout}"))
        .to_owned()
}

fn venv() -> Option<PathBuf> {
    match std::env::var_os("NIXL_TEST_VENV") {
        Some(venv) => Some(PathBuf::from(venv)),
        None if std::env::var_os("NIXL_TESTS_REQUIRED").is_some() => {
            panic!("NIXL_TESTS_REQUIRED is set but NIXL_TEST_VENV is not")
        }
        None => {
            eprintln!("SKIPPED: no NIXL_TEST_VENV (cargo xtask test makes one)");
            None
        }
    }
}

/// PATH without any folder holding a `python3` from `venv`.
fn path_without(venv: &Path) -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|p| !Path::new(p).starts_with(venv))
        .collect::<Vec<_>>()
        .join(":")
}

#[test]
fn a_pip_installed_runtime_is_found_with_nothing_set() {
    let Some(venv) = venv() else { return };
    let venv = venv.canonicalize().unwrap();
    let bare_path = path_without(&venv);
    let in_venv = |found: &str| {
        let found = Path::new(found);
        found.starts_with(&venv)
            && found.ends_with(".nixl_cu12.mesonpy.libs/libnixl_capi.so")
            && found.components().any(|c| c.as_os_str() == "site-packages")
    };

    // The activated virtualenv.
    let found = child(Some(&venv), &bare_path);
    assert!(found.starts_with("ok "), "{found}");
    assert!(in_venv(&found[3..]), "{found}");

    // No variable at all: the `python3` first on PATH is the venv's.
    let found = child(None, &format!("{}:{bare_path}", venv.join("bin").display()));
    assert!(found.starts_with("ok "), "{found}");
    assert!(in_venv(&found[3..]), "{found}");

    // Nothing anywhere: every place is listed, and the fix comes last.
    let error = child(None, &bare_path);
    assert!(error.starts_with("error "), "{error}");
    assert!(
        error.contains("/usr/lib/x86_64-linux-gnu/libnixl_capi.so: not found"),
        "{error}"
    );
    assert!(error.contains("dynamic linker search"), "{error}");
    assert!(error.contains("python3"), "{error}");
    assert!(
        error.ends_with("`pip install nixl-cu12==1.5.1` (into a virtualenv you activate, or for python3), or set NIXL_RUNTIME_DIR to the folder holding libnixl_capi.so"),
        "{error}"
    );
}

/// Runs only as the child of the test above: loads the runtime as a
/// downstream crate would (by creating an agent), moves bytes through it, and
/// prints where it came from, or the error.
#[test]
fn child_loads_the_runtime() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    match NixlBackend::new("pip-probe") {
        Ok(backend) => {
            let server = Connector::new(backend);
            let client = Connector::new(NixlBackend::new("pip-probe-client").unwrap());
            let readable = server.create_readable(filled(3, 4096)).unwrap();
            let read = client
                .begin_read(readable.metadata(), zeroed_one(4096))
                .unwrap();
            read.wait().unwrap();
            readable.wait().unwrap();
            assert_eq!(
                read.into_descriptors().unwrap()[0].as_slice().unwrap(),
                pattern(3, 4096)
            );
            let path = backend_nixl::runtime::load().unwrap();
            println!("RUNTIME: ok {}", path.display());
        }
        Err(e) => println!("RUNTIME: error {e}"),
    }
}
