//! Name-based identifiers (namespace, volume and pool UUIDs). A leaf module:
//! the NVMe-oF core and the pool both use it.

/// A name-based UUID (version 8, "custom"): two CRC32C passes over the name with
/// different seeds stretched to 128 bits. Stable and unique enough for identifiers;
/// not a security property.
pub fn stable_uuid(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, chunk) in out.chunks_mut(4).enumerate() {
        let mut h =
            crc32c::crc32c_append(0x9E37_79B9u32.wrapping_mul(i as u32 + 1), name.as_bytes());
        h ^= h >> 15;
        chunk.copy_from_slice(&h.to_le_bytes());
    }
    out[6] = (out[6] & 0x0F) | 0x80; // version 8
    out[8] = (out[8] & 0x3F) | 0x80; // RFC 4122 variant
    out
}

/// Bytes as lowercase hex, two digits each (NGUIDs, EUI-64s, host IDs).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A UUID in its 8-4-4-4-12 text form (RFC 4122), lowercase.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h = hex(u);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}
