//! The remote-agent cache: peers loaded from metadata, shared by the operations
//! that use them.
//!
//! Many operations to one peer share one entry (Dynamo added and removed the
//! peer per operation, so concurrent operations broke each other). An entry
//! whose last operation ended stays loaded, *idle*, so that the next operation
//! to that peer needs no reload and, on NIXL, no new connection (a reload costs
//! ~1 ms and the first transfer after it several more). Idle entries are capped
//! (least recently used unloaded first) and can be unloaded on demand.
//!
//! Metadata already loaded is recognised, so loading the same blob again costs
//! no backend call: a keyed hash of its length and ends finds a remembered
//! blob, whose bytes must then equal the new one's (a full agent blob is
//! kilobytes; hashing all of it on every operation cost more than comparing).
//! The hash (foldhash) is randomly seeded per cache, and equality is checked
//! byte for byte: no blob passes for another.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, PoisonError};

use foldhash::fast::RandomState;

use crate::auth::Auth;
use crate::backend::RegistrationBackend;
use crate::error::{Error, Result};
// loom's under `--cfg loom`: the model checks leases against operations.
use crate::sync::{Condvar, Mutex, MutexGuard};

/// Idle peers kept loaded by default.
pub const DEFAULT_MAX_IDLE_PEERS: usize = 64;
/// Distinct blobs remembered per peer (the most recent ones).
const MAX_BLOBS_PER_PEER: usize = 16;
/// Bytes at each end of a blob that its memo key covers.
const KEYED_ENDS: usize = 256;

/// The cache of loaded peers.
///
/// Its lock guards only the bookkeeping: `load_remote` and `unload_remote` run
/// with no lock held. Loads and unloads must still not interleave (a load that
/// merges into a peer being unloaded would hand out a lease on a peer that is
/// gone), so each side waits, on the condition variable, while the other kind
/// of call is in flight; loads run concurrently with each other.
pub(crate) struct RemoteCache {
    backend: Arc<dyn RegistrationBackend>,
    /// Which blobs may reach the backend (verified before each load; a
    /// remembered blob was verified when it was loaded).
    auth: Auth,
    hasher: RandomState,
    max_idle: usize,
    state: Mutex<State>,
    calls_done: Condvar,
}

#[derive(Default)]
struct State {
    peers: HashMap<String, Entry, RandomState>,
    /// Blob key (see `RemoteCache::key`) to the blob and the peer it loaded.
    blobs: HashMap<u64, Memo, BuildHasherDefault<KeyHasher>>,
    /// Peers with no operation (`refs` zero), so that a release need not
    /// count them.
    idle: usize,
    clock: u64,
    /// `load_remote` calls in flight.
    loading: usize,
    /// `unload_remote` calls in flight.
    unloading: usize,
    /// Threads blocked on `calls_done`: the last call out wakes them only if
    /// there are any (a wake-up is a system call even with nobody to wake).
    sleepers: usize,
}

/// A remembered blob and the peer it loaded.
type Memo = (Box<[u8]>, Arc<Peer>);

/// A loaded peer, shared by its entry, its remembered blobs and its leases,
/// so that taking or returning a lease looks nothing up by name and
/// allocates nothing. Its counts change only under the cache's lock: they
/// are atomics only so that leases can share them (relaxed: the lock orders
/// them).
struct Peer {
    name: Arc<str>,
    /// Operations using the peer.
    refs: AtomicUsize,
    /// The use clock's time when it was last taken or returned.
    last_used: AtomicU64,
}

/// A loaded peer's place in the cache.
struct Entry {
    peer: Arc<Peer>,
    /// Keys of this peer's remembered blobs, oldest first.
    blobs: VecDeque<u64>,
}

impl RemoteCache {
    pub(crate) fn new(
        backend: Arc<dyn RegistrationBackend>,
        max_idle: usize,
        auth: Auth,
    ) -> RemoteCache {
        RemoteCache {
            backend,
            auth,
            hasher: RandomState::default(),
            max_idle,
            state: Mutex::new(State::default()),
            calls_done: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        state.sleepers += 1;
        let mut state = self
            .calls_done
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
        state.sleepers -= 1;
        state
    }

    /// Peers with at least one operation.
    pub(crate) fn active(&self) -> usize {
        let state = self.lock();
        state.peers.len().saturating_sub(state.idle)
    }

    /// Peers loaded but unused.
    pub(crate) fn idle(&self) -> usize {
        self.lock().idle
    }

    /// Loads (or recognises) a peer's metadata and takes a reference on it.
    ///
    /// A blob the backend refuses changes nothing: the peers already loaded,
    /// idle or not, stay loaded. The one exception is a peer that restarted
    /// under the same name: when the backend refuses a blob that it says
    /// names a peer we keep loaded but idle, that peer (the old incarnation)
    /// is unloaded and the blob loaded again.
    pub(crate) fn acquire(self: &Arc<Self>, agent_metadata: &[u8]) -> Result<RemoteLease> {
        match self.try_acquire(agent_metadata) {
            Err(refused @ Error::Unauthenticated { .. }) => Err(refused),
            Err(refused) => match self
                .auth
                .open(agent_metadata)
                .ok()
                .and_then(|blob| self.backend.peer_name(blob))
            {
                Some(name) if self.unload_if_idle(&name) => {
                    tracing::info!(peer = %name, "a peer of that name is loaded but idle: unloaded it (restarted?) and loading the new metadata");
                    self.try_acquire(agent_metadata)
                }
                _ => Err(refused),
            },
            acquired => acquired,
        }
    }

    /// The memo key of a blob: a keyed hash of its length and both ends.
    fn key(&self, blob: &[u8]) -> u64 {
        if blob.len() <= 2 * KEYED_ENDS {
            // The ends would overlap: all of it, once.
            return self.hasher.hash_one(blob);
        }
        let head = &blob[..KEYED_ENDS];
        let tail = &blob[blob.len() - KEYED_ENDS..];
        self.hasher.hash_one((blob.len(), head, tail))
    }

    fn try_acquire(self: &Arc<Self>, agent_metadata: &[u8]) -> Result<RemoteLease> {
        let key = self.key(agent_metadata);
        let mut state = self.lock();
        let known = state
            .blobs
            .get(&key)
            .filter(|(blob, _)| **blob == *agent_metadata)
            .map(|(_, peer)| Arc::clone(peer));
        if let Some(peer) = known {
            // A remembered blob's peer is loaded: unloading forgets its blobs.
            state.take_ref(&peer);
            return Ok(self.lease(peer));
        }
        while state.unloading > 0 {
            state = self.wait(state);
        }
        state.loading += 1;
        drop(state);
        // Still counted as loading until the entry holds our reference, so
        // that no eviction can unload the peer in between. Declared before
        // `state`, so dropped (and counted out) after the lock is released.
        let _call = InFlight::load(self);
        // A blob no key of ours signed never reaches the backend.
        let loaded = self.backend.load_remote(self.auth.open(agent_metadata)?)?;
        let mut state = self.lock();
        let State {
            peers,
            blobs,
            idle,
            clock,
            ..
        } = &mut *state;
        let entry = peers.entry(loaded).or_insert_with_key(|name| {
            *idle += 1;
            Entry::new(name)
        });
        take_ref(idle, clock, &entry.peer);
        let peer = Arc::clone(&entry.peer);
        if !entry.blobs.contains(&key) {
            if entry.blobs.len() >= MAX_BLOBS_PER_PEER
                && let Some(old) = entry.blobs.pop_front()
            {
                blobs.remove(&old);
            }
            entry.blobs.push_back(key);
        }
        if let Some((_, previous)) = blobs.insert(key, (agent_metadata.into(), Arc::clone(&peer)))
            && !Arc::ptr_eq(&previous, &peer)
        {
            // Another peer's blob had this key: it is simply forgotten.
            if let Some(other) = peers.get_mut(&*previous.name) {
                other.blobs.retain(|k| *k != key);
            }
        }
        Ok(self.lease(peer))
    }

    /// A lease on `peer`, whose reference is already taken.
    fn lease(self: &Arc<Self>, peer: Arc<Peer>) -> RemoteLease {
        RemoteLease {
            cache: Arc::clone(self),
            peer,
        }
    }

    fn release(&self, peer: &Peer) {
        let mut state = self.lock();
        state.clock += 1;
        peer.last_used.store(state.clock, Relaxed);
        // A leased peer is never unloaded (only idle ones are), so it is
        // still in `peers`, and counted idle once its last lease is back.
        if peer.refs.fetch_sub(1, Relaxed) == 1 {
            state.idle += 1;
        }
        // Best effort: with a load in flight, the next release evicts instead
        // of this thread (perhaps the engine's) waiting for it.
        if state.loading == 0 {
            self.evict(state, self.max_idle);
        }
    }

    /// Unloads idle peers, least recently used first, until at most `keep` remain.
    fn evict(&self, mut state: MutexGuard<'_, State>, keep: usize) {
        if state.idle <= keep {
            return;
        }
        while state.loading > 0 {
            state = self.wait(state);
        }
        let mut idle: Vec<(u64, Arc<str>)> = state
            .peers
            .values()
            .map(|e| &e.peer)
            .filter(|p| p.refs.load(Relaxed) == 0)
            .map(|p| (p.last_used.load(Relaxed), Arc::clone(&p.name)))
            .collect();
        idle.sort_unstable();
        let excess = idle.len().saturating_sub(keep);
        let victims: Vec<Arc<str>> = idle.into_iter().take(excess).map(|(_, n)| n).collect();
        self.unload(state, &victims);
    }

    /// Unloads `name` if it is loaded and idle; true if it was. Waits for
    /// loads in flight first (a load may be merging into that peer).
    fn unload_if_idle(&self, name: &str) -> bool {
        let mut state = self.lock();
        while state.loading > 0 {
            state = self.wait(state);
        }
        let Some(name) = state
            .peers
            .get(name)
            .filter(|e| e.peer.refs.load(Relaxed) == 0)
            .map(|e| Arc::clone(&e.peer.name))
        else {
            return false;
        };
        self.unload(state, &[name]);
        true
    }

    /// Forgets `victims` (idle peers; no load in flight) and unloads them
    /// from the backend after releasing the lock.
    fn unload(&self, mut state: MutexGuard<'_, State>, victims: &[Arc<str>]) {
        for name in victims {
            if let Some(entry) = state.peers.remove(&**name) {
                // Victims are idle: each was counted there.
                state.idle = state.idle.saturating_sub(1);
                for key in entry.blobs {
                    state.blobs.remove(&key);
                }
            }
        }
        state.unloading += 1;
        drop(state);
        let _call = InFlight::unload(self);
        for name in victims {
            if let Err(error) = self.backend.unload_remote(name) {
                tracing::warn!(%error, peer = %name, "unloading peer failed");
            }
        }
    }

    pub(crate) fn unload_idle(&self) {
        self.evict(self.lock(), 0);
    }
}

impl State {
    /// Counts one more operation on `peer`, a loaded peer, used now.
    fn take_ref(&mut self, peer: &Peer) {
        take_ref(&mut self.idle, &mut self.clock, peer);
    }
}

/// [`State::take_ref`] on the state's fields, for a caller that holds
/// another of them borrowed.
fn take_ref(idle: &mut usize, clock: &mut u64, peer: &Peer) {
    if peer.refs.fetch_add(1, Relaxed) == 0 {
        *idle = idle.saturating_sub(1);
    }
    *clock += 1;
    peer.last_used.store(*clock, Relaxed);
}

impl Entry {
    /// A newly loaded peer, with no operation yet.
    fn new(name: &str) -> Entry {
        Entry {
            peer: Arc::new(Peer {
                name: name.into(),
                refs: AtomicUsize::new(0),
                last_used: AtomicU64::new(0),
            }),
            blobs: VecDeque::new(),
        }
    }
}

/// Counts a `load_remote` or `unload_remote` call out when it returns, or
/// unwinds (a backend that panics must not leave the other kind of call
/// waiting for ever), and wakes whoever waits for such calls to end.
struct InFlight<'a> {
    cache: &'a RemoteCache,
    load: bool,
}

impl<'a> InFlight<'a> {
    /// For a load already counted in `State::loading`.
    fn load(cache: &'a RemoteCache) -> InFlight<'a> {
        InFlight { cache, load: true }
    }

    /// For unloads already counted in `State::unloading`.
    fn unload(cache: &'a RemoteCache) -> InFlight<'a> {
        InFlight { cache, load: false }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut state = self.cache.lock();
        let count = if self.load {
            &mut state.loading
        } else {
            &mut state.unloading
        };
        *count -= 1;
        if *count == 0 && state.sleepers > 0 {
            drop(state);
            self.cache.calls_done.notify_all();
        }
    }
}

/// Hashes a blob key as itself: it is already a keyed hash (see
/// `RemoteCache::key`), so hashing it again would only cost time.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; fold anything else in all the same.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// One operation's reference on a loaded peer.
pub(crate) struct RemoteLease {
    cache: Arc<RemoteCache>,
    peer: Arc<Peer>,
}

impl RemoteLease {
    /// The peer's name, as the backend loaded it.
    pub(crate) fn peer(&self) -> &str {
        &self.peer.name
    }
}

impl Drop for RemoteLease {
    fn drop(&mut self) {
        self.cache.release(&self.peer);
    }
}
