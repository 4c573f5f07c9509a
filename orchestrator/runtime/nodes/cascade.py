"""``cascade``: a first stage for all texts, later stages only for unsure ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from orchestrator.runtime.errors import DownstreamError, PolicyError
from orchestrator.runtime.heads import Head
from orchestrator.runtime.nodes.base import Answer, Answers, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.schema import REQUIRED, Key, Nodes, Number, Struct

#: Appended to the ``ROUTE`` of a text the overload mode kept at an earlier stage.
OVERLOAD_SUFFIX = ":overload"
#: Counter of those texts, label ``node`` (``orchestrator.runtime.metrics``).
OVERLOAD_METRIC = "orchestrator_overload_kept_total"


@dataclass
class Overload:
    """The overload mode of a cascade (docs/policy.md, docs/reliability.md "Overload").

    Attributes:
        target_ms: queue delay (ms, ``orchestrator.runtime.load.QueueDelay``) up to which
            the cascade escalates as without overload (delay ``<= target_ms``).
        cap_ms: queue delay (ms) from which it escalates nothing (delay ``>= cap_ms``);
            between the two the margin shrinks linearly, so the most unsure texts are the
            last ones still escalated.
    """

    target_ms: float = REQUIRED
    cap_ms: float = REQUIRED


def _overload(values: Dict[str, Any], where: str) -> Overload:
    if values["cap_ms"] <= values["target_ms"]:
        raise PolicyError(f"{where}.cap_ms: {values['cap_ms']:g} must be greater than target_ms {values['target_ms']:g}")
    return Overload(**values)


OVERLOAD = Struct(
    "cascade.overload",
    [
        Key("target_ms", Number(low=0.0, high=3.6e6), "the router's queue delay, ms, up to which the cascade escalates as "
            "without overload", required=True),
        Key("cap_ms", Number(above=0.0, high=3.6e6), "the queue delay, ms, from which it escalates no text (greater than "
            "`target_ms`); in between, the margin shrinks linearly to 0", required=True),
    ],
    target=Overload,
    build=_overload,
    doc="Escalate fewer texts as the router's queue delay grows (estimated from its own executes, "
        "`orchestrator.runtime.load`); a text kept at an earlier stage for load has `:overload` appended to "
        "its ROUTE and counts in `orchestrator_overload_kept_total{node}`.",
)


@dataclass
class CascadeNode(Node):
    """Every text goes to the first stage; texts whose answer is unsure go on to the next
    stage, and so on. Unsure (``heads.Head.unsure``): binary, the probability strictly
    within ``margin`` of the threshold; multiclass, the top two probabilities less than
    ``margin`` apart; multilabel, some label strictly within ``margin`` of its threshold.
    With ``overload``, the margin shrinks as the router's queue delay grows
    (:func:`overload_margin`).
    Keys: :data:`KIND` ``.keys`` (docs/policy.md).
    """

    stages: List[Node] = REQUIRED
    margin: float = REQUIRED
    overload: Optional[Overload] = None


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> CascadeNode:
    return CascadeNode(**common, stages=values["stages"], margin=values["margin"], overload=values.get("overload"))


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


def overload_margin(margin: float, overload: Optional[Overload], delay_ms: float) -> float:
    """The margin a cascade uses at queue delay ``delay_ms`` (ms): ``margin`` while
    ``delay_ms <= target_ms`` (or without ``overload``), 0 once ``delay_ms >= cap_ms``,
    linear in between. A smaller margin escalates a subset of the texts a larger one does,
    the most unsure first, for every head (``heads.Head.unsure``: strict ``<`` distance)."""
    if overload is None or delay_ms <= overload.target_ms:
        return margin
    if delay_ms >= overload.cap_ms:
        return 0.0
    return margin * (overload.cap_ms - delay_ms) / (overload.cap_ms - overload.target_ms)


def keep_for_load(engine: Engine, node: CascadeNode, kept: List[Item], answers: Answers) -> None:
    """Mark ``kept`` (texts the full margin would have escalated) as answered by their
    current stage for load: ``ROUTE`` + :data:`OVERLOAD_SUFFIX`, one count each."""
    if not kept:
        return
    for it in kept:
        a = answers[it.idx]
        answers[it.idx] = Answer(a.probabilities, a.route + OVERLOAD_SUFFIX, a.verdict)
    engine.count(OVERLOAD_METRIC, len(kept), node=node.name)


async def _run(engine: Engine, node: CascadeNode, items: List[Item]) -> Answers:
    margin = overload_margin(node.margin, node.overload, engine.queue_delay_ms()) if node.overload else node.margin
    answers = await engine.run_node(node.stages[0], items)
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
    (``Engine.live``, asked once per stage), and with the time left for the stage
    (``Engine.affordable``). The others keep their answer; those whose earlier answer
    came in time get ``:deadline`` (``Engine.keep_for_deadline``)."""
    if not escalate:
        return []
    go, short = engine.affordable(stage, engine.live(escalate))
    engine.keep_for_deadline(node, [it for it in short if not it.context.late], answers)
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
        if len(engine.late(escalate)) < len(escalate):
            raise
        later = {}
    late = engine.late(escalate)
    engine.keep_for_deadline(node, late, answers)
    dropped = {it.idx for it in late}
    return {idx: a for idx, a in later.items() if idx not in dropped}


def _children(node: CascadeNode) -> List[Tuple[str, Node]]:
    return [("first: " if i == 0 else "then: ", n) for i, n in enumerate(node.stages)]


def _describe(node: CascadeNode) -> str:
    text = f"cascade margin={node.margin:g}"
    if node.overload:
        text += f" overload={node.overload.target_ms:g}..{node.overload.cap_ms:g}ms"
    return text


KIND = NodeKind(
    name="cascade",
    node_type=CascadeNode,
    doc="A first stage for all texts, later stages only for texts within `margin` of their threshold.",
    keys=(
        Key("stages", Nodes(2), "nodes in order: the first answers every text, each next one the texts still unsure"),
        Key("margin", Number(0.0, 1.0), "a probability distance: 0 never escalates, 1 escalates every text a stage "
            "does not fix a verdict for (multiclass: the top two probabilities closer than this)"),
        Key("overload", OVERLOAD, "the overload mode: the margin shrinks from `margin` at `target_ms` of queue delay "
            "to 0 at `cap_ms` (absent: escalate at any load)", nullable=True),
    ),
    build=_build,
    run=_run,
    describe=_describe,
    children=_children,
)
