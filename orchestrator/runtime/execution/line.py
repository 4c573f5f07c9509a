"""A straight-line policy compiled at load: one model, perhaps windowed, perhaps behind a guard.

Most policies that replace a plain ensemble are one way through: a ``switch`` that answers
empty texts (or texts a request parameter sends elsewhere) with a ``constant``, then one
``model`` node, perhaps inside a ``chunk`` node for long texts. Walking that tree node by node
costs each text four node coroutines and their bookkeeping, which at one text per execute
is a measurable part of the router's own time. :func:`compile_line` recognizes the shape
when the engine is made; :meth:`Line.answer` then runs an execute whose every text takes
the one way (no guard case matches it, it makes one window) as one model call, with the
same effects as the tree: the same answers, each node's latency observed
(``orchestrator_node_latency_seconds``) and cost estimated (``Engine.measured``), each
failing node counted (``orchestrator_node_errors_total``), the same deadlines, trace and
cancellation (``ModelCalls.classify``). Any other execute (an empty text, a long one) walks
the tree (``Run.run_node``). The differential test ``tests/mock/test_line.py`` holds the
two paths to the same outputs and metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, Tuple

from orchestrator.runtime.errors import DownstreamError
from orchestrator.runtime.metrics import Key, series
from orchestrator.runtime.routing.nodes.base import Answers, Item, Node, descendants
from orchestrator.runtime.routing.nodes.chunk import ChunkNode
from orchestrator.runtime.routing.nodes.constant import ConstantNode
from orchestrator.runtime.routing.nodes.model import ModelNode, answers_of
from orchestrator.runtime.routing.nodes.sequence import SequenceNode
from orchestrator.runtime.routing.nodes.switch import SwitchNode

if TYPE_CHECKING:  # the engine imports this module
    from orchestrator.runtime.execution.engine import Run

LATENCY = "orchestrator_node_latency_seconds"


@dataclass(frozen=True)
class Line:
    """A policy tree that is one way through (:func:`compile_line`).

    Attributes:
        outer: the ``sequence`` whose two steps are ``guard`` and the rest; None without a guard.
        guard: a ``switch`` without ``score`` or ``default`` whose cases answer with
            ``constant`` nodes; None: no guard.
        chunk: a ``chunk`` node without a stopping key around ``model``; None: the model alone.
        model: the one ``model`` node.
        around: the nodes open while the model runs, innermost first (model, chunk, outer):
            the order the tree ends them in.
        latency: each of ``around``'s latency series, made once.
    """

    outer: Optional[SequenceNode]
    guard: Optional[SwitchNode]
    chunk: Optional[ChunkNode]
    model: ModelNode
    around: Tuple[Node, ...]
    latency: Tuple[Key, ...]

    def fits(self, items: Sequence[Item]) -> bool:
        """True when every one of ``items`` takes the one way: it has the model's tokens
        (and the guard's, when a case counts them), no guard case matches it, and it makes
        one window of the chunk node (at most ``window`` tokens)."""
        tokenizer, chunk, guard = self.model.head.tokenizer, self.chunk, self.guard
        for it in items:
            ids = it.tokens.get(tokenizer)
            if ids is None or (chunk is not None and ids.shape[0] > chunk.window):
                return False
            if guard is not None:
                if guard.tokenizer not in it.tokens:  # a case may count its tokens: the tree tokenizes first
                    return False
                for case in guard.cases:
                    if case.when.matches(it, None, self.model.head, guard.tokenizer):
                        return False
        return True

    async def answer(self, run: "Run", items: Sequence[Item]) -> Answers:
        """The answers of ``items`` (non-empty, :meth:`fits`), as ``run.run_node`` of the
        policy's root gives them, with the same metrics and cost estimates.

        Raises:
            DownstreamError: the model failed (each node around it counted as failing).
        """
        engine, clock, perf = run.engine, run.engine.clock, time.perf_counter
        timing = run.timing
        if self.outer is not None:
            outer_perf, outer_clock = perf(), clock()
        if self.guard is not None:  # no case matches (fits): the switch answers nothing
            guard_perf, guard_clock = perf(), clock()
            engine.measured(self.guard, clock() - guard_clock)
            if timing:
                run.observations.setdefault(series(LATENCY, "node", self.guard.name), []).append(perf() - guard_perf)
        perfs, clocks = [perf()], [clock()]  # model's, chunk's (the outer's first, from above)
        if self.chunk is not None:
            perfs.append(perfs[0])
            clocks.append(clocks[0])
        if self.outer is not None:
            perfs.append(outer_perf)
            clocks.append(outer_clock)
        model = self.model
        try:
            answers = answers_of(model, items, await run.calls.classify(model.target, items, model.max_length, model.head))
        except DownstreamError:
            for node in self.around:
                run.count("orchestrator_node_errors_total", node=node.name)
            raise
        finally:
            if timing:
                now = perf()
                for key, began in zip(self.latency, perfs):
                    run.observations.setdefault(key, []).append(now - began)
        now = clock()
        for node, began in zip(self.around, clocks):
            engine.measured(node, now - began)
        return answers


def compile_line(root: Node) -> Optional[Line]:
    """``root`` as a :class:`Line` when it is one way through, else None.

    The shapes: ``model``; ``chunk`` (no ``stop_when_decided``, ``stop_margin`` or
    ``max_windows``) of a ``model``; either of them as the second and last step of a
    ``sequence`` whose first is a ``switch`` without ``score`` or ``default`` whose cases
    answer with ``constant`` nodes. No node may have ``timeout_ms`` (the tree applies it)."""
    if root.timeout_ms or any(n.timeout_ms for n in descendants(root)):
        return None
    outer = guard = chunk = None
    node = root
    if isinstance(node, SequenceNode):
        if len(node.steps) != 2 or not isinstance(node.steps[0], SwitchNode):
            return None
        outer, guard, node = node, node.steps[0], node.steps[1]
        if guard.score is not None or guard.default is not None or not all(isinstance(c.then, ConstantNode) for c in guard.cases):
            return None
    if isinstance(node, ChunkNode):
        if node.stops_early:
            return None
        chunk, node = node, node.node
    if not isinstance(node, ModelNode):
        return None
    around = tuple(n for n in (node, chunk, outer) if n is not None)
    return Line(outer, guard, chunk, node, around, tuple(series(LATENCY, "node", n.name) for n in around))
