//! A connection's output queue: PDU headers and small payloads encoded into one
//! byte buffer, interleaved with read data that stays in its device buffer until
//! the socket has taken it. One `writev` sends many PDUs and their data without
//! copying the data into the byte buffer first.

use crate::mem::{BufPool, IoBuf};
use std::collections::VecDeque;
use std::io::{IoSlice, Write};

/// At most this many pieces go into one `writev`.
const MAX_IOVECS: usize = 64;

enum Seg {
    /// bytes[start..end] of the byte buffer.
    Bytes { start: usize, end: usize },
    /// The first `len` bytes of a data buffer.
    Buf(IoBuf, usize),
}

impl Seg {
    fn len(&self) -> usize {
        match self {
            Seg::Bytes { start, end } => end - start,
            Seg::Buf(_, len) => *len,
        }
    }
}

#[derive(Default)]
pub struct OutQueue {
    /// Encoded bytes; segments refer into it in order, so what is sent of it is
    /// always a prefix.
    pub bytes: Vec<u8>,
    segs: VecDeque<Seg>,
    /// Start of the bytes appended since the last segment was closed.
    open_from: usize,
    /// Bytes of the front segment already sent.
    head_off: usize,
    /// Data-buffer bytes queued and not yet sent.
    buf_pending: usize,
    /// Bytes of `bytes` already sent.
    bytes_sent: usize,
}

impl OutQueue {
    pub fn with_capacity(n: usize) -> OutQueue {
        OutQueue {
            // Written once now, at queue creation: no page fault on the
            // reactor when a burst first reaches deep into it.
            bytes: {
                let mut b = crate::mem::prefaulted_vec(n);
                b.clear();
                b
            },
            ..Default::default()
        }
    }

    /// Bytes queued and not yet sent.
    pub fn pending(&self) -> usize {
        self.bytes.len() - self.bytes_sent + self.buf_pending
    }

    /// Data-buffer bytes (read data) queued and not yet sent.
    pub fn buffered_data(&self) -> usize {
        self.buf_pending
    }

    pub fn is_empty(&self) -> bool {
        self.pending() == 0
    }

    fn close_open(&mut self) {
        if self.bytes.len() > self.open_from {
            self.segs.push_back(Seg::Bytes {
                start: self.open_from,
                end: self.bytes.len(),
            });
            self.open_from = self.bytes.len();
        }
    }

    /// Queues the first `len` bytes of `buf` after everything encoded so far.
    pub fn push_buf(&mut self, buf: IoBuf, len: usize) {
        let len = len.min(buf.len());
        self.close_open();
        self.buf_pending += len;
        self.segs.push_back(Seg::Buf(buf, len));
    }

    /// Drops everything queued (the connection is gone).
    pub fn clear(&mut self, pool: &mut BufPool) {
        for s in self.segs.drain(..) {
            if let Seg::Buf(b, _) = s {
                pool.put(b);
            }
        }
        self.bytes.clear();
        self.open_from = 0;
        self.head_off = 0;
        self.buf_pending = 0;
        self.bytes_sent = 0;
    }

    /// Writes as much as `w` takes, with one vectored write per call of at most
    /// `MAX_IOVECS` pieces; sent data buffers go back to `pool`. Returns the
    /// bytes written (0 when nothing was queued).
    pub fn write_to<W: Write>(&mut self, w: &mut W, pool: &mut BufPool) -> std::io::Result<usize> {
        self.close_open();
        if self.segs.is_empty() {
            return Ok(0);
        }
        let n = {
            let mut iov: [IoSlice; MAX_IOVECS] = [IoSlice::new(&[]); MAX_IOVECS];
            let mut k = 0;
            for (i, s) in self.segs.iter().take(MAX_IOVECS).enumerate() {
                let skip = if i == 0 { self.head_off } else { 0 };
                iov[k] = match s {
                    Seg::Bytes { start, end } => IoSlice::new(&self.bytes[start + skip..*end]),
                    Seg::Buf(b, len) => IoSlice::new(&b[skip..*len]),
                };
                k += 1;
            }
            w.write_vectored(&iov[..k])?
        };
        self.consume(n, pool);
        Ok(n)
    }

    fn consume(&mut self, mut n: usize, pool: &mut BufPool) {
        while n > 0 {
            let Some(front) = self.segs.front() else {
                break;
            };
            let left = front.len() - self.head_off;
            let take = n.min(left);
            match front {
                Seg::Bytes { .. } => self.bytes_sent += take,
                Seg::Buf(..) => self.buf_pending -= take,
            }
            n -= take;
            if take == left {
                if let Some(Seg::Buf(b, _)) = self.segs.pop_front() {
                    pool.put(b);
                }
                self.head_off = 0;
            } else {
                self.head_off += take;
            }
        }
        if self.segs.is_empty() && self.bytes_sent == self.bytes.len() {
            self.bytes.clear();
            self.bytes_sent = 0;
            self.open_from = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A writer that takes at most `limits[i]` bytes on its i-th call.
    struct Choppy {
        got: Vec<u8>,
        limits: Vec<usize>,
        calls: usize,
    }

    impl Write for Choppy {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.write_vectored(&[IoSlice::new(b)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
            let mut room = self.limits.get(self.calls).copied().unwrap_or(usize::MAX);
            self.calls += 1;
            if room == 0 {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            let mut n = 0;
            for b in bufs {
                let t = b.len().min(room);
                self.got.extend_from_slice(&b[..t]);
                room -= t;
                n += t;
            }
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    proptest! {
        /// Whatever the interleaving of encoded bytes and data buffers, and however
        /// the socket splits the writes, the peer gets exactly the queued stream.
        #[test]
        fn the_stream_arrives_whole_and_in_order(
            pieces in proptest::collection::vec((any::<bool>(), 1usize..9000, any::<u8>()), 1..40),
            limits in proptest::collection::vec(0usize..20000, 0..200),
            enqueue_between in 0usize..40,
        ) {
            let mut q = OutQueue::with_capacity(64);
            let mut pool = BufPool::new(4);
            let mut want = Vec::new();
            let mut w = Choppy { got: Vec::new(), limits, calls: 0 };
            for (i, &(is_buf, len, v)) in pieces.iter().enumerate() {
                if is_buf {
                    let mut b = IoBuf::new(len + 100);
                    b[..len].fill(v);
                    b[len..].fill(v.wrapping_add(1));
                    q.push_buf(b, len);
                } else {
                    q.bytes.extend(std::iter::repeat_n(v, len));
                }
                want.extend(std::iter::repeat_n(v, len));
                if i == enqueue_between {
                    let _ = q.write_to(&mut w, &mut pool);
                }
            }
            let mut rounds = 0;
            while !q.is_empty() {
                let _ = q.write_to(&mut w, &mut pool);
                rounds += 1;
                prop_assert!(rounds < 10_000);
            }
            prop_assert_eq!(q.pending(), 0);
            prop_assert!(w.got == want, "stream differs");
            prop_assert!(q.bytes.is_empty());
        }
    }
}
