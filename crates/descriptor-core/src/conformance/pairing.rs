//! Conformance checks of what the two sides of a transfer must agree on:
//! every pairing rule is checked before the backend is touched, and names
//! what is wrong; and what metadata a hostile peer forges cannot change:
//! memory the API calls read-only.

use crate::{Descriptor, Device, Error, OperationKind, RdmaMetadata, SerializedDescriptor, Side};

use super::{
    Harness, WAIT, assert_pattern, connector, descriptors, forge, pattern, returned, zeroed,
};

/// Every pairing rule is checked before the backend is touched, and names what is wrong.
pub fn pairing_errors_name_the_problem(h: &dyn Harness) {
    let server = connector(h, "pair-server");
    let client = connector(h, "pair-client");
    let readable = server
        .create_readable(descriptors(30, &[4096, 8192]))
        .unwrap();
    let writable = server.create_writable(zeroed(&[4096])).unwrap();
    let meta = readable.metadata();

    let kind = client.begin_write(zeroed(&[4096]), meta).unwrap_err();
    assert!(
        matches!(
            kind,
            Error::OperationKindMismatch {
                expected: OperationKind::Write,
                found: OperationKind::Read
            }
        ),
        "{kind:?}"
    );
    let kind = client
        .begin_read(writable.metadata(), zeroed(&[4096]))
        .unwrap_err();
    assert!(
        matches!(
            kind,
            Error::OperationKindMismatch {
                expected: OperationKind::Read,
                ..
            }
        ),
        "{kind:?}"
    );

    let count = client.begin_read(meta, zeroed(&[4096])).unwrap_err();
    assert!(
        matches!(
            count,
            Error::DescriptorCountMismatch {
                local: 1,
                remote: 2
            }
        ),
        "{count:?}"
    );

    let size = client.begin_read(meta, zeroed(&[4096, 4096])).unwrap_err();
    assert!(
        matches!(
            size,
            Error::SizeMismatch {
                index: 1,
                local: 4096,
                remote: 8192
            }
        ),
        "{size:?}"
    );
    assert!(size.to_string().contains("descriptor 1"));

    let empty = client.begin_read(meta, Vec::new()).unwrap_err();
    assert!(
        matches!(empty, Error::EmptyDescriptorList { side: Side::Local }),
        "{empty:?}"
    );

    let read_only = client
        .begin_read(
            meta,
            vec![
                Descriptor::new(vec![0u8; 4096]).unwrap(),
                Descriptor::from_bytes(bytes::Bytes::from(vec![0u8; 8192])).unwrap(),
            ],
        )
        .unwrap_err();
    assert!(
        matches!(read_only, Error::ReadOnlyBuffer { index: 1 }),
        "{read_only:?}"
    );
    let read_only = server
        .create_writable(vec![
            Descriptor::from_bytes(bytes::Bytes::from_static(b"ro")).unwrap(),
        ])
        .unwrap_err();
    assert!(
        matches!(read_only, Error::ReadOnlyBuffer { index: 0 }),
        "{read_only:?}"
    );

    // Mixed local devices: the check fires before any memory is registered or read.
    let mut fake = vec![0u8; 8192];
    // SAFETY: `fake` outlives the descriptor, which is never transferred: the
    // pairing check rejects it first.
    let cuda = unsafe {
        Descriptor::from_raw_parts(fake.as_mut_ptr(), 8192, Device::cuda(0), None).unwrap()
    };
    let mixed = client
        .begin_read(meta, vec![Descriptor::new(vec![0u8; 4096]).unwrap(), cuda])
        .unwrap_err();
    assert!(
        matches!(
            mixed,
            Error::MixedDevices {
                side: Side::Local,
                index: 1,
                ..
            }
        ),
        "{mixed:?}"
    );
    drop(fake);

    let mut remote = meta.descriptors().to_vec();
    remote[1].device = Device::cuda(0);
    let forged = RdmaMetadata::new(
        OperationKind::Read,
        remote,
        meta.agent_metadata().to_vec(),
        meta.notification_key().to_owned(),
    )
    .unwrap();
    let mixed = client
        .begin_read(&forged, zeroed(&[4096, 8192]))
        .unwrap_err();
    assert!(
        matches!(
            mixed,
            Error::MixedDevices {
                side: Side::Remote,
                index: 1,
                ..
            }
        ),
        "{mixed:?}"
    );

    // Nothing was loaded, and the readable still serves a correct read.
    assert_eq!(client.remote_agent_count(), 0);
    let read = client.begin_read(meta, zeroed(&[4096, 8192])).unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_pattern(&read.into_descriptors().unwrap(), 30, "read after errors");
}

/// Memory the API calls read-only (a [`bytes::Bytes`] whose clones safe
/// code keeps reading) never changes, whatever a peer sends: an honest READ
/// of it gets its bytes, then WRITEs that the peer forges against it all
/// leave it as it was. Forged: the readable's metadata re-kinded to WRITE,
/// the same with each descriptor's range moved and cut inside it, and a
/// WRITE aimed at a `Bytes` this connector registered only as the source
/// of its own WRITE. A backend that enforces access refuses them; one that
/// does not (NIXL) may let them land, in the private copy the core
/// registered instead
/// ([`RegistrationBackend::access_enforced`](crate::RegistrationBackend::access_enforced)).
pub fn read_only_memory_never_changes_whatever_a_peer_writes(h: &dyn Harness) {
    let server = connector(h, "ro-server");
    let client = connector(h, "ro-client");
    let sizes = [4096usize, 1, 65536];
    let originals: Vec<bytes::Bytes> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| bytes::Bytes::from(pattern(90 + i as u64, len)))
        .collect();
    let aliases = originals.clone();
    let unchanged = |what: &str| {
        for (i, alias) in aliases.iter().enumerate() {
            let expected = pattern(90 + i as u64, alias.len());
            let first = alias.iter().zip(&expected).position(|(a, b)| a != b);
            assert!(
                first.is_none(),
                "read-only bytes {i} changed after {what}, first at byte {first:?}"
            );
        }
    };
    let readable = server
        .create_readable(
            originals
                .into_iter()
                .map(|b| Descriptor::from_bytes(b).unwrap())
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let meta = readable.metadata().clone();
    let read = client.begin_read(&meta, zeroed(&sizes)).unwrap();
    read.wait_timeout(WAIT).unwrap();
    assert_pattern(
        &read.into_descriptors().unwrap(),
        90,
        "an honest READ of read-only bytes",
    );

    // A source of our own WRITE, registered and then kept registered.
    let writable = client.create_writable(zeroed(&[4096])).unwrap();
    let source = bytes::Bytes::from(pattern(99, 4096));
    let source_alias = source.clone();
    let write = server
        .begin_write(
            vec![Descriptor::from_bytes(source).unwrap()],
            writable.metadata(),
        )
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    let source = returned!(write, "the WRITE from read-only bytes");
    assert!(source[0].is_registered());
    let aimed_at_source = vec![SerializedDescriptor {
        ptr: source[0].ptr() as u64,
        size: 4096,
        ..meta.descriptors()[0]
    }];

    let mut forgeries = vec![
        (
            "the readable re-kinded to WRITE",
            meta.descriptors().to_vec(),
        ),
        (
            "a WRITE aimed at a WRITE's read-only source",
            aimed_at_source,
        ),
    ];
    for (i, d) in meta.descriptors().iter().enumerate() {
        if d.size > 2 {
            let mut moved = meta.descriptors().to_vec();
            moved[i] = SerializedDescriptor {
                ptr: d.ptr + 1,
                size: d.size - 2,
                ..*d
            };
            forgeries.push(("a re-kinded range moved inside the readable", moved));
        }
    }
    for (what, descriptors) in forgeries {
        let forged = forge(&meta, OperationKind::Write, descriptors);
        let lens: Vec<usize> = forged
            .descriptors()
            .iter()
            .map(|d| d.size as usize)
            .collect();
        let garbage: Vec<Descriptor> = lens
            .iter()
            .map(|&len| Descriptor::new(vec![0xEEu8; len]).unwrap())
            .collect();
        if let Ok(write) = client.begin_write(garbage, &forged) {
            let _ = write.wait_timeout(WAIT);
        }
        unchanged(what);
        assert!(
            source_alias
                .iter()
                .zip(pattern(99, 4096))
                .all(|(a, b)| *a == b),
            "a WRITE's read-only source changed after {what}"
        );
    }
    readable.cancel();
    drop(source);
}
