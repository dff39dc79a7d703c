#!/usr/bin/env python3
"""Holds dpkg's and apt's locks for SECONDS (default 60), as another package manager
would (apt-get, unattended-upgrades): for testing that ci/deps.sh waits instead of
failing. Usage: ci/selftest/hold-apt-locks.py [SECONDS]"""
import fcntl
import sys
import time

LOCKS = ["/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock",
         "/var/lib/apt/lists/lock", "/var/cache/apt/archives/lock"]
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 60
held = []
for path in LOCKS:
    f = open(path, "a")
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # apt and dpkg take fcntl locks
    held.append(f)
print(f"holding {', '.join(LOCKS)} for {secs:.0f} s", flush=True)
time.sleep(secs)
