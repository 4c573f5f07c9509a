"""Cancellation and deadlines of the requests one engine runs (docs/guides/reliability.md):
the request context, the deadline arithmetic and what each downstream call carries.

:class:`RequestContext` is what a request brings besides its inputs (trace, deadline,
``is_cancelled``); :class:`CallOptions` what one BLS call carries (trace, timeout), the
trace picked by :func:`call_trace`. :class:`Deadlines` holds the engine clock and each
node's run-time estimate, and is the only code that reads or writes a request's context
flags (``started``, ``cancelled``, ``late``, ``early``). Nodes use it through
``nodes.base.DeadlineView`` (``engine.deadlines``): before a further stage or round they
ask :meth:`Deadlines.live` (once per stage) and :meth:`Deadlines.affordable`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from orchestrator.runtime.errors import DeadlineExceeded, InputError, RequestCancelled, RequestStopped
from orchestrator.runtime.metrics import Metrics

if TYPE_CHECKING:  # nodes.base's Item carries a RequestContext: the types only, no import circle
    from orchestrator.runtime.routing.nodes.base import Answers, Item, Node
    from orchestrator.runtime.serving.request import Work

#: Added to the ``ROUTE`` of a text answered by an earlier stage because of its request's
#: deadline (``classifier_fast:deadline``; docs/guides/reliability.md "Deadlines").
DEADLINE_SUFFIX = ":deadline"

#: Weight of the newest run in a node's cost estimate (an exponentially weighted mean of
#: its run times, :meth:`Deadlines.estimate`): about the last 5 runs count. A choice, not a
#: measured optimum: it follows a load change within a few requests.
COST_WEIGHT = 0.3


def _never() -> bool:
    return False


@dataclass
class RequestContext:
    """What a request brings besides its inputs, for every downstream call made for it.

    Attributes:
        trace: the request's ``pb_utils.InferenceTrace`` (``request.trace()``), passed on as
            ``InferenceRequest(trace=...)`` so a Triton trace follows the request downstream;
            None: none (warmup, tests).
        deadline: the engine clock's seconds (``Engine.clock``, ``time.monotonic`` in the
            router) at which the client's timeout (``request.timeout()``, microseconds;
            0: none) ends, counted from the start of the router's ``execute`` (the stub
            cannot see when Triton received the request, so the time it waited in the
            router's queue is not deducted); None: no timeout. docs/guides/reliability.md
            "Deadlines".
        is_cancelled: ``request.is_cancelled()``: True once the client cancelled the request
            (an IPC round trip to the Triton process in the real stub; the engine asks it
            only through ``Deadlines.live``).
        started: a downstream call was made for the request (set by the engine; before it,
            the request has just arrived and ``is_cancelled`` is not asked).
        cancelled: ``is_cancelled()`` said True (kept: the flag never goes back to False).
        late: a downstream answer for the request arrived at or after its deadline.
        early: a later stage was skipped or its late answer dropped for the deadline, and
            the request's answers come from an earlier stage that ended in time (a late
            request that is not ``early`` gets ``DeadlineExceeded``).
    """

    trace: Any = None
    deadline: Optional[float] = None
    is_cancelled: Callable[[], bool] = _never
    started: bool = False
    cancelled: bool = False
    late: bool = False
    early: bool = False


def call_trace(contexts: Sequence[RequestContext]) -> Any:
    """The one trace a downstream call carries for rows of several requests.

    A BLS request carries one trace (python_backend r24.10 ``InferenceRequest(trace=...)``;
    the stub's ``RequestExecutor`` spawns the call's trace as a child of it with
    ``TRITONSERVER_InferenceTraceSpawnChildTrace``), so a call that batches rows of several
    requests is traced under ONE of them: the first, in row order, whose trace has a context
    (``get_context()`` is not None: in ``opentelemetry`` mode, a sampled request), else the
    first request's trace. The other requests' traces get no span for that call: they show
    the router's own spans only, never a span under the wrong parent. In ``triton`` mode
    ``get_context()`` is None for every request (sampled or not), so with ``rate`` above 1
    a batched call is traced only when the first request of its rows was sampled
    (docs/reference/metrics.md, "Tracing").

    Args:
        contexts: the contexts of the call's rows, in row order (repeats allowed).

    Returns:
        a ``pb_utils.InferenceTrace``, or None when no row has one.
    """
    traces = [c.trace for c in {id(c): c for c in contexts}.values() if c.trace is not None]
    for trace in traces:
        get_context = getattr(trace, "get_context", None)
        if callable(get_context) and get_context() is not None:
            return trace
    return traces[0] if traces else None


@dataclass(frozen=True)
class CallOptions:
    """What one downstream (BLS) call carries besides its inputs.

    Attributes:
        trace: the ``pb_utils.InferenceTrace`` to pass as ``InferenceRequest(trace=...)``;
            None: none.
        timeout_us: ``InferenceRequest(timeout=...)``, microseconds; 0: no timeout.
    """

    trace: Any = None
    timeout_us: int = 0


class Deadlines:
    """The engine clock, node cost estimates and every request-context flag.

    Args:
        clock: seconds of a monotonic clock (``time.monotonic`` in the router; tests pass a
            fake one); ``RequestContext.deadline`` is on it.
        metrics: where the deadline and cancellation counters go (None: nowhere).
        costs: node name -> estimated run time, seconds (the engine's, shared by its runs;
            default a new dict).
    """

    def __init__(self, clock: Callable[[], float], metrics: Optional[Metrics] = None,
                 costs: Optional[Dict[str, float]] = None) -> None:
        self.clock = clock
        self.metrics = metrics
        self.costs: Dict[str, float] = {} if costs is None else costs

    def _count(self, family: str, value: float = 1.0, **labels: str) -> None:
        if self.metrics:
            self.metrics.inc(family, value, **labels)

    # -- what nodes use (nodes.base.DeadlineView)

    def now(self) -> float:
        """The engine clock (seconds; deadlines are on it)."""
        return self.clock()

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

    def in_time(self, items: Sequence[Item]) -> List[Item]:
        """The items whose request got no downstream answer after its deadline, in order."""
        return [it for it in items if not it.context.late]

    def live(self, items: Sequence[Item]) -> List[Item]:
        """The items whose request is not cancelled, in order.

        ``is_cancelled()`` is asked at most once per request per call, and only of requests
        that already had a downstream call (one that just arrived is not asked: the stub's
        ``is_cancelled`` is an IPC round trip); an error asking it counts as not cancelled.
        A request found cancelled stays so (``RequestContext.cancelled``) and
        ``Engine.run`` answers it with ``RequestCancelled``.
        """
        asked = set()
        out = []
        for it in items:
            ctx = it.context
            if id(ctx) not in asked:
                asked.add(id(ctx))
                self.ask_cancelled(ctx)
            if not ctx.cancelled:
                out.append(it)
        return out

    def keep_for_deadline(self, node: Node, items: Sequence[Item], answers: Answers) -> None:
        """The answers of ``items`` stay those of an earlier stage, which ended before the
        deadline: ``ROUTE`` gets ``:deadline``, their requests count as answered in time
        (``RequestContext.early``) and ``orchestrator_deadline_texts_total{node}`` counts
        them."""
        for it in items:
            a = answers[it.idx]
            answers[it.idx] = dataclasses.replace(a, route=a.route + DEADLINE_SUFFIX)
            it.context.early = True
        self._count("orchestrator_deadline_texts_total", len(items), node=node.name)

    # -- what the engine uses

    def remaining(self, item: Item) -> Optional[float]:
        """Seconds left before ``item``'s request deadline (<= 0: passed); None: no deadline."""
        deadline = item.context.deadline
        return None if deadline is None else deadline - self.clock()

    def estimate(self, node: Node) -> float:
        """Estimated run time of ``node``, seconds: the exponentially weighted mean
        (:data:`COST_WEIGHT`) of its successful runs in this process (:meth:`measured`);
        0.0 before its first."""
        return self.costs.get(node.name, 0.0)

    def measured(self, node: Node, seconds: float) -> None:
        """A successful run of ``node`` took ``seconds`` on the engine clock."""
        old = self.costs.get(node.name)
        self.costs[node.name] = seconds if old is None else old + COST_WEIGHT * (seconds - old)

    @staticmethod
    def ask_cancelled(ctx: RequestContext) -> None:
        """Ask ``is_cancelled()`` of a request that had a downstream call and is not known
        to be cancelled (an error asking it counts as not cancelled)."""
        if ctx.cancelled or not ctx.started:
            return
        try:
            ctx.cancelled = bool(ctx.is_cancelled())
        except Exception:  # the stub could not ask the server: go on
            ctx.cancelled = False

    def call_options(self, rows: Sequence[Item]) -> CallOptions:
        """The trace and timeout of one downstream call for ``rows``, which marks their
        requests as started (``RequestContext.started``): the trace of their request, or
        for rows of several requests the one :func:`call_trace` picks; the timeout, the
        largest budget left of their requests (at least 1 us), so the call is never cut
        while one of its rows can still use its answer (the rows whose deadline passed
        do not use it: :meth:`arrived`, the cascade); no timeout when a row's request
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

    def arrived(self, items: Sequence[Item]) -> None:
        """Downstream answers for ``items`` arrived now: a request whose deadline has
        passed is marked late (``RequestContext.late``; ``Engine.run`` refuses it unless a
        stage kept an earlier answer for it)."""
        now = self.clock()
        for it in items:
            if it.context.deadline is not None and now >= it.context.deadline:
                it.context.late = True

    def before_run(self, works: Sequence[Work]) -> Dict[int, RequestStopped]:
        """The requests of ``works`` not to run: cancelled (a request run before, as in the
        router's retries, is asked: this run is its next stage) or past their deadline.
        The others start afresh (``late``, ``early`` cleared)."""
        now = self.clock()
        out: Dict[int, RequestStopped] = {}
        for k, w in enumerate(works):
            w.context.late = w.context.early = False
            self.ask_cancelled(w.context)
            if w.context.cancelled:
                out[k] = RequestCancelled("the request was cancelled")
            elif w.context.deadline is not None and now >= w.context.deadline:
                out[k] = DeadlineExceeded("deadline exceeded: no stage answered within the request's timeout")
        return out

    def stopped(self, works: Sequence[Work], refused: Dict[int, Union[InputError, RequestStopped]]) -> Dict[int, RequestStopped]:
        """The requests of ``works`` cancelled or late (refused before the run as such, or
        found so during it), each counted once (``orchestrator_cancelled_requests_total``,
        ``orchestrator_expired_requests_total``)."""
        out: Dict[int, RequestStopped] = {}
        for k, w in enumerate(works):
            ctx = w.context
            if isinstance(refused.get(k), RequestCancelled) or (k not in refused and ctx.cancelled):
                out[k] = RequestCancelled("the request was cancelled; no further stage ran for it")
                self._count("orchestrator_cancelled_requests_total")
            elif isinstance(refused.get(k), DeadlineExceeded) or (k not in refused and ctx.late and not ctx.early):
                out[k] = DeadlineExceeded("deadline exceeded: no stage answered within the request's timeout")
                self._count("orchestrator_expired_requests_total")
        return out
