//! The loopback agent-metadata blob: which fabric, agent and exposure it names.
//!
//! It carries identities only, never addresses: what a peer may touch is decided
//! by the fabric's own record of the exposure, so a forged blob can at most name
//! an exposure that exists, and then only with the access it was made for.

use descriptor_core::{Error, Result};

const MAGIC: &[u8; 4] = b"LBK1";

pub(crate) struct Blob<'a> {
    pub(crate) fabric: u64,
    pub(crate) agent_id: u64,
    pub(crate) grant: u64,
    pub(crate) agent_name: &'a str,
}

pub(crate) fn encode(fabric: u64, agent_id: u64, grant: u64, agent_name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 24 + agent_name.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&fabric.to_le_bytes());
    out.extend_from_slice(&agent_id.to_le_bytes());
    out.extend_from_slice(&grant.to_le_bytes());
    out.extend_from_slice(agent_name.as_bytes());
    out
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Blob<'_>> {
    let bad = |reason: &str| Error::InvalidMetadata {
        field: "nixl_metadata".into(),
        reason: format!("not loopback agent metadata: {reason}"),
    };
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("wrong magic"))?;
    let (fabric, rest) = take_u64(rest).ok_or_else(|| bad("truncated"))?;
    let (agent_id, rest) = take_u64(rest).ok_or_else(|| bad("truncated"))?;
    let (grant, rest) = take_u64(rest).ok_or_else(|| bad("truncated"))?;
    let agent_name = std::str::from_utf8(rest).map_err(|_| bad("agent name is not UTF-8"))?;
    if agent_name.is_empty() || agent_name.len() > 255 {
        return Err(bad("agent name must be 1 to 255 bytes"));
    }
    Ok(Blob {
        fabric,
        agent_id,
        grant,
        agent_name,
    })
}

fn take_u64(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*head), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let blob = encode(1, 2, 3, "worker-7");
        let decoded = decode(&blob).unwrap();
        assert_eq!((decoded.fabric, decoded.agent_id, decoded.grant), (1, 2, 3));
        assert_eq!(decoded.agent_name, "worker-7");
        assert!(decode(&blob[..20]).is_err());
        assert!(decode(b"NIXL....").is_err());
        assert!(decode(&encode(1, 2, 3, "")).is_err());
    }
}
