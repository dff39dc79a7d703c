# Kernel-log filtering for tcp-suite.sh, sourced by it and by klog-filter-test.sh (which
# runs on the host in ci/test.sh, so the filter is tested without a guest).
#
# drop_unwritten_read_errors DISK...: stdin -> stdout, without the lines that reads of
# never-written blocks on the given disks (the attached "error" volumes) are expected to
# log. Every connect makes the kernel scan those volumes for partitions; their
# never-written blocks fail with Deallocated or Unwritten Logical Block (SCT 2, SC 87h),
# which the kernel logs as "nvmeXcYnZ: Read(0x2) @ LBA 0, ... (sct 0x2 / sc 0x87)" and
# "Buffer I/O error on dev nvmeXnZ, ...", then "ldm_validate_partition_table(): Disk
# read failed.". Says on stderr how many lines it dropped. With no disks, passes all.
drop_unwritten_read_errors() {
    if [ $# = 0 ]; then cat; return 0; fi
    local disks
    disks=$(printf '%s|' "$@"); disks=${disks%|}
    local re="^([[][^]]*[]] )?((${disks}): .*[(]sct 0x2 / sc 0x87[)]|Buffer I/O error on dev (${disks}), )"
    # The LDM partition parser's complaint names no disk; it is dropped whenever an
    # error volume is attached. It cannot be tied to the volume's own lines: the kernel
    # rate-limits those (nvme_log_error and buffer_io_error use printk_ratelimited) but
    # not LDM's, so a connect that follows another within a few seconds logs the LDM
    # line alone. A real read failure on another disk still logs that disk's own lines,
    # and the scenarios verify their data with fio and dd.
    re="$re|^([[][^]]*[]] )?ldm_validate_partition_table[(][)]: Disk read failed[.]\$"
    local lines n
    lines=$(cat)
    [ -n "$lines" ] || return 0
    n=$(printf '%s\n' "$lines" | grep -cE "$re")
    printf '%s\n' "$lines" | grep -vE "$re"
    [ "$n" = 0 ] || echo "#   (ignored $n expected unwritten-block read error lines on the error volume's disks: $*)" >&2
    return 0
}
