"""The policy engine: runs a policy over the texts of one ``execute`` call.

Texts become :class:`~orchestrator.runtime.nodes.base.Item` objects that enter the policy's
root node; each node's handler is found in :data:`orchestrator.runtime.nodes.KINDS`. The
engine owns what handlers share: tokenization with each model's own tokenizer (in-process
from the tokenizer model's files, or one batched BLS call to the tokenizer model),
classification (rows sorted by length, padded per call with the tokenizer's pad id, split
at ``bls_max_batch_size`` rows, sent concurrently), the policy's head
(``heads.Head``: probabilities and verdicts of every answer), metrics, node timeouts and
the background queue of ``shadow`` nodes (``mirror.Mirror``). What it sets up for a policy
comes from what its kinds declare (``NodeKind.tokens``, ``windows``, ``calls``,
``background``), never from their names. Downstream calls go through the ``infer``
function it is given, so tests drive it with a fake one.
"""

from __future__ import annotations

import asyncio
import copy
import random
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime import nodes as N
from orchestrator.runtime.concurrency import as_concurrent, gather, in_concurrent_branch
from orchestrator.runtime.errors import DeadlineExceeded, DownstreamError, InputError, LimitError, RequestCancelled, RequestStopped
from orchestrator.runtime.heads import LEGACY, Head
from orchestrator.runtime.load import QueueDelay
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.mirror import Mirror
from orchestrator.runtime.nodes.base import DEADLINE_SUFFIX, Answer, Answers, Item, Node, route_label, split_target, truncate
from orchestrator.runtime.ondemand import ModelManager
from orchestrator.runtime.policy import Policy, bind_heads, inline_tokenizer_dirs
from orchestrator.runtime.request import CallOptions, RequestContext, Result, Work, call_trace

# infer(target, inputs, parameters, request_id, alone, options) -> outputs; raises DownstreamError.
# ``target``: a model name, or ``name@version`` (``nodes.model.target``) for a pinned version.
# ``alone``: no other downstream call of this execute can be in flight meanwhile, so the call
# may block the event loop (the router then uses the blocking BLS ``exec``).
# ``options``: the call's trace and timeout (``CallOptions``).
InferFn = Callable[
    [str, Dict[str, NDArray[Any]], Optional[Dict[str, Any]], str, bool, CallOptions], Awaitable[Dict[str, NDArray[Any]]]
]

_SAME = object()  # Engine.fork: keep this engine's value

#: Weight of the newest run in a node's cost estimate (an exponentially weighted mean of
#: its run times, :meth:`Engine.estimate`): about the last 5 runs count. A choice, not a
#: measured optimum: it follows a load change within a few requests.
COST_WEIGHT = 0.3


class Engine:
    """Runs a :class:`~orchestrator.runtime.policy.Policy` over the texts of one ``execute`` call.

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
    """

    def __init__(
        self,
        policy: Policy,
        infer: InferFn,
        metrics: Optional[Metrics] = None,
        models: Optional[ModelManager] = None,
        model_dir: Optional[Path] = None,
        shadow_infer: Optional[InferFn] = None,
        logger: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.costs: Dict[str, float] = {}  # node name -> estimated run time, seconds (shared by forks)
        if policy.head is None:  # not bound to a repository: every model has the legacy head
            bind_heads(policy, {c.model: LEGACY for c in policy.calls()})
        assert policy.head is not None, "bind_heads sets it"
        self.head: Head = policy.head
        self.tokenizers: Dict[str, Any] = {}  # transformers tokenizers by tokenizer model
        self.tokenizer_lock = threading.Lock()  # shared with the shadow worker's twin
        self.token_kinds = policy.tokenizers()
        if policy.inline_tokenizer:
            from transformers import AutoTokenizer

            for name, path in inline_tokenizer_dirs(policy, Path(model_dir or ".")).items():
                self.tokenizers[name] = AutoTokenizer.from_pretrained(str(path))
        self.infer = infer
        self.metrics = metrics
        self.models = models
        self.counter = 0
        self.rng = random.Random()
        self.windowing = policy.windows()  # what the nodes that window texts declared
        # The router's queue delay (overload mode of cascade nodes); the router marks each
        # execute on it, a fork shares it. Tests replace it to drive the delay.
        self.load = QueueDelay()
        self.mirror_runner: Optional[Mirror] = None
        if any(N.KINDS[n.kind].background for n in policy.nodes()):
            self.mirror_runner = Mirror(self.fork(shadow_infer or infer), metrics, logger)

    def fork(self, infer: InferFn, *, models: Any = _SAME, metrics: Any = _SAME) -> "Engine":
        """A twin sharing this engine's policy, tokenizers (and their lock), metrics and
        on-demand manager, with its own ``infer``, window counter and random draws, and
        no background queue (a ``shadow`` node inside a candidate answers without
        mirroring). ``models``, ``metrics``: replace the on-demand manager or the metrics
        (None: none; the router's warmup runs without either)."""
        twin = copy.copy(self)
        twin.infer, twin.counter, twin.rng, twin.mirror_runner = infer, 0, random.Random(), None
        if models is not _SAME:
            twin.models = models
        if metrics is not _SAME:
            twin.metrics = metrics
        return twin

    def close(self) -> None:
        """Stop the shadow worker, if any (what is still queued is dropped)."""
        if self.mirror_runner is not None:
            self.mirror_runner.close()

    # -- what node handlers use (nodes.base.Engine)

    def count(self, family: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to counter ``family`` with ``labels`` (see ``metrics.Metrics``)."""
        if self.metrics:
            self.metrics.inc(family, value, **labels)

    def gauge(self, family: str, value: float, **labels: str) -> None:
        """Set gauge ``family`` with ``labels`` to ``value`` (see ``metrics.Metrics``)."""
        if self.metrics:
            self.metrics.set(family, value, **labels)

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

    def queue_delay_ms(self) -> float:
        """The router's estimated queue delay, ms (:class:`~orchestrator.runtime.load.QueueDelay`)."""
        return self.load.delay_ms()

    def random(self) -> float:
        """A uniform draw in [0, 1) (split and shadow nodes, requests without an id)."""
        return self.rng.random()

    def mirror(self, node: Node, items: List[Item], answers: Answers) -> None:
        """Queue ``items`` for ``node``'s shadow candidate (``mirror.Mirror.submit``);
        never waits, never raises."""
        if self.mirror_runner is not None:
            self.mirror_runner.submit(node, items, answers)

    async def run_node(self, node: Node, items: List[Item]) -> Answers:
        """Run ``node``'s handler on ``items``; counts errors and latency, applies its
        timeout; a successful run's time on the engine clock feeds :meth:`estimate`.

        Raises:
            DownstreamError: the node failed or timed out.
        """
        if not items:
            return {}
        start, began = time.perf_counter(), self.clock()
        try:
            coro = N.KINDS[node.kind].run(self, node, items)
            if node.timeout_ms:
                try:
                    answers: Answers = await asyncio.wait_for(as_concurrent(coro), node.timeout_ms / 1000.0)
                except asyncio.TimeoutError:
                    raise DownstreamError(f"node '{node.name}' timed out after {node.timeout_ms:g} ms") from None
            else:
                answers = await coro
            self._measured(node, self.clock() - began)
            return answers
        except DownstreamError:
            self.count("orchestrator_node_errors_total", node=node.name)
            raise
        finally:
            if self.metrics:
                self.metrics.observe("orchestrator_node_latency_seconds", time.perf_counter() - start, node=node.name)

    # -- cancellation and deadlines (nodes.base.Engine; docs/reliability.md)

    def now(self) -> float:
        """The engine clock (seconds; deadlines are on it)."""
        return self.clock()

    def remaining(self, item: Item) -> Optional[float]:
        """Seconds left before ``item``'s request deadline (<= 0: passed); None: no deadline."""
        deadline = item.context.deadline
        return None if deadline is None else deadline - self.clock()

    def estimate(self, node: Node) -> float:
        """Estimated run time of ``node``, seconds: the exponentially weighted mean
        (:data:`COST_WEIGHT`) of its successful runs in this process (``run_node``
        measures each); 0.0 before its first."""
        return self.costs.get(node.name, 0.0)

    def affordable(self, node: Node, items: Sequence[Item]) -> Tuple[List[Item], List[Item]]:
        """``(go, short)``: the items whose request can wait for ``node`` (no deadline, or
        :meth:`estimate` strictly below what is left: a stage expected to end exactly at
        the deadline would be late), and the others, in order."""
        cost, now = self.estimate(node), self.clock()
        go: List[Item] = []
        short: List[Item] = []
        for it in items:
            deadline = it.context.deadline
            (go if deadline is None or cost < deadline - now else short).append(it)
        return go, short

    def late(self, items: Sequence[Item]) -> List[Item]:
        """The items whose request deadline has passed (now >= deadline), in order."""
        now = self.clock()
        return [it for it in items if it.context.deadline is not None and now >= it.context.deadline]

    def live(self, items: Sequence[Item]) -> List[Item]:
        """The items whose request is not cancelled, in order.

        ``is_cancelled()`` is asked at most once per request per call, and only of requests
        that already had a downstream call (one that just arrived is not asked: the stub's
        ``is_cancelled`` is an IPC round trip); an error asking it counts as not cancelled.
        A request found cancelled stays so (``RequestContext.cancelled``) and
        :meth:`run` answers it with ``RequestCancelled``.
        """
        asked = set()
        out = []
        for it in items:
            ctx = it.context
            if id(ctx) not in asked:
                asked.add(id(ctx))
                self._ask_cancelled(ctx)
            if not ctx.cancelled:
                out.append(it)
        return out

    @staticmethod
    def _ask_cancelled(ctx: RequestContext) -> None:
        """Ask ``is_cancelled()`` of a request that had a downstream call and is not known
        to be cancelled (an error asking it counts as not cancelled)."""
        if ctx.cancelled or not ctx.started:
            return
        try:
            ctx.cancelled = bool(ctx.is_cancelled())
        except Exception:  # the stub could not ask the server: go on
            ctx.cancelled = False

    def keep_for_deadline(self, node: Node, items: Sequence[Item], answers: Answers) -> None:
        """The answers of ``items`` stay those of an earlier stage, which ended before the
        deadline: ``ROUTE`` gets ``:deadline``, their requests count as answered in time
        (``RequestContext.early``) and ``orchestrator_deadline_texts_total{node}`` counts
        them."""
        for it in items:
            a = answers[it.idx]
            answers[it.idx] = Answer(a.probabilities, a.route + DEADLINE_SUFFIX, a.verdict)
            it.context.early = True
        self.count("orchestrator_deadline_texts_total", len(items), node=node.name)

    def _measured(self, node: Node, seconds: float) -> None:
        old = self.costs.get(node.name)
        self.costs[node.name] = seconds if old is None else old + COST_WEIGHT * (seconds - old)

    async def ensure_tokens(self, items: Sequence[Item], tokenizer: str) -> None:
        """Tokenize with tokenizer model ``tokenizer`` (in-process with its files, or one
        batched BLS call to it without truncation) the items that have no ids of it yet."""
        todo = [it for it in items if tokenizer not in it.tokens]
        if not todo:
            return
        local = self.tokenizers.get(tokenizer)
        if local is not None:  # in-process: the same files and call as the tokenizer model
            with self.tokenizer_lock:  # a fast tokenizer used from two threads raises "Already borrowed"
                encoded = local([it.text for it in todo], truncation=False, padding=False)["input_ids"]
            for it, ids in zip(todo, encoded):
                it.tokens[tokenizer] = np.asarray(ids, dtype=np.int64)
            return

        def inputs(part: List[int]) -> Dict[str, NDArray[Any]]:
            return {"TEXT": np.array([todo[i].text.encode("utf-8") for i in part], dtype=np.object_).reshape(-1, 1)}

        outs = await self._batched(tokenizer, todo, inputs, {"truncation": False})
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
        seqs = [truncate(it.ids(head.tokenizer), max_length) for it in items]
        order = sorted(range(len(seqs)), key=lambda i: seqs[i].shape[0])
        ordered = [items[i] for i in order]

        def inputs(part: List[int]) -> Dict[str, NDArray[Any]]:
            width = max(seqs[order[i]].shape[0] for i in part)
            ids = np.full((len(part), width), head.pad_token_id, dtype=np.int64)
            mask = np.zeros((len(part), width), dtype=np.int64)
            for row, i in enumerate(part):
                s = seqs[order[i]]
                ids[row, : s.shape[0]] = s
                mask[row, : s.shape[0]] = 1
            return {"input_ids": ids, "attention_mask": mask}

        name, _ = split_target(model)  # on-demand loading is per model, every version at once
        if self.models:
            await self.models.acquire(name)
        try:
            outs = await self._batched(model, ordered, inputs, None)
        finally:
            if self.models:
                self.models.release(name)
        logits = np.empty((len(seqs), head.num_logits), dtype=np.float32)
        parts = [o["logits"].reshape(o["logits"].shape[0], -1) for o in outs]
        for part in parts:
            if part.shape[1] != head.num_logits:
                raise DownstreamError(
                    f"model '{model}' answered {part.shape[1]} logit columns, but its head has {head.num_logits} "
                    f"({head.describe()}); a model without head.json is served as one logit: export it with "
                    "'orchestrator export' or write its head.json"
                )
        logits[order] = np.concatenate(parts)
        return logits

    # -- internals

    async def _batched(self, model: str, items: Sequence[Item], make_inputs: Callable[[List[int]], Dict[str, NDArray[Any]]],
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
            ids = ",".join(dict.fromkeys(it.request_id for it in rows if it.request_id))
            forwarded = {}
            if len({it.req for it in rows}) == 1:  # BLS parameters take str, int and bool only
                forwarded = {k: v for k, v in rows[0].params.items() if isinstance(v, (str, int, bool))}
            forwarded.update(parameters or {})
            calls.append(self.infer(model, make_inputs(part), forwarded, ids, alone, self._options(rows)))
        outs = await gather(calls)
        self._arrived(items)
        for part, out in zip(parts, outs):
            for output, value in out.items():
                answered = value.shape[0] if np.ndim(value) else 0
                if answered != len(part):
                    raise DownstreamError(
                        f"model '{model}' answered {answered} rows of '{output}' for {len(part)} input rows "
                        "(with Triton's response cache: a cached answer of a request with the same input bytes "
                        "and another shape)"
                    )
        return outs

    def _options(self, rows: Sequence[Item]) -> CallOptions:
        """The trace and timeout of one downstream call for ``rows``, which marks their
        requests as started (``RequestContext.started``): the trace of their request, or
        for rows of several requests the one ``request.call_trace`` picks; the timeout, the
        largest budget left of their requests (at least 1 us), so the call is never cut
        while one of its rows can still use its answer (the rows whose deadline passed
        do not use it: :meth:`_arrived`, the cascade); no timeout when a row's request
        has none."""
        contexts = {id(it.context): it.context for it in rows}
        for ctx in contexts.values():
            ctx.started = True
        trace = call_trace(list(contexts.values()))  # one per request, in row order
        deadlines = [ctx.deadline for ctx in contexts.values() if ctx.deadline is not None]
        timeout_us = 0
        if deadlines and len(deadlines) == len(contexts):  # a request without a deadline: no timeout
            timeout_us = max(1, int((max(deadlines) - self.clock()) * 1e6))
        return CallOptions(trace=trace, timeout_us=timeout_us)

    def _arrived(self, items: Sequence[Item]) -> None:
        """Downstream answers for ``items`` arrived now: a request whose deadline has
        passed is marked late (``RequestContext.late``; :meth:`run` refuses it unless a
        stage kept an earlier answer for it)."""
        now = self.clock()
        for it in items:
            if it.context.deadline is not None and now >= it.context.deadline:
                it.context.late = True

    # -- one execute call

    def _window_error(self, work: Work, items: Sequence[Item]) -> Optional[InputError]:
        """An InputError when a text of ``work`` would make more windows than
        ``limits.max_windows_per_text`` in any node of the policy that windows texts
        (``NodeKind.windows``)."""
        cap = self.policy.limits.max_windows_per_text
        for i, it in enumerate(items):
            counts = [(w.count(int(it.tokens[w.tokenizer].shape[0])), int(it.tokens[w.tokenizer].shape[0]))
                      for w in self.windowing if w.tokenizer in it.tokens]
            windows, tokens = max(counts, default=(1, 0))
            if windows > cap:
                return LimitError(
                    f"TEXT[{i}]: {tokens} tokens make {windows} windows, over the limit of {cap} windows per text "
                    "(policy limits.max_windows_per_text)",
                    "max_windows_per_text",
                )
        return None

    async def run(self, works: List[Work]) -> List[Union[Result, InputError, RequestStopped]]:
        """Answer every request in ``works``: one :class:`Result` each, in order, or the
        InputError of a request that has a text over ``limits.max_windows_per_text``, or
        ``RequestCancelled`` for a request found cancelled (``live``; a request run again,
        as in the router's retries, is asked before it runs, and one cancelled is not run),
        or ``DeadlineExceeded`` for a request whose deadline passed before the run (not
        run) or that got a downstream answer after its deadline and no earlier stage's
        answer kept for it (``keep_for_deadline``).

        Raises:
            DownstreamError: a node failed and no fallback answered.
        """
        refused: Dict[int, Union[InputError, RequestStopped]] = dict(self._before_run(works))
        per_work: List[List[Item]] = []
        for k, w in enumerate(works):
            start = sum(len(p) for p in per_work)
            thresholds = np.asarray(w.thresholds, dtype=np.float64).reshape(len(w.texts), -1)
            pairs = enumerate(zip(w.texts, thresholds))
            per_work.append([Item(start + j, k, text, thr, w.parameters, w.request_id, {}, w.context) for j, (text, thr) in pairs])
        texts = [it for k, items in enumerate(per_work) if k not in refused for it in items if it.text.strip()]
        for tokenizer in self.token_kinds:
            await self.ensure_tokens(texts, tokenizer)
        refused.update({k: e for k, items in enumerate(per_work)
                        if k not in refused and self.windowing and (e := self._window_error(works[k], items))})
        items = [it for k, its in enumerate(per_work) if k not in refused for it in its]
        answers = await self.run_node(self.policy.root, items)
        missing = [it.idx for it in items if it.idx not in answers]
        if missing:
            raise DownstreamError(f"the policy answered no route for {len(missing)} text(s)")
        refused.update(self._stopped(works, refused))
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
        return results

    def _before_run(self, works: Sequence[Work]) -> Dict[int, RequestStopped]:
        """The requests of ``works`` not to run: cancelled (a request run before, as in the
        router's retries, is asked: this run is its next stage) or past their deadline.
        The others start afresh (``late``, ``early`` cleared)."""
        now = self.clock()
        out: Dict[int, RequestStopped] = {}
        for k, w in enumerate(works):
            w.context.late = w.context.early = False
            self._ask_cancelled(w.context)
            if w.context.cancelled:
                out[k] = RequestCancelled("the request was cancelled")
            elif w.context.deadline is not None and now >= w.context.deadline:
                out[k] = DeadlineExceeded("deadline exceeded: no stage answered within the request's timeout")
        return out

    def _stopped(self, works: Sequence[Work], refused: Dict[int, Union[InputError, RequestStopped]]) -> Dict[int, RequestStopped]:
        """The requests of ``works`` cancelled or late (refused before the run as such, or
        found so during it), each counted once (``orchestrator_cancelled_requests_total``,
        ``orchestrator_expired_requests_total``)."""
        out: Dict[int, RequestStopped] = {}
        for k, w in enumerate(works):
            ctx = w.context
            if isinstance(refused.get(k), RequestCancelled) or (k not in refused and ctx.cancelled):
                out[k] = RequestCancelled("the request was cancelled; no further stage ran for it")
                self.count("orchestrator_cancelled_requests_total")
            elif isinstance(refused.get(k), DeadlineExceeded) or (k not in refused and ctx.late and not ctx.early):
                out[k] = DeadlineExceeded("deadline exceeded: no stage answered within the request's timeout")
                self.count("orchestrator_expired_requests_total")
        return out
