"""Every request the soak sends and every response it gets, by request id.

A request is sent once with a unique id. Its outcome:

- ``ok``: a 200 whose answer passes :func:`~lab.soak.workload.check_answer`;
- ``wrong``: a 200 whose answer does not;
- ``error``: an error response (counted by message, never wrong in itself);
- ``lost``: no response within the client timeout (a client-side deadline, a broken
  connection, a timed-out read).

Independently of the outcome, a response that carries another request's id is
``mismatched`` and a second response to the same request is ``duplicated`` (gRPC answers
arrive through a callback, so a second one would be seen; an HTTP call returns once).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from lab.soak.workload import RequestSpec

OUTCOMES = ("ok", "wrong", "error", "lost")

_REQUEST_ID = re.compile(r"^\[request id: [^\]]*\]\s*")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")


def error_key(message: str, limit: int = 240) -> str:
    """An error message with the request-id prefix Triton adds removed and free-standing
    numbers replaced by ``N`` (``classifier_fast_0_0`` kept), cut at ``limit`` characters:
    the key errors are counted by."""
    text = _REQUEST_ID.sub("", " ".join(str(message).split()))
    text = _NUMBER.sub("N", text)
    return text if len(text) <= limit else text[:limit] + " ..."


@dataclass
class Record:
    """One request: its spec, the phase and models it needs (decided when sent), send and
    first-response times (``time.monotonic()`` seconds), the outcome and details."""

    spec: RequestSpec
    phase: str
    needs: frozenset
    sent: float
    done: Optional[float] = None
    outcome: Optional[str] = None
    error: Optional[str] = None  # the full message of an error response / lost reason
    status: Optional[str] = None  # the error's status (HTTP code / gRPC status code)
    problems: List[str] = field(default_factory=list)
    routes: Optional[List[str]] = None
    responses: int = 0
    mismatched_ids: List[str] = field(default_factory=list)
    probe: bool = False  # a normal request sent while an oversized one was in flight

    @property
    def latency_s(self) -> Optional[float]:
        return None if self.done is None else self.done - self.sent


class Ledger:
    """Thread-safe record of the run. ``add`` when a request is sent, ``answer`` /
    ``fail`` when a response arrives, ``lose`` when none came in time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: Dict[str, Record] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self.records)

    def add(self, record: Record) -> None:
        with self._lock:
            if record.spec.request_id in self.records:
                raise ValueError(f"request id {record.spec.request_id!r} sent twice")
            self.records[record.spec.request_id] = record

    def _response(self, request_id: str, carried_id: Optional[str], t: float) -> Optional[Record]:
        """Count a response for ``request_id``; None when it is not the first one."""
        rec = self.records[request_id]
        rec.responses += 1
        if carried_id != request_id:
            rec.mismatched_ids.append(str(carried_id))
        if rec.responses > 1 or rec.outcome == "lost":
            return None
        rec.done = t
        return rec

    def answer(self, request_id: str, carried_id: Optional[str], t: float, problems: List[str], routes: List[str]) -> None:
        """A 200 response at ``t`` carrying ``carried_id``; ``problems`` from the check."""
        with self._lock:
            rec = self._response(request_id, carried_id, t)
            if rec is not None:
                rec.outcome = "wrong" if problems else "ok"
                rec.problems = list(problems)
                rec.routes = list(routes)

    def fail(self, request_id: str, carried_id: Optional[str], t: float, status: str, message: str) -> None:
        """An error response at ``t`` (``status``: ``"400"`` or ``"StatusCode.INTERNAL"`` ...)."""
        with self._lock:
            rec = self._response(request_id, carried_id, t)
            if rec is not None:
                rec.outcome, rec.status, rec.error = "error", status, message

    def lose(self, request_id: str, reason: str) -> None:
        """No response within the client timeout (``reason``: what the client saw)."""
        with self._lock:
            rec = self.records[request_id]
            if rec.outcome is None:
                rec.outcome, rec.error = "lost", reason

    def snapshot(self) -> List[Record]:
        with self._lock:
            return list(self.records.values())

    def first(self, predicate) -> Optional[Record]:
        """The answered record with the earliest ``done`` that ``predicate`` accepts."""
        with self._lock:
            found = [r for r in self.records.values() if r.done is not None and predicate(r)]
        return min(found, key=lambda r: r.done) if found else None
