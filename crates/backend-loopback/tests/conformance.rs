//! The descriptor-core conformance suite on the loopback backend.
#![allow(clippy::unwrap_used)]

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::RegistrationBackend;
use descriptor_core::conformance::{self, Harness};
use rstest::rstest;

struct Loopback {
    fabric: Fabric,
}

impl Loopback {
    fn new() -> Loopback {
        Loopback {
            fabric: Fabric::new(),
        }
    }
}

impl Harness for Loopback {
    fn backend(&self, name: &str) -> Box<dyn RegistrationBackend> {
        Box::new(LoopbackBackend::new(&self.fabric, name).unwrap())
    }
}

#[test]
fn registration_is_idempotent_per_connector() {
    conformance::registration_is_idempotent_per_connector(&Loopback::new());
}

#[rstest]
#[case::one_small_block(&[64])]
#[case::one_large_block(&[8 << 20])]
#[case::many_blocks(&[4096; 64])]
#[case::uneven_blocks(&[1, 4095, 65536, 3])]
fn readable_then_read_moves_bytes(#[case] sizes: &[usize]) {
    conformance::readable_then_read_moves_bytes(&Loopback::new(), sizes);
}

#[rstest]
#[case::one_small_block(&[64])]
#[case::one_large_block(&[8 << 20])]
#[case::many_blocks(&[4096; 64])]
#[case::uneven_blocks(&[1, 4095, 65536, 3])]
fn writable_then_write_moves_bytes(#[case] sizes: &[usize]) {
    conformance::writable_then_write_moves_bytes(&Loopback::new(), sizes);
}

#[test]
fn pairing_errors_name_the_problem() {
    conformance::pairing_errors_name_the_problem(&Loopback::new());
}

#[test]
fn cancel_before_completion() {
    conformance::cancel_before_completion(&Loopback::new());
}

#[test]
fn cancel_after_completion_is_a_no_op() {
    conformance::cancel_after_completion_is_a_no_op(&Loopback::new());
}

#[test]
fn wait_timeout_expires_when_the_peer_never_acts() {
    conformance::wait_timeout_expires_when_the_peer_never_acts(&Loopback::new());
}

#[test]
fn dropping_an_in_flight_operation() {
    conformance::dropping_an_in_flight_operation(&Loopback::new());
}

#[test]
fn sixteen_threads_times_two_hundred_operations_to_one_peer() {
    conformance::concurrent_operations_share_one_peer(&Loopback::new(), 16, 200);
}

#[test]
fn metadata_round_trips_through_json() {
    conformance::metadata_round_trips_through_json(&Loopback::new());
}

#[test]
fn operations_are_futures() {
    conformance::operations_are_futures(&Loopback::new());
}

#[test]
fn passive_side_learns_of_completion_however_it_waits() {
    conformance::passive_side_learns_of_completion_however_it_waits(&Loopback::new());
}

#[test]
fn an_operation_nobody_follows_still_completes() {
    conformance::an_operation_nobody_follows_still_completes(&Loopback::new());
}

/// 16 x 1,000 by default; 16 x 10,000 with `RELIABILITY_LONG` set
/// (`cargo xtask test --long`).
#[test]
fn sixteen_threads_of_mixed_operations() {
    let per_thread = if std::env::var_os("RELIABILITY_LONG").is_some() {
        10_000
    } else {
        1_000
    };
    let before = test_support::rss_bytes();
    conformance::load(&Loopback::new(), 16, per_thread);
    let grew = test_support::rss_bytes() as i64 - before as i64;
    eprintln!("loopback load: 16 x {per_thread} operations, resident memory grew {grew} bytes");
}

#[test]
fn cancel_and_drop_race_completion_two_thousand_times() {
    conformance::cancel_and_drop_race_completion(&Loopback::new(), 2000);
}

#[test]
fn injected_failure_errors_the_operation_and_moves_nothing() {
    conformance::injected_failure_errors_the_operation_and_moves_nothing(&Loopback::new());
}

#[test]
fn stalled_transfer_is_in_progress_then_complete() {
    conformance::stalled_transfer_is_in_progress_then_complete(&Loopback::new());
}

#[test]
fn dropped_notification_leaves_the_passive_side_waiting() {
    conformance::dropped_notification_leaves_the_passive_side_waiting(&Loopback::new());
}

#[test]
fn vanished_peer_completes_nothing() {
    conformance::vanished_peer_completes_nothing(&Loopback::new());
}
