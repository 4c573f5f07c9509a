"""``cascade``: a first stage for all texts, later stages only for unsure ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np

from orchestrator.runtime.errors import DownstreamError
from orchestrator.runtime.heads import Head
from orchestrator.runtime.nodes.base import Answers, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.schema import REQUIRED, Key, Nodes, Number


@dataclass
class CascadeNode(Node):
    """Every text goes to the first stage; texts whose answer is unsure go on to the next
    stage, and so on. Unsure (``heads.Head.unsure``): binary, the probability strictly
    within ``margin`` of the threshold; multiclass, the top two probabilities less than
    ``margin`` apart; multilabel, some label strictly within ``margin`` of its threshold.
    Keys: :data:`KIND` ``.keys`` (docs/policy.md).
    """

    stages: List[Node] = REQUIRED
    margin: float = REQUIRED


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> CascadeNode:
    return CascadeNode(**common, stages=values["stages"], margin=values["margin"])


def unsure(head: Head, node: CascadeNode, items: List[Item], answers: Answers) -> List[Item]:
    """The items whose answer has no fixed verdict and is unsure by ``node.margin``."""
    open_ = [it for it in items if answers[it.idx].verdict is None]
    if not open_:
        return []
    probs = np.stack([answers[it.idx].probabilities for it in open_])
    thresholds = np.stack([np.broadcast_to(it.threshold, probs.shape[1:]) for it in open_])
    return [it for it, u in zip(open_, head.unsure(probs, thresholds, node.margin)) if u]


async def _run(engine: Engine, node: CascadeNode, items: List[Item]) -> Answers:
    answers = await engine.run_node(node.stages[0], items)
    for stage in node.stages[1:]:
        escalate = unsure(engine.head, node, [it for it in items if it.idx in answers], answers)
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


KIND = NodeKind(
    name="cascade",
    node_type=CascadeNode,
    doc="A first stage for all texts, later stages only for texts within `margin` of their threshold.",
    keys=(
        Key("stages", Nodes(2), "nodes in order: the first answers every text, each next one the texts still unsure"),
        Key("margin", Number(0.0, 1.0), "a probability distance: 0 never escalates, 1 escalates every text a stage "
            "does not fix a verdict for (multiclass: the top two probabilities closer than this)"),
    ),
    build=_build,
    run=_run,
    describe=lambda node: f"cascade margin={node.margin:g}",
    children=_children,
)
