//! `nixl_metadata`, the agent blob as it travels: `"b64:"` + base64 (or
//! Dynamo's legacy bare hex) of a zlib stream, and the per-thread state that
//! keeps encoding and decoding the same blob cheap.
//!
//! A worker publishes the same agent metadata with every operation (NIXL's
//! changes only with the agent's registrations), and its peer decodes the
//! same string every time: each side remembers its last one. Why: the
//! metadata bullet of §9 in docs/decisions/0009-performance-history.md.

use std::cell::RefCell;

use base64::Engine as _;

use super::MAX_AGENT_METADATA_BYTES;
use crate::error::{Error, Result};

const B64_PREFIX: &str = "b64:";
const FIELD: &str = "nixl_metadata";

/// The largest blob [`encode_agent_metadata`] remembers (a copy stays with
/// the thread until it encodes another).
const MEMO_MAX_BLOB: usize = 64 << 10;

/// The longest `nixl_metadata` string, and the largest blob, that
/// [`decode_agent_metadata_cached`] remembers (a copy of each stays with the
/// thread until it decodes another).
const DECODED_MAX: (usize, usize) = (64 << 10, 256 << 10);

thread_local! {
    /// The blob this thread encoded last, and its encoding.
    static LAST_ENCODED: RefCell<Option<(Box<[u8]>, String)>> = const { RefCell::new(None) };
    /// The `nixl_metadata` string this thread decoded last (through
    /// [`decode_agent_metadata_cached`]), and its blob.
    static LAST_DECODED: RefCell<Option<(Box<str>, Vec<u8>)>> = const { RefCell::new(None) };
    /// One zlib decompressor per thread, reset for each blob: setting up a
    /// new one costs about as much as inflating a small agent blob.
    static INFLATE: RefCell<flate2::Decompress> = RefCell::new(flate2::Decompress::new(true));
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

/// Decodes `nixl_metadata`: `"b64:"` + base64, or Dynamo's legacy bare hex, of a
/// zlib stream. The decompressed blob is capped at [`MAX_AGENT_METADATA_BYTES`].
pub fn decode_agent_metadata(encoded: &str) -> Result<Vec<u8>> {
    let compressed = match encoded.strip_prefix(B64_PREFIX) {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| Error::invalid_metadata(FIELD, format!("bad base64: {e}")))?,
        None => decode_hex(encoded).ok_or_else(|| {
            Error::invalid_metadata(
                FIELD,
                "neither \"b64:\"-prefixed base64 nor an even-length hex string",
            )
        })?,
    };
    inflate(&compressed).map_err(|reason| Error::invalid_metadata(FIELD, reason))
}

/// [`decode_agent_metadata`], remembering this thread's last success: the
/// same string as the previous one costs a comparison and a copy, not
/// another inflation. For a peer that decodes what one worker publishes
/// over and over (a pool registered once publishes the same agent metadata
/// with every operation).
///
/// The result is always the one [`decode_agent_metadata`] gives: only a
/// string that decoded is remembered (up to 64 KiB, its blob up to
/// 256 KiB), and an error is computed afresh each time.
///
/// ```
/// # use descriptor_core::{decode_agent_metadata_cached, encode_agent_metadata};
/// let encoded = encode_agent_metadata(b"agent-blob");
/// assert_eq!(decode_agent_metadata_cached(&encoded)?, b"agent-blob");
/// assert_eq!(decode_agent_metadata_cached(&encoded)?, b"agent-blob"); // remembered
/// assert!(decode_agent_metadata_cached("b64:!!!!").is_err());
/// # Ok::<(), descriptor_core::Error>(())
/// ```
pub fn decode_agent_metadata_cached(encoded: &str) -> Result<Vec<u8>> {
    let known = LAST_DECODED
        .try_with(|last| {
            last.borrow()
                .as_ref()
                .filter(|(text, _)| **text == *encoded)
                .map(|(_, blob)| blob.clone())
        })
        .ok()
        .flatten();
    if let Some(blob) = known {
        return Ok(blob);
    }
    let blob = decode_agent_metadata(encoded)?;
    let (max_text, max_blob) = DECODED_MAX;
    if encoded.len() <= max_text && blob.len() <= max_blob {
        // A thread being torn down just does not remember.
        let _ = LAST_DECODED.try_with(|last| {
            *last.borrow_mut() = Some((encoded.into(), blob.clone()));
        });
    }
    Ok(blob)
}

/// A zlib byte count as an index (it never exceeds the slice it counts).
fn counted(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
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

    /// The string this thread's cache holds now, if any.
    fn last_decoded() -> Option<String> {
        LAST_DECODED.with(|last| last.borrow().as_ref().map(|(text, _)| text.to_string()))
    }

    /// The blob this thread's cache holds for `encoded`, if it holds it.
    fn remembered_blob(encoded: &str) -> Option<Vec<u8>> {
        LAST_DECODED.with(|last| {
            last.borrow()
                .as_ref()
                .filter(|(text, _)| **text == *encoded)
                .map(|(_, blob)| blob.clone())
        })
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
        // 4 MiB of one byte compresses to a few KiB, so the output grows
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
    fn accepts_legacy_hex_of_the_zlib_stream_in_either_case() {
        // zlib.compress(b"ab", 6).hex() in Python.
        let legacy = "789c4b4c0200012600c4";
        assert_eq!(decode_agent_metadata(legacy).ok(), Some(b"ab".to_vec()));
        assert_eq!(
            decode_agent_metadata(&legacy.to_uppercase()).ok(),
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
    fn the_cached_decode_remembers_the_last_string_and_gives_what_the_plain_one_gives() {
        let first = b"first agent \x00\xff".repeat(30);
        let second = b"second agent".repeat(30);
        let (a, b) = (
            encode_agent_metadata(&first),
            encode_agent_metadata(&second),
        );
        assert_eq!(decode_agent_metadata_cached(&a).ok(), Some(first.clone()));
        assert_eq!(remembered_blob(&a), Some(first.clone()));
        assert_eq!(decode_agent_metadata_cached(&a).ok(), Some(first.clone()));
        // Another string replaces it: one entry, never a stale blob.
        assert_eq!(decode_agent_metadata_cached(&b).ok(), Some(second.clone()));
        assert_eq!(remembered_blob(&a), None);
        assert_eq!(remembered_blob(&b), Some(second.clone()));
        // The legacy hex of the same blob is another string, decoded afresh.
        let legacy = "789c4b4c0200012600c4";
        assert_eq!(
            decode_agent_metadata_cached(legacy).ok(),
            Some(b"ab".to_vec())
        );
        assert_eq!(last_decoded().as_deref(), Some(legacy));
    }

    #[test]
    fn the_cached_decode_never_remembers_an_error_and_keeps_what_it_had() {
        let blob = b"agent".repeat(10);
        let good = encode_agent_metadata(&blob);
        assert_eq!(decode_agent_metadata_cached(&good).ok(), Some(blob.clone()));
        for bad in ["b64:!!!!", "abc", "6162", ""] {
            let cached = decode_agent_metadata_cached(bad)
                .err()
                .map(|e| e.to_string());
            let plain = decode_agent_metadata(bad).err().map(|e| e.to_string());
            assert!(cached.is_some(), "{bad:?} decoded");
            assert_eq!(cached, plain, "{bad:?}");
            // Refused again the second time, not answered from memory.
            assert!(decode_agent_metadata_cached(bad).is_err(), "{bad:?}");
            assert_eq!(remembered_blob(&good), Some(blob.clone()), "{bad:?}");
        }
    }

    #[test]
    fn the_cached_decode_does_not_keep_a_large_blob() {
        let (max_text, max_blob) = DECODED_MAX;
        let small = encode_agent_metadata(b"small");
        assert_eq!(
            decode_agent_metadata_cached(&small).ok(),
            Some(b"small".to_vec())
        );
        // A short string of a blob over the limit: decoded, not kept.
        let large = vec![1u8; max_blob + 1];
        let encoded = encode_agent_metadata(&large);
        assert!(encoded.len() <= max_text, "{}", encoded.len());
        assert_eq!(decode_agent_metadata_cached(&encoded).ok(), Some(large));
        assert_eq!(remembered_blob(&encoded), None);
        assert_eq!(last_decoded(), Some(small));
    }
}
