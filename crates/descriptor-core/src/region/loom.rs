//! Registered regions shared by views, model-checked with loom: every
//! interleaving of checkouts, drops, forgotten views, racing registrations
//! and the last drops of a pool, a view and an abandoned operation.
//!
//! Run by `cargo xtask test` with the operation models
//! (`RUSTFLAGS="--cfg loom" cargo test -p descriptor-core --lib --release loom`).
//! Invariants checked in every interleaving:
//! - no block is handed out while a live (or forgotten) view holds it, and
//!   the free count is the blocks no view holds;
//! - of two registrations racing for one region exactly one survives, and
//!   the other is deregistered;
//! - the region is deregistered exactly once, after its last handle, view
//!   and operation are gone, and its memory is freed only after that (never
//!   if deregistration failed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};

use loom::thread;

use crate::backend::{RegistrationBackend, TransferId, TransferState};
use crate::buffer::MemoryBuffer;
use crate::connector::Connector;
use crate::descriptor::Descriptor;
use crate::metadata::OperationKind;
use crate::operation::Held;
use crate::operation::state::{OpShared, OperationStatus, Pending, Role};
use crate::pool::BlockPool;
use crate::sync::Ordering;
use crate::testing::{Scripted, WatchedMemory};

/// Interleavings with up to this many preemptions are explored exhaustively.
const PREEMPTION_BOUND: Option<usize> = Some(4);

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = PREEMPTION_BOUND;
    builder.check(f);
}

fn scripted() -> (Arc<Scripted>, Connector) {
    let backend = Arc::new(Scripted::new(true, false));
    let connector = Connector::from_arc(Arc::clone(&backend) as Arc<dyn RegistrationBackend>);
    (backend, connector)
}

const BLOCK: usize = 8;

fn pool(connector: &Connector, blocks: usize, memory: impl MemoryBuffer) -> BlockPool {
    let pool = BlockPool::new(connector, memory, NonZeroUsize::new(BLOCK).unwrap()).unwrap();
    assert_eq!(pool.blocks(), blocks);
    pool
}

/// Memory that records the backend's deregistrations when freed.
fn watched(backend: &Arc<Scripted>, len: usize) -> (WatchedMemory, Arc<StdAtomicUsize>) {
    let backend = Arc::clone(backend);
    WatchedMemory::new(len, 0, move || backend.deregistered.load(Ordering::SeqCst))
}

fn block_of(view: &Descriptor) -> usize {
    view.block_index().unwrap()
}

/// Two threads check blocks out while a third drops a view and a fourth
/// forgets one: the views alive at the end hold distinct blocks, none of
/// them the forgotten one's, and the free count is what nobody holds.
#[test]
fn loom_checkouts_against_drops_never_hand_a_held_block_out() {
    model(|| {
        let (_, connector) = scripted();
        let pool = pool(&connector, 3, vec![0u8; 3 * BLOCK]);
        let dropped = pool.checkout(1).unwrap().pop().unwrap();
        let forgotten = pool.checkout(1).unwrap().pop().unwrap();
        let forgotten_block = block_of(&forgotten);
        let dropper = thread::spawn(move || drop(dropped));
        let forgetter = thread::spawn(move || std::mem::forget(forgotten));
        let other = pool.clone();
        let taker = thread::spawn(move || other.checkout(1).and_then(|mut v| v.pop()));
        let mine = pool.checkout(1).and_then(|mut v| v.pop());
        dropper.join().unwrap();
        forgetter.join().unwrap();
        let theirs = taker.join().unwrap();
        let live: Vec<Descriptor> = mine.into_iter().chain(theirs).collect();
        let mut blocks: Vec<usize> = live.iter().map(block_of).collect();
        assert!(
            !blocks.contains(&forgotten_block),
            "a forgotten view's block was reissued"
        );
        blocks.sort_unstable();
        blocks.dedup();
        assert_eq!(blocks.len(), live.len(), "one block handed out twice");
        assert_eq!(pool.free(), 3 - 1 - live.len());
    });
}

/// Two views of one region register with one connector at once: exactly one
/// registration survives, the loser's is ended, and the last view's drop
/// ends the winner's.
#[test]
fn loom_racing_registrations_leave_exactly_one() {
    model(|| {
        let (backend, connector) = scripted();
        let mut first = Descriptor::new(vec![0u8; 16]).unwrap();
        let mut second = first.split_off(8).unwrap();
        let other = connector.clone();
        let racer = thread::spawn(move || {
            second.register_memory(&other).unwrap();
            second
        });
        first.register_memory(&connector).unwrap();
        let second = racer.join().unwrap();
        let made = backend.registered.load(Ordering::SeqCst);
        let ended = backend.deregistered.load(Ordering::SeqCst);
        assert_eq!(made - ended, 1, "exactly one registration survives");
        assert_eq!(first.is_registered(), second.is_registered());
        drop((first, second));
        assert_eq!(backend.deregistered.load(Ordering::SeqCst), made);
    });
}

/// The pool handle, a view dropped by the user and a view held by an
/// abandoned operation (whose transfer the engine releases) go in every
/// order: one deregistration, after all three, and the memory freed after it;
/// never freed when deregistration fails.
fn last_drops(deregistration_fails: bool) {
    model(move || {
        let (backend, connector) = scripted();
        backend
            .deregister_fails
            .store(deregistration_fails, Ordering::SeqCst);
        let (memory, freed_after) = watched(&backend, 2 * BLOCK);
        let pool = pool(&connector, 2, memory);
        let mut views = pool.checkout(2).unwrap();
        let in_flight = views.pop().unwrap();
        let user = views.pop().unwrap();
        // An active operation whose transfer is still posted, dropped by
        // its owner: the engine frees its view once the backend let go.
        backend.set_poll(TransferState::Done);
        backend.live_transfers.fetch_add(1, Ordering::SeqCst);
        let op = OpShared::new(
            Arc::clone(&backend) as Arc<dyn RegistrationBackend>,
            Role {
                kind: OperationKind::Read,
                passive: false,
            },
            BLOCK,
            OperationStatus::InProgress,
            Pending::Transfer(TransferId(1)),
            None,
            None,
        );
        let engine_op = Arc::clone(&op);
        let engine = thread::spawn(move || {
            while !engine_op.drive() {
                thread::yield_now();
            }
        });
        let handle = thread::spawn(move || drop(pool));
        let owner = thread::spawn(move || op.abandon(Held::new(vec![in_flight])));
        drop(user);
        engine.join().unwrap();
        handle.join().unwrap();
        owner.join().unwrap();
        let freed = freed_after.load(StdOrdering::SeqCst);
        if deregistration_fails {
            assert_eq!(freed, 0, "freed though the backend may still hand it out");
        } else {
            assert_eq!(backend.deregistered.load(Ordering::SeqCst), 1);
            assert_eq!(freed, 2, "freed, after exactly one deregistration");
        }
    });
}

#[test]
fn loom_the_last_of_pool_view_and_operation_deregisters_once_then_frees() {
    last_drops(false);
}

#[test]
fn loom_a_failed_deregistration_never_frees() {
    last_drops(true);
}
