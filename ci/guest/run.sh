#!/usr/bin/env bash
# Boot the interop guest (built by build.sh) under QEMU/TCG and run one script in it.
#
# The host directory --share is exported over 9p (tag "share", mounted on /mnt/share in
# the guest); --script names a file inside it, run by the guest's init with busybox sh.
# The guest writes the script's exit status to <share>/exit-status and powers off; this
# script returns that status, or 124 on timeout, 125 if the guest died without one,
# 126 if QEMU itself died of a signal (an emulator crash, not the guest's verdict: callers
# that can set their inputs up afresh may run the guest again).
#
# Usage: ci/guest/run.sh --share DIR --script REL [--timeout SECS] [--log FILE]
#                        [--smp N] [--mem SIZE] [--pidfile FILE] [--verbose]
#                        [--append "KERNEL ARGS"] [--iommu] [--nvme-disk FILE]...
#                        [--net tap|user]
# --iommu: emulated VT-d (q35 with split irqchip, intel-iommu with interrupt remapping)
#          and guest args intel_iommu=on iommu=pt, for VFIO in the guest.
# --nvme-disk: an emulated PCIe NVMe controller at 0000:00:10.0 with one namespace per
#          raw FILE given (NSIDs 1, 2, ... in order).
# --net: how the guest (10.0.2.15) reaches the host's 127.0.0.1 listeners at 10.0.2.2.
#          tap (the default when the host can make one; GUEST_NET sets it too): a tap
#          device holding 10.0.2.2 and an nftables rule that sends the guest's packets
#          for 10.0.2.2 to 127.0.0.1. The guest's virtio-net then sends 64 KiB TCP
#          segments with checksum offload; slirp (user) takes 1500-byte frames, each a
#          pass of QEMU's main loop, and that one thread at 100 % capped the guest's
#          NVMe/TCP at 7-27 MB/s. user: slirp, which needs nothing from the host.
# GUEST_QEMU_ARGS: more QEMU arguments, split at spaces (ci/selftest/hang-guest.sh
# passes -S, which holds the vCPUs stopped: a guest that hangs).
# The console log (kernel + script output) goes to --log (default <share>/console.log);
# its path is printed at the end, and its tail too when the run failed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
share= script= append= timeout_s=900 log= smp=4 mem=2G pidfile= verbose=${INTEROP_VERBOSE:-}
iommu= nvme_disks=() net=${GUEST_NET:-}
while [ $# -gt 0 ]; do
    case "$1" in
        --share) share=$2; shift 2 ;;
        --script) script=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --log) log=$2; shift 2 ;;
        --append) append="$append $2"; shift 2 ;;
        --smp) smp=$2; shift 2 ;;
        --mem) mem=$2; shift 2 ;;
        --pidfile) pidfile=$2; shift 2 ;;
        --verbose) verbose=1; shift ;;
        --iommu) iommu=1; shift ;;
        --nvme-disk) nvme_disks+=("$2"); shift 2 ;;
        --net) net=$2; shift 2 ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "guest-run: unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$net" in ""|tap|user) ;; *) echo "guest-run: --net tap|user, not '$net'" >&2; exit 2 ;; esac
[ -n "$share" ] && [ -d "$share" ] || { echo "guest-run: --share DIR required" >&2; exit 2; }
[ -n "$script" ] && [ -f "$share/$script" ] || { echo "guest-run: --script must name a file in $share" >&2; exit 2; }
share=$(cd "$share" && pwd)
log=${log:-$share/console.log}

guest=${GUEST_DIR:-$("$here/build.sh")}
[ -f "$guest/vmlinuz" ] && [ -f "$guest/initramfs.cpio" ] || { echo "guest-run: no guest in $guest" >&2; exit 2; }

rm -f "$share/exit-status"
: > "$log"

# The tap device and its NAT table are this run's own (named after its PID); one
# guest at a time may use tap, since each holds 10.0.2.2.
tap=kvtg$$ tap_up=
tap_down() {
    [ -n "$tap_up" ] || return 0
    nft delete table ip "$tap" 2>/dev/null || true
    ip link del "$tap" 2>/dev/null || true
    tap_up=
}
tap_setup() {
    [ -c /dev/net/tun ] && command -v nft >/dev/null && command -v ip >/dev/null || return 1
    # A run killed before its cleanup leaves its tap and table: remove those whose
    # run.sh is gone.
    local old
    for old in $(ip -o link show | sed -n 's/^[0-9]*: \(kvtg[0-9]*\)[:@].*/\1/p'); do
        kill -0 "${old#kvtg}" 2>/dev/null && continue
        nft delete table ip "$old" 2>/dev/null || true
        ip link del "$old" 2>/dev/null || true
    done
    if ip -4 addr show | grep -q ' 10\.0\.2\.2/'; then
        echo "guest-run: 10.0.2.2 is already on an interface (another guest on tap?)" >&2
        return 1
    fi
    ip tuntap add dev "$tap" mode tap || return 1
    tap_up=1
    ip addr add 10.0.2.2/24 dev "$tap" && ip link set "$tap" up \
        && echo 1 > "/proc/sys/net/ipv4/conf/$tap/route_localnet" \
        && nft -f - <<NFT || { tap_down; return 1; }
table ip $tap {
    chain prerouting {
        type nat hook prerouting priority dstnat;
        iifname "$tap" ip daddr 10.0.2.2 dnat to 127.0.0.1
    }
}
NFT
}

qemu_pid=
cleanup() {
    if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
        kill -TERM "$qemu_pid" 2>/dev/null || true
        sleep 1
        kill -KILL "$qemu_pid" 2>/dev/null || true
    fi
    [ -z "$pidfile" ] || rm -f "$pidfile"
    tap_down
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -cpu max: crc32c-intel (NVMe/TCP digests) needs SSE4.2, which the default qemu64
# model lacks. -smp 4: the Linux host caps I/O queues at the number of online CPUs,
# and the suite connects with 4 I/O queues. mitigations=off: no speculative-execution
# workarounds to emulate.
cmdline="console=ttyS0 quiet panic=-1 mitigations=off random.trust_cpu=on interop.run=$script$append"
# The IOMMU comes before every other PCI device so that all of them sit behind it.
machine=q35 extra=()
if [ -n "$iommu" ]; then
    machine=q35,kernel-irqchip=split
    extra+=(-device intel-iommu,intremap=on,caching-mode=on,aw-bits=48)
    cmdline="$cmdline intel_iommu=on iommu=pt"
fi
if [ ${#nvme_disks[@]} -gt 0 ]; then
    extra+=(-device nvme,id=nvme0,serial=kvtnvme0,addr=0x10)
    for i in "${!nvme_disks[@]}"; do
        # discard=unmap: Deallocate really punches the file, as DLFEAT promises.
        extra+=(-drive "file=${nvme_disks[$i]},if=none,id=nvmd$i,format=raw,discard=unmap"
                -device "nvme-ns,drive=nvmd$i,bus=nvme0,nsid=$((i + 1))")
    done
fi
netdev=(-netdev user,id=n0)
if [ "$net" != user ]; then
    if tap_setup; then
        netdev=(-netdev "tap,id=n0,ifname=$tap,script=no,downscript=no,vnet_hdr=on")
    elif [ "$net" = tap ]; then
        echo "guest-run: --net tap: cannot set up a tap device with NAT to 127.0.0.1" >&2
        exit 2
    else
        echo "guest-run: no tap device (needs /dev/net/tun, ip, nft); slirp networking, slower" >&2
    fi
fi
read -r -a user_args <<< "${GUEST_QEMU_ARGS:-}"
qemu-system-x86_64 \
    -nodefaults -no-user-config -no-reboot \
    -machine "$machine" -accel tcg,thread=multi -cpu max -smp "$smp" -m "$mem" \
    ${extra[@]+"${extra[@]}"} \
    -display none -serial stdio -monitor none \
    -kernel "$guest/vmlinuz" -initrd "$guest/initramfs.cpio" -append "$cmdline" \
    "${netdev[@]}" -device virtio-net-pci,netdev=n0,romfile= \
    -fsdev local,id=fs0,path="$share",security_model=none \
    -device virtio-9p-pci,fsdev=fs0,mount_tag=share \
    -device virtio-rng-pci \
    ${user_args[@]+"${user_args[@]}"} \
    </dev/null >>"$log" 2>&1 &
qemu_pid=$!
[ -z "$pidfile" ] || echo "$qemu_pid" > "$pidfile"

tail_pid=
if [ -n "$verbose" ]; then
    tail -n +1 -f "$log" --pid="$qemu_pid" >&2 &
    tail_pid=$!
fi

start=$SECONDS
timed_out=
while kill -0 "$qemu_pid" 2>/dev/null; do
    if [ $((SECONDS - start)) -ge "$timeout_s" ]; then
        timed_out=1
        echo "guest-run: timeout after ${timeout_s}s, killing QEMU" >&2
        kill -TERM "$qemu_pid" 2>/dev/null || true
        sleep 2
        kill -KILL "$qemu_pid" 2>/dev/null || true
        break
    fi
    sleep 1
done
qemu_rc=0
wait "$qemu_pid" 2>/dev/null || qemu_rc=$?
qemu_pid=
[ -z "$tail_pid" ] || wait "$tail_pid" 2>/dev/null || true

if [ -n "$timed_out" ]; then
    rc=124
elif [ "$qemu_rc" -gt 128 ] && [ ! -f "$share/exit-status" ]; then
    echo "guest-run: QEMU died of signal $((qemu_rc - 128)) ($(kill -l $((qemu_rc - 128)) 2>/dev/null || echo ?)) before the guest finished" >&2
    rc=126
elif [ -f "$share/exit-status" ]; then
    rc=$(cat "$share/exit-status")
    case "$rc" in ''|*[!0-9]*) rc=125 ;; esac
else
    echo "guest-run: guest stopped without writing an exit status" >&2
    rc=125
fi
echo "guest-run: exit status $rc after $((SECONDS - start))s; console log: $log" >&2
if [ "$rc" != 0 ]; then
    echo "guest-run: ---- console tail ($log) ----" >&2
    tail -n 60 "$log" >&2
    echo "guest-run: ---- end of console tail ----" >&2
fi
exit "$rc"
