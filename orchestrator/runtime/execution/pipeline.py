"""The tensor pipeline's run over one ``execute``: its requests' tensors through the steps.

Every request is a :class:`Req` (its tensors by name, rows, parameters, deadline); a node
runs over a list of :class:`View` (a request's rows that reached it) of all requests at
once, so one step makes one BLS call per group of views its callee can take together:

- same forwarded parameters and, per input, the same data type and row shape (variable
  dimensions may differ between requests), when the step's ``max_batch_size`` > 0 and the
  router batches: the views' rows are concatenated, packed whole into calls of at most
  ``max_batch_size`` rows (a view larger than that is split), and each answer is split back
  by row count; otherwise one call per view (an ensemble's behaviour: requests are never
  merged);
- the calls of one step run concurrently (``async_exec``); a lone call blocks (``exec``).

A ``switch`` evaluates its cases as row masks (``routing.conditions.evaluate``), hands each
branch the views of the rows that took it (rows in ascending order; a branch's views of all
requests together, so rows of one execute taking one branch reach each callee in one call),
runs the branches concurrently and scatters their tensors back by row index, filling rows
no branch wrote (``fill``) or leaving the tensor absent (``omit``).

Nodes of one list run in dataflow generations (each generation: the nodes whose tensors are
all written by earlier ones, side by side).

Errors are per request (:attr:`Req.error`, never raised): bad input at evaluation
(``InputError``), a failed call (``DownstreamError``/``UnavailableError`` naming the step
and model; a call merging several requests that fails is retried per request, so only the
requests that fail get the error), a deadline passed or a cancelled request
(``RequestStopped``), answers of the wrong row count or mixed shapes/dtypes between
branches (``DownstreamError``).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple, TypeVar

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.errors import (
    DeadlineExceeded,
    DownstreamError,
    OrchestratorError,
    RequestCancelled,
    RequestStopped,
    UnavailableError,
)
from orchestrator.runtime.execution.engine import as_concurrent, gather, in_concurrent_branch
from orchestrator.runtime.metrics import Metrics
from orchestrator.runtime.request import CallOptions, Deadlines, call_trace, never_cancelled
from orchestrator.runtime.routing.conditions import evaluate
from orchestrator.runtime.routing.pipeline import PNode, Step, Switch, node_reads, node_writes
from orchestrator.runtime.routing.pipeline_plan import fill_rows
from orchestrator.runtime.routing.tensors import RouterSpec

#: ``(target, inputs, parameters, request_id, alone, options, outputs, several) -> outputs``: one
#: BLS call (``several``: it holds rows of several requests, retried one by one if it fails).
CallFn = Callable[[str, Dict[str, NDArray[Any]], Dict[str, Any], str, bool, CallOptions, Sequence[str], bool],
                  Awaitable[Dict[str, NDArray[Any]]]]


@dataclass
class Req:
    """One request of an ``execute``.

    Attributes:
        tensors: its pipeline tensors by name (absent ones missing); with a batching
            router each has ``rows`` as its first dimension.
        rows: its batch size (1 for a router with ``max_batch_size: 0``).
        params: its accepted request parameters.
        forward: those BLS can carry (bool, int, str).
        request_id: its id, passed on to every call.
        context: its ``request.RequestContext``-like fields: ``trace``, ``deadline`` (engine
            clock seconds, None: none), ``is_cancelled``.
        batch: the batch size each tensor came with, as Triton's ensembles track it (a
            ``max_batch_size: 0`` router's inputs and the outputs of models without
            batching: absent, 0; a batching step's outputs: the first dimension of its
            first input sent; an ``add_batch_dim`` step's: 1).
        error: set once it failed; it then takes no further part.
        requested: the outputs the client asked for (empty: all).
        started: a downstream call was made for it (before, ``is_cancelled`` is not asked).
        cancelled: ``is_cancelled()`` said True (``request.Deadlines.ask_cancelled``).
        skip: the names of the nodes it does not run: they feed none of its requested
            outputs (``routing.pipeline_plan.unneeded_nodes``).
        describe: it asked for the ``POLICY`` output (``describe_policy``).
    """

    tensors: Dict[str, NDArray[Any]]
    rows: int
    params: Dict[str, Any] = field(default_factory=dict)
    forward: Dict[str, Any] = field(default_factory=dict)
    request_id: str = ""
    trace: Any = None
    deadline: Optional[float] = None
    is_cancelled: Callable[[], bool] = never_cancelled
    batch: Dict[str, int] = field(default_factory=dict)
    error: Optional[OrchestratorError] = None
    requested: Tuple[str, ...] = ()
    started: bool = False
    cancelled: bool = False
    skip: FrozenSet[str] = frozenset()
    describe: bool = False


def _fits(shape: Sequence[int], dims: Sequence[int]) -> bool:
    """Triton's ``CompareDimsWithWildcard``: same rank, each dim equal or -1 in ``dims``."""
    return len(shape) == len(dims) and all(d < 0 or d == s for s, d in zip(shape, dims))


def reshape_dims(array: NDArray[Any], dims: Sequence[int], batching: bool, batch: int) -> NDArray[Any]:
    """``array`` as Triton's ensembles pass it on (core ``ensemble_scheduler.cc``,
    ``ReshapeTensorDims``): only where the receiver's batching (``batching``: a model with
    ``max_batch_size`` > 0) differs from the tensor's (``batch``: the batch size it came
    with, 0 from what does not batch). Into a batching receiver, a tensor whose shape fits
    the per-row ``dims`` gets a leading dimension of 1; into one without batching, a tensor
    of batch size 1 that does not fit ``dims`` loses its leading dimension of 1. Anything
    else goes as it is (the receiver's own shape check then answers)."""
    if batching == (batch != 0):
        return array
    if batching:
        return array[np.newaxis] if _fits(array.shape, dims) else array
    if batch == 1 and array.ndim > 0 and array.shape[0] == 1 and not _fits(array.shape, dims):
        return array.reshape(array.shape[1:])
    return array


@dataclass
class View:
    """Some rows of one request, as a node sees them: ``tensors`` has ``rows`` rows."""

    req: Req
    tensors: Dict[str, NDArray[Any]]
    rows: int


def generations(nodes: Sequence[PNode]) -> List[List[PNode]]:
    """``nodes`` in dataflow generations: each one's nodes read only tensors of router
    inputs, outer nodes or earlier generations (the policy was checked acyclic at load)."""
    writer = {t: n.name for n in nodes for t in node_writes(n)}
    deps = {n.name: {writer[t] for t in node_reads(n) if t in writer and writer[t] != n.name} for n in nodes}
    done: Set[str] = set()
    out: List[List[PNode]] = []
    while len(done) < len(nodes):
        ready = [n for n in nodes if n.name not in done and deps[n.name] <= done]
        assert ready, "bind_pipeline refuses cycles"
        out.append(ready)
        done |= {n.name for n in ready}
    return out


T = TypeVar("T")


async def cut_after(coro: Awaitable[T], seconds: float) -> T:
    """Await ``coro`` (marked concurrent) for at most ``seconds``; past that it is cancelled,
    its ``finally`` and ``async with`` exits run (a circuit breaker records the cancel),
    and ``asyncio.TimeoutError`` is raised. Unlike ``asyncio.wait_for`` (which Python 3.12
    allows only inside a task) it needs only a running loop: ``coro`` runs as a task of its
    own (its context copied)."""
    task = asyncio.get_running_loop().create_task(as_concurrent(coro))
    try:
        done, _ = await asyncio.wait((task,), timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if done:
        return task.result()
    task.cancel()
    await asyncio.wait((task,))
    if not task.cancelled():
        task.exception()  # retrieved: a late failure is the cut's, not the loop's to log
    raise asyncio.TimeoutError()


def _rename(exc: BaseException, step: Step) -> OrchestratorError:
    """A call's failure as the request's error, naming the step and its model."""
    if isinstance(exc, RequestStopped):
        return exc  # a step's time limit or the request's deadline: it names the step
    text = str(exc) if isinstance(exc, OrchestratorError) else f"{type(exc).__name__}: {exc}"
    if f"model '{step.target}'" not in text:
        text = f"model '{step.target}': {text}"
    message = f"step '{step.name}' failed: {text}"
    if isinstance(exc, UnavailableError):
        return UnavailableError(message, exc.cause)
    return DownstreamError(message)


class PipelineRun:
    """The pipeline over one ``execute``'s requests (module docstring).

    Args:
        steps: the pipeline's top-level nodes (bound).
        router: the router's configuration.
        call: one BLS call (:data:`CallFn`; ``bls.downstream.Downstream.call_step``).
        clock: the engine clock (deadlines), seconds.
        metrics: per-step counters and latencies (None: none).
        fills: switch name -> its fill rows (``routing.pipeline_plan.fill_rows``), made once at load.
        plans: node list id -> its generations, made once at load.
        exports: switch name -> the tensors it puts back (``routing.pipeline_plan.switch_exports``).
        models: the on-demand model manager (``bls.ondemand.ModelManager``; None: no step is
            loaded on demand): a step's ``on_demand`` model is loaded before its call.
    """

    def __init__(self, steps: Sequence[PNode], router: RouterSpec, call: CallFn, clock: Callable[[], float],
                 metrics: Optional[Metrics], fills: Dict[str, Dict[str, NDArray[Any]]],
                 plans: Dict[int, List[List[PNode]]], exports: Dict[str, Tuple[str, ...]], models: Any = None):
        self.steps, self.router, self.call, self.clock = steps, router, call, clock
        self.metrics, self.fills, self.plans, self.exports = metrics, fills, plans, exports
        self.models = models
        self.batching = router.max_batch_size > 0

    async def run(self, reqs: Sequence[Req]) -> None:
        """Run every request through the pipeline; their tensors and errors are set in place."""
        await self.run_list(self.steps, [View(r, r.tensors, r.rows) for r in reqs])

    async def run_list(self, nodes: Sequence[PNode], views: Sequence[View]) -> None:
        """A node list over ``views``, generation by generation."""
        for generation in self.plans.get(id(nodes)) or generations(nodes):
            await gather(self.run_node(n, views) for n in generation)

    async def run_node(self, node: PNode, views: Sequence[View]) -> None:
        """One node over the views still running that need it (``orchestrator_node_latency_seconds{node}``)."""
        live = [v for v in views if v.req.error is None and v.rows > 0 and node.name not in v.req.skip]
        if not live:
            return
        began = time.perf_counter()
        if isinstance(node, Step):
            await self.run_step(node, live)
        else:
            await self.run_switch(node, live)
        if self.metrics is not None:
            self.metrics.observe("orchestrator_node_latency_seconds", time.perf_counter() - began, node=node.name)

    # -- steps

    def _stopped(self, req: Req, step: Step) -> bool:
        """True when ``req`` stops before ``step``: cancelled or past its deadline (then its error is set).

        ``is_cancelled()`` (an IPC round trip in the stub, about 0.1 ms) is asked only of a
        request that already had a downstream call, by the text policies' rule
        (``request.Deadlines.ask_cancelled``)."""
        Deadlines.ask_cancelled(req)
        if req.cancelled:
            req.error = RequestCancelled(f"request cancelled before step '{step.name}'")
        elif req.deadline is not None and self.clock() >= req.deadline:
            req.error = DeadlineExceeded(f"request timeout expired before step '{step.name}'")
        return req.error is not None

    def _inputs(self, step: Step, v: View) -> Dict[str, NDArray[Any]]:
        out = {}
        for name, tensor in step.inputs:
            array = v.tensors.get(tensor)
            if array is None:
                continue  # absent: the model gets it as an absent (optional) input, as in an ensemble
            md = step.model_dims
            dims = md.dims(name) if md is not None else None
            if md is not None and dims is not None:
                array = reshape_dims(array, dims, md.max_batch_size > 0, v.req.batch.get(tensor, 0))
            elif step.add_batch_dim and not v.req.batch.get(tensor, 0):
                array = array[np.newaxis]
            out[name] = array
        return out

    def _params(self, step: Step, req: Req) -> Dict[str, Any]:
        if step.parameters == "forward":
            return req.forward
        if step.parameters == "none":
            return {}
        return {k: req.forward[k] for k in step.parameters if k in req.forward}

    async def run_step(self, step: Step, views: Sequence[View], separate: bool = False) -> None:
        """One step over ``views``: grouped, packed into calls, called, split back and stored
        (module docstring); ``separate``: never merge views of different requests (the
        retry of a merged call that failed)."""
        views = [v for v in views if not self._stopped(v.req, step)]
        calls = self._calls(step, views, separate)
        results = await self._settle(step, calls)
        retry: Dict[int, View] = {}
        for (segments, _), result in zip(calls, results):
            if isinstance(result, BaseException) and not isinstance(result, RequestStopped) and len({id(s[0].req) for s in segments}) > 1:
                retry.update((id(s[0]), s[0]) for s in segments)
        pieces: Dict[int, List[Tuple[int, Dict[str, NDArray[Any]]]]] = {}
        fallback: Dict[int, View] = {}
        for (segments, _), result in zip(calls, results):
            if isinstance(result, BaseException):
                if not any(id(s[0]) in retry for s in segments):
                    self._failed(step, segments, result, fallback)
            elif not any(id(s[0]) in retry for s in segments):
                self._split(step, segments, result, pieces)
        if retry:  # each request of a failed merged call alone: only those that fail get the error
            await self.run_step(step, list(retry.values()), separate=True)
        if fallback:  # the next model, for the requests whose call failed
            nxt = replace(step, model=step.fallback[0], version=-1, fallback=step.fallback[1:], max_batch_size=0, on_demand=None)
            await self.run_step(nxt, list(fallback.values()), separate=True)
        for v in views:  # a view retried or passed to the fallback was stored there, whole
            if id(v) in pieces and v.req.error is None and id(v) not in retry and id(v) not in fallback:
                self._store(step, v, pieces[id(v)])

    async def _settle(self, step: Step, calls: List[Tuple[List[Tuple[View, int, int]], Dict[str, NDArray[Any]]]]) -> List[Any]:
        """Every call's outputs or its exception, in order; a lone call awaited in place (no
        task: the path of one request through a chain of steps), several side by side."""
        if len(calls) == 1:
            try:
                return [await self._call(step, calls[0][0], calls[0][1], not in_concurrent_branch())]
            except Exception as exc:  # the caller turns it into the requests' error
                return [exc]
        return await gather((self._call(step, segments, inputs, False) for segments, inputs in calls), settle=True)

    def _failed(self, step: Step, segments: List[Tuple[View, int, int]], exc: BaseException, fallback: Dict[int, View]) -> None:
        """A call failed: its views go to the step's fallback, else its requests fail."""
        if step.fallback:
            fallback.update((id(s[0]), s[0]) for s in segments)
            return
        for req in {id(s[0].req): s[0].req for s in segments}.values():  # several: a cut call, never retried
            req.error = req.error or _rename(exc, step)
            if self.metrics is not None:
                self.metrics.inc("orchestrator_node_errors_total", node=step.name)

    def _calls(self, step: Step, views: Sequence[View], separate: bool
               ) -> List[Tuple[List[Tuple[View, int, int]], Dict[str, NDArray[Any]]]]:
        """The step's calls over ``views``: grouped by what one call can hold (data type and
        row shape per input, forwarded parameters), then packed (:meth:`_pack`)."""
        merge = self.batching and (step.max_batch_size or 0) > 0
        groups: Dict[Any, List[Tuple[View, Dict[str, NDArray[Any]]]]] = {}
        for i, v in enumerate(views):
            inputs, params = self._inputs(step, v), self._params(step, v.req)
            key: Any = (tuple((n, a.dtype.str, a.shape[1:]) for n, a in inputs.items()), tuple(sorted(params.items())))
            groups.setdefault((i, key) if separate or not merge else key, []).append((v, inputs))
        calls: List[Tuple[List[Tuple[View, int, int]], Dict[str, NDArray[Any]]]] = []
        for members in groups.values():
            calls += self._pack(step, members) if merge else [([(v, 0, v.rows)], inputs) for v, inputs in members]
        return calls

    def _pack(self, step: Step, members: List[Tuple[View, Dict[str, NDArray[Any]]]]
              ) -> List[Tuple[List[Tuple[View, int, int]], Dict[str, NDArray[Any]]]]:
        """Calls of at most ``max_batch_size`` rows from the group's views, whole views
        packed in order, a view larger than a call split: ``(segments, inputs)`` with
        segments ``(view, start, stop)`` (its rows ``[start, stop)``)."""
        limit = int(step.max_batch_size or 0)
        out: List[Tuple[List[Tuple[View, int, int]], Dict[str, NDArray[Any]]]] = []
        current: List[Tuple[View, int, int, Dict[str, NDArray[Any]]]] = []
        size = 0

        def close() -> None:
            nonlocal current, size
            if not current:
                return
            v0, a0, b0, m0 = current[0]
            if len(current) == 1:
                inputs = m0 if (a0, b0) == (0, v0.rows) else {n: x[a0:b0] for n, x in m0.items()}
            else:
                inputs = {n: np.concatenate([m[n][a:b] for _, a, b, m in current]) for n in m0}
            out.append(([(v, a, b) for v, a, b, _ in current], inputs))
            current, size = [], 0

        for v, inputs in members:
            start = 0
            while start < v.rows:
                if size == limit:
                    close()
                take = min(v.rows - start, limit - size)
                if take < v.rows - start and size:  # keep a view whole when it fits a fresh call
                    close()
                    take = min(v.rows - start, limit)
                current.append((v, start, start + take, inputs))
                size += take
                start += take
        close()
        return out

    async def _call(self, step: Step, segments: List[Tuple[View, int, int]], inputs: Dict[str, NDArray[Any]],
                    alone: bool) -> Dict[str, NDArray[Any]]:
        reqs = list({id(s[0].req): s[0].req for s in segments}.values())
        for r in reqs:
            r.started = True
        now = self.clock()
        deadlines = [r.deadline for r in reqs if r.deadline is not None]
        limits = ([min(deadlines) - now] if deadlines else []) + ([step.timeout_ms / 1e3] if step.timeout_ms else [])
        timeout_us = max(1, int(min(limits) * 1e6)) if limits else 0
        options = CallOptions(trace=call_trace(reqs), timeout_us=timeout_us)  # type: ignore[arg-type]  # Req has .trace
        if self.metrics is not None:
            self.metrics.inc("orchestrator_step_rows_total", sum(b - a for _, a, b in segments), node=step.name, model=step.target)
        outputs = [name for name, _ in step.outputs]
        if step.timeout_ms:  # async_exec: a blocking exec cannot be cut
            return await self._within(step, reqs, now, lambda: self.call(
                step.target, inputs, self._params(step, reqs[0]), reqs[0].request_id, False, options, outputs, len(reqs) > 1))
        if step.on_demand is not None and self.models is not None:
            await self.models.acquire(step.model)  # UnavailableError (NOT_LOADED) when its load failed
            try:
                return await self.call(step.target, inputs, self._params(step, reqs[0]), reqs[0].request_id, alone, options,
                                       outputs, len(reqs) > 1)
            finally:
                self.models.release(step.model)
        return await self.call(step.target, inputs, self._params(step, reqs[0]), reqs[0].request_id, alone, options, outputs,
                               len(reqs) > 1)

    async def _within(self, step: Step, reqs: Sequence[Req], now: float,
                      call: Callable[[], Awaitable[Dict[str, NDArray[Any]]]]) -> Dict[str, NDArray[Any]]:
        """A call of a step with ``timeout_ms``, cut at the sooner of that and the latest
        deadline of its requests (each of them then past its own), the cut a DeadlineExceeded
        naming the step; its on-demand model held meanwhile."""
        assert step.timeout_ms
        last = max((math.inf if r.deadline is None else r.deadline for r in reqs), default=math.inf) - now
        own = step.timeout_ms / 1e3 <= last
        held = step.on_demand is not None and self.models is not None
        if held:
            await self.models.acquire(step.model)  # UnavailableError (NOT_LOADED) when its load failed
        try:
            return await cut_after(call(), min(step.timeout_ms / 1e3, max(last, 0.0)))
        except asyncio.TimeoutError:
            if own:
                raise DeadlineExceeded(f"step '{step.name}' timed out after {step.timeout_ms:g} ms: model "
                                       f"'{step.target}' did not answer in time") from None
            raise DeadlineExceeded(f"request timeout expired during step '{step.name}' (model '{step.target}')") from None
        finally:
            if held:
                self.models.release(step.model)

    def _split(self, step: Step, segments: List[Tuple[View, int, int]], result: Dict[str, NDArray[Any]],
               pieces: Dict[int, List[Tuple[int, Dict[str, NDArray[Any]]]]]) -> None:
        """A call's answer split back to its views by row count (checked)."""
        rows = sum(b - a for _, a, b in segments)
        offset = 0
        for v, a, b in segments:
            part: Dict[str, NDArray[Any]] = {}
            for name, array in result.items():
                if self.batching and (array.ndim == 0 or array.shape[0] != rows):
                    v.req.error = v.req.error or DownstreamError(
                        f"step '{step.name}': model '{step.target}' answered {name} with shape {list(array.shape)} "
                        f"for {rows} rows")
                    continue
                part[name] = array[offset: offset + b - a] if self.batching and len(segments) > 1 else array
            pieces.setdefault(id(v), []).append((a, part))
            offset += b - a

    def _store(self, step: Step, v: View, parts: List[Tuple[int, Dict[str, NDArray[Any]]]]) -> None:
        parts.sort(key=lambda p: p[0])
        batch = 1 if step.add_batch_dim else 0
        if step.model_dims is not None and step.model_dims.max_batch_size > 0:
            sent = list(self._inputs(step, v).values())  # as the call got them (outputs not stored yet)
            batch = int(sent[0].shape[0]) if sent and sent[0].ndim > 0 else 0
        for name, tensor in step.outputs:
            got = [p[name] for _, p in parts if name in p]
            if len(got) != len(parts):
                continue  # the model did not produce it: absent, as an ensemble omits it
            if len(got) == 1:
                array = got[0]
            elif len({(g.dtype.str, g.shape[1:]) for g in got}) == 1:
                array = np.concatenate(got)
            else:
                v.req.error = DownstreamError(f"step '{step.name}': model '{step.target}' answered {name} in "
                                              f"calls of different shapes or types for one request")
                return
            v.tensors[tensor] = array
            if batch:
                v.req.batch[tensor] = batch
            else:
                v.req.batch.pop(tensor, None)

    # -- switches

    def _masks(self, sw: Switch, v: View) -> Optional[List[NDArray[Any]]]:
        """Each branch's rows of ``v`` (cases in order, then the default's): bool masks."""
        per_row = self.batching and sw.scope == "row"
        taken = np.zeros(v.rows, dtype=bool)
        out = []
        try:
            for case in sw.cases:
                mask = evaluate(case.when, v.tensors, v.rows, per_row, v.req.params) & ~taken
                taken |= mask
                out.append(mask)
        except OrchestratorError as exc:
            v.req.error = v.req.error or exc
            return None
        out.append(~taken if sw.default is not None else np.zeros(v.rows, dtype=bool))
        return out

    def _sub(self, v: View, rows: NDArray[Any], reads: Sequence[str]) -> View:
        if rows.size == v.rows:
            return View(v.req, dict(v.tensors), v.rows)
        return View(v.req, {t: v.tensors[t][rows] for t in reads if t in v.tensors}, int(rows.size))

    async def run_switch(self, sw: Switch, views: Sequence[View]) -> None:
        """A switch: masks, branches side by side, tensors scattered back."""
        branches = sw.branches()
        reads = [node_reads_all(b) for b in branches]
        subs: List[List[Tuple[View, NDArray[Any], View]]] = [[] for _ in branches]
        counts = [0] * (len(branches) + 1)  # per branch, then the rows that took none
        for v in views:
            masks = self._masks(sw, v)
            if masks is None:
                continue
            counts[-1] += v.rows
            for b, mask in enumerate(masks):
                rows = np.flatnonzero(mask)
                counts[b] += int(rows.size)
                counts[-1] -= int(rows.size)
                if rows.size:
                    subs[b].append((v, rows, self._sub(v, rows, reads[b])))
        if self.metrics is not None:
            labels = [f"case{i}" for i in range(len(sw.cases))] + ["default", "none"]
            for label, n in zip(labels, counts):
                if n:
                    self.metrics.inc("orchestrator_branch_rows_total", n, node=sw.name, branch=label)
        await gather(self.run_list(branches[b], [s for _, _, s in subs[b]]) for b in range(len(branches)) if subs[b])
        writes = self.exports[sw.name]
        fill = self.fills.get(sw.name, {})
        for v in views:
            if v.req.error is None:
                mine = [(rows, sub) for b in subs for (w, rows, sub) in b if w is v]
                self._scatter(sw, v, mine, writes, fill)

    def _scatter(self, sw: Switch, v: View, branches: List[Tuple[NDArray[Any], View]], writes: Sequence[str],
                 fill: Dict[str, NDArray[Any]]) -> None:
        """The branches' tensors written back into ``v`` by row index (module docstring)."""
        for t in writes:
            pieces = [(rows, sub.tensors[t]) for rows, sub in branches if t in sub.tensors]
            if not pieces:
                if t in fill:
                    v.tensors[t] = self._fill(fill[t], v.rows)
                continue  # omitted (or absent: a branch's model did not produce it)
            if len(pieces) == 1 and pieces[0][0].size == v.rows:
                v.tensors[t] = pieces[0][1]
                continue
            first = pieces[0][1]
            if len({(p.dtype.str, p.shape[1:]) for _, p in pieces}) > 1:
                kinds = sorted({f"{p.dtype}{list(p.shape[1:])}" for _, p in pieces})
                v.req.error = DownstreamError(f"switch '{sw.name}': its branches wrote '{t}' as {' and '.join(kinds)} "
                                              "for rows of one request; they must agree")
                return
            out = np.empty((v.rows,) + first.shape[1:], dtype=first.dtype)
            covered = np.zeros(v.rows, dtype=bool)
            for rows, p in pieces:
                out[rows] = p
                covered[rows] = True
            if not covered.all():
                if t not in fill or fill[t].shape != first.shape[1:]:
                    shape = "" if t not in fill else f" (the fill's row shape {list(fill[t].shape)} is not the branches' {list(first.shape[1:])})"
                    v.req.error = DownstreamError(f"switch '{sw.name}': '{t}' is not written for rows "
                                                  f"{np.flatnonzero(~covered).tolist()}{shape}")
                    return
                out[~covered] = fill[t].astype(first.dtype)
            v.tensors[t] = out

    def _fill(self, row: NDArray[Any], rows: int) -> NDArray[Any]:
        if not self.batching:
            return row.copy()
        return np.broadcast_to(row, (rows,) + row.shape).copy()


def node_reads_all(nodes: Sequence[PNode]) -> List[str]:
    """Every tensor a branch reads from outside itself."""
    inner = {t for n in nodes for t in node_writes(n)}
    return list(dict.fromkeys(t for n in nodes for t in node_reads(n) if t not in inner))


def plan_lists(steps: Sequence[PNode], router: RouterSpec) -> Tuple[Dict[int, List[List[PNode]]], Dict[str, Dict[str, NDArray[Any]]]]:
    """Per node list (by id) its generations, per switch its fill rows: made once at load."""
    plans: Dict[int, List[List[PNode]]] = {}
    fills: Dict[str, Dict[str, NDArray[Any]]] = {}

    def visit(nodes: Sequence[PNode]) -> None:
        plans[id(nodes)] = generations(nodes)
        for n in nodes:
            if isinstance(n, Switch):
                fills[n.name] = fill_rows(n, router)
                for b in n.branches():
                    visit(b)
    visit(steps)
    return plans, fills
