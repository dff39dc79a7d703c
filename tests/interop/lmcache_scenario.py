#!/usr/bin/env python3
"""LMCache's raw-block storage layout, driven through LMCache's own I/O helper.

Issue 19's client in the interop guest. The I/O goes through the pinned
`lmcache_rust_raw_block_io` wheel (`RawBlockDevice`: posix pread/pwrite,
io_uring, or NVMe passthrough on /dev/ngXnY with `use_uring_cmd`), with the
layout LMCache's raw-block backend puts on a device:

- a metadata region first, split in two alternating checkpoint containers, each
  a 4 KiB header (`LMCIDX01`, version, sequence, JSON length, CRC32 of the JSON,
  as LMCache's RawBlockCore writes it) and the JSON index after it, written
  together in one batch; the newest whose CRC checks out is loaded;
- then fixed slots of round_up(4096 + chunk, 4096) bytes: a 4 KiB header
  (`LMCBLK01`, key id, payload length) at the slot start, the payload at
  slot + 4 KiB, zero-padded to 4 KiB;
- no discard, no flush, no fsync: an evicted slot is simply overwritten.

Payloads are Llama-8B-shaped chunks (32 MiB by default) whose every 4 KiB block
carries a stamp (key id, generation, block index) over a shared random body, so
a misplaced, stale or torn block is named exactly.

Commands (each prints `# ...` progress and exits 0 on success, 1 on a failed
check, 2 on bad usage):

  store     store keys [first, first+count) of generation G into slots, write
            the checkpoint (the index of everything stored so far)
  verify    load the newest valid checkpoint, check each indexed slot's header,
            retrieve every payload and compare (the restart path: LMCache reads
            both checkpoint headers and one header per indexed slot)
  probe     on an `unwritten = "error"` volume: a never-written slot and a torn
            chunk (header and half the payload written) must fail to read
            (a miss), never read back as data
  recover   after a target crash: load the newest valid checkpoint and sort each
            indexed key as LMCache's recovery and load would (intact; dropped: its
            slot header fails to read or names another key; miss: its payload
            fails to read); fails on any false hit (a readable payload with other
            data) and on any --must-keys key that is not intact. Prints one
            `recover: ...` summary line.
"""

import argparse
import concurrent.futures
import errno
import json
import mmap
import random
import struct
import sys
import time
import zlib

from lmcache_rust_raw_block_io import RawBlockDevice

BLOCK = 4096
SLOT_MAGIC = b"LMCBLK01"
# LMCache's checkpoint header (RawBlockCore): magic, version, sequence, payload
# length, CRC32 of the JSON payload; one block at the start of each of two
# containers that split the metadata region in halves, the payload after it.
META_HEADER = struct.Struct("<8sIQQI")
META_MAGIC = b"LMCIDX01"
META_VERSION = 1
STAMP = struct.Struct("<QQQ")  # key id, generation, block index


def usage(msg):
    """Bad arguments for this device: exit 2, as argparse does."""
    print(f"lmcache-scenario: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def log(msg):
    print(f"# {msg}", flush=True)


class Check(Exception):
    pass


def round_up(n, a):
    return (n + a - 1) // a * a


def aligned(n):
    """An anonymous mapping: page aligned, so O_DIRECT I/O needs no bounce."""
    return mmap.mmap(-1, round_up(max(n, 1), BLOCK))


class Layout:
    def __init__(self, size, meta, chunk):
        self.meta = meta
        self.chunk = chunk
        self.slot_bytes = round_up(BLOCK + chunk, BLOCK)
        self.slots = (size - meta) // self.slot_bytes
        self.container = meta // 2 // BLOCK * BLOCK
        if self.container <= BLOCK:
            usage("--meta-mib: too small for two checkpoint containers")
        if self.slots < 3:
            usage(f"device of {size} bytes holds {self.slots} slots of {self.slot_bytes}: need 3")

    def slot_off(self, slot):
        return self.meta + slot * self.slot_bytes


_BODY = None


def payload(key, gen, chunk):
    """The chunk for (key, gen): a shared random body, every block stamped."""
    global _BODY
    if _BODY is None or len(_BODY) != chunk:
        _BODY = random.Random(19).randbytes(chunk)
    buf = aligned(chunk)
    buf[:chunk] = _BODY
    for b in range(chunk // BLOCK):
        STAMP.pack_into(buf, b * BLOCK, key, gen, b)
    return buf


def first_difference(got, want, n):
    for b in range(0, n, BLOCK):
        if got[b:b + BLOCK] != want[b:b + BLOCK]:
            k, g, i = STAMP.unpack_from(got, b)
            zero = got[b:b + BLOCK].count(0) == BLOCK
            return f"block {b // BLOCK}: {'zeroes' if zero else f'stamp key {k} gen {g} block {i}'}"
    return "no difference"


def slot_header(key, length):
    h = aligned(BLOCK)
    h[:24] = SLOT_MAGIC + struct.pack("<QQ", key, length)
    return h


def read_slot_header(dev, lay, slot):
    """A slot's 4 KiB header as (magic, key id, payload length); OSError if it does not read."""
    h = aligned(BLOCK)
    read_at(dev, lay.slot_off(slot), h, BLOCK)
    return bytes(h[:8]), *struct.unpack_from("<QQ", h, 8)


def open_dev(a):
    kw = dict(use_odirect=a.odirect, alignment=BLOCK)
    if a.engine == "io_uring":
        kw.update(io_engine="io_uring", iouring_queue_depth=256)
        if a.uring_cmd:
            kw.update(use_uring_cmd=True)
    return RawBlockDevice(a.dev, True, **kw)


def wait_batch(dev, bid, what, n):
    res = dev.wait_iouring(bid)
    # (success bitmap, [(operation index, message)])
    ok, errors = res if isinstance(res, tuple) else (res, [])
    bad = [i for i in range(n) if not (ok[i] if isinstance(ok, (list, tuple)) else (ok >> i) & 1)]
    if bad or errors:
        raise OSError(errno.EIO, f"{what}: operations {bad} failed: {errors}")


# Single transfers: pread/pwrite on the posix engine, a one-operation batch on
# io_uring (the only way with NVMe passthrough, where the char device has no pread).
IO_URING = False
# NVMe passthrough hands each operation to the controller as one command, so one
# larger than the device's MDTS is refused by the kernel (EINVAL). 0.5.7rc2 does not
# split (later helpers take `max_data_transfer_size`); the scenario splits, as those do.
SPLIT = 0


def pieces(offs, bufs, lens):
    if not SPLIT:
        return offs, bufs, lens
    po, pb, pl = [], [], []
    for off, buf, n in zip(offs, bufs, lens):
        view = memoryview(buf)
        for at in range(0, n, SPLIT):
            m = min(SPLIT, n - at)
            po.append(off + at)
            pb.append(view[at:at + m])
            pl.append(m)
    return po, pb, pl


def batch(dev, write, offs, bufs, lens, what):
    po, pb, pl = pieces(offs, bufs, lens)
    bid = (dev.batched_write if write else dev.batched_read)(po, pb, pl)
    wait_batch(dev, bid, what, len(po))


def read_at(dev, off, buf, n):
    if IO_URING:
        batch(dev, False, [off], [buf], [n], f"read of {n} at {off}")
    else:
        dev.pread_into(off, buf, n, n)


def write_at(dev, off, buf, n):
    if IO_URING:
        batch(dev, True, [off], [buf], [n], f"write of {n} at {off}")
    else:
        dev.pwrite_from_buffer(off, buf, n, n)


# --- checkpoint ------------------------------------------------------------------


def read_checkpoint(dev, lay):
    """The newest container whose header and payload CRC check out, or None.

    As LMCache's RawBlockCore loads it: a header that fails to read or does not
    parse means no checkpoint there (a fresh `unwritten = "error"` volume fails
    the read with ENODATA); a payload whose CRC32 differs is torn and ignored.
    """
    best = None
    for c in (0, 1):
        at = c * lay.container
        h = aligned(BLOCK)
        try:
            read_at(dev, at, h, BLOCK)
        except OSError as e:
            log(f"checkpoint container {c}: header unreadable, none there ({e})")
            continue
        magic, version, seq, n, crc = META_HEADER.unpack_from(h, 0)
        if magic != META_MAGIC or version != META_VERSION:
            log(f"checkpoint container {c}: no checkpoint")
            continue
        if n == 0 or n > lay.container - BLOCK:
            log(f"checkpoint container {c}: sequence {seq}: bad length {n}")
            continue
        body = aligned(n)
        try:
            read_at(dev, at + BLOCK, body, round_up(n, BLOCK))
        except OSError as e:
            log(f"checkpoint container {c}: sequence {seq}: payload unreadable ({e}), ignored")
            continue
        js = bytes(body[:n])
        if zlib.crc32(js) & 0xFFFFFFFF != crc:
            log(f"checkpoint container {c}: sequence {seq}: torn (CRC mismatch), ignored")
            continue
        log(f"checkpoint container {c}: sequence {seq}, {n} bytes")
        if best is None or seq > best[0]:
            best = (seq, json.loads(js))
    return best


def write_checkpoint(dev, lay, seq, index):
    """Sequence `seq` into container (seq - 1) % 2: payload and header in one batch."""
    js = json.dumps({"version": 1, "entries": index}, sort_keys=True).encode()
    if len(js) > lay.container - BLOCK:
        raise Check(f"index of {len(index)} keys does not fit a checkpoint container")
    payload = aligned(len(js))
    payload[:len(js)] = js
    header = aligned(BLOCK)
    header[:META_HEADER.size] = META_HEADER.pack(
        META_MAGIC, META_VERSION, seq, len(js), zlib.crc32(js) & 0xFFFFFFFF
    )
    at = ((seq - 1) % 2) * lay.container
    total = round_up(len(js), BLOCK)
    if IO_URING:
        batch(dev, True, [at + BLOCK, at], [payload, header], [total, BLOCK], "checkpoint")
    else:
        write_at(dev, at + BLOCK, payload, total)
        write_at(dev, at, header, BLOCK)
    log(f"checkpoint sequence {seq} ({len(index)} keys) into container {(seq - 1) % 2}")


# --- commands ----------------------------------------------------------------------


def cmd_store(a, dev, lay):
    ck = read_checkpoint(dev, lay)
    index = ck[1]["entries"] if ck else {}
    seq = (ck[0] + 1) if ck else 1
    by_slot = {v["slot"]: k for k, v in index.items()}
    keys = list(range(a.first, a.first + a.count))
    slots = [a.slot + i for i in range(a.count)]
    if slots[-1] >= lay.slots:
        usage(f"--slot/--count: slots up to {slots[-1]}, the device has {lay.slots}")
    for s in slots:  # eviction: the slot's old key leaves the index, its data is overwritten
        if s in by_slot:
            old = by_slot[s]
            log(f"evict key {old} from slot {s}")
            del index[old]
    t0 = time.monotonic()
    bufs = [(k, s, payload(k, a.gen, lay.chunk)) for k, s in zip(keys, slots)]
    if a.engine == "io_uring":
        # LMCache's batch: per key a header write and a payload write, all in one batch.
        offs, data, lens = [], [], []
        for k, s, p in bufs:
            offs += [lay.slot_off(s), lay.slot_off(s) + BLOCK]
            data += [slot_header(k, lay.chunk), p]
            lens += [BLOCK, round_up(lay.chunk, BLOCK)]
        batch(dev, True, offs, data, lens, "store batch")
    else:
        # posix: synchronous pwrites from LMCache's two store workers.
        def one(item):
            k, s, p = item
            dev.pwrite_from_buffer(lay.slot_off(s), slot_header(k, lay.chunk), BLOCK, BLOCK)
            dev.pwrite_from_buffer(lay.slot_off(s) + BLOCK, p, lay.chunk, round_up(lay.chunk, BLOCK))

        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            list(ex.map(one, bufs))
    dt = time.monotonic() - t0
    mib = len(bufs) * lay.chunk / (1 << 20)
    log(f"stored keys {keys} (generation {a.gen}) into slots {slots}: {mib:.0f} MiB in {dt:.2f} s")
    for k, s, _ in bufs:
        index[str(k)] = {"slot": s, "length": lay.chunk, "gen": a.gen}
    write_checkpoint(dev, lay, seq, index)


def cmd_verify(a, dev, lay):
    ck = read_checkpoint(dev, lay)
    if ck is None:
        raise Check("no valid checkpoint on the device")
    seq, body = ck
    index = {int(k): v for k, v in body["entries"].items()}
    if a.expect_keys is not None:
        want = sorted(int(x) for x in a.expect_keys.split(",") if x)
        if sorted(index) != want:
            raise Check(f"checkpoint {seq} indexes keys {sorted(index)}, expected {want}")
    # Restart recovery: one header per indexed slot.
    for k, v in sorted(index.items()):
        magic, key, length = read_slot_header(dev, lay, v["slot"])
        if magic != SLOT_MAGIC or key != k or length != v["length"]:
            raise Check(f"slot {v['slot']}: header {magic!r} key {key} length {length}, index says key {k} length {v['length']}")
    t0 = time.monotonic()
    items = sorted(index.items())
    n = round_up(lay.chunk, BLOCK)
    if a.engine == "io_uring":
        outs = [aligned(n) for _ in items]
        offs = [lay.slot_off(v["slot"]) + BLOCK for _, v in items]
        batch(dev, False, offs, outs, [n] * len(items), "retrieve batch")
        got = list(zip(items, outs))
    else:
        def one(item):
            out = aligned(n)
            dev.pread_into(lay.slot_off(item[1]["slot"]) + BLOCK, out, lay.chunk, n)
            return item, out

        with concurrent.futures.ThreadPoolExecutor(4) as ex:  # LMCache's four load workers
            got = list(ex.map(one, items))
    dt = time.monotonic() - t0
    for (k, v), out in got:
        want = payload(k, v["gen"], lay.chunk)
        if out[:lay.chunk] != want[:lay.chunk]:
            raise Check(f"key {k} (slot {v['slot']}): payload differs at {first_difference(out, want, lay.chunk)}")
    log(f"checkpoint {seq}: {len(items)} chunks verified ({len(items) * lay.chunk >> 20} MiB read in {dt:.2f} s)")


def expect_miss(dev, off, n, what):
    out = aligned(n)
    try:
        read_at(dev, off, out, n)
    except OSError as e:
        log(f"{what}: read failed as a miss ({e})")
        return
    zero = out[:n].count(0) == n
    raise Check(f"{what}: read succeeded ({'all zeroes' if zero else 'data'}), expected a failed read")


def cmd_probe(a, dev, lay):
    s = a.slot
    if s >= lay.slots:
        usage(f"--slot: {s}, the device has {lay.slots} slots")
    expect_miss(dev, lay.slot_off(s), BLOCK, f"never-written slot {s} header")
    # A torn chunk: the header and the first half of the payload reached the device,
    # the rest never did. On an unwritten = "error" volume its retrieve fails.
    half = round_up(lay.chunk // 2, BLOCK)
    p = payload(9999, 0, lay.chunk)
    write_at(dev, lay.slot_off(s), slot_header(9999, lay.chunk), BLOCK)
    write_at(dev, lay.slot_off(s) + BLOCK, p, half)
    expect_miss(dev, lay.slot_off(s) + BLOCK, round_up(lay.chunk, BLOCK), f"torn chunk in slot {s}")
    out = aligned(half)
    read_at(dev, lay.slot_off(s) + BLOCK, out, half)
    if out[:half] != p[:half]:
        raise Check(f"torn chunk in slot {s}: its written half differs at {first_difference(out, p, half)}")
    log(f"torn chunk in slot {s}: the written half reads back, the whole fails")


def cmd_recover(a, dev, lay):
    ck = read_checkpoint(dev, lay)
    if ck is None:
        raise Check("no valid checkpoint on the device")
    seq, body = ck
    index = {int(k): v for k, v in body["entries"].items()}
    must = {int(x) for x in (a.must_keys or "").split(",") if x}
    if not must <= set(index):
        raise Check(f"checkpoint {seq} indexes keys {sorted(index)}, not all of {sorted(must)}")
    n = round_up(lay.chunk, BLOCK)
    sorts = {"intact": [], "dropped": [], "miss": [], "false hit": []}
    why = {}
    for k, v in sorted(index.items()):
        try:
            magic, key, length = read_slot_header(dev, lay, v["slot"])
        except OSError as e:
            sorts["dropped"].append(k)
            why[k] = f"slot {v['slot']} header unreadable ({e.strerror or e})"
            continue
        if magic != SLOT_MAGIC or key != k or length != v["length"]:
            sorts["dropped"].append(k)
            why[k] = f"slot {v['slot']} header names key {key if magic == SLOT_MAGIC else '(none)'}"
            continue
        out = aligned(n)
        try:
            read_at(dev, lay.slot_off(v["slot"]) + BLOCK, out, n)
        except OSError as e:
            sorts["miss"].append(k)
            why[k] = f"slot {v['slot']} payload unreadable ({e.strerror or e})"
            continue
        want = payload(k, v["gen"], lay.chunk)
        if out[:lay.chunk] == want[:lay.chunk]:
            sorts["intact"].append(k)
        else:
            sorts["false hit"].append(k)
            why[k] = f"slot {v['slot']} payload differs at {first_difference(out, want, lay.chunk)}"
    for k in sorted(why):
        log(f"key {k}: {why[k]}")
    print("recover: checkpoint %d: %s" % (
        seq, ", ".join(f"{name} {len(ks)}{' ' + str(ks) if ks else ''}" for name, ks in sorts.items())), flush=True)
    if sorts["false hit"]:
        raise Check(f"keys {sorts['false hit']} read back other data than stored: LMCache would load them as hits")
    lost = sorted(must - set(sorts["intact"]))
    if lost:
        raise Check(f"keys {lost} were to survive the crash and did not: {'; '.join(why[k] for k in lost)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["store", "verify", "probe", "recover"])
    ap.add_argument("--dev", required=True, help="/dev/nvmeXnY, or /dev/ngXnY with --uring-cmd")
    ap.add_argument("--engine", choices=["posix", "io_uring"], default="io_uring")
    ap.add_argument("--uring-cmd", action="store_true", help="NVMe passthrough (io_uring only)")
    ap.add_argument("--odirect", action="store_true")
    ap.add_argument("--split-kib", type=int, default=0,
                    help="--uring-cmd: largest command (the device's MDTS, max_hw_sectors_kb)")
    ap.add_argument("--meta-mib", type=int, default=128)
    ap.add_argument("--chunk-mib", type=int, default=32)
    ap.add_argument("--first", type=int, default=0, help="store: first key id")
    ap.add_argument("--count", type=int, default=1, help="store: keys")
    ap.add_argument("--slot", type=int, default=0, help="store: first slot; probe: the slot")
    ap.add_argument("--gen", type=int, default=0, help="store: payload generation")
    ap.add_argument("--expect-keys", help="verify: the keys the checkpoint must index (comma list)")
    ap.add_argument("--must-keys", help="recover: keys that must come back intact (comma list)")
    a = ap.parse_args()
    if a.uring_cmd and a.engine != "io_uring":
        usage("--uring-cmd needs --engine io_uring")
    global IO_URING, SPLIT
    IO_URING = a.engine == "io_uring"
    SPLIT = (a.split_kib << 10) if a.uring_cmd else 0
    dev = open_dev(a)
    size = dev.size_bytes()
    lay = Layout(size, a.meta_mib << 20, a.chunk_mib << 20)
    mode = f"{a.engine}{f' uring_cmd, split at {a.split_kib} KiB' if a.uring_cmd else ''}{' O_DIRECT' if a.odirect else ''}"
    log(f"{a.command} on {a.dev} ({mode}): {size >> 20} MiB, metadata {a.meta_mib} MiB, {lay.slots} slots of {lay.slot_bytes} bytes")
    try:
        {"store": cmd_store, "verify": cmd_verify, "probe": cmd_probe, "recover": cmd_recover}[a.command](a, dev, lay)
    except Check as e:
        print(f"lmcache-scenario: {a.command}: {e}", file=sys.stderr, flush=True)
        return 1
    except OSError as e:
        print(f"lmcache-scenario: {a.command}: I/O error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        dev.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
