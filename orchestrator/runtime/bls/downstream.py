"""The router's downstream client: every BLS call it makes, behind one narrow interface.

:class:`Downstream` owns what a call to another model needs: the blocking or asynchronous
BLS request, a circuit breaker per model (:class:`CircuitBreaker`, below; the candidates of
``shadow`` nodes get breakers of their own, so their failures never open a circuit the
answers depend on), the look in ``/proc`` for a dead Python-backend stub
(``stubs.StubWatch``), readiness, and the repair of a model whose stub died
(``ondemand.ModelManager.repair``). Every BLS request asks for its outputs in CPU memory
(``serving.releases.cpu_outputs``, given by the router): a ``KIND_GPU`` model would otherwise answer in GPU memory, which
``as_numpy()`` refuses. :meth:`Downstream.not_ready` is the router's readiness (its
``is_ready()`` hook on releases that call it). The engine sees only its :meth:`Downstream.infer`
(``engine.InferFn``), the seam the tests fake; the router parses, runs, responds and warms
up (``router``).

The circuit breaker is the pattern Triton users know from Envoy/Istio outlier detection:
after ``consecutive_failures`` failed calls in a row to one model, the model's circuit OPENS and
calls to it fail at once (a ``fallback`` node answers instead) for ``open_s`` seconds; then
the circuit is HALF-OPEN and a single probe call decides: success closes it, failure opens
it again. A failure that says the model cannot serve at all opens the circuit at once:
its stub process is not healthy (Triton 2.51 keeps such a model READY and fails every call
to it after about 1 s, see docs/guides/reliability.md), or the model is not ready, unloaded or
unknown. Such failures are raised as ``errors.UnavailableError`` with their
``errors.Cause``; other failures stay ``errors.DownstreamError``.

When a circuit opens because the model's stub is not healthy, ``on_unhealthy`` is called
with the model's name (the router reloads the model there, see ``ondemand.ModelManager``);
while that repair is under way the circuit stays open (no probe reaches the old instance),
and its end ends the cool-down. A circuit opened because the model was not ready
(unloaded) asks ``ready_check`` (``pb_utils.is_model_ready``, at most every 0.5 s) while
open, so it probes as soon as an operator loads the model again.

State is per router instance (per replica): nothing is shared between processes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

from numpy.typing import NDArray

from orchestrator.runtime.bls.health import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    CircuitState,
    cause_of,
    classify,
)
from orchestrator.runtime.bls.ondemand import ModelManager
from orchestrator.runtime.bls.stubs import StubWatch
from orchestrator.runtime.errors import Cause, DownstreamError, UnavailableError
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.request import CallOptions
from orchestrator.runtime.routing import nodes as N
from orchestrator.runtime.routing.nodes.model import split_target
from orchestrator.runtime.routing.nodes.shadow import ShadowNode
from orchestrator.runtime.routing.policy import PipelinePolicy, Policy
from orchestrator.runtime.routing.settings import BreakerSettings

NO_OPTIONS = CallOptions()

#: Seconds between two ``ready_check`` calls for one open circuit.
READY_CHECK_INTERVAL_S = 0.5
#: The cool-down (seconds, if longer than ``open_s``) of a circuit whose model is being
#: repaired: a probe during the reload would reach the old, dead instance (Triton routes to
#: it until the new one is ready) and wait 1 s for nothing; the repair's end probes at once.
REPAIRING_OPEN_S = 30.0


class Downstream:
    """BLS calls of one router instance, through circuit breakers, with repairs.

    Args:
        pb: the ``triton_python_backend_utils`` module (or the mock's).
        policy: the bound policy (its ``circuit_breaker`` settings and models).
        metrics: where circuit states, transitions and on-demand loads are counted.
        logger: ``pb_utils.Logger``.
        router: the router model's own name (never repaired, never watched).
        cpu_memory: the ``preferred_memory`` of every BLS request (``serving.releases.cpu_outputs``:
            outputs in CPU memory).

    Attributes:
        models: the on-demand model manager (loads, idle unloads, repairs).
    """

    def __init__(self, pb: Any, policy: Union[Policy, PipelinePolicy], metrics: Metrics, logger: Any, router: str, cpu_memory: Any):
        self.pb, self.policy, self.metrics, self.logger, self.router = pb, policy, metrics, logger, router
        settings = policy.breaker
        self.stub_watch = StubWatch.of_parent() if settings.watch_stubs else StubWatch(None)
        self.breaker = CircuitBreaker(
            settings, on_change=self._circuit_changed, on_unhealthy=self._unhealthy, ready_check=self._ready,
        )
        self.shadow_breaker = CircuitBreaker(settings, ready_check=self._ready)
        self.cpu_memory = cpu_memory  # one PreferredMemory for every BLS request
        self.targets = {m: split_target(m) for m in policy.models()}  # call target -> (model, version), once
        self.models = ModelManager(
            pb, policy.on_demand(), metrics, logger,
            repair_interval_s=settings.reload_interval_s, on_repaired=self.breaker.half_open,
        )
        for model in policy.models():
            metrics.set("orchestrator_circuit_state", CircuitState.CLOSED.gauge, model=model)

    def close(self) -> None:
        """Stop the on-demand manager's background thread; close the stub watch's descriptors."""
        self.models.close()
        self.stub_watch.close()

    # -- the engine's InferFn (engine.InferFn): outputs by name, or DownstreamError

    async def infer(self, model: str, inputs: Dict[str, NDArray[Any]], parameters: Optional[Dict[str, Any]], request_id: str,
                    alone: bool = False, options: CallOptions = NO_OPTIONS) -> Dict[str, NDArray[Any]]:
        """One call to ``model`` through its circuit breaker (raises DownstreamError)."""
        return await self._call(self.breaker, model, inputs, parameters, request_id, alone, options)

    async def shadow_infer(self, model: str, inputs: Dict[str, NDArray[Any]], parameters: Optional[Dict[str, Any]], request_id: str,
                           alone: bool = False, options: CallOptions = NO_OPTIONS) -> Dict[str, NDArray[Any]]:
        """Like :meth:`infer`, through the shadow candidates' own breakers."""
        return await self._call(self.shadow_breaker, model, inputs, parameters, request_id, alone, options)

    async def call_step(self, model: str, inputs: Dict[str, NDArray[Any]], parameters: Dict[str, Any], request_id: str,
                        alone: bool, options: CallOptions, outputs: Sequence[str], several: bool) -> Dict[str, NDArray[Any]]:
        """A pipeline step's call (``execution.pipeline.CallFn``): like :meth:`infer`, asking
        for ``outputs`` only (raises DownstreamError). ``several``: the call holds rows of
        several requests, which are retried one by one when it fails: its plain failure
        (one that does not say the model cannot serve) is no verdict on the model, the
        retries' are."""
        async with self.breaker.guard(model, neutral=several):
            dead = self._stub_dead(model)
            if dead:
                raise UnavailableError(dead, Cause.STUB_DEAD)
            return await self._bls(model, inputs, parameters, request_id, alone, options, outputs)

    @staticmethod
    async def no_infer(model: str, inputs: Dict[str, NDArray[Any]], parameters: Optional[Dict[str, Any]], request_id: str,
                       alone: bool = False, options: CallOptions = NO_OPTIONS) -> Dict[str, NDArray[Any]]:
        """The warmup's InferFn: no downstream call is made (raises DownstreamError)."""
        raise DownstreamError(f"model '{model}' is not called during warmup")

    async def _call(self, breaker: CircuitBreaker, model: str, inputs: Dict[str, NDArray[Any]],
                    parameters: Optional[Dict[str, Any]], request_id: str, alone: bool,
                    options: CallOptions) -> Dict[str, NDArray[Any]]:
        """One BLS call to ``model`` under ``breaker`` (:class:`CallGuard`), failed at once
        when the stub watch saw its stub exit (raises DownstreamError)."""
        guard = breaker.guard(model)  # as ``async with guard:``, without its two coroutines
        guard.enter()
        try:
            dead = self._stub_dead(model)
            if dead:  # as python_backend would say it, 1 s later
                raise UnavailableError(dead, Cause.STUB_DEAD)
            outputs = await self._bls(model, inputs, parameters, request_id, alone, options)
        except BaseException as exc:
            guard.exit(exc)
            raise
        guard.exit(None)
        return outputs

    async def _bls(self, model: str, inputs: Dict[str, NDArray[Any]], parameters: Optional[Dict[str, Any]], request_id: str,
                   alone: bool, options: CallOptions, outputs: Sequence[str] = ()) -> Dict[str, NDArray[Any]]:
        """One BLS call to ``model`` (a name, or ``name@version``: that version); the
        blocking ``exec`` when ``alone``, else ``async_exec``; with the trace and timeout of
        ``options`` (the stub refuses ``trace=None``, so it is left out when absent)."""
        pb = self.pb
        name, version = self.targets.get(model) or split_target(model)
        pinned: Dict[str, object] = {} if version is None else {"model_version": version}
        if options.trace is not None:
            pinned["trace"] = options.trace
        if options.timeout_us:
            pinned["timeout"] = int(options.timeout_us)
        request = pb.InferenceRequest(
            model_name=name,
            inputs=[pb.Tensor(key, value) for key, value in inputs.items()],
            requested_output_names=list(outputs),
            request_id=request_id,
            parameters=parameters or {},
            preferred_memory=self.cpu_memory,
            **pinned,
        )
        response = request.exec() if alone else await request.async_exec()
        if response.has_error():
            error = response.error()
            message = f"model '{model}' failed: {error.message()}"
            cause = classify(message, _code_name(pb, error))
            raise DownstreamError(message) if cause is None else UnavailableError(message, cause)
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    # -- readiness (the router's is_ready(), python_backend r26.03 and later)

    def not_ready(self) -> Optional[str]:
        """Why the policy cannot answer now, or None when it can.

        Not ready when a required model is not ready (a tokenizer model called through BLS,
        or a model outside every ``fallback`` node and ``shadow`` candidate that is not
        loaded on demand), or when every model that can answer is not ready or has its
        circuit open. Asks ``pb_utils.is_model_ready`` once per model; safe beside
        ``execute`` (the circuit states are read under the breaker's lock).
        """
        if isinstance(self.policy, PipelinePolicy):  # every step's own model, but those loaded on demand
            steps = self.policy.pipeline.step_nodes()
            missing = [m for m in dict.fromkeys(s.target for s in steps if s.on_demand is None) if not self._ready(m)]
            return f"required models not ready: {', '.join(missing)}" if missing else None
        required, answering = _answer_models(self.policy)
        on_demand = self.policy.on_demand()
        missing = [m for m in required if split_target(m)[0] not in on_demand and not self._ready(m)]
        if missing:
            return f"required models not ready: {', '.join(missing)}"
        usable = [m for m in answering if self.breaker.state(m) is not CircuitState.OPEN
                  and (split_target(m)[0] in on_demand or self._ready(m))]
        if answering and not usable:
            return f"no model can answer (not ready or circuit open): {', '.join(answering)}"
        return None

    # -- the breakers' callbacks

    def _circuit_changed(self, model: str, old: CircuitState, new: CircuitState, reason: str) -> None:
        self.metrics.set("orchestrator_circuit_state", new.gauge, model=model)
        self.metrics.inc("orchestrator_circuit_transitions_total", model=model, state=new.value)
        log = self.logger.log_info if new is CircuitState.CLOSED else self.logger.log_warn
        log(f"router '{self.router}': circuit of '{model}' {old.value} -> {new.value} ({reason})")

    def _ready(self, model: str) -> bool:
        name, version = split_target(model)
        return bool(self.pb.is_model_ready(name, "" if version is None else str(version)))

    def _stub_dead(self, model: str) -> Optional[str]:
        name, _ = self.targets.get(model) or split_target(model)
        return None if name == self.router else self.stub_watch.dead(name)

    def _unhealthy(self, model: str) -> bool:
        name, _ = split_target(model)
        if self.policy.breaker.reload_unhealthy and model in self.policy.models() and name != self.router:
            return self.models.repair(name)  # True: under way, the breaker holds the circuit open
        return False


@dataclass
class _Circuit:
    state: CircuitState = CLOSED
    failures: int = 0
    opened_at: float = 0.0
    last_error: str = ""
    last_cause: Optional[Cause] = None
    probing: bool = False
    checked_at: float = float("-inf")
    repairing: bool = False


class CircuitBreaker:
    """Circuit state per downstream model.

    Args:
        settings: thresholds and cool-down.
        on_change: ``(model, old_state, new_state, reason)`` after every state change
            (logging and metrics).
        on_unhealthy: ``(model) -> bool`` when a circuit opens because the model's stub is
            dead; True means a repair is under way, and the circuit then stays open until
            :meth:`half_open` (at most :data:`REPAIRING_OPEN_S`).
        ready_check: ``(model) -> bool``, whether the server reports the model ready.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        settings: BreakerSettings,
        on_change: Optional[Callable[[str, CircuitState, CircuitState, str], None]] = None,
        on_unhealthy: Optional[Callable[[str], bool]] = None,
        ready_check: Optional[Callable[[str], bool]] = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.settings = settings
        self.on_change = on_change
        self.on_unhealthy = on_unhealthy
        self.ready_check = ready_check
        self.clock = clock
        self.circuits: Dict[str, _Circuit] = {}
        self.lock = threading.Lock()

    def state(self, model: str) -> CircuitState:
        """The model's circuit state now (an open circuit whose cool-down is over reads
        ``half_open``)."""
        with self.lock:
            c = self.circuits.get(model)
            if c is None:
                return CLOSED
            if c.state == OPEN and self.clock() - c.opened_at >= self._cool_down(c):
                return HALF_OPEN
            return c.state

    def _cool_down(self, c: _Circuit) -> float:
        return max(self.settings.open_s, REPAIRING_OPEN_S) if c.repairing else self.settings.open_s

    def before_call(self, model: str) -> None:
        """Let a call to ``model`` through, or fail it fast.

        Raises:
            UnavailableError: (``Cause.CIRCUIT_OPEN``) the circuit is open, or half-open
                with its probe call in flight.
        """
        change: Optional[Tuple[CircuitState, CircuitState]] = None
        with self.lock:
            c = self.circuits.setdefault(model, _Circuit())
            if c.state == CLOSED:
                return
            now = self.clock()
            left = self._cool_down(c) - (now - c.opened_at)
            if c.state == OPEN and left > 0 and self._back(model, c, now):
                left = 0.0
            if c.state == OPEN and left <= 0:
                change = (c.state, HALF_OPEN)
                c.state = HALF_OPEN
            if c.state == HALF_OPEN and not c.probing:
                c.probing = True
            else:
                wait = f"next probe in {left:.1f} s" if c.state == OPEN else "a probe call is in flight"
                raise UnavailableError(
                    f"model '{model}' is unavailable (circuit open, {wait}; last error: {c.last_error})", Cause.CIRCUIT_OPEN
                )
        if change:
            self._changed(model, *change, "cool-down over, probing")

    def _back(self, model: str, c: _Circuit, now: float) -> bool:
        """True when a circuit opened for a not-ready model finds it ready again."""
        if self.ready_check is None or c.last_cause is not Cause.NOT_READY:
            return False
        if now - c.checked_at < READY_CHECK_INTERVAL_S:
            return False
        c.checked_at = now
        try:
            return bool(self.ready_check(model))
        except Exception:  # a failing check must not fail the call path
            return False

    def on_success(self, model: str) -> None:
        """Record a successful call: the circuit closes."""
        change: Optional[Tuple[CircuitState, CircuitState]] = None
        with self.lock:
            c = self.circuits.get(model)
            if c is None:
                return
            c.failures, c.probing = 0, False
            if c.state != CLOSED:
                change = (c.state, CLOSED)
                c.state = CLOSED
        if change:
            self._changed(model, *change, "a call succeeded")

    def on_failure(self, model: str, message: str, cause: Optional[Cause] = None) -> None:
        """Record a failed call (``message``: the error text; ``cause``: why the model
        cannot serve, None: read from the text, :func:`classify`)."""
        cause = classify(message) if cause is None else cause
        opened: Optional[CircuitState] = None
        with self.lock:
            c = self.circuits.setdefault(model, _Circuit())
            c.failures += 1
            c.last_error, c.last_cause = message, cause
            c.probing = False
            if c.state == HALF_OPEN or cause is not None or c.failures >= self.settings.consecutive_failures:
                if c.state != OPEN:
                    opened = c.state
                c.state, c.opened_at = OPEN, self.clock()
        if opened is not None:
            self._changed(model, opened, OPEN, message)
        if opened is not None and cause is Cause.STUB_DEAD and self.on_unhealthy:
            if self.on_unhealthy(model):
                with self.lock:
                    c.repairing = c.state == OPEN

    def on_cancelled(self, model: str) -> None:
        """Record a call cancelled before its answer: no verdict on the model. A cancelled
        probe frees the half-open circuit for the next call to probe."""
        with self.lock:
            c = self.circuits.get(model)
            if c is not None:
                c.probing = False

    def half_open(self, model: str) -> None:
        """End the cool-down now (the model was repaired): the next call probes it."""
        with self.lock:
            c = self.circuits.get(model)
            if c is not None:
                c.repairing = False
                if c.state == OPEN:
                    c.opened_at = self.clock() - self.settings.open_s

    def _changed(self, model: str, old: CircuitState, new: CircuitState, reason: str) -> None:
        if self.on_change:
            self.on_change(model, old, new, reason)

    def guard(self, model: str, neutral: bool = False) -> "CallGuard":
        """``async with breaker.guard(model): <one downstream call>``: the call runs only
        when the circuit lets it through (:meth:`before_call`); leaving the block records
        its outcome (:class:`CallGuard`; ``neutral``: a plain DownstreamError is no failure)."""
        return CallGuard(self, model, neutral)


class CallGuard:
    """One downstream call under a :class:`CircuitBreaker`, as an ``async with`` block: on
    entry the circuit lets the call through or fails it fast; on exit a DownstreamError
    counts as a failure, a cancellation (a node's ``timeout_ms``) only with
    ``count_timeouts``, and a block left without an error as a success.

    Raises:
        UnavailableError: (entry) failed fast, circuit open; (exit) the call failed with an
            error that says the model cannot serve (:func:`cause_of`), raised in its place
            when it was a plain DownstreamError.
    """

    def __init__(self, breaker: CircuitBreaker, model: str, neutral: bool = False) -> None:
        self.breaker, self.model, self.neutral = breaker, model, neutral

    async def __aenter__(self) -> None:
        self.enter()

    async def __aexit__(self, kind: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Any) -> None:
        self.exit(exc)

    def enter(self) -> None:
        """Let the call through, or fail it fast (the circuit's :meth:`CircuitBreaker.before_call`)."""
        self.breaker.before_call(self.model)

    def exit(self, exc: Optional[BaseException]) -> None:
        """Record the call's outcome: ``exc`` None for a success, else what it raised
        (the class docstring; may raise ``UnavailableError`` from ``exc``)."""
        breaker, model = self.breaker, self.model
        if exc is None:
            breaker.on_success(model)
        elif isinstance(exc, DownstreamError):
            cause = cause_of(exc)
            if self.neutral and cause is None:  # retried per request: the retries decide
                breaker.on_cancelled(model)
                return
            breaker.on_failure(model, str(exc), cause)
            if cause is not None and not isinstance(exc, UnavailableError):
                raise UnavailableError(str(exc), cause) from exc
        elif isinstance(exc, asyncio.CancelledError):
            if breaker.settings.count_timeouts:
                breaker.on_failure(model, "the call was cancelled (node timeout)")
            else:
                breaker.on_cancelled(model)


def _answer_models(policy: Policy) -> Tuple[List[str], List[str]]:
    """``(required, answering)`` call targets of ``policy``: answering are the models of its
    nodes but the ``shadow`` candidates'; required the targets the policy cannot do without
    (tokenizer models called through BLS, then models outside every ``fallback`` node)."""
    required: List[str] = [] if policy.inline_tokenizer else list(policy.tokenizers())
    answering: List[str] = []

    def visit(node: N.Node, optional: bool) -> None:
        for call in N.KINDS[node.kind].calls(node):
            answering.append(call.target)
            if not optional:
                required.append(call.target)
        if isinstance(node, ShadowNode):
            visit(node.primary, optional)  # the candidate never answers
            return
        for child in N.children(node):
            visit(child, optional or node.kind == "fallback")

    visit(policy.root, False)
    return list(dict.fromkeys(required)), list(dict.fromkeys(answering))


def _code_name(pb: Any, error: Any) -> Optional[str]:
    """The name of a BLS error's Triton code (``INTERNAL``, ``UNAVAILABLE``, ...), or None
    for a stub without codes. Triton 2.51 says ``INTERNAL`` for every BLS error
    (``health`` module docstring); kept for stubs and mocks that pass the code on."""
    try:
        code = error.code()
    except AttributeError:
        return None
    for name in ("UNAVAILABLE", "NOT_FOUND", "INTERNAL"):
        if code == getattr(pb.TritonError, name, object()):
            return name
    return None
