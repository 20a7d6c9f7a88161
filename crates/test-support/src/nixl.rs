//! The NIXL runtime gate, connectors for the NIXL tests, and the conformance
//! harness over NIXL.
#![allow(clippy::print_stderr)]

use std::sync::atomic::{AtomicUsize, Ordering};

use backend_nixl::{MetadataScope, NixlBackend};
use descriptor_core::conformance::Harness;
use descriptor_core::{Connector, RegistrationBackend};

/// True when the NIXL runtime is loaded. Without it a test is skipped with a
/// message, unless `NIXL_TESTS_REQUIRED` is set (as `cargo xtask test` does):
/// then a missing runtime fails the test.
pub fn runtime_available() -> bool {
    match backend_nixl::runtime::load() {
        Ok(_) => true,
        Err(e) if std::env::var_os("NIXL_TESTS_REQUIRED").is_some() => {
            panic!("NIXL_TESTS_REQUIRED is set but the runtime is unavailable: {e}")
        }
        Err(e) => {
            eprintln!(
                "SKIPPED: NIXL runtime unavailable ({e}); run `cargo xtask test` to provision it"
            );
            false
        }
    }
}

/// A connector over a NIXL agent named `{role}-{detect}-{pid}`, with
/// peer-failure detection `detect` (UCX's error handling mode) and the other
/// settings the defaults.
pub fn nixl_connector(role: &str, detect: bool) -> Connector {
    let name = format!("{role}-{detect}-{}", std::process::id());
    let backend = NixlBackend::builder(&name)
        .peer_failure_detection(detect)
        .build()
        .unwrap_or_else(|e| panic!("NIXL agent {name}: {e}"));
    Connector::new(backend)
}

/// Makes NIXL agents with names unique in the process.
pub struct Nixl {
    prefix: String,
    scope: MetadataScope,
}

impl Nixl {
    /// Agents publishing metadata of `scope`.
    pub fn new(scope: MetadataScope) -> Nixl {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Nixl {
            prefix: format!(
                "t{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            scope,
        }
    }
}

impl Harness for Nixl {
    fn backend(&self, name: &str) -> Box<dyn RegistrationBackend> {
        let backend = NixlBackend::builder(&format!("{}-{name}", self.prefix))
            .metadata_scope(self.scope)
            .build()
            .unwrap();
        Box::new(backend)
    }
}
