"""On-demand models loaded on first use and unloaded when idle, and models whose stub
process died reloaded (repaired); requests go through ``control.RepositoryControl``, and
what the hosting server allows is read from its command line (``control.ServerOptions``).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from orchestrator.runtime.bls.control import RepositoryControl, ServerOptions
from orchestrator.runtime.bls.stubs import StubWatch
from orchestrator.runtime.errors import Cause, ControlError, UnavailableError
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.routing.nodes.model import OnDemand

#: The longest extra wait before repairing a model that was repaired less than
#: ``repair_interval_s`` ago (seconds): with a reload of 2.5-4 s here, at most one reload
#: every 7 s or so for a stub that keeps dying.
MAX_REPEAT_DELAY_S = 4.0
#: Seconds after a repair ended in which a "stub not healthy" report is taken for one about
#: the old instance (python_backend's 1 s health timeout, plus a margin).
STALE_S = 1.5


class ModelManager:
    """Loads ``on_demand`` models on first use, unloads them after their idle timeout, and
    reloads models whose stub process died (:meth:`repair`).

    Only models the policy marks ``on_demand`` are ever loaded or unloaded, and only models
    this router loaded itself are unloaded. Concurrent first uses share one load. A failed
    load fails the texts that needed it (a ``fallback`` node may answer them) and is not
    retried before ``retry_after_s``. Needs ``--model-control-mode=explicit``: under any
    other mode (read from the server's command line, see :class:`ServerOptions`), or when
    the server refuses a load, the router logs it once and treats those models as always
    loaded. A model that is in none of the server's local repositories fails without a
    load request.

    Args:
        pb: ``triton_python_backend_utils``.
        on_demand: model name -> its on-demand settings.
        metrics: where load, unload and reload counts go.
        logger: ``pb_utils.Logger``.
        server: the hosting server's options (default: read from the parent process).
        repair_interval_s: the longest wait between two repair attempts of one model, and
            how long a repaired model must stay up before its next repair starts without
            extra delay (seconds; :meth:`repair`).
        on_repaired: ``(model)`` after a repair that did not fail.
        stubs: where the server's stub processes are seen (default: this process's parent
            through ``/proc``, :meth:`StubWatch.of_parent`).
        control_api: how loads are sent (default: the server's repository API,
            :class:`RepositoryControl`).
        verify_s: seconds a repair waits, after its reload returned, for a new stub process
            and a ready model.
        retry_s: seconds before a failed repair's first retry (doubled each time).
    """

    def __init__(
        self,
        pb: Any,
        on_demand: Mapping[str, OnDemand],
        metrics: Metrics,
        logger: Any,
        server: Optional[ServerOptions] = None,
        repair_interval_s: float = 30.0,
        on_repaired: Optional[Callable[[str], None]] = None,
        stubs: Optional[StubWatch] = None,
        control_api: Optional[Any] = None,
        verify_s: float = 10.0,
        retry_s: float = 1.0,
    ):
        self.pb, self.settings, self.metrics, self.logger = pb, dict(on_demand), metrics, logger
        self.server = ServerOptions.of_parent() if server is None else server
        self.control_api = RepositoryControl(pb, self.server) if control_api is None else control_api
        self.stubs = StubWatch.of_parent() if stubs is None else stubs
        self.verify_s, self.retry_s = verify_s, retry_s
        # Load requests are possible under explicit control (or when the mode is unknown).
        self.control = self.server.mode in (None, "explicit")
        self.repair_interval_s = repair_interval_s
        self.on_repaired = on_repaired
        self.repaired: Dict[str, float] = {}  # model -> monotonic time of its last repair
        self.streak: Dict[str, int] = {}  # model -> repairs in a row, each within repair_interval_s of the last
        self.enabled = bool(self.settings)
        if self.enabled and not self.control:
            self._disable(f"the server runs with --model-control-mode={self.server.mode}; pb_utils.load_model needs explicit")
        self.ours: Set[str] = set()
        self.last_used: Dict[str, float] = {}
        self.in_use: Dict[str, int] = {m: 0 for m in self.settings}
        self.failed: Dict[str, Tuple[float, str]] = {}  # model -> (monotonic time, message)
        self.guard = threading.Lock()
        self.loading: Dict[str, threading.Event] = {}
        self.stop = threading.Event()
        self.reaper = None
        if self.enabled:
            self.reaper = threading.Thread(target=self._reap_loop, name="orchestrator-unloader", daemon=True)
            self.reaper.start()

    def _disable(self, reason: str) -> None:
        """Stop loading and unloading; on-demand models count as always loaded from now on."""
        self.enabled = False
        self.control = False
        self.logger.log_warn(f"router: on-demand loading is unavailable ({reason}); treating {sorted(self.settings)} as always loaded")

    def _load_failed(self, model: str, message: str) -> UnavailableError:
        """Record a failed load (no retry before ``retry_after_s``); the error to raise. Hold ``guard``."""
        self.failed[model] = (time.monotonic(), message)
        self.metrics.inc("orchestrator_model_loads_total", model=model, outcome="failure")
        return UnavailableError(f"model '{model}' failed to load: {message}", Cause.NOT_LOADED)

    def _load_blocking(self, model: str) -> None:
        """Load ``model`` unless ready; one thread loads, the others wait for it."""
        while True:
            with self.guard:
                if self.pb.is_model_ready(model):
                    return
                event = self.loading.get(model)
                if event is None:
                    failed = self.failed.get(model)
                    if failed and time.monotonic() - failed[0] < self.settings[model].retry_after_s:
                        wait = self.settings[model].retry_after_s - (time.monotonic() - failed[0])
                        raise UnavailableError(
                            f"model '{model}' failed to load: {failed[1]} (next try in {wait:.0f} s)", Cause.NOT_LOADED
                        )
                    missing = self.server.missing(model)
                    if missing:  # a load request that must fail can crash the server (ServerOptions)
                        raise self._load_failed(model, missing)
                    event = self.loading[model] = threading.Event()
                    break
            event.wait()
        try:
            self.control_api.load(model)
        except ControlError as exc:
            message = str(exc)
            with self.guard:
                self.loading.pop(model).set()
                if "explicit model load" in message or "not allowed" in message:
                    self._disable(message)
                    raise UnavailableError(
                        f"model '{model}' is not ready and on-demand loading is unavailable: {message}", Cause.NOT_LOADED
                    ) from None
                raise self._load_failed(model, message) from None
        with self.guard:
            self.ours.add(model)
            self.failed.pop(model, None)
            self.loading.pop(model).set()
        self.metrics.inc("orchestrator_model_loads_total", model=model, outcome="success")
        self.logger.log_info(f"router: loaded on-demand model '{model}'")

    async def acquire(self, model: str) -> None:
        """Mark ``model`` in use and make sure it is loaded (no-op unless on-demand)."""
        if model not in self.settings:
            return
        with self.guard:
            self.in_use[model] += 1
            self.last_used[model] = time.monotonic()
        if not self.enabled:
            return
        try:
            if not self.pb.is_model_ready(model):
                await asyncio.get_running_loop().run_in_executor(None, self._load_blocking, model)
        except BaseException:
            self.release(model)
            raise

    def release(self, model: str) -> None:
        """Mark one use of ``model`` finished (its idle time starts when none is left)."""
        if model in self.settings:
            with self.guard:
                self.in_use[model] -= 1
                self.last_used[model] = time.monotonic()

    def reap(self, now: Optional[float] = None) -> List[str]:
        """Unload our idle models; returns their names."""
        now = time.monotonic() if now is None else now
        with self.guard:
            idle = [
                m
                for m in self.ours
                if self.in_use[m] == 0 and now - self.last_used.get(m, now) >= self.settings[m].idle_timeout_s
            ]
            for m in idle:
                self.ours.discard(m)
        for m in idle:
            try:
                self.control_api.unload(m)
                self.metrics.inc("orchestrator_model_unloads_total", model=m)
                self.logger.log_info(f"router: unloaded idle on-demand model '{m}'")
            except Exception as exc:
                self.logger.log_warn(f"router: unloading '{m}' failed: {exc}")
        return idle

    def _reap_loop(self) -> None:
        period = max(0.2, min(s.idle_timeout_s for s in self.settings.values()) / 4)
        while not self.stop.wait(min(period, 5.0)):
            self.reap()

    def repair(self, model: str, delay_s: float = 0.25) -> bool:
        """Repair ``model`` (its stub process died) in a background thread: reload it with
        new instances and check that a new stub process runs; retried with back-off until it
        does.

        Triton neither restarts a dead Python-backend stub nor, before r25.12, marks its
        model not ready, and a plain load of a loaded model whose directory did not change
        does nothing (Triton 2.51). So each attempt (:meth:`_repair_once`):

        1. takes a lock shared by every router instance of this server (an abstract Unix
           socket named after the server's pid and the model; freed when its holder
           exits); one held by another instance means that one repairs: wait for it;
        2. does nothing when every instance of the model already runs a stub started after
           the failure was seen (another router instance or an operator repaired it);
        3. reloads it in a way Triton cannot skip (``RepositoryControl.reload``: the loaded
           configuration with one parameter changed, over gRPC, else HTTP);
        4. succeeds only when, within ``verify_s``, every instance of the model runs a stub
           started after the reload was sent and the server reports the model ready.

        Outcomes, counted in ``orchestrator_model_reloads_total{model,outcome}``:
        ``success``, ``already_repaired`` (step 2), ``unverified`` (the load succeeded but
        ``/proc`` cannot show stubs: no retry), ``failure`` (refused, failed, or no new
        stub: retried after ``retry_s``, then twice as long each time, at most
        ``repair_interval_s`` seconds). The first attempt starts ``delay_s`` seconds after
        the call, so the answers of the ``execute`` that found the stub dead (from a
        fallback) leave first; a model repaired less than ``repair_interval_s`` ago waits
        twice as long each time, up to :data:`MAX_REPEAT_DELAY_S` (a stub that keeps dying
        is not reloaded in a tight loop, one killed now and then still heals within
        seconds). Loads are sent only under explicit model control, for a model found in
        the server's repositories (a load that must fail can abort Triton 2.51, see
        :class:`ServerOptions`), and one repair per model at a time.

        A failure reported less than :data:`STALE_S` after a repair of the model ended, while
        the new stubs run, is not repaired again: a call waiting python_backend's 1 s health
        timeout began before the new instance took over (the next failure, if real, starts
        a repair).

        Returns:
            True when a repair is under way (started now or before); False when none is
            possible or the failure is stale.
        """
        now = time.monotonic()
        with self.guard:
            if model in self.loading:
                return self.control
            if not self.control:
                return False
            if now - self.repaired.get(model, float("-inf")) < STALE_S and self.stubs.live(model):
                return False  # stale: the new stubs run (a dead newest stub is not in live())
            missing = self.server.missing(model)
            if missing:
                self.logger.log_warn(f"router: not reloading '{model}': {missing}")
                return False
            last = self.repaired.get(model)
            streak = self.streak.get(model, 0) if last is not None and now - last < self.repair_interval_s else 0
            self.streak[model] = streak
            event = self.loading[model] = threading.Event()
        seen = self.stubs.ticks()  # a stub started after this replaced the dead one
        delay = min(self.repair_interval_s, MAX_REPEAT_DELAY_S, delay_s * 2 ** streak)
        self.logger.log_warn(
            f"router: the stub process of '{model}' is not healthy; repairing the model in {delay:.2f} s "
            f"(repository API over {self.control_api.via})"
        )
        threading.Thread(target=self._repair, args=(model, event, delay, seen), name="orchestrator-repair", daemon=True).start()
        return True

    def _repair(self, model: str, event: threading.Event, delay_s: float, seen: Optional[int]) -> None:
        backoff = self.retry_s
        try:
            while not self.stop.wait(delay_s):
                start = time.monotonic()
                outcome, detail = self._repair_once(model, seen)
                self.metrics.inc("orchestrator_model_reloads_total", model=model, outcome=outcome)
                if outcome != "failure":
                    self.logger.log_info(f"router: repaired '{model}' in {time.monotonic() - start:.1f} s ({outcome}: {detail})")
                    with self.guard:
                        self.repaired[model] = time.monotonic()
                        self.streak[model] = self.streak.get(model, 0) + 1
                    if self.on_repaired:
                        self.on_repaired(model)
                    return
                self.logger.log_error(f"router: repairing '{model}' failed: {detail}; next try in {backoff:.0f} s")
                delay_s, backoff = backoff, min(self.repair_interval_s, backoff * 2)
        finally:
            with self.guard:
                self.loading.pop(model, None)
                event.set()

    def _replaced(self, model: str, since: Optional[int], strict: bool = False) -> Optional[bool]:
        """Whether every instance of ``model`` runs a stub started at or after (``strict``:
        after) ``since`` (clock ticks, 10 ms) and the model is ready; None when ``/proc``
        cannot tell."""
        live = self.stubs.live(model)
        if live is None or since is None:
            return None
        if not live or any(start < since + strict for _, start in live.values()):
            return False
        try:
            return bool(self.pb.is_model_ready(model))
        except Exception:  # the check must not end the repair thread
            return False

    def _repair_once(self, model: str, seen: Optional[int]) -> Tuple[str, str]:
        """One attempt (see :meth:`repair`); ``(outcome, what happened)``."""
        lock = _RepairLock(self.stubs.server_pid, model)
        if not lock.acquire():
            waited = lock.wait(self.verify_s + getattr(self.control_api, "timeout_s", 300.0), self.stop)
            if self._replaced(model, seen, strict=True):
                return "already_repaired", f"another router instance reloaded it (waited {waited:.1f} s for its lock)"
            if not lock.acquire():
                return "failure", "another router instance holds the repair lock"
        try:
            if self._replaced(model, seen, strict=True):  # the same tick: not surely a replacement
                return "already_repaired", "every instance already runs a stub started after the failure"
            sent = self.stubs.ticks()
            try:
                how = self.control_api.reload(model, str(time.time_ns()))
            except ControlError as exc:
                return "failure", str(exc)
            deadline = time.monotonic() + self.verify_s
            while True:
                replaced = self._replaced(model, sent)
                if replaced is None:
                    return "unverified", f"reloaded ({how}); /proc shows no stubs to check"
                if replaced:
                    pids = sorted(pid for pid, _ in (self.stubs.live(model) or {}).values())
                    return "success", f"reloaded ({how}), new stub process {', '.join(map(str, pids))}"
                if time.monotonic() >= deadline or self.stop.wait(0.05):
                    return "failure", f"reloaded ({how}) but no new stub process of '{model}' is up and ready after {self.verify_s:g} s"
        finally:
            lock.release()

    def close(self) -> None:
        """Stop the unloader and any delayed repair."""
        self.stop.set()


class _RepairLock:
    """One repair of ``model`` at a time among the router instances of one server: an
    abstract Unix socket (Linux; no file, freed by the kernel when its holder exits) named
    after the server's pid and the model. Where it cannot be made (another OS), every
    acquire succeeds and the check for a replaced stub is the only guard."""

    def __init__(self, server_pid: Optional[int], model: str):
        self.name = f"\0orchestrator-repair-{server_pid}-{model}"
        self.sock: Optional[socket.socket] = None

    def acquire(self) -> bool:
        """True when this object now holds the lock (or locking is unavailable)."""
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except (AttributeError, OSError):
            return True
        try:
            sock.bind(self.name)
        except OSError as exc:
            sock.close()
            return exc.errno != errno.EADDRINUSE
        self.sock = sock
        return True

    def wait(self, timeout_s: float, stop: threading.Event) -> float:
        """Wait until no one holds the lock (at most ``timeout_s``); seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s and not stop.wait(0.1):
            if self.acquire():
                self.release()
                break
        return time.monotonic() - start

    def release(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
