//! The descriptor-core conformance suite on the loopback backend: every check,
//! with its standard cases (`descriptor_core::conformance::CHECKS`), on the
//! backend itself and wrapped in `Metered` (a wrapper must change nothing a
//! connector can see).
#![allow(clippy::unwrap_used)]

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::RegistrationBackend;
use descriptor_core::conformance::{Harness, Params};
use descriptor_core::metrics::{Metered, Metrics};

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

/// Loopback agents wrapped in `Metered`, all counting into one `Metrics`.
struct MeteredLoopback {
    loopback: Loopback,
    metrics: Metrics,
}

impl MeteredLoopback {
    fn new() -> MeteredLoopback {
        MeteredLoopback {
            loopback: Loopback::new(),
            metrics: Metrics::new(),
        }
    }
}

impl Harness for MeteredLoopback {
    fn backend(&self, name: &str) -> Box<dyn RegistrationBackend> {
        let backend = LoopbackBackend::new(&self.loopback.fabric, name).unwrap();
        Box::new(Metered::new(backend, &self.metrics))
    }
}

/// Once a check is over, every transfer it posted through the meters is
/// accounted for: completed, failed or abandoned, none left in flight.
impl Drop for MeteredLoopback {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let text = self.metrics.encode_text();
        let total = |name: &str| -> f64 {
            text.lines()
                .filter(|line| line.starts_with(&format!("{name}{{")))
                .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
                .sum()
        };
        let posted = total("nixl_connect_transfers_posted_total");
        let ended = total("nixl_connect_transfers_completed_total")
            + total("nixl_connect_transfers_failed_total")
            + total("nixl_connect_transfers_abandoned_total");
        let in_flight = total("nixl_connect_transfers_in_flight");
        assert_eq!(in_flight, 0.0, "transfers left in flight:\n{text}");
        assert_eq!(posted, ended, "transfers posted but never ended:\n{text}");
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
    harnesses: {
        loopback => Loopback::new(),
        metered => MeteredLoopback::new(),
    },
    params: params(),
}
