"""ModelManager.repair with fakes: a fake /proc (tests/unit/test_stubs.FakeProc), a fake
control whose reload does what Triton does (starts a new stub, or, like Triton 2.51 with an
unchanged model directory, nothing), a fake pb_utils. A repair counts as done only when a
new stub process runs; otherwise it is a counted failure, retried."""

from __future__ import annotations

import os
import threading
import time

import pytest

from orchestrator.runtime.bls.control import ServerOptions
from orchestrator.runtime.bls.ondemand import ModelManager, _RepairLock
from orchestrator.runtime.bls.stubs import StubWatch
from orchestrator.runtime.errors import ControlError
from tests.helpers import Log
from tests.unit.test_stubs import FakeProc

TICKS = os.sysconf("SC_CLK_TCK")
#: The fake server's pid: the repair lock is an abstract Unix socket named after it, shared by
#: every process of this machine, so a constant would let two pytest runs at once (two
#: checkouts) take each other's lock.
SERVER = 4_000_000 + os.getpid()


class Proc(FakeProc):
    """FakeProc with a boot clock (``uptime``) that moves on by itself."""

    def __init__(self, root):
        super().__init__(root)
        self.t0 = time.monotonic()
        self.pid = 1000

    def ticks(self) -> int:
        return int((1000 + time.monotonic() - self.t0) * TICKS)

    def write_uptime(self) -> None:
        """Atomically, as the kernel answers a read of /proc/uptime: several repair threads
        write and read it at once (a reader of a half-written file gets no clock, and a
        repair without a clock cannot see that another instance already replaced the stub)."""
        tmp = self.root / f"uptime.{threading.get_ident()}"
        tmp.write_text(f"{self.ticks() / TICKS:.2f} 0.00\n")
        os.replace(tmp, self.root / "uptime")

    def start(self, model: str, instance: str) -> int:
        self.pid += 1
        self.add(self.pid, model, instance, start=self.ticks(), ppid=SERVER)
        return self.pid


class Uptime(StubWatch):
    """A watch on the fake /proc whose uptime is written before every look."""

    def ticks(self):
        self.proc_obj.write_uptime()
        return super().ticks()

    def live(self, model):
        self.proc_obj.write_uptime()
        return super().live(model)


class Control:
    """``reload``: ``new`` starts a new stub for each instance (and reaps the old ones),
    ``noop`` returns at once and starts nothing (Triton 2.51, directory unchanged),
    ``refuse`` raises a refusal. With a ``gate``, a reload returns only once it is set."""

    via, timeout_s = "grpc", 5.0

    def __init__(self, proc: Proc, behaviour: str = "new", delay_s: float = 0.0, gate: "threading.Event | None" = None):
        self.proc, self.behaviour, self.delay_s, self.gate = proc, behaviour, delay_s, gate
        self.calls, self.lock = [], threading.Lock()

    def reload(self, model, stamp):
        with self.lock:
            self.calls.append(model)
        time.sleep(self.delay_s)
        if self.gate is not None:
            assert self.gate.wait(10.0), "the test never opened the gate"
        if self.behaviour == "refuse":
            raise ControlError("the server refused the load of 'm': This protocol is restricted", refused=True)
        if self.behaviour == "new":
            self.proc.start(model, f"{model}_0_0")
        return "config"


class Pb:
    def __init__(self):
        self.ready = True

    def is_model_ready(self, name):
        return self.ready


class Counter:
    def __init__(self):
        self.seen = []

    def inc(self, family, value=1.0, **labels):
        self.seen.append((family, labels["model"], labels.get("outcome")))

    def outcomes(self):
        return [o for f, _, o in self.seen if f == "orchestrator_model_reloads_total"]



@pytest.fixture()
def proc(tmp_path):
    p = Proc(tmp_path)
    p.write_uptime()
    p.start("classifier_fast", "classifier_fast_0_0")
    p.start("classifier", "classifier_0_0")
    (tmp_path / "classifier_fast").mkdir()
    return p


_OPEN = []


@pytest.fixture(autouse=True)
def _close_managers():
    """A failed test must not leave a repair thread retrying (it holds the lock at times)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def manager(proc, control, **kwargs):
    watch = Uptime(SERVER, proc.root)
    watch.proc_obj = proc
    repaired, metrics, log = [], Counter(), Log()
    m = ModelManager(Pb(), {}, metrics, log, server=ServerOptions("explicit", (proc.root,)), on_repaired=repaired.append,
                     stubs=watch, control_api=control, verify_s=0.3, retry_s=0.05, **kwargs)
    _OPEN.append(m)
    return m, repaired, metrics, log


def wait_for(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def kill(proc, pid):
    proc.die(pid, int((proc.root / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]), ppid=SERVER)


def test_a_reload_that_starts_no_new_stub_is_a_counted_failure_and_is_retried(proc):
    """Triton 2.51 answers a load of an unchanged loaded model at once and starts nothing:
    the repair must not report success then."""
    control = Control(proc, "noop")
    m, repaired, metrics, log = manager(proc, control)
    kill(proc, 1001)
    assert m.repair("classifier_fast", delay_s=0.0) is True
    assert wait_for(lambda: len(metrics.outcomes()) >= 2)
    assert set(metrics.outcomes()) == {"failure"} and repaired == []
    assert any("no new stub process of 'classifier_fast' is up and ready" in line for line in log.lines)
    assert m.repair("classifier_fast") is True  # under way: the retries go on, no second repair starts
    assert sum(t.name == "orchestrator-repair" for t in threading.enumerate()) == 1
    control.behaviour = "new"  # the next try works
    assert wait_for(lambda: repaired == ["classifier_fast"])
    assert metrics.outcomes()[-1] == "success" and metrics.outcomes().count("success") == 1
    assert "classifier_fast" not in m.loading
    m.close()


def test_a_reload_that_starts_a_new_stub_succeeds_once(proc):
    control = Control(proc, "new")
    m, repaired, metrics, log = manager(proc, control)
    kill(proc, 1001)
    assert m.repair("classifier_fast", delay_s=0.0) is True
    assert wait_for(lambda: repaired == ["classifier_fast"])
    assert metrics.outcomes() == ["success"] and control.calls == ["classifier_fast"]
    assert any("new stub process 1003" in line for line in log.lines)
    m.close()


def test_a_new_stub_that_is_not_ready_is_not_a_repair(proc):
    control = Control(proc, "new")
    m, repaired, metrics, _ = manager(proc, control)
    m.pb.ready = False
    kill(proc, 1001)
    m.repair("classifier_fast", delay_s=0.0)
    assert wait_for(lambda: metrics.outcomes() == ["failure"])
    assert repaired == []
    m.pb.ready = True
    assert wait_for(lambda: repaired == ["classifier_fast"])
    m.close()


def test_a_refused_reload_is_a_failure_naming_the_refusal(proc):
    control = Control(proc, "refuse")
    m, repaired, metrics, log = manager(proc, control)
    m.repair("classifier_fast", delay_s=0.0)
    assert wait_for(lambda: metrics.outcomes()[:1] == ["failure"])
    assert any("refused the load" in line and "restricted" in line for line in log.lines)
    m.close()


def test_a_stub_killed_before_the_watch_knew_it_is_repaired(proc):
    """The zombie of a stub never seen alive cannot be told apart (no command line): the
    repair still needs a stub started after the reload."""
    control = Control(proc, "noop")
    m, repaired, metrics, _ = manager(proc, control)
    kill(proc, 1001)  # before any look
    m.repair("classifier_fast", delay_s=0.0)
    assert wait_for(lambda: metrics.outcomes()[:1] == ["failure"])
    control.behaviour = "new"
    assert wait_for(lambda: repaired == ["classifier_fast"])
    m.close()


def test_two_router_instances_repair_once(proc):
    """Both instances see the dead stub: the lock lets one reload; the other finds the new
    stub and does not reload again.

    The reload waits for ``gate`` until both have seen the failure: without it, a main thread
    descheduled for the reload's 0.3 s (a loaded machine) let the second instance see the
    failure only after the first had repaired it: a failure this instance cannot tell from a
    new one (``STALE_S`` covers its own repairs only), so it reloaded again."""
    gate = threading.Event()
    control = Control(proc, "new", delay_s=0.3, gate=gate)
    a, a_done, a_metrics, _ = manager(proc, control)
    b, b_done, b_metrics, b_log = manager(proc, control)
    kill(proc, 1001)
    assert a.repair("classifier_fast", delay_s=0.0) and b.repair("classifier_fast", delay_s=0.02)
    gate.set()
    assert wait_for(lambda: a_done and b_done)
    assert control.calls == ["classifier_fast"]
    assert sorted(a_metrics.outcomes() + b_metrics.outcomes()) == ["already_repaired", "success"]
    a.close()
    b.close()


def test_a_repair_done_by_someone_else_is_not_repeated(proc):
    control = Control(proc, "new")
    m, repaired, metrics, log = manager(proc, control)
    kill(proc, 1001)
    lock = _RepairLock(SERVER, "classifier_fast")
    assert lock.acquire()  # another router instance is repairing
    m.repair("classifier_fast", delay_s=0.0)
    time.sleep(0.2)
    assert metrics.outcomes() == []
    time.sleep(0.02)
    proc.start("classifier_fast", "classifier_fast_0_0")  # its reload's new stub
    lock.release()
    assert wait_for(lambda: repaired == ["classifier_fast"])
    assert metrics.outcomes() == ["already_repaired"] and control.calls == []
    m.close()


def test_the_same_stub_killed_three_times_is_repaired_three_times_with_growing_delay(proc):
    control = Control(proc, "new")
    m, repaired, metrics, log = manager(proc, control, repair_interval_s=30.0)
    pid = 1001
    delays = []
    for i in range(3):
        kill(proc, pid)
        t = time.monotonic()
        assert m.repair("classifier_fast", delay_s=0.05) is True
        assert wait_for(lambda n=i + 1: len(repaired) == n)
        delays.append(time.monotonic() - t)
        pid = m.stubs.live("classifier_fast")["classifier_fast_0_0"][0]
    assert metrics.outcomes() == ["success"] * 3 and len(control.calls) == 3
    # 0.05 s, then 0.1 s, then 0.2 s before the reload: as planned (the log) and at least that
    # long (an upper bound would be a bet on the machine's load)
    planned = [float(line.split("repairing the model in ")[1].split(" s")[0]) for line in log.lines if "repairing the model in" in line]
    assert planned == [0.05, 0.1, 0.2]
    assert all(d >= p for d, p in zip(delays, planned)), delays
    m.close()


def test_the_lock_is_held_by_one_holder_and_freed_on_release():
    a, b = _RepairLock(SERVER, "m"), _RepairLock(SERVER, "m")
    assert a.acquire() and not b.acquire()
    for other in (_RepairLock(SERVER, "other"), _RepairLock(SERVER + 1, "m")):  # another model, another server
        assert other.acquire()
        other.release()
    a.release()
    assert b.acquire()
    b.release()


def test_a_late_failure_from_the_old_instance_right_after_a_repair_is_not_repaired_again(proc):
    """A call that waited python_backend's 1 s timeout on the old instance reports after the
    repair ended: the new stub runs, so no second reload; a dead newest stub is repaired."""
    control = Control(proc, "new")
    m, repaired, metrics, _ = manager(proc, control)
    kill(proc, 1001)
    m.repair("classifier_fast", delay_s=0.0)
    assert wait_for(lambda: repaired == ["classifier_fast"])
    assert m.repair("classifier_fast") is False  # stale: stub 1003 runs
    kill(proc, 1003)
    assert m.repair("classifier_fast", delay_s=0.0) is True  # the new stub itself died
    assert wait_for(lambda: len(repaired) == 2)
    assert control.calls == ["classifier_fast"] * 2


def test_the_breaker_holds_the_circuit_open_while_the_repair_runs():
    from orchestrator.runtime.bls.downstream import REPAIRING_OPEN_S, CircuitBreaker
    from orchestrator.runtime.bls.health import HALF_OPEN, OPEN
    from orchestrator.runtime.routing.settings import BreakerSettings

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock, under_way = Clock(), {"m": True}
    breaker = CircuitBreaker(BreakerSettings(open_s=5.0), on_unhealthy=lambda m: under_way[m], clock=clock)
    breaker.on_failure("m", "Stub process 'm_0_0' is not healthy.")
    clock.t = 6.0  # past open_s: without a repair this would probe
    assert breaker.state("m") == OPEN
    with pytest.raises(Exception, match="circuit open"):
        breaker.before_call("m")
    breaker.half_open("m")  # the repair ended
    assert breaker.state("m") == HALF_OPEN
    breaker.on_success("m")
    under_way["m"] = False  # no repair possible (e.g. --model-control-mode=none): the usual cool-down
    breaker.on_failure("m", "Stub process 'm_0_0' is not healthy.")
    clock.t += 5.0
    assert breaker.state("m") == HALF_OPEN
    under_way["m"] = True
    breaker.before_call("m")  # the probe
    breaker.on_failure("m", "Stub process 'm_0_0' is not healthy.")  # it failed: a repair starts
    clock.t += 6.0
    assert breaker.state("m") == OPEN
    clock.t += REPAIRING_OPEN_S  # a repair that never ends does not hold the circuit for ever
    assert breaker.state("m") == HALF_OPEN


class PartialControl(Control):
    """A reload that starts a new stub for the listed instances only (a fixture with one
    instance per model cannot tell "every instance" from "one instance")."""

    def __init__(self, proc, instances):
        super().__init__(proc, "noop")
        self.instances = instances

    def reload(self, model, stamp):
        super().reload(model, stamp)
        for name in self.instances:
            self.proc.start(model, name)
        return "config"


def test_a_model_with_several_instances_is_repaired_only_when_every_instance_has_a_new_stub(proc):
    """``classifier_fast`` with two instances (``count: 2``): a reload that replaced the stub
    of one instance and left the other's old stub running is no repair."""
    second = proc.pid = proc.pid + 1  # pid 1003, started a second ago (with its model's load)
    proc.add(second, "classifier_fast", "classifier_fast_0_1", start=proc.ticks() - TICKS, ppid=SERVER)
    control = PartialControl(proc, ["classifier_fast_0_0"])
    m, repaired, metrics, log = manager(proc, control)
    kill(proc, 1001)
    assert m.repair("classifier_fast", delay_s=0.0) is True
    assert wait_for(lambda: metrics.outcomes()[:1] == ["failure"]), (log.lines, metrics.seen)
    assert repaired == [] and any("no new stub process of 'classifier_fast' is up and ready" in line for line in log.lines)
    control.instances = ["classifier_fast_0_0", "classifier_fast_0_1"]  # the next reload replaces both
    assert wait_for(lambda: repaired == ["classifier_fast"])
    live = m.stubs.live("classifier_fast")
    assert sorted(live) == ["classifier_fast_0_0", "classifier_fast_0_1"] and second not in {pid for pid, _ in live.values()}
    assert metrics.outcomes()[-1] == "success"
