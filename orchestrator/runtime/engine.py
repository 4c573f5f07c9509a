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
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from orchestrator.runtime import nodes as N
from orchestrator.runtime.concurrency import as_concurrent, gather, in_concurrent_branch
from orchestrator.runtime.errors import DownstreamError, InputError, LimitError
from orchestrator.runtime.heads import LEGACY, Head
from orchestrator.runtime.load import QueueDelay
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.mirror import Mirror
from orchestrator.runtime.nodes.base import Answer, Answers, Item, Node, split_target, truncate
from orchestrator.runtime.ondemand import ModelManager
from orchestrator.runtime.policy import Policy, bind_heads, inline_tokenizer_dirs
from orchestrator.runtime.request import Result, Work

# infer(target, inputs, parameters, request_id, alone) -> outputs; raises DownstreamError.
# ``target``: a model name, or ``name@version`` (``nodes.model.target``) for a pinned version.
# ``alone``: no other downstream call of this execute can be in flight meanwhile, so the call
# may block the event loop (the router then uses the blocking BLS ``exec``).
InferFn = Callable[[str, Dict[str, np.ndarray], Optional[dict], str, bool], Awaitable[Dict[str, np.ndarray]]]

_SAME = object()  # Engine.fork: keep this engine's value


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
    """

    def __init__(
        self,
        policy: Policy,
        infer: InferFn,
        metrics: Optional[Metrics] = None,
        models: Optional[ModelManager] = None,
        model_dir: Optional[Path] = None,
        shadow_infer: Optional[InferFn] = None,
        logger=None,
    ):
        self.policy = policy
        if policy.head is None:  # not bound to a repository: every model has the legacy head
            bind_heads(policy, {c.model: LEGACY for c in policy.calls()})
        self.head: Head = policy.head
        self.tokenizers: Dict[str, object] = {}
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

    def window(self, parent: Item, tokenizer: str, ids: np.ndarray) -> Item:
        """A new item for one window (token ids ``ids`` of ``tokenizer``) of ``parent``'s text."""
        self.counter += 1
        return Item(-self.counter, parent.req, parent.text, parent.threshold, parent.params, parent.request_id, {tokenizer: ids})

    def final_verdicts(self, answer: Answer, item: Item) -> np.ndarray:
        """The verdicts bool [C] the router reports for ``answer`` of ``item``: the fixed
        ones of a constant or vote, else the head's rule at the item's thresholds."""
        if answer.verdict is not None:
            return np.asarray(answer.verdict, dtype=bool)
        return self.head.verdicts(answer.probabilities.reshape(1, -1), item.threshold.reshape(1, -1))[0]

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
        """Run ``node``'s handler on ``items``; counts errors and latency, applies its timeout.

        Raises:
            DownstreamError: the node failed or timed out.
        """
        if not items:
            return {}
        start = time.perf_counter()
        try:
            coro = N.KINDS[node.kind].run(self, node, items)
            if node.timeout_ms:
                try:
                    return await asyncio.wait_for(as_concurrent(coro), node.timeout_ms / 1000.0)
                except asyncio.TimeoutError:
                    raise DownstreamError(f"node '{node.name}' timed out after {node.timeout_ms:g} ms") from None
            return await coro
        except DownstreamError:
            self.count("orchestrator_node_errors_total", node=node.name)
            raise
        finally:
            if self.metrics:
                self.metrics.observe("orchestrator_node_latency_seconds", time.perf_counter() - start, node=node.name)

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

        def inputs(part):
            return {"TEXT": np.array([todo[i].text.encode("utf-8") for i in part], dtype=np.object_).reshape(-1, 1)}

        outs = await self._batched(tokenizer, todo, inputs, {"truncation": False})
        k = 0
        for out in outs:
            ids, lengths = out["input_ids"], out["attention_mask"].sum(axis=1)
            for row in range(ids.shape[0]):
                todo[k].tokens[tokenizer] = ids[row, : int(lengths[row])]
                k += 1

    async def classify(self, model: str, items: Sequence[Item], max_length: int, head: Head) -> np.ndarray:
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

        def inputs(part):
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
                    "'orchestrator export' or write its head.json",
                    retryable=False,
                )
        logits[order] = np.concatenate(parts)
        return logits

    # -- internals

    async def _batched(self, model: str, items: Sequence[Item], make_inputs, parameters: Optional[dict]) -> list:
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
            calls.append(self.infer(model, make_inputs(part), forwarded, ids, alone))
        outs = await gather(calls)
        for part, out in zip(parts, outs):
            for output, value in out.items():
                rows = value.shape[0] if np.ndim(value) else 0
                if rows != len(part):
                    raise DownstreamError(
                        f"model '{model}' answered {rows} rows of '{output}' for {len(part)} input rows "
                        "(with Triton's response cache: a cached answer of a request with the same input bytes "
                        "and another shape)"
                    )
        return outs

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

    async def run(self, works: List[Work]) -> List[Union[Result, InputError]]:
        """Answer every request in ``works``: one :class:`Result` each, in order, or the
        InputError of a request that has a text over ``limits.max_windows_per_text``.

        Raises:
            DownstreamError: a node failed and no fallback answered.
        """
        per_work: List[List[Item]] = []
        for k, w in enumerate(works):
            start = sum(len(p) for p in per_work)
            thresholds = np.asarray(w.thresholds, dtype=np.float64).reshape(len(w.texts), -1)
            pairs = enumerate(zip(w.texts, thresholds))
            per_work.append([Item(start + j, k, text, thr, w.parameters, w.request_id) for j, (text, thr) in pairs])
        texts = [it for items in per_work for it in items if it.text.strip()]
        for tokenizer in self.token_kinds:
            await self.ensure_tokens(texts, tokenizer)
        refused = {k: e for k, items in enumerate(per_work) if self.windowing and (e := self._window_error(works[k], items))}
        items = [it for k, its in enumerate(per_work) if k not in refused for it in its]
        answers = await self.run_node(self.policy.root, items)
        missing = [it.idx for it in items if it.idx not in answers]
        if missing:
            raise DownstreamError(f"the policy answered no route for {len(missing)} text(s)")
        results: List[Union[Result, InputError]] = []
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
            for r in routes:
                self.count("orchestrator_texts_total", route=r)
            results.append(Result(probs, verdicts, routes))
        return results
