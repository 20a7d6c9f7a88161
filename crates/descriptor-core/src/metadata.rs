//! [`RdmaMetadata`]: what a passive operation publishes so a peer can reach it,
//! byte-compatible with Dynamo's Python `nixl_connect`.
//!
//! ```json
//! {"descriptors":[{"device":"cuda:0","ptr":140230000000000,"size":4096}],
//!  "nixl_metadata":"b64:<base64 of zlib(level 6) of the agent blob>",
//!  "notification_key":"<uuid4>","operation_kind":1}
//! ```
//!
//! Metadata comes from peers and is untrusted: every field is validated, sizes are
//! bounded before anything is allocated for them, and a zlib bomb is an error.

use std::borrow::Cow;
use std::fmt;
use std::io::Read;
use std::str::FromStr;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::error::{Error, Result};

/// Largest JSON document accepted by [`RdmaMetadata::from_json`].
pub const MAX_JSON_BYTES: usize = 64 << 20;
/// Most descriptors one metadata document may carry.
pub const MAX_DESCRIPTORS: usize = 1 << 20;
/// Largest decoded agent-metadata blob.
pub const MAX_AGENT_METADATA_BYTES: usize = 32 << 20;
/// Longest notification key.
pub const MAX_NOTIFICATION_KEY_LEN: usize = 256;

const B64_PREFIX: &str = "b64:";

/// Which operation a peer may perform on published memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OperationKind {
    /// Published by a readable operation: the peer READs (`operation_kind: 1`).
    Read = 1,
    /// Published by a writable operation: the peer WRITEs (`operation_kind: 2`).
    Write = 2,
}

impl OperationKind {
    fn from_wire(value: u8) -> Result<OperationKind> {
        match value {
            1 => Ok(OperationKind::Read),
            2 => Ok(OperationKind::Write),
            other => Err(invalid(
                "operation_kind",
                format!("{other} is neither 1 (read) nor 2 (write)"),
            )),
        }
    }
}

/// One remote region as it travels in [`RdmaMetadata`] (Dynamo's `SerializedDescriptor`).
/// Unknown fields are refused, as Dynamo's pydantic model does (`extra="forbid"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerializedDescriptor {
    /// Device of the region (`"cpu"`, `"cuda:N"` or `"xpu:N"` on the wire).
    pub device: Device,
    /// Address in the peer's address space; never zero.
    pub ptr: u64,
    /// Size in bytes; zero for an empty descriptor (as Dynamo allows).
    pub size: u64,
}

/// What a passive operation publishes: its regions, its agent's metadata, the key
/// its peer must notify, and what the peer may do.
///
/// ```
/// # use descriptor_core::RdmaMetadata;
/// let json = r#"{"descriptors":[{"device":"cpu","ptr":4096,"size":64}],"nixl_metadata":"b64:eJxLTE/NK9FNyslPAgAVQgPc","notification_key":"4bd9c5f2-0c36-4a1b-9b5e-6f1a1c3e7d10","operation_kind":1}"#;
/// let metadata: RdmaMetadata = json.parse()?;
/// assert_eq!(metadata.descriptors()[0].size, 64);
/// assert_eq!(metadata.agent_metadata(), b"agent-blob");
/// assert_eq!(metadata.to_json(), json);
/// # Ok::<(), descriptor_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaMetadata {
    descriptors: Vec<SerializedDescriptor>,
    agent_metadata: Vec<u8>,
    notification_key: String,
    operation_kind: OperationKind,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::InvalidMetadata {
        field: field.into(),
        reason: reason.into(),
    }
}

impl RdmaMetadata {
    /// Builds metadata after validating every field as [`from_json`](Self::from_json) would.
    pub fn new(
        operation_kind: OperationKind,
        descriptors: Vec<SerializedDescriptor>,
        agent_metadata: Vec<u8>,
        notification_key: String,
    ) -> Result<RdmaMetadata> {
        let metadata = RdmaMetadata {
            descriptors,
            agent_metadata,
            notification_key,
            operation_kind,
        };
        metadata.validate()?;
        Ok(metadata)
    }

    /// The published regions, in order.
    pub fn descriptors(&self) -> &[SerializedDescriptor] {
        &self.descriptors
    }

    /// The decoded agent-metadata blob (what NIXL's `load_remote_md` takes).
    pub fn agent_metadata(&self) -> &[u8] {
        &self.agent_metadata
    }

    /// The payload the peer sends to signal completion.
    pub fn notification_key(&self) -> &str {
        &self.notification_key
    }

    /// What the peer may do with the regions.
    pub fn operation_kind(&self) -> OperationKind {
        self.operation_kind
    }

    /// Serializes to Dynamo's JSON (compact, fields in Dynamo's order).
    pub fn to_json(&self) -> String {
        let wire = Wire {
            descriptors: Cow::Borrowed(&self.descriptors),
            nixl_metadata: Cow::Owned(encode_agent_metadata(&self.agent_metadata)),
            notification_key: Cow::Borrowed(&self.notification_key),
            operation_kind: self.operation_kind as u8,
        };
        #[allow(
            clippy::expect_used,
            reason = "serializing plain strings and integers to a String cannot fail; \
                      an empty string would be silently wrong"
        )]
        serde_json::to_string(&wire).expect("metadata serializes")
    }

    /// Parses and validates Dynamo's JSON.
    pub fn from_json(json: &str) -> Result<RdmaMetadata> {
        RdmaMetadata::from_slice(json.as_bytes())
    }

    /// Parses and validates Dynamo's JSON from a stream, reading at most
    /// [`MAX_JSON_BYTES`] (+1, to tell a document that is too long).
    ///
    /// Prefer this to `serde_json::from_reader`: through serde, each field is
    /// bounded as it is read, but a deserializer may buffer one string field
    /// (up to the whole stream) before the bound can refuse it.
    pub fn from_reader(reader: impl Read) -> Result<RdmaMetadata> {
        let mut json = Vec::new();
        reader
            .take(MAX_JSON_BYTES as u64 + 1)
            .read_to_end(&mut json)
            .map_err(|e| invalid("json", format!("cannot read: {e}")))?;
        RdmaMetadata::from_slice(&json)
    }

    /// Parses and validates Dynamo's JSON from bytes.
    pub fn from_slice(json: &[u8]) -> Result<RdmaMetadata> {
        if json.len() > MAX_JSON_BYTES {
            return Err(invalid(
                "json",
                format!(
                    "{} bytes exceeds the limit of {MAX_JSON_BYTES} bytes",
                    json.len()
                ),
            ));
        }
        let wire: Wire<'_> =
            serde_json::from_slice(json).map_err(|e| invalid("json", e.to_string()))?;
        let metadata = RdmaMetadata {
            descriptors: wire.descriptors.into_owned(),
            agent_metadata: decode_agent_metadata(&wire.nixl_metadata)?,
            notification_key: wire.notification_key.into_owned(),
            operation_kind: OperationKind::from_wire(wire.operation_kind)?,
        };
        metadata.validate()?;
        Ok(metadata)
    }

    fn validate(&self) -> Result<()> {
        if self.descriptors.is_empty() {
            return Err(invalid("descriptors", "the list is empty"));
        }
        if self.descriptors.len() > MAX_DESCRIPTORS {
            return Err(invalid(
                "descriptors",
                format!("more than {MAX_DESCRIPTORS} descriptors"),
            ));
        }
        for (i, d) in self.descriptors.iter().enumerate() {
            if d.ptr == 0 {
                return Err(invalid(format!("descriptors[{i}].ptr"), "must not be zero"));
            }
            if d.ptr.checked_add(d.size).is_none() {
                return Err(invalid(
                    format!("descriptors[{i}]"),
                    format!("ptr {:#x} + size {} overflows", d.ptr, d.size),
                ));
            }
        }
        if self.agent_metadata.is_empty() {
            return Err(invalid("nixl_metadata", "is empty"));
        }
        if self.agent_metadata.len() > MAX_AGENT_METADATA_BYTES {
            return Err(invalid(
                "nixl_metadata",
                format!("exceeds {MAX_AGENT_METADATA_BYTES} bytes"),
            ));
        }
        let key = &self.notification_key;
        if key.is_empty() || key.len() > MAX_NOTIFICATION_KEY_LEN {
            return Err(invalid(
                "notification_key",
                format!(
                    "length {} is not within 1..={MAX_NOTIFICATION_KEY_LEN}",
                    key.len()
                ),
            ));
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "notification_key",
                "must be printable ASCII without spaces",
            ));
        }
        Ok(())
    }
}

impl fmt::Display for RdmaMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json())
    }
}

impl FromStr for RdmaMetadata {
    type Err = Error;
    fn from_str(s: &str) -> Result<RdmaMetadata> {
        RdmaMetadata::from_json(s)
    }
}

impl Serialize for RdmaMetadata {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Wire {
            descriptors: Cow::Borrowed(&self.descriptors),
            nixl_metadata: Cow::Owned(encode_agent_metadata(&self.agent_metadata)),
            notification_key: Cow::Borrowed(&self.notification_key),
            operation_kind: self.operation_kind as u8,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RdmaMetadata {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let wire = Wire::deserialize(deserializer)?;
        let metadata = RdmaMetadata {
            descriptors: wire.descriptors.into_owned(),
            agent_metadata: decode_agent_metadata(&wire.nixl_metadata).map_err(D::Error::custom)?,
            notification_key: wire.notification_key.into_owned(),
            operation_kind: OperationKind::from_wire(wire.operation_kind)
                .map_err(D::Error::custom)?,
        };
        metadata.validate().map_err(D::Error::custom)?;
        Ok(metadata)
    }
}

/// The JSON shape, field order as pydantic writes it. Every field is bounded
/// while it is read, so that no path (serde's included) copies more than the
/// limits allow.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire<'a> {
    #[serde(deserialize_with = "bounded_descriptors")]
    descriptors: Cow<'a, [SerializedDescriptor]>,
    #[serde(borrow, deserialize_with = "bounded_nixl_metadata")]
    nixl_metadata: Cow<'a, str>,
    #[serde(borrow, deserialize_with = "bounded_notification_key")]
    notification_key: Cow<'a, str>,
    operation_kind: u8,
}

fn bounded_nixl_metadata<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Cow<'de, str>, D::Error> {
    // The encoded blob can be no longer than the whole document may be.
    deserializer.deserialize_str(BoundedStr {
        field: "nixl_metadata",
        max: MAX_JSON_BYTES,
    })
}

fn bounded_notification_key<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Cow<'de, str>, D::Error> {
    deserializer.deserialize_str(BoundedStr {
        field: "notification_key",
        max: MAX_NOTIFICATION_KEY_LEN,
    })
}

/// A string field of at most `max` bytes, borrowed from the input when it can be.
struct BoundedStr {
    field: &'static str,
    max: usize,
}

impl BoundedStr {
    fn check<E: serde::de::Error>(&self, len: usize) -> Result<(), E> {
        if len > self.max {
            return Err(E::custom(format_args!(
                "{}: {len} bytes exceeds the limit of {} bytes",
                self.field, self.max
            )));
        }
        Ok(())
    }
}

impl<'de> serde::de::Visitor<'de> for BoundedStr {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a string of at most {} bytes", self.max)
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        self.check(v.len())?;
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        self.check(v.len())?;
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        self.check(v.len())?;
        Ok(Cow::Owned(v))
    }
}

/// Reads the descriptor list but stops at [`MAX_DESCRIPTORS`], so a huge list is
/// an error before it is a huge allocation.
fn bounded_descriptors<'de, D>(
    deserializer: D,
) -> Result<Cow<'static, [SerializedDescriptor]>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Vec<SerializedDescriptor>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a list of at most {MAX_DESCRIPTORS} descriptors")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
            while let Some(d) = seq.next_element()? {
                if out.len() == MAX_DESCRIPTORS {
                    return Err(serde::de::Error::custom(format_args!(
                        "more than {MAX_DESCRIPTORS} descriptors"
                    )));
                }
                out.push(d);
            }
            Ok(out)
        }
    }
    deserializer.deserialize_seq(Bounded).map(Cow::Owned)
}

/// Encodes an agent blob as Dynamo does: `"b64:"` + padded standard base64 of
/// zlib (level 6) of the blob. The same blob as this thread's previous one
/// (up to 64 KiB) costs a comparison and a copy, not another compression.
pub fn encode_agent_metadata(blob: &[u8]) -> String {
    let remembered = LAST_ENCODED
        .try_with(|last| {
            last.borrow()
                .as_ref()
                .filter(|(known, _)| **known == *blob)
                .map(|(_, encoded)| encoded.clone())
        })
        .ok()
        .flatten();
    if let Some(encoded) = remembered {
        return encoded;
    }
    let encoded = deflate_base64(blob);
    if blob.len() <= MEMO_MAX_BLOB {
        // A thread being torn down just does not remember.
        let _ = LAST_ENCODED.try_with(|last| {
            *last.borrow_mut() = Some((blob.into(), encoded.clone()));
        });
    }
    encoded
}

/// The largest blob [`encode_agent_metadata`] remembers (a copy stays with
/// the thread until it encodes another).
const MEMO_MAX_BLOB: usize = 64 << 10;

fn deflate_base64(blob: &[u8]) -> String {
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
    #[allow(
        clippy::expect_used,
        reason = "writing into a Vec cannot fail; empty metadata would be silently wrong"
    )]
    let compressed = z
        .write_all(blob)
        .and_then(|()| z.finish())
        .expect("compressing into a Vec");
    let mut out = String::with_capacity(B64_PREFIX.len() + compressed.len().div_ceil(3) * 4);
    out.push_str(B64_PREFIX);
    base64::engine::general_purpose::STANDARD.encode_string(&compressed, &mut out);
    out
}

thread_local! {
    /// The blob this thread encoded last, and its encoding. A worker that
    /// exposes buffers over and over publishes the same agent metadata each
    /// time (NIXL's changes only with the agent's registrations), and
    /// compressing it again cost 14-20 µs per operation.
    static LAST_ENCODED: std::cell::RefCell<Option<(Box<[u8]>, String)>> =
        const { std::cell::RefCell::new(None) };
    /// One zlib decompressor per thread (about 43 KiB, its 32 KiB window
    /// included), reset for each blob: setting up a new one cost as much as
    /// inflating a few-KiB agent blob (decoding 670 B took 8.1 µs with a new
    /// one, 4.0 µs reset).
    static INFLATE: std::cell::RefCell<flate2::Decompress> =
        std::cell::RefCell::new(flate2::Decompress::new(true));
}

/// A zlib byte count as an index (it never exceeds the slice it counts).
fn counted(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Decodes `nixl_metadata`: `"b64:"` + base64, or Dynamo's legacy bare hex, of a
/// zlib stream. The decompressed blob is capped at [`MAX_AGENT_METADATA_BYTES`].
pub fn decode_agent_metadata(encoded: &str) -> Result<Vec<u8>> {
    const FIELD: &str = "nixl_metadata";
    let compressed = match encoded.strip_prefix(B64_PREFIX) {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| invalid(FIELD, format!("bad base64: {e}")))?,
        None => decode_hex(encoded).ok_or_else(|| {
            invalid(
                FIELD,
                "neither \"b64:\"-prefixed base64 nor an even-length hex string",
            )
        })?,
    };
    inflate(&compressed).map_err(|reason| invalid(FIELD, reason))
}

/// Inflates one zlib stream that must use all of `compressed`, into at most
/// [`MAX_AGENT_METADATA_BYTES`].
fn inflate(compressed: &[u8]) -> std::result::Result<Vec<u8>, String> {
    // A thread being torn down has no thread-locals left: it makes its own.
    INFLATE
        .try_with(|z| inflate_with(&mut z.borrow_mut(), compressed))
        .unwrap_or_else(|_| inflate_with(&mut flate2::Decompress::new(true), compressed))
}

fn inflate_with(
    z: &mut flate2::Decompress,
    compressed: &[u8],
) -> std::result::Result<Vec<u8>, String> {
    z.reset(true);
    // Room for a typical ratio; grown (doubling, up to one byte past the
    // cap, which tells a blob that is too large) only as the data needs.
    let mut blob = Vec::with_capacity(
        compressed
            .len()
            .saturating_mul(4)
            .min(MAX_AGENT_METADATA_BYTES + 1),
    );
    loop {
        let (read, written) = (z.total_in(), z.total_out());
        let rest = &compressed[counted(read)..];
        let status = z
            .decompress_vec(rest, &mut blob, flate2::FlushDecompress::None)
            .map_err(|e| format!("bad zlib stream: {e}"))?;
        if blob.len() > MAX_AGENT_METADATA_BYTES {
            return Err(format!(
                "decompresses to more than {MAX_AGENT_METADATA_BYTES} bytes"
            ));
        }
        if status == flate2::Status::StreamEnd {
            break;
        }
        if blob.len() == blob.capacity() {
            let grown = (blob.capacity() * 2).clamp(64, MAX_AGENT_METADATA_BYTES + 1);
            blob.reserve_exact(grown - blob.len());
        } else if (z.total_in(), z.total_out()) == (read, written) {
            // Room to write, and yet no progress: the input ended early.
            return Err("bad zlib stream: truncated".to_owned());
        }
    }
    let trailing = compressed.len() - counted(z.total_in());
    if trailing > 0 {
        return Err(format!(
            "{trailing} bytes follow the end of the zlib stream"
        ));
    }
    Ok(blob)
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let bytes = hex.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const KEY: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

    fn sample() -> RdmaMetadata {
        RdmaMetadata::new(
            OperationKind::Read,
            vec![SerializedDescriptor {
                device: Device::cuda(0),
                ptr: 140_230_000_000_000,
                size: 4096,
            }],
            b"agent blob \x00\xff bytes".repeat(20),
            KEY.to_owned(),
        )
        .unwrap_or_else(|e| unreachable!("{e}"))
    }

    fn json_with(field: &str, value: &str) -> String {
        let mut v: serde_json::Value =
            serde_json::from_str(&sample().to_json()).unwrap_or_default();
        v[field] = serde_json::from_str(value).unwrap_or_default();
        v.to_string()
    }

    #[test]
    fn zero_sizes_are_accepted_and_round_trip_as_dynamo_publishes_them() {
        // A Dynamo peer's empty tensor, beside a full one.
        let json = json_with(
            "descriptors",
            r#"[{"device":"cpu","ptr":94131275291952,"size":0},{"device":"cpu","ptr":8,"size":16}]"#,
        );
        let parsed = RdmaMetadata::from_json(&json).unwrap();
        let sizes: Vec<u64> = parsed.descriptors().iter().map(|d| d.size).collect();
        assert_eq!(sizes, [0, 16]);
        assert_eq!(parsed.to_json(), json);
    }

    #[test]
    fn json_has_dynamos_exact_shape() {
        let json = sample().to_json();
        assert!(
            json.starts_with(
                r#"{"descriptors":[{"device":"cuda:0","ptr":140230000000000,"size":4096}],"nixl_metadata":"b64:"#
            ),
            "{json}"
        );
        assert!(json.ends_with(&format!(
            r#"","notification_key":"{KEY}","operation_kind":1}}"#
        )));
    }

    #[test]
    fn round_trips_through_json_string_and_serde() {
        let m = sample();
        assert_eq!(RdmaMetadata::from_json(&m.to_json()).ok(), Some(m.clone()));
        assert_eq!(m.to_string().parse::<RdmaMetadata>().ok(), Some(m.clone()));
        let via_serde: Option<RdmaMetadata> = serde_json::to_string(&m)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok());
        assert_eq!(via_serde, Some(m));
    }

    #[test]
    fn agent_blob_is_zlib_level_6_in_padded_base64() {
        use std::io::Write;
        let blob = b"0123456789abcdef".repeat(40);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
        z.write_all(&blob).ok();
        let expected =
            base64::engine::general_purpose::STANDARD.encode(z.finish().unwrap_or_default());
        assert_eq!(encode_agent_metadata(&blob), format!("b64:{expected}"));
        assert_eq!(
            decode_agent_metadata(&encode_agent_metadata(&blob)).ok(),
            Some(blob)
        );
    }

    #[test]
    fn inflate_grows_to_fit_and_refuses_a_cut_stream() {
        // 4 MiB of one byte: ~1000x smaller compressed, so the output grows
        // from its first guess many times over.
        let blob = vec![7u8; 4 << 20];
        let encoded = encode_agent_metadata(&blob);
        assert!(encoded.len() < 16 << 10, "{}", encoded.len());
        assert_eq!(decode_agent_metadata(&encoded).ok(), Some(blob.clone()));
        // The same compressor and decompressor serve the next blob.
        let small = b"nixl".repeat(100);
        assert_eq!(
            decode_agent_metadata(&encode_agent_metadata(&small)).ok(),
            Some(small)
        );
        // Every proper prefix of a stream is refused, none half-decoded.
        let mut z = flate2::Compress::new(flate2::Compression::new(6), true);
        let mut stream = Vec::with_capacity(64 << 10);
        z.compress_vec(&blob, &mut stream, flate2::FlushCompress::Finish)
            .ok();
        for cut in [1, 2, stream.len() / 2, stream.len() - 1] {
            let hex: String = stream[..cut].iter().map(|b| format!("{b:02x}")).collect();
            match decode_agent_metadata(&hex) {
                Err(Error::InvalidMetadata { field, reason }) => {
                    assert_eq!(field, "nixl_metadata");
                    assert!(reason.contains("zlib stream"), "{reason}");
                }
                other => panic!("a stream cut at {cut} bytes: {other:?}"),
            }
        }
    }

    #[test]
    fn accepts_legacy_hex_of_the_zlib_stream() {
        // zlib.compress(b"ab", 6).hex() in Python.
        let legacy = "789c4b4c0200012600c4";
        assert_eq!(decode_agent_metadata(legacy).ok(), Some(b"ab".to_vec()));
        assert_eq!(
            decode_agent_metadata(&legacy.to_uppercase()).ok(),
            Some(b"ab".to_vec())
        );
        let json = json_with("nixl_metadata", &format!("\"{legacy}\""));
        assert_eq!(
            RdmaMetadata::from_json(&json)
                .ok()
                .map(|m| m.agent_metadata),
            Some(b"ab".to_vec())
        );
    }

    #[test]
    fn zlib_bomb_is_an_error_not_an_allocation() {
        use std::io::Write;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(MAX_AGENT_METADATA_BYTES >> 20) + 1 {
            z.write_all(&zeros).ok();
        }
        let bomb = z.finish().unwrap_or_default();
        assert!(
            bomb.len() < 100_000,
            "the bomb is small: {} bytes",
            bomb.len()
        );
        let encoded = format!(
            "b64:{}",
            base64::engine::general_purpose::STANDARD.encode(bomb)
        );
        let err = decode_agent_metadata(&encoded).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("decompresses to more than")));
    }

    #[test]
    fn reads_an_xpu_descriptor_as_dynamo_1_6_writes_it() {
        let json = json_with(
            "descriptors",
            r#"[{"device":"xpu:1","ptr":4096,"size":64}]"#,
        );
        let parsed = RdmaMetadata::from_json(&json).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(parsed.descriptors()[0].device, Device::xpu(1));
        assert_eq!(parsed.to_json(), json);
    }

    #[test]
    fn oversized_json_is_refused_before_parsing() {
        let huge = " ".repeat(MAX_JSON_BYTES + 1);
        let err = RdmaMetadata::from_json(&huge).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("exceeds the limit")));
    }

    #[test]
    fn descriptor_count_is_bounded_while_parsing() {
        let one = r#"{"device":"cpu","ptr":1,"size":1},"#;
        let mut list = one.repeat(MAX_DESCRIPTORS + 1);
        list.pop();
        let json = json_with("descriptors", "[]")
            .replace(r#""descriptors":[]"#, &format!(r#""descriptors":[{list}]"#));
        assert!(json.len() <= MAX_JSON_BYTES);
        let err = RdmaMetadata::from_json(&json).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("more than 1048576 descriptors")),
            "{err:?}"
        );
    }

    #[rstest]
    #[case::zero_ptr(
        "descriptors",
        r#"[{"device":"cpu","ptr":0,"size":8}]"#,
        "descriptors[0].ptr"
    )]
    #[case::wrapping_range(
        "descriptors",
        r#"[{"device":"cpu","ptr":18446744073709551615,"size":2}]"#,
        "descriptors[0]"
    )]
    #[case::negative_ptr("descriptors", r#"[{"device":"cpu","ptr":-5,"size":2}]"#, "json")]
    #[case::bad_device("descriptors", r#"[{"device":"npu:0","ptr":8,"size":2}]"#, "json")]
    #[case::unknown_descriptor_field(
        "descriptors",
        r#"[{"device":"cpu","ptr":8,"size":2,"stride":1}]"#,
        "json"
    )]
    #[case::empty_list("descriptors", "[]", "descriptors")]
    #[case::kind_zero("operation_kind", "0", "operation_kind")]
    #[case::kind_three("operation_kind", "3", "operation_kind")]
    #[case::kind_huge("operation_kind", "300", "json")]
    #[case::empty_key("notification_key", r#""""#, "notification_key")]
    #[case::key_with_space("notification_key", r#""a b""#, "notification_key")]
    #[case::odd_hex("nixl_metadata", r#""abc""#, "nixl_metadata")]
    #[case::bad_base64("nixl_metadata", r#""b64:!!!!""#, "nixl_metadata")]
    #[case::not_zlib("nixl_metadata", r#""b64:aGVsbG8=""#, "nixl_metadata")]
    #[case::empty_blob("nixl_metadata", r#""""#, "nixl_metadata")]
    #[case::hex_not_zlib("nixl_metadata", r#""6162""#, "nixl_metadata")]
    fn rejects_invalid_fields(#[case] field: &str, #[case] value: &str, #[case] reported: &str) {
        let json = json_with(field, value);
        match RdmaMetadata::from_json(&json) {
            Err(Error::InvalidMetadata { field, .. }) => assert_eq!(field, reported),
            other => panic!("{json} gave {other:?}"),
        }
    }

    #[rstest]
    #[case::not_json("hello")]
    #[case::unknown_field(
        r#"{"descriptors":[{"device":"cpu","ptr":8,"size":2}],"nixl_metadata":"b64:eJxLTE/NK9FNyslPAgAVQgPc","notification_key":"k","operation_kind":1,"extra":0}"#
    )]
    #[case::missing_fields("{}")]
    #[case::array("[1,2]")]
    #[case::truncated(r#"{"descriptors":[{"device":"cpu""#)]
    fn rejects_malformed_json(#[case] json: &str) {
        assert!(matches!(
            RdmaMetadata::from_json(json),
            Err(Error::InvalidMetadata { .. })
        ));
    }
}
