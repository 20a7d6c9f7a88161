//! A peer whose registrations overlap (X = [0, 8 KiB) and Y = [4 KiB,
//! 12 KiB) of one buffer: legal in NIXL 1.5.1, and what a Dynamo peer whose
//! descriptors overlap has) exposes three 4 KiB ranges end to end, the first
//! two in X, the third in Y. Each neighbouring pair lies in one registration,
//! the three together in none: read into a pool's contiguous blocks, the
//! transfer is merged into runs that each lie in one registration, and every
//! byte arrives (NIXL refuses a descriptor that lies in no registration).
#![allow(clippy::unwrap_used, clippy::panic)]

use std::num::NonZeroUsize;
use std::time::Duration;

use descriptor_core::conformance::pattern;
use descriptor_core::{BlockPool, Connector, Descriptor, Device, RawMemory, RegisteredMemory};
use test_support::{nixl_connector, runtime_available};

const B: usize = 4096;
const WAIT: Duration = Duration::from_secs(10);

/// Registrations `ranges` of one leaked buffer holding `bytes`, with `peer`.
fn registrations(
    peer: &Connector,
    bytes: &[u8],
    ranges: &[(usize, usize)],
) -> Vec<RegisteredMemory> {
    // Leaked: the registrations (and any transfer a failed assertion leaves
    // running) may outlive the test's frames.
    let backing: &'static mut [u8] = Box::leak(bytes.to_vec().into_boxed_slice());
    let base = backing.as_mut_ptr();
    ranges
        .iter()
        .map(|&(start, len)| {
            assert!(start + len <= bytes.len());
            // SAFETY: `start..start + len` lies in the leaked buffer, valid
            // for reads and writes for the rest of the process; the
            // overlapping registrations are only ever read by the peer.
            let memory = unsafe { RawMemory::new(base.add(start), len, Device::HOST, None) };
            RegisteredMemory::new(peer, memory).unwrap()
        })
        .collect()
}

#[test]
fn a_read_into_a_pool_over_a_peers_overlapping_registrations_moves_every_byte() {
    if !runtime_available() {
        return;
    }
    let peer = nixl_connector("overlap-peer", false);
    let reader = nixl_connector("overlap-reader", false);
    let bytes = pattern(41, 3 * B);
    let regs = registrations(&peer, &bytes, &[(0, 2 * B), (B, 2 * B)]);
    let (x, y) = (&regs[0], &regs[1]);
    let parts: Vec<Descriptor> = vec![
        x.carve(0, B).unwrap(),
        x.carve(B, B).unwrap(),
        y.carve(B, B).unwrap(),
    ];
    let starts: Vec<usize> = parts.iter().map(|p| p.ptr() - x.ptr()).collect();
    assert_eq!(starts, [0, B, 2 * B], "three ranges end to end");

    let readable = peer.create_readable(parts).unwrap();
    let pool = BlockPool::new(&reader, vec![0u8; 3 * B], NonZeroUsize::new(B).unwrap()).unwrap();
    let blocks = pool.checkout(3).unwrap();
    let ptrs: Vec<usize> = blocks.iter().map(|d| d.ptr() - pool.ptr()).collect();
    assert_eq!(
        ptrs,
        [0, B, 2 * B],
        "three contiguous blocks: merged locally"
    );
    let read = reader.begin_read(readable.metadata(), blocks).unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    let landed: Vec<u8> = read
        .into_descriptors()
        .unwrap()
        .iter()
        .flat_map(|d| d.as_slice().unwrap().to_vec())
        .collect();
    assert!(landed == bytes, "the blocks do not hold the peer's bytes");
}
