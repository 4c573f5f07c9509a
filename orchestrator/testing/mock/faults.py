"""Faults a test injects per model: failing requests and slow ``execute()`` calls."""

from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Union

from orchestrator.testing.mock.errors import ErrorCode
from orchestrator.testing.mock.records import Err, Req

Failure = Union[None, str, Callable[..., object]]


class _Faults:
    __slots__ = ("fail_next", "failure", "failure_code", "delay", "dead")

    def __init__(self) -> None:
        self.dead: Optional[str] = None  # the "not healthy" message of a killed stub
        self.fail_next: List[tuple] = []  # [(message, code)]
        self.failure: Failure = None
        self.failure_code = ErrorCode.INTERNAL
        self.delay = 0.0


class FaultInjector:
    """The faults of every model of one MockTriton (see ``MockTriton.fail_next``,
    ``set_failure``, ``set_delay``, ``clear_faults``). Codes are Triton error code names
    (``"INTERNAL"``, ``"UNAVAILABLE"`` ...); an unknown name raises KeyError."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: Dict[str, _Faults] = {}

    def _for(self, model: str) -> _Faults:
        return self._faults.setdefault(model, _Faults())

    def fail_next(self, model: str, message: str, count: int, code: str) -> None:
        entry = (message, ErrorCode[code])
        with self._lock:
            self._for(model).fail_next.extend([entry] * count)

    def set_failure(self, model: str, failure: Failure, code: str) -> None:
        error_code = ErrorCode[code]
        with self._lock:
            faults = self._for(model)
            faults.failure = failure
            faults.failure_code = error_code

    def set_delay(self, model: str, seconds: Optional[float]) -> None:
        with self._lock:
            self._for(model).delay = float(seconds or 0.0)

    def kill(self, model: str, message: str) -> None:
        with self._lock:
            self._for(model).dead = message

    def revive(self, model: str) -> None:
        with self._lock:
            faults = self._faults.get(model)
            if faults is not None:
                faults.dead = None

    def is_dead(self, model: str) -> bool:
        with self._lock:
            faults = self._faults.get(model)
            return faults is not None and faults.dead is not None

    def clear(self, model: Optional[str] = None) -> None:
        with self._lock:
            if model is None:
                self._faults.clear()
            else:
                self._faults.pop(model, None)

    def delay(self, model: str) -> float:
        """Seconds each ``execute()`` of ``model`` sleeps first."""
        with self._lock:
            faults = self._faults.get(model)
            return faults.delay if faults is not None else 0.0

    def check(self, model: str, req: Req) -> Optional[Err]:
        """The injected error for this request to ``model``, or None to let it through.

        A killed stub fails every request; else a pending ``fail_next`` is used up first; else a ``set_failure`` message fails
        it, or its predicate ``f(inputs, parameters)`` decides (a string is the message,
        ``True`` a default message, falsy lets it through). The predicate runs outside
        the lock, so it may call the mock.
        """
        with self._lock:
            faults = self._faults.get(model)
            if faults is None:
                return None
            if faults.dead is not None:
                return Err(faults.dead, ErrorCode.INTERNAL, "exec")
            if faults.fail_next:
                message, code = faults.fail_next.pop(0)
                return Err(message, code, "exec")
            failure, code = faults.failure, faults.failure_code
        if failure is None:
            return None
        if isinstance(failure, str):
            return Err(failure, code, "exec")
        verdict = failure(req.input_dict(), dict(req.parameters))
        if not verdict:
            return None
        if verdict is True:
            verdict = f"injected failure for model '{model}'"
        return Err(str(verdict), code, "exec")
