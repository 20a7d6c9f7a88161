//! Every timing knob of this backend in one place ([`Tuning`]), and the
//! route a transfer's notification takes ([`Notifications`]).
//!
//! The defaults are this machine's measured choice; the measurements and the
//! options tried live in the decision records under `docs/decisions/`, named
//! on each field. Change them with [`NixlBackendBuilder::tuning`] to measure
//! another host; the benchmark (`cargo xtask bench`) shows the effect.
//!
//! [`NixlBackendBuilder::tuning`]: crate::NixlBackendBuilder::tuning

use std::time::Duration;

/// The timing knobs of the watcher thread, of a waiting thread and of NIXL's
/// progress thread. Start from [`Tuning::default()`] and set fields:
///
/// ```
/// use std::time::Duration;
/// use backend_nixl::{NixlBackend, Tuning};
///
/// let mut tuning = Tuning::default();
/// tuning.spin = Duration::from_micros(300);
/// let builder = NixlBackend::builder("worker-7").tuning(tuning);
/// # let _ = builder;
/// ```
///
/// | field | default | why |
/// |---|---|---|
/// | [`spin`](Self::spin) | 100 µs | completions come soon after a post or an exposure |
/// | [`first_sleep`](Self::first_sleep) | 10 µs | back-off starts small, doubles each idle round |
/// | [`transfer_cap`](Self::transfer_cap) | 200 µs | longest nap while a transfer is in flight |
/// | [`notify_cap`](Self::notify_cap) | 1 ms | longest nap while only a peer's notification is awaited |
/// | [`wait_assist`](Self::wait_assist) | 200 µs | a waiter that polls itself needs no wake-up |
/// | [`assisted`](Self::assisted) | 20 µs | the watcher keeps off a transfer its waiter polls |
/// | [`follow_at_post`](Self::follow_at_post) | 64 KiB | waking the watcher at post costs a small transfer more than it gains |
/// | [`progress_thread_delay`](Self::progress_thread_delay) | 100 ms | NIXL's thread wakes on traffic: the delay sets only the idle cost |
/// | [`unreachable_for`](Self::unreachable_for) | 60 s | a dead peer retried leaks two sockets per attempt in UCX |
/// | [`compact_peers_above`](Self::compact_peers_above) | 262,144 regions | bounds a long-lived peer's memory; each compaction leaks file descriptors in NIXL 1.5.1 |
/// | [`parked_peers`](Self::parked_peers) | 64 | a live peer unloaded leaks two sockets in NIXL 1.5.1; one kept loaded costs only its regions |
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// How long the watcher polls without sleeping (yielding) after it is
    /// handed something or sees an event. Why: docs/decisions/0002-watcher-thread.md.
    pub spin: Duration,
    /// The watcher's first sleep after the spin window; each idle round
    /// doubles it up to a cap. Why: docs/decisions/0002-watcher-thread.md.
    pub first_sleep: Duration,
    /// The watcher's longest sleep while a transfer of this agent is in
    /// flight. Why: docs/decisions/0002-watcher-thread.md.
    pub transfer_cap: Duration,
    /// The watcher's longest sleep while only a peer's notification is
    /// awaited. Why: docs/decisions/0002-watcher-thread.md.
    pub notify_cap: Duration,
    /// How long a thread blocked on its own transfer polls it itself before
    /// it sleeps ([`RegistrationBackend::wait_assist`]). Why:
    /// docs/decisions/0002-watcher-thread.md.
    ///
    /// [`RegistrationBackend::wait_assist`]: descriptor_core::RegistrationBackend::wait_assist
    pub wait_assist: Duration,
    /// The watcher leaves alone a transfer that a waiting thread polled this
    /// recently: two threads asking NIXL about one transfer only contend.
    /// Why: docs/decisions/0002-watcher-thread.md.
    pub assisted: Duration,
    /// A transfer of more bytes than this is handed to the watcher when it
    /// is posted; a smaller one only once the connector awaits its end
    /// ([`RegistrationBackend::awaiting_end`]) or cancels it. Why:
    /// docs/decisions/0002-watcher-thread.md.
    ///
    /// The price: a small transfer that nobody waits on, polls or cancels is
    /// moved on (its notification sent) only at the next look at the
    /// operation, or at the connector's safety poll (its engine's own look
    /// while work is in flight, `EVENT_SAFETY_POLL` in descriptor-core's
    /// `engine.rs`): docs/decisions/0002-watcher-thread.md, "Consequences".
    ///
    /// [`RegistrationBackend::awaiting_end`]: descriptor_core::RegistrationBackend::awaiting_end
    pub follow_at_post: usize,
    /// The longest NIXL's progress thread, when on, sleeps waiting for
    /// traffic. It wakes at once on traffic, so this sets the idle cost, not
    /// the latency; NIXL's own default, 0, spins a core per agent. Why:
    /// docs/decisions/0001-nixl-progress-thread-and-delay.md.
    pub progress_thread_delay: Duration,
    /// How long a peer's connection info that UCX could not connect to (the
    /// peer exited) is remembered: loads of it meanwhile are refused at
    /// once, without a new attempt. Each attempt leaves a socket in UCX that
    /// nothing can close, so this bounds what a worker retrying a dead peer
    /// leaks: two file descriptors per this time, whatever the retries. A
    /// peer restarted under its name has new connection info and is not
    /// affected; zero turns it off. Why: crate `unreachable` module docs.
    pub unreachable_for: Duration,
    /// Regions of one peer NIXL may hold (every region of every blob of
    /// the peer loaded so far) before the peer is reloaded under a fresh
    /// NIXL name with only the regions of its latest blobs, which bounds
    /// the memory a long-lived peer that registers fresh memory per
    /// operation costs. Each such compaction makes new UCX endpoints to the
    /// peer, and NIXL 1.5.1 leaks file descriptors for the old ones: a
    /// trade of memory for file descriptors, and the default makes
    /// compactions rare. 0 turns them off; values under 4,096 count as
    /// 4,096. Why the default, with the soak's numbers:
    /// docs/decisions/0013-peer-record-compaction.md.
    pub compact_peers_above: usize,
    /// Peers the connector unloaded (idle ones over its cap, or all idle
    /// ones on request) that NIXL keeps loaded all the same, the last
    /// unloaded kept: loading one again costs no new endpoint. NIXL 1.5.1
    /// closes an unloaded peer's endpoints without force, and UCX destroys
    /// them only once the connection breaks, so each unload of a peer that
    /// is alive leaves two sockets open until that peer exits (NIXL issue
    /// 2025). A parked peer costs what NIXL holds for it (its regions and
    /// endpoints); a parked peer restarted under its name is unloaded when
    /// its new incarnation is loaded. 0 unloads at once, as before. Why
    /// the default: docs/decisions/0017-peer-churn.md.
    pub parked_peers: usize,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            spin: Duration::from_micros(100),
            first_sleep: Duration::from_micros(10),
            transfer_cap: Duration::from_micros(200),
            notify_cap: Duration::from_millis(1),
            wait_assist: Duration::from_micros(200),
            assisted: Duration::from_micros(20),
            follow_at_post: 64 << 10,
            progress_thread_delay: Duration::from_millis(100),
            unreachable_for: Duration::from_secs(60),
            compact_peers_above: 1 << 18,
            parked_peers: 64,
        }
    }
}

/// How a transfer's notification reaches the passive side, when NIXL's
/// progress thread is on (two agents; without it there is one agent and
/// every notification is [`Attached`](Self::Attached)).
///
/// Set with [`NixlBackendBuilder::notifications`]. Why the default:
/// docs/decisions/0004-notification-apart-and-proving-route.md; the choice is
/// this machine's (TCP and shared memory), so measure again on RDMA hardware.
///
/// [`NixlBackendBuilder::notifications`]: crate::NixlBackendBuilder::notifications
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Notifications {
    /// Every transfer carries its notification (NIXL sends it with the
    /// transfer) through the initiating agent, as with one agent. The
    /// serving agent never loads peers.
    Attached,
    /// The serving agent sends a transfer's notification once NIXL reports
    /// the transfer done, so the initiating agent's endpoint carries no
    /// message and NIXL's flush of it needs no answer from the peer. Until
    /// one transfer to a peer succeeded through the serving agent with its
    /// notification attached (the *proving route*), transfers to that peer
    /// go that way: NIXL does not say when a notification sent apart leaves.
    #[default]
    Apart,
}
