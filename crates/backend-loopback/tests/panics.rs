//! Panic injection: a wrapper over the loopback backend panics in one trait
//! method (once), in turn for each method, while both connectors run a round
//! of operations: a read (its transfer delayed), a write, a write dropped
//! mid-flight (its transfer delayed), idle peers unloaded. Whatever panics
//! where, afterwards
//! - both connectors still serve a read and a write, bytes checked;
//! - nothing hangs (every wait is bounded);
//! - no memory is freed while a transfer may touch it: `cargo xtask test` runs
//!   this file under AddressSanitizer, which reports any use-after-free, and a
//!   victim allocation checks that the dropped write lands nowhere.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use backend_loopback::Fabric;
use common::hooked;
use descriptor_core::Connector;
use descriptor_core::conformance::{filled, pattern, zeroed_one};
use descriptor_core::faults::Faults;
use rstest::rstest;

const BOUND: Duration = Duration::from_secs(20);

struct Side {
    connector: Connector,
    faults: Faults,
    /// The method that panics the next time it is called (then disarmed).
    armed: Arc<Mutex<Option<&'static str>>>,
    fired: Arc<AtomicUsize>,
}

fn side(fabric: &Fabric, name: &str) -> Side {
    let armed: Arc<Mutex<Option<&'static str>>> = Arc::default();
    let fired = Arc::new(AtomicUsize::new(0));
    let (connector, faults) = {
        let (armed, fired) = (Arc::clone(&armed), Arc::clone(&fired));
        hooked(fabric, name, true, move |_, call| {
            let fire = {
                let mut armed = armed.lock().unwrap();
                let fire = *armed == Some(call.name());
                if fire {
                    *armed = None;
                }
                fire
            };
            if fire {
                fired.fetch_add(1, Ordering::SeqCst);
                panic!("injected: {} panicked", call.name());
            }
            None
        })
    };
    Side {
        connector,
        faults,
        armed,
        fired,
    }
}

/// Runs `f`, letting an injected panic out as `Err`.
fn attempt<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// One round of everything a connector does; any step may panic.
fn round(server: &Side, client: &Side, seed: u64) {
    const N: usize = 4096;
    // Readable -> read, its transfer delayed: the engine polls it (a
    // transfer that ends inside `post` is never polled).
    attempt(|| {
        let readable = server.connector.create_readable(filled(seed, N)).unwrap();
        client.faults.delay_next_transfer(Duration::from_millis(5));
        let read = client
            .connector
            .begin_read(readable.metadata(), zeroed_one(N))
            .unwrap();
        let _ = read.wait_timeout(BOUND);
        let _ = readable.wait_timeout(Duration::from_millis(200));
    });
    // Writable -> write.
    attempt(|| {
        let writable = server.connector.create_writable(zeroed_one(N)).unwrap();
        let write = client
            .connector
            .begin_write(filled(seed + 1, N), writable.metadata())
            .unwrap();
        let _ = write.wait_timeout(BOUND);
        let _ = writable.wait_timeout(Duration::from_millis(200));
    });
    // A write dropped while its transfer waits, then runs: it must land in
    // the writable's buffer or nowhere, never in freed memory.
    attempt(|| {
        let writable = server.connector.create_writable(zeroed_one(N)).unwrap();
        client.faults.delay_next_transfer(Duration::from_millis(50));
        let write = client
            .connector
            .begin_write(filled(seed + 2, N), writable.metadata())
            .unwrap();
        let _ = attempt(move || drop(write));
        let victims: Vec<Vec<u8>> = (0..64).map(|_| vec![0xAA; N]).collect();
        std::thread::sleep(Duration::from_millis(150));
        for v in &victims {
            assert!(
                v.iter().all(|&b| b == 0xAA),
                "a dropped write landed in freed memory"
            );
        }
        drop(writable);
    });
    attempt(|| client.connector.unload_idle_remote_agents());
}

fn healthy(server: &Side, client: &Side) {
    const N: usize = 65536;
    let readable = server.connector.create_readable(filled(77, N)).unwrap();
    let read = client
        .connector
        .begin_read(readable.metadata(), zeroed_one(N))
        .unwrap();
    read.wait_timeout(BOUND).unwrap();
    readable.wait_timeout(BOUND).unwrap();
    let got = read.into_descriptors().unwrap();
    assert_eq!(got[0].as_slice().unwrap(), pattern(77, N));

    let writable = server.connector.create_writable(zeroed_one(N)).unwrap();
    let write = client
        .connector
        .begin_write(filled(78, N), writable.metadata())
        .unwrap();
    write.wait_timeout(BOUND).unwrap();
    writable.wait_timeout(BOUND).unwrap();
    let got = writable.into_descriptors().unwrap();
    assert_eq!(got[0].as_slice().unwrap(), pattern(78, N));
}

#[rstest]
fn a_panic_in_any_backend_method_leaves_the_connectors_serving(
    #[values(
        "register",
        "deregister",
        "expose",
        "revoke",
        "load_remote",
        "unload_remote",
        "post",
        "poll",
        "release",
        "drain_notifications"
    )]
    method: &'static str,
) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let fabric = Fabric::new();
        let server = side(&fabric, "server");
        let client = side(&fabric, "client");
        *server.armed.lock().unwrap() = Some(method);
        *client.armed.lock().unwrap() = Some(method);
        for seed in 0..3 {
            round(&server, &client, 10 * seed);
        }
        let fired = server.fired.load(Ordering::SeqCst) + client.fired.load(Ordering::SeqCst);
        *server.armed.lock().unwrap() = None;
        *client.armed.lock().unwrap() = None;
        healthy(&server, &client);
        let _ = tx.send(fired);
    });
    let fired = rx
        .recv_timeout(BOUND * 4)
        .unwrap_or_else(|_| panic!("{method}: hung, or the connectors stopped serving"));
    assert!(fired >= 1, "{method} was never called, so never panicked");
}
