#!/bin/bash
# Host-side test of klog-filter.sh: the kernel-log lines tcp-suite.sh accepts from the
# error volume's partition scan, and those it must still report. Each case is a log
# excerpt as the guest's 6.1 kernel prints it.
set -u
. "$(dirname "$0")/klog-filter.sh"
fails=0
# check NAME EXPECTED_OUTPUT DISKS... <<< LOG
check() {
    local name=$1 want=$2; shift 2
    local got
    got=$(drop_unwritten_read_errors "$@" 2>/dev/null)
    if [ "$got" = "$want" ]; then
        echo "ok - $name"
    else
        echo "FAIL - $name: kept [$got], expected [$want]"
        fails=$((fails + 1))
    fi
}

scan='[   88.100001] nvme0c0n3: Read(0x2) @ LBA 0, 8 blocks, Deallocated or Unwritten Logical Block (sct 0x2 / sc 0x87) DNR
[   88.100002] Buffer I/O error on dev nvme0n3, logical block 0, async page read
[   88.100003] ldm_validate_partition_table(): Disk read failed.'
check "error-volume-scan-dropped" "" nvme0c0n3 nvme0n3 <<< "$scan"

# The CI failure this file was written for: a connect soon after another, the
# rate-limited lines suppressed, LDM's line alone.
check "ldm-alone-dropped-when-error-volume-attached" "" nvme0c0n3 nvme0n3 \
    <<< '[   90.608228] ldm_validate_partition_table(): Disk read failed.'

check "ldm-kept-without-error-volume" '[   90.608228] ldm_validate_partition_table(): Disk read failed.' \
    <<< '[   90.608228] ldm_validate_partition_table(): Disk read failed.'

other='[   91.000001] nvme0c0n1: Read(0x2) @ LBA 0, 8 blocks, Deallocated or Unwritten Logical Block (sct 0x2 / sc 0x87) DNR
[   91.000002] Buffer I/O error on dev nvme0n1, logical block 0, async page read'
check "other-disk-errors-kept" "$other" nvme0c0n3 nvme0n3 <<< "$other"

digest='[   92.000001] nvme nvme0: data digest error: recv 0x1 expected 0x2
[   92.000002] nvme nvme0: starting error recovery'
check "digest-errors-kept" "$digest" nvme0c0n3 nvme0n3 <<< "$digest"

other_status='[   93.000001] nvme0c0n3: Read(0x2) @ LBA 0, 8 blocks, Internal Error (sct 0x0 / sc 0x6)'
check "other-status-on-error-volume-kept" "$other_status" nvme0c0n3 nvme0n3 <<< "$other_status"

check "prefix-disk-name-not-matched" '[   94.1] Buffer I/O error on dev nvme0n30, logical block 0, async page read' \
    nvme0n3 <<< '[   94.1] Buffer I/O error on dev nvme0n30, logical block 0, async page read'

echo "klog-filter: $fails failed"
[ "$fails" = 0 ]
