//! The peers this backend loaded into its agents: what NIXL was given for
//! each, and the name NIXL knows each by.
//!
//! Why the record: NIXL 1.5.1 keeps a peer's connection in its UCX engine when
//! it refuses a blob in the region section, after it took the connection info
//! (a region it loaded with one key, listed with another: what a peer that
//! re-registered memory at the same address publishes on RDMA hosts). It
//! erases the peer's entries, so `invalidate_remote_md` finds nothing
//! (NOT_FOUND, which nixl-sys reports as success) and never disconnects the
//! engine; every later load of that name fails (INVALID_PARAM). A name NIXL
//! may have left that way is *poisoned*: never loaded again by this backend.
//!
//! So a load is planned against what NIXL holds for the peer:
//! - a blob that changes the key of a region NIXL holds is not given to NIXL
//!   under the peer's name: everything the peer had, with the new keys, is
//!   loaded under a new name (the old one stays loaded, untouched, for the
//!   transfers that may still use it, until the peer is unloaded);
//! - a blob NIXL refuses for a reason nothing here can tell (UCX refusing a
//!   well-formed key, say) and that made NIXL erase the peer: what the peer
//!   had is loaded again under a new name, so a refused blob changes nothing.
//!
//! A peer's NIXL name is its own until then; after, `<name>#<n>`, the first
//! such name no peer uses and NIXL never poisoned. Peers do not see it: a
//! notification names its sender, not its receiver.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use descriptor_core::{DeviceKind, Segment};

use crate::agent_metadata::{AgentMetadata, Conn, RegionKey};

/// NIXL names one peer may hold before it is unloaded: its keys changed this
/// often while operations used it. Each holds a UCX endpoint to the peer.
pub(crate) const MAX_NAMES_PER_PEER: usize = 16;

/// The peers, by their own names.
#[derive(Debug, Default)]
pub(crate) struct Peers {
    peers: HashMap<String, Peer>,
    /// Names NIXL may keep a connection for after erasing their entries:
    /// never used again by this backend's agents.
    poisoned: HashSet<String>,
}

#[derive(Debug)]
struct Peer {
    /// The name both agents know the peer by now.
    nixl_name: String,
    /// Whether NIXL holds `conns` and `regions` under `nixl_name`.
    loaded: bool,
    /// Earlier names, unloaded with the peer.
    stale: Vec<String>,
    conns: Vec<Conn>,
    regions: BTreeMap<RegionKey, Vec<u8>>,
    /// Where `regions` lie, for merging a transfer's pairs.
    spans: Arc<Spans>,
}

impl Peer {
    /// `regions` changed: index them again.
    fn reindex(&mut self) {
        self.spans = Arc::new(Spans::new(self.regions.keys()));
    }
}

/// Where a peer's registrations lie, by NIXL memory type and device: tells
/// whether two ranges of a transfer lie in one registration, so that they
/// may go to NIXL as one descriptor (a descriptor across two is refused).
#[derive(Debug, Default)]
pub(crate) struct Spans {
    kinds: Vec<(MemKind, Reach)>,
}

/// NIXL's memory type and device id.
type MemKind = (u32, u64);

/// Registrations' starts, sorted, each with the furthest end of the
/// registrations starting at or before it.
type Reach = Vec<(u64, u64)>;

impl Spans {
    fn new<'a>(regions: impl Iterator<Item = &'a RegionKey>) -> Spans {
        let mut by_kind: BTreeMap<MemKind, Reach> = BTreeMap::new();
        for key in regions {
            by_kind
                .entry((key.mem, key.dev))
                .or_default()
                .push((key.addr, key.addr.saturating_add(key.len)));
        }
        let kinds = by_kind
            .into_iter()
            .map(|(kind, mut spans)| {
                spans.sort_unstable();
                let mut furthest = 0;
                for span in &mut spans {
                    furthest = furthest.max(span.1);
                    span.1 = furthest;
                }
                (kind, spans)
            })
            .collect();
        Spans { kinds }
    }

    /// Whether one registration holds every byte from `a`'s start through
    /// `b`'s end (`a` before `b`, on one device): one that starts at or
    /// before `a` and ends at or past `b`'s end. [`TransferRequest::runs`]
    /// asks it with `a` the run merged so far, so that a run is merged only
    /// while all of it lies in one registration: where registrations overlap
    /// (X = [0, 8 KiB) and Y = [4 KiB, 12 KiB), a Dynamo peer's overlapping
    /// descriptors), neighbours each in one may together lie in none.
    ///
    /// [`TransferRequest::runs`]: descriptor_core::TransferRequest::runs
    pub(crate) fn hold_together(&self, a: &Segment, b: &Segment) -> bool {
        let kind = match a.device.kind() {
            DeviceKind::Host => (0, 0),
            DeviceKind::Cuda | DeviceKind::Xpu => (1, u64::from(a.device.ordinal())),
            _ => return false,
        };
        let (Ok(start), Some(end)) = (
            u64::try_from(a.addr),
            b.end().and_then(|e| u64::try_from(e).ok()),
        ) else {
            return false;
        };
        let Some((_, spans)) = self.kinds.iter().find(|(k, _)| *k == kind) else {
            return false;
        };
        let before = spans.partition_point(|&(s, _)| s <= start);
        before.checked_sub(1).is_some_and(|i| spans[i].1 >= end)
    }
}

/// How to load a peer's blob.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// NIXL holds everything the blob holds: no call.
    Loaded,
    /// Give the blob to NIXL under `nixl_name` (the peer's NIXL name, or the
    /// name for a peer not loaded).
    Merge { nixl_name: String },
    /// A key changed: give `md` (all the peer had, the blob's keys winning)
    /// to NIXL under a new name.
    Rename {
        nixl_name: String,
        md: AgentMetadata,
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

impl Peers {
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

    /// How to load `md`. `own` are this backend's agents' names: a blob
    /// naming one is given to NIXL as it is (NIXL refuses an agent loading
    /// itself). Err if the peer holds [`MAX_NAMES_PER_PEER`] names.
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
        // refuses it before it reads the regions, and keeps what it had.
        let mut new_conns = Vec::new();
        for conn in &md.conns {
            match peer.conns.iter().find(|c| c.backend == conn.backend) {
                Some(known) if known.info != conn.info => return Ok(merge),
                Some(_) => {}
                None => new_conns.push(conn.clone()),
            }
        }
        let mut changed = false;
        let mut new_regions = false;
        for (key, bytes) in md.regions() {
            match peer.regions.get(&key) {
                Some(known) if known.as_slice() != bytes => changed = true,
                Some(_) => {}
                None => new_regions = true,
            }
        }
        if !changed {
            return Ok(if new_conns.is_empty() && !new_regions {
                Plan::Loaded
            } else {
                merge
            });
        }
        if peer.stale.len() + 1 >= MAX_NAMES_PER_PEER {
            return Err(format!(
                "peer {:?} changed the keys of regions it had published {} times while in use; \
                 it is loaded again once no operation uses it",
                md.name,
                peer.stale.len() + 1
            ));
        }
        let mut conns = peer.conns.clone();
        conns.extend(new_conns);
        let mut regions = peer.regions.clone();
        regions.extend(md.regions().map(|(key, bytes)| (key, bytes.to_vec())));
        let nixl_name = self.fresh_name(&md.name, own);
        Ok(Plan::Rename {
            md: AgentMetadata::from_parts(&md.name, conns, &regions),
            nixl_name,
        })
    }

    /// NIXL took `md` under `nixl_name` ([`Plan::Merge`]).
    pub(crate) fn merged(&mut self, md: &AgentMetadata, nixl_name: &str) {
        let peer = self.peers.entry(md.name.clone()).or_insert_with(|| Peer {
            nixl_name: nixl_name.to_owned(),
            loaded: true,
            stale: Vec::new(),
            conns: Vec::new(),
            regions: BTreeMap::new(),
            spans: Arc::default(),
        });
        peer.loaded = true;
        for conn in &md.conns {
            if !peer.conns.iter().any(|c| c.backend == conn.backend) {
                peer.conns.push(conn.clone());
            }
        }
        peer.regions
            .extend(md.regions().map(|(key, bytes)| (key, bytes.to_vec())));
        peer.reindex();
    }

    /// NIXL took `md`, all the peer's metadata, under `nixl_name`
    /// ([`Plan::Rename`], or what the peer had after NIXL erased it); the
    /// peer's previous name becomes stale.
    pub(crate) fn renamed(&mut self, md: &AgentMetadata, nixl_name: &str) {
        if let Some(peer) = self.peers.get_mut(&md.name) {
            let old = std::mem::replace(&mut peer.nixl_name, nixl_name.to_owned());
            peer.stale.push(old);
            peer.conns = md.conns.clone();
            peer.regions = md.regions().map(|(k, v)| (k, v.to_vec())).collect();
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
            .then(|| AgentMetadata::from_parts(peer, p.conns.clone(), &p.regions))
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
        // Another incarnation (other connection info) goes to NIXL, which
        // refuses it and keeps what it had.
        assert_eq!(peers.plan(&md("p", 2, &[(0x1000, 9)]), OWN), Ok(merge("p")));
        assert_eq!(peers.nixl_name("p"), Some("p"));
    }

    #[test]
    fn a_changed_key_loads_everything_with_the_new_key_under_a_new_name() {
        let mut peers = Peers::default();
        peers.merged(&md("p", 1, &[(0x1000, 7), (0x2000, 8)]), "p");
        let Ok(Plan::Rename { nixl_name, md: all }) = peers.plan(&md("p", 1, &[(0x2000, 9)]), OWN)
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
                Ok(Plan::Rename { nixl_name, md }) => peers.renamed(&md, &nixl_name),
                Err(why) => {
                    assert!(why.contains("changed the keys"), "{why}");
                    assert_eq!(usize::from(key), MAX_NAMES_PER_PEER);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn spans_tell_whether_two_ranges_lie_in_one_registration() {
        use descriptor_core::Device;
        let key = |mem: u32, addr: u64, len: u64, dev: u64| RegionKey {
            backend: "UCX".into(),
            mem,
            addr,
            len,
            dev,
        };
        let keys = [
            key(0, 0x1000, 0x1000, 0),
            key(0, 0x2000, 0x1000, 0),
            key(0, 0x8000, 0x4000, 0),
            key(1, 0x1000, 0x4000, 1),
        ];
        let spans = Spans::new(keys.iter());
        let seg = |addr: usize, len: usize, device: Device| Segment { addr, len, device };
        let host = |addr, len| seg(addr, len, Device::HOST);
        // In one registration.
        assert!(spans.hold_together(&host(0x1000, 0x800), &host(0x1800, 0x800)));
        assert!(spans.hold_together(&host(0x8000, 0x100), &host(0xbf00, 0x100)));
        // Adjacent registrations, past the end, outside every one.
        assert!(!spans.hold_together(&host(0x1800, 0x800), &host(0x2000, 0x800)));
        assert!(!spans.hold_together(&host(0xb000, 0x1000), &host(0xc000, 0x10)));
        assert!(!spans.hold_together(&host(0x4000, 0x10), &host(0x4010, 0x10)));
        // Another device's registration does not hold host ranges, nor the
        // other way round; its own device's ranges it does.
        let cuda = |ordinal, addr, len| seg(addr, len, Device::cuda(ordinal));
        assert!(spans.hold_together(&cuda(1, 0x1000, 0x800), &cuda(1, 0x1800, 0x3800)));
        assert!(!spans.hold_together(&cuda(0, 0x1000, 0x800), &cuda(0, 0x1800, 0x800)));
        assert!(!spans.hold_together(&host(0x3000, 0x800), &host(0x3800, 0x800)));
        assert!(!Spans::default().hold_together(&host(0x1000, 1), &host(0x1001, 1)));
    }

    /// X = [0, 8 KiB) and Y = [4 KiB, 12 KiB) of one peer, three 4 KiB remote
    /// ranges end to end: each neighbouring pair lies in X or in Y, the
    /// three together in neither; the runs NIXL is given lie each in one.
    #[test]
    fn runs_over_overlapping_registrations_lie_each_in_one() {
        use descriptor_core::{Device, OperationKind, RegionId, TransferRequest};
        const B: u64 = 4096;
        let key = |addr: u64, len: u64| RegionKey {
            backend: "UCX".into(),
            mem: 0,
            addr,
            len,
            dev: 0,
        };
        let base = 0x10_0000;
        let spans = Spans::new([key(base, 2 * B), key(base + B, 2 * B)].iter());
        let host = |addr: u64, len: u64| Segment {
            addr: usize::try_from(addr).unwrap(),
            len: usize::try_from(len).unwrap(),
            device: Device::HOST,
        };
        let remote: Vec<Segment> = (0..3).map(|i| host(base + i * B, B)).collect();
        assert!(spans.hold_together(&remote[0], &remote[1]));
        assert!(spans.hold_together(&remote[1], &remote[2]));
        assert!(!spans.hold_together(&host(base, 2 * B), &remote[2]));
        let local: Vec<Segment> = (0..3).map(|i| host(0x90_0000 + i * B, B)).collect();
        let request = TransferRequest {
            op: OperationKind::Read,
            peer: "p",
            local: &local,
            local_regions: &[RegionId(1); 3],
            remote: &remote,
            notification: b"k",
            notify: true,
        };
        let runs: Vec<(Segment, usize)> = request
            .runs(|a, b| spans.hold_together(a, b))
            .map(|run| (run.remote, run.count))
            .collect();
        assert_eq!(runs, [(host(base, 2 * B), 2), (host(base + 2 * B, B), 1)]);
    }
}
