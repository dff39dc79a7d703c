//! kv-uring: stores, retrieves, checks and deletes values in a KV namespace
//! through the Linux generic NVMe char device (/dev/ngXnY) with io_uring NVMe
//! passthrough (IORING_OP_URING_CMD, 128-byte SQEs, 32-byte CQEs: the path
//! Mooncake Store's NVMe-KV backend takes). Verifies every byte and the value
//! size the controller returns in DW0, with several commands in flight.
//!
//! Usage: kv-uring --dev /dev/ng0n2 --nsid 2 [--count N] [--qd Q] [--sizes A,B,..] [--seed S]
//! Prints one summary line; exits 1 on the first mismatch or failed command.

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::os::fd::AsRawFd;

/// `_IOWR('N', 0x80, struct nvme_uring_cmd)`: NVME_URING_CMD_IO.
const NVME_URING_CMD_IO: u32 = 0xC048_4E80;

const STORE: u8 = 0x01;
const RETRIEVE: u8 = 0x02;
const DELETE: u8 = 0x10;
const EXIST: u8 = 0x14;
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
        put(&mut b, 44, &self.key_len.to_le_bytes());
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
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        dev: String::new(),
        nsid: 0,
        count: 64,
        qd: 8,
        sizes: vec![4096, 65536, 1 << 20],
        seed: 1,
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
