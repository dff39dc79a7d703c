#!/usr/bin/env python3
"""Turns recordings and pool images into fuzz inputs (see make-corpus.sh).

    corpus.py pdus CAPTURE_DIR MODE_BYTE OUT_ROOT   split streams into PDUs
    corpus.py pool IMAGE NAME OUT_ROOT              a pool image's seeds
    corpus.py kv OUT_ROOT                           KV command set commands

Inputs are named by content hash, so rerunning adds nothing twice. Per kind
(PDU type and opcode), only a few distinct inputs are kept: the corpus stays
small and AFL's mutations do the rest.
"""
import hashlib
import os
import struct
import sys

KEEP_PER_KIND = 4
# Longest PDU kept as a seed: bigger data adds bytes, not paths.
MAX_SEED_PDU = 20 << 10
BLOCK = 4096


def put(root, target, data, kinds=None, kind=None):
    if kinds is not None:
        kinds[kind] = kinds.get(kind, 0) + 1
        if kinds[kind] > KEEP_PER_KIND:
            return
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def kv_sqe(opc, key, cdw10, kl=None, options=0, nsid=1, cid=1):
    """A KV command set SQE: key bytes 7:0 in CDW2-3, 15:8 in CDW14-15."""
    kl = len(key) if kl is None else kl
    k = key.ljust(16, b"\0")
    sqe = bytearray(64)
    sqe[0] = opc
    sqe[1] = 0x40  # PSDT: SGLs
    struct.pack_into("<HI", sqe, 2, cid, nsid)
    sqe[8:16] = k[:8]
    sqe[56:64] = k[8:]
    struct.pack_into("<II", sqe, 40, cdw10, kl | options << 8)
    return bytes(sqe)


def kv(root):
    """Seeds for the KV decoder (there is no KV traffic to record yet): each
    command with a good key, the edge key lengths, store options, and a List
    response as its capsule data."""
    key = bytes(range(1, 17))
    seeds = [
        kv_sqe(0x01, key, 4096, options=0b010),  # Store, must not exist
        kv_sqe(0x01, key[:3], 0, options=0b101),  # empty value, must exist
        kv_sqe(0x01, key, 4096, options=0b011),  # conflicting options
        kv_sqe(0x02, key, 1 << 20, options=1),  # Retrieve raw
        kv_sqe(0x02, key, 0),  # size query
        kv_sqe(0x10, key[:8], 0),  # Delete
        kv_sqe(0x14, key, 0, kl=17),  # Exist, key too long
        kv_sqe(0x14, key, 0, kl=0),  # Exist, no key
        kv_sqe(0x00, b"", 0),  # Flush
    ]
    listing = struct.pack("<I", 2)
    for k in (b"ab", key):
        e = struct.pack("<H", len(k)) + k
        listing += e + b"\0" * (-len(e) % 4)
    seeds.append(kv_sqe(0x06, b"", len(listing)) + listing)  # List from the start
    for s in seeds:
        put(root, "nvme_command", s)


def split_pdus(stream):
    """Yields (type, pdu bytes) using the common header's PLEN."""
    off = 0
    while off + 8 <= len(stream):
        plen = struct.unpack_from("<I", stream, off + 4)[0]
        if plen < 8 or off + plen > len(stream):
            return
        yield stream[off], stream[off:off + plen]
        off += plen


def pdus(cap_dir, mode, root):
    kinds = {}
    for name in sorted(os.listdir(cap_dir)):
        stream = open(os.path.join(cap_dir, name), "rb").read()
        seq = []
        for t, p in split_pdus(stream):
            if len(p) > MAX_SEED_PDU:
                continue
            opc = p[8] if t == 4 and len(p) > 8 else 0
            fct = p[12] if t == 4 and opc == 0x7F else 0
            put(root, "pdu", bytes([mode]) + p, kinds, ("pdu", mode, t, opc, fct))
            seq.append(p)
            if t == 4 and len(p) >= 72:
                # The SQE and its in-capsule data (PDO in byte 3) for the NVMe
                # command target; the descriptor bytes for the RDMA one.
                pdo = p[3] or len(p)
                sqe, data = p[8:72], p[pdo:]
                put(root, "nvme_command", sqe + data, kinds, ("cmd", opc, fct, len(data) > 0))
                put(root, "rdma", bytes([2]) + sqe[24:40], kinds, ("sgl", sqe[39]))
        # A connection's opening (ICReq, Connect, the first commands) as one
        # stream: the harness parses up to 64 PDUs in a row.
        if seq:
            put(root, "pdu", bytes([mode]) + b"".join(seq[:8]), kinds, ("stream", mode, len(seq) > 8))


def pool(image, name, root):
    img = open(image, "rb").read()
    # pool_check: the sparse form fuzz/src/image.rs reads, with and without
    # the checksum fix-up flag.
    blocks = min((len(img) + BLOCK - 1) // BLOCK, 16 << 10)
    # Metadata only: extents' data is not parsed, and keeps the corpus small.
    data_off = struct.unpack_from("<Q", img, 80)[0] if len(img) >= 88 else len(img)
    meta_blocks = min(blocks, data_off // BLOCK)
    for flags in (0, 1):
        out = bytearray([flags]) + struct.pack("<H", blocks)
        i = 0
        while i < meta_blocks:
            if not any(img[i * BLOCK:(i + 1) * BLOCK]):
                i += 1
                continue
            start = i
            while i < meta_blocks and any(img[i * BLOCK:(i + 1) * BLOCK]) and i - start < 15:
                i += 1
            run = img[start * BLOCK:i * BLOCK].rstrip(b"\0")
            out += struct.pack("<IH", start * BLOCK, len(run)) + run
        put(root, "pool_check", bytes(out))
    # pool_format: the superblock, checkpoint block and payload, journal payloads.
    sb = img[:BLOCK]
    put(root, "pool_format", bytes([0]) + sb)
    ckpt_off, slot_len, j_off, j_len = struct.unpack_from("<QQQQ", sb, 8 + 4 + 16 + 8 + 8 + 4)
    for slot in range(2):
        off = ckpt_off + slot * slot_len
        h = img[off:off + 64]
        if h[:8] != b"KVTCKPT\0":
            continue
        plen = struct.unpack_from("<Q", h, 32)[0]
        put(root, "pool_format", bytes([1]) + img[off:off + 64 + plen])
        put(root, "pool_format", bytes([2]) + img[off + 64:off + 64 + plen])
    pos = 0
    while pos + BLOCK <= j_len:
        h = img[j_off + pos:j_off + pos + 64]
        if h[:8] != b"KVTJRNL\0":
            break
        plen = struct.unpack_from("<Q", h, 32)[0]
        put(root, "pool_format", bytes([3]) + img[j_off + pos + 64:j_off + pos + 64 + plen])
        if pos == 0:
            put(root, "pool_format", bytes([5]) + img[j_off:j_off + 64 + plen])
        pos += (64 + plen + BLOCK - 1) // BLOCK * BLOCK


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "pdus":
        pdus(sys.argv[2], int(sys.argv[3], 0), sys.argv[4])
    elif cmd == "pool":
        pool(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "kv":
        kv(sys.argv[2])
    else:
        sys.exit(__doc__)
