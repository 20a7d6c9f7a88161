//! `NixlBackendBuilder::notifications`: under either setting, READs and
//! WRITEs in both directions move the bytes and the passive side sees its
//! notification; with `Apart`, past the proving route too (several rounds).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use backend_nixl::{NixlBackend, Notifications};
use descriptor_core::Connector;
use descriptor_core::conformance::{filled, pattern, zeroed_one};
use rstest::rstest;
use test_support::runtime_available;

const WAIT: Duration = Duration::from_secs(20);
/// Enough rounds that `Apart` leaves the proving route (its first success).
const ROUNDS: u64 = 3;

fn connector(role: &str, notifications: Notifications) -> Connector {
    let name = format!("notif-{notifications:?}-{role}-{}", std::process::id());
    let backend = NixlBackend::builder(&name)
        .notifications(notifications)
        .build()
        .unwrap();
    Connector::new(backend)
}

/// `reader` READs from `owner`'s readable.
fn read(reader: &Connector, owner: &Connector, seed: u64, len: usize) {
    let readable = owner.create_readable(filled(seed, len)).unwrap();
    let read = reader
        .begin_read(readable.metadata(), zeroed_one(len))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    // The passive side's operation completes only on its notification.
    readable.wait_timeout(WAIT).unwrap();
    let got = read.into_descriptors().unwrap();
    assert_eq!(got[0].as_slice().unwrap(), pattern(seed, len));
}

/// `writer` WRITEs into `owner`'s writable.
fn write(writer: &Connector, owner: &Connector, seed: u64, len: usize) {
    let writable = owner.create_writable(zeroed_one(len)).unwrap();
    let write = writer
        .begin_write(filled(seed, len), writable.metadata())
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    let got = writable.into_descriptors().unwrap();
    assert_eq!(got[0].as_slice().unwrap(), pattern(seed, len));
}

#[rstest]
fn reads_and_writes_both_ways_notify_the_passive_side(
    #[values(Notifications::Attached, Notifications::Apart)] notifications: Notifications,
    #[values(4096, 1 << 20)] len: usize,
) {
    if !runtime_available() {
        return;
    }
    let tag = format!("{len}");
    let a = connector(&format!("a{tag}"), notifications);
    let b = connector(&format!("b{tag}"), notifications);
    for round in 0..ROUNDS {
        let seed = round * 10;
        read(&a, &b, seed + 1, len);
        read(&b, &a, seed + 2, len);
        write(&a, &b, seed + 3, len);
        write(&b, &a, seed + 4, len);
    }
}

#[rstest]
fn with_one_agent_either_setting_moves_bytes_and_notifies(
    #[values(Notifications::Attached, Notifications::Apart)] notifications: Notifications,
) {
    if !runtime_available() {
        return;
    }
    let one_agent = |role: &str| {
        let name = format!("notif1-{notifications:?}-{role}-{}", std::process::id());
        let backend = NixlBackend::builder(&name)
            .progress_thread(false)
            .notifications(notifications)
            .build()
            .unwrap();
        Connector::new(backend)
    };
    let (a, b) = (one_agent("a"), one_agent("b"));
    for round in 0..ROUNDS {
        read(&a, &b, round + 1, 4096);
        write(&b, &a, round + 2, 4096);
    }
}
