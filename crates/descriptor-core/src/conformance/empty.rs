//! Conformance checks of empty descriptors (zero bytes), as Dynamo 1.6.1
//! moves them: an empty tensor is registered, published with `size: 0`, and
//! its READ or WRITE completes on both sides. A backend registers, exposes
//! and moves a zero-length range like any other (a peer's zero-length
//! descriptor must lie in a registration, as NIXL checks), and a transfer of
//! nothing but empty descriptors still carries its notification, which is
//! how the passive side learns that it completed.

use bytes::{Bytes, BytesMut};

use super::{Harness, WAIT, connector, pattern};
use crate::{Descriptor, Error, OperationStatus};

/// What the checks describe, by kind of empty memory or by size.
#[derive(Clone, Copy)]
enum Part {
    /// An empty `Vec`: a dangling, non-null address.
    EmptyVec,
    /// An empty `Bytes` (read-only) on the side that is read or writes.
    EmptyBytes,
    /// A view of `n` bytes whose size is set to 0 (a partial length of 0).
    SizedToZero(usize),
    /// `n` pattern bytes.
    Full(usize),
}

impl Part {
    fn size(self) -> usize {
        match self {
            Part::Full(n) => n,
            _ => 0,
        }
    }
}

/// A descriptor for `part`: pattern bytes of seed `seed` (sources), or
/// zeros (`None`: destinations, always writable).
fn describe(part: Part, seed: Option<u64>) -> Descriptor {
    let made = match (part, seed) {
        (Part::EmptyVec, _) => Descriptor::new(Vec::<u8>::new()),
        (Part::EmptyBytes, Some(_)) => Descriptor::from_bytes(Bytes::new()),
        (Part::EmptyBytes, None) => Descriptor::new(BytesMut::new()),
        (Part::SizedToZero(n), seed) => {
            let bytes = seed.map_or_else(|| vec![0u8; n], |s| pattern(s, n));
            Descriptor::new(bytes).and_then(|mut d| d.set_size(0).map(|()| d))
        }
        (Part::Full(n), Some(s)) => Descriptor::new(pattern(s, n)),
        (Part::Full(n), None) => Descriptor::new(vec![0u8; n]),
    };
    made.unwrap()
}

fn sources(parts: &[Part], seed: u64) -> Vec<Descriptor> {
    parts
        .iter()
        .enumerate()
        .map(|(i, &p)| describe(p, Some(seed + i as u64)))
        .collect()
}

fn destinations(parts: &[Part]) -> Vec<Descriptor> {
    parts.iter().map(|&p| describe(p, None)).collect()
}

/// Descriptor `i` of `got` holds pattern `seed + i` over its size (nothing
/// for an empty one), and a view sized to zero kept every byte it had:
/// `before` (zeros on the receiving side, the pattern on the sending one).
fn check(got: &[Descriptor], parts: &[Part], seed: u64, receiving: bool, what: &str) {
    assert_eq!(got.len(), parts.len(), "{what}: descriptors came back");
    for (i, (d, &part)) in got.iter().zip(parts).enumerate() {
        assert_eq!(d.size(), part.size(), "{what}: size of descriptor {i}");
        let full = d.as_full_slice().unwrap();
        let expected = match part {
            Part::SizedToZero(n) if receiving => vec![0u8; n],
            Part::SizedToZero(n) => pattern(seed + i as u64, n),
            _ => pattern(seed + i as u64, part.size()),
        };
        if full != expected.as_slice() {
            let first = full.iter().zip(&expected).position(|(a, b)| a != b);
            panic!(
                "{what}: descriptor {i} differs from the expected bytes, first at byte {first:?}"
            );
        }
    }
}

/// Empty descriptors move like any other, as Dynamo's do: READs and WRITEs
/// of only empty descriptors (one, several) and of lists mixing them with
/// full ones (empty `Vec`s, empty `Bytes`, views sized to 0) complete on
/// both sides, the passive side by the peer's notification; the metadata
/// publishes size 0 and a non-null address; the non-empty parts arrive byte
/// for byte and a view sized to 0 is left untouched; a fitted READ of a
/// peer's empty descriptor into a larger one moves nothing into it; and an
/// empty descriptor still pairs only with an empty one.
pub fn empty_descriptors_move_like_any_other(h: &dyn Harness) {
    let server = connector(h, "empty-server");
    let client = connector(h, "empty-client");
    let lists: [&[Part]; 4] = [
        &[Part::EmptyVec],
        &[Part::EmptyVec, Part::EmptyBytes, Part::SizedToZero(64)],
        &[
            Part::EmptyVec,
            Part::Full(4096),
            Part::EmptyBytes,
            Part::Full(1),
            Part::SizedToZero(128),
            Part::Full(65536),
        ],
        &[Part::Full(3), Part::EmptyVec],
    ];
    for (n, parts) in lists.iter().enumerate() {
        let seed = 400 + 10 * n as u64;
        let readable = server.create_readable(sources(parts, seed)).unwrap();
        let published: Vec<u64> = readable
            .metadata()
            .descriptors()
            .iter()
            .map(|d| d.size)
            .collect();
        let sizes: Vec<u64> = parts.iter().map(|p| p.size() as u64).collect();
        assert_eq!(published, sizes, "list {n}: published sizes");
        assert!(
            readable.metadata().descriptors().iter().all(|d| d.ptr != 0),
            "list {n}: a published address is never null"
        );
        let read = client
            .begin_read(readable.metadata(), destinations(parts))
            .unwrap();
        read.wait_timeout(WAIT).unwrap();
        readable.wait_timeout(WAIT).unwrap();
        assert_eq!(
            (read.status(), readable.status()),
            (OperationStatus::Complete, OperationStatus::Complete),
            "list {n}: READ and readable"
        );
        check(
            &read.into_descriptors().unwrap(),
            parts,
            seed,
            true,
            &format!("list {n}: read"),
        );
        check(
            &readable.into_descriptors().unwrap(),
            parts,
            seed,
            false,
            &format!("list {n}: readable"),
        );

        let seed = seed + 5;
        let writable = server.create_writable(destinations(parts)).unwrap();
        let write = client
            .begin_write(sources(parts, seed), writable.metadata())
            .unwrap();
        write.wait_timeout(WAIT).unwrap();
        writable.wait_timeout(WAIT).unwrap();
        assert_eq!(
            (write.status(), writable.status()),
            (OperationStatus::Complete, OperationStatus::Complete),
            "list {n}: WRITE and writable"
        );
        check(
            &writable.into_descriptors().unwrap(),
            parts,
            seed,
            true,
            &format!("list {n}: written"),
        );
        check(
            &write.into_descriptors().unwrap(),
            parts,
            seed,
            false,
            &format!("list {n}: write source"),
        );
    }

    // A fitted READ of an empty descriptor into a larger one moves nothing.
    let readable = server
        .create_readable(vec![
            Descriptor::new(Vec::<u8>::new()).unwrap(),
            Descriptor::new(pattern(470, 100)).unwrap(),
        ])
        .unwrap();
    let read = client
        .begin_read_fit(
            readable.metadata(),
            vec![
                Descriptor::new(vec![0xA5u8; 64]).unwrap(),
                Descriptor::new(vec![0u8; 256]).unwrap(),
            ],
        )
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    let got = read.into_descriptors().unwrap();
    assert_eq!((got[0].size(), got[1].size()), (0, 100), "fitted sizes");
    assert!(
        got[0].as_full_slice().unwrap().iter().all(|&b| b == 0xA5),
        "fitted: the empty pair wrote nothing"
    );
    assert_eq!(
        got[1].as_slice().unwrap(),
        pattern(470, 100).as_slice(),
        "fitted: the full pair's bytes"
    );
    assert!(
        got[1].as_full_slice().unwrap()[100..]
            .iter()
            .all(|&b| b == 0),
        "fitted: nothing past the size"
    );
    drop(readable.into_descriptors());

    // Sizes still pair exactly: empty with empty only.
    let readable = server
        .create_readable(vec![Descriptor::new(Vec::<u8>::new()).unwrap()])
        .unwrap();
    let mismatch = client
        .begin_read(
            readable.metadata(),
            vec![Descriptor::new(vec![0u8; 8]).unwrap()],
        )
        .unwrap_err();
    assert!(
        matches!(
            mismatch,
            Error::SizeMismatch {
                index: 0,
                local: 8,
                remote: 0
            }
        ),
        "{mismatch:?}"
    );
    let full = server
        .create_readable(vec![Descriptor::new(pattern(480, 8)).unwrap()])
        .unwrap();
    let mismatch = client
        .begin_read(
            full.metadata(),
            vec![Descriptor::new(Vec::<u8>::new()).unwrap()],
        )
        .unwrap_err();
    assert!(
        matches!(
            mismatch,
            Error::SizeMismatch {
                index: 0,
                local: 0,
                remote: 8
            }
        ),
        "{mismatch:?}"
    );
    readable.cancel();
    full.cancel();
}
