//! Stops the build, with what to install, when nixl-sys's build would fail on
//! a missing libclang or C++ compiler with a panic that does not say.
#![allow(clippy::print_stderr)]

#[path = "src/check.rs"]
mod check;

fn main() {
    for var in check::WATCHED {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if std::env::var_os(check::SKIP).is_some()
        || std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os != "linux")
    {
        return;
    }
    let missing = check::missing();
    if missing.is_empty() {
        return;
    }
    eprintln!("backend-nixl cannot be built here; missing:");
    for m in &missing {
        eprintln!("  - {m}");
    }
    eprintln!("{}", check::INSTALL_HINT);
    std::process::exit(1);
}
