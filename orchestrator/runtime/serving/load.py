"""The router's queue delay, estimated inside the Python-backend stub.

Triton's Python backend (stub r24.10) does not tell a model when its requests were
enqueued, so the delay is estimated from what the router sees: the start and end of each
of its own ``execute`` calls. One router instance runs one ``execute`` at a time, and the
dynamic batcher hands it every request that queued meanwhile (up to ``max_batch_size``).
When an ``execute`` starts within ``busy_gap_s`` of the previous one's end (the stub's
turnaround: sending the responses, receiving the next batch), requests were waiting: they
arrived after the previous batch was taken, so the oldest of them waited about the time
from the previous ``execute``'s start to this one's (the sample). After a longer gap the
instance sat idle and its requests found it free: the sample is 0. Samples are smoothed
with an exponential moving average (weight ``smoothing`` for the newest), so one slow batch
does not flip the overload mode of a cascade while a backlog shows after two or three
executes.

Limits: the estimate is the oldest request's wait (a Poisson stream's mean request waited
about half of it); a request that waited more than one ``execute`` (a queue longer than
``max_batch_size``) counts as one period, which the recommended queue policy's
``max_queue_size`` (16, at most its ``max_batch_size``; docs/guides/reliability.md "Overload")
rules out; on a machine so loaded that the stub's turnaround exceeds ``busy_gap_s`` the
backlog is missed (a queue policy still refuses).
It assumes one router instance (the shipped ``instance_group``); with more, each
instance sees only its own executes and reads low. Triton 2.51's dynamic batcher can
leave the instance idle up to 500 ms under any queue policy (docs/guides/reliability.md
"Overload"): such a gap reads as idle.
The clock is injectable so tests drive it (``clock``: seconds, monotonic).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

#: An ``execute`` starting within this many seconds of the previous one's end found a
#: request waiting: a margin over the stub's turnaround between two executes of a
#: backlogged router (responses out, next batch in: milliseconds), wide enough for a
#: loaded CPU; an idle gap this short adds at most one execute period to the estimate,
#: which is small exactly when the router is not loaded.
BUSY_GAP_S = 0.020
#: The newest sample's weight in the moving average.
SMOOTHING = 0.5


class QueueDelay:
    """Estimated queue delay of the router's requests (module docstring).

    Args:
        clock: seconds, monotonic (default ``time.monotonic``).
        busy_gap_s: see :data:`BUSY_GAP_S`.
        smoothing: weight of the newest sample, in (0, 1] (1: no smoothing).

    Raises:
        ValueError: ``smoothing`` outside (0, 1] or ``busy_gap_s`` negative.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, busy_gap_s: float = BUSY_GAP_S,
                 smoothing: float = SMOOTHING) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        if busy_gap_s < 0.0:
            raise ValueError(f"busy_gap_s must be >= 0, got {busy_gap_s}")
        self.clock = clock
        self.busy_gap_s = busy_gap_s
        self.smoothing = smoothing
        self._lock = threading.Lock()
        self._estimate_s = 0.0
        self._started: Optional[float] = None
        self._ended: Optional[float] = None
        self._last_start: Optional[float] = None

    def begin(self) -> float:
        """Mark the start of an ``execute``; returns the updated estimate, seconds."""
        with self._lock:
            now = self.clock()
            if self._ended is not None and self._last_start is not None:
                busy = now - self._ended <= self.busy_gap_s
                sample = now - self._last_start if busy else 0.0
                self._estimate_s += self.smoothing * (sample - self._estimate_s)
            self._started = self._last_start = now
            self._ended = None
            return self._estimate_s

    def end(self) -> None:
        """Mark the end of the ``execute`` that :meth:`begin` started (no-op without one)."""
        with self._lock:
            if self._started is None:
                return
            self._ended, self._started = self.clock(), None

    def delay_ms(self) -> float:
        """The current estimate, milliseconds (0 before the second ``execute``)."""
        with self._lock:
            return self._estimate_s * 1000.0
