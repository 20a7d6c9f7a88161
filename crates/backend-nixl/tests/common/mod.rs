//! Shared by the NIXL integration tests: the runtime gate and a harness.
#![allow(dead_code, clippy::unwrap_used, clippy::panic, clippy::print_stderr)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backend_nixl::{MetadataScope, NixlBackend};
use descriptor_core::Connector;
use descriptor_core::conformance::Harness;

/// True when the NIXL runtime is loaded. Without it a test is skipped with a
/// message, unless `NIXL_TESTS_REQUIRED` is set (as `cargo xtask test` does):
/// then a missing runtime fails the test.
pub(crate) fn runtime_available() -> bool {
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

/// Makes NIXL connectors with names unique in the process.
pub(crate) struct Nixl {
    prefix: String,
    scope: MetadataScope,
}

impl Nixl {
    pub(crate) fn new(scope: MetadataScope) -> Nixl {
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
    fn connector(&self, name: &str) -> Connector {
        let backend = NixlBackend::builder(&format!("{}-{name}", self.prefix))
            .metadata_scope(self.scope)
            .build()
            .unwrap();
        Connector::new(backend)
    }

    fn delay_next_transfer(&self, _name: &str, _delay: Duration) -> bool {
        false
    }
}
