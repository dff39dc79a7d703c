#!/usr/bin/env bash
# The project's test command (README): lint, unit + integration tests, then the
# interop suite against the real Linux NVMe host in a QEMU guest.
#
#   ci/test.sh            everything
#   ci/test.sh --quick    lint and cargo tests only (no QEMU guest)
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
[[ "${1:-}" == "--quick" ]] && quick=1

# Each stage's wall time, the total so far, and how busy the machine's cores were
# (all processes, from /proc/stat), printed as the next one starts and at exit. A
# long stage that leaves cores idle is one to overlap with another.
cpu_ticks() { # busy and total jiffies of all cores
    local _ user nice system idle iowait rest
    read -r _ user nice system idle iowait rest < /proc/stat
    local total=$((user + nice + system + idle + iowait)) r
    for r in $rest; do total=$((total + r)); done
    echo "$((total - idle - iowait)) $total"
}
t_start=$SECONDS t_stage=$SECONDS stage= cpu_at_stage=$(cpu_ticks)
stage_done() {
    [ -n "$stage" ] || return 0
    local b0 t0 b1 t1
    read -r b0 t0 <<< "$cpu_at_stage"
    read -r b1 t1 < <(cpu_ticks)
    printf '==> took %ss (total %ss, cores %s%% busy): %s\n' "$((SECONDS - t_stage))" \
        "$((SECONDS - t_start))" "$(( (b1 - b0) * 100 / (t1 - t0 > 0 ? t1 - t0 : 1) ))" "$stage"
}
step() { stage_done; stage=$*; t_stage=$SECONDS; cpu_at_stage=$(cpu_ticks); printf '\n==> %s\n' "$*"; }
trap 'rc=$?; stage_done; exit $rc' EXIT

step "toolchain: $(cargo --version)"
cargo fmt --version >/dev/null && cargo clippy --version >/dev/null

step "cargo fmt --check"
cargo fmt --all -- --check

step "no import circle inside src/nvmf or src/pool (ci/import-circles.py)"
python3 ci/import-circles.py

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

# SPDK from ../shared/vendor/spdk, built once into .cache/spdk (about 5 minutes the
# first time), for the `spdk` feature build and for SPDK's own tools below.
step "SPDK v25.09 (ci/spdk.sh: cached build)"
eval "$(ci/spdk.sh)"

step "cargo clippy --all-targets --features spdk -- -D warnings"
cargo clippy --all-targets --features spdk -- -D warnings

# tests/cluster.rs starts private etcd servers (Debian's etcd-server): without the
# binary those tests only print that they skip, so CI installs it.
step "etcd-server for tests/cluster.rs (ci/lib/debian.sh)"
log() { echo "test.sh: $*" >&2; }
die() { echo "test.sh: error: $*" >&2; exit 1; }
source ci/lib/debian.sh
install_debs etcd-server
command -v etcd >/dev/null || die "etcd-server installed no etcd binary"

step "cargo test (unit, property and loopback integration tests)"
cargo test --all-targets

# Only the tests the feature changes: the spdk backend's own and config's (which
# accepts an spdk device only in an SPDK-linked build). Every other lib test ran
# above on the same code; running all 478 again here took 37 s.
step "cargo test --features spdk --lib bdev::spdk config:: (the tests the spdk feature changes, SPDK linked)"
cargo test --features spdk --lib -- bdev::spdk config::

# Both simulations run their seeds on one thread per core (src/sim_seeds.rs): on
# this 2-core machine 600 pool seeds took 35.5 s on one thread and 19.7 s on two,
# 600 target seeds 7.3 s and 3.8 s. The full run runs them in the background beside
# the TCP interop and spdk-backend boots (below); --quick runs them here.
: "${KVT_SIM_SEEDS:=5000}" "${KVT_TARGET_SIM_SEEDS:=5000}"
sims_title="pool simulation: $KVT_SIM_SEEDS seeds (sim profile: optimised, overflow checks on), then target simulation: $KVT_TARGET_SIM_SEEDS seeds (queues on a fake link over pools on the fault device)"
run_sims() {
    KVT_SIM_SEEDS=$KVT_SIM_SEEDS cargo test --profile sim --lib pool::sim -- --nocapture \
        && KVT_TARGET_SIM_SEEDS=$KVT_TARGET_SIM_SEEDS cargo test --profile sim --lib nvmf::tests::target_sim -- --nocapture
}
if [[ $quick == 1 ]]; then
    step "$sims_title"
    run_sims
fi

step "interop suite's kernel-log filter (tests/interop/klog-filter-test.sh)"
tests/interop/klog-filter-test.sh

step "fuzz crate: fmt, clippy, replay of fuzz/corpus and fuzz/regressions"
(cd fuzz && cargo fmt -- --check && cargo clippy --all-targets -- -D warnings && cargo test)

step "interop's io_uring KV client (tests/interop/kv-uring): fmt, clippy"
(cd tests/interop/kv-uring && CARGO_TARGET_DIR=../../../.cache/kv-uring cargo fmt -- --check \
    && CARGO_TARGET_DIR=../../../.cache/kv-uring cargo clippy --release -- -D warnings)

if [[ $quick == 1 ]]; then
    step "fuzzing: every cargo-afl target for ${FUZZ_SECONDS:-20} s (ci/fuzz.sh)"
    ci/fuzz.sh
    exit 0
fi

# The SPDK-linked binary first, copied out to target/spdk: built in the same target
# folder, it shares every dependency with the default build below, which then
# recompiles only kvtarget and spdk-sys (about 30 s less than a folder of its own).
# It builds beside the fuzz targets' build: cargo-afl compiles every crate with
# codegen-units=1, so that build keeps one core busy most of its time (the stage
# was 78 % busy). The fuzzing itself runs after both, on idle cores.
step "cargo build --release --features spdk (copied to target/spdk/release), beside the fuzz targets' build (ci/fuzz.sh --build-only)"
mkdir -p target
spdk_build_log=$PWD/target/build-release-spdk.log
cargo build --release --features spdk > "$spdk_build_log" 2>&1 &
spdk_build_pid=$!
ci/fuzz.sh --build-only || { kill "$spdk_build_pid" 2>/dev/null; exit 1; }
wait "$spdk_build_pid" || { tail -n 40 "$spdk_build_log"; die "cargo build --release --features spdk failed (log $spdk_build_log)"; }
tail -n 2 "$spdk_build_log"
mkdir -p target/spdk/release
cp target/release/kvtarget target/spdk/release/kvtarget
spdk_bin=$PWD/target/spdk/release/kvtarget

step "fuzzing: every cargo-afl target for ${FUZZ_SECONDS:-20} s (ci/fuzz.sh)"
ci/fuzz.sh

step "cargo build --release"
cargo build --release

# Work no stage needs until later runs in the background at SCHED_IDLE (only on a
# core nothing else wants) beside the next two guest stages: their TCG guest keeps
# about one core of two busy (kvtarget runs on the host), and the simulations (about
# 390 s alone) and SPDK v26.05's build (about 250 s alone from cold) use the other.
# They are waited for before the RDMA stage, whose guest runs kvtarget itself and
# wants both cores: with them beside it, it ran past its guest's timeout in one run.
# Nothing runs cargo in target/ or apt-get while they run (v26.05's packages are
# installed first, in the foreground: two apt-gets at once fail on dpkg's lock).
bg_dir=$PWD/target/ci-background
bg_pids=() bg_names=() bg_t0=()
bg_start() { # NAME COMMAND...: the command's output goes to $bg_dir/NAME.log
    local name=$1; shift
    mkdir -p "$bg_dir"
    # A session of its own, so that a stopped run can end the job's whole group;
    # its log's last line says how long it ran.
    setsid --wait chrt --idle 0 bash -c 's=$SECONDS; "$@"; rc=$?
        echo "background job: exit status $rc after $((SECONDS - s)) s"; exit $rc' bg "$@" \
        > "$bg_dir/$name.log" 2>&1 < /dev/null &
    bg_pids+=($!) bg_names+=("$name") bg_t0+=("$SECONDS")
    echo "test.sh: started in the background: $name (pid $!, log $bg_dir/$name.log)"
}
bg_wait() { # NAME: waits for it, shows its log's tail, fails the run if it failed
    local name=$1 i rc
    for i in "${!bg_names[@]}"; do
        [ "${bg_names[$i]}" = "$name" ] || continue
        rc=0; wait "${bg_pids[$i]}" || rc=$?
        echo "test.sh: $name started $((SECONDS - bg_t0[i])) s ago, exit status $rc (its own time: the log's last line)"
        if [ "$rc" != 0 ]; then tail -n 60 "$bg_dir/$name.log"; die "$name failed (log $bg_dir/$name.log)"; fi
        tail -n 12 "$bg_dir/$name.log"
        return 0
    done
    die "bg_wait: no background job $name"
}
# A run that fails or is stopped early leaves no background job behind.
trap 'rc=$?; stage_done; for p in "${bg_pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; exit $rc' EXIT

step "promtool check metrics on a live target's /metrics (ci/promtool.sh)"
KVTARGET_BIN="$PWD/target/release/kvtarget" ci/promtool.sh

step "SPDK's own JSON-RPC client (spdk-rpc from PyPI) drives kvtarget"
KVTARGET_BIN="$PWD/target/release/kvtarget" tests/spdk-rpc/run.sh

step "SPDK v25.09's own host tools (spdk_nvme_identify, spdk_nvme_perf, bdevperf verify) against kvtarget, default options"
KVTARGET_BIN="$PWD/target/release/kvtarget" tests/spdk-tools/run.sh

step "DH-HMAC-CHAP against SPDK v25.09's host (spdk_nvme_perf --dhchap-key, bdevperf verify), SPDK nvmf_tgt as the control"
KVTARGET_BIN="$PWD/target/release/kvtarget" tests/spdk-tools/auth.sh

step "NVMe/TCP TLS 1.3 with PSKs against SPDK v25.09's host (spdk_nvme_perf -S ssl --psk-path, both cipher suites), SPDK nvmf_tgt as the control"
KVTARGET_BIN="$PWD/target/release/kvtarget" tests/spdk-tools/tls.sh

step "ANA multipath with SPDK v25.09's host (bdev_nvme, two paths, bdevperf verify while listener states flip and a listener goes and comes back), SPDK nvmf_tgt as the control"
KVTARGET_BIN="$PWD/target/release/kvtarget" tests/spdk-tools/multipath.sh

step "spdk backend: its SPDK controller killed under load (I/O fails with a status, the target and its other namespaces carry on)"
KVTARGET_BIN="$spdk_bin" tests/spdk-tools/backend-failure.sh

# Started only now: the SPDK tool stages above keep both cores busy polling, and
# their timings are theirs alone.
step "start in the background (SCHED_IDLE): the simulations, and SPDK v26.05 + DPDK v25.11 (ci/spdk26.sh: cached build)"
ci/spdk26.sh --deps
bg_start simulations bash -c "$(declare -f run_sims); KVT_SIM_SEEDS=$KVT_SIM_SEEDS KVT_TARGET_SIM_SEEDS=$KVT_TARGET_SIM_SEEDS run_sims"
bg_start spdk26 ci/spdk26.sh

step "interop: Linux kernel NVMe/TCP host in a QEMU guest"
KVTARGET_BIN="$PWD/target/release/kvtarget" ci/interop.sh

step "spdk backend: SPDK's NVMe/TCP host under a pool (SPDK nvmf_tgt, an AIO bdev, interrupt mode), the Linux host in the guest, restarts by SIGKILL"
INTEROP_BACKEND=spdk-tcp INTEROP_RESTART_SIGNAL=KILL KVTARGET_BIN="$spdk_bin" \
    ci/interop.sh --target kvtarget

step "$sims_title (waiting for the background run)"
bg_wait simulations

# SPDK v26.05 with DPDK v25.11 from ../shared/vendor/spdk-26.05 (Debian's DPDK is too
# old for it), built once into .cache/spdk26 (about 9 minutes the first time): the
# NVMe host that speaks the Key Value command set.
step "SPDK v26.05 + DPDK v25.11 (ci/spdk26.sh: cached build; waiting for the background run)"
bg_wait spdk26

step "SPDK v26.05's stock NVMe-KV host (tests/spdk-kv: a C client on nvme_kv.h) against kvtarget's KV namespaces, SIGKILL cycles"
KVTARGET_BIN="$PWD/target/release/kvtarget" tests/spdk-kv/run.sh

step "interop: Linux kernel NVMe/RDMA host (and SPDK's NVMe/RDMA host tools) over soft-RoCE, kvtarget in the QEMU guest"
KVTARGET_BIN="$PWD/target/release/kvtarget" ci/rdma.sh

step "nvme backend: kvtarget's user-space NVMe driver over VFIO in a QEMU guest"
KVTARGET_BIN="$PWD/target/release/kvtarget" ci/vfio.sh

step "spdk backend: SPDK's PCIe NVMe driver over VFIO in a QEMU guest"
VFIO_BACKEND=spdk KVTARGET_BIN="$spdk_bin" ci/vfio.sh
