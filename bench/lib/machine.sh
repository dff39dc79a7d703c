# Sourced by the bench scripts: the machine check and the binary every one of them
# starts with. The caller sets repo (the checkout) and defines log.

# warn_if_busy: sets load_start (uptime at the start, for the report) and warns when
# the 1-minute load average is above 0.5: figures taken beside other work are noise.
warn_if_busy() {
    load_start=$(uptime)
    local load1
    load1=$(cut -d' ' -f1 /proc/loadavg)
    if awk -v l="$load1" 'BEGIN { exit !(l > 0.5) }'; then
        log "WARNING: 1-minute load average is $load1 (> 0.5): something else is running;"
        log "WARNING: figures from this run are not a measurement. $load_start"
    fi
}

# kvtarget_bin -> the kvtarget to measure: $KVTARGET_BIN, or this checkout's release
# build, built first. Fails (status 1, reason logged) when there is none.
kvtarget_bin() {
    if [ -z "${KVTARGET_BIN:-}" ]; then
        (cd "$repo" && cargo build --release -q) || { log "cargo build --release failed"; return 1; }
    fi
    local bin=${KVTARGET_BIN:-$repo/target/release/kvtarget}
    [ -x "$bin" ] || { log "$bin not built"; return 1; }
    echo "$bin"
}
