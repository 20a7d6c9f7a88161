//! Counts kept per thread: exact however many threads count, whether they
//! hold a slot, share the last line, or take a slot another thread gave back.
#![allow(clippy::unwrap_used)]

use std::sync::{Barrier, OnceLock};

use super::*;

/// Each of `threads` threads (all alive at once when `together`) adds 1 to
/// count 0 and its index to count 1, `rounds` times.
fn count_from(threads: usize, rounds: u64, together: bool) -> Cells {
    let cells = Cells::new(2);
    let barrier = Barrier::new(if together { threads } else { 1 });
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (cells, barrier) = (&cells, &barrier);
            let counting = scope.spawn(move || {
                if together {
                    // All of them alive before any counts: more threads
                    // than slots, so some share the last line.
                    barrier.wait();
                }
                let line = cells.line(Shard::current());
                for _ in 0..rounds {
                    line.add(0, 1);
                    line.add(1, t as u64);
                }
            });
            if !together {
                counting.join().unwrap();
            }
        }
    });
    cells
}

#[test]
fn more_threads_than_slots_at_once_add_up_exactly() {
    let threads = OWNED + 16;
    let cells = count_from(threads, 10_000, true);
    assert_eq!(cells.sum(0), threads as u64 * 10_000);
    let indices: u64 = (0..threads as u64).sum();
    assert_eq!(cells.sum(1), indices * 10_000);
}

#[test]
fn a_slot_given_back_keeps_its_counts_for_the_next_holder() {
    // Threads one after another, many more than slots: each takes a slot
    // that an exited thread gave back, and adds to what it left.
    let threads = 4 * OWNED;
    let cells = count_from(threads, 100, false);
    assert_eq!(cells.sum(0), threads as u64 * 100);
    let indices: u64 = (0..threads as u64).sum();
    assert_eq!(cells.sum(1), indices * 100);
}

#[test]
fn counts_wrap_as_atomic_additions_do() {
    let cells = Cells::new(1);
    let line = cells.line(Shard::current());
    line.add(0, u64::MAX);
    line.add(0, 2);
    assert_eq!(cells.sum(0), 1);
}

#[test]
fn a_count_past_the_line_is_ignored_not_a_panic() {
    let cells = Cells::new(3);
    cells.line(Shard::current()).add(BLOCK * 4, 1);
    assert_eq!((0..3).map(|i| cells.sum(i)).sum::<u64>(), 0);
    assert_eq!(cells.sum(BLOCK * 4), 0);
}

#[test]
fn a_histogram_counts_each_observation_in_the_first_bucket_that_holds_it() {
    const BOUNDS: &[f64] = &[1.0, 2.0, 4.0];
    // After two counts of something else (one from the line's first).
    let h = Buckets::new(BOUNDS, 1.0, 1);
    let cells = Cells::new(2 + h.len());
    let line = cells.line(Shard::current());
    for value in [0, 1, 2, 3, 4, 5, 1_000] {
        h.observe(&line, 1, value);
    }
    let per_bucket: Vec<u64> = (2..2 + BOUNDS.len() + 1).map(|i| cells.sum(i)).collect();
    assert_eq!(per_bucket, [2, 1, 2, 2]);
    assert_eq!(cells.sum(2 + BOUNDS.len() + 1), 1_015);
    assert_eq!((cells.sum(0), cells.sum(1)), (0, 0));
}

#[test]
fn a_thread_local_destructor_that_counts_at_exit_counts_exactly() {
    static CELLS: OnceLock<Cells> = OnceLock::new();
    struct AtExit;
    impl Drop for AtExit {
        fn drop(&mut self) {
            let cells = CELLS.get().unwrap();
            cells.line(Shard::current()).add(0, 1);
        }
    }
    thread_local! {
        static AT_EXIT: AtExit = const { AtExit };
    }
    let cells = CELLS.get_or_init(|| Cells::new(1));
    // Thread-local destructors run in the reverse order of their
    // registration: with the slot taken first, the destructor counts into
    // the thread's own line before the slot is given back; with the
    // destructor registered first, it counts after, into the shared line.
    for slot_first in [true, false] {
        std::thread::spawn(move || {
            if slot_first {
                cells.line(Shard::current()).add(0, 1);
            }
            AT_EXIT.with(|_| ());
            if !slot_first {
                cells.line(Shard::current()).add(0, 1);
            }
        })
        .join()
        .unwrap();
    }
    assert_eq!(cells.sum(0), 4);
}

#[test]
fn a_histograms_count_is_its_buckets_total() {
    const BOUNDS: &[f64] = &[1.0, 2.0];
    let h = Buckets::new(BOUNDS, 1.0, 0);
    let cells = Cells::new(h.len());
    let line = cells.line(Shard::current());
    for value in [0, 2, 3, 9] {
        h.observe(&line, 0, value);
    }
    assert_eq!(h.count(&cells, 0), 4);
    // The sum is not a bucket.
    assert_eq!(cells.sum(BOUNDS.len() + 1), 14);
}
