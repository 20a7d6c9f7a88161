//! NIXL prints `E...` lines on stderr for every refused request; the
//! builder's `log_level` quiets them. The log level is process-wide, so each
//! case runs this test binary again as a child and reads its stderr.
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stdout)]

use std::process::Command;

use backend_nixl::{LogLevel, NixlBackend};
use descriptor_core::conformance::{filled, forge, shifted, zeroed_one};
use descriptor_core::{Connector, Error, OperationKind};
use test_support::runtime_available;

const CHILD: &str = "NIXL_LOG_LEVEL_CHILD";

/// The child's stderr, after one refused request with `level` (or NIXL's default).
fn stderr_of_a_refused_request(level: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["child_makes_a_refused_request", "--exact", "--nocapture"])
        .env(CHILD, level)
        .env_remove("NIXL_LOG_LEVEL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("REFUSED"),
        "child failed: {stdout}"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn log_level_off_silences_nixls_error_lines() {
    if !runtime_available() {
        return;
    }
    let noisy = stderr_of_a_refused_request("default");
    assert!(
        noisy.contains("createXferReq"),
        "NIXL's default prints the refusal: {noisy}"
    );
    let quiet = stderr_of_a_refused_request("off");
    assert!(!quiet.contains("createXferReq"), "{quiet}");
}

/// Runs only as the child of the test above.
#[test]
fn child_makes_a_refused_request() {
    let Ok(level) = std::env::var(CHILD) else {
        return;
    };
    let name = |role: &str| format!("log-{role}-{}", std::process::id());
    let mut builder = NixlBackend::builder(&name("server"));
    if level == "off" {
        builder = builder.log_level(LogLevel::Off);
    }
    let server = Connector::new(builder.build().unwrap());
    let client = Connector::new(NixlBackend::new(&name("client")).unwrap());
    let writable = server.create_writable(zeroed_one(4096)).unwrap();
    // One byte past the exposed region: NIXL refuses it (and logs why).
    let forged = forge(
        writable.metadata(),
        OperationKind::Write,
        shifted(writable.metadata(), 4096, 4096),
    );
    match client.begin_write(filled(1, 4096), &forged) {
        Err(Error::AccessDenied { .. }) => println!("REFUSED"),
        other => panic!("not refused: {other:?}"),
    }
}
