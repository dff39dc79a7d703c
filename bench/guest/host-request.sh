# Sourced by the guest halves of the bench scripts (bench/guest/*.sh), copied beside
# them into the 9p share: requests to the host script. The caller sets share (the
# share's mount point) and defines log.
#
# host_do COMMAND [ARG...]: writes "SEQ COMMAND ARG..." to ./request and waits for
# "SEQ REPLY" in ./reply, polling every $HOST_POLL s (default 0.1) for at most 120 s;
# prints REPLY.
seq_no=0
host_do() {
    seq_no=$((seq_no + 1))
    echo "$seq_no $*" > "$share/request.tmp" && mv "$share/request.tmp" "$share/request"
    local poll=${HOST_POLL:-0.1} deadline=$((SECONDS + 120)) r_seq r
    while [ "$SECONDS" -lt "$deadline" ]; do
        if [ -f "$share/reply" ]; then
            read -r r_seq r < "$share/reply"
            if [ "$r_seq" = "$seq_no" ]; then
                rm -f "$share/reply"
                echo "$r"
                return 0
            fi
        fi
        sleep "$poll"
    done
    log "no reply from the host to '$*'"
    return 1
}
