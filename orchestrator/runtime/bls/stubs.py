"""Seeing a downstream model's dead Python-backend stub before calling it.

Triton 2.51 keeps a model whose stub process died READY, and python_backend gives every call
to it 1 s before it answers ``Stub process '<instance>' is not healthy`` (docs/guides/reliability.md).
The router answers one ``execute`` at a time, so that second is paid by every request in and
behind the first call. The stubs are children of the router's own parent, ``tritonserver``,
visible in ``/proc`` (Linux, Triton's platform): a stub that has exited (a zombie, or gone)
is seen in microseconds, and the call fails at once with the same message, which opens the
circuit and starts the repair as the real error would (``downstream.CircuitBreaker``).

A stub's command line (python_backend ``StubLauncher::Launch``, the same arguments in r24.10
= Triton 2.51 and in r25.08 and later)::

    triton_python_backend_stub <repo>/<model>/<version>/model.py <shm region> <shm size>
        <shm growth> <server pid> <backend dir> <ipc handle> <instance name> <runtime dir>

names its model (the directory above the version) and instance (``<model>_<group>_<index>``,
or ``<group name>_<index>`` when the ``instance_group`` has a name; the stub that
auto-completes a configuration is named after the model alone and is not an instance). r24.10 starts it through ``bash -c "exec ..."`` (with an execution environment,
``source <env>/bin/activate && exec env LD_LIBRARY_PATH=... <stub> ...``), so for a moment
the child is ``bash`` or ``env``; from r25.08 it is ``execv``'d directly. Either way, only a
process whose ``argv[0]`` is the stub binary counts (:func:`parse_stub_argv`).

When a model is reloaded, the old and the new stub share the instance name; the newest one
(by start time) is the instance's stub. Models with no stub (another backend, not loaded) are
never reported. Any error reading ``/proc`` means "unknown": the call goes ahead.

Which dead stubs are seen: Triton 2.51 never reaps a stub that died, so it stays a zombie
and is reported until a reload replaces it. From r25.12 python_backend's instance readiness
check (``StubActive``: ``waitpid(WNOHANG)``, run by a model or server readiness request,
``pb_utils.is_model_ready`` included) reaps it; a reaped stub is indistinguishable here from
one an unload stopped, so it is not reported, and the call to it takes python_backend's 1 s
health timeout before it fails (``Stub process '<instance>' is not healthy.``), which opens
the circuit and starts the repair as well.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from orchestrator.runtime.bls.control import parent_server_argv

STUB_BINARY = "triton_python_backend_stub"
#: Seconds between two full scans of ``/proc`` when a model's stubs are unknown (a model
#: loaded later, or one without stubs).
RESCAN_S = 5.0
#: Seconds between two full scans while a known stub looks gone (a reload in progress).
RECHECK_S = 0.2
#: Seconds a model whose stubs were all alive is not looked at again: one look is a ``pread``
#: per stub (:meth:`StubWatch._alive_by_fd`; in a router's stub at c=1 on 2 shared cores about
#: 55 us, against 145 us through the path), so under load the calls of the next 20 ms share
#: it (a stub that dies in that window costs its first call the 1 s health timeout, as
#: without the watch).
CHECK_S = 0.02


def parse_stub_argv(argv: Sequence[str]) -> Optional[Tuple[str, str]]:
    """``(model, instance)`` from a process's command line when it is a Python-backend
    model instance's stub (module docstring), else None (another program, the ``bash`` or
    ``env`` that starts a stub in Triton 2.51, a stub that auto-completes a config)."""
    if len(argv) < 3 or Path(argv[0]).name != STUB_BINARY or len(Path(argv[1]).parts) < 3:
        return None
    model = Path(argv[1]).parts[-3]
    if len(argv) >= 10:  # the instance name's place in both releases (an instance_group may name it)
        return None if argv[8] == model else (model, argv[8])
    instance = next((a for a in argv[2:] if re.fullmatch(rf"{re.escape(model)}_\d+_\d+", a)), None)
    return None if instance is None else (model, instance)


def clock_ticks(proc: Path | str = "/proc") -> Optional[int]:
    """Now, in the unit of a process's start time (clock ticks since boot, from
    ``<proc>/uptime``); None when unreadable."""
    try:
        uptime = float((Path(proc) / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return int(uptime * os.sysconf("SC_CLK_TCK"))


def read_stat(pid: int, proc: Path | str = "/proc") -> Optional[Tuple[int, str, int]]:
    """``(ppid, state, start time in clock ticks)`` of ``pid`` from ``<proc>/<pid>/stat``;
    None when the process is gone or unreadable."""
    try:
        text = (Path(proc) / str(pid) / "stat").read_bytes().decode("utf-8", "replace")
    except OSError:
        return None
    return parse_stat(text)


def parse_stat(text: str) -> Optional[Tuple[int, str, int]]:
    """``(ppid, state, start time in clock ticks)`` from the text of a ``/proc/<pid>/stat``;
    None when it has too few fields."""
    fields = text.rsplit(")", 1)[-1].split()  # "pid (comm) state ppid ...": comm may hold ')'
    if len(fields) < 20:
        return None
    return int(fields[1]), fields[0], int(fields[19])


class StubWatch:
    """Which models' stubs have exited, from ``/proc``; thread-safe.

    Args:
        server_pid: the pid of ``tritonserver`` (the router's parent), or None to disable.
        proc: the proc file system's root (tests pass a fake one).
        clock: monotonic seconds.
    """

    def __init__(self, server_pid: Optional[int], proc: Path | str = "/proc", clock: Callable[[], float] = time.monotonic):
        self.server_pid = server_pid
        self.proc = Path(proc)
        self.clock = clock
        self.lock = threading.Lock()
        #: model -> instance name -> (pid, start time) of its newest stub at the last scan
        self.stubs: Dict[str, Dict[str, Tuple[int, int]]] = {}
        self.scanned_at = float("-inf")
        self.alive_at: Dict[str, float] = {}  # model -> when all its stubs were last seen alive
        #: (pid, start time) -> an open descriptor of its ``stat``: one ``pread`` a look instead
        #: of a path's open, read and close; once the process is reaped Linux answers ESRCH on
        #: it, so a reused pid is never mistaken for the stub
        self.fds: Dict[Tuple[int, int], int] = {}

    @classmethod
    def of_parent(cls) -> "StubWatch":
        """A watch on this process's parent when it is ``tritonserver`` and ``/proc`` exists;
        a disabled one otherwise (the in-process mock, another OS)."""
        return cls(os.getppid() if parent_server_argv() is not None else None)

    def dead(self, model: str) -> Optional[str]:
        """The error text for ``model`` (a model name, no version) when one of its stubs has
        exited, python_backend's own wording plus how it was seen; None when all are alive
        or nothing is known."""
        if self.server_pid is None:
            return None
        try:
            with self.lock:
                return self._dead(model)
        except Exception:  # never fail the call path over a look at /proc
            return None

    def _dead(self, model: str) -> Optional[str]:
        now = self.clock()
        if now - self.alive_at.get(model, float("-inf")) < CHECK_S:
            return None
        if model not in self.stubs and now - self.scanned_at >= RESCAN_S:
            self._scan(now)
        states = self._states(model)
        if any(state != "alive" for _, _, state in states) and now - self.scanned_at >= RECHECK_S:
            self._scan(now)  # reaped or exited: a reload may have started a newer stub
            states = self._states(model)
        exited = [(name, pid) for name, pid, state in states if state == "exited"]
        if not exited:
            if states and all(state == "alive" for _, _, state in states):
                self.alive_at[model] = now
            return None
        name, pid = exited[0]
        return f"Stub process '{name}' is not healthy (process {pid} has exited; seen in /proc before the call)"

    def live(self, model: str) -> Optional[Dict[str, Tuple[int, int]]]:
        """A fresh look (a full scan, a few ms): instance -> ``(pid, start time in clock
        ticks)`` of the newest live stub of each of ``model``'s instances; ``{}`` when it has
        none (not loaded, every stub exited, or a zombie the router never saw alive); None
        when the watch is disabled or ``/proc`` is unreadable."""
        if self.server_pid is None:
            return None
        try:
            with self.lock:
                self._scan(self.clock())
                self.alive_at.pop(model, None)
                return {name: (pid, start) for name, pid, state in self._states(model) if state == "alive"
                        for start in [self.stubs[model][name][1]]}
        except Exception:  # a repair must not fail over a look at /proc
            return None

    def ticks(self) -> Optional[int]:
        """Now in clock ticks since boot (:func:`clock_ticks` of this watch's ``/proc``)."""
        return clock_ticks(self.proc)

    def _states(self, model: str) -> List[Any]:
        """``(instance, pid, state)`` of the model's known stubs; state ``alive``,
        ``exited`` (a zombie: it died and the server has not reaped it) or ``gone`` (reaped,
        as after an unload or a reload, or no longer the server's child)."""
        return [(name, pid, self._state(pid, start)) for name, (pid, start) in self.stubs.get(model, {}).items()]

    def _state(self, pid: int, start: int) -> str:
        if self._alive_by_fd(pid, start):
            return "alive"
        return self._judge(read_stat(pid, self.proc), start)  # anything else read through the path, as at a scan

    def _judge(self, stat: Optional[Tuple[int, str, int]], start: int) -> str:
        """The state of the stub started at ``start`` from its ``stat`` (:func:`parse_stat`;
        None: unreadable): ``gone`` unless it is still the server's child started then."""
        if stat is None or stat[0] != self.server_pid or stat[2] != start:
            return "gone"
        return "exited" if stat[1] in ("Z", "X") else "alive"

    def _alive_by_fd(self, pid: int, start: int) -> bool:
        """Whether the stub ``(pid, start)`` is alive by its kept ``stat`` descriptor (opened
        on first use); False when unsure (not open, unreadable, not alive), and the descriptor
        is closed unless the stub is alive."""
        key = (pid, start)
        fd = self.fds.get(key)
        try:
            if fd is None:
                fd = self.fds[key] = os.open(self.proc / str(pid) / "stat", os.O_RDONLY)
            stat = parse_stat(os.pread(fd, 1024, 0).decode("utf-8", "replace"))
        except (OSError, ValueError):
            stat = None
        if self._judge(stat, start) == "alive":
            return True
        self._close_fd(key)
        return False

    def _close_fd(self, key: Tuple[int, int]) -> None:
        fd = self.fds.pop(key, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """Close the kept descriptors (the watch still answers: it opens them again)."""
        with self.lock:
            for key in list(self.fds):
                self._close_fd(key)

    def _scan(self, now: float) -> None:
        """Find every live stub among the server's children; keep the known stubs that have
        exited since (a zombie has an empty command line) unless a newer one replaced them."""
        found: Dict[str, Dict[str, Tuple[int, int]]] = {}
        for entry in os.listdir(self.proc):
            if not entry.isdigit():
                continue
            stat = read_stat(int(entry), self.proc)
            if stat is None or stat[0] != self.server_pid:
                continue
            try:
                argv = [a.decode("utf-8", "replace") for a in (self.proc / entry / "cmdline").read_bytes().split(b"\0") if a]
            except OSError:
                continue
            parsed = parse_stub_argv(argv)
            if parsed is None:
                continue
            model, instance = parsed
            have = found.setdefault(model, {}).get(instance)
            if have is None or stat[2] >= have[1]:
                found[model][instance] = (int(entry), stat[2])
        for model, instances in self.stubs.items():
            for name, (pid, start) in instances.items():
                if name not in found.get(model, {}) and self._state(pid, start) == "exited":
                    found.setdefault(model, {})[name] = (pid, start)
        self.stubs, self.scanned_at = found, now
        kept = {stub for instances in found.values() for stub in instances.values()}
        for key in [k for k in self.fds if k not in kept]:  # replaced or reaped stubs
            self._close_fd(key)
