"""Model control from inside the router: on-demand models loaded on first use and unloaded
when idle, and models whose stub process died reloaded (repaired).

What the hosting server allows is read from its command line (:class:`ServerOptions`),
because a model-control request that must fail can abort Triton 2.51 (see there).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from orchestrator.runtime.errors import DownstreamError
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.nodes.model import OnDemand


@dataclass(frozen=True)
class ServerOptions:
    """What the hosting ``tritonserver``'s command line says about model control.

    ``mode``: the ``--model-control-mode`` value (``none`` when the flag is absent, as in
    Triton), or None when the command line could not be read. ``repositories``: the
    ``--model-repository``/``--model-store`` paths, absolute, or None when unknown or when
    any of them is not a local path (``s3://``, ``gs://``, ``as://``).

    Why the router reads them: in Triton 2.51 (python_backend ``ProcessMessage``) a
    ``pb_utils.load_model`` that fails frees the error text in shared memory before the
    stub reads it; the stub then frees it again, the shared-memory allocator is corrupted
    and the server aborts (``boost::interprocess::lock_exception``). A refused load in
    ``--model-control-mode=none`` and a load of a model that is in no repository are
    failures known in advance, so the router does not ask for them. docs/deployment.md
    has the details and the reproduction.
    """

    mode: Optional[str] = None
    repositories: Optional[tuple] = None

    @classmethod
    def parse(cls, argv: Sequence[str], cwd: Path) -> "ServerOptions":
        """Options from ``tritonserver`` arguments (``--flag=value`` or ``--flag value``;
        the last occurrence of ``--model-control-mode`` wins, as in Triton)."""
        mode, repositories = "none", []
        args = list(argv[1:])
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=")
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            if flag == "--model-control-mode":
                mode = value.strip().lower()
            elif flag in ("--model-repository", "--model-store"):
                repositories.append(value)
        local = None
        if repositories and not any("://" in r for r in repositories):
            local = tuple((cwd / r).resolve() for r in repositories)
        return cls(mode, local)

    @classmethod
    def of_parent(cls) -> "ServerOptions":
        """Options of this process's parent when it is ``tritonserver`` (Linux ``/proc``);
        empty options (all unknown) otherwise, e.g. under the in-process mock."""
        proc = Path("/proc") / str(os.getppid())
        try:
            argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
            if not argv or not Path(argv[0]).name.startswith("tritonserver"):
                return cls()
            return cls.parse(argv, Path(os.readlink(proc / "cwd")))
        except (OSError, UnicodeDecodeError):
            return cls()

    def missing(self, model: str) -> Optional[str]:
        """Why loading ``model`` must fail, when the local repositories show it; else None."""
        if self.repositories is None or any((r / model).is_dir() for r in self.repositories):
            return None
        return f"model '{model}' is in no model repository ({', '.join(map(str, self.repositories))})"


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
            self.pb.load_model(model_name=model)
        except Exception as exc:  # the stub raises TritonModelException
            message = str(exc)
            with self.guard:
                self.loading.pop(model).set()
                if "explicit model load" in message or "not allowed" in message:
                    self._disable(message)
                    raise DownstreamError(f"model '{model}' is not ready and on-demand loading is unavailable: {message}")
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
                self.pb.unload_model(model_name=m)
                self.metrics.inc("orchestrator_model_unloads_total", model=m)
                self.logger.log_info(f"router: unloaded idle on-demand model '{m}'")
            except Exception as exc:
                self.logger.log_warn(f"router: unloading '{m}' failed: {exc}")
        return idle

    def _reap_loop(self) -> None:
        period = max(0.2, min(s.idle_timeout_s for s in self.settings.values()) / 4)
        while not self.stop.wait(min(period, 5.0)):
            self.reap()

    def repair(self, model: str) -> bool:
        """Reload ``model`` (its stub process died) in a background thread.

        Triton 2.51 neither restarts a dead Python-backend stub nor marks its model not
        ready; a load request for the loaded model starts new instances (measured here:
        about 2 s; docs/reliability.md). The load is sent only under explicit model
        control, for a model found in the server's repositories (a load that must fail can
        abort Triton 2.51, see :class:`ServerOptions`), at most once per
        ``repair_interval_s`` per model, and never while a load of it is under way.

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
        self.logger.log_warn(f"router: the stub process of '{model}' is not healthy; reloading the model")
        threading.Thread(target=self._repair, args=(model, event), name="orchestrator-repair", daemon=True).start()
        return True

    def _repair(self, model: str, event: threading.Event) -> None:
        start = time.monotonic()
        try:
            self.pb.load_model(model_name=model)
            outcome = "success"
        except Exception as exc:  # the stub raises TritonModelException
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
        self.stop.set()
