//! The fabric: the registry of agents that can reach each other, and what each
//! agent registered and exposed.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard, Weak};

use descriptor_core::{EventHook, Notification, OperationKind, RegionId, Segment};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Hashes the ids [`next_id`] hands out with one multiply. Maps keyed by them
/// only ever hold ids this crate made (a peer's forged id is only looked up),
/// so nobody can fill one with colliding keys; SipHash on every lookup was a
/// measurable share of a loopback operation.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by ids from [`next_id`].
pub(crate) type IdMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;

/// A map keyed by agent names, hashed with randomly seeded foldhash: several
/// lookups per transfer, each much cheaper than SipHash's.
pub(crate) type NameMap<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// A map keyed by notification keys (peer-given bytes on lookup), hashed with
/// randomly seeded foldhash.
pub(crate) type KeyMap<V> = HashMap<Arc<[u8]>, V, foldhash::fast::RandomState>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A set of loopback agents that can reach each other, like the machines of one
/// network. Agents of different fabrics cannot load each other's metadata.
///
/// Cloning gives another handle to the same fabric.
#[derive(Clone)]
pub struct Fabric {
    pub(crate) inner: Arc<FabricInner>,
}

pub(crate) struct FabricInner {
    pub(crate) id: u64,
    agents: Mutex<NameMap<Arc<Agent>>>,
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric::new()
    }
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("id", &self.inner.id)
            .field("agents", &lock(&self.inner.agents).len())
            .finish()
    }
}

impl Fabric {
    /// A new, empty fabric.
    pub fn new() -> Fabric {
        Fabric {
            inner: Arc::new(FabricInner {
                id: next_id(),
                agents: Mutex::new(NameMap::default()),
            }),
        }
    }

    /// The process-wide default fabric.
    pub fn global() -> Fabric {
        static GLOBAL: OnceLock<Fabric> = OnceLock::new();
        GLOBAL.get_or_init(Fabric::new).clone()
    }

    /// Names of the agents currently on the fabric, sorted.
    pub fn agents(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.inner.agents).keys().cloned().collect();
        names.sort();
        names
    }

    /// How many regions the agent named `name` has registered right now, and
    /// how many exposures it has live: both return to zero once its operations
    /// and descriptors are gone. `None` if no such agent is on the fabric.
    pub fn usage(&self, name: &str) -> Option<(usize, usize)> {
        let agent = self.find(name)?;
        let grants = agent
            .grants
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .by_id
            .len();
        Some((agent.regions.load(Ordering::Relaxed), grants))
    }

    pub(crate) fn join(&self, agent: Arc<Agent>) -> bool {
        let mut agents = lock(&self.inner.agents);
        if agents.contains_key(&*agent.name) {
            return false;
        }
        agents.insert(agent.name.to_string(), agent);
        true
    }

    pub(crate) fn leave(&self, agent: &Agent) {
        let mut agents = lock(&self.inner.agents);
        if agents.get(&*agent.name).is_some_and(|a| a.id == agent.id) {
            agents.remove(&*agent.name);
        }
    }

    pub(crate) fn find(&self, name: &str) -> Option<Arc<Agent>> {
        lock(&self.inner.agents).get(name).cloned()
    }
}

/// One agent's state, shared by its backend and by peers that transfer to it.
pub(crate) struct Agent {
    pub(crate) id: u64,
    /// Shared with the notifications it sends.
    pub(crate) name: Arc<str>,
    pub(crate) vanished: AtomicBool,
    /// Regions registered right now (for leak checks).
    pub(crate) regions: std::sync::atomic::AtomicUsize,
    /// Live exposures.
    pub(crate) grants: RwLock<Grants>,
    /// Peers loaded from metadata. Their metadata names the agent only: what
    /// a transfer may reach is the exposure its notification key names.
    pub(crate) loaded: Mutex<NameMap<Weak<Agent>>>,
    pub(crate) inbox: Mutex<Vec<Notification>>,
    pub(crate) hook: OnceLock<EventHook>,
}

impl Agent {
    pub(crate) fn new(name: &str) -> Agent {
        Agent {
            id: next_id(),
            name: name.into(),
            vanished: AtomicBool::new(false),
            regions: std::sync::atomic::AtomicUsize::new(0),
            grants: RwLock::new(Grants::default()),
            loaded: Mutex::new(NameMap::default()),
            inbox: Mutex::new(Vec::new()),
            hook: OnceLock::new(),
        }
    }

    pub(crate) fn is_gone(&self) -> bool {
        self.vanished.load(Ordering::Acquire)
    }

    /// The live exposure made for the operation with notification key `key`.
    pub(crate) fn grant_for(&self, key: &[u8]) -> Option<Arc<Grant>> {
        let grants = self.grants.read().unwrap_or_else(PoisonError::into_inner);
        grants.by_key.get(key).cloned()
    }

    /// Delivers a notification and wakes the agent's connector.
    pub(crate) fn notify(&self, notification: Notification) {
        if self.is_gone() {
            return;
        }
        lock(&self.inbox).push(notification);
        self.signal();
    }

    pub(crate) fn signal(&self) {
        if let Some(hook) = self.hook.get() {
            hook();
        }
    }
}

/// An agent's live exposures, by id and by the notification key of the
/// operation each was made for (one exposure per key).
#[derive(Default)]
pub(crate) struct Grants {
    pub(crate) by_id: IdMap<u64, Arc<Grant>>,
    /// The key is the grant's own (`Grant::key`), shared.
    by_key: KeyMap<Arc<Grant>>,
}

impl Grants {
    /// Adds `grant`; false (and nothing added) if its key is taken.
    pub(crate) fn insert(&mut self, grant: Grant) -> bool {
        match self.by_key.entry(Arc::clone(&grant.key)) {
            Entry::Occupied(_) => false,
            Entry::Vacant(slot) => {
                let grant = Arc::new(grant);
                self.by_id.insert(grant.id, Arc::clone(&grant));
                slot.insert(grant);
                true
            }
        }
    }

    /// Removes exposure `id`, if live.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Arc<Grant>> {
        let grant = self.by_id.remove(&id)?;
        self.by_key.remove(&grant.key);
        Some(grant)
    }

    /// Revokes and removes every exposure that covers `region`.
    pub(crate) fn revoke_region(&mut self, region: RegionId) {
        let Grants { by_id, by_key } = self;
        by_id.retain(|_, grant| {
            let covers = grant.regions.iter().any(|(id, _)| *id == region);
            if covers {
                grant.revoke();
                by_key.remove(&grant.key);
            }
            !covers
        });
    }
}

/// One exposure: regions a peer may access one way, until revoked.
pub(crate) struct Grant {
    /// The exposure id the owner revokes it by.
    pub(crate) id: u64,
    pub(crate) access: OperationKind,
    /// The notification key of the operation it was made for.
    pub(crate) key: Arc<[u8]>,
    /// The exposed regions in the operation's descriptor order, which its
    /// metadata keeps: an honest peer's `i`-th remote range lies in the
    /// `i`-th region.
    pub(crate) regions: Vec<(RegionId, Segment)>,
    /// The same regions sorted by start, for ranges in any other order.
    sorted: Vec<Segment>,
    /// Transfers copy under the read lock; revocation takes the write lock, so
    /// once `revoke` returns no copy into these regions is running or will start.
    live: RwLock<bool>,
}

impl Grant {
    pub(crate) fn new(
        id: u64,
        access: OperationKind,
        key: &[u8],
        regions: Vec<(RegionId, Segment)>,
    ) -> Grant {
        let mut sorted: Vec<Segment> = regions.iter().map(|&(_, r)| r).collect();
        sorted.sort_by_key(|r| r.addr);
        Grant {
            id,
            access,
            key: key.into(),
            regions,
            sorted,
            live: RwLock::new(true),
        }
    }

    pub(crate) fn revoke(&self) {
        *self.live.write().unwrap_or_else(PoisonError::into_inner) = false;
    }

    /// Holds the grant open; `None` once revoked.
    pub(crate) fn hold(&self) -> Option<RwLockReadGuard<'_, bool>> {
        let guard = self.live.read().unwrap_or_else(PoisonError::into_inner);
        (*guard).then_some(guard)
    }

    /// Whether `range`, a transfer's `index`-th remote range, lies inside one
    /// exposed region.
    pub(crate) fn covers(&self, index: usize, range: &Segment) -> bool {
        // The region of the same index holds it unless the peer reordered the
        // metadata. Otherwise the nearest region starting at or before the
        // range almost always holds it; overlapping registrations need the scan.
        if self
            .regions
            .get(index)
            .is_some_and(|(_, r)| r.contains(range))
        {
            return true;
        }
        let after = self.sorted.partition_point(|r| r.addr <= range.addr);
        after
            .checked_sub(1)
            .is_some_and(|i| self.sorted[i].contains(range))
            || self.sorted[..after].iter().any(|r| r.contains(range))
    }
}
