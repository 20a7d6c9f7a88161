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
//! Metadata already loaded is recognised by a keyed hash of its bytes, so
//! loading the same blob again costs no backend call. The key is random per
//! process: a hostile peer cannot craft a blob that passes for another peer's.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::backend::RegistrationBackend;
use crate::error::Result;

/// Idle peers kept loaded by default.
pub const DEFAULT_MAX_IDLE_PEERS: usize = 64;
/// Distinct blobs remembered per peer before the memory of them is reset.
const MAX_BLOBS_PER_PEER: usize = 256;

pub(crate) struct RemoteCache {
    backend: Arc<dyn RegistrationBackend>,
    hasher: RandomState,
    max_idle: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    peers: HashMap<String, Peer>,
    /// Blob hash to the peer it loaded.
    blobs: HashMap<u64, String>,
    clock: u64,
}

#[derive(Default)]
struct Peer {
    refs: usize,
    blobs: HashSet<u64>,
    last_used: u64,
}

impl RemoteCache {
    pub(crate) fn new(backend: Arc<dyn RegistrationBackend>, max_idle: usize) -> RemoteCache {
        RemoteCache {
            backend,
            hasher: RandomState::new(),
            max_idle,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Peers with at least one operation.
    pub(crate) fn active(&self) -> usize {
        self.lock().peers.values().filter(|p| p.refs > 0).count()
    }

    /// Peers loaded but unused.
    pub(crate) fn idle(&self) -> usize {
        self.lock().peers.values().filter(|p| p.refs == 0).count()
    }

    /// Loads (or recognises) a peer's metadata and takes a reference on it. The
    /// lock is held across the backend call so that a concurrent eviction cannot
    /// unload the peer between the load and the count.
    pub(crate) fn acquire(self: &Arc<Self>, agent_metadata: &[u8]) -> Result<RemoteLease> {
        let hash = self.hasher.hash_one(agent_metadata);
        let mut state = self.lock();
        state.clock += 1;
        let now = state.clock;
        let known = state.blobs.get(&hash).cloned();
        let peer = match known {
            Some(peer) => peer,
            None => {
                let peer = match self.backend.load_remote(agent_metadata) {
                    Ok(peer) => peer,
                    // A restarted peer may reuse a name whose old connection an
                    // idle entry still holds: forget idle peers and try once more.
                    Err(first) if state.peers.values().any(|p| p.refs == 0) => {
                        self.evict(&mut state, 0);
                        self.backend
                            .load_remote(agent_metadata)
                            .map_err(|_| first)?
                    }
                    Err(e) => return Err(e),
                };
                let State { peers, blobs, .. } = &mut *state;
                let entry = peers.entry(peer.clone()).or_default();
                if entry.blobs.len() >= MAX_BLOBS_PER_PEER {
                    for old in entry.blobs.drain() {
                        blobs.remove(&old);
                    }
                }
                entry.blobs.insert(hash);
                blobs.insert(hash, peer.clone());
                peer
            }
        };
        if let Some(entry) = state.peers.get_mut(&peer) {
            entry.refs += 1;
            entry.last_used = now;
        }
        Ok(RemoteLease {
            cache: Arc::clone(self),
            peer,
        })
    }

    fn release(&self, peer: &str) {
        let mut state = self.lock();
        state.clock += 1;
        let now = state.clock;
        if let Some(entry) = state.peers.get_mut(peer) {
            entry.refs = entry.refs.saturating_sub(1);
            entry.last_used = now;
        }
        self.evict(&mut state, self.max_idle);
    }

    /// Unloads idle peers, least recently used first, until at most `keep` remain.
    fn evict(&self, state: &mut State, keep: usize) {
        let mut idle: Vec<(u64, String)> = state
            .peers
            .iter()
            .filter(|(_, p)| p.refs == 0)
            .map(|(name, p)| (p.last_used, name.clone()))
            .collect();
        if idle.len() <= keep {
            return;
        }
        idle.sort_unstable();
        for (_, name) in idle.into_iter().rev().skip(keep) {
            if let Some(entry) = state.peers.remove(&name) {
                for hash in entry.blobs {
                    state.blobs.remove(&hash);
                }
            }
            if let Err(error) = self.backend.unload_remote(&name) {
                tracing::warn!(%error, peer = %name, "unloading peer failed");
            }
        }
    }

    pub(crate) fn unload_idle(&self) {
        let mut state = self.lock();
        self.evict(&mut state, 0);
    }
}

/// One operation's reference on a loaded peer.
pub(crate) struct RemoteLease {
    cache: Arc<RemoteCache>,
    pub(crate) peer: String,
}

impl Drop for RemoteLease {
    fn drop(&mut self) {
        self.cache.release(&self.peer);
    }
}
