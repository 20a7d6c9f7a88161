//! NIXL's serialized agent metadata (what `get_local_md` and
//! `get_local_partial_md` return and `load_remote_md` takes), read whole and
//! checked before NIXL sees a byte of it, and written back.
//!
//! Why here and not in NIXL: NIXL 1.5.1 reads a blob field by field, trusting
//! every length (a truncated blob makes it read past the end), and a blob it
//! refuses in its region section, after it accepted the connection info, leaves
//! the peer's UCX connection behind with nothing NIXL can unload: every later
//! load of that peer fails. nixl-sys 1.5.2 panics on a peer name that is not
//! UTF-8. UCX unpacks a region's remote key without its length and indexes its
//! tables with the key's memory type (one flipped byte there crashed the process
//! here). So a blob is parsed in full here, and refused unless every field is
//! where NIXL 1.5.1 puts it.
//!
//! Inside the fields, UCX's own formats are checked only as far as their
//! frame: a worker address's version, a key's memory-domain map, memory type
//! and per-domain sizes. What UCX makes of the rest (the devices and
//! transport addresses in a worker address, a transport's key bytes) it
//! trusts, and fuzzing crashed it there (`fuzz/fuzz_targets/nixl_load.rs`).
//!
//! The format (`nixlSerDes`): `nixlSerDes|`, then entries of a tag, a
//! little-endian u64 length, that many bytes, and `|`:
//!
//! ```text
//! Agent <name>  Conns <u64 n>  n × (t <backend>  c <connection info>)
//! "" MemSection  nixlSecElms <u64 m>
//! m × (bknd <backend>  nixlDList nixlSDList  t <u32 memory type>  n <u64 k>
//!      k × ("" <u64 addr, u64 len, u64 device, backend's key>))
//! ```
//!
//! This crate's two-part blob ([`MetadataScope::Exposed`](crate::MetadataScope))
//! is [`SCOPED_MAGIC`], the first part's length as a little-endian u64, the
//! connection info and the regions, each a `nixlSerDes` blob.

use std::collections::BTreeMap;
use std::fmt;

/// Prefix of this crate's two-part agent metadata.
pub(crate) const SCOPED_MAGIC: &[u8; 8] = b"NXRSMD01";
/// The longest agent name accepted.
pub(crate) const MAX_NAME: usize = 4096;
/// The longest backend (plugin) name accepted.
const MAX_BACKEND_NAME: usize = 256;
const HEADER: &[u8] = b"nixlSerDes|";
const MEM_SECTION: &[u8] = b"MemSection";
/// The descriptor-list type NIXL writes for a section.
const LIST_TYPE: &[u8] = b"nixlSDList";
/// `nixlBasicDesc`: address, length and device id, three u64s.
const DESC_HEAD: usize = 24;
/// NIXL's memory types: DRAM, VRAM, BLK, OBJ, FILE.
const MAX_MEM_TYPE: u32 = 4;
/// UCX's memory types a packed remote key may name (`UCS_MEMORY_TYPE_LAST` of
/// the UCX NIXL 1.5.1 ships: host to ze-managed).
const UCX_MEMORY_TYPES: u8 = 9;

/// A peer's agent metadata, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentMetadata {
    /// The agent's name: UTF-8, no NUL, 1 to [`MAX_NAME`] bytes.
    pub(crate) name: String,
    /// Connection info, one per backend.
    pub(crate) conns: Vec<Conn>,
    /// Registered regions, by backend and memory type.
    pub(crate) sections: Vec<Section>,
}

/// One backend's connection info (UCX: the worker address).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Conn {
    pub(crate) backend: String,
    pub(crate) info: Vec<u8>,
}

/// A backend's regions of one memory type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Section {
    pub(crate) backend: String,
    pub(crate) mem: u32,
    pub(crate) regions: Vec<RegionMd>,
}

/// One registered region and the backend's key to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegionMd {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) dev: u64,
    /// What the backend needs to reach the region (UCX: a packed remote key).
    pub(crate) key: Vec<u8>,
}

/// Where NIXL tells one region from another: a region with the same key
/// (backend, memory type, address, length, device) and other key bytes is a
/// changed key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct RegionKey {
    pub(crate) backend: String,
    pub(crate) mem: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) dev: u64,
}

impl RegionKey {
    fn of(section: &Section, region: &RegionMd) -> RegionKey {
        RegionKey {
            backend: section.backend.clone(),
            mem: section.mem,
            addr: region.addr,
            len: region.len,
            dev: region.dev,
        }
    }
}

/// Why a blob was refused, and the byte offset where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed {
    pub(crate) at: usize,
    pub(crate) what: String,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "not NIXL agent metadata as NIXL 1.5.1 writes it: {} (at byte {})",
            self.what, self.at
        )
    }
}

impl AgentMetadata {
    /// Parses a blob: NIXL's own, or this crate's two-part one.
    pub(crate) fn parse(blob: &[u8]) -> Result<AgentMetadata, Malformed> {
        let Some((connection, regions)) = split_scoped(blob) else {
            return parse_serdes(blob, 0);
        };
        let offset = SCOPED_MAGIC.len() + 8;
        let mut md = parse_serdes(connection, offset)?;
        if regions.is_empty() {
            return Ok(md);
        }
        let regions = parse_serdes(regions, offset + connection.len())?;
        if regions.name != md.name {
            return Err(Malformed {
                at: offset + connection.len(),
                what: format!(
                    "the connection info names {:?} but the regions belong to {:?}",
                    md.name, regions.name
                ),
            });
        }
        for conn in regions.conns {
            add_conn(&mut md.conns, conn, offset + connection.len())?;
        }
        md.sections.extend(regions.sections);
        check_regions(&md.sections, offset + connection.len())?;
        Ok(md)
    }

    /// The regions, by the key NIXL tells them apart by.
    pub(crate) fn regions(&self) -> impl Iterator<Item = (RegionKey, &[u8])> {
        self.sections.iter().flat_map(|s| {
            s.regions
                .iter()
                .map(move |r| (RegionKey::of(s, r), r.key.as_slice()))
        })
    }

    /// Metadata of the agent `name` with `conns` and `regions`.
    pub(crate) fn from_parts(
        name: &str,
        conns: Vec<Conn>,
        regions: &BTreeMap<RegionKey, Vec<u8>>,
    ) -> AgentMetadata {
        let mut sections: Vec<Section> = Vec::new();
        for (key, bytes) in regions {
            let region = RegionMd {
                addr: key.addr,
                len: key.len,
                dev: key.dev,
                key: bytes.clone(),
            };
            // Sorted by backend, then memory type: a section's regions are adjacent.
            match sections.last_mut() {
                Some(s) if s.backend == key.backend && s.mem == key.mem => s.regions.push(region),
                _ => sections.push(Section {
                    backend: key.backend.clone(),
                    mem: key.mem,
                    regions: vec![region],
                }),
            }
        }
        AgentMetadata {
            name: name.to_owned(),
            conns,
            sections,
        }
    }

    /// The blob NIXL reads, naming the agent `name` (the peer's own name, or
    /// the one this backend loads it under).
    pub(crate) fn to_blob(&self, name: &str) -> Vec<u8> {
        let mut w = Writer(HEADER.to_vec());
        w.entry(b"Agent", name.as_bytes());
        w.entry(b"Conns", &(self.conns.len() as u64).to_le_bytes());
        for conn in &self.conns {
            w.entry(b"t", conn.backend.as_bytes());
            w.entry(b"c", &conn.info);
        }
        w.entry(b"", MEM_SECTION);
        w.entry(b"nixlSecElms", &(self.sections.len() as u64).to_le_bytes());
        for section in &self.sections {
            w.entry(b"bknd", section.backend.as_bytes());
            w.entry(b"nixlDList", LIST_TYPE);
            w.entry(b"t", &section.mem.to_le_bytes());
            w.entry(b"n", &(section.regions.len() as u64).to_le_bytes());
            for r in &section.regions {
                let mut desc = Vec::with_capacity(DESC_HEAD + r.key.len());
                desc.extend_from_slice(&r.addr.to_le_bytes());
                desc.extend_from_slice(&r.len.to_le_bytes());
                desc.extend_from_slice(&r.dev.to_le_bytes());
                desc.extend_from_slice(&r.key);
                w.entry(b"", &desc);
            }
        }
        w.0
    }
}

/// This crate's two-part blob: the connection info, then the regions.
pub(crate) fn scoped_blob(connection: &[u8], regions: &[u8]) -> Vec<u8> {
    let mut blob = Vec::with_capacity(SCOPED_MAGIC.len() + 8 + connection.len() + regions.len());
    blob.extend_from_slice(SCOPED_MAGIC);
    blob.extend_from_slice(&(connection.len() as u64).to_le_bytes());
    blob.extend_from_slice(connection);
    blob.extend_from_slice(regions);
    blob
}

/// Splits a two-part blob into (connection, regions).
pub(crate) fn split_scoped(blob: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = blob.strip_prefix(SCOPED_MAGIC)?;
    let (len, rest) = rest.split_first_chunk::<8>()?;
    let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
    (len <= rest.len()).then(|| rest.split_at(len))
}

struct Writer(Vec<u8>);

impl Writer {
    fn entry(&mut self, tag: &[u8], payload: &[u8]) {
        self.0.extend_from_slice(tag);
        self.0
            .extend_from_slice(&(payload.len() as u64).to_le_bytes());
        self.0.extend_from_slice(payload);
        self.0.push(b'|');
    }
}

/// Reads entries off a `nixlSerDes` blob; `base` is the blob's offset in what
/// the caller was given, for the error's byte offset.
struct Reader<'a> {
    blob: &'a [u8],
    at: usize,
    base: usize,
}

impl<'a> Reader<'a> {
    fn fail<T>(&self, what: impl Into<String>) -> Result<T, Malformed> {
        Err(Malformed {
            at: self.base + self.at,
            what: what.into(),
        })
    }

    fn rest(&self) -> &'a [u8] {
        self.blob.get(self.at..).unwrap_or_default()
    }

    /// The payload of the entry tagged `tag` that must come next.
    fn entry(&mut self, tag: &[u8], what: &str) -> Result<&'a [u8], Malformed> {
        let Some(rest) = self.rest().strip_prefix(tag) else {
            let shown = String::from_utf8_lossy(tag);
            return self.fail(format!("expected the {what} (tag {shown:?})"));
        };
        let Some((len, rest)) = rest.split_first_chunk::<8>() else {
            return self.fail(format!("truncated in the length of the {what}"));
        };
        let len = u64::from_le_bytes(*len);
        // The payload and its `|` must fit in what is left.
        let fits = usize::try_from(len).ok().filter(|len| *len < rest.len());
        let Some(len) = fits else {
            return self.fail(format!(
                "the {what} claims {len} bytes, {} are left",
                rest.len().saturating_sub(1)
            ));
        };
        let (payload, after) = rest.split_at(len);
        if after.first() != Some(&b'|') {
            return self.fail(format!("no `|` after the {what}"));
        }
        self.at += tag.len() + 8 + len + 1;
        Ok(payload)
    }

    fn u64_entry(&mut self, tag: &[u8], what: &str) -> Result<u64, Malformed> {
        let at = self.at;
        let payload = self.entry(tag, what)?;
        match <[u8; 8]>::try_from(payload) {
            Ok(bytes) => Ok(u64::from_le_bytes(bytes)),
            Err(_) => {
                self.at = at;
                self.fail(format!("the {what} is {} bytes, not 8", payload.len()))
            }
        }
    }

    fn u32_entry(&mut self, tag: &[u8], what: &str) -> Result<u32, Malformed> {
        let at = self.at;
        let payload = self.entry(tag, what)?;
        match <[u8; 4]>::try_from(payload) {
            Ok(bytes) => Ok(u32::from_le_bytes(bytes)),
            Err(_) => {
                self.at = at;
                self.fail(format!("the {what} is {} bytes, not 4", payload.len()))
            }
        }
    }

    /// A name: UTF-8 (nixl-sys panics on anything else), no NUL (NIXL's C
    /// API would cut it there), 1 to `max` bytes.
    fn name(&mut self, tag: &[u8], what: &str, max: usize) -> Result<String, Malformed> {
        let at = self.at;
        let payload = self.entry(tag, what)?;
        let refused = if payload.is_empty() {
            Some("empty".to_owned())
        } else if payload.len() > max {
            Some(format!("{} bytes, more than {max}", payload.len()))
        } else if payload.contains(&0) {
            Some("holds a NUL byte".to_owned())
        } else {
            None
        };
        if let Some(why) = refused {
            self.at = at;
            return self.fail(format!("the {what} is {why}"));
        }
        match std::str::from_utf8(payload) {
            Ok(name) => Ok(name.to_owned()),
            Err(e) => {
                self.at = at;
                self.fail(format!("the {what} is not UTF-8 ({e})"))
            }
        }
    }
}

fn parse_serdes(blob: &[u8], base: usize) -> Result<AgentMetadata, Malformed> {
    let mut r = Reader { blob, at: 0, base };
    if !blob.starts_with(HEADER) {
        return r.fail("no `nixlSerDes|` header");
    }
    r.at = HEADER.len();
    let name = r.name(b"Agent", "agent name", MAX_NAME)?;
    let conn_count = r.u64_entry(b"Conns", "connection count")?;
    let mut conns = Vec::new();
    for _ in 0..conn_count {
        // Each entry consumes bytes: a count past the blob's end fails here.
        let at = base + r.at;
        let backend = r.name(b"t", "connection's backend", MAX_BACKEND_NAME)?;
        let info = r.entry(b"c", "connection info")?;
        if info.is_empty() {
            return r.fail(format!("the {backend} connection info is empty"));
        }
        if backend == "UCX"
            && let Err(why) = check_ucx_address(info)
        {
            return Err(Malformed {
                at,
                what: format!("the UCX worker address: {why}"),
            });
        }
        add_conn(
            &mut conns,
            Conn {
                backend,
                info: info.to_vec(),
            },
            at,
        )?;
    }
    let marker = r.entry(b"", "memory section marker")?;
    if marker != MEM_SECTION {
        return r.fail("the memory section marker is not `MemSection`");
    }
    let section_count = r.u64_entry(b"nixlSecElms", "section count")?;
    let mut sections = Vec::new();
    for _ in 0..section_count {
        sections.push(parse_section(&mut r)?);
    }
    if r.at != blob.len() {
        return r.fail(format!(
            "{} bytes follow the last section",
            blob.len() - r.at
        ));
    }
    check_regions(&sections, base)?;
    Ok(AgentMetadata {
        name,
        conns,
        sections,
    })
}

fn parse_section(r: &mut Reader<'_>) -> Result<Section, Malformed> {
    let backend = r.name(b"bknd", "section's backend", MAX_BACKEND_NAME)?;
    let list = r.entry(b"nixlDList", "descriptor list type")?;
    if list != LIST_TYPE {
        return r.fail("the descriptor list type is not `nixlSDList`");
    }
    let mem = r.u32_entry(b"t", "memory type")?;
    if mem > MAX_MEM_TYPE {
        return r.fail(format!(
            "memory type {mem} is not one of NIXL's (0-{MAX_MEM_TYPE})"
        ));
    }
    // NIXL refuses an empty section only after it took the connection info.
    let count = r.u64_entry(b"n", "region count")?;
    if count == 0 {
        return r.fail(format!("the {backend} section lists no region"));
    }
    let mut regions = Vec::new();
    for _ in 0..count {
        let at = r.at;
        let desc = r.entry(b"", "region")?;
        let fail = |what: String| {
            Err(Malformed {
                at: r.base + at,
                what,
            })
        };
        let Some((head, key)) = desc.split_first_chunk::<DESC_HEAD>() else {
            return fail(format!(
                "a region is {} bytes, shorter than its address, length and device",
                desc.len()
            ));
        };
        let word = |i: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&head[i * 8..i * 8 + 8]);
            u64::from_le_bytes(bytes)
        };
        let (addr, len, dev) = (word(0), word(1), word(2));
        if addr.checked_add(len).is_none() {
            return fail(format!(
                "region {addr:#x}+{len} wraps around the address space"
            ));
        }
        if backend == "UCX"
            && let Err(why) = check_ucx_key(key)
        {
            return fail(format!("the UCX key of region {addr:#x}+{len}: {why}"));
        }
        regions.push(RegionMd {
            addr,
            len,
            dev,
            key: key.to_vec(),
        });
    }
    Ok(Section {
        backend,
        mem,
        regions,
    })
}

/// Adds `conn`, refusing a second, different one for its backend.
fn add_conn(conns: &mut Vec<Conn>, conn: Conn, at: usize) -> Result<(), Malformed> {
    match conns.iter().find(|c| c.backend == conn.backend) {
        Some(known) if known.info != conn.info => Err(Malformed {
            at,
            what: format!("two different {} connection infos", conn.backend),
        }),
        Some(_) => Ok(()),
        None => {
            conns.push(conn);
            Ok(())
        }
    }
}

/// NIXL refuses a region listed twice with different keys, after it took the
/// connection info.
fn check_regions(sections: &[Section], at: usize) -> Result<(), Malformed> {
    let mut seen: BTreeMap<RegionKey, &[u8]> = BTreeMap::new();
    for section in sections {
        for region in &section.regions {
            let key = RegionKey::of(section, region);
            if let Some(known) = seen.insert(key, &region.key)
                && known != region.key.as_slice()
            {
                return Err(Malformed {
                    at,
                    what: format!(
                        "region {:#x}+{} is listed twice with different keys",
                        region.addr, region.len
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The header of a UCX worker address (`ucp_address_pack`): its low four bits
/// are the format's version, which UCX asserts (aborting the process) is one
/// it knows, v1 or v2. The rest UCX reads without a length and trusts: see
/// the crate's docs.
fn check_ucx_address(address: &[u8]) -> Result<(), String> {
    const VERSIONS: u8 = 2;
    let version = address.first().map_or(0, |header| header & 0x0f);
    if version >= VERSIONS {
        return Err(format!("format version {version}, UCX knows 0 and 1"));
    }
    if version == 1 && address.len() < 2 {
        return Err("a v2 header is two bytes".into());
    }
    Ok(())
}

/// The frame of a UCX packed remote key (`ucp_rkey_pack`): a u64 map of memory
/// domains, a memory type, then per domain in the map a size byte and that
/// many bytes; what follows (system device, distances) UCX does not read from
/// a key unpacked without its length, as NIXL unpacks it.
fn check_ucx_key(key: &[u8]) -> Result<(), String> {
    let Some((map, rest)) = key.split_first_chunk::<8>() else {
        return Err(format!("{} bytes, shorter than its domain map", key.len()));
    };
    let domains = u64::from_le_bytes(*map).count_ones();
    let Some((&mem, mut rest)) = rest.split_first() else {
        return Err("no memory type".into());
    };
    if mem >= UCX_MEMORY_TYPES {
        return Err(format!("memory type {mem} is not one of UCX's"));
    }
    for domain in 0..domains {
        let Some((&size, after)) = rest.split_first() else {
            return Err(format!("truncated at domain {domain} of {domains}"));
        };
        let size = usize::from(size);
        if size > after.len() {
            return Err(format!(
                "domain {domain} claims {size} bytes, {} are left",
                after.len()
            ));
        }
        rest = &after[size..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ucx_key(tail: u8) -> Vec<u8> {
        let mut key = 1u64.to_le_bytes().to_vec();
        key.extend_from_slice(&[0, 2, 0xaa, 0xbb, tail]);
        key
    }

    fn sample() -> AgentMetadata {
        AgentMetadata {
            name: "worker-7".into(),
            conns: vec![Conn {
                backend: "UCX".into(),
                info: vec![1, 2, 3, b'|', 0],
            }],
            sections: vec![Section {
                backend: "UCX".into(),
                mem: 0,
                regions: vec![
                    RegionMd {
                        addr: 0x1000,
                        len: 64,
                        dev: 0,
                        key: ucx_key(0xff),
                    },
                    RegionMd {
                        addr: 0x2000,
                        len: 128,
                        dev: 0,
                        key: ucx_key(0xff),
                    },
                ],
            }],
        }
    }

    #[test]
    fn a_blob_written_reads_back_the_same() {
        let md = sample();
        let blob = md.to_blob("worker-7");
        assert!(blob.starts_with(b"nixlSerDes|Agent"));
        assert_eq!(AgentMetadata::parse(&blob), Ok(md.clone()));
        let renamed = AgentMetadata::parse(&md.to_blob("worker-7#1")).unwrap();
        assert_eq!(renamed.name, "worker-7#1");
        assert_eq!(renamed.sections, md.sections);
    }

    #[test]
    fn every_truncation_is_refused() {
        let blob = sample().to_blob("worker-7");
        for cut in 0..blob.len() {
            assert!(
                AgentMetadata::parse(&blob[..cut]).is_err(),
                "accepted {cut} of {} bytes",
                blob.len()
            );
        }
        let mut longer = blob.clone();
        longer.push(b'x');
        let refused = AgentMetadata::parse(&longer).unwrap_err();
        assert!(
            refused.what.contains("follow the last section"),
            "{refused}"
        );
    }

    #[test]
    fn names_that_nixl_sys_or_nixl_cannot_take_are_refused() {
        for name in ["", "nul\0inside"] {
            let blob = sample().to_blob(name);
            assert!(AgentMetadata::parse(&blob).is_err(), "{name:?}");
        }
        let mut blob = sample().to_blob("worker-7");
        blob[24] = 0xff; // the name's first byte
        let refused = AgentMetadata::parse(&blob).unwrap_err();
        assert!(refused.what.contains("not UTF-8"), "{refused}");
        assert_eq!(refused.at, HEADER.len()); // the name's entry
    }

    #[test]
    fn sections_nixl_would_refuse_after_the_connection_info_are_refused() {
        let refused = |edit: &dyn Fn(&mut AgentMetadata)| {
            let mut md = sample();
            edit(&mut md);
            AgentMetadata::parse(&md.to_blob("worker-7"))
                .unwrap_err()
                .what
        };
        assert!(refused(&|md| md.sections[0].regions.clear()).contains("no region"));
        assert!(refused(&|md| md.sections[0].mem = 9).contains("memory type 9"));
        assert!(refused(&|md| md.sections[0].regions[0].key.truncate(10)).contains("claims 2"));
        assert!(refused(&|md| md.sections[0].regions[0].key[8] = 0xff).contains("UCX's"));
        assert!(refused(&|md| md.sections[0].regions[0].key.truncate(3)).contains("domain map"));
        assert!(
            refused(&|md| md.sections[0].regions[1].addr = u64::MAX - 8).contains("wraps around")
        );
        assert!(
            refused(&|md| {
                let mut twin = md.sections[0].regions[0].clone();
                twin.key = ucx_key(0);
                md.sections[0].regions.push(twin);
            })
            .contains("listed twice")
        );
        assert!(
            refused(&|md| {
                let mut other = md.conns[0].clone();
                other.info.push(9);
                md.conns.push(other);
            })
            .contains("two different UCX")
        );
        assert!(refused(&|md| md.conns[0].info.clear()).contains("is empty"));
        assert!(refused(&|md| md.conns[0].info[0] = 0x2a).contains("format version 10"));
    }

    #[test]
    fn a_key_tail_ucx_does_not_read_is_not_checked() {
        let mut md = sample();
        md.sections[0].regions[0].key = ucx_key(0x00);
        assert!(AgentMetadata::parse(&md.to_blob("worker-7")).is_ok());
    }

    #[test]
    fn a_scoped_blob_reads_as_its_two_parts_together() {
        let md = sample();
        let connection = AgentMetadata {
            sections: Vec::new(),
            ..md.clone()
        };
        let regions = AgentMetadata {
            conns: Vec::new(),
            ..md.clone()
        };
        let blob = scoped_blob(
            &connection.to_blob("worker-7"),
            &regions.to_blob("worker-7"),
        );
        assert_eq!(AgentMetadata::parse(&blob), Ok(md.clone()));
        let only = scoped_blob(&connection.to_blob("worker-7"), &[]);
        assert_eq!(AgentMetadata::parse(&only), Ok(connection.clone()));
        let stranger = scoped_blob(
            &connection.to_blob("worker-7"),
            &regions.to_blob("worker-8"),
        );
        let refused = AgentMetadata::parse(&stranger).unwrap_err();
        assert!(refused.what.contains("belong to \"worker-8\""), "{refused}");
        let mut truncated = SCOPED_MAGIC.to_vec();
        truncated.extend_from_slice(&99u64.to_le_bytes());
        assert_eq!(split_scoped(&truncated), None);
        assert!(AgentMetadata::parse(&truncated).is_err());
        assert!(AgentMetadata::parse(b"garbage").is_err());
    }

    #[test]
    fn regions_regroup_into_sections() {
        let md = sample();
        let regions: BTreeMap<RegionKey, Vec<u8>> =
            md.regions().map(|(k, v)| (k, v.to_vec())).collect();
        let rebuilt = AgentMetadata::from_parts("worker-7", md.conns.clone(), &regions);
        assert_eq!(rebuilt, md);
    }
}
