//! `Metered` over the loopback backend: what a scrape shows after READs and
//! WRITEs of known sizes, failures of each kind, and operations cancelled or
//! dropped in flight.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::conformance::{filled, forge, pattern, shifted, zeroed_one as zeroed};
use descriptor_core::faults::{Faults, Faulty};
use descriptor_core::metrics::{Metered, Metrics};
use descriptor_core::testing::openmetrics_sample;
use descriptor_core::{Connector, Descriptor, Error, OperationKind};

const LONG: Duration = Duration::from_secs(10);

/// A connector over a metered loopback agent `name` whose transfers can be
/// made to fail or stall (the faults sit inside the meter: what it counts is
/// what the connector sees), and its metrics.
fn metered(fabric: &Fabric, name: &str) -> (Connector, Metrics, Faults) {
    let metrics = Metrics::new();
    let faulty = Faulty::new(LoopbackBackend::new(fabric, name).unwrap());
    let faults = faulty.faults();
    let connector = Connector::new(Metered::new(faulty, &metrics));
    (connector, metrics, faults)
}

/// The value of `name` for the loopback backend with `labels`; every series
/// but a failure reason's exists from the start, so a missing one fails.
fn value(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut all = vec![("backend", "loopback")];
    all.extend_from_slice(labels);
    let text = metrics.encode_text();
    openmetrics_sample(&text, name, &all)
        .or_else(|| name.ends_with("failed_total").then_some(0.0))
        .unwrap_or_else(|| panic!("no sample {name} {all:?} in:\n{text}"))
}

const READ: [(&str, &str); 2] = [("op", "read"), ("target", "peer")];
const WRITE: [(&str, &str); 2] = [("op", "write"), ("target", "peer")];

fn with(
    direction: [(&'static str, &'static str); 2],
    reason: &'static str,
) -> [(&'static str, &'static str); 3] {
    [direction[0], direction[1], ("reason", reason)]
}

#[test]
fn a_scrape_counts_every_transfer_byte_and_failure_exactly() {
    let fabric = Fabric::new();
    let (server, served, _) = metered(&fabric, "server");
    let (client, metrics, faults) = metered(&fabric, "client");

    // READs of known sizes, one descriptor each.
    let sizes = [4096usize, 65536, 1];
    for (seed, &len) in sizes.iter().enumerate() {
        let readable = server.create_readable(filled(seed as u64, len)).unwrap();
        let read = client.begin_read(readable.metadata(), zeroed(len)).unwrap();
        read.wait_timeout(LONG).unwrap();
        readable.wait_timeout(LONG).unwrap();
        let got = read.into_descriptors().unwrap();
        assert_eq!(got[0].as_slice().unwrap(), pattern(seed as u64, len));
    }
    // One WRITE of three descriptors.
    let parts = [100usize, 200, 300];
    let writable = server
        .create_writable(
            parts
                .iter()
                .map(|&n| Descriptor::new(vec![0u8; n]).unwrap())
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let write = client
        .begin_write(
            parts
                .iter()
                .map(|&n| Descriptor::new(vec![9u8; n]).unwrap())
                .collect::<Vec<_>>(),
            writable.metadata(),
        )
        .unwrap();
    write.wait_timeout(LONG).unwrap();
    writable.wait_timeout(LONG).unwrap();

    // A READ the link fails (injected), and one whose forged metadata the
    // loopback refuses at posting (a range past the exposed one).
    let readable = server.create_readable(filled(7, 4096)).unwrap();
    faults.fail_next_transfer("link down");
    let failing = client
        .begin_read(readable.metadata(), zeroed(4096))
        .unwrap();
    assert!(matches!(
        failing.wait_timeout(LONG),
        Err(Error::TransferFailed { .. })
    ));
    let forged = forge(
        readable.metadata(),
        OperationKind::Read,
        shifted(readable.metadata(), 1, 4096),
    );
    let refused = client.begin_read(&forged, zeroed(4096));
    assert!(
        matches!(refused, Err(Error::AccessDenied { .. })),
        "{refused:?}"
    );
    readable.cancel();
    drop((failing, readable, write, writable));

    let read_bytes: usize = sizes.iter().sum();
    let count = |name, labels: &[(&str, &str)]| value(&metrics, name, labels);
    assert_eq!(count("nixl_connect_transfers_posted_total", &READ), 5.0);
    assert_eq!(count("nixl_connect_transfers_completed_total", &READ), 3.0);
    assert_eq!(
        count("nixl_connect_transfer_completed_bytes_total", &READ),
        read_bytes as f64
    );
    assert_eq!(
        count("nixl_connect_transfer_posted_bytes_total", &READ),
        (read_bytes + 2 * 4096) as f64
    );
    assert_eq!(
        count(
            "nixl_connect_transfers_failed_total",
            &with(READ, "transfer")
        ),
        1.0
    );
    assert_eq!(
        count(
            "nixl_connect_transfers_failed_total",
            &with(READ, "access_denied")
        ),
        1.0
    );
    assert_eq!(count("nixl_connect_transfer_descriptors_count", &READ), 5.0);
    assert_eq!(
        count("nixl_connect_transfer_duration_seconds_count", &READ),
        3.0
    );
    assert_eq!(count("nixl_connect_transfers_posted_total", &WRITE), 1.0);
    assert_eq!(count("nixl_connect_transfers_completed_total", &WRITE), 1.0);
    assert_eq!(
        count("nixl_connect_transfer_completed_bytes_total", &WRITE),
        600.0
    );
    assert_eq!(count("nixl_connect_transfer_descriptors_sum", &WRITE), 3.0);
    // Three descriptors fall in the bucket of up to 4, not in that of 2.
    let bucket = |le| [WRITE[0], WRITE[1], ("le", le)];
    assert_eq!(
        count("nixl_connect_transfer_descriptors_bucket", &bucket("2.0")),
        0.0
    );
    assert_eq!(
        count("nixl_connect_transfer_descriptors_bucket", &bucket("4.0")),
        1.0
    );
    for direction in [READ, WRITE] {
        assert_eq!(count("nixl_connect_transfers_in_flight", &direction), 0.0);
        assert_eq!(
            count("nixl_connect_transfers_abandoned_total", &direction),
            0.0
        );
    }
    // The client loaded its one peer once, and keeps it (idle peers stay).
    assert_eq!(count("nixl_connect_peers_loaded", &[]), 1.0);

    // The server: what it exposed and the notifications of the four
    // transfers that moved their bytes; every buffer deregistered once its
    // operation ended.
    let on_server = |name, labels: &[(&str, &str)]| value(&served, name, labels);
    assert_eq!(
        on_server("nixl_connect_exposures_total", &[("op", "read")]),
        4.0
    );
    assert_eq!(
        on_server("nixl_connect_exposures_total", &[("op", "write")]),
        1.0
    );
    assert_eq!(
        on_server("nixl_connect_notifications_received_total", &[]),
        4.0
    );
    assert_eq!(on_server("nixl_connect_transfers_posted_total", &READ), 0.0);
    let memory = [("kind", "memory")];
    let registered = on_server("nixl_connect_registrations_total", &memory);
    assert!(
        registered >= 5.0,
        "{registered} registrations for 5 exposures"
    );
    assert_eq!(
        on_server("nixl_connect_deregistrations_total", &memory),
        registered
    );
    assert_eq!(on_server("nixl_connect_registered_regions", &memory), 0.0);
    assert_eq!(on_server("nixl_connect_registered_bytes", &[]), 0.0);
}

#[test]
fn registered_bytes_follow_a_pool_for_its_lifetime() {
    let fabric = Fabric::new();
    let (connector, metrics, _) = metered(&fabric, "pool");
    let block = std::num::NonZeroUsize::new(4096).unwrap();
    let pool = descriptor_core::BlockPool::new(&connector, vec![0u8; 64 * 4096], block).unwrap();
    assert_eq!(
        value(&metrics, "nixl_connect_registered_bytes", &[]),
        (64 * 4096) as f64
    );
    assert_eq!(
        value(
            &metrics,
            "nixl_connect_registered_regions",
            &[("kind", "memory")]
        ),
        1.0
    );
    drop(pool);
    assert_eq!(value(&metrics, "nixl_connect_registered_bytes", &[]), 0.0);
}

#[test]
fn a_transfer_that_ends_later_is_timed_from_its_post_to_the_poll_that_saw_it() {
    let fabric = Fabric::new();
    let (server, _, _) = metered(&fabric, "server");
    let (client, metrics, faults) = metered(&fabric, "client");
    let readable = server.create_readable(filled(1, 4096)).unwrap();
    faults.delay_next_transfer(Duration::from_millis(20));
    let read = client
        .begin_read(readable.metadata(), zeroed(4096))
        .unwrap();
    assert_eq!(
        value(&metrics, "nixl_connect_transfers_in_flight", &READ),
        1.0
    );
    read.wait_timeout(LONG).unwrap();
    readable.wait_timeout(LONG).unwrap();
    let count = |name, labels: &[(&str, &str)]| value(&metrics, name, labels);
    assert_eq!(count("nixl_connect_transfers_in_flight", &READ), 0.0);
    assert_eq!(count("nixl_connect_transfers_completed_total", &READ), 1.0);
    assert_eq!(
        count("nixl_connect_transfer_duration_seconds_count", &READ),
        1.0
    );
    let seconds = count("nixl_connect_transfer_duration_seconds_sum", &READ);
    assert!((0.02..LONG.as_secs_f64()).contains(&seconds), "{seconds} s");
    // Not in a bucket below the delay.
    let bucket = |le| [READ[0], READ[1], ("le", le)];
    assert_eq!(
        count(
            "nixl_connect_transfer_duration_seconds_bucket",
            &bucket("0.01")
        ),
        0.0
    );
}

#[test]
fn cancelled_and_dropped_operations_leave_nothing_in_flight() {
    let fabric = Fabric::new();
    let (server, _, _) = metered(&fabric, "server");
    let (client, metrics, faults) = metered(&fabric, "client");
    let rounds = 500;
    for round in 0..rounds {
        let readable = server.create_readable(filled(round, 4096)).unwrap();
        let stall = faults.stall_next_transfer();
        let read = client
            .begin_read(readable.metadata(), zeroed(4096))
            .unwrap();
        assert_eq!(
            value(&metrics, "nixl_connect_transfers_in_flight", &READ),
            1.0
        );
        if round % 2 == 0 {
            read.cancel();
            assert!(matches!(read.wait_timeout(LONG), Err(Error::Cancelled)));
            assert!(read.wait_released(LONG));
        } else {
            drop(read);
        }
        drop(stall);
        readable.cancel();
    }
    descriptor_core::testing::eventually("every abandoned transfer is released", || {
        value(&metrics, "nixl_connect_transfers_abandoned_total", &READ) == rounds as f64
    });
    let count = |name| value(&metrics, name, &READ);
    assert_eq!(count("nixl_connect_transfers_in_flight"), 0.0);
    assert_eq!(count("nixl_connect_transfers_posted_total"), rounds as f64);
    assert_eq!(count("nixl_connect_transfers_completed_total"), 0.0);
    assert_eq!(count("nixl_connect_transfer_completed_bytes_total"), 0.0);
}
