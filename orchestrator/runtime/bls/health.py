"""Downstream model health: a circuit breaker per model, in front of every BLS call.

The pattern Triton users know from Envoy/Istio outlier detection: after
``consecutive_failures`` failed calls in a row to one model, the model's circuit OPENS and
calls to it fail at once (a ``fallback`` node answers instead) for ``open_s`` seconds; then
the circuit is HALF-OPEN and a single probe call decides: success closes it, failure opens
it again. A failure that says the model cannot serve at all opens the circuit at once:
its stub process is not healthy (Triton 2.51 keeps such a model READY and fails every call
to it after about 1 s, see docs/guides/reliability.md), or the model is not ready, unloaded or
unknown. Such failures are raised as ``errors.UnavailableError`` with their
``errors.Cause``; other failures stay ``errors.DownstreamError``.

Classifying a BLS error: Triton 2.51's python_backend (r24.10) gives every BLS error
response the code ``INTERNAL`` (``request_executor.cc`` and ``infer_request.cc`` build the
``PbError`` from the message alone; ``THROW_IF_TRITON_ERROR`` keeps only the text), so
:func:`classify` falls back to the error texts of core and python_backend where no code
(other than ``INTERNAL``) comes with the error.

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
from enum import Enum
from typing import Any, Callable, Dict, Optional, Tuple, Type

from orchestrator.runtime.errors import Cause, DownstreamError, UnavailableError


class CircuitState(str, Enum):
    """A model's circuit state; the value is the label of the
    ``orchestrator_circuit_transitions_total`` counter and of log lines."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    @property
    def gauge(self) -> int:
        """The ``orchestrator_circuit_state`` gauge's value: 0 closed, 1 open, 2 half-open."""
        return STATE_VALUES[self]


CLOSED, OPEN, HALF_OPEN = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN
#: The ``orchestrator_circuit_state`` gauge's value for each state (docs/metrics: 0, 1, 2).
STATE_VALUES: Dict[CircuitState, int] = {CLOSED: 0, OPEN: 1, HALF_OPEN: 2}

# Error texts (Triton 2.51 core and python_backend) that mean the model cannot serve; the
# code of a 2.51 BLS error is always INTERNAL (module docstring), so the text decides.
_STUB_DEAD = ("is not healthy", "Failed to obtain the health mutex")
_NOT_READY = ("is not ready", "not at ready state", "unavailable", "not found", "unknown model", "is not loaded")
#: Seconds between two ``ready_check`` calls for one open circuit.
READY_CHECK_INTERVAL_S = 0.5
#: The cool-down (seconds, if longer than ``open_s``) of a circuit whose model is being
#: repaired: a probe during the reload would reach the old, dead instance (Triton routes to
#: it until the new one is ready) and wait 1 s for nothing; the repair's end probes at once.
REPAIRING_OPEN_S = 30.0


def stub_is_dead(message: str) -> bool:
    """True when a BLS error says the model's stub process died or hangs (python_backend's
    ``Stub process '<instance>' is not healthy.``)."""
    return any(s in message for s in _STUB_DEAD)


def classify(message: str, code: Optional[str] = None) -> Optional[Cause]:
    """Why a BLS error says the model cannot serve, or None when it can (an ordinary
    failure).

    Args:
        message: the error text.
        code: the error's Triton code name (``TritonError.code()``), if known. ``UNAVAILABLE``
            and ``NOT_FOUND`` mean not ready; ``INTERNAL`` (what every 2.51 BLS error
            response says, module docstring) or None fall back to the text.
    """
    if stub_is_dead(message):
        return Cause.STUB_DEAD
    if code in ("UNAVAILABLE", "NOT_FOUND") or any(s in message for s in _NOT_READY):
        return Cause.NOT_READY
    return None


def cause_of(error: BaseException) -> Optional[Cause]:
    """The :class:`~orchestrator.runtime.errors.Cause` of an error that says its model
    cannot serve (its own, or from its text), else None."""
    if isinstance(error, UnavailableError):
        return error.cause
    return classify(str(error))


@dataclass(frozen=True)
class BreakerSettings:
    """The policy's ``circuit_breaker`` block.

    Attributes:
        consecutive_failures: failed calls in a row that open a model's circuit (default 3;
            an "unavailable" failure opens it at once).
        open_s: seconds a circuit stays open before one probe call is let through
            (default 5).
        reload_unhealthy: reload a model whose stub is not healthy (needs
            ``--model-control-mode=explicit``; default true).
        reload_interval_s: seconds (default 30): the longest wait between two attempts of
            a repair that keeps failing, and how long a repaired model must stay up before
            its next repair starts without extra delay (``ondemand.ModelManager.repair``).
        watch_stubs: before each call, look in ``/proc`` whether the model's
            Python-backend stub has exited, and fail the call at once if so instead of
            waiting python_backend's 1 s health timeout (``stubs.StubWatch``; default true).
        count_timeouts: count a call cancelled before its answer (a node's ``timeout_ms``,
            the request's deadline, the client's cancellation) as a failure of its model
            (default false: a node's deadline is that node's, and three expiries of one
            tightly timed node must not close a healthy model to every other node; a model
            that hangs is still caught by the nodes' fallbacks and by its errors).
    """

    consecutive_failures: int = 3
    open_s: float = 5.0
    reload_unhealthy: bool = True
    reload_interval_s: float = 30.0
    watch_stubs: bool = True
    count_timeouts: bool = False


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

    def guard(self, model: str) -> "CallGuard":
        """``async with breaker.guard(model): <one downstream call>``: the call runs only
        when the circuit lets it through (:meth:`before_call`); leaving the block records
        its outcome (:class:`CallGuard`)."""
        return CallGuard(self, model)


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

    def __init__(self, breaker: CircuitBreaker, model: str) -> None:
        self.breaker, self.model = breaker, model

    async def __aenter__(self) -> None:
        self.breaker.before_call(self.model)

    async def __aexit__(self, kind: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Any) -> None:
        breaker, model = self.breaker, self.model
        if exc is None:
            breaker.on_success(model)
        elif isinstance(exc, DownstreamError):
            cause = cause_of(exc)
            breaker.on_failure(model, str(exc), cause)
            if cause is not None and not isinstance(exc, UnavailableError):
                raise UnavailableError(str(exc), cause) from exc
        elif isinstance(exc, asyncio.CancelledError):
            if breaker.settings.count_timeouts:
                breaker.on_failure(model, "the call was cancelled (node timeout)")
            else:
                breaker.on_cancelled(model)
