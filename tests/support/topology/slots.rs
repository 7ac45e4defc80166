//! Redis Cluster's hash slots: which slot a key is in, and a hash tag for each slot.

use super::SLOTS;
use std::sync::OnceLock;

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of `key`: CRC16 of its hash tag (what is between the first `{` and
/// the first `}` after it, when that is not empty) or of the whole key, mod 16384.
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    let key = key.as_ref();
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            match rest.iter().position(|&b| b == b'}') {
                Some(0) | None => None,
                Some(close) => Some(&rest[..close]),
            }
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// A short hash tag for `slot`: every key containing `{<tag>}` lands there.
pub fn tag_for_slot(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut missing = usize::from(SLOTS);
        let mut n = 0u64;
        while missing > 0 {
            let tag = n.to_string();
            let entry = &mut tags[usize::from(key_slot(&tag))];
            if entry.is_empty() {
                *entry = tag;
                missing -= 1;
            }
            n += 1;
        }
        tags
    });
    &tags[usize::from(slot)]
}
