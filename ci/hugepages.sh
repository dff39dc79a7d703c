#!/usr/bin/env bash
# Hugepages for SPDK/DPDK processes (nvmf_tgt, spdk_nvme_perf, spdk_nvme_identify,
# bdevperf, an SPDK-linked kvtarget). Idempotent: mounts hugetlbfs on /dev/hugepages
# if nothing is mounted there, and raises vm.nr_hugepages to at least the wanted
# count (never lowers it: another process may be using the pages).
#
#   ci/hugepages.sh          at least 1024 pages (2 GiB with 2 MiB pages)
#   ci/hugepages.sh 1536     at least 1536 pages
#   HUGEPAGES=1536 ci/hugepages.sh
#
# Needs root. Exits non-zero if the kernel cannot provide the pages.
set -euo pipefail

want=${1:-${HUGEPAGES:-1024}}
case $want in '' | *[!0-9]*) echo "hugepages: '$want' is not a page count" >&2; exit 2 ;; esac

if [ "$(id -u)" != 0 ]; then
    echo "hugepages: must run as root (mount hugetlbfs, write /proc/sys/vm/nr_hugepages)" >&2
    exit 1
fi

mkdir -p /dev/hugepages
mountpoint -q /dev/hugepages || mount -t hugetlbfs nodev /dev/hugepages

have=$(cat /proc/sys/vm/nr_hugepages)
if [ "$have" -lt "$want" ]; then
    echo "$want" > /proc/sys/vm/nr_hugepages
    have=$(cat /proc/sys/vm/nr_hugepages)
fi
if [ "$have" -lt "$want" ]; then
    echo "hugepages: asked for $want pages, the kernel gave $have (memory fragmented or short)" >&2
    exit 1
fi
echo "hugepages: $have pages of $(awk '/^Hugepagesize/ {print $2 $3}' /proc/meminfo)," \
    "$(awk '/^HugePages_Free/ {print $2}' /proc/meminfo) free, hugetlbfs on /dev/hugepages" >&2
