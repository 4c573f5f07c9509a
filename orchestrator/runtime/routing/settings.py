"""The policy's settings of other parts of the router: its top-level ``circuit_breaker``
(:class:`BreakerSettings`, used by ``bls.downstream.CircuitBreaker``) and ``admission``
(:class:`AdmissionSettings`, used by ``serving.admission.Admission``) blocks. Field defaults
are the keys' defaults (``policy.TOP`` reads them; docs/reference/policy.md shows them).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.runtime.routing.schema import REQUIRED


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


@dataclass(frozen=True)
class AdmissionSettings:
    """The policy's ``admission`` mapping.

    Attributes:
        max_wait_ms: milliseconds: the longest a request should take from its arrival to
            its answer; requests the router expects to exceed it are refused.
    """

    max_wait_ms: float = REQUIRED
