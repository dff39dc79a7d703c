#!/usr/bin/env python3
"""The test command's runner (ci/test.sh calls it): stages in order, each with a cap.

A *stage* is a step of the run with a time cap; the caps add up to at most
MAX_TOTAL_CAP_S, so that one hang can never use the whole CI budget (90 minutes).
Inside a stage, *jobs* run side by side where they can (each names the jobs it
needs, in its stage or an earlier one, and how many of the two cores it keeps
busy): a QEMU guest leaves about one core idle, which a build or a simulation
uses. Every job is `ci/jobs.sh NAME`, its output in target/ci/logs/NAME.log.

A job that fails ends the run: the jobs still running are stopped, and the run
fails with the stage's and the job's names and the job's last log lines. A stage
still running at its cap is stopped the same way and fails with its name, its
cap and the last log lines of each job it was waiting for. At the end, pass or
fail, one table: stage, cap, time, verdict (and the same for each job).

    ci/test.sh                   every stage
    ci/test.sh --quick           the stages marked quick (no release build, no guest)
    ci/test.sh --list            the stages, their caps and their jobs
    ci/test.sh --stage NAME ...  those stages (or jobs) and the jobs they need
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOG_DIR = os.path.join(REPO, "target", "ci", "logs")
# 85 of CI's 90 minutes: what is left covers the clone, cargo's start and the table.
MAX_TOTAL_CAP_S = 85 * 60
CORES = os.cpu_count() or 2
# A job stopped at its stage's cap gets this long after SIGTERM to clean up (QEMU,
# kvtarget, tap devices) before SIGKILL.
STOP_GRACE_S = 15
TAIL_LINES = 40
# For measuring on a slower or busier machine only: every cap times this (the caps'
# sum is checked unscaled). CI never sets it.
CAP_SCALE = float(os.environ.get("KVT_CI_CAP_SCALE", "1"))


def cap_overrides(text):
    """KVT_CI_CAPS="STAGE=SECONDS,...": caps for named stages (a self-test's
    short cap on the stage it hangs; a slower machine's longer one)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, secs = item.partition("=")
        if not sep or not secs.strip().isdigit():
            sys.exit(f"pipeline: KVT_CI_CAPS: '{item}' is not STAGE=SECONDS")
        out[name.strip()] = int(secs)
    return out


CAP_OVERRIDES = cap_overrides(os.environ.get("KVT_CI_CAPS", ""))


def effective_cap(stage):
    return CAP_OVERRIDES.get(stage.name, stage.cap_s) * CAP_SCALE
# How far the foreground jobs' cores may add up past the machine's: a light job
# (the guest image's build, mostly downloads and copies) may join a build.
OVERCOMMIT = 0.5
# A build's share: two builds side by side (each would take both cores alone, so
# together they finish when they would have one after the other, but the jobs
# waiting for either start sooner), or a build beside a guest.
BUILD = 1.25


def poll(job):
    """The job's exit status once it has ended (None while it runs); records the
    CPU time it and every process it waited for used (wait4's rusage)."""
    if job.rc is not None:
        return job.rc
    pid, status, ru = os.wait4(job.proc.pid, os.WNOHANG)
    if pid == 0:
        return None
    job.rc = os.waitstatus_to_exitcode(status)
    job.cpu_s = ru.ru_utime + ru.ru_stime
    job.proc.returncode = job.rc
    return job.rc


class Job:
    """One command of a stage: `ci/jobs.sh NAME`.

    cpu: how many cores it keeps busy (a build 2, a TCG guest beside a host kvtarget
    about 1); a job starts only while the running ones leave it room.
    needs: jobs that must have passed first.
    early: the stage from which it may start, when that is before its own (a
    background job: a build or simulation beside the guest stages); its own stage
    waits for it, and its cap bounds it.
    idle: runs at SCHED_IDLE, on what the foreground jobs leave of the cores (never
    builds with cargo in target/: a starved job must not hold cargo's lock).
    cargo: builds in target/ (cargo's lock: one such job at a time).
    tap: boots a guest on the tap network (one such guest at a time).
    """

    def __init__(self, name, cpu=2.0, needs=(), early=None, idle=False, cargo=False,
                 tap=False, quick=False):
        self.name, self.cpu, self.needs = name, cpu, list(needs)
        self.early, self.idle, self.cargo, self.tap, self.quick = early, idle, cargo, tap, quick
        self.stage = None
        self.proc = self.log = self.t0 = self.rc = self.cpu_s = None
        self.elapsed = None
        self.verdict = "not run"


class Stage:
    def __init__(self, name, cap_s, desc, jobs):
        self.name, self.cap_s, self.desc, self.jobs = name, cap_s, desc, jobs
        for j in jobs:
            j.stage = self
        self.elapsed = None
        self.verdict = "not run"


# The run, in order. Caps: about 1.6x the slowest time measured on this kind of
# machine (2 cores) from cold, so a busy hour passes and a hang is caught early.
STAGES = [
    Stage("deps", 360, "every Debian package any stage needs: one apt-get update, one install "
          "(waits for the dpkg lock, retries once)",
          [Job("deps", cpu=1, quick=True)]),
    Stage("build", 780, "lint, SPDK v25.09, the guest image, the release builds",
          [Job("spdk", cpu=BUILD, quick=True),
           Job("lint", cpu=BUILD, cargo=True, quick=True),
           Job("guest-image", cpu=0.5),
           Job("release", cpu=BUILD, needs=["lint"], cargo=True),
           Job("clippy-spdk", cpu=BUILD, needs=["lint", "spdk"], cargo=True, quick=True),
           Job("release-spdk", cpu=BUILD, needs=["release", "spdk"], cargo=True)]),
    Stage("test", 780, "cargo test, the SPDK-linked tests, the kernel nvmet control boot (its "
          "verdict cached), the operator's kit, SPDK's tools against kvtarget",
          [Job("nvmet-control", cpu=1, needs=["guest-image"], early="build"),
           Job("cargo-test", cpu=BUILD, cargo=True, quick=True),
           Job("test-spdk", cpu=BUILD, needs=["cargo-test", "spdk"], cargo=True, quick=True),
           Job("promtool", cpu=1, needs=["release"]),
           Job("alerts", cpu=0.5, quick=True),
           Job("top", cpu=1, needs=["release"]),
           Job("deploy", cpu=1, needs=["release"]),
           Job("spdk-rpc", cpu=1, needs=["release"]),
           Job("spdk-tools", needs=["release", "release-spdk", "promtool", "spdk-rpc"])]),
    Stage("guest-tcp", 1080, "the Linux kernel NVMe/TCP host in a QEMU guest against kvtarget; "
          "beside it: the simulations and the fuzzers",
          [Job("interop-tcp", cpu=1.2, needs=["release", "spdk", "guest-image"], tap=True),
           Job("sims-build", cpu=BUILD, cargo=True, early="test", quick=True),
           Job("sims", cpu=0.8, needs=["sims-build"], idle=True, quick=True),
           Job("fuzz-build", cpu=1, early="test", quick=True),
           Job("fuzz", cpu=0.8, needs=["fuzz-build"], idle=True, quick=True)]),
    Stage("guest-spdk", 780, "kvtarget's pool on SPDK's NVMe/TCP host, the Linux host in the guest; "
          "beside it: SPDK v26.05's build, then its NVMe-KV host",
          [Job("interop-spdk-backend", cpu=1.2, needs=["release-spdk", "guest-image"], tap=True),
           Job("spdk26", cpu=0.8, idle=True, early="guest-tcp"),
           Job("spdk-kv", needs=["spdk26", "interop-spdk-backend"])]),
    Stage("guest-rdma", 900, "NVMe/RDMA over soft-RoCE, kvtarget in the guest",
          [Job("interop-rdma", needs=["release", "spdk", "guest-image"], cpu=2)]),
    Stage("guest-vfio", 420, "the nvme and spdk backends over VFIO in the guest (one boot)",
          [Job("vfio", needs=["release", "release-spdk", "guest-image"], cpu=2)]),
]


def all_jobs():
    return {j.name: j for s in STAGES for j in s.jobs}


# Every job needs the packages.
for _job in all_jobs().values():
    if _job.name != "deps" and "deps" not in _job.needs:
        _job.needs.insert(0, "deps")


def tail(path, n=TAIL_LINES):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
        return lines[-n:]
    except OSError as e:
        return [f"(no log: {e})"]


# What a failing log says about its failure, wherever it sits in the log: TAP-style
# verdicts of the guest suites, cargo's failed tests, panics, shell errors.
FAILURE_LINE = re.compile(r"FAIL - |not ok |---- .* stdout ----|thread '.*' panicked|"
                          r"\berror(\[E\d+\])?: |\bError: |FAILED|TIMEOUT")


def failure_lines(path, n=30):
    """The first n lines of a job's log that name a failure (the tail may not)."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    hits = [line for line in text.splitlines() if FAILURE_LINE.search(line)]
    return hits[:n]


def print_failure(path):
    hits = failure_lines(path)
    if hits:
        print(f"    lines that name the failure ({len(hits)} shown):")
        for line in hits:
            print(f"    ! {line[:400]}")
    print(f"    last lines ({path}):")
    for line in tail(path):
        print(f"    | {line}")


def say(t0, msg):
    print(f"==> [{int(time.monotonic() - t0):5d}s] {msg}", flush=True)


class Run:
    def __init__(self, stages, selected):
        self.stages, self.selected = stages, selected
        self.t0 = time.monotonic()
        self.failed = None  # (stage, job or None, why)
        self.running = []
        os.makedirs(LOG_DIR, exist_ok=True)

    # -- jobs ----------------------------------------------------------------------
    def start(self, job):
        job.log = os.path.join(LOG_DIR, job.name + ".log")
        logf = open(job.log, "wb")
        cmd = ["bash", os.path.join(REPO, "ci", "jobs.sh"), job.name]
        if job.idle:
            cmd = ["chrt", "--idle", "0"] + cmd
        env = dict(os.environ, KVT_CI="1", KVT_CI_JOB=job.name)
        # A process group of its own, so that a stopped job's whole group (QEMU,
        # kvtarget, SPDK's targets) goes with it; but the run's session: with the
        # kernel's autogroup scheduling (on here), each session shares the CPU
        # equally whatever its processes' nice values, so a job in a session of its
        # own would take as much as a guest however idle it was meant to be.
        job.proc = subprocess.Popen(cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, process_group=0)
        logf.close()
        job.t0 = time.monotonic()
        job.verdict = "running"
        self.running.append(job)
        say(self.t0, f"start {job.name} (log {os.path.relpath(job.log, REPO)})")

    def stop(self, job, verdict):
        """Stops a running job's process group: SIGTERM, then SIGKILL."""
        if poll(job) is None:
            try:
                os.killpg(job.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + STOP_GRACE_S
            while poll(job) is None and time.monotonic() < deadline:
                time.sleep(0.2)
        try:
            os.killpg(job.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while poll(job) is None:
            time.sleep(0.1)
        job.elapsed = time.monotonic() - job.t0
        job.verdict = verdict
        if job in self.running:
            self.running.remove(job)

    def stop_all(self, verdict):
        for job in list(self.running):
            self.stop(job, verdict)

    def reap(self, stage):
        for job in list(self.running):
            rc = poll(job)
            if rc is None:
                continue
            job.elapsed = time.monotonic() - job.t0
            self.running.remove(job)
            if rc == 0:
                job.verdict = "passed"
                say(self.t0, f"passed {job.name} in {job.elapsed:.0f}s ({job.cpu_s:.0f} s of CPU)")
                for line in tail(job.log, 3):
                    print(f"    | {line}")
            else:
                job.verdict = f"failed ({rc})"
                say(self.t0, f"FAILED {job.name} (exit status {rc}) after {job.elapsed:.0f}s "
                    f"(stage {job.stage.name}):")
                print_failure(job.log)
                self.failed = (job.stage.name, job.name, f"job {job.name} exited with status {rc}")
                return

    # -- stages --------------------------------------------------------------------
    def ready(self, job, jobs):
        return all(jobs[n].verdict in ("passed", "skipped: not selected") for n in job.needs)

    def room(self, job):
        if job.tap and any(j.tap for j in self.running):
            return False
        if job.cargo and any(j.cargo for j in self.running):
            return False
        if job.idle:  # SCHED_IDLE: takes only what is left, so it always fits
            return True
        load = sum(j.cpu for j in self.running if not j.idle)
        return load == 0 or load + job.cpu <= CORES + OVERCOMMIT

    def startable(self, k):
        """Jobs that may start while stage k runs: its own, then the early ones of
        later stages (background work)."""
        own = [j for j in self.stages[k].jobs]
        later = [j for s in self.stages[k + 1:] for j in s.jobs
                 if j.early and self.index[j.early] <= k]
        return [j for j in own + later if j.verdict == "pending"]

    def run_stage(self, k, jobs):
        stage = self.stages[k]
        own = [j for j in stage.jobs if j.name in self.selected]
        say(self.t0, f"stage {stage.name} (cap {effective_cap(stage):.0f}s): {stage.desc}")
        t_stage = time.monotonic()
        while not self.failed and any(j.verdict in ("pending", "running") for j in own):
            waiting = False  # a ready job of this stage that found no room
            for job in self.startable(k):
                if not self.ready(job, jobs):
                    continue
                # Background work never overtakes this stage's own jobs: it
                # starts only while none of them is waiting for room.
                if job.stage is not stage and waiting:
                    continue
                if self.room(job):
                    self.start(job)
                elif job.stage is stage:
                    waiting = True
            stuck = [j for j in own if j.verdict == "pending" and any(
                jobs[n].verdict.startswith(("failed", "not run", "stopped")) for n in j.needs)]
            if stuck:
                j = stuck[0]
                self.failed = (stage.name, j.name, f"job {j.name} needs {', '.join(j.needs)}: "
                               "not all of them passed")
                break
            if not self.running and all(not self.ready(j, jobs) for j in own if j.verdict == "pending"):
                j = next(j for j in own if j.verdict == "pending")
                self.failed = (stage.name, j.name, f"job {j.name} waits for {', '.join(j.needs)}, "
                               "which no stage up to this one runs")
                break
            time.sleep(0.25)
            self.reap(stage)
            if time.monotonic() - t_stage > effective_cap(stage) and not self.failed:
                late = [j for j in self.running if j.stage is stage]
                say(self.t0, f"TIMEOUT: stage {stage.name} ran past its cap of {effective_cap(stage):.0f}s; "
                    f"stopping {', '.join(j.name for j in late)}")
                for job in late:
                    print(f"    {job.name}:")
                    print_failure(job.log)
                    self.stop(job, "stopped at the stage's cap")
                self.failed = (stage.name, None, f"stage {stage.name} ran past its cap of "
                               f"{effective_cap(stage):.0f}s ({', '.join(j.name for j in late)} unfinished)")
        if self.failed:
            self.stop_all("stopped (another job failed)")
        stage.elapsed = time.monotonic() - t_stage
        stage.verdict = "passed" if not self.failed else (
            "FAILED" if self.failed[0] == stage.name else "stopped")

    def run(self):
        jobs = all_jobs()
        for name, job in jobs.items():
            job.verdict = "pending" if name in self.selected else "skipped: not selected"
        self.index = {s.name: k for k, s in enumerate(self.stages)}
        for stage in self.stages:
            if not any(j.name in self.selected for j in stage.jobs):
                stage.verdict = "skipped: not selected"
        for k, stage in enumerate(self.stages):
            if self.failed:
                break
            if stage.verdict != "skipped: not selected":
                self.run_stage(k, jobs)
        for job in jobs.values():
            if job.verdict == "pending":
                job.verdict = "not run"
        self.table()
        if self.failed:
            stage, job, why = self.failed
            print(f"==> FAILED in stage {stage}" + (f", job {job}" if job else "") + f": {why}")
            return 1
        print(f"==> passed in {time.monotonic() - self.t0:.0f}s")
        return 0

    def table(self):
        print()
        print(f"{'stage / job':<26} {'cap':>6} {'time':>6} {'cpu':>6}  verdict")
        for s in self.stages:
            if s.verdict == "skipped: not selected":
                continue
            t = f"{s.elapsed:.0f}s" if s.elapsed is not None else "-"
            print(f"{s.name:<26} {effective_cap(s):>5.0f}s {t:>6} {'':>6}  {s.verdict}")
            for j in s.jobs:
                if j.verdict == "skipped: not selected":
                    continue
                t = f"{j.elapsed:.0f}s" if j.elapsed is not None else "-"
                c = f"{j.cpu_s:.0f}s" if j.cpu_s is not None else "-"
                print(f"  {j.name:<24} {'':>6} {t:>6} {c:>6}  {j.verdict}")
        total_cap = sum(s.cap_s for s in self.stages if s.verdict != "skipped: not selected")
        cpu = sum(j.cpu_s or 0 for s in self.stages for j in s.jobs)
        print(f"{'total':<26} {total_cap:>5}s {time.monotonic() - self.t0:>5.0f}s {cpu:>5.0f}s")


def expand(names):
    """Jobs to run: the named stages' or jobs' own, and every job they need."""
    jobs = all_jobs()
    want = set()
    for n in names:
        st = [s for s in STAGES if s.name == n]
        if st:
            want.update(j.name for j in st[0].jobs)
        elif n in jobs:
            want.add(n)
        else:
            sys.exit(f"ci/test.sh: no stage or job named '{n}' (ci/test.sh --list)")
    stack = list(want)
    while stack:
        for n in jobs[stack.pop()].needs:
            if n not in want:
                want.add(n)
                stack.append(n)
    return want


def main():
    p = argparse.ArgumentParser(prog="ci/test.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="only the jobs marked quick")
    p.add_argument("--list", action="store_true", help="list the stages and their jobs")
    p.add_argument("--stage", action="append", default=[], metavar="NAME",
                   help="run this stage or job (and what it needs); repeatable")
    a = p.parse_args()
    total = sum(s.cap_s for s in STAGES)
    assert total <= MAX_TOTAL_CAP_S, f"the caps add up to {total}s, over {MAX_TOTAL_CAP_S}s"
    if a.list:
        for s in STAGES:
            print(f"{s.name:<12} cap {s.cap_s:>4}s  {s.desc}")
            for j in s.jobs:
                shown = [n for n in j.needs if n != "deps"]
                needs = f" (after {', '.join(shown)})" if shown else ""
                print(f"  {j.name}{needs}{' [quick]' if j.quick else ''}")
        print(f"caps add up to {total}s ({total / 60:.0f} min)")
        return 0
    jobs = all_jobs()
    if a.stage:
        selected = expand(a.stage)
    elif a.quick:
        selected = expand([n for n, j in jobs.items() if j.quick])
    else:
        selected = set(jobs)
    run = Run(STAGES, selected)

    def on_signal(signum, _frame):
        say(run.t0, f"signal {signum}: stopping every job")
        run.stop_all(f"stopped (signal {signum})")
        run.table()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return run.run()


if __name__ == "__main__":
    sys.exit(main())
