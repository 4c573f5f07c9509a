"""What the run's machinery costs a one-way policy: a fused stand-in for ``Run.run`` (lab only).

``python -m lab.bench.execute_profile --models router_single --ablate fused_line`` times the
router with its ``Run.run`` and with :func:`fused` in its place, in alternating blocks. The
stand-in answers an execute of one request of one text through a policy compiled to a line
(``orchestrator.runtime.execution.line``: a ``switch`` guard with ``constant`` cases, then a
``chunk`` around one ``model``) in one straight function: no ``Item`` lists, no
``ensure_tokens``, ``Line.answer``, ``ModelCalls.classify``/``batched`` or the results loop,
but every effect of theirs that the router keeps (the deadlines before and after the run, the
call's trace and timeout, the circuit breaker and the stub watch through ``infer``, the rows and
logit-column checks, the head with its shift and verdicts, each node's latency observation and
cost estimate, ``orchestrator_texts_total``, the stage timings, the flush). Any other execute
(several requests or texts, an empty or long text, a guard case that matches, a request refused
before the run) goes to the runtime's own ``Run.run``.

So the ablation's cost (on - off) is what fusing those layers could save at most, the upper
bound of one restructuring, measured rather than estimated. It is a measurement aid and never
ships: :func:`fused` answers as the runtime does for the executes it takes (held by
``tests/unit/test_bench_fused_line.py``), and nothing outside the lab imports it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Coroutine, Dict, List

import numpy as np

RunFn = Callable[[Any, List[Any]], Coroutine[Any, Any, List[Any]]]


def eligible(run: Any, works: List[Any]) -> bool:
    """Whether :func:`fused` may answer ``works`` itself (the module docstring), before any effect."""
    engine, line = run.engine, run.engine.line
    return not (line is None or line.chunk is None or line.guard is None or len(works) != 1 or len(works[0].texts) != 1
                or not works[0].texts[0].strip() or set(engine.token_kinds) != {line.model.head.tokenizer}
                or line.model.head.tokenizer not in engine.tokenizers or run.calls.models)


async def classify_one(run: Any, item: Any, ids: Any) -> Any:
    """The line's model on ``item`` (token ids ``ids``): its probabilities float64 [1, C], as
    ``ModelCalls.classify`` and ``answers_of`` give them, with the call's deadlines and checks.

    Raises:
        DownstreamError: the call failed, or answered another number of rows or logit columns.
    """
    from orchestrator.runtime.errors import DownstreamError
    from orchestrator.runtime.execution.engine import in_concurrent_branch
    from orchestrator.runtime.execution.tokenize import truncate

    model = run.engine.line.model
    one = np.array(truncate(ids, model.max_length), dtype=np.int64).reshape(1, -1)
    mask = np.empty(one.shape, dtype=np.int64)
    mask.fill(1)
    forwarded = {k: v for k, v in item.params.items() if isinstance(v, (str, int, bool))}
    began = time.perf_counter()
    out = await run.calls.infer(model.target, {"input_ids": one, "attention_mask": mask}, forwarded, item.request_id,
                                not in_concurrent_branch(), run.deadlines.call_options([item]))
    run.stage("bls", began)
    run.deadlines.arrived([item])
    for name, value in out.items():
        if np.ndim(value) == 0 or value.shape[0] != 1:
            raise DownstreamError(f"model '{model.target}' answered another number of rows of '{name}' than 1")
    logits = out["logits"].reshape(1, -1)
    if logits.shape[1] != model.head.num_logits:
        raise DownstreamError(f"model '{model.target}' answered {logits.shape[1]} logit columns")
    shift = model.logit_shift
    return model.head.probabilities(logits.astype(np.float32), shift if isinstance(shift, float) else np.asarray(shift, dtype=np.float64))


def measured(costs: Dict[str, float], name: str, seconds: float) -> None:
    """``Engine.measured``, inline: the node's cost estimate moves towards ``seconds``."""
    from orchestrator.runtime.execution.engine import COST_WEIGHT

    old = costs.get(name)
    costs[name] = seconds if old is None else old + COST_WEIGHT * (seconds - old)


def fused(original: RunFn) -> RunFn:
    """A ``Run.run`` replacement: the straight path for the executes described in the module
    docstring, ``original`` (the runtime's ``Run.run``) for every other."""
    from orchestrator.runtime.errors import DownstreamError
    from orchestrator.runtime.execution.engine import route_label
    from orchestrator.runtime.metrics import series
    from orchestrator.runtime.request import Result
    from orchestrator.runtime.routing.nodes.base import Item

    latency = "orchestrator_node_latency_seconds"

    async def run(self: Any, works: List[Any]) -> List[Any]:
        if not eligible(self, works):
            return await original(self, works)
        engine, work = self.engine, works[0]
        line = engine.line
        model, guard, head = line.model, line.guard, line.model.head
        perf, clock = time.perf_counter, engine.clock
        try:
            if self.deadlines.before_run(works):
                return await original(self, works)  # asks again: the same answer, the runtime's way
            thresholds = np.asarray(work.thresholds, dtype=np.float64).reshape(1, -1)
            item = Item(0, 0, work.texts[0], thresholds[0], work.parameters, work.request_id, {}, work.context)
            began = perf()
            ids = engine.tokenizers[head.tokenizer].encode([item.text], truncation=False)[0]
            item.tokens[head.tokenizer] = ids
            self.stage("tokenize", began)
            if ids.shape[0] > line.chunk.window or any(c.when.matches(item, None, head, guard.tokenizer) for c in guard.cases):
                return await original(self, works)
            outer_perf, outer_clock = perf(), clock()
            measured(engine.costs, guard.name, clock() - outer_clock)  # the guard answers nothing
            if self.timing:
                self.observations.setdefault(series(latency, "node", guard.name), []).append(perf() - outer_perf)
            inner_perf, inner_clock = perf(), clock()
            try:
                probs = await classify_one(self, item, ids)
            except DownstreamError:
                for node in line.around:
                    self.count("orchestrator_node_errors_total", node=node.name)
                raise
            finally:
                if self.timing:
                    now = perf()
                    for key, start in zip(line.latency, (inner_perf, inner_perf, outer_perf)):
                        self.observations.setdefault(key, []).append(now - start)
            now = clock()
            for node, start in zip(line.around, (inner_clock, inner_clock, outer_clock)):
                measured(engine.costs, node.name, now - start)
            stopped = self.deadlines.stopped(works, {})
            if stopped:
                return [stopped[0]]
            began = perf()
            verdicts = self.head.verdicts(probs, thresholds)
            self.count("orchestrator_texts_total", route=route_label(model.route))
            results = [Result(probs.astype(np.float32), verdicts, [model.route])]
            self.stage("results", began)
            return results
        finally:
            self.flush()

    return run
