//! Pool to pool across OS processes over NIXL: a peer serves blocks of its
//! one registered pool, this process READs them into its own pool; then the
//! peer is killed and restarted under the same name (a new pool, new
//! addresses and keys), and READs of it work again without a registration
//! on this side.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::num::NonZeroUsize;
use std::process::Command;
use std::time::Duration;

use descriptor_core::{BlockPool, RdmaMetadata};
use test_support::{Peer, crc32_of, nixl_connector, pattern, runtime_available};

const BLOCK: usize = 64 << 10;
const BLOCKS: usize = 32;
const WAIT: Duration = Duration::from_secs(60);

/// Block sets of one request each: a run, scattered blocks, a run at the end.
const REQUESTS: [&[usize]; 3] = [&[0, 1, 2, 3], &[5, 9, 17], &[30, 31]];

fn pool_peer(seed: u64) -> Peer {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nixl-test-peer"));
    let (blocks, block) = (BLOCKS.to_string(), BLOCK.to_string());
    command.args(["pool", "pool-peer", &blocks, &block, &seed.to_string()]);
    Peer::spawn(command)
}

#[test]
fn pool_to_pool_across_processes_survives_a_peer_restarted_under_its_name() {
    if !runtime_available() {
        return;
    }
    let client = nixl_connector("pool-client", true);
    let pool = BlockPool::new(
        &client,
        vec![0u8; BLOCKS * BLOCK],
        NonZeroUsize::new(BLOCK).unwrap(),
    )
    .unwrap();
    for (incarnation, seed) in [(0, 100u64), (1, 200)] {
        let mut peer = pool_peer(seed);
        for indices in REQUESTS {
            let line: Vec<String> = indices.iter().map(ToString::to_string).collect();
            peer.send(&line.join(","));
            let metadata: RdmaMetadata = peer.line(WAIT).parse().unwrap();
            let local = pool.checkout(indices.len()).unwrap();
            let read = client.begin_read(&metadata, local).unwrap();
            read.wait_timeout(WAIT).unwrap();
            let blocks = read.into_descriptors().unwrap();
            for (view, &index) in blocks.iter().zip(indices) {
                assert_eq!(
                    view.as_slice().unwrap(),
                    pattern(seed + index as u64, BLOCK).as_slice(),
                    "incarnation {incarnation}: block {index}"
                );
            }
            let report: serde_json::Value = serde_json::from_str(&peer.line(WAIT)).unwrap();
            assert_eq!(
                report["crc32"],
                crc32_of(&blocks),
                "the peer's view of its blocks"
            );
        }
        // The first incarnation dies without a word; the second ends cleanly.
        if incarnation == 0 {
            peer.kill();
        } else {
            peer.finish();
        }
    }
    assert_eq!(client.registrations(), 1, "the client's pool, once");
    assert_eq!(pool.free(), BLOCKS);
}
