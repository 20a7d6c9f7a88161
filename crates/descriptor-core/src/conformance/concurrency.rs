//! Conformance checks of many operations at once on one peer: concurrent
//! reads from many threads, and a long mixed load, every byte checked and
//! the peer cache empty afterwards. [`Params`](super::Params) scales them.

use super::{Harness, WAIT, assert_pattern, connector, descriptors, zeroed};

/// `threads` threads each run `per_thread` concurrent reads against one peer;
/// all bytes arrive and the remote-agent cache is empty afterwards.
pub fn concurrent_operations_share_one_peer(h: &dyn Harness, threads: usize, per_thread: usize) {
    let server = connector(h, "busy-server");
    let client = connector(h, "busy-client");
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (server, client) = (server.clone(), client.clone());
            scope.spawn(move || {
                let seed = |i: usize| 1000 + (t * per_thread + i) as u64;
                let readables: Vec<_> = (0..per_thread)
                    .map(|i| {
                        server
                            .create_readable(descriptors(seed(i), &[4096]))
                            .unwrap()
                    })
                    .collect();
                let reads: Vec<_> = readables
                    .iter()
                    .map(|r| client.begin_read(r.metadata(), zeroed(&[4096])).unwrap())
                    .collect();
                for (i, (read, readable)) in reads.into_iter().zip(readables).enumerate() {
                    read.wait_timeout(WAIT).unwrap();
                    readable.wait_timeout(WAIT).unwrap();
                    assert_pattern(
                        &read.into_descriptors().unwrap(),
                        seed(i),
                        "concurrent read",
                    );
                }
            });
        }
    });
    assert_eq!(
        client.remote_agent_count(),
        0,
        "every operation released its peer"
    );
    assert_eq!(
        client.idle_remote_agent_count(),
        1,
        "the peer stays loaded, idle"
    );
    client.unload_idle_remote_agents();
    assert_eq!(client.idle_remote_agent_count(), 0);
}

/// `threads` threads each run `per_thread` operations of mixed sizes and both
/// directions against one peer, verifying every byte; the peer cache ends empty.
pub fn load(h: &dyn Harness, threads: usize, per_thread: usize) {
    const SIZES: [usize; 5] = [64, 4096, 65536, 4097, 256 << 10];
    let before = crate::testing::rss_bytes();
    let server = connector(h, "load-server");
    let client = connector(h, "load-client");
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (server, client) = (server.clone(), client.clone());
            scope.spawn(move || {
                for i in 0..per_thread {
                    let size = SIZES[(t + i) % SIZES.len()];
                    let seed = 10_000 + (t * per_thread + i) as u64;
                    if i % 2 == 0 {
                        let readable = server.create_readable(descriptors(seed, &[size])).unwrap();
                        let read = client
                            .begin_read(readable.metadata(), zeroed(&[size]))
                            .unwrap();
                        read.wait_timeout(WAIT).unwrap();
                        readable.wait_timeout(WAIT).unwrap();
                        assert_pattern(&read.into_descriptors().unwrap(), seed, "load read");
                    } else {
                        let writable = server.create_writable(zeroed(&[size])).unwrap();
                        let write = client
                            .begin_write(descriptors(seed, &[size]), writable.metadata())
                            .unwrap();
                        write.wait_timeout(WAIT).unwrap();
                        writable.wait_timeout(WAIT).unwrap();
                        assert_pattern(&writable.into_descriptors().unwrap(), seed, "load write");
                    }
                }
            });
        }
    });
    assert_eq!(client.remote_agent_count(), 0);
    assert!(client.idle_remote_agent_count() <= 1);
    let grew = crate::testing::rss_bytes() as i64 - before as i64;
    // The figure RELIABILITY.md quotes (informational, not asserted).
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "{} load: {threads} x {per_thread} operations, resident memory grew {grew} bytes",
            server.backend_name()
        );
    }
}
