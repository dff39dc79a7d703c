#!/usr/bin/env python3
"""A TCP proxy that records what hosts send: listen on LISTEN_PORT, forward to
TARGET_PORT on 127.0.0.1, and write each connection's host-to-target bytes to
OUT_DIR/conn-N.bin. Runs until killed.

    record_proxy.py LISTEN_PORT TARGET_PORT OUT_DIR
"""
import os
import socket
import sys
import threading

listen_port, target_port, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.makedirs(out_dir, exist_ok=True)
counter = [0]
lock = threading.Lock()


def pump(src, dst, record):
    try:
        while True:
            b = src.recv(65536)
            if not b:
                break
            if record is not None:
                record.write(b)
                record.flush()
            dst.sendall(b)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(host_sock):
    with lock:
        counter[0] += 1
        n = counter[0]
    target = socket.create_connection(("127.0.0.1", target_port))
    for s in (host_sock, target):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    record = open(os.path.join(out_dir, f"conn-{n:03}.bin"), "wb")
    t = threading.Thread(target=pump, args=(target, host_sock, None), daemon=True)
    t.start()
    pump(host_sock, target, record)
    t.join()
    record.close()


ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", listen_port))
ls.listen(64)
while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
