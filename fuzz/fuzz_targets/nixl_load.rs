//! Mutated real NIXL agent blobs down the NIXL backend's whole load path, with
//! live agents: `RegistrationBackend::peer_name`, `load_remote` (and
//! `unload_remote` of what loaded), then a connector's `begin_read` with the
//! blob as the peer's metadata. A panic is a crash (libfuzzer-sys aborts on
//! one; `catch_unwind` names the call), and so is a crash in nixl-sys, NIXL or
//! UCX below.
//!
//! What is not fuzzed: the bytes UCX trusts. Before a blob goes down the
//! path, the UCX worker address in its connection info is replaced by a live
//! server's, and the memory-domain map at the head of each region's UCX key by
//! the live server's (lengths kept). UCX reads both without a length: a
//! mutated worker address crashed UCX's TCP transport
//! (`uct_tcp_ep_set_dest_addr`, SEGV) within 9,000 runs, and a key whose map
//! named the peer's shared-memory domain with no key bytes made
//! `uct_posix_rkey_unpack` read past the key (heap overflow) within 5,000.
//! The backend checks their frame (the address's version, the key's map,
//! memory type and per-domain sizes), not what UCX makes of them: a peer that
//! can publish metadata can crash a process there (see RELIABILITY.md). Set
//! `NIXL_FUZZ_UCX_TRUSTED=1` to mutate them too. Everything else (names,
//! counts, lengths, tags, sections, regions and the rest of their keys, the
//! two-part framing) is mutated freely.
//!
//! Needs the NIXL runtime: `NIXL_RUNTIME_DIR` (`cargo xtask fuzz` provisions
//! and sets it). At start-up the target writes the blobs of its live servers
//! (full agent metadata, and this crate's two-part metadata) into the corpus
//! folder libFuzzer was given, so a clean clone starts from real blobs, and
//! mutations of them reach live agents.
#![no_main]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use backend_nixl::{LogLevel, MetadataScope, NixlBackend};
use descriptor_core::{
    Connector, Descriptor, OperationKind, RdmaMetadata, ReadableOperation, RegistrationBackend,
    SerializedDescriptor,
};
use libfuzzer_sys::fuzz_target;

/// Bytes each server exposes, and each read moves.
const LEN: usize = 64;
/// How long a read that started may take before it is dropped.
const READ_WAIT: Duration = Duration::from_millis(200);

/// Dropped in field order: the agents that load before those they load.
struct Live {
    /// Loads and unloads blobs directly.
    loader: NixlBackend,
    /// Reads with them.
    reader: Connector,
    /// The readables whose blobs seed the corpus, and their servers; a
    /// read targets the first one's region. Never completed: reads notify
    /// a key no readable has.
    servers: Vec<(ReadableOperation, Connector)>,
    region: Vec<SerializedDescriptor>,
    /// What UCX trusts, as a live server publishes it; `None` to fuzz it.
    trusted: Option<Trusted>,
}

/// A live server's UCX worker address, and its keys' memory-domain map.
struct Trusted {
    address: Vec<u8>,
    domains: [u8; 8],
}

/// The live agents, made at start-up and again when the process holds
/// [`FD_BUDGET`] file descriptors: NIXL 1.5.1 keeps about two sockets per
/// agent for each peer loaded and unloaded (on both sides) until the agent is
/// dropped (measured here, and outside fuzzing too), and the process may hold
/// 20,000.
static LIVE: Mutex<Option<Live>> = Mutex::new(None);
const FD_BUDGET: usize = 8_000;
/// How often (in runs) the descriptors are counted.
const FD_CHECK_EVERY: u64 = 1_000;
static RUNS: AtomicU64 = AtomicU64::new(0);

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// The live agents, made (again) if needed.
fn live() -> MutexGuard<'static, Option<Live>> {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    if live.is_some() && run.is_multiple_of(FD_CHECK_EVERY) && open_fds() > FD_BUDGET {
        // The old agents go first: their names are taken again.
        *live = None;
    }
    if live.is_none() {
        *live = Some(start());
    }
    live
}

fn backend(name: &str, scope: MetadataScope) -> NixlBackend {
    NixlBackend::builder(name)
        .metadata_scope(scope)
        .log_level(LogLevel::Off)
        .build()
        .unwrap_or_else(|e| panic!("NIXL agent {name} (is NIXL_RUNTIME_DIR set?): {e}"))
}

fn start() -> Live {
    let servers: Vec<(ReadableOperation, Connector)> = [
        ("fuzz-server-agent", MetadataScope::Agent),
        ("fuzz-server-scoped", MetadataScope::Exposed),
    ]
    .into_iter()
    .map(|(name, scope)| {
        let server = Connector::new(backend(name, scope));
        let data = Descriptor::new((0..LEN as u8).collect::<Vec<u8>>()).unwrap();
        let readable = server.create_readable(vec![data]).unwrap();
        (readable, server)
    })
    .collect();
    let region = servers[0].0.metadata().descriptors().to_vec();
    let mut address = None;
    let mut domains = None;
    rewrite(
        servers[0].0.metadata().agent_metadata(),
        &mut |info| {
            address.get_or_insert_with(|| info.to_vec());
        },
        &mut |map| {
            domains.get_or_insert(*map);
        },
    );
    // Rewriting the live blob with its own values changes nothing.
    let blob = servers[0].0.metadata().agent_metadata();
    let (same_address, same_domains) = (address.clone(), domains);
    let again = rewrite(
        blob,
        &mut |a| a.clone_from(same_address.as_ref().unwrap()),
        &mut |d| *d = same_domains.unwrap(),
    );
    assert_eq!(again, blob, "the rewrite of a live blob changed it");
    let trusted = std::env::var_os("NIXL_FUZZ_UCX_TRUSTED")
        .is_none()
        .then(|| Trusted {
            address: address.expect("the live blob has a worker address"),
            domains: domains.expect("the live blob has a region"),
        });
    Live {
        trusted,
        loader: backend("fuzz-loader", MetadataScope::Agent),
        reader: Connector::new(backend("fuzz-reader", MetadataScope::Agent)),
        servers,
        region,
    }
}

/// Writes the live servers' blobs into the corpus folders on the command
/// line (libFuzzer reads them after this runs).
fn seed_corpus() {
    let live = live();
    let Some(live) = live.as_ref() else {
        return;
    };
    let folders = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .filter(|arg| Path::new(arg).is_dir());
    for folder in folders {
        for (i, (readable, _)) in live.servers.iter().enumerate() {
            let seed = Path::new(&folder).join(format!("live-server-{i}"));
            if let Err(e) = std::fs::write(&seed, readable.metadata().agent_metadata()) {
                eprintln!("nixl_load: cannot write the seed {}: {e}", seed.display());
            }
        }
    }
}

/// Runs `call`; a panic is a crash, named after `what`. (Nothing `call`
/// touched is looked at after a panic: the process aborts.)
fn must_not_panic<T>(what: &str, call: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(value) => value,
        Err(_) => {
            eprintln!("nixl_load: {what} panicked on a peer's bytes");
            std::process::abort();
        }
    }
}

const SCOPED_MAGIC: &[u8] = b"NXRSMD01";

/// `blob`, a NIXL blob or both parts of a two-part one, after `address`
/// saw (and may change) each connection info and `domains` each region key's
/// first eight bytes. A blob that does not parse as far as one of them comes
/// back as it is from there on: the backend refuses it before NIXL sees it.
fn rewrite(
    blob: &[u8],
    address: &mut dyn FnMut(&mut Vec<u8>),
    domains: &mut dyn FnMut(&mut [u8; 8]),
) -> Vec<u8> {
    let scoped = blob
        .strip_prefix(SCOPED_MAGIC)
        .and_then(|rest| rest.split_first_chunk::<8>())
        .and_then(|(len, rest)| {
            let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
            (len <= rest.len()).then(|| rest.split_at(len))
        });
    let Some((first, second)) = scoped else {
        return in_serdes(blob, address, domains);
    };
    let first = in_serdes(first, address, domains);
    let second = in_serdes(second, address, domains);
    let mut out = SCOPED_MAGIC.to_vec();
    out.extend_from_slice(&(first.len() as u64).to_le_bytes());
    out.extend_from_slice(&first);
    out.extend_from_slice(&second);
    out
}

/// [`rewrite`] of one `nixlSerDes` blob: the backend's grammar, without its
/// checks of what the entries hold.
fn in_serdes(
    blob: &[u8],
    address: &mut dyn FnMut(&mut Vec<u8>),
    domains: &mut dyn FnMut(&mut [u8; 8]),
) -> Vec<u8> {
    /// Copies the entry tagged `tag` at `*at` to `out`, moves past it, and
    /// returns its payload's place in `out`.
    fn entry(
        blob: &[u8],
        at: &mut usize,
        tag: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<std::ops::Range<usize>> {
        let rest = blob.get(*at..)?.strip_prefix(tag)?;
        let (len, rest) = rest.split_first_chunk::<8>()?;
        let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
        if len >= rest.len() || rest[len] != b'|' {
            return None;
        }
        let end = *at + tag.len() + 8 + len + 1;
        out.extend_from_slice(&blob[*at..end]);
        *at = end;
        Some(out.len() - 1 - len..out.len() - 1)
    }
    fn count(out: &[u8], payload: std::ops::Range<usize>) -> Option<u64> {
        Some(u64::from_le_bytes(out[payload].try_into().ok()?))
    }
    let mut out = Vec::with_capacity(blob.len());
    let mut at = 0;
    let _ = (|| {
        let header = b"nixlSerDes|";
        blob.starts_with(header).then_some(())?;
        out.extend_from_slice(header);
        at = header.len();
        entry(blob, &mut at, b"Agent", &mut out)?;
        let conns = entry(blob, &mut at, b"Conns", &mut out)?;
        for _ in 0..count(&out, conns)? {
            entry(blob, &mut at, b"t", &mut out)?;
            let info = entry(blob, &mut at, b"c", &mut out)?;
            // Replaced: written again with its new length.
            let mut new = out[info.clone()].to_vec();
            address(&mut new);
            out.truncate(info.start - 8 - 1);
            out.push(b'c');
            out.extend_from_slice(&(new.len() as u64).to_le_bytes());
            out.extend_from_slice(&new);
            out.push(b'|');
        }
        entry(blob, &mut at, b"", &mut out)?;
        let sections = entry(blob, &mut at, b"nixlSecElms", &mut out)?;
        for _ in 0..count(&out, sections)? {
            for tag in [&b"bknd"[..], b"nixlDList", b"t"] {
                entry(blob, &mut at, tag, &mut out)?;
            }
            let regions = entry(blob, &mut at, b"n", &mut out)?;
            for _ in 0..count(&out, regions)? {
                let region = entry(blob, &mut at, b"", &mut out)?;
                // Address, length and device, then the key.
                let map = region.start + 24..region.start + 32;
                if map.end <= region.end {
                    let bytes: &mut [u8; 8] = (&mut out[map]).try_into().ok()?;
                    domains(bytes);
                }
            }
        }
        Some(())
    })();
    out.extend_from_slice(blob.get(at..).unwrap_or_default());
    out
}

fuzz_target!(init: seed_corpus(), |data: &[u8]| {
    let live = live();
    let Some(live) = live.as_ref() else {
        return;
    };
    let rewritten;
    let data = match &live.trusted {
        Some(trusted) => {
            rewritten = rewrite(
                data,
                &mut |address| address.clone_from(&trusted.address),
                &mut |domains| *domains = trusted.domains,
            );
            &rewritten[..]
        }
        None => data,
    };
    let named = must_not_panic("peer_name", || live.loader.peer_name(data));
    let loaded = must_not_panic("load_remote", || live.loader.load_remote(data));
    if let Ok(peer) = loaded {
        // A blob that loads names its agent.
        assert_eq!(named.as_deref(), Some(peer.as_str()));
        let _ = must_not_panic("unload_remote", || live.loader.unload_remote(&peer));
    }
    let Ok(meta) = RdmaMetadata::new(
        OperationKind::Read,
        live.region.clone(),
        data.to_vec(),
        "fuzz: no readable has this key".to_owned(),
    ) else {
        return;
    };
    let into = vec![Descriptor::new(vec![0u8; LEN]).unwrap()];
    let read = must_not_panic("begin_read", || live.reader.begin_read(&meta, into));
    if let Ok(read) = read {
        let _ = must_not_panic("wait_timeout", || read.wait_timeout(READ_WAIT));
    }
});
