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
//!   transfers posted against it: it is unloaded at a later load once none
//!   is in flight, or with the peer);
//! - a blob NIXL refuses for a reason nothing here can tell (UCX refusing a
//!   well-formed key, say) and that made NIXL erase the peer: what the peer
//!   had is loaded again under a new name, so a refused blob changes nothing.
//!
//! A peer's NIXL name is its own until then; after, `<name>#<n>`, the first
//! such name no peer uses and NIXL never poisoned. Peers do not see it: a
//! notification names its sender, not its receiver.
//!
//! Two rooms: [`record`] is the bookkeeping (what NIXL holds per peer, the
//! plan of a load, the transfers in flight per NIXL name), pure and tested
//! without NIXL; [`loader`] is [`PeerLoader`], the NIXL calls that carry a
//! plan out, under one lock.

mod loader;
mod record;

pub(crate) use loader::PeerLoader;
