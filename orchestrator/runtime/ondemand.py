"""On-demand models loaded on first use and unloaded when idle, and models whose stub
process died reloaded (repaired); requests go through ``control.RepositoryControl``, and
what the hosting server allows is read from its command line (``control.ServerOptions``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Dict, List, Mapping, Optional

from orchestrator.runtime.control import ControlError, RepositoryControl, ServerOptions
from orchestrator.runtime.errors import DownstreamError
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.nodes.model import OnDemand


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
        repair_interval_s: at most one :meth:`repair` per model in this many seconds.
        on_repaired: ``(model)`` after a successful repair.
    """

    def __init__(
        self,
        pb,
        on_demand: Mapping[str, OnDemand],
        metrics: Metrics,
        logger,
        server: Optional[ServerOptions] = None,
        repair_interval_s: float = 30.0,
        on_repaired=None,
    ):
        self.pb, self.settings, self.metrics, self.logger = pb, dict(on_demand), metrics, logger
        self.server = ServerOptions.of_parent() if server is None else server
        self.control_api = RepositoryControl(pb, self.server)
        # Load requests are possible under explicit control (or when the mode is unknown).
        self.control = self.server.mode in (None, "explicit")
        self.repair_interval_s = repair_interval_s
        self.on_repaired = on_repaired
        self.repaired: Dict[str, float] = {}  # model -> monotonic time of its last repair
        self.enabled = bool(self.settings)
        if self.enabled and not self.control:
            self._disable(f"the server runs with --model-control-mode={self.server.mode}; pb_utils.load_model needs explicit")
        self.ours = set()
        self.last_used: Dict[str, float] = {}
        self.in_use: Dict[str, int] = {m: 0 for m in self.settings}
        self.failed: Dict[str, tuple] = {}  # model -> (monotonic time, message)
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

    def _load_failed(self, model: str, message: str) -> DownstreamError:
        """Record a failed load (no retry before ``retry_after_s``); the error to raise. Hold ``guard``."""
        self.failed[model] = (time.monotonic(), message)
        self.metrics.inc("orchestrator_model_loads_total", model=model, outcome="failure")
        return DownstreamError(f"model '{model}' failed to load: {message}")

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
                        raise DownstreamError(f"model '{model}' failed to load: {failed[1]} (next try in {wait:.0f} s)")
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
                    raise DownstreamError(f"model '{model}' is not ready and on-demand loading is unavailable: {message}") from None
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
        """Reload ``model`` (its stub process died) in a background thread.

        Triton 2.51 neither restarts a dead Python-backend stub nor marks its model not
        ready; a load request for the loaded model starts new instances (measured here:
        about 2 s; docs/reliability.md), sent through the server's HTTP API so the router
        keeps answering meanwhile (``control``). The load is sent only under explicit model
        control, for a model found in the server's repositories (a load that must fail can
        abort Triton 2.51, see :class:`ServerOptions`), at most once per
        ``repair_interval_s`` per model, and never while a load of it is under way. It
        starts ``delay_s`` after the call, so the answers of the ``execute`` that found the
        stub dead (from a fallback) leave first: in Triton 2.51 the router's BLS calls wait
        while a model whose stub died is reloaded (measured here: 2 to 3 s;
        docs/reliability.md).

        Returns:
            True when a reload was started.
        """
        now = time.monotonic()
        with self.guard:
            last = self.repaired.get(model)
            if not self.control or model in self.loading or (last is not None and now - last < self.repair_interval_s):
                return False
            missing = self.server.missing(model)
            if missing:
                self.logger.log_warn(f"router: not reloading '{model}': {missing}")
                return False
            self.repaired[model] = now
            event = self.loading[model] = threading.Event()
        self.logger.log_warn(f"router: the stub process of '{model}' is not healthy; reloading the model (repository API over {self.control_api.via})")
        threading.Thread(target=self._repair, args=(model, event, delay_s), name="orchestrator-repair", daemon=True).start()
        return True

    def _repair(self, model: str, event: threading.Event, delay_s: float) -> None:
        if self.stop.wait(delay_s):
            with self.guard:
                self.loading.pop(model, None)
                event.set()
            return
        start = time.monotonic()
        try:
            self.control_api.load(model)
            outcome = "success"
        except ControlError as exc:
            outcome = "failure"
            self.logger.log_error(f"router: reloading '{model}' failed: {exc}")
        finally:
            with self.guard:
                self.loading.pop(model, None)
                event.set()
        self.metrics.inc("orchestrator_model_reloads_total", model=model, outcome=outcome)
        if outcome == "success":
            self.logger.log_info(f"router: reloaded '{model}' in {time.monotonic() - start:.1f} s")
            if self.on_repaired:
                self.on_repaired(model)

    def close(self) -> None:
        """Stop the unloader and any delayed repair."""
        self.stop.set()
