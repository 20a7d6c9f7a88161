//! The descriptor-core conformance suite on the loopback backend: every check,
//! with its standard cases (`descriptor_core::conformance::CHECKS`).
#![allow(clippy::unwrap_used)]

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::RegistrationBackend;
use descriptor_core::conformance::{Harness, Params};

struct Loopback {
    fabric: Fabric,
}

impl Loopback {
    fn new() -> Loopback {
        Loopback {
            fabric: Fabric::new(),
        }
    }
}

impl Harness for Loopback {
    fn backend(&self, name: &str) -> Box<dyn RegistrationBackend> {
        Box::new(LoopbackBackend::new(&self.fabric, name).unwrap())
    }
}

/// The load check runs 16 x 1,000 operations by default; 16 x 10,000 with
/// `RELIABILITY_LONG` set (`cargo xtask test --long`).
fn params() -> Params {
    let long = std::env::var_os("RELIABILITY_LONG").is_some();
    Params {
        load_per_thread: if long { 10_000 } else { 1_000 },
        ..Params::default()
    }
}

descriptor_core::conformance_suite! {
    harnesses: { loopback => Loopback::new() },
    params: params(),
}
