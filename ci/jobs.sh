#!/usr/bin/env bash
# The jobs of ci/test.sh, one function each: `ci/jobs.sh NAME` runs one (ci/pipeline.py
# runs them in stages, with caps; `ci/test.sh --list` shows which and in what order).
# Run by hand, a job assumes the jobs it needs have run (ci/test.sh --stage NAME runs
# them too). Every status counts: `set -e` and pipefail, no `eval "$(cmd)"`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
log() { echo "jobs: $*" >&2; }
die() { echo "jobs: error: $*" >&2; exit 1; }
source ci/lib/debian.sh

ci_dir=$repo/target/ci
bin_dir=$ci_dir/bin
# The release binaries the later jobs run, copied out of target/release: the default
# build and the SPDK-linked one leave their binary at the same path.
KVT_BIN=$bin_dir/kvtarget
KVT_SPDK_BIN=$bin_dir/kvtarget-spdk
mkdir -p "$bin_dir"

# SPDK v25.09's environment (SPDK_DIR, PKG_CONFIG_PATH, LD_LIBRARY_PATH) for every job,
# before that build exists too: build scripts that use pkg-config (openssl-sys's, and
# so everything above it) rebuild whenever PKG_CONFIG_PATH changes, so every cargo
# command of the run sees the same one.
if [ "${1:-}" != deps ]; then
    planned=$(ci/spdk.sh --planned-env) || die "ci/spdk.sh --planned-env failed"
    eval "$planned"
fi
# spdk_env: fails (naming the spdk job) unless SPDK's cached build is there.
spdk_env() {
    [ -s "$ci_dir/spdk.env" ] && [ -f "$SPDK_DIR/build/lib/pkgconfig/spdk_nvme.pc" ] \
        || die "no SPDK build in $SPDK_DIR: the spdk job has not run (ci/test.sh --stage spdk)"
}
need_bin() { [ -x "$1" ] || die "no $1: the ${2} job has not run (ci/test.sh --stage ${2})"; }

# ---- deps ------------------------------------------------------------------------
job_deps() { ci/deps.sh; }

# ---- build -----------------------------------------------------------------------
job_lint() {
    log "cargo fmt --check (the workspace with fuzz/, tests/interop/kv-uring)"
    cargo fmt --all -- --check
    (cd tests/interop/kv-uring && cargo fmt -- --check)
    log "no import circle between the crates or inside any crate's folders (ci/import-circles.py)"
    python3 ci/import-circles.py
    log "function and file sizes (ci/fn-sizes.py: none over 100 lines, at most 15 over 70, no file over 1,200)"
    python3 ci/fn-sizes.py
    log "the interop suite's kernel-log filter (tests/interop/klog-filter-test.sh)"
    tests/interop/klog-filter-test.sh
    log "cargo clippy --workspace --all-targets -- -D warnings"
    cargo clippy --workspace --all-targets -- -D warnings
    log "clippy of the interop's io_uring KV client (tests/interop/kv-uring)"
    (cd tests/interop/kv-uring && CARGO_TARGET_DIR=$repo/.cache/kv-uring \
        cargo clippy --release -- -D warnings)
}

job_spdk() {
    # The environment goes to a file the later jobs read: its status is the build's.
    # (Without the planned SPDK_DIR, which ci/spdk.sh would take for a user's own tree.)
    env -u SPDK_DIR ci/spdk.sh > "$ci_dir/spdk.env.tmp"
    mv "$ci_dir/spdk.env.tmp" "$ci_dir/spdk.env"
    cat "$ci_dir/spdk.env"
}

job_guest_image() { ci/guest/build.sh; }

job_release() {
    cargo build --release
    cp target/release/kvtarget "$KVT_BIN"
    "$KVT_BIN" --version
}

job_clippy_spdk() {
    spdk_env
    cargo clippy --workspace --all-targets --features spdk -- -D warnings
}

job_release_spdk() {
    spdk_env
    cargo build --release --features spdk
    cp target/release/kvtarget "$KVT_SPDK_BIN"
    "$KVT_SPDK_BIN" --version
}

# ---- tests -----------------------------------------------------------------------
# Every crate's unit, property and integration tests, and the fuzz crate's replay
# of fuzz/corpus and fuzz/regressions; --no-fail-fast: one failing test binary
# does not hide the others' verdicts.
job_cargo_test() { cargo test --workspace --all-targets --no-fail-fast; }

# Only the crates the feature changes, SPDK linked: the spdk backend's (kvt-bdev)
# and config's (which accepts an spdk device only in an SPDK-linked build); the
# rest ran in cargo-test.
job_test_spdk() {
    spdk_env
    cargo test -p kvt-bdev -p kvt-config --features spdk --lib
}

job_nvmet_control() { ci/nvmet-control.sh; }

job_promtool() { KVTARGET_BIN=$KVT_BIN ci/promtool.sh; }

# The operator's kit (docs/operations.md): the alert rules' promtool checks and
# unit tests and the dashboard's queries; `kvtarget top` driven in tmux against a
# target under load; the Debian package installed into a clean Debian 12 root
# (debootstrap, cached in .cache/debian12-root), its unit verified, the daemon's
# system calls within its filter.
job_alerts() { ci/alerts.sh; }
job_top() { need_bin "$KVT_BIN" release; KVTARGET_BIN=$KVT_BIN ci/top.sh; }
job_deploy() { need_bin "$KVT_BIN" release; KVTARGET_BIN=$KVT_BIN ci/deploy.sh; }

job_spdk_rpc() { need_bin "$KVT_BIN" release; KVTARGET_BIN=$KVT_BIN tests/spdk-rpc/run.sh; }

job_spdk_tools() {
    need_bin "$KVT_BIN" release
    need_bin "$KVT_SPDK_BIN" release-spdk
    local t
    for t in run auth tls multipath; do
        log "tests/spdk-tools/$t.sh"
        KVTARGET_BIN=$KVT_BIN "tests/spdk-tools/$t.sh"
    done
    log "tests/spdk-tools/backend-failure.sh (the SPDK-linked binary)"
    KVTARGET_BIN=$KVT_SPDK_BIN tests/spdk-tools/backend-failure.sh
}

# Both simulations run their seeds on one thread per core (crates/kvt-seeds), in the
# sim profile (optimised, overflow checks and debug assertions on): the pool's in
# kvt-pool, the whole target's in kvt-nvmf. sims-build builds their test binaries
# (cargo, in the foreground); sims runs them without cargo, so that it can run at
# SCHED_IDLE beside a guest without holding cargo's lock.
sims_bins=$ci_dir/sims.bins
job_sims_build() {
    cargo test --profile sim -p kvt-pool -p kvt-nvmf --lib --no-run \
        --message-format=json-render-diagnostics \
        | python3 -c 'import json, sys
for m in map(json.loads, sys.stdin):
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])' > "$sims_bins.tmp"
    mv "$sims_bins.tmp" "$sims_bins"
    cat "$sims_bins"
}

sim_bin() { # CRATE: its sim-profile test binary
    local b
    b=$(awk -v c="$1" '$1 == c {print $2}' "$sims_bins" 2>/dev/null)
    [ -x "$b" ] || die "no sim-profile test binary of $1: the sims-build job has not run"
    echo "$b"
}

job_sims() {
    local pool nvmf
    pool=$(sim_bin kvt_pool) nvmf=$(sim_bin kvt_nvmf)
    : "${KVT_SIM_SEEDS:=5000}" "${KVT_TARGET_SIM_SEEDS:=5000}"
    export KVT_SIM_SEEDS KVT_TARGET_SIM_SEEDS
    log "pool simulation: $KVT_SIM_SEEDS seeds"
    "$pool" sim:: --nocapture
    log "target simulation: $KVT_TARGET_SIM_SEEDS seeds (queues on a fake link over pools on the fault device)"
    "$nvmf" tests::target_sim --nocapture
}

# The fuzz targets: cargo-afl (cached in .cache/fuzz) builds them in fuzz/target;
# fuzz runs each for FUZZ_SECONDS (20) without cargo building anything.
job_fuzz_build() { ci/fuzz.sh --build-only; }
job_fuzz() { ci/fuzz.sh --run-only; }

# ---- guests ----------------------------------------------------------------------
# No silent skip: the scenarios each boot may skip, by design; any other skip fails.
# kvtarget on the host runs every scenario. The kernel's nvmet (Linux 6.1) has no
# in-band authentication, TLS, thin volumes, KV namespaces, reservations or ANA, and
# is no cluster node.
export INTEROP_EXPECTED_SKIPS_kvtarget=""
export INTEROP_EXPECTED_SKIPS_kernel="auth-required-refused tls-required-refused
    several-namespaces nuse-tracks-writes-and-discard unwritten-error-volume
    volume-data-survives-restart namespace-hot-add-remove lmcache-volatile-kill kv-namespace
    reservations reservation-ptpl-kill reservations-spdk-control
    reservation-ptpl-kill-spdk-control ana-multipath cluster-referrals cluster-failover"
# Over RDMA (kvtarget inside the guest): the NVMe/TCP-only scenarios, and those the
# soft-RoCE boot does not set up because they take the same code over any transport
# and the TCP boot runs them (authentication and TLS refusals, the SIGKILLed volatile
# LMCache volume, reservations, the cluster).
export INTEROP_EXPECTED_SKIPS_rdma="discovery-8009 digests auth-required-refused
    tls-required-refused lmcache-volatile-kill reservations reservation-ptpl-kill
    reservations-spdk-control reservation-ptpl-kill-spdk-control cluster-referrals
    cluster-failover"
job_interop_tcp() {
    need_bin "$KVT_BIN" release
    spdk_env
    KVTARGET_BIN=$KVT_BIN ci/interop.sh --target kvtarget
}

job_interop_spdk_backend() {
    need_bin "$KVT_SPDK_BIN" release-spdk
    spdk_env
    INTEROP_BACKEND=spdk-tcp INTEROP_RESTART_SIGNAL=KILL KVTARGET_BIN=$KVT_SPDK_BIN \
        ci/interop.sh --target kvtarget
}

job_spdk26() {
    ci/spdk26.sh > "$ci_dir/spdk26.env.tmp"
    mv "$ci_dir/spdk26.env.tmp" "$ci_dir/spdk26.env"
    cat "$ci_dir/spdk26.env"
}

job_spdk_kv() { need_bin "$KVT_BIN" release; KVTARGET_BIN=$KVT_BIN tests/spdk-kv/run.sh; }

job_interop_rdma() {
    need_bin "$KVT_BIN" release
    spdk_env
    KVTARGET_BIN=$KVT_BIN ci/rdma.sh
}

job_vfio() {
    need_bin "$KVT_BIN" release
    need_bin "$KVT_SPDK_BIN" release-spdk
    spdk_env
    KVTARGET_BIN=$KVT_BIN KVTARGET_SPDK_BIN=$KVT_SPDK_BIN VFIO_BACKENDS="nvme spdk" ci/vfio.sh
}

[ $# = 1 ] || die "usage: ci/jobs.sh JOB (ci/test.sh --list names them)"
fn=job_${1//-/_}
declare -F "$fn" > /dev/null || die "no job '$1' (ci/test.sh --list names them)"
echo "jobs: $1 started $(date -u +%H:%M:%S)"
"$fn"
echo "jobs: $1 done $(date -u +%H:%M:%S)"
