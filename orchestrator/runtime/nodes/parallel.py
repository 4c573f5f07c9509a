"""``parallel``: fan out to several nodes concurrently and combine their answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np

from orchestrator.runtime.concurrency import gather
from orchestrator.runtime.nodes.base import Answer, Answers, Engine, Item, Node, NodeKind, ParseContext
from orchestrator.runtime.schema import REQUIRED, Choice, Key, Nodes

COMBINES = ("mean", "max", "vote")


@dataclass
class ParallelNode(Node):
    """All ``nodes`` run concurrently on every text; ``combine`` joins their answers column
    by column (``heads.Head.combine``): ``mean`` or ``max`` of the probabilities, or
    ``vote``: per column the share of nodes whose verdict is true there (the head's rule:
    binary, probability >= threshold; multiclass, the node's top label; multilabel, per
    label), a verdict of true where more than half of the nodes vote for it (a tie is false).
    Keys: :data:`KIND` ``.keys`` (docs/policy.md).
    """

    nodes: List[Node] = REQUIRED
    combine: str = "mean"


def _build(values: Dict[str, Any], ctx: ParseContext, common: Dict[str, Any]) -> ParallelNode:
    return ParallelNode(**common, nodes=values["nodes"], combine=values["combine"])


async def _run(engine: Engine, node: ParallelNode, items: List[Item]) -> Answers:
    results = await gather(engine.run_node(n, items) for n in node.nodes)
    answers: Answers = {}
    for it in items:
        parts = [r[it.idx] for r in results]
        route = f"parallel:{node.combine}(" + ",".join(a.route for a in parts) + ")"
        if node.combine == "vote":
            share = np.mean([engine.final_verdicts(a, it) for a in parts], axis=0)
            answers[it.idx] = Answer(share, route, share > 0.5)
        else:
            answers[it.idx] = Answer(engine.head.combine([a.probabilities for a in parts], node.combine), route)
    return answers


def _children(node: ParallelNode) -> List[Tuple[str, Node]]:
    return [("", n) for n in node.nodes]


KIND = NodeKind(
    name="parallel",
    node_type=ParallelNode,
    doc="Fan out to every node concurrently and combine their answers column by column.",
    keys=(
        Key("nodes", Nodes(2), "the nodes; each answers every text"),
        Key("combine", Choice(COMBINES), "`mean` or `max` of the probabilities, or `vote`: the share of nodes whose "
            "verdict is true, true where more than half vote for it"),
    ),
    build=_build,
    run=_run,
    describe=lambda node: f"parallel combine={node.combine}",
    children=_children,
)
