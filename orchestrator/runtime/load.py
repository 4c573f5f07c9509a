"""The router's queue delay, estimated inside the Python-backend stub.

Triton's Python backend (stub r24.10) does not tell a model when its requests were
enqueued, so the delay is estimated from what the router sees: the start and end of each
of its own ``execute`` calls. One router instance runs one ``execute`` at a time, and the
dynamic batcher hands it every request that queued meanwhile (up to ``max_batch_size``),
so when an ``execute`` starts right after the previous one ended (within
``busy_gap_s``), its requests arrived while the previous one ran: the oldest of them
waited about that previous ``execute``'s duration. When the instance was idle in between
(a longer gap), its requests found it free: the sample is 0. Samples are smoothed with an
exponential moving average (weight ``smoothing`` for the newest), so one slow batch does
not flip the overload mode of a cascade, while a backlog shows after two or three
executes.

The estimate is an upper bound for the oldest request of a batch (the mean request of a
Poisson stream waited about half of it); it does not count requests that waited longer
than one ``execute``, which the router's queue policy (``max_queue_size`` up to the
``max_batch_size``, ``config.pbtxt``) keeps rare. The clock is injectable so tests drive
it (``clock``: seconds, monotonic).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

#: An ``execute`` starting within this many seconds of the previous one's end found a
#: request waiting: the stub's round trip from the end of one ``execute`` to the start of
#: the next with a full queue is under 1 ms on the 2-core benchmark machine
#: (docs/benchmarks.md, "Overload"); 2 ms leaves room for a loaded machine.
BUSY_GAP_S = 0.002
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
        self._last_duration_s = 0.0

    def begin(self) -> float:
        """Mark the start of an ``execute``; returns the updated estimate, seconds."""
        with self._lock:
            now = self.clock()
            if self._ended is not None:
                busy = now - self._ended <= self.busy_gap_s
                sample = self._last_duration_s if busy else 0.0
                self._estimate_s += self.smoothing * (sample - self._estimate_s)
            self._started = now
            return self._estimate_s

    def end(self) -> None:
        """Mark the end of the ``execute`` that :meth:`begin` started (no-op without one)."""
        with self._lock:
            if self._started is None:
                return
            now = self.clock()
            self._last_duration_s = max(0.0, now - self._started)
            self._ended, self._started = now, None

    def delay_ms(self) -> float:
        """The current estimate, milliseconds (0 before the second ``execute``)."""
        with self._lock:
            return self._estimate_s * 1000.0
