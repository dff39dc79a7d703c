//! kv-uring: stores, retrieves, checks and deletes values in a KV namespace
//! through the Linux generic NVMe char device (/dev/ngXnY) with io_uring NVMe
//! passthrough (IORING_OP_URING_CMD, 128-byte SQEs, 32-byte CQEs: the path
//! Mooncake Store's NVMe-KV backend takes). Verifies every byte and the value
//! size the controller returns in DW0, with several commands in flight.
//!
//! Usage: kv-uring --dev /dev/ng0n2 --nsid 2 [--count N] [--qd Q] [--sizes A,B,..] [--seed S]
//!        kv-uring --dev /dev/ng0n2 --nsid 2 --mooncake 1 [--count N] [--seed S]
//! Prints one summary line; exits 1 on the first mismatch or failed command.
//!
//! `--mooncake 1` encodes every command as Mooncake Store's NVMe-KV backend
//! does (`mooncake-store/client/nvme_kv`): 16-byte physical keys whose byte 11
//! carries the CSI (01h) in CDW14 bits 31:24, insert-only Stores (CDW11 option
//! "must not exist"), CDW10 and the data length rounded up to 4 KiB, CDW12 the
//! transfer's 512-byte block count minus one, values up to its default limit of
//! 264 KiB, a first Retrieve into a 4 KiB buffer followed by one of the size DW0
//! names, and statuses read as `res & 0xFF`.

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::os::fd::AsRawFd;

/// `_IOWR('N', 0x80, struct nvme_uring_cmd)`: NVME_URING_CMD_IO.
const NVME_URING_CMD_IO: u32 = 0xC048_4E80;

const STORE: u8 = 0x01;
const RETRIEVE: u8 = 0x02;
const DELETE: u8 = 0x10;
const EXIST: u8 = 0x14;
/// Key Exists: SCT 1, SC 89h.
const SC_KEY_EXISTS: i32 = 0x89;
/// Key Does Not Exist's status code alone (Mooncake reads `res & 0xFF`).
const SC_KEY_DOES_NOT_EXIST: i32 = 0x87;
/// Key Does Not Exist: SCT 1, SC 87h.
const KEY_DOES_NOT_EXIST: i32 = 0x187;

/// `struct nvme_uring_cmd` (72 bytes, in the SQE's 80-byte command area).
struct UringCmd {
    opcode: u8,
    nsid: u32,
    key: [u8; 16],
    key_len: u32,
    addr: u64,
    data_len: u32,
    cdw10: u32,
    /// CDW11 bits 15:8 (Store options).
    options: u8,
    cdw12: u32,
}

impl UringCmd {
    fn bytes(&self) -> [u8; 80] {
        let mut b = [0u8; 80];
        let put = |b: &mut [u8; 80], at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        b[0] = self.opcode;
        put(&mut b, 4, &self.nsid.to_le_bytes());
        // Key bytes 0-7 in CDW2-3, 8-15 in CDW14-15, in memory order.
        put(&mut b, 8, &self.key[..8]);
        put(&mut b, 24, &self.addr.to_le_bytes());
        put(&mut b, 36, &self.data_len.to_le_bytes());
        put(&mut b, 40, &self.cdw10.to_le_bytes());
        let cdw11 = self.key_len | (self.options as u32) << 8;
        put(&mut b, 44, &cdw11.to_le_bytes());
        put(&mut b, 48, &self.cdw12.to_le_bytes());
        put(&mut b, 56, &self.key[8..]);
        b
    }
}

fn key_of(seed: u64, i: u64) -> ([u8; 16], u32) {
    let mut k = [0u8; 16];
    k[..4].copy_from_slice(b"kvu-");
    k[4..12].copy_from_slice(&(seed ^ (i << 32) ^ i).to_be_bytes());
    (k, 12)
}

/// One 4 KiB page, page-aligned.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Page([u8; 4096]);

/// A page-aligned byte buffer, as passthrough clients use: the kernel maps a
/// command larger than one bio (256 pages) only if its buffer starts on a page
/// (a first segment at an offset is a "gap" to the next bio under the NVMe
/// virt boundary, and the command fails with EINVAL), so an unaligned 1 MiB
/// buffer works only when its pages happen to be physically contiguous.
struct Buf {
    pages: Vec<Page>,
    len: usize,
}

impl Buf {
    fn zeroed(len: usize) -> Buf {
        Buf {
            pages: vec![Page([0; 4096]); len.div_ceil(4096)],
            len,
        }
    }
    fn bytes(&self) -> impl Iterator<Item = &u8> {
        self.pages.iter().flat_map(|p| p.0.iter()).take(self.len)
    }
    fn addr(&self) -> u64 {
        self.pages.as_ptr() as u64
    }
    /// For a buffer the kernel writes into.
    fn addr_mut(&mut self) -> u64 {
        self.pages.as_mut_ptr() as u64
    }
    fn len(&self) -> usize {
        self.len
    }
    /// The whole pages: a Retrieve asks for a multiple of 4 KiB.
    fn page_bytes(&self) -> usize {
        self.pages.len() * 4096
    }
}

fn value_of(seed: u64, i: u64, len: usize) -> Buf {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_add(1);
    let mut b = Buf::zeroed(len);
    for byte in b.pages.iter_mut().flat_map(|p| p.0.iter_mut()).take(len) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *byte = x as u8;
    }
    b
}

struct Args {
    dev: String,
    nsid: u32,
    count: u64,
    qd: usize,
    sizes: Vec<usize>,
    seed: u64,
    mooncake: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        dev: String::new(),
        nsid: 0,
        count: 64,
        qd: 8,
        sizes: vec![4096, 65536, 1 << 20],
        seed: 1,
        mooncake: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| format!("{k}: needs a value"))?;
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{k}: `{v}` is not a number"))
        };
        match k.as_str() {
            "--dev" => a.dev = v,
            "--nsid" => a.nsid = num(&v)? as u32,
            "--count" => a.count = num(&v)?,
            "--qd" => a.qd = num(&v)?.clamp(1, 64) as usize,
            "--seed" => a.seed = num(&v)?,
            "--mooncake" => a.mooncake = num(&v)? != 0,
            "--sizes" => {
                a.sizes = v
                    .split(',')
                    .map(|s| num(s).map(|n| n as usize))
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.dev.is_empty() || a.nsid == 0 || a.sizes.is_empty() {
        return Err("--dev and --nsid are required".into());
    }
    Ok(a)
}

/// One command's outcome: the CQE's result (0 or the NVMe status) and DW0.
struct Done {
    res: i32,
    dw0: u64,
}

/// Runs `cmds` with up to `qd` in flight; their buffers stay alive in the caller.
fn run(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry32>,
    fd: i32,
    cmds: &[UringCmd],
    qd: usize,
) -> Result<Vec<Done>, String> {
    let mut out: Vec<Option<Done>> = (0..cmds.len()).map(|_| None).collect();
    let (mut next, mut inflight, mut done) = (0usize, 0usize, 0usize);
    while done < cmds.len() {
        while inflight < qd && next < cmds.len() {
            let e = opcode::UringCmd80::new(types::Fd(fd), NVME_URING_CMD_IO)
                .cmd(cmds[next].bytes())
                .build()
                .user_data(next as u64);
            // SAFETY: the command's buffer (addr, data_len) lives in the caller's
            // vectors until every completion below has been reaped.
            unsafe { ring.submission().push(&e) }
                .map_err(|_| "submission queue full".to_string())?;
            next += 1;
            inflight += 1;
        }
        ring.submit_and_wait(1)
            .map_err(|e| format!("io_uring_enter: {e}"))?;
        for c in ring.completion() {
            let i = c.user_data() as usize;
            if let Some(slot) = out.get_mut(i) {
                *slot = Some(Done {
                    res: c.result(),
                    dw0: c.big_cqe()[0],
                });
            }
            inflight -= 1;
            done += 1;
        }
    }
    Ok(out
        .into_iter()
        .map(|d| d.unwrap_or(Done { res: -1, dw0: 0 }))
        .collect())
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("kv-uring: {e}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<(), String> {
    let a = parse()?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&a.dev)
        .map_err(|e| format!("{}: {e}", a.dev))?;
    let fd = f.as_raw_fd();
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry32> = IoUring::builder()
        .build(64)
        .map_err(|e| format!("io_uring with SQE128/CQE32: {e}"))?;
    if a.mooncake {
        return mooncake::run_all(&mut ring, fd, &a);
    }
    let len_of = |i: u64| a.sizes[i as usize % a.sizes.len()];
    let values: Vec<Buf> = (0..a.count)
        .map(|i| value_of(a.seed, i, len_of(i)))
        .collect();
    let cmd = |opcode, i: u64, addr: u64, len: usize| {
        let (key, key_len) = key_of(a.seed, i);
        UringCmd {
            opcode,
            nsid: a.nsid,
            key,
            key_len,
            addr,
            data_len: len as u32,
            cdw10: len as u32,
            options: 0,
            cdw12: 0,
        }
    };
    let t0 = std::time::Instant::now();
    // Store every value.
    let stores: Vec<UringCmd> = (0..a.count)
        .map(|i| {
            let v = &values[i as usize];
            cmd(STORE, i, v.addr(), v.len())
        })
        .collect();
    for (i, d) in run(&mut ring, fd, &stores, a.qd)?.iter().enumerate() {
        if d.res != 0 {
            return Err(format!(
                "Store {i} ({} bytes): status {:#x}",
                values[i].len(),
                d.res
            ));
        }
    }
    let stored: usize = values.iter().map(|v| v.len()).sum();
    // Retrieve each into a buffer of whole 4 KiB blocks (at most VML, as the
    // kernel does not split passthrough): the data is the value, DW0 its size.
    let mut bufs: Vec<Buf> = values.iter().map(|v| Buf::zeroed(v.len())).collect();
    let gets: Vec<UringCmd> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| {
            let n = b.page_bytes();
            cmd(RETRIEVE, i as u64, b.addr_mut(), n)
        })
        .collect();
    for (i, d) in run(&mut ring, fd, &gets, a.qd)?.iter().enumerate() {
        if d.res != 0 {
            return Err(format!("Retrieve {i}: status {:#x}", d.res));
        }
        if d.dw0 as usize != values[i].len() {
            return Err(format!(
                "Retrieve {i}: DW0 says {} bytes, stored {}",
                d.dw0,
                values[i].len()
            ));
        }
        if !bufs[i].bytes().eq(values[i].bytes()) {
            return Err(format!(
                "Retrieve {i}: the value differs from what was stored"
            ));
        }
    }
    let mid = t0.elapsed();
    // Delete every other key; Exist then finds exactly the rest.
    let dels: Vec<UringCmd> = (0..a.count)
        .step_by(2)
        .map(|i| cmd(DELETE, i, 0, 0))
        .collect();
    for (j, d) in run(&mut ring, fd, &dels, a.qd)?.iter().enumerate() {
        if d.res != 0 {
            return Err(format!("Delete {}: status {:#x}", j * 2, d.res));
        }
    }
    let exists: Vec<UringCmd> = (0..a.count).map(|i| cmd(EXIST, i, 0, 0)).collect();
    let mut misses = 0;
    for (i, d) in run(&mut ring, fd, &exists, a.qd)?.iter().enumerate() {
        let want_miss = i % 2 == 0;
        // The status the kernel reports: SCT/SC, with DNR (bit 14) and More.
        let got_miss = d.res & 0x7ff == KEY_DOES_NOT_EXIST;
        if want_miss != got_miss || (!want_miss && d.res != 0) {
            return Err(format!(
                "Exist {i}: status {:#x}, expected {}",
                d.res,
                if want_miss {
                    "Key Does Not Exist"
                } else {
                    "success"
                }
            ));
        }
        misses += got_miss as usize;
    }
    println!(
        "kv-uring: {} values ({} bytes, sizes {:?}) stored and retrieved byte for byte at QD {} in {:.2} s, {} deleted, {} misses after",
        a.count,
        stored,
        a.sizes,
        a.qd,
        mid.as_secs_f64(),
        dels.len(),
        misses
    );
    Ok(())
}

/// Mooncake Store's NVMe-KV encoding (see the module comment), against the
/// results its backend expects.
mod mooncake {
    use super::*;

    /// Mooncake's transfer alignment and value block unit.
    const ALIGN: usize = 4096;
    const BLOCK_UNIT: usize = 512;
    /// Its default effective value limit: min(512 KiB protocol, 264 KiB runtime).
    pub const MAX_VALUE: usize = 270_336;
    /// Store option "only if the key does not exist" (insert-only).
    const STORE_IF_NOT_EXISTS: u8 = 0x2;
    const CSI_KV: u32 = 0x01;

    /// A 16-byte physical key (Mooncake hashes its object identity into one),
    /// packed as it packs it: bytes 8-10 keep their place in CDW14, whose top
    /// byte is the command set identifier, so byte 11 on the wire is 01h.
    pub fn physical_key(seed: u64, i: u64) -> [u8; 16] {
        let mut x = seed ^ 0x6d6f_6f6e_6361_6b65 ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut k = [0u8; 16];
        for half in k.chunks_mut(8) {
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^= x >> 29;
            half.copy_from_slice(&x.to_le_bytes());
        }
        let cdw14 = CSI_KV << 24 | (u32::from_le_bytes([k[8], k[9], k[10], k[11]]) & 0x00FF_FFFF);
        k[8..12].copy_from_slice(&cdw14.to_le_bytes());
        k
    }

    fn round_up(n: usize) -> usize {
        n.div_ceil(ALIGN) * ALIGN
    }

    /// CDW12: the transfer in 512-byte blocks, minus one.
    fn blocks_minus_one(transfer: usize) -> u32 {
        (transfer.div_ceil(BLOCK_UNIT).max(1) - 1) as u32
    }

    fn command(op: u8, nsid: u32, key: [u8; 16], addr: u64, transfer: usize) -> UringCmd {
        UringCmd {
            opcode: op,
            nsid,
            key,
            key_len: 16,
            addr,
            data_len: transfer as u32,
            cdw10: transfer as u32,
            options: if op == STORE { STORE_IF_NOT_EXISTS } else { 0 },
            cdw12: if op == DELETE {
                0
            } else {
                blocks_minus_one(transfer)
            },
        }
    }

    fn one(
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry32>,
        fd: i32,
        c: UringCmd,
    ) -> Result<Done, String> {
        run(ring, fd, &[c], 1)?
            .pop()
            .ok_or_else(|| "no completion".to_string())
    }

    pub fn run_all(
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry32>,
        fd: i32,
        a: &Args,
    ) -> Result<(), String> {
        // Logical sizes: aligned, unaligned (zero-padded to 4 KiB), and its limit.
        let sizes = [4096usize, 5000, 65536, 131_073, MAX_VALUE];
        let n = a.count.max(sizes.len() as u64);
        let len_of = |i: u64| sizes[i as usize % sizes.len()];
        // Values padded with zeros to the transfer size, as Mooncake submits them.
        let values: Vec<Buf> = (0..n)
            .map(|i| {
                let mut v = value_of(a.seed, i, round_up(len_of(i)));
                let len = len_of(i);
                for b in v.pages.iter_mut().flat_map(|p| p.0.iter_mut()).skip(len) {
                    *b = 0;
                }
                v
            })
            .collect();
        let key = |i: u64| physical_key(a.seed, i);
        let stores: Vec<UringCmd> = (0..n)
            .map(|i| {
                let v = &values[i as usize];
                command(STORE, a.nsid, key(i), v.addr(), v.len())
            })
            .collect();
        for (i, d) in run(ring, fd, &stores, a.qd)?.iter().enumerate() {
            if d.res != 0 {
                return Err(format!("mooncake Store {i}: status {:#x}", d.res));
            }
        }
        // Insert-only: a second Store of a key is Key Exists (its "already exists").
        let v0 = &values[0];
        let d = one(
            ring,
            fd,
            command(STORE, a.nsid, key(0), v0.addr(), v0.len()),
        )?;
        if d.res & 0xFF != SC_KEY_EXISTS {
            return Err(format!(
                "mooncake Store of a present key: status {:#x}, not Key Exists",
                d.res
            ));
        }
        // Retrieve as its backend does without a size hint: 4 KiB first; DW0 names
        // the stored size, and a larger value is read again at that size.
        let mut retried = 0;
        for i in 0..n {
            let want = &values[i as usize];
            let mut head = Buf::zeroed(ALIGN);
            let d = one(
                ring,
                fd,
                command(RETRIEVE, a.nsid, key(i), head.addr_mut(), ALIGN),
            )?;
            if d.res != 0 || d.dw0 as usize != want.len() {
                return Err(format!(
                    "mooncake Retrieve {i} (4 KiB): status {:#x}, DW0 {} (stored {})",
                    d.res,
                    d.dw0,
                    want.len()
                ));
            }
            let got = if want.len() > ALIGN {
                retried += 1;
                let mut full = Buf::zeroed(d.dw0 as usize);
                let len = full.len();
                let d = one(
                    ring,
                    fd,
                    command(RETRIEVE, a.nsid, key(i), full.addr_mut(), len),
                )?;
                if d.res != 0 || d.dw0 as usize != want.len() {
                    return Err(format!(
                        "mooncake Retrieve {i} ({len} bytes): status {:#x}, DW0 {}",
                        d.res, d.dw0
                    ));
                }
                full
            } else {
                head
            };
            if !got.bytes().eq(want.bytes()) {
                return Err(format!(
                    "mooncake Retrieve {i}: the value differs from what was stored"
                ));
            }
        }
        // A key never stored, then every key deleted: Key Does Not Exist, as its
        // backend maps to "object not found".
        let mut b = Buf::zeroed(ALIGN);
        let d = one(
            ring,
            fd,
            command(RETRIEVE, a.nsid, key(n + 1), b.addr_mut(), ALIGN),
        )?;
        if d.res & 0xFF != SC_KEY_DOES_NOT_EXIST {
            return Err(format!(
                "mooncake Retrieve of a missing key: status {:#x}",
                d.res
            ));
        }
        for i in 0..n {
            let d = one(ring, fd, command(DELETE, a.nsid, key(i), 0, 0))?;
            if d.res != 0 {
                return Err(format!("mooncake Delete {i}: status {:#x}", d.res));
            }
            let d = one(
                ring,
                fd,
                command(RETRIEVE, a.nsid, key(i), b.addr_mut(), ALIGN),
            )?;
            if d.res & 0xFF != SC_KEY_DOES_NOT_EXIST {
                return Err(format!(
                    "mooncake Retrieve {i} after Delete: status {:#x}",
                    d.res
                ));
            }
        }
        let d = one(ring, fd, command(DELETE, a.nsid, key(0), 0, 0))?;
        if d.res & 0xFF != SC_KEY_DOES_NOT_EXIST {
            return Err(format!(
                "mooncake Delete of a deleted key: status {:#x}",
                d.res
            ));
        }
        println!(
            "kv-uring --mooncake: {n} values of {sizes:?} bytes stored insert-only, a second Store refused with Key Exists, read back at 4 KiB and {retried} again at DW0's size byte for byte, missing and deleted keys Key Does Not Exist"
        );
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn keys_carry_the_csi_in_byte_11() {
            for i in 0..100 {
                let k = physical_key(3, i);
                assert_eq!(k[11], 0x01);
            }
            assert_ne!(physical_key(3, 1), physical_key(3, 2));
        }

        #[test]
        fn cdw12_counts_512_byte_blocks_minus_one() {
            assert_eq!(blocks_minus_one(4096), 7);
            assert_eq!(blocks_minus_one(round_up(5000)), 15);
            assert_eq!(blocks_minus_one(MAX_VALUE), 527);
        }
    }
}
