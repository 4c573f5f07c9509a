"""runtime.bls.stubs.StubWatch on a fake /proc: a stub that exited is seen before a call; a
reload, an unload, another model or another server's stub is not reported."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.runtime.bls import stubs
from orchestrator.runtime.bls.downstream import CircuitBreaker, Downstream
from orchestrator.runtime.bls.health import OPEN, stub_is_dead
from orchestrator.runtime.bls.stubs import StubWatch
from orchestrator.runtime.errors import Cause, DownstreamError, UnavailableError
from orchestrator.runtime.request import CallOptions
from orchestrator.runtime.routing.settings import BreakerSettings

SERVER = 4242


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class FakeProc:
    """``<root>/<pid>/stat`` and ``cmdline`` as Linux writes them."""

    def __init__(self, root: Path):
        self.root = root

    def add(self, pid, model, instance, start, ppid=SERVER, state="S"):
        argv = ["/opt/tritonserver/backends/python/triton_python_backend_stub", f"/models/{model}/1/model.py",
                "triton_python_backend_shm_region_1", "1048576", "1048576", str(ppid), "/opt/tritonserver/backends/python",
                "336", instance, "DEFAULT"]
        d = self.root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        self._stat(pid, ppid, state, start)

    def _stat(self, pid, ppid, state, start, comm="triton_python_b"):
        # fields after "(comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt
        # cmajflt utime stime cutime cstime priority nice threads itrealvalue starttime ...
        rest = [state, str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 30
        (self.root / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(rest) + "\n")

    def die(self, pid, start, ppid=SERVER):
        """SIGKILL: a zombie until the server reaps it (empty command line)."""
        (self.root / str(pid) / "cmdline").write_bytes(b"")
        self._stat(pid, ppid, "Z", start)

    def reap(self, pid):
        """Gone from /proc; a ``stat`` descriptor kept open reads nothing (Linux: ESRCH)."""
        (self.root / str(pid) / "stat").write_bytes(b"")
        for f in (self.root / str(pid)).iterdir():
            f.unlink()
        (self.root / str(pid)).rmdir()


@pytest.fixture()
def proc(tmp_path):
    p = FakeProc(tmp_path)
    p.add(100, "classifier_fast", "classifier_fast_0_0", start=500)
    p.add(101, "classifier", "classifier_0_0", start=501)
    p.add(102, "router", "router_0_0", start=502)
    p.add(200, "classifier", "classifier_0_0", start=400, ppid=999)  # another server's stub
    (tmp_path / "self").mkdir()
    return p


def test_a_stub_that_exited_is_reported_with_python_backends_wording(proc):
    clock = Clock()
    watch = StubWatch(SERVER, proc.root, clock)
    assert watch.dead("classifier_fast") is None and watch.dead("classifier") is None
    proc.die(100, 500)
    assert watch.dead("classifier_fast") is None  # seen alive less than CHECK_S ago: not looked at
    clock.t += 2 * stubs.CHECK_S
    message = watch.dead("classifier_fast")
    assert message == "Stub process 'classifier_fast_0_0' is not healthy (process 100 has exited; seen in /proc before the call)"
    assert stub_is_dead(message)  # so the breaker opens at once and asks for a reload
    assert watch.dead("classifier") is None  # another model; 'classifier' is a prefix of its name
    clock.t += 10
    assert watch.dead("classifier_fast") == message  # still dead after a rescan (a zombie has no cmdline)


def test_a_reloaded_model_is_alive_once_its_new_stub_runs(proc):
    clock = Clock()
    watch = StubWatch(SERVER, proc.root, clock)
    assert watch.dead("classifier_fast") is None
    proc.die(100, 500)
    clock.t += 2 * stubs.CHECK_S
    assert watch.dead("classifier_fast")
    proc.add(300, "classifier_fast", "classifier_fast_0_0", start=900)  # the repair's new stub
    assert watch.dead("classifier_fast")  # not rescanned within RECHECK_S
    clock.t += 2 * stubs.RECHECK_S
    assert watch.dead("classifier_fast") is None
    proc.die(300, 900)  # and its death is seen too
    clock.t += 2 * stubs.CHECK_S
    assert watch.dead("classifier_fast") and "process 300" in watch.dead("classifier_fast")


def test_an_unloaded_model_is_not_reported(proc):
    clock = Clock()
    watch = StubWatch(SERVER, proc.root, clock)
    assert watch.dead("classifier") is None
    proc.reap(101)  # Triton stopped and reaped it: an unload, not a crash
    clock.t += 2 * max(stubs.RECHECK_S, stubs.CHECK_S)
    assert watch.dead("classifier") is None
    assert "classifier" not in watch.stubs


def test_models_without_stubs_and_other_servers_are_never_reported(proc):
    clock = Clock()
    watch = StubWatch(SERVER, proc.root, clock)
    proc.die(200, 400, ppid=999)  # another server's classifier stub
    assert watch.dead("classifier") is None
    assert watch.dead("onnx_model") is None  # a native backend: no stub at all
    proc.add(103, "late", "late_0_0", start=600)  # loaded after the last scan
    assert watch.dead("late") is None
    proc.die(103, 600)
    assert watch.dead("late") is None  # not known yet, and a zombie cannot be recognised
    assert StubWatch(None, proc.root, clock).dead("classifier_fast") is None  # disabled
    assert StubWatch(SERVER, proc.root / "absent", clock).dead("classifier_fast") is None  # unreadable: unknown


def test_the_breaker_fails_a_call_to_a_dead_stub_at_once():
    """``Downstream._call``: the stub watch is asked once the circuit lets a call through;
    a dead stub fails the call at once, and its circuit opens for a repair."""
    dead = {"m": None}
    unhealthy, called = [], []
    breaker = CircuitBreaker(BreakerSettings(consecutive_failures=5), on_unhealthy=unhealthy.append)

    async def bls(model, inputs, parameters, request_id, alone, options):
        called.append(1)
        return {"out": "answer"}

    client = SimpleNamespace(_stub_dead=lambda m: dead[m], _bls=bls)

    def call():
        return Downstream._call(client, breaker, "m", {}, None, "", True, CallOptions())

    assert asyncio.run(call()) == {"out": "answer"}
    dead["m"] = "Stub process 'm_0_0' is not healthy (process 7 has exited; seen in /proc before the call)"
    with pytest.raises(DownstreamError, match=r"Stub process 'm_0_0' is not healthy") as info:
        asyncio.run(call())
    assert isinstance(info.value, UnavailableError) and info.value.cause is Cause.STUB_DEAD
    assert called == [1]  # no call was made
    assert breaker.state("m") == OPEN and unhealthy == ["m"]


def test_the_policy_switches_the_watch_and_checks_its_type():
    from orchestrator.runtime.errors import PolicyError
    from orchestrator.runtime.routing.policy import parse_policy

    def policy(breaker):
        return parse_policy({"version": 1, "circuit_breaker": breaker, "root": {"kind": "model", "model": "m"}})

    assert policy({}).breaker.watch_stubs is True
    assert policy({"watch_stubs": False}).breaker.watch_stubs is False
    with pytest.raises(PolicyError, match=r"^policy\.circuit_breaker\.watch_stubs"):
        policy({"watch_stubs": "yes"})


# Stub command lines as python_backend's StubLauncher::Launch builds them (src/stub_launcher.cc).
R2410 = ["/opt/tritonserver/backends/python/triton_python_backend_stub", "/models/classifier_fast/1/model.py",
         "triton_python_backend_shm_region_7", "1048576", "1048576", "77", "/opt/tritonserver/backends/python", "336",
         "classifier_fast_0_0", "DEFAULT"]
# r25.08 and later: execv'd directly (no bash), a model's own stub, a runtime model directory
R2508 = ["/models/classifier_fast/triton_python_backend_stub", "/models/classifier_fast/1/model.py",
         "triton_python_backend_shm_region_2f1e", "16777216", "1048576", "77", "/opt/tritonserver/backends/python",
         "4096", "classifier_fast_1_3", "/opt/tritonserver/backends/python"]


def test_stub_command_lines_of_both_releases_name_model_and_instance():
    from orchestrator.runtime.bls.stubs import parse_stub_argv

    assert parse_stub_argv(R2410) == ("classifier_fast", "classifier_fast_0_0")
    assert parse_stub_argv(R2508) == ("classifier_fast", "classifier_fast_1_3")
    custom = R2508[:1] + ["/models/classifier_fast/1/other.py"] + R2508[2:]  # default_model_filename
    assert parse_stub_argv(custom) == ("classifier_fast", "classifier_fast_1_3")
    # r24.10 starts it through bash (with an env: source activate && exec env ... stub): not a stub yet
    assert parse_stub_argv(["bash", "-c", " exec " + " ".join(R2410)]) is None
    assert parse_stub_argv(["env", "LD_LIBRARY_PATH=/env/lib", *R2410]) is None
    # the stub that auto-completes a config is named after the model, not an instance
    assert parse_stub_argv(R2410[:8] + ["classifier_fast", "DEFAULT"]) is None
    assert parse_stub_argv(R2410[:2]) is None and parse_stub_argv([]) is None
    named = R2508[:8] + ["fast_group_0", R2508[9]]  # instance_group { name: "fast_group" }
    assert parse_stub_argv(named) == ("classifier_fast", "fast_group_0")


def test_a_stub_reaped_by_a_readiness_check_is_not_reported_but_a_repair_still_sees_its_replacement(proc):
    """From r25.12 a readiness request reaps a dead stub (StubActive: waitpid WNOHANG): no
    zombie is left, which looks like an unload here, so the call goes ahead (and fails after
    python_backend's 1 s); the repair's fresh look finds no live stub until the new one."""
    clock = Clock()
    watch = StubWatch(SERVER, proc.root, clock)
    assert watch.dead("classifier_fast") is None
    proc.die(100, 500)
    proc.reap(100)
    clock.t += 2 * max(stubs.RECHECK_S, stubs.CHECK_S)
    assert watch.dead("classifier_fast") is None
    assert watch.live("classifier_fast") == {}
    proc.add(300, "classifier_fast", "classifier_fast_0_0", start=900)
    assert watch.live("classifier_fast") == {"classifier_fast_0_0": (300, 900)}
    assert watch.live("classifier") == {"classifier_0_0": (101, 501)}  # not another server's (pid 200)
    assert StubWatch(None, proc.root, clock).live("classifier") is None  # disabled: cannot tell


def test_clock_ticks_read_uptime(tmp_path):
    import os

    from orchestrator.runtime.bls.stubs import clock_ticks

    (tmp_path / "uptime").write_text("12.34 56.78\n")
    assert clock_ticks(tmp_path) == int(12.34 * os.sysconf("SC_CLK_TCK"))
    assert clock_ticks(tmp_path / "absent") is None
    assert clock_ticks() > 0  # this machine's /proc


def test_on_this_machines_proc_a_child_is_alive_then_exited_then_gone():
    """The real ``/proc`` through the watch's kept descriptor: a live child is alive, a killed
    one a zombie (exited) until reaped, and gone once reaped (the kept descriptor answers
    ESRCH, so a reused pid cannot pass for the stub)."""
    import os
    import signal
    import subprocess

    from orchestrator.runtime.bls.stubs import read_stat

    child = subprocess.Popen(["sleep", "30"])
    try:
        watch = StubWatch(os.getpid())
        start = read_stat(child.pid)[2]
        assert watch._state(child.pid, start) == "alive" and (child.pid, start) in watch.fds
        assert watch._state(child.pid, start + 1) == "gone"  # another process with that pid
        fd = watch.fds[(child.pid, start)]
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie
        assert watch._state(child.pid, start) == "exited" and (child.pid, start) not in watch.fds
        with pytest.raises(OSError):
            os.fstat(fd)  # closed with its stub
        assert watch._state(child.pid, start) == "exited"
        child.wait()
        assert watch._state(child.pid, start) == "gone"
    finally:
        child.kill()
        child.wait()


def test_descriptors_of_stubs_gone_are_closed(proc):
    """An unload or a reload ends a stub: its kept descriptor is closed (at its next look or
    at the next scan), so reloads leave no open files behind; close() closes the rest."""
    import os

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    clock = Clock()
    before = open_fds()
    watch = StubWatch(SERVER, proc.root, clock)
    assert watch.dead("classifier_fast") is None and watch.dead("classifier") is None
    assert set(watch.fds) == {(100, 500), (101, 501)} and open_fds() == before + 2
    proc.reap(101)  # unloaded: never asked for again
    proc.add(300, "classifier_fast", "classifier_fast_0_0", start=900)  # reloaded: the new stub runs
    # before the old one has exited (still alive here): the newest is the instance's stub
    clock.t += 2 * stubs.RESCAN_S
    assert watch.dead("late") is None  # an unknown model: a scan
    assert watch.dead("classifier_fast") is None
    assert set(watch.fds) == {(300, 900)} and open_fds() == before + 1
    watch.close()
    assert watch.fds == {} and open_fds() == before
    assert watch.dead("classifier_fast") is None  # still answers after close()
