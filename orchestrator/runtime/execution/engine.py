"""The policy engine: runs a policy over the texts of one ``execute`` call.

Texts become :class:`~orchestrator.runtime.routing.nodes.base.Item` objects that enter the policy's root node;
each node's handler is found in ``routing.nodes.KINDS``. The :class:`Engine` is made once, at load; each
execute is a :class:`Run` (``Engine.start``), whose :class:`ModelCalls` tokenize texts with each model's own
tokenizer (in-process from the tokenizer model's files, or one batched BLS call to the tokenizer model) and
classify them (rows sorted by length, padded per call with the head's pad id, split at ``bls_max_batch_size``
rows, sent concurrently). What the engine sets up for a policy comes from what its kinds declare
(``NodeKind.tokens``, ``windows``, ``calls``, ``background``), never from their names. Every downstream call
goes through the ``infer`` function a run is given (:data:`InferFn`; the router's is ``Downstream.infer``;
tests pass a fake one), with the trace and timeout ``request.Deadlines.call_options`` gives its rows.

Concurrency on the router's event loop: a BLS call that is the only one in flight may use the blocking
``InferenceRequest.exec`` (no thread hand-offs); calls that run beside others (branches under :func:`gather`)
or under a timeout (``asyncio.wait_for`` must be able to give up on them) must use ``async_exec``: a context
variable says which.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import random
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.bls.ondemand import ModelManager
from orchestrator.runtime.errors import DownstreamError, InputError, LimitError, RequestStopped
from orchestrator.runtime.execution.line import compile_line
from orchestrator.runtime.execution.mirror import Mirror
from orchestrator.runtime.execution.tokenize import TextTokenizer, truncate
from orchestrator.runtime.metrics import Key, Metrics, series
from orchestrator.runtime.request import CallOptions, Deadlines, Result, Work
from orchestrator.runtime.routing import nodes as N
from orchestrator.runtime.routing.heads import LEGACY, Head
from orchestrator.runtime.routing.nodes.base import Answer, Answers, Item, Node, Windows, split_target
from orchestrator.runtime.routing.policy import Policy, bind_heads, inline_tokenizer_dirs

T = TypeVar("T")

# infer(target, inputs, parameters, request_id, alone, options) -> outputs; raises DownstreamError.
# ``target``: a model name, or ``name@version`` (``nodes.model.target``) for a pinned version.
# ``alone``: no other downstream call of this execute can be in flight meanwhile, so the call
# may block the event loop (the router then uses the blocking BLS ``exec``).
# ``options``: the call's trace and timeout (``CallOptions``).
InferFn = Callable[
    [str, Dict[str, NDArray[Any]], Optional[Dict[str, Any]], str, bool, CallOptions], Awaitable[Dict[str, NDArray[Any]]]
]

#: Weight of the newest run in a node's cost estimate (an exponentially weighted mean, :meth:`Engine.measured`, read by
#: ``Deadlines.estimate``): about the last 5 runs count; a choice, not a measured optimum (it follows a load change).
COST_WEIGHT = 0.3

# True inside a branch that runs beside others or under a timeout.
_CONCURRENT: contextvars.ContextVar[bool] = contextvars.ContextVar("orchestrator_concurrent", default=False)


def in_concurrent_branch() -> bool:
    """True when the current task runs beside others or under a timeout."""
    return _CONCURRENT.get()


async def as_concurrent(coro: Awaitable[T]) -> T:
    """Await ``coro`` marked concurrent (its downstream calls must not block the loop)."""
    token = _CONCURRENT.set(True)  # reset: Python 3.12's wait_for awaits in the caller's task
    try:
        return await coro
    finally:
        _CONCURRENT.reset(token)


async def gather(coros: Iterable[Awaitable[T]], settle: bool = False) -> List[Any]:
    """``asyncio.gather`` of ``coros``, marking them concurrent when there is more than one;
    ``settle``: failures are returned in their places (``return_exceptions``)."""
    coros = list(coros)
    if not coros:  # as asyncio.gather() of nothing: [], without its future
        return []
    if len(coros) == 1 and not settle:
        return [await coros[0]]
    return await asyncio.gather(*(as_concurrent(c) for c in coros), return_exceptions=settle)


@functools.lru_cache(maxsize=1024)  # on every text's path; a policy has a few routes
def route_label(route: str) -> str:
    """``route`` without its details: ``:<name>=<value>`` parts a node appends to say how it answered (a chunk
    node's ``:windows=<used>/<made>``). The ``orchestrator_texts_total`` label: one value per route, not per count."""
    return ":".join(part for part in route.split(":") if "=" not in part)


def window_error(windowing: Sequence[Windows], items: Sequence["Item"], cap: int) -> Optional[LimitError]:
    """A LimitError when a text of ``items`` (one request's) would make more than ``cap``
    windows (``limits.max_windows_per_text``) in any of the ``windowing`` nodes."""
    for i, it in enumerate(items):
        worst: Optional[Tuple[int, int]] = None  # max() of the nodes' (windows, tokens), without a list
        for w in windowing:
            if (ids := it.tokens.get(w.tokenizer)) is not None:
                pair = (w.count(int(ids.shape[0])), int(ids.shape[0]))
                worst = pair if worst is None or pair > worst else worst
        windows, tokens = worst or (1, 0)
        if windows > cap:
            return LimitError(
                f"TEXT[{i}]: {tokens} tokens make {windows} windows, over the limit of {cap} windows per text "
                "(policy limits.max_windows_per_text)",
                "max_windows_per_text",
            )
    return None


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
        costs: node name -> estimated run time, seconds (:meth:`measured`; read by
            ``Deadlines.estimate``), shared by every run.
        line: the policy as one way through (``execution.line.Line``; None: it branches), for :meth:`Run.run`.
    """

    def __init__(self, policy: Policy, infer: InferFn, metrics: Optional[Metrics] = None, models: Optional[ModelManager] = None,
                 model_dir: Optional[Path] = None, shadow_infer: Optional[InferFn] = None, logger: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        if policy.head is None:  # not bound to a repository: every model has the legacy head
            policy = self.policy = bind_heads(policy, {c.model: LEGACY for c in policy.calls()})
        assert policy.head is not None, "bind_heads sets it"
        self.head: Head = policy.head
        self.token_kinds = policy.tokenizers()
        self.infer, self.models, self.metrics = infer, models, metrics
        self.tokenizers: Dict[str, TextTokenizer] = {}  # the in-process ones (``inline.tokenizer``), read from their files
        if policy.inline_tokenizer:  # paths relative to the router's model_dir
            self.tokenizers = {name: TextTokenizer(path) for name, path in inline_tokenizer_dirs(policy, Path(model_dir or ".")).items()}
        self.costs: Dict[str, float] = {}
        self.rng = random.Random()  # every run's draws (Run.random)
        self.states: Dict[str, Any] = {}  # node name -> its state across executes (Run.state), shared by every run
        self.on_demand = bool(policy.on_demand())  # else no model call needs the on-demand manager
        self.windowing = policy.windows()  # what the nodes that window texts declared
        self.line = compile_line(policy.root)  # one way through: runs that take it skip the tree (execution.line)
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

    def measured(self, node: Node, seconds: float) -> None:
        """A successful run of ``node`` took ``seconds`` on the engine clock: its cost
        estimate (:attr:`costs`) moves towards it by :data:`COST_WEIGHT`."""
        old = self.costs.get(node.name)
        self.costs[node.name] = seconds if old is None else old + COST_WEIGHT * (seconds - old)

    def close(self) -> None:
        """Stop the shadow worker, if any (what is still queued is dropped)."""
        if self.mirror_runner is not None:
            self.mirror_runner.close()


class Run:
    """What belongs to one ``execute`` (a warmup sample, a shadow comparison): the ``infer``
    its model calls use (``calls``: :class:`ModelCalls`), deadlines and cancellation
    (``deadlines``: ``request.Deadlines``), window ids,
    random draws, its metrics and the shadow queue. Node handlers get it (``nodes.base.Engine``)."""

    def __init__(self, engine: Engine, infer: InferFn, models: Optional[ModelManager], metrics: Optional[Metrics],
                 mirror_runner: Optional[Mirror]) -> None:
        self.engine, self.head, self.metrics, self.mirror_runner = engine, engine.head, metrics, mirror_runner
        # the timing histograms (stage, node latency): off with metrics_timing_sample=off
        self.timing = metrics is not None and bool(getattr(metrics, "timing", True))
        self.deadlines = Deadlines(engine.clock, metrics, engine.costs)
        self.calls = ModelCalls(engine.policy, infer, models, self.deadlines, engine.tokenizers, self.stage)
        self.counter = 0
        self.counts: Dict[Key, float] = {}  # (family, labels) -> value: handed to ``metrics`` at the end (flush)
        self.observations: Dict[Key, List[float]] = {}
        self.gauges: Dict[Key, float] = {}

    # -- what node handlers use (nodes.base.Engine)

    def count(self, family: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to counter ``family`` with ``labels`` (see ``metrics.Metrics``; at :meth:`flush`)."""
        if self.metrics is None:
            return
        key = (family, tuple(sorted(labels.items())))
        self.counts[key] = self.counts.get(key, 0.0) + value

    def gauge(self, family: str, value: float, **labels: str) -> None:
        """Set gauge ``family`` with ``labels`` to ``value`` (see ``metrics.Metrics``; at :meth:`flush`)."""
        if self.metrics is not None:
            self.gauges[(family, tuple(sorted(labels.items())))] = value

    def observe(self, family: str, value: float, **labels: str) -> None:
        """Add one observation to histogram ``family`` (see ``metrics.Metrics``; at :meth:`flush`)."""
        if self.metrics is not None:
            self.observations.setdefault((family, tuple(sorted(labels.items()))), []).append(value)

    def stage(self, stage: str, began: float) -> None:
        """Observe ``orchestrator_stage_seconds{stage}``: ``time.perf_counter()`` since ``began``
        (nothing when timing is off)."""
        if self.timing:
            self.observations.setdefault(series("orchestrator_stage_seconds", "stage", stage), []).append(time.perf_counter() - began)

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
        """A uniform draw in [0, 1) (split and shadow nodes, requests without an id), from
        the engine's generator (seeding one per run would cost each execute ~20 us)."""
        return self.engine.rng.random()

    def state(self, node: Node, make: Callable[[], T]) -> T:
        """``node``'s state across executes, made by ``make`` on first use: the engine's (``Engine.states``), so every
        run shares it; ``setdefault`` keeps one of two first uses at once (the shadow worker's thread)."""
        held: T = self.engine.states[node.name] if node.name in self.engine.states else self.engine.states.setdefault(node.name, make())
        return held

    def mirror(self, node: Node, items: List[Item], answers: Answers) -> None:
        """Queue ``items`` for ``node``'s shadow candidate (``mirror.Mirror.submit``);
        never waits, never raises. A run without the shadow queue (warmup, a candidate's
        own shadow node) answers without mirroring."""
        if self.mirror_runner is not None:
            self.mirror_runner.submit(node, items, [(answers[it.idx].probabilities, self.final_verdicts(answers[it.idx], it))
                                                    for it in items])

    #: :func:`gather` itself (``coros`` side by side through ``async_exec``), without a wrapper's call.
    gather = staticmethod(gather)

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
            self.engine.measured(node, self.engine.clock() - began)
            return answers
        except DownstreamError:
            self.count("orchestrator_node_errors_total", node=node.name)
            raise
        finally:
            if self.timing:  # observe(), its series made once
                key = series("orchestrator_node_latency_seconds", "node", node.name)
                self.observations.setdefault(key, []).append(time.perf_counter() - start)

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
            per_thresholds: List[NDArray[Any]] = []  # each work's thresholds, float64 [texts, 1 or C]: its items' rows
            start = 0  # the first item's idx of each work: the texts before it
            for k, w in enumerate(works):
                thresholds = np.asarray(w.thresholds, dtype=np.float64).reshape(len(w.texts), -1)
                pairs = enumerate(zip(w.texts, thresholds), start)
                per_work.append([Item(j, k, text, thr, w.parameters, w.request_id, {}, w.context) for j, (text, thr) in pairs])
                per_thresholds.append(thresholds)
                start += len(per_work[-1])
            texts = [it for k, items in enumerate(per_work) if k not in refused for it in items if it.text.strip()]
            began = time.perf_counter()
            for tokenizer in self.engine.token_kinds:
                await self.calls.ensure_tokens(texts, tokenizer)
            self.stage("tokenize", began)
            for k, items in enumerate(per_work) if self.engine.windowing else ():  # a loop: no dict to update from
                if k not in refused and (e := window_error(self.engine.windowing, items, self.engine.policy.limits.max_windows_per_text)):
                    refused[k] = e
            items = [it for k, its in enumerate(per_work) if k not in refused for it in its]
            line = self.engine.line  # every text one way through: one model call, no tree walked
            root = line.answer(self, items) if line is not None and items and line.fits(items) else self.run_node(self.engine.policy.root, items)
            answers = await root
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
                answered = [answers[it.idx] for it in its]
                probs = answered[0].probabilities[np.newaxis] if len(answered) == 1 else np.stack([a.probabilities for a in answered])
                verdicts = self.head.verdicts(probs, per_thresholds[k])
                for row, a in enumerate(answered):  # a constant's or a vote's own verdicts
                    if a.verdict is not None:
                        verdicts[row] = a.verdict
                probs = probs.astype(np.float32)
                routes = [a.route for a in answered]
                for r in routes:  # without a chunk node's ``:windows=<used>/<made>``: a bounded label set
                    self.count("orchestrator_texts_total", route=route_label(r))
                results.append(Result(probs, verdicts, routes))
            self.stage("results", began)
            return results
        finally:  # the metrics of this execute, also when it failed
            self.flush()


class ModelCalls:
    """Tokenize and classify through ``infer`` (module docstring).

    Args:
        policy: the validated policy (``bls_max_batch_size``, inline tokenizers).
        infer: the downstream call (:data:`InferFn`); raises DownstreamError.
        models: the on-demand model manager (None: every model counts as loaded).
        deadlines: marks requests started and late around each call.
        tokenizers: :class:`~orchestrator.runtime.execution.tokenize.TextTokenizer` by tokenizer
            model (inline tokenizers only: ``Engine.tokenizers``, made once per engine).
        stage: ``(stage, began)``: the run's :meth:`Run.stage`, where each batched group's
            round trip goes (``orchestrator_stage_seconds{stage="bls"}``).
    """

    def __init__(self, policy: Policy, infer: InferFn, models: Optional[ModelManager], deadlines: Deadlines,
                 tokenizers: Dict[str, TextTokenizer], stage: Callable[[str, float], None]) -> None:
        self.policy, self.infer, self.models, self.deadlines, self.stage = policy, infer, models, deadlines, stage
        self.tokenizers = tokenizers

    async def ensure_tokens(self, items: Sequence[Item], tokenizer: str) -> None:
        """Tokenize with tokenizer model ``tokenizer`` (in-process with its files, or one
        batched BLS call to it without truncation) the items that have no ids of it yet."""
        todo = [it for it in items if tokenizer not in it.tokens]
        if not todo:
            return
        local = self.tokenizers.get(tokenizer)
        if local is not None:  # in-process: the same files and encoding as the tokenizer model
            for it, ids in zip(todo, local.encode([it.text for it in todo], truncation=False)):
                it.tokens[tokenizer] = ids
            return

        def inputs(part: List[int]) -> Dict[str, NDArray[Any]]:
            return {"TEXT": np.array([todo[i].text.encode("utf-8") for i in part], dtype=np.object_).reshape(-1, 1)}

        outs = await self.batched(tokenizer, todo, inputs, {"truncation": False})
        k = 0
        for out in outs:
            ids, lengths = out["input_ids"], out["attention_mask"].sum(axis=1)
            for row in range(ids.shape[0]):
                todo[k].tokens[tokenizer] = ids[row, : int(lengths[row])]
                k += 1

    async def classify(self, model: str, items: Sequence[Item], max_length: int, head: Head) -> NDArray[Any]:
        """Logits (float32 [len(items), head.num_logits]) of ``model`` (a name or
        ``name@version``): the ids of the head's tokenizer, truncated to ``max_length``
        tokens, rows sorted by length and padded per call with the head's ``pad_token_id``.

        Raises:
            DownstreamError: the model failed, answered another number of rows than it
                was sent or another number of logit columns than its head has, or (on
                demand) could not be loaded.
        """
        seqs = [truncate(it.tokens[head.tokenizer], max_length) for it in items]
        order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
        ordered = [items[i] for i in order]

        def inputs(part: List[int]) -> Dict[str, NDArray[Any]]:
            if len(part) == 1:  # one row: its ids as they are, nothing to pad
                one = np.array(seqs[order[part[0]]], dtype=np.int64).reshape(1, -1)
                mask = np.empty(one.shape, dtype=np.int64)
                mask.fill(1)  # np.ones' own two steps, without its Python frame
                return {"input_ids": one, "attention_mask": mask}
            width = max(seqs[order[i]].shape[0] for i in part)
            ids = np.full((len(part), width), head.pad_token_id, dtype=np.int64)
            mask = np.zeros((len(part), width), dtype=np.int64)
            for row, i in enumerate(part):
                s = seqs[order[i]]
                ids[row, : s.shape[0]] = s
                mask[row, : s.shape[0]] = 1
            return {"input_ids": ids, "attention_mask": mask}

        if not self.models:
            outs = await self.batched(model, ordered, inputs, None)
        else:
            name, _ = split_target(model)  # on-demand loading is per model, every version at once
            await self.models.acquire(name)
            try:
                outs = await self.batched(model, ordered, inputs, None)
            finally:
                self.models.release(name)
        columns = head.num_logits
        parts = [o["logits"].reshape(o["logits"].shape[0], -1) for o in outs]
        for part in parts:
            if part.shape[1] != columns:
                raise DownstreamError(
                    f"model '{model}' answered {part.shape[1]} logit columns, but its head has {columns} "
                    f"({head.describe()}); a model without head.json is served as one logit: export it with "
                    "'orchestrator export' or write its head.json"
                )
        block = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if order == sorted(order):  # rows sent in the items' order (one text, or sorted already): a new array, no scatter
            return block.astype(np.float32)
        logits = np.empty((len(seqs), columns), dtype=np.float32)
        logits[order] = block
        return logits

    async def batched(self, model: str, items: Sequence[Item], make_inputs: Callable[[List[int]], Dict[str, NDArray[Any]]],
                      parameters: Optional[Dict[str, Any]]) -> List[Dict[str, NDArray[Any]]]:
        """Send ``items`` to ``model`` in concurrent calls of at most ``bls_max_batch_size``
        rows; ``make_inputs(row indices)`` builds one call's tensors.

        Each call carries the Triton request ids of its rows, and, when all its rows come
        from one request, that request's parameters too (ours win), so a trace can follow a
        request downstream.

        Raises:
            DownstreamError: a call failed, or an output has another number of rows than
                the call sent. Triton's response cache keys on the model, version, input
                names and input bytes, not shapes (core r24.10 ``TritonCache::Hash``), so
                rows ``[2, 310, 3, 2, 538, 3]`` sent as one text of 6 tokens and as two
                of 3 share a key: this check turns such a cached answer into an error
                instead of broadcasting one row's logit over two texts.
        """
        size = self.policy.bls_max_batch_size
        parts = [list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size)]
        alone = len(parts) == 1 and not in_concurrent_branch()
        calls = []
        for part in parts:
            rows = [items[i] for i in part]
            ids = rows[0].request_id if len(rows) == 1 else ",".join(dict.fromkeys(it.request_id for it in rows if it.request_id))
            forwarded = {}
            if len(rows) == 1 or len({it.req for it in rows}) == 1:  # BLS parameters take str, int and bool only
                forwarded = {k: v for k, v in rows[0].params.items() if isinstance(v, (str, int, bool))}
            forwarded.update(parameters or {})
            calls.append(self.infer(model, make_inputs(part), forwarded, ids, alone, self.deadlines.call_options(rows)))
        began = time.perf_counter()
        outs = [await calls[0]] if len(calls) == 1 else await gather(calls)  # gather's own rule for one call
        self.stage("bls", began)
        self.deadlines.arrived(items)
        for part, out in zip(parts, outs):
            for output, value in out.items():
                answered = value.shape[0] if (value.ndim if isinstance(value, np.ndarray) else np.ndim(value)) else 0
                if answered != len(part):
                    raise DownstreamError(
                        f"model '{model}' answered {answered} rows of '{output}' for {len(part)} input rows "
                        "(with Triton's response cache: a cached answer of a request with the same input bytes "
                        "and another shape)"
                    )
        return outs
