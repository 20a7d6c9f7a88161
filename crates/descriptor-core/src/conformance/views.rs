//! Conformance checks of registered memory moved in parts: views of a
//! [`BlockPool`] or of [`RegisteredMemory`], partial lengths, fitted reads,
//! and when a shared registration ends.
//!
//! Every check fills the bytes around the views it moves with a canary and
//! checks them afterwards, on both sides: a transfer into a view must never
//! touch its neighbours, which safe code may hold.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use super::{Call, Harness, WAIT, connector, faulty, hooked_agent, pattern};
use crate::testing::eventually;
use crate::{BlockPool, Connector, Descriptor, Error, OperationKind, RegisteredMemory, Release};

/// Bytes per block of the pools these checks make.
const BLOCK: usize = 4096;
/// What bytes no transfer should touch hold.
const CANARY: u8 = 0xA5;

fn block_size() -> NonZeroUsize {
    NonZeroUsize::new(BLOCK).unwrap()
}

/// A pool of `blocks` canary-filled blocks registered with `c`.
fn canary_pool(c: &Connector, blocks: usize) -> BlockPool {
    BlockPool::new(c, vec![CANARY; blocks * BLOCK], block_size()).unwrap()
}

/// Fills view `i` of `views` with pattern `seed + i` over its whole size.
fn fill(views: &mut [Descriptor], seed: u64) {
    for (i, v) in views.iter_mut().enumerate() {
        let bytes = pattern(seed + i as u64, v.size());
        v.as_mut_slice().unwrap().copy_from_slice(&bytes);
    }
}

/// View `i` holds pattern `seed + i` over its size and the canary past it.
fn assert_filled(views: &[Descriptor], seed: u64, what: &str) {
    for (i, v) in views.iter().enumerate() {
        let full = v.as_full_slice().unwrap();
        let (data, rest) = full.split_at(v.size());
        assert!(
            data == pattern(seed + i as u64, v.size()).as_slice(),
            "{what}: view {i} does not hold the bytes sent"
        );
        assert!(
            rest.iter().all(|&b| b == CANARY),
            "{what}: view {i} was written past its size ({} of {} bytes)",
            v.size(),
            v.capacity()
        );
    }
}

fn assert_canary(views: &[Descriptor], what: &str) {
    for (i, v) in views.iter().enumerate() {
        assert!(
            v.as_full_slice().unwrap().iter().all(|&b| b == CANARY),
            "{what}: view {i} was written"
        );
    }
}

/// Moves views one way and waits for both sides: READ (the server exposes
/// `server_views` for reading, the client reads into `client_views`) or
/// WRITE (the server exposes its views for writing, the client writes its
/// own into them). The sending side's views are filled with pattern `seed`
/// first; `inspect` sees the passive side's metadata. Returns the sender's
/// views and the receiver's, as they came back.
fn exchange(
    (server, client): (&Connector, &Connector),
    op: OperationKind,
    (mut server_views, mut client_views): (Vec<Descriptor>, Vec<Descriptor>),
    seed: u64,
    inspect: impl FnOnce(&crate::RdmaMetadata),
) -> (Vec<Descriptor>, Vec<Descriptor>) {
    match op {
        OperationKind::Read => {
            fill(&mut server_views, seed);
            let readable = server.create_readable(server_views).unwrap();
            inspect(readable.metadata());
            let read = client
                .begin_read(readable.metadata(), client_views)
                .unwrap();
            read.wait_timeout(WAIT).unwrap();
            readable.wait_timeout(WAIT).unwrap();
            (
                readable.into_descriptors().unwrap(),
                read.into_descriptors().unwrap(),
            )
        }
        OperationKind::Write => {
            fill(&mut client_views, seed);
            let writable = server.create_writable(server_views).unwrap();
            inspect(writable.metadata());
            let write = client
                .begin_write(client_views, writable.metadata())
                .unwrap();
            write.wait_timeout(WAIT).unwrap();
            writable.wait_timeout(WAIT).unwrap();
            (
                write.into_descriptors().unwrap(),
                writable.into_descriptors().unwrap(),
            )
        }
    }
}

/// Views at the start, in the middle and at the end of a pool, READ into
/// and WRITTEN from views of another pool: the bytes land, and every other
/// block of both pools, held by the test meanwhile, keeps its canary.
pub fn a_transfer_into_a_view_leaves_its_neighbours_untouched(h: &dyn Harness) {
    const PICKED: [usize; 3] = [0, 3, 7];
    const OTHERS: [usize; 5] = [1, 2, 4, 5, 6];
    for op in [OperationKind::Read, OperationKind::Write] {
        let server = connector(h, &format!("views-server-{op:?}"));
        let client = connector(h, &format!("views-client-{op:?}"));
        let (server_pool, client_pool) = (canary_pool(&server, 8), canary_pool(&client, 8));
        let server_others = server_pool.checkout_blocks(&OTHERS).unwrap();
        let client_others = client_pool.checkout_blocks(&OTHERS).unwrap();
        let server_views = server_pool.checkout_blocks(&PICKED).unwrap();
        let client_views = client_pool.checkout_blocks(&PICKED).unwrap();
        let (sent, received) = exchange(
            (&server, &client),
            op,
            (server_views, client_views),
            300,
            |_| {},
        );
        assert_filled(&received, 300, &format!("{op:?}: received"));
        assert_filled(&sent, 300, &format!("{op:?}: sent"));
        assert_canary(
            &server_others,
            &format!("{op:?}: the server's other blocks"),
        );
        assert_canary(
            &client_others,
            &format!("{op:?}: the client's other blocks"),
        );
        drop((sent, received, server_others, client_others));
        assert_eq!((server_pool.free(), client_pool.free()), (8, 8));
    }
}

/// Views whose size is less than their capacity move their first `size`
/// bytes only, READ and WRITE: nothing past the size is sent or written on
/// either side, and the views come back with size and capacity unchanged.
pub fn partial_lengths_move_only_the_prefix(h: &dyn Harness) {
    // (offset in the server's memory, capacity, size)
    const VIEWS: [(usize, usize, usize); 3] = [
        (0, 10_000, 3_333),
        (20_000, 30_000, 12_345),
        (60_000, 5_536, 1),
    ];
    for op in [OperationKind::Read, OperationKind::Write] {
        let server = connector(h, &format!("partial-server-{op:?}"));
        let client = connector(h, &format!("partial-client-{op:?}"));
        let memory = RegisteredMemory::new(&server, vec![CANARY; 65_536]).unwrap();
        let server_views: Vec<Descriptor> = VIEWS
            .iter()
            .map(|&(offset, capacity, size)| {
                let mut v = memory.carve(offset, capacity).unwrap();
                v.set_size(size).unwrap();
                v
            })
            .collect();
        let client_views: Vec<Descriptor> = VIEWS
            .iter()
            .map(|&(_, capacity, size)| {
                let mut v = Descriptor::new(vec![CANARY; capacity]).unwrap();
                v.set_size(size).unwrap();
                v
            })
            .collect();
        let (sent, received) = exchange(
            (&server, &client),
            op,
            (server_views, client_views),
            400,
            |metadata| {
                let published: Vec<u64> = metadata.descriptors().iter().map(|d| d.size).collect();
                assert_eq!(
                    published,
                    VIEWS.map(|(_, _, size)| size as u64),
                    "{op:?}: the metadata publishes the sizes"
                );
            },
        );
        for views in [&sent, &received] {
            let shapes: Vec<(usize, usize)> =
                views.iter().map(|v| (v.capacity(), v.size())).collect();
            assert_eq!(shapes, VIEWS.map(|(_, capacity, size)| (capacity, size)));
        }
        assert_filled(&received, 400, &format!("{op:?}: received"));
        assert_filled(&sent, 400, &format!("{op:?}: sent"));
        // The server's memory between the views kept its canary too.
        drop(sent);
        drop(received);
        let whole = memory.carve(0, memory.len()).unwrap();
        let bytes = whole.as_slice().unwrap();
        for (from, to) in [(10_000, 20_000), (50_000, 60_000)] {
            assert!(
                bytes[from..to].iter().all(|&b| b == CANARY),
                "{op:?}: between the views"
            );
        }
    }
}

/// `begin_read_fit` reads descriptors of several sizes into larger pool
/// views: each comes back with the size that arrived and its capacity, the
/// bytes past the size untouched; a view too small for its partner is
/// refused before anything moves, and its blocks go back to the pool.
pub fn a_fitted_read_reports_the_length_that_arrived(h: &dyn Harness) {
    const SIZES: [usize; 3] = [100, 4096, 5000];
    let server = connector(h, "fit-server");
    let client = connector(h, "fit-client");
    let pool = BlockPool::new(
        &client,
        vec![CANARY; 6 * 8192],
        NonZeroUsize::new(8192).unwrap(),
    )
    .unwrap();
    let mut sources: Vec<Descriptor> = SIZES
        .iter()
        .map(|&n| Descriptor::new(vec![0u8; n]).unwrap())
        .collect();
    fill(&mut sources, 500);
    let readable = server.create_readable(sources).unwrap();
    let read = client
        .begin_read_fit(readable.metadata(), pool.checkout(3).unwrap())
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    let views = read.into_descriptors().unwrap();
    let shapes: Vec<(usize, usize)> = views.iter().map(|v| (v.size(), v.capacity())).collect();
    assert_eq!(shapes, SIZES.map(|n| (n, 8192)), "the lengths that arrived");
    assert_filled(&views, 500, "fitted read");
    drop(views);

    // Too small: blocks of 4096 bytes for a partner of 5000.
    let small = BlockPool::new(&client, vec![CANARY; 3 * 4096], block_size()).unwrap();
    let readable = server
        .create_readable(vec![Descriptor::new(pattern(501, 5000)).unwrap()])
        .unwrap();
    match client.begin_read_fit(readable.metadata(), small.checkout(1).unwrap()) {
        Err(Error::CapacityTooSmall {
            index: 0,
            capacity: 4096,
            remote: 5000,
        }) => {}
        other => panic!("a 4096-byte view for 5000 bytes gave {other:?}"),
    }
    assert_eq!(small.free(), 3, "the refused views went back to their pool");
    assert_eq!(pool.free(), 6);
    readable.cancel();
}

/// Pairing compares transfer lengths (`size()`), not capacities: a view
/// larger than its partner is refused with both lengths named until its
/// size is set to its partner's.
pub fn pairing_checks_transfer_lengths(h: &dyn Harness) {
    let server = connector(h, "pairlen-server");
    let client = connector(h, "pairlen-client");
    let readable = server
        .create_readable(vec![Descriptor::new(pattern(600, 4096)).unwrap()])
        .unwrap();
    let pool = BlockPool::new(
        &client,
        vec![CANARY; 2 * 8192],
        NonZeroUsize::new(8192).unwrap(),
    )
    .unwrap();
    match client.begin_read(readable.metadata(), pool.checkout(1).unwrap()) {
        Err(Error::SizeMismatch {
            index: 0,
            local: 8192,
            remote: 4096,
        }) => {}
        other => panic!("an 8192-byte view for a 4096-byte partner gave {other:?}"),
    }
    let mut view = pool.checkout(1).unwrap();
    view[0].set_size(4096).unwrap();
    let read = client.begin_read(readable.metadata(), view).unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    let back = read.into_descriptors().unwrap();
    assert_eq!(&back[0].as_slice().unwrap(), &pattern(600, 4096).as_slice());
    assert!(
        back[0].as_full_slice().unwrap()[4096..]
            .iter()
            .all(|&b| b == CANARY)
    );
}

/// Views of two pools move back and forth a hundred times, READ and WRITE,
/// and neither connector registers anything after its pool.
pub fn views_come_back_and_move_again_without_registering(h: &dyn Harness) {
    let server = connector(h, "again-server");
    let client = connector(h, "again-client");
    let (server_pool, client_pool) = (canary_pool(&server, 16), canary_pool(&client, 16));
    let before = (server.registrations(), client.registrations());
    assert_eq!(before, (1, 1), "one registration per pool");
    for round in 0..100u64 {
        let n = 1 + (round as usize % 4);
        let op = if round % 2 == 0 {
            OperationKind::Read
        } else {
            OperationKind::Write
        };
        let views = (
            server_pool.checkout(n).unwrap(),
            client_pool.checkout(n).unwrap(),
        );
        let seed = 1000 + round * 10;
        let (sent, received) = exchange((&server, &client), op, views, seed, |_| {});
        assert_filled(&received, seed, &format!("round {round} ({op:?})"));
        drop(sent);
    }
    assert_eq!((server.registrations(), client.registrations()), before);
    assert_eq!((server_pool.free(), client_pool.free()), (16, 16));
}

/// What [`counted_pool`] hands back.
struct Counted {
    connector: Connector,
    faults: crate::faults::Faults,
    pool: BlockPool,
    /// Deregistrations the backend was asked for.
    deregistrations: Arc<AtomicUsize>,
    /// 0 while the pool's memory lives; then 1 + the deregistrations seen.
    freed_after: Arc<AtomicUsize>,
    /// While set, `release` answers that the transfer is still running, as
    /// a backend that cannot abort one does.
    still_running: Arc<AtomicBool>,
}

/// A connector over the harness's agent `name` that counts its backend's
/// deregistrations, and a pool of `blocks` canary blocks whose memory
/// records that count when freed.
fn counted_pool(h: &dyn Harness, name: &str, blocks: usize) -> Counted {
    let deregistrations = Arc::new(AtomicUsize::new(0));
    let still_running = Arc::new(AtomicBool::new(false));
    let (counted, running) = (Arc::clone(&deregistrations), Arc::clone(&still_running));
    let (c, faults) = hooked_agent(h, name, true, move |_, call| match call {
        Call::Deregister => {
            counted.fetch_add(1, Ordering::SeqCst);
            None
        }
        Call::Release(_) if running.load(Ordering::SeqCst) => Some(Ok(Release::StillRunning)),
        _ => None,
    });
    let seen = Arc::clone(&deregistrations);
    let (memory, freed_after) =
        crate::testing::WatchedMemory::new(blocks * BLOCK, CANARY, move || {
            seen.load(Ordering::SeqCst)
        });
    let pool = BlockPool::new(&c, memory, block_size()).unwrap();
    Counted {
        connector: c,
        faults,
        pool,
        deregistrations,
        freed_after,
        still_running,
    }
}

/// A pool's registration ends only after its handle, every view and every
/// operation holding one are gone, in whatever order they go, and its
/// memory is freed only after that: dropped handle first, then a view in
/// an operation, then the last view.
pub fn deregistration_after_the_last_view(h: &dyn Harness) {
    let server = connector(h, "dereg-server");
    let Counted {
        connector: client,
        pool,
        deregistrations,
        freed_after,
        ..
    } = counted_pool(h, "dereg-client", 4);
    let views = pool.checkout(2).unwrap();
    let kept = pool.checkout(1).unwrap();
    drop(pool);
    let readable = server
        .create_readable(vec![Descriptor::new(pattern(700, 2 * BLOCK)).unwrap()])
        .unwrap();
    let mut views = views;
    let second = views.pop().unwrap();
    views[0].unsplit(second).unwrap();
    let read = client.begin_read(readable.metadata(), views).unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_eq!(
        deregistrations.load(Ordering::SeqCst),
        0,
        "an operation's view is live"
    );
    let back = read.into_descriptors().unwrap();
    assert_eq!(
        back[0].as_slice().unwrap(),
        pattern(700, 2 * BLOCK).as_slice()
    );
    drop(back);
    assert_eq!(deregistrations.load(Ordering::SeqCst), 0, "a view is live");
    assert_eq!(freed_after.load(Ordering::SeqCst), 0);
    drop(kept);
    assert_eq!(
        deregistrations.load(Ordering::SeqCst),
        1,
        "deregistered with the last view"
    );
    assert_eq!(
        freed_after.load(Ordering::SeqCst),
        2,
        "freed after one deregistration"
    );
}

/// A pool dropped while its views are in flight, and then the operations
/// holding them dropped mid-transfer: nothing is freed early. An active
/// operation's views go back once the backend let go (then the region is
/// deregistered and freed); a cancelled passive operation's views come back
/// only where the backend enforces revocation, and are leaked otherwise,
/// with the region still registered (a peer that read the metadata might
/// still write).
pub fn a_dropped_pool_with_views_in_flight(h: &dyn Harness) {
    // The active side: a READ into a dropped pool's views, held before it
    // reaches the backend, then dropped while the backend says it is still
    // running (it cannot abort it): the views stay until it lets go.
    let server = connector(h, "inflight-server");
    let Counted {
        connector: client,
        faults,
        pool,
        deregistrations,
        freed_after,
        still_running,
    } = counted_pool(h, "inflight-client", 2);
    let readable = server
        .create_readable(vec![Descriptor::new(pattern(800, 2 * BLOCK)).unwrap()])
        .unwrap();
    let run = pool.checkout_run(2).unwrap();
    drop(pool);
    still_running.store(true, Ordering::SeqCst);
    let stall = faults.stall_next_transfer();
    let read = client.begin_read(readable.metadata(), vec![run]).unwrap();
    drop(read);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        (
            deregistrations.load(Ordering::SeqCst),
            freed_after.load(Ordering::SeqCst)
        ),
        (0, 0),
        "deregistered or freed while the backend still ran the transfer"
    );
    still_running.store(false, Ordering::SeqCst);
    drop(stall);
    eventually(
        "the dropped READ's views went back and the pool's memory was freed",
        || freed_after.load(Ordering::SeqCst) != 0,
    );
    assert_eq!(deregistrations.load(Ordering::SeqCst), 1);
    assert_eq!(
        freed_after.load(Ordering::SeqCst),
        2,
        "freed after one deregistration"
    );
    readable.cancel();

    // The passive side: a readable over a dropped pool's views, the peer's
    // READ delayed, the readable dropped meanwhile.
    let Counted {
        connector: server,
        pool,
        deregistrations,
        freed_after,
        ..
    } = counted_pool(h, "inflight-server-passive", 2);
    let (client, client_faults) = faulty(h, "inflight-client-passive");
    let enforced = server.revocation_enforced();
    let mut views = pool.checkout(2).unwrap();
    fill(&mut views, 801);
    drop(pool);
    let readable = server.create_readable(views).unwrap();
    client_faults.delay_next_transfer(Duration::from_millis(50));
    let read = client
        .begin_read(
            readable.metadata(),
            vec![
                Descriptor::new(vec![0u8; BLOCK]).unwrap(),
                Descriptor::new(vec![0u8; BLOCK]).unwrap(),
            ],
        )
        .unwrap();
    drop(readable);
    // The READ ends one way or the other (refused after revocation, or done).
    let _ = read.wait_timeout(WAIT);
    drop(read);
    if enforced {
        eventually(
            "the cancelled readable's views went back and were freed",
            || freed_after.load(Ordering::SeqCst) != 0,
        );
        assert_eq!(
            freed_after.load(Ordering::SeqCst),
            2,
            "freed after one deregistration"
        );
    } else {
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            (
                deregistrations.load(Ordering::SeqCst),
                freed_after.load(Ordering::SeqCst)
            ),
            (0, 0),
            "a cancelled readable's views must leak, their region registered, where revocation is not enforced"
        );
    }
}

/// Two pools move blocks, the client unloads its idle peer, and they move
/// blocks again: what a backend prepared for the peer is made anew, and the
/// bytes are right each time.
pub fn pool_to_pool_after_the_peer_is_unloaded_and_reloaded(h: &dyn Harness) {
    let server = connector(h, "reload-server");
    let client = connector(h, "reload-client");
    let (server_pool, client_pool) = (canary_pool(&server, 8), canary_pool(&client, 8));
    for round in 0..4u64 {
        let mut server_views = server_pool.checkout_blocks(&[1, 2, 5]).unwrap();
        fill(&mut server_views, 900 + round);
        let readable = server.create_readable(server_views).unwrap();
        let read = client
            .begin_read(
                readable.metadata(),
                client_pool.checkout_blocks(&[0, 1, 6]).unwrap(),
            )
            .unwrap();
        read.wait_timeout(WAIT).unwrap();
        readable.wait_timeout(WAIT).unwrap();
        assert_filled(
            &read.into_descriptors().unwrap(),
            900 + round,
            &format!("round {round}"),
        );
        drop(readable.into_descriptors().unwrap());
        client.unload_idle_remote_agents();
        assert_eq!(client.idle_remote_agent_count(), 0);
    }
}

/// Two descriptors registered separately over the two halves of one
/// allocation of `2 * len` bytes (so one ends where the other begins), each
/// filled with `fill`.
fn adjacent_registrations(len: usize, fill: u8) -> [Descriptor; 2] {
    let mut memory = vec![fill; 2 * len].into_boxed_slice();
    let base = memory.as_mut_ptr();
    let owner: Arc<Box<[u8]>> = Arc::new(memory);
    [0, len].map(|offset| {
        let keep: Box<dyn std::any::Any + Send + Sync> = Box::new(Arc::clone(&owner));
        // SAFETY: `[base + offset, base + offset + len)` is half of the
        // boxed slice `owner` holds, which each descriptor keeps alive; the
        // two halves do not overlap, and nothing else reaches the slice.
        unsafe {
            Descriptor::from_raw_parts(base.add(offset), len, crate::Device::HOST, Some(keep))
                .unwrap()
        }
    })
}

/// Random sets of blocks, some in contiguous runs on both sides and some
/// scattered, READ and WRITTEN between two pools, and pairs that are
/// adjacent in memory but registered separately (on each side): every
/// block holds exactly its partner's bytes, whatever a backend merged, and
/// nothing around them moved.
pub fn merged_runs_move_the_bytes_of_their_descriptors(h: &dyn Harness) {
    const BLOCKS: usize = 32;
    let server = connector(h, "runs-server");
    let client = connector(h, "runs-client");
    let (server_pool, client_pool) = (canary_pool(&server, BLOCKS), canary_pool(&client, BLOCKS));
    let mut rng = 0x5eed_u64;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    for round in 0..24u64 {
        let op = if round % 2 == 0 {
            OperationKind::Read
        } else {
            OperationKind::Write
        };
        let count = 1 + next(12);
        // Even rounds of four: one run at the same place on both sides;
        // otherwise random blocks, or a run on one side only.
        let pick = |next: &mut dyn FnMut(usize) -> usize, run: bool| -> Vec<usize> {
            if run {
                let start = next(BLOCKS - count + 1);
                (start..start + count).collect()
            } else {
                let mut all: Vec<usize> = (0..BLOCKS).collect();
                for i in 0..count {
                    all.swap(i, i + next(BLOCKS - i));
                }
                all.truncate(count);
                all
            }
        };
        let server_blocks = pick(&mut next, round % 4 < 2);
        let client_blocks = pick(&mut next, round % 4 != 3);
        let server_views = server_pool.checkout_blocks(&server_blocks).unwrap();
        let client_views = client_pool.checkout_blocks(&client_blocks).unwrap();
        let seed = 2000 + round * 100;
        let what = format!("round {round} ({op:?}, {server_blocks:?} <-> {client_blocks:?})");
        let (sent, received) = exchange(
            (&server, &client),
            op,
            (server_views, client_views),
            seed,
            |_| {},
        );
        assert_filled(&received, seed, &what);
        assert_filled(&sent, seed, &what);
        // Every block not moved kept its canary, on both sides.
        drop((sent, received));
        for (pool, side) in [(&server_pool, "server"), (&client_pool, "client")] {
            let all = pool.checkout_run(BLOCKS).unwrap();
            let moved = if std::ptr::eq(pool, &server_pool) {
                &server_blocks
            } else {
                &client_blocks
            };
            for (b, bytes) in all.as_slice().unwrap().chunks(BLOCK).enumerate() {
                if !moved.contains(&b) {
                    assert!(
                        bytes.iter().all(|&x| x == CANARY),
                        "{what}: {side} block {b} was written"
                    );
                }
            }
            // The next round starts from canaries again.
            let mut all = all;
            all.as_mut_slice().unwrap().fill(CANARY);
        }
    }
    // Adjacent in memory, registered apart, on both sides: never one run.
    for op in [OperationKind::Read, OperationKind::Write] {
        let server_views = Vec::from(adjacent_registrations(BLOCK, CANARY));
        let client_views = Vec::from(adjacent_registrations(BLOCK, CANARY));
        let what = format!("adjacent registrations, {op:?}");
        let (sent, received) = exchange(
            (&server, &client),
            op,
            (server_views, client_views),
            3000,
            |_| {},
        );
        assert_filled(&received, 3000, &what);
        assert_filled(&sent, 3000, &what);
    }
}
