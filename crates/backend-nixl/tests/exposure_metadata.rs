//! An exposure's agent metadata in the default scope (`MetadataScope::Agent`,
//! NIXL's own one-blob format) lists only the regions that hold its ranges:
//! its size does not depend on what the agent registered, or leaked, before
//! (issue 48, item 2), and a peer reaches every byte through it, across many
//! operations in a row (the peer merges successive blobs of one agent).
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use backend_nixl::MetadataScope;
use descriptor_core::conformance::{Harness, filled, pattern, zeroed_one};
use descriptor_core::{Connector, Descriptor, RdmaMetadata};
use test_support::{Nixl, runtime_available};

const WAIT: Duration = Duration::from_secs(30);
const LEN: usize = 4096;

/// One region of a blob: address, length, device.
type Region = (u64, u64, u64);

/// What a test needs of NIXL's `nixlSerDes` agent blob: the agent name, the
/// connection infos' backends, and every region of every section. Panics on
/// anything that is not that format (this crate's two-part blob included).
struct Parsed {
    name: String,
    conns: Vec<String>,
    regions: Vec<Region>,
}

fn parse(blob: &[u8]) -> Parsed {
    let mut at = b"nixlSerDes|".len();
    assert_eq!(&blob[..at], b"nixlSerDes|", "not NIXL's format");
    let mut entry = |tag: &[u8]| -> Vec<u8> {
        assert_eq!(&blob[at..at + tag.len()], tag, "tag at byte {at}");
        at += tag.len();
        let len = u64::from_le_bytes(blob[at..at + 8].try_into().unwrap());
        let len = usize::try_from(len).unwrap();
        at += 8;
        let payload = blob[at..at + len].to_vec();
        at += len;
        assert_eq!(blob[at], b'|');
        at += 1;
        payload
    };
    let count = |bytes: Vec<u8>| u64::from_le_bytes(bytes.try_into().unwrap());
    let name = String::from_utf8(entry(b"Agent")).unwrap();
    let mut conns = Vec::new();
    for _ in 0..count(entry(b"Conns")) {
        conns.push(String::from_utf8(entry(b"t")).unwrap());
        entry(b"c");
    }
    assert_eq!(entry(b""), b"MemSection");
    let mut regions = Vec::new();
    for _ in 0..count(entry(b"nixlSecElms")) {
        entry(b"bknd");
        entry(b"nixlDList");
        entry(b"t");
        for _ in 0..count(entry(b"n")) {
            let desc = entry(b"");
            let word = |i: usize| u64::from_le_bytes(desc[i * 8..i * 8 + 8].try_into().unwrap());
            regions.push((word(0), word(1), word(2)));
        }
    }
    assert_eq!(at, blob.len(), "bytes after the last section");
    Parsed {
        name,
        conns,
        regions,
    }
}

/// The regions `meta`'s descriptors name, as (address, length).
fn named(meta: &RdmaMetadata) -> Vec<(u64, u64)> {
    meta.descriptors().iter().map(|d| (d.ptr, d.size)).collect()
}

/// Reads `meta` (a readable of `pattern(seed, LEN)`) from `client` and
/// checks every byte.
fn read_all(client: &Connector, meta: &RdmaMetadata, seed: u64) {
    let read = client.begin_read(meta, zeroed_one(LEN)).unwrap();
    read.wait_timeout(WAIT).unwrap();
    assert_eq!(
        read.into_descriptors().unwrap()[0].as_slice().unwrap(),
        pattern(seed, LEN).as_slice()
    );
}

#[test]
fn an_exposures_blob_lists_only_its_regions_and_does_not_grow_with_abandoned_ones() {
    if !runtime_available() {
        return;
    }
    let h = Nixl::new(MetadataScope::Agent);
    let (server, client) = (
        Connector::new(h.backend("server")),
        Connector::new(h.backend("client")),
    );
    let first = server.create_readable(filled(1, LEN)).unwrap();
    let blob = first.metadata().agent_metadata().to_vec();
    let parsed = parse(&blob);
    assert!(parsed.name.ends_with("-server"), "{}", parsed.name);
    assert_eq!(parsed.conns, ["UCX"]);
    let regions: Vec<(u64, u64)> = parsed.regions.iter().map(|&(a, l, _)| (a, l)).collect();
    assert_eq!(regions, named(first.metadata()));
    read_all(&client, first.metadata(), 1);
    first.wait_timeout(WAIT).unwrap();

    // 200 readables abandoned: NIXL cannot revoke, so each stays registered
    // with the serving agent for its quarantine's window (decision 0014),
    // and none of them travels with a later exposure.
    for _ in 0..200 {
        server.create_readable(filled(0, 1 << 16)).unwrap().cancel();
    }
    for seed in 2..12 {
        let later = server.create_readable(filled(seed, LEN)).unwrap();
        let later_blob = later.metadata().agent_metadata();
        let parsed = parse(later_blob);
        assert_eq!(later_blob.len(), blob.len(), "operation {seed}");
        assert_eq!(parsed.regions.len(), 1);
        assert_eq!(
            (parsed.regions[0].0, parsed.regions[0].1),
            named(later.metadata())[0]
        );
        // The client, which already holds this agent, merges the new region.
        read_all(&client, later.metadata(), seed);
        later.wait_timeout(WAIT).unwrap();
    }
}

/// An exposure of several regions lists each once, and a fresh peer that
/// loads nothing else reaches all of them.
#[test]
fn a_multi_region_exposure_lists_each_region_once() {
    if !runtime_available() {
        return;
    }
    let h = Nixl::new(MetadataScope::Agent);
    let (server, client) = (
        Connector::new(h.backend("server")),
        Connector::new(h.backend("client")),
    );
    let lens = [LEN, 2 * LEN, 64];
    let sources: Vec<_> = lens
        .iter()
        .zip(7..)
        .map(|(&len, seed)| Descriptor::new(pattern(seed, len)).unwrap())
        .collect();
    let readable = server.create_readable(sources).unwrap();
    let meta = readable.metadata();
    let parsed = parse(meta.agent_metadata());
    let mut listed: Vec<(u64, u64)> = parsed.regions.iter().map(|&(a, l, _)| (a, l)).collect();
    let mut expected = named(meta);
    listed.sort_unstable();
    expected.sort_unstable();
    assert_eq!(listed, expected);
    let sinks: Vec<_> = lens
        .iter()
        .map(|&len| Descriptor::new(vec![0u8; len]).unwrap())
        .collect();
    let read = client.begin_read(meta, sinks).unwrap();
    read.wait_timeout(WAIT).unwrap();
    let got: Vec<Vec<u8>> = read
        .into_descriptors()
        .unwrap()
        .iter()
        .map(|d| d.as_slice().unwrap().to_vec())
        .collect();
    let want: Vec<Vec<u8>> = lens.iter().zip(7..).map(|(&l, s)| pattern(s, l)).collect();
    assert_eq!(got, want);
    readable.wait_timeout(WAIT).unwrap();
}
