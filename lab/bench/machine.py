"""The machine a benchmark (or a parity run) measured on: CPU, memory, OS, load, code revision."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import List, Optional

from orchestrator.tooling.host import cpu_model
from orchestrator.tooling.paths import PROJECT_ROOT

ROOT = PROJECT_ROOT


def machine_info() -> dict:
    """Cores, CPU model (``/proc/cpuinfo``), memory (``/proc/meminfo``), kernel, Python, load."""
    cpu = cpu_model() or "unknown"
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024**2, 1)
    except (OSError, ValueError):
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {
        "cores": cores,
        "cpu_model": cpu,
        "memory_gib": mem_gib,
        "kernel": platform.release(),
        "os": _os_name(),
        "python": platform.python_version(),
    }


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.system()


def git_revision() -> Optional[str]:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return f"{rev}{' (uncommitted changes)' if dirty else ''}" if rev else None


#: Other work on the machine, as the benchmarks judge it: a 1-minute load over this much per
#: core just before a run (it distorts side-by-side ratios). The load *during* a run cannot
#: tell: the server and perf_analyzer alone keep every core busy (5 to 6 on 2 cores).
QUIET_LOAD_PER_CORE = 0.5


def wait_quiet(threshold: float, max_wait_s: float = 180.0, log=print) -> List[float]:
    """Wait (at most ``max_wait_s``) until the 1-minute load average is below ``threshold``,
    so that a benchmark does not start inside the tail of earlier work; returns the load
    average then (what the report calls *before*)."""
    deadline = time.monotonic() + max_wait_s
    load = load_average()
    while load and load[0] >= threshold and time.monotonic() < deadline:
        log(f"waiting for a quiet machine: load average {load[0]} >= {threshold:g}")
        time.sleep(15)
        load = load_average()
    return load


def load_average() -> List[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []



# ----------------------------------------------------------------------------- the machine's speed
#
# A fixed pure-Python workload (dicts, a dataclass-like object, string formatting: the kind of
# code a router runs between numpy calls), timed where the load average cannot see: a virtual
# machine's host may slow every core at once without a process of ours running.

SPEED_WORKLOAD = """
import statistics, sys, time
class It:
    __slots__ = ("a", "b", "c")
    def __init__(self, a, b, c):
        self.a, self.b, self.c = a, b, c
def work(n):
    out = []
    for i in range(n):
        d = {"x": i, "y": str(i)}
        it = It(i, d["y"], d)
        out.append(it.a + len(it.b))
    return sum(out)
slices, per_slice, took = int(sys.argv[1]), int(sys.argv[2]), []
for _ in range(slices):
    t = []
    for _ in range(per_slice):
        s = time.perf_counter(); work(200); t.append(time.perf_counter() - s)
    took.append(statistics.median(t) * 1e6)
print(" ".join(f"{x:.1f}" for x in took))
"""


def speed_probe(processes: int = 12, slices: int = 8, per_slice: int = 100) -> dict:
    """The machine's speed now: :data:`SPEED_WORKLOAD` in ``processes`` fresh interpreters one
    after another, each timing ``slices`` slices of ``per_slice`` runs (about 10 ms a slice).

    Returns ``{"us": [[median us of each slice] per process], "median_us", "fastest_us",
    "slowest_us", "within_process_max_ratio", "across_processes_ratio"}``: microseconds per
    run of the workload; the ratios say how far the speed moved within one process (slowest
    over fastest slice, the largest of any process) and across processes (slowest over fastest
    process median). Near 1 on a steady machine.

    Raises:
        subprocess.CalledProcessError: an interpreter failed to run the workload.
    """
    import statistics
    import sys

    per: List[List[float]] = []
    for _ in range(processes):
        done = subprocess.run([sys.executable, "-c", SPEED_WORKLOAD, str(slices), str(per_slice)], capture_output=True,
                              text=True, timeout=120, check=True)
        per.append([float(x) for x in done.stdout.split()])
    medians = [statistics.median(p) for p in per]
    return {"us": per, "median_us": round(statistics.median(medians), 1), "fastest_us": round(min(medians), 1),
            "slowest_us": round(max(medians), 1),
            "within_process_max_ratio": round(max(max(p) / min(p) for p in per), 2),
            "across_processes_ratio": round(max(medians) / min(medians), 2)}


if __name__ == "__main__":  # python -m lab.bench.machine [PROCESSES]: the speed probe, as JSON
    import json
    import sys

    print(json.dumps({"load_before": load_average(), **speed_probe(int(sys.argv[1]) if len(sys.argv) > 1 else 12),
                      "load_after": load_average()}))
