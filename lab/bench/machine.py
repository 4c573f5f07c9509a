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

