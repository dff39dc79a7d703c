#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo-afl, stable Rust): builds the fuzz/ targets and
# runs each for a bounded time from its committed corpus. Fails if any target
# finds a crash or a hang, printing the reproducer and how to replay it.
#
#   ci/fuzz.sh                      every target, FUZZ_SECONDS (20) each
#   FUZZ_SECONDS=600 ci/fuzz.sh pdu one target, longer
#   ci/fuzz.sh --build-only         install cargo-afl, build the targets, fuzz nothing
#   ci/fuzz.sh --run-only           fuzz the targets built before (no cargo build)
#
# cargo-afl and AFL++ (built by `cargo afl config --build`) are cached in
# .cache/fuzz; findings go to fuzz/out/<target>/ (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
secs=${FUZZ_SECONDS:-20}
build_only= run_only=
case "${1:-}" in
    --build-only) build_only=1; shift ;;
    --run-only) run_only=1; shift ;;
esac
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(pdu nvme_command rdma pool_format pool_check config auth etcd_answer)

cache=$repo/.cache/fuzz
afl_target=$repo/target/afl
bins=$afl_target/fuzz
export XDG_DATA_HOME=$cache/xdg
export PATH=$cache/cargo/bin:$PATH
if [ -z "$run_only" ]; then
    # AFL++'s build needs make and a C compiler (ci/lib/debian.sh's group fuzz).
    log() { echo "fuzz: $*" >&2; }
    die() { echo "fuzz: error: $*" >&2; exit 1; }
    source ci/lib/debian.sh
    install_debs fuzz
    if ! command -v cargo-afl >/dev/null; then
        echo "==> installing cargo-afl into $cache/cargo"
        CARGO_TARGET_DIR=$cache/cargo-build cargo install cargo-afl --version '^0.18' --locked --root "$cache/cargo"
    fi
    if ! ls "$XDG_DATA_HOME"/afl.rs/*/*/afl/bin/afl-fuzz >/dev/null 2>&1; then
        echo "==> building AFL++ (cargo afl config --build)"
        cargo afl config --build
    fi
    # Its own target folder: cargo-afl's RUSTFLAGS (instrumentation) would otherwise
    # rebuild the workspace's release artifacts, and back.
    echo "==> cargo afl build --profile fuzz -p kvtarget-fuzz --features afl (target/afl)"
    CARGO_TARGET_DIR=$afl_target cargo afl build --profile fuzz -p kvtarget-fuzz --features afl --bins
fi
[ -z "$build_only" ] || exit 0
for t in "${targets[@]}"; do
    [ -x "$bins/$t" ] || { echo "fuzz: no $bins/$t (ci/fuzz.sh --build-only)" >&2; exit 1; }
done

export AFL_SKIP_CPUFREQ=1 AFL_NO_UI=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
export AFL_NO_AFFINITY=${AFL_NO_AFFINITY:-1}   # shared cores: do not pin
# One target per core at a time: each still gets its full time, on a core of
# its own, and the stage takes half as long on two cores.
jobs=${FUZZ_JOBS:-$(nproc)}
fuzz_one() { # TARGET: fuzz it; $out/summary gets its line, $out/failed its problems
    local t=$1 out=$repo/fuzz/out/$1 stats kind f
    rm -rf "$out"
    mkdir -p "$out"
    # -V stops after that many seconds; -t the per-input timeout in ms (a
    # slower input is a hang: the parsers have nothing to wait for).
    if ! cargo afl fuzz -V "$secs" -t "${FUZZ_TIMEOUT_MS:-1000}" -i "fuzz/corpus/$t" -o "$out" \
        "$bins/$t" > "$out/afl.log" 2>&1; then
        tail -n 20 "$out/afl.log"
        echo "$t: afl-fuzz failed (log $out/afl.log)" > "$out/failed"
        return
    fi
    stats=$out/default/fuzzer_stats
    field() { sed -n "s/^$1 *: *//p" "$stats"; }
    echo "$t: $(field execs_done) execs, $(field execs_per_sec) exec/s, corpus $(field corpus_count), edges $(field edges_found)/$(field total_edges) ($(field bitmap_cvg)), crashes $(field saved_crashes), hangs $(field saved_hangs)" > "$out/summary"
    : > "$out/failed"
    for kind in crashes hangs; do
        for f in "$out"/default/$kind/id:*; do
            [ -e "$f" ] || continue
            echo "$t: $kind/$(basename "$f")" >> "$out/failed"
            echo "FUZZ FAILURE ($kind) in $t: $f"
            echo "  replay:  target/afl/fuzz/$t < '$f'"
            echo "  keep it: cp '$f' fuzz/regressions/$t/<name> && cargo test -p kvtarget-fuzz"
        done
    done
}
running=0
for t in "${targets[@]}"; do
    echo "==> fuzzing $t for ${secs}s"
    fuzz_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait
failed=()
summary=()
for t in "${targets[@]}"; do
    out=$repo/fuzz/out/$t
    [ -s "$out/summary" ] && { summary+=("$(cat "$out/summary")"); cat "$out/summary"; }
    while IFS= read -r line; do failed+=("$line"); done < <(cat "$out/failed" 2>/dev/null || echo "$t: no result")
done
echo
echo "==> fuzzing summary (${secs}s per target)"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "==> fuzzing found problems:"
    printf '  %s\n' "${failed[@]}"
    exit 1
fi
