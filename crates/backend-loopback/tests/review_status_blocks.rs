//! Regression test from the review (issue "Hardening", defect 8): `status()`
//! is documented "never blocks", but it took the operation's state lock, which
//! was held across backend calls (2.7 s measured behind a `release` that
//! waited for a 512 MiB copy).
//!
//! Now no lock is held across a backend call, and `status()` is an atomic
//! read (on a passive operation, after taking a notification that arrived,
//! which waits for no other thread). Checked without timing: another thread reads the status while the
//! backend is *inside* `poll`, `release` and `revoke` for that very operation.
//! Were `status()` to wait behind any of them, the read would never return and
//! the bounded wait below would fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backend_loopback::Fabric;
use common::{Call, hooked};
use descriptor_core::conformance::{filled, zeroed_one};
use descriptor_core::faults::Faults;
use descriptor_core::{Connector, OperationStatus};

type Probe = Arc<dyn Fn(&'static str) + Send + Sync>;

/// A loopback connector that runs `probe` (once set) inside `poll`,
/// `release` and `revoke`.
fn probed(fabric: &Fabric, name: &str, probe: &Arc<Mutex<Option<Probe>>>) -> (Connector, Faults) {
    let probe = Arc::clone(probe);
    hooked(fabric, name, true, move |_, call| {
        if matches!(call, Call::Poll(_) | Call::Release(_) | Call::Revoke) {
            let probe = probe.lock().unwrap().clone();
            if let Some(probe) = probe {
                probe(call.name());
            }
        }
        None
    })
}

/// Reads `status` on another thread; panics if that read does not return
/// within 10 s (a deadlock bound, not a timing assertion).
fn status_from_another_thread(
    status: impl Fn() -> OperationStatus + Send + 'static,
) -> OperationStatus {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(status());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("status() blocked behind a backend call")
}

#[test]
fn status_never_blocks_behind_poll_release_or_revoke() {
    let fabric = Fabric::new();
    let probe: Arc<Mutex<Option<Probe>>> = Arc::default();
    let (client, faults) = probed(&fabric, "client", &probe);
    let server_probe: Arc<Mutex<Option<Probe>>> = Arc::default();
    let (server, _) = probed(&fabric, "server", &server_probe);

    // An active operation: probed in `poll` (the engine's and the waiter's),
    // then in `release` when it is cancelled.
    let readable = Arc::new(server.create_readable(filled(1, 4096)).unwrap());
    faults.delay_next_transfer(Duration::from_secs(3600));
    let read = Arc::new(
        client
            .begin_read(readable.metadata(), zeroed_one(4096))
            .unwrap(),
    );
    let seen: Arc<Mutex<Vec<(&'static str, OperationStatus)>>> = Arc::default();
    {
        let (read, seen) = (Arc::clone(&read), Arc::clone(&seen));
        *probe.lock().unwrap() = Some(Arc::new(move |call| {
            let read = Arc::clone(&read);
            let status = status_from_another_thread(move || read.status());
            seen.lock().unwrap().push((call, status));
        }));
    }
    assert!(matches!(
        read.wait_timeout(Duration::from_millis(20)),
        Err(descriptor_core::Error::TimedOut(_))
    ));
    read.cancel();
    *probe.lock().unwrap() = None; // the probe holds the operation: let go of it
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.contains(&("release", OperationStatus::Cancelled)),
        "inside release the status was already decided: {seen:?}"
    );
    assert!(seen.iter().all(|(call, status)| *call != "poll"
        || matches!(
            status,
            OperationStatus::InProgress | OperationStatus::Cancelled
        )));

    // A passive operation: probed in `revoke` when it is cancelled.
    let seen: Arc<Mutex<Vec<OperationStatus>>> = Arc::default();
    {
        let (readable, seen) = (Arc::clone(&readable), Arc::clone(&seen));
        *server_probe.lock().unwrap() = Some(Arc::new(move |_| {
            let readable = Arc::clone(&readable);
            seen.lock()
                .unwrap()
                .push(status_from_another_thread(move || readable.status()));
        }));
    }
    readable.cancel();
    *server_probe.lock().unwrap() = None;
    assert_eq!(*seen.lock().unwrap(), [OperationStatus::Cancelled]);
}
