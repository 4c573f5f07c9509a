"""What a downstream model's failure means, and its circuit's states.

:class:`CircuitState` (with its gauge value) and :func:`classify`: which BLS errors say a
model cannot serve (``errors.Cause``). The breaker's settings are the policy's
``circuit_breaker`` block (``routing.settings.BreakerSettings``). The breaker itself, in front of every BLS call, is
``downstream.CircuitBreaker``.

Classifying a BLS error: Triton 2.51's python_backend (r24.10) gives every BLS error
response the code ``INTERNAL`` (``request_executor.cc`` and ``infer_request.cc`` build the
``PbError`` from the message alone; ``THROW_IF_TRITON_ERROR`` keeps only the text), so
:func:`classify` falls back to the error texts of core and python_backend where no code
(other than ``INTERNAL``) comes with the error.
"""

from __future__ import annotations

from enum import Enum
from typing import Dict, Optional

from orchestrator.runtime.errors import Cause, UnavailableError


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
