"""The engine's model calls: tokens, padding and batching of BLS calls (``engine.calls``).

:class:`ModelCalls` tokenizes texts with each model's own tokenizer (in-process from the
tokenizer model's files, or one batched BLS call to the tokenizer model) and classifies
them (rows sorted by length, padded per call with the head's pad id, split at
``bls_max_batch_size`` rows, sent concurrently). Every call goes through the ``infer``
function it is given (``InferFn``; the router's is ``Downstream.infer``), with the trace
and timeout ``Deadlines.call_options`` gives its rows.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.bls.ondemand import ModelManager
from orchestrator.runtime.errors import DownstreamError
from orchestrator.runtime.execution.concurrency import gather, in_concurrent_branch
from orchestrator.runtime.execution.deadlines import CallOptions, Deadlines
from orchestrator.runtime.execution.tokenize import TextTokenizer
from orchestrator.runtime.metrics import Metrics, observe_stage
from orchestrator.runtime.routing.heads import Head
from orchestrator.runtime.routing.nodes.base import Item, split_target, truncate
from orchestrator.runtime.routing.policy import Policy, inline_tokenizer_dirs

# infer(target, inputs, parameters, request_id, alone, options) -> outputs; raises DownstreamError.
# ``target``: a model name, or ``name@version`` (``nodes.model.target``) for a pinned version.
# ``alone``: no other downstream call of this execute can be in flight meanwhile, so the call
# may block the event loop (the router then uses the blocking BLS ``exec``).
# ``options``: the call's trace and timeout (``CallOptions``).
InferFn = Callable[
    [str, Dict[str, NDArray[Any]], Optional[Dict[str, Any]], str, bool, CallOptions], Awaitable[Dict[str, NDArray[Any]]]
]


def inline_tokenizers(policy: Policy, model_dir: Optional[Path]) -> Dict[str, TextTokenizer]:
    """The in-process tokenizers of ``policy`` (``inline.tokenizer``) by tokenizer model,
    read from their files (paths relative to the router's ``model_dir``); none without."""
    if not policy.inline_tokenizer:
        return {}
    return {name: TextTokenizer(path) for name, path in inline_tokenizer_dirs(policy, Path(model_dir or ".")).items()}


class ModelCalls:
    """Tokenize and classify through ``infer`` (module docstring).

    Args:
        policy: the validated policy (``bls_max_batch_size``, inline tokenizers).
        infer: the downstream call (:data:`InferFn`); raises DownstreamError.
        models: the on-demand model manager (None: every model counts as loaded).
        deadlines: marks requests started and late around each call.
        tokenizers: :class:`~orchestrator.runtime.execution.tokenize.TextTokenizer` by tokenizer
            model (inline tokenizers only: :func:`inline_tokenizers`, made once per engine).
        metrics: where each batched group's round trip goes (``orchestrator_stage_seconds{stage="bls"}``).
    """

    def __init__(self, policy: Policy, infer: InferFn, models: Optional[ModelManager], deadlines: Deadlines,
                 tokenizers: Optional[Dict[str, TextTokenizer]] = None, metrics: Optional[Metrics] = None) -> None:
        self.policy, self.infer, self.models, self.deadlines, self.metrics = policy, infer, models, deadlines, metrics
        self.tokenizers: Dict[str, TextTokenizer] = tokenizers or {}

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
        logits = np.empty((len(seqs), columns), dtype=np.float32)
        parts = [o["logits"].reshape(o["logits"].shape[0], -1) for o in outs]
        for part in parts:
            if part.shape[1] != columns:
                raise DownstreamError(
                    f"model '{model}' answered {part.shape[1]} logit columns, but its head has {columns} "
                    f"({head.describe()}); a model without head.json is served as one logit: export it with "
                    "'orchestrator export' or write its head.json"
                )
        logits[order] = np.concatenate(parts)
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
            ids = ",".join(dict.fromkeys(it.request_id for it in rows if it.request_id))
            forwarded = {}
            if len({it.req for it in rows}) == 1:  # BLS parameters take str, int and bool only
                forwarded = {k: v for k, v in rows[0].params.items() if isinstance(v, (str, int, bool))}
            forwarded.update(parameters or {})
            calls.append(self.infer(model, make_inputs(part), forwarded, ids, alone, self.deadlines.call_options(rows)))
        began = time.perf_counter()
        outs = await gather(calls)
        observe_stage(self.metrics, "bls", began)
        self.deadlines.arrived(items)
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
