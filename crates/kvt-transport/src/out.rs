//! A connection's output queue: PDU headers and small payloads encoded into one
//! byte buffer, interleaved with read data that stays in its device buffer until
//! the socket has taken it. One `writev` sends many PDUs and their data without
//! copying the data into the byte buffer first.
//!
//! A large read's data is *held* instead (`hold`): it goes into the stream a
//! piece at a time (`feed`, one C2HData PDU per piece, framed by the caller),
//! so that responses queued after it go out after at most the piece being
//! sent, not after the whole transfer.

use kvt_mem::{BufPool, IoBuf};
use std::collections::VecDeque;
use std::io::{IoSlice, Write};

/// Segments an `OutQueue` has room for from the start: a response and its
/// data for each of 128 commands (Linux's default queue depth), twice over.
const SEGS_AT_START: usize = 512;

/// At most this many pieces go into one `writev`.
const MAX_IOVECS: usize = 64;

enum Seg {
    /// bytes[start..end] of the byte buffer.
    Bytes { start: usize, end: usize },
    /// The first `len` bytes of a data buffer.
    Buf(IoBuf, usize),
    /// Bytes start..end of held buffer number `seq` (see `OutQueue::held`).
    Held { seq: u64, start: usize, end: usize },
}

impl Seg {
    fn len(&self) -> usize {
        match self {
            Seg::Bytes { start, end } => end - start,
            Seg::Buf(_, len) => *len,
            Seg::Held { start, end, .. } => end - start,
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
    /// Held data buffers (their first `len` bytes), oldest first; the front
    /// one is number `held_front`. A buffer goes back to the pool once its
    /// last byte is sent.
    held: VecDeque<(IoBuf, usize)>,
    held_front: u64,
    /// Held bytes not yet sent (fed or not), and not yet fed.
    held_pending: usize,
    unfed: usize,
    /// The next bytes to feed: buffer number `feed_seq`, from `feed_off`.
    feed_seq: u64,
    feed_off: usize,
}

impl OutQueue {
    pub fn with_capacity(n: usize) -> OutQueue {
        OutQueue {
            // Written once now, at queue creation: no page fault on the
            // reactor when a burst first reaches deep into it.
            bytes: {
                let mut b = kvt_mem::prefaulted_vec(n);
                b.clear();
                b
            },
            // Written once too: a burst of more segments than any before
            // would otherwise grow the ring on the reactor (a page fault,
            // seen by `reactor_takes_no_page_fault_once_warm`).
            segs: {
                let mut d = VecDeque::with_capacity(SEGS_AT_START);
                d.extend((0..SEGS_AT_START).map(|_| Seg::Bytes { start: 0, end: 0 }));
                d.clear();
                d
            },
            ..Default::default()
        }
    }

    /// Bytes queued and not yet sent.
    pub fn pending(&self) -> usize {
        self.bytes.len() - self.bytes_sent + self.buf_pending + self.held_pending
    }

    /// Bytes in the stream and not yet sent: `pending` less held bytes not
    /// yet fed.
    pub fn sendable(&self) -> usize {
        self.pending() - self.unfed
    }

    /// Data-buffer bytes (read data) queued or held and not yet sent.
    pub fn buffered_data(&self) -> usize {
        self.buf_pending + self.held_pending
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

    /// Holds the first `len` bytes of `buf`, to be fed into the stream later
    /// (after everything held before it).
    pub fn hold(&mut self, buf: IoBuf, len: usize) {
        let len = len.min(buf.len());
        self.held_pending += len;
        self.unfed += len;
        self.held.push_back((buf, len));
    }

    /// The next held bytes to feed, at most `max` of them, and their offset
    /// in their buffer; `None` when every held byte is fed.
    pub fn unfed_piece(&self, max: usize) -> Option<(usize, &[u8])> {
        let (buf, len) = self.held.get((self.feed_seq - self.held_front) as usize)?;
        let end = (self.feed_off + max).min(*len);
        Some((self.feed_off, &buf[self.feed_off..end]))
    }

    /// Appends the next `n` held bytes (of one buffer) to the stream, after
    /// everything encoded so far.
    pub fn feed(&mut self, n: usize) {
        let i = (self.feed_seq - self.held_front) as usize;
        let len = self.held.get(i).map_or(0, |h| h.1);
        assert!(self.feed_off + n <= len, "fed beyond a held buffer");
        self.close_open();
        self.segs.push_back(Seg::Held {
            seq: self.feed_seq,
            start: self.feed_off,
            end: self.feed_off + n,
        });
        self.unfed -= n;
        self.feed_off += n;
        if self.feed_off == len {
            self.feed_seq += 1;
            self.feed_off = 0;
        }
    }

    /// Drops held bytes not yet fed (the connection is being terminated):
    /// a buffer partly fed ends at what was fed.
    pub fn drop_unfed(&mut self) {
        let i = (self.feed_seq - self.held_front) as usize;
        let keep = if self.feed_off > 0 { i + 1 } else { i };
        if self.feed_off > 0 {
            if let Some(h) = self.held.get_mut(i) {
                h.1 = self.feed_off;
            }
            self.feed_seq += 1;
            self.feed_off = 0;
        }
        self.held.truncate(keep);
        self.held_pending -= self.unfed;
        self.unfed = 0;
    }

    /// Drops everything queued (the connection is gone).
    pub fn clear(&mut self, pool: &mut BufPool) {
        for s in self.segs.drain(..) {
            if let Seg::Buf(b, _) = s {
                pool.put(b);
            }
        }
        for (b, _) in self.held.drain(..) {
            pool.put(b);
        }
        self.held_front = 0;
        self.feed_seq = 0;
        self.feed_off = 0;
        self.held_pending = 0;
        self.unfed = 0;
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
                    Seg::Held { seq, start, end } => {
                        let (b, _) = &self.held[(seq - self.held_front) as usize];
                        IoSlice::new(&b[start + skip..*end])
                    }
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
                Seg::Held { .. } => self.held_pending -= take,
            }
            n -= take;
            if take == left {
                match self.segs.pop_front() {
                    Some(Seg::Buf(b, _)) => pool.put(b),
                    Some(Seg::Held { seq, end, .. }) => self.sent_held(seq, end, pool),
                    _ => {}
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

    /// A piece of held buffer `seq` ending at `end` is sent: the buffer goes
    /// back to the pool if that was its last byte (pieces go out in order, so
    /// it is the front one).
    fn sent_held(&mut self, seq: u64, end: usize, pool: &mut BufPool) {
        assert!(seq >= self.held_front, "held buffers sent out of order");
        if seq == self.held_front && self.held.front().is_some_and(|h| h.1 == end) {
            if let Some((b, _)) = self.held.pop_front() {
                pool.put(b);
            }
            self.held_front += 1;
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

    /// A terminated connection sends what was fed and nothing held after it.
    #[test]
    fn dropping_unfed_data_keeps_what_was_fed() {
        let mut q = OutQueue::with_capacity(64);
        let mut pool = BufPool::new(4);
        let mut w = Choppy {
            got: Vec::new(),
            limits: Vec::new(),
            calls: 0,
        };
        let mut a = IoBuf::new(100);
        a.fill(1);
        q.hold(a, 100);
        q.hold(IoBuf::new(50), 50);
        q.feed(30);
        q.bytes.extend_from_slice(&[9; 5]);
        q.drop_unfed();
        assert_eq!(q.pending(), 35);
        while !q.is_empty() {
            q.write_to(&mut w, &mut pool).unwrap();
        }
        assert_eq!(w.got, [[1u8; 30].as_slice(), &[9; 5]].concat());
        assert!(q.held.is_empty());
        assert!(q.unfed_piece(10).is_none());
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

        /// Held buffers fed in pieces between other output, however the
        /// socket splits the writes: the peer gets the pieces where they were
        /// fed, the accounting ends at zero and every held buffer is let go.
        #[test]
        fn held_data_goes_out_where_it_was_fed(
            ops in proptest::collection::vec((0u8..3, 1usize..9000, any::<u8>(), 0usize..5000), 1..40),
            limits in proptest::collection::vec(0usize..20000, 0..200),
        ) {
            let mut q = OutQueue::with_capacity(64);
            let mut pool = BufPool::new(4);
            let mut want = Vec::new();
            let mut w = Choppy { got: Vec::new(), limits, calls: 0 };
            for &(kind, len, v, feed) in &ops {
                match kind {
                    0 => {
                        q.bytes.extend(std::iter::repeat_n(v, len));
                        want.extend(std::iter::repeat_n(v, len));
                    }
                    1 => {
                        let mut b = IoBuf::new(len);
                        b.fill(v);
                        q.push_buf(b, len);
                        want.extend(std::iter::repeat_n(v, len));
                    }
                    _ => {
                        let mut b = IoBuf::new(len + 10);
                        for (i, x) in b.iter_mut().enumerate() {
                            *x = v.wrapping_add(i as u8);
                        }
                        q.hold(b, len);
                    }
                }
                if let Some((_, piece)) = q.unfed_piece(feed.max(1)) {
                    want.extend_from_slice(piece);
                    let n = piece.len();
                    q.feed(n);
                }
                prop_assert_eq!(q.pending(), want.len() - w.got.len() + q.unfed);
                let _ = q.write_to(&mut w, &mut pool);
            }
            let mut rounds = 0;
            while !q.is_empty() {
                if let Some((_, piece)) = q.unfed_piece(3000) {
                    want.extend_from_slice(piece);
                    let n = piece.len();
                    q.feed(n);
                }
                let _ = q.write_to(&mut w, &mut pool);
                rounds += 1;
                prop_assert!(rounds < 10_000);
            }
            prop_assert!(w.got == want, "stream differs");
            prop_assert!(q.held.is_empty());
            prop_assert_eq!(q.buffered_data(), 0);
        }
    }
}
