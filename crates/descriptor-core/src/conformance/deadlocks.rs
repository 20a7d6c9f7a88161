//! Conformance checks that nothing deadlocks: no backend, hook or waker is
//! called with a lock held. Each scenario runs inside `within`, so a
//! deadlock fails the check, not the run.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use crate::faults::Faults;
use crate::testing::{eventually, within};
use crate::{Connector, Error, OperationFuture, OperationStatus};

use super::{
    Call, Harness, WAIT, assert_pattern, connector, descriptors, faulty, hooked_agent, zeroed,
};

/// A connector READs its own readable while the transfer is delayed: both
/// complete. (The delay thread once held the transfer's lock while the event
/// hook of the same agent polled that transfer: a self-deadlock.)
pub fn reading_its_own_readable_with_a_delayed_transfer_completes(h: &dyn Harness) {
    let (solo, faults) = faulty(h, "solo");
    let read = within(
        "a delayed read of the connector's own readable",
        move || {
            let readable = solo.create_readable(descriptors(130, &[4096])).unwrap();
            faults.delay_next_transfer(Duration::from_millis(50));
            let read = solo
                .begin_read(readable.metadata(), zeroed(&[4096]))
                .unwrap();
            read.wait_timeout(WAIT).unwrap();
            readable.wait_timeout(WAIT).unwrap();
            read.into_descriptors().unwrap()
        },
    );
    assert_pattern(&read, 130, "a read of the connector's own readable");
}

/// Two connectors READ each other's readable, both transfers delayed: both
/// complete. (Each delay thread once held its transfer's lock and, through
/// the peer's event hook, waited for the other's: an ABBA deadlock.)
pub fn crossed_delayed_reads_complete(h: &dyn Harness) {
    const N: usize = 32 << 20;
    let (a, fa) = faulty(h, "crossed-a");
    let (b, fb) = faulty(h, "crossed-b");
    let (got_a, got_b) = within("two crossed delayed reads", move || {
        let ra = a.create_readable(descriptors(131, &[N])).unwrap();
        let rb = b.create_readable(descriptors(132, &[N])).unwrap();
        fa.delay_next_transfer(Duration::from_millis(200));
        fb.delay_next_transfer(Duration::from_millis(200));
        let read_a = a.begin_read(rb.metadata(), zeroed(&[N])).unwrap();
        let read_b = b.begin_read(ra.metadata(), zeroed(&[N])).unwrap();
        read_a.wait_timeout(WAIT).unwrap();
        read_b.wait_timeout(WAIT).unwrap();
        (
            read_a.into_descriptors().unwrap(),
            read_b.into_descriptors().unwrap(),
        )
    });
    assert_pattern(&got_a, 132, "a's read of b");
    assert_pattern(&got_b, 131, "b's read of a");
}

/// A waker that drops the task (here: the operation's future) when woken, as
/// an executor shut down before its tasks are woken does.
struct DropOnWake(Mutex<Option<OperationFuture>>);

impl Wake for DropOnWake {
    fn wake(self: Arc<Self>) {
        let future = self.0.lock().unwrap().take();
        drop(future);
    }
}

/// A waker that drops the very operation it wakes, woken when the peer's
/// READ completes it, deadlocks nobody: the peer's read returns and the
/// operation is gone. (Wakers were once woken under the operation's lock.)
pub fn a_waker_that_drops_its_operation_deadlocks_nobody(h: &dyn Harness) {
    let server = connector(h, "dropwake-server");
    let client = connector(h, "dropwake-client");
    let read = within("a read whose peer's waker drops its operation", move || {
        let readable = server.create_readable(descriptors(133, &[4096])).unwrap();
        let meta = readable.metadata().clone();
        let mut future = readable.into_future();
        let wake = Arc::new(DropOnWake(Mutex::new(None)));
        let waker = Waker::from(Arc::clone(&wake));
        assert!(
            Pin::new(&mut future)
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        *wake.0.lock().unwrap() = Some(future);
        let read = client.begin_read(&meta, zeroed(&[4096])).unwrap();
        read.wait_timeout(WAIT).unwrap();
        eventually("the woken waker dropped the readable", || {
            wake.0.lock().unwrap().is_none()
        });
        read.into_descriptors().unwrap()
    });
    assert_pattern(&read, 133, "the read of a readable its waker dropped");
}

/// `status()` never blocks: read from another thread while the backend is
/// inside `poll`, `release` and `revoke` of that very operation, it returns
/// (were it to wait behind the call, the bounded wait would fail the check),
/// and inside `release` the outcome is already decided.
pub fn status_never_blocks_behind_poll_release_or_revoke(h: &dyn Harness) {
    type Probe = Arc<dyn Fn(&'static str) + Send + Sync>;
    /// An agent that runs the probe (once set) inside `poll`, `release` and `revoke`.
    fn probed(
        h: &dyn Harness,
        name: &str,
        probe: &Arc<Mutex<Option<Probe>>>,
    ) -> (Connector, Faults) {
        let probe = Arc::clone(probe);
        hooked_agent(h, name, true, move |_, call| {
            if matches!(call, Call::Poll(_) | Call::Release(_) | Call::Revoke) {
                let probe = probe.lock().unwrap().clone();
                if let Some(probe) = probe {
                    probe(call.name());
                }
            }
            None
        })
    }
    fn status_from_another_thread(
        status: impl Fn() -> OperationStatus + Send + 'static,
    ) -> OperationStatus {
        within("status() read while the backend is inside a call", status)
    }

    let probe: Arc<Mutex<Option<Probe>>> = Arc::default();
    let (client, faults) = probed(h, "status-client", &probe);
    let server_probe: Arc<Mutex<Option<Probe>>> = Arc::default();
    let (server, _) = probed(h, "status-server", &server_probe);

    // An active operation: probed in `poll` (the engine's and the waiter's),
    // then in `release` when it is cancelled.
    let readable = Arc::new(server.create_readable(descriptors(134, &[4096])).unwrap());
    faults.delay_next_transfer(Duration::from_secs(3600));
    let read = Arc::new(
        client
            .begin_read(readable.metadata(), zeroed(&[4096]))
            .unwrap(),
    );
    let seen: Arc<Mutex<Vec<(&'static str, OperationStatus)>>> = Arc::default();
    {
        let (read, seen) = (Arc::clone(&read), Arc::clone(&seen));
        *probe.lock().unwrap() = Some(Arc::new(move |call| {
            let read = Arc::clone(&read);
            let status = status_from_another_thread(move || read.status());
            seen.lock().unwrap().push((call, status));
        }));
    }
    let early = read.wait_timeout(Duration::from_millis(20));
    assert!(matches!(early, Err(Error::TimedOut(_))), "{early:?}");
    read.cancel();
    *probe.lock().unwrap() = None; // the probe holds the operation: let go of it
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.contains(&("release", OperationStatus::Cancelled)),
        "inside release the status was already decided: {seen:?}"
    );
    assert!(
        seen.iter().all(|(call, status)| *call != "poll"
            || matches!(
                status,
                OperationStatus::InProgress | OperationStatus::Cancelled
            )),
        "{seen:?}"
    );

    // A passive operation: probed in `revoke` when it is cancelled.
    let seen: Arc<Mutex<Vec<OperationStatus>>> = Arc::default();
    {
        let (readable, seen) = (Arc::clone(&readable), Arc::clone(&seen));
        *server_probe.lock().unwrap() = Some(Arc::new(move |_| {
            let readable = Arc::clone(&readable);
            seen.lock()
                .unwrap()
                .push(status_from_another_thread(move || readable.status()));
        }));
    }
    readable.cancel();
    *server_probe.lock().unwrap() = None;
    assert_eq!(*seen.lock().unwrap(), [OperationStatus::Cancelled]);
}
