//! Damaged metadata is refused: a zlib stream cut short, followed by bytes or
//! with a wrong checksum, and oversized strings on the serde path (the
//! review's defect 10 in issue "Hardening": parsing accepted bytes after the
//! zlib stream, and the serde path skipped the size bounds).
#![allow(clippy::unwrap_used, clippy::panic)]

use base64::Engine as _;
use descriptor_core::{RdmaMetadata, decode_agent_metadata, encode_agent_metadata};

fn b64(bytes: &[u8]) -> String {
    format!(
        "b64:{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}
fn raw(encoded: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(encoded.strip_prefix("b64:").unwrap())
        .unwrap()
}

const BLOB: &[u8] = b"LBK1 this stands for an agent blob: addresses, rkeys, connection info .....";

#[test]
fn truncated_zlib_stream_is_rejected() {
    let z = raw(&encode_agent_metadata(BLOB));
    // Cut the stream in the middle: the blob would be silently shortened.
    for cut in [4usize, z.len() / 2, z.len() - 4] {
        let r = decode_agent_metadata(&b64(&z[..cut]));
        assert!(
            r.is_err(),
            "stream cut to {cut}/{} bytes accepted as a {}-byte blob (original {})",
            z.len(),
            r.as_ref().map(Vec::len).unwrap_or(0),
            BLOB.len()
        );
    }
}

#[test]
fn trailing_garbage_after_zlib_stream_is_rejected() {
    let mut z = raw(&encode_agent_metadata(BLOB));
    z.extend_from_slice(b"GARBAGE GARBAGE");
    assert!(
        decode_agent_metadata(&b64(&z)).is_err(),
        "trailing bytes ignored"
    );
}

#[test]
fn wrong_adler32_is_rejected() {
    let mut z = raw(&encode_agent_metadata(BLOB));
    let n = z.len();
    z[n - 1] ^= 0xFF;
    assert!(
        decode_agent_metadata(&b64(&z)).is_err(),
        "checksum not verified"
    );
}

#[test]
fn serde_path_does_not_bound_string_sizes() {
    // Via `Deserialize` (e.g. serde_json::from_reader / from_value) there is
    // no MAX_JSON_BYTES check; a huge notification_key is allocated before
    // validation rejects it. (Informational: prints the size it accepted to buffer.)
    let key = "k".repeat(80 << 20);
    let json = format!(
        r#"{{"descriptors":[{{"device":"cpu","ptr":1,"size":1}}],"nixl_metadata":"{}","notification_key":"{key}","operation_kind":1}}"#,
        encode_agent_metadata(b"x")
    );
    assert!(RdmaMetadata::from_json(&json).is_err()); // size check
    let bounded = RdmaMetadata::from_reader(json.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(bounded.contains("exceeds the limit"), "{bounded}");
    let via_reader: Result<RdmaMetadata, _> = serde_json::from_reader(json.as_bytes());
    let msg = via_reader.err().map(|e| e.to_string()).unwrap_or_default();
    eprintln!("from_reader error: {}", &msg[..msg.len().min(120)]);
    assert!(
        msg.contains("exceeds"),
        "the serde path parsed an {} MiB document",
        json.len() >> 20
    );
}
