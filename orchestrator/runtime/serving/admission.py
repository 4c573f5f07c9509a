"""Admission control: the router refuses work it cannot finish in time, before any model
runs for it (docs/guides/reliability.md "Admission control").

Triton's Python backend hands the router, in one ``execute``, every request that queued
while its previous ``execute`` ran (up to ``max_batch_size``). Under a load beyond the
router's capacity that batch grows, each ``execute`` takes longer, and the next batch waits
longer still: without a bound the wait grows until clients time out (``make
bench-overload``: p99 of seconds). Triton's queue policy could bound it, but on 2.51 it
stalls the dynamic batcher (docs/guides/reliability.md "Overload").

So the router bounds it itself. At the start of an ``execute`` of ``n`` requests it has two
estimates: how long the oldest of them waited (``router.QueueDelay``, seconds) and what an
``execute`` of ``k`` requests costs it, ``fixed + k * per_request`` seconds
(:class:`Admission`: a least-squares line through its recent executes' sizes and run
times, exponentially weighted; a batch's fixed part, the BLS round trips and the stub's
turnaround, is most of a small batch's time, so one cost per request would refuse far
too much). A request admitted as one of ``k`` is answered about ``wait + cost(k)`` after it
arrived; the router admits the largest ``k`` with ``wait + cost(k) <= max_wait_ms``, at
least one (so it always makes progress and keeps its estimates current), takes them in
arrival order, and answers the other ``n - k`` at once with ``UNAVAILABLE``: retryable,
nothing ran for them. Refusing costs a response each, so the next batch waits about one
bounded ``execute``.

Limits: the cost is a line in ``k`` (measured, not assumed: while every execute has the
same size the line cannot be fitted, and the cost is that size's mean, per request); the
wait is the oldest request's, not each one's; a refused request still passed Triton's
frontend and queue and the stub's IPC (a refusal in Triton's own queue would not, but
its queue policy stalls 2.51's batcher); a request's priority is not visible to a
Python model on Triton 2.51 (its stub has no ``priority()``), so every request is equal
here; a deployment that needs priorities keeps Triton's ``priority_levels``, with their
2.51 cost. With several router instances each one judges its own executes.
"""

from __future__ import annotations

import math
import threading
from typing import Tuple

from orchestrator.runtime.routing.settings import AdmissionSettings

#: Weight of the newest execute in the cost model: each fit forgets older executes by
#: ``1 - FORGET``, so about the last 10 count and the model follows a load change within a
#: few executes (a choice, as ``deadlines.COST_WEIGHT`` is).
FORGET = 0.1
#: The least weighted variance of the recent executes' sizes (requests^2) for which the
#: cost is fitted as a line: executes of 1 and 2 requests, half each, have 0.25.
MIN_SIZE_VARIANCE = 0.1


class Admission:
    """Which requests of an ``execute`` the router runs (module docstring).

    Args:
        settings: the policy's ``admission``.

    Thread-safe: with more than one model instance the stub may call it from several
    threads.
    """

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        # exponentially weighted sums over executes of w, w*k, w*k^2, w*t, w*k*t
        self._sums = [0.0] * 5

    def cost(self) -> Tuple[float, float]:
        """``(fixed_s, per_request_s)``: the estimated seconds of an ``execute`` of ``k``
        admitted requests is ``fixed_s + k * per_request_s`` (both >= 0; ``(0, 0)`` before
        the first :meth:`ran`)."""
        with self._lock:
            w, wk, wkk, wt, wkt = self._sums
        if w <= 0.0:
            return 0.0, 0.0
        spread = w * wkk - wk * wk  # w^2 * the weighted variance of the sizes
        if spread >= MIN_SIZE_VARIANCE * w * w:  # sizes differ enough to fit a line
            per = (w * wkt - wk * wt) / spread
            fixed = (wt - per * wk) / w
            if per > 0.0 and fixed >= 0.0:
                return fixed, per
        return 0.0, wt / wk  # one size seen (or a line through it makes no sense): the mean per request

    def admit(self, n: int, wait_s: float) -> int:
        """How many of an ``execute``'s ``n`` requests to run, in arrival order: the largest
        ``k`` in [1, n] with ``wait_s + fixed + k * per_request <= max_wait_ms``
        (:meth:`cost`; all ``n`` before any cost is measured; 0 when ``n`` is 0).

        Args:
            n: requests in this ``execute``.
            wait_s: the oldest one's estimated wait, seconds (``router.QueueDelay``).
        """
        if n <= 0:
            return 0
        fixed, per = self.cost()
        if per <= 0.0:
            return n
        room = self.settings.max_wait_ms / 1000.0 - max(0.0, wait_s) - fixed
        fits = math.floor(room / per + 1e-9) if room > 0 else 0
        return max(1, min(n, fits))

    def ran(self, admitted: int, seconds: float) -> None:
        """An ``execute`` ran ``admitted`` requests in ``seconds`` (ignored when either is
        not positive)."""
        if admitted <= 0 or seconds <= 0.0:
            return
        k, t = float(admitted), seconds
        with self._lock:
            keep = 1.0 - FORGET if self._sums[0] > 0.0 else 0.0
            self._sums = [keep * a + b for a, b in zip(self._sums, (1.0, k, k * k, t, k * t))]

    def message(self, wait_s: float, admitted: int) -> str:
        """The refused requests' error text (the router prefixes ``router: ``)."""
        fixed, per = self.cost()
        return (f"overloaded: this request would wait past the router's admission.max_wait_ms "
                f"({self.settings.max_wait_ms:g} ms; estimated queue delay {wait_s * 1000:.1f} ms, "
                f"an execute of {admitted} estimated at {(fixed + admitted * per) * 1000:.1f} ms); refused before any model ran, "
                "retry with backoff")
