//! Regression test from the review (issue "Hardening", defect 8): `status()`
//! is documented "never blocks", but it took the operation's state lock, which
//! was held across backend calls (2.7 s measured behind a `release` that
//! waited for a 512 MiB copy).
//!
//! Now no lock is held across a backend call, and `status()` is an atomic
//! read. Checked without timing: another thread reads the status while the
//! backend is *inside* `poll`, `release` and `revoke` for that very operation.
//! Were `status()` to wait behind any of them, the read would never return and
//! the bounded wait below would fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::conformance::{filled, zeroed_one};
use descriptor_core::{
    Connector, EventHook, Exposure, ExposureId, Notification, OperationKind, OperationStatus,
    RegionId, RegistrationBackend, Result, Segment, TransferId, TransferRequest, TransferState,
};

type Probe = Arc<dyn Fn(&'static str) + Send + Sync>;

/// Loopback, with a probe run inside `poll`, `release` and `revoke`.
struct Probed {
    inner: LoopbackBackend,
    probe: Arc<Mutex<Option<Probe>>>,
}

impl Probed {
    fn probe(&self, call: &'static str) {
        let probe = self.probe.lock().unwrap().clone();
        if let Some(probe) = probe {
            probe(call);
        }
    }
}

impl RegistrationBackend for Probed {
    fn backend_name(&self) -> &'static str {
        "probed"
    }
    fn agent_name(&self) -> &str {
        self.inner.agent_name()
    }
    unsafe fn register(&self, region: &Segment, writable: bool) -> Result<RegionId> {
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.register(region, writable) }
    }
    fn deregister(&self, region: RegionId) -> Result<()> {
        self.inner.deregister(region)
    }
    unsafe fn expose(&self, regions: &[RegionId], access: OperationKind) -> Result<Exposure> {
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.expose(regions, access) }
    }
    fn revoke(&self, exposure: ExposureId) -> Result<()> {
        self.probe("revoke");
        self.inner.revoke(exposure)
    }
    fn revocation_enforced(&self) -> bool {
        self.inner.revocation_enforced()
    }
    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        self.inner.load_remote(agent_metadata)
    }
    fn unload_remote(&self, peer: &str) -> Result<()> {
        self.inner.unload_remote(peer)
    }
    unsafe fn post(&self, request: &TransferRequest<'_>) -> Result<TransferId> {
        // SAFETY: our caller's contract is the inner backend's.
        unsafe { self.inner.post(request) }
    }
    fn poll(&self, transfer: TransferId) -> TransferState {
        self.probe("poll");
        self.inner.poll(transfer)
    }
    fn release(&self, transfer: TransferId) -> Result<bool> {
        self.probe("release");
        self.inner.release(transfer)
    }
    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()> {
        self.inner.drain_notifications(sink)
    }
    fn set_event_hook(&self, hook: EventHook) -> bool {
        self.inner.set_event_hook(hook)
    }
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
    let backend = LoopbackBackend::new(&fabric, "client").unwrap();
    let faults = backend.faults();
    let client = Connector::new(Probed {
        inner: backend,
        probe: Arc::clone(&probe),
    });
    let server_probe: Arc<Mutex<Option<Probe>>> = Arc::default();
    let server = Connector::new(Probed {
        inner: LoopbackBackend::new(&fabric, "server").unwrap(),
        probe: Arc::clone(&server_probe),
    });

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
