"""``cascade``: a first stage for all texts, later stages only for unsure ones."""

from __future__ import annotations

import bisect
import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import NDArray

from orchestrator.runtime.errors import DownstreamError
from orchestrator.runtime.routing.heads import MULTICLASS, Head
from orchestrator.runtime.routing.nodes.base import Answer, Answers, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.routing.schema import REQUIRED, Int, Key, Nodes, Number, Struct

#: Appended to the ``ROUTE`` of a text the escalation budget kept at an earlier stage.
BUDGET_SUFFIX = ":budget"
#: Counter of those texts, label ``node``.
BUDGET_METRIC = "orchestrator_budget_kept_total"
#: Gauges, label ``node``: the margin the budget allows now, and the share of the window's
#: texts escalated.
MARGIN_GAUGE = "orchestrator_cascade_margin"
RATE_GAUGE = "orchestrator_escalation_rate"


@dataclass(frozen=True)
class Budget:
    """The escalation budget of a cascade (docs/reference/policy.md ``cascade.budget``).

    Attributes:
        max_escalation_rate: the most texts, as a share of those the first stage answers,
            that go on to the second stage, over the window; in [0, 1].
        window: texts in the sliding window (the latest ones the first stage answered).
        window_s: seconds; texts older than this leave the window too (None: only
            ``window`` counts).
    """

    max_escalation_rate: float = REQUIRED
    window: int = 1000
    window_s: Optional[float] = None


def distances(head: Head, probabilities: NDArray[Any], thresholds: NDArray[Any]) -> NDArray[Any]:
    """How far each answer is from being unsure: float64 [N] for probabilities [N, C] and
    thresholds [N, 1] or [N, C], such that ``heads.Head.unsure(p, t, m)`` is exactly
    ``distance < m``. Binary and multilabel: the smallest ``|p_k - t_k|``; multiclass: the
    gap between the top two probabilities."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1, head.columns)
    if head.kind == MULTICLASS:
        top2 = np.sort(p, axis=1)[:, -2:]
        gap: NDArray[Any] = top2[:, 1] - top2[:, 0]
        return gap
    near: NDArray[Any] = np.abs(p - head.thresholds(thresholds, p.shape[0])).min(axis=1)
    return near


class EscalationBudget:
    """Holds a cascade's escalation rate within ``Budget.max_escalation_rate`` (the rule).

    The controller keeps, for the first stage's latest ``window`` texts (texts older than
    ``window_s`` leave too), each text's distance (:func:`distances`) and whether it was
    escalated. For each batch it adds the batch, then with ``n`` texts in the window and
    ``k = floor(rate * n)`` escalations allowed there, the batch's margin is the smallest of:

    - ``cap``: the cascade's own margin (lowered by ``overload``);
    - the quantile: ``d_(k+1)``, the (k+1)-th smallest distance in the window (at most
      ``k`` lie strictly below it; no limit when ``k >= n``): the margin at which the
      window's traffic would escalate the budget's share, which follows a shift in the
      traffic within a window and spreads the escalations over it, the most unsure first;
    - the allowance: with ``used`` escalations already in the window, at most
      ``k - used`` of the batch's texts, its most unsure ones, so the escalated share of
      the window never exceeds the budget (a hard bound, from the first text on: a fresh
      router escalates none of its first ``1 / rate`` texts).

    A smaller margin escalates a subset of the texts a larger one does (strict ``<``), so
    the texts kept are always the surest of those ``cap`` would escalate. Deterministic for
    given texts and clock; no gain to tune (docs/guides/reliability.md "Escalation budget").

    Args:
        budget: the policy's settings.

    One per cascade node and router instance, held by the engine (``Engine.state``), so
    every run shares it; thread-safe (the shadow worker's runs use it from their thread).
    """

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._seen: Deque[List[Any]] = deque()  # [time s, distance, escalated], oldest first
        self._sorted: List[float] = []  # the window's distances, sorted
        self._used = 0  # escalated texts in the window

    def _drop_oldest(self) -> None:
        _, d, escalated = self._seen.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, d)]
        self._used -= int(escalated)

    def plan(self, batch: Sequence[float], cap: float, now: float) -> Tuple[float, float]:
        """Add a batch's distances (seen at ``now``, seconds) to the window and decide it.

        Args:
            batch: the first stage's distances of the batch's texts (``inf``: a fixed verdict).
            cap: the margin the cascade would use without the budget (its ``margin``, or
                less under ``overload``).
            now: the engine clock, seconds.

        Returns:
            ``(budget_margin, measured_rate)``: the largest margin the budget allows this
            batch (``inf``: no limit), and the share of the window's texts escalated, this
            batch's counted at ``min(cap, budget_margin)``.
        """
        fresh = [float(d) if d == d else float("inf") for d in batch]  # NaN: never unsure (and keeps the sort)
        with self._lock:
            for d in fresh:
                self._seen.append([now, d, False])
                bisect.insort(self._sorted, d)
            # older texts leave; a batch larger than the window stays whole (it is decided at once)
            while len(self._seen) > len(fresh) and (len(self._seen) > self.budget.window or (
                    self.budget.window_s is not None and now - self._seen[0][0] > self.budget.window_s)):
                self._drop_oldest()
            n = len(self._seen)
            k = int(np.floor(self.budget.max_escalation_rate * n + 1e-9))
            allowed = self._sorted[k] if k < n else float("inf")
            eligible = sorted(d for d in fresh if d < min(cap, allowed))
            room = max(0, k - self._used)
            if len(eligible) > room:
                allowed = eligible[room]
            m = min(cap, allowed)
            for i in range(n - len(fresh), n):
                if self._seen[i][1] < m:
                    self._seen[i][2] = True
                    self._used += 1
            return allowed, self._used / n if n else 0.0


def _budget(values: Dict[str, Any], where: str) -> Budget:
    return Budget(**values)


BUDGET = Struct(
    "cascade.budget",
    [
        Key("max_escalation_rate", Number(0.0, 1.0), "the most texts, as a share of those the first stage answered "
            "in the window, sent on to the second stage", required=True),
        Key("window", Int(1, 1 << 20), "texts in the sliding window: the latest ones the first stage answered"),
        Key("window_s", Number(above=0.0, high=86400.0), "seconds: older texts leave the window too (absent: only "
            "`window` counts)"),
    ],
    target=Budget,
    build=_budget,
    doc="Hold the escalation rate within a budget. Per batch the margin is at most the smaller of: the distance "
        "from the threshold (multiclass: the top-two gap) below which `max_escalation_rate` of the window's texts "
        "lie (a quantile of the first stage's recent distances), and the distance that leaves the batch only the "
        "escalations the window has left (so the escalated share of the window never exceeds the budget; a fresh "
        "router escalates none of its first `1 / max_escalation_rate` texts). A text the margin would escalate but "
        "the budget keeps has `:budget` appended to its ROUTE and counts in `orchestrator_budget_kept_total{node}`; "
        "the gauges `orchestrator_cascade_margin{node}` and `orchestrator_escalation_rate{node}` show the margin "
        "used and the window's escalated share.",
)


@dataclass(frozen=True)
class CascadeNode(Node):
    """Every text goes to the first stage; texts whose answer is unsure go on to the next
    stage, and so on. Unsure (``heads.Head.unsure``): binary, the probability strictly
    within ``margin`` of the threshold; multiclass, the top two probabilities less than
    ``margin`` apart; multilabel, some label strictly within ``margin`` of its threshold.
    With ``budget``, the margin is at most what keeps the escalation rate within it
    (:class:`EscalationBudget`, the node's state in the engine: ``Engine.state``).
    Keys: :data:`KIND` ``.keys`` (docs/reference/policy.md).
    """

    stages: Tuple[Node, ...] = REQUIRED
    margin: float = REQUIRED
    budget: Optional[Budget] = None


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> CascadeNode:
    return CascadeNode(**common, stages=tuple(values["stages"]), margin=values["margin"], budget=values.get("budget"))


def unsure(head: Head, node: CascadeNode, items: List[Item], answers: Answers,
           margin: Optional[float] = None) -> List[Item]:
    """The items whose answer has no fixed verdict and is unsure by ``margin`` (default
    ``node.margin``)."""
    open_ = [it for it in items if answers[it.idx].verdict is None]
    if not open_:
        return []
    probs = np.stack([answers[it.idx].probabilities for it in open_])
    thresholds = np.stack([np.broadcast_to(it.threshold, probs.shape[1:]) for it in open_])
    m = node.margin if margin is None else margin
    return [it for it, u in zip(open_, head.unsure(probs, thresholds, m)) if u]


def keep_for_load(engine: Engine, node: CascadeNode, kept: List[Item], answers: Answers) -> None:
    """Mark ``kept`` (texts the full margin would have escalated) as answered by their
    current stage for the escalation budget: ``ROUTE`` + :data:`BUDGET_SUFFIX`, one count
    each in :data:`BUDGET_METRIC`."""
    if not kept:
        return
    for it in kept:
        a = answers[it.idx]
        answers[it.idx] = Answer(a.probabilities, a.route + BUDGET_SUFFIX, a.verdict)
    engine.count(BUDGET_METRIC, len(kept), node=node.name)


def _distances(engine: Engine, items: List[Item], answers: Answers) -> NDArray[Any]:
    """:func:`distances` of ``items``' answers; ``inf`` for a fixed verdict (never unsure)."""
    out = np.full(len(items), np.inf)
    open_ = [i for i, it in enumerate(items) if answers[it.idx].verdict is None]
    if open_:
        probs = np.stack([answers[items[i].idx].probabilities for i in open_])
        thresholds = np.stack([np.broadcast_to(items[i].threshold, probs.shape[1:]) for i in open_])
        out[open_] = distances(engine.head, probs, thresholds)
    return out


def _margins(engine: Engine, node: CascadeNode, first: List[Item], answers: Answers) -> Tuple[float, float]:
    """``(cap, budget_margin)``: the margin without the budget (``margin``) and the budget's
    (``inf`` without one); a batch escalates at the smaller. Sets the node's gauges when it
    has a budget."""
    cap, budget = node.margin, node.budget
    if budget is None:
        return cap, float("inf")
    controller = engine.state(node, lambda: EscalationBudget(budget))
    allowed, rate = controller.plan(_distances(engine, first, answers).tolist(), cap, engine.deadlines.now())
    engine.gauge(MARGIN_GAUGE, min(cap, allowed), node=node.name)
    engine.gauge(RATE_GAUGE, rate, node=node.name)
    return cap, allowed


async def _run(engine: Engine, node: CascadeNode, items: List[Item]) -> Answers:
    answers = await engine.run_node(node.stages[0], items)
    cap, allowed = _margins(engine, node, [it for it in items if it.idx in answers], answers)
    margin = min(cap, allowed)
    for stage in node.stages[1:]:
        candidates = unsure(engine.head, node, [it for it in items if it.idx in answers], answers)
        escalate = candidates if margin == node.margin else unsure(engine.head, node, candidates, answers, margin)
        if len(escalate) < len(candidates):
            chosen = {it.idx for it in escalate}
            keep_for_load(engine, node, [it for it in candidates if it.idx not in chosen], answers)
        escalate = still_wanted(engine, node, stage, escalate, answers)
        if not escalate:
            break
        engine.count("orchestrator_escalations_total", len(escalate), node=node.name)
        answers.update(await in_time(engine, node, stage, escalate, answers))
    return answers


def still_wanted(engine: Engine, node: CascadeNode, stage: Node, escalate: List[Item], answers: Answers) -> List[Item]:
    """The unsure items worth sending to ``stage``: not of a cancelled request
    (``Deadlines.live``, asked once per stage), and with the time left for the stage
    (``Deadlines.affordable``). The others keep their answer; those whose earlier answer
    came in time get ``:deadline`` (``Deadlines.keep_for_deadline``)."""
    if not escalate:
        return []
    go, short = engine.deadlines.affordable(stage, engine.deadlines.live(escalate))
    engine.deadlines.keep_for_deadline(node, engine.deadlines.in_time(short), answers)
    return go


async def in_time(engine: Engine, node: CascadeNode, stage: Node, escalate: List[Item], answers: Answers) -> Answers:
    """``stage``'s answers for ``escalate`` that came before their request's deadline.
    A late answer is dropped: the earlier stage's answer stays, with ``:deadline`` (the
    stage only started with time left, so that one was in time). A stage failure when
    every item's deadline has passed (for example Triton's queue timeout, "Request
    timeout expired") is treated as late answers; otherwise it is raised.

    Raises:
        DownstreamError: the stage failed while some item still had time.
    """
    try:
        later = await engine.run_node(stage, escalate)
    except DownstreamError:
        if len(engine.deadlines.late(escalate)) < len(escalate):
            raise
        later = {}
    late = engine.deadlines.late(escalate)
    engine.deadlines.keep_for_deadline(node, late, answers)
    dropped = {it.idx for it in late}
    return {idx: a for idx, a in later.items() if idx not in dropped}


def _children(node: CascadeNode) -> List[Tuple[str, Node]]:
    return [("first: " if i == 0 else "then: ", n) for i, n in enumerate(node.stages)]


def _describe(node: CascadeNode) -> str:
    text = f"cascade margin={node.margin:g}"
    if node.budget:
        b = node.budget
        text += f" budget={b.max_escalation_rate:g} of the last {b.window} texts" + (f" within {b.window_s:g}s" if b.window_s else "")
    return text


KIND = NodeKind(
    name="cascade",
    node_type=CascadeNode,
    doc="A first stage for all texts, later stages only for texts within `margin` of their threshold.",
    keys=(
        Key("stages", Nodes(2), "nodes in order: the first answers every text, each next one the texts still unsure"),
        Key("margin", Number(0.0, 1.0), "a probability distance: 0 never escalates, 1 escalates every text a stage "
            "does not fix a verdict for (multiclass: the top two probabilities closer than this)"),
        Key("budget", BUDGET, "the escalation budget: the margin is at most what keeps the share of texts escalated "
            "within `max_escalation_rate` over the latest texts (absent: `margin` holds at any rate)", nullable=True),
    ),
    removed=(("overload", "the cascade's overload mode was removed: use `budget` (an escalation budget over the "
              "latest texts) and the policy's `admission` (refuse what would wait too long) instead"),),
    build=_build,
    run=_run,
    describe=_describe,
    children=_children,
    with_children=lambda node, children: replace(node, stages=tuple(children)),
)
