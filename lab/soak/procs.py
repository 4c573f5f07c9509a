"""Python-backend stub processes of a server this process started, found through ``/proc``.

Triton's Python backend runs each model instance in its own ``triton_python_backend_stub``
process, a child of ``tritonserver``. Its command line (seen with Triton 2.51 on these
machines) is::

    triton_python_backend_stub <repo>/<model>/<version>/model.py <shm region> <shm size>
        <shm growth> <server pid> <backend dir> <ipc handle> <instance name> DEFAULT

with the instance name ``<model>_<group>_<index>`` (``classifier_fast_0_0``). The soak
finds a stub by its parent pid (the server it started) and that instance-name argument,
never by process name: other servers on the machine run stubs with the same names.
Linux only (reads ``/proc/<pid>/stat``, ``cmdline`` and ``status``).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import List, Optional

from orchestrator.runtime.bls.stubs import read_stat
from orchestrator.tooling.errors import ToolingError


class StubNotFound(ToolingError):
    """No live stub process with that instance name is a child of the given server."""


@dataclass(frozen=True)
class Proc:
    """One process: ``pid``, parent ``ppid``, ``state`` (``R``, ``S``, ``Z`` ...),
    ``start`` (start time after boot, in clock ticks), ``argv``."""

    pid: int
    ppid: int
    state: str
    start: int
    argv: List[str]


def read_proc(pid: int) -> Optional[Proc]:
    """``/proc/<pid>`` as a :class:`Proc`; None when the process is gone or unreadable."""
    stat = read_stat(pid)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return None
    if stat is None:
        return None
    return Proc(pid, stat[0], stat[1], stat[2], argv)


def children(parent: int) -> List[Proc]:
    """The processes whose parent is ``parent`` (zombies included), by pid."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = read_proc(int(name))
            if proc is not None and proc.ppid == parent:
                out.append(proc)
    return sorted(out, key=lambda p: p.pid)


def find_stub(server_pid: int, instance: str) -> Optional[int]:
    """The pid of the live (not zombie) stub of model instance ``instance``
    (``classifier_fast_0_0``) among the children of ``server_pid``; None when there is none.
    While a model reloads, the old and the new instance have the same name: the one
    started last is returned."""
    live = [p for p in children(server_pid) if p.state != "Z" and instance in p.argv[1:]]
    return max(live, key=lambda p: (p.start, p.pid)).pid if live else None


def rss_bytes(pid: int, field: str = "VmRSS") -> Optional[int]:
    """Resident set size of ``pid`` in bytes (``VmRSS`` of ``/proc/<pid>/status``; pages of
    shared memory the process touched count too); ``field="RssAnon"``: its private anonymous
    part alone (heap and stacks, without the shared memory a Python-backend stub maps for its
    tensors). None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def kill_stub(server_pid: int, instance: str) -> int:
    """SIGKILL the stub of ``instance`` that is a child of ``server_pid``; returns its pid.
    Raises :class:`StubNotFound` when there is no such live child."""
    pid = find_stub(server_pid, instance)
    if pid is None:
        seen = [f"{p.pid} {p.state} {' '.join(p.argv[1:2])}" for p in children(server_pid)]
        raise StubNotFound(f"no live stub {instance!r} among the children of pid {server_pid} (children: {seen})")
    os.kill(pid, signal.SIGKILL)
    return pid
