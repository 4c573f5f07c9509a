"""The policy engine: runs a policy over the texts of one ``execute`` call.

Texts become :class:`~orchestrator.runtime.routing.nodes.base.Item` objects that enter the
policy's root node; each node's handler is found in ``routing.nodes.KINDS``. The
:class:`Engine` is made once, at load; each execute is a :class:`Run` (``Engine.start``).
What the engine sets up for a policy comes from what its kinds declare
(``NodeKind.tokens``, ``windows``, ``calls``, ``background``), never from their names.
Downstream calls go through the ``infer`` function a run is given (``calls.InferFn``), so
tests drive it with a fake one.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.bls.ondemand import ModelManager
from orchestrator.runtime.errors import DownstreamError, InputError, RequestStopped
from orchestrator.runtime.execution.calls import InferFn, ModelCalls, inline_tokenizers
from orchestrator.runtime.execution.concurrency import as_concurrent
from orchestrator.runtime.execution.deadlines import Deadlines
from orchestrator.runtime.execution.mirror import Mirror
from orchestrator.runtime.metrics import Key, Metrics
from orchestrator.runtime.routing import nodes as N
from orchestrator.runtime.routing.heads import LEGACY, Head
from orchestrator.runtime.routing.nodes.base import Answer, Answers, Item, Node, route_label, window_error
from orchestrator.runtime.routing.policy import Policy, bind_heads
from orchestrator.runtime.serving.request import Result, Work


class Engine:
    """Runs a :class:`~orchestrator.runtime.routing.policy.Policy` over the texts of one ``execute`` call.

    It holds what lasts from one ``execute`` to the next: the policy bound to its heads, the
    tokenizer kinds and windowing its nodes declare, the inline tokenizers, node cost
    estimates and the shadow queue (``mirror.Mirror``). Each execute is a :class:`Run`
    (:meth:`start`); the router's warmup and the shadow worker are runs with another ``infer``.

    Args:
        policy: the validated policy.
        infer: the downstream call (see :data:`InferFn`); raises DownstreamError.
        metrics: where counters and node latencies go (None: nowhere).
        models: the on-demand model manager (None: every model counts as loaded).
        model_dir: the router's model directory (inline tokenizer paths are relative to it).
        shadow_infer: the downstream call of ``shadow`` candidates (default ``infer``); the
            router gives them their own circuit breakers.
        logger: ``pb_utils.Logger`` for the shadow worker's warnings (None: silent).
        clock: seconds of a monotonic clock (default ``time.monotonic``); deadlines
            (``RequestContext.deadline``) are on it. Tests pass a fake one.

    Attributes:
        costs: node name -> estimated run time, seconds (``Deadlines.estimate``), shared
            by every run.
    """

    def __init__(self, policy: Policy, infer: InferFn, metrics: Optional[Metrics] = None, models: Optional[ModelManager] = None,
                 model_dir: Optional[Path] = None, shadow_infer: Optional[InferFn] = None, logger: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        if policy.head is None:  # not bound to a repository: every model has the legacy head
            bind_heads(policy, {c.model: LEGACY for c in policy.calls()})
        assert policy.head is not None, "bind_heads sets it"
        self.head: Head = policy.head
        self.token_kinds = policy.tokenizers()
        self.infer, self.models, self.metrics = infer, models, metrics
        self.tokenizers = inline_tokenizers(policy, model_dir)
        self.costs: Dict[str, float] = {}
        self.on_demand = bool(policy.on_demand())  # else no model call needs the on-demand manager
        self.windowing = policy.windows()  # what the nodes that window texts declared
        self.mirror_runner: Optional[Mirror] = None
        if any(N.KINDS[n.kind].background for n in policy.nodes()):
            self.mirror_runner = Mirror(self, shadow_infer or infer, metrics, logger)

    def start(self, infer: InferFn, models: Optional[ModelManager] = None, metrics: Optional[Metrics] = None,
              background: bool = False) -> "Run":
        """A run through ``infer``, with the on-demand manager ``models`` and the metrics
        sink ``metrics`` (None: none); ``background``: its ``shadow`` nodes queue work for
        the shadow worker (only the router's own executes do)."""
        return Run(self, infer, models if self.on_demand else None, metrics, self.mirror_runner if background else None)

    async def run(self, works: List[Work]) -> List[Union[Result, InputError, RequestStopped]]:
        """:meth:`Run.run` of a run through this engine's ``infer``, on-demand manager and
        metrics, with the shadow queue."""
        return await self.start(self.infer, self.models, self.metrics, background=True).run(works)

    def close(self) -> None:
        """Stop the shadow worker, if any (what is still queued is dropped)."""
        if self.mirror_runner is not None:
            self.mirror_runner.close()


class Run:
    """What belongs to one ``execute`` (a warmup sample, a shadow comparison): the ``infer``
    its model calls use (``calls``), deadlines and cancellation (``deadlines``), window ids,
    random draws, its metrics and the shadow queue. Node handlers get it (``nodes.base.Engine``)."""

    def __init__(self, engine: Engine, infer: InferFn, models: Optional[ModelManager], metrics: Optional[Metrics],
                 mirror_runner: Optional[Mirror]) -> None:
        self.engine, self.head, self.metrics, self.mirror_runner = engine, engine.head, metrics, mirror_runner
        self.deadlines = Deadlines(engine.clock, metrics, engine.costs)
        self.calls = ModelCalls(engine.policy, infer, models, self.deadlines, engine.tokenizers, metrics)
        self.counter, self.rng = 0, random.Random()
        self.counts: Dict[Key, float] = {}  # (family, labels) -> value: handed to ``metrics`` at the end (flush)
        self.observations: Dict[Key, List[float]] = {}
        self.gauges: Dict[Key, float] = {}

    # -- what node handlers use (nodes.base.Engine)

    def count(self, family: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to counter ``family`` with ``labels`` (see ``metrics.Metrics``; at :meth:`flush`)."""
        key = (family, tuple(sorted(labels.items())))
        self.counts[key] = self.counts.get(key, 0.0) + value

    def gauge(self, family: str, value: float, **labels: str) -> None:
        """Set gauge ``family`` with ``labels`` to ``value`` (see ``metrics.Metrics``; at :meth:`flush`)."""
        self.gauges[(family, tuple(sorted(labels.items())))] = value

    def observe(self, family: str, value: float, **labels: str) -> None:
        """Add one observation to histogram ``family`` (see ``metrics.Metrics``; at :meth:`flush`)."""
        self.observations.setdefault((family, tuple(sorted(labels.items()))), []).append(value)

    def stage(self, stage: str, began: float) -> None:
        """Observe ``orchestrator_stage_seconds{stage}``: ``time.perf_counter()`` since ``began``."""
        self.observe("orchestrator_stage_seconds", time.perf_counter() - began, stage=stage)

    def flush(self) -> None:
        """Hand this run's counters, observations and gauges to its metrics sink, at once."""
        if self.metrics:
            self.metrics.record(self.counts, self.observations, self.gauges)
        self.counts, self.observations, self.gauges = {}, {}, {}

    def window(self, parent: Item, tokenizer: str, ids: NDArray[Any]) -> Item:
        """A new item for one window (token ids ``ids`` of ``tokenizer``) of ``parent``'s text."""
        self.counter += 1
        return Item(-self.counter, parent.req, parent.text, parent.threshold, parent.params, parent.request_id,
                    {tokenizer: ids}, parent.context)

    def final_verdicts(self, answer: Answer, item: Item) -> NDArray[Any]:
        """The verdicts bool [C] the router reports for ``answer`` of ``item``: the fixed
        ones of a constant or vote, else the head's rule at the item's thresholds."""
        if answer.verdict is not None:
            return np.asarray(answer.verdict, dtype=bool)
        verdicts: NDArray[Any] = self.head.verdicts(answer.probabilities.reshape(1, -1), item.threshold.reshape(1, -1))[0]
        return verdicts

    def random(self) -> float:
        """A uniform draw in [0, 1) (split and shadow nodes, requests without an id)."""
        return self.rng.random()

    def mirror(self, node: Node, items: List[Item], answers: Answers) -> None:
        """Queue ``items`` for ``node``'s shadow candidate (``mirror.Mirror.submit``);
        never waits, never raises. A run without the shadow queue (warmup, a candidate's
        own shadow node) answers without mirroring."""
        if self.mirror_runner is not None:
            self.mirror_runner.submit(node, items, [(answers[it.idx].probabilities, self.final_verdicts(answers[it.idx], it))
                                                    for it in items])

    async def run_node(self, node: Node, items: List[Item]) -> Answers:
        """Run ``node``'s handler on ``items``; counts errors and latency, applies its
        timeout; a successful run's time on the engine clock feeds ``Deadlines.estimate``.

        Raises:
            DownstreamError: the node failed or timed out.
        """
        if not items:
            return {}
        start, began = time.perf_counter(), self.engine.clock()
        try:
            coro = N.KINDS[node.kind].run(self, node, items)
            if node.timeout_ms:
                try:
                    answers: Answers = await asyncio.wait_for(as_concurrent(coro), node.timeout_ms / 1000.0)
                except asyncio.TimeoutError:
                    raise DownstreamError(f"node '{node.name}' timed out after {node.timeout_ms:g} ms") from None
            else:
                answers = await coro
            self.deadlines.measured(node, self.engine.clock() - began)
            return answers
        except DownstreamError:
            self.count("orchestrator_node_errors_total", node=node.name)
            raise
        finally:
            self.observe("orchestrator_node_latency_seconds", time.perf_counter() - start, node=node.name)

    # -- one execute call

    async def run(self, works: List[Work]) -> List[Union[Result, InputError, RequestStopped]]:
        """Answer every request in ``works``: in order, a :class:`Result`, or the InputError
        of a text over ``limits.max_windows_per_text``, or ``RequestCancelled`` (found
        cancelled: ``live``; a request run again, as in the router's retries, is asked
        first), or ``DeadlineExceeded`` (its deadline passed before the run, or a downstream
        answer came after it and no earlier stage's answer was kept: ``keep_for_deadline``).
        Raises DownstreamError: a node failed and no fallback answered."""
        try:
            refused: Dict[int, Union[InputError, RequestStopped]] = dict(self.deadlines.before_run(works))
            per_work: List[List[Item]] = []
            for k, w in enumerate(works):
                start = sum(len(p) for p in per_work)
                thresholds = np.asarray(w.thresholds, dtype=np.float64).reshape(len(w.texts), -1)
                pairs = enumerate(zip(w.texts, thresholds))
                per_work.append([Item(start + j, k, text, thr, w.parameters, w.request_id, {}, w.context) for j, (text, thr) in pairs])
            texts = [it for k, items in enumerate(per_work) if k not in refused for it in items if it.text.strip()]
            began = time.perf_counter()
            for tokenizer in self.engine.token_kinds:
                await self.calls.ensure_tokens(texts, tokenizer)
            self.stage("tokenize", began)
            refused.update({k: e for k, items in enumerate(per_work)
                            if k not in refused and self.engine.windowing
                            and (e := window_error(self.engine.windowing, items, self.engine.policy.limits.max_windows_per_text))})
            items = [it for k, its in enumerate(per_work) if k not in refused for it in its]
            answers = await self.run_node(self.engine.policy.root, items)
            missing = [it.idx for it in items if it.idx not in answers]
            if missing:
                raise DownstreamError(f"the policy answered no route for {len(missing)} text(s)")
            refused.update(self.deadlines.stopped(works, refused))
            began = time.perf_counter()
            results: List[Union[Result, InputError, RequestStopped]] = []
            for k, its in enumerate(per_work):
                if k in refused:
                    results.append(refused[k])
                    continue
                probs = np.stack([answers[it.idx].probabilities for it in its])
                verdicts = self.head.verdicts(probs, np.stack([it.threshold for it in its]))
                for row, it in enumerate(its):  # a constant's or a vote's own verdicts
                    if answers[it.idx].verdict is not None:
                        verdicts[row] = answers[it.idx].verdict
                probs = probs.astype(np.float32)
                routes = [answers[it.idx].route for it in its]
                for r in routes:  # without a chunk node's ``:windows=<used>/<made>``: a bounded label set
                    self.count("orchestrator_texts_total", route=route_label(r))
                results.append(Result(probs, verdicts, routes))
            self.stage("results", began)
            return results
        finally:  # the metrics of this execute, also when it failed
            self.flush()
