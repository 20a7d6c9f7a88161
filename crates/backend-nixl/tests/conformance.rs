//! The descriptor-core conformance suite on real NIXL (UCX, DRAM), once with
//! Dynamo-style full agent metadata and once with exposure-scoped metadata.
#![allow(clippy::unwrap_used)]

use backend_nixl::MetadataScope;
use descriptor_core::conformance;
use rstest::rstest;
use test_support::{Nixl, runtime_available};

macro_rules! suite {
    ($($name:ident => |$h:ident| $body:expr;)*) => {
        $(
            #[rstest]
            fn $name(#[values(MetadataScope::Agent, MetadataScope::Exposed)] scope: MetadataScope) {
                if runtime_available() {
                    let $h = &Nixl::new(scope);
                    $body
                }
            }
        )*
    };
}

suite! {
    registration_is_idempotent_per_connector => |h| conformance::registration_is_idempotent_per_connector(h);
    read_one_block => |h| conformance::readable_then_read_moves_bytes(h, &[4096]);
    read_large_block => |h| conformance::readable_then_read_moves_bytes(h, &[8 << 20]);
    read_many_blocks => |h| conformance::readable_then_read_moves_bytes(h, &[65536; 64]);
    read_uneven_blocks => |h| conformance::readable_then_read_moves_bytes(h, &[1, 4095, 65536, 3]);
    write_one_block => |h| conformance::writable_then_write_moves_bytes(h, &[4096]);
    write_large_block => |h| conformance::writable_then_write_moves_bytes(h, &[8 << 20]);
    write_many_blocks => |h| conformance::writable_then_write_moves_bytes(h, &[65536; 64]);
    write_uneven_blocks => |h| conformance::writable_then_write_moves_bytes(h, &[1, 4095, 65536, 3]);
    pairing_errors_name_the_problem => |h| conformance::pairing_errors_name_the_problem(h);
    cancel_before_completion => |h| conformance::cancel_before_completion(h);
    cancel_after_completion_is_a_no_op => |h| conformance::cancel_after_completion_is_a_no_op(h);
    wait_timeout_expires_when_the_peer_never_acts => |h| conformance::wait_timeout_expires_when_the_peer_never_acts(h);
    dropping_an_in_flight_operation => |h| conformance::dropping_an_in_flight_operation(h);
    sixteen_threads_times_two_hundred_operations_to_one_peer => |h| conformance::concurrent_operations_share_one_peer(h, 16, 200);
    metadata_round_trips_through_json => |h| conformance::metadata_round_trips_through_json(h);
    operations_are_futures => |h| conformance::operations_are_futures(h);
    passive_side_learns_of_completion_however_it_waits => |h| conformance::passive_side_learns_of_completion_however_it_waits(h);
    an_operation_nobody_follows_still_completes => |h| conformance::an_operation_nobody_follows_still_completes(h);
    injected_failure_errors_the_operation_and_moves_nothing => |h| conformance::injected_failure_errors_the_operation_and_moves_nothing(h);
    stalled_transfer_is_in_progress_then_complete => |h| conformance::stalled_transfer_is_in_progress_then_complete(h);
    dropped_notification_leaves_the_passive_side_waiting => |h| conformance::dropped_notification_leaves_the_passive_side_waiting(h);
    vanished_peer_completes_nothing => |h| conformance::vanished_peer_completes_nothing(h);
}

#[test]
fn four_threads_times_a_thousand_mixed_operations() {
    if runtime_available() {
        let before = test_support::rss_bytes();
        conformance::load(&Nixl::new(MetadataScope::Agent), 4, 1000);
        let grew = test_support::rss_bytes() as i64 - before as i64;
        eprintln!("nixl load: 4,000 operations, resident memory grew {grew} bytes");
    }
}

#[test]
fn cancel_and_drop_race_completion_a_thousand_times() {
    if runtime_available() {
        conformance::cancel_and_drop_race_completion(&Nixl::new(MetadataScope::Agent), 1000);
    }
}
