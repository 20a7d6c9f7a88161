//! The record of what NIXL holds for each peer ([`Peers`]), and the plan of
//! each load against it ([`Plan`]): bookkeeping only, no NIXL call, so it is
//! tested without NIXL. Why the record and its plans: the [parent
//! module](super); the calls that carry a plan out: [`super::loader`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::agent_metadata::{AgentMetadata, Conn, RegionKey};
use crate::spans::Spans;
use crate::sync::lock;

/// NIXL names one peer may hold before it is unloaded: its keys changed this
/// often while transfers used its earlier names. Each holds a UCX endpoint to
/// the peer.
pub(crate) const MAX_NAMES_PER_PEER: usize = 16;

/// Regions a peer's record holds, at the least, before this backend looks
/// for regions the peer no longer publishes (see [`RECENT_LOADS`]): the
/// floor of `Tuning::compact_peers_above`, and the tests' value.
pub(crate) const COMPACT_FLOOR: usize = 4096;

/// How many of a peer's latest loaded blobs the regions kept in its record
/// come from, when the record is compacted. The core's remote cache loads a
/// blob it remembers no more (it remembers the peer's 16 latest), and an
/// operation posts right after it loaded its blob: a region seen in the last
/// this many loads is kept, so no remembered blob, nor one just loaded by an
/// operation about to post, lacks its regions.
pub(crate) const RECENT_LOADS: u64 = 64;

/// The peers, by their own names.
#[derive(Debug)]
pub(crate) struct Peers {
    peers: HashMap<String, Peer>,
    /// `Tuning::compact_peers_above`: a peer's record smaller than this is
    /// never compacted (`usize::MAX`: never).
    compact_above: usize,
    /// Names NIXL may keep a connection for after erasing their entries:
    /// never used again by this backend's agents.
    poisoned: HashSet<String>,
    /// Transfers posted and not yet released, by the NIXL name they were
    /// posted against: a peer's earlier name is unloaded only once none
    /// uses it ([`Peers::retire`]).
    in_flight: HashMap<String, usize>,
}

/// A transfer about to be created against a NIXL name, counted in flight
/// ([`Peers::posting`]): dropped, it is counted out; kept, it stays counted
/// until the transfer is released ([`Peers::posted`]).
pub(crate) struct Posting<'a> {
    peers: &'a Mutex<Peers>,
    name: String,
    armed: bool,
}

impl Posting<'_> {
    /// The NIXL name to post against.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The transfer is recorded: counted out when it is released.
    pub(crate) fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for Posting<'_> {
    fn drop(&mut self) {
        if self.armed {
            lock(self.peers).posted(&self.name);
        }
    }
}

/// Why the record: a long-lived client of a server that registers fresh
/// buffers per operation loads a new region per operation, and deregistered
/// regions are never announced. So the record keeps what the peer's latest
/// blobs hold and, once it holds more than twice that (and at least
/// [`COMPACT_FLOOR`] regions), the next load renames the peer with only
/// those ([`Plan::Rename`] with `compacting`): NIXL's sections and the
/// record stay bounded, and every per-load cost is the new blob's, not the
/// history's (issue 48).
#[derive(Debug)]
struct Peer {
    /// The name both agents know the peer by now.
    nixl_name: String,
    /// Whether NIXL holds `conns` and `regions` under `nixl_name`.
    loaded: bool,
    /// Earlier names, unloaded with the peer, or once no transfer uses them.
    stale: Vec<String>,
    conns: Vec<Conn>,
    regions: BTreeMap<RegionKey, Recorded>,
    /// Where `regions` lie, for merging a transfer's pairs; kept up to date
    /// as regions are added, rebuilt only when regions are dropped.
    spans: Arc<Spans>,
    /// Blobs of the peer loaded (or found loaded) so far.
    loads: u64,
    /// Record size at which to count the regions recently seen again.
    check_at: usize,
    /// The least record size that is ever compacted.
    floor: usize,
    /// The record holds more than twice the regions recently seen: the next
    /// load renames the peer with only those.
    compact: bool,
}

/// A region NIXL holds for a peer.
#[derive(Debug, Clone)]
struct Recorded {
    /// NIXL's key bytes of the region.
    key: Vec<u8>,
    /// The peer's [`Peer::loads`] when a blob last held it.
    seen: u64,
}

impl Peer {
    fn new(nixl_name: &str, floor: usize) -> Peer {
        Peer {
            nixl_name: nixl_name.to_owned(),
            loaded: true,
            stale: Vec::new(),
            conns: Vec::new(),
            regions: BTreeMap::new(),
            spans: Arc::default(),
            loads: 0,
            check_at: floor,
            floor,
            compact: false,
        }
    }

    /// `regions` lost some: index them again.
    fn reindex(&mut self) {
        self.spans = Arc::new(Spans::new(self.regions.keys()));
        self.check_at = self.floor.max(2 * self.regions.len());
        self.compact = false;
    }

    /// Whether the region was in one of the [`RECENT_LOADS`] latest blobs.
    fn recent(&self, r: &Recorded) -> bool {
        r.seen.saturating_add(RECENT_LOADS) > self.loads
    }

    /// A blob holding `md`'s regions was loaded: adds the new ones, marks
    /// all seen, and checks (amortized: when the record doubled) whether the
    /// record should be compacted.
    fn seen(&mut self, md: &AgentMetadata) {
        self.loads += 1;
        let loads = self.loads;
        let spans = Arc::make_mut(&mut self.spans);
        for (key, bytes) in md.regions() {
            match self.regions.get_mut(&key) {
                Some(r) => {
                    r.seen = loads;
                    if r.key.as_slice() != bytes {
                        r.key = bytes.to_vec();
                    }
                }
                None => {
                    spans.insert(&key);
                    self.regions.insert(
                        key,
                        Recorded {
                            key: bytes.to_vec(),
                            seen: loads,
                        },
                    );
                }
            }
        }
        if self.regions.len() > self.check_at && !self.compact {
            let recent = self.regions.values().filter(|r| self.recent(r)).count();
            if self.regions.len() > 2 * recent {
                self.compact = true;
            } else {
                self.check_at = 2 * self.regions.len();
            }
        }
    }

    /// The record's regions as [`AgentMetadata::from_parts`] takes them:
    /// all, or only the recently seen ones.
    fn parts(&self, only_recent: bool) -> BTreeMap<RegionKey, Vec<u8>> {
        self.regions
            .iter()
            .filter(|(_, r)| !only_recent || self.recent(r))
            .map(|(k, r)| (k.clone(), r.key.clone()))
            .collect()
    }
}

/// How to load a peer's blob.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// NIXL holds everything the blob holds: no call ([`Peers::found`]).
    Loaded,
    /// Give the blob to NIXL under `nixl_name` (the peer's NIXL name, or the
    /// name for a peer not loaded).
    Merge { nixl_name: String },
    /// Give `md` to NIXL under a new name: a key changed (all the peer had,
    /// the blob's keys winning), or `compacting`: the record holds more than
    /// twice the regions of the peer's recent blobs, and `md` holds only
    /// those and the blob's. A compaction NIXL refuses is not an error: the
    /// blob is merged instead ([`Peers::compaction_refused`]).
    Rename {
        nixl_name: String,
        md: AgentMetadata,
        compacting: bool,
    },
}

/// What [`Peers::remove`] hands back to unload.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Names {
    /// The peer's NIXL name, if NIXL holds it.
    pub(crate) current: Option<String>,
    /// Earlier names (loaded, or erased by NIXL).
    pub(crate) stale: Vec<String>,
}

impl Default for Peers {
    fn default() -> Peers {
        Peers::new(COMPACT_FLOOR)
    }
}

impl Peers {
    /// No peers yet; a peer's record is compacted from `compact_above`
    /// regions on (0: never; at least [`COMPACT_FLOOR`] otherwise).
    pub(crate) fn new(compact_above: usize) -> Peers {
        Peers {
            peers: HashMap::new(),
            compact_above: match compact_above {
                0 => usize::MAX,
                n => n.max(COMPACT_FLOOR),
            },
            poisoned: HashSet::new(),
            in_flight: HashMap::new(),
        }
    }

    /// The name NIXL knows `peer` by.
    pub(crate) fn nixl_name(&self, peer: &str) -> Option<&str> {
        self.peers.get(peer).map(|p| p.nixl_name.as_str())
    }

    /// Where `peer`'s registrations lie, as NIXL holds them.
    pub(crate) fn spans(&self, peer: &str) -> Option<Arc<Spans>> {
        self.peers
            .get(peer)
            .filter(|p| p.loaded)
            .map(|p| Arc::clone(&p.spans))
    }

    /// A transfer (or warm-up READ) to `peer` is about to be created: the
    /// NIXL name to post it against, counted in flight until the returned
    /// [`Posting`] is dropped (kept: until [`Peers::posted`]), and, if
    /// `spans`, where the peer's registrations lie (asked only for a request
    /// of several descriptors: a shared index is copied when a load adds to
    /// it).
    pub(crate) fn posting<'a>(
        peers: &'a Mutex<Peers>,
        peer: &str,
        spans: bool,
    ) -> (Posting<'a>, Option<Arc<Spans>>) {
        let mut this = lock(peers);
        let name = this.nixl_name(peer).unwrap_or(peer).to_owned();
        let spans = if spans { this.spans(peer) } else { None };
        *this.in_flight.entry(name.clone()).or_default() += 1;
        drop(this);
        (
            Posting {
                peers,
                name,
                armed: true,
            },
            spans,
        )
    }

    /// A transfer whose [`Posting`] was kept, posted against `nixl_name`,
    /// was released.
    pub(crate) fn posted(&mut self, nixl_name: &str) {
        if let Some(n) = self.in_flight.get_mut(nixl_name) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(nixl_name);
            }
        }
    }

    /// `peer`'s earlier names that no transfer uses: forgotten here, for the
    /// caller to unload (and to poison, if the unload fails).
    pub(crate) fn retire(&mut self, peer: &str) -> Vec<String> {
        let Some(p) = self.peers.get_mut(peer) else {
            return Vec::new();
        };
        if p.stale.is_empty() {
            return Vec::new();
        }
        let in_flight = &self.in_flight;
        let (busy, idle) = std::mem::take(&mut p.stale)
            .into_iter()
            .partition(|name| in_flight.contains_key(name));
        p.stale = busy;
        idle
    }

    /// How to load `md`. `own` are this backend's agents' names: a blob
    /// naming one is given to NIXL as it is (NIXL refuses an agent loading
    /// itself). Err if the peer holds [`MAX_NAMES_PER_PEER`] names. Costs
    /// the blob's size (times the log of the record's), not the record's,
    /// unless it renames.
    pub(crate) fn plan(&self, md: &AgentMetadata, own: &[&str]) -> Result<Plan, String> {
        if own.contains(&md.name.as_str()) {
            return Ok(Plan::Merge {
                nixl_name: md.name.clone(),
            });
        }
        let Some(peer) = self.peers.get(&md.name).filter(|p| p.loaded) else {
            let nixl_name = match self.peers.get(&md.name) {
                Some(peer) => peer.nixl_name.clone(),
                None => self.fresh_name(&md.name, own),
            };
            return Ok(Plan::Merge { nixl_name });
        };
        let merge = Plan::Merge {
            nixl_name: peer.nixl_name.clone(),
        };
        // Other connection info: another incarnation of the peer. NIXL
        // would refuse it (NIXL_ERR_NOT_ALLOWED, logged as an error) before
        // it reads the regions, and keep what it had: refused here alike.
        let mut new_conns = Vec::new();
        for conn in &md.conns {
            match peer.conns.iter().find(|c| c.backend == conn.backend) {
                Some(known) if known.info != conn.info => {
                    return Err(format!(
                        "another incarnation of peer {:?} (other connection info) is loaded; \
                         the new one is loaded once the old one is unloaded (it is, once idle)",
                        md.name
                    ));
                }
                Some(_) => {}
                None => new_conns.push(conn.clone()),
            }
        }
        let mut changed = false;
        let mut new_regions = false;
        for (key, bytes) in md.regions() {
            match peer.regions.get(&key) {
                Some(known) if known.key.as_slice() != bytes => changed = true,
                Some(_) => {}
                None => new_regions = true,
            }
        }
        let capped = peer.stale.len() + 1 >= MAX_NAMES_PER_PEER;
        if !changed {
            if peer.compact && !capped && (new_regions || !new_conns.is_empty()) {
                let nixl_name = self.fresh_name(&md.name, own);
                return Ok(Plan::Rename {
                    md: renamed_md(md, peer, new_conns, true),
                    nixl_name,
                    compacting: true,
                });
            }
            return Ok(if new_conns.is_empty() && !new_regions {
                Plan::Loaded
            } else {
                merge
            });
        }
        if capped {
            return Err(format!(
                "peer {:?} changed the keys of regions it had published {} times while in use; \
                 it is loaded again once no operation uses it",
                md.name,
                peer.stale.len() + 1
            ));
        }
        let nixl_name = self.fresh_name(&md.name, own);
        Ok(Plan::Rename {
            md: renamed_md(md, peer, new_conns, peer.compact),
            nixl_name,
            compacting: false,
        })
    }

    /// Whether NIXL holds `peer` under its NIXL name.
    pub(crate) fn loaded(&self, peer: &str) -> bool {
        self.peers.get(peer).is_some_and(|p| p.loaded)
    }

    /// Whether NIXL holds `md`'s peer with `md`'s connection info (the same
    /// incarnation), or nothing for it.
    pub(crate) fn same_incarnation(&self, md: &AgentMetadata) -> bool {
        let Some(peer) = self.peers.get(&md.name).filter(|p| p.loaded) else {
            return true;
        };
        md.conns.iter().all(|conn| {
            peer.conns
                .iter()
                .all(|known| known.backend != conn.backend || known.info == conn.info)
        })
    }

    /// NIXL held all of `md` already ([`Plan::Loaded`]): its regions count
    /// as seen.
    pub(crate) fn found(&mut self, md: &AgentMetadata) {
        if let Some(peer) = self.peers.get_mut(&md.name).filter(|p| p.loaded) {
            peer.seen(md);
        }
    }

    /// NIXL took `md` under `nixl_name` ([`Plan::Merge`]).
    pub(crate) fn merged(&mut self, md: &AgentMetadata, nixl_name: &str) {
        let floor = self.compact_above;
        let peer = self
            .peers
            .entry(md.name.clone())
            .or_insert_with(|| Peer::new(nixl_name, floor));
        peer.loaded = true;
        for conn in &md.conns {
            if !peer.conns.iter().any(|c| c.backend == conn.backend) {
                peer.conns.push(conn.clone());
            }
        }
        peer.seen(md);
    }

    /// NIXL refused a compacting [`Plan::Rename`] (and kept the peer's
    /// current name, untouched): no compaction is tried again before the
    /// record doubles.
    pub(crate) fn compaction_refused(&mut self, peer: &str) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.compact = false;
            p.check_at = 2 * p.regions.len();
        }
    }

    /// NIXL took `md`, all the peer's metadata, under `nixl_name`
    /// ([`Plan::Rename`], or what the peer had after NIXL erased it); the
    /// peer's previous name becomes stale.
    pub(crate) fn renamed(&mut self, md: &AgentMetadata, nixl_name: &str) {
        if let Some(peer) = self.peers.get_mut(&md.name) {
            let old = std::mem::replace(&mut peer.nixl_name, nixl_name.to_owned());
            peer.stale.push(old);
            peer.conns = md.conns.clone();
            let loads = peer.loads;
            let regions = md
                .regions()
                .map(|(k, v)| {
                    let seen = peer.regions.get(&k).map_or(loads, |r| r.seen);
                    (
                        k,
                        Recorded {
                            key: v.to_vec(),
                            seen,
                        },
                    )
                })
                .collect();
            peer.regions = regions;
            peer.reindex();
            peer.loaded = true;
        }
    }

    /// What NIXL held for `peer` under its NIXL name, for loading again
    /// under a new one after NIXL erased it; `None` if the peer holds
    /// [`MAX_NAMES_PER_PEER`] names, or NIXL held nothing.
    pub(crate) fn recorded(&self, peer: &str) -> Option<AgentMetadata> {
        let p = self.peers.get(peer).filter(|p| p.loaded)?;
        (p.stale.len() + 1 < MAX_NAMES_PER_PEER)
            .then(|| AgentMetadata::from_parts(peer, p.conns.clone(), &p.parts(false)))
    }

    /// NIXL holds nothing for `peer` any more (it erased it, and loading what
    /// it had again failed or was not tried): its names, `tried` too, become
    /// stale, and it is loaded afresh next time under a new name.
    pub(crate) fn forgotten(&mut self, peer: &str, tried: Option<String>, own: &[&str]) {
        let Some(p) = self.peers.get_mut(peer) else {
            return;
        };
        if p.loaded {
            p.stale.push(p.nixl_name.clone());
        }
        p.stale.extend(tried);
        p.loaded = false;
        p.conns.clear();
        p.regions.clear();
        p.reindex();
        let fresh = self.fresh_name(peer, own);
        if let Some(p) = self.peers.get_mut(peer) {
            p.nixl_name = fresh;
        }
    }

    /// NIXL may keep a connection under `nixl_name` that nothing unloads.
    pub(crate) fn poison(&mut self, nixl_name: &str) {
        self.poisoned.insert(nixl_name.to_owned());
    }

    /// Forgets `peer`; `None` if it was not loaded.
    pub(crate) fn remove(&mut self, peer: &str) -> Option<Names> {
        let p = self.peers.remove(peer)?;
        Some(Names {
            current: p.loaded.then_some(p.nixl_name),
            stale: p.stale,
        })
    }

    /// The first of `peer`, `peer#1`, `peer#2`, ... that no agent of this
    /// backend knows and NIXL never poisoned.
    pub(crate) fn fresh_name(&self, peer: &str, own: &[&str]) -> String {
        let taken: HashSet<&str> = self
            .peers
            .values()
            .flat_map(|p| std::iter::once(&p.nixl_name).chain(&p.stale))
            .chain(&self.poisoned)
            .map(String::as_str)
            .chain(own.iter().copied())
            .collect();
        if !taken.contains(peer) {
            return peer.to_owned();
        }
        // `taken` is finite: some n is free.
        (1u64..)
            .map(|n| format!("{peer}#{n}"))
            .find(|name| !taken.contains(name.as_str()))
            .unwrap_or_else(|| format!("{peer}#"))
    }
}

/// What a [`Plan::Rename`] of `peer` loads: its connections with
/// `new_conns`, its regions (only the recently seen ones if `only_recent`)
/// with `md`'s, `md`'s keys winning.
fn renamed_md(
    md: &AgentMetadata,
    peer: &Peer,
    new_conns: Vec<Conn>,
    only_recent: bool,
) -> AgentMetadata {
    let mut conns = peer.conns.clone();
    conns.extend(new_conns);
    let mut regions = peer.parts(only_recent);
    regions.extend(md.regions().map(|(key, bytes)| (key, bytes.to_vec())));
    AgentMetadata::from_parts(&md.name, conns, &regions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_metadata::{RegionMd, Section};

    fn md(name: &str, conn: u8, regions: &[(u64, u8)]) -> AgentMetadata {
        AgentMetadata {
            name: name.into(),
            conns: vec![Conn {
                backend: "UCX".into(),
                info: vec![conn],
            }],
            sections: vec![Section {
                backend: "UCX".into(),
                mem: 0,
                regions: regions
                    .iter()
                    .map(|&(addr, key)| RegionMd {
                        addr,
                        len: 64,
                        dev: 0,
                        key: vec![key],
                    })
                    .collect(),
            }],
        }
    }

    fn merge(name: &str) -> Plan {
        Plan::Merge {
            nixl_name: name.into(),
        }
    }

    const OWN: &[&str] = &["me", "me.initiator"];

    #[test]
    fn a_new_peer_is_loaded_under_its_own_name_and_its_known_regions_cost_no_load() {
        let mut peers = Peers::default();
        let a = md("p", 1, &[(0x1000, 7)]);
        assert_eq!(peers.plan(&a, OWN), Ok(merge("p")));
        peers.merged(&a, "p");
        assert_eq!(peers.plan(&a, OWN), Ok(Plan::Loaded));
        let more = md("p", 1, &[(0x1000, 7), (0x2000, 8)]);
        assert_eq!(peers.plan(&more, OWN), Ok(merge("p")));
        // Another incarnation (other connection info) is refused, as NIXL
        // would, and what NIXL holds is kept.
        let refused = peers.plan(&md("p", 2, &[(0x1000, 9)]), OWN).unwrap_err();
        assert!(refused.contains("another incarnation"), "{refused}");
        assert_eq!(peers.plan(&a, OWN), Ok(Plan::Loaded));
        assert_eq!(peers.nixl_name("p"), Some("p"));
    }

    #[test]
    fn a_changed_key_loads_everything_with_the_new_key_under_a_new_name() {
        let mut peers = Peers::default();
        peers.merged(&md("p", 1, &[(0x1000, 7), (0x2000, 8)]), "p");
        let Ok(Plan::Rename {
            nixl_name, md: all, ..
        }) = peers.plan(&md("p", 1, &[(0x2000, 9)]), OWN)
        else {
            panic!("no rename");
        };
        assert_eq!(nixl_name, "p#1");
        let keys: Vec<(u64, Vec<u8>)> = all.regions().map(|(k, v)| (k.addr, v.to_vec())).collect();
        assert_eq!(keys, [(0x1000, vec![7]), (0x2000, vec![9])]);
        peers.renamed(&all, &nixl_name);
        assert_eq!(peers.nixl_name("p"), Some("p#1"));
        assert_eq!(
            peers.plan(&md("p", 1, &[(0x2000, 9)]), OWN),
            Ok(Plan::Loaded)
        );
        assert_eq!(
            peers.remove("p"),
            Some(Names {
                current: Some("p#1".into()),
                stale: vec!["p".into()],
            })
        );
    }

    #[test]
    fn a_poisoned_name_is_never_used_again() {
        let mut peers = Peers::default();
        peers.poison("p");
        assert_eq!(peers.plan(&md("p", 1, &[]), OWN), Ok(merge("p#1")));
        // A peer whose own name is another's NIXL name gets one of its own.
        peers.merged(&md("q", 1, &[]), "p#1");
        assert_eq!(peers.plan(&md("p#1", 1, &[]), OWN), Ok(merge("p#1#1")));
    }

    #[test]
    fn after_nixl_erased_a_peer_what_it_had_loads_again_under_a_new_name() {
        let mut peers = Peers::default();
        let a = md("p", 1, &[(0x1000, 7)]);
        peers.merged(&a, "p");
        peers.poison("p");
        let had = peers.recorded("p").unwrap();
        assert_eq!(had, a);
        peers.renamed(&had, "p#1");
        assert_eq!(peers.nixl_name("p"), Some("p#1"));
        // Restoring failed: nothing is loaded, the next load starts afresh.
        peers.poison("p#1");
        peers.forgotten("p", Some("p#2".into()), OWN);
        assert_eq!(peers.recorded("p"), None);
        assert_eq!(peers.plan(&a, OWN), Ok(merge("p#3")));
        peers.merged(&a, "p#3");
        assert_eq!(
            peers.remove("p").map(|n| n.stale),
            Some(vec!["p".into(), "p#1".into(), "p#2".into()])
        );
    }

    #[test]
    fn own_names_go_to_nixl_as_they_are() {
        let peers = Peers::default();
        assert_eq!(peers.plan(&md("me", 1, &[]), OWN), Ok(merge("me")));
        assert_eq!(peers.plan(&md("me#1", 1, &[]), OWN), Ok(merge("me#1")));
    }

    #[test]
    fn a_peer_that_keeps_changing_keys_while_in_use_is_refused_at_the_cap() {
        let mut peers = Peers::default();
        peers.merged(&md("p", 1, &[(0x1000, 0)]), "p");
        for key in 1.. {
            match peers.plan(&md("p", 1, &[(0x1000, key)]), OWN) {
                Ok(Plan::Rename { nixl_name, md, .. }) => peers.renamed(&md, &nixl_name),
                Err(why) => {
                    assert!(why.contains("changed the keys"), "{why}");
                    assert_eq!(usize::from(key), MAX_NAMES_PER_PEER);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// A fresh region per blob (a server registering a new buffer per
    /// operation): the record, NIXL's names and the index stay bounded, and
    /// the regions of the recent blobs (those the core's cache may not load
    /// again) stay in the record.
    #[test]
    fn a_record_of_fresh_regions_stays_bounded() {
        let mut peers = Peers::default();
        let blob = |i: u64| md("p", 1, &[(0x1000 * (i + 1), 7)]);
        let mut compactions = 0;
        for i in 0..5 * COMPACT_FLOOR as u64 {
            let b = blob(i);
            match peers.plan(&b, OWN) {
                Ok(Plan::Merge { nixl_name }) => peers.merged(&b, &nixl_name),
                Ok(Plan::Rename {
                    nixl_name,
                    md,
                    compacting: true,
                }) => {
                    compactions += 1;
                    assert!(md.regions().count() <= RECENT_LOADS as usize + 1);
                    peers.renamed(&md, &nixl_name);
                    peers.found(&b);
                    let retired = peers.retire("p");
                    assert_eq!(retired.len(), 1, "{retired:?}");
                }
                other => panic!("{i}: {other:?}"),
            }
            let p = &peers.peers["p"];
            assert!(
                p.regions.len() <= 2 * COMPACT_FLOOR + 1,
                "{i}: {}",
                p.regions.len()
            );
            assert_eq!(p.spans.indexed(), p.regions.len());
            assert!(p.stale.is_empty());
            for back in 0..(16.min(i)) {
                assert_eq!(
                    peers.plan(&blob(i - back), OWN),
                    Ok(Plan::Loaded),
                    "{i} {back}"
                );
            }
        }
        assert!(compactions >= 2, "{compactions}");
        // The names cycle: a retired name is free again.
        assert!(matches!(peers.nixl_name("p"), Some("p" | "p#1")));
    }

    /// A transfer posted against a name keeps it loaded after a rename;
    /// released, the name is retired (for the caller to unload).
    #[test]
    fn an_earlier_name_is_retired_only_once_no_transfer_uses_it() {
        let peers = Mutex::new(Peers::default());
        lock(&peers).merged(&md("p", 1, &[(0x1000, 7)]), "p");
        let (posting, spans) = Peers::posting(&peers, "p", true);
        assert_eq!(posting.name(), "p");
        assert!(spans.is_some());
        posting.keep();
        // A posting dropped before its transfer was recorded counts out.
        drop(Peers::posting(&peers, "p", false));
        let changed = md("p", 1, &[(0x1000, 8)]);
        let Ok(Plan::Rename { nixl_name, md, .. }) = lock(&peers).plan(&changed, OWN) else {
            panic!("no rename");
        };
        lock(&peers).renamed(&md, &nixl_name);
        assert!(lock(&peers).retire("p").is_empty());
        let (next, _) = Peers::posting(&peers, "p", false);
        assert_eq!(next.name(), "p#1");
        drop(next);
        lock(&peers).posted("p");
        assert_eq!(lock(&peers).retire("p"), ["p"]);
        assert_eq!(
            lock(&peers).remove("p"),
            Some(Names {
                current: Some("p#1".into()),
                stale: vec![],
            })
        );
    }
}
