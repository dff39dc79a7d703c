#!/usr/bin/env bash
# Runs INSIDE the QEMU guest (ci/vfio-bench.sh starts it): target CPU instructions
# per I/O for the ram, uring and nvme backends, same workload, same kvtarget run;
# then, when the share has an SPDK-linked kvtarget, the spdk backend (SPDK's PCIe
# driver) on the same controller in a second run with the same workload.
#
# kvtarget (one reactor) runs under callgrind and serves three namespaces: 1 = ram,
# 2 = uring (a file on the guest's tmpfs: page cache, no O_DIRECT), 3 = nvme (the
# emulated PCIe controller through VFIO). For each namespace: zero callgrind's
# counters (vgdb), run the same fio job from the guest kernel's NVMe/TCP host over
# loopback, dump the counters; instructions per I/O = Ir / (reads + writes). The
# counts include everything the target process executes in that window (TCP,
# target, device, reactor polling); under TCG only the instruction counts mean
# anything, not the times. Callgrind counts user-space instructions only: work the
# kernel does for a backend (io_uring, page-cache copies; for nvme nothing, the
# device does it) is not in these numbers, and a polled backend's spinning while the
# (slow, emulated) device works is.
set -uo pipefail
S=/mnt/share
K=$S/kvtarget
export LD_LIBRARY_PATH=$S/lib VALGRIND_LIB=$S/valgrind/lib
VG=$S/valgrind/valgrind VGDB=$S/valgrind/vgdb
PCI=0000:00:10.0
NQN=nqn.2026-11.io.kvtarget:bench
W=/tmp/bench
IOS=${BENCH_IOS:-4000}
mkdir -p $W
echo never > /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || true
die() { echo "bench: $*"; tail -n 20 $W/kvtarget.log 2>/dev/null; exit 1; }

"$K" nvme bind $PCI > /dev/null || die "bind"
cat > $W/kvt.toml <<EOT
[reactors]
count = 1
idle = "adaptive"
[rpc]
enabled = false
[[listeners]]
address = "127.0.0.1"
port = 4420
[[subsystems]]
nqn = "$NQN"
allow_any_host = true
[[subsystems.namespaces]]
nsid = 1
backend = "ram"
size = "64MiB"
block_size = 512
[[subsystems.namespaces]]
nsid = 2
backend = "uring"
path = "$W/uring.img"
size = "64MiB"
block_size = 512
[[subsystems.namespaces]]
nsid = 3
backend = "nvme"
pci = "$PCI"
nvme_nsid = 1
EOT
cd $W
"$VG" --tool=callgrind --callgrind-out-file=$W/cg.out --vgdb=yes --vgdb-prefix=$W/vgdb \
    "$K" --config $W/kvt.toml > $W/kvtarget.log 2>&1 &
vg_pid=$!
n=0
until grep -q "listening on 127.0.0.1:4420" $W/kvtarget.log; do
    kill -0 $vg_pid 2>/dev/null || die "kvtarget under callgrind exited"
    [ $n -lt 1800 ] || die "kvtarget did not start"
    sleep 0.1; n=$((n + 1))
done
nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" > /dev/null || die "connect"
dev=
for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/transport" 2>/dev/null)" = tcp ] && dev=/dev/$(basename "$c")
done
for i in 1 2 3; do n=0; while [ ! -b ${dev}n$i ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done; done

echo "# instructions per I/O: fio randrw 50/50 4k, iodepth 8, $IOS I/Os, libaio O_DIRECT, one reactor"
printf '# %-6s %14s %8s %12s\n' backend Ir ios Ir/io
# measure NAME DEVICE VGDB_PREFIX PROFILE: fill, warm up, zero callgrind's
# counters, run the fio job, dump them into PROFILE, print the row.
measure() {
    local name=$1 d=$2 prefix=$3 f=$4 ir ios
    # Not measured: data first, so reads read something on every backend, and a
    # warm-up run so one-time costs (channel open, buffer pools filling) stay out.
    dd if=/dev/urandom of=$d bs=1M count=32 oflag=direct status=none
    fio --name=w --filename=$d --direct=1 --ioengine=libaio --rw=randrw \
        --bs=4k --iodepth=8 --size=32M --number_ios=512 > /dev/null 2>&1 || die "warm-up on $name"
    "$VGDB" --vgdb-prefix=$prefix --pid=$vg_pid zero > /dev/null 2>&1 || die "vgdb zero"
    fio --name=b --filename=$d --direct=1 --ioengine=libaio --rw=randrw --rwmixread=50 \
        --bs=4k --iodepth=8 --size=32M --number_ios=$IOS --norandommap --randrepeat=1 \
        --output-format=json --output=$W/fio-$name.json > /dev/null 2>&1 || die "fio on $name"
    "$VGDB" --vgdb-prefix=$prefix --pid=$vg_pid dump > /dev/null 2>&1 || die "vgdb dump"
    ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$f")
    ios=$(sed -n '/^{/,$p' $W/fio-$name.json | jq '.jobs[0].read.total_ios + .jobs[0].write.total_ios')
    printf '  %-6s %14s %8s %12s\n' $name "$ir" "$ios" $((ir / ios))
}
dumps=0
for pair in 1:ram 2:uring 3:nvme; do
    ns=${pair%%:*} name=${pair#*:}
    dumps=$((dumps + 1))
    measure $name ${dev}n$ns $W/vgdb $W/cg.out.$dumps
done
nvme disconnect -n "$NQN" > /dev/null
kill -TERM $vg_pid; wait $vg_pid

# The `spdk` backend on the same controller (SPDK's PCIe driver), when the share has
# an SPDK-linked kvtarget: a second kvtarget run under callgrind, same fio job.
KS=$S/kvtarget-spdk
if [ -x "$KS" ]; then
    mkdir -p /var/run /var/tmp
    : > $W/openssl.cnf
    cat > $W/kvt-spdk.toml <<EOT
[reactors]
count = 1
idle = "adaptive"
[rpc]
enabled = false
[spdk]
no_huge = true
mem_size = "256MiB"
[[listeners]]
address = "127.0.0.1"
port = 4420
[[subsystems]]
nqn = "$NQN"
allow_any_host = true
[[subsystems.namespaces]]
nsid = 1
backend = "spdk"
trid = "trtype:PCIe traddr:$PCI"
nvme_nsid = 1
EOT
    OPENSSL_CONF=$W/openssl.cnf LD_LIBRARY_PATH=$S/lib-spdk:$S/lib \
        "$VG" --tool=callgrind --callgrind-out-file=$W/cg-spdk.out --vgdb=yes --vgdb-prefix=$W/vgdb-spdk \
        "$KS" --config $W/kvt-spdk.toml > $W/kvtarget-spdk.log 2>&1 &
    vg_pid=$!
    n=0
    until grep -q "listening on 127.0.0.1:4420" $W/kvtarget-spdk.log; do
        kill -0 $vg_pid 2>/dev/null || { echo "# spdk backend under callgrind exited:"; tail -n 15 $W/kvtarget-spdk.log; vg_pid=; break; }
        [ $n -lt 3000 ] || { echo "# spdk backend did not start"; tail -n 15 $W/kvtarget-spdk.log; break; }
        sleep 0.1; n=$((n + 1))
    done
    if [ -n "$vg_pid" ] && nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" > /dev/null; then
        dev=
        for c in /sys/class/nvme/nvme*; do
            [ "$(cat "$c/transport" 2>/dev/null)" = tcp ] && dev=/dev/$(basename "$c")
        done
        n=0; while [ ! -b ${dev}n1 ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
        measure spdk ${dev}n1 $W/vgdb-spdk $W/cg-spdk.out.1
        nvme disconnect -n "$NQN" > /dev/null
    fi
    if [ -n "$vg_pid" ]; then
        # Bounded: under valgrind, DPDK's exit (its threads are cancelled) can hang.
        kill -TERM $vg_pid
        n=0; while kill -0 $vg_pid 2>/dev/null && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
        if kill -0 $vg_pid 2>/dev/null; then
            echo "# spdk run did not exit within 60 s of SIGTERM under valgrind; its log ends:"
            tail -n 5 $W/kvtarget-spdk.log | sed 's/^/#   /'
            kill -KILL $vg_pid
        fi
        wait $vg_pid 2>/dev/null
    fi
fi
"$K" nvme unbind $PCI > /dev/null || die "unbind"
# The profiles, for callgrind_annotate on the host (where the instructions went).
mkdir -p $S/profiles && cp $W/cg*.out* $S/profiles/ 2>/dev/null
echo "# bench done"
