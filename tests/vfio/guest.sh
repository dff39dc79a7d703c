#!/usr/bin/env bash
# Runs INSIDE the QEMU guest (ci/vfio.sh starts it): tests/vfio/backend.sh once for
# each backend named in the share's `backends` file (nvme, spdk), in one boot. Each
# run starts as the first did: the kernel nvme driver owns the emulated controller,
# and namespace 2 holds no pool (its first MiB zeroed), so the next backend formats
# its own. Exit status 0 only when every run passed.
set -uo pipefail
S=/mnt/share
PCI=0000:00:10.0
rc=0 n=0
driver() { basename "$(readlink "/sys/bus/pci/devices/$PCI/driver" 2>/dev/null)" 2>/dev/null; }
for backend in $(cat $S/backends); do
    n=$((n + 1))
    if [ "$n" -gt 1 ]; then
        # A run that stopped early may have left the controller on vfio-pci.
        if [ "$(driver)" != nvme ]; then
            "$S/nvme/kvtarget" nvme unbind "$PCI" || echo "# could not hand $PCI back to the kernel"
        fi
        dev=
        for _ in $(seq 100); do
            for c in /sys/bus/pci/devices/$PCI/nvme/nvme*; do
                [ -e "$c" ] && dev=/dev/$(basename "$c")n2
            done
            [ -n "$dev" ] && [ -b "$dev" ] && break
            sleep 0.1
        done
        if [ -b "$dev" ]; then
            dd if=/dev/zero of="$dev" bs=1M count=1 oflag=direct conv=fsync status=none \
                && echo "# namespace 2 ($dev) wiped for the $backend run"
        else
            echo "# no namespace 2 block device before the $backend run"
        fi
    fi
    echo "# ==== vfio: the $backend backend ===="
    bash "$S/backend.sh" "$backend" || rc=1
done
exit $rc
