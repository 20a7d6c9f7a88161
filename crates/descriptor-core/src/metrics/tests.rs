//! `Metered` over a stub backend called directly: what it forwards, what it
//! counts, and that nothing it keeps grows with transfers it never saw end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use rstest::rstest;

use super::*;
use crate::device::Device;
use crate::testing::openmetrics_sample;
use crate::{FileSpan, PeerTarget};

/// A backend that answers every defaulted method differently from the
/// default, and whose transfers run until the test says how they end.
struct Stub {
    next: AtomicU64,
    /// What `poll` answers.
    poll: Mutex<TransferState>,
    /// Whether `post` refuses, and with what.
    refuse: Mutex<Option<Error>>,
    awaited: AtomicUsize,
    hooked: AtomicBool,
}

impl Stub {
    fn new() -> Stub {
        Stub {
            next: AtomicU64::new(1),
            poll: Mutex::new(TransferState::InProgress),
            refuse: Mutex::new(None),
            awaited: AtomicUsize::new(0),
            hooked: AtomicBool::new(false),
        }
    }

    fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

impl RegistrationBackend for Stub {
    fn backend_name(&self) -> &'static str {
        "stub"
    }
    fn agent_name(&self) -> &str {
        "stub-agent"
    }
    unsafe fn register(&self, _region: &Segment, writable: bool) -> Result<RegionId> {
        if !writable {
            return Err(Error::backend("stub", "register", "read-only refused"));
        }
        Ok(RegionId(self.id()))
    }
    fn deregister(&self, _region: RegionId) -> Result<()> {
        Ok(())
    }
    unsafe fn register_file(&self, _fd: BorrowedFd<'_>, _writable: bool) -> Result<RegionId> {
        Ok(RegionId(self.id()))
    }
    unsafe fn expose(
        &self,
        _ranges: &[Exposed],
        _access: OperationKind,
        _key: &[u8],
    ) -> Result<Exposure> {
        Ok(Exposure {
            id: ExposureId(self.id()),
            agent_metadata: b"stub blob".to_vec(),
        })
    }
    fn revoke(&self, _exposure: ExposureId) -> Result<()> {
        Ok(())
    }
    fn revocation_enforced(&self) -> bool {
        true
    }
    fn access_enforced(&self) -> bool {
        true
    }
    fn load_remote(&self, agent_metadata: &[u8]) -> Result<String> {
        Ok(String::from_utf8_lossy(agent_metadata).into_owned())
    }
    fn unload_remote(&self, _peer: &str) -> Result<()> {
        Ok(())
    }
    fn peer_name(&self, _agent_metadata: &[u8]) -> Option<String> {
        Some("named by the stub".into())
    }
    unsafe fn post(&self, _request: &TransferRequest<'_>) -> Result<Posted> {
        if let Some(error) = self.refuse.lock().unwrap().take() {
            return Err(error);
        }
        Ok(Posted::running(TransferId(self.id())))
    }
    fn poll(&self, _transfer: TransferId) -> TransferState {
        self.poll.lock().unwrap().clone()
    }
    fn release(&self, _transfer: TransferId) -> Result<Release> {
        Ok(Release::StillRunning)
    }
    fn drain_notifications(&self, sink: &mut dyn FnMut(Notification)) -> Result<()> {
        for key in [&b"one"[..], b"two"] {
            sink(Notification {
                from: Arc::from("peer"),
                payload: Arc::from(key),
                exposure: None,
            });
        }
        Ok(())
    }
    fn wait_assist(&self) -> Duration {
        Duration::from_millis(7)
    }
    fn awaiting_end(&self, _transfer: TransferId) {
        self.awaited.fetch_add(1, Ordering::SeqCst);
    }
    fn warm_up(&self, peer: &str) -> Result<()> {
        Err(Error::backend(
            "stub",
            "warm up",
            format!("no route to {peer}"),
        ))
    }
    fn set_event_hook(&self, _hook: EventHook) -> bool {
        self.hooked.store(true, Ordering::SeqCst);
        true
    }
}

fn metered() -> Metered<Stub> {
    Metered::new(Stub::new(), &Metrics::new())
}

/// A sample of `metered`'s text for the stub backend. Every series but a
/// failure reason's exists from the start, so a missing one fails.
fn value(metered: &Metered<Stub>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut all = vec![("backend", "stub")];
    all.extend_from_slice(labels);
    let text = metered.metrics().encode_text();
    openmetrics_sample(&text, name, &all)
        .or_else(|| name.ends_with("failed_total").then_some(0.0))
        .unwrap_or_else(|| panic!("no sample {name} {all:?} in:\n{text}"))
}

const HOST_SEGMENT: Segment = Segment {
    addr: 0x1000,
    len: 4096,
    device: Device::HOST,
};

/// Posts a READ from a peer of `segments` local segments of 4 KiB.
fn post_read(metered: &Metered<Stub>, segments: usize) -> Result<Posted> {
    let local = vec![HOST_SEGMENT; segments];
    let regions = vec![RegionId(0); segments];
    let request = TransferRequest {
        op: OperationKind::Read,
        local: &local,
        local_regions: &regions,
        target: Target::Peer(PeerTarget {
            peer: "peer",
            remote: &local,
            notification: b"key",
            notify: true,
        }),
    };
    // SAFETY: the stub touches no memory.
    unsafe { metered.post(&request) }
}

#[test]
fn every_method_is_forwarded_the_defaulted_ones_too() {
    let metered = metered();
    assert_eq!(metered.backend_name(), "stub");
    assert_eq!(metered.agent_name(), "stub-agent");
    assert!(metered.revocation_enforced());
    assert!(metered.access_enforced());
    assert_eq!(
        metered.peer_name(b"x").as_deref(),
        Some("named by the stub")
    );
    assert_eq!(metered.wait_assist(), Duration::from_millis(7));
    metered.awaiting_end(TransferId(3));
    assert_eq!(metered.inner().awaited.load(Ordering::SeqCst), 1);
    let warm = metered.warm_up("p").unwrap_err().to_string();
    assert!(warm.contains("no route to p"), "{warm}");
    assert!(metered.set_event_hook(Arc::new(|| {})));
    assert!(metered.inner().hooked.load(Ordering::SeqCst));
    let file = std::fs::File::open("/dev/null").unwrap();
    // SAFETY: `file` outlives the registration's use here (none).
    let region = unsafe { metered.register_file(std::os::fd::AsFd::as_fd(&file), false) };
    assert!(
        region.is_ok(),
        "register_file was not forwarded: {region:?}"
    );
    let posted = post_read(&metered, 1).unwrap();
    assert_eq!(metered.release(posted.id).unwrap(), Release::StillRunning);
    let mut got = Vec::new();
    metered
        .drain_notifications(&mut |n| got.push(n.payload))
        .unwrap();
    assert_eq!(got, [Arc::from(&b"one"[..]), Arc::from(&b"two"[..])]);
}

#[test]
fn transfers_are_counted_by_how_they_end() {
    let metered = metered();
    // Two that complete, seen by a poll: 1 and 3 descriptors of 4 KiB.
    let done = [
        post_read(&metered, 1).unwrap(),
        post_read(&metered, 3).unwrap(),
    ];
    // One that fails, one abandoned, one refused at posting.
    let failing = post_read(&metered, 2).unwrap();
    let abandoned = post_read(&metered, 1).unwrap();
    *metered.inner().refuse.lock().unwrap() = Some(Error::AccessDenied {
        backend: "stub",
        peer: "peer".into(),
        reason: "unknown".into(),
    });
    assert!(post_read(&metered, 1).is_err());
    assert_eq!((metered.pending.entries(), metered.pending.len()), (4, 4));

    let d = [("op", "read"), ("target", "peer")];
    assert_eq!(value(&metered, "nixl_connect_transfers_in_flight", &d), 4.0);
    assert!(metered.poll(done[0].id).is_in_progress());
    *metered.inner().poll.lock().unwrap() = TransferState::Done;
    for p in &done {
        assert!(matches!(metered.poll(p.id), TransferState::Done));
        // A second poll of an ended transfer counts nothing more.
        assert!(matches!(metered.poll(p.id), TransferState::Done));
    }
    *metered.inner().poll.lock().unwrap() = TransferState::failed("link down");
    assert!(matches!(metered.poll(failing.id), TransferState::Failed(_)));
    for p in [&done[0], &done[1], &failing, &abandoned] {
        metered.release(p.id).unwrap();
        metered.release(p.id).unwrap();
    }

    assert_eq!((metered.pending.entries(), metered.pending.len()), (0, 0));
    let count = |name| value(&metered, name, &d);
    assert_eq!(count("nixl_connect_transfers_posted_total"), 5.0);
    assert_eq!(count("nixl_connect_transfers_completed_total"), 2.0);
    assert_eq!(count("nixl_connect_transfers_abandoned_total"), 1.0);
    assert_eq!(count("nixl_connect_transfers_in_flight"), 0.0);
    assert_eq!(
        count("nixl_connect_transfer_posted_bytes_total"),
        (8 * 4096) as f64
    );
    assert_eq!(
        count("nixl_connect_transfer_completed_bytes_total"),
        (4 * 4096) as f64
    );
    assert_eq!(count("nixl_connect_transfer_descriptors_count"), 5.0);
    assert_eq!(count("nixl_connect_transfer_descriptors_sum"), 8.0);
    assert_eq!(count("nixl_connect_transfer_duration_seconds_count"), 2.0);
    let failed = |reason| {
        value(
            &metered,
            "nixl_connect_transfers_failed_total",
            &[d[0], d[1], ("reason", reason)],
        )
    };
    assert_eq!(failed("transfer"), 1.0);
    assert_eq!(failed("access_denied"), 1.0);
    // The other directions were not touched, and show as zero.
    let other = [("op", "write"), ("target", "file")];
    assert_eq!(
        openmetrics_sample(
            &metered.metrics().encode_text(),
            "nixl_connect_transfers_posted_total",
            &[("backend", "stub"), other[0], other[1]],
        ),
        Some(0.0)
    );
}

#[test]
fn abandoned_transfers_leave_nothing_behind() {
    let metered = metered();
    for round in 0..10_000 {
        let posted = post_read(&metered, 1).unwrap();
        if round % 2 == 0 {
            // Polled while running, then abandoned.
            assert!(metered.poll(posted.id).is_in_progress());
        }
        metered.release(posted.id).unwrap();
        assert_eq!(metered.pending.entries(), 0, "round {round}");
        assert_eq!(metered.pending.len(), 0, "round {round}");
    }
    let d = [("op", "read"), ("target", "peer")];
    assert_eq!(
        value(&metered, "nixl_connect_transfers_abandoned_total", &d),
        10_000.0
    );
    assert_eq!(value(&metered, "nixl_connect_transfers_in_flight", &d), 0.0);
}

#[test]
fn registrations_peers_exposures_and_notifications_are_counted() {
    let metered = metered();
    let segment = |len| Segment {
        len,
        ..HOST_SEGMENT
    };
    // SAFETY: the stub touches no memory.
    let (a, b) = unsafe {
        (
            metered.register(&segment(4096), true).unwrap(),
            metered.register(&segment(1 << 20), true).unwrap(),
        )
    };
    // SAFETY: as above.
    assert!(unsafe { metered.register(&segment(64), false) }.is_err());
    let memory = [("kind", "memory")];
    assert_eq!(
        value(&metered, "nixl_connect_registered_bytes", &[]),
        1_052_672.0
    );
    assert_eq!(
        value(&metered, "nixl_connect_registered_regions", &memory),
        2.0
    );
    metered.deregister(a).unwrap();
    assert_eq!(
        value(&metered, "nixl_connect_registered_bytes", &[]),
        (1 << 20) as f64
    );
    metered.deregister(b).unwrap();
    // An unknown region changes nothing.
    metered.deregister(RegionId(999)).unwrap();
    assert_eq!(
        value(&metered, "nixl_connect_registrations_total", &memory),
        2.0
    );
    assert_eq!(
        value(
            &metered,
            "nixl_connect_registration_failures_total",
            &memory
        ),
        1.0
    );
    assert_eq!(
        value(&metered, "nixl_connect_deregistrations_total", &memory),
        2.0
    );
    assert_eq!(
        value(&metered, "nixl_connect_registered_regions", &memory),
        0.0
    );
    assert_eq!(value(&metered, "nixl_connect_registered_bytes", &[]), 0.0);
    assert!(metered.regions.lock().unwrap().is_empty());

    for blob in [&b"alpha"[..], b"beta", b"alpha"] {
        metered.load_remote(blob).unwrap();
    }
    assert_eq!(value(&metered, "nixl_connect_peers_loaded", &[]), 2.0);
    metered.unload_remote("alpha").unwrap();
    metered.unload_remote("never loaded").unwrap();
    assert_eq!(value(&metered, "nixl_connect_peers_loaded", &[]), 1.0);
    assert_eq!(value(&metered, "nixl_connect_peer_loads_total", &[]), 3.0);
    assert_eq!(value(&metered, "nixl_connect_peer_unloads_total", &[]), 2.0);

    let range = Exposed {
        region: a,
        segment: HOST_SEGMENT,
    };
    for access in [
        OperationKind::Read,
        OperationKind::Write,
        OperationKind::Write,
    ] {
        // SAFETY: the stub touches no memory.
        let exposure = unsafe { metered.expose(&[range], access, b"key") }.unwrap();
        metered.revoke(exposure.id).unwrap();
    }
    assert_eq!(
        value(&metered, "nixl_connect_exposures_total", &[("op", "write")]),
        2.0
    );
    assert_eq!(value(&metered, "nixl_connect_revocations_total", &[]), 3.0);

    metered.drain_notifications(&mut |_| {}).unwrap();
    metered.drain_notifications(&mut |_| {}).unwrap();
    assert_eq!(
        value(&metered, "nixl_connect_notifications_received_total", &[]),
        4.0
    );
}

#[test]
fn file_transfers_and_registrations_have_their_own_series() {
    let metered = metered();
    let file = std::fs::File::open("/dev/null").unwrap();
    // SAFETY: the stub touches no file.
    let region = unsafe { metered.register_file(std::os::fd::AsFd::as_fd(&file), true) }.unwrap();
    let local = [HOST_SEGMENT];
    let spans = [FileSpan {
        region,
        fd: 3,
        offset: 0,
        len: 4096,
    }];
    let request = TransferRequest {
        op: OperationKind::Write,
        local: &local,
        local_regions: &[RegionId(0)],
        target: Target::File(&spans),
    };
    // SAFETY: the stub touches no memory.
    let posted = unsafe { metered.post(&request) }.unwrap();
    *metered.inner().poll.lock().unwrap() = TransferState::failed(Error::backend(
        "stub",
        "pwrite",
        std::io::Error::from_raw_os_error(libc::ENOSPC),
    ));
    assert!(matches!(metered.poll(posted.id), TransferState::Failed(_)));
    metered.deregister(region).unwrap();
    let f = [("op", "write"), ("target", "file")];
    assert_eq!(
        value(&metered, "nixl_connect_transfers_posted_total", &f),
        1.0
    );
    assert_eq!(
        value(
            &metered,
            "nixl_connect_transfers_failed_total",
            &[f[0], f[1], ("reason", "io")]
        ),
        1.0
    );
    let kind = [("kind", "file")];
    assert_eq!(
        value(&metered, "nixl_connect_registrations_total", &kind),
        1.0
    );
    assert_eq!(
        value(&metered, "nixl_connect_deregistrations_total", &kind),
        1.0
    );
    assert_eq!(value(&metered, "nixl_connect_registered_bytes", &[]), 0.0);
}

#[rstest]
#[case::a_peer_that_refused(Error::AccessDenied { backend: "b", peer: "p".into(), reason: "r".into() }, "access_denied")]
#[case::no_storage(Error::Unsupported { backend: "b", what: "files".into() }, "unsupported")]
#[case::a_missing_runtime(Error::BackendUnavailable { backend: "b", reason: "r".into(), tried: vec![], hint: None }, "unavailable")]
#[case::a_read_past_the_end(Error::PastEndOfFile { index: 0, end: 10, file_len: 5 }, "invalid_request")]
#[case::an_os_error(
    Error::backend("b", "pread", std::io::Error::from_raw_os_error(libc::EIO)),
    "io"
)]
#[case::a_backend_message(Error::backend("b", "post", "status -3"), "backend")]
#[case::a_shared_transfer_failure(Error::TransferFailed { source: Arc::new(std::io::Error::from_raw_os_error(libc::EIO)) }, "io")]
#[case::a_cancelled_wait(Error::Cancelled, "other")]
fn failure_reasons_are_a_closed_set(#[case] error: Error, #[case] expected: &str) {
    assert_eq!(reason(&error), expected);
    assert!(REASONS.contains(&expected));
    let cause: SharedCause = Arc::new(error);
    assert_eq!(cause_reason(&cause), expected);
}

#[test]
fn a_plain_message_from_the_transport_is_a_transfer_failure() {
    let TransferState::Failed(cause) = TransferState::failed("UCX: endpoint timeout") else {
        unreachable!()
    };
    assert_eq!(cause_reason(&cause), "transfer");
}

#[test]
fn the_text_names_units_and_ends_in_eof() {
    let metrics = Metrics::new();
    let _metered = Metered::new(Stub::new(), &metrics);
    let text = metrics.encode_text();
    for line in [
        "# TYPE nixl_connect_transfers_posted counter",
        "# TYPE nixl_connect_transfer_duration_seconds histogram",
        "# UNIT nixl_connect_transfer_duration_seconds seconds",
        "# UNIT nixl_connect_transfer_posted_bytes bytes",
        "# TYPE nixl_connect_registered_bytes gauge",
        "nixl_connect_transfer_duration_seconds_bucket{le=\"0.000005\",backend=\"stub\",op=\"read\",target=\"peer\"} 0",
    ] {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn a_registry_of_ones_own_shows_the_same_series() {
    let metrics = Metrics::new();
    let metered = Metered::new(Stub::new(), &metrics);
    let mut registry = Registry::with_prefix("app");
    metrics.register_into(&mut registry);
    let posted = post_read(&metered, 1).unwrap();
    metered.release(posted.id).unwrap();
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    let labels = [("backend", "stub"), ("op", "read"), ("target", "peer")];
    assert_eq!(
        openmetrics_sample(&text, "app_nixl_connect_transfers_posted_total", &labels),
        Some(1.0)
    );
    assert_eq!(
        openmetrics_sample(
            &metrics.encode_text(),
            "nixl_connect_transfers_posted_total",
            &labels
        ),
        Some(1.0)
    );
}
