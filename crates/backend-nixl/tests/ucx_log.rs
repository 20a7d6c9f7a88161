//! UCX prints its log lines on stdout by default; this crate sends them to
//! stderr (`UCX_LOG_FILE=stderr` when the runtime is first loaded, unless it
//! is set) and gives UCX the level of `log_level` / `set_log_level` (unless
//! `UCX_LOG_LEVEL` is set). UCX reads its variables once per process, so
//! each case runs this test binary again as a child.
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stdout)]

use std::process::Command;

use backend_nixl::{LogLevel, NixlBackend};
use descriptor_core::conformance::{filled, forge, shifted, zeroed_one};
use descriptor_core::{Connector, Error, OperationKind};
use test_support::runtime_available;

const CHILD: &str = "NIXL_UCX_LOG_CHILD";

/// The child's stdout, after a refused request with `LogLevel::Off`, and
/// with the environment `env` (UCX's log variables otherwise unset).
fn stdout_of_the_child(env: &[(&str, &str)]) -> String {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["child_reports_ucx_log_variables", "--exact", "--nocapture"])
        .env(CHILD, "1")
        .env_remove("UCX_LOG_FILE")
        .env_remove("UCX_LOG_LEVEL")
        .env_remove("NIXL_LOG_LEVEL");
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("REFUSED"),
        "child failed: {stdout}"
    );
    stdout
}

#[test]
fn ucx_logs_to_stderr_at_the_level_set() {
    if !runtime_available() {
        return;
    }
    let stdout = stdout_of_the_child(&[]);
    assert!(stdout.contains("UCX_LOG_FILE=stderr\n"), "{stdout}");
    assert!(stdout.contains("UCX_LOG_LEVEL=fatal\n"), "{stdout}");
    assert!(!stdout.contains("UCX  "), "a UCX line on stdout: {stdout}");
}

#[test]
fn the_users_ucx_log_variables_win() {
    if !runtime_available() {
        return;
    }
    let stdout = stdout_of_the_child(&[("UCX_LOG_FILE", "/dev/null"), ("UCX_LOG_LEVEL", "error")]);
    assert!(stdout.contains("UCX_LOG_FILE=/dev/null\n"), "{stdout}");
    assert!(stdout.contains("UCX_LOG_LEVEL=error\n"), "{stdout}");
}

/// Runs only as the child of the tests above.
#[test]
fn child_reports_ucx_log_variables() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let name = |role: &str| format!("ucx-log-{role}-{}", std::process::id());
    let builder = NixlBackend::builder(&name("server")).log_level(LogLevel::Off);
    let server = Connector::new(builder.build().unwrap());
    let client = Connector::new(NixlBackend::new(&name("client")).unwrap());
    let writable = server.create_writable(zeroed_one(4096)).unwrap();
    let forged = forge(
        writable.metadata(),
        OperationKind::Write,
        shifted(writable.metadata(), 4096, 4096),
    );
    match client.begin_write(filled(1, 4096), &forged) {
        Err(Error::AccessDenied { .. }) => println!("REFUSED"),
        other => panic!("not refused: {other:?}"),
    }
    for key in ["UCX_LOG_FILE", "UCX_LOG_LEVEL"] {
        println!("{key}={}", std::env::var(key).unwrap_or_default());
    }
}
