//! The loopback agent-metadata blob: which fabric and agent it names.
//!
//! It carries identities only, never addresses or exposures: what a peer may
//! touch is decided by the fabric's own record of the exposure that a
//! transfer's notification key names. So one agent's blob is the same for all
//! its operations, and a forged blob can at most name an agent that exists.
//! (`LBK1`, the format before, named an exposure too: it is refused.)

use descriptor_core::{Error, Result};

const MAGIC: &[u8; 4] = b"LBK2";

pub(crate) struct Blob<'a> {
    pub(crate) fabric: u64,
    pub(crate) agent_id: u64,
    pub(crate) agent_name: &'a str,
}

pub(crate) fn encode(fabric: u64, agent_id: u64, agent_name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 16 + agent_name.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&fabric.to_le_bytes());
    out.extend_from_slice(&agent_id.to_le_bytes());
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
    let agent_name = std::str::from_utf8(rest).map_err(|_| bad("agent name is not UTF-8"))?;
    if agent_name.is_empty() || agent_name.len() > 255 {
        return Err(bad("agent name must be 1 to 255 bytes"));
    }
    Ok(Blob {
        fabric,
        agent_id,
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
        let blob = encode(1, 2, "worker-7");
        let decoded = decode(&blob).unwrap();
        assert_eq!((decoded.fabric, decoded.agent_id), (1, 2));
        assert_eq!(decoded.agent_name, "worker-7");
        assert!(decode(&blob[..12]).is_err());
        assert!(decode(b"NIXL....").is_err());
        assert!(decode(&encode(1, 2, "")).is_err());
        let mut old = b"LBK1".to_vec();
        old.extend_from_slice(&blob[4..]);
        assert!(decode(&old).is_err(), "the older format is refused");
    }
}
