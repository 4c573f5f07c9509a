"""The background side of ``shadow`` nodes: a bounded queue of mirrored texts, one worker
thread that runs each shadow node's candidate on them, and the comparison metrics.

The request path only copies the sampled items and the primary's answers into the queue
(:meth:`Mirror.submit`, no waiting). The worker thread has its own event loop and runs
one batch at a time as a run of the router's :class:`~orchestrator.runtime.execution.engine.Engine`
(``Engine.start``: same policy, tokenizer, on-demand manager and metrics; its own downstream
call function, so its circuit breakers are not the primary's: a failing candidate never
opens a circuit that the primary path uses; no shadow queue of its own). Comparison per text, between the primary's final
answer and the candidate's (verdicts as the router reports them, ``Run.final_verdicts``;
a flip is ``heads.Head.flipped``: another top label for multiclass heads, another verdict
in some column otherwise):

    orchestrator_shadow_texts_total{node,candidate}      texts compared
    orchestrator_shadow_flips_total{node,candidate}      of those, verdicts that differ
    orchestrator_shadow_probability_difference{node,candidate}
                                                         histogram of max over columns of
                                                         |p_candidate - p_primary|
                                                         (``metrics.DIFFERENCE_BUCKETS``)
    orchestrator_shadow_errors_total{node,candidate}     mirrored texts the candidate did
                                                         not answer (error, timeout, open circuit)
    orchestrator_shadow_dropped_total{node,candidate}    texts not mirrored: queue full
    orchestrator_shadow_queued_texts{node}               gauge: texts queued or running

``node`` is the shadow node's name, ``candidate`` its candidate node's name.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.routing.nodes.base import Item


class Mirror:
    """The shadow queue and its worker thread (started at the first :meth:`submit`).

    Args:
        engine: the router's engine; each batch of candidates is one run of it (``Engine.start``).
        infer: the candidates' downstream call (``calls.InferFn``).
        metrics: where the comparison counts go (``metrics.Metrics`` or None).
        logger: ``pb_utils.Logger`` or None; the first candidate error of each shadow
            node is logged as a warning, later ones only counted.
    """

    def __init__(self, engine: Any, infer: Any, metrics: Optional[Any] = None, logger: Optional[Any] = None):
        self.engine, self.infer = engine, infer
        self.metrics = metrics
        self.logger = logger
        self.jobs: "queue.SimpleQueue[Optional[Tuple[Any, ...]]]" = queue.SimpleQueue()
        self.lock = threading.Condition()
        self.pending: Dict[str, int] = {}
        self.logged: Set[str] = set()
        self.thread: Optional[threading.Thread] = None
        self.closed = False

    # -- request path

    def submit(self, node: Any, items: List[Item], primary: List[Tuple[NDArray[Any], NDArray[Any]]]) -> bool:
        """Queue ``items`` for ``node``'s candidate, with ``node.primary``'s answers
        (probabilities and the verdicts the router reports, one pair per item); returns
        False when they were dropped (queue full or closed)."""
        labels = {"node": node.name, "candidate": node.candidate.name}
        with self.lock:
            queued = self.pending.get(node.name, 0)
            if self.closed or queued + len(items) > node.queue_size:
                self._count("orchestrator_shadow_dropped_total", len(items), **labels)
                return False
            self.pending[node.name] = queued + len(items)
            self._gauge(node.name)
            if self.thread is None:
                self.thread = threading.Thread(target=self._work, name="orchestrator-shadow", daemon=True)
                self.thread.start()
        copies = [Item(it.idx, it.req, it.text, it.threshold, it.params, it.request_id, dict(it.tokens)) for it in items]
        self.jobs.put((node, copies, primary))
        return True

    # -- worker

    def _work(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            while True:
                job = self.jobs.get()
                if job is None:
                    break
                node, items, primary = job
                try:
                    if not self.closed:
                        loop.run_until_complete(self._compare(node, items, primary))
                finally:
                    with self.lock:
                        self.pending[node.name] -= len(items)
                        self._gauge(node.name)
                        self.lock.notify_all()
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())  # async_exec's threads
            loop.close()

    async def _compare(self, node: Any, items: List[Item], primary: List[Tuple[NDArray[Any], NDArray[Any]]]) -> None:
        labels = {"node": node.name, "candidate": node.candidate.name}
        run = self.engine.start(self.infer, self.engine.models, self.metrics)
        run.counter = -min([it.idx for it in items] + [0])  # its windows' ids below the mirrored items' own
        try:
            answers = await run.run_node(node.candidate, items)
        except Exception as exc:  # a DownstreamError, or a bug: counted, never raised
            self._count("orchestrator_shadow_errors_total", len(items), **labels)
            if self.logger is not None and node.name not in self.logged:
                self.logged.add(node.name)
                self.logger.log_warn(f"router: shadow '{node.name}': candidate '{node.candidate.name}' failed: {exc}")
            return
        finally:  # the candidate's node latencies and counters
            run.flush()
        compared = flips = 0
        head = self.engine.head
        for it, (p0, v0) in zip(items, primary):
            a = answers.get(it.idx)
            if a is None:
                continue
            compared += 1
            flips += head.flipped(a.probabilities, run.final_verdicts(a, it), p0, v0)
            if self.metrics is not None:
                diff = float(np.max(np.abs(a.probabilities - p0)))
                self.metrics.observe("orchestrator_shadow_probability_difference", diff, **labels)
        self._count("orchestrator_shadow_texts_total", compared, **labels)
        self._count("orchestrator_shadow_flips_total", flips, **labels)
        self._count("orchestrator_shadow_errors_total", len(items) - compared, **labels)

    # -- helpers

    def _count(self, family: str, value: float, **labels: str) -> None:
        if self.metrics is not None and value:
            self.metrics.inc(family, value, **labels)

    def _gauge(self, node: str) -> None:
        if self.metrics is not None:
            self.metrics.set("orchestrator_shadow_queued_texts", self.pending[node], node=node)

    def wait(self, timeout: float) -> bool:
        """Wait until no mirrored text is queued or running; False after ``timeout`` s."""
        with self.lock:
            return self.lock.wait_for(lambda: not any(self.pending.values()), timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Drop what is still queued and stop the worker (waits up to ``timeout`` s for
        the batch it is running)."""
        with self.lock:
            self.closed = True
            thread = self.thread
        if thread is not None:
            self.jobs.put(None)
            thread.join(timeout)
