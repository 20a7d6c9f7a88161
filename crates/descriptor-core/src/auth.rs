//! [`PeerKeys`]: shared keys with which a connector authenticates the agent
//! blobs it publishes, and refuses every blob it is given that no key of
//! its own signed, before the backend (NIXL, UCX) sees a byte of it.
//!
//! A sealed blob is the backend's blob behind a 48-byte header:
//! [`SEALED_MAGIC`], the signing key's id (8 bytes of SHA-256 over the key),
//! and an HMAC-SHA256 tag over a domain string and the blob. Without keys a
//! connector publishes and loads the backend's blobs unchanged (what Dynamo
//! 1.6.1's workers read), and refuses a sealed one with a clear error.
//!
//! What the keys protect, and what they do not: a blob is authenticated,
//! not encrypted. A peer without a key cannot get a blob of its making
//! loaded (so a forged worker address or memory key never reaches UCX), but
//! anyone who sees a sealed blob can read the agent metadata inside it, and
//! a key holder reaches all of a registration, as without keys.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// How a sealed blob starts.
pub const SEALED_MAGIC: &[u8; 8] = b"NXCAUTH1";

/// `NIXL_CONNECT_PEER_KEYS`: the keys of [`PeerKeys::from_env`], as
/// comma-separated hex strings, the signing key first.
pub const ENV_PEER_KEYS: &str = "NIXL_CONNECT_PEER_KEYS";

/// The fewest bytes a key may have.
pub const MIN_KEY_BYTES: usize = 16;

/// The sealed header: magic, key id, tag.
const HEADER: usize = 8 + 8 + 32;
/// What the tag covers before the blob, so that a tag made for something
/// else with the same key never verifies here.
const DOMAIN: &[u8] = b"nixl-connect agent blob v1\0";

type HmacSha256 = Hmac<Sha256>;

/// One key and its id.
#[derive(Clone)]
struct Key {
    id: [u8; 8],
    bytes: Vec<u8>,
}

impl Key {
    fn new(bytes: &[u8]) -> Key {
        let digest = Sha256::new()
            .chain_update(b"nixl-connect peer key id\0")
            .chain_update(bytes)
            .finalize();
        let mut id = [0; 8];
        id.copy_from_slice(&digest[..8]);
        Key {
            id,
            bytes: bytes.to_vec(),
        }
    }

    fn mac(&self, blob: &[u8]) -> HmacSha256 {
        // HMAC takes a key of any length: `new_from_slice` cannot fail.
        let mut mac = HmacSha256::new_from_slice(&self.bytes)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        mac.update(DOMAIN);
        mac.update(blob);
        mac
    }
}

/// The keys a connector signs with (the first) and accepts (all of them:
/// rotate by adding the new key to every peer's list, then moving it first,
/// then dropping the old one).
#[derive(Clone)]
pub struct PeerKeys {
    keys: Vec<Key>,
}

impl std::fmt::Debug for PeerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Ids only: a key never goes to a log.
        let ids: Vec<String> = self.keys.iter().map(|k| hex(&k.id)).collect();
        f.debug_struct("PeerKeys").field("ids", &ids).finish()
    }
}

impl PeerKeys {
    /// Keys from their bytes, the signing key first. Err if there is none,
    /// or one is shorter than [`MIN_KEY_BYTES`].
    pub fn new<K: AsRef<[u8]>>(keys: impl IntoIterator<Item = K>) -> Result<PeerKeys> {
        let keys: Vec<Key> = keys.into_iter().map(|k| Key::new(k.as_ref())).collect();
        if keys.is_empty() {
            return Err(invalid("keys", "", "no key given"));
        }
        if keys.iter().any(|k| k.bytes.len() < MIN_KEY_BYTES) {
            return Err(invalid(
                "keys",
                "",
                "a key is shorter than 16 bytes (MIN_KEY_BYTES)",
            ));
        }
        Ok(PeerKeys { keys })
    }

    /// The keys [`ENV_PEER_KEYS`] names (hex, comma-separated), or `None`
    /// when it is unset or empty. Err names what is wrong with it.
    pub fn from_env() -> Result<Option<PeerKeys>> {
        let Some(value) = std::env::var_os(ENV_PEER_KEYS) else {
            return Ok(None);
        };
        let value = value.to_string_lossy();
        if value.trim().is_empty() {
            return Ok(None);
        }
        let mut keys = Vec::new();
        for part in value.split(',') {
            let part = part.trim();
            let bytes = unhex(part).ok_or_else(|| {
                invalid(
                    ENV_PEER_KEYS,
                    "<hidden>",
                    "a key is not an even number of hex digits",
                )
            })?;
            keys.push(bytes);
        }
        PeerKeys::new(keys).map(Some).map_err(|e| match e {
            Error::InvalidSetting { reason, .. } => invalid(ENV_PEER_KEYS, "<hidden>", reason),
            other => other,
        })
    }

    /// The id of the signing key, as hex (what a refusal names).
    pub fn signing_id(&self) -> String {
        hex(&self.keys[0].id)
    }

    /// `blob` sealed with the signing key.
    pub fn seal(&self, blob: &[u8]) -> Vec<u8> {
        let key = &self.keys[0];
        let tag = key.mac(blob).finalize().into_bytes();
        let mut sealed = Vec::with_capacity(HEADER + blob.len());
        sealed.extend_from_slice(SEALED_MAGIC);
        sealed.extend_from_slice(&key.id);
        sealed.extend_from_slice(&tag);
        sealed.extend_from_slice(blob);
        sealed
    }

    /// The blob inside `sealed`, if one of these keys signed it (the tag is
    /// compared in constant time); [`Error::Unauthenticated`] otherwise.
    pub fn open<'a>(&self, sealed: &'a [u8]) -> Result<&'a [u8]> {
        if !is_sealed(sealed) {
            return Err(unauthenticated(
                "the blob is not sealed: its peer has no key, or is not this library",
            ));
        }
        let (id, rest) = sealed[8..].split_at(8);
        let (tag, blob) = rest.split_at(32);
        let Some(key) = self.keys.iter().find(|k| k.id == id) else {
            return Err(unauthenticated(&format!(
                "sealed with key {}, which this connector does not accept",
                hex(id)
            )));
        };
        key.mac(blob).verify_slice(tag).map_err(|_| {
            unauthenticated("its tag does not verify: the blob was forged or changed")
        })?;
        Ok(blob)
    }
}

/// Whether `blob` starts as a sealed blob does (it may still not verify).
pub fn is_sealed(blob: &[u8]) -> bool {
    blob.len() >= HEADER && blob.starts_with(SEALED_MAGIC)
}

/// How a connector treats agent blobs: as they are, sealed with keys, or
/// refused because its keys' setting is invalid (fail closed).
#[derive(Clone, Debug)]
pub(crate) enum Auth {
    Open,
    Keys(PeerKeys),
    Refused(String),
}

impl Auth {
    /// The environment's: [`ENV_PEER_KEYS`]'s keys, none, or refused if it
    /// is invalid (logged).
    pub(crate) fn from_env() -> Auth {
        match PeerKeys::from_env() {
            Ok(Some(keys)) => Auth::Keys(keys),
            Ok(None) => Auth::Open,
            Err(error) => {
                tracing::error!(%error, "refusing every agent blob until the keys are fixed");
                Auth::Refused(error.to_string())
            }
        }
    }

    /// What this connector publishes for the backend's `blob`.
    pub(crate) fn seal(&self, blob: Vec<u8>) -> Result<Vec<u8>> {
        match self {
            Auth::Open => Ok(blob),
            Auth::Keys(keys) => Ok(keys.seal(&blob)),
            Auth::Refused(reason) => Err(unauthenticated(reason)),
        }
    }

    /// What the backend may load of a peer's `blob`.
    pub(crate) fn open<'a>(&self, blob: &'a [u8]) -> Result<&'a [u8]> {
        match self {
            Auth::Open if is_sealed(blob) => Err(unauthenticated(&format!(
                "the blob is sealed, and this connector has no key ({ENV_PEER_KEYS}, \
                 ConnectorBuilder::peer_keys)"
            ))),
            Auth::Open => Ok(blob),
            Auth::Keys(keys) => keys.open(blob),
            Auth::Refused(reason) => Err(unauthenticated(reason)),
        }
    }
}

fn unauthenticated(reason: &str) -> Error {
    Error::Unauthenticated {
        reason: reason.to_owned(),
    }
}

fn invalid(setting: &str, value: &str, reason: &'static str) -> Error {
    Error::InvalidSetting {
        setting: setting.to_owned(),
        value: value.to_owned(),
        reason,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const K1: &[u8] = b"0123456789abcdef-first";
    const K2: &[u8] = b"fedcba9876543210-second";

    #[test]
    fn a_sealed_blob_opens_with_its_key_and_any_list_holding_it() {
        let blob = b"an agent blob".to_vec();
        let sealed = PeerKeys::new([K1]).unwrap().seal(&blob);
        assert_eq!(sealed.len(), HEADER + blob.len());
        assert!(is_sealed(&sealed));
        assert_eq!(PeerKeys::new([K1]).unwrap().open(&sealed).unwrap(), blob);
        // Rotation: the receiver accepts the old key and the new one.
        assert_eq!(
            PeerKeys::new([K2, K1]).unwrap().open(&sealed).unwrap(),
            blob
        );
    }

    #[test]
    fn every_changed_byte_and_every_other_key_is_refused() {
        let blob: Vec<u8> = (0..=255).collect();
        let keys = PeerKeys::new([K1]).unwrap();
        let sealed = keys.seal(&blob);
        for i in 0..sealed.len() {
            let mut forged = sealed.clone();
            forged[i] ^= 0x01;
            let error = keys.open(&forged).unwrap_err();
            assert!(
                matches!(error, Error::Unauthenticated { .. }),
                "byte {i}: {error}"
            );
        }
        let other = PeerKeys::new([K2]).unwrap();
        let error = other.open(&sealed).unwrap_err().to_string();
        assert!(error.contains("does not accept"), "{error}");
        // Cut anywhere: refused, never a panic.
        for len in 0..sealed.len() {
            assert!(keys.open(&sealed[..len]).is_err(), "cut at {len}");
        }
        // A tag made for the blob with another key, under this key's id.
        let mut swapped = other.seal(&blob);
        swapped[8..16].copy_from_slice(&sealed[8..16]);
        assert!(
            keys.open(&swapped)
                .unwrap_err()
                .to_string()
                .contains("does not verify")
        );
    }

    #[test]
    fn without_keys_blobs_pass_unchanged_and_sealed_ones_are_refused() {
        let open = Auth::Open;
        assert_eq!(open.seal(b"plain".to_vec()).unwrap(), b"plain");
        assert_eq!(open.open(b"plain").unwrap(), b"plain");
        let sealed = PeerKeys::new([K1]).unwrap().seal(b"plain");
        assert!(
            open.open(&sealed)
                .unwrap_err()
                .to_string()
                .contains("has no key")
        );
        let refused = Auth::Refused("NIXL_CONNECT_PEER_KEYS: bad".into());
        assert!(refused.seal(b"x".to_vec()).is_err());
        assert!(
            refused
                .open(&sealed)
                .unwrap_err()
                .to_string()
                .contains("bad")
        );
    }

    #[test]
    fn short_missing_or_malformed_keys_are_refused_and_never_printed() {
        assert!(PeerKeys::new(Vec::<Vec<u8>>::new()).is_err());
        assert!(PeerKeys::new([b"short".as_slice()]).is_err());
        assert_eq!(unhex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
        let keys = PeerKeys::new([K1]).unwrap();
        let shown = format!("{keys:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert!(shown.contains(&keys.signing_id()), "{shown}");
    }
}
