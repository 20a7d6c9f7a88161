//! Shared by the loopback integration tests: a loopback agent whose trait
//! methods first call a test's hook (descriptor-core's conformance
//! [`hooked`](descriptor_core::conformance::hooked) wrapper, over loopback).
#![allow(dead_code, clippy::unwrap_used)]

use backend_loopback::{Fabric, LoopbackBackend};
pub(crate) use descriptor_core::conformance::Call;
use descriptor_core::faults::{Faults, Faulty};
use descriptor_core::{Connector, Release, Result};

/// A connector over a loopback agent of `fabric` whose methods call `hook`
/// first, and the handle arming its faults.
pub(crate) fn hooked(
    fabric: &Fabric,
    name: &str,
    event_driven: bool,
    hook: impl Fn(&Faulty<LoopbackBackend>, Call) -> Option<Result<Release>> + Send + Sync + 'static,
) -> (Connector, Faults) {
    descriptor_core::conformance::hooked(
        LoopbackBackend::new(fabric, name).unwrap(),
        event_driven,
        hook,
    )
}
