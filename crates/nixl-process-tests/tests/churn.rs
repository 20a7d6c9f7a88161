//! Peer churn (issue 43): a long-lived connector among peer processes that
//! come and go keeps its file descriptors, threads and memory within a fixed
//! bound, whatever the number of incarnations.
//!
//! - Incarnations: peers restarted under one name and started under fresh
//!   names, each ended cleanly or killed, and peers reading this process's
//!   memory; 100 incarnations (1,000 with `RELIABILITY_LONG`, as
//!   `cargo xtask test --long` sets).
//! - A peer that stays alive, loaded and unloaded once per operation
//!   (`max_idle_peers(0)` and explicit unloads), then restarted.
//!
//! Every READ is checked byte for byte and by the peer's CRC. The bounds are
//! taken after a warm-up longer than the connector's caps (idle and parked
//! peers), against the largest value seen after it: the usage must stop
//! growing, not merely grow slowly. What NIXL 1.5.1 leaked before, and why
//! the bounds: docs/decisions/0017-peer-churn.md.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backend_nixl::{NixlBackend, Tuning};
use descriptor_core::{Connector, Descriptor, RdmaMetadata};
use test_support::{Peer, crc32_of, pattern, runtime_available};

const WAIT: Duration = Duration::from_secs(60);
const BLOCK: usize = 4096;
/// The connector's caps in these tests: small, so that the warm-up passes
/// them quickly.
const IDLE_PEERS: usize = 4;
const PARKED_PEERS: usize = 8;
/// Incarnations before the usage is taken as the baseline: more fresh names
/// than the caps hold.
const WARM_UP: usize = 45;
/// How far past the warm-up's usage the largest value seen may lie. Each
/// idle or parked peer that exited holds at most one socket until UCX's
/// next look, a thread or two come and go with the peers' pipes, and the
/// allocator keeps some of what peers' bookkeeping freed.
const FD_SLACK: usize = 8;
const THREAD_SLACK: usize = 3;
const RSS_SLACK_KIB: u64 = 24 << 10;

/// Both tests read this process's usage: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    fds: usize,
    threads: usize,
    rss_kib: u64,
}

impl Usage {
    fn now() -> Usage {
        let count = |dir: &str| std::fs::read_dir(dir).unwrap().count();
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        Usage {
            fds: count("/proc/self/fd"),
            threads: count("/proc/self/task"),
            rss_kib: pages * 4,
        }
    }

    fn max(self, other: Usage) -> Usage {
        Usage {
            fds: self.fds.max(other.fds),
            threads: self.threads.max(other.threads),
            rss_kib: self.rss_kib.max(other.rss_kib),
        }
    }
}

/// The baseline after the warm-up, and the largest usage seen after it.
#[derive(Default)]
struct Bound {
    baseline: Option<Usage>,
    peak: Option<Usage>,
}

impl Bound {
    fn sample(&mut self, i: usize) {
        let now = Usage::now();
        if i + 1 == WARM_UP {
            self.baseline = Some(now);
        } else if i >= WARM_UP {
            self.peak = Some(self.peak.map_or(now, |p| p.max(now)));
        }
    }

    fn check(&self, what: &str) {
        let (Some(base), Some(peak)) = (self.baseline, self.peak) else {
            panic!("{what}: fewer incarnations than the warm-up");
        };
        eprintln!("{what}: after the warm-up {base:?}; the most after it {peak:?}");
        assert!(
            peak.fds <= base.fds + FD_SLACK,
            "{what}: file descriptors grew from {} to {}",
            base.fds,
            peak.fds
        );
        assert!(
            peak.threads <= base.threads + THREAD_SLACK,
            "{what}: threads grew from {} to {}",
            base.threads,
            peak.threads
        );
        assert!(
            peak.rss_kib <= base.rss_kib + RSS_SLACK_KIB,
            "{what}: RSS grew from {} KiB to {} KiB",
            base.rss_kib,
            peak.rss_kib
        );
    }
}

fn incarnations() -> usize {
    if std::env::var_os("RELIABILITY_LONG").is_some() {
        1000
    } else {
        100
    }
}

/// The long-lived connector: small caps, and its backend for the parked
/// count.
fn survivor(role: &str, idle: usize) -> (Connector, Arc<NixlBackend>) {
    let mut tuning = Tuning::default();
    tuning.parked_peers = PARKED_PEERS;
    let name = format!("{role}-{}", std::process::id());
    let backend = Arc::new(NixlBackend::builder(&name).tuning(tuning).build().unwrap());
    let connector = Connector::builder_from_arc(backend.clone())
        .max_idle_peers(idle)
        .build();
    (connector, backend)
}

/// A peer serving two blocks of pattern `seed`, `seed + 1` as agent `name`.
fn pool_peer(name: &str, seed: u64) -> Peer {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nixl-test-peer"));
    command.args(["pool", name, "2", &BLOCK.to_string(), &seed.to_string()]);
    Peer::spawn(command)
}

/// READs the peer's two blocks and checks every byte, and the peer's CRC.
fn read_from(survivor: &Connector, peer: &mut Peer, seed: u64) {
    peer.send("0,1");
    let metadata: RdmaMetadata = peer.line(WAIT).parse().unwrap();
    let local: Vec<Descriptor> = (0..2)
        .map(|_| Descriptor::new(vec![0u8; BLOCK]).unwrap())
        .collect();
    let read = survivor.begin_read(&metadata, local).unwrap();
    read.wait_timeout(WAIT).unwrap();
    let got = read.into_descriptors().unwrap();
    for (i, block) in got.iter().enumerate() {
        assert_eq!(
            block.as_slice().unwrap(),
            pattern(seed + i as u64, BLOCK),
            "block {i} of seed {seed}"
        );
    }
    let report: serde_json::Value = serde_json::from_str(&peer.line(WAIT)).unwrap();
    assert_eq!(report["crc32"], crc32_of(&got), "the peer's view");
}

/// A peer process READs a block this process exposes.
fn read_by_a_peer(survivor: &Connector, seed: u64) {
    let source = vec![Descriptor::new(pattern(seed, BLOCK)).unwrap()];
    let expected = crc32_of(&source);
    let readable = survivor.create_readable(source).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_nixl-test-peer"));
    command.arg("reader");
    let mut reader = Peer::spawn(command);
    reader.send(&readable.metadata().to_json());
    assert_eq!(reader.line(WAIT), r#"{"started":true}"#);
    let report: serde_json::Value = serde_json::from_str(&reader.line(WAIT)).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_eq!(report["crc32"], expected, "what the peer read");
    reader.finish();
}

#[test]
fn peers_restarted_under_their_name_and_under_fresh_names_leave_usage_flat() {
    if !runtime_available() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (survivor, backend) = survivor("churn-survivor", IDLE_PEERS);
    let same = format!("churn-same-{}", std::process::id());
    let mut bound = Bound::default();
    for i in 0..incarnations() {
        let seed = 1000 * i as u64;
        match i % 3 {
            2 => read_by_a_peer(&survivor, seed),
            kind => {
                let name = if kind == 0 {
                    same.clone()
                } else {
                    format!("churn-fresh-{}-{i}", std::process::id())
                };
                let mut peer = pool_peer(&name, seed);
                read_from(&survivor, &mut peer, seed);
                // Half die without a word, half end cleanly.
                if (i / 3) % 2 == 0 {
                    peer.kill();
                } else {
                    peer.finish();
                }
            }
        }
        assert!(survivor.remote_agent_count() <= IDLE_PEERS);
        assert!(backend.parked_peers() <= PARKED_PEERS);
        bound.sample(i);
    }
    bound.check("restarted and fresh peers");
}

#[test]
fn a_live_peer_loaded_and_unloaded_per_operation_leaves_usage_flat() {
    if !runtime_available() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Unloaded as soon as each operation ends, as Dynamo does.
    let (survivor, backend) = survivor("churn-live", 0);
    let name = format!("churn-live-peer-{}", std::process::id());
    let mut bound = Bound::default();
    let mut peer = pool_peer(&name, 7);
    let cycles = 4 * incarnations();
    for i in 0..cycles {
        read_from(&survivor, &mut peer, 7);
        assert_eq!(survivor.remote_agent_count(), 0, "unloaded after each");
        if i % 2 == 0 {
            survivor.unload_idle_remote_agents();
        }
        bound.sample(i);
    }
    assert_eq!(backend.parked_peers(), 1, "the live peer, parked");
    // Restarted under its name: the parked incarnation gives way.
    peer.kill();
    let mut peer = pool_peer(&name, 9);
    read_from(&survivor, &mut peer, 9);
    bound.sample(cycles);
    peer.finish();
    bound.check("a live peer loaded and unloaded");
}
