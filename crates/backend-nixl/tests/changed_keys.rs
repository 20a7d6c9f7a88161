//! NIXL 1.5.1 cannot load a peer again once it refused a blob of it in the
//! region section: it keeps the peer's UCX connection and erases the rest. Two
//! ways there that no check of the blob's form can catch must leave the peer
//! reachable, bytes and all:
//! - the peer republishes a region it published before with another key (on
//!   RDMA hosts: it re-registered memory at the same address; here, a byte of
//!   the key that NIXL compares and UCX does not read is changed);
//! - a well-formed blob whose key UCX refuses to unpack, while an operation
//!   uses the peer: the peer's earlier regions stay reachable.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::ops::Range;
use std::time::Duration;

use backend_nixl::{LogLevel, MetadataScope, NixlBackend};
use descriptor_core::conformance::{filled, pattern, reblobbed, zeroed_one};
use descriptor_core::faults::Faulty;
use descriptor_core::{
    Connector, Error, OperationKind, RdmaMetadata, ReadableOperation, WritableOperation,
};
use rstest::rstest;
use test_support::runtime_available;

const WAIT: Duration = Duration::from_secs(10);
const LEN: usize = 4096;

fn backend(tag: &str) -> NixlBackend {
    NixlBackend::builder(&format!("rekey{}-{tag}", std::process::id()))
        .metadata_scope(MetadataScope::Agent)
        .log_level(LogLevel::Off)
        .build()
        .unwrap()
}

/// A passive operation of the server: a readable of `pattern(seed)`, or a
/// zeroed writable that the client fills with it.
enum Passive {
    Readable(u64, ReadableOperation),
    Writable(u64, WritableOperation),
}

impl Passive {
    fn new(server: &Connector, kind: OperationKind, seed: u64) -> Passive {
        match kind {
            OperationKind::Read => {
                Passive::Readable(seed, server.create_readable(filled(seed, LEN)).unwrap())
            }
            OperationKind::Write => {
                Passive::Writable(seed, server.create_writable(zeroed_one(LEN)).unwrap())
            }
        }
    }

    fn metadata(&self) -> RdmaMetadata {
        match self {
            Passive::Readable(_, op) => op.metadata().clone(),
            Passive::Writable(_, op) => op.metadata().clone(),
        }
    }

    /// The client's transfer with `meta` (this operation's regions, some
    /// peer blob), started.
    fn begin(&self, client: &Connector, meta: &RdmaMetadata) -> Result<Active, Error> {
        match self {
            Passive::Readable(..) => client.begin_read(meta, zeroed_one(LEN)).map(Active::Read),
            Passive::Writable(seed, _) => client
                .begin_write(filled(*seed, LEN), meta)
                .map(Active::Write),
        }
    }

    /// Waits for `active` and this operation, and checks the bytes where
    /// they landed.
    fn finish(self, active: Active) {
        let landed = match (self, active) {
            (Passive::Readable(seed, passive), Active::Read(read)) => {
                read.wait_timeout(WAIT).unwrap();
                passive.wait_timeout(WAIT).unwrap();
                (seed, read.into_descriptors().unwrap().remove(0))
            }
            (Passive::Writable(seed, passive), Active::Write(write)) => {
                write.wait_timeout(WAIT).unwrap();
                passive.wait_timeout(WAIT).unwrap();
                (seed, passive.into_descriptors().unwrap().remove(0))
            }
            _ => panic!("mismatched operations"),
        };
        let (seed, descriptor) = landed;
        assert_eq!(descriptor.into_vec::<u8>().unwrap(), pattern(seed, LEN));
    }

    /// One whole transfer with `meta`, bytes checked.
    fn serve(self, client: &Connector, meta: &RdmaMetadata) {
        let active = self.begin(client, meta).unwrap();
        self.finish(active);
    }
}

enum Active {
    Read(descriptor_core::ReadOperation),
    Write(descriptor_core::WriteOperation),
}

/// Where the key to `region`'s memory lies in NIXL agent metadata: after
/// the region's address, length and device (three u64s), to the end of the
/// entry whose length precedes them.
fn key_of(blob: &[u8], region: &RdmaMetadata) -> Range<usize> {
    let d = region.descriptors()[0];
    let head: Vec<u8> = [d.ptr, d.size, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let at = blob
        .windows(head.len())
        .position(|w| w == head)
        .unwrap_or_else(|| panic!("region {:#x} is not in the blob", d.ptr));
    let entry = u64::from_le_bytes(blob[at - 8..at].try_into().unwrap());
    at + head.len()..at + usize::try_from(entry).unwrap()
}

/// `region`'s descriptors and key, with `blob_of`'s agent metadata, the key
/// to `region`'s memory there changed by `edit`.
fn with_key(
    region: &RdmaMetadata,
    blob_of: &RdmaMetadata,
    edit: impl FnOnce(&mut [u8]),
) -> RdmaMetadata {
    let mut blob = blob_of.agent_metadata().to_vec();
    let key = key_of(&blob, region);
    edit(&mut blob[key]);
    reblobbed(region, blob)
}

/// `meta` with its agent blob (one section of one region, as an exposure of
/// one descriptor publishes) listing `other`'s region too, key and all.
fn with_region_of(meta: &RdmaMetadata, other: &RdmaMetadata) -> RdmaMetadata {
    let mut blob = meta.agent_metadata().to_vec();
    let key = key_of(other.agent_metadata(), other);
    // The region's entry: its length (8 bytes, after an empty tag), the
    // address, length and device, the key, and `|`.
    let entry = &other.agent_metadata()[key.start - 32..=key.end];
    let mut one = b"n".to_vec();
    one.extend_from_slice(&8u64.to_le_bytes());
    one.extend_from_slice(&1u64.to_le_bytes());
    let count = blob
        .windows(one.len())
        .position(|w| w == one)
        .unwrap_or_else(|| panic!("not a blob of one region"));
    blob[count + 9..count + 17].copy_from_slice(&2u64.to_le_bytes());
    blob.extend_from_slice(entry);
    reblobbed(meta, blob)
}

#[rstest]
fn a_peer_republishing_another_key_for_a_region_is_reached_again(
    #[values(OperationKind::Read, OperationKind::Write)] kind: OperationKind,
) {
    if !runtime_available() {
        return;
    }
    let server = Connector::new(backend(&format!("{kind:?}-server")));
    let client = Connector::new(backend(&format!("{kind:?}-client")));
    let target = Passive::new(&server, kind, 1);
    let target_meta = target.metadata();
    // A blob of the peer's that lists the target's region too (as a blob of
    // an exposure of both would): the client loads both keys.
    let primer = Passive::new(&server, kind, 2);
    let primer_meta = with_region_of(&primer.metadata(), &target_meta);
    primer.serve(&client, &primer_meta);
    // The target's region again, under another key: the key's last byte
    // (UCX's system device, which it does not read from a key unpacked
    // without its length) differs, so NIXL sees a changed key and the bytes
    // still move.
    let rekeyed = with_key(&target_meta, &primer_meta, |key| {
        *key.last_mut().unwrap() ^= 0xff;
    });
    target.serve(&client, &rekeyed);
    // And the peer's later blobs load as before: one peer, reachable.
    let later = Passive::new(&server, kind, 3);
    let later_meta = later.metadata();
    later.serve(&client, &later_meta);
    assert_eq!(client.idle_remote_agent_count(), 1);
}

#[rstest]
fn a_blob_nixl_refuses_leaves_the_peer_in_use_with_its_regions(
    #[values(OperationKind::Read, OperationKind::Write)] kind: OperationKind,
) {
    if !runtime_available() {
        return;
    }
    let server = Connector::new(backend(&format!("{kind:?}-refusing-server")));
    let client = Faulty::new(backend(&format!("{kind:?}-refusing-client")));
    let faults = client.faults();
    let client = Connector::new(client);
    let target = Passive::new(&server, kind, 1);
    let target_meta = target.metadata();
    let busy = Passive::new(&server, kind, 2);
    let busy_meta = busy.metadata();
    let primer = Passive::new(&server, kind, 3);
    let primer_meta = primer.metadata();
    primer.serve(&client, &primer_meta);
    // An operation uses the peer (so the connector does not unload it).
    let stall = faults.stall_next_transfer();
    let in_flight = busy.begin(&client, &busy_meta).unwrap();
    // A new region whose key names memory domain 1 with no bytes, instead of
    // domain 0: well-formed, and UCX refuses to unpack it.
    let other = Passive::new(&server, kind, 4);
    let other_meta = other.metadata();
    let refused = with_key(&other_meta, &other_meta, |key| key[0] = 2);
    assert!(matches!(
        other.begin(&client, &refused),
        Err(Error::Backend { .. })
    ));
    // The peer's regions are reachable as before, new ones too.
    target.serve(&client, &target_meta);
    other.serve(&client, &other_meta);
    stall.release();
    busy.finish(in_flight);
    assert_eq!(client.idle_remote_agent_count(), 1);
}
