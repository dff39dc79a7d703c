//! NVMe, NVMe/TCP and NVMe/RDMA wire formats.
//!
//! Everything here is plain byte layout: encoding writes little-endian fields at the
//! offsets the specifications give, decoding reads them back and never panics on short
//! or hostile input (property tests in each module prove it). Beside them, the
//! NQN rules (`nqn`) and name-based identifiers (`ident`). The lowest layer of the
//! workspace: it depends on no other crate of it.

pub mod ident;
pub mod nqn;
pub mod nvme;
pub mod rdma;
pub mod tcp;

/// Little-endian field accessors over byte slices. Reads past the end yield zero
/// rather than panicking: callers validate lengths first, this is the backstop.
/// `#[inline]`, as the `Sqe` accessors built on them, which other crates inline.
pub(crate) mod le {
    #[inline]
    pub fn u16_at(b: &[u8], off: usize) -> u16 {
        match b.get(off..off + 2) {
            Some(s) => u16::from_le_bytes([s[0], s[1]]),
            None => 0,
        }
    }
    #[inline]
    pub fn u32_at(b: &[u8], off: usize) -> u32 {
        match b.get(off..off + 4) {
            Some(s) => u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
            None => 0,
        }
    }
    #[inline]
    pub fn u64_at(b: &[u8], off: usize) -> u64 {
        match b.get(off..off + 8) {
            Some(s) => {
                let mut a = [0u8; 8];
                a.copy_from_slice(s);
                u64::from_le_bytes(a)
            }
            None => 0,
        }
    }
    #[inline]
    pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
        b[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    #[inline]
    pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
        b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    #[inline]
    pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
    /// Writes an ASCII string space-padded into a fixed field (Identify sn/mn/fr).
    pub fn put_ascii_padded(b: &mut [u8], off: usize, len: usize, s: &str) {
        let field = &mut b[off..off + len];
        field.fill(b' ');
        let n = s.len().min(len);
        field[..n].copy_from_slice(&s.as_bytes()[..n]);
    }
    /// Writes a string NUL-padded into a fixed field (NQNs, transport addresses).
    pub fn put_str_nul(b: &mut [u8], off: usize, len: usize, s: &str) {
        let field = &mut b[off..off + len];
        field.fill(0);
        let n = s.len().min(len.saturating_sub(1));
        field[..n].copy_from_slice(&s.as_bytes()[..n]);
    }
    /// Reads a NUL-terminated (or field-length) string; invalid UTF-8 is replaced.
    pub fn str_at(b: &[u8], off: usize, len: usize) -> String {
        let field = b.get(off..(off + len).min(b.len())).unwrap_or(&[]);
        let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
        String::from_utf8_lossy(&field[..end])
            .trim_end()
            .to_string()
    }
}
