#!/usr/bin/env bash
# Hugepages for SPDK/DPDK processes (nvmf_tgt, spdk_nvme_perf, spdk_nvme_identify,
# bdevperf, an SPDK-linked kvtarget). Idempotent: mounts hugetlbfs on /dev/hugepages
# if nothing is mounted there, and raises vm.nr_hugepages to at least the wanted
# count (never lowers it: another process may be using the pages).
#
#   ci/hugepages.sh              at least 1024 pages in all (2 GiB with 2 MiB pages)
#   ci/hugepages.sh 1536         at least 1536 pages in all
#   ci/hugepages.sh --free 900   also at least 900 of them free now (other processes
#                                may hold some), raising the total by the shortfall
#   HUGEPAGES=1536 ci/hugepages.sh
#
# Needs root. Exits non-zero if the kernel cannot provide the pages.
set -euo pipefail

want=${HUGEPAGES:-1024} want_free=0
while [ $# -gt 0 ]; do
    case $1 in
        --free) want_free=${2:-}; shift 2 || { echo "hugepages: --free needs a page count" >&2; exit 2; } ;;
        *) want=$1; shift ;;
    esac
done
for n in "$want" "$want_free"; do
    case $n in '' | *[!0-9]*) echo "hugepages: '$n' is not a page count" >&2; exit 2 ;; esac
done

if [ "$(id -u)" != 0 ]; then
    echo "hugepages: must run as root (mount hugetlbfs, write /proc/sys/vm/nr_hugepages)" >&2
    exit 1
fi

mkdir -p /dev/hugepages
mountpoint -q /dev/hugepages || mount -t hugetlbfs nodev /dev/hugepages

total() { cat /proc/sys/vm/nr_hugepages; }
free_pages() { awk '/^HugePages_Free/ {print $2}' /proc/meminfo; }
raise() { # to at least $1 pages in all
    [ "$(total)" -ge "$1" ] || echo "$1" > /proc/sys/vm/nr_hugepages
}

raise "$want"
short=$((want_free - $(free_pages)))
[ "$short" -le 0 ] || raise $(($(total) + short))

if [ "$(total)" -lt "$want" ] || [ "$(free_pages)" -lt "$want_free" ]; then
    echo "hugepages: asked for $want pages ($want_free free), the kernel gave $(total) ($(free_pages) free):" \
        "memory short or fragmented" >&2
    exit 1
fi
echo "hugepages: $(total) pages of $(awk '/^Hugepagesize/ {print $2 $3}' /proc/meminfo)," \
    "$(free_pages) free, hugetlbfs on /dev/hugepages" >&2
