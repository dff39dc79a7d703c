//! A RAM device with a volatile write cache and crash injection, for the pool
//! simulation. Completed writes sit in a cache until a Flush; a crash keeps or
//! loses each cached 512-byte sector at random (so writes are lost, reordered and
//! torn at any sector), and a fuse can make every operation fail from the Nth
//! write on, to crash in the middle of a metadata update.
//!
//! Channels complete at the next `poll`. With `reorder` set, a channel holds
//! what was submitted and carries it out at `poll` in an order drawn from the
//! device's seeded generator, as a real device may reorder commands that are in
//! flight together (writes against a Flush among them). Read faults return one
//! read's data corrupted or from the wrong place, as failing media and firmware
//! do. Everything is drawn from seeds, so a single-threaded simulation stays
//! deterministic.

use super::{BlockDevice, IoChannel, IoCompletion, IoOp};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub const SECTOR: usize = 512;

struct State {
    durable: Vec<u8>,
    /// Writes since the last flush, oldest first: (offset, bytes, FUA). A FUA
    /// write is durable at once; it stays here so a crash replaying older
    /// cached sectors cannot overwrite it.
    cache: Vec<(u64, Vec<u8>, bool)>,
    /// Writes left before every operation fails; `None` when disarmed.
    fuse: Option<u64>,
    tripped: bool,
    writes: u64,
    flushes: u64,
    /// Carry out each channel's submissions at `poll`, shuffled by this.
    reorder: Option<SimRng>,
    /// The next faulty read, and reads left before it.
    read_fault: Option<(u64, ReadFault)>,
    read_faults: u64,
}

/// What a faulty read returns instead of the data asked for. Applied to the
/// first read after the countdown that overlaps `range` (one read, then gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadFault {
    pub range: std::ops::Range<u64>,
    pub kind: ReadFaultKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFaultKind {
    /// One byte of the data flipped.
    Corrupt { at: u64 },
    /// The data of another offset (`by` bytes further, wrapping in the device).
    Misdirect { by: u64 },
}

pub struct FaultDevice {
    size: u64,
    state: Mutex<State>,
}

/// A small deterministic generator (SplitMix64) so a seed reproduces a run.
#[derive(Debug, Clone)]
pub struct SimRng(pub u64);

impl SimRng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, n); 0 when n is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

impl FaultDevice {
    pub fn new(size: u64) -> Arc<FaultDevice> {
        Arc::new(FaultDevice {
            size,
            state: Mutex::new(State {
                durable: vec![0; size as usize],
                cache: Vec::new(),
                fuse: None,
                tripped: false,
                writes: 0,
                flushes: 0,
                reorder: None,
                read_fault: None,
                read_faults: 0,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Fails every operation after `writes` more writes (0: the next one).
    pub fn arm_fuse(&self, writes: u64) {
        let mut s = self.lock();
        s.fuse = Some(writes);
    }

    /// Makes channels carry out their submissions at `poll` in an order drawn
    /// from `seed`.
    pub fn set_reorder(&self, seed: Option<u64>) {
        self.lock().reorder = seed.map(SimRng);
    }

    /// Arms one faulty read, after `after` more reads that overlap its range.
    pub fn arm_read_fault(&self, after: u64, fault: ReadFault) {
        self.lock().read_fault = Some((after, fault));
    }

    pub fn disarm_read_fault(&self) {
        self.lock().read_fault = None;
    }

    /// Faulty reads served so far.
    pub fn read_faults(&self) -> u64 {
        self.lock().read_faults
    }

    pub fn tripped(&self) -> bool {
        self.lock().tripped
    }

    /// Simulates power loss: each cached sector survives or not at random.
    pub fn crash(&self, rng: &mut SimRng) {
        let mut s = self.lock();
        let cache = std::mem::take(&mut s.cache);
        for (off, data, fua) in cache {
            // Whole write lost, whole write kept, or torn sector by sector.
            let mode = if fua { 1 } else { rng.below(3) };
            if mode == 0 {
                continue;
            }
            for (i, sector) in data.chunks(SECTOR).enumerate() {
                if mode == 1 || rng.chance(50) {
                    let at = off as usize + i * SECTOR;
                    s.durable[at..at + sector.len()].copy_from_slice(sector);
                }
            }
        }
        s.fuse = None;
        s.tripped = false;
    }

    /// Writes and flushes so far (for coverage reports).
    pub fn counts(&self) -> (u64, u64) {
        let s = self.lock();
        (s.writes, s.flushes)
    }

    fn read_into(s: &State, off: u64, buf: &mut [u8]) {
        let (o, n) = (off as usize, buf.len());
        buf.copy_from_slice(&s.durable[o..o + n]);
        for (woff, data, _) in &s.cache {
            let (ws, we) = (*woff as usize, *woff as usize + data.len());
            let (lo, hi) = (ws.max(o), we.min(o + n));
            if lo < hi {
                buf[lo - o..hi - o].copy_from_slice(&data[lo - ws..hi - ws]);
            }
        }
    }

    /// A read of `buf.len()` bytes at `off`, with the armed read fault if it
    /// is due.
    fn read(&self, s: &mut State, off: u64, buf: &mut [u8]) {
        let len = buf.len() as u64;
        let hit = match &mut s.read_fault {
            Some((left, f)) if off < f.range.end && f.range.start < off + len => {
                if *left == 0 {
                    Some(f.kind)
                } else {
                    *left -= 1;
                    None
                }
            }
            _ => None,
        };
        match hit {
            None => Self::read_into(s, off, buf),
            Some(kind) => {
                s.read_fault = None;
                s.read_faults += 1;
                match kind {
                    ReadFaultKind::Corrupt { at } => {
                        Self::read_into(s, off, buf);
                        if let Some(b) = buf.get_mut((at % len.max(1)) as usize) {
                            *b ^= 0x5A;
                        }
                    }
                    ReadFaultKind::Misdirect { by } => {
                        let span = self.size.saturating_sub(len).max(1);
                        let from = (off + by) % span;
                        Self::read_into(s, from, buf);
                    }
                }
            }
        }
    }

    fn execute(&self, op: &mut IoOp) -> Result<(), i32> {
        let mut s = self.lock();
        if s.tripped {
            return Err(libc::EIO);
        }
        let in_range = |off: u64, len: u64| off.checked_add(len).is_some_and(|e| e <= self.size);
        match op {
            IoOp::Read { offset, buf } => {
                if !in_range(*offset, buf.len() as u64) {
                    return Err(libc::EINVAL);
                }
                self.read(&mut s, *offset, buf);
                Ok(())
            }
            IoOp::Write { .. } | IoOp::WriteZeroes { .. } | IoOp::Deallocate { .. } => {
                let (offset, data, fua) = match op {
                    IoOp::Write { offset, buf, fua } => (*offset, buf.to_vec(), *fua),
                    IoOp::WriteZeroes { offset, len } | IoOp::Deallocate { offset, len } => {
                        (*offset, vec![0u8; *len as usize], false)
                    }
                    _ => return Err(libc::EINVAL),
                };
                if !in_range(offset, data.len() as u64) {
                    return Err(libc::EINVAL);
                }
                if let Some(f) = s.fuse {
                    if f == 0 {
                        s.tripped = true;
                        return Err(libc::EIO);
                    }
                    s.fuse = Some(f - 1);
                }
                s.writes += 1;
                if fua {
                    let o = offset as usize;
                    s.durable[o..o + data.len()].copy_from_slice(&data);
                }
                s.cache.push((offset, data, fua));
                Ok(())
            }
            IoOp::Flush => {
                s.flushes += 1;
                let cache = std::mem::take(&mut s.cache);
                for (off, data, _) in cache {
                    let o = off as usize;
                    s.durable[o..o + data.len()].copy_from_slice(&data);
                }
                Ok(())
            }
        }
    }
}

struct FaultChannel {
    dev: Arc<FaultDevice>,
    /// Submissions held for `poll` when the device reorders.
    held: Vec<(u64, IoOp)>,
    done: Vec<IoCompletion>,
}

impl FaultChannel {
    fn run(&mut self, tag: u64, mut op: IoOp) {
        let result = self.dev.execute(&mut op);
        self.done.push(IoCompletion {
            tag,
            result,
            buf: op.into_buf(),
        });
    }
}

impl FaultDevice {
    /// A seeded order for `n` held operations, or None when not reordering.
    fn order(&self, n: usize) -> Option<Vec<usize>> {
        let mut s = self.lock();
        let rng = s.reorder.as_mut()?;
        let mut idx: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            idx.swap(i, rng.below(i as u64 + 1) as usize);
        }
        Some(idx)
    }

    fn reorders(&self) -> bool {
        self.lock().reorder.is_some()
    }
}

impl IoChannel for FaultChannel {
    fn submit(&mut self, tag: u64, op: IoOp, _now: Instant) -> Result<(), (IoOp, i32)> {
        if self.dev.reorders() {
            self.held.push((tag, op));
        } else {
            self.run(tag, op);
        }
        Ok(())
    }
    fn flush_submissions(&mut self) {}
    fn poll(&mut self, out: &mut Vec<IoCompletion>, _now: Instant) -> usize {
        if !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            let order = self.dev.order(held.len());
            let mut slots: Vec<Option<(u64, IoOp)>> = held.into_iter().map(Some).collect();
            let order = order.unwrap_or_else(|| (0..slots.len()).collect());
            for i in order {
                if let Some((tag, op)) = slots.get_mut(i).and_then(Option::take) {
                    self.run(tag, op);
                }
            }
        }
        let n = self.done.len();
        out.append(&mut self.done);
        n
    }
    fn in_flight(&self) -> usize {
        self.held.len() + self.done.len()
    }
    fn completion_fd(&self) -> Option<RawFd> {
        None
    }
}

/// A cheap handle so `open_channel` can hand out `Arc` clones of the device.
pub struct FaultHandle(pub Arc<FaultDevice>);

impl BlockDevice for FaultHandle {
    fn describe(&self) -> String {
        "fault-injecting RAM".into()
    }
    fn size_bytes(&self) -> u64 {
        self.0.size
    }
    fn open_channel(&self) -> std::io::Result<Box<dyn IoChannel>> {
        Ok(Box::new(FaultChannel {
            held: Vec::new(),
            dev: self.0.clone(),
            done: Vec::new(),
        }))
    }
    fn sync(&self) -> std::io::Result<()> {
        let mut op = IoOp::Flush;
        self.0
            .execute(&mut op)
            .map_err(std::io::Error::from_raw_os_error)
    }
    fn volatile(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_like_a_device_and_loses_only_unflushed_data() {
        let dev = FaultDevice::new(1 << 20);
        crate::testing::exercise(&FaultHandle(dev.clone()));
        let mut ch = FaultHandle(dev.clone()).open_channel().unwrap();
        let mut b = kvt_mem::IoBuf::new(4096);
        b.fill(7);
        let c = crate::testing::run(
            ch.as_mut(),
            IoOp::Write {
                offset: 65536,
                buf: b,
                fua: false,
            },
        );
        assert_eq!(c.result, Ok(()));
        let mut rng = SimRng(1);
        dev.crash(&mut rng);
        let r = crate::testing::run(
            ch.as_mut(),
            IoOp::Read {
                offset: 65536,
                buf: kvt_mem::IoBuf::new(4096),
            },
        );
        let data = r.buf.unwrap();
        // Each sector is either old (0) or new (7): torn, never mixed within one.
        for s in data.chunks(SECTOR) {
            assert!(s.iter().all(|&x| x == 0) || s.iter().all(|&x| x == 7));
        }
        dev.arm_fuse(0);
        let c = crate::testing::run(
            ch.as_mut(),
            IoOp::Write {
                offset: 0,
                buf: kvt_mem::IoBuf::new(4096),
                fua: false,
            },
        );
        assert_eq!(c.result, Err(libc::EIO));
        assert!(dev.tripped());
    }
}
