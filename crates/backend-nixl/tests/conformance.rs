//! The descriptor-core conformance suite on real NIXL (UCX, DRAM): every
//! check, with its standard cases (`descriptor_core::conformance::CHECKS`),
//! once with Dynamo-style full agent metadata (`agent::`) and once with
//! exposure-scoped metadata (`exposed::`).
#![allow(clippy::unwrap_used)]

use backend_nixl::MetadataScope;
use descriptor_core::conformance::Params;
use test_support::{Nixl, runtime_available};

/// Smaller than loopback's: four threads of load, a thousand race rounds.
fn params() -> Params {
    Params {
        load_threads: 4,
        load_per_thread: 1000,
        race_rounds: 1000,
        ..Params::default()
    }
}

descriptor_core::conformance_suite! {
    harnesses: {
        agent => Nixl::new(MetadataScope::Agent),
        exposed => Nixl::new(MetadataScope::Exposed),
    },
    skip_unless: runtime_available(),
    params: params(),
}
