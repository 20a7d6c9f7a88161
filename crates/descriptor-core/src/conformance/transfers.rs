//! Conformance checks that bytes move exactly: a READ of a readable and a
//! WRITE into a writable, of one or many blocks of any size, and through
//! metadata that went through JSON; registering with one connector, and
//! refusing another.

use crate::{
    Descriptor, Error, OperationKind, OperationStatus, RdmaMetadata, SerializedDescriptor,
};

use super::{Harness, WAIT, assert_pattern, connector, descriptors, pattern, zeroed};

/// `register_memory` twice with one connector is a no-op; with another it fails.
pub fn registration_is_idempotent_per_connector(h: &dyn Harness) {
    let a = connector(h, "reg-a");
    let b = connector(h, "reg-b");
    let mut d = Descriptor::new(pattern(1, 4096)).unwrap();
    assert!(!d.is_registered());
    d.register_memory(&a).unwrap();
    d.register_memory(&a).unwrap();
    assert!(d.is_registered());
    match d.register_memory(&b) {
        Err(Error::RegisteredElsewhere {
            registered,
            requested,
        }) => assert_eq!(
            (registered.as_str(), requested.as_str()),
            (a.name(), b.name())
        ),
        other => panic!("registering with a second connector gave {other:?}"),
    }
    // A registered descriptor works in an operation of its own connector.
    let readable = a.create_readable(vec![d]).unwrap();
    let read = b.begin_read(readable.metadata(), zeroed(&[4096])).unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_pattern(&read.into_descriptors().unwrap(), 1, "read back");
    let d = readable.into_descriptors().unwrap().remove(0);
    assert!(d.is_registered(), "descriptors come back still registered");
    assert_eq!(d.into_vec::<u8>().unwrap(), pattern(1, 4096));
}

/// A readable exposes bytes; `begin_read` copies them exactly; both sides complete.
pub fn readable_then_read_moves_bytes(h: &dyn Harness, sizes: &[usize]) {
    let server = connector(h, "read-server");
    let client = connector(h, "read-client");
    let readable = server.create_readable(descriptors(10, sizes)).unwrap();
    assert_eq!(readable.status(), OperationStatus::Initialized);
    assert_eq!(readable.metadata().operation_kind(), OperationKind::Read);
    assert_eq!(readable.metadata().descriptors().len(), sizes.len());
    let read = client
        .begin_read(readable.metadata(), zeroed(sizes))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    assert_eq!(read.status(), OperationStatus::Complete);
    readable.wait_timeout(WAIT).unwrap();
    assert_eq!(readable.status(), OperationStatus::Complete);
    assert_pattern(&read.into_descriptors().unwrap(), 10, "read data");
    assert_pattern(
        &readable.into_descriptors().unwrap(),
        10,
        "source after read",
    );
    assert_eq!(client.remote_agent_count(), 0);
}

/// A writable exposes a buffer; `begin_write` fills it exactly; both sides complete.
pub fn writable_then_write_moves_bytes(h: &dyn Harness, sizes: &[usize]) {
    let server = connector(h, "write-server");
    let client = connector(h, "write-client");
    let writable = server.create_writable(zeroed(sizes)).unwrap();
    assert_eq!(writable.metadata().operation_kind(), OperationKind::Write);
    let write = client
        .begin_write(descriptors(20, sizes), writable.metadata())
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    assert_eq!(
        (write.status(), writable.status()),
        (OperationStatus::Complete, OperationStatus::Complete)
    );
    assert_pattern(&writable.into_descriptors().unwrap(), 20, "written data");
    assert_pattern(&write.into_descriptors().unwrap(), 20, "source after write");
    assert_eq!(client.remote_agent_count(), 0);
}

/// Metadata survives JSON both ways, and parsed metadata drives a real transfer.
pub fn metadata_round_trips_through_json(h: &dyn Harness) {
    let server = connector(h, "json-server");
    let client = connector(h, "json-client");
    let writable = server.create_writable(zeroed(&[4096, 100])).unwrap();
    let json = writable.metadata().to_json();
    assert!(json.contains(r#""nixl_metadata":"b64:"#), "{json}");
    assert!(json.contains(r#""operation_kind":2"#));
    let parsed: RdmaMetadata = json.parse().unwrap();
    assert_eq!(&parsed, writable.metadata());
    assert_eq!(parsed.to_json(), json);
    let expected: Vec<SerializedDescriptor> = parsed.descriptors().to_vec();
    assert_eq!(
        expected.iter().map(|d| d.size).collect::<Vec<_>>(),
        [4096, 100]
    );
    let write = client
        .begin_write(descriptors(80, &[4096, 100]), &parsed)
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    let received = writable.into_descriptors().unwrap();
    assert_eq!(
        received.iter().map(|d| d.ptr() as u64).collect::<Vec<_>>(),
        expected.iter().map(|d| d.ptr).collect::<Vec<_>>(),
        "the metadata named the very buffers that were written"
    );
    assert_pattern(&received, 80, "write through parsed metadata");
}
