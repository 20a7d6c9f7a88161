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
//! Every check lives here, public where another reader of the same document
//! needs it ([`check_json_len`], [`check_descriptor_count`],
//! `OperationKind::try_from`, [`RdmaMetadata::new`]): the Python package's
//! exact parser refuses what this one refuses. `nixl_metadata`'s encoding,
//! and the per-thread state that keeps it cheap, is in `metadata/agent_blob.rs`.

use std::borrow::Cow;
use std::fmt;
use std::io::Read;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::device::Device;
use crate::error::{Error, Result};

mod agent_blob;

pub use agent_blob::{decode_agent_metadata, decode_agent_metadata_cached, encode_agent_metadata};

/// Largest JSON document accepted by [`RdmaMetadata::from_json`].
pub const MAX_JSON_BYTES: usize = 64 << 20;
/// Most descriptors one metadata document may carry.
pub const MAX_DESCRIPTORS: usize = 1 << 20;
/// Largest decoded agent-metadata blob.
pub const MAX_AGENT_METADATA_BYTES: usize = 32 << 20;
/// Longest notification key.
pub const MAX_NOTIFICATION_KEY_LEN: usize = 256;

/// Refuses a JSON document of `len` bytes if it is longer than
/// [`MAX_JSON_BYTES`]: the check [`RdmaMetadata::from_slice`] makes before it
/// parses, for a parser of its own to make first too.
///
/// ```
/// # use descriptor_core::{MAX_JSON_BYTES, check_json_len};
/// assert!(check_json_len(MAX_JSON_BYTES).is_ok());
/// assert!(check_json_len(MAX_JSON_BYTES + 1).is_err());
/// ```
pub fn check_json_len(len: usize) -> Result<()> {
    if len > MAX_JSON_BYTES {
        return Err(Error::invalid_metadata(
            "json",
            format!("{len} bytes exceeds the limit of {MAX_JSON_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// Refuses a list of more than [`MAX_DESCRIPTORS`] descriptors: the bound
/// [`RdmaMetadata`] keeps, for a reader to check before it allocates for
/// `count` of them.
///
/// ```
/// # use descriptor_core::{MAX_DESCRIPTORS, check_descriptor_count};
/// assert!(check_descriptor_count(MAX_DESCRIPTORS).is_ok());
/// assert!(check_descriptor_count(MAX_DESCRIPTORS + 1).is_err());
/// ```
pub fn check_descriptor_count(count: usize) -> Result<()> {
    if count > MAX_DESCRIPTORS {
        return Err(Error::invalid_metadata(
            "descriptors",
            format!("more than {MAX_DESCRIPTORS} descriptors"),
        ));
    }
    Ok(())
}

/// Which operation a peer may perform on published memory.
///
/// On the wire it is `operation_kind`, a number: `u8::from(kind)` writes it,
/// `OperationKind::try_from(number)` reads it (1 or 2; anything else is
/// [`Error::InvalidMetadata`]).
///
/// ```
/// # use descriptor_core::OperationKind;
/// assert_eq!(u8::from(OperationKind::Write), 2);
/// assert_eq!(OperationKind::try_from(1u64)?, OperationKind::Read);
/// assert!(OperationKind::try_from(3u64).is_err());
/// # Ok::<(), descriptor_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OperationKind {
    /// Published by a readable operation: the peer READs (`operation_kind: 1`).
    Read = 1,
    /// Published by a writable operation: the peer WRITEs (`operation_kind: 2`).
    Write = 2,
}

impl From<OperationKind> for u8 {
    /// The wire number: 1 for [`OperationKind::Read`], 2 for [`OperationKind::Write`].
    fn from(kind: OperationKind) -> u8 {
        kind as u8
    }
}

impl TryFrom<u64> for OperationKind {
    type Error = Error;

    /// Reads the wire number (any unsigned integer widens to `u64`); an
    /// [`Error::InvalidMetadata`] of `operation_kind` for one that is
    /// neither 1 nor 2.
    fn try_from(number: u64) -> Result<OperationKind> {
        match number {
            1 => Ok(OperationKind::Read),
            2 => Ok(OperationKind::Write),
            other => Err(Error::invalid_metadata(
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
            operation_kind: self.operation_kind.into(),
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
            .map_err(|e| Error::invalid_metadata("json", format!("cannot read: {e}")))?;
        RdmaMetadata::from_slice(&json)
    }

    /// Parses and validates Dynamo's JSON from bytes.
    pub fn from_slice(json: &[u8]) -> Result<RdmaMetadata> {
        check_json_len(json.len())?;
        let wire: Wire<'_> = serde_json::from_slice(json)
            .map_err(|e| Error::invalid_metadata("json", e.to_string()))?;
        let metadata = RdmaMetadata {
            descriptors: wire.descriptors.into_owned(),
            agent_metadata: decode_agent_metadata(&wire.nixl_metadata)?,
            notification_key: wire.notification_key.into_owned(),
            operation_kind: OperationKind::try_from(u64::from(wire.operation_kind))?,
        };
        metadata.validate()?;
        Ok(metadata)
    }

    fn validate(&self) -> Result<()> {
        if self.descriptors.is_empty() {
            return Err(Error::invalid_metadata("descriptors", "the list is empty"));
        }
        check_descriptor_count(self.descriptors.len())?;
        for (i, d) in self.descriptors.iter().enumerate() {
            if d.ptr == 0 {
                return Err(Error::invalid_metadata(
                    format!("descriptors[{i}].ptr"),
                    "must not be zero",
                ));
            }
            if d.ptr.checked_add(d.size).is_none() {
                return Err(Error::invalid_metadata(
                    format!("descriptors[{i}]"),
                    format!("ptr {:#x} + size {} overflows", d.ptr, d.size),
                ));
            }
        }
        if self.agent_metadata.is_empty() {
            return Err(Error::invalid_metadata("nixl_metadata", "is empty"));
        }
        if self.agent_metadata.len() > MAX_AGENT_METADATA_BYTES {
            return Err(Error::invalid_metadata(
                "nixl_metadata",
                format!("exceeds {MAX_AGENT_METADATA_BYTES} bytes"),
            ));
        }
        let key = &self.notification_key;
        if key.is_empty() || key.len() > MAX_NOTIFICATION_KEY_LEN {
            return Err(Error::invalid_metadata(
                "notification_key",
                format!(
                    "length {} is not within 1..={MAX_NOTIFICATION_KEY_LEN}",
                    key.len()
                ),
            ));
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Error::invalid_metadata(
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
            operation_kind: self.operation_kind.into(),
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
            operation_kind: OperationKind::try_from(u64::from(wire.operation_kind))
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
    fn accepts_legacy_hex_of_the_zlib_stream() {
        // zlib.compress(b"ab", 6).hex() in Python.
        let legacy = "789c4b4c0200012600c4";
        let json = json_with("nixl_metadata", &format!("\"{legacy}\""));
        assert_eq!(
            RdmaMetadata::from_json(&json)
                .ok()
                .map(|m| m.agent_metadata),
            Some(b"ab".to_vec())
        );
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

    #[rstest]
    #[case::read(OperationKind::Read, 1)]
    #[case::write(OperationKind::Write, 2)]
    fn an_operation_kind_is_its_wire_number_both_ways(
        #[case] kind: OperationKind,
        #[case] number: u8,
    ) {
        assert_eq!(u8::from(kind), number);
        assert_eq!(OperationKind::try_from(u64::from(number)).ok(), Some(kind));
        let json = RdmaMetadata::new(
            kind,
            sample().descriptors().to_vec(),
            b"blob".to_vec(),
            KEY.to_owned(),
        )
        .map(|m| m.to_json())
        .unwrap_or_default();
        assert!(
            json.ends_with(&format!(r#""operation_kind":{number}}}"#)),
            "{json}"
        );
    }

    #[rstest]
    #[case::zero(0)]
    #[case::three(3)]
    #[case::past_a_byte(257)]
    #[case::largest(u64::MAX)]
    fn any_other_number_is_no_operation_kind(#[case] number: u64) {
        match OperationKind::try_from(number) {
            Err(Error::InvalidMetadata { field, reason }) => {
                assert_eq!(field, "operation_kind");
                assert_eq!(
                    reason,
                    format!("{number} is neither 1 (read) nor 2 (write)")
                );
            }
            other => panic!("{number} gave {other:?}"),
        }
    }

    #[rstest]
    #[case::empty(0, None)]
    #[case::at_the_limit(MAX_JSON_BYTES, None)]
    #[case::one_past(MAX_JSON_BYTES + 1, Some(format!("{} bytes exceeds the limit of {MAX_JSON_BYTES} bytes", MAX_JSON_BYTES + 1)))]
    #[case::far_past(usize::MAX, Some(format!("{} bytes exceeds the limit of {MAX_JSON_BYTES} bytes", usize::MAX)))]
    fn json_length_is_checked_against_the_limit(
        #[case] len: usize,
        #[case] refused: Option<String>,
    ) {
        match (check_json_len(len), refused) {
            (Ok(()), None) => {}
            (Err(Error::InvalidMetadata { field, reason }), Some(expected)) => {
                assert_eq!(field, "json");
                assert_eq!(reason, expected);
            }
            (other, expected) => panic!("{len} bytes gave {other:?}, expected {expected:?}"),
        }
    }

    #[rstest]
    #[case::none(0, true)]
    #[case::at_the_limit(MAX_DESCRIPTORS, true)]
    #[case::one_past(MAX_DESCRIPTORS + 1, false)]
    fn descriptor_count_is_checked_against_the_limit(#[case] count: usize, #[case] ok: bool) {
        match check_descriptor_count(count) {
            Ok(()) => assert!(ok, "{count} accepted"),
            Err(Error::InvalidMetadata { field, reason }) => {
                assert!(!ok, "{count} refused");
                assert_eq!(field, "descriptors");
                assert_eq!(reason, "more than 1048576 descriptors");
            }
            Err(other) => panic!("{count} gave {other:?}"),
        }
    }

    #[test]
    fn the_parser_and_the_public_checks_refuse_alike() {
        let huge = " ".repeat(MAX_JSON_BYTES + 1);
        let parsed = RdmaMetadata::from_slice(huge.as_bytes())
            .err()
            .map(|e| e.to_string());
        let checked = check_json_len(huge.len()).err().map(|e| e.to_string());
        assert!(parsed.is_some());
        assert_eq!(parsed, checked);
        let kind = RdmaMetadata::from_json(&json_with("operation_kind", "3"))
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            kind,
            OperationKind::try_from(3u64).err().map(|e| e.to_string())
        );
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
